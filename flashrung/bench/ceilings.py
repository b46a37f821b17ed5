"""Ceilings measured in the same run as the rows they judge.

A percentage of a datasheet peak mixes the kernel with the clock the card happens to hold; a
percentage of a ceiling measured minutes earlier on the same card, under the same timer, does
not. Two are measured (seed 000, 1: "three denominators that must never be conflated"):

- a cuBLAS GEMM, M = N = K = 8192, in each dtype the rows use (FLOPs = 2·M·N·K), the
  tensor-core ceiling a compute-bound attention kernel is read against;
- a device-to-device copy of 1 GiB, counted as bytes read + bytes written, the memory ceiling.
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


def gemm(dtype: str, timer=None, *, size: int = GEMM_SIZE) -> Ceiling:
    import torch
    from flashrung.bench.peers import torch_dtype
    timer = timer or timing.CudaEventTimer()
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(size, size, device="cuda", generator=g).to(torch_dtype(dtype))
    b = torch.randn(size, size, device="cuda", generator=g).to(torch_dtype(dtype))
    c = torch.empty(size, size, device="cuda", dtype=a.dtype)

    def fn():
        torch.mm(a, b, out=c)
    timing.measure(timer, fn, WARMUP_CALLS)
    ms = float(np.median(timing.measure(timer, fn, TIMED_CALLS)))
    return Ceiling("gemm", dtype, ms, 2 * size ** 3 / (ms * 1e-3) / 1e12, "TFLOP/s",
                   f"torch.mm {size}x{size}x{size} (cuBLAS), median of {TIMED_CALLS}")


def copy(timer=None, *, nbytes: int = COPY_BYTES) -> Ceiling:
    import torch
    timer = timer or timing.CudaEventTimer()
    src = torch.ones(nbytes, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)

    def fn():
        dst.copy_(src)
    timing.measure(timer, fn, WARMUP_CALLS)
    ms = float(np.median(timing.measure(timer, fn, TIMED_CALLS)))
    return Ceiling("copy", None, ms, 2 * nbytes / (ms * 1e-3) / 1e9, "GB/s",
                   f"device-to-device copy of {nbytes >> 20} MiB, read + write bytes, median of {TIMED_CALLS}")


def measure_all(dtypes) -> dict[str, Ceiling]:
    """``{"gemm:<dtype>": …, "copy": …}``."""
    out = {f"gemm:{d}": gemm(d) for d in sorted(set(dtypes))}
    out["copy"] = copy()
    return out
