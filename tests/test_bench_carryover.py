"""What a bench block inherits from the block before it, read back from a run's stored blocks (no GPU)."""
import pytest

from flashrung.bench import carryover, numerators, peers, report, runner, suites, timing

ROW = suites.Row(batch=32, seqlen_q=1024, seqlen_k=1024, heads_q=32, heads_kv=32, headdim=64, dtype="bfloat16",
                 causal=True, mode="fwd", suite="fa4-protocol")
BASE_MS = {"cudnn": 2.0, "fa4": 2.2, "flashrung:portable": 1.9}
SLOWED = 1.10      # flashrung:portable's calls right after a cudnn block


class Clock:
    t = 0.0
    current = None     # the implementation whose calls run now
    before = None      # the one whose calls ran before them


def carried_prepare(impl, row, inputs, options=None):
    """peers.prepare stand-in on a virtual clock: flashrung:portable runs SLOWED × its time while the
    implementation that ran before its block (preheat and timed calls alike) is cudnn."""
    def fn():
        if Clock.current != impl:
            Clock.before, Clock.current = Clock.current, impl
        slow = SLOWED if impl == "flashrung:portable" and Clock.before == "cudnn" else 1.0
        Clock.t += BASE_MS[impl] * slow / 1e3
    return peers.Prepared(fn=fn, note=f"synthetic {impl}")


@pytest.fixture
def carried_doc(monkeypatch):
    monkeypatch.setattr(peers, "prepare", carried_prepare)
    Clock.current = Clock.before = None
    timer = timing.ClockTimer(now=lambda: Clock.t)
    protocol = timing.BenchProtocol(warmup_calls=2, warmup_ms=4, rounds=6, block_ms=8, block_reps_min=2,
                                    block_reps_max=10)
    row = runner.time_row(ROW, list(BASE_MS), inputs=None, protocol=protocol, timer=timer,
                          causal_convention=numerators.FA_HALF)
    return {"suite": "fa4-protocol", "impls": list(BASE_MS), "rows": [row], "protocol": protocol.to_json()}


def test_a_block_slowed_by_its_predecessor_reads_above_its_other_cells(carried_doc):
    # the property: the slowdown lands in the (timed, predecessor) cell that caused it, and nowhere else
    s = carryover.summary([carried_doc])
    ours = s["cells"]["flashrung:portable"]
    after_cudnn, after_fa4 = ours["cudnn"]["mean"], ours["fa4"]["mean"]
    assert after_cudnn / after_fa4 == pytest.approx(SLOWED)
    # the other implementations' blocks do not move with what ran before them
    for impl in ("cudnn", "fa4"):
        assert all(c["mean"] == pytest.approx(1.0) for c in s["cells"][impl].values())
    assert s["notable"] == [dict(impl="flashrung:portable", slowest_after="cudnn", slow_mean=after_cudnn,
                                 fastest_after="fa4", fast_mean=after_fa4)]
    text = report.carryover_table([carried_doc])
    assert "fr:portable runs 10.0% slower after cudnn" in text


def test_every_block_but_the_rows_first_is_counted_once_by_its_predecessor(carried_doc):
    # the balanced design: 6 rounds × 3 implementations = 18 blocks, each after the one before it in
    # the round or the previous round's last; the row's first block follows other work (its gate,
    # warm-up, the previous row) and is left out
    row = carried_doc["rows"][0]
    ratios = carryover.row_ratios(row)
    assert sum(len(v) for v in ratios.values()) == 6 * 3 - 1
    first = row["round_orders"][0][0]
    counts = {impl: sum(len(v) for (i, _), v in ratios.items() if i == impl) for impl in BASE_MS}
    assert counts == {impl: 6 - (impl == first) for impl in BASE_MS}
    # nothing is keyed by itself within a round; across rounds a block may follow its own kind
    orders = [tuple(o) for o in row["round_orders"]]
    seams = {(b[0], a[-1]) for a, b in zip(orders, orders[1:])}
    assert {k for k in ratios if k[0] == k[1]} <= seams


def test_the_report_prints_the_table_and_runs_pool_it(carried_doc):
    text = report.results_table(carried_doc)
    assert "carryover: each block's median" in text and "fr:portable runs 10.0% slower after cudnn" in text
    pooled = carryover.pooled([carried_doc, carried_doc])
    single = carryover.pooled([carried_doc])
    assert {k: len(v) for k, v in pooled.items()} == {k: 2 * len(v) for k, v in single.items()}


def test_rows_without_stored_blocks_give_no_table():
    # a run stored before blocks and orders were kept, or a row where an implementation did not run
    assert report.carryover_table([{"impls": ["cudnn"], "rows": [{"results": {"cudnn": {"status": "ok", "ms": 1.0}}}]}]) is None
    row = {"round_orders": [["a", "b"], ["b", "a"]],
           "results": {"a": {"status": "ok", "blocks_ms": [[1.0], [1.0]]},
                       "b": {"status": "unsupported", "reason": "declines"}}}
    assert carryover.row_ratios(row) == {}
    assert report.carryover_table([{"impls": ["a", "b"], "rows": [row]}]) is None


def _two_speed_row(ours_ms, peer_ms, ours="flashrung", peer="fa4"):
    blocks = {ours: [[t, t * 1.001] for t in ours_ms], peer: [[t, t] for t in peer_ms]}
    return {"label": "B2 H16 S16384 d128 bf16 full fwd", "best_peer": peer,
            "results": {name: {"status": "ok", "blocks_ms": b} for name, b in blocks.items()}}


def test_blocks_at_two_speeds_beside_a_steady_peer_are_named_with_their_rounds():
    # the property (the H100's target row): ours alternates between two speeds by round while the
    # peer's blocks hold, so the paired ratio of the slow rounds and of the others are two readings,
    # and the median counts rounds; the slow rounds are named 1-based, each side's ratio its own
    row = _two_speed_row([5.6, 6.4, 5.6, 6.4, 5.8, 5.6], [6.3, 6.35, 6.3, 6.35, 6.3, 6.3])
    split = carryover.two_speeds(row, "flashrung", "fa4")
    assert split["slow_rounds"] == [2, 4]
    assert split["spread"] == pytest.approx(6.4 * 1.0005 / (5.6 * 1.0005) - 1)
    assert split["ratios"]["slow"] == pytest.approx((6.35 / (6.4 * 1.0005),) * 2)
    assert split["ratios"]["fast"][0] == pytest.approx(6.3 / (5.8 * 1.0005))
    assert split["ratios"]["fast"][1] == pytest.approx(6.3 / (5.6 * 1.0005))
    text = report.two_speeds_note({"rows": [row]}, ["flashrung"])
    assert "flashrung at B2 H16 S16384 d128 bf16 full fwd: blocks 14.3% apart (fa4's 0.8%), in rounds 2, 4 0.992–0.992× fa4" \
        in text and "flashrung sustain" in text


def test_a_spread_the_peer_shares_or_a_small_one_is_not_two_speeds():
    # the same clock state under both (the peer spread as much: the H200's seven-implementation
    # suites) or a spread under TWO_SPEEDS_SPREAD is the row's ordinary noise, not named
    shared = _two_speed_row([5.6, 6.4, 5.6, 6.4, 5.8, 5.6], [6.0, 6.8, 6.0, 6.8, 6.2, 6.0])
    small = _two_speed_row([5.6, 5.9, 5.6, 5.9, 5.7, 5.6], [6.3] * 6)
    for row in (shared, small):
        assert carryover.two_speeds(row, "flashrung", "fa4") is None
        assert report.two_speeds_note({"rows": [row]}, ["flashrung"]) is None
    # an implementation that did not run, or rows without stored blocks, give nothing
    missing = _two_speed_row([5.6, 6.4], [6.3, 6.3])
    missing["results"]["fa4"] = {"status": "error"}
    assert carryover.two_speeds(missing, "flashrung", "fa4") is None
    assert carryover.two_speeds({"results": {}}, "flashrung", "fa4") is None
