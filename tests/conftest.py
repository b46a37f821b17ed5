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
    # the modules whose fixtures compile in the background (EARLY_STARTS, below) run last, each kept
    # whole: the tests of every other module then run beside those compiles instead of after them,
    # with one of CI's two cores idle (a clean clone's run waited 419 s on the Hopper census at its
    # first census test, then ran the modules after it alone: --durations, 2026-12-07)
    items[:] = sorted(items, key=lambda item: bool(getattr(getattr(item, "module", None), "EARLY_STARTS", None)))
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


class Subprocesses:
    """Commands started now, at a lower CPU priority (niceness ``NICE``), their outputs read later
    by :meth:`result`: the compile-only evidence (census) a module fixture gathers in fresh
    interpreter-free processes."""

    NICE = 10

    def __init__(self, commands: list[list[str]], env: dict):
        import subprocess
        self.procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                       preexec_fn=lambda: os.nice(self.NICE)) for command in commands]

    def result(self, timeout: float) -> list[str]:
        """Every command's standard output, in order; a command that failed fails the caller with its
        standard error's tail."""
        outs = []
        for proc in self.procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, err[-3000:]
            outs.append(out)
        return outs

    def cancel(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


# Module fixtures that compile many kernels in subprocesses start when collection ends, not when
# their module's first test asks: the single-threaded tests that run before them leave a core idle
# on CI's two, and tests/test_hopper.py's census alone held 557 s of a 1209 s run (--durations,
# 2026-12-05). A module lists them in EARLY_STARTS = {fixture name: a function returning
# Subprocesses}; only fixtures a selected test uses start, once each, and the fixture takes its
# handle with early_start(). The compiles run niced, so the tests beside them keep their core.
# (The README's test command runs in one process; under pytest-xdist nothing starts early.)
_EARLY_STARTED: dict[tuple[str, str], Subprocesses] = {}


def pytest_collection_finish(session):
    # an xdist worker collects every test but runs a share of them: there a fixture starts when a
    # test asks for it, so that workers with no census test compile nothing
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for item in session.items:
        module = getattr(item, "module", None)
        for name, start in getattr(module, "EARLY_STARTS", {}).items():
            key = (module.__name__, name)
            if key not in _EARLY_STARTED and name in getattr(item, "fixturenames", ()):
                _EARLY_STARTED[key] = start()


def early_start(module_name: str, name: str, start) -> Subprocesses:
    """The handle collection started for ``module_name``'s fixture ``name``, or (a run that did not
    start it, e.g. one test run by node id after a plugin reordered collection) one started now."""
    return _EARLY_STARTED.pop((module_name, name), None) or start()


def pytest_sessionfinish(session, exitstatus):
    # a run stopped early (-x, a failure in collection's wake) leaves nothing compiling behind it
    for handle in _EARLY_STARTED.values():
        handle.cancel()
    _EARLY_STARTED.clear()
