"""The argument checks every forward entry point shares: ``flashrung.attention`` and the kernels'
own ``forward`` called directly (``hopper.fwd``, the ladder).

One place for the structure of (q, k, v) and for the softmax scale, so a caller sees the same
message whichever door it used; each entry point adds what only it requires (the public API:
no empty tensors, a contiguous last dimension; a kernel: its dtypes, device, strides, head dims).
"""
from __future__ import annotations

import math
import weakref

import torch

_LAYOUTS = {"q": "(batch, seqlen_q, heads_q, head_dim)", "k": "(batch, seqlen_k, heads_kv, head_dim)",
            "v": "(batch, seqlen_k, heads_kv, head_dim_v)"}


def check_qkv(q, k, v, dtypes: tuple[torch.dtype, ...] | None = None, dtype_words: str = "") -> None:
    """Three 4-D torch tensors of one dtype on one device: q ``(batch, seqlen_q, heads_q, head_dim)``,
    k ``(batch, seqlen_k, heads_kv, head_dim)``, v ``(batch, seqlen_k, heads_kv, head_dim_v)``; v's
    head dim may differ from q's and k's (each kernel says whether it runs that). With ``dtypes``,
    each tensor's dtype must be one of them (``dtype_words`` says which, for the message). Raises
    ``TypeError``/``ValueError`` naming the argument."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions {_LAYOUTS[name]}, got shape {tuple(t.shape)}")
        if dtypes is not None and t.dtype not in dtypes:
            raise TypeError(f"{name} has dtype {t.dtype}; expected {dtype_words}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got q {q.device}, k {k.device}, v {v.device}")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree in (batch, seqlen_k, heads_kv): k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"k's head_dim ({k.shape[3]}) must equal q's ({q.shape[3]})")


def check_softmax_scale(softmax_scale) -> float:
    """A finite positive number, as a float. Positive because the kernels take the running max over
    raw scores and scale afterwards, which commutes with the scale only when it is positive."""
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be a finite positive number, got {softmax_scale!r}")
    return float(softmax_scale)


def check_softcap(softcap) -> float:
    """flash-attn's ``softcap``: 0 (none) or a finite positive number, as a float."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) \
            or softcap < 0:
        raise ValueError(f"softcap must be 0 (none) or a finite positive number, got {softcap!r}")
    return float(softcap)


# flash-attn's window_size for "no sliding window": both sides unbounded
NO_WINDOW = (-1, -1)


def score_kwargs(window_size=NO_WINDOW, softcap: float = 0.0) -> dict:
    """``window_size=`` and ``softcap=`` for a kernel call whose problem has them; nothing for what
    is absent, so kernels without sliding windows or caps are called as they always were (dispatch
    sends a problem that has them only to a kernel that takes them)."""
    kwargs = {} if tuple(window_size) == NO_WINDOW else {"window_size": tuple(window_size)}
    return kwargs | ({"softcap": float(softcap)} if softcap else {})


# cu_seqlens' values as last read on the host, by the tensor's id: (a weak reference that proves
# the id still names that tensor, its in-place version then, the values). An entry leaves with its
# tensor.
_HOST_OFFSETS: dict[int, tuple[weakref.ref, int, tuple[int, ...]]] = {}


def host_offsets(name: str, cu: torch.Tensor) -> tuple[int, ...]:
    """The values of a packed launch's cumulative lengths ``cu`` (named ``name``) on the host, read
    once per tensor and in-place version: a call with the tensor it was given last time, unchanged,
    does not copy it again, so the host does not wait for the GPU before launching (every call
    that copies does). A change made in place through PyTorch (``cu[1] = 7``, ``cu.copy_(...)``, on
    it or on a view of its storage) moves the version and is read again; one PyTorch cannot see
    (through ``.data``, a kernel of one's own, DLPack) is not. Inference tensors carry no version:
    they are read every call. Under a CUDA graph capture only a tensor already read can be used
    (the copy would break the capture): raises ``RuntimeError`` naming it otherwise."""
    if cu.is_inference():
        return tuple(cu.tolist())
    key, version = id(cu), cu._version
    hit = _HOST_OFFSETS.get(key)
    if hit is not None and hit[0]() is cu and hit[1] == version:
        return hit[2]
    if cu.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{name} is read on the host before a packed launch, which a CUDA graph capture cannot "
                           "record: call once with this tensor before capturing (its values then, unchanged since, "
                           "are what the capture checks)")
    offsets = tuple(cu.tolist())
    _HOST_OFFSETS[key] = (weakref.ref(cu, lambda _, key=key: _HOST_OFFSETS.pop(key, None)), version, offsets)
    return offsets
