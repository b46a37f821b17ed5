"""The instrument on a GPU: one tiny row through every peer, one fresh-process paired run."""
import json
import subprocess
import sys

import pytest
import torch

from flashrung.bench import peers, runner, stats, suites, timing, worker

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY = dict(batch=2, seqlen_q=256, seqlen_k=256, heads_q=4, heads_kv=4, headdim=64, dtype="bfloat16", causal=True)


def test_tiny_rows_end_to_end():
    rows = [suites.Row(**TINY, mode="fwd"), suites.Row(**TINY, mode="bwd")]
    doc = runner.run(rows, list(peers.DEFAULT_IMPLS), protocol=timing.QUICK_BENCH, progress=False)
    json.dumps(doc, default=str)                     # the document is writable as is
    assert doc["ceilings"]["gemm:bfloat16"]["value"] > 10 and doc["ceilings"]["copy"]["value"] > 100
    for row in doc["rows"]:
        assert set(row["results"]) == set(peers.DEFAULT_IMPLS)       # nobody silently skipped
        for impl, r in row["results"].items():
            # no peer here computes another function (a WRONG cell would hide a convention bug)
            assert r["status"] in ("ok", "unsupported", "error"), (impl, r)
            if r["status"] == "ok":
                assert r["tflops"] > 0 and r["distribution"]["n"] >= 2
                # the host-path probe ran and its verdict follows from its two numbers
                h = r["host_path"]
                assert h["host_ms"] > 0 and h["device_ms"] > 0 and h["calls"] >= runner.HOST_PROBE_MIN_CALLS
                assert r["host_bound"] == (h["host_ms"] >= timing.HOST_BOUND_SHARE * h["device_ms"])
            else:
                assert r["reason"]
        assert row["results"]["flashrung"]["status"] == "ok", row["results"]["flashrung"]
        assert row["results"]["cudnn"]["status"] == "ok" or row["results"]["flash"]["status"] == "ok"
        if row["mode"] == "fwd":
            # every forward output was read against the oracle; flashrung's within the gate's bound
            for impl, r in row["results"].items():
                if r["status"] == "ok":
                    assert r["agreement"]["ratio"] <= runner.WRONG_OUTPUT_RATIO, (impl, r["agreement"])
                    assert r["agreement"]["ratio"] <= 1 or not peers.is_ours(impl), (impl, r["agreement"])
    assert doc["correctness"] and all(g["passed"] for g in doc["correctness"]), doc["correctness"]
    env = doc["manifest"]["environment"]
    assert env["gpu"] and env["sm_count"] > 0 and doc["manifest"]["clocks_end"]["source"]
    # the clock beside each block (block_clocks): every timed block placed in order on the wall
    # clock, inside the run, and most meeting a sample (a sampler that could not start says why)
    clocks = doc["clocks"]
    if "error" not in clocks:
        placed = [(span, c) for row in doc["rows"] for r in row["results"].values() if r["status"] == "ok"
                  for span, c in zip(r["blocks_span_s"], r["blocks_clock"])]
        assert placed and all(a <= b <= c for (a, b, c), _ in placed)
        first = min(span[0] for span, _ in placed)
        assert clocks["series"][0][0] <= first and max(span[2] for span, _ in placed) <= clocks["series"][-1][0] + 1
        assert clocks["blocks_without_sample"] <= len(placed) // 2, clocks["blocks_without_sample"]
        assert all(c["mhz"] is None or 100 < c["mhz"] < 3000 for _, c in placed)


def test_a_packed_row_end_to_end():
    # packed sequences through every implementation: SDPA's backends decline, flex (its document
    # mask) and the flashrung kernels run and agree, each flashrung kernel's packed gate passes
    hopper = ["flashrung:hopper.fwd"] if torch.cuda.get_device_capability() == (9, 0) else []
    impls = list(peers.DEFAULT_IMPLS) + hopper
    rows = suites.packed_rows(lengths=(300, 1, 0, 700, 129), heads=4, kv_heads=2, headdim=64, causal=True,
                              mode="fwd")
    doc = runner.run(rows, impls, protocol=timing.QUICK_BENCH, progress=False)
    (row,) = doc["rows"]
    for impl in peers.SDPA_PEERS:
        assert row["results"][impl]["status"] == "unsupported" and "packed" in row["results"][impl]["reason"]
    assert row["results"]["flashrung"]["status"] == "ok", row["results"]["flashrung"]
    for impl, r in row["results"].items():
        if r["status"] == "ok":
            assert r["agreement"]["ratio"] <= 1 or not peers.is_ours(impl), (impl, r["agreement"])
    assert doc["correctness"] and all(g["passed"] for g in doc["correctness"]), doc["correctness"]


def test_fresh_process_a_a_pair_is_near_one():
    spec = worker.Spec("cudnn", "cudnn", suites.Row(**{**TINY, "batch": 8, "seqlen_q": 1024, "seqlen_k": 1024},
                                                   mode="fwd"),
                       timing.PairedProtocol(alternations=20, reps=3, block_warmup=1, warmup_calls=5))
    out = worker.run_fresh(spec, timeout_s=600)
    s = stats.PairedSummary.from_json(out["summary"])
    assert s.n == 20 and abs(s.margin - 1) < 0.05


def test_cli_bench_writes_json_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "flashrung.bench", "bench", "--seqlen", "512", "1024", "--batch", "2",
                           "--heads", "4", "--headdim", "64", "--impl", "cudnn", "--impl", "flashrung", "--quick",
                           "--no-progress", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 2 and out.with_suffix(".png").exists()
    assert "flashrung/best" in proc.stdout
