"""Microbenchmarks that measure the resource model's per-SM rates on the GPU at hand (sm_90a).

Four Gluon kernels, one per rate the ledger reads, each saturating one unit and timing itself in
SM cycles:

==========================  ==========================================  ========================
kernel                      what it repeats                             rate
==========================  ==========================================  ========================
``wgmma_rate_kernel``       async ``warpgroup_mma`` 128x256x128 bf16,   tensor FLOP/cycle/SM
                            both operands in SMEM (HGMMA.64x256x16)
``ex2_rate_kernel``         ``ex2.approx.ftz.f32`` chains, 8 per thread  exp2/cycle/SM (MUFU.EX2)
``fma_rate_kernel``         FP32 ``fma`` chains, 8 per thread           FMA/cycle/SM (FFMA)
``smem_read_rate_kernel``   conflict-free 16-byte SMEM loads            SMEM bytes/cycle/SM
==========================  ==========================================  ========================

Each CTA reads ``%clock64`` and ``%globaltimer`` after a CTA barrier before and after its loop
and records its ``%smid``. The rate of one SM is the work of all CTAs that ran on it divided by
the span of its own cycle counter (first start to last end), so the figure is per cycle, whatever
clock the GPU chose, and launch overhead never enters it. The clock is the same span in cycles
over the span in nanoseconds. The table keeps the median over SMs; the spread is stored too.

These are sustained rates reached by simple kernels, so each is a lower bound on the unit's peak;
``flashrung model --measure`` stores them as the ``measured`` figures of the H200 table with a
manifest of the run (GPU, clocks, driver, torch/triton). Evidence level: timing (seed 001 0x0F).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shutil
import statistics
import subprocess
from typing import Callable

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from flashrung.evidence.census import CensusSpec
from flashrung.model import rates as R

# Per CTA: smid, clock64 start, clock64 end, globaltimer start (ns), globaltimer end (ns).
STAMP_FIELDS = 5


@gluon.jit
def _clock64():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def _globaltimer():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def _smid():
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _write_stamps(stamps_ptr, c0, c1, t0, t1):
    base = stamps_ptr + gl.program_id(0) * 5
    gl.store(base + 0, _smid().to(gl.int64))
    gl.store(base + 1, c0)
    gl.store(base + 2, c1)
    gl.store(base + 3, t0)
    gl.store(base + 4, t1)


@gluon.jit
def wgmma_rate_kernel(a_ptr, b_ptr, out_ptr, stamps_ptr, iters,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    # a: (BLOCK_M, BLOCK_K) bf16 row-major, b: (BLOCK_K, BLOCK_N) bf16 row-major.
    NW: gl.constexpr = gl.num_warps()
    # One HGMMA.64xBLOCK_Nx16 per warpgroup per k-step: the widest wgmma there is (n = 256), so
    # issue and wait overhead per FLOP is smallest.
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, load_layout))
    rk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, load_layout))
    a = gl.load(a_ptr + gl.expand_dims(rm, 1) * BLOCK_K + gl.expand_dims(rk, 0))
    rk2 = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, load_layout))
    rn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, load_layout))
    b = gl.load(b_ptr + gl.expand_dims(rk2, 1) * BLOCK_N + gl.expand_dims(rn, 0))
    a_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_K], smem_layout, a)
    b_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_K, BLOCK_N], smem_layout, b)
    # Generic-proxy stores must be visible to the async proxy wgmma reads through.
    fence_async_shared()
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=acc_layout)

    gl.thread_barrier()
    c0 = _clock64()
    t0 = _globaltimer()
    for _ in range(iters):
        acc = warpgroup_mma(a_smem, b_smem, acc, is_async=True)
        # Keep one group in flight so the next issue overlaps the previous group's drain.
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    gl.thread_barrier()
    c1 = _clock64()
    t1 = _globaltimer()
    _write_stamps(stamps_ptr, c0, c1, t0, t1)
    # Consume the accumulator so the MMAs stay live.
    gl.store(out_ptr + gl.program_id(0), gl.sum(gl.sum(acc, axis=1), axis=0))


@gluon.jit
def ex2_rate_kernel(x_ptr, stamps_ptr, iters, ILP: gl.constexpr, UNROLL: gl.constexpr):
    # x: (grid * ILP * 32 * num_warps,) fp32 in (0, 1]; every thread keeps ILP independent chains.
    NW: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([ILP], [32], [NW], [0])
    BLOCK: gl.constexpr = ILP * 32 * NW
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    x = gl.load(x_ptr + offs)
    gl.thread_barrier()
    c0 = _clock64()
    t0 = _globaltimer()
    for _ in range(iters):
        for _u in gl.static_range(UNROLL):
            # x <- 2^-x keeps x in [0.5, 1]; the negation folds into the MUFU operand.
            x = gl.inline_asm_elementwise("{ .reg .f32 t; neg.f32 t, $1; ex2.approx.ftz.f32 $0, t; }",
                                          "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)
    gl.thread_barrier()
    c1 = _clock64()
    t1 = _globaltimer()
    _write_stamps(stamps_ptr, c0, c1, t0, t1)
    gl.store(x_ptr + offs, x)


@gluon.jit
def fma_rate_kernel(x_ptr, stamps_ptr, iters, mul, add, ILP: gl.constexpr, UNROLL: gl.constexpr):
    # x: (grid * ILP * 32 * num_warps,) fp32; mul/add are runtime scalars so nothing folds.
    NW: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([ILP], [32], [NW], [0])
    BLOCK: gl.constexpr = ILP * 32 * NW
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    x = gl.load(x_ptr + offs)
    gl.thread_barrier()
    c0 = _clock64()
    t0 = _globaltimer()
    for _ in range(iters):
        for _u in gl.static_range(UNROLL):
            x = gl.fma(x, mul, add)
    gl.thread_barrier()
    c1 = _clock64()
    t1 = _globaltimer()
    _write_stamps(stamps_ptr, c0, c1, t0, t1)
    gl.store(x_ptr + offs, x)


@gluon.jit
def smem_read_rate_kernel(out_ptr, stamps_ptr, iters, ROWS: gl.constexpr, COLS: gl.constexpr,
                          NUM_BUFFERS: gl.constexpr):
    # Each warp reads whole 512-byte rows, 16 bytes per lane: four wavefronts per LDS.128 and no
    # bank conflict, so the SMEM pipe, not the banks' serialisation, sets the pace.
    NW: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [NW, 1], [1, 0])
    plain: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    smem = gl.allocate_shared_memory(gl.float32, [NUM_BUFFERS, ROWS, COLS], plain)
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    seed = (gl.expand_dims(rows, 1) * COLS + gl.expand_dims(cols, 0)).to(gl.float32)
    for i in gl.static_range(NUM_BUFFERS):
        smem.index(i).store(seed * (i + 1))
    acc = gl.zeros([ROWS, COLS], gl.float32, layout=layout)
    gl.thread_barrier()
    c0 = _clock64()
    t0 = _globaltimer()
    for it in range(iters):
        # A buffer index that changes every iteration keeps the load inside the loop.
        acc += smem.index(it % NUM_BUFFERS).load(layout)
    gl.thread_barrier()
    c1 = _clock64()
    t1 = _globaltimer()
    _write_stamps(stamps_ptr, c0, c1, t0, t1)
    gl.store(out_ptr + gl.program_id(0), gl.sum(gl.sum(acc, axis=1), axis=0))


@dataclasses.dataclass(frozen=True)
class Microbenchmark:
    """One rate measurement: its kernel, launch shape and the work one CTA does per iteration."""

    name: str
    field: str                     # the RateTable field it measures
    fn: Callable
    signature: dict
    constexprs: dict
    num_warps: int
    ctas_per_sm: int               # CTAs launched per SM (all resident at once)
    iters: int
    work_per_cta_iter: int         # FLOPs, exp2 results, FMA results or bytes
    sass_family: str               # the instruction the census must find
    why: str

    def census_spec(self) -> CensusSpec:
        return CensusSpec(kernel=f"model.measure.{self.name}", config={"field": self.field},
                          fn=self.fn, signature=self.signature, constexprs=self.constexprs,
                          num_warps=self.num_warps, gluon=True, arches=("sm_90a",))


WGMMA_TILE = (128, 256, 128)       # BLOCK_M, BLOCK_N, BLOCK_K: 96 KB of SMEM, 128 acc regs/thread
NUM_WARPS = 8
ILP = 8                            # independent chains per thread (ex2, fma)
EX2_UNROLL, FMA_UNROLL = 4, 16     # chain steps per loop trip
SMEM_ROWS, SMEM_COLS, SMEM_BUFFERS = 64, 128, 2
_THREADS = NUM_WARPS * 32

BENCHMARKS = (
    Microbenchmark(
        "wgmma_bf16", "mma_flops", wgmma_rate_kernel,
        {"a_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*fp32", "stamps_ptr": "*i64", "iters": "i32"},
        dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), WGMMA_TILE)),
        num_warps=NUM_WARPS, ctas_per_sm=1, iters=4096,
        work_per_cta_iter=2 * WGMMA_TILE[0] * WGMMA_TILE[1] * WGMMA_TILE[2],
        sass_family="HGMMA",
        why="two warpgroups of one CTA per SM, each 64x256 of the accumulator (128 registers/thread) "
            "— the register file holds one such CTA"),
    Microbenchmark(
        "mufu_ex2", "exp", ex2_rate_kernel,
        {"x_ptr": "*fp32", "stamps_ptr": "*i64", "iters": "i32"},
        {"ILP": ILP, "UNROLL": EX2_UNROLL},
        num_warps=NUM_WARPS, ctas_per_sm=4, iters=2048,
        work_per_cta_iter=_THREADS * ILP * EX2_UNROLL,
        sass_family="MUFU.EX2",
        why="32 warps per SM with 8 independent chains each hide MUFU latency"),
    Microbenchmark(
        "ffma_fp32", "fma", fma_rate_kernel,
        {"x_ptr": "*fp32", "stamps_ptr": "*i64", "iters": "i32", "mul": "fp32", "add": "fp32"},
        {"ILP": ILP, "UNROLL": FMA_UNROLL},
        num_warps=NUM_WARPS, ctas_per_sm=4, iters=4096,
        work_per_cta_iter=_THREADS * ILP * FMA_UNROLL,
        sass_family="FFMA",
        why="128 FFMAs per loop trip keep loop overhead under 3% of issue slots"),
    Microbenchmark(
        "smem_read", "smem_bytes", smem_read_rate_kernel,
        {"out_ptr": "*fp32", "stamps_ptr": "*i64", "iters": "i32"},
        {"ROWS": SMEM_ROWS, "COLS": SMEM_COLS, "NUM_BUFFERS": SMEM_BUFFERS},
        num_warps=NUM_WARPS, ctas_per_sm=3, iters=8192,
        work_per_cta_iter=SMEM_ROWS * SMEM_COLS * 4,
        sass_family="LDS",
        why="3 CTAs x 64 KB of SMEM per SM, every load a conflict-free LDS.128"),
)


def census_specs() -> list[CensusSpec]:
    """The microbenchmarks as census specs (kept out of the kernel registry on purpose)."""
    return [b.census_spec() for b in BENCHMARKS]


# ------------------------------------------------------------------------------------------------
# Running on the GPU


@dataclasses.dataclass(frozen=True)
class BenchResult:
    name: str
    field: str
    per_sm_median: float
    per_sm_min: float
    per_sm_max: float
    sms_seen: int
    clock_ghz: float
    wall_ms: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def per_sm_rates(stamps, work_per_cta: float) -> tuple[list[float], list[float], float]:
    """(rate per SM, clock GHz per SM, wall ms) from a (CTAs, 5) stamp table.

    Work of every CTA that ran on an SM over that SM's own cycle span: clock64 counters of
    different SMs are never compared.
    """
    by_sm: dict[int, list] = {}
    for smid, c0, c1, t0, t1 in stamps:
        by_sm.setdefault(int(smid), []).append((int(c0), int(c1), int(t0), int(t1)))
    rates, clocks = [], []
    for rows in by_sm.values():
        cycles = max(r[1] for r in rows) - min(r[0] for r in rows)
        ns = max(r[3] for r in rows) - min(r[2] for r in rows)
        if cycles <= 0:
            raise RuntimeError("a CTA recorded no elapsed cycles; the loop was optimised away")
        rates.append(work_per_cta * len(rows) / cycles)
        if ns > 0:
            clocks.append(cycles / ns)
    wall_ms = (max(int(s[4]) for s in stamps) - min(int(s[3]) for s in stamps)) / 1e6
    return rates, clocks, wall_ms


def _launch(bench: Microbenchmark, sm_count: int, iters: int, device):
    import torch

    grid = (sm_count * bench.ctas_per_sm,)
    stamps = torch.zeros(grid[0], STAMP_FIELDS, dtype=torch.int64, device=device)
    kw = dict(bench.constexprs)
    if bench.name == "wgmma_bf16":
        bm, bn, bk = WGMMA_TILE
        gen = torch.Generator(device=device).manual_seed(0)
        a = (torch.randn(bm, bk, device=device, generator=gen) / 16).to(torch.bfloat16)
        b = (torch.randn(bk, bn, device=device, generator=gen) / 16).to(torch.bfloat16)
        out = torch.empty(grid[0], dtype=torch.float32, device=device)
        bench.fn[grid](a, b, out, stamps, iters, num_warps=bench.num_warps, **kw)
    elif bench.name == "smem_read":
        out = torch.empty(grid[0], dtype=torch.float32, device=device)
        bench.fn[grid](out, stamps, iters, num_warps=bench.num_warps, **kw)
    else:
        n = grid[0] * bench.num_warps * 32 * kw["ILP"]
        x = torch.rand(n, device=device, dtype=torch.float32) * 0.5 + 0.5
        if bench.name == "mufu_ex2":
            bench.fn[grid](x, stamps, iters, num_warps=bench.num_warps, **kw)
        else:
            bench.fn[grid](x, stamps, iters, 0.999, 1e-3, num_warps=bench.num_warps, **kw)
    torch.cuda.synchronize(device)
    return stamps.cpu().tolist()


def run_benchmark(bench: Microbenchmark, sm_count: int, device, repeats: int = 3) -> BenchResult:
    # Compile and warm up with a trip count that specialises like the timed one (a multiple of
    # 16), so the timed launches reuse the same binary.
    _launch(bench, sm_count, 16, device)
    best = None
    for _ in range(repeats):
        stamps = _launch(bench, sm_count, bench.iters, device)
        rates, clocks, wall_ms = per_sm_rates(stamps, bench.work_per_cta_iter * bench.iters)
        res = BenchResult(bench.name, bench.field, statistics.median(rates), min(rates), max(rates),
                          len(rates), statistics.median(clocks) if clocks else float("nan"), wall_ms)
        # Keep the fastest repeat: interference can only slow a repeat down.
        if best is None or res.per_sm_median > best.per_sm_median:
            best = res
    return best


def _nvidia_smi() -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    fields = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu"
    try:
        out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return {}
    first = out.strip().splitlines()[0] if out.strip() else ""
    return dict(zip(fields.split(","), (v.strip() for v in first.split(","))))


def _git_commit() -> str | None:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip() or None
    except (subprocess.SubprocessError, OSError):
        return None


def measure(device: str = "cuda", repeats: int = 3, table: str = "h200", progress: bool = True) -> dict:
    """Run every microbenchmark; returns ``{"table": RateTable JSON, "manifest": ..., "benchmarks": ...}``."""
    import torch
    import triton

    if not torch.cuda.is_available():
        raise RuntimeError("needs a CUDA GPU; none is visible")
    dev = torch.device(device)
    cap = torch.cuda.get_device_capability(dev)
    if cap[0] != 9:
        raise RuntimeError(f"the microbenchmarks use wgmma and target sm_90a; this GPU is sm_{cap[0]}{cap[1]}")
    props = torch.cuda.get_device_properties(dev)
    sm_count = props.multi_processor_count
    smi_start = _nvidia_smi()
    results = {}
    it = BENCHMARKS
    if progress:
        from tqdm import tqdm
        it = tqdm(BENCHMARKS, desc="measure", unit="kernel")
    for bench in it:
        results[bench.name] = run_benchmark(bench, sm_count, dev, repeats)
    smi_end = _nvidia_smi()

    base = R.TABLES.get(table, R.H200_QUOTED)     # the quoted table the measurement replaces
    source = f"flashrung model --measure on {props.name}, " + "{}"
    figs = {}
    for res in results.values():
        bench = next(b for b in BENCHMARKS if b.name == res.name)
        figs[res.field] = R.Figure(
            res.per_sm_median, getattr(base, res.field).unit, R.MEASURED,
            source.format(f"{res.name}: median over {res.sms_seen} SMs "
                          f"(min {res.per_sm_min:.4g}, max {res.per_sm_max:.4g}); {bench.why}"))
    figs["sm_count"] = R.Figure(float(sm_count), base.sm_count.unit, R.MEASURED,
                                "torch.cuda.get_device_properties().multi_processor_count")
    mma = results["wgmma_bf16"]
    figs["clock_ghz"] = R.Figure(mma.clock_ghz, base.clock_ghz.unit, R.MEASURED,
                                 "clock64 span / globaltimer span during the wgmma benchmark "
                                 "(the clock a tensor-bound kernel runs at)")
    measured_table = base.with_figures(**figs)
    measured_table = dataclasses.replace(
        measured_table, gpu=props.name,
        note=f"Measured on {props.name} by `flashrung model --measure`; each figure names its kernel "
             "and statistic, and the manifest below gives the clocks and versions of the run.")
    manifest = {
        "gpu": props.name,
        "capability": f"{cap[0]}.{cap[1]}",
        "sm_count": sm_count,
        "clocks_ghz_measured": {k: r.clock_ghz for k, r in results.items()},
        "nvidia_smi_start": smi_start,
        "nvidia_smi_end": smi_end,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_commit": _git_commit(),
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "repeats": repeats,
        "statistic": "per-SM rate = work of its CTAs / its clock64 span; median over SMs; best of repeats",
    }
    return {"table": measured_table.to_json(), "manifest": manifest,
            "benchmarks": {k: r.to_json() for k, r in results.items()}}
