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
``JITFunction.run``; so does every call of a function the interpreter runs. The debug and
instrumentation knobs are part of every key (Triton compiles a different kernel under them).
"""
from __future__ import annotations

import inspect
from typing import Any, Hashable, Mapping

from triton import knobs
from triton.knobs import HookChain
from triton.runtime import driver
from triton.runtime.jit import JITFunction

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
        self.direct_calls = 0       # launches that skipped JITFunction.run (tests read these)
        self.ordinary_calls = 0

    def __call__(self, grid: int, key: Hashable, args: tuple, constexprs: Mapping[str, Any],
                 num_warps: int) -> None:
        """Launch ``fn[(grid,)](*args, **constexprs, num_warps=num_warps)`` on the current device
        and stream. ``args`` are the leading positional parameters; ``constexprs`` name the rest."""
        if not self._compiled or _hooks_active(self.fn):
            self._ordinary(grid, args, constexprs, num_warps)
            return
        device = driver.active.get_current_device()
        full_key = (device, knobs.runtime.debug, knobs.compilation.instrumentation_mode, key)
        entry = self._kernels.get(full_key)
        if entry is None:
            kernel = self._ordinary(grid, args, constexprs, num_warps)
            if hasattr(kernel, "result"):           # Triton's asynchronous compile mode
                kernel = kernel.result()
            if len(self._kernels) >= MAX_ENTRIES:
                self._kernels.clear()
            self._kernels[full_key] = (kernel, self._trailing(len(args), constexprs, num_warps))
            return
        kernel, trailing = entry
        stream = driver.active.get_current_stream(device)
        # the launcher skips the constexpr positions itself: it wants every parameter, in order
        kernel.run(grid, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None,
                   *args, *trailing)
        self.direct_calls += 1

    def _ordinary(self, grid, args, constexprs, num_warps):
        self.ordinary_calls += 1
        return self.fn[(grid,)](*args, **constexprs, num_warps=num_warps)

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


def _hook_set(hook) -> bool:
    # Triton 3.6 keeps an (empty) HookChain here; older releases a callable or None
    return hook is not None and (not isinstance(hook, HookChain) or bool(hook.calls))


def _hooks_active(fn) -> bool:
    return (_hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook)
            or bool(fn.pre_run_hooks))
