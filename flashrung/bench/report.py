"""What a person reads: the terminal table, the dry-run plan, and the JSON on disk.

The table has one line per row: each implementation's TFLOP/s, the best peer, and for each
flashrung kernel its paired margin over the best peer (median of per-round ratios, > 1 means
ours is faster, with p10–p90) and its share of the GEMM ceiling measured in the same run; where
a row has a speed target (``targets``), the target and what the product's kernel still needs to
meet it, with a count of the rows met below the table. The FLOP convention heads the table;
unsupported implementations show ``unsup`` / ``error`` in their cell and their reasons below,
never a blank; a cell whose calls were host-bound carries a ``*`` and a footnote. Below it, what
each implementation's blocks inherited from the block before them (:mod:`~flashrung.bench.carryover`).
"""
from __future__ import annotations

import pathlib
import statistics
from typing import Iterable, Sequence

from flashrung.bench import block_clocks, carryover, drift, numerators, peers, targets, timing
from flashrung import jsonfile

SHORT = {"efficient": "effic", "flashrung": "flashrung"}


def _short(impl: str) -> str:
    return SHORT.get(impl, impl.replace("flashrung:", "fr:"))


def _table(header: Sequence[str], lines: Iterable[Sequence[str]], left: int = 1) -> str:
    lines = [list(map(str, ln)) for ln in lines]
    widths = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths)] + [fmt(ln) for ln in lines])


def _window_text(row: dict) -> str:
    """A plan row's sliding window as the mask column shows it: `` win4096,0``, or nothing."""
    window = row.get("window")
    return f" win{window[0]},{window[1]}" if window is not None else ""


def _seqlen_text(row: dict) -> str:
    """A plan row's lengths as the seqlen column shows them: ``4096``, ``1000x4097``, or a packed
    row's sequences (``packed 4096x2,1024x8``)."""
    if row.get("packed") is not None:
        from flashrung.bench.suites import packed_text
        return f"packed {packed_text(row['packed'])}"
    return f"{row['seqlen_q']}" if row["seqlen_q"] == row["seqlen_k"] else f"{row['seqlen_q']}x{row['seqlen_k']}"


def plan_table(plan: dict) -> str:
    rows = plan["rows"]
    lines = [[f"B{r['batch']} H{r['heads_q']}" + ("" if r["heads_kv"] == r["heads_q"] else f"/{r['heads_kv']}"),
              _seqlen_text(r),
              r["headdim"], r["dtype"], ("causal" if r["causal"] else "full") + _window_text(r), r["mode"],
              f"{r['flops']:,}",
              r["flops_convention"]] for r in rows]
    return _table(["shape", "seqlen", "d", "dtype", "mask", "mode", "FLOPs", "convention"], lines, left=1)


HOST_BOUND_MARK = "*"


def _cell(result: dict | None) -> str:
    if result is None:
        return "-"
    if result["status"] == "ok":
        return f"{result['tflops']:.1f}" + (HOST_BOUND_MARK if result.get("host_bound") else "")
    return {"unsupported": "unsup", peers.GATE_FAILED: "FAIL",
            peers.WRONG_OUTPUT: "WRONG"}.get(result["status"], "error")


def host_bound_note(doc: dict) -> str | None:
    """The footnote of the ``*`` cells: which rows and implementations ran host-bound."""
    cells = [(row["label"], impl, r["host_path"]) for row in doc["rows"] for impl, r in row["results"].items()
             if r.get("status") == "ok" and r.get("host_bound")]
    if not cells:
        return None
    share = cells[0][2]
    example = (f"e.g. {cells[0][1]} at {cells[0][0]}: {share['host_ms']:.3f} ms/call issued against "
               f"{share['device_ms']:.3f} ms/call on the GPU")
    return (f"{HOST_BOUND_MARK} host-bound: issuing a call took the host at least {timing.HOST_BOUND_SHARE:.0%} of "
            f"the call's GPU time (probe of back-to-back calls after the row's timing), so the GPU waited for "
            f"the host and the cell rates the entry point, not the kernel ({len(cells)} cell"
            f"{'s' if len(cells) > 1 else ''}; {example})")


# the margin of a row whose balanced rounds' halves disagree: with the peer's block before ours the
# margin sits on one side of 1, with ours first on the other (on an H100 the d64 causal S1k row read
# 1.021 and 0.919 over cuDNN in one run, 1.020-1.026 paired two-arm): which implementation ran
# first decides that row's verdict
ORDER_MARK = "~"


def _best_peer_comparison(row: dict, impl: str) -> dict | None:
    """The paired summary of ``impl`` over the row's best peer, if the row has one."""
    return row.get("comparisons", {}).get(impl, {}).get(row.get("best_peer") or "") or None


def _order_dependent(row: dict, impl: str) -> dict | None:
    """The comparison of ``impl`` with the row's best peer, where its halves disagree."""
    cmp = _best_peer_comparison(row, impl)
    return cmp if cmp and cmp.get("halves_agree") is False else None


def order_note(doc: dict, impls: Sequence[str]) -> str | None:
    """The footnote of the ``~`` margins: the rows of ``impls`` whose halves disagree."""
    cells = [(row, impl, cmp) for row in doc["rows"] for impl in impls
             if (cmp := _order_dependent(row, impl)) is not None]
    if not cells:
        return None
    listed = "; ".join(f"{impl} at {row['label']}: {cmp['margin_ab']:.3f} with {row['best_peer']} first, "
                       f"{cmp['margin_ba']:.3f} with {impl} first" for row, impl, cmp in cells[:3])
    more = f"; {len(cells) - 3} more" if len(cells) > 3 else ""
    return (f"{ORDER_MARK} order-dependent: the rounds with the best peer's block first and those with ours "
            f"first put the margin on opposite sides of 1 — which ran first moved it more than the two differ "
            f"({listed}"
            f"{more}); a paired compare of the two at the suite's preheat (flashrung compare "
            f"--block-preheat-ms) says which holds")


def _split_clock_text(clock: dict) -> str:
    """The clock beside a split's two sides (:func:`block_clocks.split_reading`)."""
    share = clock["clock_share"]
    reading = ("" if share is None else
               f": the clock accounts for {100 * share:.0f}% of the time between them")
    return f" (at {clock['mhz_slow']:.0f} MHz in the slow rounds, {clock['mhz_fast']:.0f} in the others{reading})"


def clocks_line(doc: dict) -> str | None:
    """One line on the clock the timed blocks met (the run's ``clocks``: nvidia-smi through the
    rows, :mod:`block_clocks`): each implementation's range of block clocks over the run, or why
    there are none. None for a run that sampled nothing."""
    clocks = doc.get("clocks")
    if not clocks:
        return None
    per_impl: dict[str, list[float]] = {}
    for row in doc["rows"]:
        for impl, r in row["results"].items():
            per_impl.setdefault(impl, []).extend(c["mhz"] for c in r.get("blocks_clock") or () if c["mhz"] is not None)
    ranges = "; ".join(f"{_short(impl)} {min(m):.0f}–{max(m):.0f} (median {statistics.median(m):.0f})"
                       for impl, m in per_impl.items() if m)
    line = (f"clocks: the timed blocks at {ranges} MHz (nvidia-smi every {clocks['sample_ms']} ms, "
            f"{clocks.get('count', 0)} samples" if ranges else
            f"clocks: no block has a clock (nvidia-smi every {clocks['sample_ms']} ms, "
            f"{clocks.get('count', 0)} samples")
    if clocks.get("blocks_without_sample"):
        line += f"; {clocks['blocks_without_sample']} blocks without a sample"
    line += ")"
    if clocks.get("error"):
        line += f"; the sampler: {clocks['error']}"
    return line


def two_speeds_note(doc: dict, impls: Sequence[str]) -> str | None:
    """The rows where one of ``impls`` ran at two speeds by round beside the row's best peer
    (:func:`carryover.two_speeds`): its margin there is a count of rounds on each side."""
    found = []
    for row in doc["rows"]:
        for impl in impls:
            split = carryover.two_speeds(row, impl, row["best_peer"]) if row.get("best_peer") else None
            if split is not None:
                clock = block_clocks.split_reading(row["results"][impl], split["slow_rounds"])
                found.append(dict(split, row=row["label"], clock=clock))
    if not found:
        return None
    listed = "; ".join(
        f"{_short(s['impl'])} at {s['row']}: blocks {100 * s['spread']:.1f}% apart ({s['peer']}'s "
        f"{100 * s['peer_spread']:.1f}%), in round{'s' if len(s['slow_rounds']) > 1 else ''} "
        f"{', '.join(map(str, s['slow_rounds']))} {s['ratios']['slow'][0]:.3f}–{s['ratios']['slow'][1]:.3f}× "
        f"{s['peer']}, in the others {s['ratios']['fast'][0]:.3f}–{s['ratios']['fast'][1]:.3f}×"
        + (_split_clock_text(s["clock"]) if s["clock"] else "")
        for s in found[:3])
    more = f"; {len(found) - 3} more" if len(found) > 3 else ""
    return (f"two speeds: {listed}{more} — the median counts the rounds on each side; what each sustains "
            f"at that row is for flashrung sustain to say")


def carryover_table(docs: Sequence[dict], title: str = "carryover") -> str | None:
    """What each implementation's blocks inherited from the block before them (:mod:`carryover`):
    rows the implementation timed, columns the one whose block ran just before, cells the mean block
    ÷ typical block with the count of blocks; a line per implementation whose predecessors move it
    by ``carryover.NOTABLE_SPREAD`` or more. None where no row stored its blocks and rounds."""
    s = carryover.summary(docs)
    if not s["cells"]:
        return None
    impls = s["impls"]
    lines = []
    for impl in impls:
        row = s["cells"].get(impl, {})
        lines.append([_short(impl)] + [f"{row[b]['mean']:.3f} ({row[b]['n']})" if b in row else "-" for b in impls])
    out = [f"{title}: each block's median ÷ its implementation's typical block in the row, by the block just "
           "before it (mean over the rows' blocks, count in brackets; a row's first block left out)",
           _table(["timed \\ after"] + [_short(i) for i in impls], lines)]
    for n in s["notable"]:
        out.append(f"  {_short(n['impl'])} runs {100 * (n['slow_mean'] / n['fast_mean'] - 1):.1f}% slower after "
                   f"{_short(n['slowest_after'])} ({n['slow_mean']:.3f}) than after {_short(n['fastest_after'])} "
                   f"({n['fast_mean']:.3f})")
    return "\n".join(out)


def drift_table(docs: Sequence[dict]) -> str | None:
    """Each implementation's rates run by run (:mod:`drift`): a cell per run, the median over the rows
    of the row's rate ÷ its median over the runs, with the least and the most. None below two runs
    or where no implementation timed a row in every run."""
    moved = drift.rates_by_run(docs)
    if not moved:
        return None
    lines = [[_short(impl), str(d["rows"])] + [f"{r['median']:.3f} [{r['least']:.3f},{r['most']:.3f}]"
                                                for r in d["runs"]]
             for impl, d in moved.items()]
    return ("rates by run: each row's TFLOP/s ÷ its median over the runs, the median over the rows "
            "[least, most] — one implementation moving alone changed; all moving together is the machine\n"
            + _table(["impl", "rows"] + [f"run {n + 1}" for n in range(len(docs))], lines))


def target_impls(impls: Sequence[str]) -> list[str]:
    """The implementations the speed targets read: the product's dispatch and the Hopper kernel
    named directly (the portable kernels are not held to them)."""
    return [i for i in impls if i == "flashrung" or i.startswith("flashrung:hopper")]


def with_targets(doc: dict) -> dict:
    """``doc`` with its rows' targets and readings as data (``targets``), for the JSON on disk."""
    readings = [r for impl in target_impls(doc["impls"]) for r in targets.to_json(doc, impl)]
    return {**doc, "targets": readings} if readings else doc


def runs_table(docs: Sequence[dict], names: Sequence[str]) -> str:
    """Several runs of one suite, read against the targets together: each row's ratio in every
    run (``*`` where that run met the target), the runs that met it, the median ratio and what
    the median still needs, then :func:`targets.across_runs_summary`. Raises ValueError where the
    runs are not of the same rows or carry no target."""
    impls = [i for i in target_impls(docs[0]["impls"]) if all(i in d["impls"] for d in docs)]
    parts = []
    for impl in impls:
        rows = targets.across_runs(list(docs), impl, list(names))
        if not rows:
            continue
        header = ["row", "target"] + [f"run {n + 1}" for n in range(len(docs))] + ["met", "median", "needs"]
        lines = []
        for r in rows:
            cells = [("n/a" if x is None else f"{x:.3f}" + ("*" if m else " ")) for x, m in zip(r["ratios"], r["met"])]
            needs = targets.needs_cell(r["needs"])
            median = "n/a" if r["median_ratio"] is None else f"{r['median_ratio']:.3f}"
            target = targets.Target(r["min_ratio"], r["peer"], r["min_tflops"]).label()
            lines.append([r["row"], target] + cells + [f"{r['met_runs']}/{r['runs']}", median, needs])
        parts.append(f"{impl} ÷ the run's best peer (paired median of each run; * at target):\n"
                     + _table(header, lines) + "\n" + targets.across_runs_summary(rows, impl))
    if not parts:
        raise ValueError("across runs: no row of these runs carries a target")
    moved = drift_table(docs)
    if moved:
        parts.append(moved)
    carried = carryover_table(docs, "carryover, the runs pooled")
    if carried:
        parts.append(carried)
    runs = "\n".join(f"  run {n + 1}: {name}" for n, name in enumerate(names))
    return runs + "\n\n" + "\n\n".join(parts)


# what a suite's parts must share to be read as one run (their rows aside)
PART_FIELDS = ("suite", "impls", "causal_convention", "protocol")


def join_parts(docs: Sequence[dict], names: Sequence[str]) -> dict:
    """One document from runs that each timed a disjoint part of one suite's rows (``flashrung bench
    --suite S --headdim 128``, then ``--headdim 64``: a suite too long for one sitting), in the order
    given: the rows and gates of all, each part's ceilings, manifest and wall time under ``parts``
    (a row's %ceil is its own part's), the clocks' counts summed. Raises ValueError naming the parts
    where they differ in suite, implementations, FLOP convention, protocol or GPU, or share a row (runs of
    the same rows are read across runs, :func:`runs_table`)."""
    if len(docs) < 2:
        raise ValueError(f"parts: expected at least two, got {len(docs)}")
    first = docs[0]

    def gpu(doc):
        return ((doc.get("manifest") or {}).get("environment") or {}).get("gpu")
    for name, doc in zip(names[1:], docs[1:]):
        for field in PART_FIELDS:
            if doc.get(field) != first.get(field):
                raise ValueError(f"parts: {name} differs from {names[0]} in {field} ({doc.get(field)!r} against "
                                 f"{first.get(field)!r}); parts of one run share it")
        if gpu(doc) != gpu(first):
            raise ValueError(f"parts: {name} ran on {gpu(doc)}, {names[0]} on {gpu(first)}; parts of one run share "
                             "their GPU")
    seen: dict[str, str] = {}
    for name, doc in zip(names, docs):
        for row in doc["rows"]:
            if row["label"] in seen:
                raise ValueError(f"parts: {name} and {seen[row['label']]} both hold {row['label']}; parts of a "
                                 "suite hold disjoint rows (runs of the same rows are read together as runs)")
            seen[row["label"]] = name
    clocks = [doc.get("clocks") for doc in docs]
    joined_clocks = None
    if all(clocks):
        joined_clocks = {"source": clocks[0]["source"], "sample_ms": clocks[0]["sample_ms"],
                         "count": sum(c.get("count", 0) for c in clocks),
                         "blocks_without_sample": sum(c.get("blocks_without_sample", 0) for c in clocks)}
        errors = [f"{name}: {c['error']}" for name, c in zip(names, clocks) if c.get("error")]
        if errors:
            joined_clocks["error"] = "; ".join(errors)
    return {**{field: first.get(field) for field in PART_FIELDS}, "peer_options": first.get("peer_options"),
            "timing": first.get("timing"), "ceilings": {},
            "rows": [row for doc in docs for row in doc["rows"]],
            "correctness": [g for doc in docs for g in doc.get("correctness") or []],
            "clocks": joined_clocks, "manifest": first.get("manifest"),
            "parts": [{"name": name, "rows": len(doc["rows"]), "ceilings": doc.get("ceilings") or {},
                       "wall_s": doc.get("wall_s"), "manifest": doc.get("manifest")}
                      for name, doc in zip(names, docs)],
            "wall_s": sum(doc.get("wall_s") or 0.0 for doc in docs)}


def parts_line(doc: dict) -> str | None:
    """Where a document joins parts (:func:`join_parts`): each part's rows and its GEMM ceiling."""
    parts = doc.get("parts")
    if not parts:
        return None

    def gemm(p):
        values = [f"{c['value']:.1f}" for k, c in p["ceilings"].items() if k.startswith("gemm:")]
        return f", GEMM {'/'.join(values)} TFLOP/s" if values else ""
    return "parts, each timed in its own run: " + "; ".join(f"{p['name']} ({p['rows']} rows{gemm(p)})" for p in parts)


def rounds_line(doc: dict) -> str:
    """How the rows' rounds were ordered (a run stored before the balanced design has no ``order``:
    it ran the halves schedule), with the rounds a row took."""
    protocol = doc.get("protocol") or {}
    if not protocol:
        return ""
    rounds = sorted({r["rounds"] for row in doc.get("rows", []) for r in row["results"].values()
                     if r.get("status") == "ok" and "rounds" in r})
    count = "/".join(str(n) for n in rounds) if rounds else str(protocol.get("rounds", "?"))
    if protocol.get("order", "halves") == "balanced":
        return (f"rounds: {count} a row in a carryover-balanced design (every implementation in every position "
                "and right after every other equally often)")
    return (f"rounds: {count} a row, one listed order then reversed — at the power limit an implementation's "
            "place in the list can move its rate by several % (flashrung bench --order balanced)")


def results_table(doc: dict) -> str:
    impls = doc["impls"]
    ours = [i for i in impls if peers.is_ours(i)]
    held = [i for i in target_impls(impls) if any(targets.target_for(row) for row in doc["rows"])]
    conv = doc.get("causal_convention", numerators.FA_HALF)
    head = [f"suite {doc.get('suite', '?')} — TFLOP/s = FLOPs / median time per call; causal rows count "
            f"{numerators.LABELS[conv]}; backward = 2.5 × forward"]
    ceil = doc.get("ceilings", {})
    if ceil:
        parts = [f"{k.split(':', 1)[1]} GEMM {c['value']:.1f} TFLOP/s" for k, c in ceil.items() if k.startswith("gemm:")]
        if "copy" in ceil:
            parts.append(f"copy {ceil['copy']['value']:.0f} GB/s")
        head.append("ceilings measured in this run: " + ", ".join(parts))
        head.append("%ceil: each kernel at the clock it sustains; at the power limit a GEMM may sustain another "
                    "clock than attention (the ladder's mma.sync GEMM: ~10% lower on the H200), so %ceil is not a "
                    "share at one clock")
    schedule = rounds_line(doc)
    if schedule:
        head.append(schedule)
    joined = parts_line(doc)
    if joined:
        head.append(joined)
    header = ["row"] + [_short(i) for i in impls] + ["best peer"]
    for o in ours:
        header += [f"{_short(o)}/best [p10,p90]", f"{_short(o)} %ceil"]
    if held:
        header += ["target"] + [f"{_short(o)} needs" for o in held]
    lines = []
    for row in doc["rows"]:
        res = row["results"]
        line = [row["label"]] + [_cell(res.get(i)) for i in impls] + [row.get("best_peer") or "-"]
        for o in ours:
            cmp = _best_peer_comparison(row, o)
            line.append(f"{cmp['margin']:.3f}{ORDER_MARK if cmp.get('halves_agree') is False else ''} "
                        f"[{cmp['lo']:.3f},{cmp['hi']:.3f}]" if cmp else "-")
            pct = res.get(o, {}).get("percent_of_gemm_ceiling")
            line.append(f"{pct:.1f}%" if pct is not None else "-")
        if held:
            target = targets.target_for(row)
            line.append(target.label() if target else "-")
            line += [targets.reading(row, o).cell() if target else "-" for o in held]
        lines.append(line)
    out = "\n".join(head) + "\n" + _table(header, lines)
    for o in held:
        out += "\n" + targets.summary(doc, o)
    bound = host_bound_note(doc)
    if bound:
        out += "\n" + bound
    order = order_note(doc, ours)
    if order:
        out += "\n" + order
    speeds = two_speeds_note(doc, ours)
    if speeds:
        out += "\n" + speeds
    clocks = clocks_line(doc)
    if clocks:
        out += "\n" + clocks
    carried = carryover_table([doc])
    if carried:
        out += "\n\n" + carried
    notes = reasons(doc)
    if notes:
        out += "\n\nnot measured:\n" + "\n".join(f"  {n}" for n in notes)
    gates = doc.get("correctness") or []
    if gates:
        out += "\n\ncorrectness gate (flashrung kernels, reduced size, each on the build its rows time):\n" + "\n".join(
            f"  {'PASS' if g['passed'] else 'FAIL'} {g['impl']} {g.get('mode', 'fwd')} {_gate_shape(g['config'])}"
            f"{_gate_rows(g)}: {g['text']}" for g in gates)
    first = {}
    for row in doc["rows"]:
        for impl, r in row["results"].items():
            if r["status"] == "ok":
                first[impl] = first.get(impl, 0.0) + r.get("first_call_s", 0.0)
    if first:
        out += "\n\nfirst calls (compile, load, autotune), seconds summed over rows: " + ", ".join(
            f"{impl} {s:.1f}" for impl, s in first.items())
    if "wall_s" in doc:
        out += f"\nwall time {doc['wall_s']:.1f} s"
    return out


def _gate_rows(g: dict) -> str:
    """Which timed rows a gate line stands for (their batch, heads and lengths; the shape before
    it gives the rest), so lines of builds that differ only in schedule read as what they are.
    Results written before the gate recorded its rows give none."""
    rows = g.get("rows") or []
    if not rows:
        return ""
    return " for " + ", ".join(" ".join(label.split()[:3]) for label in rows)


def _gate_shape(c: dict) -> str:
    return (f"B{c['batch']} H{c['heads_q']}/{c['heads_kv']} S{c['seqlen_q']}x{c['seqlen_k']} d{c['head_dim']} "
            f"{c['dtype']} {'causal' if c['causal'] else 'full'}")


def reasons(doc: dict) -> list[str]:
    """One line per (implementation, reason), with how many rows it covers."""
    seen: dict[tuple[str, str, str], list[str]] = {}
    for row in doc["rows"]:
        for impl, r in row["results"].items():
            if r["status"] != "ok":
                seen.setdefault((impl, r["status"], r["reason"]), []).append(row["label"])
    return [f"{impl} ({status}, {len(labels)} row{'s' if len(labels) > 1 else ''}, e.g. {labels[0]}): {reason}"
            for (impl, status, reason), labels in seen.items()]


def write_json(doc: dict, path: str | pathlib.Path) -> pathlib.Path:
    return jsonfile.write(doc, path, default=str)
