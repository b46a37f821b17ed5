"""FLOP numerators: seed 001's reconciliation (0x0D) and the exact causal count."""
import numpy as np
import pytest

from flashrung.bench import numerators, suites

# Seed 001, 0x0D, "A Numeric Reconciliation": B=32, Sq=Sk=1024, H=16, d=128.
RECONCILIATION = dict(batch=32, heads_q=16, seqlen_q=1024, seqlen_k=1024, head_dim=128)


def test_dense_forward_matches_the_seed():
    fc = numerators.count(**RECONCILIATION, causal=False)
    assert fc.forward(numerators.DENSE) == 274_877_906_944
    assert fc.forward(numerators.DENSE) == 4 * 32 * 1024 * 1024 * 16 * 128


def test_causal_and_backward_rows_match_the_seed_table():
    causal = numerators.count(**RECONCILIATION, causal=True)
    dense = numerators.count(**RECONCILIATION, causal=False)
    # the table's counted FLOPs (in units of 1e9): 274.878 / 137.439 / 687.195 / 343.597
    assert causal.forward(numerators.FA_HALF) == 137_438_953_472
    assert dense.backward(numerators.DENSE) == 687_194_767_360
    assert causal.backward(numerators.FA_HALF) == 343_597_383_680
    # and the derived throughputs at the seed's synthetic times
    for flops, ms, expected in ((dense.forward("dense"), 0.20, 1374.39), (causal.forward("fa-half"), 0.20, 687.19),
                                (dense.backward("dense"), 0.45, 1527.10), (causal.backward("fa-half"), 0.45, 763.55)):
        assert numerators.tflops(flops, ms) == pytest.approx(expected, abs=0.006)


def test_exact_causal_differs_from_the_half_convention_by_one_over_s():
    fc = numerators.count(**RECONCILIATION, causal=True)
    # S(S+1)/2 pairs instead of S²/2: relative difference exactly 1/S
    assert fc.forward(numerators.EXACT) / fc.forward(numerators.FA_HALF) == pytest.approx(1 + 1 / 1024, rel=1e-15)
    assert fc.forward(numerators.EXACT) == 2 * 32 * 16 * 256 * (1024 * 1025 // 2)


@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 7), (7, 1), (5, 5), (3, 11), (11, 3), (64, 65), (65, 64), (128, 37)])
def test_exact_pairs_equal_a_brute_force_bottom_right_mask(sq, sk):
    # query i sees key j iff j <= i + (sk - sq): np.tril with that diagonal offset
    mask = np.tril(np.ones((sq, sk), dtype=np.int64), k=sk - sq)
    assert numerators.causal_pairs(sq, sk) == int(mask.sum())


def test_backward_is_exactly_two_and_a_half_forward_for_odd_pair_counts():
    # S=3: 6 causal pairs; with B=H=1 and d=1 the forward is 2·6·2 = 24, backward 60
    fc = numerators.count(batch=1, heads_q=1, seqlen_q=3, seqlen_k=3, head_dim=1, causal=True)
    assert fc.forward("exact") == 24 and fc.backward("exact") == 60


def test_gqa_counts_query_heads_and_distinct_v_dim():
    fc = numerators.count(batch=2, heads_q=8, seqlen_q=16, seqlen_k=32, head_dim=192, head_dim_v=128, causal=False)
    assert fc.forward("dense") == 2 * 2 * 8 * 16 * 32 * (192 + 128)


def test_conventions_that_do_not_apply_are_refused():
    with pytest.raises(ValueError, match="does not apply"):
        numerators.count(**RECONCILIATION, causal=False).forward(numerators.FA_HALF)
    with pytest.raises(ValueError, match="causal_convention"):
        numerators.convention_for(True, "dense")
    with pytest.raises(ValueError, match="seqlen_q"):
        numerators.causal_pairs(0, 4)
    with pytest.raises(ValueError, match="milliseconds"):
        numerators.tflops(10, 0.0)


def test_fa4_protocol_rows_keep_tokens_and_hidden_fixed():
    rows = suites.fa4_protocol()
    assert len(rows) == 2 * 2 * 6 * 2      # head dims × masks × seqlens × directions
    for r in rows:
        assert r.batch * r.seqlen_q == 32768 and r.heads_q * r.headdim == 2048 and r.dtype == "bfloat16"
    # fixed tokens and hidden: forward FLOPs depend on S only, equal for d64/H32 and d128/H16
    by_key = {}
    for r in rows:
        by_key.setdefault((r.seqlen_q, r.causal, r.mode), set()).add(r.flops()[0])
    assert all(len(v) == 1 for v in by_key.values())
    first = rows[0]
    assert (first.batch, first.seqlen_q, first.heads_q, first.headdim, first.causal, first.mode) == (32, 1024, 16, 128, False, "fwd")
    assert first.flops() == (274_877_906_944, "dense")


def test_seed_frozen_rows():
    rows = suites.seed_frozen()
    assert [(r.batch, r.heads_q, r.seqlen_q, r.headdim, r.dtype, r.causal) for r in rows] == [
        (2, 16, 2048, 128, "float16", False), (1, 16, 32768, 128, "bfloat16", True)]


def _window_mask(sq, sk, left, right, causal):
    # flash-attn's window, bottom-right aligned: query i sees key j iff
    # i + (sk - sq) - left <= j <= i + (sk - sq) + right, a side of -1 unbounded, causal right 0
    i = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    seen = np.ones((sq, sk), dtype=bool)
    if left != -1:
        seen &= j >= i - left
    right = 0 if causal else right
    if right != -1:
        seen &= j <= i + right
    return seen


@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 9), (9, 1), (17, 17), (5, 40), (40, 5), (64, 65), (130, 37)])
@pytest.mark.parametrize("left,right,causal", [(0, 0, False), (3, -1, True), (3, 0, True), (8, 2, False),
                                               (-1, 5, False), (6, -1, False), (100, 100, False), (0, -1, True)])
def test_window_pairs_equal_a_brute_force_mask(sq, sk, left, right, causal):
    """Protects: a windowed row's FLOPs count exactly the (query, key) pairs flash-attn's window
    allows, wherever the clamps to the key range bite (Sq != Sk, windows wider than the keys)."""
    want = int(_window_mask(sq, sk, left, right, causal).sum())
    assert numerators.window_pairs(sq, sk, left, right, causal) == want
    fc = numerators.count(batch=2, heads_q=3, seqlen_q=sq, seqlen_k=sk, head_dim=64, head_dim_v=32, causal=causal,
                          window=(left, right))
    assert fc.forward(numerators.WINDOW) == 2 * 2 * 3 * (64 + 32) * want
    assert fc.backward(numerators.WINDOW) == fc.forward(numerators.WINDOW) * 5 // 2
    for convention in (numerators.FA_HALF, numerators.EXACT):
        with pytest.raises(ValueError, match="windowed: 'window'"):
            fc.forward(convention)


def test_a_window_reaching_every_key_counts_the_mask_it_leaves():
    # a left side past the first key is no bound: causal pairs, or dense pairs
    assert numerators.window_pairs(300, 300, 299, 0, causal=True) == numerators.causal_pairs(300, 300)
    assert numerators.window_pairs(70, 90, 1000, 1000) == numerators.dense_pairs(70, 90)
    with pytest.raises(ValueError, match="window left must be an integer >= -1"):
        numerators.window_pairs(8, 8, -2, 0)
    with pytest.raises(ValueError, match="causal window's right side must be -1 or 0"):
        numerators.window_pairs(8, 8, 4, 2, causal=True)


@pytest.mark.parametrize("lengths", [(5,), (17, 0, 40), (64, 65, 1, 130)])
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, (6, 0)), (False, (3, 9))])
def test_packed_flops_are_each_sequences_own(lengths, causal, window):
    """Protects: a packed row's FLOPs count each sequence as its own problem (no pair across two
    sequences), an empty one none, under every convention that applies — fa-half halving each
    sequence's dense count."""
    fc = numerators.count_packed(lengths=lengths, heads_q=3, head_dim=64, head_dim_v=32, causal=causal,
                                 window=window)
    per_pair = 2 * 3 * (64 + 32)
    if window is not None:
        want = sum(int(_window_mask(n, n, *window, causal).sum()) for n in lengths if n)
        assert fc.forward(numerators.WINDOW) == per_pair * want
    elif causal:
        assert fc.forward(numerators.EXACT) == per_pair * sum(n * (n + 1) // 2 for n in lengths)
        assert fc.forward(numerators.FA_HALF) == sum(per_pair * n * n // 2 for n in lengths)
    else:
        assert fc.forward(numerators.DENSE) == per_pair * sum(n * n for n in lengths)
    with pytest.raises(ValueError, match="at least one row"):
        numerators.count_packed(lengths=(0, 0), heads_q=1, head_dim=64, causal=False)
