"""hopper.fwd's host-side schedule: which tiles the split tail cuts (host rule) and the merge of
their partial results (``tail_combine``, plain Triton: runs under the interpreter on CPU, and on the
GPU), the balanced persistent grid's table (``schedule.balanced_schedule``), and the magic numbers
the kernel divides by (``schedule.fast_divisor``), with its work-item decode replayed on the host.

The kernel side (work items, K/V ranges, the partial stores, the table walk) runs only on sm_90:
its gate tests are in tests/test_hopper.py (``test_gate_split_tail``, ``test_gate_balanced``).
"""
import heapq
import math
import random

import numpy as np
import pytest
import torch

from flashrung.kernels.hopper import fwd
from flashrung.kernels.hopper.schedule import (
    _deal,
    balanced_schedule,
    balanced_section,
    deal_packed,
    lists_makespan,
    fast_divisor,
    last_section_width,
    PackedSections,
    head_section,
    PACKED_GREEDY_TILES_PER_CTA,
    packed_handout_table,
    packed_schedule,
    packed_tiles,
    pool_start,
    sequence_tile_costs,
    tail_split,
    tail_step_times,
    TILE_OVERHEAD_KV_TILES,
    tile_cost,
    tile_m_blocks,
    tile_id_of,
    tile_position,
)
from flashrung.kernels.hopper.tail_combine import LOADS_FIRST_COLS, SPLITS_PER_LOAD, combine_tail, workspace
from flashrung.model.schedule import causal_costs, list_schedule, live_blocks
from flashrung.reference import oracle


# --------------------------------------------------------------------------- host rule


@pytest.mark.parametrize("num_tiles, resident, n_kv", [
    (4096, 132, 128),    # the suite's d128 rows: 31 full rounds and 4 tiles left over
    (4096, 132, 8),      # the same tiles at S = 1k: no more splits than K/V tiles
    (5462, 132, 128),    # d64's 192-row tiles: 50 left over, 2 splits each
    (24, 132, 8),        # fewer tiles than SMs: every tile is a tail tile
    (264, 132, 8),       # full rounds only
    (131, 132, 64),      # one SM idle: nothing to gain
    (0, 132, 8),
])
def test_tail_split_fills_the_last_round_without_overflowing_it(num_tiles, resident, n_kv):
    full, splits = tail_split(num_tiles, resident, n_kv)
    tail = num_tiles - full
    assert 0 <= tail < resident and full % resident == 0 or splits == 1
    assert 1 <= splits <= n_kv                       # every work item gets at least one K/V tile
    items = full + tail * splits
    # the split items fit in one round: the last round never grows
    assert math.ceil(items / resident) == math.ceil(num_tiles / resident)
    if splits > 1:
        assert tail * (splits + 1) > resident or splits == n_kv   # as many splits as fit
    else:
        assert full == num_tiles


def test_tail_split_examples():
    assert tail_split(4096, 132, 128) == (4092, 33)
    assert tail_split(4096, 132, 8) == (4092, 8)
    assert tail_split(264, 132, 8) == (264, 1)
    assert tail_split(24, 132, 8) == (0, 5)
    assert tail_split(100, 132, 8) == (100, 1)       # 132 // 100 = 1


@pytest.mark.parametrize("num_tiles, resident, n_kv, fixed", [
    (4096, 132, 128, 1),   # the suite's d128 rows: 4 tiles left over
    (2048, 132, 128, 3),   # d256 non-causal B2 H16 S8192: 68 left over, a step-time of 131 each
    (5504, 132, 128, 1),   # d64's 192-row tiles at B2 H32 S16384: 92 left over
    (96, 132, 32, 1),      # fewer tiles than SMs, long keys
    (131, 132, 64, 1),     # one SM idle
    (264, 132, 8, 1),      # full rounds only
])
def test_modeled_tail_split_ends_no_later_than_either_rule(num_tiles, resident, n_kv, fixed):
    # the modeled count's last rounds are never longer than one round of whole tiles, nor than
    # the one-round rule's split; where it splits, strictly shorter than whole tiles
    full, splits = tail_split(num_tiles, resident, n_kv, fixed)
    tail = num_tiles % resident
    assert 1 <= splits <= n_kv and (full == num_tiles - tail if splits > 1 else full == num_tiles)
    whole = tail_step_times(tail, resident, n_kv, 1, fixed) if tail else 0
    _, one_round = tail_split(num_tiles, resident, n_kv)
    modeled = tail_step_times(tail, resident, n_kv, splits, fixed) if tail else 0
    assert modeled <= whole and modeled <= (tail_step_times(tail, resident, n_kv, one_round, fixed) if tail else 0)
    assert splits == 1 or modeled < whole


def test_modeled_tail_split_examples():
    # where one round holds the split, the modeled count is the one-round rule's (the measured
    # d128 default: 4 tiles x 33)
    assert tail_split(4096, 132, 128, 1) == tail_split(4096, 132, 128) == (4092, 33)
    assert tail_split(4096, 132, 32, 1) == tail_split(4096, 132, 32) == (4092, 32)
    assert tail_split(24, 132, 8, 1) == tail_split(24, 132, 8) == (0, 5)
    # d256 B2 H16 S8192: 68 tiles in five splits, three rounds of 26 + 3 step-times against one
    # round of 131 whole (the one-round rule cannot split: 132 // 68 = 1)
    assert tail_split(2048, 132, 128) == (2048, 1)
    assert tail_split(2048, 132, 128, 3) == (1980, 5)
    assert tail_step_times(68, 132, 128, 5, 3) == 3 * (26 + 3) < tail_step_times(68, 132, 128, 1, 3) == 131
    # a larger fixed cost splits less
    assert tail_split(2048, 132, 128, 40)[1] < 5
    assert tail_split(131, 132, 64, 1) == (131, 1)


@pytest.mark.parametrize("args, name", [((-1, 132, 8), "num_tiles"), ((10, 0, 8), "resident_ctas"),
                                        ((10, 132, 0), "num_kv_tiles"), ((10.0, 132, 8), "num_tiles"),
                                        ((10, 132, 8, -1), "item_fixed_kv_tiles"),
                                        ((10, 132, 8, 1.5), "item_fixed_kv_tiles")])
def test_tail_split_rejects_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        tail_split(*args)


# --------------------------------------------------------------------------- the merge


def _partials(q, k, v, coords, splits, block_m, key_ranges, scale):
    """What the kernel's split items write: per tail tile and split, O normalized over the split's
    keys (fp32) and its natural-log LSE, for every row of the tile (rows past Sq included)."""
    batch, seqlen_q, heads, d = q.shape
    part_o = torch.zeros(len(coords) * splits, block_m, d)
    part_lse = torch.full((len(coords) * splits, block_m), float("-inf"))
    for t, (b, h, m_block) in enumerate(coords):
        rows = slice(m_block * block_m, min((m_block + 1) * block_m, seqlen_q))
        n = rows.stop - rows.start
        for s, (lo, hi) in enumerate(key_ranges):
            if hi > lo:
                o, lse = oracle(q[b:b + 1, rows, h:h + 1], k[b:b + 1, lo:hi, h:h + 1], v[b:b + 1, lo:hi, h:h + 1],
                                False, scale)
                part_o[t * splits + s, :n] = o[0, :, 0].float()
                part_lse[t * splits + s, :n] = lse[0, 0].float()
            # rows past Sq hold whatever the kernel computed from TMA's zero rows: garbage here
            part_o[t * splits + s, n:] = 7.0
            part_lse[t * splits + s, n:] = 3.0
    return part_o, part_lse


@pytest.mark.parametrize("loads_first", [False, True])
@pytest.mark.parametrize("seqlen_q, splits, empty_split", [(40, 3, False), (17, 2, False), (64, 4, True),
                                                           (40, 33, False)])
def test_combine_matches_attention_over_all_keys(seqlen_q, splits, empty_split, loads_first, device):
    # property: merging the splits' normalized partials by their LSE is attention over every key,
    # written only into the tail tiles' rows of out/lse (the rest stays poisoned)
    torch.manual_seed(0)
    batch, heads, d, block_m, seqlen_k = 2, 3, 16, 32, 50
    scale = d ** -0.5
    q = torch.randn(batch, seqlen_q, heads, d, dtype=torch.float16)
    k = torch.randn(batch, seqlen_k, heads, d, dtype=torch.float16)
    v = torch.randn(batch, seqlen_k, heads, d, dtype=torch.float16)
    bounds = [round(i * seqlen_k / splits) for i in range(splits + 1)]
    ranges = list(zip(bounds[:-1], bounds[1:]))
    if empty_split:
        ranges[1] = (ranges[1][0], ranges[1][0])      # a split whose rows saw no key: weight 0
    m_blocks = -(-seqlen_q // block_m)
    coords = [(1, 2, m_blocks - 1), (0, 0, 0), (1, 0, 0)]
    part_o, part_lse = _partials(q, k, v, coords, splits, block_m, ranges, scale)
    out = torch.full((batch, seqlen_q, heads, d), float("nan"), dtype=torch.float16)
    lse = torch.full((batch, heads, seqlen_q), float("nan"))
    on = [t.to(device) for t in (part_o, part_lse, torch.tensor(coords, dtype=torch.int32), out, lse)]
    combine_tail(*on, splits, loads_first=loads_first)
    out, lse = on[3].cpu(), on[4].cpu()

    keys = torch.cat([torch.arange(lo, hi) for lo, hi in ranges])
    want_o, want_lse = oracle(q, k[:, keys], v[:, keys], False, scale)
    written = torch.zeros(batch, seqlen_q, heads, dtype=torch.bool)
    for b, h, m_block in coords:
        written[b, m_block * block_m:(m_block + 1) * block_m, h] = True
    assert torch.isnan(out[~written]).all() and torch.isnan(lse.transpose(1, 2)[~written]).all()
    torch.testing.assert_close(out[written].float(), want_o.float()[written], atol=2e-3, rtol=0)
    torch.testing.assert_close(lse.transpose(1, 2)[written], want_lse.float().transpose(1, 2)[written],
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("loads_first", [False, True])
def test_combine_carries_a_flagged_partial_into_the_merged_lse(loads_first, device):
    # property: a split item whose row the frozen row max's guard flagged (its partial LSE NaN,
    # fwd._flag_overflow) leaves that row's merged LSE NaN, so the recompute after the merge
    # (portable.fwd.recompute_flagged) finds it; every other row merges as before
    torch.manual_seed(2)
    batch, heads, d, block_m, seqlen_q, seqlen_k, splits = 1, 2, 16, 32, 40, 50, 3
    scale = d ** -0.5
    q, k, v = (torch.randn(batch, n, heads, d, dtype=torch.float16) for n in (seqlen_q, seqlen_k, seqlen_k))
    bounds = [round(i * seqlen_k / splits) for i in range(splits + 1)]
    coords = [(0, 1, 0), (0, 0, 1)]
    part_o, part_lse = _partials(q, k, v, coords, splits, block_m, list(zip(bounds[:-1], bounds[1:])), scale)
    flagged = (1 * splits + 2, 3)                   # tail tile 1's third split, row 3 of the tile
    part_lse[flagged] = float("nan")
    out = torch.full((batch, seqlen_q, heads, d), float("nan"), dtype=torch.float16)
    lse = torch.full((batch, heads, seqlen_q), float("nan"))
    on = [t.to(device) for t in (part_o, part_lse, torch.tensor(coords, dtype=torch.int32), out, lse)]
    combine_tail(*on, splits, loads_first=loads_first)
    lse = on[4].cpu()
    want = oracle(q, k, v, False, scale)[1].float()
    row = 1 * block_m + 3                           # tile (0, 0, 1): q rows 32..39
    assert torch.isnan(lse[0, 0, row])
    kept = [(h, r) for h, m in ((1, 0), (0, 1)) for r in range(m * block_m, min((m + 1) * block_m, seqlen_q))
            if (h, r) != (0, row)]
    got = torch.stack([lse[0, h, r] for h, r in kept])
    torch.testing.assert_close(got, torch.stack([want[0, h, r] for h, r in kept]), atol=1e-5, rtol=1e-5)


def test_combine_with_loads_first_is_the_same_merge(device):
    # loads_first only moves the loads ahead of the coordinates and widens them: rows past Sq are
    # still never written (out is a view of a longer buffer whose extra rows must stay poisoned;
    # their partials hold garbage), the sums agree to rounding, and under the interpreter (source
    # order) up to SPLITS_PER_LOAD splits bit for bit (compiled, they run over differently laid out
    # blocks); at d128 each row is merged by two programs of LOADS_FIRST_COLS columns
    torch.manual_seed(1)
    block_m, d, tiles, seqlen_q = 16, 128, 3, 20
    assert d // LOADS_FIRST_COLS == 2
    coords = torch.tensor([[0, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.int32)
    for splits in (5, 33):
        part_o = torch.randn(tiles * splits, block_m, d)
        part_lse = torch.randn(tiles * splits, block_m) * 4
        results = []
        for loads_first in (False, True):
            base = torch.full((2, 32, 2, d), float("nan"), dtype=torch.float16, device=device)
            lse = torch.full((2, 2, seqlen_q), float("nan"), device=device)
            combine_tail(part_o.to(device), part_lse.to(device), coords.to(device), base[:, :seqlen_q], lse, splits,
                         loads_first=loads_first)
            base = base.cpu()
            assert base[:, seqlen_q:].isnan().all(), "a row past Sq was written"
            results.append((base[:, :seqlen_q], lse.cpu()))
        (o0, l0), (o1, l1) = results
        written = ~o0.isnan()
        assert torch.equal(written, ~o1.isnan()) and int(written[..., 0].sum()) == 4 + 16 + 4
        torch.testing.assert_close(o1, o0, atol=1e-3, rtol=0, equal_nan=True)
        torch.testing.assert_close(l1, l0, atol=1e-6, rtol=1e-6, equal_nan=True)
        if splits <= SPLITS_PER_LOAD and torch.device(device).type == "cpu":
            assert torch.equal(o0[written], o1[written])
            assert torch.equal(l0.nan_to_num(), l1.nan_to_num())


def test_combine_writes_through_strided_out_and_keeps_rows_that_saw_no_key_empty(device):
    # out as a view with a head stride of 2·D (every other head of a larger tensor); a row no
    # split saw (all LSEs -inf) gets out = 0, lse = -inf, as the kernel's own empty rows do
    block_m, d, splits = 16, 8, 2
    base = torch.full((1, 16, 4, d), float("nan"), dtype=torch.bfloat16, device=device)
    out = base[:, :, ::2]
    lse = torch.full((1, 2, 16), float("nan"), device=device)
    part_o = torch.randn(splits, block_m, d)
    part_lse = torch.randn(splits, block_m)
    part_lse[:, 5] = float("-inf")
    part_o[:, 5] = 0.0
    combine_tail(part_o.to(device), part_lse.to(device), torch.tensor([[0, 1, 0]], dtype=torch.int32, device=device),
                 out, lse, splits)
    base, out, lse = base.cpu(), base.cpu()[:, :, ::2], lse.cpu()
    w = torch.softmax(part_lse, 0)
    want = (w[:, :, None] * part_o).sum(0)
    want[5] = 0.0
    torch.testing.assert_close(out[0, :, 1].float(), want, atol=1e-2, rtol=1e-2)
    assert lse[0, 1, 5] == float("-inf")
    torch.testing.assert_close(lse[0, 1, :5], torch.logsumexp(part_lse, 0)[:5])
    assert torch.isnan(base[:, :, 1::2].float()).all() and torch.isnan(out[0, :, 0].float()).all()


@pytest.mark.parametrize("loads_first", [False, True])
def test_combine_into_a_padded_head_dim_stores_only_the_outputs_columns(loads_first, device):
    # a padded head dim (config.kernel_head_dim: d96 on the d128 kernel) merges a workspace of the
    # kernel's 128 columns into an out of 96: its columns are the full merge's first 96, and the
    # 32 columns after them in memory (here a wider buffer's) are never written
    torch.manual_seed(2)
    block_m, d, d_out, splits, seqlen_q = 16, 128, 96, 3, 20
    coords = torch.tensor([[0, 1, 1], [1, 0, 0]], dtype=torch.int32, device=device)
    part_o = torch.randn(2 * splits, block_m, d, device=device)
    part_lse = torch.randn(2 * splits, block_m, device=device) * 4
    full = torch.full((2, seqlen_q, 2, d), float("nan"), dtype=torch.float16, device=device)
    lse_full = torch.full((2, 2, seqlen_q), float("nan"), device=device)
    combine_tail(part_o, part_lse, coords, full, lse_full, splits, loads_first=loads_first)
    wide = torch.full((2, seqlen_q, 2, d), float("nan"), dtype=torch.float16, device=device)
    lse = torch.full((2, 2, seqlen_q), float("nan"), device=device)
    combine_tail(part_o, part_lse, coords, wide[..., :d_out], lse, splits, loads_first=loads_first)
    full, wide, lse, lse_full = full.cpu(), wide.cpu(), lse.cpu(), lse_full.cpu()
    written = ~full[..., 0].isnan()
    assert int(written.sum()) == 4 + 16
    assert torch.equal(wide[..., :d_out][written], full[..., :d_out][written])
    assert wide[..., d_out:].isnan().all(), "a column past the output's head dim was written"
    assert torch.equal(lse.nan_to_num(), lse_full.nan_to_num())


@pytest.mark.parametrize("kwargs, match", [
    (dict(out=torch.zeros(1, 16, 2, 16)), "D_out"),
    (dict(splits=3), "splits"),
    (dict(part_lse=torch.zeros(4, 15)), "part_lse"),
    (dict(coords=torch.zeros(2, 3, dtype=torch.int64)), "coords"),
    (dict(part_o=torch.zeros(4, 16, 8, dtype=torch.float16)), "part_o"),
    (dict(lse=torch.zeros(1, 2, 17)), "lse"),
])
def test_combine_rejects_bad_input(kwargs, match):
    args = dict(part_o=torch.zeros(4, 16, 8), part_lse=torch.zeros(4, 16),
                coords=torch.zeros(2, 3, dtype=torch.int32), out=torch.zeros(1, 16, 2, 8), lse=torch.zeros(1, 2, 16),
                splits=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        combine_tail(**args)


def test_workspace_views_are_disjoint_and_shaped_for_combine():
    part_o, part_lse, coords = workspace(items=66, tiles=2, block_m=128, head_dim=64, device="cpu")
    assert part_o.shape == (66, 128, 64) and part_lse.shape == (66, 128) and coords.shape == (2, 3)
    assert part_o.dtype == part_lse.dtype == torch.float32 and coords.dtype == torch.int32
    assert all(t.is_contiguous() for t in (part_o, part_lse, coords))
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (part_o, part_lse, coords))
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


# --------------------------------------------------------------------------- the balanced grid


def _split_table(table, ctas):
    offsets, order = table[:ctas + 1], table[ctas + 1:]
    return [list(order[offsets[i]:offsets[i + 1]]) for i in range(ctas)]


@pytest.mark.parametrize("m_blocks, batch_heads, section, lpt", [(171, 32, 6, True), (8, 1024, 24, True),
                                                                 (32, 128, 128, True), (5, 7, 3, False)])
def test_balanced_schedule_is_a_permutation_walked_in_launch_order(m_blocks, batch_heads, section, lpt):
    # property: every tile runs exactly once, and each CTA keeps the launch order (heaviest first)
    ctas = 132
    table = balanced_schedule(m_blocks, batch_heads, section, lpt, m_blocks * 128, m_blocks * 128, 128, 128,
                              True, ctas)
    lists = _split_table(table, ctas)
    assert table[0] == 0 and list(table[1:ctas + 1]) == sorted(table[1:ctas + 1])
    assert sorted(t for tiles in lists for t in tiles) == list(range(m_blocks * batch_heads))
    assert all(tiles == sorted(tiles) for tiles in lists)


def test_tile_m_blocks_follow_the_kernel_order():
    # LPT: inside each section of heads, m-blocks run from the last down, heads fastest
    assert tile_m_blocks(3, 4, 2, True) == [2, 2, 1, 1, 0, 0, 2, 2, 1, 1, 0, 0]
    assert tile_m_blocks(3, 5, 2, True)[-3:] == [2, 1, 0]      # the last section holds one head
    assert tile_m_blocks(3, 2, 2, False) == [0, 1, 2, 0, 1, 2]
    # every (batch·head, m-block) appears once, in either order, sections ragged or not
    for lpt, heads, section in ((True, 5, 2), (False, 5, 2), (True, 4, 4)):
        seen = sorted(tile_position(t, 3, heads, section, lpt) for t in range(3 * heads))
        assert seen == [(bh, m) for bh in range(heads) for m in range(3)]


@pytest.mark.parametrize("m_blocks, batch_heads, section", [(1, 1, 1), (3, 5, 2), (7, 13, 4), (171, 32, 6),
                                                              (8, 96, 96), (2, 9, 16)])
def test_tile_m_blocks_is_tile_position_tile_by_tile(m_blocks, batch_heads, section):
    # the section-by-section list the host schedule uses is the per-tile mapping the kernel and
    # the L2 model use, ragged last sections included
    for lpt in (True, False):
        assert tile_m_blocks(m_blocks, batch_heads, section, lpt) == [
            tile_position(t, m_blocks, batch_heads, section, lpt)[1] for t in range(m_blocks * batch_heads)]


@pytest.mark.parametrize("m_blocks, batch_heads, section, ctas", [(9, 7, 3, 5), (16, 12, 4, 132), (5, 40, 8, 17)])
def test_balanced_schedule_is_the_greedy_list_schedule(m_blocks, batch_heads, section, ctas):
    # against the model's plain scan (no heap, flashrung.model.schedule.list_schedule): each tile
    # in launch order to the least-loaded CTA, the lowest index on ties
    seqlen = m_blocks * 128 - 50
    per_m = [live_blocks(m, 128, 128, seqlen, seqlen, True) + 1.0 for m in range(m_blocks)]
    costs = [per_m[m] for m in tile_m_blocks(m_blocks, batch_heads, section, True)]
    lists = [[] for _ in range(ctas)]
    for a in list_schedule(costs, list(range(len(costs))), ctas).assignments:
        lists[a.worker].append(a.tile)
    table = balanced_schedule(m_blocks, batch_heads, section, True, seqlen, seqlen, 128, 128, True, ctas)
    assert _split_table(table, ctas) == lists


@pytest.mark.parametrize("window_left, window_right", [(0, 0), (300, 0), (1024, 0), (300, 200)])
def test_balanced_schedule_of_a_window_is_the_greedy_list_schedule_of_its_tiles(window_left, window_right):
    # a windowed causal launch (d128's 128-row tiles, S8000 in 63 m-blocks, 12 heads in sections of
    # 4, 29 CTAs): each tile estimated by the K/V tiles its window leaves, not the causal count (a
    # right side moves the diagonal)
    m_blocks, batch_heads, section, ctas, seqlen = 63, 12, 4, 29, 8000
    per_m = [live_blocks(m, 128, 128, seqlen, seqlen, True, window_left, window_right) + 1.0
             for m in range(m_blocks)]
    assert per_m == [tile_cost(m, 128, 128, seqlen, seqlen, True, (), window_left, window_right)
                     for m in range(m_blocks)]
    # flat past the window's width
    assert max(per_m) <= -(-(window_left + window_right + 128) // 128) + 2
    costs = [per_m[m] for m in tile_m_blocks(m_blocks, batch_heads, section, True)]
    lists = [[] for _ in range(ctas)]
    for a in list_schedule(costs, list(range(len(costs))), ctas).assignments:
        lists[a.worker].append(a.tile)
    table = balanced_schedule(m_blocks, batch_heads, section, True, seqlen, seqlen, 128, 128, True, ctas,
                              window_left=window_left, window_right=window_right)
    assert _split_table(table, ctas) == lists
    assert table != balanced_schedule(m_blocks, batch_heads, section, True, seqlen, seqlen, 128, 128, True, ctas)


def test_balanced_schedule_beats_the_stride_on_causal_tiles():
    # the suite's d64 causal S32k row (171 m-blocks of 192 rows, 32 heads in sections of 6):
    # makespan of the estimated work, stride against the balanced table; and the table is the
    # model's greedy list schedule of the same costs
    m_blocks, heads, ctas, section = 171, 32, 132, 6
    per_m = [c + 1.0 for c in causal_costs(192, 128, 32768, 32768)]
    costs = [per_m[m] for m in tile_m_blocks(m_blocks, heads, section, True)]
    table = balanced_schedule(m_blocks, heads, section, True, 32768, 32768, 192, 128, True, ctas)
    balanced = max(sum(costs[t] for t in tiles) for tiles in _split_table(table, ctas))
    stride = max(sum(costs[i::ctas]) for i in range(ctas))
    mean = sum(costs) / ctas
    assert balanced == pytest.approx(list_schedule(costs, list(range(len(costs))), ctas).makespan)
    assert balanced / mean < 1.01 < stride / mean


def test_pool_start_is_the_longest_suffix_within_the_share():
    costs = [5.0, 4.0, 3.0, 2.0, 1.0]          # 15 in all
    assert pool_start(costs, 0.0) == 5           # no pool
    assert pool_start(costs, 0.1) == 4           # 1 <= 1.5, 1 + 2 > 1.5
    assert pool_start(costs, 0.2) == 3           # 1 + 2 = 3 <= 3
    assert pool_start(costs, 0.99) == 1          # all but the first
    assert pool_start([], 0.5) == 0
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="pool_share"):
            pool_start(costs, bad)


def test_a_tiles_overhead_reprices_the_lists_alone():
    # tile_overhead_steps (host-side only): the lists' estimate of a tile's prologue and epilogue
    # moves every tile's price by the same steps, so the lists are another permutation of the same
    # tiles; the default is TILE_OVERHEAD_KV_TILES, and the configuration refuses a negative one
    args = (22, 64, 16, True, 4096, 4096, 192, 128, True, 132, (0.5, 0.75, 1.0))
    one, three = balanced_schedule(*args), balanced_schedule(*args, overhead=3.0)
    assert one == balanced_schedule(*args, overhead=TILE_OVERHEAD_KV_TILES) and one != three
    assert sorted(one[133:]) == sorted(three[133:]) == list(range(22 * 64))
    assert tile_cost(3, 192, 128, 4096, 4096, True, overhead=3.0) == tile_cost(3, 192, 128, 4096, 4096, True) + 2.0
    base = fwd.default_config(64, True, 4096)
    assert base.tile_overhead_steps == TILE_OVERHEAD_KV_TILES
    with pytest.raises(ValueError, match="tile_overhead_steps"):
        base.__class__(**{**base.__dict__, "tile_overhead_steps": -1.0}).check(64)


def test_a_packs_tiles_take_the_same_overhead():
    # tile_overhead_steps reaches a pack's table too (its costs, its lists, its pool's start): each
    # tile's price moves by the same steps, the tiles stay the same
    lens_q, lens_k = (300, 0, 129, 1, 640), (200, 5, 129, 1, 700)
    args = (4, 5, 8, True, 128, 128, True, 7)
    tiles, costs = packed_tiles(lens_q, lens_k, *args)
    tiles3, costs3 = packed_tiles(lens_q, lens_k, *args, overhead=3.0)
    assert sorted(tiles.tolist()) == sorted(tiles3.tolist())
    assert sorted((costs + 2.0).tolist()) == sorted(costs3.tolist())
    one = packed_handout_table(lens_q, lens_k, *args, 100, pool_share=0.2)
    three = packed_handout_table(lens_q, lens_k, *args, 100, pool_share=0.2, overhead=3.0)
    assert int(one[7]) == pool_start(costs, 0.2) and int(three[7]) == pool_start(costs3, 0.2)
    assert int(one[7]) != int(three[7])


@pytest.mark.parametrize("seed", range(4))
def test_pool_start_is_the_walk_from_the_last_tile(seed):
    # pool_start sums the suffixes at once; the same start as adding tiles from the last one while
    # the share's budget holds, on costs with ties, zeros and a pack's spread
    rng = np.random.default_rng(seed)
    costs = np.concatenate([rng.integers(0, 40, 300) / 4.0, np.zeros(3)])
    for share in (0.0, 0.01, 0.03, 0.25, 0.9):
        budget, start = share * costs.sum(), costs.size
        while start > 0 and costs[start - 1] <= budget:
            budget -= costs[start - 1]
            start -= 1
        assert pool_start(costs, share) == start, share


@pytest.mark.parametrize("pool_share", [0.0, 0.03, 0.5])
def test_balanced_schedule_lists_the_order_before_its_pool(pool_share):
    # property: the lists hold exactly the launch order's prefix before the pool, each CTA in
    # launch order, and offsets[ctas] (what the kernel reads as the pool's first item) is its length
    m_blocks, heads, section, ctas = 64, 16, 4, 132
    seqlen = m_blocks * 128
    table = balanced_schedule(m_blocks, heads, section, True, seqlen, seqlen, 128, 128, True, ctas,
                              pool_share=pool_share)
    costs = [tile_cost(m, 128, 128, seqlen, seqlen, True) for m in tile_m_blocks(m_blocks, heads, section, True)]
    first = pool_start(costs, pool_share)
    lists = _split_table(table, ctas)
    assert table[ctas] == first and sorted(t for tiles in lists for t in tiles) == list(range(first))
    assert all(tiles == sorted(tiles) for tiles in lists)
    assert sum(costs[first:]) <= pool_share * sum(costs) + 1e-9
    assert (first < len(costs)) is (pool_share > 0)


D64_SHARE = (0.65, 0.83, 1.0)     # config.PARTIAL_TILE_COST_SHARE[(64, 192)], d64's 192-row tile


def test_tile_cost_scales_only_the_partial_last_tile():
    # S4096 = 21 whole 192-row tiles + 64 rows (one consumer warpgroup); S3968: + 128 rows (two)
    for seqlen, share in ((4096, 0.65), (3968, 0.83)):
        last = -(-seqlen // 192) - 1
        whole = [tile_cost(m, 192, 128, seqlen, seqlen, True) for m in range(last + 1)]
        shared = [tile_cost(m, 192, 128, seqlen, seqlen, True, D64_SHARE) for m in range(last + 1)]
        assert shared[:last] == whole[:last]
        assert shared[last] == pytest.approx(share * whole[last])
        assert whole[last] == live_blocks(last, 192, 128, seqlen, seqlen, True) + 1.0
    assert tile_cost(0, 192, 128, 1, 1, True, D64_SHARE) == pytest.approx(0.65 * 2.0)   # one row, one K/V tile


@pytest.mark.parametrize("batch_heads, seqlen", [(256, 4096), (128, 8192), (64, 16384), (256, 4000 + 64)])
def test_balanced_partial_tiles_shortens_the_makespan_of_the_measured_costs(batch_heads, seqlen):
    # property: with tiles costing what the tile trace measured (a partial last tile at its share),
    # the lists dealt with the shares end no later than the whole-tile estimate's, and at the
    # suite's d64 causal S4096 (one consumer's rows in every head's last tile) about 2.7% sooner
    m_blocks, ctas = -(-seqlen // 192), 132
    section = min(fwd.head_section(seqlen, 32, 32, 64, 2, 16 << 20), batch_heads)
    actual = [tile_cost(m, 192, 128, seqlen, seqlen, True, D64_SHARE) for m in range(m_blocks)]
    per_tile = tile_m_blocks(m_blocks, batch_heads, section, True)

    def makespan(share):
        lists = _split_table(balanced_schedule(m_blocks, batch_heads, section, True, seqlen, seqlen, 192, 128, True,
                                               ctas, share), ctas)
        return max(sum(actual[per_tile[t]] for t in tiles) for tiles in lists)

    whole, shared = makespan(()), makespan(D64_SHARE)
    assert shared <= whole * 1.0005
    if (batch_heads, seqlen) == (256, 4096):
        assert shared < 0.98 * whole


@pytest.mark.parametrize("head_dim, batch, heads, seqlen, budget, expected", [
    (160, 2, 16, 8192, 3, 2), (160, 4, 16, 8192, 3, 2), (160, 8, 16, 4096, 6, 4), (160, 16, 16, 2048, 12, 8),
    (128, 2, 16, 8192, 4, 4), (128, 3, 5, 4096, 8, 8), (128, 2, 9, 2048, 16, 9), (256, 1, 7, 8192, 2, 2)])
def test_balanced_section_divides_the_columns_where_the_lists_end_sooner(head_dim, batch, heads, seqlen, budget,
                                                                         expected):
    # property: the section a balanced launch walks is the L2 budget's or a narrower one dividing
    # the columns (at least half as wide), and never one the lists' model ends later; MLA's
    # (mean K/V width 160) divides, as does B2 H9 S2048; B3 H5 S4096 has fewer tiles than CTAs a
    # section and keeps its 8 (5 would end at 1.147x the mean, 8 at 1.037x); d256 B1 H7 keeps 2
    m_blocks, columns = seqlen // 128, batch * heads
    assert min(fwd.head_section(seqlen, heads, heads, head_dim, 2, 16 << 20), columns) == budget
    args = (True, seqlen, seqlen, 128, 128, True, 132)
    width = balanced_section(m_blocks, columns, budget, 1, *args)
    assert width == expected and width <= budget
    assert width == budget or (columns % width == 0 and 2 * width >= budget)
    assert lists_makespan(m_blocks, columns, width, *args) <= lists_makespan(m_blocks, columns, budget, *args)
    # a GQA group's q-heads stay in one section: a width that splits a group is never taken
    assert balanced_section(m_blocks, columns, budget, budget, *args) == budget
    assert balanced_section(m_blocks, columns, budget, 1, False, *args[1:]) == budget     # no LPT order


@pytest.mark.parametrize("batch, heads, seqlen", [(2, 16, 8192), (4, 16, 8192), (8, 16, 4096), (16, 16, 2048)])
def test_divided_sections_end_mla_causal_lists_as_evenly_as_a_power_of_two_head_dim(batch, heads, seqlen):
    # property: MLA's 192/128 sizes its 16 MiB sections at 3, 6 or 12 columns, none dividing 32
    # to 256; its last section's heavy tiles then end the lists up to 5% past the mean work a CTA
    # (the tile trace measured 4.6% of the CTAs' time idle at B2 H16 S8192 on an H100). Divided,
    # the model's makespan is within 1% of the mean, as d128's is with the same tile and count
    m_blocks, ctas, columns = seqlen // 128, 132, batch * heads
    budget = min(fwd.head_section(seqlen, heads, heads, (192 + 128) // 2, 2, 16 << 20), columns)
    args = (True, seqlen, seqlen, 128, 128, True, ctas)
    divided = balanced_section(m_blocks, columns, budget, 1, *args)
    assert columns % budget and not columns % divided
    assert lists_makespan(m_blocks, columns, budget, *args) > 1.015
    assert lists_makespan(m_blocks, columns, divided, *args) < 1.01
    # the model is the lists' own: the table dealt for the divided section ends where it says
    cost = [tile_cost(m, 128, 128, seqlen, seqlen, True) for m in range(m_blocks)]
    lists = _split_table(balanced_schedule(m_blocks, columns, divided, True, seqlen, seqlen, 128, 128, True, ctas),
                         ctas)
    per_tile = tile_m_blocks(m_blocks, columns, divided, True)
    loads = [sum(cost[per_tile[t]] for t in tiles) for tiles in lists]
    assert max(loads) / (sum(loads) / ctas) == pytest.approx(lists_makespan(m_blocks, columns, divided, *args))


@pytest.mark.parametrize("num_m_blocks, batch_heads, section", [(3, 5, 2), (7, 13, 4), (1, 1, 1), (9, 12, 12)])
def test_tile_id_of_inverts_tile_position(num_m_blocks, batch_heads, section):
    # the packed table names the launch's own tile ids: the kernel decodes them back (tile_coords)
    for lpt in (True, False):
        for t in range(num_m_blocks * batch_heads):
            assert tile_id_of(*tile_position(t, num_m_blocks, batch_heads, section, lpt), num_m_blocks,
                              batch_heads, section, lpt) == t


# packs: one long and many short sequences; Sq != Sk within a pack, an empty query range, an empty
# key range; lengths off the tile edges
PACKS = [((8192, 4096, 4096) + (1024,) * 8, None), ((1000, 4097, 17, 0, 300), (1000, 4097, 3000, 5, 0)),
         ((64, 65, 1, 192, 127, 128, 63), (64, 63, 1, 192, 129, 128, 200)), ((130,), None)]


@pytest.mark.parametrize("lengths", PACKS, ids=["long-short", "uneven", "box-edges", "one"])
@pytest.mark.parametrize("causal, lpt, window", [(True, True, (-1, 0)), (False, False, (-1, 0)),
                                                 (True, True, (300, 0)), (True, True, (64, 40))])
def test_packed_schedule_lists_each_tile_with_a_row_once_priced_by_its_own_sequence(lengths, causal, lpt, window):
    # property: the table lists exactly the launch's tiles whose q-tile holds a row of its own
    # sequence (an empty one is never drawn; one with rows but no key still runs, to write its zeros
    # and -inf), each once; every CTA walks its tiles heaviest first; the makespan under each tile's
    # own cost is within one tile of the tile-by-tile greedy list schedule's
    lens_q, lens_k = lengths[0], lengths[1] or lengths[0]
    heads, block_m, kv_tile, ctas = 3, 128, 128, 7
    num_m_blocks = -(-max(lens_q) // block_m)
    batch_heads = len(lens_q) * heads
    section = 4
    table = packed_schedule(lens_q, lens_k, heads, num_m_blocks, section, lpt, block_m, kv_tile, causal, ctas,
                            (), *window)
    assert table.dtype == np.int32
    lists = _split_table(table.tolist(), ctas)

    def cost(tile):
        head, m = tile_position(tile, num_m_blocks, batch_heads, section, lpt)
        b = head // heads
        if lens_k[b] == 0:
            return TILE_OVERHEAD_KV_TILES   # no K/V tile: its prologue and epilogue
        return tile_cost(m, block_m, kv_tile, lens_q[b], lens_k[b], causal, (), *window)

    with_rows = sorted(t for t in range(num_m_blocks * batch_heads)
                       if tile_position(t, num_m_blocks, batch_heads, section, lpt)[1] * block_m
                       < lens_q[tile_position(t, num_m_blocks, batch_heads, section, lpt)[0] // heads])
    assert sorted(t for tiles in lists for t in tiles) == with_rows
    assert all([cost(t) for t in tiles] == sorted((cost(t) for t in tiles), reverse=True) for tiles in lists)
    costs = sorted((cost(t) for t in with_rows), reverse=True)
    greedy = list_schedule(costs, list(range(len(costs))), ctas)
    makespan = max(sum(cost(t) for t in tiles) for tiles in lists)
    assert makespan <= max(greedy.loads) + max(costs)


def test_packed_schedule_balances_where_the_longest_sequences_estimate_does_not():
    # the pack the bench times (8192, 4096 x2, 1024 x8; 16 heads, d128's 128-row tiles, 132 CTAs),
    # causal: the launch's balanced lists priced as if each sequence were the longest leave the CTA
    # with the most true work at 3.8x the even share (empty tiles one step each); the packed table
    # within 1% of it
    lens = (8192, 4096, 4096) + (1024,) * 8
    heads, ctas, num_m_blocks = 16, 132, 64
    batch_heads = len(lens) * heads

    def true_cost(tile):
        head, m = tile_position(tile, num_m_blocks, batch_heads, batch_heads, True)
        n = lens[head // heads]
        return tile_cost(m, 128, 128, n, n, True) if m * 128 < n else 1.0

    even = sum(true_cost(t) for t in range(num_m_blocks * batch_heads) if true_cost(t) > 1.0) / ctas
    longest = balanced_schedule(num_m_blocks, batch_heads, batch_heads, True, 8192, 8192, 128, 128, True, ctas)
    packed = packed_schedule(lens, lens, heads, num_m_blocks, batch_heads, True, 128, 128, True, ctas).tolist()
    spans = [max(sum(true_cost(t) for t in tiles) for tiles in _split_table(table, ctas)) / even
             for table in (longest, packed)]
    assert spans[0] > 3.5 and spans[1] < 1.01, spans


@pytest.mark.parametrize("kind", ["whole", "fractional", "zeros and ties"])
def test_deal_is_the_greedy_list_schedule_with_whole_or_fractional_costs(kind):
    # whole costs take the integer-keyed heap (load << bits | cta), fractional ones the (load, cta)
    # pairs: both must hand every tile to the CTA the plain scan does (least load, lowest index on
    # ties) and report the same loads — a key that ordered ties or sums differently would change
    # the tables the GPU timings ran with
    rng = np.random.default_rng(3)
    ctas, tiles = 13, 700
    costs = {"whole": rng.integers(1, 70, tiles).astype(float),
             "fractional": rng.integers(1, 70, tiles) * rng.choice([0.55, 0.8, 1.0], tiles),
             "zeros and ties": rng.choice([0.0, 1.0, 4.0], tiles)}[kind].tolist()
    loads, owner = _deal(costs, ctas)
    greedy = list_schedule(costs, list(range(tiles)), ctas)
    assert owner == [a.worker for a in greedy.assignments]
    assert loads == list(greedy.loads)


@pytest.mark.parametrize("ctas, tiles", [(7, 40), (132, 4320), (13, 13 * PACKED_GREEDY_TILES_PER_CTA + 1),
                                         (132, 20000)])
def test_deal_packed_is_the_greedy_list_schedule_or_its_rounds(ctas, tiles):
    # up to PACKED_GREEDY_TILES_PER_CTA tiles a CTA, each tile to the least-loaded CTA (lowest index
    # on ties) exactly as the greedy list schedule; past it, rounds of `ctas` tiles, one tile a CTA
    # each round and the round's heaviest to the least-loaded, ending within a tile of the greedy
    # (costs: an L2-sectioned pack's, heaviest first section by section)
    rng = np.random.default_rng(tiles)
    cost = np.concatenate([np.sort(rng.integers(3, 70, n))[::-1] for n in np.diff(
        np.sort(np.concatenate([[0, tiles], rng.integers(0, tiles, 5)])))]).astype(float)
    owner = deal_packed(cost, ctas)
    loads = np.bincount(owner, weights=cost, minlength=ctas)
    greedy = list_schedule(cost.tolist(), list(range(tiles)), ctas)
    if tiles <= PACKED_GREEDY_TILES_PER_CTA * ctas:
        assert owner.tolist() == [a.worker for a in greedy.assignments]
    else:
        for first in range(0, tiles, ctas):
            assert len(set(owner[first:first + ctas].tolist())) == min(ctas, tiles - first)
        assert loads.max() <= greedy.makespan + cost.max()
        # the rounds exactly: each round's tiles heaviest first (ties in order) to the CTAs by their
        # load so far (ties by index) — the owners the GPU timings of the lists ran with
        load, rounds = [0.0] * ctas, []
        for first in range(0, tiles, ctas):
            batch = sorted(range(first, min(first + ctas, tiles)), key=lambda t: (-cost[t], t))
            by_load = sorted(range(ctas), key=lambda c: (load[c], c))
            for t, c in zip(batch, by_load):
                rounds.append((t, c))
                load[c] += cost[t]
        assert owner.tolist() == [c for _, c in sorted(rounds)]
    with pytest.raises(ValueError, match="ctas"):
        deal_packed(cost, 0)


@pytest.mark.parametrize("head_dim, heads, block_m, mib", [(64, 32, 192, 16), (128, 16, 128, 16)])
def test_packed_lists_in_l2_sections_end_evenly(head_dim, heads, block_m, mib):
    # a regression: the pack's lists dealt a round of `ctas` tiles at a time, in order, ended the
    # L2-sectioned causal pack (8192, 4096 x2, 1024 x8) at 1.24x the mean work a CTA at d128 (1.05x
    # at d64; 20% slower than the run-time hand-out on an H100): a round held one section's lightest
    # tiles and the next one's heaviest. Dealt greedily, within 1% of the mean
    lens = np.array((8192, 4096, 4096) + (1024,) * 8)
    ctas, num_m_blocks = 132, -(-8192 // block_m)
    sections = PackedSections(mib << 20, 4 * head_dim)
    args = (lens, lens, heads, num_m_blocks, len(lens) * heads, True, block_m, 128, True, ctas)
    table = packed_schedule(*args, l2_sections=sections)
    tiles, costs = packed_tiles(*args, l2_sections=sections)
    cost_of = dict(zip(tiles.tolist(), costs.tolist()))
    loads = [sum(cost_of[t] for t in tiles_of) for tiles_of in _split_table(table.tolist(), ctas)]
    assert sorted(t for tiles_of in _split_table(table.tolist(), ctas) for t in tiles_of) == sorted(tiles.tolist())
    assert max(loads) * ctas / sum(loads) < 1.01


@pytest.mark.parametrize("pool_share", [0.0, 0.03, 0.4])
@pytest.mark.parametrize("ctas", [1, 7, 132])
def test_the_packed_table_with_a_pool_lists_the_order_then_draws_the_rest(ctas, pool_share):
    # a causal pack's default (config.PACKED_CAUSAL_POOL_SHARE): the tiles before the pool dealt into
    # lists (deal_packed), each list in the launch order; the pool — the order's last tiles, up to
    # the share of the estimated work — drawn through the table after them, then each CTA's "none
    # left". Replayed with the draws in any interleaving, every tile with a row runs once
    lens_q, lens_k = (300, 0, 129, 1, 640, 2000), (200, 5, 129, 1, 700, 2000)
    heads, num_m_blocks, section, block_m = 4, 16, 8, 128
    num_items = num_m_blocks * len(lens_q) * heads
    args = (heads, num_m_blocks, section, True, block_m, 128, True, ctas)
    sections = PackedSections(1 << 20, 256)
    table = packed_handout_table(lens_q, lens_k, *args, num_items, l2_sections=sections, pool_share=pool_share)
    tiles, costs = packed_tiles(lens_q, lens_k, *args, l2_sections=sections)
    offsets, order = table[:ctas + 1], table[ctas + 1:]
    listed = pool_start(costs, pool_share)
    assert int(offsets[0]) == 0 and int(offsets[ctas]) == listed
    assert list(order[listed:]) == list(tiles[listed:]) + [num_items] * ctas
    position = {int(t): i for i, t in enumerate(tiles)}
    owner = deal_packed(costs[:listed], ctas)
    for cta in range(ctas):
        mine = [int(t) for t in order[offsets[cta]:offsets[cta + 1]]]
        assert [position[t] for t in mine] == sorted(position[t] for t in mine)
        assert mine == [int(t) for t in tiles[:listed][owner == cta]]
    ran = [int(t) for t in order[:listed]] + _replay_draws(order, listed, num_items, ctas)
    assert sorted(ran) == sorted(int(t) for t in tiles)
    assert costs[listed:].sum() <= pool_share * costs.sum() + 1e-9


def _replay_draws(order, pool, num_items, ctas):
    """The items a table's pool hands out (``order`` past position ``pool``), the CTAs drawing in a
    random interleaving until each reads its "none left" (``num_items``); no draw reads past it."""
    ran, draws, live = [], 0, list(range(ctas))
    rng = random.Random(ctas)
    while live:
        cta = rng.choice(live)
        assert pool + draws < len(order)
        item = int(order[pool + draws])
        draws += 1
        if item == num_items:
            live.remove(cta)
        else:
            ran.append(item)
    return ran


@pytest.mark.parametrize("ctas", [1, 7, 132])
def test_the_packed_handout_table_hands_each_tile_with_a_row_out_once(ctas):
    # the run-time hand-out through the table (handout_table), replayed on the host: each CTA's
    # listed first tile, then draws in any interleaving; every tile with a row runs exactly once,
    # heaviest first, no id past its sequence's rows is handed out, every CTA reads its "none left",
    # and no draw reads past the table (a pack with fewer tiles than CTAs too)
    lens_q, lens_k = (300, 0, 129, 1, 640), (200, 5, 129, 1, 700)
    heads, num_m_blocks, section, block_m = 4, 5, 8, 128
    num_items = num_m_blocks * len(lens_q) * heads
    args = (heads, num_m_blocks, section, True, block_m, 128, True, ctas)
    table = packed_handout_table(lens_q, lens_k, *args, num_items)
    tiles, costs = packed_tiles(lens_q, lens_k, *args)
    assert len(tiles) == heads * sum(-(-n // block_m) for n in lens_q) and list(costs) == sorted(costs, reverse=True)
    offsets, order = table[:ctas + 1], table[ctas + 1:]
    assert list(order) == list(tiles) + [num_items] * ctas
    ran = [int(t) for cta in range(ctas) for t in order[offsets[cta]:offsets[cta + 1]]]
    ran += _replay_draws(order, int(offsets[ctas]), num_items, ctas)
    assert sorted(ran) == sorted(int(t) for t in tiles)
    for tile in ran:
        head, m = tile_position(tile, num_m_blocks, len(lens_q) * heads, section, True)
        assert m * block_m < lens_q[head // heads]
    with pytest.raises(ValueError, match="num_items"):
        packed_handout_table(lens_q, lens_k, *args, int(tiles.max()))


def test_a_packed_launch_finds_its_table_by_the_lengths_read_once(monkeypatch):
    # the launch's table is packed_schedule's for the lengths in cu_seqlens; the same tensors
    # again (unchanged) find it without another copy to the host; other lengths get their own
    from flashrung import gate

    lens_q, lens_k = (300, 0, 129, 1), (200, 5, 129, 1)
    cu = (gate.cu_seqlens(lens_q, "cpu"), gate.cu_seqlens(lens_k, "cpu"))
    copies = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: (copies.append(1) if any(t is c for c in cu) else None)
                        or real(t))
    args = (8, 3, 16, True, 128, 128, True, 10, torch.device("cpu"))
    table = fwd._packed_schedule_table(cu, *args)
    assert len(copies) == 2 and table.tolist() == packed_schedule(lens_q, lens_k, *args[:-1]).tolist()
    assert fwd._packed_schedule_table(cu, *args) is table and len(copies) == 2
    cu[0][2:].add_(1)                                                              # sequence 1: one row
    other = fwd._packed_schedule_table(cu, *args)
    assert len(copies) == 3
    assert other.tolist() == packed_schedule((300, 1, 129, 1), lens_k, *args[:-1]).tolist()
    handout = fwd._packed_schedule_table(cu, *args, handout_items=96)
    assert len(copies) == 3
    assert handout.tolist() == packed_handout_table((300, 1, 129, 1), lens_k, *args[:-1], 96).tolist()


def test_packed_sections_order_an_even_pack_as_the_unpacked_lpt_launch():
    # four sequences of 8192 at d128 H16 are B4 S8192 packed: in L2 sections their table walks the
    # unpacked launch's LPT order (16 MiB sections of 4 columns, each from its last q-tile down),
    # where heaviest first across the pack ran every column's last q-tile at once (all 256 MiB of
    # K/V in flight)
    lens, heads, num_m_blocks = (8192,) * 4, 16, 64
    section = head_section(8192, heads, heads, 128, 2, 16 << 20)
    assert section == 4
    args = (heads, num_m_blocks, section, True, 128, 128, True, 132)
    tiles, _ = packed_tiles(lens, lens, *args, (), -1, 0, PackedSections(16 << 20, 2 * 128 * 2))
    assert tiles.tolist() == list(range(num_m_blocks * len(lens) * heads))
    across, _ = packed_tiles(lens, lens, *args)
    assert [tile_position(int(t), num_m_blocks, len(lens) * heads, section, True)[1] for t in across[:64]] == [63] * 64


@pytest.mark.parametrize("lengths", PACKS, ids=["long-short", "uneven", "box-edges", "one"])
@pytest.mark.parametrize("causal, window", [(True, (-1, 0)), (False, (-1, 0)), (True, (300, 0))])
@pytest.mark.parametrize("heads, group", [(3, 1), (8, 4)])
def test_packed_sections_keep_each_tile_and_walk_budget_sized_sections_heaviest_first(lengths, causal, window,
                                                                                    heads, group):
    # property: the sectioned order holds the same tiles as heaviest first across the pack; each
    # section's K/V fits the budget (or is one K/V head); a K/V head's q-heads share a section;
    # sections follow one another, each heaviest first, their heaviest tiles never rising
    lens_q, lens_k = lengths[0], lengths[1] or lengths[0]
    block_m, kv_tile, budget, per_key = 128, 128, 1 << 20, 512
    num_m_blocks = -(-max(lens_q) // block_m)
    batch_heads = len(lens_q) * heads
    args = (heads, num_m_blocks, 4, True, block_m, kv_tile, causal, 7, (), *window)
    sections = PackedSections(budget, per_key, group)
    tiles, costs = packed_tiles(lens_q, lens_k, *args, sections)
    across, _ = packed_tiles(lens_q, lens_k, *args)
    assert sorted(tiles.tolist()) == sorted(across.tolist())
    rank = sections.of(lens_q, lens_k, heads, block_m, kv_tile, causal, *window)
    column = [tile_position(int(t), num_m_blocks, batch_heads, 4, True)[0] for t in tiles]
    by_tile = [int(rank[c]) for c in column]
    assert by_tile == sorted(by_tile)
    heaviest = []
    for r in sorted(set(by_tile)):
        part = [float(c) for c, x in zip(costs, by_tile) if x == r]
        assert part == sorted(part, reverse=True)
        heaviest.append(part[0])
    assert heaviest == sorted(heaviest, reverse=True)
    for r in set(rank.tolist()):
        kv_heads = {c // group for c in range(batch_heads) if rank[c] == r}
        assert len(kv_heads) == 1 or sum(lens_k[h * group // heads] * per_key for h in kv_heads) <= budget
    assert all(len({int(rank[c]) for c in range(h * group, (h + 1) * group)}) == 1 for h in range(batch_heads // group))


@pytest.mark.parametrize("head_dim, heads, block_m, mib", [(128, 16, 128, 16), (64, 32, 192, 48)])
@pytest.mark.parametrize("lengths", [(8192, 4096, 4096) + (1024,) * 8, (8192,) * 4, (32768,), (1024,) * 64,
                                     (2048,) * 16 + (512,) * 32, (16384, 700, 3000, 256, 12000, 6000)],
                         ids=["long-short", "four", "one-long", "many-short", "two-sizes", "mixed"])
def test_packed_sections_hand_out_an_even_end(head_dim, heads, block_m, mib, lengths):
    # property: in L2 sections the run-time hand-out (each tile of the order to the first free CTA,
    # at its estimated cost) still ends within 1% of the mean work a CTA, as heaviest first across
    # the pack does (1.000-1.005 there, 1.000-1.007 sectioned on these packs): the sections keep the
    # pack's lightest tiles for its end
    ctas = 132
    args = (heads, -(-max(lengths) // block_m), 4, True, block_m, 128, True, ctas)
    _, costs = packed_tiles(lengths, lengths, *args, (), -1, 0, PackedSections(mib << 20, 2 * head_dim * 2))
    free = [(0.0, i) for i in range(ctas)]
    for cost in costs:
        load, i = free[0]
        heapq.heapreplace(free, (load + float(cost), i))
    assert max(load for load, _ in free) * ctas / float(costs.sum()) < 1.01


@pytest.mark.parametrize("seed", range(6))
def test_sequence_tile_costs_are_tile_cost_tile_by_tile(seed):
    # the pack's costs computed at once (a table is built on every call with new lengths) are the
    # scalar estimate's, tile for tile: sequences without a row or a key, Sq ≠ Sk both ways, a
    # window's either side, a partial last tile's consumer share
    rng = random.Random(seed)
    block_m, kv_tile = rng.choice([(128, 128), (192, 128), (128, 64)])
    lens_q = [rng.choice([0, 1, 17, 127, 128, 129, 1000, 4097, rng.randrange(1, 3000)]) for _ in range(9)]
    lens_k = [rng.choice([0, lq, rng.randrange(1, 5000)]) for lq in lens_q]
    for causal in (False, True):
        for window_left, window_right in ((-1, 0), (300, 0), (64, 200)):
            share = (0.45, 0.75, 1.0) if block_m == 192 else ()
            seq, m, cost = sequence_tile_costs(lens_q, lens_k, block_m, kv_tile, causal, share, window_left,
                                               window_right)
            expected = [(b, t, TILE_OVERHEAD_KV_TILES if lk == 0 else
                         tile_cost(t, block_m, kv_tile, lq, lk, causal, share, window_left, window_right))
                        for b, (lq, lk) in enumerate(zip(lens_q, lens_k)) for t in range(-(-lq // block_m))]
            assert list(zip(seq.tolist(), m.tolist(), cost.tolist())) == expected, (causal, window_left)


def _sections_head_by_head(sections, lens_q, lens_k, heads_q, block_m, kv_tile, causal):
    """PackedSections.of's rule walked one K/V head at a time (the definition it computes)."""
    heaviest = [max((tile_cost(t, block_m, kv_tile, lq, lk, causal) if lk else TILE_OVERHEAD_KV_TILES
                     for t in range(-(-lq // block_m))), default=0.0) for lq, lk in zip(lens_q, lens_k)]
    kv_heads = heads_q // sections.group
    rank, section, used = {}, 0, 0
    for b in sorted(range(len(lens_q)), key=lambda b: -heaviest[b]):     # stable: ties in pack order
        head_bytes = lens_k[b] * sections.kv_bytes_per_key
        for kv_head in range(kv_heads):
            if used and used + head_bytes > sections.budget_bytes:
                section, used = section + 1, 0
            used += head_bytes
            rank[b * kv_heads + kv_head] = section
    return [rank[c // sections.group] for c in range(len(lens_q) * heads_q)]


@pytest.mark.parametrize("seed", range(24))
def test_packed_sections_fill_as_a_head_by_head_walk(seed):
    # each sequence's K/V heads placed at once are where a head-by-head walk puts them: the open
    # section filled as far as it holds, then whole sections, a head alone where one overflows the
    # budget, sequences without keys in the open section
    rng = random.Random(seed)
    heads_q, group = rng.choice([(8, 1), (8, 4), (32, 8), (6, 3)])
    lens = [rng.choice([0, 1, 256, 1024, 4096, rng.randrange(1, 9000)]) for _ in range(rng.randrange(1, 12))]
    lens_k = [rng.choice([0, n, rng.randrange(0, 9000)]) for n in lens]
    sections = PackedSections(rng.choice([1, 4096, 1 << 18, 1 << 20, 16 << 20]), rng.choice([256, 512]), group)
    got = sections.of(lens, lens_k, heads_q, 128, 128, True)
    assert got.tolist() == _sections_head_by_head(sections, lens, lens_k, heads_q, 128, 128, True)


@pytest.mark.parametrize("seed", range(4))
def test_packed_tiles_order_by_section_then_heaviest_then_launch_order(seed):
    # the order's whole key, not only its sections' heaviest-first runs: equal costs keep the
    # launch's tile order, in each section and across the pack
    rng = random.Random(seed)
    lens = [rng.choice([1, 300, 1024, 2048, rng.randrange(1, 4000)]) for _ in range(rng.randrange(1, 10))]
    heads, block_m = 4, 128
    num_m_blocks = -(-max(lens) // block_m)
    args = (heads, num_m_blocks, 3, True, block_m, 128, True, 11)
    for sections in (None, PackedSections(1 << 20, 512, 2)):
        tiles, costs = packed_tiles(lens, lens, *args, (), -1, 0, sections)
        rank = [0] * (len(lens) * heads) if sections is None else sections.of(lens, lens, heads, block_m, 128, True)
        column = [tile_position(int(t), num_m_blocks, len(lens) * heads, 3, True)[0] for t in tiles]
        keys = [(int(rank[c]), -float(cost), int(t)) for c, cost, t in zip(column, costs, tiles)]
        assert keys == sorted(keys)


def test_packed_sections_reject_bad_input():
    with pytest.raises(ValueError, match="PackedSections.budget_bytes must be a positive integer, got 0"):
        PackedSections(0, 512)
    with pytest.raises(ValueError, match="PackedSections.group must be a positive integer"):
        PackedSections(1 << 20, 512, 0)
    with pytest.raises(ValueError, match=r"heads_q \(6\) must be a multiple of PackedSections.group \(4\)"):
        PackedSections(1 << 20, 512, 4).of((4,), (4,), 6, 128, 128, True)


def test_packed_schedule_rejects_bad_input():
    with pytest.raises(ValueError, match="as many sequences"):
        packed_schedule((4, 5), (4,), 2, 1, 2, True, 128, 128, True, 8)
    with pytest.raises(ValueError, match="sequence 1 has 300 rows: more than the launch's 2 q-tiles"):
        packed_schedule((4, 300), (4, 4), 2, 2, 2, True, 128, 128, True, 8)
    with pytest.raises(ValueError, match="must not be negative"):
        packed_schedule((4, -1), (4, 4), 2, 2, 2, True, 128, 128, True, 8)
    with pytest.raises(ValueError, match="ctas"):
        packed_schedule((4,), (4,), 2, 1, 2, True, 128, 128, True, 0)


def test_balanced_schedule_rejects_bad_input():
    with pytest.raises(ValueError, match="ctas"):
        balanced_schedule(4, 4, 4, True, 512, 512, 128, 128, True, 0)
    with pytest.raises(ValueError, match="seqlen_q"):
        balanced_schedule(4, 4, 4, True, 0, 512, 128, 128, True, 8)
    for share in ((0.5, 0.9), (0.5, 1.0, 1.0, 1.0, 1.0), (0.0, 0.8, 1.0), (0.6, 1.2, 1.0)):
        with pytest.raises(ValueError, match="consumer_share"):
            balanced_schedule(4, 4, 4, True, 512, 512, 192, 128, True, 8, share)


# --------------------------------------------------------------------------- the decode's divisions


def _fast_div(x, mul, shift):
    """schedule.fast_div on the host: umulhi(2·x, mul) >> shift, mul read as unsigned (numpy
    uint64: 2·x and mul are below 2**32, so their product fits)."""
    x = np.asarray(x, dtype=np.uint64)
    return ((x * np.uint64(2) * np.uint64(mul % (1 << 32))) >> np.uint64(32 + shift)).astype(np.int64)


def _dividends(d, rng):
    """0 and its neighbours, both sides of multiples of ``d`` up to the largest below 2**31, the
    largest dividends, and random ones."""
    top = (1 << 31) - 1
    ks = sorted({1, 2, 3, top // d, max(top // d - 1, 1)} | {rng.randrange(1, top // d + 1) for _ in range(40)})
    xs = set(range(0, 260)) | {top, top - 1, top - d, top - top % d, top - top % d - 1}
    xs |= {k * d + e for k in ks for e in (-1, 0, 1)} | {rng.randrange(0, top + 1) for _ in range(200)}
    return np.array(sorted(x for x in xs if 0 <= x <= top), dtype=np.uint64)


def test_fast_divisor_divides_exactly():
    rng = random.Random(2024)
    top = (1 << 31) - 1
    divisors = set(range(1, 5001)) | {1 << k for k in range(31)} | {(1 << k) + e for k in range(2, 31) for e in (-1, 1)}
    divisors |= {top, top - 1, 3 ** 19, 641 * 6700417 % top} | {rng.randrange(1, top + 1) for _ in range(2000)}
    for d in sorted(divisors):
        mul, shift = fast_divisor(d)
        # an int32 argument (i32 in the kernel's signature) and a shift a 32-bit shifter takes
        assert -(1 << 31) <= mul < 0 and 0 <= shift <= 31, d
        xs = _dividends(d, rng)
        assert np.array_equal(_fast_div(xs, mul, shift), (xs // np.uint64(d)).astype(np.int64)), d


@pytest.mark.parametrize("d", [0, -3, 1 << 31, 1 << 40, 2.0, True, "7", None])
def test_fast_divisor_rejects_what_int32_dividing_cannot_take(d):
    with pytest.raises(ValueError, match="num_m_blocks"):
        fast_divisor(d, "num_m_blocks")


def _replay_decode(tile_id, sizes, lpt):
    """schedule.fast_tile_coords and the producer's K/V head as the kernel computes them, from the
    arguments _launch passes (``sizes``: by name, as in the kernel's signature)."""
    def div(x, name):
        return int(_fast_div(x, sizes[f"{name}_mul"], sizes[f"{name}_shift"]))

    if lpt:
        per_section = sizes["num_m_blocks"] * sizes["head_section"]
        section = div(tile_id, "per_section")
        r = tile_id - section * per_section
        first_bh = section * sizes["head_section"]
        narrow = first_bh + sizes["head_section"] > sizes["batch_heads"]
        width, name = (sizes["last_section"], "last_section") if narrow else (sizes["head_section"], "section")
        m_from_last = div(r, name)
        m_block = sizes["num_m_blocks"] - 1 - m_from_last
        bh = first_bh + r - m_from_last * width
    else:
        bh = div(tile_id, "m_blocks")
        m_block = tile_id - bh * sizes["num_m_blocks"]
    b = div(bh, "heads_q")
    h = bh - b * sizes["heads_q"]
    return b, h, m_block, div(h, "group")


@pytest.mark.parametrize("m_blocks, batch, heads_q, heads_kv, section", [
    (1, 1, 1, 1, 1), (3, 1, 5, 5, 2), (7, 1, 13, 13, 4), (171, 2, 16, 2, 6), (8, 4, 24, 3, 96), (2, 3, 3, 1, 16),
    (17, 5, 12, 4, 8), (33, 1, 64, 8, 40), (9, 7, 6, 6, 7), (5, 11, 8, 1, 1000000)])
def test_kernel_decode_walks_the_host_order(m_blocks, batch, heads_q, heads_kv, section):
    # the kernel's (batch, q_head, m_block, kv_head) of every tile, replayed with the launch's magic
    # numbers, is tile_position's (the order the balanced table and the L2 model assume), ragged
    # last sections and sections wider than every column (clamped, as _launch does) included
    batch_heads = batch * heads_q
    clamped = min(section, batch_heads)
    values = fwd._decode_sizes(heads_q, heads_q // heads_kv, m_blocks, batch_heads, clamped)
    assert len(values) == len(fwd._SIZE_ARGS[2:20]) and fwd._SIZE_ARGS[20] == "num_items"
    sizes = dict(zip(fwd._SIZE_ARGS[2:20], values))
    assert sizes["last_section"] == last_section_width(batch_heads, clamped) == (
        batch_heads - (math.ceil(batch_heads / clamped) - 1) * clamped)
    for lpt in (True, False):
        for tile_id in range(m_blocks * batch_heads):
            bh, m = tile_position(tile_id, m_blocks, batch_heads, section, lpt)
            assert (bh, m) == tile_position(tile_id, m_blocks, batch_heads, clamped, lpt)
            b, h, m_block, kv_head = _replay_decode(tile_id, sizes, lpt)
            assert (b * heads_q + h, m_block) == (bh, m) and 0 <= h < heads_q, (lpt, tile_id)
            assert kv_head == h // (heads_q // heads_kv)


@pytest.mark.parametrize("num_tiles, resident, n_kv", [(4096, 132, 128), (4096, 132, 8), (5462, 132, 128),
                                                        (24, 132, 8), (17, 132, 3)])
def test_kernel_split_decode_is_the_plain_one(num_tiles, resident, n_kv):
    # schedule.work_item and kv_split_range with tail_splits' magic numbers against plain division
    full, splits = tail_split(num_tiles, resident, n_kv)
    _, mul, shift = fwd._divisor_args(splits, "tail_splits")
    covered = {}
    for item in range(full, full + (num_tiles - full) * splits):
        tail = item - full
        tile_tail = int(_fast_div(tail, mul, shift))
        split = tail - tile_tail * splits
        assert (tile_tail, split) == divmod(tail, splits)
        lo, hi = (int(_fast_div(s * n_kv, mul, shift)) for s in (split, split + 1))
        assert (lo, hi) == (split * n_kv // splits, (split + 1) * n_kv // splits) and lo < hi
        covered.setdefault(tile_tail, []).append((lo, hi))
    for ranges in covered.values():
        assert [lo for lo, _ in ranges[1:]] == [hi for _, hi in ranges[:-1]] and ranges[-1][1] == n_kv
