"""One dispatch table: which kernel runs a problem, and why.

The table is ordered best-first. Each backend says whether it supports a problem and, if not,
why; the first that does runs, and :func:`last_dispatch` reports it together with every faster
backend that declined and its reason, so a fallback is never silent.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import threading
import warnings

import torch

from flashrung import _device
from flashrung.inputs import NO_WINDOW


@dataclasses.dataclass(frozen=True)
class Problem:
    """Everything dispatch may look at. Shapes follow flash-attn: q (B, Sq, Hq, D)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    dtype: torch.dtype
    causal: bool
    device_type: str
    capability: tuple[int, int] | None
    interpreter: bool = False
    # Memory layout, for kernels whose loads have layout rules (TMA): the (B, S, H, D) strides of
    # q, k, v in elements, and the largest power of two (≤ 256 bytes) dividing all their addresses.
    strides: tuple[tuple[int, ...], ...] = ()
    ptr_alignment: int = 256
    # flash-attn's sliding window (left, right), -1 for an unbounded side; (-1, -1): none. A causal
    # problem's right side is the mask's (flashrung.api keeps it -1 there)
    window_size: tuple[int, int] = NO_WINDOW
    # flash-attn's softcap: the scaled scores capped at ±softcap by softcap·tanh(scores/softcap); 0: none
    softcap: float = 0.0
    # packed sequences (flash-attn's varlen): batch sequences of up to seqlen_q / seqlen_k rows each,
    # placed by cu_seqlens; the strides are those of the packed (1, rows, heads, dim) tensors
    varlen: bool = False

    @property
    def windowed(self) -> bool:
        return self.window_size != NO_WINDOW

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
           window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0) -> "Problem":
        return cls(
            batch=q.shape[0], seqlen_q=q.shape[1], seqlen_k=k.shape[1], heads_q=q.shape[2],
            heads_kv=k.shape[2], head_dim=q.shape[3], head_dim_v=v.shape[3], dtype=q.dtype,
            causal=bool(causal), device_type=q.device.type, capability=_device.capability(q.device),
            interpreter=_device.interpreter_enabled(),
            strides=tuple(tuple(t.stride()) for t in (q, k, v)),
            ptr_alignment=min(_alignment(t.data_ptr()) for t in (q, k, v)),
            window_size=tuple(window_size), softcap=float(softcap),
        )

    @classmethod
    def of_packed(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sequences: int,
                  max_seqlens: tuple[int, int], window_size: tuple[int, int] = NO_WINDOW,
                  softcap: float = 0.0) -> "Problem":
        """The problem of packed sequences (flash-attn's varlen): q, k, v the packed ``(1, rows,
        heads, dim)`` tensors (their layout), ``sequences`` of them, the longest ``max_seqlens``."""
        return dataclasses.replace(cls.of(q, k, v, causal, window_size, softcap), batch=sequences,
                                   seqlen_q=max_seqlens[0], seqlen_k=max_seqlens[1], varlen=True)


def score_options_reason(problem: Problem, *, takes_softcap: bool = False, takes_window: bool = False,
                         takes_varlen: bool = False) -> str | None:
    """Why a kernel that has neither sliding windows (unless ``takes_window``: the kernel then says
    which windows it takes), nor (unless ``takes_varlen``) packed sequences, nor (unless
    ``takes_softcap``) softcap cannot run ``problem`` (the first of them it asks for), or None: one
    wording for every such kernel."""
    if problem.windowed and not takes_window:
        return f"has no sliding window (window_size {problem.window_size})"
    if problem.softcap and not takes_softcap:
        return f"has no softcap (softcap {problem.softcap:g})"
    if problem.varlen and not takes_varlen:
        return "has no packed sequences (varlen)"
    return None


def _alignment(address: int, cap: int = 256) -> int:
    """The largest power of two, up to ``cap``, that divides ``address``."""
    return cap if address % cap == 0 else address & -address


@dataclasses.dataclass(frozen=True)
class Backend:
    """A kernel family as dispatch sees it. ``module`` provides ``unsupported_reason(problem)``
    and ``forward(q, k, v, causal, softmax_scale) -> (out, lse)`` (and ``backward`` when
    ``direction`` includes it); optionally ``auto_declined_reason(problem)``: why automatic dispatch
    passes over a problem the module can run when asked for by name."""

    name: str          # public dotted name, e.g. "hopper.fwd"
    module: str
    direction: str     # "fwd" or "bwd"
    auto: bool = True  # False: runs only when asked for by name (ladder rungs, variants)

    def load(self):
        return _import(self.module)


@functools.lru_cache(maxsize=None)
def _import(module: str):
    # once per module: import_module's lookup, twice a call, was host time on every forward
    return importlib.import_module(module)


# Best first. A backend missing here cannot run, however good it is.
FORWARD_BACKENDS = (
    Backend("hopper.fwd", "flashrung.kernels.hopper.fwd", "fwd"),
    Backend("portable.fwd", "flashrung.kernels.portable.fwd", "fwd"),
)
# Teaching rungs and variants: never picked automatically, callable by name (impl="ladder.v3").
EXTRA_FORWARD_BACKENDS: tuple[Backend, ...] = (
    Backend("ladder.v0", "flashrung.kernels.ladder.v0", "fwd", auto=False),
    Backend("ladder.v1", "flashrung.kernels.ladder.v1", "fwd", auto=False),
    Backend("ladder.v2", "flashrung.kernels.ladder.v2", "fwd", auto=False),
    Backend("ladder.v3", "flashrung.kernels.ladder.v3", "fwd", auto=False),
    Backend("ladder.v4", "flashrung.kernels.ladder.v4", "fwd", auto=False),
    Backend("ladder.v5", "flashrung.kernels.ladder.v5", "fwd", auto=False),
    Backend("ladder.v7", "flashrung.kernels.ladder.v7", "fwd", auto=False),
    Backend("ladder.v8", "flashrung.kernels.ladder.v8", "fwd", auto=False),
    Backend("ladder.v9", "flashrung.kernels.ladder.v9", "fwd", auto=False),
    Backend("ladder.v10", "flashrung.kernels.ladder.v10", "fwd", auto=False),
    Backend("ladder.v11", "flashrung.kernels.ladder.v11", "fwd", auto=False),
    Backend("ladder.v12", "flashrung.kernels.ladder.v12", "fwd", auto=False),
    Backend("ladder.v13", "flashrung.kernels.ladder.v13", "fwd", auto=False),
    Backend("ladder.v14", "flashrung.kernels.ladder.v14", "fwd", auto=False),
    Backend("ladder.v15", "flashrung.kernels.ladder.v15", "fwd", auto=False),
    Backend("ladder.v16", "flashrung.kernels.ladder.v16", "fwd", auto=False),
    Backend("ladder.v17", "flashrung.kernels.ladder.v17", "fwd", auto=False),
    Backend("ladder.v18", "flashrung.kernels.ladder.v18", "fwd", auto=False),
    Backend("ladder.v19", "flashrung.kernels.ladder.v19", "fwd", auto=False),
    Backend("ladder.v20", "flashrung.kernels.ladder.v20", "fwd", auto=False),
    Backend("ladder.v21", "flashrung.kernels.ladder.v21", "fwd", auto=False),
    Backend("ladder.v22", "flashrung.kernels.ladder.v22", "fwd", auto=False),
    Backend("ladder.v23", "flashrung.kernels.ladder.v23", "fwd", auto=False),
)
BACKWARD_BACKENDS = (
    Backend("portable.bwd", "flashrung.kernels.portable.bwd", "bwd"),
)


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """What ran, and which better backends declined and why."""

    kernel: str
    direction: str
    declined: tuple[tuple[str, str], ...] = ()
    forced: bool = False
    # the backend's module, the problem it ran and a forced variant's overrides: what config()
    # resolves, only when asked (references, no work on the call's host path)
    module: object = dataclasses.field(default=None, repr=False, compare=False)
    problem: Problem | None = dataclasses.field(default=None, repr=False, compare=False)
    overrides: tuple[tuple[str, str], ...] = dataclasses.field(default=(), repr=False, compare=False)

    def __str__(self) -> str:
        why = "; ".join(f"{name}: {reason}" for name, reason in self.declined)
        return f"{self.kernel}" + (f" (declined: {why})" if why else "")

    def config(self):
        """The configuration the kernel ran this problem with — its frozen config dataclass, as its
        ``config_with`` resolves the problem and the overrides (``hopper.fwd``: the
        ``HopperFwdConfig`` that ``flashrung defaults --seqlen`` describes) — or None for a kernel
        that has none (the portable kernels)."""
        if self.problem is None or not hasattr(self.module, "config_with"):
            return None
        return _variant_config(self.module, self.problem, self.overrides)


_local = threading.local()
# autograd runs the backward of CUDA tensors on a thread of its own (one per device), never the
# caller's: a backward's dispatch is kept for the whole process, where the caller can read it
_last_backward: Dispatch | None = None


def last_dispatch(direction: str = "fwd") -> Dispatch | None:
    """The kernel that ran the most recent forward call on this thread (``"fwd"``), or the most
    recent backward in this process (``"bwd"``: autograd runs it on its own thread)."""
    if direction == "bwd":
        return _last_backward
    return getattr(_local, direction, None)


def _record(d: Dispatch) -> None:
    global _last_backward
    if d.direction == "bwd":
        _last_backward = d
    else:
        setattr(_local, d.direction, d)


def _backends(direction: str):
    return FORWARD_BACKENDS + EXTRA_FORWARD_BACKENDS if direction == "fwd" else BACKWARD_BACKENDS


def names(direction: str = "fwd") -> list[str]:
    return [b.name for b in _backends(direction)]


class UnsupportedError(ValueError):
    pass


def parse_impl(impl: str) -> tuple[str, dict[str, str]]:
    """``"hopper.fwd@pingpong=true,block_n=64"`` → ``("hopper.fwd", {"pingpong": "true", ...})``.

    The part after ``@`` overrides fields of the kernel's chosen configuration: how a single
    lever is priced against the default through the same public entry point users call."""
    name, _, spec = impl.partition("@")
    overrides = {}
    for item in filter(None, spec.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"impl {impl!r}: expected name@key=value[,key=value...], got {item!r}")
        overrides[key.strip()] = value.strip()
    return name.strip(), overrides


def apply_overrides(kernel: str, base, overrides: dict, keys: tuple[str, ...] | None = None):
    """``base`` (a frozen config dataclass) with ``overrides`` applied, each value parsed as the
    type of the field it replaces (``{"pingpong": "true"}`` from ``impl="kernel@pingpong=true"``).
    ``keys`` limits which fields may be overridden (default: every field). Raises ``ValueError``
    naming an unknown key (listing the valid ones) or a value of the wrong type."""
    valid = list(keys) if keys is not None else [f.name for f in dataclasses.fields(base)]
    changes = {}
    for key, value in dict(overrides).items():
        if key not in valid:
            raise ValueError(f"unknown {kernel} config key {key!r}; valid keys: {', '.join(valid)}")
        changes[key] = _parse_override(key, value, getattr(base, key))
    return dataclasses.replace(base, **changes)


def _parse_override(key: str, value, current):
    """``value`` (a string from ``impl="hopper.fwd@key=value"``, or already typed) as ``current``'s type."""
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"override {key}={value!r}: expected true or false")
    if isinstance(current, int):
        if isinstance(value, bool):
            raise ValueError(f"override {key}={value!r}: expected an integer")
        try:
            return int(str(value).strip(), 0) if not isinstance(value, int) else value
        except ValueError:
            raise ValueError(f"override {key}={value!r}: expected an integer") from None
    if isinstance(current, float):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"override {key}={value!r}: expected a number") from None
    if isinstance(current, str):
        return str(value).strip()   # the config's own check names the values it takes
    raise ValueError(f"override {key}: field of type {type(current).__name__} cannot be overridden")


@dataclasses.dataclass(frozen=True)
class Variant:
    """A backend module run with configuration overrides (``impl="name@key=value"``)."""

    module: object
    overrides: tuple[tuple[str, str], ...]

    def unsupported_reason(self, problem: Problem) -> str | None:
        reason = self.module.unsupported_reason(problem)
        if reason is None:
            # raises on a bad override, on every call (lru_cache keeps no exceptions); a good one
            # is resolved once per problem, as forward resolves it
            _variant_config(self.module, problem, self.overrides)
        return reason

    @property
    def FORWARD_TAKES_PROBLEM(self) -> bool:     # noqa: N802 (the module-level flag's name)
        return bool(getattr(self.module, "FORWARD_TAKES_PROBLEM", False))

    def forward(self, q, k, v, causal, softmax_scale, out=None, lse=None, problem=None, **options):
        """The module's forward under the overrides; ``options`` (``window_size``, ``softcap``,
        ``cu_seqlens`` and ``max_seqlens``: what the caller's problem has) pass through as given."""
        if problem is None:
            scores = {key: options[key] for key in ("window_size", "softcap") if key in options}
            if "cu_seqlens" in options:
                problem = Problem.of_packed(q, k, v, causal, options["cu_seqlens"][0].numel() - 1,
                                            options["max_seqlens"], **scores)
            else:
                problem = Problem.of(q, k, v, causal, **scores)
        config = _variant_config(self.module, problem, self.overrides)
        extra = {"problem": problem} if self.FORWARD_TAKES_PROBLEM else {}
        return self.module.forward(q, k, v, causal, softmax_scale, out=out, lse=lse, config=config, **extra,
                                   **options)


@functools.lru_cache(maxsize=256)
def _variant_config(module, problem: Problem, overrides: tuple[tuple[str, str], ...]):
    """``module.config_with`` once per (problem, overrides): parsing and checking the overrides
    on every call (15 µs on a 2-core host) gave a variant a longer host path than the plain
    kernel it is compared with — at S = 1k calls of 0.3 ms, enough for a slowed host to starve
    the GPU on the variant's side only."""
    return module.config_with(problem, dict(overrides))


def select(problem: Problem, direction: str, impl: str | None = None):
    """Pick a backend for ``problem``. ``impl`` forces one (by full or family name: "hopper")."""
    impl = impl or os.environ.get(f"FLASHRUNG_{direction.upper()}_IMPL") or None
    declined = []
    backends = _backends(direction)
    if impl is not None:
        name, overrides = parse_impl(impl)
        wanted = [b for b in backends if b.name == name or b.name.split(".")[0] == name]
        if not wanted:
            # the offending value first: callers that shorten the message (the bench's reasons)
            # keep it as the list of backends grows
            raise ValueError(f"impl {impl!r} names no {direction} kernel: impl must be one of "
                             f"{[b.name for b in backends]} (optionally name@key=value,...)")
        backend = wanted[0]
        module = loaded = backend.load()
        pinned = tuple(sorted(overrides.items()))
        if overrides:
            if not hasattr(module, "config_with"):
                raise ValueError(f"{backend.name} takes no configuration overrides (got {impl!r})")
            module = Variant(module, pinned)
        reason = module.unsupported_reason(problem)
        if reason is not None:
            raise UnsupportedError(f"{backend.name} cannot run this problem: {reason}")
        label = backend.name + (impl[impl.index("@"):] if overrides else "")
        d = Dispatch(label, direction, forced=True, module=loaded, problem=problem, overrides=pinned)
        _record(d)
        return module, d
    for backend in (b for b in backends if b.auto):
        module = backend.load()
        reason = module.unsupported_reason(problem)
        if reason is None and hasattr(module, "auto_declined_reason"):
            # runs the problem when asked for by name, but is not picked for it unasked
            reason = module.auto_declined_reason(problem)
        if reason is None:
            d = Dispatch(backend.name, direction, tuple(declined), module=module, problem=problem)
            _record(d)
            if declined and problem.device_type == "cuda" and os.environ.get("FLASHRUNG_WARN_FALLBACK"):
                warnings.warn(f"flashrung: {direction} ran {d}", stacklevel=3)
            return backend.load(), d
        declined.append((backend.name, reason))
    raise UnsupportedError(
        f"no flashrung {direction} kernel supports this problem: "
        + "; ".join(f"{n}: {r}" for n, r in declined))
