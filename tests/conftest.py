"""Test set-up: without a GPU the portable kernels run under the Triton interpreter, which must
be switched on before any kernel module is imported; GPU tests are skipped with a reason."""
import fcntl
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"

# a test whose fp32 oracle holds score matrices larger than this (B·H·Sq·Sk·4 bytes) takes
# `gpu_memory_turn`: at S16384 H2 one matrix is 2 GiB and the backward oracle keeps several, and on
# the H200 seven such cases run at once by `pytest -n 15` ran out of its 140 GiB
ORACLE_EXCLUSIVE_SCORE_BYTES = 1 << 30


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found); runs with the same command on the H200")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory(request):
    """Hands a GPU test's cached blocks back to the driver when it ends: under `pytest -n N` the
    workers share one GPU, and each worker's caching allocator would otherwise keep what its
    largest test reserved."""
    yield
    if HAS_CUDA and "gpu" in request.keywords and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.fixture
def gpu_memory_turn(tmp_path_factory):
    """One such test at a time across the pytest-xdist workers of a run (an exclusive lock on a file
    in the run's shared temporary directory), its memory handed back before the next one starts."""
    lock_path = tmp_path_factory.getbasetemp().parent / "flashrung-gpu-memory.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if HAS_CUDA and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)
