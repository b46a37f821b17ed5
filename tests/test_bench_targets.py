"""The speed targets read off a bench document (no GPU): which rows carry one, how a row's paired
reading and rate turn into what it still needs, and the count below the table."""
import json
import pathlib

import pytest

from flashrung import jsonfile
from flashrung.bench import report, suites, targets

RESULTS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "results"


def _plan(**kw):
    base = dict(batch=8, seqlen_q=4096, seqlen_k=4096, heads_q=16, heads_kv=16, headdim=128, dtype="bfloat16",
                causal=False, mode="fwd", suite="fa4-protocol")
    return suites.Row(**{**base, **kw}).plan()


def _row(margin=None, tflops=500.0, best="fa4", impl="flashrung", **kw):
    """A bench row as the runner writes it: ``impl``'s paired margin over ``best`` and its rate."""
    row = {**_plan(**kw), "best_peer": best, "results": {impl: {"status": "ok", "tflops": tflops}}}
    row["label"] = suites.Row.from_plan(row).label()
    row["comparisons"] = {impl: {best: {"margin": margin, "lo": margin, "hi": margin}}} if margin else {}
    return row


def test_the_suite_rows_carry_the_specification_targets():
    # S1k at 1.00x the best peer, S >= 2k at 1.05x, the d128 S16k non-causal row 700 TFLOP/s besides
    rows = suites.fa4_protocol(("fwd",))
    got = {(r.headdim, r.seqlen_q, r.causal): targets.target_for(r.plan()) for r in rows}
    assert len(got) == 24 and all(t is not None for t in got.values())
    assert {t.min_ratio for (d, s, c), t in got.items() if s == 1024} == {1.00}
    assert {t.min_ratio for (d, s, c), t in got.items() if s >= 2048} == {1.05}
    assert [k for k, t in got.items() if t.min_tflops is not None] == [(128, 16384, False)]
    assert got[(128, 16384, False)].min_tflops == 700.0 and all(t.peer is None for t in got.values())


@pytest.mark.parametrize("kw", [dict(mode="bwd"), dict(dtype="float16"), dict(suite="free"),
                                dict(seqlen_k=2048), dict(headdim=256, seqlen_q=4096, seqlen_k=4096)],
                         ids=["backward", "fp16", "free-shape", "sq-ne-sk", "d256-4k"])
def test_rows_the_specification_names_nothing_for_carry_no_target(kw):
    assert targets.target_for(_plan(**kw)) is None
    assert targets.reading(_row(1.2, **kw), "flashrung") is None


def test_d256_s8k_is_held_to_fa4_in_any_bench():
    t = targets.target_for(_plan(headdim=256, seqlen_q=8192, seqlen_k=8192, heads_q=16, heads_kv=16, suite="free"))
    assert t == targets.Target(1.05, peer="fa4")
    # against FA4 even where another peer is the run's best
    row = _row(1.10, best="cudnn", headdim=256, seqlen_q=8192, seqlen_k=8192, suite="free")
    row["comparisons"]["flashrung"]["fa4"] = {"margin": 1.02, "lo": 1.0, "hi": 1.04}
    assert targets.reading(row, "flashrung").needs == pytest.approx(1.05 / 1.02)


def test_needs_is_the_target_over_the_paired_reading():
    short = targets.reading(_row(1.02, seqlen_q=2048, seqlen_k=2048), "flashrung")
    assert short.needs == pytest.approx(1.05 / 1.02) and not short.met and short.cell() == "+2.9%"
    level = targets.reading(_row(1.05, seqlen_q=2048, seqlen_k=2048), "flashrung")
    assert level.met and level.cell() == "met"
    one_k = targets.reading(_row(0.999, seqlen_q=1024, seqlen_k=1024), "flashrung")
    assert one_k.needs == pytest.approx(1 / 0.999) and not one_k.met


def test_the_target_row_needs_both_its_ratio_and_its_rate():
    kw = dict(batch=2, seqlen_q=16384, seqlen_k=16384)
    rate_binds = targets.reading(_row(1.10, tflops=650.0, **kw), "flashrung")
    assert rate_binds.needs == pytest.approx(700 / 650) and not rate_binds.met
    ratio_binds = targets.reading(_row(1.00, tflops=720.0, **kw), "flashrung")
    assert ratio_binds.needs == pytest.approx(1.05) and not ratio_binds.met
    assert targets.reading(_row(1.06, tflops=701.0, **kw), "flashrung").met


def test_a_row_without_a_paired_reading_is_not_read_as_met_or_missed():
    r = targets.reading(_row(None), "flashrung")
    assert r.needs is None and not r.met and r.cell() == "n/a"
    doc = {"rows": [_row(None), _row(1.06)], "impls": ["fa4", "flashrung"]}
    text = targets.summary(doc, "flashrung")
    assert text.startswith("targets (flashrung): 1 of 2 rows met") and "no paired reading" in text


def test_the_table_counts_the_stored_run_at_change_50():
    # the fa4-protocol forward at e9a4991, read by hand in docs/hopper.md: four rows at target,
    # d128 causal S8k the nearest below (1.048, needs 0.2%), the target row 641.3 TFLOP/s (needs 9.2%)
    doc = jsonfile.read(RESULTS / "fa4-fwd-e9a4991.json.gz")
    text = report.results_table(doc)
    assert "targets (flashrung): 4 of 24 rows met" in text and "flashrung needs" in text
    assert "nearest below: B4 H16 S8192 d128 bf16 causal fwd +0.2%" in text
    rows = {r["row"]: r for r in report.with_targets(doc)["targets"]}
    assert len(rows) == 24 and sum(r["met"] for r in rows.values()) == 4
    target_row = rows["B2 H16 S16384 d128 bf16 full fwd"]
    assert target_row["min_tflops"] == 700.0 and target_row["needs"] == pytest.approx(700 / target_row["tflops"])
    json.dumps(report.with_targets(doc))


def test_a_run_without_targets_shows_no_target_columns():
    doc = {"suite": "seed-frozen", "impls": ["cudnn", "flashrung"], "rows": [
        {**_row(1.1, dtype="float16", seqlen_q=2048, seqlen_k=2048, batch=2, suite="seed-frozen"), "best_peer": "fa4"}]}
    doc["rows"][0]["results"]["cudnn"] = {"status": "ok", "tflops": 400.0}
    text = report.results_table(doc)
    assert "target" not in text and report.with_targets(doc) is doc


def test_the_portable_kernels_are_not_held_to_the_targets():
    assert report.target_impls(["cudnn", "flashrung", "flashrung:portable", "flashrung:hopper.fwd@pack_p=true"]) == [
        "flashrung", "flashrung:hopper.fwd@pack_p=true"]


def test_the_plot_adds_a_row_of_target_panels_where_rows_carry_targets(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from flashrung.bench import plot
    shapes = []
    monkeypatch.setattr(plot, "save", lambda fig, path: shapes.append(fig.axes[0].get_gridspec().get_geometry()))
    doc = jsonfile.read(RESULTS / "fa4-fwd-e9a4991.json.gz")
    plot.plot(doc, tmp_path / "with.png")
    doc["impls"] = [i for i in doc["impls"] if i != "flashrung"]
    plot.plot(doc, tmp_path / "without.png")
    assert shapes == [(2, 4), (1, 4)]   # the forward's TFLOP/s panels, then the targets' below them


RUNS_95F4CD1 = [RESULTS / f"fa4-fwd-95f4cd1{tag}.json.gz" for tag in ("", "-run2", "-run3")]


def test_three_runs_read_together_give_the_counts_the_docs_quote():
    # docs/hopper.md, *Against the peers* (three runs in a row on one H200 at 95f4cd1): 4, 6 and 5
    # of 24 rows at target, three in every run; d128 causal S2k met in two runs (median 1.064); the
    # target row needs 5.3% by its median rate (664.7 TFLOP/s) where its median ratio needs 4.2%
    docs = [jsonfile.read(p) for p in RUNS_95F4CD1]
    rows = {r["row"]: r for r in targets.across_runs(docs, "flashrung")}
    assert len(rows) == 24 and [sum(r["met"][k] for r in rows.values()) for k in range(3)] == [4, 6, 5]
    assert sum(r["met_runs"] == 3 for r in rows.values()) == 3
    s2k = rows["B16 H16 S2048 d128 bf16 causal fwd"]
    assert s2k["met_runs"] == 2 and s2k["median_ratio"] == pytest.approx(1.064, abs=5e-4) and s2k["needs"] < 1.0
    target_row = rows["B2 H16 S16384 d128 bf16 full fwd"]
    assert target_row["needs"] == pytest.approx(700 / sorted(target_row["tflops"])[1])
    assert target_row["needs"] > 1.05 / target_row["median_ratio"]
    text = report.runs_table(docs, [p.name for p in RUNS_95F4CD1])
    assert "across 3 runs: 4 / 6 / 5 of 24 rows met; in every run 3" in text
    assert "at most 3.3% (B8 H16 S4096 d128 bf16 full fwd)" in text


def test_runs_of_other_rows_or_without_the_implementation_are_refused():
    docs = [jsonfile.read(p) for p in RUNS_95F4CD1[:2]]
    with pytest.raises(ValueError, match="at least two runs"):
        targets.across_runs(docs[:1], "flashrung")
    short = {**docs[1], "rows": docs[1]["rows"][:5]}
    with pytest.raises(ValueError, match=r"b\.json holds other rows than a\.json"):
        targets.across_runs([docs[0], short], "flashrung", ["a.json", "b.json"])
    with pytest.raises(ValueError, match="fr:x did not run in run 1, run 2"):
        targets.across_runs(docs, "fr:x")


def test_cli_reads_several_runs_and_refuses_a_plot_of_them(capsys, tmp_path):
    from flashrung import cli
    paths = [str(p) for p in RUNS_95F4CD1]
    assert cli.main(["bench"] + [a for p in paths for a in ("--from-json", p)]) == 0
    out = capsys.readouterr().out
    assert "run 3: " + paths[2] in out and "3/3" in out
    assert cli.main(["bench", "--from-json", paths[0], "--from-json", paths[1], "--plot", str(tmp_path / "x.png")]) == 2
    assert "--plot draws one run" in capsys.readouterr().err


SUITE_7ADCF6B = RESULTS / "h100-fa4-fwd-7adcf6b-preheat1000.json.gz"


def _parts_by_headdim(doc):
    return [{**doc, "rows": [r for r in doc["rows"] if r["headdim"] == d]} for d in (128, 64)]


def test_parts_of_one_suite_read_as_the_whole_run():
    # the property: a suite timed in parts (disjoint rows, one protocol: --headdim 128, then 64)
    # reads as the run that timed it whole — the same rows, cells and target count — and says
    # which part each row came from (the stored H100 suite at 7adcf6b, split by head dim)
    whole = jsonfile.read(SUITE_7ADCF6B)
    joined = report.join_parts(_parts_by_headdim(whole), ["d128.json", "d64.json"])
    assert [r["label"] for r in joined["rows"]] == [r["label"] for r in whole["rows"]]
    assert targets.summary(joined, "flashrung") == targets.summary(whole, "flashrung")
    assert targets.summary(joined, "flashrung").startswith("targets (flashrung): 24 of 24 rows met")
    text, original = report.results_table(joined), report.results_table(whole)
    assert "parts, each timed in its own run: d128.json (12 rows, GEMM 695.5 TFLOP/s); d64.json (12 rows, " \
           "GEMM 695.5 TFLOP/s)" in text
    table = [ln for ln in original.splitlines() if ln.startswith("B")]
    assert table and all(ln in text.splitlines() for ln in table)
    assert joined["wall_s"] == pytest.approx(2 * whole["wall_s"])


def test_parts_that_share_a_row_or_a_protocol_apart_are_refused():
    whole = jsonfile.read(SUITE_7ADCF6B)
    d128, d64 = _parts_by_headdim(whole)
    overlapping = {**d64, "rows": d64["rows"] + d128["rows"][:1]}
    with pytest.raises(ValueError, match="b.json and a.json both hold B32 H16 S1024 d128"):
        report.join_parts([d128, overlapping], ["a.json", "b.json"])
    longer = {**d64, "protocol": {**d64["protocol"], "block_preheat_ms": 150.0}}
    with pytest.raises(ValueError, match="b.json differs from a.json in protocol"):
        report.join_parts([d128, longer], ["a.json", "b.json"])
    fewer = {**d64, "impls": ["cudnn", "flashrung"]}
    with pytest.raises(ValueError, match="in impls"):
        report.join_parts([d128, fewer], ["a.json", "b.json"])
    manifest = d64["manifest"]
    elsewhere = {**d64, "manifest": {**manifest, "environment": {**manifest["environment"], "gpu": "NVIDIA H200"}}}
    with pytest.raises(ValueError, match="b.json ran on NVIDIA H200, a.json on NVIDIA H100 80GB HBM3"):
        report.join_parts([d128, elsewhere], ["a.json", "b.json"])


def test_cli_reads_parts_as_one_run_and_plots_them(capsys, tmp_path):
    from flashrung import cli
    paths = []
    for n, part in enumerate(_parts_by_headdim(jsonfile.read(SUITE_7ADCF6B))):
        paths.append(str(tmp_path / f"part{n}.json"))
        pathlib.Path(paths[-1]).write_text(json.dumps(part))
    png = tmp_path / "joined.png"
    assert cli.main(["bench", "--from-json", paths[0], "--from-json", paths[1], "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "targets (flashrung): 24 of 24 rows met" in out and f"{paths[0]} (12 rows" in out
    assert png.exists() and png.stat().st_size > 0
