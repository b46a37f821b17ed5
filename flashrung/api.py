"""Public functions: validation, dispatch, autograd and the ``torch.library`` ops.

Layering: ``attention`` (validate) → ``flashrung::attention_fwd`` custom op (dispatch → kernel)
with a fake implementation for ``torch.compile`` → autograd through ``flashrung::attention_bwd``.
A call that autograd, torch.compile and op interceptors will not see (``_needs_the_op``) runs the
same dispatch and kernel without the op's wrapping. What the benchmark measures is this path, the
one users call.
"""
from __future__ import annotations

import math

import torch

from flashrung import dispatch
from flashrung.inputs import NO_WINDOW, check_qkv, check_softcap, check_softmax_scale, host_offsets, score_kwargs

MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8


def head_dim_supported(head_dim: int) -> bool:
    """Whether some flashrung kernel path takes ``head_dim``: a positive multiple of
    ``HEAD_DIM_MULTIPLE`` up to ``MAX_HEAD_DIM`` (each kernel says which of them it runs)."""
    return 0 < head_dim <= MAX_HEAD_DIM and head_dim % HEAD_DIM_MULTIPLE == 0
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _window(window_size, causal: bool) -> tuple[int, int]:
    """flash-attn's ``window_size`` checked and normalized: ``(left, right)`` integers, -1 for an
    unbounded side. With ``causal`` the right side is the mask's: -1 or 0 given, -1 kept. A window
    of ``(-1, 0)`` without ``causal`` is the causal mask itself, and the caller runs it as one."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair (left, right) of integers, got {window_size!r}") from None
    for name, side in (("left", left), ("right", right)):
        if isinstance(side, bool) or not isinstance(side, int) or side < -1:
            raise ValueError(f"window_size {name} must be an integer >= -1 (-1: unbounded), got {side!r}")
    if causal and right > 0:
        raise ValueError(f"window_size right must be -1 or 0 with causal=True (a causal query sees no later key), "
                         f"got {right}")
    return (left, -1) if causal else (left, right)


def _validate(q, k, v, causal, softmax_scale, impl) -> float:
    check_qkv(q, k, v, SUPPORTED_DTYPES, "float16, bfloat16 or float32")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); every dimension must be >= 1")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (stride(-1) == 1), "
                             f"got strides {t.stride()}; call {name}.contiguous() first")
    head_dim = q.shape[3]
    for name, dim in (("head_dim", head_dim), ("head_dim_v", v.shape[3])):
        if not head_dim_supported(dim):
            raise ValueError(f"{name} {dim} is not supported: expected a multiple of {HEAD_DIM_MULTIPLE} "
                             f"up to {MAX_HEAD_DIM}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"heads_q ({q.shape[2]}) must be a multiple of heads_kv ({k.shape[2]}) for GQA/MQA")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if impl is not None and not isinstance(impl, str):
        raise TypeError(f"impl must be a kernel name (str) or None, got {type(impl).__name__}")
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    return check_softmax_scale(softmax_scale)


def _score_options(causal: bool, window_size, softcap) -> tuple[bool, tuple[int, int], float]:
    """``(causal, window, softcap)`` checked and normalized, for :func:`attention` and
    :func:`attention_varlen` alike: a window of ``(-1, 0)`` is the causal mask itself and runs as
    one (``hopper.fwd`` takes that)."""
    window = _window(window_size, causal)
    if window == (-1, 0):
        causal, window = True, NO_WINDOW
    return causal, window, check_softcap(softcap)


def _refuse_missing_features(dropout_p, alibi_slopes) -> None:
    """flash-attn's arguments flashrung has no kernel for raise instead of being ignored."""
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p={dropout_p} is not supported by flashrung (only 0.0)")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes is not supported by flashrung")


def _run_forward(q, k, v, causal: bool, softmax_scale: float, impl: str | None,
                 window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0):
    problem = dispatch.Problem.of(q, k, v, causal, window_size, softcap)
    module, _ = dispatch.select(problem, "fwd", impl)
    # window_size= and softcap= only where the problem has them: dispatch picked a kernel that takes them
    extra = score_kwargs(window_size, softcap)
    if getattr(module, "FORWARD_TAKES_PROBLEM", False):
        return module.forward(q, k, v, causal, softmax_scale, problem=problem, **extra)
    return module.forward(q, k, v, causal, softmax_scale, **extra)


@torch.library.custom_op("flashrung::attention_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   softmax_scale: float, impl: str, window_left: int = -1,
                   window_right: int = -1, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = _run_forward(q, k, v, causal, softmax_scale, impl or None, (window_left, window_right), softcap)
    return out, lse


@_attention_fwd.register_fake
def _(q, k, v, causal, softmax_scale, impl, window_left=-1, window_right=-1, softcap=0.0):
    B, Sq, Hq, _ = q.shape
    return (q.new_empty((B, Sq, Hq, v.shape[3])),
            q.new_empty((B, Hq, Sq), dtype=torch.float32))


@torch.library.custom_op("flashrung::attention_bwd", mutates_args=())
def _attention_bwd(dout: torch.Tensor, dlse: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, causal: bool,
                   softmax_scale: float, window_left: int = -1, window_right: int = -1,
                   softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    window_size = (window_left, window_right)
    problem = dispatch.Problem.of(q, k, v, causal, window_size, softcap)
    module, _ = dispatch.select(problem, "bwd")
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    return module.backward(dout, q, k, v, out, lse, causal, softmax_scale, dlse=dlse,
                           **score_kwargs(window_size, softcap))


@_attention_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, causal, softmax_scale, window_left=-1, window_right=-1, softcap=0.0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, softmax_scale, _, window_left, window_right, softcap = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal = causal
    ctx.softmax_scale = softmax_scale
    ctx.score_args = (window_left, window_right, softcap)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    if dlse is None:
        dlse = torch.zeros_like(lse)
    dq, dk, dv = _attention_bwd(dout, dlse, q, k, v, out, lse, ctx.causal, ctx.softmax_scale, *ctx.score_args)
    return dq, dk, dv, None, None, None, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, return_lse: bool = False,
              impl: str | None = None, window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0):
    """Exact scaled-dot-product attention.

    Args:
        q: ``(batch, seqlen_q, heads_q, head_dim)``, float16 / bfloat16 (float32 where a kernel
           supports it).
        k: ``(batch, seqlen_k, heads_kv, head_dim)``; ``heads_q % heads_kv == 0`` (GQA/MQA).
        v: ``(batch, seqlen_k, heads_kv, head_dim_v)``; ``head_dim_v`` may differ from ``head_dim``
           (MLA's 192/128, say), each a multiple of 8 up to 256.
        causal: mask future keys. With ``seqlen_q != seqlen_k`` the mask is aligned to the
           bottom-right corner, as flash-attn >= 2.1 does: query ``i`` sees key ``j`` iff
           ``j <= i + seqlen_k - seqlen_q``. A query that sees no key returns 0 (lse = -inf).
        softmax_scale: defaults to ``1 / sqrt(head_dim)`` (q's and k's head dim).
        return_lse: also return the log-sum-exp ``(batch, heads_q, seqlen_q)``, float32,
           natural log.
        impl: run this kernel by name (``"portable.fwd"``, ``"hopper.fwd"``, a ladder rung
           ``"ladder.v3"``) instead of the best available one; raises if it cannot run.
        window_size: a sliding window ``(left, right)`` as flash-attn's (local attention): query
           ``i`` sees key ``j`` iff ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q
           + right``; -1 leaves a side unbounded. With ``causal`` the right side must be -1 or 0.
        softcap: > 0 caps the scaled scores as flash-attn does, ``softcap · tanh(scores /
           softcap)``, before the mask and the softmax (Gemma 2's 50, Grok's 30); 0, the default,
           caps nothing.

    A window and a cap run forward on ``hopper.fwd`` where dispatch takes it (sm_90), otherwise on
    the portable kernel; the backward of either is the portable kernel's.

    Returns ``out`` ``(batch, seqlen_q, heads_q, head_dim_v)`` in q's dtype, or ``(out, lse)``.
    Differentiable in q, k, v. :func:`flashrung.last_dispatch` tells which kernel ran.
    """
    scale = _validate(q, k, v, causal, softmax_scale, impl)
    causal, window, softcap = _score_options(causal, window_size, softcap)
    if _needs_the_op(q, k, v):
        out, lse = _attention_fwd(q, k, v, causal, scale, impl or "", *window, softcap)
    else:
        out, lse = _run_forward(q, k, v, causal, scale, impl or None, window, softcap)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------- packed sequences


def _check_cu_seqlens(name: str, cu: torch.Tensor, rows: int, max_name: str, max_seqlen, device) -> None:
    """flash-attn's cumulative lengths checked on the host: a 1-D int32 tensor on the inputs' device,
    from 0, non-decreasing, ending at ``rows``, no sequence longer than ``max_seqlen``: a wrong offset
    would otherwise read another sequence's rows. The values are copied to the host once per tensor
    and in-place version (:func:`flashrung.inputs.host_offsets`: a tensor reused unchanged costs no
    wait for the GPU). Under ``torch.compile`` the values are not read (a traced graph cannot branch
    on them): the type and shape are."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype != torch.int32 or cu.numel() < 2:
        raise ValueError(f"{name} must be a 1-D torch.int32 tensor of batch + 1 cumulative lengths, got "
                         f"{cu.dtype if isinstance(cu, torch.Tensor) else type(cu).__name__} "
                         f"{tuple(cu.shape) if isinstance(cu, torch.Tensor) else ''}")
    if cu.device != device:
        raise ValueError(f"{name} must be on the inputs' device {device}, got {cu.device}")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise ValueError(f"{max_name} must be a non-negative integer, got {max_seqlen!r}")
    if torch.compiler.is_compiling():
        return
    offsets = host_offsets(name, cu)
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    if offsets[0] != 0 or min(lengths) < 0 or offsets[-1] != rows:
        raise ValueError(f"{name} must start at 0, never decrease and end at the packed rows ({rows}), "
                         f"got {offsets[:4]}{' ...' if len(offsets) > 4 else ''} ending at {offsets[-1]}")
    if max_seqlen < max(lengths):
        raise ValueError(f"{max_name} must be at least the longest sequence ({max(lengths)}), got {max_seqlen}")


def check_packed(q: torch.Tensor, k: torch.Tensor, cu_seqlens, max_seqlens) -> None:
    """Packed sequences checked as :func:`attention_varlen` checks them: ``q``, ``k`` the packed
    ``(1, rows, heads, dim)`` tensors, ``cu_seqlens`` (cu_seqlens_q, cu_seqlens_k) and ``max_seqlens``
    (max_seqlen_q, max_seqlen_k); a kernel called directly with them checks the same."""
    (cu_seqlens_q, cu_seqlens_k), (max_seqlen_q, max_seqlen_k) = cu_seqlens, max_seqlens
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[1], "max_seqlen_q", max_seqlen_q, q.device)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[1], "max_seqlen_k", max_seqlen_k, q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe as many sequences, got "
                         f"{cu_seqlens_q.numel() - 1} and {cu_seqlens_k.numel() - 1}")


def _run_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                        impl, window_size=NO_WINDOW, softcap=0.0):
    problem = _varlen_problem(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, window_size, softcap)
    module, _ = dispatch.select(problem, "fwd", impl)
    extra = {"problem": problem} if getattr(module, "FORWARD_TAKES_PROBLEM", False) else {}
    out, lse = module.forward(q[None], k[None], v[None], causal, softmax_scale,
                              cu_seqlens=(cu_seqlens_q, cu_seqlens_k), max_seqlens=(max_seqlen_q, max_seqlen_k),
                              **score_kwargs(window_size, softcap), **extra)
    return out[0], lse[0]


def _varlen_problem(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, window_size, softcap):
    """The :class:`~flashrung.dispatch.Problem` of packed sequences: the packed tensors' layout, the
    sequences' count and longest lengths."""
    return dispatch.Problem.of_packed(q[None], k[None], v[None], causal, cu_seqlens_q.numel() - 1,
                                      (max_seqlen_q, max_seqlen_k), window_size, softcap)


@torch.library.custom_op("flashrung::attention_varlen_fwd", mutates_args=())
def _attention_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                          cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                          softmax_scale: float, impl: str, window_left: int = -1, window_right: int = -1,
                          softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                               softmax_scale, impl or None, (window_left, window_right), softcap)


@_attention_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, impl,
      window_left=-1, window_right=-1, softcap=0.0):
    rows, heads_q, _ = q.shape
    return q.new_empty((rows, heads_q, v.shape[2])), q.new_empty((heads_q, rows), dtype=torch.float32)


@torch.library.custom_op("flashrung::attention_varlen_bwd", mutates_args=())
def _attention_varlen_bwd(dout: torch.Tensor, dlse: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                          cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                          softmax_scale: float, window_left: int = -1, window_right: int = -1,
                          softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    window_size = (window_left, window_right)
    problem = _varlen_problem(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, window_size, softcap)
    module, _ = dispatch.select(problem, "bwd")
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = module.backward(dout[None], q[None], k[None], v[None], out[None], lse[None], causal, softmax_scale,
                                 dlse=dlse[None], cu_seqlens=(cu_seqlens_q, cu_seqlens_k),
                                 max_seqlens=(max_seqlen_q, max_seqlen_k), **score_kwargs(window_size, softcap))
    return dq[0], dk[0], dv[0]


@_attention_varlen_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
      softmax_scale, window_left=-1, window_right=-1, softcap=0.0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_varlen_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, _, *score_args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.args = (max_seqlen_q, max_seqlen_k, causal, softmax_scale, *score_args)


def _varlen_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dout = torch.zeros_like(out) if dout is None else dout
    dlse = torch.zeros_like(lse) if dlse is None else dlse
    dq, dk, dv = _attention_varlen_bwd(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.args)
    return (dq, dk, dv) + (None,) * 10


_attention_varlen_fwd.register_autograd(_varlen_backward, setup_context=_setup_varlen_context)


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     softmax_scale: float | None = None, return_lse: bool = False, impl: str | None = None,
                     window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0):
    """:func:`attention` over packed sequences of different lengths (flash-attn's varlen).

    Args:
        q: ``(total_q, heads_q, head_dim)``: every sequence's query rows, one after another.
        k: ``(total_k, heads_kv, head_dim)``; v: ``(total_k, heads_kv, head_dim_v)``.
        cu_seqlens_q, cu_seqlens_k: int32 ``(batch + 1,)`` cumulative lengths: sequence ``i`` is
           query rows ``cu_seqlens_q[i]:cu_seqlens_q[i + 1]`` and key rows
           ``cu_seqlens_k[i]:cu_seqlens_k[i + 1]``; a sequence may be empty. Checked on the host,
           copied there once per tensor and in-place version (a tensor passed again unchanged costs
           no wait for the GPU; :func:`flashrung.inputs.host_offsets` says what counts as a change).
           Inside a CUDA graph capture only tensors already checked before it can be used.
        max_seqlen_q, max_seqlen_k: at least the longest sequence's lengths.
        causal, softmax_scale, window_size, softcap, impl: as :func:`attention`, within each sequence
           (causal aligned to each sequence's own bottom-right corner).

    Returns ``out`` ``(total_q, heads_q, head_dim_v)``, or ``(out, lse)`` with lse ``(heads_q,
    total_q)`` float32 as flash-attn's. Differentiable in q, k, v. The forward runs on
    ``hopper.fwd`` where dispatch takes it (sm_90; :func:`flashrung.last_dispatch` says which kernel
    ran and why), otherwise and backward on the portable kernels.
    """
    for name, t, layout in (("q", q, "(total_q, heads_q, head_dim)"), ("k", k, "(total_k, heads_kv, head_dim)"),
                            ("v", v, "(total_k, heads_kv, head_dim_v)")):
        if isinstance(t, torch.Tensor) and t.dim() != 3:
            raise ValueError(f"{name} must have 3 dimensions {layout} for packed sequences, got shape {tuple(t.shape)}")
    # the packed tensors as one batch entry: the same checks as attention's, the same messages
    q4, k4, v4 = (t[None] if isinstance(t, torch.Tensor) else t for t in (q, k, v))
    scale = _validate(q4, k4, v4, causal, softmax_scale, impl)
    check_packed(q4, k4, (cu_seqlens_q, cu_seqlens_k), (max_seqlen_q, max_seqlen_k))
    causal, window, softcap = _score_options(causal, window_size, softcap)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)
    if _needs_the_op(q, k, v):
        out, lse = _attention_varlen_fwd(*args, impl or "", *window, softcap)
    else:
        out, lse = _run_varlen_forward(*args, impl or None, window, softcap)
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False, window_size=NO_WINDOW,
                           softcap: float = 0.0, alibi_slopes=None, deterministic: bool = False,
                           return_attn_probs: bool = False):
    """flash-attn's ``flash_attn_varlen_func`` signature over :func:`attention_varlen`; what
    :func:`flash_attn_func` refuses, this refuses too."""
    _refuse_missing_features(dropout_p, alibi_slopes)
    kwargs = dict(causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap)
    if return_attn_probs:
        out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, return_lse=True,
                                    **kwargs)
        return out, lse, None
    return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs)


def _needs_the_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a forward call must go through the ``flashrung::attention_fwd`` custom op: autograd
    will differentiate it, torch.compile or ``torch.jit.trace`` is tracing it, or something that
    intercepts ops (a tensor subclass such as a fake tensor, a dispatch mode such as
    ``FlopCounterMode``, a functorch transform) should see it. Otherwise the op's wrapping is pure
    host time (about 80 µs a call on the H200's host, more than a small problem's kernel): the same
    dispatch and kernel run directly."""
    return ((torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            or type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor
            or torch.compiler.is_compiling() or torch.jit.is_tracing()
            or _dispatch_modes_active() or _functorch_active())


def _private_query(name: str):
    """``torch._C.<name>`` when this torch has it; otherwise a query that always says "active", so
    a torch without it sends every call through the op (slower, never wrong)."""
    fn = getattr(torch._C, name, None)
    if fn is None:
        return lambda: True
    return fn


_len_dispatch_stack = _private_query("_len_torch_dispatch_stack")
_functorch_active = _private_query("_are_functorch_transforms_active")


def _dispatch_modes_active() -> bool:
    return bool(_len_dispatch_stack())


def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: float | None = None,
                    causal: bool = False, window_size=NO_WINDOW, softcap: float = 0.0,
                    alibi_slopes=None, deterministic: bool = False, return_attn_probs: bool = False):
    """flash-attn's ``flash_attn_func`` signature over :func:`attention`.

    Features flashrung does not have raise instead of being ignored: dropout and ALiBi.
    ``window_size`` and ``softcap`` are flash-attn's (see :func:`attention`). ``deterministic`` is
    accepted: every flashrung kernel already is. With ``return_attn_probs`` it returns
    ``(out, softmax_lse, None)``: the lse as flash-attn does, and no probability matrix.
    """
    _refuse_missing_features(dropout_p, alibi_slopes)
    if return_attn_probs:
        out, lse = attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True,
                             window_size=window_size, softcap=softcap)
        return out, lse, None
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap)
