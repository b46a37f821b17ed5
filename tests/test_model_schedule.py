"""Causal live blocks and makespan on identical machines (seed 001 0x0B)."""
import pytest

from flashrung.model import schedule as S


@pytest.mark.parametrize("block", [64, 128])
def test_square_causal_live_blocks_is_q_tile_plus_one(block):
    seqlen = 16 * block
    assert S.causal_costs(block, block, seqlen, seqlen) == [m + 1 for m in range(16)]
    # Only the diagonal block of each query tile needs the mask.
    assert all(S.masked_blocks(m, block, block, seqlen, seqlen) == 1 for m in range(16))


def test_non_causal_and_rectangular_blocks():
    assert S.causal_costs(128, 128, 1024, 1024, causal=False) == [8] * 8
    # M = 2N: query tile m reaches key tile 2m + 1.
    assert S.causal_costs(128, 64, 512, 512) == [2, 4, 6, 8]
    # Ragged tail: last query tile of 1000 rows is short but still sees every key.
    assert S.causal_costs(128, 128, 1000, 1000)[-1] == 8


def test_bottom_right_alignment():
    # Sk > Sq: the queries sit at the end of the keys, so every tile sees the prefix.
    assert S.causal_costs(128, 128, 256, 1024) == [7, 8]
    # Sq > Sk: the first rows see no key at all.
    assert S.causal_costs(128, 128, 1024, 256) == [0, 0, 0, 0, 0, 0, 1, 2]


@pytest.mark.parametrize("causal, right", [(True, 0), (False, None), (True, 45)])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 1), (17, 300), (300, 17), (1000, 1000), (333, 4097)])
@pytest.mark.parametrize("window_left", [0, 17, 300])
def test_window_live_blocks_are_the_tiles_holding_a_visible_score(causal, right, seqlen_q, seqlen_k, window_left):
    # the count a windowed launch's estimate rests on, against the mask itself (bottom-right
    # aligned: row i sees keys [i + Sk - Sq - left, i + Sk - Sq + right] causal, right 0 the mask's
    # own and more a window's right side, up to Sk - 1 without)
    block_m, block_n = 128, 64
    off = seqlen_k - seqlen_q
    for q_tile in range(S.q_blocks(seqlen_q, block_m)):
        seen = set()
        for i in range(q_tile * block_m, min((q_tile + 1) * block_m, seqlen_q)):
            lo, hi = max(i + off - window_left, 0), min(i + off + right if causal else seqlen_k - 1, seqlen_k - 1)
            seen |= {j // block_n for j in range(lo, hi + 1)}
        assert S.live_blocks(q_tile, block_m, block_n, seqlen_q, seqlen_k, causal, window_left,
                             right or 0) == len(seen)
        # the tiles seen are one run from the window's first: the kernel visits [first, end)
        if seen:
            assert min(seen) == S.window_first_block(q_tile, block_m, block_n, seqlen_q, seqlen_k, window_left)
            assert sorted(seen) == list(range(min(seen), max(seen) + 1))


def test_no_window_keeps_the_causal_count():
    assert S.window_first_block(5, 128, 128, 1024, 1024) == 0
    assert [S.live_blocks(m, 128, 128, 1024, 1024, True, -1) for m in range(8)] == S.causal_costs(128, 128, 1024, 1024)
    with pytest.raises(ValueError, match="window_left"):
        S.live_blocks(0, 128, 128, 1024, 1024, True, 1.5)


def test_lexical_vs_lpt_makespan_oracle():
    costs = [1, 2, 3, 4, 5, 6]
    lex = S.list_schedule(costs, S.lexical_order(costs), 3)
    lpt = S.list_schedule(costs, S.lpt_order(costs), 3)
    assert sorted(lex.loads) == [5, 7, 9] and lex.makespan == 9
    assert lpt.loads == (7, 7, 7) and lpt.makespan == 7
    assert S.makespan_lower_bound(costs, 3) == 7
    assert S.lpt_order(costs) == [5, 4, 3, 2, 1, 0]


def test_lpt_on_a_causal_launch_beats_lexical():
    costs = S.causal_costs(128, 128, 8192, 8192) * 8        # 8 heads of 64 query tiles
    workers = 132
    lex = S.list_schedule(costs, S.lexical_order(costs), workers).makespan
    lpt = S.list_schedule(costs, S.lpt_order(costs), workers).makespan
    lb = S.makespan_lower_bound(costs, workers)
    assert lb <= lpt < lex


def test_schedule_validation():
    with pytest.raises(ValueError, match="permutation"):
        S.list_schedule([1, 2], [0, 0], 2)
    with pytest.raises(ValueError, match="q_tile"):
        S.live_blocks(8, 128, 128, 1024, 1024)
    with pytest.raises(ValueError, match="workers"):
        S.makespan_lower_bound([1], 0)


def _idle_share(schedule):
    span = schedule.makespan
    return sum(span - load for load in schedule.loads) / (span * len(schedule.loads))


def test_a_hand_out_drawn_at_the_finish_is_the_list_schedule():
    # the greedy list schedule is what a run-time hand-out makes when each worker draws its next
    # tile as it finishes the last (or a fixed lead before: the same order of draws)
    costs = [5.0, 3.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0, 4.0, 0.5]
    order = list(range(len(costs)))
    assert S.reserve_schedule(costs, order, 3, 0.0) == S.list_schedule(costs, order, 3)
    with pytest.raises(ValueError, match="lead"):
        S.reserve_schedule(costs, order, 3, -1.0)
    with pytest.raises(ValueError, match="permutation"):
        S.reserve_schedule(costs, [0, 0], 3, 0.0)


def test_a_tile_in_reserve_ends_a_causal_launch_unevenly():
    # d128 causal B4 H16 S8192 on 132 CTAs, the kernel's launch order and the lists' estimate:
    # drawn as each tile starts (a tile always in reserve), a CTA busy with a heavy tile still
    # takes one of the last, and about 2% of the CTAs' time is idle at the end (measured on the
    # H200 with the draw after the tile's Q: 1.83%); drawn two steps before the end, as the lists
    from flashrung.kernels.hopper.schedule import head_section, tile_cost, tile_m_blocks
    m_blocks, heads, seqlen = 64, 64, 8192
    section = min(head_section(seqlen, 16, 16, 128, 2, 16 << 20), heads)
    costs = [tile_cost(m, 128, 128, seqlen, seqlen, True) for m in tile_m_blocks(m_blocks, heads, section, True)]
    order = list(range(len(costs)))
    at_start = S.reserve_schedule(costs, order, 132, None)
    ahead = S.reserve_schedule(costs, order, 132, 2.0)
    assert _idle_share(ahead) < 0.001 and 0.015 < _idle_share(at_start) < 0.025
    assert at_start.makespan > 1.015 * S.list_schedule(costs, order, 132).makespan
