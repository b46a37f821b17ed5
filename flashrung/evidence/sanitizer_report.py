"""Reading ``compute-sanitizer``'s logs of the warp-specialization probes (:mod:`ws_probe`).

``racecheck`` reports one hazard per launch of ``hopper.fwd`` that is not the kernel's: a read at
the kernel's ``def`` line against writes at that line and at its ``gl.warp_specialize`` call — the
shared-memory bytes of Triton's own partition dispatch (the ``hopper-shaped`` probe reproduces them
without any of ``hopper.fwd``'s code; ``tests/test_ws_probe.py`` pins the dispatch in the SASS).
Thirty-six schedules under three tools make a log no one should have to read line by line to see
whether anything else is in it. This module splits a log into its sanitizer runs and, for each,
counts the probe's outputs (right or wrong), the race reports that are the dispatch and those that
are not, and the errors the summary counts; a run is clean when its outputs are right, its races
are all the dispatch and its summary counts nothing else.

``python -m flashrung.evidence.sanitizer_report LOG [LOG ...]`` prints one row a run and exits 0
only if every run is clean (1 otherwise, 2 for a log it cannot read). The dispatch lines default to
those of the ``hopper.fwd`` source installed here; a log of another commit names its own with
``--dispatch-lines fwd.py:2055,fwd.py:2248`` (or ``--dispatch-source`` with that commit's ``fwd.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence

RUN_START = "========= COMPUTE-SANITIZER"
_ACCESS = r"(Read|Write) access at (\S+?)\+0x[0-9a-f]+ in ([^\s:]+):(\d+)"
RACE = re.compile(r"^=========\s+Error: Race reported between " + _ACCESS)
RACE_PEER = re.compile(r"^=========\s+and " + _ACCESS + r"(?: \[(\d+) hazards?\])?")
ERROR_SUMMARY = re.compile(r"^========= ERROR SUMMARY: (\d+) errors?")
RACECHECK_SUMMARY = re.compile(r"^========= RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
SCHEDULE_LINE = re.compile(r"'s schedule .*: max \|err\| \S+ (ok|WRONG)$")
PROBE_VERDICT = re.compile(r"^ws_probe (\S+).*: (output correct|OUTPUT WRONG)$")
KERNEL_NAME = "_attn_fwd_kernel"


@dataclasses.dataclass(frozen=True)
class Race:
    read: tuple[str, int]                  # (file name, line) of the access the report opens with
    writes: tuple[tuple[str, int], ...]    # the accesses it races with
    kernel: str


@dataclasses.dataclass
class Run:
    """One sanitizer run of a log (from its ``COMPUTE-SANITIZER`` banner to its summary)."""
    index: int
    tool: str = "?"                        # racecheck from its summary; else the log's name says
    outputs_ok: int = 0
    outputs_wrong: int = 0
    probe_verdict: str | None = None
    races: list = dataclasses.field(default_factory=list)
    summary_errors: int | None = None      # None: the run has no summary (cut short)
    summary_warnings: int = 0

    def classify(self, dispatch_lines: set) -> tuple[int, int]:
        """``(dispatch races, other races)`` under ``dispatch_lines`` (a set of ``(file, line)``)."""
        dispatch = sum(1 for race in self.races if is_dispatch(race, dispatch_lines))
        return dispatch, len(self.races) - dispatch

    def problems(self, dispatch_lines: set) -> list[str]:
        """What keeps the run from being clean; empty when it is."""
        out = []
        if self.summary_errors is None:
            out.append("no summary (the run was cut short)")
        if self.outputs_wrong:
            out.append(f"{self.outputs_wrong} schedule(s)' output wrong")
        elif self.probe_verdict == "OUTPUT WRONG":
            out.append("the probe's output wrong")
        if self.probe_verdict is None:
            out.append("no probe verdict")
        _, other = self.classify(dispatch_lines)
        if other:
            out.append(f"{other} race(s) not the dispatch's")
        if self.summary_errors is not None and self.summary_errors != len(self.races):
            out.append(f"summary counts {self.summary_errors} error(s) against {len(self.races)} race report(s)")
        if self.summary_warnings:
            out.append(f"{self.summary_warnings} racecheck warning(s)")
        return out


def is_dispatch(race: Race, dispatch_lines: set) -> bool:
    """A race of ``hopper.fwd``'s kernel whose read is at its ``def`` line and whose every other
    access is at the ``def`` line or a ``gl.warp_specialize`` call (``dispatch_lines``)."""
    return (race.kernel == KERNEL_NAME and race.read in dispatch_lines and bool(race.writes)
            and all(write in dispatch_lines for write in race.writes))


def dispatch_lines_of(source: str, file_name: str = "fwd.py") -> set:
    """``{(file_name, line)}`` of ``KERNEL_NAME``'s ``def``, of each ``gl.warp_specialize(`` call
    inside it and of the ``if`` / ``elif`` / ``else`` line that selects the call, read from the
    kernel's source text."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"def {KERNEL_NAME}(")), None)
    if start is None:
        raise ValueError(f"no 'def {KERNEL_NAME}(' in the source")
    out = {(file_name, start + 1)}
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line and not line[0].isspace() and not line.startswith(")"):
            break                                            # the next top-level statement
        if "gl.warp_specialize(" in line:
            out.add((file_name, i + 1))
            # the branch that picks this call (``if NUM_CONSUMERS == 1:``): the line the dispatch's
            # writes are charged to in the logs of 2ec74a4, e47490b and 16b0ae2
            j = i - 1
            while j > start and (not lines[j].strip() or lines[j].strip().startswith("#")):
                j -= 1
            header = lines[j].strip()
            if header.endswith(":") and header.split()[0] in ("if", "elif", "else:", "else"):
                out.add((file_name, j + 1))
    if len(out) < 2:
        raise ValueError(f"no gl.warp_specialize call in {KERNEL_NAME}")
    return out


def installed_dispatch_lines() -> set:
    """The dispatch lines of the ``hopper.fwd`` source installed here (logs of this commit)."""
    from flashrung.kernels.hopper import fwd

    path = Path(fwd.__file__)
    return dispatch_lines_of(path.read_text(), path.name)


def parse_dispatch_lines(spec: str) -> set:
    """``"fwd.py:2055,fwd.py:2248"`` → ``{("fwd.py", 2055), ("fwd.py", 2248)}``."""
    out = set()
    for part in spec.split(","):
        name, _, line = part.strip().rpartition(":")
        if not name or not line.isdigit():
            raise ValueError(f"--dispatch-lines takes FILE:LINE[,FILE:LINE...], got {spec!r}")
        out.add((name, int(line)))
    return out


def parse(text: str, tool_hint: str = "?") -> list[Run]:
    """The sanitizer runs of a log, in order. ``tool_hint``: the tool of runs whose summary does not
    name it (synccheck's and memcheck's read alike)."""
    runs: list[Run] = []
    run: Run | None = None
    pending: tuple | None = None           # a race report whose peer accesses are being read
    for line in text.splitlines():
        if line.startswith(RUN_START):
            run = Run(index=len(runs) + 1, tool=tool_hint)
            runs.append(run)
            continue
        if run is None:
            continue
        if pending is not None:
            peer = RACE_PEER.match(line)
            if peer:
                pending[1].append((peer.group(3), int(peer.group(4))))
                continue
            run.races.append(Race(read=pending[0], writes=tuple(pending[1]), kernel=pending[2]))
            pending = None
        race = RACE.match(line)
        if race:
            pending = ((race.group(3), int(race.group(4))), [], race.group(2))
            continue
        match = SCHEDULE_LINE.search(line)
        if match:
            if match.group(1) == "ok":
                run.outputs_ok += 1
            else:
                run.outputs_wrong += 1
            continue
        match = PROBE_VERDICT.match(line)
        if match:
            run.probe_verdict = match.group(2)
            continue
        match = RACECHECK_SUMMARY.match(line)
        if match:
            run.tool, run.summary_errors, run.summary_warnings = "racecheck", int(match.group(2)), int(match.group(3))
            continue
        match = ERROR_SUMMARY.match(line)
        if match:
            run.summary_errors = int(match.group(1))
    if pending is not None and run is not None:
        run.races.append(Race(read=pending[0], writes=tuple(pending[1]), kernel=pending[2]))
    return runs


def tool_of(name: str) -> str:
    """The tool a log's file name names, or '?'."""
    return next((tool for tool in ("racecheck", "synccheck", "memcheck", "initcheck") if tool in name), "?")


def report(logs: Sequence[tuple[str, str]], dispatch_lines: set) -> dict:
    """``{"runs": [...], "clean": bool}`` for ``logs`` as ``(name, text)`` pairs."""
    rows = []
    for name, text in logs:
        runs = parse(text, tool_of(name))
        if not runs:
            rows.append({"log": name, "run": 0, "tool": tool_of(name), "problems": ["no sanitizer run in the log"]})
        for run in runs:
            dispatch, other = run.classify(dispatch_lines)
            rows.append({"log": name, "run": run.index, "tool": run.tool, "outputs_ok": run.outputs_ok,
                         "outputs_wrong": run.outputs_wrong, "races_dispatch": dispatch, "races_other": other,
                         "summary_errors": run.summary_errors, "problems": run.problems(dispatch_lines),
                         "other_races": [dataclasses.asdict(r) for r in run.races
                                         if not is_dispatch(r, dispatch_lines)]})
    return {"runs": rows, "clean": bool(rows) and not any(row["problems"] for row in rows),
            "dispatch_lines": sorted(f"{name}:{line}" for name, line in dispatch_lines)}


def format_report(result: dict) -> str:
    header = f"{'log':<44} {'run':>3}  {'tool':<9} {'outputs':>9}  {'races: dispatch':>15} {'other':>5}  verdict"
    lines = [header, "-" * len(header)]
    for row in result["runs"]:
        outputs = f"{row.get('outputs_ok', 0)} ok" + (f", {row['outputs_wrong']} wrong" if row.get("outputs_wrong") else "")
        verdict = "clean" if not row["problems"] else "; ".join(row["problems"])
        lines.append(f"{Path(row['log']).name[-44:]:<44} {row['run']:>3}  {row['tool']:<9} {outputs:>9}  "
                     f"{row.get('races_dispatch', 0):>15} {row.get('races_other', 0):>5}  {verdict}")
        for race in row.get("other_races", []):
            writes = ", ".join(f"{f}:{n}" for f, n in race["writes"])
            lines.append(f"    race in {race['kernel']}: read at {race['read'][0]}:{race['read'][1]} against {writes}")
    runs = len(result["runs"])
    lines.append(f"dispatch lines: {', '.join(result['dispatch_lines'])}")
    lines.append(f"{runs} sanitizer run(s): " + ("all clean (every race the warp-specialization dispatch's)"
                                                  if result["clean"] else "NOT CLEAN"))
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path, help="compute-sanitizer logs of ws_probe runs")
    parser.add_argument("--dispatch-lines", default=None, metavar="FILE:LINE,...",
                        help="the kernel's def and warp_specialize lines of the logged commit "
                             "(default: those of the installed hopper.fwd)")
    parser.add_argument("--dispatch-source", type=Path, default=None, metavar="FWD_PY",
                        help="read the dispatch lines from this copy of the logged commit's fwd.py")
    parser.add_argument("--json", type=Path, default=None, help="write the reading as JSON too")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.dispatch_lines and args.dispatch_source:
        parser.error("give --dispatch-lines or --dispatch-source, not both")
    try:
        if args.dispatch_lines:
            lines = parse_dispatch_lines(args.dispatch_lines)
        elif args.dispatch_source:
            lines = dispatch_lines_of(args.dispatch_source.read_text(), args.dispatch_source.name)
        else:
            lines = installed_dispatch_lines()
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    logs = []
    for path in args.logs:
        try:
            logs.append((str(path), path.read_text(errors="replace")))
        except OSError as exc:
            print(f"sanitizer_report: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    result = report(logs, lines)
    print(format_report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if result["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
