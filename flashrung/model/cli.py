"""``flashrung model``: the resource ledger of one tile, a calibration run, or a bench comparison.

    flashrung model --gpu b200 --tile 128x128 --headdim 128 [--json]
    flashrung model --gpu h200 --direction bwd
    flashrung model --measure [--out h200.json]        (on an sm_90 GPU)
    flashrung model --gpu h200 --against results.json
    flashrung model --l2 [--batch 32 --heads 16 --seqlen 1024 --headdim 128 --causal]
    flashrung model --l2 --packed 8192,4096x2,1024x8 [--heads 16 --headdim 128 --causal]
"""
from __future__ import annotations

import argparse
import json
import sys

from flashrung.model import ledger as L
from flashrung.model import levers
from flashrung.model import rates as R
from flashrung import jsonfile

def register(subparsers) -> None:
    p = subparsers.add_parser(
        "model", help="feeds-and-speeds ledger of one attention tile; --measure calibrates it",
        description="Seed 001's per-tile resource ledger (tensor, shared-memory and exponential "
                    "cycles), its lower bound max(...), the crossover head dimension and a "
                    "sensitivity table; --measure runs the H200 microbenchmarks; --against "
                    "compares a bench result with the modeled lower bound.")
    p.add_argument("--gpu", default="h200", choices=sorted(R.TABLES),
                   help="rate table (default h200: quoted Hopper rates, measured ones once stored)")
    p.add_argument("--tile", default="128x128", help="M x N of the work tile (default 128x128)")
    p.add_argument("--headdim", type=int, default=128, help="head dimension d (default 128)")
    p.add_argument("--headdim-v", type=int, default=None, help="value head dimension (default d)")
    p.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    p.add_argument("--dtype", choices=sorted(L.ELEMENT_BYTES), default="bf16")
    p.add_argument("--rates", metavar="JSON", default=None,
                   help="a measured rate table to use instead of the stored one")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--measure", action="store_true",
                   help="run the microbenchmarks on this GPU and store the measured rate table")
    p.add_argument("--out", default=None,
                   help="where --measure writes (default flashrung/model/measured/<gpu>.json)")
    p.add_argument("--repeats", type=int, default=3, help="--measure: runs per microbenchmark")
    p.add_argument("--against", metavar="RESULTS_JSON", default=None,
                   help="report measured time / modeled lower bound for every row of a bench result")
    p.add_argument("--l2", action="store_true",
                   help="model the DRAM reads of hopper.fwd's tile orders (an LRU L2 replay of the grid): "
                        "the default launch and, for causal rows, the stride and the balanced lists at each "
                        "LPT section size; the fa4-protocol forward rows unless --seqlen is given")
    p.add_argument("--batch", type=int, default=1, help="--l2: batch (default 1)")
    p.add_argument("--heads", type=int, default=16, help="--l2: query heads (default 16)")
    p.add_argument("--heads-kv", type=int, default=None, help="--l2: K/V heads (default --heads)")
    p.add_argument("--seqlen", type=int, default=None, help="--l2: Sq (and Sk unless --seqlen-k)")
    p.add_argument("--seqlen-k", type=int, default=None, help="--l2: Sk (default --seqlen)")
    p.add_argument("--causal", action="store_true", help="--l2: causal mask")
    p.add_argument("--packed", metavar="LENGTHS", default=None,
                   help="--l2: packed sequences (flash-attn's varlen) of these lengths, queries and keys alike, "
                        "LxN for N of length L (--packed 8192,4096x2,1024x8): the pack's table heaviest first "
                        "and in L2 sections of each size; instead of --batch/--seqlen")
    p.add_argument("--capacity-mib", type=int, default=None,
                   help="--l2: the modelled L2 in MiB (default: the H200 fit, 40)")
    p.set_defaults(func=run)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 else f"{x:,.1f}"


def _rates_lines(table: R.RateTable) -> list[str]:
    lines = [f"rates: {table.name} — {table.gpu}"]
    for key, fig in table.figures().items():
        lines.append(f"  {key:<11} {fig.value:>12.6g}  {fig.unit}  [{fig.provenance}] {fig.source}")
    if table.exp_mma_coupling is not None:
        fig = table.exp_mma_coupling
        lines.append(f"  {'exp_mma_k':<11} {fig.value:>12.6g}  {fig.unit}  [{fig.provenance}] {fig.source}")
    return lines


def ledger_report(table: R.RateTable, tile: L.Tile, direction: str, element_bytes: int) -> dict:
    if direction == "fwd":
        led = L.forward(table, tile, element_bytes)
    else:
        led = L.backward(table, tile, element_bytes)
    out = led.to_json()
    out["gpu"] = table.name
    out["rates_table"] = table.to_json()
    out["d_star"] = L.crossover_headdim(table)
    out["d_star_coupled"] = L.coupled_crossover_headdim(table)
    if direction == "fwd":
        out["sensitivity"] = [r.to_json() for r in L.sensitivity(table, tile, element_bytes)]
        phi = levers.balanced_fraction(table)
        out["levers"] = {
            "exp_binds": levers.exp_binds(table, tile, element_bytes),
            "exp_split_balanced_fraction": phi,
            "exp_split_at_balance": levers.price_exp_split(table, tile, phi, element_bytes).to_json(),
            "exp_split_coupled_unbinding_fraction": levers.coupled_unbinding_fraction(table, tile, element_bytes),
            "conditional_rescale_all_skipped": levers.price_conditional_rescale(
                table, tile, 1.0, element_bytes).to_json(),
        }
    return out


def format_ledger(rep: dict, table: R.RateTable) -> str:
    t = rep["tile"]
    lines = [f"flashrung model — {rep['direction']} tile M={t['m']} N={t['n']} d={t['d']}"
             + (f" dv={t['dv']}" if t["dv"] != t["d"] else "") + f", {rep['element_bytes']}-byte elements"]
    lines += _rates_lines(table)
    lines.append("")
    if rep["direction"] == "fwd":
        lines += [
            f"  {'resource':<8} {'work':<44} {'cycles':>10}",
            f"  {'MMA':<8} {'2·M·N·(d+dv) = ' + _fmt(rep['flops']) + ' FLOP':<44} {_fmt(rep['mma_cycles']):>10}",
            f"  {'SMEM':<8} {'QK ' + _fmt(rep['qk_smem_bytes']) + ' B (' + str(rep['qk_instructions']) + ' instr) + PV ' + _fmt(rep['pv_smem_bytes']) + ' B (' + str(rep['pv_instructions']) + ')':<44} {_fmt(rep['smem_cycles']):>10}",
            f"  {'exp':<8} {'M·N = ' + _fmt(rep['exps']) + ' exp2':<44} {_fmt(rep['exp_cycles']):>10}",
        ]
    else:
        lines += [
            f"  {'resource':<22} {'cycles':>10}",
            f"  {'MMA (five MMAs)':<22} {_fmt(rep['mma_cycles']):>10}",
            f"  {'SMEM MMA operands':<22} {_fmt(rep['smem_mma_cycles']):>10}",
            f"  {'SMEM dS write':<22} {_fmt(rep['smem_ds_cycles']):>10}",
            f"  {'SMEM dQ write+read':<22} {_fmt(rep['smem_dq_cycles']):>10}",
            f"  {'SMEM total':<22} {_fmt(rep['smem_cycles']):>10}",
            f"  {'exp':<22} {_fmt(rep['exp_cycles']):>10}",
        ]
    lines += [
        "",
        f"lower bound max(...) = {_fmt(rep['bound'])} cycles, bound by "
        f"{L.describe_bound(tuple(rep['bound_resources']))} (perfect overlap; not a runtime)",
        f"serial subtotal      = {_fmt(rep['serial'])} cycles (no overlap; not an upper bound)",
        f"crossover d* = R_MMA / (4·R_exp) = {rep['d_star']:.4g}: exponentials bind below it, MMA above",
    ]
    if rep.get("coupled"):
        c = rep["coupled"]
        lines += [
            "",
            f"beside the tensor pipe the exponentials run at R_exp·(1 − k·busy share), k = {c['k']:.4g} "
            f"[{table.exp_mma_coupling.provenance}]:",
            f"  exp {_fmt(c['exp_cycles'])} cycles (T_exp + k·T_MMA); lower bound {_fmt(c['bound'])} cycles, bound by "
            f"{L.describe_bound(tuple(c['bound_resources']))}; crossover d* = R_MMA / (4·R_exp·(1 − k)) = "
            f"{rep['d_star_coupled']:.4g}",
        ]
    if rep["direction"] == "fwd":
        lines += ["", "sensitivity (one synthetic rate change per row):",
                  f"  {'mutation':<38} {'MMA':>8} {'SMEM':>8} {'exp':>8}  largest"]
        for row in rep["sensitivity"]:
            lines.append(f"  {row['mutation']:<38} {_fmt(row['mma_cycles']):>8} {_fmt(row['smem_cycles']):>8} "
                         f"{_fmt(row['exp_cycles']):>8}  {L.describe_bound(tuple(row['bound_resources']))}")
        lv = rep["levers"]
        split = lv["exp_split_at_balance"]
        resc = lv["conditional_rescale_all_skipped"]
        lines += [
            "", "FA4 softmax levers (seed 001 0x09), priced:",
            f"  exp path binds this tile: {'yes' if lv['exp_binds'] else 'no'}",
            f"  software exp2 on the FMA pipe: MUFU and FMA balance at {lv['exp_split_balanced_fraction']:.1%} "
            f"emulated -> exp {_fmt(split['exp'])}, fma {_fmt(split['fma'])} cycles; bound "
            f"{_fmt(split['bound'])} ({L.describe_bound(tuple(split['bound_resources']))})",
        ]
        if lv.get("exp_split_coupled_unbinding_fraction") is not None:
            lines.append(f"  beside the tensor pipe (k above) the exponentials stop binding from "
                         f"{lv['exp_split_coupled_unbinding_fraction']:.1%} emulated (issue slots not counted)")
        lines += [
            f"  conditional rescale: skipping every O rescale saves {_fmt(resc['saved_cycles'])} FMA-pipe "
            f"cycles per tile ({resc['share_of_bound']:.1%} of the bound)",
        ]
    return "\n".join(lines)


def _run_measure(args) -> int:
    from flashrung.model import measure
    try:
        result = measure.measure(repeats=args.repeats, table=args.gpu, progress=not args.json)
    except RuntimeError as exc:
        print(f"flashrung model --measure: {exc}", file=sys.stderr)
        return 2
    out = args.out or R.measured_path(args.gpu)
    jsonfile.write(result, out)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    quoted = R.TABLES.get(args.gpu, R.H200_QUOTED)
    measured = R.RateTable.from_json(result["table"])
    print(f"measured on {result['manifest']['gpu']} ({result['manifest']['sm_count']} SMs), written to {out}")
    print(f"  {'rate':<11} {'measured':>12} {'quoted':>12} {'ratio':>7}  unit")
    for key, fig in measured.figures().items():
        q = getattr(quoted, key).value
        print(f"  {key:<11} {fig.value:>12.5g} {q:>12.5g} {fig.value / q:>7.3f}  {fig.unit}")
    print(f"  crossover d* = {L.crossover_headdim(measured):.4g} (quoted {L.crossover_headdim(quoted):.4g})")
    return 0


def _run_against(args, table: R.RateTable, tile: L.Tile, element_bytes: int) -> int:
    from flashrung.model import against as A
    try:
        rows = A.against(table, A.load(args.against), (tile.m, tile.n), element_bytes)
    except (OSError, ValueError) as exc:
        print(f"flashrung model --against: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"gpu": table.name, "rates_table": table.to_json(),
                          "tile": [tile.m, tile.n], "rows": [r.to_json() for r in rows]}, indent=1))
    else:
        print(A.format_table(rows, table))
    return 0


def _run_l2(args) -> int:
    from flashrung.model import l2

    capacity = args.capacity_mib if args.capacity_mib is not None else l2.H200_CAPACITY_MIB
    try:
        if capacity < 1:
            raise ValueError(f"--capacity-mib must be >= 1, got {capacity}")
        if args.packed is not None:
            from flashrung.bench.suites import parse_packed

            if args.seqlen is not None or args.seqlen_k is not None or args.batch != 1:
                raise ValueError("--packed gives the sequences' lengths: it replaces --batch, --seqlen and --seqlen-k")
            reports = [l2.report_pack(parse_packed(args.packed), heads_q=args.heads,
                                      heads_kv=args.heads_kv or args.heads, head_dim=args.headdim, causal=args.causal,
                                      capacity_mib=capacity)]
        else:
            if args.seqlen is None:
                from flashrung.bench.suites import suite_rows
                shapes = [dict(batch=r.batch, heads_q=r.heads_q, heads_kv=r.heads_kv, seqlen_q=r.seqlen_q,
                               seqlen_k=r.seqlen_k, head_dim=r.headdim, causal=r.causal)
                          for r in suite_rows("fa4-protocol", "fwd")]
            else:
                shapes = [dict(batch=args.batch, heads_q=args.heads, heads_kv=args.heads_kv or args.heads,
                               seqlen_q=args.seqlen, seqlen_k=args.seqlen_k or args.seqlen, head_dim=args.headdim,
                               causal=args.causal)]
            reports = [l2.report_row(**shape, capacity_mib=capacity) for shape in shapes]
    except ValueError as exc:
        print(f"flashrung model --l2: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from flashrung.bench import manifest

        print(json.dumps({"capacity_mib": capacity, "evidence": "model (LRU replay of the tile order), not a "
                          "measurement", "rows": [r.to_json() for r in reports],
                          "manifest": {"command": sys.argv, "identity": {"git": manifest.git_state(),
                                                                         "kernel_source": manifest.source_hash()}}},
                         indent=1))
    else:
        print(l2.format_reports(reports, capacity))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.measure:
        return _run_measure(args)
    if args.l2:
        return _run_l2(args)
    if args.packed is not None:
        print("flashrung model: --packed models a pack's L2 reads: it needs --l2", file=sys.stderr)
        return 2
    try:
        table = R.get_table(args.gpu, args.rates)
        tile = L.Tile.parse(args.tile, args.headdim, args.headdim_v)
    except ValueError as exc:
        print(f"flashrung model: {exc}", file=sys.stderr)
        return 2
    element_bytes = L.ELEMENT_BYTES[args.dtype]
    if args.against:
        return _run_against(args, table, tile, element_bytes)
    try:
        rep = ledger_report(table, tile, args.direction, element_bytes)
    except ValueError as exc:
        print(f"flashrung model: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=1) if args.json else format_ledger(rep, table))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashrung")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
