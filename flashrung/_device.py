"""One cached device-capability query, with an override for tests and the census."""
from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index``, queried once a device (persistent and
    fixed grids are sized by it on every call's host path)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA device; ``None`` for the CPU.

    ``FLASHRUNG_CAPABILITY=9.0`` overrides the query (used to exercise dispatch without a GPU).
    """
    override = os.environ.get("FLASHRUNG_CAPABILITY")
    if device.type != "cuda":
        return None
    if override:
        major, minor = override.split(".")
        return int(major), int(minor)
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


def interpreter_enabled() -> bool:
    import triton
    return bool(triton.knobs.runtime.interpret)
