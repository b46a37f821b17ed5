"""How fast do the exponentials run beside a warpgroup that keeps the tensor cores busy?

``hopper.fwd``'s softmax (docs/hopper.md, *Three changes to the d128 step*) runs its
``MUFU.EX2`` stream while the other consumer warpgroup's ``wgmma``s occupy the tensor pipe. This
probe isolates that pairing: one CTA per SM, two 4-warp partitions — one warp of each on every SM
sub-partition, as in the kernel. The *stream* partition runs ``ROUNDS`` rounds of ``ex2.approx``
(or an FFMA) over ``CHAINS`` independent chains per thread between two ``%clock64`` reads; the
*GEMM* partition, at the same time, either

* ``idle`` — returns at once;
* ``queued`` — issues 64×N×64 ``wgmma``s (N = 128 or 64; A from shared memory or registers) back
  to back, keeping up to ``QUEUE`` groups outstanding, so its warps sit blocked in issue whenever
  the pipe's queue is full;
* ``paced`` — the same products, each waited for before the next is issued: the tensor pipe
  works nearly as much, but the warps never wait in issue;
* ``mma.sync`` — 64×64×64 ``mma_v2`` products from registers (``HMMA.16816``, the ladder's
  instruction) back to back.

The GEMM partition keeps issuing until the stream partition has read its last clock (a per-CTA
flag in global memory, set and read by atomics; at most ``MAX_GROUPS`` groups), and reports its
own FLOPs per SM cycle, so the tensor pipe's load beside each reading is known. Measured on the
H200: ``ex2`` falls by about 25% × the pipe's busy share, queued or paced alike (``queued``
against ``paced`` separates a blocked issue from the tensor work itself).

``python -m flashrung.evidence.wgmma_neighbor [--json PATH]`` needs a Hopper (sm_90) GPU;
``--census`` (:func:`probe_census`) compiles every variant for sm_90a without one.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from flashrung.evidence import census
from flashrung import jsonfile

MODES = {"idle": 0, "queued": 1, "paced": 2, "mma.sync": 3}
OPS = {"ex2": 0, "ffma": 1}
# (operation, GEMM mode, GEMM N, A from registers): the exponentials beside each GEMM mode; beside
# a narrower accumulator and a register A operand (PV's form); an FMA stream beside the same
VARIANTS = [("ex2", "idle", 128, False), ("ex2", "queued", 128, False), ("ex2", "paced", 128, False),
            ("ex2", "queued", 64, False), ("ex2", "queued", 128, True), ("ex2", "paced", 128, True),
            ("ffma", "idle", 128, False), ("ffma", "queued", 128, False), ("ffma", "paced", 128, False),
            ("ex2", "mma.sync", 64, False), ("ffma", "mma.sync", 64, False)]
ROUNDS = {"ex2": 4096, "ffma": 32768}   # per operation: both streams last ~260k cycles alone
CHAINS = 8
QUEUE = 4                       # wgmma groups a "queued" GEMM partition keeps outstanding
MAX_GROUPS = 1 << 16            # a GEMM partition stops after this many groups whatever its flag says
M, K = 64, 64                   # one group: 4 m64nNk16 instructions (N = 128: 256 tensor cycles per SM)
GEMM_REGS = 152                 # the GEMM partition's registers: a 64×128 fp32 accumulator and its loop


_ONE = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))    # one value per thread of a warpgroup


@gluon.jit
def _clock():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _exp_partition(x_ptr, out_ptr, cycles_ptr, flag_ptr, ROUNDS: gl.constexpr, CHAINS: gl.constexpr, OP: gl.constexpr):
    lay: gl.constexpr = gl.BlockedLayout([CHAINS], [32], [4], [0])
    offs = gl.arange(0, CHAINS * 128, layout=lay)
    x = gl.load(x_ptr + offs)
    t0 = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [offs], dtype=gl.int64, is_pure=False, pack=1)
    for _ in range(ROUNDS):
        if OP == 0:
            x = gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32,
                                          is_pure=True, pack=1)
        else:
            x = x * 0.999 + 0.0001
    t1 = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [x.to(gl.int32, bitcast=True)],
                                   dtype=gl.int64, is_pure=False, pack=1)
    base = gl.program_id(0) * CHAINS * 128
    gl.store(out_ptr + base + offs, x)
    gl.store(cycles_ptr + base + offs, t1 - t0)
    # tell the GEMM partition to stop: every stream thread has read its second clock (an atomic on
    # this CTA's flag in global memory: a plain load of it in the GEMM loop may be hoisted)
    gl.atomic_xchg(flag_ptr + gl.program_id(0) + gl.arange(0, 1, layout=_ONE), gl.full([1], 1, gl.int32, _ONE))


@gluon.jit
def _gemm_partition(a_ptr, gemm_ptr, a_smem, b_smem, flag_ptr, MODE: gl.constexpr, QUEUE: gl.constexpr,
                    GEMM_N: gl.constexpr, A_IN_REGISTERS: gl.constexpr, MAX_GROUPS: gl.constexpr):
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, GEMM_N, 16])
    if MODE == 3:
        # the ladder's instruction: mma.sync (HMMA.16816) from registers, 64×64×64 per call and warpgroup
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
        tile = _load_tile(a_ptr, 64)
        a_reg = gl.convert_layout(tile, gl.DotOperandLayout(0, mma, 2))
        b_reg = gl.convert_layout(tile, gl.DotOperandLayout(1, mma, 2))
        acc3 = gl.zeros([64, 64], gl.float32, mma)
        t0 = _clock()
        n = 0
        keep = 1
        while keep != 0:
            for _ in range(8):
                acc3 = mma_v2(a_reg, b_reg, acc3)
            n += 8
            keep = _keep_going(flag_ptr, n, MAX_GROUPS)
        _report(gemm_ptr, n, _clock() - t0, gl.sum(gl.sum(acc3, 1), 0))
    elif MODE > 0:
        a_smem.store(_load_tile(a_ptr, 64))
        b_smem.store(_load_tile(a_ptr, 128))
        fence_async_shared()
        acc = gl.zeros([64, GEMM_N], gl.float32, acc_layout)
        b_op = b_smem.slice(0, GEMM_N).permute((1, 0))
        if A_IN_REGISTERS:
            # P's place in PV: the A operand read from the registers of the issuing warps
            a_op = a_smem.load(gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2))
        else:
            a_op = a_smem
        t0 = _clock()
        n = 0
        keep = 1
        while keep != 0:
            for _ in range(8):
                acc = warpgroup_mma(a_op, b_op, acc, is_async=True)
                if MODE == 1:
                    acc = warpgroup_mma_wait(QUEUE, deps=[acc])
                else:
                    acc = warpgroup_mma_wait(0, deps=[acc])
            n += 8
            keep = _keep_going(flag_ptr, n, MAX_GROUPS)
        acc = warpgroup_mma_wait(0, deps=[acc])
        _report(gemm_ptr, n, _clock() - t0, gl.sum(gl.sum(acc, 1), 0))


@gluon.jit
def _load_tile(a_ptr, ROWS: gl.constexpr):
    """``ROWS`` × 64 bf16 operand values from the 64 × 64 input (rows repeat past 64)."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, ld))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    return gl.load(a_ptr + gl.expand_dims(rows % 64, 1) * 64 + gl.expand_dims(cols, 0))


@gluon.jit
def _keep_going(flag_ptr, n, MAX_GROUPS: gl.constexpr):
    """1 while this CTA's stream runs (its flag, read by an atomic: a plain load may be hoisted out
    of the loop) and fewer than ``MAX_GROUPS`` groups were issued (a stream that never sets the
    flag cannot hang the probe); else 0."""
    flag = gl.atomic_add(flag_ptr + gl.program_id(0) + gl.arange(0, 1, layout=_ONE), gl.full([1], 0, gl.int32, _ONE))
    return (1 - gl.max(flag, 0)) * (n < MAX_GROUPS).to(gl.int32)


@gluon.jit
def _report(gemm_ptr, n, cycles, total):
    """This CTA's GEMM row: groups issued, their cycles, and the products' sum (so they are used)."""
    base = gemm_ptr + gl.program_id(0) * 3 + gl.arange(0, 1, layout=_ONE)
    zero = gl.full([1], 0, gl.int64, _ONE)
    gl.store(base, zero + n)
    gl.store(base + 1, zero + cycles)
    gl.store(base + 2, zero + total.to(gl.int64))


@gluon.jit
def neighbor_kernel(x_ptr, a_ptr, out_ptr, cycles_ptr, gemm_ptr, flag_ptr, ROUNDS: gl.constexpr, CHAINS: gl.constexpr,
                    MODE: gl.constexpr, QUEUE: gl.constexpr, GEMM_REGS: gl.constexpr, OP: gl.constexpr = 0,
                    GEMM_N: gl.constexpr = 128, A_IN_REGISTERS: gl.constexpr = False,
                    MAX_GROUPS: gl.constexpr = 65536):
    a_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16))
    b_smem = gl.allocate_shared_memory(gl.bfloat16, [128, 64],
                                       gl.NVMMASharedLayout.get_default_for([128, 64], gl.bfloat16))
    gl.warp_specialize([
        (_exp_partition, (x_ptr, out_ptr, cycles_ptr, flag_ptr, ROUNDS, CHAINS, OP)),
        (_gemm_partition, (a_ptr, gemm_ptr, a_smem, b_smem, flag_ptr, MODE, QUEUE, GEMM_N, A_IN_REGISTERS, MAX_GROUPS)),
    ], [4], [GEMM_REGS])


def _constexprs(op: str, mode: str, gemm_n: int, a_in_registers: bool) -> dict:
    return {"ROUNDS": ROUNDS[op], "CHAINS": CHAINS, "MODE": MODES[mode], "QUEUE": QUEUE, "GEMM_REGS": GEMM_REGS,
            "OP": OPS[op], "GEMM_N": gemm_n, "A_IN_REGISTERS": a_in_registers, "MAX_GROUPS": MAX_GROUPS}


def _spec(op: str, mode: str, gemm_n: int = 128, a_in_registers: bool = False) -> census.CensusSpec:
    return census.CensusSpec(
        kernel=f"probe.wgmma_neighbor.{op}.{mode}",
        config={"op": op, "mode": mode, "gemm_n": gemm_n, "a_in_registers": a_in_registers}, fn=neighbor_kernel,
        signature={"x_ptr": "*fp32", "a_ptr": "*bf16", "out_ptr": "*fp32", "cycles_ptr": "*i64", "gemm_ptr": "*i64",
                   "flag_ptr": "*i32"},
        constexprs=_constexprs(op, mode, gemm_n, a_in_registers), num_warps=4, gluon=True)


def probe_census(arch: str = "sm_90a") -> dict:
    """Per variant, the probe compiled for ``arch`` (no GPU): its ``HGMMA`` (and how many take A
    from registers), ``MUFU.EX2``, ``FFMA`` counts and whether it spills."""
    if census.needs_reexec():
        raise RuntimeError("compile without TRITON_INTERPRET=1 (python -m flashrung.evidence.wgmma_neighbor --census)")
    import re

    out = {}
    for variant in VARIANTS:
        spec = _spec(*variant)
        row = census.census_one(spec, arch)
        if row.error:
            raise RuntimeError(f"{variant}: {row.error}")
        sass = census.compiled_sass(census.compile_spec(spec, arch))
        out[_label(*variant)] = {"HGMMA": row.sass["HGMMA"], "HMMA": row.sass["HMMA"], "MUFU.EX2": row.sass["MUFU.EX2"],
                                 "FFMA": row.sass["FFMA"],
                                 "hgmma_register_a": len(re.findall(r"HGMMA\S* R\d+, R\d+", sass)),
                                 "spill_bytes": row.spill_bytes}
    return out


def _label(op, mode, gemm_n, a_in_registers) -> str:
    if mode in ("idle", "mma.sync"):
        return f"{op} beside {mode}"
    return f"{op} beside {mode} n{gemm_n}{' A in registers' if a_in_registers else ''}"


def measure(op: str, mode: str, gemm_n: int = 128, a_in_registers: bool = False, repeats: int = 3) -> dict:
    """The stream partition's results per SM cycle (``op``) beside a GEMM partition in ``mode``, and
    the GEMM partition's tensor share (its products' tensor cycles over its elapsed cycles),
    medians over the SMs."""
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = CHAINS * 128
    x = torch.rand(n, device="cuda") * -1.0
    a = torch.randn(64 * 64, device="cuda").to(torch.bfloat16)
    out = torch.empty(sms * n, device="cuda")
    cycles = torch.empty(sms * n, device="cuda", dtype=torch.int64)
    gemm = torch.zeros(sms * 3, device="cuda", dtype=torch.int64)
    flags = torch.zeros(sms, device="cuda", dtype=torch.int32)
    for _ in range(repeats):
        flags.zero_()
        neighbor_kernel[(sms,)](x, a, out, cycles, gemm, flags, **_constexprs(op, mode, gemm_n, a_in_registers), num_warps=4)
    torch.cuda.synchronize()
    per_cta = cycles.view(sms, n).max(1).values.tolist()
    row = dict(op=op, mode=mode, gemm_n=gemm_n, a_in_registers=a_in_registers, label=_label(op, mode, gemm_n, a_in_registers),
               per_sm_cycle=ROUNDS[op] * n / statistics.median(per_cta))
    if mode != "idle":
        g = gemm.view(sms, 3).tolist()
        # one group: 2·64·N·64 FLOPs (mma.sync: N = 64)
        flops = 2 * M * (64 if mode == "mma.sync" else gemm_n) * K
        row["tensor_flop_per_sm_cycle"] = statistics.median(r[0] * flops / r[1] for r in g if r[1] > 0)
        if mode != "mma.sync":
            # wgmma's dense bf16 rate: 4096 FLOPs per SM cycle
            row["tensor_share"] = row["tensor_flop_per_sm_cycle"] / 4096
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashrung.evidence.wgmma_neighbor", description=__doc__.split("\n")[0])
    ap.add_argument("--census", action="store_true", help="compile the probe for sm_90a and count it (no GPU)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if args.census:
        print(json.dumps(probe_census()))
        return 0
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        found = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA GPU"
        print(f"wgmma_neighbor: the probe issues wgmma, which needs a Hopper (sm_90) GPU; found {found}. "
              "Use --census to compile it without one.", file=sys.stderr)
        return 2
    rows = [measure(*variant) for variant in VARIANTS]
    print(f"{torch.cuda.get_device_name(0)}: a stream beside a GEMM warpgroup, one CTA per SM, {CHAINS} chains")
    print(f"{'stream and GEMM partition':34s} {'per SM cycle':>12s} {'tensor FLOP/cyc':>15s} {'wgmma share':>11s}")
    for r in rows:
        share = f"{r['tensor_share']:.1%}" if "tensor_share" in r else "—"
        flop = f"{r['tensor_flop_per_sm_cycle']:.0f}" if "tensor_flop_per_sm_cycle" in r else "—"
        print(f"{r['label']:34s} {r['per_sm_cycle']:12.2f} {flop:>15s} {share:>11s}")
    if args.json:
        jsonfile.write(dict(gpu=torch.cuda.get_device_name(0), rounds=ROUNDS, chains=CHAINS, queue=QUEUE, rows=rows),
                       args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
