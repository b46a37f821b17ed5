"""Pieces the portable forward and backward share: tile configuration, the causal geometry,
and the launch-side checks. Kept in one place so the mask and the KV-loop bounds are the same
everywhere they are used."""
from __future__ import annotations

import dataclasses
import functools
import math

import torch
import triton
import triton.language as tl

from flashrung.dispatch import Problem

LOG2E = 1.4426950408889634   # log2(e): folded into the softmax scale so exp becomes exp2
LN2 = 0.6931471805599453     # ln(2): turns the kernel's log2-domain LSE back to natural log

# Head dims the portable kernels take, for q/k and for v alike (they may differ): the tile width
# is the next power of two and the unused columns are masked, so any multiple of 8 in range works.
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 256
DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Kernels are decorated once, at import; whether they are interpreted is fixed then.
INTERPRETED = bool(triton.knobs.runtime.interpret)
# The interpreter (3.6) rounds fp32 → bf16 toward zero whatever rounding is asked for, which
# doubles the error of every bf16 store; round to nearest-even by hand there. On a GPU the
# plain cast already rounds to nearest-even (cvt.rn).
EMULATE_BF16_ROUNDING = tl.constexpr(INTERPRETED)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """fp32 → ``dtype`` with round-to-nearest-even, on the GPU and in the interpreter alike."""
    if EMULATE_BF16_ROUNDING and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


@triton.jit
def causal_kv_bounds(start_m, seqlen_q, seqlen_k,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """KV range of one Q tile: ``[0, full_end)`` needs no mask, ``[full_end, hi)`` does.

    Causal is bottom-right aligned: query i sees key j iff j <= i + (Sk − Sq). Tiles past ``hi``
    are never visited (block skipping); only the diagonal tiles and the ragged key tail pay for
    the mask.
    """
    whole_tiles_end = (seqlen_k // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        diag = seqlen_k - seqlen_q
        hi = tl.minimum(seqlen_k, tl.maximum(start_m + BLOCK_M + diag, 0))
        # every row of the tile sees keys < start_m + diag + 1
        first_row_sees = tl.maximum(start_m + diag + 1, 0)
        full_end = tl.minimum((first_row_sees // BLOCK_N) * BLOCK_N, whole_tiles_end)
    else:
        hi = seqlen_k
        full_end = whole_tiles_end
    full_end = tl.minimum(full_end, hi)
    return full_end, hi


# An element 2**31 or more past its tensor's start has an offset an int32 index × stride product
# cannot hold: it wraps, and the load reads another batch entry's rows without a fault. A launch
# that reaches one computes its indices in int64 (PyTorch's rule for 32-bit indexing, per launch);
# the others keep int32 address arithmetic, and their machine code is unchanged.
INT32_OFFSET_LIMIT = 2**31


def needs_int64_offsets(*tensors: torch.Tensor) -> bool:
    """Whether some element of these tensors lies ``INT32_OFFSET_LIMIT`` elements or more past its
    tensor's start, by the tensor's own strides (a view into a larger buffer counts its gaps)."""
    return any(sum((n - 1) * s for n, s in zip(t.shape, t.stride())) >= INT32_OFFSET_LIMIT
               for t in tensors if t.numel())


@triton.jit
def offset_index(index, INT64_OFFSETS: tl.constexpr):
    """``index`` as int64 when the launch needs it (``needs_int64_offsets``), else as it is. The
    kernels pass their program ids and in-tile row ranges through this: every batch, head and row
    index derives from them, so every product with an int32 stride widens with them."""
    # one return: compiled (not interpreted), a function whose returns differ in type is refused
    # even where a constexpr decides which one runs
    if INT64_OFFSETS:
        index = index.to(tl.int64)
    return index


@triton.jit
def sequence_span(cu_seqlens, b, seqlen, VARLEN: tl.constexpr):
    """``(first row, length)`` of batch entry ``b``: with ``VARLEN`` its slice of the packed rows, read
    from ``cu_seqlens`` (flash-attn's cumulative lengths); otherwise ``(0, seqlen)``, the batch stride
    placing it. The first row is as wide as ``b`` (``offset_index``)."""
    start = 0
    if VARLEN:
        start = tl.load(cu_seqlens + b).to(b.dtype)
        seqlen = tl.load(cu_seqlens + b + 1) - start
    return start, seqlen


@triton.jit
def window_kv_bounds(start_m, seqlen_q, seqlen_k, window_left, window_right,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """KV range of one Q tile under a sliding window: ``[lo, full_start)`` and ``[full_end, hi)``
    need the mask, ``[full_start, full_end)`` does not.

    Query i sees key j iff ``i + (Sk − Sq) − window_left <= j <= i + (Sk − Sq) + window_right``
    (bottom-right aligned, as flash-attn's ``window_size``; ``window_sides`` gives both as
    non-negative numbers). Tiles outside every row's window are never visited; a tile is unmasked
    only when every row of the Q tile sees every key of it and no key is past ``Sk``.
    """
    diag = seqlen_k - seqlen_q
    lo = (tl.maximum(start_m + diag - window_left, 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(seqlen_k, tl.maximum(start_m + BLOCK_M + diag + window_right, 0))
    # the keys every row sees: from the last row's first key to the first row's last key
    full_start = tl.cdiv(tl.maximum(start_m + BLOCK_M - 1 + diag - window_left, 0), BLOCK_N) * BLOCK_N
    full_end = tl.minimum((tl.maximum(start_m + diag + window_right + 1, 0) // BLOCK_N) * BLOCK_N,
                          (seqlen_k // BLOCK_N) * BLOCK_N)
    full_start = tl.minimum(tl.maximum(full_start, lo), hi)
    full_end = tl.minimum(tl.maximum(full_end, full_start), hi)
    return lo, full_start, full_end, hi


@triton.jit
def score_mask(offs_m, offs_n, seqlen_q, seqlen_k, window_left, window_right,
               IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """True where query ``offs_m`` may attend key ``offs_n`` and the key exists. With ``HAS_WINDOW``
    the sliding window decides (a causal one has ``window_right`` 0), ``IS_CAUSAL`` otherwise."""
    valid = offs_n[None, :] < seqlen_k
    if HAS_WINDOW:
        rel = offs_n[None, :] - (offs_m[:, None] + (seqlen_k - seqlen_q))
        valid = valid & (rel >= -window_left) & (rel <= window_right)
    elif IS_CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None] + (seqlen_k - seqlen_q))
    return valid


@triton.jit
def capped_scores(qk, softcap_pre, softcap_post):
    """flash-attn's ``softcap`` on raw q·kᵀ products, in log2 units: ``softcap · tanh(scale · qk /
    softcap) · log2(e)``, the host folding ``scale / softcap`` into ``softcap_pre`` and
    ``softcap · log2(e)`` into ``softcap_post`` (``softcap_factors``). Also returns the tanh: the
    backward multiplies dS by its ``1 − tanh²``. The tanh as ``1 − 2 / (e^{2x} + 1)``: exactly ±1 at
    both infinities, and exp2 is what the interpreter and every GPU run alike."""
    cap = 1.0 - 2.0 / (tl.math.exp2(qk * (softcap_pre * 2.8853900817779268)) + 1.0)    # 2·log2(e)
    return cap * softcap_post, cap


def softcap_factors(softcap: float, softmax_scale: float) -> tuple[float, float] | None:
    """``(softcap_pre, softcap_post)`` of :func:`capped_scores`, or None without a cap (``HAS_SOFTCAP`` off)."""
    if softcap == 0.0:
        return None
    return softmax_scale / softcap, softcap * LOG2E


def window_sides(window_size: tuple[int, int], causal: bool, seqlen_q: int, seqlen_k: int) -> tuple[int, int] | None:
    """The kernels' ``(window_left, window_right)`` for flash-attn's ``window_size`` (−1: that side
    unbounded), both non-negative — an unbounded side as ``Sq + Sk``, wider than any distance, and
    a causal window's right side 0 — or None where nothing is windowed (``HAS_WINDOW`` off)."""
    left, right = window_size
    if left < 0 and (right < 0 or causal):
        return None
    unbounded = seqlen_q + seqlen_k
    return (left if left >= 0 else unbounded, 0 if causal else (right if right >= 0 else unbounded))


@dataclasses.dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@functools.lru_cache(maxsize=None)
def forward_config(head_dim: int, capability: tuple[int, int] | None) -> TileConfig:
    """Tiles for the forward at ``head_dim``, the wider of q/k's and v's. Under the interpreter,
    small tiles so CPU tests cross several tiles at small lengths; on sm_120 (99 KB of shared
    memory) one stage fewer at d > 128."""
    if capability is None:
        return TileConfig(32, 32, 4, 1)
    block_d = triton.next_power_of_2(head_dim)
    if block_d <= 64:
        return TileConfig(128, 64, 4, 3)
    if block_d <= 128:
        return TileConfig(128, 64, 8, 3 if capability[0] != 12 else 2)
    # d256: every tile shape tried spills on sm_90a (64x64x4w: 4.6 KB; this one: 240 B, the
    # least of 64/128 rows x 16/32/64 keys x 4/8 warps); the portable kernel is the floor here
    return TileConfig(64, 32, 8, 2 if capability[0] != 12 else 1)


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    dkdv: TileConfig     # one program per KV tile (block_n keys), looping over block_m query tiles
    dq: TileConfig       # one program per Q tile (block_m queries), looping over block_n key tiles


@functools.lru_cache(maxsize=None)
def backward_config(head_dim: int, capability: tuple[int, int] | None) -> BackwardConfig:
    """Backward tiles at ``head_dim``, the wider of q/k's and v's, chosen from the sm_90a census
    as the shapes with the fewest spilled bytes (dk and dv both live in registers across the whole
    query loop): d64 spills nothing; d128's dk/dv kernel spills 288 B at best and d256's 3 KB, where
    the portable kernel is only the floor. sm_120 keeps every tile under its 99 KB of shared memory."""
    if capability is None:
        tile = TileConfig(32, 32, 4, 1)
        return BackwardConfig(tile, tile)
    block_d = triton.next_power_of_2(head_dim)
    small_smem = capability[0] == 12
    if block_d <= 64:
        return BackwardConfig(TileConfig(32, 128, 8, 1), TileConfig(64, 64, 4, 2))
    if block_d <= 128:
        return BackwardConfig(TileConfig(16, 64, 4, 1), TileConfig(64, 64, 4, 1))
    if small_smem:
        return BackwardConfig(TileConfig(16, 64, 4, 1), TileConfig(16, 64, 4, 1))
    return BackwardConfig(TileConfig(64, 64, 8, 1), TileConfig(32, 128, 8, 1))


# The launch the census compiles the portable kernels as (``census.as_launched``): contiguous
# (B, S, H, D) tensors and (B, H, S) row statistics of the fa4-protocol's d128 rows' kind — every
# stride, length and head count a multiple of 16, one query head per K/V head. A problem whose
# lengths or heads are not multiples of 16 runs another binary (fewer alignment facts).
CENSUS_LAUNCH = dict(batch=2, seqlen=16384, heads=16)
CENSUS_LAUNCH_LABEL = "contiguous (B, S, H, D), S and H multiples of 16, group 1"


def census_launch_values(head_dim: int, batch: int = CENSUS_LAUNCH["batch"], seqlen: int = CENSUS_LAUNCH["seqlen"],
                         heads: int = CENSUS_LAUNCH["heads"]) -> dict:
    """Every integer argument the portable forward and backward kernels take, as a launch on
    contiguous tensors of this problem passes it (the census keeps the ones a kernel has)."""
    from flashrung.evidence.census import contiguous_strides

    values = contiguous_strides(("q", "k", "v", "o", "do", "dk", "dv", "dq", "d"), seqlen, heads, head_dim)
    return {**values, "stride_lb": heads * seqlen, "stride_lh": seqlen, "seqlen_q": seqlen, "seqlen_k": seqlen,
            "heads_q": heads, "heads_kv": heads, "group": 1}


def census_as_launched(spec):
    """``spec`` compiled as :data:`CENSUS_LAUNCH` launches it (``census.as_launched``)."""
    from flashrung.evidence.census import as_launched

    values = census_launch_values(spec.constexprs["HEAD_DIM"])
    return as_launched(spec, {k: v for k, v in values.items() if k in spec.signature}, CENSUS_LAUNCH_LABEL)


def unsupported_reason(problem: Problem) -> str | None:
    """Why the portable kernels cannot run ``problem``, or None."""
    if problem.device_type == "cpu":
        if not INTERPRETED:
            return ("CPU tensors run only under the Triton interpreter: set TRITON_INTERPRET=1 "
                    "before importing flashrung, or move the tensors to a CUDA device")
    elif problem.device_type != "cuda":
        return f"device type {problem.device_type!r} is not supported (CUDA or CPU interpreter)"
    elif problem.capability is not None and problem.capability < (8, 0):
        return f"compute capability {problem.capability} < 8.0 (Ampere or newer required)"
    if problem.dtype not in DTYPES:
        return f"dtype {problem.dtype} is not supported (float16, bfloat16, float32)"
    for name, dim in (("head_dim", problem.head_dim), ("head_dim_v", problem.head_dim_v)):
        if not (MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM) or dim % 8:
            return f"{name} {dim} is not a multiple of 8 in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    return None


def dot_in_fp32(dtype: torch.dtype) -> bool:
    """The interpreter multiplies raw bf16 bits in tl.dot: upcast its operands there."""
    return INTERPRETED or dtype == torch.float32


def capability_of(t: torch.Tensor):
    if t.device.type != "cuda":
        return None
    from flashrung import _device
    return _device.capability(t.device)


def check_scale(softmax_scale: float) -> float:
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return float(softmax_scale)
