"""How each implementation's rates moved between stored runs of one suite.

A run's margins are ratios inside the run; its rates are what an implementation read on that
machine that day. Between runs, an implementation whose rates moved alone changed (a rebuilt peer,
a new default of ours); all of them moving together is the machine (clock, power, another GPU of
the same kind). For each implementation and run: the rate of each row the implementation timed in
every run, divided by that row's median over the runs, summarized over the rows (median, least,
most). Rows are matched by label; a row an implementation did not time in some run (unsupported,
failed its gate, absent) is left out of that implementation's rows in every run, and an
implementation that ran in only some of the runs is left out. Derived from stored timing: no GPU.
"""
from __future__ import annotations

import statistics
from typing import Sequence


def _rates(doc: dict) -> dict[str, dict[str, float]]:
    """``{impl: {row label: TFLOP/s}}`` of the rows each implementation timed in ``doc``."""
    out: dict[str, dict[str, float]] = {}
    for row in doc.get("rows", []):
        for impl, result in row.get("results", {}).items():
            if result.get("status") == "ok" and result.get("tflops"):
                out.setdefault(impl, {})[row["label"]] = float(result["tflops"])
    return out


def rates_by_run(docs: Sequence[dict]) -> dict[str, dict]:
    """``{impl: {"rows": n, "runs": [{"median", "least", "most"} per run]}}``: each run's rate ÷ the
    row's median rate over the runs, for the rows the implementation timed in every run; in the
    order the implementations first appear. Empty below two runs."""
    if len(docs) < 2:
        return {}
    per_run = [_rates(doc) for doc in docs]
    impls = list(dict.fromkeys(impl for rates in per_run for impl in rates))
    out = {}
    for impl in impls:
        if not all(impl in rates for rates in per_run):
            continue
        labels = [label for label in per_run[0][impl] if all(label in rates[impl] for rates in per_run)]
        if not labels:
            continue
        medians = {label: statistics.median(rates[impl][label] for rates in per_run) for label in labels}
        runs = []
        for rates in per_run:
            ratios = [rates[impl][label] / medians[label] for label in labels]
            runs.append({"median": statistics.median(ratios), "least": min(ratios), "most": max(ratios)})
        out[impl] = {"rows": len(labels), "runs": runs}
    return out
