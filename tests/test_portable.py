"""Portable kernels at the odd shapes that break tiled kernels, through the gate."""
import pytest
import torch

from flashrung import gate
from flashrung.kernels.portable import bwd, common, fwd
from conftest import DEVICE

# (B, Sq, Sk, Hq, Hkv, D)           why it is here
ODD = [
    (1, 1, 1000, 2, 1, 32),      # decode-like: one query against a long, ragged KV
    (1, 1000, 1000, 1, 1, 32),   # many tiles with a ragged tail in both directions
    (1, 1000, 17, 2, 2, 40),     # Sq >> Sk; head_dim not a power of two (masked columns)
    (3, 5, 7, 3, 1, 96),         # batch > 1, MQA with 3 query heads, head_dim 96
]


@pytest.mark.parametrize("shape", ODD, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_odd_shapes(shape, causal):
    B, Sq, Sk, Hq, Hkv, D = shape
    case = gate.Case(B, Sq, Sk, Hq, Hkv, D, torch.float16, causal)
    result = gate.check_forward_case(fwd.forward, case, DEVICE)
    assert result.passed, str(result)


@pytest.mark.parametrize("shape", [(1, 1, 70, 2, 1, 32), (1, 70, 1, 1, 1, 32), (2, 45, 45, 3, 1, 48)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_backward_odd_shapes(shape, causal):
    B, Sq, Sk, Hq, Hkv, D = shape
    case = gate.Case(B, Sq, Sk, Hq, Hkv, D, torch.float16, causal)
    result = gate.check_backward(fwd.forward, bwd.backward, case, DEVICE)
    assert result.passed, str(result)


# (B, Sq, Sk, Hq, Hkv, D, Dv)        why it is here
VALUE_HEAD_DIMS = [
    (1, 33, 95, 4, 1, 192, 128),   # MLA's head dims: q/k 192 (a 256-wide tile), v 128; MQA, Sq < Sk
    (2, 17, 17, 2, 2, 32, 64),     # v wider than q/k
    (1, 80, 24, 2, 1, 48, 40),     # neither a power of two, each masked to its own width; Sq > Sk
]


@pytest.mark.parametrize("shape", VALUE_HEAD_DIMS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_a_value_head_dim_of_its_own_passes_the_gate_both_ways(shape, causal):
    # v, out, dout and dv have Dv columns, q, k, dq and dk D: each load, product and store must
    # take its own tensor's width (a V tile loaded D wide reads past its rows, or misses columns)
    B, Sq, Sk, Hq, Hkv, D, Dv = shape
    case = gate.Case(B, Sq, Sk, Hq, Hkv, D, torch.bfloat16, causal, head_dim_v=Dv)
    result = gate.check_forward_case(fwd.forward, case, DEVICE)
    assert result.passed, str(result)
    result = gate.check_backward(fwd.forward, bwd.backward, case, DEVICE)
    assert result.passed, str(result)


# (left, right) windows: one key each side of the diagonal, a band, left only, right only, a
# window wider than the keys; with odd lengths, Sq < Sk and Sq > Sk (rows whose window holds no key)
WINDOWS = [(0, 0), (7, 2), (16, -1), (-1, 5), (1000, 1000)]
WINDOW_SHAPES = [(2, 17, 17, 2, 2), (1, 33, 95, 4, 1), (1, 80, 24, 2, 1), (1, 130, 130, 2, 1)]


@pytest.mark.parametrize("shape", WINDOW_SHAPES, ids=str)
@pytest.mark.parametrize("window_size, causal", [(w, c) for w in WINDOWS for c in (False, True)
                                                 if not (c and w[1] > 0)], ids=str)   # causal: no right side
def test_a_sliding_window_passes_the_gate_both_ways(window_size, causal, shape):
    # the tiles at both edges of the window are masked, those inside it are not, those outside it
    # are never visited — forward, dK/dV (query tiles per key tile) and dQ alike
    case = gate.Case(*shape, 32, torch.float16, causal, window_size=window_size)
    result = gate.check_forward_case(fwd.forward, case, DEVICE)
    assert result.passed, str(result)
    result = gate.check_backward(fwd.forward, bwd.backward, case, DEVICE)
    assert result.passed, str(result)


@pytest.mark.parametrize("shape", WINDOW_SHAPES[:3], ids=str)
@pytest.mark.parametrize("softcap, causal, window_size", [(0.5, False, (-1, -1)), (5.0, True, (-1, -1)),
                                                          (30.0, False, (7, 2))], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_softcap_passes_the_gate_both_ways(softcap, causal, window_size, dtype, shape):
    # softcap·tanh(scale·qkᵀ/softcap) in the forward, its 1 − tanh² on dS in both backward kernels;
    # a small cap bends nearly every score, a large one only the largest
    case = gate.Case(*shape, 32, dtype, causal, window_size=window_size, softcap=softcap)
    result = gate.check_forward_case(fwd.forward, case, DEVICE)
    assert result.passed, str(result)
    result = gate.check_backward(fwd.forward, bwd.backward, case, DEVICE)
    assert result.passed, str(result)


# packed sequences: (query lengths, key lengths), empty sequences and Sq ≠ Sk within a pack, one
# sequence alone, a long one beside one-row ones
PACKS = [((5, 0, 40, 17, 1), (7, 3, 33, 17, 0)), ((33,), (95,)), ((1, 1, 70), (1, 64, 2))]


@pytest.mark.parametrize("varlen", PACKS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{}, dict(window_size=(6, -1)), dict(softcap=3.0, head_dim_v=16)], ids=str)
def test_packed_sequences_pass_the_gate_both_ways(varlen, causal, extra):
    # each sequence is checked against the references run on it alone: a program that reads another
    # sequence's rows, or writes past its own, fails; the forward, dK/dV and dQ all place each
    # sequence by its cu_seqlens entry and stop at its own length
    case = gate.Case(len(varlen[0]), max(varlen[0]), max(varlen[1]), 4, 2, 32, torch.float16, causal,
                     varlen=varlen, **extra)
    result = gate.check_varlen(fwd.forward, bwd.backward, case, DEVICE, seed=1)
    assert result.passed, str(result)


def test_float32_forward_is_near_exact():
    # fp32 inputs use IEEE dots: the kernel should sit at the fp32 floor, far inside the bound
    case = gate.Case(1, 33, 65, 2, 1, 32, torch.float32, True)
    result = gate.check_forward_case(fwd.forward, case, DEVICE)
    assert result.passed and result.ratio < 0.1, str(result)


def test_backward_is_deterministic():
    # dk/dv accumulate over the GQA group inside one program, without atomics
    case = gate.Case(1, 40, 40, 4, 1, 32, torch.float16, True)
    q, k, v = gate.random_inputs(case, DEVICE)
    do = torch.randn_like(q)
    out, lse = fwd.forward(q, k, v, True, 0.2)
    first = bwd.backward(do, q, k, v, out, lse, True, 0.2)
    second = bwd.backward(do, q, k, v, out, lse, True, 0.2)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_needs_int64_offsets_counts_each_tensors_own_strides():
    # meta tensors: shapes and strides without memory
    def meta(shape, stride=None):
        t = torch.empty(shape, device="meta")
        return t if stride is None else t.as_strided(shape, stride)
    assert not common.needs_int64_offsets(meta((1, 2**20, 16, 128)))              # last element 2**31 − 1
    assert common.needs_int64_offsets(meta((1, 2**20 + 1, 16, 128)))
    assert common.needs_int64_offsets(meta((3, 4, 2, 32)), meta((3, 5, 2, 32), (2**30, 64, 32, 1)))
    assert not common.needs_int64_offsets(meta((0, 2**30, 16, 128)))             # empty: nothing is read


def _views_past_int32(shapes, dtype, device):
    """Random tensors of ``shapes`` (B, S, H, D) viewed into one buffer with a batch stride of
    2**31 − 4096 elements: entry 2's offsets pass 2**31 and, in int32, wrap to 8192 elements before
    the view's start, still inside the buffer (a wrapped read returns wrong rows, never a fault)."""
    batch_stride, lead = 2**31 - 4096, 16384
    B = shapes[0][0]
    slot = [s * h * d for _, s, h, d in shapes]
    buffer = torch.empty(lead + (B - 1) * batch_stride + sum(slot), dtype=dtype, device=device)
    views, at = [], lead
    for (b, s, h, d), size in zip(shapes, slot):
        view = buffer.as_strided((b, s, h, d), (batch_stride, h * d, d, 1), at)
        view.copy_(torch.randn(b, s, h, d, dtype=dtype, device=device))
        views.append(view)
        at += size
    return views


@pytest.mark.parametrize("causal", [False, True])
def test_offsets_past_int32_read_and_write_the_right_rows(causal, monkeypatch):
    # a view whose batch entries lie 2**31 elements apart: the kernels must take the launch's indices in
    # int64, forward, dK/dV and dQ alike, and give what they give on compact copies, bit for bit
    q, k, v = _views_past_int32([(3, 40, 2, 32), (3, 33, 1, 32), (3, 33, 1, 32)], torch.float16, DEVICE)
    do = torch.randn(3, 40, 2, 32, dtype=torch.float16, device=DEVICE)
    compact = [t.contiguous() for t in (q, k, v)]
    assert common.needs_int64_offsets(q) and not common.needs_int64_offsets(*compact)
    out, lse = fwd.forward(q, k, v, causal, 0.2)
    out_compact, lse_compact = fwd.forward(*compact, causal, 0.2)
    assert torch.equal(out, out_compact) and torch.equal(lse, lse_compact)
    grads = bwd.backward(do, q, k, v, out, lse, causal, 0.2)
    grads_compact = bwd.backward(do, *compact, out_compact, lse_compact, causal, 0.2)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_compact))
    # the property can fail: with int32 indices, batch entry 2 reads the wrong rows
    monkeypatch.setattr(common, "needs_int64_offsets", lambda *tensors: False)
    wrapped, _ = fwd.forward(q, k, v, causal, 0.2)
    assert torch.equal(wrapped[:2], out[:2]) and not torch.equal(wrapped[2], out[2])


# --------------------------------------------------------------------------- recompute_flagged


def _recompute_everything(q, k, v, causal, softmax_scale, out=None, lse=None, **score_options):
    # the gate hands over NaN-poisoned out and lse: every row reads as flagged
    guard = torch.ones(1, dtype=torch.int32, device=q.device)
    fwd.recompute_flagged(guard, q, k, v, out, lse, causal, softmax_scale, **score_options)
    return out, lse


@pytest.mark.parametrize("case", [
    gate.Case(1, 1000, 17, 2, 2, 40, torch.float16, False),             # Sq >> Sk, a ragged key tail
    gate.Case(3, 5, 7, 3, 1, 96, torch.float16, True),                  # MQA, head_dim 96, Sq < Sk
    gate.Case(1, 130, 130, 4, 2, 32, torch.bfloat16, True, window_size=(16, -1)),
    gate.Case(2, 33, 95, 2, 1, 32, torch.bfloat16, False, softcap=3.0, head_dim_v=16),
], ids=str)
def test_recompute_of_every_flagged_row_passes_the_gate(case):
    # property: a launch that flagged every row (a NaN LSE each) is rewritten whole by the
    # grid-stride recompute, as the one-program-per-tile forward would write it: every tile visited
    # once, each row against its own keys, mask, window and cap
    result = gate.check_forward_case(_recompute_everything, case, DEVICE)
    assert result.passed, str(result)


@pytest.mark.parametrize("packed", [False, True])
def test_recompute_rewrites_the_flagged_rows_alone_and_only_when_the_guard_is_set(packed):
    # property: with the guard word set, each row whose LSE is NaN gets portable.fwd's own out and
    # LSE bit for bit, and every other row keeps what it held (a row written by the faster kernel
    # is never overwritten); with the word 0 nothing is written at all. q is a non-contiguous view
    torch.manual_seed(3)
    heads_q, heads_kv, d = 4, 2, 32
    if packed:
        lengths_q, lengths_k = (5, 40, 17), (7, 33, 17)
        rows_q, rows_k, batch = sum(lengths_q), sum(lengths_k), 1
        cu = tuple(torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
                   for n in (lengths_q, lengths_k))
        packing = dict(cu_seqlens=cu, max_seqlens=(max(lengths_q), max(lengths_k)))
    else:
        rows_q, rows_k, batch, packing = 70, 45, 2, {}
    q = torch.randn(batch, heads_q, rows_q, d, dtype=torch.float16, device=DEVICE).transpose(1, 2)
    k, v = (torch.randn(batch, rows_k, heads_kv, d, dtype=torch.float16, device=DEVICE) for _ in range(2))
    want_out, want_lse = fwd.forward(q, k, v, True, 0.2, **packing)
    flagged = torch.zeros(batch, heads_q, rows_q, dtype=torch.bool, device=DEVICE)
    flagged[..., 3::7] = True                       # scattered rows across every tile and head
    flagged[-1, 2, 32:64] = True                    # a whole tile of one head
    out = torch.full_like(want_out, 3.0)
    lse = torch.full_like(want_lse, 5.0).masked_fill(flagged, float("nan"))
    held_out, held_lse = out.clone(), lse.clone()

    fwd.recompute_flagged(torch.zeros(1, dtype=torch.int32, device=DEVICE), q, k, v, out, lse, True, 0.2, **packing)
    torch.testing.assert_close(lse, held_lse, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(out, held_out)

    fwd.recompute_flagged(torch.ones(1, dtype=torch.int32, device=DEVICE), q, k, v, out, lse, True, 0.2, **packing)
    rows = flagged.transpose(1, 2)                  # out is (B, S, H, D)
    assert torch.equal(lse[flagged], want_lse[flagged]) and torch.equal(lse[~flagged], held_lse[~flagged])
    assert torch.equal(out[rows], want_out[rows]) and torch.equal(out[~rows], held_out[~rows])


def test_recompute_names_a_guard_it_cannot_read():
    q = k = v = torch.randn(1, 8, 1, 32, dtype=torch.float16, device=DEVICE)
    out, lse = fwd.forward(q, k, v, False, 0.2)
    for guard in (torch.ones(1, dtype=torch.int64, device=DEVICE), torch.ones(2, dtype=torch.int32, device=DEVICE)):
        with pytest.raises(ValueError, match="guard must be one int32 word"):
            fwd.recompute_flagged(guard, q, k, v, out, lse, False, 0.2)
    for guard in (torch.ones(1, dtype=torch.int32, device=DEVICE), torch.ones(4, dtype=torch.int32, device=DEVICE)[::2]):
        with pytest.raises(ValueError, match="guard must be 2 contiguous int32 words"):
            fwd.recompute_flagged(guard, q, k, v, out, lse, False, 0.2, reset=True)


@pytest.mark.parametrize("programs", [1, 3])
def test_a_resetting_recompute_leaves_its_word_pair_zero_after_a_trip(programs, monkeypatch):
    # property: with reset (the word pair hopper.fwd keeps per stream, never zeroed on the host) a
    # tripped launch rewrites its flagged rows exactly as a one-word launch does and leaves both words
    # 0 — the last program to count resets them, whichever it is — so the next launch starts clear;
    # an untripped one leaves the pair as it found it. One program and several (a grid stride)
    monkeypatch.setattr(fwd, "RECOMPUTE_PROGRAMS_PER_SM", programs)
    torch.manual_seed(5)
    q = torch.randn(2, 150, 2, 32, dtype=torch.float16, device=DEVICE)
    k, v = torch.randn_like(q), torch.randn_like(q)
    want_out, want_lse = fwd.forward(q, k, v, False, 0.2)
    flagged = torch.zeros_like(want_lse, dtype=torch.bool)
    flagged[0, 1, 100:140] = True
    flagged[1, 0, ::9] = True
    out, lse = torch.full_like(want_out, 3.0), torch.full_like(want_lse, 5.0).masked_fill(flagged, float("nan"))
    words = torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    fwd.recompute_flagged(words, q, k, v, out, lse, False, 0.2, reset=True)
    assert words.tolist() == [0, 0]
    rows = flagged.transpose(1, 2)
    assert torch.equal(lse[flagged], want_lse[flagged]) and torch.equal(lse[~flagged], torch.full_like(lse, 5.0)[~flagged])
    assert torch.equal(out[rows], want_out[rows]) and (out[~rows] == 3.0).all()
    # the next launch reads 0: a NaN row it finds stays as it is, and the pair stays 0
    lse[0, 0, 7] = float("nan")
    fwd.recompute_flagged(words, q, k, v, out, lse, False, 0.2, reset=True)
    assert words.tolist() == [0, 0] and torch.isnan(lse[0, 0, 7])
