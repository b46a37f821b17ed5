"""Portable attention forward in plain Triton (FlashAttention-2 algorithm).

What it computes: out = softmax(scale · q kᵀ [+ causal mask]) v and the natural-log LSE, for
q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) (Dv may differ from D: MLA's 192/128),
any lengths, GQA/MQA by head-index mapping, causal or not, with or without a sliding window and
flash-attn's softcap on the scaled scores (``common.capped_scores``).

Levers: online softmax in the log2 domain (log2(e) folded into the scale once on the host, so the
inner loop is one FMA and one exp2 per score); causal block skipping with the mask applied only on
the diagonal tiles and the ragged key tail (``causal_kv_bounds``), and for a sliding window on the
tiles at both of its edges (``window_kv_bounds``); one program per (Q tile, head).

Evidence: runs on any CUDA GPU sm_80+ and under ``TRITON_INTERPRET=1`` on the CPU; gated by
``flashrung.gate`` in the CPU tests (interpreter) and on the device (``flashrung check``). It is
the floor the Hopper kernels must leave behind, not a contender.

``DEFECT`` exists for the gate's mutation battery only (``flashrung.gate_mutations``): each
non-zero value compiles in one deliberate bug the gate must catch; 0 compiles none of them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrung._device import sm_count
from flashrung.evidence.census import CensusSpec
from flashrung.kernels.direct_launch import DirectLaunch, enabled_by_environment, specialization_key
from flashrung.inputs import NO_WINDOW
from flashrung.kernels.portable import common
from flashrung.kernels.portable.common import (LOG2E, capped_scores, causal_kv_bounds, offset_index,
                                               round_to, score_mask, sequence_span, softcap_factors,
                                               window_kv_bounds, window_sides)

unsupported_reason = common.unsupported_reason

# Deliberate defects for the mutation battery (see flashrung/gate_mutations.py).
NO_DEFECT = 0
DEFECT_SKIP_RESCALE = 1       # forget to rescale the accumulator when the running max moves
DEFECT_CAUSAL_OFF_BY_ONE = 2  # causal mask lets each query see one key too many
DEFECT_UNFOLDED_SCALE = 3     # exp2 applied to scores scaled for exp (log2(e) not folded in)
DEFECT_PERMUTED_K_TILE = 4    # K rows of a tile read in reverse order, V rows not
DEFECT_DROP_LAST_KV_TILE = 5  # loop stops one KV tile early
DEFECT_UNWRITTEN_ROW = 6      # last row of every Q tile never stored
DEFECT_LSE_LOG2 = 7           # LSE stored in base 2 instead of natural log


@triton.jit
def _kv_tile_update(acc, row_max, row_sum, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, offs_dv,
                    stride_ks, stride_vs, seqlen_q, seqlen_k, qk_scale_log2, window_left, window_right,
                    softcap_pre, softcap_post, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                    MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                    HAS_SOFTCAP: tl.constexpr, DOT_FP32: tl.constexpr, DEFECT: tl.constexpr):
    """One step of the online softmax: fold KV tile ``start_n`` into (acc, row_max, row_sum)."""
    keys = start_n + offs_n
    key_rows = keys
    if DEFECT == 4:
        key_rows = start_n + (offs_n.shape[0] - 1 - offs_n)
    k = tl.load(k_base + key_rows[:, None] * stride_ks + offs_d[None, :],
                mask=(key_rows[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    v = tl.load(v_base + keys[:, None] * stride_vs + offs_dv[None, :],
                mask=(keys[:, None] < seqlen_k) & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    if DOT_FP32:
        scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    if HAS_SOFTCAP:
        scores, _ = capped_scores(scores, softcap_pre, softcap_post)
    elif DEFECT == 3:
        scores = scores * (qk_scale_log2 / 1.4426950408889634)
    else:
        scores = scores * qk_scale_log2
    if MASKED:
        if DEFECT == 2:
            valid = (keys[None, :] < seqlen_k) & (keys[None, :] <= offs_m[:, None] + (seqlen_k - seqlen_q) + 1)
        else:
            valid = score_mask(offs_m, keys, seqlen_q, seqlen_k, window_left, window_right, IS_CAUSAL, HAS_WINDOW)
        scores = tl.where(valid, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    # A row that has seen only masked keys keeps max = -inf; subtracting 0 instead keeps
    # exp2(-inf - (-inf)) = NaN out of the sums (its output is defined as 0 at the end).
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    p = tl.math.exp2(scores - safe_max[:, None])
    alpha = tl.math.exp2(row_max - safe_max)
    if DEFECT == 1:
        alpha = tl.full(alpha.shape, 1.0, tl.float32)
    row_sum = row_sum * alpha + tl.sum(p, 1)
    if DOT_FP32:
        pv = tl.dot(round_to(p, v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(round_to(p, v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return acc, new_max, row_sum


@triton.jit
def _attend_tile(
    Q, K, V, O, LSE,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale_log2, window_left, window_right, softcap_pre, softcap_post,
    CU_SEQLENS_Q, CU_SEQLENS_K, pid_m, pid_bh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, DOT_FP32: tl.constexpr, DEFECT: tl.constexpr,
    INT64_OFFSETS: tl.constexpr, ONLY_FLAGGED: tl.constexpr,
):
    """Q tile ``pid_m`` of (batch · q head) ``pid_bh``: its rows' O and LSE over every key. With
    ``ONLY_FLAGGED`` the tile runs only if a row's LSE already in ``LSE`` is NaN, and writes those
    rows alone (:func:`recompute_flagged`)."""
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    kv_h = h // group                       # GQA: `group` query heads share one K/V head
    start_m = pid_m * BLOCK_M
    live = True
    if VARLEN:
        # packed sequences: the grid covers the longest; this one's rows start at its cu_seqlens entry
        q_start, seqlen_q = sequence_span(CU_SEQLENS_Q, b, seqlen_q, VARLEN)
        k_start, seqlen_k = sequence_span(CU_SEQLENS_K, b, seqlen_k, VARLEN)
        live = start_m < seqlen_q
        Q += q_start * stride_qs
        O += q_start * stride_os
        LSE += q_start                      # lse is (heads, rows): its rows are contiguous
        K += k_start * stride_ks
        V += k_start * stride_vs
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = offset_index(tl.arange(0, BLOCK_N), INT64_OFFSETS)     # key rows: start_n + offs_n
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)       # V's and O's columns: HEAD_DIM_V may differ from HEAD_DIM
    row_ok = offs_m < seqlen_q

    store_ok = row_ok
    if ONLY_FLAGGED:
        # a faster kernel's rows it could not finish exactly: their LSE is NaN (hopper.fwd's
        # frozen row max, _flag_overflow)
        earlier = tl.load(LSE + b * stride_lb + h * stride_lh + offs_m, mask=row_ok, other=0.0)
        store_ok = row_ok & (earlier != earlier)
        live = live & (tl.max(store_ok.to(tl.int32), 0) > 0)
    if live:
        q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        k_base = K + b * stride_kb + kv_h * stride_kh
        v_base = V + b * stride_vb + kv_h * stride_vh

        row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

        if HAS_WINDOW:
            # a sliding window masks the tiles at both of its ends: the first ones first
            lo, full_start, full_end, hi = window_kv_bounds(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                                            BLOCK_M, BLOCK_N)
            for start_n in range(lo, full_start, BLOCK_N):
                acc, row_max, row_sum = _kv_tile_update(
                    acc, row_max, row_sum, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, offs_dv,
                    stride_ks, stride_vs, seqlen_q, seqlen_k, qk_scale_log2, window_left, window_right,
                    softcap_pre, softcap_post, HEAD_DIM, HEAD_DIM_V, True, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP,
                    DOT_FP32, DEFECT)
        else:
            full_start = 0
            full_end, hi = causal_kv_bounds(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        if DEFECT == 5:
            hi = tl.maximum(hi - BLOCK_N, 0)
            full_end = tl.minimum(full_end, hi)
        for start_n in range(full_start, full_end, BLOCK_N):
            acc, row_max, row_sum = _kv_tile_update(
                acc, row_max, row_sum, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, offs_dv,
                stride_ks, stride_vs, seqlen_q, seqlen_k, qk_scale_log2, window_left, window_right,
                softcap_pre, softcap_post, HEAD_DIM, HEAD_DIM_V, False, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP,
                DOT_FP32, DEFECT)
        for start_n in range(full_end, hi, BLOCK_N):
            acc, row_max, row_sum = _kv_tile_update(
                acc, row_max, row_sum, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, offs_dv,
                stride_ks, stride_vs, seqlen_q, seqlen_k, qk_scale_log2, window_left, window_right,
                softcap_pre, softcap_post, HEAD_DIM, HEAD_DIM_V, True, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP,
                DOT_FP32, DEFECT)

        # Rows that saw no key (causal with Sq > Sk) are defined as out = 0, lse = -inf.
        seen = row_sum > 0.0
        out = acc / tl.where(seen, row_sum, 1.0)[:, None]
        lse_log2 = row_max + tl.math.log2(tl.where(seen, row_sum, 1.0))
        if DEFECT == 7:
            lse = tl.where(seen, lse_log2, float("-inf"))
        else:
            lse = tl.where(seen, lse_log2 * 0.6931471805599453, float("-inf"))
        if DEFECT == 6:
            store_ok = store_ok & (offs_m < start_m + BLOCK_M - 1)
        tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_dv[None, :],
                 round_to(out, O.dtype.element_ty), mask=store_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))
        tl.store(LSE + b * stride_lb + h * stride_lh + offs_m, lse, mask=store_ok)


@triton.jit
def _attn_fwd(
    Q, K, V, O, LSE,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale_log2, window_left, window_right, softcap_pre, softcap_post,
    CU_SEQLENS_Q, CU_SEQLENS_K,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, DOT_FP32: tl.constexpr, DEFECT: tl.constexpr,
    INT64_OFFSETS: tl.constexpr,
):
    # one program per (Q tile, batch · q head)
    _attend_tile(Q, K, V, O, LSE, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                 seqlen_q, seqlen_k, heads_q, group, qk_scale_log2, window_left, window_right, softcap_pre,
                 softcap_post, CU_SEQLENS_Q, CU_SEQLENS_K, offset_index(tl.program_id(0), INT64_OFFSETS),
                 offset_index(tl.program_id(1), INT64_OFFSETS), HEAD_DIM, BLOCK_D, HEAD_DIM_V, BLOCK_DV, BLOCK_M,
                 BLOCK_N, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP, VARLEN, DOT_FP32, DEFECT, INT64_OFFSETS, False)


@triton.jit
def _recompute_flagged(
    GUARD, Q, K, V, O, LSE,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale_log2, window_left, window_right, softcap_pre, softcap_post,
    CU_SEQLENS_Q, CU_SEQLENS_K, num_m_blocks, num_tiles,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, DOT_FP32: tl.constexpr,
    INT64_OFFSETS: tl.constexpr, RESET: tl.constexpr = False,
):
    # a fixed grid that reads one word and leaves when it is 0 (every launch the guard did not
    # trip); otherwise it walks every tile and runs those with a flagged row
    if tl.load(GUARD) != 0:
        for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            tile = offset_index(tile, INT64_OFFSETS)
            _attend_tile(Q, K, V, O, LSE, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                         stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                         seqlen_q, seqlen_k, heads_q, group, qk_scale_log2, window_left, window_right,
                         softcap_pre, softcap_post, CU_SEQLENS_Q, CU_SEQLENS_K, tile % num_m_blocks,
                         tile // num_m_blocks, HEAD_DIM, BLOCK_D, HEAD_DIM_V, BLOCK_DV, BLOCK_M, BLOCK_N,
                         IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP, VARLEN, DOT_FP32, 0, INT64_OFFSETS, True)
        if RESET:
            # the word left 0 for the next launch on this stream, so that no launch pays a memset:
            # the last program to count itself resets it (GUARD[1] counts), and every program read
            # the word before it counted (the add releases in program order), so none reads it reset
            done = tl.atomic_add(GUARD + 1, 1)
            if done == tl.num_programs(0) - 1:
                tl.store(GUARD, 0)
                tl.store(GUARD + 1, 0)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float,
            out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
            defect: int = NO_DEFECT, window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
            cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None = None, max_seqlens: tuple[int, int] | None = None):
    """q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv), inner stride 1 → out (B, Sq, Hq, Dv),
    lse (B, Hq, Sq) fp32. ``window_size``: flash-attn's sliding window ``(left, right)``, −1 for an
    unbounded side (``common.window_sides``). ``softcap`` > 0: flash-attn's cap on the scaled scores,
    ``softcap · tanh(scores / softcap)`` (``common.capped_scores``).

    Packed sequences (flash-attn's varlen): ``cu_seqlens`` = (cu_seqlens_q, cu_seqlens_k), int32
    cumulative lengths of B + 1 entries, and ``max_seqlens`` = (max_seqlen_q, max_seqlen_k); q, k,
    v, out are then (1, total rows, heads, dim) and lse (1, Hq, total_q)."""
    B, Sq, Hq, D = q.shape
    Dv = v.shape[3]
    if out is None:
        out = torch.empty((B, Sq, Hq, Dv), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    args, constexprs, (num_m_blocks, batch_heads), cfg = _launch_args(q, k, v, out, lse, causal, softmax_scale,
                                                                      window_size, softcap, cu_seqlens, max_seqlens)
    _attn_fwd[(num_m_blocks, batch_heads)](*args, **constexprs, DEFECT=defect, num_warps=cfg.num_warps,
                                           num_stages=cfg.num_stages)
    return out, lse


def check_guard(guard: torch.Tensor, device, name: str = "guard", words: int = 1) -> None:
    """Raise ``ValueError`` (naming ``name``) unless ``guard`` is ``words`` contiguous int32 words on
    ``device``: the word :func:`recompute_flagged` reads (and, to reset it, the count beside it)."""
    if guard.dtype != torch.int32 or guard.numel() != words or guard.device != device or not guard.is_contiguous():
        raise ValueError(f"{name} must be {'one int32 word' if words == 1 else f'{words} contiguous int32 words'} "
                         f"on {device}, got {tuple(guard.shape)} {guard.dtype} on {guard.device}")


# False: every recompute launch through JITFunction.run (hopper.fwd's switch, the same variable)
DIRECT_LAUNCH = enabled_by_environment()
_RECOMPUTE = DirectLaunch(_recompute_flagged)
# recompute_flagged's launch plans by shape class; a process that sees more starts over
_RECOMPUTE_PLANS: dict[tuple, tuple] = {}
MAX_RECOMPUTE_PLANS = 4096


# Programs of the recompute per SM: each walks its share of the tiles only when the guard tripped
RECOMPUTE_PROGRAMS_PER_SM = 2


def recompute_flagged(guard: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                      lse: torch.Tensor, causal: bool, softmax_scale: float,
                      window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
                      cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None = None,
                      max_seqlens: tuple[int, int] | None = None, reset: bool = False) -> None:
    """Rewrite, with this kernel's online softmax, every row whose LSE in ``lse`` is NaN, when the
    int32 word ``guard`` is not 0; arguments as :func:`forward`'s, ``out`` and ``lse`` a finished
    launch's. A faster kernel that cannot finish a row exactly flags it this way (``hopper.fwd``'s
    frozen row max). The launch does not read ``guard`` on the host: when it is 0 each program
    reads it and leaves, so the call costs one small launch and never synchronizes.

    ``reset``: ``guard`` is two words, the flag and a count the launch uses to leave both 0 after a
    trip (a word reused by every launch of one stream needs no zeroing); else one word, left as the
    launch found it (a caller reads it)."""
    check_guard(guard, q.device, words=2 if reset else 1)
    # everything _launch_args derives from the call but the tensors' addresses, once per shape class:
    # a launch that almost always only reads the word should cost its caller little more than the
    # launch itself (hopper.fwd's small calls are bound by their host path)
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), out.shape, out.stride(), lse.shape,
           lse.stride(), q.dtype, q.device, bool(causal), softmax_scale, tuple(window_size), softcap,
           cu_seqlens is not None, max_seqlens, reset, RECOMPUTE_PROGRAMS_PER_SM)
    plan = _RECOMPUTE_PLANS.get(key)
    if plan is None:
        args, constexprs, (num_m_blocks, batch_heads), cfg = _launch_args(
            q, k, v, out, lse, causal, softmax_scale, window_size, softcap, cu_seqlens, max_seqlens)
        num_tiles = num_m_blocks * batch_heads
        sms = sm_count(q.device.index) if q.device.type == "cuda" else 1
        grid = max(1, min(num_tiles, RECOMPUTE_PROGRAMS_PER_SM * sms))
        if len(_RECOMPUTE_PLANS) >= MAX_RECOMPUTE_PLANS:
            _RECOMPUTE_PLANS.clear()
        # the scalars between lse and cu_seqlens: strides, lengths, heads, scale, window, cap
        plan = _RECOMPUTE_PLANS[key] = (args[5:-2], (num_m_blocks, num_tiles), dict(constexprs, RESET=reset), grid,
                                        cfg.num_warps, cfg.num_stages)
    scalars, tiles, constexprs, grid, num_warps, num_stages = plan
    pointers = (guard, q, k, v, out, lse, *(cu_seqlens or (lse, lse)))
    args = (*pointers[:6], *scalars, *pointers[6:], *tiles)
    if DIRECT_LAUNCH:
        # the launch JITFunction.run would make, without its binding of 33 arguments (tens of µs a
        # call): the plan's key fixes every integer, constexpr and the dtype of q, k, v and out; the
        # pointers add their dtypes and 16-byte alignment (specialization_key's rule)
        _RECOMPUTE(grid, (key, specialization_key(pointers)), args, constexprs, num_warps, num_stages=num_stages)
    else:
        _recompute_flagged[(grid,)](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)


def _launch_args(q, k, v, out, lse, causal, softmax_scale, window_size, softcap, cu_seqlens, max_seqlens):
    """``(args, constexprs, (q tiles, batch · q heads), tiles)`` of a launch over these tensors,
    :func:`forward`'s and :func:`recompute_flagged`'s alike (``DEFECT`` aside)."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    if cu_seqlens is not None:
        B = cu_seqlens[0].numel() - 1
        Sq, Sk = max_seqlens
    cfg = common.forward_config(max(D, Dv), common.capability_of(q))
    sides = window_sides(window_size, causal, Sq, Sk)
    scale = common.check_scale(softmax_scale)
    cap = softcap_factors(softcap, scale)
    # packed sequences are one batch entry of rows: the kernel places each sequence by its offset
    batch_stride = (lambda t: 0) if cu_seqlens is not None else (lambda t: t.stride(0))
    args = (
        q, k, v, out, lse,
        batch_stride(q), q.stride(1), q.stride(2),
        batch_stride(k), k.stride(1), k.stride(2),
        batch_stride(v), v.stride(1), v.stride(2),
        batch_stride(out), out.stride(1), out.stride(2),
        batch_stride(lse), lse.stride(1),
        Sq, Sk, Hq, Hq // Hkv, scale * LOG2E, *(sides or (0, 0)), *(cap or (0.0, 0.0)),
        *(cu_seqlens or (lse, lse)),     # never read without VARLEN
    )
    constexprs = dict(
        HEAD_DIM=D, BLOCK_D=triton.next_power_of_2(D), HEAD_DIM_V=Dv, BLOCK_DV=triton.next_power_of_2(Dv),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        IS_CAUSAL=bool(causal), HAS_WINDOW=sides is not None,
        HAS_SOFTCAP=cap is not None, VARLEN=cu_seqlens is not None, DOT_FP32=common.dot_in_fp32(q.dtype),
        INT64_OFFSETS=common.needs_int64_offsets(q, k, v, out, lse),
    )
    return args, constexprs, (triton.cdiv(Sq, cfg.block_m), B * Hq), cfg


def _signature(dtype: str) -> dict:
    ptrs = {name: f"*{dtype}" for name in ("Q", "K", "V", "O")}
    ints = {name: "i32" for name in (
        "stride_qb", "stride_qs", "stride_qh", "stride_kb", "stride_ks", "stride_kh",
        "stride_vb", "stride_vs", "stride_vh", "stride_ob", "stride_os", "stride_oh",
        "stride_lb", "stride_lh", "seqlen_q", "seqlen_k", "heads_q", "group")}
    return {**ptrs, "LSE": "*fp32", **ints, "qk_scale_log2": "fp32", "window_left": "i32", "window_right": "i32",
                "softcap_pre": "fp32", "softcap_post": "fp32", "CU_SEQLENS_Q": "*i32", "CU_SEQLENS_K": "*i32"}


def census_specs() -> list[CensusSpec]:
    specs = []
    for arch, cap in (("sm_80", (8, 0)), ("sm_90a", (9, 0)), ("sm_120", (12, 0))):
        for head_dim in (64, 128, 256):
            for causal in (False, True):
                cfg = common.forward_config(head_dim, cap)
                specs.append(CensusSpec(
                    kernel="portable.fwd",
                    config={"head_dim": head_dim, "causal": causal, "dtype": "bf16",
                            "block_m": cfg.block_m, "block_n": cfg.block_n,
                            "num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                    fn=_attn_fwd, signature=_signature("bf16"),
                    constexprs={"HEAD_DIM": head_dim, "BLOCK_D": head_dim, "HEAD_DIM_V": head_dim,
                                "BLOCK_DV": head_dim, "BLOCK_M": cfg.block_m,
                                "BLOCK_N": cfg.block_n, "IS_CAUSAL": causal, "HAS_WINDOW": False,
                                "HAS_SOFTCAP": False, "VARLEN": False, "DOT_FP32": False,
                                "DEFECT": NO_DEFECT, "INT64_OFFSETS": False},
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages, arches=(arch,)))
    # the recompute behind hopper.fwd's frozen row max (recompute_flagged), on the GPU it serves:
    # compiled here, a kernel the CPU tests only interpret shows what a compiled build refuses (a
    # module global read inside the kernel, say) and what it costs in registers and spills
    for head_dim in (64, 128):
        for causal in (False, True):
            cfg = common.forward_config(head_dim, (9, 0))
            specs.append(CensusSpec(
                kernel="portable.recompute_flagged",
                config={"head_dim": head_dim, "causal": causal, "dtype": "bf16",
                        "block_m": cfg.block_m, "block_n": cfg.block_n,
                        "num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                fn=_recompute_flagged,
                signature={"GUARD": "*i32", **_signature("bf16"), "num_m_blocks": "i32", "num_tiles": "i32"},
                constexprs={"HEAD_DIM": head_dim, "BLOCK_D": head_dim, "HEAD_DIM_V": head_dim,
                            "BLOCK_DV": head_dim, "BLOCK_M": cfg.block_m,
                            "BLOCK_N": cfg.block_n, "IS_CAUSAL": causal, "HAS_WINDOW": False,
                            "HAS_SOFTCAP": False, "VARLEN": False, "DOT_FP32": False, "INT64_OFFSETS": False,
                            "RESET": True},
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, arches=("sm_90a",)))
    # as a launch compiles them: strides and lengths known multiples of 16 (vectorized loads,
    # cp.async staging), which the unspecialized build has none of
    return [common.census_as_launched(spec) for spec in specs]
