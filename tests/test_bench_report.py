"""A bench row end to end on a virtual clock (no GPU), its table, plot, manifest and calibration."""
import dataclasses
import json
import sys
import types

import pytest

from flashrung.bench import calibration, manifest, numerators, peers, report, runner, suites, timing

ROW = suites.Row(batch=8, seqlen_q=4096, seqlen_k=4096, heads_q=16, heads_kv=16, headdim=128, dtype="bfloat16",
                 causal=True, mode="fwd", suite="fa4-protocol")


class Clock:
    t = 0.0


def fake_prepare(times_ms):
    """peers.prepare stand-in: each impl advances a virtual clock; "flash" declines."""
    def prepare(impl, row, inputs, options=None):
        if impl not in times_ms:
            raise peers.Unsupported(f"{impl} declines head dim {row.headdim} (synthetic)")

        def fn():
            Clock.t += times_ms[impl] / 1e3
        return peers.Prepared(fn=fn, note=f"synthetic {impl}")
    return prepare


@pytest.fixture
def row_result(monkeypatch):
    monkeypatch.setattr(peers, "prepare", fake_prepare({"cudnn": 2.0, "flex": 2.5, "flashrung:portable": 1.6}))
    timer = timing.ClockTimer(now=lambda: Clock.t)
    protocol = timing.BenchProtocol(warmup_calls=2, warmup_ms=4, rounds=4, block_ms=8, block_reps_min=2, block_reps_max=10)
    return runner.time_row(ROW, ["cudnn", "flash", "flex", "flashrung:portable"], inputs=None, protocol=protocol,
                           timer=timer, causal_convention=numerators.FA_HALF)


def test_time_row_measures_every_impl_and_pairs_ours_with_the_best_peer(row_result):
    r = row_result
    assert r["results"]["flash"] == {"status": "unsupported", "reason": "flash declines head dim 128 (synthetic)"}
    assert r["best_peer"] == "cudnn"
    ours = r["results"]["flashrung:portable"]
    flops = ROW.flops(numerators.FA_HALF)[0]
    assert ours["ms"] == pytest.approx(1.6) and ours["tflops"] == pytest.approx(flops / 1.6e-3 / 1e12)
    # three implementations time in a balanced design, 6 rounds (the protocol asks at least 4)
    assert ours["reps_per_block"] == 5 and ours["rounds"] == 6 and ours["distribution"]["n"] == 6 * 5
    # the raw calls behind the summary, block by block, and the order each round ran in (a slow
    # block can be traced to what ran before it)
    assert [len(b) for b in ours["blocks_ms"]] == [5] * 6
    assert all(t == pytest.approx(1.6) for b in ours["blocks_ms"] for t in b)
    assert r["round_orders"] == [list(o) for o in timing.balanced_orders(["cudnn", "flex", "flashrung:portable"])]
    cmp = r["comparisons"]["flashrung:portable"]
    assert cmp["cudnn"]["margin"] == pytest.approx(2.0 / 1.6) and cmp["flex"]["margin"] == pytest.approx(2.5 / 1.6)
    assert r["flops_convention"] == "fa-half" and "dense/2" in r["flops_convention_label"]


def test_the_table_says_how_the_rounds_were_ordered(row_result):
    # a reader must see whether the ratios came from the balanced design or from the halves
    # schedule, under which a place in the list moved the target row by 5% (a stored run from
    # before the design has no order in its protocol: it ran the halves)
    doc = {**_doc([row_result]), "impls": ["cudnn", "flash", "flex", "flashrung:portable"]}
    doc["protocol"] = timing.BenchProtocol(rounds=4).to_json()
    assert "rounds: 6 a row in a carryover-balanced design" in report.results_table(doc)
    del doc["protocol"]["order"]
    assert "rounds: 6 a row, one listed order then reversed" in report.results_table(doc)


def test_a_row_says_when_its_calls_were_host_bound(monkeypatch):
    # the probe after the timing: when issuing a call takes the host as long as the call takes the
    # GPU (here the synthetic calls advance one clock that both read), the cell is marked and the
    # footnote says the rate is the entry point's
    monkeypatch.setattr(peers, "prepare", fake_prepare({"cudnn": 2.0, "flashrung:portable": 1.6}))
    timer = timing.ClockTimer(now=lambda: Clock.t)
    protocol = timing.BenchProtocol(warmup_calls=2, warmup_ms=4, rounds=2, block_ms=8, block_reps_min=2,
                                    block_reps_max=10)
    bound = runner.time_row(ROW, ["cudnn", "flashrung:portable"], None, protocol, timer, numerators.FA_HALF,
                            host_clock=lambda: Clock.t)
    ours = bound["results"]["flashrung:portable"]
    assert ours["host_bound"] and ours["host_path"]["host_ms"] == pytest.approx(ours["host_path"]["device_ms"])
    assert runner.HOST_PROBE_MIN_CALLS <= ours["host_path"]["calls"] <= timing.HOST_PATH_CALLS
    doc = {**_doc([bound]), "impls": ["cudnn", "flashrung:portable"]}
    text = report.results_table(doc)
    line = next(ln for ln in text.splitlines() if ln.startswith("B8 H16 S4096"))
    assert line.count("*") == 2
    assert "* host-bound" in text and "2 cells" in text and "rates the entry point, not the kernel" in text
    # a host that issues far faster than the GPU runs (the real clock against 1.6 ms calls): no mark
    free = runner.time_row(ROW, ["cudnn", "flashrung:portable"], None, protocol, timer, numerators.FA_HALF)
    assert not free["results"]["flashrung:portable"]["host_bound"]
    assert "host-bound" not in report.results_table({**_doc([free]), "impls": ["cudnn", "flashrung:portable"]})


def test_a_failed_host_probe_leaves_the_timing_and_says_why(monkeypatch):
    monkeypatch.setattr(peers, "prepare", fake_prepare({"cudnn": 2.0}))

    def broken(*args, **kwargs):
        raise RuntimeError("probe could not run")
    monkeypatch.setattr(timing, "host_path", broken)
    r = runner.time_row(ROW, ["cudnn"], None, timing.QUICK_BENCH, timing.ClockTimer(now=lambda: Clock.t),
                        numerators.FA_HALF)
    res = r["results"]["cudnn"]
    assert res["status"] == "ok" and res["ms"] == pytest.approx(2.0)
    assert res["host_path"] == {"error": "RuntimeError: probe could not run"} and res["host_bound"] is False


def _doc(rows, ceilings=True):
    return {"suite": "fa4-protocol", "impls": ["cudnn", "flash", "flex", "flashrung:portable"],
            "causal_convention": "fa-half", "rows": rows,
            "ceilings": {"gemm:bfloat16": {"value": 793.5}, "copy": {"value": 4246.3}} if ceilings else {},
            "correctness": [{"impl": "flashrung:portable", "passed": True, "text": "ratio 0.41",
                             "config": runner.gate_config(ROW)}]}


def test_table_shows_ratios_ceiling_and_reasons(row_result):
    r = row_result
    r["results"]["flashrung:portable"]["percent_of_gemm_ceiling"] = 100 * r["results"]["flashrung:portable"]["tflops"] / 793.5
    text = report.results_table(_doc([r]))
    assert "causal = dense/2 (FlashAttention convention)" in text
    assert "bfloat16 GEMM 793.5 TFLOP/s" in text and "copy 4246 GB/s" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("B8 H16 S4096"))
    assert "unsup" in line and "1.250 [1.250,1.250]" in line and "cudnn" in line
    assert "flash (unsupported, 1 row, e.g. B8 H16 S4096 d128 bf16 causal fwd): flash declines head dim 128" in text
    assert "PASS flashrung:portable" in text


def test_a_margin_whose_halves_disagree_is_marked_order_dependent(row_result):
    # the balanced rounds' halves (the peer's block first, ours first) on opposite sides of 1: the
    # row's verdict rests on the order, and the table says so beside the margin and in a footnote
    r = row_result
    text = report.results_table(_doc([r]))
    assert report.ORDER_MARK + " [" not in text and "order-dependent" not in text
    cmp = r["comparisons"]["flashrung:portable"]["cudnn"]
    cmp.update(margin=0.953, margin_ab=1.021, margin_ba=0.919, halves_agree=False)
    text = report.results_table(_doc([r]))
    line = next(ln for ln in text.splitlines() if ln.startswith("B8 H16 S4096"))
    assert "0.953~ [" in line
    assert ("~ order-dependent" in text and "flashrung:portable at B8 H16 S4096 d128 bf16 causal fwd: 1.021 with "
            "cudnn first, 0.919 with flashrung:portable first" in text)
    # halves on one side of 1 are not marked, however far apart
    cmp.update(margin=1.10, margin_ab=1.15, margin_ba=1.02, halves_agree=True)
    assert "order-dependent" not in report.results_table(_doc([r]))


def test_json_round_trip_and_plot(row_result, tmp_path):
    pytest.importorskip("matplotlib")
    from flashrung.bench import plot
    rows = []
    for s in (1024, 2048, 4096):
        for mode in ("fwd", "bwd"):
            rows.append({**row_result, "seqlen_q": s, "seqlen_k": s, "mode": mode, "label": f"S{s} {mode}"})
    path = report.write_json(_doc(rows), tmp_path / "out" / "bench.json")
    doc = json.loads(path.read_text())
    png = plot.plot(doc, tmp_path / "bench.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_plan_table_lists_every_row():
    plan = suites.plan_json(suites.seed_frozen(("fwd", "bwd")))
    text = report.plan_table(plan)
    assert len(text.splitlines()) == 2 + 4 and "68,719,476,736" in text


def test_kernel_source_hash_tracks_sources_only(tmp_path):
    (tmp_path / "portable").mkdir()
    (tmp_path / "portable" / "fwd.py").write_text("x = 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "junk.py").write_text("ignored")
    h1 = manifest.source_hash(tmp_path)
    (tmp_path / "__pycache__" / "junk.py").write_text("still ignored")
    assert manifest.source_hash(tmp_path) == h1 and h1["files"] == 1
    (tmp_path / "portable" / "fwd.py").write_text("x = 2\n")
    assert manifest.source_hash(tmp_path)["sha256"] != h1["sha256"]


def test_compiled_kernel_hashes_read_triton_caches(monkeypatch):
    from triton.runtime.jit import JITFunction

    def body(x):
        pass
    kernel = JITFunction(body)      # not triton.jit: under TRITON_INTERPRET that returns an interpreter wrapper
    compiled = types.SimpleNamespace(name="kernel", hash="abc123", asm={"cubin": b"\x7fELF fake"})
    kernel.device_caches = {0: ({"key": compiled}, {}, None, None, None)}
    module = types.ModuleType("flashrung.kernels.fake_for_test")
    module.kernel = kernel
    # a launcher holding the function (as hopper.fwd's _DIRECT does) sorts before it: the row still
    # names the kernel's function, once
    module._LAUNCHER = types.SimpleNamespace(fn=kernel)
    monkeypatch.setitem(sys.modules, "flashrung.kernels.fake_for_test", module)
    found = [k for k in manifest.compiled_kernel_hashes() if k["module"] == "flashrung.kernels.fake_for_test"]
    assert len(found) == 1 and found[0]["triton_hash"] == "abc123" and len(found[0]["cubin_sha256"]) == 64
    assert found[0]["function"] == "body"


def test_identity_names_version_and_git_state():
    ident = manifest.identity()
    assert ident["package"] == "flashrung" and ident["version"]
    assert "commit" in ident["git"] and ident["kernel_source"]["sha256"]


def test_calibration_store_and_lookup(tmp_path):
    path = tmp_path / "cal.json"
    margins = [1.0001, 0.9998, 1.0004, 0.99941, 1.0, 1.0002, 0.9999, 1.0003, 0.9997, 1.00059]
    entry = calibration.entry_from_margins(margins, impl="flashrung", row=ROW.plan(), protocol={}, runs=[])
    calibration.store("NVIDIA H200", entry, path)
    calibration.store("NVIDIA H100", {**entry, "t_noise": 0.5}, path)
    got = calibration.lookup("NVIDIA H200", path)
    assert got["t_noise"] == pytest.approx(0.00059) and got["positive"] == 5 and got["negative"] == 4
    assert calibration.lookup("NVIDIA A100", path) is None
    with pytest.raises(ValueError, match="at least 10"):
        calibration.entry_from_margins(margins[:9], impl="x", row={}, protocol={}, runs=[])


def test_worker_spec_round_trips():
    from flashrung.bench import worker
    spec = worker.Spec("cudnn", "flashrung:portable", ROW, timing.PairedProtocol(alternations=40), gate=True, seed=3)
    assert worker.Spec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_gate_config_is_reduced_but_keeps_the_problem_family():
    big = suites.Row(batch=1, seqlen_q=32768, seqlen_k=32768, heads_q=32, heads_kv=8, headdim=64, dtype="float16",
                     causal=True, mode="bwd")
    c = runner.gate_config(big)
    assert (c["batch"], c["seqlen_q"], c["seqlen_k"]) == (1, 1024, 1024)
    assert (c["heads_q"], c["heads_kv"], c["head_dim"], c["dtype"], c["causal"]) == (32, 8, 64, "float16", True)
    assert "head_dim_v" not in c
    # v's own head dim is part of the problem the gate must check, never dropped to the head dim
    mla = dataclasses.replace(big, headdim=192, headdim_v=128)
    assert (runner.gate_config(mla)["head_dim"], runner.gate_config(mla)["head_dim_v"]) == (192, 128)


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_run_gate_drives_the_real_gate_through_the_public_api(mode, device):
    # small enough for the interpreter on CPU; fp16 because bf16 dots are wrong there
    row = suites.Row(batch=1, seqlen_q=48, seqlen_k=80, heads_q=4, heads_kv=2, headdim=32, dtype="float16",
                     causal=True, mode=mode)
    g = runner.run_gate("flashrung:portable", row, seed=1, device=device)
    assert g["passed"], g["text"]
    assert g["mode"] == mode and g["ratio"] < 1 and "portable" in g["text"]
    # a kernel name dispatch does not know is reported as a gate that could not run, never a pass
    bad = runner.run_gate("flashrung:nonexistent", row, seed=1, device=device)
    assert not bad["passed"] and "could not run" in bad["text"]


def test_the_gate_checks_the_build_a_row_times_not_the_reduced_problems(monkeypatch):
    # the gate runs at a reduced size, where dispatch would pick the reduced problem's own schedule
    # (d128 non-causal S16k's split tail and K/V pairs are not S1024's); pinned to every field of
    # the row's configuration, the reduced problem builds exactly the row's, and a variant's
    # override is applied at the row's size (where it builds)
    from flashrung import _device, dispatch

    monkeypatch.setenv("FLASHRUNG_CAPABILITY", "9.0")          # an H200 without the interpreter
    monkeypatch.setattr(_device, "interpreter_enabled", lambda: False)
    rows = [suites.Row(batch=2, seqlen_q=16384, seqlen_k=16384, heads_q=16, heads_kv=16, headdim=128,
                       dtype="bfloat16", causal=False, mode="fwd"),
            suites.Row(batch=2, seqlen_q=8192, seqlen_k=8192, heads_q=16, heads_kv=16, headdim=64, dtype="bfloat16",
                       causal=True, mode="fwd", window=(1024, 0)),
            suites.Row(batch=11, seqlen_q=8192, seqlen_k=8192, heads_q=16, heads_kv=16, headdim=128,
                       dtype="bfloat16", causal=True, mode="fwd", packed=(8192, 4096, 4096) + (1024,) * 8)]
    for row in rows:
        for impl in ("flashrung", "flashrung:hopper.fwd@block_m=192" if row.window else "flashrung:hopper"):
            build = runner.timed_build(impl, row)
            assert build.startswith("flashrung:hopper.fwd@block_m="), build
            _, timed = dispatch.select(runner._row_problem(row, "cuda"), "fwd", peers.kernel_name(impl))
            g = runner.gate_config(row)
            reduced = dataclasses.replace(row, batch=g["batch"], seqlen_q=g["seqlen_q"], seqlen_k=g["seqlen_k"],
                                          packed=g["varlen"][0] if "varlen" in g else None)
            _, pinned = dispatch.select(runner._row_problem(reduced, "cuda"), "fwd", peers.kernel_name(build))
            assert pinned.config() == timed.config(), (row.label(), impl)
            if "@" in impl:     # the override on the reduced problem's short tile does not build
                with pytest.raises(ValueError, match="registers per SM"):
                    dispatch.select(runner._row_problem(reduced, "cuda"), "fwd", peers.kernel_name(impl))
            else:
                _, own = dispatch.select(runner._row_problem(reduced, "cuda"), "fwd", peers.kernel_name(impl))
                assert own.config() != timed.config(), (row.label(), impl)
    # the portable kernels have no configuration: the kernel dispatch picks is pinned; a peer, a
    # backward row and a kernel dispatch does not know stay as given (the gate says why)
    assert runner.timed_build("flashrung:portable", rows[0]) == "flashrung:portable.fwd"
    assert runner.timed_build("flashrung", dataclasses.replace(rows[0], mode="bwd")) == "flashrung"
    assert runner.timed_build("fa4", rows[0]) == "fa4"
    assert runner.timed_build("flashrung:nonexistent", rows[0]) == "flashrung:nonexistent"
    # a kernel whose configuration takes few of its fields as overrides (the ladder's rungs, the
    # same configuration at every size): the kernel and the overrides it was given
    assert runner.timed_build("flashrung:ladder.v14@qk_ahead=false", rows[0]) == "flashrung:ladder.v14@qk_ahead=false"
    assert runner.timed_build("flashrung:ladder.v16", rows[0]) == "flashrung:ladder.v16"
    assert runner._gate_key("flashrung", rows[0]) != runner._gate_key(
        "flashrung", dataclasses.replace(rows[0], seqlen_q=2048, seqlen_k=2048))


def test_carried_changes_name_what_an_override_drops_beside_what_it_sets(monkeypatch):
    # an override the default cannot run with takes derived fields with it (config.
    # replace_following): two key boxes on d128 non-causal S16k leave its K/V pairs and what runs
    # with them, which compare then prints beside the arm; a plain override, the default itself and
    # a peer carry nothing
    from flashrung import _device

    monkeypatch.setenv("FLASHRUNG_CAPABILITY", "9.0")
    monkeypatch.setattr(_device, "interpreter_enabled", lambda: False)
    row = suites.Row(batch=2, seqlen_q=16384, seqlen_k=16384, heads_q=16, heads_kv=16, headdim=128,
                     dtype="bfloat16", causal=False, mode="fwd")
    carried = runner.carried_changes("flashrung:hopper.fwd@block_n=64,extra_keys=64,wait_pv_early=true", row)
    assert carried == {"kv_multicast": (True, False), "relay_release": (True, False),
                       "meet_before_pass": (True, False)}
    assert runner.carried_changes("flashrung:hopper.fwd@pack_p=false", row) == {}
    assert runner.carried_changes("flashrung:hopper.fwd", row) == {}
    assert runner.carried_changes("fa4", row) == {}


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_run_gate_checks_a_value_head_dim_of_its_own(mode, device):
    row = suites.Row(batch=1, seqlen_q=40, seqlen_k=56, heads_q=2, heads_kv=1, headdim=64, headdim_v=32,
                     dtype="float16", causal=True, mode=mode)
    g = runner.run_gate("flashrung:portable", row, seed=2, device=device)
    assert g["passed"] and "d64/32" in g["text"], g["text"]


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_run_gate_checks_a_softcap(mode, device):
    # a capped row's gate caps the references too: the kernel is judged on the row's problem
    row = suites.Row(batch=1, seqlen_q=40, seqlen_k=56, heads_q=2, heads_kv=1, headdim=32, dtype="float16",
                     causal=True, mode=mode, softcap=5.0)
    assert runner.gate_config(row)["softcap"] == 5.0
    g = runner.run_gate("flashrung:portable", row, seed=2, device=device)
    assert g["passed"] and "softcap5" in g["text"], g["text"]


def test_peers_without_a_softcap_are_unsupported_not_uncapped():
    row = suites.Row(batch=1, seqlen_q=64, seqlen_k=64, heads_q=2, heads_kv=2, headdim=64, dtype="bfloat16",
                     causal=False, mode="fwd", softcap=30.0)
    for impl in peers.SDPA_PEERS:
        with pytest.raises(peers.Unsupported, match="no softcap"):
            peers.prepare(impl, row, inputs=None)


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_run_gate_checks_a_window(mode, device):
    # a windowed row's gate windows the references too: the kernel is judged on the row's problem
    row = suites.Row(batch=1, seqlen_q=40, seqlen_k=56, heads_q=2, heads_kv=1, headdim=32, dtype="float16",
                     causal=True, mode=mode, window=(9, 0))
    assert runner.gate_config(row)["window_size"] == (9, 0)
    g = runner.run_gate("flashrung:portable", row, seed=2, device=device)
    assert g["passed"] and "window(9, 0)" in g["text"], g["text"]


def test_peers_without_a_window_are_unsupported_not_unwindowed():
    row = suites.Row(batch=1, seqlen_q=64, seqlen_k=64, heads_q=2, heads_kv=2, headdim=64, dtype="bfloat16",
                     causal=True, mode="fwd", window=(16, 0))
    for impl in peers.SDPA_PEERS:
        with pytest.raises(peers.Unsupported, match="no sliding window"):
            peers.prepare(impl, row, inputs=None)


@pytest.mark.parametrize("causal, window", [(True, None), (True, (5, 0)), (False, (5, 3)), (False, (-1, 2)),
                                            (False, (4, -1)), (True, (7, -1))])
@pytest.mark.parametrize("sq, sk", [(24, 24), (16, 40), (40, 16)])
def test_flex_mask_mod_is_the_gates_mask(causal, window, sq, sk):
    """Protects: FlexAttention is timed on the row's own mask — the causal diagonal and the window,
    bottom-right aligned as flash-attn's (the reference's mask, evaluated here on index grids)."""
    import torch

    from flashrung import reference

    row = suites.Row(batch=1, seqlen_q=sq, seqlen_k=sk, heads_q=1, heads_kv=1, headdim=32, dtype="bfloat16",
                     causal=causal, mode="fwd", window=window)
    q_idx, kv_idx = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    got = peers.flex_mask_mod(row)(0, 0, q_idx, kv_idx)
    want = reference.attention_mask(sq, sk, causal, window or (-1, -1), device="cpu")
    assert torch.equal(got.expand(sq, sk), want)
    assert peers.flex_mask_mod(dataclasses.replace(row, causal=False, window=None)) is None


def _packed_row(mode="fwd", causal=True, window=None, lengths=(40, 1, 0, 25, 64)):
    return suites.packed_rows(lengths=lengths, heads=2, kv_heads=1, headdim=32, dtype="float16", causal=causal,
                              mode=mode, window=window)[0]


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_run_gate_checks_packed_sequences(mode, device):
    # a packed row's gate is the packed gate (each sequence against the references run on it alone),
    # on the pack's first sequences, each at most GATE_MAX_SEQLEN
    row = _packed_row(mode, window=(9, 0))
    config = runner.gate_config(row)
    assert config["varlen"] == ((40, 1, 0, 25), (40, 1, 0, 25)) and config["batch"] == 4
    g = runner.run_gate("flashrung:portable", row, seed=2, device=device)
    assert g["passed"] and "varlen q(40, 1, 0, 25)" in g["text"], g["text"]
    long = _packed_row(lengths=(5000, 3, 7, 9, 11))
    assert runner.gate_config(long)["varlen"][0] == (runner.GATE_MAX_SEQLEN, 3, 7, 9)


def test_packed_inputs_are_one_batch_entry_of_rows_and_sdpa_declines_them():
    import torch

    row = _packed_row()
    inputs = peers.make_inputs(row, device="cpu")
    assert inputs.q.shape == (1, 130, 2, 32) and inputs.k.shape == (1, 130, 1, 32)
    assert inputs.cu_seqlens.tolist() == [0, 40, 41, 41, 66, 130] and inputs.cu_seqlens.dtype == torch.int32
    for impl in peers.SDPA_PEERS:
        with pytest.raises(peers.Unsupported, match="no packed sequences"):
            peers.prepare(impl, row, inputs=None)


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, (5, 0)), (False, (4, 3))])
def test_flex_mask_mod_of_a_pack_is_each_sequences_mask(causal, window):
    """Protects: FlexAttention is timed on packed sequences as the kernels compute them — each query
    sees its own sequence's keys only, under that sequence's causal diagonal and window."""
    import torch

    from flashrung import reference

    row = _packed_row(causal=causal, window=window, lengths=(9, 0, 1, 13))
    total = sum(row.packed)
    q_idx, kv_idx = torch.arange(total)[:, None], torch.arange(total)[None, :]
    got = peers.flex_mask_mod(row, peers.sequence_index(row))(0, 0, q_idx, kv_idx).expand(total, total)
    want = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for n in row.packed:
        mask = reference.attention_mask(n, n, causal, window or (-1, -1), device="cpu")
        want[start:start + n, start:start + n] = True if mask is None else mask     # None: no mask
        start += n
    assert torch.equal(got, want)


def test_a_failure_after_the_first_call_is_an_error_row_not_a_crash(monkeypatch):
    def prepare(impl, row, inputs, options=None):
        calls = {"n": 0}

        def fn():
            calls["n"] += 1
            if impl == "flex" and calls["n"] > 1:
                raise RuntimeError("Trying to backward through the graph a second time")
            Clock.t += 1e-3
        return peers.Prepared(fn=fn)
    monkeypatch.setattr(peers, "prepare", prepare)
    r = runner.time_row(ROW, ["cudnn", "flex"], None, timing.QUICK_BENCH, timing.ClockTimer(now=lambda: Clock.t),
                        numerators.FA_HALF)
    assert r["results"]["cudnn"]["status"] == "ok"
    assert r["results"]["flex"]["status"] == "error" and "second time" in r["results"]["flex"]["reason"]


def test_given_commit_wins_over_a_stale_local_repository(monkeypatch):
    # a copied tree may carry an old .git: the commit named by FLASHRUNG_GIT_COMMIT is recorded,
    # the local repository's answer is kept beside it when the two differ
    monkeypatch.setenv("FLASHRUNG_GIT_COMMIT", "0123456789abcdef")
    state = manifest.git_state()
    assert state["commit"] == "0123456789abcdef" and state["source"] == "FLASHRUNG_GIT_COMMIT"
    local = manifest._git_of_tree()
    if local is not None:
        assert state["local_git"]["commit"] == local["commit"]
    monkeypatch.delenv("FLASHRUNG_GIT_COMMIT")
    assert manifest.git_state()["source"] != "FLASHRUNG_GIT_COMMIT"


def test_bench_gates_before_timing_and_times_no_kernel_that_failed(monkeypatch):
    # correct first: every flashrung kernel is gated once per problem family before any row is
    # timed; a row whose family's gate failed does not time that kernel and shows it as FAIL with
    # the check's text, in the same column order as the other rows; peers are timed as usual
    from flashrung.bench import ceilings
    events = []
    monkeypatch.setattr(ceilings, "measure_all", lambda dtypes, preheat_ms=0.0: {})
    monkeypatch.setattr(manifest, "start", lambda command=None: {})
    monkeypatch.setattr(manifest, "finish", lambda m: m)
    monkeypatch.setattr(peers, "make_inputs", lambda row, seed=0: None)

    def run_gate(impl, row, seed=0, device="cuda", build=None):
        events.append(("gate", impl, row.causal))
        ok = not row.causal          # this kernel is wrong under the causal mask only
        return {"impl": impl, "mode": row.mode, "config": runner.gate_config(row), "passed": ok,
                "text": ("PASS" if ok else "FAIL") + f" {impl} causal={row.causal}"}

    def time_row(row, impls, inputs, protocol, timer, convention, **kw):
        events.append(("time", tuple(impls), row.causal))
        return {"label": row.label(), "results": {i: {"status": "ok", "ms": 1.0, "tflops": 1.0} for i in impls}}
    monkeypatch.setattr(runner, "run_gate", run_gate)
    monkeypatch.setattr(runner, "time_row", time_row)
    rows = [dataclasses.replace(ROW, seqlen_q=s, seqlen_k=s, causal=c) for c in (False, True) for s in (1024, 2048)]
    doc = runner.run(rows, ["cudnn", "flashrung"], protocol=timing.QUICK_BENCH, progress=False)
    gates = [e for e in events if e[0] == "gate"]
    assert gates == [("gate", "flashrung", False), ("gate", "flashrung", True)]      # one per family
    assert events.index(gates[-1]) < min(i for i, e in enumerate(events) if e[0] == "time")
    timed = [e[1] for e in events if e[0] == "time"]
    assert timed == [("cudnn", "flashrung")] * 2 + [("cudnn",)] * 2
    causal = doc["rows"][-1]["results"]
    assert list(causal) == ["cudnn", "flashrung"] and causal["cudnn"]["status"] == "ok"
    assert causal["flashrung"] == {"status": peers.GATE_FAILED, "reason": "not timed: FAIL flashrung causal=True"}
    assert [g["passed"] for g in doc["correctness"]] == [True, False]
    # each gate names the rows it stands for: one gate line per family, both rows on it
    assert [g["rows"] for g in doc["correctness"]] == [[r.label() for r in rows[:2]], [r.label() for r in rows[2:]]]
    assert report._cell(causal["flashrung"]) == "FAIL"
    table = report.results_table(doc)
    assert "FAIL" in table and "flashrung (gate failed, 2 rows" in table
    gate_lines = [ln for ln in table.splitlines() if ln.startswith(("  PASS", "  FAIL"))]
    assert len(gate_lines) == 2
    assert all(" for B8 H16 S1024, B8 H16 S2048: " in ln for ln in gate_lines), gate_lines
