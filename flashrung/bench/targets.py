"""The speed targets the Hopper forward is held to, read off a bench run.

The specification (H200, ``flashrung bench --suite fa4-protocol``, forward, every peer in the same
run): each row with S ≥ 2k and d ∈ {64, 128} at ≥ 1.05× the best peer of the run, the S = 1k rows
at ≥ 1.00×, and d128 S16k non-causal bf16 at ≥ 700 TFLOP/s besides; d256 S8k (a bench of its own)
at ≥ 1.05× FA4. A row's reading is the paired same-run median of the table's ratio column (never a
ratio of two medians), and ``needs`` is the speed-up still wanted, ``target ÷ reading`` — 1.0 or
less where the row meets its target. Rows the specification names nothing for (the backward, free
shapes at other lengths, fp16) carry no target.
"""
from __future__ import annotations

import dataclasses
import statistics

RATIO_LONG = 1.05             # × the best peer, S ≥ 2k
RATIO_SHORT = 1.00            # × the best peer, S = 1k
SHORT_SEQLEN = 1024           # tokens: the suite's shortest length, held to RATIO_SHORT
TARGET_ROW_TFLOPS = 700.0     # TFLOP/s at d128 S16k non-causal bf16, beside its ratio
TARGET_ROW = (128, 16384, False)
D256_ROW = (256, 8192)        # d256 S8k: ≥ RATIO_LONG × FA4, both masks
TARGET_HEAD_DIMS = (64, 128)


@dataclasses.dataclass(frozen=True)
class Target:
    """What one row asks of an implementation: a paired ratio over a peer (``peer`` None: the
    run's best peer) and, on the target row, a rate."""

    min_ratio: float
    peer: str | None = None
    min_tflops: float | None = None

    def label(self) -> str:
        over = "best" if self.peer is None else self.peer
        text = f"≥{self.min_ratio:.2f}×{over}"
        return text + (f", ≥{self.min_tflops:.0f} TFLOP/s" if self.min_tflops is not None else "")


@dataclasses.dataclass(frozen=True)
class Reading:
    """One implementation's standing against a row's target: ``needs`` ≤ 1 means met; None where
    the run has no paired reading against the peer named (the peer failed, or ours did)."""

    target: Target
    ratio: float | None
    tflops: float | None
    needs: float | None
    lo: float | None = None       # the paired reading's p10 and p90
    hi: float | None = None

    @property
    def met(self) -> bool:
        return self.needs is not None and self.needs <= 1.0

    def cell(self) -> str:
        return needs_cell(self.needs)


def needs_cell(needs: float | None) -> str:
    """A table cell for what a row still needs: ``met``, ``+x.x%``, or ``n/a`` with no reading."""
    if needs is None:
        return "n/a"
    return "met" if needs <= 1.0 else f"+{(needs - 1) * 100:.1f}%"


def target_for(row: dict) -> Target | None:
    """The target of one row of a bench document (its plan fields), or None."""
    if row.get("mode") != "fwd" or row.get("dtype") != "bfloat16" or row["seqlen_q"] != row["seqlen_k"]:
        return None
    d, s, causal = row["headdim"], row["seqlen_q"], bool(row["causal"])
    if (d, s) == D256_ROW:
        return Target(RATIO_LONG, peer="fa4")
    if row.get("suite") != "fa4-protocol" or d not in TARGET_HEAD_DIMS:
        return None
    if s <= SHORT_SEQLEN:
        return Target(RATIO_SHORT)
    return Target(RATIO_LONG, min_tflops=TARGET_ROW_TFLOPS if (d, s, causal) == TARGET_ROW else None)


def reading(row: dict, impl: str) -> Reading | None:
    """``impl``'s standing on ``row`` against its target, or None where the row has none."""
    target = target_for(row)
    if target is None:
        return None
    peer = target.peer or row.get("best_peer")
    cmp = row.get("comparisons", {}).get(impl, {}).get(peer or "")
    result = row.get("results", {}).get(impl, {})
    tflops = result.get("tflops") if result.get("status") == "ok" else None
    if not cmp:
        return Reading(target, None, tflops, None)
    ratio, spread = cmp["margin"], dict(lo=cmp["lo"], hi=cmp["hi"])
    if target.min_tflops is not None and tflops is None:
        return Reading(target, ratio, tflops, None, **spread)
    needs = target.min_ratio / ratio
    if target.min_tflops is not None:
        needs = max(needs, target.min_tflops / tflops)
    return Reading(target, ratio, tflops, needs, **spread)


def summary(doc: dict, impl: str) -> str | None:
    """One paragraph: how many rows with a target ``impl`` meets, and the nearest and furthest
    of the others by what they still need; None where no row of the run has a target."""
    readings = [(row["label"], r) for row in doc["rows"] if (r := reading(row, impl)) is not None]
    if not readings:
        return None
    met = [label for label, r in readings if r.met]
    short = sorted(((label, r) for label, r in readings if not r.met and r.needs is not None),
                   key=lambda item: item[1].needs)
    unread = [label for label, r in readings if r.needs is None]
    text = f"targets ({impl}): {len(met)} of {len(readings)} rows met"
    if met:
        text += " — " + ", ".join(met)
    if short:
        def fmt(items):
            return ", ".join(f"{label} {r.cell()}" for label, r in items)
        text += f"\n  nearest below: {fmt(short[:3])}"
        if len(short) > 3:
            text += f"\n  furthest: {fmt(short[-3:][::-1])}"
    if unread:
        text += f"\n  no paired reading: {', '.join(unread)}"
    return text


def to_json(doc: dict, impl: str) -> list[dict]:
    """Each row with a target as data: the target, the reading, what it still needs."""
    out = []
    for row in doc["rows"]:
        r = reading(row, impl)
        if r is not None:
            out.append({"row": row["label"], "impl": impl, **dataclasses.asdict(r.target), "ratio": r.ratio,
                        "tflops": r.tflops, "needs": r.needs, "met": r.met})
    return out


def across_runs(docs: list[dict], impl: str, names: list[str] | None = None) -> list[dict]:
    """Each row with a target read in every run of the same rows: the run's ratios, TFLOP/s and
    verdicts, how many runs met it, and the median ratio's (and, on the target row, median
    rate's) ``needs`` — one suite reading does not settle a row within a few percent of a 5%
    target; the runs together say how often it is met and by how much it moves. ``names`` label
    the runs in errors (default: run 1, run 2, ...). Raises ValueError where the runs do not hold
    the same rows in the same order, or ``impl`` is missing from any of them."""
    names = names or [f"run {n + 1}" for n in range(len(docs))]
    if len(docs) < 2:
        raise ValueError(f"across runs: expected at least two runs, got {len(docs)}")
    labels = [[row["label"] for row in doc["rows"]] for doc in docs]
    for name, ls in zip(names[1:], labels[1:]):
        if ls != labels[0]:
            raise ValueError(f"across runs: {name} holds other rows than {names[0]} "
                             f"({len(ls)} against {len(labels[0])}; runs of one suite are compared)")
    missing = [name for name, doc in zip(names, docs) if impl not in doc["impls"]]
    if missing:
        raise ValueError(f"across runs: {impl} did not run in {', '.join(missing)}")
    out = []
    for n, row in enumerate(docs[0]["rows"]):
        readings = [reading(doc["rows"][n], impl) for doc in docs]
        if readings[0] is None:
            continue
        target = readings[0].target
        ratios = [r.ratio for r in readings if r.ratio is not None]
        rates = [r.tflops for r in readings if r.tflops is not None]
        needs = None
        if ratios:
            needs = target.min_ratio / statistics.median(ratios)
            if target.min_tflops is not None:
                needs = max(needs, target.min_tflops / statistics.median(rates)) if rates else None
        out.append({"row": row["label"], "impl": impl, **dataclasses.asdict(target),
                    "ratios": [r.ratio for r in readings], "tflops": [r.tflops for r in readings],
                    "met": [r.met for r in readings], "met_runs": sum(r.met for r in readings),
                    "runs": len(readings), "median_ratio": statistics.median(ratios) if ratios else None,
                    "spread": (max(ratios) / min(ratios) - 1) if len(ratios) > 1 else None,
                    "needs": needs})
    return out


def across_runs_summary(rows: list[dict], impl: str) -> str:
    """One paragraph over :func:`across_runs`: rows met in every run, in some, in none, and the
    largest move of a row's ratio between the runs."""
    runs = rows[0]["runs"] if rows else 0
    every = [r["row"] for r in rows if r["met_runs"] == runs]
    some = [f"{r['row']} ({r['met_runs']} of {runs})" for r in rows if 0 < r["met_runs"] < runs]
    per_run = [sum(r["met"][k] for r in rows) for k in range(runs)]
    text = (f"targets ({impl}) across {runs} runs: {' / '.join(str(n) for n in per_run)} of {len(rows)} rows met; "
            f"in every run {len(every)}" + (" — " + ", ".join(every) if every else ""))
    if some:
        text += f"\n  in some runs: {', '.join(some)}"
    spreads = [(r["spread"], r["row"]) for r in rows if r["spread"] is not None]
    if spreads:
        worst = max(spreads)
        text += (f"\n  a row's ratio moved between the runs by a median {statistics.median(s for s, _ in spreads):.1%}, "
                 f"at most {worst[0]:.1%} ({worst[1]})")
    return text
