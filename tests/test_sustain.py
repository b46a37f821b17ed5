"""`flashrung sustain`: nvidia-smi parsing, ABBA blocks, settled windows, the per-arm figures and
the reading (no GPU), the CLI's refusal without a GPU, and one short run on a Hopper GPU."""
import datetime
import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from flashrung.bench import cli, sustain
from flashrung.bench.sustain import Sample
from test_bench_cli import parse, run     # the instrument's CLI, parsed and run in-process


# ---------------------------------------------------------------------------------------- parsing


def test_smi_lines_parse_and_bad_lines_are_skipped_and_counted():
    lines = [
        "2026/11/30 11:02:44.764, 1980, 123.80",
        "2026/11/30 11:02:44.817, 1965, 690.15",
        "2026/11/30 11:02:44.868, [N/A], 690.00",        # a field nvidia-smi could not read
        "2026/11/30 11:02:44.918, 1980, [N/A]",
        "",                                               # blank
        "   ",
        "Failed to initialize NVML: Unknown Error",       # garbled
        "2026/11/30 11:02:44.968, 1980",                  # cut short
        "2026/11/30 11:02:45.018, 1980, 124.31, 7",       # one field too many
        "2026/13/30 11:02:45.068, 1980, 124.31",          # no 13th month
        "2026/11/30 11:02:45.118, nan, 124.31",           # not a number a mean can take
        "2026/11/30 11:02:45.168,1590,691.2",             # no spaces: still a sample
    ]
    samples, skipped = sustain.parse_smi(lines)
    assert skipped == 9
    assert [(s.mhz, s.watts) for s in samples] == [(1980.0, 123.8), (1965.0, 690.15), (1590.0, 691.2)]
    # local time, the clock time.time() reads, to the millisecond
    assert samples[0].t == datetime.datetime(2026, 11, 30, 11, 2, 44, 764000).timestamp()
    assert samples[1].t - samples[0].t == pytest.approx(0.053, abs=1e-6)
    assert sustain.parse_smi_line("[N/A], [N/A], [N/A]") is None


# ------------------------------------------------------------------------------------ ABBA order


def test_abba_order():
    b, c = sustain.ARMS
    assert sustain.abba_order(10) == [b, c, c, b, b, c, c, b, b, c]
    assert sustain.abba_order(2) == [b, c]
    assert sustain.abba_order(4, arms=("on", "off")) == ["on", "off", "off", "on"]
    for n in (2, 4, 6, 8, 10, 12):
        order = sustain.abba_order(n)
        assert order.count(b) == order.count(c) == n // 2
    with pytest.raises(ValueError):
        sustain.abba_order(0)


def test_time_blocks_follows_the_order_and_calls_the_check_between_blocks():
    ran, checks = [], []

    def block(fn, block_s):
        fn()
        return {"start": len(ran), "end": len(ran) + block_s, "calls": 20, "ms_per_call": 1.0}
    fns = {arm: (lambda arm=arm: ran.append(arm)) for arm in sustain.ARMS}
    blocks = sustain.time_blocks(fns, sustain.abba_order(4), 2.5, block=block, between=lambda: checks.append(1))
    assert ran == ["baseline", "candidate", "candidate", "baseline"]
    assert [(b["index"], b["arm"]) for b in blocks] == list(enumerate(ran))
    assert len(checks) == 4


# ---------------------------------------------------------------------------------- windows


def test_window_edges_count_and_samples_outside_do_not():
    lo, hi = sustain.settled_window(100.0, 102.5)
    assert lo == 100.0 + sustain.SETTLE_S and hi == 102.5 - sustain.TAIL_S
    samples = [Sample(lo - 1e-3, 1980.0, 120.0),     # still settling
               Sample(lo, 1600.0, 690.0),            # on the first edge: counts
               Sample((lo + hi) / 2, 1610.0, 691.0),
               Sample(hi, 1620.0, 692.0),            # on the last edge: counts
               Sample(hi + 1e-3, 1500.0, 500.0)]     # straddling the next block
    inside = sustain.samples_within(samples, lo, hi)
    assert [s.mhz for s in inside] == [1600.0, 1610.0, 1620.0]
    [block] = sustain.assign_samples([{"arm": "baseline", "start": 100.0, "end": 102.5, "calls": 2600,
                                       "ms_per_call": 0.95}], samples)
    assert block["window"] == [lo, hi] and block["samples"] == 3
    assert block["mhz"] == pytest.approx(1610.0) and block["watts"] == pytest.approx(691.0)


def test_a_block_without_samples_is_marked_and_left_out_of_its_arms_means():
    figures = sustain.block_figures(0.95, [])
    assert figures == {"ms_per_call": 0.95, "samples": 0, "mhz": None, "watts": None, "joules_per_call": None,
                       "mcycles_per_call": None}
    blocks = [
        {"arm": "baseline", "ms_per_call": 0.95, **sustain.block_figures(0.95, [Sample(0, 1590.0, 690.0)])},
        {"arm": "candidate", "ms_per_call": 0.93, **sustain.block_figures(0.93, [Sample(0, 1626.0, 689.0)])},
        {"arm": "candidate", "ms_per_call": 0.93, **sustain.block_figures(0.93, [Sample(0, 1626.0, 689.0)])},
        # no sample in its window: its time (a slower 0.99) must not enter the baseline's mean
        {"arm": "baseline", "ms_per_call": 0.99, **sustain.block_figures(0.99, [])},
    ]
    summary = sustain.summarize(blocks)
    base = summary["arms"]["baseline"]
    assert (base["blocks"], base["blocks_with_samples"], base["blocks_without_samples"]) == (2, 1, 1)
    assert base["means"]["ms_per_call"] == 0.95 and base["means"]["mhz"] == 1590.0
    assert summary["ratios"]["ms_per_call"] == pytest.approx(0.93 / 0.95)
    assert "1 without samples left out" in sustain.arm_line("baseline", "x", base)
    doc = {"blocks": [{**b, "index": i} for i, b in enumerate(blocks)]}
    assert sustain.blocks_table(doc).splitlines()[-1].rstrip().endswith("no samples")

    # an arm with no block with samples: no means, no ratios, no reading, no division by zero
    none = sustain.summarize([{**b, **sustain.block_figures(b["ms_per_call"], [])} if b["arm"] == "baseline" else b
                              for b in blocks])
    assert none["arms"]["baseline"]["means"] == {q: None for q in sustain.QUANTITIES}
    assert none["ratios"] == {q: None for q in sustain.QUANTITIES}
    assert sustain.moved_with(none["ratios"]) is None
    assert "no reading" in sustain.reading_line(none["ratios"], True)


# ---------------------------------------------------------------------------------- summary


def _blocks_at(order, figures):
    """Timed blocks 10 s apart, 2.5 s long, with two samples in each settled window and two outside
    it (settling, and straddling the next block) that must not count."""
    timed, samples = [], []
    for i, (arm, (ms, mhz_pair, watt_pair)) in enumerate(zip(order, figures)):
        start = 10.0 * i
        timed.append({"index": i, "arm": arm, "start": start, "end": start + 2.5, "calls": 2600, "ms_per_call": ms})
        samples.append(Sample(start + 0.5, 1980.0, 120.0))
        samples += [Sample(start + 1.5, mhz_pair[0], watt_pair[0]), Sample(start + 2.0, mhz_pair[1], watt_pair[1])]
        samples.append(Sample(start + 2.45, 1500.0, 700.0))
    return timed, samples


def test_summary_arithmetic_by_hand():
    # the pingpong token at d128 non-causal B16 H16 S2048: off is the baseline, on the candidate
    order = sustain.abba_order(4)     # baseline, candidate, candidate, baseline
    figures = [(0.9500, (1585.0, 1595.0), (689.0, 691.0)),    # baseline: 1590 MHz, 690 W
               (0.9300, (1624.0, 1628.0), (688.0, 690.0)),    # candidate: 1626 MHz, 689 W
               (0.9304, (1620.0, 1624.0), (689.0, 689.0)),    # candidate: 1622 MHz, 689 W
               (0.9586, (1580.0, 1584.0), (691.0, 693.0))]    # baseline: 1582 MHz, 692 W
    timed, samples = _blocks_at(order, figures)
    blocks = sustain.assign_samples(timed, samples)
    assert [b["samples"] for b in blocks] == [2, 2, 2, 2]
    # block 0: 690 W × 0.95 ms = 0.6555 J; 1590 MHz × 0.95 ms = 1.5105 Mcycles
    assert blocks[0]["joules_per_call"] == pytest.approx(0.6555)
    assert blocks[0]["mcycles_per_call"] == pytest.approx(1.5105)
    summary = sustain.summarize(blocks)
    base, cand = (summary["arms"][a]["means"] for a in sustain.ARMS)
    # baseline: ms (0.95 + 0.9586) / 2 = 0.9543; MHz (1590 + 1582) / 2 = 1586; W (690 + 692) / 2 = 691;
    # J (0.6555 + 0.6633512) / 2 = 0.6594256; Mcycles (1.5105 + 1.5165052) / 2 = 1.5135026
    assert base == pytest.approx({"ms_per_call": 0.9543, "mhz": 1586.0, "watts": 691.0,
                                  "joules_per_call": 0.6594256, "mcycles_per_call": 1.5135026})
    # candidate: ms 0.9302, MHz 1624, W 689; J (0.64077 + 0.6410456) / 2 = 0.6409078;
    # Mcycles (1.51218 + 1.5091088) / 2 = 1.5106444
    assert cand == pytest.approx({"ms_per_call": 0.9302, "mhz": 1624.0, "watts": 689.0,
                                  "joules_per_call": 0.6409078, "mcycles_per_call": 1.5106444})
    # candidate ÷ baseline: 0.9302 / 0.9543, 1624 / 1586, 689 / 691, 1.5106444 / 1.5135026, 0.6409078 / 0.6594256
    assert summary["ratios"] == pytest.approx({"ms_per_call": 0.974745887, "mhz": 1.023959647, "watts": 0.997105644,
                                               "mcycles_per_call": 0.998111533, "joules_per_call": 0.971918288})
    assert all(summary["arms"][a]["blocks_without_samples"] == 0 for a in sustain.ARMS)
    line = sustain.reading_line(summary["ratios"], sustain.at_power_cap([691.0, 689.0], 700.0))
    assert line == ("candidate ÷ baseline: time 0.9747, clock 1.0240, power 0.9971, cycles/call 0.9981, "
                    "energy/call 0.9719 — the time moved with the clock (energy-bound at the power cap)")


# ---------------------------------------------------------------------------------- reading


def test_reading_clock_bound_and_cycles_bound():
    # the clock carries the time: −log(1.024) is 0.93 of log(0.975), the cycles 0.07
    clock = {"ms_per_call": 0.975, "mhz": 1.024, "watts": 0.997, "mcycles_per_call": 0.998, "joules_per_call": 0.972}
    assert sustain.moved_with(clock) == sustain.CLOCK
    assert sustain.reading_line(clock, True).endswith(
        "— the time moved with the clock (energy-bound at the power cap)")
    assert sustain.reading_line(clock, False).endswith("— the time moved with the clock (below the power cap)")
    assert sustain.reading_line(clock, None).endswith("— the time moved with the clock (power limit unknown)")
    # fewer cycles at the same clock
    cycles = {"ms_per_call": 0.95, "mhz": 1.001, "watts": 1.0, "mcycles_per_call": 0.951, "joules_per_call": 0.95}
    assert sustain.moved_with(cycles) == sustain.CYCLES
    assert sustain.reading_line(cycles, True).endswith("— the time moved with the cycles")
    # the clock fell yet the time fell: the cycles fell more, and carry it
    against = {"ms_per_call": 0.99, "mhz": 0.98, "mcycles_per_call": 0.9702}
    assert sustain.moved_with(against) == sustain.CYCLES
    assert sustain.moved_with({"ms_per_call": 1.0, "mhz": 1.01, "mcycles_per_call": 1.01}) == sustain.NEITHER
    assert sustain.moved_with({"ms_per_call": 0.99, "mhz": None, "mcycles_per_call": 0.99}) is None


def test_power_cap():
    assert sustain.at_power_cap([689.0, 691.0], 700.0) is True
    assert sustain.at_power_cap([500.0, 691.0], 700.0) is False
    assert sustain.at_power_cap([689.0, 691.0], None) is None
    assert sustain.at_power_cap([None, 691.0], 700.0) is None


def test_parameters_need_a_settled_window():
    sustain.check_parameters(10, 2.5, 1.0, 50)
    for bad in ((3, 2.5, 1.0, 50), (0, 2.5, 1.0, 50), (10, 1.0, 1.0, 50), (10, 1.05, 1.0, 50), (10, 2.5, 1.0, 0)):
        with pytest.raises(ValueError):
            sustain.check_parameters(*bad)


# ---------------------------------------------------------------------------------- sampler


def _fake_smi(tmp_path, body: str):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    exe.chmod(0o755)
    return str(exe)


def test_sampler_reads_what_nvidia_smi_wrote(tmp_path):
    exe = _fake_smi(tmp_path, """
        import sys, time
        print("2026/11/30 11:02:44.764, 1980, 123.80", flush=True)
        print("2026/11/30 11:02:44.817, [N/A], 690.00", flush=True)
        print("2026/11/30 11:02:44.868, 1620, 689.50", flush=True)
        time.sleep(60)
    """)
    sampler = sustain.Sampler(exe, "GPU-0000", 50)
    assert sampler.command[1:] == ["--id=GPU-0000", "--query-gpu=timestamp,clocks.sm,power.draw",
                                   "--format=csv,noheader,nounits", "-lms", "50"]
    import time
    deadline = time.time() + 20
    while time.time() < deadline:      # until the fake has written its lines
        with open(sampler._out.name) as f:
            if f.read().count("\n") >= 3:
                break
        time.sleep(0.05)
    sampler.check_alive()
    samples, skipped = sampler.stop()
    assert [(s.mhz, s.watts) for s in samples] == [(1980.0, 123.8), (1620.0, 689.5)] and skipped == 1


def test_the_first_sample_is_waited_for_not_assumed(tmp_path):
    # nvidia-smi can take a second to write its first line: the bench's sampler waits for it (the
    # first row's blocks need samples around them), up to a limit, and says whether it came
    exe = _fake_smi(tmp_path, """
        import time
        time.sleep(0.4)
        print("2026/11/30 11:02:44.764, 1980, 123.80", flush=True)
        time.sleep(60)
    """)
    sampler = sustain.Sampler(exe, "GPU-0000", 50)
    try:
        assert sampler.wait_for_first_sample(20.0)
    finally:
        samples, _ = sampler.stop()
    assert [s.mhz for s in samples] == [1980.0]
    silent = sustain.Sampler(_fake_smi(tmp_path, "import time\ntime.sleep(60)\n"), "GPU-0000", 50)
    try:
        assert not silent.wait_for_first_sample(0.3)
    finally:
        assert silent.stop() == ([], 0)


def test_a_sampler_that_dies_says_why(tmp_path):
    exe = _fake_smi(tmp_path, """
        import sys
        print("No devices were found", file=sys.stderr)
        sys.exit(6)
    """)
    sampler = sustain.Sampler(exe, "0", 50)
    sampler._proc.wait(timeout=20)
    with pytest.raises(sustain.SustainError, match="No devices were found"):
        sampler.check_alive()
    assert sampler.stop() == ([], 0)


# ---------------------------------------------------------------------------------- CLI


def test_sustain_arguments():
    args = parse("sustain", "flashrung:hopper.fwd", "flashrung:hopper.fwd@pingpong=false")
    assert (args.blocks, args.block_s, args.settle_s, args.sample_ms, args.device, args.seed) == \
        (sustain.BLOCKS, sustain.BLOCK_S, sustain.SETTLE_S, sustain.SAMPLE_MS, "cuda", 0)
    row = cli.pair_row(parse("sustain", "cudnn", "flash", "--batch", "16", "--seqlen", "2048", "--no-causal"))
    assert (row.batch, row.seqlen_q, row.heads_q, row.headdim, row.dtype, row.causal, row.mode) == \
        (16, 2048, 16, 128, "bfloat16", False, "fwd")
    assert parse("sustain", "cudnn", "flash", "--device", "cuda:1").device == "cuda:1"
    for bad in (("--blocks", "3"), ("--blocks", "0"), ("--block-s", "0"), ("--settle-s", "-1"),
                ("--sample-ms", "0"), ("--device", "cpu"), ("--device", "cuda:x")):
        with pytest.raises(SystemExit):
            parse("sustain", "cudnn", "flash", *bad)
    with pytest.raises(SystemExit):
        parse("sustain", "cudnn", "flashrung:")


def test_sustain_without_a_settled_window_says_so_before_looking_for_a_gpu(capsys):
    rc, _, err = run(capsys, "sustain", "cudnn", "flash", "--block-s", "1", "--settle-s", "1")
    assert rc == 2 and "no settled window" in err


def _no_gpu():
    return not torch.cuda.is_available()


@pytest.mark.skipif(not _no_gpu(), reason="checks the message a machine without a GPU prints")
def test_sustain_without_a_gpu_refuses_plainly(capsys, tmp_path):
    rc, out, err = run(capsys, "sustain", "flashrung:hopper.fwd", "flashrung:hopper.fwd",
                       "--json", str(tmp_path / "s.json"))
    assert rc == 2 and "flashrung sustain: needs a GPU" in err and "CUDA GPU" in err
    assert "--device cpu" not in err           # no CPU path to point to: clock and power are a GPU's
    assert not (tmp_path / "s.json").exists() and out == ""
    with pytest.raises(sustain.SustainError, match="needs a CUDA GPU"):
        sustain.run("cudnn", "flash", cli.pair_row(parse("sustain", "cudnn", "flash")))
    # through the `flashrung` entry point, as a person types it
    proc = subprocess.run([sys.executable, "-m", "flashrung.cli", "sustain", "flashrung", "cudnn"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "flashrung sustain: needs a GPU" in proc.stderr


# ---------------------------------------------------------------------------------- GPU


# the mark nearest the function is read first: on a machine without a GPU, the reason says so
@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi on PATH")
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                    reason="needs a CUDA device of compute capability 9.0 (Hopper)")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sustain_runs_hopper_fwd_against_itself(tmp_path):
    out = tmp_path / "sustain.json"
    proc = subprocess.run([sys.executable, "-m", "flashrung.cli", "sustain", "flashrung:hopper.fwd",
                           "flashrung:hopper.fwd", "--batch", "2", "--seqlen", "1024", "--heads", "4", "--headdim",
                           "128", "--no-causal", "--blocks", "2", "--block-s", "0.5", "--settle-s", "0.2",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["instrument"] == "sustain" and doc["label"] == "B2 H4 S1024 d128 bf16 full fwd"
    assert {a: doc["arms"][a]["impl"] for a in sustain.ARMS} == {"baseline": "flashrung:hopper.fwd",
                                                                 "candidate": "flashrung:hopper.fwd"}
    assert all(doc["arms"][a]["gate"]["passed"] for a in sustain.ARMS)
    assert doc["protocol"]["order"] == ["baseline", "candidate"]
    assert [b["arm"] for b in doc["blocks"]] == ["baseline", "candidate"]
    for b in doc["blocks"]:
        assert b["calls"] >= sustain.CALLS_PER_SYNC and b["calls"] % sustain.CALLS_PER_SYNC == 0
        assert b["ms_per_call"] > 0 and b["end"] - b["start"] >= 0.5
        assert b["window"] == pytest.approx([b["start"] + 0.2, b["end"] - sustain.TAIL_S])
        assert set(sustain.QUANTITIES) <= set(b)
    assert doc["samples"]["count"] > 0 and doc["samples"]["count"] == len(doc["samples"]["series"])
    assert set(doc["summary"]["arms"]) == set(sustain.ARMS) and set(doc["summary"]["ratios"]) == set(sustain.QUANTITIES)
    assert doc["reading"].startswith("candidate ÷ baseline: time ")
    assert doc["clocks_start"]["source"] and doc["clocks_end"]["source"]
    assert doc["manifest"]["identity"]["kernel_source"]["sha256"]
    assert "ms/call" in proc.stdout and "candidate ÷ baseline" in proc.stdout


def test_the_sampled_gpu_is_torchs_device_or_the_only_one():
    # CUDA_VISIBLE_DEVICES renumbers torch's devices and not nvidia-smi's: the sampler must name
    # torch's device by UUID, and never guess among several GPUs
    listed = ["GPU-aaaa-1111", "GPU-bbbb-2222"]
    assert sustain.match_smi_id("bbbb-2222", listed) == "GPU-bbbb-2222"
    assert sustain.match_smi_id("GPU-aaaa-1111", listed + [""]) == "GPU-aaaa-1111"
    assert sustain.match_smi_id("cccc", ["GPU-aaaa-1111\n"]) == "GPU-aaaa-1111"   # one GPU: that one
    assert sustain.match_smi_id(None, ["GPU-aaaa-1111"]) == "GPU-aaaa-1111"
    with pytest.raises(sustain.SustainError, match="cannot tell which"):
        sustain.match_smi_id("cccc", listed)
    with pytest.raises(sustain.SustainError, match="none listed"):
        sustain.match_smi_id("cccc", [])
