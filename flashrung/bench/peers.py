"""The implementations a bench row is timed on, each behind one ``prepare(impl, row, inputs)``.

Every implementation receives the same inputs in flash-attn layout, q (B, Sq, Hq, D) and k/v
(B, Sk, Hkv, D), and returns a zero-argument callable that runs the timed work:

- forward rows time one attention call;
- backward rows run the forward once (untimed) and time ``torch.autograd.grad`` of its output
  with ``retain_graph=True``: the backward kernels only, as peers' own benchmarks do.

A peer that cannot run a row raises :class:`Unsupported` with its reason (the forced SDPA
backend's own warnings, the flashrung dispatcher's reason, an import error, the exception a
first call raised), and the row shows it; nothing is skipped silently.

Peers:

- ``cudnn`` / ``flash`` / ``efficient`` — ``torch.nn.functional.scaled_dot_product_attention``
  with exactly one backend allowed. SDPA takes (B, H, S, D): it gets ``transpose(1, 2)`` views,
  no copies. GQA is passed as ``enable_gqa=True``; a backend that refuses it gets K/V repeated
  to Hq heads with ``repeat_interleave`` outside the timed region, and the row's note says so.
  Causal with Sq ≠ Sk uses ``causal_lower_right`` (bottom-right alignment, like flashrung);
  ``is_causal=True`` would align top-left.
- ``flex`` — ``torch.compile(flex_attention, dynamic=False)``, compiled per shape and warm before
  timing (``PeerOptions.flex_dynamic`` compiles once with symbolic shapes instead); causal is a
  block mask built once per row outside the timed region.
- ``fa4`` — ``flash_attn.cute.flash_attn_func`` (FlashAttention-4, CuTe DSL) when importable.
- ``flashrung`` / ``flashrung:<name>`` — ``flashrung.attention(..., impl=<name>)``, the public
  entry point users call; the dispatch record of what actually ran is kept.

Packed rows (flash-attn's varlen, ``Row.packed``) get one batch entry of rows, q (1, total, Hq, D),
and the sequences' cumulative lengths: flashrung through ``flashrung.attention_varlen``, FA4 through
``flash_attn.cute.flash_attn_varlen_func``, FlexAttention over the whole pack with a block mask that
keeps each query to its own sequence (a document mask); SDPA's backends have no packed sequences.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import warnings
from typing import Any, Callable

from flashrung.bench.suites import Row
from flashrung.inputs import NO_WINDOW

SDPA_PEERS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
PEERS = ("cudnn", "flash", "efficient", "flex", "fa4")
OURS = "flashrung"
DEFAULT_IMPLS = PEERS + (OURS,)

# Recompiles flex may do in one process: one per (shape, direction); the default limit of 8
# would silently fall back to eager (unfused) attention after the eighth row.
FLEX_RECOMPILE_LIMIT = 1024


# the status of a flashrung kernel that a row did not time because it failed its correctness gate
GATE_FAILED = "gate failed"
# the status of an implementation a forward row did not time because its output is not the row's
# attention (runner.output_agreement)
WRONG_OUTPUT = "wrong output"


class Unsupported(Exception):
    """This implementation does not run this row; ``str(exc)`` says why."""

    def __init__(self, reason: str, status: str = "unsupported"):
        super().__init__(reason)
        self.reason = reason
        self.status = status      # "unsupported": declined by the implementation; "error": it raised


def is_ours(impl: str) -> bool:
    return impl == OURS or impl.startswith(OURS + ":")


def validate_impl(impl: str) -> str:
    if impl in PEERS or is_ours(impl):
        if impl.startswith(OURS + ":") and not impl.split(":", 1)[1]:
            raise ValueError(f"impl {impl!r}: name the flashrung kernel after the colon (flashrung:portable)")
        return impl
    raise ValueError(f"impl must be one of {list(PEERS)}, {OURS!r} or '{OURS}:<kernel>' "
                     f"(e.g. {OURS}:portable), got {impl!r}")


@dataclasses.dataclass
class Inputs:
    """One shape's tensors, shared by every implementation (flash-attn layout)."""

    q: Any          # (B, Sq, Hq, D)
    k: Any          # (B, Sk, Hkv, D)
    v: Any          # (B, Sk, Hkv, Dv)
    dout: Any       # (B, Sq, Hq, Dv), the upstream gradient for backward rows
    scale: float
    # packed rows: int32 cumulative lengths (queries and keys alike) of the sequences in the one
    # batch entry of rows; None otherwise
    cu_seqlens: Any = None

    def leaves(self):
        """Fresh autograd leaves over the same storage, for one implementation's backward."""
        return tuple(t.detach().requires_grad_(True) for t in (self.q, self.k, self.v))


def torch_dtype(name: str):
    import torch
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def make_inputs(row: Row, *, device="cuda", seed: int = 0) -> Inputs:
    """Standard-normal inputs (never zeros: a kernel can be fast on zeros and wrong elsewhere)."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(row.dtype)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dt)

    # a packed row: one batch entry of every sequence's rows
    batch, seqlen_q, seqlen_k = (1, sum(row.packed), sum(row.packed)) if row.packed else \
        (row.batch, row.seqlen_q, row.seqlen_k)
    q = randn(batch, seqlen_q, row.heads_q, row.headdim)
    k = randn(batch, seqlen_k, row.heads_kv, row.headdim)
    v = randn(batch, seqlen_k, row.heads_kv, row.dv)
    dout = randn(batch, seqlen_q, row.heads_q, row.dv) if row.mode == "bwd" else None
    cu = None
    if row.packed:
        from flashrung.gate import cu_seqlens
        cu = cu_seqlens(row.packed, device)
    return Inputs(q=q, k=k, v=v, dout=dout, scale=1.0 / math.sqrt(row.headdim), cu_seqlens=cu)


@dataclasses.dataclass
class Prepared:
    """A ready-to-time callable and what a reader needs to know about it."""

    fn: Callable[[], Any]
    first_out: Any = None          # the forward output of the first call (forward rows)
    note: str = ""
    dispatch: dict | None = None   # flashrung: which kernel ran (and who declined)
    first_call_s: float = 0.0      # wall time of the first call, compile included


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _sync(t) -> None:
    import torch
    if t is not None and t.is_cuda:
        torch.cuda.synchronize(t.device)


def _backward_callable(forward: Callable[..., Any], inputs: Inputs) -> Callable[[], Any]:
    """Run ``forward`` once on fresh leaves and return a callable timing only its backward."""
    import torch
    q, k, v = inputs.leaves()
    out = _first(forward(q, k, v))
    dout = inputs.dout

    def backward():
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return backward


def _wrap(row: Row, inputs: Inputs, forward: Callable[..., Any], note: str = "") -> Prepared:
    """Forward rows time ``forward(q, k, v)``; backward rows time its gradient. The first call
    (compile, load, autotune) runs here, untimed by the protocol but its wall time recorded."""
    import time
    import torch
    try:
        t0 = time.perf_counter()
        if row.mode == "fwd":
            fn = functools.partial(forward, inputs.q, inputs.k, inputs.v)
            out = _first(fn())
        else:
            fn = _backward_callable(forward, inputs)
            out = None
            fn()
        _sync(inputs.q)
        return Prepared(fn=fn, first_out=out, note=note, first_call_s=time.perf_counter() - t0)
    except Unsupported:
        raise
    except torch.cuda.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        raise Unsupported(f"out of memory: {_one_line(exc, 200)}", status="error") from None
    except Exception as exc:   # the row records the failure instead of the run dying
        raise Unsupported(f"{type(exc).__name__}: {_one_line(exc)}", status="error") from None


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text[:limit] + ("…" if len(text) > limit else "")


# ----------------------------------------------------------------------------------------------
# torch SDPA, one backend at a time


def _sdpa_forward(backend_name: str, row: Row, scale: float, gqa: str) -> Callable[..., Any]:
    """SDPA with one backend; ``gqa`` is "none", "enable_gqa" or "repeat_interleave"."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)
    kwargs: dict[str, Any] = {"scale": scale}
    if row.causal and row.seqlen_q == row.seqlen_k:
        kwargs["is_causal"] = True
    elif row.causal:
        from torch.nn.attention.bias import causal_lower_right
        kwargs["attn_mask"] = causal_lower_right(row.seqlen_q, row.seqlen_k)
    if gqa == "enable_gqa":
        kwargs["enable_gqa"] = True
    group = row.heads_q // row.heads_kv

    def forward(q, k, v):
        if gqa == "repeat_interleave":
            k = k.repeat_interleave(group, dim=2)
            v = v.repeat_interleave(group, dim=2)
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 **kwargs)
        return out.transpose(1, 2)
    return forward


# What SDPA raises when the one allowed backend declines (wording differs across torch versions).
SDPA_DECLINED = ("No available kernel", "No viable backend")

SDPA_GQA_NOTES = {
    "none": "",
    "enable_gqa": "GQA via enable_gqa=True",
    "repeat_interleave": "GQA via repeat_interleave of K/V",
}


def _prepare_sdpa(impl: str, row: Row, inputs: Inputs) -> Prepared:
    if row.packed:
        raise Unsupported(f"SDPA {impl} backend: scaled_dot_product_attention has no packed sequences (varlen)")
    if row.softcap:
        raise Unsupported(f"SDPA {impl} backend: scaled_dot_product_attention has no softcap")
    if row.window is not None:
        # an explicit mask would be the window, but it sends SDPA to its masked (materialised) path,
        # not the backend's flash path: no peer worth timing
        raise Unsupported(f"SDPA {impl} backend: scaled_dot_product_attention has no sliding window")
    backend = SDPA_PEERS[impl]
    gqa_modes = ["none"] if row.heads_q == row.heads_kv else ["enable_gqa", "repeat_interleave"]
    reasons, status = [], "unsupported"
    for gqa in gqa_modes:
        note = SDPA_GQA_NOTES[gqa]
        call_inputs, forward = inputs, _sdpa_forward(backend, row, inputs.scale, gqa)
        if gqa == "repeat_interleave" and row.mode == "fwd":
            # a forward row times attention only: K/V are repeated once, before timing
            group = row.heads_q // row.heads_kv
            call_inputs = dataclasses.replace(inputs, k=inputs.k.repeat_interleave(group, dim=2),
                                              v=inputs.v.repeat_interleave(group, dim=2))
            forward = _sdpa_forward(backend, row, inputs.scale, "none")
            note += " (once, outside the timed region)"
        elif gqa == "repeat_interleave":
            note += " (the copy runs in the untimed forward; its gradient, a sum over each group, is timed)"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return _wrap(row, call_inputs, forward, note)
            except Unsupported as exc:
                said = "; ".join(dict.fromkeys(_one_line(w.message, 200) for w in caught))
                reasons.append(f"[{gqa}] {exc.reason}" + (f" ({said})" if said else ""))
                if not any(m in exc.reason for m in SDPA_DECLINED):
                    status = exc.status
    raise Unsupported(f"SDPA {impl} backend: " + " | ".join(reasons), status=status)


# ----------------------------------------------------------------------------------------------
# FlexAttention


@dataclasses.dataclass(frozen=True)
class PeerOptions:
    """How peers are built. ``flex_dynamic``: compile FlexAttention once with symbolic shapes
    instead of once per shape (the recommended ``dynamic=False``, the peer's best case). Flex
    compiles cost seconds per shape and direction; on a many-shape suite dynamic saves minutes
    for, per PyTorch's own measurement (pytorch#125994), a few percent of flex's speed."""

    flex_dynamic: bool = False


@functools.lru_cache(maxsize=None)
def _compiled_flex(dynamic: bool):
    import torch
    import torch._dynamo.config as dynamo_config
    from torch.nn.attention.flex_attention import flex_attention
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(dynamo_config, knob):
            setattr(dynamo_config, knob, max(getattr(dynamo_config, knob), FLEX_RECOMPILE_LIMIT))
    # Backward rows replay one graph with retain_graph=True; compiled backwards that donate their
    # saved buffers refuse that (seen on the H200 with torch 2.11: every flex backward row
    # errored). Donation saves memory, not time, so switch it off for the timed graphs.
    import torch._functorch.config as functorch_config
    if hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False
    return torch.compile(flex_attention, dynamic=dynamic)


def flex_mask_mod(row: Row, sequence_of=None):
    """FlexAttention's ``mask_mod`` for ``row``: the causal mask and the sliding window, both aligned
    bottom-right as flash-attn's (query ``i`` sees key ``j`` iff ``i + Sk − Sq − left <= j <= i + Sk −
    Sq + right``, a side of -1 unbounded); None for a row with neither. A packed row's (``sequence_of``:
    each packed row's sequence index, an int tensor) keeps each query to its own sequence's keys
    too; its sequences have as many keys as queries, so its offset within one is 0."""
    offset = 0 if row.packed else row.seqlen_k - row.seqlen_q
    left, right = row.window if row.window is not None else (-1, -1)
    if row.causal:
        right = 0
    if left == -1 and right == -1 and not row.packed:
        return None

    def mask_mod(b, h, q_idx, kv_idx):
        diagonal = q_idx + offset
        seen = kv_idx <= diagonal + right if right != -1 else kv_idx >= 0
        if left != -1:
            seen = seen & (kv_idx >= diagonal - left)
        if row.packed:
            seen = seen & (sequence_of[q_idx] == sequence_of[kv_idx])
        return seen
    return mask_mod


def sequence_index(row: Row, device=None):
    """Each packed row's sequence, ``len(packed)`` runs of their lengths (an int32 tensor)."""
    import torch
    lengths = torch.tensor(row.packed, dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(len(row.packed), dtype=torch.int32, device=device), lengths)


def _softcap_score_mod(cap: float):
    """FlexAttention's score_mod for flash-attn's softcap: ``cap · tanh(score / cap)``."""
    import torch

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return score_mod


def _prepare_flex(row: Row, inputs: Inputs, options: PeerOptions) -> Prepared:
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as exc:
        raise Unsupported(f"FlexAttention not importable: {exc}") from None
    flex = _compiled_flex(options.flex_dynamic)
    block_mask = None
    mask_mod = flex_mask_mod(row, sequence_index(row, inputs.q.device) if row.packed else None)
    if mask_mod is not None:
        # a packed row's mask spans the whole pack
        rows_q, rows_k = inputs.q.shape[1], inputs.k.shape[1]
        block_mask = create_block_mask(mask_mod, None, None, rows_q, rows_k, device=inputs.q.device)
    gqa = row.heads_q != row.heads_kv
    score_mod = _softcap_score_mod(row.softcap) if row.softcap else None

    def forward(q, k, v):
        out = flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod,
                   block_mask=block_mask, scale=inputs.scale, enable_gqa=gqa)
        return out.transpose(1, 2)
    note = (f"torch.compile(flex_attention, dynamic={options.flex_dynamic}); block mask built outside the "
            "timed region" + ("; softcap as a score_mod" if row.softcap else "")
            + ("; the window in the block mask" if row.window is not None else "")
            + ("; the pack's sequences in the block mask" if row.packed else ""))
    return _wrap(row, inputs, forward, note)


# ----------------------------------------------------------------------------------------------
# FlashAttention-4 (CuTe DSL)


def fa4_window(window: tuple[int, int]) -> tuple[int | None, int | None]:
    """A row's window (flash-attn's ``window_size``: -1 an unbounded side) as FA4's CuTe interface
    takes it: there an unbounded side is ``None``, and a negative one is taken as a bound unless
    both sides are negative — ``(1024, -1)`` would be the keys from 1024 before the diagonal to
    one before it, not everything from 1024 before on."""
    return tuple(None if side < 0 else side for side in window)


def _prepare_fa4(row: Row, inputs: Inputs) -> Prepared:
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    except Exception as exc:  # ImportError, or a DSL library that fails to load
        raise Unsupported(f"flash_attn.cute not importable ({type(exc).__name__}: {_one_line(exc, 160)})") from None

    extra = ({"softcap": row.softcap} if row.softcap else {}) | (
        {"window_size": fa4_window(row.window)} if row.window is not None else {})
    if row.packed:
        cu, longest = inputs.cu_seqlens, max(row.packed)

        def packed_forward(q, k, v):
            out = _first(flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                max_seqlen_q=longest, max_seqlen_k=longest,
                                                softmax_scale=inputs.scale, causal=row.causal, **extra))
            return out[None]
        return _wrap(row, inputs, packed_forward, "flash_attn.cute.flash_attn_varlen_func")

    def forward(q, k, v):
        return _first(flash_attn_func(q, k, v, softmax_scale=inputs.scale, causal=row.causal, **extra))
    return _wrap(row, inputs, forward, "flash_attn.cute.flash_attn_func")


# ----------------------------------------------------------------------------------------------
# flashrung


def kernel_name(impl: str) -> str | None:
    """``flashrung`` → None (dispatch chooses); ``flashrung:portable`` → ``portable``."""
    return impl.split(":", 1)[1] if ":" in impl else None


def _attend(q, k, v, *, causal, scale, name, window_size=NO_WINDOW, softcap=0.0, cu_seqlens=None,
            max_seqlens=None, return_lse=False):
    """flashrung's public call on bench tensors: ``flashrung.attention``, or with ``cu_seqlens`` and
    ``max_seqlens`` (packed sequences, q/k/v one batch entry of rows) ``flashrung.attention_varlen``
    on that entry, its results given the batch dimension back."""
    import flashrung
    options = dict(causal=causal, softmax_scale=scale, impl=name, window_size=window_size, softcap=softcap,
                   return_lse=return_lse)
    if cu_seqlens is None:
        return flashrung.attention(q, k, v, **options)
    result = flashrung.attention_varlen(q[0], k[0], v[0], *cu_seqlens, *max_seqlens, **options)
    return tuple(t[None] for t in result) if return_lse else result[None]


def flashrung_forward_fn(impl: str):
    """``forward_fn(q, k, v, causal, softmax_scale[, window_size=, softcap=][, cu_seqlens=,
    max_seqlens=]) -> (out, lse)`` for the correctness gate; with ``cu_seqlens`` (packed sequences,
    q/k/v one batch entry of rows) through ``flashrung.attention_varlen``. ``out``/``lse`` given by the
    gate are not written: the results come back as new tensors."""
    name = kernel_name(impl)

    def forward_fn(q, k, v, causal, softmax_scale, window_size=NO_WINDOW, softcap=0.0, cu_seqlens=None,
                   max_seqlens=None, out=None, lse=None):
        return _attend(q, k, v, causal=causal, scale=softmax_scale, name=name, window_size=window_size,
                       softcap=softcap, cu_seqlens=cu_seqlens, max_seqlens=max_seqlens, return_lse=True)
    return forward_fn


def flashrung_backward_fn(impl: str):
    """``backward_fn(do, q, k, v, out, lse, causal, scale) -> (dq, dk, dv)`` for the gate, through
    the same autograd path a user's ``loss.backward()`` takes."""
    import torch
    name = kernel_name(impl)

    def backward_fn(do, q, k, v, out, lse, causal, scale, window_size=NO_WINDOW, softcap=0.0, cu_seqlens=None,
                    max_seqlens=None, dq=None, dk=None, dv=None):
        leaves = tuple(t.detach().requires_grad_(True) for t in (q, k, v))
        o = _attend(*leaves, causal=causal, scale=scale, name=name, window_size=window_size, softcap=softcap,
                    cu_seqlens=cu_seqlens, max_seqlens=max_seqlens)
        return torch.autograd.grad(o, leaves, do)
    return backward_fn


def _dispatch_record(flashrung) -> dict:
    record = {}
    for direction in ("fwd", "bwd"):
        d = flashrung.last_dispatch(direction)
        if d is not None:
            record[direction] = {"kernel": d.kernel, "forced": d.forced, "declined": [list(x) for x in d.declined],
                                 "text": str(d)}
    return record


def _prepare_flashrung(impl: str, row: Row, inputs: Inputs) -> Prepared:
    try:
        import flashrung
    except Exception as exc:
        raise Unsupported(f"flashrung not importable: {type(exc).__name__}: {_one_line(exc)}", status="error") from None
    name = kernel_name(impl)

    window = row.window if row.window is not None else NO_WINDOW
    packing = dict(cu_seqlens=(inputs.cu_seqlens,) * 2, max_seqlens=(max(row.packed),) * 2) if row.packed else {}

    def forward(q, k, v):
        return _attend(q, k, v, causal=row.causal, scale=inputs.scale, name=name, window_size=window,
                       softcap=row.softcap, **packing)
    try:
        prepared = _wrap(row, inputs, forward)
    except Unsupported as exc:
        # the dispatcher declining is a statement about the kernel, not a failure of the run
        if exc.reason.startswith("UnsupportedError: ") or "cannot run this problem" in exc.reason \
                or "no flashrung" in exc.reason:
            raise Unsupported(exc.reason.split(": ", 1)[1], status="unsupported") from None
        raise
    prepared.dispatch = _dispatch_record(flashrung)
    prepared.note = " / ".join(f"{k}: {v['text']}" for k, v in prepared.dispatch.items())
    return prepared


def prepare(impl: str, row: Row, inputs: Inputs, options: PeerOptions = PeerOptions()) -> Prepared:
    """A warm-ready callable for ``impl`` on ``row``; raises :class:`Unsupported` with the reason."""
    validate_impl(impl)
    if impl in SDPA_PEERS:
        return _prepare_sdpa(impl, row, inputs)
    if impl == "flex":
        return _prepare_flex(row, inputs, options)
    if impl == "fa4":
        return _prepare_fa4(row, inputs)
    return _prepare_flashrung(impl, row, inputs)


def versions() -> dict:
    """Versions of every peer library that is importable (and why not, for those that are not)."""
    out: dict[str, Any] = {}
    try:
        import torch
        out["torch"] = torch.__version__
        out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception as exc:  # torch is a dependency; this only guards broken installs
        out["torch"] = f"unavailable: {exc}"
    from importlib import metadata
    for dist in ("flash-attn-4", "flash_attn_4", "flash-attn", "nvidia-cutlass-dsl", "quack-kernels", "triton"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        mod = importlib.import_module("flash_attn")
        out.setdefault("flash_attn.__version__", getattr(mod, "__version__", "unknown"))
    except Exception as exc:
        out["flash_attn"] = f"not importable: {type(exc).__name__}"
    return out
