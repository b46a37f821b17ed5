"""``flashrung profile``: one launch of one implementation under ``ncu --set full``.

The child process builds the row's inputs, calls the implementation three times (compile, load,
warm-up: ``flashrung.bench.peers.prepare`` makes the first call), then once more between
``torch.cuda.profiler.start()`` and ``stop()``; ``ncu --profile-from-start off`` profiles that
call's kernels only, with ``--clock-control none`` so the GPU runs at the clock it chooses, as in
every timing here. From the report it writes the details page (``STEM.txt``) and the
per-SASS-instruction source page (``STEM-sass.csv.gz``), then prints the details' headline
metrics and :mod:`flashrung.evidence.stalls`' summary of the page. Evidence level: profile.

    flashrung profile flashrung:hopper.fwd --headdim 128 --seqlen 16384 --batch 2 --no-causal --out DIR
    flashrung profile fa4 --headdim 128 --seqlen 16384 --batch 2 --no-causal --out DIR
    flashrung stalls DIR/ncu-flashrung-hopper.fwd-...-sass.csv.gz DIR/ncu-fa4-...-sass.csv.gz
"""
from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys

from flashrung.bench import suites
from flashrung.evidence import stalls

WARM_CALLS = 3            # compile and load, then two more: the profiled call finds everything warm
NCU_TIMEOUT_S = 900       # one --set full launch replays the kernel ~40 times; long rows take minutes
# the details page's lines quoted after a run (name as ncu prints it, unit included)
HEADLINE = ("Duration", "SM Frequency", "Elapsed Cycles", "Executed Ipc Active", "Issue Slots Busy",
            "Executed Instructions", "Registers Per Thread", "Achieved Active Warps Per SM", "L2 Hit Rate")
_HEADLINE_LINE = re.compile(r"^\s{4}(" + "|".join(map(re.escape, HEADLINE)) + r")\s{2,}(\S+)\s+(\S+)\s*$")
_PIPELINE = re.compile(r"(\w+) is the highest-utilized pipeline \(([\d.]+)%\)")
# what one run writes next to its stem (output_stem): ncu's report, the details page, the source page
REPORT, DETAILS, SOURCE = ".ncu-rep", ".txt", "-sass.csv.gz"


def output_stem(impl: str, row: suites.Row) -> str:
    """A file name for the row: ``ncu-<impl>-d128-full-b2-h16-s16384`` (+ ``-sk``, ``-kv``, ``-dv``,
    ``-win``, ``-cap``, ``-packed``, dtype, mode): two rows that differ in any field get two stems, so
    a windowed profile never overwrites the plain one beside it."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", impl).strip("-")
    parts = [f"ncu-{name}", f"d{row.headdim}", "causal" if row.causal else "full"]
    if row.packed is not None:
        # the pack's own text (runs as LxN); long packs keep their count and longest sequence
        text = suites.packed_text(row.packed)
        parts.append("packed-" + (text.replace(",", "_") if len(text) <= 40 else
                                  f"n{len(row.packed)}-max{max(row.packed)}-sum{sum(row.packed)}"))
    else:
        parts.append(f"b{row.batch}")
    parts += [f"h{row.heads_q}", f"s{row.seqlen_q}"]
    if row.seqlen_k != row.seqlen_q:
        parts.append(f"sk{row.seqlen_k}")
    if row.heads_kv != row.heads_q:
        parts.append(f"kv{row.heads_kv}")
    if row.dv != row.headdim:
        parts.append(f"dv{row.dv}")
    if row.window is not None:
        parts.append(f"win{row.window[0]}_{row.window[1]}".replace("-1", "inf"))
    if row.softcap:
        parts.append(f"cap{row.softcap:g}")
    if row.dtype != "bfloat16":
        parts.append(row.dtype)
    if row.mode != "fwd":
        parts.append(row.mode)
    return "-".join(parts)


def shape_argv(row: suites.Row) -> list[str]:
    """The shape flags that rebuild ``row`` in the child (``flashrung.bench.cli.pair_row``): every
    field of the row, so the profiled launch is the one the command names (a window, a cap, v's
    head dim or a pack dropped here would profile another problem under this one's name)."""
    if row.packed is not None:
        argv = ["--packed", suites.packed_text(row.packed)]
    else:
        argv = ["--batch", str(row.batch), "--seqlen", str(row.seqlen_q), "--seqlen-k", str(row.seqlen_k)]
    argv += ["--heads", str(row.heads_q), "--kv-heads", str(row.heads_kv), "--headdim", str(row.headdim),
             "--dtype", row.dtype, "--causal" if row.causal else "--no-causal", "--mode", row.mode]
    if row.dv != row.headdim:
        argv += ["--headdim-v", str(row.dv)]
    if row.window is not None:
        # one token: argparse would read "-1,128" after a space as a flag of its own
        argv.append(f"--window={row.window[0]},{row.window[1]}")
    if row.softcap:
        argv += ["--softcap", repr(float(row.softcap))]
    return argv


def commands(ncu: str, impl: str, row: suites.Row, stem: str) -> list[dict]:
    """The three ``ncu`` invocations: profile, details page, source page (``stdout``: where it goes)."""
    return [
        dict(argv=[ncu, "--clock-control", "none", "--profile-from-start", "off", "--set", "full", "-f",
                   "-o", stem, sys.executable, "-m", "flashrung.evidence.profile", "--target", impl]
             + shape_argv(row), stdout=None),
        dict(argv=[ncu, "-i", stem + REPORT, "--page", "details"], stdout=stem + DETAILS),
        dict(argv=[ncu, "-i", stem + REPORT, "--page", "source", "--csv", "--print-source", "sass"],
             stdout=stem + SOURCE),
    ]


def headline(details: str) -> list[tuple[str, str, str]]:
    """(metric, unit, value) of the :data:`HEADLINE` lines of a details page, each kernel in turn,
    and the pipeline ncu names the highest-utilized."""
    out = []
    for line in details.splitlines():
        if line.startswith("  ") and not line.startswith("    ") and "(" in line:
            out.append(("kernel", "", line.strip().split(" ")[0][:80]))
        m = _HEADLINE_LINE.match(line)
        if m:
            out.append((m.group(1), m.group(2), m.group(3)))
        p = _PIPELINE.search(line)
        if p:
            out.append(("highest-utilized pipeline", "%", f"{p.group(1)} {p.group(2)}"))
    return out


def _child(argv: list[str]) -> int:
    """The profiled process: WARM_CALLS calls, then one between profiler start and stop."""
    from flashrung.bench import cli as bench_cli
    from flashrung.bench import peers

    p = argparse.ArgumentParser(prog="flashrung.evidence.profile")
    p.add_argument("--target", required=True, type=bench_cli._impl)
    bench_cli._shape_flags(p, many=False)
    args = p.parse_args(argv)
    row = bench_cli.pair_row(args)
    import torch

    inputs = peers.make_inputs(row)
    try:
        prepared = peers.prepare(args.target, row, inputs)    # the first call
    except peers.Unsupported as exc:
        print(f"flashrung profile: {args.target} does not run this row: {exc.reason}", file=sys.stderr)
        return 2
    for _ in range(WARM_CALLS - 1):
        prepared.fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    prepared.fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled one call of {args.target} ({prepared.note or 'no note'})", file=sys.stderr)
    return 0


def register(sub) -> None:
    from flashrung.bench import cli as bench_cli

    p = sub.add_parser("profile", help="one launch of an implementation under ncu --set full: details page, "
                       "per-instruction source page and its stall summary (needs a GPU and ncu)")
    p.add_argument("impl", type=bench_cli._impl,
                   help="what to profile: a peer (cudnn, fa4, flex, ...), flashrung or flashrung:<kernel>[@k=v]")
    bench_cli._shape_flags(p, many=False)
    p.add_argument("--out", default=".", help="directory for STEM.txt and STEM-sass.csv.gz (default: here)")
    p.add_argument("--ncu", default=None, help="the ncu executable (default: ncu on PATH)")
    p.add_argument("--keep-report", action="store_true", help="keep the .ncu-rep report as well")
    p.add_argument("--dry-run", action="store_true", help="print the ncu commands and stop")
    p.set_defaults(func=run)


def run(args) -> int:
    from flashrung.bench import cli as bench_cli

    try:
        row = bench_cli.pair_row(args)
    except ValueError as exc:
        print(f"flashrung profile: {exc}", file=sys.stderr)
        return 2
    named = args.ncu or "ncu"
    ncu = shutil.which(named) or named
    stem = os.path.join(args.out, output_stem(args.impl, row))
    steps = commands(ncu, args.impl, row, stem)
    if args.dry_run:
        for step in steps:
            out = step["stdout"]
            # the source page is compressed as it is written: a shell needs gzip in the pipe
            redirect = (f" | gzip > {out}" if out.endswith(".gz") else f" > {out}") if out else ""
            print(" ".join(step["argv"]) + redirect)
        return 0
    ok, what = bench_cli.gpu_available()
    if not ok:
        print(f"flashrung profile: needs a GPU: {what} (--dry-run prints the ncu commands)", file=sys.stderr)
        return 2
    if shutil.which(ncu) is None:
        print(f"flashrung profile: no ncu executable at {named!r}: put Nsight Compute's ncu on PATH or pass --ncu",
              file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    profiled = subprocess.run(steps[0]["argv"], capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
    if profiled.returncode != 0:
        tail = (profiled.stdout + profiled.stderr)[-3000:]
        print(f"flashrung profile: ncu exited {profiled.returncode}:\n{tail}", file=sys.stderr)
        return 1
    for step in steps[1:]:
        page = subprocess.run(step["argv"], capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
        if page.returncode != 0:
            print(f"flashrung profile: {' '.join(step['argv'][:6])} exited {page.returncode}: {page.stderr[-1000:]}",
                  file=sys.stderr)
            return 1
        opener = gzip.open if step["stdout"].endswith(".gz") else open
        with opener(step["stdout"], "wt") as f:
            f.write(page.stdout)
    if not args.keep_report:
        os.remove(stem + REPORT)
    with open(stem + DETAILS) as f:
        for metric, unit, value in headline(f.read()):
            print(f"  {metric:32s} {unit:12s} {value}" if metric != "kernel" else f"kernel {value}")
    print()
    print(stalls.render([stalls.summary(stem + SOURCE)]))
    print(f"\nwrote {stem + DETAILS} and {stem + SOURCE}")
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
