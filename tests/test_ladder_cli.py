"""`flashrung ladder`: the census without a GPU, argument validation, the table and JSON from
synthetic rows, the climb's plumbing on a virtual clock, the ncu parsing; on a GPU, the real climb.

The census compiles in an interpreter-free subprocess (Gluon cannot compile under
TRITON_INTERPRET=1, which the CPU suite sets), as tests/test_census.py does.
"""
import argparse
import dataclasses
import json
import math
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

from flashrung.bench import cli as bench_cli
from flashrung.bench import stats, timing
from flashrung.evidence import census
from flashrung.kernels import ladder
from flashrung.kernels.ladder import ceiling, cli

HAS_GPU = torch.cuda.is_available()


def parse(*argv):
    parser = argparse.ArgumentParser(prog="flashrung")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    return parser.parse_args(["ladder", *argv])


def run_cli(*argv, timeout=900):
    return subprocess.run([sys.executable, "-m", "flashrung.cli", "ladder", *argv], capture_output=True, text=True,
                          env=census.interpreter_free_env(), timeout=timeout)


# ------------------------------------------------------------------------------------------
# Census mode (no GPU)
# ------------------------------------------------------------------------------------------

def test_census_json_has_every_registered_config_of_the_chosen_rungs():
    proc = run_cli("--only", "v1,v3", "--arch", "sm_90a", "--json", *(["--census"] if HAS_GPU else []))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["mode"] == "census" and doc["arch"] == "sm_90a" and "SASS" in doc["evidence"]
    if not HAS_GPU:
        assert "no CUDA GPU" in doc["no_gpu_reason"] and "no GPU" in proc.stderr
    expected = [(r.name, dict(s.config)) for r in (ladder.rung("v1"), ladder.rung("v3"))
                for s in r.load().census_specs()]
    assert [(r["kernel"], r["config"]) for r in doc["rows"]] == expected       # 4 + 6, ladder order
    for row in doc["rows"]:
        assert not row.get("error"), row
        s = row["sass"]
        assert s["HMMA"] == row["config"]["head_dim"]                       # mma.sync, d per loop body
        if row["kernel"] == "ladder.v1":
            assert s["LDGSTS"] == 0 and s["LDG"] > 0                        # scalar staging
        else:
            assert s["LDGSTS"] > 0 and s["LDG"] == 0                        # v3's lever: cp.async
        assert 0 < row["smem_bytes"] <= doc["smem_budget_bytes"] == 227 * 1024


def test_census_table_reports_the_sm120_budget_and_says_there_is_no_gpu():
    proc = run_cli("--only", "v3", "--arch", "sm_120", *(["--census"] if HAS_GPU else []))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    if not HAS_GPU:
        assert "no GPU here" in out
    assert "evidence level: SASS" in out
    assert "shared memory per block on sm_120: budget 99 KB (101,376 B)" in out and "the seed's card" in out
    assert "largest here 81,920 B (ladder.v3 d128 full 64x64 kv_stages=2)" in out
    assert "all 6 configurations fit" in out
    header = next(ln for ln in out.splitlines() if ln.startswith("rung"))
    for col in ("config", "regs", "smem B", "spill B", "HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "FFMA"):
        assert col in header


def test_census_as_launched_compiles_the_binary_a_launch_at_b_runs():
    # --as-launched B: every row compiled as config B's launch specializes it, in bf16; the table
    # and the JSON say so, and the lever still reads (v22's trips meet no barrier)
    proc = run_cli("--only", "v22", "--arch", "sm_90a", "--as-launched", "b", "--json",
                   *(["--census"] if HAS_GPU else []))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["as_launched"] == "B" and doc["rows"]
    for row in doc["rows"]:
        assert not row.get("error"), row
        assert row["config"]["launch"] == "B" and row["config"]["dtype"] == "bf16"
        assert row["sass"]["BAR"] >= 0
    causal = next(r for r in doc["rows"] if r["config"]["head_dim"] == 128 and r["config"]["causal"]
                  and r["config"].get("kv_copy") == "one_stride")
    from flashrung.kernels.ladder import evidence
    assert [loop["BAR"] for loop in evidence.key_loops(causal)] == [0, 0]
    text = cli.format_census(doc["rows"], "sm_90a", launch="B")
    assert "as launched at config B (bf16; the binary the climb times)" in text
    assert "unspecialized (--as-launched" in cli.format_census(doc["rows"], "sm_90a")


def test_as_launched_is_refused_outside_the_census(monkeypatch, capsys):
    for extra in (["--profile"], ["--processes", "2"]):
        args = parse("--as-launched", "a", *extra)
        assert args.func(args) == 2
    assert "--as-launched selects how the census compiles" in capsys.readouterr().err
    monkeypatch.setattr(bench_cli, "gpu_available", lambda: (True, "a GPU"))
    args = parse("--as-launched", "b")
    assert args.func(args) == 2
    assert "add --census to see it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--as-launched", "c")


def _census_row(kernel, smem, error=None, **config):
    cfg = {"head_dim": 128, "causal": False, "dtype": "fp16", "tile": "64x64", "num_warps": 4, **config}
    if error:
        return {"kernel": kernel, "arch": "sm_120", "config": cfg, "regs": None, "smem_bytes": None,
                "spill_bytes": None, "sass": {}, "error": error}
    sass = {"HMMA": 128, "LDSM": 72, "LDGSTS": 24, "MUFU.EX2": 34, "FFMA": 224}
    return {"kernel": kernel, "arch": "sm_120", "config": cfg, "regs": 255, "smem_bytes": smem, "spill_bytes": 0,
            "sass": sass}


def test_census_table_flags_configs_over_budget_and_compile_errors():
    rows = [_census_row("ladder.v3", 49152, kv_stages=1), _census_row("ladder.x", 120 * 1024, variant="big"),
            _census_row("ladder.y", 0, error="RuntimeError: out of resources")]
    text = cli.format_census(rows, "sm_120", no_gpu="torch sees no CUDA GPU")
    assert "no GPU here (torch sees no CUDA GPU)" in text
    assert "1 of 2 configurations do NOT fit: ladder.x d128 full 64x64 variant=big" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("ladder.x"))
    assert line.split()[-1] == "NO" and "122880" in line
    assert "ERROR" in next(ln for ln in text.splitlines() if ln.startswith("ladder.y"))
    assert "kv_stages=1" in next(ln for ln in text.splitlines() if ln.startswith("ladder.v3"))


def test_census_table_shows_each_loops_instructions_per_trip():
    # a rung with an unmasked and a masked key loop reads "563/738"; a row without loops "-"
    split = dict(_census_row("ladder.v15", 112 * 1024), loops=[{"length": 563}, {"length": 738}])
    text = cli.format_census([split, _census_row("ladder.v3", 49152)], "sm_90a")
    assert "loop instr" in text
    assert "563/738" in next(ln for ln in text.splitlines() if ln.startswith("ladder.v15"))
    assert next(ln for ln in text.splitlines() if ln.startswith("ladder.v3")).split()[-2] == "-"


# ------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------

def test_only_names_rungs_in_ladder_order_and_refuses_unknown_ones(capsys):
    assert parse("--only", "ladder.v4,v3,v3").only == ("ladder.v3", "ladder.v4")
    with pytest.raises(SystemExit):
        parse("--only", "v3,v6")
    err = capsys.readouterr().err
    assert "--only: unknown rung 'v6'" in err and "v0, v1, v2, v3, v4, v5, v7, v8, v9, v10, v11, v12, v13, v14, v15, v16, v17, v18, v19" in err
    with pytest.raises(SystemExit):
        parse("--only", ",")
    assert "expected comma-separated rung names" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--config", "c")
    with pytest.raises(SystemExit):
        parse("--census", "--profile")       # one mode at a time
    assert parse("--config", "B").config == "b"
    assert cli.selected_configs("both") == ["A", "B"] and cli.selected_configs("a") == ["A"]


def test_profile_without_ncu_says_so_and_fails(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))          # nothing on PATH, ncu least of all
    args = parse("--profile")
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "ncu (Nsight Compute) is not on PATH" in err and "Nothing was profiled" in err


def test_compare_command_parses_as_the_row_it_names():
    """The table points to `flashrung compare` for the keep verdict: its line must select
    exactly the configuration the margin was measured at."""
    parser = argparse.ArgumentParser(prog="flashrung")
    sub = parser.add_subparsers(dest="command", required=True)
    bench_cli.register(sub)
    for config in cli.CONFIGS.values():
        line = cli.compare_command(config, "ladder.v4", "ladder.v5")
        args = parser.parse_args(line.split()[1:])
        assert (args.baseline, args.candidate) == ("flashrung:ladder.v4", "flashrung:ladder.v5")
        assert bench_cli.pair_row(args).shape_key() == config.shape_key()


def test_paired_alternations_fill_the_time_budget():
    p = cli.DEFAULT_PROTOCOL      # 8 s of kernel time per margin, 5 + 1 calls per arm per alternation
    assert p.alternations_for(0.30, 0.25) == 120                  # fast rungs: the seed's 120
    assert p.alternations_for(60.0, 40.0) == 12                   # 8000 / (6 * 100) = 13.3 -> even 12
    assert p.alternations_for(5000.0, 5000.0) == 10               # never below ten (five per order)
    assert cli.QUICK_PROTOCOL.alternations_for(0.1, 0.1) == 40
    proto = p.paired(20.0, 15.0)
    assert proto.alternations % 2 == 0 and proto.reps == 5 and proto.warmup_calls == 0
    assert stats.half_orders(proto.alternations)                  # valid for the paired runner


def test_the_rungs_rates_say_the_order_they_run_in():
    # the climb keeps one order and its reverse (a balanced design would take a round per rung):
    # its protocol and timing text must say so, not the bench's balanced default
    for proto in (cli.DEFAULT_PROTOCOL, cli.QUICK_PROTOCOL):
        assert proto.rates.order == "halves" and proto.to_json()["rates"]["order"] == "halves"
        names = [f"ladder.v{i}" for i in range(5)]
        assert proto.rates.orders_for(names) == timing.half_reversed_orders(names, proto.rates.rounds)
    assert "second half reversed" in cli.TIMING_TEXT


def test_order_balanced_times_the_rungs_in_a_balanced_design():
    """Protects: `--order balanced` reaches the rates (every rung in every position and after every
    other equally often), the JSON's timing text says so, and each fresh process of `--processes`
    runs the same order; the paired margins keep their AB/BA runs."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    names = [f"ladder.v{i}" for i in range(5)]
    for extra, base in (([], cli.DEFAULT_PROTOCOL), (["--quick"], cli.QUICK_PROTOCOL)):
        args = parser.parse_args(["ladder", "--order", "balanced", *extra])
        proto = cli.protocol_for(args)
        assert proto.rates.order == "balanced" and proto.to_json()["rates"]["order"] == "balanced"
        assert proto.rates.orders_for(names) == timing.balanced_orders(names) * (
            timing.balanced_rounds(len(names), base.rates.rounds) // len(timing.balanced_orders(names)))
        assert dataclasses.replace(proto, rates=base.rates) == base          # nothing else moved
        assert cli.timing_text(proto) == cli.BALANCED_TIMING_TEXT
        assert cli.child_argv(args, "climb.json")[-2:] == ["--order", "balanced"]
    plain = parser.parse_args(["ladder"])
    assert cli.protocol_for(plain) is cli.DEFAULT_PROTOCOL and cli.timing_text(cli.DEFAULT_PROTOCOL) == cli.TIMING_TEXT
    assert "--order" not in cli.child_argv(plain, "climb.json")
    with pytest.raises(SystemExit):
        parser.parse_args(["ladder", "--order", "random"])


# ------------------------------------------------------------------------------------------
# Rates, table and JSON from synthetic rows
# ------------------------------------------------------------------------------------------

CEILINGS = {"gemm:float16": {"value": 550.0}, "mma_sync:float16": {"value": 400.0, "tile": "128x128x32 w2x4 s3"},
            "gemm:bfloat16": {"value": 700.0}, "mma_sync:bfloat16": {"value": 440.0, "tile": "128x256x32 w2x4 s3"}}


def _summary(margin, lo, hi, ab, ba, n=40):
    return {"vs": "?", "n": n, "margin": margin, "lo": lo, "hi": hi, "margin_ab": ab, "margin_ba": ba,
            "unpaired_ratio": margin, "halves_agree": (ab > 1) == (ba > 1), "order_effect": ab / ba - 1}


def _gate(passed, ratio):
    return {"passed": passed, "ratio": ratio, "text": f"{'PASS' if passed else 'FAIL'} ratio {ratio}",
            "config": {"batch": 2, "seqlen_q": cli.GATE_SEQLEN, "seqlen_k": cli.GATE_SEQLEN}}


def synthetic_doc():
    a, b = cli.CONFIGS["A"], cli.CONFIGS["B"]
    v0, v1, v2 = (ladder.rung(n) for n in ("v0", "v1", "v2"))
    rows = []
    r = cli.rate(cli.new_row("A", v0), 2.0, a, CEILINGS)
    r.update(status="ok", margin_note="the anchor (no parent)", gate=_gate(True, 0.41))
    rows.append(r)
    r = cli.rate(cli.new_row("A", v1), 0.25, a, CEILINGS)
    r.update(status="ok", margin=_summary(8.0, 7.9, 8.1, 8.02, 7.98), gate=_gate(True, 0.30))
    rows.append(r)
    r = cli.new_row("B", v0)
    r.update(status="skipped", reason=cli.SKIPS[("ladder.v0", "B")])
    rows.append(r)
    r = cli.rate(cli.new_row("B", v1), 20.0, b, CEILINGS)
    r.update(status="ok", margin_note="parent ladder.v0 skipped at config B", gate=_gate(False, 1.7))
    rows.append(r)
    r = cli.rate(cli.new_row("B", v2), 16.0, b, CEILINGS)
    r.update(status="ok", margin=_summary(1.25, 1.2, 1.3, 1.01, 0.99), gate=_gate(True, 0.5))
    rows.append(r)
    return {"mode": "climb", "configs": {n: {**c.plan(), "label": c.label()} for n, c in cli.CONFIGS.items()},
            "rungs": [{"name": x.name, "parent": x.parent, "lever": x.lever} for x in (v0, v1, v2)],
            "ceilings": CEILINGS, "rows": rows,
            "compare_commands": {"B ladder.v1 -> ladder.v2": cli.compare_command(b, "ladder.v1", "ladder.v2")},
            "manifest": {"environment": {"gpu": "NVIDIA H200"}}, "wall_s": 12.0}


def test_rates_follow_the_fa_convention_and_the_measured_ceilings():
    doc = synthetic_doc()
    a_v1, b_v1 = doc["rows"][1], doc["rows"][3]
    # A: 4*2*16*2048^2*128 = 68,719,476,736 FLOPs in 0.25 ms
    assert a_v1["flops"] == 68_719_476_736 and a_v1["tflops"] == pytest.approx(274.877906944)
    assert a_v1["percent_of_gemm_ceiling"] == pytest.approx(100 * 274.877906944 / 550)
    assert a_v1["percent_of_mma_sync_ceiling"] == pytest.approx(100 * 274.877906944 / 400)
    # B: causal counts dense / 2 (FlashAttention convention): 4*16*32768^2*128 / 2 in 20 ms, bf16 ceilings
    assert b_v1["flops_convention"] == "fa-half" and b_v1["flops"] == 4 * 16 * 32768 ** 2 * 128 // 2
    assert b_v1["tflops"] == pytest.approx(4 * 16 * 32768 ** 2 * 128 / 2 / 20e-3 / 1e12)
    assert b_v1["percent_of_mma_sync_ceiling"] == pytest.approx(100 * b_v1["tflops"] / 440)


def test_table_shows_every_column_and_every_reason():
    doc = synthetic_doc()
    text = cli.format_table(doc)
    assert "flashrung ladder on NVIDIA H200" in text and "causal = dense/2" in text
    assert "float16 cuBLAS GEMM 550.0" in text and "mma.sync GEMM 440.0 (tile 128x256x32 w2x4 s3)" in text
    head = next(ln for ln in text.splitlines() if ln.split()[:2] == ["config", "rung"])
    lines = {(ln.split()[0], ln.split()[1]): ln for ln in text.splitlines() if ln[:2] in ("A ", "B ")}
    assert "TFLOP/s" in head and "%mma.sync" in head and "vs parent" in head and "gate" in head and "lever" in head
    assert "274.9" in lines["A", "v1"] and "50.0%" in lines["A", "v1"] and "68.7%" in lines["A", "v1"]
    assert "8.000x [7.900,8.100] n=40" in lines["A", "v1"] and "PASS 0.30" in lines["A", "v1"]
    assert "anchor" in lines["A", "v0"] and ladder.rung("v0").lever in lines["A", "v0"]
    assert "skipped" in lines["B", "v0"]
    assert "parent ladder.v0 skipped at config B" in lines["B", "v1"] and "FAIL 1.70" in lines["B", "v1"]
    assert "1.250x [1.200,1.300] n=40 AB/BA disagree" in lines["B", "v2"]
    assert "B ladder.v0: skipped: CUDA-core FMA at S=32768" in text
    assert "B ladder.v1: gate FAIL ratio 1.7" in text
    assert "flashrung compare flashrung:ladder.v1 flashrung:ladder.v2 --batch 1 --heads 16 --seqlen 32768" in text
    assert f"S{cli.GATE_SEQLEN}" in text


def test_json_round_trip_renders_the_same_table(tmp_path, capsys):
    doc = synthetic_doc()
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps(doc))
    args = parse("--from-json", str(path))
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == cli.format_table(doc).strip()


def test_plot_of_the_climb(tmp_path):
    pytest.importorskip("matplotlib")
    out = cli.plot_climb(synthetic_doc(), tmp_path / "climb.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------
# The climb's plumbing on a virtual clock (what the GPU run does, with kernels that only
# advance a clock: skips, margins, gates, JSON and plot are checked; no number is a measurement)
# ------------------------------------------------------------------------------------------

COST_MS = {"ladder.v0": 10.0, "ladder.v1": 2.0, "ladder.v2": 1.6, "ladder.v3": 1.0, "ladder.v4": 0.8,
           "ladder.v5": 0.8, "ladder.v7": 0.5, "ladder.v8": 0.6,
           "ladder.v9": 0.75, "ladder.v10": 0.7, "ladder.v11": 0.72, "ladder.v12": 0.78,
           "ladder.v13": 0.76, "ladder.v14": 0.74, "ladder.v15": 0.72,
           "ladder.v16": 0.71, "ladder.v17": 0.70, "ladder.v18": 0.69, "ladder.v19": 0.70,
           "ladder.v20": 0.69, "ladder.v21": 0.68, "ladder.v22": 0.67, "ladder.v23": 0.66}


class VirtualClock:
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t


@pytest.fixture
def fake_gpu(monkeypatch):
    from flashrung.bench import peers, runner

    clock = VirtualClock()
    scale = {"A": 1.0, "B": 20.0}
    gated = []

    def prepare(impl, row, inputs, options=None):
        cost = COST_MS[impl.split(":", 1)[1]] * scale["A" if row.seqlen_q == 2048 else "B"] / 1e3

        def fn():
            clock.t += cost
        return peers.Prepared(fn=fn, first_out=object(), dispatch={"fwd": {"kernel": impl}}, first_call_s=0.1)

    def run_gate(impl, row, seed=0, device="cuda"):
        gated.append((impl, row))
        passed = impl != "flashrung:ladder.v2"
        return {"impl": impl, "mode": "fwd", "config": runner.gate_config(row), "passed": passed,
                "ratio": 0.5 if passed else 3.0, "text": f"{'PASS' if passed else 'FAIL'} {impl}"}

    monkeypatch.setattr(bench_cli, "gpu_available", lambda: (True, "Virtual GPU"))
    monkeypatch.setattr(peers, "prepare", prepare)
    monkeypatch.setattr(peers, "make_inputs", lambda row, seed=0, device="cuda": None)
    monkeypatch.setattr(runner, "run_gate", run_gate)
    monkeypatch.setattr(timing, "CudaEventTimer", lambda: timing.ClockTimer(now=clock.now))
    monkeypatch.setattr(cli, "gemm_fns", lambda dtype, on_tile: (virtual_gemms(clock, GEMM_COST_MS), []))
    return gated


# virtual GEMMs of the ceilings: cuBLAS and two mma.sync tiles, ms per call
GEMM_COST_MS = {cli.CUBLAS: 1.0, "tile a": 4.0, "tile b": 2.5}
GEMM_FLOPS = 2 * cli.GEMM_SIZE ** 3


def virtual_gemms(clock, costs, calls=None):
    def make(name, cost):
        def fn():
            clock.t += cost / 1e3
            if calls is not None:
                calls[name] = calls.get(name, 0) + 1
        return fn
    return {name: make(name, cost) for name, cost in costs.items()}


def test_ceilings_are_timed_interleaved_and_preheated_as_the_rungs_are(monkeypatch):
    from flashrung.bench import peers

    clock, calls = VirtualClock(), {}
    fns = virtual_gemms(clock, GEMM_COST_MS, calls)
    failed = [{"tile": "tile c", "status": "error", "reason": "RuntimeError: GEMM result wrong"}]
    monkeypatch.setattr(cli, "gemm_fns", lambda dtype, on_tile: (fns, list(failed)))
    monkeypatch.setattr(peers, "make_inputs", lambda row, seed=0, device="cuda": None)
    protocol = cli.QUICK_PROTOCOL
    progress = cli._Progress(0, enabled=False)
    rows, got = cli.measure_config("B", cli.CONFIGS["B"], [], set(), protocol, timing.ClockTimer(now=clock.now),
                                   progress, seed=0)
    assert rows == []
    cublas, mma = got["gemm:bfloat16"], got["mma_sync:bfloat16"]
    assert cublas["value"] == pytest.approx(GEMM_FLOPS / 1.0e-3 / 1e12)
    assert mma["tile"] == "tile b" and mma["value"] == pytest.approx(GEMM_FLOPS / 2.5e-3 / 1e12)
    assert [t["tile"] for t in mma["tiles"]] == ["tile a", "tile b", "tile c"]    # cuBLAS is not a tile
    rates = protocol.rates
    for t in mma["tiles"][:2]:
        cost = GEMM_COST_MS[t["tile"]]
        # the virtual clock's float sums may put the estimate a hair under the cost: one call more
        assert math.ceil(rates.block_preheat_ms / cost) <= t["preheat_calls"] <= math.ceil(rates.block_preheat_ms / cost) + 1
        want = timing.reps_for(cost, target_ms=rates.block_ms, lo=rates.block_reps_min, hi=rates.block_reps_max)
        assert want <= t["reps_per_block"] <= want + 1
        warm = timing.warm_up(timing.ClockTimer(now=VirtualClock().now), lambda: None,
                              min_calls=max(2, rates.warmup_calls), min_ms=0).calls
        assert calls[t["tile"]] >= rates.rounds * (t["preheat_calls"] + t["reps_per_block"]) + warm
    assert "preheat" in mma["detail"] or "ms of its own calls" in mma["detail"]


def test_climb_plumbing_on_a_virtual_clock(fake_gpu, tmp_path, capsys):
    path = tmp_path / "ladder.json"
    args = parse("--quick", "--no-progress", "--json", str(path))
    rc = args.func(args)
    out, err = capsys.readouterr()
    assert rc == 1                                            # ladder.v2 fails its (fake) gate
    doc = json.loads(path.read_text())
    assert (tmp_path / "ladder.png").exists() or "no plot" in err
    rows = {(r["config"], r["rung"]): r for r in doc["rows"]}
    assert len(rows) == 2 * len(ladder.RUNGS)
    assert rows["B", "ladder.v0"]["status"] == "skipped" and rows["B", "ladder.v0"]["gate"] is None
    # every measured row: the virtual kernel's time exactly, rated against the fake ceilings
    for (config, rung), r in rows.items():
        if r["status"] != "ok":
            continue
        ms = COST_MS[rung] * (1.0 if config == "A" else 20.0)
        assert r["ms"] == pytest.approx(ms)
        assert r["percent_of_mma_sync_ceiling"] == pytest.approx(100 * r["tflops"] / (GEMM_FLOPS / 2.5e-3 / 1e12))
        assert r["percent_of_gemm_ceiling"] == pytest.approx(100 * r["tflops"] / (GEMM_FLOPS / 1.0e-3 / 1e12))
        assert r["preheat_calls"] >= 1
        assert r["dispatch"] == {"fwd": {"kernel": f"flashrung:{rung}"}}
        # round by round against the best tile's block of the same round: constant virtual costs
        by_round = r["percent_of_mma_sync_ceiling_by_round"]
        assert by_round["n"] == cli.QUICK_PROTOCOL.rates.rounds
        for key in ("median", "p10", "p90"):
            assert by_round[key] == pytest.approx(r["percent_of_mma_sync_ceiling"])
    assert doc["ceilings"]["mma_sync:bfloat16"]["config"] == "B" and doc["ceilings"]["gemm:float16"]["config"] == "A"
    assert "interleaved with config B's rungs" in doc["ceilings"]["mma_sync:bfloat16"]["detail"]
    # margins: the paired runner's ratio of the two virtual costs, AB/BA halves agreeing
    for (config, rung), r in rows.items():
        parent = ladder.rung(rung).parent
        if parent is None or (config, parent) == ("B", "ladder.v0"):
            assert r["margin"] is None and r["margin_note"]
            continue
        assert r["margin"]["margin"] == pytest.approx(COST_MS[parent] / COST_MS[rung])
        assert r["margin"]["vs"] == parent and r["margin"]["n"] == r["margin"]["protocol"]["alternations"]
    assert rows["B", "ladder.v1"]["margin_note"] == "parent ladder.v0 skipped at config B"
    # the gate ran at the reduced size of each config's dtype and mask, for every measured rung
    assert len(fake_gpu) == 2 * len(ladder.RUNGS) - 1
    for impl, row in fake_gpu:
        assert row.seqlen_q == cli.GATE_SEQLEN and row.batch <= cli.GATE_MAX_BATCH and row.headdim == 128
    assert {(r.dtype, r.causal) for _, r in fake_gpu} == {("float16", False), ("bfloat16", True)}
    assert "ladder.v2: gate FAIL" in out and doc["manifest"]["command"]
    assert len(doc["compare_commands"]) == 2 * len(ladder.RUNGS) - 3


def test_ceilings_are_timed_in_the_rounds_of_each_configurations_rungs(fake_gpu, monkeypatch, capsys):
    # one interleave per configuration, holding its rungs and its dtype's GEMMs: a ceiling timed
    # in a phase of its own reads another clock than the rungs it divides
    seen = []
    real = cli.interleave_warmed

    def spy(fns, warm, protocol, timer):
        seen.append(list(fns))
        return real(fns, warm, protocol, timer)
    monkeypatch.setattr(cli, "interleave_warmed", spy)
    args = parse("--quick", "--no-progress", "--only", "v3,v4", "--no-gate", "--json", "-")
    assert args.func(args) == 0
    gemms = [f"{cli.CEILING_PREFIX}{g}" for g in GEMM_COST_MS]
    assert seen == [["ladder.v3", "ladder.v4", *gemms]] * 2
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc["ceilings"]) == ["gemm:bfloat16", "gemm:float16", "mma_sync:bfloat16", "mma_sync:float16"]


def test_percent_by_round_pairs_each_round_with_the_ceilings_own():
    row = cli.CONFIGS["B"]
    flops, _ = row.flops("fa-half")
    gemm_flops = 2 * cli.GEMM_SIZE ** 3
    # the clock falls 10% in the third round: both blocks slow down, the share does not move
    rung_ms, gemm_ms = [10.0, 10.0, 11.0, 10.0], [2.0, 2.0, 2.2, 2.0]
    got = cli.percent_by_round(rung_ms, gemm_ms, row)
    want = 100.0 * (flops / 10.0) / (gemm_flops / 2.0)
    assert got == {"median": pytest.approx(want), "p10": pytest.approx(want), "p90": pytest.approx(want), "n": 4}


def test_only_narrows_the_climb_and_names_the_missing_parent(fake_gpu, tmp_path, capsys):
    args = parse("--quick", "--no-progress", "--only", "v3,v4", "--config", "a", "--no-gate", "--json", "-")
    assert args.func(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["config"], r["rung"]) for r in doc["rows"]] == [("A", "ladder.v3"), ("A", "ladder.v4")]
    assert doc["rows"][0]["margin_note"] == "parent ladder.v2 not selected (--only)"
    assert doc["rows"][1]["margin"]["margin"] == pytest.approx(COST_MS["ladder.v3"] / COST_MS["ladder.v4"])
    assert list(doc["ceilings"]) == ["gemm:float16", "mma_sync:float16"]     # config A's dtype only
    assert fake_gpu == []


# ------------------------------------------------------------------------------------------
# Profile: ncu's CSV and its errors (synthetic), the retry without rejected metrics
# ------------------------------------------------------------------------------------------

WAVEFRONTS = "smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum"
LDSM = "smsp__inst_executed_op_ldsm.sum"
LDSM_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum"


def ncu_csv(values: dict) -> str:
    cols = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", *values]
    units = ["", "", "", "", "", *(u for _, u in values.values())]
    data = ["0", "4242", "python", "127.0.0.1", "attention_fwd_v1", *(v for v, _ in values.values())]
    quote = lambda cells: ",".join(f'"{c}"' for c in cells)   # noqa: E731
    return "\n".join(["==PROF== Connected to process 4242", quote(cols), quote(units), quote(data),
                      "==PROF== Disconnected from process 4242"])


def test_parse_ncu_raw_csv_and_derive_wavefronts_per_ldmatrix():
    text = ncu_csv({"gpu__time_duration.sum": ("1,234,567", "nsecond"),
                    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("41.5", "%"),
                    WAVEFRONTS: ("3,200", ""), LDSM: ("100", "inst"),
                    "sm__cycles_active.avg": ("900", "cycle"), "sm__cycles_elapsed.avg": ("1000", "cycle")})
    rows = cli.parse_ncu_csv(text)
    assert len(rows) == 1
    assert rows[0]["gpu__time_duration.sum"] == (1234567.0, "nsecond")
    assert rows[0]["Kernel Name"] == ("attention_fwd_v1", "")
    d = cli.derived(rows[0])
    assert d["ldsm_wavefronts_per_instruction"] == 32.0 and d["sm_active_pct"] == 90.0
    assert cli.parse_ncu_csv("==PROF== no kernels were profiled\n") == []

    doc = {"shape": cli.PROFILE_ROW.plan(), "ncu_version": "2025.3.1", "dropped": [LDSM_CONFLICTS],
           "rows": [{"rung": "ladder.v1", "status": "ok", "metrics": rows[0], "derived": d},
                    {"rung": "ladder.v2", "status": "error", "reason": "ncu exited 1: boom"}]}
    text = cli.format_profile(doc)
    line = next(ln for ln in text.splitlines() if ln.startswith("ladder.v1"))
    assert "1234.6" in line and "41.5" in line and "32.00" in line and "90.0" in line and "n/a" in line
    assert "B1 H16 S4096 d128 bfloat16 causal" in text and "--clock-control none" in text
    assert f"not collected (this ncu or GPU has no such metric): {LDSM_CONFLICTS}" in text
    assert "ladder.v2: ncu exited 1: boom" in text


def test_ncu_command_profiles_one_warm_launch_of_the_rung_without_locking_clocks():
    cmd = cli.ncu_command("ncu", ["a.sum", "b.pct"], "ladder.v3")
    assert cmd[:3] == ["ncu", "--clock-control", "none"]
    assert cmd[cmd.index("--metrics") + 1] == "a.sum,b.pct"
    assert cmd[cmd.index("--launch-skip") + 1] == "1" and cmd[cmd.index("--launch-count") + 1] == "1"
    child = cmd[cmd.index(sys.executable):]
    assert child[:5] == [sys.executable, "-m", "flashrung.kernels.ladder.cli", "--profile-target", "ladder.v3"]
    assert "--causal" in child and child[child.index("--seqlen") + 1] == "4096"


def test_profile_runs_at_the_chosen_frozen_configuration_and_skips_v0_at_b(monkeypatch, capsys):
    # --config b profiles where the climb's config-B margins were measured (S32768 causal), not at
    # the S4096 default; v0 is skipped there as in the climb, and the shape is recorded
    assert cli.profile_row("both") == (cli.PROFILE_ROW, None)
    row, name = cli.profile_row("b")
    assert name == "B" and row == cli.CONFIGS["B"] and row.seqlen_q == 32768 and row.causal
    cmd = cli.ncu_command("ncu", ["a.sum"], "ladder.v9", row)
    child = cmd[cmd.index(sys.executable):]
    assert child[child.index("--seqlen") + 1] == "32768" and "--causal" in child
    seen = []
    # elapsed cycles per launch: the rung's FLOPs per cycle against the best tile's
    cycles = {"ladder.v4": 2.0e7, cli.ceiling_target(0): 1.2e6, cli.ceiling_target(1): 1.0e6}

    def fake_profile_one(ncu, rung, metrics, dropped, row, flops=None):
        seen.append((rung, row.seqlen_q, flops))
        values = {"sm__cycles_elapsed.avg": (cycles.get(rung, 1.5e6), "cycle")}
        return {"rung": rung, "status": "ok", "kernel": "k", "metrics": values, "derived": cli.derived(values, flops)}

    monkeypatch.setattr(cli, "profile_one", fake_profile_one)
    monkeypatch.setattr(cli.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(cli.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "ncu 2025.3", ""))
    import flashrung.bench.cli as bench_cli
    monkeypatch.setattr(bench_cli, "gpu_available", lambda: (True, "test GPU"))
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["ladder", "--profile", "--config", "b", "--only", "v0,v4", "--no-progress",
                              "--peer", "flash"])
    assert cli.cmd_profile(args) == 0
    gemm = 2.0 * cli.GEMM_SIZE ** 3
    n_tiles = len(ceiling.CEILING_TILES)
    assert seen == [("ladder.v4", 32768, row.flops("fa-half")[0]), ("peer:flash", 32768, row.flops("fa-half")[0])] + [
        (cli.ceiling_target(i), 32768, gemm) for i in range(n_tiles)]
    out = capsys.readouterr().out
    assert "S32768" in out and "ladder.v0: CUDA-core FMA" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("ladder.v4"))
    want = 100.0 * (row.flops("fa-half")[0] / 2.0e7) / (gemm / 1.0e6)     # tile 1: the fewest cycles
    assert f"{want:.1f}" in line.split()[-1]
    assert f"mma.sync {ceiling.CEILING_TILES[1].label()}" in out
    # the peer is read per cycle against the same ceiling as the rungs
    peer = next(ln for ln in out.splitlines() if ln.startswith("peer flash"))
    assert f"{100.0 * (row.flops('fa-half')[0] / 1.5e6) / (gemm / 1.0e6):.1f}" in peer.split()[-1]


def test_profile_target_takes_a_rung_or_a_ceiling_tile():
    assert cli._profile_target("v4") == "ladder.v4"
    assert cli._profile_target("mma_sync:0") == "mma_sync:0"
    with pytest.raises(argparse.ArgumentTypeError, match="expected mma_sync:N with N below"):
        cli._profile_target(f"mma_sync:{len(ceiling.CEILING_TILES)}")
    cmd = cli.ncu_command("ncu", ["a.sum"], cli.ceiling_target(2))
    assert cmd[cmd.index("--kernel-name") + 1] == cli.CEILING_KERNELS
    assert cmd[cmd.index("--profile-target") + 1] == "mma_sync:2"
    assert cli._profile_target("peer:flash") == "peer:flash"
    with pytest.raises(argparse.ArgumentTypeError, match="expected peer:NAME with NAME in flash"):
        cli._profile_target("peer:cudnn")
    cmd = cli.ncu_command("ncu", ["a.sum"], "peer:flash")
    assert cmd[cmd.index("--kernel-name") + 1] == cli.PROFILE_PEERS["flash"] == "regex:flash_fwd"


def test_profile_drops_the_metrics_ncu_rejects_and_retries(monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        metrics = cmd[cmd.index("--metrics") + 1].split(",")
        calls.append(metrics)
        if LDSM_CONFLICTS in metrics:
            return subprocess.CompletedProcess(cmd, 1, "", f"==ERROR== Failed to find metric {LDSM_CONFLICTS}\n")
        return subprocess.CompletedProcess(cmd, 0, ncu_csv({m: ("1", "") for m in metrics}), "")

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    metrics, dropped = [m.name for m in cli.PROFILE_METRICS], []
    result = cli.profile_one("ncu", "ladder.v2", metrics, dropped)
    assert result["status"] == "ok" and dropped == [LDSM_CONFLICTS]
    assert len(calls) == 2 and LDSM_CONFLICTS not in metrics and set(result["metrics"]) == set(metrics)
    # the next rung starts from the pruned list: one call
    cli.profile_one("ncu", "ladder.v3", metrics, dropped)
    assert len(calls) == 3

    monkeypatch.setattr(cli.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "==ERROR== ERR_NVGPUCTRPERM - no permission to access the GPU performance counters"))
    failed = cli.profile_one("ncu", "ladder.v4", metrics, dropped)
    assert failed["status"] == "error" and "ERR_NVGPUCTRPERM" in failed["reason"] and "exited 1" in failed["reason"]


# ------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_climb_on_the_gpu(tmp_path):
    path = tmp_path / "ladder.json"
    proc = run_cli("--quick", "--only", "v3,v4", "--config", "a", "--no-progress", "--json", str(path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(path.read_text())
    assert doc["ceilings"]["gemm:float16"]["value"] > 0 and doc["ceilings"]["mma_sync:float16"]["value"] > 0
    v3, v4 = doc["rows"]
    for r in (v3, v4):
        assert r["status"] == "ok" and r["tflops"] > 0 and r["gate"]["passed"], r
        assert r["dispatch"]["fwd"]["kernel"] == r["rung"]                     # the public path ran the rung
    assert v4["margin"]["vs"] == "ladder.v3" and v4["margin"]["n"] >= 10
    assert "v4" in proc.stdout and "%mma.sync" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs ncu (Nsight Compute) on PATH")
def test_profile_on_the_gpu(tmp_path):
    path = tmp_path / "profile.json"
    proc = run_cli("--profile", "--only", "v0,v1", "--peer", "flash", "--no-progress", "--json", str(path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(path.read_text())
    rows = {r["rung"]: r for r in doc["rows"]}
    tensor = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    assert rows["ladder.v1"]["metrics"][tensor][0] > rows["ladder.v0"]["metrics"][tensor][0]
    # the ceiling's tiles were profiled too, and v1 is read against the best of them per cycle
    tiles = [r for r in doc["rows"] if r["kind"] == "ceiling"]
    assert len(tiles) == len(ceiling.CEILING_TILES) and all(t["status"] == "ok" for t in tiles)
    assert 0 < rows["ladder.v0"]["percent_of_mma_sync_per_cycle"] < rows["ladder.v1"]["percent_of_mma_sync_per_cycle"] < 100
    # FA2 (SDPA's flash backend) on the same instructions, found by its kernel name and read the same way
    fa2 = rows["peer flash"]
    assert fa2["status"] == "ok" and fa2["kind"] == "peer", fa2
    assert rows["ladder.v1"]["percent_of_mma_sync_per_cycle"] < fa2["percent_of_mma_sync_per_cycle"] < 100


# ------------------------------------------------------------------------------------------
# --processes: the climb repeated in fresh processes, read as a median and range per rung
# ------------------------------------------------------------------------------------------

def _climb_with(pcts: dict[tuple[str, str], float], mma_sync: float = 370.0, gate_ok: bool = True) -> dict:
    # one process's climb: rows whose share of the mma.sync ceiling is given, in ladder order
    rows = []
    for (config, rung), pct in pcts.items():
        r = cli.new_row(config, ladder.rung(rung))
        r.update(status="ok", tflops=pct * mma_sync / 100, percent_of_mma_sync_ceiling=pct,
                 margin=_summary(1.03, 1.02, 1.04, 1.03, 1.03) if r["parent"] else None,
                 gate=_gate(gate_ok, 0.3))
        rows.append(r)
    return {"mode": "climb", "rows": rows, "ceilings": {"mma_sync:bfloat16": {"value": mma_sync}},
            "manifest": {"environment": {"gpu": "NVIDIA H200"}}}


def test_readings_report_the_median_the_range_and_the_readings_at_target():
    # the property: a share near the target is read over processes — the median, the range and how
    # many processes reached 90% — not from whichever process ran last
    climbs = [_climb_with({("B", "ladder.v20"): 88.1, ("B", "ladder.v22"): p}, mma_sync=c)
              for p, c in ((89.8, 378.8), (91.2, 366.3), (90.4, 370.0))]
    summary = cli.summarize_readings(climbs)
    rows = {r["rung"]: r for r in summary["rows"]}
    v22 = rows["ladder.v22"]
    assert v22["readings"] == 3 and v22["at_or_above_target"] == 2
    assert v22["percent_of_mma_sync_ceiling"]["median"] == pytest.approx(90.4)
    assert (v22["percent_of_mma_sync_ceiling"]["min"], v22["percent_of_mma_sync_ceiling"]["max"]) == (89.8, 91.2)
    assert v22["margin"]["median"] == pytest.approx(1.03) and rows["ladder.v20"]["at_or_above_target"] == 0
    assert summary["ceilings"]["mma_sync:bfloat16"]["min"] == 366.3
    doc = {"mode": "readings", "processes": 4, "protocol": "default", "gated": True,
           "summary": summary, "wall_s": 200.0,
           "runs": [{"process": i + 1, "returncode": 0, "climb": c, "error": None} for i, c in enumerate(climbs)]
           + [{"process": 4, "returncode": 1, "climb": None, "error": "CUDA error: out of memory"}]}
    text = cli.format_readings(doc)
    assert "3 of 4 fresh processes read" in text and "NVIDIA H200" in text
    assert "90.4% [89.8,91.2]" in text and "2 of 3" in text
    assert "process 4: exit 1: CUDA error: out of memory" in text


def test_readings_count_failed_gates_and_unmeasured_rows():
    climbs = [_climb_with({("B", "ladder.v22"): 90.0}, gate_ok=False), _climb_with({("B", "ladder.v22"): 90.0})]
    skipped = cli.new_row("B", ladder.rung("v0"))
    skipped.update(status="skipped")
    climbs[0]["rows"].append(skipped)
    summary = cli.summarize_readings(climbs)
    rows = {r["rung"]: r for r in summary["rows"]}
    assert rows["ladder.v22"]["gate_failed"] == 1 and rows["ladder.v22"]["at_or_above_target"] == 2
    assert rows["ladder.v0"]["readings"] == 0 and rows["ladder.v0"]["not_measured"] == ["skipped"]
    text = cli.format_readings({"mode": "readings", "processes": 2, "protocol": "quick", "gated": True,
                                "summary": summary, "wall_s": 1.0,
                                "runs": [{"process": 1, "returncode": 1, "climb": climbs[0], "error": None}]})
    assert "FAIL x1" in text and "skipped" in text


def test_processes_run_the_same_climb_in_fresh_processes(monkeypatch, tmp_path, capsys):
    # each child is this climb's command (rungs, config, protocol, seed) writing its own JSON; the
    # readings document keeps every child's climb and renders again from --from-json
    monkeypatch.setattr(bench_cli, "gpu_available", lambda: (True, "Virtual GPU"))
    seen = []

    def fake_child(argv):
        seen.append(argv)
        path = pathlib.Path(argv[argv.index("--json") + 1])
        if len(seen) == 2:                                      # the second process dies before writing
            return subprocess.CompletedProcess(argv, -9, "", "Killed")
        path.write_text(json.dumps(_climb_with({("B", "ladder.v20"): 88.0, ("B", "ladder.v22"): 89.0 + len(seen)})))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(cli, "run_child", fake_child)
    out = tmp_path / "readings.json"
    args = parse("--processes", "3", "--only", "v20,v22", "--config", "b", "--quick", "--seed", "7",
                 "--no-progress", "--json", str(out))
    rc = args.func(args)
    assert rc == 1                                               # one process wrote nothing
    assert len(seen) == 3
    for argv in seen:
        assert argv[1:4] == ["-m", "flashrung.cli", "ladder"] and "--processes" not in argv
        assert argv[argv.index("--only") + 1] == "v20,v22" and argv[argv.index("--config") + 1] == "b"
        assert "--quick" in argv and argv[argv.index("--seed") + 1] == "7"
    assert len({a[a.index("--json") + 1] for a in seen}) == 3   # a file of its own each
    doc = json.loads(out.read_text())
    assert doc["mode"] == "readings" and [r["returncode"] for r in doc["runs"]] == [0, -9, 0]
    v22 = next(r for r in doc["summary"]["rows"] if r["rung"] == "ladder.v22")
    assert v22["percent_of_mma_sync_ceiling"]["values"] == [90.0, 92.0] and v22["at_or_above_target"] == 2
    printed = capsys.readouterr().out
    assert "process 2: exit -9: Killed" in printed
    args = parse("--from-json", str(out), "--plot", str(tmp_path / "again.png"))
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == printed.strip()


def test_processes_refuse_the_census_the_profile_and_a_machine_without_a_gpu(monkeypatch, capsys):
    for extra in (["--census"], ["--profile"]):
        args = parse("--processes", "2", *extra)
        assert args.func(args) == 2
    monkeypatch.setattr(bench_cli, "gpu_available", lambda: (False, "no CUDA device"))
    args = parse("--processes", "2")
    assert args.func(args) == 2
    assert "needs a GPU (no CUDA device)" in capsys.readouterr().err
    for bad in ("0", "21", "x"):
        with pytest.raises(SystemExit):
            parse("--processes", bad)


def test_plot_of_the_readings(tmp_path):
    pytest.importorskip("matplotlib")
    climbs = [_climb_with({("B", "ladder.v20"): 88.0, ("B", "ladder.v22"): p}) for p in (89.8, 90.6)]
    doc = {"processes": 2, "summary": cli.summarize_readings(climbs)}
    out = cli.plot_readings(doc, tmp_path / "readings.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
