"""What a whole work item of ``hopper.fwd`` costs: the clock stamps of ``trace_tiles``.

``hopper.fwd`` built with ``trace_tiles = N`` (``flashrung/kernels/hopper/trace.py``) records, for
each consumer warpgroup, each of every CTA's first N work items whole: the SM clock at its start
(before its Q wait) and after its epilogue, its K/V steps and how many of them are masked. The step
trace (``step_trace``) sees the steady steps of one item; this sees what the item pays around them
— its first step, its masked diagonal or key-tail steps, its epilogue and the hand-over to the next
item — by fitting, per warpgroup, ``cycles = fixed + per_step · unmasked + per_masked · masked`` over
every recorded item (least squares; causal problems give items of many lengths, so the fit is well
posed; a problem whose items all have the same steps gives only their mean). It times the traced
kernel against the untraced one (CUDA events, interleaved) and checks their outputs are
bit-identical.

Each record also holds the item's index and its start and end on the GPU's global timer, one time
axis for every SM: with the launch plan beside it, the summary tells whole tiles from the split
items of a split tail (their cycles apart) and lays the launch out in time — its span, when the
first CTA ran out of items, the window the last items run in while SMs idle, and the share of SM
time idle at the end (:func:`timeline`). The timeline is complete when every item was recorded
(``--tiles`` at least the items a CTA runs).

``python -m flashrung.evidence.tile_trace --headdim 128 --seqlen 16384 --batch 2 --heads 16
[--causal] [--window LEFT,RIGHT] [--tiles 8] [--split-tail] [--set key=value,...] [--json PATH]``.
Needs an sm_90 GPU. Whole tiles unless ``--split-tail`` switches the split tail on (non-causal
problems). ``--window`` traces a sliding window's launch on the windowed default (its items stop at
the window's left edge, whose steps count as masked).
"""
from __future__ import annotations

import argparse
import sys

from flashrung.evidence.step_trace import _cycles, problem_parser, run_probe


# the share of items that must have one masked-step count for it to be folded into the fixed part
MODAL_SHARE = 0.9


def _global_us(later, earlier):
    """Signed µs from ``earlier`` to ``later``, two global-timer stamps (``trace.GLOBAL_TIMER_SHIFT``:
    the timer's low word shifted, which wraps)."""
    from flashrung.kernels.hopper.trace import GLOBAL_TIMER_SHIFT

    wrap = 1 << (32 - GLOBAL_TIMER_SHIFT)
    units = ((later.astype("int64") - earlier.astype("int64") + wrap // 2) % wrap) - wrap // 2
    return units * (1 << GLOBAL_TIMER_SHIFT) / 1000.0


def timeline(records, fields: tuple[str, ...], tail: dict | None = None) -> dict:
    """The launch on the global timer, from every recorded item: ``span_us`` (the first item's
    start to the last item's end), ``first_idle_us`` (when the first CTA finished its last item),
    ``tail_us`` (from then to the end: the window in which SMs run out of work), ``idle_share`` (of
    the CTAs' time over the span, the share spent after their last item), and, for the split items
    of a split tail (item index at least ``tail["num_full_tiles"]``), ``split_window_us`` [first
    start, last end]. ``complete``: every item of the plan was recorded (``tail["num_items"]``
    distinct indices), without which the times cover only the recorded items.

    ``cycles_idle_share``: the idle the CTAs would show if their time were their items' SM-clock
    cycles — per CTA the busiest warpgroup's items summed, one minus their mean over their largest.
    Beside ``idle_share`` it says how much of the idle at the end is the items' cost (what a better
    estimate of the balanced lists could deal evenly) and how much lies outside the items' stamps
    (CTAs starting late, time between items, SMs at unequal clocks)."""
    import numpy as np

    f = {name: i for i, name in enumerate(fields)}
    records = np.asarray(records)
    ctas = records.shape[0]
    whole = (records[..., f["start_ns"]] >= 0) & (records[..., f["end_ns"]] >= 0)
    if not whole.any():
        return {"items": 0}
    ref = records[..., f["start_ns"]][whole].min()
    start = _global_us(records[..., f["start_ns"]], ref)
    end = _global_us(records[..., f["end_ns"]], ref)
    t0, t1 = float(start[whole].min()), float(end[whole].max())
    finish = np.array([end[c][whole[c]].max() for c in range(ctas) if whole[c].any()])
    stamped = whole & (records[..., f["start"]] >= 0) & (records[..., f["end"]] >= 0)
    busy = np.where(stamped, _cycles(records[..., f["end"]], records[..., f["start"]]), 0).sum(axis=2).max(axis=1)
    busy = busy[busy > 0]
    out = {"items": int(whole.sum()), "span_us": t1 - t0, "first_idle_us": float(finish.min()) - t0,
           "tail_us": t1 - float(finish.min()),
           "idle_share": float(((t1 - finish).sum()) / (len(finish) * (t1 - t0))) if t1 > t0 else 0.0,
           "cycles_idle_share": float(1.0 - busy.mean() / busy.max()) if busy.size else 0.0}
    if tail is not None:
        items = records[..., f["item"]][whole]
        out["complete"] = len(np.unique(items)) == int(tail["num_items"])
        split = whole & (records[..., f["item"]] >= int(tail["num_full_tiles"]))
        if split.any():
            out["split_window_us"] = [float(start[split].min()) - t0, float(end[split].max()) - t0]
            # the whole tiles that end after the first split item starts: the last round's whole tiles
            out["whole_end_us"] = float(end[whole & ~split].max()) - t0 if (whole & ~split).any() else None
    return out


def summarize(records, fields: tuple[str, ...], tail: dict | None = None) -> dict:
    """Per consumer warpgroup: the items recorded, their cycles (median, p10, p90) and the fit of
    cycles on unmasked and masked steps (``fixed``, ``per_step``, ``per_masked``; ``per_masked`` is
    None when no item has a masked step, and the fit is None when the items' step counts do not
    tell the terms apart) with its residuals' p10 and p90. When every item has the same number of
    masked steps (at least ``MODAL_SHARE`` of them; the others are ``left_out`` of the fit), their
    cost is part of ``fixed`` and ``masked_in_fixed`` says how many; ``items``
    keeps each item's cycles, steps and masked steps.

    ``records`` is the int32 array of ``fwd.traced_forward`` with ``trace_tiles``: [CTAs,
    warpgroups, items, fields], -1 where nothing was recorded. With ``tail`` (the launch plan's
    ``num_full_tiles`` and ``num_items``) and the records' item field, ``by_kind`` gives whole
    tiles' and split items' cycles apart; with global-timer fields, ``timeline`` (:func:`timeline`)."""
    import numpy as np

    records = np.asarray(records)
    if records.ndim != 4 or records.shape[3] != len(fields):
        raise ValueError(f"records must be [CTAs, warpgroups, items, {len(fields)}], got {records.shape}")
    f = {name: i for i, name in enumerate(fields)}
    ctas, groups, items, _ = records.shape
    # an item is recorded when its clock stamps and step counts are (the fields every record has)
    base = [f["start"], f["end"], f["steps"], f["masked"]]
    out = {"ctas": int(ctas), "warpgroups": int(groups), "items": int(items), "by_warpgroup": []}
    for g in range(groups):
        rec = records[:, g].reshape(-1, len(fields))
        rec = rec[(rec[:, base] >= 0).all(axis=1)]
        cycles = _cycles(rec[:, f["end"]], rec[:, f["start"]]).astype("float64")
        steps = rec[:, f["steps"]].astype("float64")
        masked = rec[:, f["masked"]].astype("float64")
        row = {"n": int(rec.shape[0])}
        if rec.shape[0] == 0:
            out["by_warpgroup"].append(row)
            continue
        row["cycles"] = {"median": float(np.median(cycles)), "p10": float(np.percentile(cycles, 10)),
                         "p90": float(np.percentile(cycles, 90))}
        row["steps"] = {"min": int(steps.min()), "max": int(steps.max()), "masked_max": int(masked.max())}
        # (nearly) every item the same number of masked steps (a causal problem on the balanced
        # lists: one or two diagonal steps each): the masked steps' cost cannot be told from the
        # fixed part, so it is folded into it and the fit says so (``masked_in_fixed``). The few
        # items with another count are special tiles — at d64 causal the sequence's last, partial
        # tile, whose steps run faster beside empty warpgroups — and a masked term would absorb
        # their speed (a fixed part of -222k cycles, H200 d64 causal S16k), so they are left out
        # of the fit (``left_out``) and still counted in the medians
        counts, freq = np.unique(masked, return_counts=True)
        mode = int(counts[freq.argmax()])
        masked_in_fixed = mode if mode and freq.max() >= MODAL_SHARE * len(masked) else 0
        separate_masked = bool(masked.any()) and not masked_in_fixed
        fitted = masked == mode if masked_in_fixed else np.ones_like(masked, dtype=bool)
        row["left_out"] = int((~fitted).sum())
        columns = [np.ones_like(cycles), steps - masked] + ([masked] if separate_masked else [])
        design = np.stack(columns, axis=1)[fitted]
        if np.linalg.matrix_rank(design) < design.shape[1]:
            row["fit"] = None
        else:
            coef, *_ = np.linalg.lstsq(design, cycles[fitted], rcond=None)
            residual = cycles[fitted] - design @ coef
            row["fit"] = {"fixed": float(coef[0]), "per_step": float(coef[1]),
                          "per_masked": float(coef[2]) if separate_masked else None,
                          "masked_in_fixed": masked_in_fixed,
                          "residual_p10": float(np.percentile(residual, 10)),
                          "residual_p90": float(np.percentile(residual, 90))}
        # the items themselves, so that a reader can refit them (cycles, steps, masked steps)
        row["items"] = [[int(c), int(n), int(m)] for c, n, m in zip(cycles, steps, masked)]
        out["by_warpgroup"].append(row)
    if tail is not None and "item" in f:
        rec = records.reshape(-1, len(fields))
        rec = rec[(rec[:, base + [f["item"]]] >= 0).all(axis=1)]
        cycles = _cycles(rec[:, f["end"]], rec[:, f["start"]]).astype("float64")
        is_split = rec[:, f["item"]] >= int(tail["num_full_tiles"])
        out["by_kind"] = {}
        for kind, sel in (("whole", ~is_split), ("split", is_split)):
            if sel.any():
                out["by_kind"][kind] = {"n": int(sel.sum()), "cycles_median": float(np.median(cycles[sel])),
                                        "cycles_p10": float(np.percentile(cycles[sel], 10)),
                                        "cycles_p90": float(np.percentile(cycles[sel], 90)),
                                        "steps_min": int(rec[sel, f["steps"]].min()),
                                        "steps_max": int(rec[sel, f["steps"]].max())}
    if "start_ns" in f:
        out["timeline"] = timeline(records, fields, tail)
    return out


def table(summary: dict) -> str:
    """The summary as text, one row per warpgroup."""
    head = ["warpgroup", "items", "steps", "cycles median [p10, p90]", "fixed", "per step", "per masked step",
            "residual [p10, p90]"]
    lines = [head]
    for g, row in enumerate(summary["by_warpgroup"]):
        if row["n"] == 0:
            lines.append([str(g), "0"] + ["-"] * (len(head) - 2))
            continue
        c, s, fit = row["cycles"], row["steps"], row["fit"]
        cells = [str(g), str(row["n"]), f"{s['min']}-{s['max']} ({s['masked_max']} masked at most)",
                 f"{c['median']:.0f} [{c['p10']:.0f}, {c['p90']:.0f}]"]
        if fit is None:
            cells += ["-", "-", "-", "-"]
        else:
            fixed = f"{fit['fixed']:.0f}" + (f" (with {fit['masked_in_fixed']} masked)" if fit["masked_in_fixed"] else "")
            if row.get("left_out"):
                fixed += f", {row['left_out']} items left out"
            cells += [fixed, f"{fit['per_step']:.0f}",
                      "-" if fit["per_masked"] is None else f"{fit['per_masked']:.0f}",
                      f"[{fit['residual_p10']:.0f}, {fit['residual_p90']:.0f}]"]
        lines.append(cells)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)
    for kind, k in summary.get("by_kind", {}).items():
        text += (f"\n{kind} items: {k['n']}, {k['steps_min']}-{k['steps_max']} K/V steps, cycles median "
                 f"{k['cycles_median']:.0f} [{k['cycles_p10']:.0f}, {k['cycles_p90']:.0f}]")
    t = summary.get("timeline")
    if t and t.get("items"):
        text += (f"\ntimeline (global timer): span {t['span_us']:.1f} µs; first CTA out of items at "
                 f"{t['first_idle_us']:.1f} µs, the last {t['tail_us']:.1f} µs with SMs idle; "
                 f"{t['idle_share']:.2%} of the CTAs' time idle at the end")
        if "cycles_idle_share" in t:
            text += f" ({t['cycles_idle_share']:.2%} in the items' SM cycles)"
        if "split_window_us" in t:
            a, b = t["split_window_us"]
            text += f"; split items run {a:.1f}-{b:.1f} µs"
            if t.get("whole_end_us") is not None:
                text += f", the last whole tile ends at {t['whole_end_us']:.1f} µs"
        if t.get("complete") is False:
            text += " (not every item recorded: raise --tiles)"
    return text


def build_parser() -> argparse.ArgumentParser:
    p = problem_parser("python -m flashrung.evidence.tile_trace",
                       "clock stamps of hopper.fwd's work items: a tile's fixed cost and its steps'")
    p.add_argument("--tiles", type=int, default=8, help="work items recorded per CTA (default 8)")
    p.add_argument("--split-tail", action=argparse.BooleanOptionalAction, default=False,
                   help="run the split tail (non-causal; on whatever the problem's default): the last round's "
                        "tiles split over every SM (default: off, whole tiles only)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.prog = "tile_trace"
    if args.tiles < 1:
        raise SystemExit("--tiles must be at least 1")
    if args.split_tail and args.causal:
        raise SystemExit("--split-tail: the split tail is non-causal only (a causal grid ends on its lightest tiles)")
    from flashrung.kernels.hopper.trace import TILE_FIELDS

    return run_probe(args, dict(trace_tiles=args.tiles), TILE_FIELDS,
                     lambda records, fields, common: summarize(records, fields, tail=common["tail"]), table, "tile trace",
                     lambda s: f"the first {args.tiles} work items of each; cycles (SM clock) = fixed + per step x "
                               "unmasked steps + per masked step x masked steps (least squares)")


if __name__ == "__main__":
    sys.exit(main())
