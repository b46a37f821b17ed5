"""Rate tables: every figure labelled, JSON round trip, measured figures overlaid on quoted ones."""
import json
import os

import pytest

from flashrung import jsonfile
from flashrung.model import rates as R


@pytest.mark.parametrize("name", sorted(R.TABLES))
def test_every_figure_has_provenance_and_source(name):
    table = R.TABLES[name]
    for key, fig in table.figures().items():
        assert fig.provenance in R.PROVENANCES, key
        assert fig.source.strip(), key
        assert fig.unit == R.RATE_FIELDS[key]
    assert table.operand_tile.source.strip()


def test_no_stored_table_claims_a_measurement_it_did_not_make():
    # rates are measured by `flashrung model --measure` into measured/; the one measured figure a
    # stored table carries is the H200's exponential-tensor coupling, refitted below from its run
    for table in R.TABLES.values():
        assert all(f.provenance != R.MEASURED for f in table.figures().values())
    assert [n for n, t in R.TABLES.items() if t.exp_mma_coupling is not None] == ["h200"]


def _probe_rows(commit):
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "results", f"h200-wgmma-neighbor-{commit}.json.gz")
    return jsonfile.read(path)["rows"]


def test_the_h200_coupling_refits_from_its_stored_probe_run():
    # k of R_exp·(1 − k·busy share), the least-squares slope of the probe's five ex2-beside-wgmma
    # rows; the two earlier runs of the same probe give the same k within 0.001
    k, n = R.fit_exp_mma_coupling(_probe_rows("f8c8015"))
    fig = R.TABLES["h200"].exp_mma_coupling
    assert n == 5 and k == pytest.approx(fig.value, abs=5e-5)
    assert fig.provenance == R.MEASURED and "h200-wgmma-neighbor-f8c8015.json.gz" in fig.source
    for commit in ("216ee7f", "beeb232"):
        assert R.fit_exp_mma_coupling(_probe_rows(commit))[0] == pytest.approx(k, abs=1e-3)
    with pytest.raises(ValueError, match="idle"):
        R.fit_exp_mma_coupling([r for r in _probe_rows("f8c8015") if r["mode"] != "idle"])


def test_derived_clocks_reproduce_their_quoted_peaks():
    h100 = R.TABLES["h100"]
    peak = h100.sm_count.value * h100.mma_flops.value * h100.clock_ghz.value * 1e9
    assert peak == pytest.approx(989e12)
    # The same clock gives the 3.9 TFLOP/s exponential figure seed 000 quotes for H100.
    assert h100.sm_count.value * h100.exp.value * h100.clock_ghz.value * 1e9 == pytest.approx(3.9e12, rel=0.01)
    rtx = R.TABLES["rtx5090"]
    assert 2 * rtx.fma.value * rtx.sm_count.value * rtx.clock_ghz.value * 1e9 == pytest.approx(104.8e12)
    assert rtx.mma_flops.value * rtx.sm_count.value * rtx.clock_ghz.value * 1e9 == pytest.approx(209.5e12, rel=0.001)


def test_json_round_trip():
    for table in R.TABLES.values():
        assert R.RateTable.from_json(json.loads(json.dumps(table.to_json()))) == table
    with pytest.raises(ValueError, match="lacks"):
        R.RateTable.from_json({"name": "x"})


def test_bad_figures_are_refused():
    with pytest.raises(ValueError, match="provenance"):
        R.Figure(1.0, "x", "guessed", "nowhere")
    with pytest.raises(ValueError, match="positive"):
        R.Figure(0.0, "x", R.QUOTED, "nowhere")


def test_measured_overlay(tmp_path):
    base = R.TABLES["h200"]
    measured = base.with_figures(
        exp=R.Figure(15.9, base.exp.unit, R.MEASURED, "test"),
        mma_flops=R.Figure(3900.0, base.mma_flops.unit, R.MEASURED, "test"))
    path = tmp_path / "h200.json"
    path.write_text(json.dumps({"table": measured.to_json(), "manifest": {"gpu": "NVIDIA H200"}}))
    t = R.get_table("h200", str(path))
    assert t.exp.value == 15.9 and t.exp.provenance == R.MEASURED
    assert t.mma_flops.value == 3900.0
    assert t.smem_bytes == base.smem_bytes          # not measured: stays quoted
    assert t.exp_mma_coupling == base.exp_mma_coupling   # --measure does not measure it: kept
    with pytest.raises(ValueError, match="does not exist"):
        R.get_table("h200", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="gpu must be one of"):
        R.get_table("a100")
