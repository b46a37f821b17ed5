"""``flashrung ladder``: the ladder's table — the census without a GPU, the climb on one.

Three modes, one command:

- **census** (no GPU, or ``--census``): every rung's registered census configurations compiled
  ahead of time for ``--arch`` (sm_90a, sm_80, sm_120) and read back from the SASS — registers,
  shared memory, spills and the instruction families each lever changes (HMMA, LDSM, LDGSTS,
  MUFU.EX2, FFMA) — with the architecture's shared-memory budget per block (sm_120, the seed's
  card: 99 KB). Evidence level: SASS (which instructions exist, not how fast they run).
- **climb** (a GPU): the seed's two frozen configurations (``--config a|b|both``). Ceilings
  first, once per dtype: the cuBLAS GEMM (``torch.mm``) and the mma.sync GEMM
  (:mod:`flashrung.kernels.ladder.ceiling`, its best tile), timed interleaved and preheated as the
  rungs are, so both sides of "% of the ceiling" run at the clock they set. Then per configuration every rung
  through the public entry point (``flashrung.attention(..., impl="ladder.vN")``, prepared as
  ``flashrung bench`` prepares it), timed round-robin with CUDA events (the bench's interleaved
  protocol, each block preheated by its own calls, median per call; the rounds in ladder order and then
  reversed, or with ``--order balanced`` in the bench's carryover-balanced design), and each rung's paired
  margin over its parent with the AB/BA
  runner ``flashrung compare`` uses — here in one process, sized to a time budget; the keep
  verdict (two fresh processes, the A/A threshold) stays with ``flashrung compare``, whose
  command line the table prints. Last, the correctness gate of every rung at a reduced size of
  the same dtype, mask and head dim. Table, ``--json`` (rows and the run manifest),
  ``--plot`` (the climb).
- **profile** (``--profile``, a GPU and ``ncu``): each rung once under
  ``ncu --clock-control none`` in a child process at B1 H16 S4096 d128 bf16 causal, or at config
  A or B itself with ``--config a|b``: tensor-pipe activity, shared-memory bank conflicts and
  wavefronts per ldmatrix, long-scoreboard / barrier / MIO stall shares, achieved occupancy, SM
  active share, L2 hit rate and traffic, HBM reads. Evidence level: profile.
- **readings** (``--processes N``, a GPU): the climb N times, each in a fresh process, and per
  rung and configuration the median and range of its TFLOP/s, of its share of the mma.sync
  ceiling (timed in that process's rounds) and of its in-process margin, with how many readings
  reach the ladder's target (``TARGET_MMA_SYNC_PERCENT``). One process's share moves with its
  own ceiling reading (on the H200 the in-round mma.sync ceiling has moved 366–379 TFLOP/s between
  processes), so a share near the target is read over several processes, not one.

``python -m flashrung.kernels.ladder.cli --profile-target ladder.vN ...`` is the child the
profiler launches: it runs one rung twice at the profile shape and nothing else.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

from flashrung.bench import numerators, report, stats, suites, timing
from flashrung.kernels import ladder
from flashrung.kernels.ladder.evidence import ARCHES, key_loops
from flashrung import jsonfile

DEFAULT_ARCH = "sm_90a"
SEED_CARD_ARCH = "sm_120"     # the seed's RTX 5090: its 99 KB budget set the seed's occupancy cliffs

# Seed 000's two frozen configurations, as the bench defines them (one source of truth):
# A = B2 H16 S2048 d128 fp16 non-causal (the frozen core), B = B1 H16 S32768 d128 bf16 causal.
CONFIGS: dict[str, suites.Row] = dict(zip("AB", suites.seed_frozen()))
CONFIG_CHOICES = ("a", "b", "both")

# v0 is CUDA-core FMA: at config B one call is the whole 32k causal problem at FMA speed, which
# alone would take most of the run's time budget; the seed timed v0 at its frozen config only.
SKIPS = {("ladder.v0", "B"): "CUDA-core FMA at S=32768 is too slow for this table; the seed timed v0 "
                             "at its frozen config (A) only"}

# The gate's oracle materialises Sq x Sk scores: run it at a reduced length. 1008 is not a
# multiple of the 64-key block (the last block is masked) but is a multiple of 16, the
# divisibility Triton specialises integer arguments on, so the gate runs the binary that was timed.
GATE_SEQLEN = 1008
GATE_MAX_BATCH = 2

# Seed 000's target for the ladder's top rung at config B: this share of the mma.sync ceiling,
# each kernel timed at the clock it sustains
TARGET_MMA_SYNC_PERCENT = 90.0
MAX_PROCESSES = 20            # --processes: each process is a whole climb (about a minute at two rungs)

GEMM_SIZE = 8192              # M = N = K of both GEMM ceilings
GEMM_MAX_REL_ERR = 1e-2       # a tile whose GEMM is wrong cannot be a ceiling


@dataclasses.dataclass(frozen=True)
class LadderProtocol:
    """How the climb is timed. ``rates`` is the bench's interleaved protocol (the per-rung
    median); each margin is one paired AB/BA run whose alternations fill ``pair_budget_s`` of
    kernel time, within [min_alternations, max_alternations] (max: seed 000's 120)."""

    # the rungs keep one fixed order and its reverse by default: a balanced design needs a round
    # per rung (two dozen), four times the climb's rounds (``--order balanced`` runs it, to read the
    # halves schedule's position bias on the rates); each margin is its own paired AB/BA run
    rates: timing.BenchProtocol = timing.BenchProtocol(order="halves")
    paired_reps: int = 5               # timed calls per arm per alternation (block = their median)
    paired_block_warmup: int = 1       # untimed calls before each block
    pair_budget_s: float = 8.0         # kernel time per rung-vs-parent margin
    min_alternations: int = 10         # even: half AB, half BA
    max_alternations: int = 120

    def alternations_for(self, baseline_ms: float, candidate_ms: float) -> int:
        per_alternation = (self.paired_reps + self.paired_block_warmup) * (baseline_ms + candidate_ms)
        n = int(self.pair_budget_s * 1e3 // per_alternation) if per_alternation > 0 else self.max_alternations
        n = max(self.min_alternations, min(self.max_alternations, n))
        return n - n % 2

    def paired(self, baseline_ms: float, candidate_ms: float) -> timing.PairedProtocol:
        # Both arms are warm from the rate measurement: no extra warm-up calls.
        return timing.PairedProtocol(alternations=self.alternations_for(baseline_ms, candidate_ms),
                                     reps=self.paired_reps, block_warmup=self.paired_block_warmup,
                                     warmup_calls=0)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "rates": self.rates.to_json()}


DEFAULT_PROTOCOL = LadderProtocol()
QUICK_PROTOCOL = LadderProtocol(rates=dataclasses.replace(timing.QUICK_BENCH, order="halves"), paired_reps=3,
                                pair_budget_s=2.0, max_alternations=40)

TIMING_TEXT = ("CUDA events between back-to-back calls, median per call; rungs interleaved round-robin "
               "(first half of the rounds in ladder order, second half reversed)")
BALANCED_TIMING_TEXT = ("CUDA events between back-to-back calls, median per call; rungs interleaved round-robin "
                        "in a carryover-balanced order of the rounds (every rung in every position and right "
                        "after every other equally often)")
MARGIN_TEXT = ("t_parent / t_rung per alternation, median [p10, p90]; one paired interleaved run in this "
               "process, AB then BA halves; not a keep verdict (that is `flashrung compare`: two fresh "
               "processes against the A/A threshold)")


def protocol_for(args) -> LadderProtocol:
    """The climb's protocol: the default or ``--quick``'s, its rates in ``--order`` if given."""
    protocol = QUICK_PROTOCOL if args.quick else DEFAULT_PROTOCOL
    order = getattr(args, "order", None)
    if order and order != protocol.rates.order:
        protocol = dataclasses.replace(protocol, rates=dataclasses.replace(protocol.rates, order=order))
    return protocol


def timing_text(protocol: LadderProtocol) -> str:
    return BALANCED_TIMING_TEXT if protocol.rates.order == "balanced" else TIMING_TEXT


# ----------------------------------------------------------------------------------------------
# Arguments


def _only(text: str) -> tuple[str, ...]:
    """``"v3,v4"`` -> ``("ladder.v3", "ladder.v4")`` in ladder order."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated rung names, e.g. --only v3,v4")
    known = [r.name.split(".")[1] for r in ladder.RUNGS]
    chosen = set()
    for name in names:
        try:
            chosen.add(ladder.rung(name).name)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"unknown rung {name!r}: the ladder has {', '.join(known)} (v6, the seed's FP8 side "
                "branch, is not built)") from None
    return tuple(r.name for r in ladder.RUNGS if r.name in chosen)


def _processes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_PROCESSES:
        raise argparse.ArgumentTypeError(f"expected a number of fresh processes from 1 to {MAX_PROCESSES}, "
                                         f"got {text!r}")
    return value


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of parallel compiles, got {text!r}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "ladder", help="the optimization ladder: census without a GPU, TFLOP/s and paired margins on one",
        description="On a GPU: every rung at seed 000's two frozen configurations — TFLOP/s, % of the "
                    "cuBLAS and mma.sync GEMM ceilings measured in the same run, the paired margin over "
                    "the parent, the correctness gate. Without a GPU (or with --census): the SASS census "
                    "of every rung. With --profile: ncu metrics per rung.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--census", action="store_true", help="the census even when a GPU is present")
    mode.add_argument("--profile", action="store_true",
                      help="each rung once under ncu --clock-control none (needs a GPU and ncu on PATH)")
    mode.add_argument("--from-json", type=pathlib.Path, metavar="PATH",
                      help="re-render the table (and --plot) from a saved climb; no GPU needed")
    p.add_argument("--only", type=_only, metavar="RUNGS",
                   help="comma-separated rungs, e.g. v3,v4 (default: all). A margin needs the parent "
                        "selected too")
    p.add_argument("--arch", choices=ARCHES, help=f"census target (default {DEFAULT_ARCH})")
    p.add_argument("--as-launched", type=str.upper, choices=("A", "B"), metavar="A|B",
                   help="with the census: compile every rung as a launch at configuration A or B specializes "
                        "it (strides, lengths and heads divisible by 16, group = 1, aligned pointers; B in "
                        "bf16): the binary the climb times there")
    p.add_argument("--jobs", type=_jobs, default=os.cpu_count() or 1, help="parallel census compiles")
    p.add_argument("--config", type=str.lower, choices=CONFIG_CHOICES, default="both",
                   help="A: B2 H16 S2048 d128 fp16 non-causal; B: B1 H16 S32768 d128 bf16 causal. With "
                        "--profile: a or b profiles at that configuration, both (default) at B1 H16 S4096 "
                        "d128 bf16 causal")
    p.add_argument("--quick", action="store_true", help="fewer rounds and shorter paired runs (a smoke run)")
    p.add_argument("--order", choices=timing.ORDERS, default=None,
                   help="the rates' order of the rounds: halves (default: ladder order, then reversed) or "
                        "balanced (every rung in every position and right after every other equally often; "
                        "a round per rung, about four times the rounds)")
    p.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="write JSON to PATH (no PATH: print JSON instead of the table)")
    p.add_argument("--plot", type=pathlib.Path, metavar="PNG",
                   help="the climb as a PNG (default: next to --json PATH); needs matplotlib")
    p.add_argument("--no-gate", action="store_true", help="skip the correctness gate")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--seed", type=int, default=0, help="input seed")
    p.add_argument("--processes", type=_processes, default=1, metavar="N",
                   help="the climb in N fresh processes, one after another: per rung the median and range "
                        "of TFLOP/s, of the share of the mma.sync ceiling and of the margin, and how many "
                        f"readings reach {TARGET_MMA_SYNC_PERCENT:g}%% (default 1: one climb in this process)")
    p.add_argument("--peer", action="append", choices=sorted(PROFILE_PEERS), default=[],
                   help="with --profile: a peer profiled beside the rungs, read per cycle against the same "
                        "ceiling (flash: torch SDPA's flash backend, FlashAttention-2 on the same mma.sync "
                        "path); repeatable")
    p.set_defaults(func=cmd_ladder)


def selected_rungs(only: tuple[str, ...] | None) -> list[ladder.Rung]:
    return [r for r in ladder.RUNGS if not only or r.name in only]


def selected_configs(choice: str) -> list[str]:
    return ["A", "B"] if choice == "both" else [choice.upper()]


def cmd_ladder(args) -> int:
    if args.from_json:
        doc = jsonfile.read(args.from_json)
        mode = doc.get("mode")
        if mode == "census":
            print(format_census(doc["rows"], doc["arch"], doc.get("no_gpu_reason"), doc.get("as_launched")))
        elif mode == "readings":
            print(format_readings(doc))
            _plot(doc, args, plot_readings)
        elif mode == "profile":
            print(format_profile(doc))
        else:
            print(format_table(doc))
            _plot(doc, args)
        return 0
    if args.processes > 1 and (args.profile or args.census):
        print("flashrung ladder: --processes repeats the climb (timing); the census and the profile are "
              "one reading each", file=sys.stderr)
        return 2
    if args.as_launched and (args.profile or args.processes > 1):
        print("flashrung ladder: --as-launched selects how the census compiles each rung; the climb and the "
              "profile run the launched binary itself", file=sys.stderr)
        return 2
    if args.profile:
        return cmd_profile(args)
    from flashrung.bench.cli import gpu_available
    ok, what = gpu_available()
    if args.processes > 1 and not ok:
        print(f"flashrung ladder: --processes repeats the climb, which needs a GPU ({what})", file=sys.stderr)
        return 2
    if args.processes > 1:
        if args.arch:
            print("flashrung ladder: --arch selects the census target, not a climb's", file=sys.stderr)
            return 2
        return cmd_readings(args, what)
    if args.census or not ok:
        return cmd_census(args, None if ok else what)
    if args.as_launched:
        print("flashrung ladder: --as-launched selects how the census compiles each rung; add --census to see "
              "it (the climb runs the launched binary itself)", file=sys.stderr)
        return 2
    if args.arch:
        print("flashrung ladder: --arch selects the census target; add --census to see it "
              "(the climb runs on this GPU)", file=sys.stderr)
        return 2
    return cmd_climb(args, what)


def _emit_json(doc: dict, target: str) -> None:
    if target == "-":
        json.dump(doc, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        print(f"wrote {report.write_json(doc, target)}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# Census (no GPU)


# the dtype each seed configuration runs in (A fp16, B bf16): an --as-launched census compiles it
LAUNCH_DTYPES = {"A": "fp16", "B": "bf16"}


def census_rows(arch: str, rungs: list[ladder.Rung], jobs: int, launch: str | None = None) -> list[dict]:
    """Census rows of every registered configuration of ``rungs`` for ``arch``, in ladder order;
    with ``launch`` ("A" or "B") each compiled as a launch at that configuration specializes it,
    in its dtype (``evidence.launched_spec``). Gluon cannot compile under TRITON_INTERPRET=1: then
    the compiles run in a clean child."""
    from flashrung.evidence.census import needs_reexec
    from flashrung.kernels.ladder import evidence

    names = {r.name for r in rungs}
    selectors = [s for s in evidence.all_selectors((arch,)) if s["rung"] in names]
    if launch is not None:
        selectors = [{**s, "launch": launch, "dtype": LAUNCH_DTYPES[launch]} for s in selectors]
    if needs_reexec():
        return evidence.rows_in_subprocess(selectors, jobs=jobs)
    return evidence.rows_for(selectors, jobs=jobs)


def config_label(config: dict) -> str:
    """``d128 causal 64x32 variant=all_keeps``: what tells a rung's configurations apart."""
    extra = ("variant",) if "variant" in config else tuple(config)
    shown = [f"{k}={v}" for k, v in config.items() if k in extra and v is not None
             and k not in ("head_dim", "causal", "dtype", "tile", "num_warps")]
    return " ".join([f"d{config['head_dim']}", "causal" if config["causal"] else "full", config["tile"], *shown])


CENSUS_FAMILIES = ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "FFMA")


def census_budget(arch: str) -> int:
    from flashrung.evidence.census import ARCHES as BUDGETS
    return BUDGETS[arch][1]


def format_census(rows: list[dict], arch: str, no_gpu: str | None = None, launch: str | None = None) -> str:
    """The census table and the shared-memory budget of ``arch``; pure (rows as JSON dicts).
    ``launch``: the rows were compiled as launched at that configuration."""
    budget = census_budget(arch)
    head = []
    if no_gpu:
        head.append(f"flashrung ladder: no GPU here ({no_gpu}), so no timing: this is the census — each "
                    "rung compiled ahead of time and read back from its SASS.")
    built = (f"each rung as launched at config {launch} ({LAUNCH_DTYPES[launch]}; the binary the climb times)"
             if launch else "each rung unspecialized (--as-launched A|B: the binary a launch there runs)")
    head.append(f"census {arch}, {built} — evidence level: SASS (static instruction counts: which instructions "
                "exist, not how fast they run); spills = spill stores + loads in bytes (ptxas -v); loop instr = "
                "instructions per trip of each innermost loop")
    header = ["rung", "config", "regs", "smem B", "spill B", *CENSUS_FAMILIES, "loop instr", "fits"]
    lines = []
    for r in rows:
        if r.get("error"):
            lines.append([r["kernel"], config_label(r["config"]), "ERROR", r["error"][:70]] + [""] * (len(header) - 4))
            continue
        lines.append([r["kernel"], config_label(r["config"]), r["regs"], r["smem_bytes"], r["spill_bytes"],
                      *(r["sass"].get(f, 0) for f in CENSUS_FAMILIES), loop_lengths(r),
                      "yes" if r["smem_bytes"] <= budget else "NO"])
    out = "\n".join(head) + "\n" + report._table(header, lines, left=2)
    return out + "\n\n" + budget_line(rows, arch)


def loop_lengths(row: dict) -> str:
    """Instructions per trip of each key loop (``evidence.key_loops``), in listing order: "563/738"
    is a kernel with an unmasked and a masked key loop; "-" for rows without loops (or recorded
    before the census read them)."""
    return "/".join(str(loop["length"]) for loop in key_loops(row)) or "-"


def budget_line(rows: list[dict], arch: str) -> str:
    budget = census_budget(arch)
    ok = [r for r in rows if not r.get("error")]
    card = (" — the seed's card (RTX 5090), where this budget set the occupancy cliffs"
            if arch == SEED_CARD_ARCH else "")
    text = f"shared memory per block on {arch}: budget {budget // 1024} KB ({budget:,} B){card}"
    if not ok:
        return text + "; no configuration compiled"
    big = max(ok, key=lambda r: r["smem_bytes"])
    over = [r for r in ok if r["smem_bytes"] > budget]
    text += (f"; largest here {big['smem_bytes']:,} B ({big['kernel']} {config_label(big['config'])}); ")
    if over:
        return text + f"{len(over)} of {len(ok)} configurations do NOT fit: " + ", ".join(
            f"{r['kernel']} {config_label(r['config'])}" for r in over)
    return text + f"all {len(ok)} configurations fit"


def cmd_census(args, no_gpu: str | None) -> int:
    arch = args.arch or DEFAULT_ARCH
    rungs = selected_rungs(args.only)
    notes = sys.stderr if args.json == "-" else sys.stdout
    if no_gpu and args.json == "-":
        print(f"flashrung ladder: no GPU here ({no_gpu}); printing the census (evidence level: SASS)",
              file=sys.stderr)
    print(f"compiling {', '.join(r.name for r in rungs)} for {arch} ({args.jobs} jobs)…", file=sys.stderr)
    launch = getattr(args, "as_launched", None)
    rows = census_rows(arch, rungs, args.jobs, launch)
    if args.json:
        doc = {"mode": "census", "arch": arch, "gpu": None if no_gpu else "present (census asked for)",
               "no_gpu_reason": no_gpu, "smem_budget_bytes": census_budget(arch), "as_launched": launch,
               "evidence": "SASS: static instruction counts of ahead-of-time compiles (no timing)",
               "rungs": [r.name for r in rungs], "budget": budget_line(rows, arch), "rows": rows}
        _emit_json(doc, args.json)
    if args.json != "-":
        print(format_census(rows, arch, no_gpu, launch), file=notes)
    if args.plot:
        print("no plot: the census has no timings", file=sys.stderr)
    return 1 if any(r.get("error") for r in rows) else 0


# ----------------------------------------------------------------------------------------------
# The climb (GPU): rows, their rates, and the table


def impl_of(rung: str) -> str:
    """The bench's name for a rung: ``flashrung:ladder.v3`` (dispatch by name, the public path)."""
    return f"flashrung:{rung}"


def compare_command(config: suites.Row, baseline: str, candidate: str) -> str:
    """The ``flashrung compare`` line that decides KEEP / REVERT / NULL for one link."""
    dtype = {"bfloat16": "bf16", "float16": "fp16"}[config.dtype]
    return (f"flashrung compare {impl_of(baseline)} {impl_of(candidate)} --batch {config.batch} "
            f"--heads {config.heads_q} --seqlen {config.seqlen_q} --headdim {config.headdim} --dtype {dtype} "
            f"{'--causal' if config.causal else '--no-causal'}")


def new_row(config: str, rung: ladder.Rung) -> dict:
    return {"config": config, "rung": rung.name, "parent": rung.parent, "lever": rung.lever, "status": None,
            "reason": None, "ms": None, "tflops": None, "percent_of_gemm_ceiling": None,
            "percent_of_mma_sync_ceiling": None, "margin": None, "margin_note": None, "gate": None}


def rate(row: dict, ms: float, config: suites.Row, ceilings: dict) -> dict:
    """Fill ``row``'s TFLOP/s (FA convention: causal = dense / 2) and its shares of the ceilings
    of the configuration's dtype."""
    flops, convention = config.flops(numerators.FA_HALF)
    row["ms"] = ms
    row["tflops"] = numerators.tflops(flops, ms)
    row["flops"], row["flops_convention"] = flops, convention
    for key, field in (("gemm", "percent_of_gemm_ceiling"), ("mma_sync", "percent_of_mma_sync_ceiling")):
        c = ceilings.get(f"{key}:{config.dtype}")
        row[field] = 100.0 * row["tflops"] / c["value"] if c and c.get("value") else None
    return row


def margin_note(rung: ladder.Rung, config: str, rows: dict[str, dict], chosen: set[str]) -> str | None:
    """Why ``rung`` has no margin at ``config`` (None when it can have one)."""
    if rung.parent is None:
        return "the anchor (no parent)"
    if rung.parent not in chosen:
        return f"parent {rung.parent} not selected (--only)"
    parent = rows.get(rung.parent)
    if parent is None or parent["status"] != "ok":
        why = parent["status"] if parent else "not run"
        return f"parent {rung.parent} {why} at config {config}"
    if rows[rung.name]["status"] != "ok":
        return "rung not measured"
    return None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}%"


def _margin_cell(row: dict) -> str:
    m = row.get("margin")
    if not m:
        note = row.get("margin_note")
        if row.get("parent") is None:
            return "anchor"
        return "-" if note in (None, "rung not measured") else f"- ({note})"
    flag = "" if m["halves_agree"] else " AB/BA disagree"
    return f"{m['margin']:.3f}x [{m['lo']:.3f},{m['hi']:.3f}] n={m['n']}{flag}"


def _gate_cell(row: dict) -> str:
    g = row.get("gate")
    if not g:
        return "-"
    if g.get("ratio") is None:
        return "ERROR"
    return f"{'PASS' if g['passed'] else 'FAIL'} {g['ratio']:.2f}"


def _aligned(header, lines, left) -> str:
    """Columns padded to their widest cell; the columns in ``left`` left-aligned (text), the others
    right-aligned (numbers)."""
    rows = [list(map(str, header))] + [list(map(str, ln)) for ln in lines]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(rows[0]).rstrip(), "  ".join("-" * w for w in widths)]
                     + [fmt(r).rstrip() for r in rows[1:]])


def _mma_sync_cell(row: dict) -> str:
    """The share of the mma.sync ceiling, with its spread over the rounds when the ceiling was
    timed in the rung's rounds (runs before that have none)."""
    by_round = row.get("percent_of_mma_sync_ceiling_by_round")
    cell = _pct(row["percent_of_mma_sync_ceiling"])
    return f"{cell} [{by_round['p10']:.1f},{by_round['p90']:.1f}]" if by_round else cell


def format_table(doc: dict) -> str:
    """The climb as a person reads it; pure (the JSON document in, text out)."""
    gpu = (doc.get("manifest") or {}).get("environment", {}).get("gpu") or "?"
    out = [f"flashrung ladder on {gpu} — TFLOP/s = FLOPs / median time per call, FLOPs 4·B·H·S²·d, "
           f"{numerators.LABELS[numerators.FA_HALF]}",
           f"timing: {doc.get('timing', TIMING_TEXT)}",
           f"margin vs parent: {doc.get('margin_text', MARGIN_TEXT)}"]
    ceil = doc.get("ceilings", {})
    parts = []
    for dtype in dict.fromkeys(c["dtype"] for c in doc["configs"].values()):
        g, m = ceil.get(f"gemm:{dtype}"), ceil.get(f"mma_sync:{dtype}")
        parts.append(f"{dtype} cuBLAS GEMM {g['value']:.1f}" if g else f"{dtype} cuBLAS GEMM not measured")
        parts.append(f"mma.sync GEMM {m['value']:.1f} (tile {m['tile']})" if m and m.get("value")
                     else "mma.sync GEMM not measured")
    where = ("timed in the rounds of their configuration's rungs" if any("config" in c for c in ceil.values())
             else "measured in this run")
    out.append(f"ceilings {where}, TFLOP/s at 8192³: " + ", ".join(parts))
    out.append("%GEMM, %mma.sync: each kernel timed at the clock it sustains, and at the power limit a GEMM "
               "sustains a lower one than attention (H200: ~10%); the share at one clock is --profile's %mma/cyc")
    header = ["config", "rung", "ms", "TFLOP/s", "%GEMM", "%mma.sync [by round p10,p90]", "vs parent [p10,p90]",
              "gate", "lever"]
    lines = []
    for r in doc["rows"]:
        short = r["rung"].split(".", 1)[1]
        if r["status"] != "ok":
            lines.append([r["config"], short, r["status"], "-", "-", "-", "-", _gate_cell(r), r["lever"]])
            continue
        lines.append([r["config"], short, f"{r['ms']:.3f}", f"{r['tflops']:.1f}", _pct(r["percent_of_gemm_ceiling"]),
                      _mma_sync_cell(r), _margin_cell(r), _gate_cell(r), r["lever"]])
    out.append("")
    for name, plan in doc["configs"].items():
        out.append(f"config {name}: {plan['label']}")
    out.append(_aligned(header, lines, left={0, 1, len(header) - 2, len(header) - 1}))
    notes = [f"{r['config']} {r['rung']}: {r['status']}: {r['reason']}" for r in doc["rows"]
             if r["status"] != "ok" and r.get("reason")]
    notes += [f"{r['config']} {r['rung']}: gate {r['gate']['text']}" for r in doc["rows"]
              if r.get("gate") and not r["gate"]["passed"]]
    if notes:
        out += ["", "not measured / not passed:"] + [f"  {n}" for n in notes]
    cmds = doc.get("compare_commands") or {}
    if cmds:
        out += ["", "keep verdicts (two fresh processes, A/A threshold from `flashrung null`):"]
        out += [f"  {c}" for c in cmds.values()]
    gates = [r["gate"] for r in doc["rows"] if r.get("gate")]
    if gates:
        c = gates[0]["config"]
        out.append(f"gate: frozen rule, reduced size B≤{GATE_MAX_BATCH} S{c['seqlen_q']} of each config's dtype, "
                   "mask and head dim; ratio = worst error / bound (< 1 passes)")
    if "wall_s" in doc:
        out.append(f"wall time {doc['wall_s']:.0f} s")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# The climb (GPU): measurement


class _Progress:
    """One tqdm bar on stderr over every step of the run (quiet when not a terminal)."""

    def __init__(self, total: int, enabled: bool):
        from tqdm import tqdm
        tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, desc="ladder", unit="step", disable=not enabled, file=sys.stderr,
                        dynamic_ncols=True, mininterval=0.5 if tty else 15.0)

    def step(self, what: str, n: int = 1) -> None:
        self.bar.set_postfix_str(what, refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


CUBLAS = "cuBLAS"


CEILING_PREFIX = "ceiling "   # the GEMMs' names in a configuration's rounds


def gemm_fns(dtype: str, *, size: int = GEMM_SIZE, on_tile=lambda s: None) -> tuple[dict, list[dict]]:
    """The GEMMs the ceilings of ``dtype`` are taken from: cuBLAS (``torch.mm``) and every tile of
    ``ceiling.CEILING_TILES``, each tile checked against cuBLAS first. Returns ({label: fn} of the
    GEMMs that run and are right, [a record per tile that does not])."""
    import torch
    from flashrung.bench.peers import torch_dtype
    from flashrung.kernels.ladder.ceiling import CEILING_TILES, mma_v2_gemm

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(size, size, device="cuda", generator=g).to(torch_dtype(dtype))   # (M, K)
    b = torch.randn(size, size, device="cuda", generator=g).to(torch_dtype(dtype))   # (N, K)
    c = torch.empty(size, size, device="cuda", dtype=a.dtype)
    ref = torch.mm(a, b.t()).float()
    fns, failed = {CUBLAS: lambda: torch.mm(a, b.t(), out=c)}, []
    for tile in CEILING_TILES:
        on_tile(f"mma.sync {dtype} {tile.label()}")
        try:
            err = ((mma_v2_gemm(a, b, tile).float() - ref).abs().max() / ref.abs().max()).item()
            if not err < GEMM_MAX_REL_ERR:
                raise RuntimeError(f"GEMM result wrong: max relative error {err:.2e}")
        except Exception as exc:   # a tile that fails is reported; the others still define the ceiling
            failed.append({"tile": tile.label(), "status": "error",
                           "reason": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"})
            continue
        fns[tile.label()] = lambda tile=tile: mma_v2_gemm(a, b, tile)
    del ref
    return fns, failed


def ceilings_of(dtype: str, medians: dict, reps: dict, preheat: dict, failed: list[dict], *, how: str,
                size: int = GEMM_SIZE) -> dict:
    """The ceiling records of ``dtype`` from the GEMMs' median ms per call (``medians``, keyed as
    :func:`gemm_fns` names them; ``how``: how they were timed): the cuBLAS GEMM's, and the best
    mma.sync tile's. A ceiling timed in a few dozen calls after a lighter kernel reads the clock
    that kernel left, up to 19% high on the H200 for the first ~100 ms; the same best tile read
    367.6-432.9 TFLOP/s over four runs timed that way — so the climb times every GEMM after
    ``block_preheat_ms`` of its own calls."""
    flops = 2 * size ** 3
    tiles = [{"tile": n, "status": "ok", "ms": ms, "value": flops / ms * 1e-9, "reps_per_block": reps[n],
              "preheat_calls": preheat[n]} for n, ms in medians.items() if n != CUBLAS] + list(failed)
    ok = [t for t in tiles if t["status"] == "ok"]
    best = max(ok, key=lambda t: t["value"]) if ok else None
    cublas_ms = medians[CUBLAS]
    return {
        f"gemm:{dtype}": {"kind": "gemm", "dtype": dtype, "ms": cublas_ms, "value": flops / cublas_ms * 1e-9,
                          "unit": "TFLOP/s", "detail": f"torch.mm {size}³ (cuBLAS), {how}"},
        f"mma_sync:{dtype}": {
            "kind": "mma_sync", "dtype": dtype, "value": best["value"] if best else None,
            "ms": best["ms"] if best else None, "unit": "TFLOP/s", "tile": best["tile"] if best else None,
            "detail": f"Gluon mma_v2 GEMM C = A·Bᵀ {size}³ (mma.sync m16n8k16, ldmatrix, cp.async ring), best of "
                      f"{len(tiles)} tiles, {how}", "tiles": tiles},
    }


def warm_up(fn, protocol: LadderProtocol, timer) -> timing.Warmup:
    """``fn``'s warm-up under ``protocol.rates`` (its estimate sizes the blocks and the preheat)."""
    return timing.warm_up(timer, fn, min_calls=max(2, protocol.rates.warmup_calls), min_ms=protocol.rates.warmup_ms)


def interleave_warmed(fns: dict, warm: dict, protocol: LadderProtocol, timer) -> tuple[timing.Interleaved, dict, dict]:
    """``fns`` (warmed up: ``warm`` holds their estimates) timed round-robin with ``protocol.rates``:
    blocks of about ``block_ms``, each preceded by ``block_preheat_ms`` of its own untimed calls, so
    every function is timed at the clock it sets itself, not at the one the previous block left.
    Returns (the interleaved times, {name: calls per block}, {name: preheat calls})."""
    rates = protocol.rates
    reps = {n: timing.reps_for(warm[n].estimate_ms, target_ms=rates.block_ms, lo=rates.block_reps_min,
                               hi=rates.block_reps_max) for n in fns}
    preheat = {n: timing.preheat_calls(warm[n].estimate_ms, rates.block_preheat_ms) for n in fns}
    orders = rates.orders_for(list(fns))
    return timing.interleave(fns, reps, len(orders), timer, block_warmup=preheat, orders=orders), reps, preheat


def measure_config(name: str, config: suites.Row, rungs: list[ladder.Rung], chosen: set[str],
                   protocol: LadderProtocol, timer, progress: _Progress, seed: int) -> tuple[list[dict], dict]:
    """Every rung at one configuration: prepared through the public entry point, timed
    round-robin together with the ceiling GEMMs of the configuration's dtype, then each paired
    against its parent. Returns (the rows, the ceilings).

    The GEMMs run in the rungs' rounds because a ceiling timed in a phase of its own reads another
    thermal and power state: on the H200 the bf16 mma.sync tile read 367.0-371.3 TFLOP/s timed
    before one rung and 360.1 before all of them, while the rungs moved 0.4% (default protocol,
    `9e96816`). In the same rounds, each round's ratio of a rung to the ceiling is a paired one."""
    import torch
    from flashrung.bench import peers

    rows = {r.name: new_row(name, r) for r in rungs}
    inputs = peers.make_inputs(config, seed=seed)
    prepared, warm = {}, {}
    for r in rungs:
        row = rows[r.name]
        progress.step(f"{name} prepare {r.name}")
        if (r.name, name) in SKIPS:
            row["status"], row["reason"] = "skipped", SKIPS[(r.name, name)]
            continue
        try:
            p = peers.prepare(impl_of(r.name), config, inputs)
            p.first_out = None
            warm[r.name] = warm_up(p.fn, protocol, timer)
        except peers.Unsupported as exc:
            row["status"], row["reason"] = exc.status, exc.reason
            continue
        except Exception as exc:   # e.g. a launch failure during warm-up: the row says so, the run goes on
            row["status"], row["reason"] = "error", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            continue
        prepared[r.name] = p
        row.update(status="ok", dispatch=p.dispatch, first_call_s=p.first_call_s)

    progress.step(f"{name} cuBLAS GEMM {config.dtype}")
    gemms, failed = gemm_fns(config.dtype, on_tile=lambda s: progress.step(f"{name} {s}"))
    gemm_key = {g: f"{CEILING_PREFIX}{g}" for g in gemms}   # a GEMM's name in the rounds, apart from any rung's
    for g, fn in gemms.items():
        warm[gemm_key[g]] = warm_up(fn, protocol, timer)

    progress.step(f"{name} timing {len(prepared)} rungs and {len(gemms)} GEMMs")
    fns = {**{n: p.fn for n, p in prepared.items()}, **{gemm_key[g]: fn for g, fn in gemms.items()}}
    inter, reps, preheat = interleave_warmed(fns, warm, protocol, timer)
    gemm_medians = {g: stats.Distribution.of(inter.per_call(gemm_key[g])).median for g in gemms}
    ceilings = ceilings_of(config.dtype, gemm_medians, {g: reps[gemm_key[g]] for g in gemms},
                           {g: preheat[gemm_key[g]] for g in gemms}, failed,
                           how=(f"median per call over {protocol.rates.rounds} rounds interleaved with config "
                                f"{name}'s rungs, each block after {protocol.rates.block_preheat_ms:g} ms of its "
                                "own calls"))
    for c in ceilings.values():
        c["config"] = name
    best = ceilings[f"mma_sync:{config.dtype}"].get("tile")
    for n in prepared:
        dist = stats.Distribution.of(inter.per_call(n))
        rate(rows[n], dist.median, config, ceilings)
        rows[n].update(distribution=dist.to_json(), reps_per_block=reps[n], rounds=protocol.rates.rounds,
                       warmup_calls=warm[n].calls, preheat_calls=preheat[n])
        if best is not None:
            rows[n]["percent_of_mma_sync_ceiling_by_round"] = percent_by_round(
                inter.block_medians(n), inter.block_medians(gemm_key[best]), config)
    del gemms, fns
    torch.cuda.empty_cache()

    for r in rungs:
        row = rows[r.name]
        row["margin_note"] = margin_note(r, name, rows, chosen)
        if row["margin_note"] is not None:
            continue
        progress.step(f"{name} {r.name} vs {r.parent}")
        proto = protocol.paired(rows[r.parent]["ms"], row["ms"])
        t0 = time.perf_counter()
        run = timing.paired_run(prepared[r.parent].fn, prepared[r.name].fn, proto, timer)
        row["margin"] = {"vs": r.parent, **stats.summarize(run).to_json(), "protocol": proto.to_json(),
                         "wall_s": time.perf_counter() - t0, "run": run.to_json()}
    del prepared, inputs
    torch.cuda.empty_cache()
    return [rows[r.name] for r in rungs], ceilings


def percent_by_round(rung_ms: list[float], gemm_ms: list[float], config: suites.Row, *,
                     size: int = GEMM_SIZE) -> dict:
    """A rung's share of the mma.sync ceiling round by round: each round's rung block against the
    same round's block of the best tile — paired, so what moves both from round to round (the
    GPU's power and thermal state) cancels; the clock each kernel sustains does not (a GEMM's is
    lower at the power limit: the share at one clock is ``--profile``'s). Median and [p10, p90]
    over the rounds, in percent."""
    flops, _ = config.flops(numerators.FA_HALF)
    pct = [100.0 * (flops / r) / (2 * size ** 3 / g) for r, g in zip(rung_ms, gemm_ms)]
    dist = stats.Distribution.of(pct)
    return {"median": dist.median, "p10": dist.p10, "p90": dist.p90, "n": dist.n}


def gate_config_row(config: suites.Row) -> suites.Row:
    return dataclasses.replace(config, batch=min(config.batch, GATE_MAX_BATCH), seqlen_q=GATE_SEQLEN,
                               seqlen_k=GATE_SEQLEN)


def cmd_climb(args, gpu: str) -> int:
    import torch
    from flashrung.bench import manifest as manifest_mod
    from flashrung.bench import runner

    started = time.perf_counter()
    protocol = protocol_for(args)
    rungs = selected_rungs(args.only)
    chosen = {r.name for r in rungs}
    names = selected_configs(args.config)
    configs = {n: CONFIGS[n] for n in names}
    print(f"flashrung ladder on {gpu}: {', '.join(r.name for r in rungs)} at config "
          f"{' and '.join(names)}, {'quick' if args.quick else 'default'} protocol, rounds in "
          f"{protocol.rates.order} order", file=sys.stderr)
    manifest = manifest_mod.start(list(sys.argv))
    timer = timing.CudaEventTimer()

    from flashrung.kernels.ladder.ceiling import CEILING_TILES
    n_rows = sum(1 for n in names for _ in rungs)
    total = len(names) * (1 + len(CEILING_TILES)) + n_rows + len(names) + n_rows + (0 if args.no_gate else n_rows)
    progress = _Progress(total, enabled=not args.no_progress)
    try:
        ceilings, rows = {}, []
        for n, config in configs.items():
            config_rows, config_ceilings = measure_config(n, config, rungs, chosen, protocol, timer, progress,
                                                          args.seed)
            progress.bar.update(sum(1 for r in config_rows if r["margin_note"] is not None))
            rows += config_rows
            ceilings.update(config_ceilings)

        if not args.no_gate:
            for row in rows:
                progress.step(f"gate {row['config']} {row['rung']}")
                if row["status"] == "skipped":
                    continue
                row["gate"] = runner.run_gate(impl_of(row["rung"]), gate_config_row(configs[row["config"]]),
                                              seed=args.seed)
    finally:
        progress.close()
    manifest_mod.finish(manifest)

    compare = {f"{r['config']} {r['parent']} -> {r['rung']}":
               compare_command(configs[r["config"]], r["parent"], r["rung"]) for r in rows if r.get("margin")}
    doc = {"mode": "climb", "configs": {n: {**c.plan(), "label": c.label()} for n, c in configs.items()},
           "rungs": [{"name": r.name, "parent": r.parent, "lever": r.lever} for r in rungs],
           "protocol": protocol.to_json(), "timing": timing_text(protocol), "margin_text": MARGIN_TEXT,
           "evidence": {"tflops": "timing (CUDA events, median, interleaved)", "margin": "timing (paired, in-process)",
                        "ceilings": "timing (same run)", "gate": "correctness gate (reduced size)"},
           "ceilings": ceilings, "rows": rows, "compare_commands": compare, "manifest": manifest,
           "wall_s": time.perf_counter() - started}
    table = format_table(doc)
    print(table, file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        _emit_json(doc, args.json)
    _plot(doc, args)
    torch.cuda.empty_cache()
    failed = [r for r in rows if r["status"] in ("error", "unsupported")
              or (r.get("gate") is not None and not r["gate"]["passed"])]
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------
# Readings over fresh processes (GPU): the climb repeated, each in its own process


def child_argv(args, json_path) -> list[str]:
    """The command line of one fresh climb: this one's rungs, configurations, protocol, gate and
    seed, its JSON to ``json_path`` (its plot lands beside it), no progress bar."""
    argv = [sys.executable, "-m", "flashrung.cli", "ladder", "--config", args.config, "--seed", str(args.seed),
            "--no-progress", "--json", str(json_path)]
    if args.only:
        argv += ["--only", ",".join(name.split(".", 1)[1] for name in args.only)]
    if args.quick:
        argv.append("--quick")
    if getattr(args, "order", None):
        argv += ["--order", args.order]
    if args.no_gate:
        argv.append("--no-gate")
    return argv


def run_child(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True)


def spread(values: list[float]) -> dict | None:
    """Median, min and max of a reading over processes (None without a reading)."""
    import statistics
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": list(values)}


def summarize_readings(docs: list[dict]) -> dict:
    """Per (configuration, rung), over the climbs in ``docs`` (each one process's JSON): TFLOP/s,
    the share of the mma.sync ceiling, the in-process margin over the parent, readings at or above
    ``TARGET_MMA_SYNC_PERCENT``, failed gates and statuses other than ok; and each ceiling's
    spread. Pure."""
    cells: dict[tuple[str, str], dict] = {}
    for doc in docs:
        for r in doc["rows"]:
            cell = cells.setdefault((r["config"], r["rung"]), {
                "config": r["config"], "rung": r["rung"], "parent": r["parent"], "lever": r["lever"],
                "tflops": [], "pct": [], "margin": [], "gate_failed": 0, "not_measured": []})
            if r["status"] != "ok":
                cell["not_measured"].append(r["status"])
                continue
            cell["tflops"].append(r["tflops"])
            if r.get("percent_of_mma_sync_ceiling") is not None:
                cell["pct"].append(r["percent_of_mma_sync_ceiling"])
            if r.get("margin"):
                cell["margin"].append(r["margin"]["margin"])
            if r.get("gate") is not None and not r["gate"]["passed"]:
                cell["gate_failed"] += 1
    rows = [{"config": c["config"], "rung": c["rung"], "parent": c["parent"], "lever": c["lever"],
             "readings": len(c["tflops"]), "tflops": spread(c["tflops"]),
             "percent_of_mma_sync_ceiling": spread(c["pct"]),
             "at_or_above_target": sum(p >= TARGET_MMA_SYNC_PERCENT for p in c["pct"]),
             "margin": spread(c["margin"]), "gate_failed": c["gate_failed"], "not_measured": c["not_measured"]}
            for c in cells.values()]
    ceilings: dict[str, list[float]] = {}
    for doc in docs:
        for key, c in doc.get("ceilings", {}).items():
            if c.get("value"):
                ceilings.setdefault(key, []).append(c["value"])
    return {"rows": rows, "ceilings": {k: spread(v) for k, v in ceilings.items()}}


def _spread_cell(x: dict | None, fmt: str, unit: str = "") -> str:
    if not x:
        return "-"
    if x["n"] == 1:
        return f"{x['median']:{fmt}}{unit}"
    return f"{x['median']:{fmt}}{unit} [{x['min']:{fmt}},{x['max']:{fmt}}]"


def format_readings(doc: dict) -> str:
    """The readings as a person reads them; pure (the JSON document in, text out)."""
    runs = doc["runs"]
    ok = [run for run in runs if run.get("climb")]
    gpu = next(((run["climb"].get("manifest") or {}).get("environment", {}).get("gpu") for run in ok), None) or "?"
    out = [f"flashrung ladder on {gpu}: {len(ok)} of {len(runs)} fresh processes read, each a whole climb "
           f"({doc['protocol']} protocol, rounds in {doc.get('order', 'halves')} order); per rung the median "
           f"[min, max] over the processes",
           f"%mma.sync: the share of the mma.sync ceiling timed in that process's rounds; target "
           f"{TARGET_MMA_SYNC_PERCENT:g}% (seed 000, config B)",
           "vs parent: each process's in-process paired margin (the keep verdict stays with `flashrung compare`)"]
    parts = [f"{key.replace(':', ' ')} {_spread_cell(v, '.1f')}" for key, v in sorted(doc["summary"]["ceilings"].items())]
    if parts:
        out.append("ceilings per process, TFLOP/s: " + ", ".join(parts))
    header = ["config", "rung", "n", "TFLOP/s [min,max]", "%mma.sync [min,max]", f">={TARGET_MMA_SYNC_PERCENT:g}%",
              "vs parent [min,max]", "gate", "lever"]
    lines = []
    for r in doc["summary"]["rows"]:
        gate = "-" if not doc.get("gated", True) else ("PASS" if not r["gate_failed"] else f"FAIL x{r['gate_failed']}")
        if not r["readings"]:
            lines.append([r["config"], r["rung"].split(".", 1)[1], 0, ", ".join(sorted(set(r["not_measured"]))),
                          "-", "-", "-", "-", r["lever"]])
            continue
        pct = r["percent_of_mma_sync_ceiling"]
        lines.append([r["config"], r["rung"].split(".", 1)[1], r["readings"], _spread_cell(r["tflops"], ".1f"),
                      _spread_cell(pct, ".1f", "%"), f"{r['at_or_above_target']} of {pct['n']}" if pct else "-",
                      _spread_cell(r["margin"], ".3f", "x"), gate, r["lever"]])
    out += ["", _aligned(header, lines, left={0, 1, len(header) - 1})]
    failed = [run for run in runs if not run.get("climb")]
    if failed:
        out += ["", "processes that wrote no climb:"]
        out += [f"  process {run['process']}: exit {run['returncode']}: {run['error']}" for run in failed]
    out.append(f"wall time {doc['wall_s']:.0f} s")
    return "\n".join(out)


def cmd_readings(args, gpu: str) -> int:
    import tempfile
    from flashrung.bench import manifest as manifest_mod

    started = time.perf_counter()
    print(f"flashrung ladder on {gpu}: the climb in {args.processes} fresh processes", file=sys.stderr)
    manifest = manifest_mod.start(list(sys.argv))
    runs = []
    progress = _Progress(args.processes, enabled=not args.no_progress)
    try:
        with tempfile.TemporaryDirectory(prefix="flashrung-ladder-") as tmp:
            for i in range(args.processes):
                progress.step(f"process {i + 1} of {args.processes}")
                path = pathlib.Path(tmp) / f"climb-{i}.json"
                done = run_child(child_argv(args, path))
                run = {"process": i + 1, "returncode": done.returncode, "climb": None, "error": None}
                if path.exists():
                    run["climb"] = json.loads(path.read_text())
                else:
                    tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
                    run["error"] = " / ".join(tail) or "no output"
                runs.append(run)
    finally:
        progress.close()
    manifest_mod.finish(manifest)
    doc = {"mode": "readings", "processes": args.processes, "protocol": "quick" if args.quick else "default",
           "order": protocol_for(args).rates.order,
           "gated": not args.no_gate, "target_mma_sync_percent": TARGET_MMA_SYNC_PERCENT,
           "summary": summarize_readings([run["climb"] for run in runs if run["climb"]]),
           "runs": runs, "manifest": manifest, "wall_s": time.perf_counter() - started}
    print(format_readings(doc), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        _emit_json(doc, args.json)
    _plot(doc, args, plot_readings)
    bad = [run for run in runs if run["climb"] is None or run["returncode"] != 0]
    return 1 if bad else 0


def plot_readings(doc: dict, path) -> pathlib.Path:
    """Each process's share of the mma.sync ceiling per rung (one dot each, the median as a bar),
    one panel per configuration, the target as a line."""
    from flashrung.bench import plot
    plt = plot.pyplot("ladder")
    rows = doc["summary"]["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, max(1, len(configs)), figsize=(5.6 * max(1, len(configs)), 4.2), squeeze=False)
    for ax, cname in zip(axes[0], configs):
        mine = [r for r in rows if r["config"] == cname and r["percent_of_mma_sync_ceiling"]]
        for i, r in enumerate(mine):
            pct = r["percent_of_mma_sync_ceiling"]
            ax.scatter([i] * pct["n"], pct["values"], s=18, alpha=0.7, color="C0", zorder=3)
            ax.hlines(pct["median"], i - 0.3, i + 0.3, color="C1", lw=2.2, zorder=4)
        ax.axhline(TARGET_MMA_SYNC_PERCENT, ls="--", color="0.35", lw=1.2,
                   label=f"target {TARGET_MMA_SYNC_PERCENT:g}%")
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([r["rung"].split(".", 1)[1] for r in mine])
        ax.grid(True, alpha=0.3)
        ax.set_title(f"config {cname}", fontsize=9)
        ax.set_ylabel("% of the mma.sync ceiling (each process)")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"flashrung ladder: {doc['processes']} fresh processes; dots: one process each, bar: the "
                 "median; ceilings timed in each process's rounds", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return plot.save(fig, path)


# ----------------------------------------------------------------------------------------------
# Plot


def plot_climb(doc: dict, path) -> pathlib.Path:
    """TFLOP/s per rung, one panel per configuration, the two ceilings of its dtype as lines,
    each point labelled with its share of the mma.sync ceiling."""
    from flashrung.bench import plot
    plt = plot.pyplot("ladder")
    names = [r["name"] for r in doc["rungs"]]
    configs = doc["configs"]
    fig, axes = plt.subplots(1, len(configs), figsize=(5.6 * len(configs), 4.2), squeeze=False)
    for ax, (cname, plan) in zip(axes[0], configs.items()):
        by_rung = {r["rung"]: r for r in doc["rows"] if r["config"] == cname}
        pts = [(i, by_rung[n]) for i, n in enumerate(names) if by_rung.get(n, {}).get("status") == "ok"]
        if pts:
            ax.plot([i for i, _ in pts], [r["tflops"] for _, r in pts], marker="o", lw=2.2, zorder=3,
                    label="rung (TFLOP/s)")
            for i, r in pts:
                pct = r.get("percent_of_mma_sync_ceiling")
                if pct is not None:
                    ax.annotate(f"{pct:.0f}%", (i, r["tflops"]), textcoords="offset points", xytext=(0, 6),
                                ha="center", fontsize=7)
        for key, style, label in (("gemm", "--", "cuBLAS GEMM"), ("mma_sync", ":", "mma.sync GEMM")):
            c = doc["ceilings"].get(f"{key}:{plan['dtype']}")
            if c and c.get("value"):
                ax.axhline(c["value"], ls=style, color="0.35", lw=1.2, label=f"{label} {c['value']:.0f}")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n.split(".", 1)[1] for n in names])
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"config {cname}: {plan['label']}", fontsize=9)
        ax.set_ylabel("TFLOP/s")
        ax.legend(fontsize=7, loc="best")
    gpu = (doc.get("manifest") or {}).get("environment", {}).get("gpu") or "?"
    fig.suptitle(f"flashrung ladder on {gpu}; {numerators.LABELS[numerators.FA_HALF]}; labels: % of the "
                 "mma.sync ceiling; ceilings measured in the same run", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return plot.save(fig, path)


def _plot(doc: dict, args, draw=None) -> None:
    """``--plot``: the climb (``plot_climb``), or what ``draw`` draws (``plot_readings``)."""
    from flashrung.bench import plot
    plot.write_for_cli(draw or plot_climb, doc, args.plot, args.json)


# ----------------------------------------------------------------------------------------------
# Profile (ncu)

# One launch per rung at a shape where even v0 takes milliseconds, not seconds, under replay
# (``--config both``, the default); ``--config a|b`` profiles at that frozen configuration itself,
# where the climb's margins were measured (v0 is skipped at B, as in the climb).
PROFILE_ROW = suites.Row(batch=1, seqlen_q=4096, seqlen_k=4096, heads_q=16, heads_kv=16, headdim=128,
                         dtype="bfloat16", causal=True, mode="fwd", suite="ladder-profile")


def profile_row(choice: str) -> tuple[suites.Row, str | None]:
    """(shape to profile at, config name or None) for ``--config``'s value."""
    if choice == "both":
        return PROFILE_ROW, None
    name = choice.upper()
    return CONFIGS[name], name
PROFILE_KERNELS = "regex:attention_fwd_v"    # the rung kernels (attention_fwd_v0 ... _v7)
CEILING_KERNELS = "regex:mma_v2_gemm_kernel"  # the mma.sync ceiling's GEMM
CEILING_TARGET = "mma_sync:"                  # a profile target that is a ceiling tile: "mma_sync:<index>"
PEER_TARGET = "peer:"                         # a profile target that is a peer: "peer:flash"
# peers --profile can read, and the kernels ncu is to profile for each: torch's FlashAttention-2
# forward is flash_fwd_kernel (flash_fwd_splitkv_kernel when it splits the keys)
PROFILE_PEERS = {"flash": "regex:flash_fwd"}
PROFILE_TIMEOUT_S = 600


def ceiling_target(index: int) -> str:
    """The profile target of ``ceiling.CEILING_TILES[index]``."""
    return f"{CEILING_TARGET}{index}"


def _profile_target(text: str) -> str:
    """A rung (``v3`` or ``ladder.v3``), a ceiling tile (``mma_sync:0``) or a peer (``peer:flash``):
    the profiled child's target."""
    if text.startswith(PEER_TARGET):
        if text[len(PEER_TARGET):] not in PROFILE_PEERS:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {PEER_TARGET}NAME with NAME in "
                                             f"{', '.join(sorted(PROFILE_PEERS))}")
        return text
    if text.startswith(CEILING_TARGET):
        from flashrung.kernels.ladder.ceiling import CEILING_TILES
        index = text[len(CEILING_TARGET):]
        if not index.isdigit() or int(index) >= len(CEILING_TILES):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {CEILING_TARGET}N with N below {len(CEILING_TILES)}")
        return text
    return _only(text)[0]


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str       # ncu metric
    label: str      # table column
    why: str        # which rung's story it tells


PROFILE_METRICS = (
    Metric("gpu__time_duration.sum", "time", "one launch under replay (clocks not locked)"),
    Metric("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor%",
           "v0 idle -> v1 active; the climb toward the mma.sync ceiling"),
    Metric("sm__warps_active.avg.pct_of_peak_sustained_active", "occ%", "achieved occupancy (227 KB vs 99 KB)"),
    Metric("sm__maximum_warps_per_active_cycle_pct", "theo%", "theoretical occupancy"),
    Metric("launch__registers_per_thread", "regs", "the register bound on occupancy"),
    Metric("smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct", "lsb%",
           "global-memory latency: v3's cp.async removes register-bound staging"),
    Metric("smsp__warp_issue_stalled_barrier_per_warp_active.pct", "bar%", "barrier waits: v7's 64x32 tile"),
    Metric("smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct", "mio%", "shared-memory queue: v1 vs v2"),
    Metric("smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct", "ssb%", "shared-memory / MUFU latency"),
    Metric("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "ld-conf", "bank conflicts of shared loads"),
    Metric("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum", "ldsm-conf",
           "bank conflicts of ldmatrix: v1 (row-major) vs v2 (XOR swizzle)"),
    Metric("smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum", "ldsm-wf", "ldmatrix wavefronts"),
    Metric("smsp__inst_executed_op_ldsm.sum", "ldsm", "ldmatrix instructions"),
    Metric("sm__cycles_active.avg", "sm-act", "SM busy cycles: v5's idle tail"),
    Metric("sm__cycles_elapsed.avg", "sm-ela", "elapsed cycles"),
    Metric("lts__t_sector_hit_rate.pct", "L2hit%", "L2 reuse of K/V across resident CTAs: v4's vs v5's order"),
    Metric("lts__t_sectors_srcunit_tex_op_read.sum", "L2rd", "sectors the SMs read from L2"),
    Metric("dram__bytes_read.sum", "dram-rd", "bytes read from HBM: K/V re-fetched when L2 does not hold it"),
)


def ncu_command(ncu: str, metrics, rung: str, row: suites.Row = PROFILE_ROW) -> list[str]:
    """ncu profiling one warm launch of ``rung`` at ``row`` (the child runs it twice); ``rung`` may
    be a ceiling tile (:func:`ceiling_target`), run at 8192³ in ``row``'s dtype."""
    kernels = (CEILING_KERNELS if rung.startswith(CEILING_TARGET)
               else PROFILE_PEERS[rung[len(PEER_TARGET):]] if rung.startswith(PEER_TARGET) else PROFILE_KERNELS)
    return [ncu, "--clock-control", "none", "--target-processes", "all", "--csv", "--page", "raw",
            "--print-units", "base", "--kernel-name-base", "function",
            "--kernel-name", kernels, "--launch-skip", "1", "--launch-count", "1", "--metrics", ",".join(metrics),
            sys.executable, "-m", "flashrung.kernels.ladder.cli", "--profile-target", rung,
            "--batch", str(row.batch), "--heads", str(row.heads_q), "--seqlen", str(row.seqlen_q),
            "--headdim", str(row.headdim), "--dtype", row.dtype, "--causal" if row.causal else "--no-causal"]


def _number(text: str):
    """ncu's value: a float where it is one (thousands separators dropped), else the text."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of ncu's ``--csv --page raw`` output: ``{column: (value, unit)}`` per profiled kernel.
    The first line that starts with ``"ID"`` is the header, the next the units; ``==PROF==`` lines
    and the application's own output around them are skipped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    table = list(csv.reader(io.StringIO("\n".join(ln for ln in lines[start:] if ln.startswith('"')))))
    header, units, body = table[0], table[1] if len(table) > 1 else [], table[2:]
    out = []
    for cells in body:
        if len(cells) != len(header) or not cells[0].isdigit():
            continue
        out.append({h: (_number(c), units[i] if i < len(units) else "") for i, (h, c) in enumerate(zip(header, cells))})
    return out


_METRIC_TOKEN = re.compile(r"[a-z0-9]+__[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")


def rejected_metrics(ncu_output: str, metrics) -> list[str]:
    """Requested metrics that ncu's error lines name (a metric this ncu/GPU does not have).
    Whole names are compared, base name to base name: ``..._op_ld`` is not ``..._op_ldsm``."""
    named = {t.split(".")[0] for ln in ncu_output.splitlines() if "ERROR" in ln for t in _METRIC_TOKEN.findall(ln)}
    return [m for m in metrics if m.split(".")[0] in named]


def derived(values: dict, flops: float | None = None) -> dict:
    """Figures read from two metrics: wavefronts per ldmatrix (the seed's 32 -> 4), the share of
    elapsed cycles the SMs were busy, and (given the launch's ``flops``) FLOPs per elapsed SM clock
    cycle — the rate with the clock divided out, which the clocks left unlocked do not move."""
    def v(name):
        x = values.get(name, (None, ""))[0]
        return x if isinstance(x, float) else None
    wf = v("smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum")
    ldsm = v("smsp__inst_executed_op_ldsm.sum")
    act, ela = v("sm__cycles_active.avg"), v("sm__cycles_elapsed.avg")
    return {"ldsm_wavefronts_per_instruction": wf / ldsm if wf is not None and ldsm else None,
            "sm_active_pct": 100.0 * act / ela if act is not None and ela else None,
            "flop_per_cycle": flops / ela if flops is not None and ela else None}


def percent_per_cycle(rows: list[dict]) -> dict | None:
    """Each rung row's FLOPs per cycle as a share of the best ceiling tile's (in place, as
    ``percent_of_mma_sync_per_cycle``): the %-of-ceiling at one clock, what locking the clock
    gives, from counters. Returns the best ceiling row (None when no tile was profiled)."""
    tiles = [r for r in rows if r.get("kind") == "ceiling" and r["status"] == "ok"
             and r["derived"].get("flop_per_cycle")]
    best = max(tiles, key=lambda r: r["derived"]["flop_per_cycle"]) if tiles else None
    for r in rows:
        fpc = r.get("derived", {}).get("flop_per_cycle") if r["status"] == "ok" else None
        r["percent_of_mma_sync_per_cycle"] = (100.0 * fpc / best["derived"]["flop_per_cycle"]
                                              if best is not None and fpc and r.get("kind") != "ceiling" else None)
    return best


def _duration_us(value, unit: str):
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}
    return value * scale[unit] if isinstance(value, float) and unit in scale else None


def format_profile(doc: dict) -> str:
    """The profile table; pure."""
    shown = [m for m in PROFILE_METRICS if m.name != "gpu__time_duration.sum"]
    header = ["rung", "time us"] + [m.label for m in shown] + ["wf/ldsm", "SM act%", "FLOP/cyc", "%mma/cyc"]
    lines = []
    for r in doc["rows"]:
        if r["status"] != "ok":
            lines.append([r["rung"], r["status"]] + [""] * (len(header) - 2))
            continue
        vals = r["metrics"]
        t = vals.get("gpu__time_duration.sum")
        cells = [r["rung"], f"{_duration_us(*t):.1f}" if t and _duration_us(*t) is not None else "-"]
        for m in shown:
            x = vals.get(m.name, (None, ""))[0]
            cells.append("n/a" if m.name not in vals else f"{x:,.1f}" if isinstance(x, float) else str(x))
        d = r["derived"]
        wf, act, fpc = d["ldsm_wavefronts_per_instruction"], d["sm_active_pct"], d.get("flop_per_cycle")
        pct = r.get("percent_of_mma_sync_per_cycle")
        cells += ["-" if wf is None else f"{wf:.2f}", "-" if act is None else f"{act:.1f}",
                  "-" if fpc is None else f"{fpc:,.0f}", "-" if pct is None else f"{pct:.1f}"]
        lines.append(cells)
    row = doc["shape"]
    out = [f"flashrung ladder --profile — evidence level: profile (ncu {doc.get('ncu_version') or '?'}, "
           f"--clock-control none, one launch per rung at B{row['batch']} H{row['heads_q']} S{row['seqlen_q']} "
           f"d{row['headdim']} {row['dtype']} {'causal' if row['causal'] else 'full'})",
           report._table(header, lines, left=1),
           "columns: " + "; ".join(f"{m.label} = {m.name} ({m.why})" for m in shown),
           "wf/ldsm = ldsm wavefronts / ldsm instructions (1 per 8x8 phase is conflict-free, 4 per x4); "
           "SM act% = sm__cycles_active / sm__cycles_elapsed; FLOP/cyc = the launch's FLOPs (attention: "
           "4·B·H·S²·d, causal /2; GEMM: 2·8192³) / sm__cycles_elapsed.avg, the whole GPU's FLOPs per SM "
           "clock cycle; %mma/cyc = a rung's FLOP/cyc / the best mma.sync tile's (the share of the "
           "ceiling at one clock)"]
    if doc.get("dropped"):
        out.append("not collected (this ncu or GPU has no such metric): " + ", ".join(doc["dropped"]))
    for r in doc["rows"]:
        if r["status"] != "ok":
            out.append(f"{r['rung']}: {r['reason']}")
    return "\n".join(out)


def profile_one(ncu: str, rung: str, metrics: list[str], dropped: list[str], row: suites.Row = PROFILE_ROW, *,
                flops: float | None = None) -> dict:
    """One rung (or ceiling tile) under ncu; metrics ncu rejects are dropped (into ``dropped``) and
    the run retried. ``flops``: the launch's FLOPs, for FLOPs per cycle."""
    from flashrung.bench import manifest as manifest_mod
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(manifest_mod.REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.pop("TRITON_INTERPRET", None)
    while True:
        try:
            proc = subprocess.run(ncu_command(ncu, metrics, rung, row), capture_output=True, text=True, env=env,
                                  timeout=PROFILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"rung": rung, "status": "error", "reason": f"ncu did not finish in {PROFILE_TIMEOUT_S} s"}
        output = proc.stdout + "\n" + proc.stderr
        rows = parse_ncu_csv(proc.stdout)
        if rows:
            values = {k: v for k, v in rows[0].items() if k in metrics}
            return {"rung": rung, "status": "ok", "kernel": rows[0].get("Kernel Name", ("?", ""))[0],
                    "metrics": values, "derived": derived(values, flops)}
        bad = rejected_metrics(output, metrics)
        if bad and len(bad) < len(metrics):
            dropped.extend(bad)
            metrics[:] = [m for m in metrics if m not in bad]
            continue
        tail = " | ".join(ln.strip() for ln in output.strip().splitlines()[-6:])
        why = "ncu profiled no kernel" if proc.returncode == 0 else f"ncu exited {proc.returncode}"
        return {"rung": rung, "status": "error", "reason": f"{why}: {tail[:600]}"}


def cmd_profile(args) -> int:
    ncu = shutil.which("ncu")
    if ncu is None:
        print("flashrung ladder --profile: ncu (Nsight Compute) is not on PATH; install the CUDA toolkit's "
              "Nsight Compute or add its directory to PATH. Nothing was profiled.", file=sys.stderr)
        return 2
    from flashrung.bench.cli import gpu_available
    ok, what = gpu_available()
    if not ok:
        print(f"flashrung ladder --profile: needs a GPU: {what}. Nothing was profiled.", file=sys.stderr)
        return 2
    from flashrung.bench import manifest as manifest_mod
    from tqdm import tqdm

    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    manifest = manifest_mod.start(list(sys.argv))
    row, config = profile_row(args.config)
    rungs = selected_rungs(args.only)
    from flashrung.kernels.ladder.ceiling import CEILING_TILES
    metrics, dropped, rows = [m.name for m in PROFILE_METRICS], [], []
    row_flops, _ = row.flops(numerators.FA_HALF)
    targets = [(r.name, "rung", row_flops) for r in rungs]
    targets += [(f"{PEER_TARGET}{name}", "peer", row_flops) for name in dict.fromkeys(args.peer)]
    targets += [(ceiling_target(i), "ceiling", 2.0 * GEMM_SIZE ** 3) for i in range(len(CEILING_TILES))]
    for target, kind, flops in tqdm(targets, desc="ncu", unit="kernel", file=sys.stderr, disable=args.no_progress):
        skip = SKIPS.get((target, config))
        got = ({"rung": target, "status": "skipped", "reason": skip} if skip
               else profile_one(ncu, target, metrics, dropped, row, flops=flops))
        got["kind"] = kind
        if kind == "ceiling":   # the table names the tile, the JSON keeps the target too
            got.update(target=target, rung=f"mma.sync {CEILING_TILES[int(target[len(CEILING_TARGET):])].label()}")
        elif kind == "peer":
            got.update(target=target, rung=f"peer {target[len(PEER_TARGET):]}")
        rows.append(got)
    percent_per_cycle(rows)
    manifest_mod.finish(manifest)
    doc = {"mode": "profile", "gpu": what, "shape": row.plan(), "config": config,
           "ncu_version": version[-1] if version else None,
           "ncu_command": " ".join(ncu_command("ncu", metrics, "<rung>", row)), "metrics": metrics, "dropped": dropped,
           "evidence": "profile: ncu hardware counters, clocks not locked, one launch per rung and per mma.sync "
                       f"ceiling tile (8192³ GEMM in {row.dtype})",
           "rows": rows, "manifest": manifest}
    print(format_profile(doc), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        _emit_json(doc, args.json)
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1


def profile_target_main(argv: list[str] | None = None) -> int:
    """The profiled child: one rung (through the public entry point), a peer at the same shape, or
    a ceiling tile at 8192³, twice (ncu skips the first launch and measures the second)."""
    p = argparse.ArgumentParser(prog="python -m flashrung.kernels.ladder.cli")
    p.add_argument("--profile-target", required=True, type=_profile_target, metavar="RUNG",
                   help=f"a rung, {CEILING_TARGET}N (the mma.sync ceiling's tile N at 8192³) or "
                        f"{PEER_TARGET}NAME (a peer at this shape)")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--seqlen", type=int, required=True)
    p.add_argument("--headdim", type=int, required=True)
    p.add_argument("--dtype", choices=suites.DTYPES, required=True)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, required=True)
    args = p.parse_args(argv)
    import torch
    import flashrung
    from flashrung.bench import peers

    row = suites.Row(batch=args.batch, seqlen_q=args.seqlen, seqlen_k=args.seqlen, heads_q=args.heads,
                     heads_kv=args.heads, headdim=args.headdim, dtype=args.dtype, causal=args.causal, mode="fwd")
    if args.profile_target.startswith(PEER_TARGET):
        name = args.profile_target[len(PEER_TARGET):]
        prepared = peers.prepare(name, row, peers.make_inputs(row))
        for _ in range(2):
            prepared.fn()
        torch.cuda.synchronize()
        print(f"ran the peer {name} twice at {row.label()}", file=sys.stderr)
        return 0
    if args.profile_target.startswith(CEILING_TARGET):
        from flashrung.kernels.ladder.ceiling import CEILING_TILES, mma_v2_gemm
        tile = CEILING_TILES[int(args.profile_target[len(CEILING_TARGET):])]
        g = torch.Generator(device="cuda").manual_seed(0)
        a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", generator=g).to(peers.torch_dtype(args.dtype))
                for _ in range(2))
        for _ in range(2):
            mma_v2_gemm(a, b, tile)
        torch.cuda.synchronize()
        print(f"ran the mma.sync GEMM {tile.label()} twice at {GEMM_SIZE}³ {args.dtype}", file=sys.stderr)
        return 0
    inputs = peers.make_inputs(row)
    for _ in range(2):
        flashrung.attention(inputs.q, inputs.k, inputs.v, causal=row.causal, softmax_scale=inputs.scale,
                            impl=args.profile_target)
    torch.cuda.synchronize()
    print(f"ran {args.profile_target} twice at {row.label()} ({flashrung.last_dispatch('fwd')})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(profile_target_main())
