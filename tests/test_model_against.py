"""Measured time / modeled lower bound for bench result rows."""
import json

import pytest

from flashrung.model import against as A
from flashrung.model import ledger as L
from flashrung.model import rates as R

H200 = R.TABLES["h200"]


def test_problem_bound_non_causal_is_tile_sum_over_sms():
    p = A.Problem(batch=2, seqlen_q=1024, seqlen_k=1024, heads=16, headdim=128, headdim_v=128, causal=False)
    pb = A.problem_bound(H200, p)
    tiles = 2 * 16 * 8 * 8
    led = L.forward(H200, L.Tile(128, 128, 128))
    assert pb.resource_cycles["mma"] == tiles * led.mma_cycles
    assert pb.machine_cycles == tiles * led.mma_cycles / 132
    assert pb.bound_resources == ("mma",)
    assert pb.seconds == pytest.approx(pb.cycles / (H200.clock_ghz.value * 1e9))


def test_causal_counts_live_tiles_only():
    kw = dict(batch=1, seqlen_q=2048, seqlen_k=2048, heads=64, headdim=128, headdim_v=128)
    dense = A.problem_bound(H200, A.Problem(causal=False, **kw))
    causal = A.problem_bound(H200, A.Problem(causal=True, **kw))
    assert causal.resource_cycles["mma"] / dense.resource_cycles["mma"] == (16 * 17 / 2) / 256


def test_chain_bound_when_few_ctas():
    # One head, one query tile, a long K/V: a single CTA's chain bounds, not the SM count.
    p = A.Problem(1, 128, 65536, 1, 128, 128, False)
    pb = A.problem_bound(H200, p)
    assert pb.chain_cycles == 512 * L.forward(H200, L.Tile(128, 128, 128)).bound
    assert pb.cycles == pb.chain_cycles > pb.machine_cycles


def test_fwd_plus_bwd_adds_the_directions():
    kw = dict(batch=4, seqlen_q=1024, seqlen_k=1024, heads=16, headdim=128, headdim_v=128, causal=False)
    f = A.problem_bound(H200, A.Problem(mode="fwd", **kw))
    b = A.problem_bound(H200, A.Problem(mode="bwd", **kw))
    fb = A.problem_bound(H200, A.Problem(mode="fwd+bwd", **kw))
    assert fb.cycles == pytest.approx(f.cycles + b.cycles)


def test_against_reads_bench_and_baseline_shapes():
    doc = {"rows": [
        # flashrung bench style: plan keys plus a median per implementation.
        {"batch": 2, "seqlen_q": 4096, "seqlen_k": 4096, "heads_q": 16, "heads_kv": 16, "headdim": 128,
         "dtype": "bf16", "causal": False, "mode": "fwd",
         "results": {"flashrung:hopper": {"median_ms": 1.0}, "sdpa:cudnn": {"median_ms": 1.2}}},
        # baseline style: B/H/S/D with fwd_ms and bwd_ms.
        {"kind": "sdpa", "backend": "cudnn", "B": 2, "H": 16, "S": 4096, "D": 128, "causal": True,
         "fwd_ms": 0.9, "bwd_ms": 2.5},
        {"kind": "gemm", "ms": 1.4},
        {"batch": 1, "seqlen": 1024, "heads": 8, "headdim": 64, "causal": False},
    ]}
    rows = A.against(H200, doc)
    measured = [r for r in rows if not r.skipped]
    assert [r.measured_ms for r in measured] == [1.0, 1.2, 0.9, 2.5]
    assert [r.problem.mode for r in measured] == ["fwd", "fwd", "fwd", "bwd"]
    assert measured[2].problem.causal and measured[2].problem.seqlen_k == 4096
    assert "flashrung:hopper" in measured[0].label
    for r in measured:
        assert r.ratio == pytest.approx(r.measured_ms / r.bound_ms)
    skipped = [r.skipped for r in rows if r.skipped]
    assert skipped == ["no attention shape", "no measured time"]
    # Same problem, same bound.
    assert measured[0].bound_ms == measured[1].bound_ms
    text = A.format_table(rows, H200)
    assert "ratio" in text and "skipped: no attention shape" in text


def test_against_rejects_unknown_documents():
    with pytest.raises(ValueError, match="rows"):
        A.rows_of({"data": []})
    with pytest.raises(ValueError, match="mode"):
        A.Problem(1, 1, 1, 1, 1, 1, False, mode="both")


def test_against_round_trips_json(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps([{"B": 1, "H": 1, "S": 128, "D": 64, "causal": False, "ms": 0.01}]))
    (row,) = A.against(H200, A.load(str(path)))
    assert row.problem.headdim == 64 and row.measured_ms == 0.01 and row.bound_ms > 0
