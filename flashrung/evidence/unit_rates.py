"""Results per SM clock cycle of the exponential unit (``MUFU.EX2``) and of the FMA pipe, measured.

The softmax's cycle budget in ``hopper.fwd`` (docs/hopper.md, *Where a K/V step's cycles go*) is
written against a MUFU rate: 64 exponentials per thread and K/V step at d128 take 512 cycles of a
warp's SM sub-partition if ``MUFU.EX2`` returns 16 results per SM cycle (4 per sub-partition: one
warp instruction every 8 cycles — the spacing ptxas gives consecutive ``MUFU.EX2`` in the
kernel's SASS). This probe measures the rate instead of assuming it: one CTA per SM, ``warps``
warps, each thread ``chains`` independent dependency chains (enough to cover the unit's latency),
``rounds`` rounds of one operation per chain; every thread reads ``%clock64`` around the loop and
the rate is the CTA's results over its slowest thread's cycles (median over the SMs).

``python -m flashrung.evidence.unit_rates [--json PATH]`` (needs a CUDA GPU). Without one,
:func:`probe_census` compiles the probe for sm_90a and counts its loop's instructions, so the
measured loop is known to hold one ``MUFU.EX2`` (or ``FFMA``) per chain and round.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import triton
import triton.language as tl

from flashrung.evidence import census

OPS = {"ex2": 0, "ffma": 1}
WARPS = (4, 8)           # one and two warps per SM sub-partition
CHAINS = (8, 32)         # independent chains per thread
ROUNDS = 2048


@triton.jit
def _rate_probe(x_ptr, out_ptr, cycles_ptr, ROUNDS: tl.constexpr, CHAINS: tl.constexpr, OP: tl.constexpr,
                WARPS: tl.constexpr):
    offs = tl.arange(0, CHAINS * 32 * WARPS)
    x = tl.load(x_ptr + offs)
    t0 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [offs], dtype=tl.int64, is_pure=False, pack=1)
    for _ in range(ROUNDS):
        if OP == 0:
            x = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:
            x = x * 0.999 + 0.0001
    t1 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [offs], dtype=tl.int64, is_pure=False, pack=1)
    base = tl.program_id(0) * CHAINS * 32 * WARPS
    tl.store(out_ptr + base + offs, x)       # the chains' results are used: nothing is folded away
    tl.store(cycles_ptr + base + offs, t1 - t0)


def _spec(op: str, warps: int, chains: int, rounds: int = ROUNDS) -> census.CensusSpec:
    return census.CensusSpec(kernel=f"probe.rate.{op}", config={"op": op, "warps": warps, "chains": chains},
                             fn=_rate_probe, signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "cycles_ptr": "*i64"},
                             constexprs={"ROUNDS": rounds, "CHAINS": chains, "OP": OPS[op], "WARPS": warps},
                             num_warps=warps)


def probe_census(arch: str = "sm_90a", warps: int = 4, chains: int = 8) -> dict:
    """The probe's loop for each operation, compiled for ``arch`` (no GPU): ``{op: {"MUFU.EX2":
    n, "FFMA": n, "length": n}}`` of its innermost loop, per thread and trip."""
    if census.needs_reexec():
        raise RuntimeError("compile without TRITON_INTERPRET=1 (python -m flashrung.evidence.unit_rates --census)")
    out = {}
    for op in OPS:
        row = census.census_one(_spec(op, warps, chains), arch)
        if row.error:
            raise RuntimeError(f"{op}: {row.error}")
        loop = max(row.loops, key=lambda lp: lp["length"])
        out[op] = {"MUFU.EX2": loop["MUFU.EX2"], "FFMA": loop["FFMA"], "length": loop["length"]}
    return out


def measure(op: str, warps: int, chains: int, rounds: int = ROUNDS, repeats: int = 3) -> float:
    """Results per SM cycle of ``op`` (one CTA per SM; median over SMs of each CTA's results over its
    slowest thread's cycles)."""
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = chains * 32 * warps
    x = torch.rand(n, device="cuda") * -1.0
    out = torch.empty(sms * n, device="cuda")
    cycles = torch.empty(sms * n, device="cuda", dtype=torch.int64)
    for _ in range(repeats):        # the last launch is read; the first compiles and warms the clocks
        _rate_probe[(sms,)](x, out, cycles, ROUNDS=rounds, CHAINS=chains, OP=OPS[op], WARPS=warps, num_warps=warps)
    torch.cuda.synchronize()
    per_cta = cycles.view(sms, n).max(1).values.tolist()
    return rounds * n / statistics.median(per_cta)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashrung.evidence.unit_rates", description=__doc__.split("\n")[0])
    ap.add_argument("--census", action="store_true", help="compile the probe for sm_90a and count its loop (no GPU)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if args.census:
        print(json.dumps(probe_census()))
        return 0
    import torch

    rows = [dict(op=op, warps=w, chains=c, per_sm_cycle=measure(op, w, c)) for op in OPS for w in WARPS for c in CHAINS]
    print(f"{torch.cuda.get_device_name(0)}: results per SM cycle, one CTA per SM, {ROUNDS} rounds")
    print(f"{'op':5s} {'warps':>5s} {'chains':>6s} {'per SM cycle':>12s}")
    for r in rows:
        print(f"{r['op']:5s} {r['warps']:5d} {r['chains']:6d} {r['per_sm_cycle']:12.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(0), rounds=ROUNDS, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
