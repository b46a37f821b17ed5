"""The soak probe's watchdog: how it reads a child's reports into a verdict (no GPU needed; the
children here are small Python programs standing in for the attention calls)."""
import sys

import pytest

from flashrung.evidence import soak


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", "import sys, time\n" + code]


def test_a_child_that_reports_to_the_end_is_ok():
    r = soak.watch(_child("print('ready 1', flush=True)\nprint('progress 250 0.1', flush=True)\n"
                          "print('done 300 0.2', flush=True)"), run=1, timeout_s=5)
    assert (r.verdict, r.calls, r.run) == ("ok", 300, 1)


def test_a_child_that_stops_reporting_is_killed_and_called_a_hang():
    # the launch that never returns: reports stop, the process stays; the watchdog must not wait
    r = soak.watch(_child("print('ready 1', flush=True)\nprint('progress 250 0.1', flush=True)\n"
                          "time.sleep(60)"), run=2, timeout_s=0.5)
    assert (r.verdict, r.calls) == ("hang", 250)
    assert r.seconds < 30 and "killed" in r.detail


def test_the_first_report_waits_for_the_compile_and_then_the_short_limit_holds():
    # the first call compiles (first_timeout_s); later reports get timeout_s
    slow_first = _child("time.sleep(1.0)\nprint('ready 1', flush=True)\nprint('done 1 1.0', flush=True)")
    assert soak.watch(slow_first, run=1, timeout_s=0.3, first_timeout_s=5).verdict == "ok"
    assert soak.watch(slow_first, run=1, timeout_s=5, first_timeout_s=0.3).verdict == "hang"


def test_a_moved_output_is_reported_with_its_call():
    r = soak.watch(_child("print('ready 1', flush=True)\nprint('moved 500', flush=True)\ntime.sleep(60)"),
                   run=1, timeout_s=5)
    assert (r.verdict, r.calls) == ("moved", 500)
    assert "500" in r.detail


def test_a_failing_child_is_an_error_with_its_stderr():
    r = soak.watch(_child("print('ready 1', flush=True)\nraise ValueError('kv_multicast needs asm_arrivals')"),
                   run=1, timeout_s=5)
    assert r.verdict == "error" and "exit status 1" in r.detail
    assert "kv_multicast needs asm_arrivals" in r.detail


@pytest.mark.parametrize("argv", [["--calls", "0"], ["--timeout-s", "0"], ["--heads", "6", "--heads-kv", "4"],
                                  ["--dtype", "fp8"]])
def test_bad_arguments_are_refused_before_touching_a_gpu(argv, capsys):
    assert soak.main(argv) == 2


def test_soak_needs_a_gpu(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert soak.main(["--calls", "10"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def _hopper() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _soak_verdicts(tmp_path, argv: list[str]) -> list[tuple[str, int]]:
    """Run the soak on the GPU with ``argv`` (exit status 0 asserted); each run's verdict and calls."""
    import json

    path = tmp_path / "soak.json"
    assert soak.main([*argv, "--json", str(path)]) == 0
    return [(r["verdict"], r["calls"]) for r in json.loads(path.read_text())["runs"]]


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU (hopper.fwd)")
def test_soak_of_a_paired_default_completes_with_identical_outputs(tmp_path):
    # d64 non-causal from S4k pairs its CTAs with the unsynced producer (changes 43, 44, 47)
    assert _soak_verdicts(tmp_path, ["--batch", "1", "--seqlen", "4200", "--heads", "4", "--heads-kv", "2",
                                     "--calls", "60", "--check-every", "20", "--runs", "2"]) == [("ok", 60), ("ok", 60)]


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU (hopper.fwd)")
@pytest.mark.parametrize("headdim, heads, seqlen", [(64, 32, 4324), (128, 16, 4146)])
def test_soak_of_a_pair_whose_last_tile_lies_past_the_sequence(tmp_path, headdim, heads, seqlen):
    # an odd count of q-tiles a head (23 of 192 rows, 33 of 128). Paired within a head (d128's
    # default), the last pair's second tile has no rows: with skip_empty_rows the d64 default hung
    # here on the H200 in 3 of 3 runs, two on the first call, and such a launch now computes the
    # empty rows (change 48). d64's default pairs across heads (change 49): every head's last tile
    # pairs with the next head's first, each CTA loading its own K/V
    assert _soak_verdicts(tmp_path, ["--batch", "8", "--seqlen", str(seqlen), "--heads", str(heads),
                                     "--headdim", str(headdim), "--calls", "500", "--check-every", "100",
                                     "--runs", "2"]) == [("ok", 500), ("ok", 500)]
