"""The ladder's static evidence: census rows of chosen rung configurations, the v3 -> v4
exponential closed form, and the bank-conflict model behind v2.

Evidence levels (seed 001, 0x0F): the census is SASS level (what instructions exist, not how long
they take); ``ldmatrix_wavefronts`` is a model of the shared-memory banks applied to the layout
the kernels declare — a prediction for ncu to confirm on the GPU, not a measurement.

``python -m flashrung.kernels.ladder.evidence`` prints the census of every rung for sm_90a,
sm_80 and sm_120 (``--json`` for rows). Kernels cannot be compiled under TRITON_INTERPRET=1, so
the module re-executes itself without it when needed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

ARCHES = ("sm_90a", "sm_80", "sm_120")
BANKS = 32             # shared-memory banks
BANK_BYTES = 4         # bytes per bank
LDMATRIX_ROWS = 8      # rows of one 8x8 ldmatrix phase, 16 bytes each


# --------------------------------------------------------------------------------------------
# Selecting and compiling configurations
# --------------------------------------------------------------------------------------------

def find_spec(rung: str, match: dict, dtype: str = "fp16"):
    """The one census spec of ``rung`` whose config contains ``match``; ``dtype`` "bf16"
    recompiles it with bfloat16 pointers."""
    from flashrung.kernels.ladder import rung as get_rung

    specs = [s for s in get_rung(rung).load().census_specs()
             if all(s.config.get(k) == v for k, v in match.items())]
    if len(specs) != 1:
        raise ValueError(f"match must select exactly one {rung} census spec, got {len(specs)} for {match}")
    spec = specs[0]
    if dtype != "fp16":
        sig = {k: (f"*{dtype}" if v == "*fp16" else v) for k, v in spec.signature.items()}
        spec = dataclasses.replace(spec, signature=sig, config={**spec.config, "dtype": dtype})
    return spec


# the seed's two configurations as launched: (batch, seqlen, heads) of contiguous (B, S, H, D)
# tensors, whose integer arguments Triton specializes the timed binary on (``census.as_launched``)
SEED_LAUNCHES = {"A": dict(batch=2, seqlen=2048, heads=16), "B": dict(batch=1, seqlen=32768, heads=16)}


def launched_spec(spec, launch: str):
    """``spec`` as :func:`common.launch` specializes it at seed configuration ``launch`` ("A" or
    "B"): strides, lengths and heads divisible by 16, ``group`` = 1, pointers 16-byte aligned."""
    from flashrung.evidence.census import as_launched
    from flashrung.kernels.ladder import common

    if launch not in SEED_LAUNCHES:
        raise ValueError(f"launch must be one of {sorted(SEED_LAUNCHES)}, got {launch!r}")
    values = common.launch_values(head_dim=spec.config["head_dim"], **SEED_LAUNCHES[launch])
    return as_launched(spec, {k: v for k, v in values.items() if k in spec.signature}, launch)


def _row(selector: dict) -> dict:
    from flashrung.evidence.census import census_one

    spec = find_spec(selector["rung"], selector.get("match", {}), selector.get("dtype", "fp16"))
    if selector.get("launch"):
        spec = launched_spec(spec, selector["launch"])
    row = census_one(spec, selector["arch"]).to_json()
    row["selector"] = selector
    return row


def rows_for(selectors: list[dict], jobs: int = 1) -> list[dict]:
    """Census rows for ``selectors`` ({"rung", "arch", "match", "dtype"}, and "launch": "A" or "B"
    for the binary a launch at that seed configuration runs), in order."""
    if jobs <= 1 or len(selectors) <= 1:
        return [_row(s) for s in selectors]
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_row, selectors))


def rows_command(selectors: list[dict], jobs: int = 1) -> list[str]:
    """The command line that prints ``rows_for(selectors)`` as JSON (run it with
    ``census.interpreter_free_env()``)."""
    return [sys.executable, "-m", "flashrung.kernels.ladder.evidence", "--select", json.dumps(selectors),
            "--jobs", str(jobs), "--json"]


def rows_in_subprocess(selectors: list[dict], jobs: int = 1, timeout: float = 900) -> list[dict]:
    """``rows_for`` in a fresh interpreter-free Python (for callers running under
    TRITON_INTERPRET=1, e.g. the CPU test suite)."""
    from flashrung.evidence.census import interpreter_free_env

    out = subprocess.run(rows_command(selectors, jobs), capture_output=True, text=True, env=interpreter_free_env(),
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"ladder census failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout)


# --------------------------------------------------------------------------------------------
# Derived quantities
# --------------------------------------------------------------------------------------------

def key_loops(row: dict) -> list[dict]:
    """The key loops of a rung's census row (``census.innermost_loops``): its trips, unmasked then
    masked. A span that holds an ``EXIT`` is not one: ptxas places an mbarrier spin's retry block
    after the kernel's exit and branches back into the trip from there (ladder.v22's copy wait),
    and no rung's key loop holds the exit (one tile per CTA; v5's persistent arm walks its tiles in
    a loop around the key loop, never innermost)."""
    return [loop for loop in row.get("loops") or [] if not loop.get("EXIT")]


def opcode_count(row: dict, *prefixes: str) -> int:
    """Static count of the opcodes of ``row`` that start with any of ``prefixes``."""
    return sum(n for op, n in row["sass"]["opcodes"].items() if op.startswith(prefixes))


def spill_instructions(row: dict) -> int:
    """Static LDL + STL count: the local-memory instructions, which in these kernels are register
    spills (``spill_bytes`` is the same spill traffic in bytes, from ``ptxas -v``)."""
    return opcode_count(row, "LDL", "STL")


def exp_calls_per_body(block_m: int, block_n: int, num_warps: int) -> int:
    """Exponentials per thread per loop body in the mma layout: the thread's share of the score
    tile plus one rescale factor per row it holds (2 rows: r and r+8 of its warp's 16)."""
    return block_m * block_n // (32 * num_warps) + 2 * (block_m // (16 * num_warps))


def fp32_pipe(row: dict) -> int:
    return opcode_count(row, "FFMA", "FADD", "FMUL")


def exp_closed_form(v3_row: dict, v4_row: dict) -> dict:
    """What v4's lever removed, by family (static SASS counts, v3 minus v4)."""
    return {
        "MUFU.EX2": (v3_row["sass"]["MUFU.EX2"], v4_row["sass"]["MUFU.EX2"]),
        "FFMA.FTZ.RM": opcode_count(v3_row, "FFMA.FTZ.RM") - opcode_count(v4_row, "FFMA.FTZ.RM"),
        "FADD.FTZ.SAT": opcode_count(v3_row, "FADD.FTZ.SAT") - opcode_count(v4_row, "FADD.FTZ.SAT"),
        "FFMA.FTZ": (opcode_count(v3_row, "FFMA.FTZ") - opcode_count(v3_row, "FFMA.FTZ.RM"))
                    - (opcode_count(v4_row, "FFMA.FTZ") - opcode_count(v4_row, "FFMA.FTZ.RM")),
        "fp32_pipe": fp32_pipe(v3_row) - fp32_pipe(v4_row),
        "total": v3_row["sass"]["total"] - v4_row["sass"]["total"],
    }


def swizzled_chunk(row: int, chunk: int, vec: int, per_phase: int, max_phase: int) -> int:
    """The 16-byte chunk a row-major (row, chunk) lands in under ``SwizzledSharedLayout(vec,
    per_phase, max_phase, [1, 0])`` with ``vec`` = 8 halves per chunk; identity for (1, 1, 1)."""
    if vec == 1:
        return chunk
    return chunk ^ ((row // per_phase) % max_phase)


def ldmatrix_wavefronts(head_dim: int, vec: int, per_phase: int, max_phase: int,
                        element_bytes: int = 2) -> int:
    """Modeled wavefronts of one 8x8 ldmatrix phase (8 lanes, each a 16-byte row segment of 8
    consecutive tile rows at one column chunk): the most 16-byte segments any bank must serve,
    worst case over the row group and chunk. 1 is conflict-free; ldmatrix.x4 issues 4 phases."""
    row_bytes = head_dim * element_bytes
    chunks = row_bytes // 16
    worst = 0
    for r0 in range(0, LDMATRIX_ROWS * max(1, max_phase), LDMATRIX_ROWS):
        for c in range(chunks):
            load = [0] * BANKS
            for r in range(r0, r0 + LDMATRIX_ROWS):
                start = r * row_bytes + swizzled_chunk(r, c, vec, per_phase, max_phase) * 16
                for b in range(16 // BANK_BYTES):
                    load[(start // BANK_BYTES + b) % BANKS] += 1
            worst = max(worst, max(load))
    return worst


def layout_fields(layout) -> tuple[int, int, int]:
    return layout.vec, layout.per_phase, layout.max_phase


# --------------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------------

def all_selectors(arches=ARCHES) -> list[dict]:
    from flashrung.kernels.ladder import RUNGS

    selectors = []
    for arch in arches:
        for r in RUNGS:
            for spec in r.load().census_specs():
                if arch in spec.arches:
                    selectors.append({"rung": r.name, "arch": arch, "match": dict(spec.config)})
    return selectors


def format_table(rows: list[dict]) -> str:
    head = (f"{'arch':7} {'rung':10} {'config':42} {'regs':>4} {'smem B':>7} {'spillB':>6} {'HMMA':>5} "
            f"{'LDSM':>5} {'LDGSTS':>6} {'LDG':>4} {'EX2':>4} {'FFMA':>5} {'VOTE':>4} {'total':>6}")
    lines = [head, "-" * len(head)]
    for row in rows:
        c = row["config"]
        shown = ("variant",) if "variant" in c else tuple(c)   # v7: the variant names the switches
        extra = [f"{k}={v}" for k, v in c.items()
                 if k in shown and k not in ("head_dim", "causal", "dtype", "tile", "num_warps")
                 and v is not None]
        desc = f"d{c['head_dim']} {'causal' if c['causal'] else 'full'} {c['tile']} " + " ".join(extra)
        if row.get("error"):
            lines.append(f"{row['arch']:7} {row['kernel']:10} {desc[:42]:42} ERROR {row['error'][:80]}")
            continue
        lines.append(
            f"{row['arch']:7} {row['kernel']:10} {desc[:42]:42} {row['regs']:>4} {row['smem_bytes']:>7} "
            f"{row['spill_bytes']:>6} {row['sass']['HMMA']:>5} {row['sass']['LDSM']:>5} "
            f"{row['sass']['LDGSTS']:>6} {row['sass']['LDG']:>4} {row['sass']['MUFU.EX2']:>4} "
            f"{row['sass']['FFMA']:>5} {opcode_count(row, 'VOTE'):>4} {row['sass']['total']:>6}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrung.kernels.ladder.evidence",
                                     description="Census of the ladder rungs (no GPU needed).")
    parser.add_argument("--arch", action="append", choices=ARCHES, help="repeatable; default all three")
    parser.add_argument("--select", help="JSON list of {rung, arch, match, dtype, launch} selectors")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    args = parser.parse_args(argv)

    from flashrung.evidence.census import interpreter_free_env, needs_reexec
    if needs_reexec():
        return subprocess.call([sys.executable, "-m", "flashrung.kernels.ladder.evidence"]
                               + list(argv if argv is not None else sys.argv[1:]), env=interpreter_free_env())
    selectors = json.loads(args.select) if args.select else all_selectors(tuple(args.arch or ARCHES))
    rows = rows_for(selectors, jobs=args.jobs)
    print(json.dumps(rows) if args.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
