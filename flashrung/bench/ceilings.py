"""Ceilings measured in the same run as the rows they judge.

A percentage of a datasheet peak mixes the kernel with the clock the card happens to hold; a
percentage of a ceiling measured minutes earlier on the same card, under the same timer, does
not. Two are measured (seed 000, 1: "three denominators that must never be conflated"):

- a cuBLAS GEMM, M = N = K = 8192, in each dtype the rows use (FLOPs = 2·M·N·K), the
  tensor-core ceiling a compute-bound attention kernel is read against;
- a device-to-device copy of 1 GiB, counted as bytes read + bytes written, the memory ceiling.

Each is timed after ``preheat_ms`` of its own calls (the bench protocol's ``block_preheat_ms``),
as every row is: an H200 runs the first ~100 ms of a kernel above the clock it sustains, and a
cuBLAS GEMM timed in 20 calls right after warm-up read 789–800 TFLOP/s (bf16) where the same GEMM
after 150–300 ms read 591–695 (docs/ladder.md, *What moves the ceilings*) — a ceiling at a burst
clock over rows at the sustained one.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from flashrung.bench import timing

GEMM_SIZE = 8192
COPY_BYTES = 1 << 30          # 1 GiB: far beyond the 60 MB L2, so it measures HBM
WARMUP_CALLS = 5
TIMED_CALLS = 20


@dataclasses.dataclass(frozen=True)
class Ceiling:
    kind: str          # "gemm" | "copy"
    dtype: str | None
    ms: float          # median per call
    value: float       # TFLOP/s for gemm, GB/s for copy
    unit: str
    detail: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


PREHEAT_MS = timing.BenchProtocol().block_preheat_ms


def timed_median(fn, timer, preheat_ms: float = PREHEAT_MS, *, warmup_calls: int = WARMUP_CALLS) -> tuple[float, int]:
    """``fn``'s median ms per call over ``TIMED_CALLS``, after ``warmup_calls`` (the first not
    counted in the estimate) and then at least ``preheat_ms`` of its own untimed calls.
    Returns (median ms, preheat calls)."""
    estimate = float(np.median(timing.measure(timer, fn, warmup_calls)[1:]))
    calls = timing.preheat_calls(estimate, preheat_ms)
    for _ in range(calls):
        fn()
    return float(np.median(timing.measure(timer, fn, TIMED_CALLS))), calls


def gemm(dtype: str, timer=None, *, size: int = GEMM_SIZE, preheat_ms: float = PREHEAT_MS) -> Ceiling:
    import torch
    from flashrung.bench.peers import torch_dtype
    timer = timer or timing.CudaEventTimer()
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(size, size, device="cuda", generator=g).to(torch_dtype(dtype))
    b = torch.randn(size, size, device="cuda", generator=g).to(torch_dtype(dtype))
    c = torch.empty(size, size, device="cuda", dtype=a.dtype)

    def fn():
        torch.mm(a, b, out=c)
    ms, _ = timed_median(fn, timer, preheat_ms)
    return Ceiling("gemm", dtype, ms, 2 * size ** 3 / (ms * 1e-3) / 1e12, "TFLOP/s",
                   f"torch.mm {size}x{size}x{size} (cuBLAS), median of {TIMED_CALLS} after {preheat_ms:g} ms of "
                   f"its own calls")


def copy(timer=None, *, nbytes: int = COPY_BYTES, preheat_ms: float = PREHEAT_MS) -> Ceiling:
    import torch
    timer = timer or timing.CudaEventTimer()
    src = torch.ones(nbytes, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)

    def fn():
        dst.copy_(src)
    ms, _ = timed_median(fn, timer, preheat_ms)
    return Ceiling("copy", None, ms, 2 * nbytes / (ms * 1e-3) / 1e9, "GB/s",
                   f"device-to-device copy of {nbytes >> 20} MiB, read + write bytes, median of {TIMED_CALLS} "
                   f"after {preheat_ms:g} ms of its own calls")


def measure_all(dtypes, preheat_ms: float = PREHEAT_MS) -> dict[str, Ceiling]:
    """``{"gemm:<dtype>": …, "copy": …}``, each timed after ``preheat_ms`` of its own calls."""
    out = {f"gemm:{d}": gemm(d, preheat_ms=preheat_ms) for d in sorted(set(dtypes))}
    out["copy"] = copy(preheat_ms=preheat_ms)
    return out
