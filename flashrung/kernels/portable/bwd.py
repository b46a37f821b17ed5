"""Portable attention backward in plain Triton (FlashAttention-2 algorithm).

What it computes: dq, dk, dv of out = softmax(scale · q kᵀ) v given dout, the forward's out and
its natural-log LSE, for GQA/MQA and any lengths, causal (bottom-right) or not; v, out and dout
may have a head dim (Dv) other than q's and k's (D).

Structure: a preprocess computes delta = rowsum(dout ∘ out); then one program per (KV tile,
K/V head) accumulates dk and dv over every query head of its GQA group and every query tile
that sees it — no atomics, so the result is deterministic; then one program per (Q tile, query
head) accumulates dq. Probabilities are recomputed from the LSE in the log2 domain. As in the
forward, tiles fully hidden by the causal mask are skipped and only diagonal tiles are masked.

Evidence: gated against the fp64/fp32 oracle's autograd (``flashrung.gate.check_backward``) in
the CPU tests under the interpreter and on the device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashrung.evidence.census import CensusSpec
from flashrung.inputs import NO_WINDOW
from flashrung.kernels.portable import common
from flashrung.kernels.portable.common import (LOG2E, capped_scores, causal_kv_bounds, offset_index, round_to,
                                               score_mask, sequence_span, softcap_factors, window_kv_bounds,
                                               window_sides)

unsupported_reason = common.unsupported_reason
PREPROCESS_BLOCK_M = 64    # rows of dO ∘ O reduced per program; memory-bound, any size works


@triton.jit
def _bwd_preprocess(O, DO, DELTA,
                    stride_ob, stride_os, stride_oh, stride_db, stride_ds, stride_dh,
                    stride_lb, stride_lh, seqlen_q, heads_q,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    INT64_OFFSETS: tl.constexpr):
    pid_m = offset_index(tl.program_id(0), INT64_OFFSETS)
    pid_bh = offset_index(tl.program_id(1), INT64_OFFSETS)
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_ds + offs_d[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + b * stride_lb + h * stride_lh + offs_m, tl.sum(o * do, 1), mask=offs_m < seqlen_q)


@triton.jit
def _dot(a, b, DOT_FP32: tl.constexpr):
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _lse_log2(lse):
    # A row that saw no key has lse = -inf and contributes nothing: +inf makes its p exactly 0.
    return tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)


@triton.jit
def _dkdv_q_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, start_m, offs_n, offs_mb,
                 offs_d, offs_dv, stride_qs, stride_dos, seqlen_q, seqlen_k, qk_scale_log2,
                 window_left, window_right, softcap_pre, softcap_post, HEAD_DIM: tl.constexpr,
                 HEAD_DIM_V: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
                 HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, DOT_FP32: tl.constexpr):
    offs_m = start_m + offs_mb
    row_ok = offs_m < seqlen_q
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    do = tl.load(do_base + offs_m[:, None] * stride_dos + offs_dv[None, :],
                 mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    # rows past Sq: lse = +inf gives p = 0, so they add nothing
    lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
    qk_t = _dot(k, tl.trans(q), DOT_FP32)                              # (BLOCK_N, BLOCK_M)
    if HAS_SOFTCAP:
        scores_t, cap_t = capped_scores(qk_t, softcap_pre, softcap_post)
    else:
        scores_t = qk_t * qk_scale_log2
    p_t = tl.math.exp2(scores_t - _lse_log2(lse2)[None, :])
    if MASKED:
        valid = score_mask(offs_m, offs_n, seqlen_q, seqlen_k, window_left, window_right, IS_CAUSAL, HAS_WINDOW)
        p_t = tl.where(tl.trans(valid), p_t, 0.0)
    dv += _dot(round_to(p_t, do.dtype), do, DOT_FP32)
    dp_t = _dot(v, tl.trans(do), DOT_FP32)
    ds_t = p_t * (dp_t - delta[None, :])
    if HAS_SOFTCAP:
        ds_t = ds_t * (1.0 - cap_t * cap_t)          # through the cap: d(c·tanh(x/c))/dx = 1 − tanh²
    dk += _dot(round_to(ds_t, q.dtype), q, DOT_FP32)
    return dk, dv


@triton.jit
def _bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
    stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, heads_kv, group, softmax_scale, qk_scale_log2, window_left, window_right,
    softcap_pre, softcap_post, CU_SEQLENS_Q, CU_SEQLENS_K,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, DOT_FP32: tl.constexpr, INT64_OFFSETS: tl.constexpr,
):
    pid_n = offset_index(tl.program_id(0), INT64_OFFSETS)
    pid_bh = offset_index(tl.program_id(1), INT64_OFFSETS)
    b = pid_bh // heads_kv
    kv_h = pid_bh % heads_kv
    start_n = pid_n * BLOCK_N
    if VARLEN:
        # packed sequences: the grid covers the longest; this one's rows start at its cu_seqlens entries
        q_start, seqlen_q = sequence_span(CU_SEQLENS_Q, b, seqlen_q, VARLEN)
        k_start, seqlen_k = sequence_span(CU_SEQLENS_K, b, seqlen_k, VARLEN)
        if start_n >= seqlen_k:
            return
        Q += q_start * stride_qs
        DO += q_start * stride_dos
        LSE += q_start                      # lse and delta are (heads, rows): their rows are contiguous
        DELTA += q_start
        K += k_start * stride_ks
        V += k_start * stride_vs
        DK += k_start * stride_dks
        DV += k_start * stride_dvs
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_mb = offset_index(tl.arange(0, BLOCK_M), INT64_OFFSETS)     # query rows: start_m + offs_mb
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)       # V's, dO's and dV's columns: HEAD_DIM_V may differ
    k_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    v_mask = (offs_n[:, None] < seqlen_k) & (offs_dv[None, :] < HEAD_DIM_V)
    k = tl.load(K + b * stride_kb + kv_h * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :],
                mask=k_mask, other=0.0)
    v = tl.load(V + b * stride_vb + kv_h * stride_vh + offs_n[:, None] * stride_vs + offs_dv[None, :],
                mask=v_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)

    # Query tiles that see this KV tile: causal row i sees key j iff i >= j − (Sk − Sq).
    # [lo, full_start) straddles the diagonal and is masked; from full_start on every row sees
    # every key of the tile (the key tail needs no mask here: those dk/dv rows are not stored).
    # A sliding window also masks [full_end, hi), the rows past its left edge.
    if HAS_WINDOW:
        # a sliding window: row i sees key j iff j − diag − window_right <= i <= j − diag + window_left;
        # masked tiles at both ends, unmasked where every row of the tile sees every key of this one
        diag = seqlen_k - seqlen_q
        lo = (tl.maximum(start_n - diag - window_right, 0) // BLOCK_M) * BLOCK_M
        hi = tl.minimum(tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M,
                        tl.cdiv(tl.maximum(start_n + BLOCK_N - diag + window_left, 0), BLOCK_M) * BLOCK_M)
        full_start = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diag - window_right, 0), BLOCK_M) * BLOCK_M
        full_end = (tl.maximum(start_n - diag + window_left + 1, 0) // BLOCK_M) * BLOCK_M
        full_start = tl.minimum(tl.maximum(full_start, lo), hi)
        full_end = tl.minimum(tl.maximum(full_end, full_start), hi)
    elif IS_CAUSAL:
        diag = seqlen_k - seqlen_q
        lo = (tl.maximum(start_n - diag, 0) // BLOCK_M) * BLOCK_M
        last_key = start_n + BLOCK_N - 1
        full_start = tl.minimum(tl.cdiv(tl.maximum(last_key - diag, 0), BLOCK_M) * BLOCK_M,
                                tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M)
        full_start = tl.maximum(full_start, lo)
    else:
        lo = 0
        full_start = 0
    if not HAS_WINDOW:
        hi = tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M
        full_end = hi

    for qh in range(kv_h * group, kv_h * group + group):
        q_base = Q + b * stride_qb + qh * stride_qh
        do_base = DO + b * stride_dob + qh * stride_doh
        lse_base = LSE + b * stride_lb + qh * stride_lh
        delta_base = DELTA + b * stride_lb + qh * stride_lh
        for start_m in range(lo, full_start, BLOCK_M):
            dk, dv = _dkdv_q_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, start_m, offs_n,
                                  offs_mb, offs_d, offs_dv, stride_qs, stride_dos, seqlen_q, seqlen_k,
                                  qk_scale_log2, window_left, window_right, softcap_pre, softcap_post,
                                  HEAD_DIM, HEAD_DIM_V, True, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP, DOT_FP32)
        for start_m in range(full_start, full_end, BLOCK_M):
            dk, dv = _dkdv_q_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, start_m, offs_n,
                                  offs_mb, offs_d, offs_dv, stride_qs, stride_dos, seqlen_q, seqlen_k,
                                  qk_scale_log2, window_left, window_right, softcap_pre, softcap_post,
                                  HEAD_DIM, HEAD_DIM_V, False, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP, DOT_FP32)
        if HAS_WINDOW:
            for start_m in range(full_end, hi, BLOCK_M):
                dk, dv = _dkdv_q_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, start_m, offs_n,
                                      offs_mb, offs_d, offs_dv, stride_qs, stride_dos, seqlen_q, seqlen_k,
                                      qk_scale_log2, window_left, window_right, softcap_pre, softcap_post,
                                      HEAD_DIM, HEAD_DIM_V, True, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP, DOT_FP32)
    dk = dk * softmax_scale
    tl.store(DK + b * stride_dkb + kv_h * stride_dkh + offs_n[:, None] * stride_dks + offs_d[None, :],
             round_to(dk, DK.dtype.element_ty), mask=k_mask)
    tl.store(DV + b * stride_dvb + kv_h * stride_dvh + offs_n[:, None] * stride_dvs + offs_dv[None, :],
             round_to(dv, DV.dtype.element_ty), mask=v_mask)


@triton.jit
def _dq_kv_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_nb, offs_d, offs_dv,
                stride_ks, stride_vs, seqlen_q, seqlen_k, qk_scale_log2, window_left, window_right,
                softcap_pre, softcap_post, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, DOT_FP32: tl.constexpr):
    offs_n = start_n + offs_nb
    key_ok = offs_n[:, None] < seqlen_k
    k = tl.load(k_base + offs_n[:, None] * stride_ks + offs_d[None, :],
                mask=key_ok & (offs_d[None, :] < HEAD_DIM), other=0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vs + offs_dv[None, :],
                mask=key_ok & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    qk = _dot(q, tl.trans(k), DOT_FP32)
    if HAS_SOFTCAP:
        scores, cap = capped_scores(qk, softcap_pre, softcap_post)
    else:
        scores = qk * qk_scale_log2
    p = tl.math.exp2(scores - lse2[:, None])
    if MASKED:
        valid = score_mask(offs_m, offs_n, seqlen_q, seqlen_k, window_left, window_right, IS_CAUSAL, HAS_WINDOW)
        p = tl.where(valid, p, 0.0)
    dp = _dot(do, tl.trans(v), DOT_FP32)
    ds = p * (dp - delta[:, None])
    if HAS_SOFTCAP:
        ds = ds * (1.0 - cap * cap)
    dq += _dot(round_to(ds, k.dtype), k, DOT_FP32)
    return dq


@triton.jit
def _bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh,
    seqlen_q, seqlen_k, heads_q, group, softmax_scale, qk_scale_log2, window_left, window_right,
    softcap_pre, softcap_post, CU_SEQLENS_Q, CU_SEQLENS_K,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, DOT_FP32: tl.constexpr, INT64_OFFSETS: tl.constexpr,
):
    pid_m = offset_index(tl.program_id(0), INT64_OFFSETS)
    pid_bh = offset_index(tl.program_id(1), INT64_OFFSETS)
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    kv_h = h // group
    start_m = pid_m * BLOCK_M
    if VARLEN:
        q_start, seqlen_q = sequence_span(CU_SEQLENS_Q, b, seqlen_q, VARLEN)
        k_start, seqlen_k = sequence_span(CU_SEQLENS_K, b, seqlen_k, VARLEN)
        if start_m >= seqlen_q:
            return
        Q += q_start * stride_qs
        DO += q_start * stride_dos
        DQ += q_start * stride_dqs
        LSE += q_start
        DELTA += q_start
        K += k_start * stride_ks
        V += k_start * stride_vs
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_nb = offset_index(tl.arange(0, BLOCK_N), INT64_OFFSETS)     # key rows: start_n + offs_nb
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)       # V's and dO's columns: HEAD_DIM_V may differ
    row_ok = offs_m < seqlen_q
    q_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=q_mask, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dos + offs_dv[None, :],
                 mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    lse2 = _lse_log2(tl.load(LSE + b * stride_lb + h * stride_lh + offs_m, mask=row_ok, other=float("inf")))
    delta = tl.load(DELTA + b * stride_lb + h * stride_lh + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if HAS_WINDOW:
        lo, full_start, full_end, hi = window_kv_bounds(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                                        BLOCK_M, BLOCK_N)
        for start_n in range(lo, full_start, BLOCK_N):
            dq = _dq_kv_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_nb, offs_d, offs_dv,
                             stride_ks, stride_vs, seqlen_q, seqlen_k, qk_scale_log2, window_left, window_right,
                             softcap_pre, softcap_post,
                             HEAD_DIM, HEAD_DIM_V, True, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP, DOT_FP32)
    else:
        full_start = 0
        full_end, hi = causal_kv_bounds(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    for start_n in range(full_start, full_end, BLOCK_N):
        dq = _dq_kv_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_nb, offs_d, offs_dv,
                         stride_ks, stride_vs, seqlen_q, seqlen_k, qk_scale_log2, window_left, window_right,
                         softcap_pre, softcap_post,
                         HEAD_DIM, HEAD_DIM_V, False, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP, DOT_FP32)
    for start_n in range(full_end, hi, BLOCK_N):
        dq = _dq_kv_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_nb, offs_d, offs_dv,
                         stride_ks, stride_vs, seqlen_q, seqlen_k, qk_scale_log2, window_left, window_right,
                         softcap_pre, softcap_post,
                         HEAD_DIM, HEAD_DIM_V, True, IS_CAUSAL, HAS_WINDOW, HAS_SOFTCAP, DOT_FP32)
    dq = dq * softmax_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqs + offs_d[None, :],
             round_to(dq, DQ.dtype.element_ty), mask=q_mask)


def backward(do, q, k, v, out, lse, causal: bool, softmax_scale: float,
             dq: torch.Tensor | None = None, dk: torch.Tensor | None = None,
             dv: torch.Tensor | None = None, dlse: torch.Tensor | None = None,
             window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
             cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None = None, max_seqlens: tuple[int, int] | None = None):
    """do/out (B, Sq, Hq, Dv), q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv), lse (B, Hq, Sq)
    → dq, dk, dv.

    ``dlse`` (B, Hq, Sq), the gradient flowing into the LSE output, enters through delta:
    d lse_i / d s_ij = p_ij, so dS = P ∘ (dP − (rowsum(dO ∘ O) − dlse)). ``window_size``: the
    forward's sliding window, flash-attn's ``(left, right)``; ``softcap``: the forward's cap.
    ``cu_seqlens`` and ``max_seqlens``: packed sequences, as the forward takes them."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    rows_b, rows_q = B, Sq           # delta is row by row: over the tensors as they are, packed or not
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    if lse.stride(-1) != 1:
        lse = lse.contiguous()
    delta = torch.empty_strided(lse.shape, lse.stride(), dtype=torch.float32, device=q.device)
    cfg = common.backward_config(max(D, Dv), common.capability_of(q))
    dims = dict(HEAD_DIM=D, BLOCK_D=triton.next_power_of_2(D), HEAD_DIM_V=Dv, BLOCK_DV=triton.next_power_of_2(Dv))
    scale = common.check_scale(softmax_scale)
    sides = window_sides(window_size, causal, Sq, Sk)
    cap = softcap_factors(softcap, scale)
    switches = dict(IS_CAUSAL=bool(causal), HAS_WINDOW=sides is not None, HAS_SOFTCAP=cap is not None)
    dot_fp32 = common.dot_in_fp32(q.dtype)
    int64_offsets = common.needs_int64_offsets(q, k, v, out, do, lse, delta, dq, dk, dv)
    _bwd_preprocess[(triton.cdiv(rows_q, PREPROCESS_BLOCK_M), rows_b * Hq)](
        out, do, delta, out.stride(0), out.stride(1), out.stride(2),
        do.stride(0), do.stride(1), do.stride(2), lse.stride(0), lse.stride(1), rows_q, Hq,
        # delta's rows are over O's and dO's columns: the value head dim
        HEAD_DIM=Dv, BLOCK_D=dims["BLOCK_DV"], BLOCK_M=PREPROCESS_BLOCK_M, INT64_OFFSETS=int64_offsets,
        num_warps=4)
    if dlse is not None:
        delta.sub_(dlse)
    varlen = cu_seqlens is not None
    if varlen:
        B = cu_seqlens[0].numel() - 1
        Sq, Sk = max_seqlens
    # packed sequences are one batch entry of rows: the kernels place each sequence by its offset
    batch_stride = (lambda t: 0) if varlen else (lambda t: t.stride(0))
    strides = (batch_stride(q), q.stride(1), q.stride(2), batch_stride(k), k.stride(1), k.stride(2),
               batch_stride(v), v.stride(1), v.stride(2), batch_stride(do), do.stride(1), do.stride(2))
    switches.update(VARLEN=varlen, INT64_OFFSETS=int64_offsets)
    sequences = cu_seqlens or (lse, lse)      # never read without VARLEN
    _bwd_dkdv[(triton.cdiv(Sk, cfg.dkdv.block_n), B * Hkv)](
        q, k, v, do, lse, delta, dk, dv, *strides,
        batch_stride(dk), dk.stride(1), dk.stride(2), batch_stride(dv), dv.stride(1), dv.stride(2),
        batch_stride(lse), lse.stride(1), Sq, Sk, Hkv, Hq // Hkv, scale, scale * LOG2E, *(sides or (0, 0)),
        *(cap or (0.0, 0.0)), *sequences,
        **dims, BLOCK_M=cfg.dkdv.block_m, BLOCK_N=cfg.dkdv.block_n, **switches, DOT_FP32=dot_fp32,
        num_warps=cfg.dkdv.num_warps,
        num_stages=cfg.dkdv.num_stages)
    _bwd_dq[(triton.cdiv(Sq, cfg.dq.block_m), B * Hq)](
        q, k, v, do, lse, delta, dq, *strides,
        batch_stride(dq), dq.stride(1), dq.stride(2), batch_stride(lse), lse.stride(1),
        Sq, Sk, Hq, Hq // Hkv, scale, scale * LOG2E, *(sides or (0, 0)), *(cap or (0.0, 0.0)), *sequences,
        **dims, BLOCK_M=cfg.dq.block_m, BLOCK_N=cfg.dq.block_n, **switches, DOT_FP32=dot_fp32,
        num_warps=cfg.dq.num_warps,
        num_stages=cfg.dq.num_stages)
    return dq, dk, dv


def census_specs() -> list[CensusSpec]:
    specs = []
    common_ints = ("stride_qb", "stride_qs", "stride_qh", "stride_kb", "stride_ks", "stride_kh",
                   "stride_vb", "stride_vs", "stride_vh", "stride_dob", "stride_dos", "stride_doh")
    ptrs = {n: "*bf16" for n in ("Q", "K", "V", "DO")}
    sig_dkdv = {**ptrs, "LSE": "*fp32", "DELTA": "*fp32", "DK": "*bf16", "DV": "*bf16",
                **{n: "i32" for n in common_ints + ("stride_dkb", "stride_dks", "stride_dkh",
                                                     "stride_dvb", "stride_dvs", "stride_dvh",
                                                     "stride_lb", "stride_lh", "seqlen_q",
                                                     "seqlen_k", "heads_kv", "group")},
                "softmax_scale": "fp32", "qk_scale_log2": "fp32", "window_left": "i32", "window_right": "i32",
                "softcap_pre": "fp32", "softcap_post": "fp32",
                "CU_SEQLENS_Q": "*i32", "CU_SEQLENS_K": "*i32"}
    sig_dq = {**ptrs, "LSE": "*fp32", "DELTA": "*fp32", "DQ": "*bf16",
              **{n: "i32" for n in common_ints + ("stride_dqb", "stride_dqs", "stride_dqh",
                                                   "stride_lb", "stride_lh", "seqlen_q",
                                                   "seqlen_k", "heads_q", "group")},
              "softmax_scale": "fp32", "qk_scale_log2": "fp32", "window_left": "i32", "window_right": "i32",
                "softcap_pre": "fp32", "softcap_post": "fp32",
                "CU_SEQLENS_Q": "*i32", "CU_SEQLENS_K": "*i32"}
    sig_pre = {"O": "*bf16", "DO": "*bf16", "DELTA": "*fp32",
               **{n: "i32" for n in ("stride_ob", "stride_os", "stride_oh", "stride_db", "stride_ds",
                                     "stride_dh", "stride_lb", "stride_lh", "seqlen_q", "heads_q")}}
    for arch, cap in (("sm_80", (8, 0)), ("sm_90a", (9, 0)), ("sm_120", (12, 0))):
        for head_dim in (64, 128, 256):
            cfg = common.backward_config(head_dim, cap)
            for name, fn, sig, tile in (("portable.bwd_dkdv", _bwd_dkdv, sig_dkdv, cfg.dkdv),
                                        ("portable.bwd_dq", _bwd_dq, sig_dq, cfg.dq)):
                config = {"head_dim": head_dim, "causal": True, "dtype": "bf16", "block_m": tile.block_m,
                          "block_n": tile.block_n, "num_warps": tile.num_warps, "num_stages": tile.num_stages}
                constexprs = {"HEAD_DIM": head_dim, "BLOCK_D": head_dim, "HEAD_DIM_V": head_dim,
                              "BLOCK_DV": head_dim, "BLOCK_M": tile.block_m,
                              "BLOCK_N": tile.block_n, "IS_CAUSAL": True, "HAS_WINDOW": False, "HAS_SOFTCAP": False,
                              "VARLEN": False, "DOT_FP32": False, "INT64_OFFSETS": False}
                specs.append(CensusSpec(name, config, fn, sig, constexprs, tile.num_warps,
                                        tile.num_stages, arches=(arch,)))
            specs.append(CensusSpec(
                "portable.bwd_preprocess", {"head_dim": head_dim, "dtype": "bf16", "block_m": PREPROCESS_BLOCK_M},
                _bwd_preprocess, sig_pre,
                {"HEAD_DIM": head_dim, "BLOCK_D": head_dim, "BLOCK_M": PREPROCESS_BLOCK_M, "INT64_OFFSETS": False},
                4, 1, arches=(arch,)))
    # as a launch compiles them: strides and lengths known multiples of 16 (vectorized loads,
    # cp.async staging), which the unspecialized build has none of
    return [common.census_as_launched(spec) for spec in specs]
