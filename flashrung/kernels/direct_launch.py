"""Launching a compiled Triton or Gluon kernel without ``JITFunction.run``'s per-call work.

``kernel[grid](*args, **constexprs)`` binds every argument in Python, specializes each one
(pointer alignment, integers equal to 1 or divisible by 16, descriptor block shapes), hashes the
result into a cache key, checks the kernel's globals and then calls the compiled kernel's
launcher. For ``hopper.fwd``'s 43 arguments that took 57 µs of the H200 host's time per call
(binding alone 21 µs; ``docs/hopper.md``, *The host path*), the largest single part of a call's
host path and as long as the kernel of a small problem.

:class:`DirectLaunch` keeps its own table from a **caller-supplied key** to the compiled kernel
the ordinary path returned for it. The caller's contract: two launches with equal keys would get
the same compiled kernel from Triton, i.e. the key determines everything Triton specializes on —
the constexprs, the dtypes and block shapes of descriptors, the exact values of the integer
arguments (or at least whether each equals 1, its divisibility by 16 and its integer width) and
whether each pointer is 16-byte aligned. A new key takes the ordinary path once (which compiles
or finds the kernel in Triton's caches) and records the kernel it returned.

Whatever observes launches keeps seeing them: with a launch hook set (``knobs.runtime``, as
profilers such as proton set it) or a pre-run hook on the function, every call goes through
``JITFunction.run``; so does every call of a function the interpreter runs. A cluster launch, which
``JITFunction.run`` cannot start, goes through :meth:`DirectLaunch.through_triton` then: Triton's
own binding and its ``CudaLauncher``, with the launch metadata and both hooks. The debug and
instrumentation knobs are part of every key (Triton compiles a different kernel under them).
"""
from __future__ import annotations

import inspect
import os
import types
from typing import Any, Hashable, Mapping

from triton import knobs
from triton.knobs import HookChain
from triton.runtime import driver
from triton.runtime.jit import JITFunction

try:
    from triton.backends.nvidia import driver as _nvidia_driver
except ImportError:         # a Triton without the CUDA backend: RawLaunch.of finds nothing to call
    _nvidia_driver = types.SimpleNamespace(__name__="")

# compiled kernels kept per launcher; a key is one (configuration, shape class), so a process that
# sees more distinct shapes than this starts over (each miss costs one ordinary launch, no compile)
MAX_ENTRIES = 4096


class DirectLaunch:
    """A launcher for one ``@triton.jit`` / ``@gluon.jit`` function (see the module docstring)."""

    def __init__(self, fn):
        self.fn = fn
        # under TRITON_INTERPRET the decorator returns an interpreted function: no compiled kernel
        self._compiled = isinstance(fn, JITFunction)
        signature = getattr(fn, "signature", None) or inspect.signature(getattr(fn, "fn", fn))
        self._params = list(signature.parameters.values())
        self._kernels: dict[Hashable, tuple[Any, tuple]] = {}
        # call the C launcher behind the compiled kernel's CudaLauncher (RawLaunch) where its
        # structure is the one RawLaunch knows; False: always through CudaLauncher
        self.raw = True
        self.direct_calls = 0       # launches that skipped JITFunction.run (tests read these)
        self.ordinary_calls = 0

    def __call__(self, grid: int, key: Hashable, args: tuple, constexprs: Mapping[str, Any],
                 num_warps: int, cluster_ctas: int = 1, num_stages: int | None = None) -> None:
        """Launch ``fn[(grid,)](*args, **constexprs, num_warps=num_warps)`` on the current device
        and stream. ``args`` are the leading positional parameters; ``constexprs`` name the rest.
        ``num_stages``: Triton's software-pipelining depth for the compile (its default if None).

        ``cluster_ctas`` > 1: the ``grid`` CTAs of a kernel compiled for one CTA are launched in
        clusters of that many consecutive CTAs (Triton's C launcher takes the cluster size from the
        packed metadata it is handed). ``JITFunction.run`` cannot launch that: such a launch goes
        the direct way, compiled through ``warmup`` the first time — or, with a hook set, through
        :meth:`through_triton`, so that the hook sees it."""
        self._check_cluster(grid, cluster_ctas)
        options = _options(num_warps, num_stages)
        if cluster_ctas > 1 and _hooks_active(self.fn):
            self.through_triton(grid, args, constexprs, num_warps, cluster_ctas, num_stages)
            return
        if cluster_ctas == 1 and (not self._compiled or _hooks_active(self.fn)):
            self._ordinary(grid, args, constexprs, options)
            return
        device = driver.active.get_current_device()
        full_key = (device, knobs.runtime.debug, knobs.compilation.instrumentation_mode, key, cluster_ctas,
                    num_stages)
        entry = self._kernels.get(full_key)
        if entry is None:
            if cluster_ctas > 1:
                kernel = self.fn.warmup(*args, **constexprs, **options, grid=(grid,))
            else:
                kernel = self._ordinary(grid, args, constexprs, options)
            if hasattr(kernel, "result"):           # Triton's asynchronous compile mode
                kernel = kernel.result()
            if len(self._kernels) >= MAX_ENTRIES:
                self._kernels.clear()
            entry = self._kernels[full_key] = (kernel, self._trailing(len(args), constexprs, num_warps),
                                               RawLaunch.of(kernel, len(args)) if self.raw else None)
            if cluster_ctas == 1:
                return
        kernel, trailing, raw = entry
        stream = driver.active.get_current_stream(device)
        metadata = kernel.packed_metadata
        if cluster_ctas > 1:
            warps, _, shared = metadata
            metadata = (warps, cluster_ctas, shared)
            grid //= cluster_ctas               # the launcher starts grid × cluster_ctas CTAs
        if raw is not None:
            raw(grid, stream, kernel.function, metadata, args, trailing)
        else:
            # the launcher skips the constexpr positions itself: it wants every parameter, in order
            kernel.run(grid, 1, 1, stream, kernel.function, metadata, None, None, None, *args, *trailing)
        self.direct_calls += 1

    def through_triton(self, grid: int, args: tuple, constexprs: Mapping[str, Any], num_warps: int,
                       cluster_ctas: int, num_stages: int | None = None) -> None:
        """A cluster launch as ``JITFunction.run`` launches a kernel, with no table of this
        launcher's: Triton binds and specializes the arguments and finds (or compiles) the kernel
        (``warmup``, which also runs the function's pre-run hooks), and the kernel's own
        ``CudaLauncher`` starts it with the launch metadata and the enter and exit hooks. Only the
        cluster size in the packed metadata is this launcher's. The way a hooked cluster launch
        goes (a profiler sees it), and the one a caller picks to stay off the direct path."""
        self._check_cluster(grid, cluster_ctas)
        self.ordinary_calls += 1
        kernel = self.fn.warmup(*args, **constexprs, **_options(num_warps, num_stages), grid=(grid,))
        if hasattr(kernel, "result"):           # Triton's asynchronous compile mode
            kernel = kernel.result()
        device = driver.active.get_current_device()
        stream = driver.active.get_current_stream(device)
        bound = (*args, *self._trailing(len(args), constexprs, num_warps))
        warps, _, shared = kernel.packed_metadata
        # the metadata names the program grid (CTAs), as JITFunction.run's would; the launcher
        # counts clusters and starts grid × cluster_ctas CTAs
        launch_metadata = kernel.launch_metadata((grid,), stream, *bound)
        kernel.run(grid // cluster_ctas, 1, 1, stream, kernel.function, (warps, cluster_ctas, shared), launch_metadata,
                   knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound)

    def _check_cluster(self, grid: int, cluster_ctas: int) -> None:
        if cluster_ctas < 1 or grid % cluster_ctas:
            raise ValueError(f"{self.fn.__name__}: a grid of {grid} CTAs does not split into clusters of {cluster_ctas}")
        if cluster_ctas > 1 and not self._compiled:
            raise RuntimeError(f"{self.fn.__name__}: the interpreter runs no cluster launch")

    def _ordinary(self, grid, args, constexprs, options):
        self.ordinary_calls += 1
        return self.fn[(grid,)](*args, **constexprs, **options)

    def _trailing(self, n_args: int, constexprs: Mapping[str, Any], num_warps: int) -> tuple:
        """The values of the parameters after the positional ones, in signature order, as
        ``JITFunction.run`` binds them (keywords, else defaults)."""
        out = []
        for p in self._params[n_args:]:
            if p.name in constexprs:
                out.append(constexprs[p.name])
            elif p.default is not p.empty:
                out.append(p.default)
            else:
                raise TypeError(f"{self.fn.__name__}: no value for parameter {p.name!r}")
        unknown = set(constexprs) - {p.name for p in self._params[n_args:]}
        if unknown:
            raise TypeError(f"{self.fn.__name__}: unknown keyword arguments {sorted(unknown)}")
        return tuple(out)

    def clear(self) -> None:
        self._kernels.clear()


class RawLaunch:
    """The C launcher behind a compiled kernel's ``CudaLauncher``, called with the argument list
    ``CudaLauncher.__call__`` and its descriptor wrapper would build.

    For each launch Triton 3.6's ``CudaLauncher`` defines and calls two scratch allocators and
    then a wrapper (``wrap_handle_tensordesc``) that walks every argument in Python to expand each
    TMA descriptor into its encoded map, shape and strides — for ``hopper.fwd`` 80 arguments for 6
    descriptors, the largest Python cost left in a launch (H200 host profile,
    ``docs/results/h200-host-profile-d16d102.txt``). This does the same expansion at the
    descriptor positions only, through the same ``make_tensordesc_arg``. :meth:`of` returns
    ``None`` — the caller keeps ``CudaLauncher`` — unless the launcher is exactly what this was
    written against: Triton's CUDA launcher, no scratch memory, and either the C function itself
    (no descriptor argument) or the nvidia driver's descriptor wrapper with its closure intact.
    ``tests/test_direct_launch.py`` checks that the C function receives the same arguments both
    ways.
    """

    def __init__(self, launch, descriptors: tuple, cooperative: bool, pdl: bool):
        self.launch = launch
        self.descriptors = descriptors        # (argument position, tensordesc metadata), in order
        self.cooperative = cooperative
        self.pdl = pdl

    @classmethod
    def of(cls, kernel, n_args: int) -> "RawLaunch | None":
        try:
            run = kernel.run
            if type(run).__name__ != "CudaLauncher" or run.global_scratch_size or run.profile_scratch_size:
                return None
            launch = run.launch
            if isinstance(launch, types.FunctionType):
                if (launch.__module__ != _nvidia_driver.__name__
                        or launch.__qualname__ != "wrap_handle_tensordesc.<locals>.inner"):
                    return None
                free = dict(zip(launch.__code__.co_freevars, (c.cell_contents for c in launch.__closure__ or ())))
                if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= free.keys():
                    return None
                positions = sorted(free["tensordesc_indices"])
                metas = list(free["tensordesc_meta"])
                if len(positions) != len(metas) or (positions and positions[-1] >= n_args):
                    return None
                return cls(free["launcher"], tuple(zip(positions, metas)), bool(run.launch_cooperative_grid),
                           bool(run.launch_pdl))
            if isinstance(launch, types.BuiltinFunctionType):
                return cls(launch, (), bool(run.launch_cooperative_grid), bool(run.launch_pdl))
        except (AttributeError, TypeError, ValueError):
            pass
        return None

    def __call__(self, grid: int, stream, function, packed_metadata, args: tuple, trailing: tuple) -> None:
        # CudaLauncher's base arguments: grid, stream, function, cooperative, PDL, the two scratch
        # buffers (none), packed metadata, launch metadata and the two hooks (none: DirectLaunch
        # goes the ordinary way whenever a hook is set)
        final = [grid, 1, 1, stream, function, self.cooperative, self.pdl, None, None, packed_metadata,
                 None, None, None]
        start = 0
        for position, meta in self.descriptors:
            final.extend(args[start:position])
            final.extend(_nvidia_driver.make_tensordesc_arg(args[position], meta))
            start = position + 1
        final.extend(args[start:])
        final.extend(trailing)
        self.launch(*final)


def _options(num_warps: int, num_stages: int | None) -> dict:
    """The compile options of a launch, as ``fn[grid](...)`` takes them (Triton's own defaults for
    those left None)."""
    return {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}


def specialization_key(args: tuple) -> tuple:
    """A key covering what Triton specializes ``args`` on, for a launcher with no cheaper key of its
    own: each tensor's dtype and 16-byte alignment, each integer's exact value (which fixes whether it
    is 1, divisible by 16 and its width), each float by type alone (always fp32). Exact integers make
    it finer than Triton's: a new length takes one ordinary launch, no compile."""
    return tuple((a.dtype, a.data_ptr() % 16 == 0) if hasattr(a, "data_ptr") else
                 (a if isinstance(a, int) else type(a)) for a in args)


def enabled_by_environment(environ=None) -> bool:
    """``FLASHRUNG_DIRECT_LAUNCH=0`` sends every launch through ``JITFunction.run`` (slower host
    path, Triton's own binding) — a cluster launch (kv_multicast), which it cannot start, through
    ``DirectLaunch.through_triton`` — the way out should a Triton release change what the direct
    path relies on. Any other value but ``1`` is refused rather than guessed at."""
    value = (os.environ if environ is None else environ).get("FLASHRUNG_DIRECT_LAUNCH", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"FLASHRUNG_DIRECT_LAUNCH must be 0 or 1, got {value!r}")
    return value == "1"


def _hook_set(hook) -> bool:
    # Triton 3.6 keeps an (empty) HookChain here; older releases a callable or None
    return hook is not None and (not isinstance(hook, HookChain) or bool(hook.calls))


def _hooks_active(fn) -> bool:
    return (_hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook)
            or bool(fn.pre_run_hooks))
