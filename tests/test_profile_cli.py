"""``flashrung profile``: the ncu commands it runs, the child's shape, the details page it quotes."""
from __future__ import annotations

import argparse
import os

import pytest

from flashrung import cli
from flashrung.bench import cli as bench_cli
from flashrung.bench import suites
from flashrung.evidence import profile

RESULTS = os.path.join(os.path.dirname(__file__), "..", "docs", "results")


def _row(**changes):
    base = dict(batch=2, seqlen_q=16384, seqlen_k=16384, heads_q=16, heads_kv=16, headdim=128,
                dtype="bfloat16", causal=False, mode="fwd")
    return suites.Row(**{**base, **changes})


@pytest.mark.parametrize("row", [_row(), _row(causal=True, seqlen_k=1000, heads_kv=4, dtype="float16"),
                                 _row(mode="bwd", headdim=64, batch=1),
                                 _row(headdim=64, causal=True, window=(4096, 0)),
                                 _row(window=(256, -1)), _row(window=(-1, 128)),
                                 _row(softcap=50.0), _row(headdim=192, headdim_v=128, causal=True),
                                 suites.packed_rows(lengths=(8192, 4096, 4096, 17), heads=16, kv_heads=4, headdim=128,
                                                    causal=True, window=(1024, 0))[0]])
def test_the_child_rebuilds_the_row_it_is_given(row):
    # the profiled process must run the row the command names: its flags parse back to the same Row
    # (a window, cap, v head dim or pack the child did not receive would profile another problem
    # under this one's name)
    p = argparse.ArgumentParser()
    bench_cli._shape_flags(p, many=False)
    assert bench_cli.pair_row(p.parse_args(profile.shape_argv(row))) == row


def test_output_stem_names_the_row():
    assert profile.output_stem("flashrung:hopper.fwd@pingpong=true", _row()) == \
        "ncu-flashrung-hopper.fwd-pingpong-true-d128-full-b2-h16-s16384"
    assert profile.output_stem("fa4", _row(causal=True, seqlen_k=1000, heads_kv=4, dtype="float16")) == \
        "ncu-fa4-d128-causal-b2-h16-s16384-sk1000-kv4-float16"


def test_output_stem_tells_apart_rows_that_differ_only_in_a_window_cap_dv_or_pack():
    # two profiles of one command line but for --window must not overwrite each other's pages
    plain = _row(headdim=64, causal=True, batch=4)
    rows = [plain, _row(headdim=64, causal=True, batch=4, window=(4096, 0)),
            _row(headdim=64, causal=True, batch=4, window=(4096, -1)),
            _row(headdim=64, causal=True, batch=4, softcap=30.0),
            _row(headdim=64, headdim_v=128, causal=True, batch=4),
            suites.packed_rows(lengths=(16384, 16384, 8192, 4096), heads=16, kv_heads=16, headdim=64, causal=True)[0]]
    stems = [profile.output_stem("fa4", r) for r in rows]
    assert len(set(stems)) == len(stems)
    assert stems[1] == "ncu-fa4-d64-causal-b4-h16-s16384-win4096_0"
    assert stems[2] == "ncu-fa4-d64-causal-b4-h16-s16384-win4096_inf"
    assert stems[5] == "ncu-fa4-d64-causal-packed-16384x2_8192_4096-h16-s16384"
    many = suites.packed_rows(lengths=tuple(range(100, 4100, 100)), heads=16, kv_heads=16, headdim=64, causal=True)[0]
    assert profile.output_stem("fa4", many) == "ncu-fa4-d64-causal-packed-n40-max4000-sum82000-h16-s4000"


def test_dry_run_passes_the_window_to_the_profiled_child(capsys, tmp_path):
    argv = ["profile", "flashrung:hopper.fwd", "--headdim", "64", "--seqlen", "8192", "--batch", "4", "--heads",
            "16", "--causal", "--window", "4096,0", "--out", str(tmp_path), "--ncu", "ncu", "--dry-run"]
    assert cli.main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "--window=4096,0" in first and "-win4096_0 " in first


def test_dry_run_prints_the_profile_and_both_pages(capsys, tmp_path):
    argv = ["profile", "fa4", "--headdim", "64", "--seqlen", "4096", "--batch", "4", "--heads", "32", "--causal",
            "--out", str(tmp_path), "--ncu", "/opt/ncu/ncu", "--dry-run"]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    stem = os.path.join(str(tmp_path), "ncu-fa4-d64-causal-b4-h32-s4096")
    assert len(lines) == 3
    assert lines[0].startswith(f"/opt/ncu/ncu --clock-control none --profile-from-start off --set full -f -o {stem} ")
    assert "-m flashrung.evidence.profile --target fa4 --batch 4 --seqlen 4096" in lines[0]
    assert lines[1].endswith(f"--page details > {stem}.txt")
    assert lines[2].endswith(f"--page source --csv --print-source sass | gzip > {stem}-sass.csv.gz")
    assert not os.listdir(tmp_path)                  # nothing written on a dry run


def test_refuses_a_bad_shape_and_names_it(capsys):
    assert cli.main(["profile", "fa4", "--heads", "6", "--kv-heads", "4", "--dry-run"]) == 2
    assert "must be a multiple of kv-heads" in capsys.readouterr().err


def test_without_a_gpu_it_says_so():
    ok, _ = bench_cli.gpu_available()
    if ok:
        pytest.skip("a GPU is present: the refusal is for machines without one")
    assert cli.main(["profile", "fa4", "--out", "unused-dir"]) == 2
    assert not os.path.exists("unused-dir")


def test_headline_quotes_each_kernel_of_a_stored_details_page():
    with open(os.path.join(RESULTS, "h200-ncu-fa4-d128-full-s16384-bbbfdcf.txt")) as f:
        fa4 = profile.headline(f.read())
    assert ("Elapsed Cycles", "cycle", "9,729,285") in fa4
    assert ("highest-utilized pipeline", "%", "Tensor 84.6") in fa4
    with open(os.path.join(RESULTS, "h200-ncu-hopper-d128-full-s16384-bbbfdcf.txt")) as f:
        ours = profile.headline(f.read())
    kernels = [value for metric, _, value in ours if metric == "kernel"]
    assert kernels == ["_attn_fwd_kernel", "_combine_kernel"]     # the split tail's merge is its own launch
    assert ("Duration", "ms", "5.87") in ours


@pytest.mark.gpu
def test_the_child_runs_its_calls_outside_ncu():
    # without a profiler attached, profiler start/stop do nothing: the child's warm-up and its
    # profiled call must still run the row and exit cleanly
    import subprocess
    import sys
    argv = [sys.executable, "-m", "flashrung.evidence.profile", "--target", "flashrung"] + \
        profile.shape_argv(_row(batch=1, seqlen_q=1000, seqlen_k=777, heads_q=4, heads_kv=2))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "profiled one call of flashrung" in done.stderr
