"""Does a packed 16-bit exp2 cost one MUFU issue for two elements? A census probe (no GPU).

The softmax's exponentials are on the critical path of ``hopper.fwd`` (removing them gains 11.5%
at d128 and 17% at d64, *What is left* in docs/hopper.md), and PTX offers packed forms —
``ex2.approx.f16x2`` and, from sm_90, ``ex2.approx.ftz.bf16x2`` — that take two 16-bit inputs
in one register. If the hardware evaluated both halves in one ``MUFU`` issue, P could be
computed in half the MUFU time (and come out already packed for the PV ``wgmma``). This probe
compiles the same elementwise kernel three ways for a target — packed f16x2, packed bf16x2 and
plain f32 — and counts ``MUFU.EX2`` instructions against the elements each thread evaluates.

Result on sm_90a (ptxas of Triton 3.6): one ``MUFU.EX2`` per element in all three forms — the
packed forms become ``MUFU.EX2.F16`` / ``MUFU.EX2.BF16``, one per half — so a packed exp2 saves
no MUFU issue on Hopper and the lever is rejected before any device time. Run:
``python -m flashrung.evidence.packed_exp2 [--arch sm_90a]``.

``--time`` (a GPU) also times each form's exponentials in a throughput kernel (:func:`rate`): if a
16-bit ``MUFU.EX2`` ran at twice the 32-bit rate, one per half would still halve the time. On an
H100 (2026-12-06): 4094, 4107 and 4032 elements a nanosecond for f32, f16x2 and bf16x2 — 16 a clock
an SM in every form.
"""
from __future__ import annotations

import argparse
import json
import sys

import triton
import triton.language as tl

from flashrung.evidence import census

THREADS = 128            # 4 warps
ELEMENTS_PER_THREAD = 8  # contiguous, so adjacent pairs share one 32-bit register when packed
# form -> (PTX, constraint, pack, element type)
FORMS = {
    "f16x2": ("ex2.approx.f16x2 $0, $1;", "=r,r", 2, "fp16"),
    "bf16x2": ("ex2.approx.ftz.bf16x2 $0, $1;", "=r,r", 2, "bf16"),
    "f32": ("ex2.approx.f32 $0, $1;", "=f,f", 1, "fp32"),
}


@triton.jit
def _exp2_probe(x_ptr, y_ptr, N: tl.constexpr, ASM: tl.constexpr, CONSTRAINT: tl.constexpr,
                PACK: tl.constexpr):
    offs = tl.max_contiguous(tl.multiple_of(tl.arange(0, N), 8), 8)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise(ASM, CONSTRAINT, [x], dtype=x.dtype, is_pure=True, pack=PACK)
    tl.store(y_ptr + offs, y)


# form -> the same exponential of the negated input (2^-x stays in (0, 1] round after round), for
# the throughput kernel
RATE_FORMS = {
    "f32": ("{ .reg .f32 t; neg.f32 t, $1; ex2.approx.ftz.f32 $0, t; }", "=f,f", 1, "float32"),
    "f16x2": ("{ .reg .b32 t; neg.f16x2 t, $1; ex2.approx.f16x2 $0, t; }", "=r,r", 2, "float16"),
    "bf16x2": ("{ .reg .b32 t; neg.bf16x2 t, $1; ex2.approx.ftz.bf16x2 $0, t; }", "=r,r", 2, "bfloat16"),
}
RATE_ELEMENTS_PER_THREAD = 16     # independent chains a thread: MUFU's latency hidden
RATE_ROUNDS = 4096
RATE_CTAS_PER_SM = 16


@triton.jit
def _exp2_rate(x_ptr, ROUNDS: tl.constexpr, E: tl.constexpr, ASM: tl.constexpr, CONSTRAINT: tl.constexpr,
               PACK: tl.constexpr, N: tl.constexpr):
    # N = E · THREADS elements a CTA, E contiguous a thread
    offs = tl.program_id(0) * N + tl.max_contiguous(tl.multiple_of(tl.arange(0, N), E), E)
    x = tl.load(x_ptr + offs)
    for _ in range(ROUNDS):
        x = tl.inline_asm_elementwise(ASM, CONSTRAINT, [x], dtype=x.dtype, is_pure=True, pack=PACK)
    tl.store(x_ptr + offs, x)


def rate(repeats: int = 10) -> dict:
    """``{form: {"ms", "elements_per_ns", "finite"}}``: each form's exponentials a nanosecond over
    the whole GPU (CUDA events, the median of ``repeats`` launches after one warm-up)."""
    import torch

    ctas = torch.cuda.get_device_properties(0).multi_processor_count * RATE_CTAS_PER_SM
    n = ctas * RATE_ELEMENTS_PER_THREAD * THREADS
    out = {}
    for form, (asm, constraint, pack, dtype) in RATE_FORMS.items():
        x = torch.rand(n, device="cuda", dtype=getattr(torch, dtype))
        launch = lambda: _exp2_rate[(ctas,)](x, RATE_ROUNDS, RATE_ELEMENTS_PER_THREAD, asm, constraint, pack,
                                             RATE_ELEMENTS_PER_THREAD * THREADS, num_warps=THREADS // 32)
        launch()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        ms = sorted(times)[len(times) // 2]
        out[form] = {"ms": ms, "elements_per_ns": n * RATE_ROUNDS / ms / 1e6,
                     "finite": bool(torch.isfinite(x.float()).all())}
    return out


def probe(arch: str = "sm_90a") -> dict:
    """``{form: {"mufu_ex2": n, "elements_per_thread": e, "sass": {MUFU opcode: count}}}``."""
    if census.needs_reexec():
        raise RuntimeError("compile without TRITON_INTERPRET=1 (python -m flashrung.evidence.packed_exp2)")
    n = THREADS * ELEMENTS_PER_THREAD
    out = {}
    for form, (asm, constraint, pack, dtype) in FORMS.items():
        spec = census.CensusSpec(kernel=f"probe.exp2.{form}", config={"form": form}, fn=_exp2_probe,
                                 signature={"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}"},
                                 constexprs={"N": n, "ASM": asm, "CONSTRAINT": constraint, "PACK": pack},
                                 num_warps=THREADS // 32)
        row = census.census_one(spec, arch)
        if row.error:
            raise RuntimeError(f"{form}: {row.error}")
        out[form] = {"mufu_ex2": row.sass["MUFU.EX2"], "elements_per_thread": ELEMENTS_PER_THREAD,
                     "sass": {op: c for op, c in row.sass["opcodes"].items() if op.startswith("MUFU")}}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90a", choices=sorted(census.ARCHES))
    ap.add_argument("--time", action="store_true", help="also time each form's exponentials on this GPU")
    args = ap.parse_args(argv)
    if census.needs_reexec():
        import subprocess
        return subprocess.run([sys.executable, "-m", "flashrung.evidence.packed_exp2", *(argv or sys.argv[1:])],
                              env=census.interpreter_free_env()).returncode
    result = probe(args.arch)
    for form, r in result.items():
        print(f"{args.arch} {form:7s} MUFU.EX2 per thread {r['mufu_ex2']} for {r['elements_per_thread']} elements "
              f"({', '.join(f'{op} x{c}' for op, c in sorted(r['sass'].items()))})")
    if args.time:
        import torch

        timed = rate()
        for form, r in timed.items():
            print(f"{torch.cuda.get_device_name()} {form:7s} {r['elements_per_ns']:.0f} exponentials a ns "
                  f"({r['ms']:.3f} ms a launch, outputs finite: {r['finite']})")
        result = {"census": result, "rate": timed}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
