"""``flashrung model`` through its ``register(subparsers)`` entry point."""
import argparse
import json

import pytest

from flashrung.model import cli


def _run(capsys, *argv):
    parser = argparse.ArgumentParser(prog="flashrung")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["model", *argv])
    rc = args.func(args)
    out, err = capsys.readouterr()
    return rc, out, err


def test_b200_json_reproduces_the_paper_row(capsys):
    rc, out, _ = _run(capsys, "--gpu", "b200", "--tile", "128x128", "--headdim", "128", "--json")
    assert rc == 0
    d = json.loads(out)
    assert (d["mma_cycles"], d["smem_cycles"], d["exp_cycles"], d["bound"]) == (1024, 768, 1024, 1024)
    assert d["bound_resources"] == ["mma", "exp"]
    assert d["serial"] == 2816 and d["d_star"] == 128
    assert len(d["sensitivity"]) == 4
    assert d["rates_table"]["figures"]["exp"]["provenance"] == "quoted"


def test_ragged_tile_text(capsys):
    rc, out, _ = _run(capsys, "--gpu", "b200", "--tile", "192x96", "--headdim", "160")
    assert rc == 0
    assert "bound by SMEM" in out and "2,048" in out and "1,440" in out and "1,152" in out


def test_h200_text_and_backward(capsys):
    rc, out, _ = _run(capsys, "--gpu", "h200")
    assert rc == 0 and "crossover d* = R_MMA / (4·R_exp) = 64" in out and "bound by MMA" in out
    rc, out, _ = _run(capsys, "--gpu", "b200", "--direction", "bwd", "--json")
    d = json.loads(out)
    assert d["smem_cycles"] == 3328 and d["bound_resources"] == ["smem"]


def test_against_from_the_cli(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"rows": [
        {"batch": 2, "seqlen_q": 2048, "seqlen_k": 2048, "heads_q": 16, "headdim": 128, "causal": False,
         "mode": "fwd", "median_ms": 0.5}]}))
    rc, out, _ = _run(capsys, "--gpu", "h200", "--against", str(path), "--json")
    assert rc == 0
    (row,) = json.loads(out)["rows"]
    assert row["ratio"] == pytest.approx(0.5 / row["bound_ms"])


def test_bad_input_is_a_clear_error(capsys):
    rc, _, err = _run(capsys, "--tile", "128")
    assert rc == 2 and "128x128" in err
    rc, _, err = _run(capsys, "--headdim", "0")
    assert rc == 2 and "positive integer" in err
    rc, _, err = _run(capsys, "--rates", "/nonexistent.json")
    assert rc == 2 and "does not exist" in err


def test_measure_writes_the_table_and_compares(tmp_path, capsys, monkeypatch):
    from flashrung.model import measure
    from flashrung.model import rates as R

    base = R.TABLES["h200"]
    fake = base.with_figures(exp=R.Figure(15.5, base.exp.unit, R.MEASURED, "test"))
    monkeypatch.setattr(measure, "measure", lambda **kw: {
        "table": fake.to_json(), "manifest": {"gpu": "NVIDIA H200", "sm_count": 132}, "benchmarks": {}})
    out = tmp_path / "h200.json"
    rc, text, _ = _run(capsys, "--measure", "--out", str(out))
    assert rc == 0 and out.exists()
    assert "crossover d* = 66.06 (quoted 64)" in text
    # The stored file is what --rates reads back.
    rc, text, _ = _run(capsys, "--gpu", "h200", "--rates", str(out), "--json")
    d = json.loads(text)
    assert d["exp_cycles"] == 128 * 128 / 15.5
    assert d["rates_table"]["figures"]["exp"]["provenance"] == "measured"


def test_measure_without_gpu_exits_2(capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, _, err = _run(capsys, "--measure")
    assert rc == 2 and "needs a CUDA GPU" in err
