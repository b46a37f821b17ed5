"""ladder.v17 — the next block's row max formed under this block's softmax (max one block ahead).

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v16): v14 computes S(j+1) in trip j, but its row max — 32 FMNMX per thread and
the quad's two shuffle rounds, the head of every exponential of the block — is still taken at the
start of trip j+1, where nothing else of that trip can start before it. Here trip j takes the max
of S(j+1) as soon as its scores are in, beside softmax(j) and PV(j), and hands it to trip j+1 with
the scores: the trip's exponentials start on a known max. Two registers more per thread.
Prediction: +1-3% at config B.
Measured (H200, docs/ladder.md, paired over v16): config B 0.9759 / 0.9766, config A 0.9355 /
0.9353 — REVERT; d64 at config B's shape 1.0222 / 1.0215. Census: no FMNMX chain ahead of the
trip's first MUFU.EX2 (>= 32 -> <= 4), but the max now waits at the end of the trip for QK(j+1)'s
HMMA results (a reading of the SASS order, not profiled). Kept as measured; v16 is the top rung.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import v14, v16
from flashrung.kernels.ladder.common import mma_scores
from flashrung.kernels.ladder.v16 import softmax_pv

NAME = "ladder.v17"
PARENT = "ladder.v16"
LEVER = "the next block's row max formed under this block's softmax (max one block ahead)"
HEAD_DIMS = v14.HEAD_DIMS
CONFIG = v14.CONFIG   # v16's tile and ring; the row sum deferred (v16's pick, every head dim and mask)
ROW_SUM = v16.SUM_DEFERRED


@gluon.jit
def ahead_trip(q, k_smem, v_smem, s, s_max, m_i, l_i, acc, start_n, hi, k_base, v_base, stride_ks, stride_vs, offs_m,
               seqlen_k, causal_shift, qk_scale, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr, KV_COPY: gl.constexpr,
               MASKED: gl.constexpr, ROW_SUM: gl.constexpr):
    """v16's trip j, with S(j+1)'s row max formed here, beside softmax(j), instead of at the head
    of trip j+1. Returns (s_next, its row max, m_i, l_i, acc)."""
    j = start_n // BLOCK_N
    v14.refill_and_wait(k_smem, v_smem, start_n, hi, k_base, v_base, stride_ks, stride_vs, BLOCK_N, HEAD_DIM,
                        KV_STAGES, KV_COPY, KV_STAGES - 2)  # block j+1 has landed
    s_next = mma_scores(q, k_smem.index((j + 1) % KV_STAGES), start_n + BLOCK_N, offs_m, seqlen_k,
                        causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, MASKED)
    s_next_max = gl.max(s_next, 1)
    acc, m_i, l_i = softmax_pv(s, s_max, m_i, l_i, acc, qk_scale, v_smem.index(j % KV_STAGES), ROW_SUM)
    gl.thread_barrier()  # every warp is done reading slot j before trip j+1's copy overwrites it
    return s_next, s_next_max, m_i, l_i, acc


@gluon.jit
def attention_fwd_v17(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr, QK_AHEAD: gl.constexpr, KV_COPY: gl.constexpr, ROW_SUM: gl.constexpr,
):
    (q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi, m_i, acc, offs_m, l_i, causal_shift, s, s_max,
     split, last_trip) = v16.ring_prologue(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, ROW_SUM)
    for start_n in range(0, split, BLOCK_N):
        s, s_max, m_i, l_i, acc = ahead_trip(q, k_smem, v_smem, s, s_max, m_i, l_i, acc, start_n, hi, k_base,
                                             v_base, stride_ks, stride_vs, offs_m, seqlen_k, causal_shift, qk_scale,
                                             HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, False,
                                             ROW_SUM)
    for start_n in range(split, last_trip, BLOCK_N):
        s, s_max, m_i, l_i, acc = ahead_trip(q, k_smem, v_smem, s, s_max, m_i, l_i, acc, start_n, hi, k_base,
                                             v_base, stride_ks, stride_vs, offs_m, seqlen_k, causal_shift, qk_scale,
                                             HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, True,
                                             ROW_SUM)
    v16.ring_epilogue(s, s_max, m_i, l_i, acc, qk_scale, v_smem, hi, o_base, lse_base, start_m, seqlen_q, stride_os,
                      HEAD_DIM, BLOCK_M, BLOCK_N, KV_STAGES, ROW_SUM)


def unsupported_reason(problem) -> str | None:
    return v14.unsupported_reason(problem)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    return v14.launch_on_ring(attention_fwd_v17, q, k, v, causal, softmax_scale, config=config, out=out, lse=lse,
                              constexprs={"ROW_SUM": ROW_SUM}, needs_ahead=NAME)


def census_specs():
    return v14.ring_census_specs(NAME, attention_fwd_v17, {"ROW_SUM": ROW_SUM})
