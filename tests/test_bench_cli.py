"""`flashrung bench | null | compare | reanchor` argument handling and the no-GPU paths."""
import argparse
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from flashrung.bench import cli, suites, timing


def parse(*argv):
    parser = argparse.ArgumentParser(prog="flashrung")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    return parser.parse_args(list(argv))


def run(capsys, *argv):
    args = parse(*argv)
    rc = args.func(args)
    out, err = capsys.readouterr()
    return rc, out, err


def test_dry_run_json_prints_the_fa4_plan(capsys):
    rc, out, _ = run(capsys, "bench", "--suite", "fa4-protocol", "--dry-run", "--json")
    assert rc == 0
    plan = json.loads(out)
    assert len(plan["rows"]) == 48
    required = {"batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "headdim", "dtype", "causal", "mode",
                "flops", "flops_convention"}
    assert all(required <= set(r) for r in plan["rows"])
    first = plan["rows"][0]
    assert (first["batch"], first["seqlen_q"], first["flops"], first["flops_convention"]) == (32, 1024, 274_877_906_944, "dense")
    causal = [r for r in plan["rows"] if r["causal"]]
    assert all(r["flops_convention"] == "fa-half" for r in causal)
    assert {r["mode"] for r in plan["rows"]} == {"fwd", "bwd"}


def test_exact_convention_is_labelled(capsys):
    rc, out, _ = run(capsys, "bench", "--suite", "seed-frozen", "--dry-run", "--json", "--causal-flops", "exact")
    rows = json.loads(out)["rows"]
    assert rc == 0 and [r["flops_convention"] for r in rows] == ["dense", "exact"]
    assert rows[1]["flops"] == rows[1]["flops_by_convention"]["exact"] > rows[1]["flops_by_convention"]["fa-half"]


def test_suite_filters_and_free_shapes():
    _, rows = cli.rows_from_args(parse("bench", "--suite", "fa4-protocol", "--seqlen", "4096", "--headdim", "128",
                                       "--no-causal", "--mode", "fwd"))
    assert [(r.batch, r.seqlen_q, r.headdim, r.causal, r.mode) for r in rows] == [(8, 4096, 128, False, "fwd")]
    name, rows = cli.rows_from_args(parse("bench", "--seqlen", "2048", "8192", "--heads", "32", "--kv-heads", "8",
                                          "--headdim", "64", "--causal", "--dtype", "fp16", "--mode", "fwd+bwd"))
    assert name == "free" and len(rows) == 4
    assert {(r.batch, r.seqlen_q) for r in rows} == {(16, 2048), (4, 8192)}      # 32k tokens when --batch is absent
    assert all(r.heads_kv == 8 and r.dtype == "float16" and r.causal for r in rows)
    name, rows = cli.rows_from_args(parse("bench"))
    assert name == "fa4-protocol" and len(rows) == 48


def test_a_value_head_dim_reaches_free_shapes_and_paired_rows_and_not_a_suite(capsys):
    _, rows = cli.rows_from_args(parse("bench", "--seqlen", "4096", "--headdim", "192", "--headdim-v", "128"))
    assert [(r.headdim, r.dv, r.label()) for r in rows] == [(192, 128, rows[0].label())]
    assert "d192/128" in rows[0].label()
    row = cli.pair_row(parse("compare", "cudnn", "flashrung", "--headdim", "192", "--headdim-v", "128"))
    assert (row.headdim, row.dv) == (192, 128)
    # a value head dim equal to the head dim is no value head dim of its own
    assert cli.pair_row(parse("compare", "cudnn", "flashrung", "--headdim-v", "128")).headdim_v is None
    rc, _, err = run(capsys, "bench", "--suite", "fa4-protocol", "--headdim-v", "128", "--dry-run")
    assert rc == 2 and "--headdim-v" in err and "suite" in err


def test_a_softcap_reaches_free_shapes_and_paired_rows_and_not_a_suite(capsys):
    # --softcap C: the rows' problem (their label, plan and shared inputs), not their FLOPs
    _, rows = cli.rows_from_args(parse("bench", "--seqlen", "4096", "--softcap", "30"))
    plain = cli.rows_from_args(parse("bench", "--seqlen", "4096"))[1][0]
    assert rows[0].softcap == 30.0 and "cap30" in rows[0].label() and rows[0].plan()["softcap"] == 30.0
    assert rows[0].flops() == plain.flops() and rows[0].shape_key() != plain.shape_key()
    assert suites.Row.from_plan(rows[0].plan()) == rows[0]
    assert cli.pair_row(parse("compare", "fa4", "flashrung", "--softcap", "50")).softcap == 50.0
    rc, _, err = run(capsys, "bench", "--suite", "fa4-protocol", "--softcap", "30", "--dry-run")
    assert rc == 2 and "--softcap" in err and "suite" in err
    for bad in ("-1", "nan", "inf", "thirty"):
        with pytest.raises(SystemExit):
            parse("bench", "--seqlen", "4096", "--softcap=" + bad, "--dry-run")
        assert "softcap must be 0 (none) or a finite positive number" in capsys.readouterr().err


def test_a_window_reaches_free_shapes_and_paired_rows_and_not_a_suite(capsys):
    # --window LEFT,RIGHT: the rows' problem (label, plan, shared inputs) and their FLOPs, which
    # count the pairs inside the window under a convention of their own
    _, rows = cli.rows_from_args(parse("bench", "--seqlen", "8192", "--window", "1024,0", "--causal"))
    (row,) = rows
    assert row.window == (1024, 0) and "causal win1024,0" in row.label()
    assert row.flops() == (row.flop_count().forward("window"), "window")
    assert row.flops()[0] < cli.rows_from_args(parse("bench", "--seqlen", "8192", "--causal"))[1][0].flops()[0]
    assert suites.Row.from_plan(row.plan()) == row and row.plan()["window"] == [1024, 0]
    assert row.shape_key() != dataclasses.replace(row, window=None).shape_key()
    assert cli.pair_row(parse("compare", "fa4", "flashrung", "--window", "256,256")).window == (256, 256)
    rc, out, _ = run(capsys, "bench", "--seqlen", "4096", "--window", "128,-1", "--causal", "--dry-run")
    assert rc == 0 and "causal win128,-1" in out and "window" in out
    rc, _, err = run(capsys, "bench", "--suite", "fa4-protocol", "--window", "128,0", "--dry-run")
    assert rc == 2 and "--window" in err and "suite" in err
    # a right side a causal row cannot have, and windows that bound nothing the mask does not
    for argv in (("--window", "128,4", "--causal"), ("--window=-1,0",), ("--window=-1,-1", "--causal")):
        rc, _, err = run(capsys, "bench", "--seqlen", "4096", *argv, "--dry-run")
        assert rc == 2 and err.startswith("flashrung bench: --window: "), err
    with pytest.raises(SystemExit, match="--window: a causal row's window right side"):
        cli.pair_row(parse("compare", "fa4", "flashrung", "--window", "64,3", "--causal"))
    for bad in ("64", "a,b", "-2,0", "1,2,3"):
        with pytest.raises(SystemExit):
            parse("bench", "--seqlen", "4096", "--window=" + bad, "--dry-run")
        assert "--window" in capsys.readouterr().err


def test_packed_sequences_reach_free_shapes_and_paired_rows_and_not_a_suite(capsys):
    # --packed LENGTHS: one row of those sequences (batch their count, seqlen the longest), labelled
    # and planned as a pack, its FLOPs each sequence's; refused beside the flags it replaces and
    # beside a suite
    _, rows = cli.rows_from_args(parse("bench", "--packed", "4096x2,1024x3,17", "--causal", "--heads", "32",
                                       "--kv-heads", "8"))
    (row,) = rows
    assert row.packed == (4096, 4096, 1024, 1024, 1024, 17) and (row.batch, row.seqlen_q) == (6, 4096)
    assert "packed 4096x2,1024x3,17" in row.label()
    assert suites.Row.from_plan(row.plan()) == row and row.plan()["packed"] == list(row.packed)
    assert row.flops()[0] == row.flop_count().forward("fa-half") < suites.Row(
        batch=6, seqlen_q=4096, seqlen_k=4096, heads_q=32, heads_kv=8, headdim=128, dtype="bfloat16", causal=True,
        mode="fwd").flops()[0]
    assert row.shape_key() != dataclasses.replace(row, packed=None, batch=6).shape_key()
    paired = cli.pair_row(parse("compare", "flashrung:portable.fwd", "flashrung:hopper.fwd", "--packed", "300,7"))
    assert paired.packed == (300, 7) and paired.batch == 2
    rc, out, _ = run(capsys, "bench", "--packed", "2048x4", "--dry-run")
    assert rc == 0 and "packed 2048x4" in out
    for extra in (("--seqlen", "4096"), ("--batch", "2"), ("--seqlen-k", "100")):
        rc, _, err = run(capsys, "bench", "--packed", "2048x4", *extra, "--dry-run")
        assert rc == 2 and "--packed" in err and extra[0] in err, err
    with pytest.raises(SystemExit, match="drop --seqlen"):
        cli.pair_row(parse("compare", "fa4", "flashrung", "--packed", "64", "--seqlen", "64"))
    rc, _, err = run(capsys, "bench", "--suite", "fa4-protocol", "--packed", "128", "--dry-run")
    assert rc == 2 and "--packed" in err and "suite" in err
    for bad in ("", "a", "12x0", "-3", "0,0", "1024x", "17,0x"):
        with pytest.raises(SystemExit):
            parse("bench", "--packed=" + bad, "--dry-run")
        assert "--packed" in capsys.readouterr().err


def test_bad_arguments_say_what_to_fix(capsys):
    rc, _, err = run(capsys, "bench", "--suite", "seed-frozen", "--batch", "3", "--dry-run")
    assert rc == 2 and "--batch" in err and "suite" in err
    rc, _, err = run(capsys, "bench", "--heads", "16", "--dry-run")
    assert rc == 2 and "--seqlen" in err
    with pytest.raises(SystemExit):
        parse("bench", "--impl", "cutlass")
    with pytest.raises(SystemExit):
        parse("compare", "cudnn", "flashrung:")
    with pytest.raises(SystemExit):
        parse("null", "--alternations", "7")
    with pytest.raises(SystemExit):
        parse("compare", "cudnn", "flash", "--block-preheat-ms", "-5")
    with pytest.raises(ValueError, match="multiple of kv-heads"):
        suites.free_rows(seqlens=[128], batch=1, heads=6, kv_heads=4, headdim=64)


def test_impl_list_defaults_to_every_peer_and_flashrung(capsys):
    rc, out, _ = run(capsys, "bench", "--seqlen", "1024", "--dry-run", "--json", "--impl", "cudnn",
                     "--impl", "flashrung:portable", "--impl", "cudnn")
    assert json.loads(out)["impls"] == ["cudnn", "flashrung:portable"]
    rc, out, _ = run(capsys, "bench", "--seqlen", "1024", "--dry-run", "--json")
    assert json.loads(out)["impls"] == ["cudnn", "flash", "efficient", "flex", "fa4", "flashrung"]


def _no_gpu():
    import torch
    return not torch.cuda.is_available()


@pytest.mark.skipif(not _no_gpu(), reason="checks the message a machine without a GPU prints")
def test_plain_bench_without_a_gpu_says_so_and_prints_the_plan():
    proc = subprocess.run([sys.executable, "-m", "flashrung.bench", "bench"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0
    assert "no GPU" in proc.stderr and "nothing was timed" in proc.stderr
    assert "274,877,906,944" in proc.stdout and "fa-half" in proc.stdout


@pytest.mark.skipif(not _no_gpu(), reason="checks the message a machine without a GPU prints")
def test_paired_commands_without_a_gpu_refuse_plainly(capsys, tmp_path):
    for argv in (("null",), ("compare", "cudnn", "flashrung")):
        rc, _, err = run(capsys, *argv, "--calibration", str(tmp_path / "c.json"))
        assert rc == 2 and "needs a GPU" in err


def test_reanchor_rejects_a_broken_chain_before_touching_a_gpu(capsys, tmp_path):
    links = tmp_path / "links.json"
    links.write_text(json.dumps({"links": [
        {"baseline": "flashrung:ladder.v5", "candidate": "flashrung:a", "margin": 1.004, "verdict": "KEEP", "paired": True},
        {"baseline": "flashrung:b", "candidate": "flashrung:c", "margin": 1.01, "verdict": "KEEP", "paired": True}]}))
    rc, _, err = run(capsys, "reanchor", "--links", str(links))
    assert rc == 2 and "chain is broken" in err


def test_links_load_from_compare_outputs_and_lists(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"link": {"baseline": "x", "candidate": "y", "margin": 1.01, "verdict": "KEEP",
                                      "paired": True, "row": {}}, "verdict": {}}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps([{"baseline": "y", "candidate": "z", "margin": 1.02, "verdict": "KEEP", "paired": True}]))
    links = cli.load_links([a, b])
    assert [(l.baseline, l.candidate) for l in links] == [("x", "y"), ("y", "z")]


TINY = ["--batch", "1", "--seqlen", "64", "--heads", "2", "--headdim", "32", "--dtype", "fp16", "--device", "cpu",
        "--quick", "--alternations", "4", "--reps", "1", "--warmup", "2"]


def test_null_compare_reanchor_run_their_fresh_process_path_on_cpu(capsys, tmp_path):
    """The machinery end to end on the CPU (wall clock, interpreter): the numbers mean nothing,
    the plumbing — fresh processes, calibration, verdict, links, re-anchor — is what is checked."""
    cal = tmp_path / "cal.json"
    rc, out, err = run(capsys, "null", "--impl", "flash", "--pairs", "10", "--calibration", str(cal), *TINY)
    assert rc == 0, err
    entry = json.loads(cal.read_text())["cpu"]
    assert entry["n"] == 10 and len(entry["margins"]) == 10 and entry["impl"] == "flash"
    assert entry["t_noise"] == pytest.approx(max(abs(m - 1) for m in entry["margins"]))
    assert "t_noise =" in out and out.count("pair ") >= 10

    # the calibration just stored is the threshold compare reads
    link_path = tmp_path / "link.json"
    rc, out, err = run(capsys, "compare", "flash", "flashrung:portable", "--calibration", str(cal),
                       "--json", str(link_path), *TINY)
    assert rc == 0, err
    assert f"t_keep {1 + entry['t_noise']:.6f}" in out and "gate candidate: PASS" in out
    doc = json.loads(link_path.read_text())
    verdict = doc["verdict"]["verdict"]
    assert verdict in ("KEEP", "REVERT", "NULL") and f"\n{verdict}: margin" in out
    assert len(doc["runs"]) == 2 and doc["runs"][0]["pid"] != doc["runs"][1]["pid"]      # two fresh processes
    assert doc["link"]["paired"] and doc["link"]["margin"] == doc["verdict"]["runs"][0]["margin"]

    links = tmp_path / "links.json"
    links.write_text(json.dumps([{**doc["link"], "verdict": "KEEP"}]))
    rc, out, err = run(capsys, "reanchor", "--links", str(links), "--t-noise", "0.01", *TINY)
    assert rc == 0, err
    assert "1 kept links flash → flashrung:portable" in out
    assert any(w in out for w in ("CONSISTENT", "OVERSHOOT", "UNDERSHOOT"))


def test_compare_without_a_calibration_asks_for_the_null(capsys, tmp_path):
    rc, _, err = run(capsys, "compare", "flash", "flash", "--calibration", str(tmp_path / "none.json"), *TINY)
    assert rc == 2 and "flashrung null" in err


def test_rounds_reach_the_bench_protocol_and_must_be_even(capsys):
    # more rounds put more pairs behind a row's ratio (six by default); the halves stay in
    # opposite orders, so an odd count or fewer than two is refused, naming the flag
    assert cli.bench_protocol(parse("bench")) == timing.BenchProtocol()
    proto = cli.bench_protocol(parse("bench", "--rounds", "24"))
    assert proto.rounds == 24 and proto.block_preheat_ms == timing.BenchProtocol().block_preheat_ms
    assert cli.bench_protocol(parse("bench", "--quick", "--rounds", "8")) == \
        dataclasses.replace(timing.QUICK_BENCH, rounds=8)
    for bad in ("5", "0", "-2", "six"):
        with pytest.raises(SystemExit):
            parse("bench", "--rounds", bad)
        assert "--rounds" in capsys.readouterr().err
    assert len(timing.half_reversed_orders(["a", "b"], proto.rounds)) == 24


def test_order_reaches_the_bench_protocol_balanced_by_default(capsys):
    # the balanced design by default; the fixed order and its reverse on request (the protocol the
    # suite ran before), anything else refused naming the flag
    assert cli.bench_protocol(parse("bench")).order == "balanced"
    proto = cli.bench_protocol(parse("bench", "--order", "halves", "--rounds", "8"))
    assert proto.order == "halves" and proto.rounds == 8
    with pytest.raises(SystemExit):
        parse("bench", "--order", "shuffled")
    assert "--order" in capsys.readouterr().err


def test_block_preheat_reaches_the_bench_protocol_and_the_suites_default_stays(capsys):
    # the suite's protocol preheats 150 ms; a longer preheat (a GPU whose clock carries the previous
    # block's state longer: the report's "two speeds") or none reaches the protocol as given, and a
    # negative one is refused naming the flag
    assert cli.bench_protocol(parse("bench")).block_preheat_ms == timing.BenchProtocol().block_preheat_ms == 150.0
    assert cli.bench_protocol(parse("bench", "--block-preheat-ms", "1000")).block_preheat_ms == 1000.0
    assert cli.bench_protocol(parse("bench", "--block-preheat-ms", "0")).block_preheat_ms == 0.0
    quick = cli.bench_protocol(parse("bench", "--quick", "--block-preheat-ms", "500"))
    assert quick == dataclasses.replace(timing.QUICK_BENCH, block_preheat_ms=500.0)
    with pytest.raises(SystemExit):
        parse("bench", "--block-preheat-ms", "-1")
    assert "--block-preheat-ms" in capsys.readouterr().err


def test_block_preheat_reaches_the_paired_protocol():
    # off by default (the A/A calibration was taken without it); given, it travels with the
    # protocol into the fresh-process worker's spec
    assert cli.pair_protocol(parse("compare", "cudnn", "flash", "--quick")).block_preheat_ms == 0.0
    proto = cli.pair_protocol(parse("compare", "cudnn", "flash", "--quick", "--block-preheat-ms", "150"))
    assert proto.block_preheat_ms == 150.0 and proto.alternations == timing.QUICK_PAIRED.alternations
    assert timing.PairedProtocol(**proto.to_json()) == proto



def test_calibration_from_before_a_protocol_field_still_matches(tmp_path):
    # an A/A entry stored before block_preheat_ms existed matches a run that leaves it at 0, and
    # is flagged against a run that preheats
    row = suites.Row(batch=8, seqlen_q=4096, seqlen_k=4096, heads_q=16, heads_kv=16, headdim=128,
                     dtype="bfloat16", causal=False, mode="fwd")
    old_protocol = {k: v for k, v in timing.QUICK_PAIRED.to_json().items() if k != "block_preheat_ms"}
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"gpu0": {"t_noise": 0.0004, "n": 10, "impl": "flashrung", "date": "d",
                                        "row": row.plan(), "protocol": old_protocol}}))
    args = argparse.Namespace(t_noise=None, calibration=cal)
    t, source = cli._t_noise(args, "gpu0", row, timing.QUICK_PAIRED)
    assert t == 0.0004 and "NOTE" not in source
    preheated = timing.PairedProtocol(**{**timing.QUICK_PAIRED.to_json(), "block_preheat_ms": 150.0})
    _, source = cli._t_noise(args, "gpu0", row, preheated)
    assert "calibrated with protocol" in source


def _run_end(power, limit="700.00", sm="1980"):
    return {"clocks_end": {"source": "nvidia-smi", "power.draw": power, "power.limit": limit, "clocks.sm": sm}}


def test_compare_reports_the_power_regime_its_runs_ended_in():
    # the property: an unpreheated comparison that ended below the power limit says so, because a
    # lever that moves memory traffic ranked differently at the limit (stagger: 1.02 vs 0.98)
    plain = cli.pair_protocol(parse("compare", "cudnn", "flash", "--quick"))
    hot = cli.pair_protocol(parse("compare", "cudnn", "flash", "--quick", "--block-preheat-ms", "150"))
    line = cli.regime_line([_run_end("272.27"), _run_end("641.20", sm="1935")], plain)
    assert "272 W of 700 W at 1980 MHz, 641 W of 700 W at 1935 MHz" in line and "NOTE: below the power limit" in line
    # at the limit, or preheated, the line is a plain record
    assert "NOTE" not in cli.regime_line([_run_end("690.1"), _run_end("688.0")], plain)
    assert "NOTE" not in cli.regime_line([_run_end("130.0")], hot) and "preheated 150 ms" in cli.regime_line(
        [_run_end("130.0")], hot)
    # no snapshot (the CPU path, or nvidia-smi missing or printing [N/A]): no line rather than a guess
    assert cli.regime_line([{"clocks_end": {"source": "torch", "clocks.sm": 1980}}, {}], plain) is None
    assert cli.regime_line([_run_end("[N/A]")], plain) is None


def test_compare_says_when_an_arm_may_be_timed_host_bound():
    # the property: an arm whose host path per call comes near its GPU time is named, with both
    # figures; arms well ahead of the GPU, and runs without a probe (the CPU path), print nothing
    near = {"host_path": {"baseline": {"host_ms": 0.10, "device_ms": 0.32},
                          "candidate": {"host_ms": 0.29, "device_ms": 0.32}}}
    far = {"host_path": {"baseline": {"host_ms": 0.05, "device_ms": 0.5}, "candidate": {"host_ms": 0.06, "device_ms": 0.5}}}
    line = cli.host_path_line([far, near])
    assert line.startswith("host path: run 2 candidate 0.290 ms/call issued against 0.320 ms/call")
    assert "run 1" not in line and "baseline" not in line
    assert cli.host_path_line([far, far]) is None
    assert cli.host_path_line([{"host_path": None}, {}]) is None


def _failed_gate(role):
    return {"impl": role, "mode": "fwd", "config": {}, "passed": False, "ratio": 85.2,
            "text": f"FAIL {role}: worst out err 3.493e+00 bound 4.099e-02 ratio 85.220"}


def test_a_failed_gate_is_not_timed_in_the_worker(monkeypatch):
    # correct first: the worker gates both arms before it prepares or times anything; an arm that
    # fails leaves a document with the gate results and no series
    from flashrung.bench import peers, runner, worker
    monkeypatch.setattr(runner, "run_gate", lambda impl, row, seed=0, device="cuda":
                        _failed_gate(impl) if impl.endswith("@broken=1") else {**_failed_gate(impl), "passed": True})

    def no_timing(*a, **k):
        raise AssertionError("an arm that failed its gate was prepared or timed")
    monkeypatch.setattr(peers, "make_inputs", no_timing)
    monkeypatch.setattr(timing, "paired_run", no_timing)
    row = cli.pair_row(parse("compare", "cudnn", "flash", *TINY))
    spec = worker.Spec("flashrung:portable", "flashrung:portable@broken=1", row, timing.PairedProtocol(alternations=4),
                       gate=True, device="cpu")
    doc = worker.run_in_process(spec)
    assert doc["summary"] is None and doc["run"] is None
    assert doc["untimed"] == "candidate failed the correctness gate: not timed"
    assert doc["gate"]["baseline"]["passed"] and not doc["gate"]["candidate"]["passed"]


def test_an_arm_computing_another_function_is_not_timed_in_the_worker(monkeypatch):
    # with the gate, the worker reads a forward row's two outputs against the oracle at the row's
    # size, peers' too (the gate itself checks only flashrung's kernels): a baseline whose window is
    # another than the row's fails as a gate does — nothing is timed, the gate record says why — and
    # one computing the row's attention passes
    from flashrung import reference
    from flashrung.bench import peers, suites, worker
    row = suites.Row(batch=1, seqlen_q=48, seqlen_k=48, heads_q=2, heads_kv=2, headdim=32, dtype="float16",
                     causal=False, window=(8, -1), mode="fwd")
    real = peers.prepare

    def prepare(impl, r, inputs, options=peers.PeerOptions()):
        window = {"flash": (4, -1), "efficient": (8, -1)}.get(impl)
        if window is None:
            return real(impl, r, inputs, options)
        return peers._wrap(r, inputs, lambda q, k, v: reference.lowp(
            q, k, v, softmax_scale=inputs.scale, window_size=window)[0].to(q.dtype))
    monkeypatch.setattr(peers, "prepare", prepare)

    def no_timing(*a, **k):
        raise AssertionError("an arm computing another function was timed")
    monkeypatch.setattr(timing, "paired_run", no_timing)
    doc = worker.run_in_process(worker.Spec("flash", "efficient", row, timing.PairedProtocol(alternations=4),
                                            gate=True, device="cpu"))
    assert doc["summary"] is None and doc["untimed"].startswith("baseline computes another function")
    assert not doc["gate"]["baseline"]["passed"] and doc["gate"]["baseline"]["text"].startswith("FAIL output check")
    assert doc["gate"].get("candidate") is None
    monkeypatch.undo()
    monkeypatch.setattr(peers, "prepare", prepare)
    doc = worker.run_in_process(worker.Spec("efficient", "efficient", row, timing.PairedProtocol(alternations=4),
                                            gate=True, device="cpu"))
    assert doc["summary"] is not None and doc["gate"] == {"baseline": None, "candidate": None}


def test_compare_reverts_an_untimed_candidate_without_a_second_run(capsys, monkeypatch, tmp_path):
    from flashrung.bench import worker
    calls = []

    def run_fresh(spec, **kw):
        calls.append(spec)
        return {"spec": spec.to_json(), "gpu": "cpu", "run": None, "summary": None,
                "untimed": "candidate failed the correctness gate: not timed", "dispatch": {}, "notes": {},
                "gate": {"baseline": None, "candidate": _failed_gate("flashrung:portable")}, "pid": 1,
                "clocks_start": {}, "clocks_end": {}, "host_path": None, "wall_s": 0.1}
    monkeypatch.setattr(worker, "run_fresh", run_fresh)
    out_json = tmp_path / "c.json"
    rc, out, err = run(capsys, "compare", "cudnn", "flashrung:portable", "--t-noise", "0.002",
                       "--json", str(out_json), *TINY)
    assert rc == 0, err
    assert len(calls) == 1 and calls[0].gate            # the gated run only: nothing to replicate
    assert "run 1: candidate failed the correctness gate: not timed" in out
    assert "gate candidate: FAIL" in out and "\nREVERT: not timed vs t_keep 1.002000" in out
    doc = json.loads(out_json.read_text())
    assert doc["verdict"]["verdict"] == "REVERT" and doc["link"]["margin"] is None
    assert cli.load_links([out_json])[0].margin is None


RESULTS_DIR = os.path.join(os.path.dirname(__file__), "..", "docs", "results")


def _stored(name):
    return os.path.join(RESULTS_DIR, name)


def test_row_from_reruns_the_problem_a_stored_reading_ran(tmp_path):
    # a stored compare's row comes back whole (a pack here), for another pair of arms on this GPU
    packed = cli.pair_row(parse("compare", "--row-from",
                                _stored("h100-compare-packed-causal-sections-d64-16-over-48-a3615bf.json.gz"),
                                "flashrung:hopper.fwd@packed_section_mib=48", "flashrung:hopper.fwd"))
    assert packed.packed == (8192, 4096, 4096) + (1024,) * 8 and packed.causal and packed.headdim == 64
    assert packed.heads_q == 32
    # a sustain's row, and row N of a bench run (the fa4-protocol suite's target row is its fifth)
    sustained = cli.pair_row(parse("sustain", "--row-from", _stored("h200-sustain-fa4-d64-full-s16384-37f7706.json.gz"),
                                   "fa4", "flashrung"))
    assert (sustained.batch, sustained.seqlen_q, sustained.headdim, sustained.causal) == (2, 16384, 64, False)
    target = cli.pair_row(parse("compare", "--row-from", _stored("fa4-fwd-95f4cd1.json.gz") + "#4", "fa4", "flashrung"))
    assert (target.batch, target.heads_q, target.seqlen_q, target.headdim, target.causal) == (2, 16, 16384, 128, False)
    # a row with a window, v's own head dim and a cap survives the file as it does the flags
    row = suites.Row(batch=3, seqlen_q=1000, seqlen_k=777, heads_q=8, heads_kv=2, headdim=192, headdim_v=128,
                     dtype="float16", causal=True, mode="fwd", softcap=30.0, window=(256, 0))
    f = tmp_path / "link.json"
    f.write_text(json.dumps({"link": {"baseline": "a", "candidate": "b", "row": row.plan()}}))
    assert cli.pair_row(parse("compare", "--row-from", str(f), "fa4", "flashrung")) == row


def test_row_from_refuses_what_it_cannot_read_and_names_it(tmp_path):
    suite = _stored("fa4-fwd-95f4cd1.json.gz")
    with pytest.raises(SystemExit, match="holds 24 rows; name one as .*#N"):
        cli.pair_row(parse("compare", "--row-from", suite, "fa4", "flashrung"))
    with pytest.raises(SystemExit, match="row 24 asked for, the file holds 24"):
        cli.pair_row(parse("compare", "--row-from", suite + "#24", "fa4", "flashrung"))
    with pytest.raises(SystemExit, match="must be an integer"):
        cli.pair_row(parse("compare", "--row-from", suite + "#x", "fa4", "flashrung"))
    with pytest.raises(SystemExit, match="gives the whole row; drop --batch, --causal"):
        cli.pair_row(parse("compare", "--row-from", suite + "#4", "--batch", "2", "--causal", "fa4", "flashrung"))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"verdict": "KEEP"}))
    with pytest.raises(SystemExit, match="holds no row"):
        cli.pair_row(parse("compare", "--row-from", str(empty), "fa4", "flashrung"))
    with pytest.raises(SystemExit, match="cannot read it as JSON"):
        cli.pair_row(parse("compare", "--row-from", str(tmp_path / "missing.json"), "fa4", "flashrung"))
