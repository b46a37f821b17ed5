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
"""
from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import re
import sys
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
_REASON = re.compile(r"^stall_(\w+)$")          # the all-samples columns; "(Not Issued)" ones excluded
# runs of loop instructions are one copy when at most this many instructions of other counts lie
# between them: a branch-skipped block inside the body (d256's per-warp O rescale is ~130), where
# the next partition's copy of the loop starts thousands of instructions away
MAX_GAP_INSTRUCTIONS = 512


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


def by_opcode(instructions, reason: str) -> dict:
    """Opcode -> its share of ``instructions``' samples of ``reason`` (``unnamed`` allowed), largest
    first."""
    counts = Counter()
    for i in instructions:
        counts[i.opcode] += i.unnamed if reason == "unnamed" else i.reasons.get(reason, 0)
    total = sum(counts.values())
    return {op: n / total for op, n in counts.most_common() if n} if total else {}


def top_instructions(instructions, n: int):
    return sorted(instructions, key=lambda i: -i.samples)[:n]


def summary(path: str, kernel: str | None = None, loop_count: int | None = None, top: int = 12,
            reasons_by_opcode: tuple = ()) -> dict:
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
                                    for op, n in Counter(i.opcode for i in loop.instructions).most_common()}),
        shares=shares(k.instructions), loop_shares=shares(loop.instructions),
        top=[dict(address=hex(i.address), source=i.source, executed=i.executed, samples=i.samples,
                  reasons=_top_reasons(i)) for i in top_instructions(k.instructions, top)],
    )


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
    reasons = []
    for s in summaries:
        for r in list(s["shares"]) + list(s["loop_shares"]):
            if r not in reasons:
                reasons.append(r)
    head = ["stall reason"] + [f"{tag} {n + 1}" for n in range(len(summaries)) for tag in ("kernel", "loop")]
    rows = [[r] + [_pct(s[key].get(r)) for s in summaries for key in ("shares", "loop_shares")] for r in reasons]
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
        summaries = [summary(p, args.kernel, c, args.top, tuple(args.by_opcode)) for p, c in zip(args.pages, counts)]
    except (OSError, ValueError) as exc:
        print(f"flashrung stalls: {exc}", file=sys.stderr)
        return 2
    print(render(summaries))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summaries, f, indent=1)
    return 0
