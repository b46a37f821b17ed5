"""The timing statistics on synthetic series (seed 000, 2.1 and 2.8), no GPU.

The series come from the real schedulers in ``flashrung.bench.timing`` driving a virtual GPU:
a clock that each "kernel" call advances by its base time × a shared, slowly wandering clock
state (what neighbouring launches share, and pairing divides out) × an optional drift × its own
small noise.
"""
import dataclasses
import functools
import math

import numpy as np
import pytest

from flashrung.bench import stats, timing

PROTOCOL = timing.PairedProtocol(alternations=120, reps=5, block_warmup=1, warmup_calls=5)


class VirtualGPU:
    def __init__(self, seed, *, noise=0.002, wander=0.0005, drift_per_s=0.0):
        self.rng = np.random.default_rng(seed)
        self.t = 0.0            # seconds
        self.state = 0.0        # log clock factor shared by neighbouring calls
        self.noise, self.wander, self.drift_per_s = noise, wander, drift_per_s

    def now(self):
        return self.t

    def kernel(self, base_ms):
        def call():
            self.state = float(np.clip(self.state + self.rng.normal(0, self.wander), -0.02, 0.02))
            factor = math.exp(self.state + self.rng.normal(0, self.noise)) * (1 + self.drift_per_s * self.t)
            self.t += base_ms * factor / 1e3
        return call

    def timer(self):
        return timing.ClockTimer(now=self.now)


def paired(seed, baseline_ms=1.0, candidate_ms=1.0, **gpu):
    g = VirtualGPU(seed, **gpu)
    a, b = g.kernel(baseline_ms), g.kernel(candidate_ms)
    timing.measure(g.timer(), a, PROTOCOL.warmup_calls)
    timing.measure(g.timer(), b, PROTOCOL.warmup_calls)
    return stats.summarize(timing.paired_run(a, b, PROTOCOL, g.timer()))


@pytest.fixture(scope="module")
def t_noise():
    """A/A null: ten fresh 'processes' (fresh virtual GPUs), the same kernel in both arms."""
    margins = [paired(seed).margin for seed in range(100, 110)]
    return stats.t_noise(margins)


def test_a_a_null_is_small_and_balanced(t_noise):
    margins = [paired(seed).margin for seed in range(100, 110)]
    assert 0 < t_noise < 0.002
    # at n = 10 the nearest-rank p95 is the largest deviation
    assert t_noise == max(abs(m - 1) for m in margins)
    assert 2 <= sum(m > 1 for m in margins) <= 8


def test_a_a_series_gives_null(t_noise):
    runs = [paired(seed) for seed in (7, 8)]
    verdict = stats.keep_gate(runs, t_noise, baseline_correct=True, candidate_correct=True)
    assert verdict.verdict == stats.NULL


def test_injected_one_percent_speedup_is_kept(t_noise):
    runs = [paired(seed, 1.0, 1.0 / 1.01) for seed in (21, 22)]
    verdict = stats.keep_gate(runs, t_noise, baseline_correct=True, candidate_correct=True)
    assert verdict.verdict == stats.KEEP, verdict.reasons
    assert verdict.margin == pytest.approx(1.01, abs=0.002)


def test_injected_one_percent_slowdown_is_reverted(t_noise):
    runs = [paired(seed, 1.0, 1.01) for seed in (31, 32)]
    assert stats.keep_gate(runs, t_noise, baseline_correct=True, candidate_correct=True).verdict == stats.REVERT


def test_keep_needs_the_fresh_process_replicate_and_the_gate(t_noise):
    fast = [paired(seed, 1.0, 1.0 / 1.01) for seed in (41, 42)]
    assert stats.keep_gate(fast[:1], t_noise, baseline_correct=True, candidate_correct=True).verdict == stats.NULL
    # a replicate that does not clear t_keep blocks the keep
    flat = paired(43)
    assert stats.keep_gate([fast[0], flat], t_noise, baseline_correct=True, candidate_correct=True).verdict == stats.NULL
    # a faster candidate that fails the correctness gate is reverted
    v = stats.keep_gate(fast, t_noise, baseline_correct=True, candidate_correct=False)
    assert v.verdict == stats.REVERT and any("correctness" in r for r in v.reasons)
    # a gate that does not apply (a peer with no LSE) does not block
    assert stats.keep_gate(fast, t_noise, baseline_correct=None, candidate_correct=None).verdict == stats.KEEP


def test_slow_drift_moves_the_unpaired_ratio_but_not_the_paired_one():
    # the card slows by 5% per simulated second; the same kernel in both arms
    g = VirtualGPU(5, drift_per_s=0.05, wander=0.0)
    a, b = g.kernel(1.0), g.kernel(1.0)
    run = timing.paired_run(a, b, PROTOCOL, g.timer())
    assert abs(stats.summarize(run).margin - 1) < 0.001
    # unpaired: all of A, then all of B, each reduced to its median
    n = PROTOCOL.alternations * PROTOCOL.reps
    times_a, times_b = timing.measure(g.timer(), a, n), timing.measure(g.timer(), b, n)
    assert stats.unpaired_ratio(times_a, times_b) < 0.99     # B looks >1% slower than A: it is not


def test_order_effect_shows_up_in_the_halves(t_noise):
    # whichever arm runs second in an alternation is 0.5% faster (a clock that ramps up);
    # the two kernels are identical
    rng = np.random.default_rng(3)
    orders = stats.half_orders(120)
    base, cand = [], []
    for o in orders:
        t1, t2 = 1.0 * np.exp(rng.normal(0, 0.0005, 2))
        first, second = t1, t2 / 1.005
        base.append(first if o == stats.AB else second)
        cand.append(second if o == stats.AB else first)
    s = stats.summarize(stats.PairedRun(tuple(base), tuple(cand), orders))
    assert s.margin_ab > 1.003 and s.margin_ba < 0.997
    assert not s.halves_agree and s.order_effect > 0.006
    # an AB-only protocol would have reported a 0.5% "gain"
    ab_only = stats.summarize(stats.PairedRun(tuple(base[:60] * 2), tuple(cand[:60] * 2), orders))
    assert ab_only.margin > 1 + t_noise
    assert stats.keep_gate([s, s], t_noise, baseline_correct=True, candidate_correct=True).verdict == stats.NULL


def test_shared_slowdowns_are_counted_and_named_not_dropped(t_noise):
    # a window of ten alternations in which the machine slows both arms 1.3-2x (as a compare run
    # at B32 H16 S1024 d128 causal saw on the H200): the count says so, the verdict names it, and
    # the margin is still the median over every alternation
    rng = np.random.default_rng(5)
    orders = stats.half_orders(40)
    base = list(0.32 * np.exp(rng.normal(0, 0.01, 40)))
    cand = list(0.32 * np.exp(rng.normal(0, 0.01, 40)))
    for i in range(24, 34):
        slow = 1.3 + 0.07 * (i - 24)
        base[i] *= slow
        cand[i] *= slow * rng.uniform(0.9, 1.1)
    s = stats.summarize(stats.PairedRun(tuple(base), tuple(cand), orders))
    assert s.shared_slow == 10
    assert s.margin == pytest.approx(float(np.median(np.asarray(base) / np.asarray(cand))))
    verdict = stats.keep_gate([s, s], t_noise, baseline_correct=True, candidate_correct=True)
    assert any("10 of 40 alternations" in r and "both sides" in r for r in verdict.reasons)
    # one arm slow alone is that arm's own time, not the machine's
    assert stats.shared_slowdowns([1.0] * 9 + [2.0], [1.0] * 10) == 0
    assert stats.shared_slowdowns([1.0] * 9 + [2.0], [1.0] * 9 + [1.19]) == 0
    assert stats.shared_slowdowns([1.0] * 9 + [2.0], [1.0] * 9 + [1.2]) == 1
    # summaries written before the count existed still load (as 0)
    old = {k: v for k, v in s.to_json().items() if k != "shared_slow"}
    assert stats.PairedSummary.from_json(old).shared_slow == 0
    with pytest.raises(ValueError, match="factor"):
        stats.shared_slowdowns([1.0], [1.0], factor=1.0)
    with pytest.raises(ValueError, match="one entry per alternation"):
        stats.shared_slowdowns([1.0, 1.0], [1.0])


def test_scheduler_runs_ab_then_ba_halves():
    calls = []
    clock = {"t": 0.0}

    def kernel(name):
        def fn():
            calls.append(name)
            clock["t"] += 1e-3
        return fn
    proto = timing.PairedProtocol(alternations=4, reps=2, block_warmup=1)
    run = timing.paired_run(kernel("a"), kernel("b"), proto, timing.ClockTimer(now=lambda: clock["t"]))
    assert run.order == ("AB", "AB", "BA", "BA")
    # per alternation: block warm-up + reps for the first arm, then the second
    assert "".join(calls) == "aaabbb" * 2 + "bbbaaa" * 2
    assert run.baseline == pytest.approx((1.0,) * 4)


def test_interleave_pairs_any_two_of_n_implementations():
    clock = {"t": 0.0}

    def kernel(ms):
        def fn():
            clock["t"] += ms / 1e3
        return fn
    fns = {"x": kernel(1.0), "y": kernel(2.0), "z": kernel(0.5)}
    inter = timing.interleave(fns, {"x": 3, "y": 2, "z": 4}, 4, timing.ClockTimer(now=lambda: clock["t"]))
    assert inter.orders == [("x", "y", "z")] * 2 + [("z", "y", "x")] * 2
    assert len(inter.per_call("z")) == 16
    run = inter.paired("y", "z")
    assert stats.summarize(run).margin == pytest.approx(4.0)
    assert run.order == ("AB", "AB", "BA", "BA")


@pytest.mark.parametrize("count", range(1, 9))
def test_the_balanced_design_favours_no_position_predecessor_or_order(count):
    # property: a block's place in the round and the implementation right before it set the clock it
    # runs at on an H200 at its power limit (the preheat does not undo it: the target row's ratio to
    # FA4 moved 5% when two implementations swapped places). Over one design every implementation
    # holds every position equally often, follows every other equally often, and precedes every
    # other in exactly half the rounds (so each pair's paired ratio has both orders)
    from collections import Counter

    names = [f"impl{i}" for i in range(count)]
    rounds = timing.balanced_orders(names)
    assert len(rounds) == (count if count % 2 == 0 else 2 * count)
    assert all(sorted(r) == sorted(names) for r in rounds)
    for pos in range(count):
        assert set(Counter(r[pos] for r in rounds).values()) == {len(rounds) // count}
    follows = Counter((r[i - 1], r[i]) for r in rounds for i in range(1, count))
    assert len(follows) == count * (count - 1) and len(set(follows.values())) <= 1
    before = Counter((a, b) for r in rounds for i, a in enumerate(r) for b in r[i + 1:])
    assert all(before[(a, b)] == len(rounds) // 2 for a in names for b in names if a != b)


def test_balanced_rounds_are_whole_designs_of_at_least_the_rounds_asked():
    assert [timing.balanced_rounds(n, 6) for n in (2, 3, 4, 5, 6, 7)] == [6, 6, 8, 10, 6, 14]
    assert timing.balanced_rounds(6, 24) == 24 and timing.balanced_rounds(7, 24) == 28
    assert len(timing.BenchProtocol().orders_for(list("abcdefg"))) == 14
    assert timing.BenchProtocol(order="halves").orders_for(list("abc")) == [tuple("abc")] * 3 + [tuple("cba")] * 3
    with pytest.raises(ValueError, match="order must be one of"):
        timing.BenchProtocol(order="random")
    with pytest.raises(ValueError, match="distinct"):
        timing.balanced_orders(["a", "a"])


def _logging_fns(log: list, names: str) -> dict:
    """One "kernel" per name that appends its name to ``log`` when called: the order calls ran in."""
    return {n: functools.partial(log.append, n) for n in names}


def test_interleave_runs_the_orders_it_is_given_and_refuses_ones_that_miss_an_implementation():
    log = []
    fns = _logging_fns(log, "xyz")
    orders = timing.balanced_orders(list(fns))
    inter = timing.interleave(fns, {"x": 1, "y": 1, "z": 1}, len(orders), timing.ClockTimer(now=lambda: 0.0),
                              orders=orders)
    assert inter.orders == orders and "".join(log) == "".join("".join(o) for o in orders)
    with pytest.raises(ValueError, match="orders must give 2 rounds"):
        timing.interleave(fns, {"x": 1, "y": 1, "z": 1}, 2, timing.ClockTimer(now=lambda: 0.0),
                          orders=[("x", "y", "z"), ("x", "y")])


def test_each_block_is_preheated_by_its_own_implementation():
    # a timed block must start from its own implementation's steady state (power and clock),
    # never from the previous implementation's: the untimed preheat calls come right before it
    log = []
    fns = _logging_fns(log, "xy")
    timing.interleave(fns, {"x": 2, "y": 1}, 2, timing.ClockTimer(now=lambda: 0.0), block_warmup={"x": 3, "y": 1})
    assert "".join(log) == "xxxxx" + "yy" + "yy" + "xxxxx"
    assert timing.preheat_calls(2.0, 100.0) == 50
    assert timing.preheat_calls(300.0, 100.0) == 1
    assert timing.preheat_calls(2.0, 0.0) == 0
    assert timing.BenchProtocol().block_preheat_ms >= 5 * timing.BenchProtocol().block_ms


def test_warm_up_and_reps_sizing():
    clock = {"t": 0.0}

    def fn():
        clock["t"] += 2e-3
    w = timing.warm_up(timing.ClockTimer(now=lambda: clock["t"]), fn, min_calls=3, min_ms=20)
    assert w.estimate_ms == pytest.approx(2.0) and w.calls >= 11
    assert timing.reps_for(2.0, target_ms=20, lo=2, hi=20) == 10
    assert timing.reps_for(500.0, target_ms=20, lo=2, hi=20) == 2
    assert timing.reps_for(0.01, target_ms=20, lo=2, hi=20) == 20
    with pytest.raises(ValueError, match="even"):
        timing.half_reversed_orders(["a", "b"], 3)


def test_t_noise_is_nearest_rank_p95():
    margins = [1.0001, 0.9998, 1.0004, 0.99941, 1.0, 1.0002, 0.9999, 1.0003, 0.9997, 1.00059]
    assert stats.t_noise(margins) == pytest.approx(0.00059)
    assert stats.t_noise(margins * 2) == pytest.approx(0.00059)           # n = 20: the 19th of 20
    assert stats.t_noise([1.0] * 19 + [1.01]) == pytest.approx(0.0)        # one outlier in 20 is beyond p95
    with pytest.raises(ValueError):
        stats.t_noise([])


def test_paired_run_validation():
    with pytest.raises(ValueError, match="one entry per alternation"):
        stats.PairedRun((1.0, 1.0), (1.0,), ("AB", "BA"))
    with pytest.raises(ValueError, match="positive"):
        stats.PairedRun((1.0, -1.0), (1.0, 1.0), ("AB", "BA"))
    with pytest.raises(ValueError, match="both orders"):
        stats.summarize(stats.PairedRun((1.0, 1.0), (1.0, 1.0), ("AB", "AB")))


def test_chain_multiplies_kept_paired_links_only():
    links = [stats.Link("v5", "e1", 1.0038, "KEEP"), stats.Link("e1", "e2", 0.9990, "REVERT"),
             stats.Link("e1", "e3", 1.0098, "KEEP"), stats.Link("e3", "e10", 1.0218, "KEEP"),
             stats.Link("e10", "e15", 1.0100, "NULL")]
    assert stats.chain_product(links) == pytest.approx(1.0038 * 1.0098 * 1.0218)
    with pytest.raises(ValueError, match="not a paired margin"):
        stats.chain_product([stats.Link("a", "b", 1.01, "KEEP", paired=False)])
    with pytest.raises(ValueError, match="chain is broken"):
        stats.chain_product([stats.Link("a", "b", 1.01, "KEEP"), stats.Link("c", "d", 1.01, "KEEP")])
    with pytest.raises(ValueError, match="no KEEP"):
        stats.chain_product([stats.Link("a", "b", 1.01, "NULL")])


def test_reanchor_reproduces_the_seed_figures():
    # seed 000, 2.8: RA2 after four keeps, RA1 after three, t_noise 0.0591%
    ra2 = stats.Reanchor(product=1.048690, measured=1.048680, n_links=4, t_noise=0.000591)
    assert ra2.tolerance == pytest.approx(0.00132, abs=5e-6) and abs(ra2.gap) == pytest.approx(0.0000095, abs=1e-6)
    assert ra2.verdict == stats.CONSISTENT
    ra1 = stats.Reanchor(product=1.035775, measured=1.035868, n_links=3, t_noise=0.000591)
    assert ra1.tolerance == pytest.approx(0.001182) and ra1.verdict == stats.CONSISTENT
    # double counting makes the product overshoot the direct run; interference undershoots
    assert stats.Reanchor(1.060, 1.048, 4, 0.000591).verdict == stats.OVERSHOOT
    assert stats.Reanchor(1.040, 1.048, 4, 0.000591).verdict == stats.UNDERSHOOT


def test_distribution_dispersion():
    d = stats.Distribution.of([1.0] * 8 + [1.1, 0.9])
    assert d.median == 1.0 and d.n == 10 and d.dispersion == pytest.approx((d.p90 - d.p10) / 1.0)


def test_block_preheat_runs_each_arm_at_its_own_steady_state():
    # with block_preheat_ms, every timed block of an arm is preceded by enough of its own calls to
    # fill that time (a 2 ms arm: 5 calls for 10 ms; a 0.5 ms arm: 20), never fewer than block_warmup
    calls = []
    clock = {"t": 0.0}

    def kernel(name, ms):
        def fn():
            calls.append(name)
            clock["t"] += ms / 1e3
        return fn
    proto = timing.PairedProtocol(alternations=2, reps=1, block_warmup=1, block_preheat_ms=10.0)
    run = timing.paired_run(kernel("a", 2.0), kernel("b", 0.5), proto, timing.ClockTimer(now=lambda: clock["t"]))
    sized = timing.PREHEAT_ESTIMATE_CALLS
    assert "".join(calls[:2 * sized]) == "a" * sized + "b" * sized        # the per-arm estimates
    assert "".join(calls[2 * sized:]) == "a" * 6 + "b" * 21 + "b" * 21 + "a" * 6
    assert run.baseline == pytest.approx((2.0, 2.0)) and run.candidate == pytest.approx((0.5, 0.5))
    # 0 keeps the calibrated protocol: block_warmup calls only, no estimate
    calls.clear()
    timing.paired_run(kernel("a", 2.0), kernel("b", 0.5), dataclasses.replace(proto, block_preheat_ms=0.0),
                      timing.ClockTimer(now=lambda: clock["t"]))
    assert "".join(calls) == "aabb" + "bbaa"
    with pytest.raises(ValueError, match="block_preheat_ms"):
        timing.PairedProtocol(block_preheat_ms=-1.0)


def test_host_path_probe_reads_the_host_beside_the_timer():
    # a fake GPU that runs each call in 2 ms while issuing it costs the host 0.5 ms: the probe
    # reports both per call, after emptying the queue once
    clock = {"host": 0.0}
    synced = []

    class Timer:
        def block(self, fn, reps):
            for _ in range(reps):
                fn()
            return [2.0] * reps

        def resolve(self, handle):
            return handle

    def call():
        clock["host"] += 0.0005

    out = timing.host_path(Timer(), call, 10, now=lambda: clock["host"], sync=lambda: synced.append(1))
    assert out == {"host_ms": pytest.approx(0.5), "device_ms": pytest.approx(2.0), "calls": 10}
    assert synced == [1]
    with pytest.raises(ValueError, match="reps"):
        timing.host_path(Timer(), call, 0)


def test_an_arm_that_failed_its_gate_is_judged_untimed(t_noise):
    # correct first: a candidate whose gate failed is reverted with no margin (nothing was timed),
    # a failed baseline leaves nothing to compare against, and no runs without a failed gate is a
    # caller's mistake, not a verdict
    v = stats.keep_gate([], t_noise, baseline_correct=True, candidate_correct=False)
    assert v.verdict == stats.REVERT and v.margin is None and "not timed" in v.reasons[-1]
    assert v.to_json()["margin"] is None and v.to_json()["runs"] == []
    v = stats.keep_gate([], t_noise, baseline_correct=False, candidate_correct=None)
    assert v.verdict == stats.NULL and v.margin is None and "baseline fails" in v.reasons[-1]
    with pytest.raises(ValueError, match="failed its gate"):
        stats.keep_gate([], t_noise, baseline_correct=True, candidate_correct=True)
    # the link such a verdict writes round-trips, and no chain can keep it
    link = stats.Link.from_json({"baseline": "a", "candidate": "b", "margin": None, "verdict": stats.REVERT})
    assert link.margin is None and stats.kept_chain([link]) == []
    with pytest.raises(ValueError, match="no positive margin"):
        stats.kept_chain([dataclasses.replace(link, verdict=stats.KEEP, paired=True)])


def test_ceilings_are_timed_after_their_own_preheat():
    """A ceiling is read at the clock its own kernel sustains, as every row is: after the warm-up,
    ``preheat_ms`` of its own untimed calls, then the timed ones (a virtual clock whose calls slow
    down as the kernel heats: the median reads the settled cost, not the burst one)."""
    from flashrung.bench import ceilings

    clock = {"t": 0.0, "calls": 0}

    def fn():      # 1.0 ms for the first 50 ms of calls, 1.25 ms after: a clock that settles
        clock["t"] += 1.0e-3 if clock["t"] < 0.050 else 1.25e-3
        clock["calls"] += 1

    timer = timing.ClockTimer(now=lambda: clock["t"])
    ms, preheat = ceilings.timed_median(fn, timer, preheat_ms=150.0)
    assert preheat == 150                               # the warm-up estimate is 1.0 ms a call
    assert clock["calls"] == ceilings.WARMUP_CALLS + preheat + ceilings.TIMED_CALLS
    assert ms == pytest.approx(1.25)
    clock.update(t=0.0, calls=0)
    ms_burst, none = ceilings.timed_median(fn, timer, preheat_ms=0.0)
    assert none == 0 and ms_burst == pytest.approx(1.0)     # unheated: the burst clock's reading
