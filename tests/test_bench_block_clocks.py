"""The clock beside each of the bench's timed blocks (flashrung.bench.block_clocks): blocks placed on
the wall clock by the timer's marks, nvidia-smi's samples read per block, the split of a row's two
speeds into clock and cycles, and a sampler that fails leaving the timings as they are. No GPU."""
from __future__ import annotations

import argparse

import pytest

from flashrung.bench import block_clocks, carryover, report, runner, sustain, timing


class VirtualClock:
    def __init__(self):
        self.t = 0.0


def _fns(clock, seconds):
    def make(dt):
        def fn():
            clock.t += dt
        return fn
    return {name: make(dt) for name, dt in seconds.items()}


def test_interleave_places_each_block_on_the_wall_clock_and_leaves_its_times_alone():
    # the property: a block's span is its preheat's start, its timed calls' start and its end, on
    # the wall clock the anchor fixes; the marks sit outside the timed calls, so the per-call times
    # are those of a run without spans
    seconds, reps, warm = {"x": 0.002, "y": 0.005}, {"x": 3, "y": 2}, {"x": 4, "y": 1}
    orders = [("x", "y"), ("y", "x")]
    runs = {}
    for spans in (False, True):
        clock = VirtualClock()
        timer = timing.ClockTimer(now=lambda: clock.t, wall=lambda: 1000.0 + clock.t)
        runs[spans] = timing.interleave(_fns(clock, seconds), reps, 2, timer, block_warmup=warm, orders=orders,
                                        spans=spans)
    assert runs[False].spans is None
    assert runs[True].times == runs[False].times
    spans = runs[True].spans
    # round 1: x preheats 4 × 2 ms from t=0, times 3 × 2 ms; then y preheats 5 ms and times 2 × 5 ms
    assert spans["x"][0] == pytest.approx((1000.0, 1000.008, 1000.014))
    assert spans["y"][0] == pytest.approx((1000.014, 1000.019, 1000.029))
    # round 2 in the other order: y first, then x
    assert spans["y"][1] == pytest.approx((1000.029, 1000.034, 1000.044))
    assert spans["x"][1] == pytest.approx((1000.044, 1000.052, 1000.058))


def _samples(t0, mhz_watts, period=0.05):
    return [sustain.Sample(t0 + i * period, mhz, watts) for i, (mhz, watts) in enumerate(mhz_watts)]


def test_a_block_reads_the_samples_of_its_timed_calls_not_of_its_preheat():
    # the property: the preheat moves the clock (the reason the block is preheated), so only the
    # samples within the timed calls count, widened by half a period so that a block shorter than
    # the period still meets one; a block with none has no figure made up
    samples = _samples(100.0, [(1980, 300), (1700, 650), (1500, 700), (1450, 699), (1440, 698)])
    # preheat from 100.00 to 100.14, timed calls 100.14–100.16: only the sample at 100.15 is within
    # [100.115, 100.185]
    one = block_clocks.block_clock((100.0, 100.14, 100.16), samples, 0.05)
    assert one == {"mhz": 1450, "watts": 699, "samples": 1}
    two = block_clocks.block_clock((100.0, 100.09, 100.16), samples, 0.05)
    assert two["samples"] == 2 and two["mhz"] == pytest.approx(1475)
    assert block_clocks.block_clock((200.0, 200.1, 200.12), samples, 0.05) == {"mhz": None, "watts": None,
                                                                              "samples": 0}


def _row_with_spans(ms_by_round, mhz_by_round, t0=50.0, block_s=0.03, peer_ms=6.3):
    """flashrung and fa4 in alternating blocks; flashrung's blocks at the given times and clocks."""
    spans, samples, t = [], [], t0
    peer_spans = []
    for mhz in mhz_by_round:
        peer_spans.append([t, t + 0.15, t + 0.15 + block_s])
        t += 0.15 + block_s
        spans.append([t, t + 0.15, t + 0.15 + block_s])
        samples.append(sustain.Sample(t + 0.15 + block_s / 2, mhz, 699.0))
        t += 0.15 + block_s
    results = {"fa4": {"status": "ok", "blocks_ms": [[peer_ms] * 4 for _ in ms_by_round], "blocks_span_s": peer_spans},
               "flashrung": {"status": "ok", "blocks_ms": [[ms] * 4 for ms in ms_by_round], "blocks_span_s": spans}}
    row = {"label": "B2 H16 S16384 d128 bf16 full fwd", "best_peer": "fa4", "results": results}
    return row, samples


def test_attach_gives_every_placed_result_its_clocks_and_counts_the_blocks_without_one():
    row, samples = _row_with_spans([5.6, 6.4, 5.6, 6.4], [1650, 1440, 1650, 1440])
    missing = block_clocks.attach([row], samples, 20)
    # flashrung's blocks each meet their sample; fa4's blocks (no sample in them) are counted
    assert [c["mhz"] for c in row["results"]["flashrung"]["blocks_clock"]] == [1650, 1440, 1650, 1440]
    assert missing == 4 and all(c["mhz"] is None for c in row["results"]["fa4"]["blocks_clock"])
    # a result that did not place its blocks (a run without the sampler) is left as it was
    bare = {"results": {"fa4": {"status": "ok", "blocks_ms": [[1.0]]}}}
    assert block_clocks.attach([bare], samples, 20) == 0 and "blocks_clock" not in bare["results"]["fa4"]


def test_two_speeds_by_clock_and_by_cycles_are_told_apart():
    # the property: slow rounds at a clock lower by as much as their time is longer are the clock's
    # (share 1: the same cycles); slow rounds at the same clock are the cycles' (share 0)
    by_clock, samples = _row_with_spans([5.6, 6.4, 5.6, 6.4, 5.6, 5.6], [1680, 1470, 1680, 1470, 1680, 1680])
    block_clocks.attach([by_clock], samples, 20)
    split = carryover.two_speeds(by_clock, "flashrung", "fa4")
    reading = block_clocks.split_reading(by_clock["results"]["flashrung"], split["slow_rounds"])
    assert split["slow_rounds"] == [2, 4]
    assert reading["mhz_slow"] == 1470 and reading["mhz_fast"] == 1680
    assert reading["clock_share"] == pytest.approx((1680 / 1470 - 1) / (6.4 / 5.6 - 1))
    text = report.two_speeds_note({"rows": [by_clock]}, ["flashrung"])
    assert "(at 1470 MHz in the slow rounds, 1680 in the others: the clock accounts for 100% of the time " \
           "between them)" in text

    by_cycles, samples = _row_with_spans([5.6, 6.4, 5.6, 6.4, 5.6, 5.6], [1500] * 6)
    block_clocks.attach([by_cycles], samples, 20)
    reading = block_clocks.split_reading(by_cycles["results"]["flashrung"], [2, 4])
    assert reading["clock_share"] == pytest.approx(0.0)
    assert "the clock accounts for 0% of the time between them" in report.two_speeds_note({"rows": [by_cycles]},
                                                                                          ["flashrung"])
    # without clocks (a stored run from before them) the note is the same as it was, and no split reading
    bare, _ = _row_with_spans([5.6, 6.4, 5.6, 6.4, 5.6, 5.6], [1500] * 6)
    assert block_clocks.split_reading(bare["results"]["flashrung"], [2, 4]) is None
    assert "MHz" not in report.two_speeds_note({"rows": [bare]}, ["flashrung"])


def test_the_report_gives_each_implementations_block_clocks_or_why_there_are_none():
    row, samples = _row_with_spans([5.6, 6.4], [1650, 1440])
    block_clocks.attach([row], samples, 20)
    doc = {"rows": [row], "clocks": {"source": "nvidia-smi", "sample_ms": 20, "count": 2, "blocks_without_sample": 2}}
    line = report.clocks_line(doc)
    assert line == ("clocks: the timed blocks at flashrung 1440–1650 (median 1545) MHz (nvidia-smi every 20 ms, "
                    "2 samples; 2 blocks without a sample)")
    failed = {"rows": [], "clocks": {"source": "nvidia-smi", "sample_ms": 50, "count": 0, "blocks_without_sample": 0,
                                     "error": "nvidia-smi is not on PATH: no clock per block"}}
    assert report.clocks_line(failed) == ("clocks: no block has a clock (nvidia-smi every 50 ms, 0 samples); the "
                                          "sampler: nvidia-smi is not on PATH: no clock per block")
    assert report.clocks_line({"rows": []}) is None and report.clocks_line({"rows": [], "clocks": None}) is None


class _DyingSampler:
    """sustain.Sampler's interface: alive for ``lives`` checks, then gone, with samples to give."""

    def __init__(self, exe, gpu, sample_ms, lives=2, samples=()):
        self.lives, self.samples, self.stopped = lives, list(samples), 0

    def wait_for_first_sample(self, timeout_s):
        return True

    def check_alive(self):
        self.lives -= 1
        if self.lives < 0:
            raise sustain.SustainError("nvidia-smi exited (code 1) while sampling: gone")

    def stop(self):
        self.stopped += 1
        return self.samples, 3


def test_a_sampler_that_cannot_start_or_dies_leaves_the_timings_and_says_why(monkeypatch):
    # the property: the clocks are a reading beside the bench, never a condition of it — without
    # nvidia-smi the run has no spans and says why; a sampler that dies keeps what it sampled
    monkeypatch.setattr(block_clocks.shutil, "which", lambda name: None)
    absent = block_clocks.SuiteSampler(0)
    assert not absent.running
    row, _ = _row_with_spans([5.6], [1500])
    entry = absent.finish([row])
    assert entry["error"] == "nvidia-smi is not on PATH: no clock per block" and entry["count"] == 0

    row, samples = _row_with_spans([5.6, 6.4], [1650, 1440])
    made = []
    monkeypatch.setattr(block_clocks.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(block_clocks.sustain, "smi_uuids", lambda exe: ["GPU-1"])
    monkeypatch.setattr(block_clocks.sustain, "smi_id", lambda index, listed: listed[0])
    monkeypatch.setattr(block_clocks.sustain, "SAMPLER_LEAD_S", 0.0)
    monkeypatch.setattr(block_clocks.sustain, "Sampler",
                        lambda exe, gpu, ms: made.append(_DyingSampler(exe, gpu, ms, samples=samples)) or made[-1])
    dying = block_clocks.SuiteSampler(0, 20)
    assert dying.running
    dying.check()                       # the second check: still alive
    dying.check()                       # gone: stopped once, its samples kept
    assert not dying.running and made[0].stopped == 1
    entry = dying.finish([row])
    assert made[0].stopped == 1 and entry["count"] == 2 and entry["skipped_lines"] == 3
    assert entry["error"].startswith("nvidia-smi exited")
    assert [c["mhz"] for c in row["results"]["flashrung"]["blocks_clock"]] == [1650, 1440]


def test_time_row_stores_the_spans_only_when_asked(monkeypatch):
    # runner.time_row passes spans through to interleave and keeps them per result, round by round
    seen = {}

    def fake_interleave(fns, reps, rounds, timer, *, block_warmup, orders, spans):
        seen["spans"] = spans
        names = list(fns)
        placed = {n: [(1.0 + r, 1.1 + r, 1.2 + r) for r in range(rounds)] for n in names} if spans else None
        return timing.Interleaved(times={n: [[1.0, 1.0]] * rounds for n in names}, reps=dict(reps),
                                  orders=[tuple(o) for o in orders], spans=placed)
    monkeypatch.setattr(runner.timing, "interleave", fake_interleave)
    from flashrung.bench import peers, suites

    row = suites.Row(batch=1, seqlen_q=64, seqlen_k=64, heads_q=2, heads_kv=2, headdim=64, dtype="bfloat16",
                     causal=False, mode="fwd")
    inputs = peers.make_inputs(row, device="cpu", seed=0)
    fn_calls = []
    prepared = peers.Prepared(fn=lambda: fn_calls.append(1))
    monkeypatch.setattr(runner.peers, "prepare", lambda impl, row, inputs, options: prepared)
    monkeypatch.setattr(runner, "check_outputs", lambda row, inputs, prepared: ({}, []))
    clock = VirtualClock()
    timer = timing.ClockTimer(now=lambda: clock.t)
    for spans in (False, True):
        result = runner.time_row(row, ["sdpa"], inputs, timing.QUICK_BENCH, timer, "fa-half", spans=spans)
        assert seen["spans"] is spans
        assert ("blocks_span_s" in result["results"]["sdpa"]) is spans
    assert result["results"]["sdpa"]["blocks_span_s"][0] == [1.0, 1.1, 1.2]


def test_clock_sample_ms_takes_whole_milliseconds_from_zero(capsys):
    from flashrung.bench import cli
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    assert parser.parse_args(["bench", "--clock-sample-ms", "0"]).clock_sample_ms == 0
    assert parser.parse_args(["bench"]).clock_sample_ms == block_clocks.SAMPLE_MS
    for bad in ("-1", "2.5", "fast"):
        with pytest.raises(SystemExit):
            parser.parse_args(["bench", "--clock-sample-ms", bad])
        assert f"argument --clock-sample-ms: expected a whole number >= 0, got '{bad}'" in capsys.readouterr().err
