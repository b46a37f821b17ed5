"""ladder.v15 — v14's key loop split where the mask begins: interior blocks run an unmasked QK.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v14): every trip of v14's loop masks the next block's scores — a key-length
compare and, causal, a diagonal compare and a select per score — though only the blocks at the
diagonal and the key tail can hold a masked score. Here the trips whose next block lies wholly
inside ``seqlen_k`` and left of the tile's first diagonal (``common.kv_interior_end``) run a copy
of the trip with no mask; the trips after them run the masked copy. The seed's keeps 3 and 4
(mask specialization, the causal loop split; ladder.v7) on v14's pipelined loop. One trip body
(``ahead_trip``) serves both loops, its ``MASKED`` a constexpr.

Why this lever: v14's causal loop is 706 SASS instructions per trip against 648 non-causal (census,
sm_90a, d128), and the loop is issue- and latency-bound (tensor pipe 51%, short scoreboard 19%,
profile at config B), so instructions off the critical path of a trip are time off the trip. At
config B (64-row tiles, S = 32768) all but the last block of each tile are interior; at config A
(non-causal, S = 2048) every block is.
Prediction: +2-5% at config B, +1-4% at config A (the key-length mask alone is smaller than the
causal one).
Measured (H200, docs/ladder.md, paired `flashrung compare` over v14, two fresh processes): config B
1.0280 / 1.0301, config A 1.0417 / 1.0429, d64 at config B's shape 1.1513 / 1.1471 — KEEP; census:
the unmasked d128 causal trip 706 -> 563 instructions.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from flashrung.kernels.ladder import common, v14
from flashrung.kernels.ladder.common import finalize, flash_state, mma_layout, mma_pv, mma_scores, softmax_update, store_tile

NAME = "ladder.v15"
PARENT = "ladder.v14"
LEVER = "the key loop split where the mask begins: interior blocks run QK with no mask"
HEAD_DIMS = v14.HEAD_DIMS
EXP2 = gl.constexpr(True)
CONFIG = v14.CONFIG


@gluon.jit
def split_trips(start_m, seqlen_q, seqlen_k, hi, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(split, last_trip): trip j (``start_n = j·BLOCK_N``) computes S(j+1), so trips below ``split``
    are those whose next block ends at or before the interior end (``common.kv_interior_end``) —
    no mask; ``last_trip`` ends the loop, the last block's softmax and PV follow it."""
    last_trip = hi - BLOCK_N
    split = gl.minimum(gl.maximum(common.kv_interior_end(start_m, seqlen_q, seqlen_k, BLOCK_N, IS_CAUSAL) - BLOCK_N,
                                  0), gl.maximum(last_trip, 0))
    return split, last_trip


@gluon.jit
def ahead_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base, stride_ks, stride_vs, offs_m,
               seqlen_k, causal_shift, qk_scale, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr, KV_COPY: gl.constexpr,
               MASKED: gl.constexpr):
    """v14's trip j: block j+KV_STAGES-1's copy, the wait for block j+1, S(j+1) (masked only if
    ``MASKED``), then softmax(j) and PV(j). Returns (s_next, m_i, l_i, acc)."""
    j = start_n // BLOCK_N
    v14.refill_and_wait(k_smem, v_smem, start_n, hi, k_base, v_base, stride_ks, stride_vs, BLOCK_N, HEAD_DIM,
                        KV_STAGES, KV_COPY, KV_STAGES - 2)  # block j+1 has landed
    s_next = mma_scores(q, k_smem.index((j + 1) % KV_STAGES), start_n + BLOCK_N, offs_m, seqlen_k,
                        causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, MASKED)
    p, alpha, m_i, l_i = softmax_update(s, m_i, l_i, qk_scale, EXP2)
    acc = mma_pv(acc * alpha[:, None], p, v_smem.index(j % KV_STAGES))
    gl.thread_barrier()  # every warp is done reading slot j before trip j+1's copy overwrites it
    return s_next, m_i, l_i, acc


@gluon.jit
def attention_fwd_v15(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr, QK_AHEAD: gl.constexpr, KV_COPY: gl.constexpr,
):
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)

    q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi = v14.ring_start(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        DOT_A, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY)

    m_i, l_i, acc, offs_m = flash_state(start_m, BLOCK_M, HEAD_DIM, ROW, MMA)
    causal_shift = seqlen_k - seqlen_q
    s = v14.first_scores(q, k_smem, offs_m, seqlen_k, causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL)
    split, last_trip = split_trips(start_m, seqlen_q, seqlen_k, hi, BLOCK_N, IS_CAUSAL)
    for start_n in range(0, split, BLOCK_N):
        s, m_i, l_i, acc = ahead_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base, stride_ks,
                                      stride_vs, offs_m, seqlen_k, causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL,
                                      BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, False)
    for start_n in range(split, last_trip, BLOCK_N):
        s, m_i, l_i, acc = ahead_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base, stride_ks,
                                      stride_vs, offs_m, seqlen_k, causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL,
                                      BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, True)
    last = gl.maximum(gl.cdiv(hi, BLOCK_N), 1) - 1
    p, alpha, m_i, l_i = softmax_update(s, m_i, l_i, qk_scale, EXP2)
    acc = mma_pv(acc * alpha[:, None], p, v_smem.index(last % KV_STAGES))
    async_copy.wait_group(0)  # drain the trailing zero-row prefetches before the CTA exits

    out, lse = finalize(acc, m_i, l_i, EXP2)
    store_tile(o_base, lse_base, out, lse, seqlen_q - start_m, stride_os, BLOCK_M, HEAD_DIM)


def unsupported_reason(problem) -> str | None:
    return v14.unsupported_reason(problem)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    return v14.launch_on_ring(attention_fwd_v15, q, k, v, causal, softmax_scale, config=config, out=out, lse=lse,
                              needs_ahead=NAME)


def census_specs():
    return v14.ring_census_specs(NAME, attention_fwd_v15)
