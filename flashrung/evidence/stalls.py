"""``flashrung stalls``: read an ``ncu`` source page — where a kernel's warps stall, per instruction.

Input: the per-SASS-instruction page of one profile, as ``ncu`` writes it::

    ncu --set full -o rep python script.py
    ncu -i rep.ncu-rep --page source --csv --print-source sass | gzip > page.csv.gz

Each row is one instruction with its execution count (warp-level) and its warp-state samples,
split by stall reason (``stall_wait``, ``stall_barrier``, ...). Samples that carry no named
reason are reported as ``unnamed`` (on Hopper they gather on ``wgmma`` instructions whose warps
wait for the tensor pipe to accept them: a reading, the page does not say).

What this prints, per page: executed instructions and samples; the *hot loop* — the instructions
executed the most common loop count of times (by default the count that carries the most
executed instructions; each contiguous address range of them is one copy, e.g. one per consumer
partition) with its instructions per trip — those run on every trip: a block a branch skips on
some trips has a smaller count and is left out; stall-reason shares over the kernel and over the hot
loop; the instructions holding the most samples. With two pages, the shares side by side and the
hot loops' opcode counts per trip where they differ. Evidence level: profile (one launch, sampled
warp states; a share is where warps wait, not what lengthens the critical path).

Derived from the hot loop (:func:`cycles_per_trip`): a warp issues at most one instruction a
cycle, and its ``selected`` samples are the cycles it issued, so its instructions per trip over the
loop's ``selected`` share are its cycles per trip — comparable between two kernels whose warps run
the same trip count, at the same clock. ``--by-opcode REASON`` splits one reason's hot-loop samples
by opcode (which instructions wait on a fixed latency, on the MUFU's queue, ...).

``--executed-per UNITS`` counts what the hot loop leaves out: every instruction the kernel
executed (the producer's, the spins of its waits, the out-of-line retry loops, the prologue and
epilogue), summed by opcode family (the opcode's first word: ``SYNCS``, ``UIADD3``, ``MUFU``) and
divided by a unit of work the caller names — for two kernels that ran one problem, the same
number of K/V steps of the same tile, so each family reads as instructions a step, side by side.

*Parked* instructions (:func:`parked`): a warp that waits out the launch — one of the idle warps
Triton pads a one-warp partition with, parked on a barrier from the start to the end — is sampled
all along at one instruction it executes once. Such instructions hold many samples an execution
(:data:`PARKED_SAMPLES_PER_EXECUTION`; a loop's instructions hold far less than one) and issue
nothing, yet they weigh in the kernel's shares (3 warps of 16 are 18.75% of its samples, all
``barrier``): the page says how much and gives the kernel's shares without them beside the others.

``--phases`` cuts each copy's trip (its address range, so the spins and skipped blocks inside it
count) at its tensor-core landmarks — before the first ``HGMMA``, after the last, before each
``WARPGROUP.DEPBAR`` — and prices each phase in cycles per trip: the trip's cycles times the
phase's share of the range's samples (derived; a warp's samples fall where it spends its time).
In FA4's order the phases read: the loop's top (K/V waits, the turn), the GEMM issue, QK's wait,
the row max up to PV's wait, the exponentials — the step trace's phases, read without stamps.
"""
from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import re
import sys
from collections import Counter
from flashrung import jsonfile

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
_REASON = re.compile(r"^stall_(\w+)$")          # the all-samples columns; "(Not Issued)" ones excluded
# runs of loop instructions are one copy when at most this many instructions of other counts lie
# between them: a branch-skipped block inside the body (d256's per-warp O rescale is ~130), where
# the next partition's copy of the loop starts thousands of instructions away
MAX_GAP_INSTRUCTIONS = 512
# an instruction holding at least this many samples for each time a warp executed it is where
# warps sit parked (a padding warp at its barrier: ~55 an execution on the d64 causal S8k page of
# efcd5d5); a spinning wait's retry holds < 0.1, a hot loop's instructions < 0.01, EXIT < 0.5
PARKED_SAMPLES_PER_EXECUTION = 5.0


@dataclasses.dataclass(frozen=True)
class Instruction:
    address: int
    source: str
    executed: int
    samples: int
    reasons: dict            # reason -> samples (named reasons only)

    @property
    def unnamed(self) -> int:
        """Samples that carry no named reason."""
        return self.samples - sum(self.reasons.values())

    @property
    def opcode(self) -> str:
        """The opcode with its modifiers, predicate dropped (``HGMMA.64x128x16.F32.BF16``)."""
        words = self.source.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        return words[0] if words else "?"


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    instructions: tuple

    @property
    def samples(self) -> int:
        return sum(i.samples for i in self.instructions)

    @property
    def executed(self) -> int:
        return sum(i.executed for i in self.instructions)


def read_page(path: str) -> list[Kernel]:
    """Every kernel of an ``ncu --page source --csv --print-source sass`` page (plain or gzip)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return parse_page(f.read(), path)


def parse_page(text: str, where: str = "page") -> list[Kernel]:
    kernels, name, header, rows = [], None, None, []

    def close():
        if name is not None:
            kernels.append(Kernel(name, tuple(rows)))

    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            close()
            name, header, rows = (row[1] if len(row) > 1 else "?"), None, []
            continue
        if row[0] == "Address":
            header = row
            missing = [c for c in ("Source", SAMPLES, EXECUTED) if c not in header]
            if missing:
                raise ValueError(f"{where}: the source page lacks the columns {missing}; write it with "
                                 "`ncu -i rep --page source --csv --print-source sass` from a --set full profile")
            continue
        if header is None or name is None:
            raise ValueError(f"{where}: a row before any 'Kernel Name' / 'Address' header: not an ncu source page")
        d = dict(zip(header, row))
        reasons = {m.group(1): _int(d.get(c)) for c in header if (m := _REASON.match(c))}
        rows.append(Instruction(int(d["Address"], 16), d["Source"].strip(), _int(d[EXECUTED]),
                                _int(d[SAMPLES]), {k: v for k, v in reasons.items() if v}))
    close()
    if not kernels:
        raise ValueError(f"{where}: no kernel found (expected 'Kernel Name' rows from ncu's source page)")
    return kernels


def _int(value) -> int:
    value = (value or "").replace(",", "").strip()
    return int(value) if value and value != "-" else 0


def pick_kernel(kernels: list[Kernel], pattern: str | None) -> Kernel:
    """The kernel whose name matches ``pattern`` (regex), or the one with the most samples."""
    if pattern:
        found = [k for k in kernels if re.search(pattern, k.name)]
        if not found:
            raise ValueError(f"--kernel {pattern!r} matches none of: {', '.join(k.name[:60] for k in kernels)}")
        return max(found, key=lambda k: k.samples)
    return max(kernels, key=lambda k: k.samples)


def shares(instructions) -> dict:
    """Stall reason -> share of the samples (named reasons, and ``unnamed`` for the rest)."""
    total = sum(i.samples for i in instructions)
    counts = Counter()
    for i in instructions:
        counts.update(i.reasons)
    counts["unnamed"] = sum(i.unnamed for i in instructions)
    return {k: v / total for k, v in counts.most_common()} if total else {}


def parked(instructions) -> list:
    """The instructions warps sit parked at (:data:`PARKED_SAMPLES_PER_EXECUTION`): executed at
    least once, holding that many samples or more for each execution."""
    return [i for i in instructions
            if i.executed > 0 and i.samples >= PARKED_SAMPLES_PER_EXECUTION * i.executed]


@dataclasses.dataclass(frozen=True)
class HotLoop:
    count: int               # executions of each of its instructions
    copies: tuple            # instructions per trip of each copy (contiguous address range)
    instructions: tuple      # every instruction of every copy executed ``count`` times

    @property
    def per_trip(self) -> float:
        return len(self.instructions) / len(self.copies)


def hot_loop(kernel: Kernel, count: int | None = None) -> HotLoop:
    """The instructions executed ``count`` times (default: the count carrying the most executed
    instructions), split into copies where more than ``MAX_GAP_INSTRUCTIONS`` instructions of other
    counts separate them."""
    if count is None:
        weight = Counter()
        for i in kernel.instructions:
            if i.executed:
                weight[i.executed] += i.executed
        if not weight:
            raise ValueError(f"{kernel.name}: no instruction was executed")
        count = weight.most_common(1)[0][0]
    order = sorted(kernel.instructions, key=lambda i: i.address)
    members = [k for k, i in enumerate(order) if i.executed == count]
    if not members:
        raise ValueError(f"{kernel.name}: no instruction executed exactly {count} times")
    copies, size = [], 1
    for prev, k in zip(members, members[1:]):
        if k - prev > MAX_GAP_INSTRUCTIONS:
            copies.append(size)
            size = 0
        size += 1
    copies.append(size)
    return HotLoop(count, tuple(copies), tuple(order[k] for k in members))


def cycles_per_trip(loop: HotLoop) -> float | None:
    """A warp's cycles per trip of ``loop``, derived: instructions per trip over the loop's share of
    ``selected`` samples (the cycles its warps issued). None when no sample was ``selected``."""
    selected = shares(loop.instructions).get("selected", 0.0)
    return loop.per_trip / selected if selected else None


# an instruction that opens a phase of a trip (see loop_phases)
_MMA = "HGMMA"
_MMA_WAIT = "WARPGROUP.DEPBAR"


def loop_phases(kernel: Kernel, loop: HotLoop) -> list[dict]:
    """The hot loop's trip in phases: each copy's address range (first to last hot-loop
    instruction, every instruction between them included) cut before its first ``HGMMA``, after
    its last, and before each ``WARPGROUP.DEPBAR``; the copies' phases summed position by position
    (copies whose cuts differ are refused: their phases are not the same code). Each phase:
    ``label``, ``instructions`` (a copy's, on average), ``share`` of the ranges' samples and
    ``cycles`` per trip (:func:`cycles_per_trip` times that share; None without a ``selected``
    sample) and its ``opcodes``: cycles per trip of its three opcodes holding the most samples."""
    order = sorted(kernel.instructions, key=lambda i: i.address)
    trip = cycles_per_trip(loop)
    copies, start = [], 0
    for size in loop.copies:
        members = loop.instructions[start:start + size]
        start += size
        lo, hi = members[0].address, members[-1].address
        body = [i for i in order if lo <= i.address <= hi]
        mmas = [k for k, i in enumerate(body) if i.opcode.startswith(_MMA)]
        cuts = {0} | {k for k, i in enumerate(body) if i.opcode.startswith(_MMA_WAIT)}
        if mmas:
            cuts |= {mmas[0], mmas[-1] + 1}
        cuts = sorted(c for c in cuts if c < len(body))
        phases = []
        for a, b in zip(cuts, cuts[1:] + [len(body)]):
            first = body[a]
            if mmas and a == mmas[0]:
                label = f"GEMM issue ({sum(1 for k in mmas if a <= k < b)} HGMMA)"
            elif first.opcode.startswith(_MMA_WAIT):
                label = "from " + " ".join(w for w in first.source.split() if not w.startswith("@"))
            elif a == 0:
                label = "loop top"
            else:
                label = "after the issue"
            phases.append((label, body[a:b]))
        copies.append(phases)
    labels = [[label for label, _ in phases] for phases in copies]
    if any(ls != labels[0] for ls in labels):
        raise ValueError(f"{kernel.name}: the hot loop's copies cut into different phases ({labels}); "
                         "read one copy with --loop-count")
    total = sum(i.samples for phases in copies for _, part in phases for i in part)
    out = []
    for n, label in enumerate(labels[0]):
        part = [i for phases in copies for i in phases[n][1]]
        samples = sum(i.samples for i in part)
        share = samples / total if total else 0.0
        by_op = Counter()
        for i in part:
            by_op[i.opcode] += i.samples
        out.append(dict(label=label, instructions=len(part) / len(copies), share=share,
                        cycles=trip * share if trip else None,
                        opcodes={op: (trip * n_ / total if trip and total else None)
                                 for op, n_ in by_op.most_common(3) if n_}))
    return out


def by_opcode(instructions, reason: str) -> dict:
    """Opcode -> its share of ``instructions``' samples of ``reason`` (``unnamed`` allowed), largest
    first."""
    counts = Counter()
    for i in instructions:
        counts[i.opcode] += i.unnamed if reason == "unnamed" else i.reasons.get(reason, 0)
    total = sum(counts.values())
    return {op: n / total for op, n in counts.most_common() if n} if total else {}


def executed_by_family(instructions) -> dict:
    """Opcode family (the opcode's first word, predicate dropped) -> warp instructions executed,
    largest first: the whole kernel's instruction mix, spins and one-off code included."""
    counts = Counter()
    for i in instructions:
        counts[i.opcode.split(".")[0]] += i.executed
    return {family: n for family, n in counts.most_common() if n}


def top_instructions(instructions, n: int):
    return sorted(instructions, key=lambda i: -i.samples)[:n]


def summary(path: str, kernel: str | None = None, loop_count: int | None = None, top: int = 12,
            reasons_by_opcode: tuple = (), phases: bool = False, executed_per: int | None = None) -> dict:
    """One page's reading. ``executed_per``: the units of work (e.g. consumer-warp K/V steps) the
    whole kernel's executed instructions are divided by, family by family (``executed_per_unit``)."""
    if executed_per is not None and executed_per <= 0:
        raise ValueError(f"--executed-per must be a positive number of work units, got {executed_per}")
    k = pick_kernel(read_page(path), kernel)
    loop = hot_loop(k, loop_count)
    known = {r for i in k.instructions for r in i.reasons} | {"unnamed"}
    for r in reasons_by_opcode:
        if r not in known:
            raise ValueError(f"--by-opcode {r!r}: not a stall reason of {path}; expected one of "
                             f"{', '.join(sorted(known))}")
    return dict(
        page=path, kernel=k.name, executed=k.executed, samples=k.samples,
        loop=dict(count=loop.count, copies=list(loop.copies), per_trip=loop.per_trip,
                  samples=sum(i.samples for i in loop.instructions), cycles_per_trip=cycles_per_trip(loop),
                  by_opcode={r: by_opcode(loop.instructions, r) for r in reasons_by_opcode},
                  opcodes_per_trip={op: n / len(loop.copies)
                                    for op, n in Counter(i.opcode for i in loop.instructions).most_common()},
                  phases=loop_phases(k, loop) if phases else None),
        shares=shares(k.instructions), loop_shares=shares(loop.instructions),
        parked=_parked_reading(k),
        executed_per=executed_per,
        executed_per_unit=({f: n / executed_per for f, n in executed_by_family(k.instructions).items()}
                           if executed_per else None),
        top=[dict(address=hex(i.address), source=i.source, executed=i.executed, samples=i.samples,
                  reasons=_top_reasons(i)) for i in top_instructions(k.instructions, top)],
    )


def _parked_reading(k: Kernel) -> dict | None:
    """How many of the kernel's samples sit on parked instructions, and its shares without them."""
    idle = parked(k.instructions)
    if not idle:
        return None
    ids = {id(i) for i in idle}
    return dict(instructions=len(idle), samples=sum(i.samples for i in idle),
                share=sum(i.samples for i in idle) / max(k.samples, 1),
                executed=sum(i.executed for i in idle),
                active_shares=shares([i for i in k.instructions if id(i) not in ids]))


def _top_reasons(i: Instruction, n: int = 3) -> dict:
    reasons = Counter(i.reasons)
    if i.unnamed > 0:
        reasons["unnamed"] = i.unnamed
    return dict(reasons.most_common(n))


def _pct(x) -> str:
    return f"{100 * x:5.1f}%" if x is not None else "     -"


def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def render(summaries: list[dict]) -> str:
    out = []
    for s in summaries:
        lp = s["loop"]
        copies = ", ".join(str(c) for c in lp["copies"])
        out.append(f"{s['page']}\n  kernel {_short(s['kernel'], 70)}: {s['executed']:,} warp instructions "
                   f"executed, {s['samples']:,} samples\n  hot loop: {lp['per_trip']:.1f} instructions per trip "
                   f"({len(lp['copies'])} cop{'y' if len(lp['copies']) == 1 else 'ies'}: {copies}), each executed "
                   f"{lp['count']:,} times; {lp['samples'] / max(s['samples'], 1):.1%} of the samples")
        if lp["cycles_per_trip"]:
            out.append(f"  a warp's cycles per trip (derived: {lp['per_trip']:.1f} instructions / "
                       f"{s['loop_shares']['selected']:.1%} selected): {lp['cycles_per_trip']:.0f}")
        pk = s.get("parked")
        if pk:
            out.append(f"  parked: {pk['share']:.1%} of the kernel's samples on {pk['instructions']} "
                       f"instruction{'s' if pk['instructions'] > 1 else ''} executed {pk['executed']:,} times in all "
                       f"(>= {PARKED_SAMPLES_PER_EXECUTION:g} samples an execution: warps waiting out the launch, "
                       "issuing nothing); 'active' leaves them out")
    # columns: the kernel's shares, without its parked instructions where it has some, the loop's
    keys = [[("kernel", "shares")] + ([("active", "parked")] if s.get("parked") else []) + [("loop", "loop_shares")]
            for s in summaries]
    reasons = []
    for s in summaries:
        for r in list(s["shares"]) + list(s["loop_shares"]):
            if r not in reasons:
                reasons.append(r)

    def share(s, key, r):
        return s["parked"]["active_shares"].get(r) if key == "parked" else s[key].get(r)

    head = ["stall reason"] + [f"{tag} {n + 1}" for n, ks in enumerate(keys) for tag, _ in ks]
    rows = [[r] + [_pct(share(s, key, r)) for s, ks in zip(summaries, keys) for _, key in ks] for r in reasons]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    out.append("")
    out += ["  ".join(x.ljust(w) if c == 0 else x.rjust(w) for c, (x, w) in enumerate(zip(row, widths)))
            for row in [head] + rows]
    if len(summaries) == 2:
        a, b = (s["loop"]["opcodes_per_trip"] for s in summaries)
        diff = sorted((op for op in set(a) | set(b) if abs(a.get(op, 0) - b.get(op, 0)) > 1e-9),
                      key=lambda op: -abs(a.get(op, 0) - b.get(op, 0)))
        out.append(f"\nhot-loop opcodes per trip where the pages differ (page 1 - page 2 = "
                   f"{summaries[0]['loop']['per_trip']:.1f} - {summaries[1]['loop']['per_trip']:.1f}):")
        for op in diff:
            out.append(f"  {op:44s} {a.get(op, 0):6.1f} {b.get(op, 0):6.1f} {a.get(op, 0) - b.get(op, 0):+6.1f}")
    if any(s.get("executed_per_unit") for s in summaries):
        out += _render_executed(summaries)
    if any(s["loop"].get("phases") for s in summaries):
        out += _render_phases(summaries)
    for n, s in enumerate(summaries):
        for reason, split in s["loop"]["by_opcode"].items():
            part = s["loop_shares"].get(reason, 0.0)
            out.append(f"\npage {n + 1}: hot-loop samples of {reason} ({part:.1%} of the loop's) by opcode")
            out += [f"  {op:44s} {share:6.1%} of them, {share * part:6.1%} of the loop's"
                    for op, share in list(split.items())[:8]]
    for n, s in enumerate(summaries):
        if not s["top"]:
            continue
        out.append(f"\npage {n + 1}: the instructions holding the most samples")
        for t in s["top"]:
            why = ", ".join(f"{k} {v}" for k, v in t["reasons"].items()) or "unnamed"
            out.append(f"  {t['address'][-5:]} {t['samples']:8,d} {t['executed']:>12,d}x  {t['source'][:58]:58s} {why}")
    out.append("\nevidence level: profile (sampled warp states of one launch)")
    return "\n".join(out)


def _render_executed(summaries: list[dict]) -> list[str]:
    """The whole kernel's executed instructions by opcode family per unit of work; two pages side
    by side with the difference, largest difference first; families under 0.05 a unit left out."""
    tables = [s["executed_per_unit"] or {} for s in summaries]
    units = " / ".join(f"{s['executed_per']:,}" for s in summaries)
    out = [f"\nexecuted warp instructions by opcode family, the whole kernel per unit of work ({units} units; "
           "spins, producer, prologue and epilogue included):"]
    families = [f for f in dict.fromkeys(f for t in tables for f in t) if max(t.get(f, 0.0) for t in tables) >= 0.05]
    if len(tables) == 2:
        a, b = tables
        out.append(f"  {'family':14s} {'page 1':>9s} {'page 2':>9s} {'1 - 2':>8s}")
        out.append(f"  {'all':14s} {sum(a.values()):9.1f} {sum(b.values()):9.1f} "
                   f"{sum(a.values()) - sum(b.values()):+8.1f}")
        for f in sorted(families, key=lambda f: (-abs(a.get(f, 0.0) - b.get(f, 0.0)), f)):
            out.append(f"  {f:14s} {a.get(f, 0.0):9.1f} {b.get(f, 0.0):9.1f} {a.get(f, 0.0) - b.get(f, 0.0):+8.1f}")
        return out
    (t,) = tables
    out.append(f"  {'all':14s} {sum(t.values()):9.1f}")
    out += [f"  {f:14s} {t[f]:9.1f}" for f in families]
    return out


def _render_phases(summaries: list[dict]) -> list[str]:
    """The phases of each page's trip; two pages cut into the same number of phases side by side,
    with the difference in cycles."""
    out = []
    tables = [s["loop"]["phases"] for s in summaries]
    if len(tables) == 2 and all(tables) and len(tables[0]) == len(tables[1]):
        out.append("\nthe trip in phases (cycles per trip, derived: the trip's cycles x the phase's share of its "
                   "samples; instructions a copy):")
        out.append(f"  {'phase (page 1 / page 2)':52s} {'page 1':>14s} {'page 2':>14s} {'1 - 2':>7s}")
        for a, b in zip(*tables):
            label = a["label"] if a["label"] == b["label"] else f"{a['label']} / {b['label']}"
            out.append(f"  {label[:52]:52s} {_cycles(a):>14s} {_cycles(b):>14s} "
                       f"{(a['cycles'] or 0) - (b['cycles'] or 0):+7.0f}")
        out.append(f"  {'whole trip':52s} {sum(p['cycles'] or 0 for p in tables[0]):>9.0f}      "
                   f"{sum(p['cycles'] or 0 for p in tables[1]):>9.0f}")
        for n, table in enumerate(tables):
            out.append(f"page {n + 1}: each phase's opcodes holding the most samples (cycles per trip)")
            out += [f"  {p['label'][:40]:40s} " + ", ".join(f"{op} {c:.0f}" for op, c in p["opcodes"].items() if c)
                    for p in table]
        return out
    for n, table in enumerate(tables):
        if not table:
            continue
        out.append(f"\npage {n + 1}: the trip in phases (cycles per trip, derived; instructions a copy)")
        for p in table:
            ops = ", ".join(f"{op} {c:.0f}" for op, c in p["opcodes"].items() if c)
            out.append(f"  {p['label'][:52]:52s} {_cycles(p):>14s}   {ops}")
    return out


def _cycles(phase: dict) -> str:
    cycles = f"{phase['cycles']:.0f}" if phase["cycles"] is not None else "-"
    return f"{cycles} ({phase['instructions']:.0f})"


def register(sub) -> None:
    p = sub.add_parser("stalls", help="read ncu source pages: stall reasons over the kernel and its hot loop, "
                       "the instructions holding the most samples, two pages side by side")
    p.add_argument("pages", nargs="+", metavar="PAGE",
                   help="`ncu -i rep --page source --csv --print-source sass` output (.csv or .csv.gz); one or two")
    p.add_argument("--kernel", default=None, help="regex on the kernel name (default: the kernel with most samples)")
    p.add_argument("--loop-count", type=int, default=None, action="append",
                   help="the hot loop's execution count per instruction (once per page; default: found)")
    p.add_argument("--top", type=int, default=12, help="instructions listed by samples (default 12)")
    p.add_argument("--by-opcode", default=[], action="append", metavar="REASON",
                   help="split the hot loop's samples of this stall reason by opcode (repeatable; e.g. wait)")
    p.add_argument("--phases", action="store_true",
                   help="cut the hot loop's trip at its HGMMA issue and WARPGROUP.DEPBAR waits and price each phase "
                        "in cycles per trip (derived from its share of the samples)")
    p.add_argument("--executed-per", type=int, default=None, metavar="UNITS",
                   help="also count every instruction the kernel executed (spins, producer, prologue included) by "
                        "opcode family, divided by UNITS units of work: e.g. consumer-warp K/V steps, the same for "
                        "two kernels that ran one problem on one tile")
    p.add_argument("--json", default=None, help="also write the summaries to this file")
    p.set_defaults(func=run)


def run(args) -> int:
    if len(args.pages) > 2:
        print(f"flashrung stalls: one or two pages, got {len(args.pages)}", file=sys.stderr)
        return 2
    counts = args.loop_count or [None] * len(args.pages)
    if len(counts) != len(args.pages):
        print("flashrung stalls: --loop-count once per page, or not at all", file=sys.stderr)
        return 2
    try:
        summaries = [summary(p, args.kernel, c, args.top, tuple(args.by_opcode), args.phases, args.executed_per)
                     for p, c in zip(args.pages, counts)]
    except (OSError, ValueError) as exc:
        print(f"flashrung stalls: {exc}", file=sys.stderr)
        return 2
    print(render(summaries))
    if args.json:
        jsonfile.write(summaries, args.json)
    return 0
