"""ladder.v18 — v16's prefetches of whole blocks issued without their row predicate.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v16): every trip of v16 prefetches block j+2 into the ring with each row's
cp.async predicated on ``row < hi - start`` (the zero-fill that keeps a block running past the
tile's keys finite), though only the last two trips of a tile can copy such a block. Here the
unmasked loop ends where the prefetched block stops lying whole below ``hi``
(:func:`whole_copy_trips`) and issues its copies with no predicate (``common.row_keep``); the
trips after it run v16's masked trip (an interior trip among them — at most one a tile — masks
nothing). The cut is a loop bound, so no trip tests it, and the loop keeps v16's two trip copies.

Why this lever: v16's unmasked trip is where a tile spends its time, and the predicate is
per-trip integer work on the same issue slots as the softmax (the comparison of each copied row
with the remaining count, the select of each copy's source size). Census (sm_90a): the unmasked
trip d128 causal 560 -> 538 instructions, non-causal 566 -> 537, d64 395 -> 389, no ISETP in it,
no spill.
Prediction: v16's deferred sum bought 3.8% for 3 instructions where they sat on the trip's
chain; these are not on it (the copies have no consumer in the trip) — +0.5-2% at config B and
A, nothing at d64.
Measured (H200, docs/ladder.md, paired `flashrung compare` over v16, two fresh processes): config A
1.0154 / 1.0151 KEEP; config B 0.9811 / 0.9825 and d64 at config B's shape 0.9644 / 0.9657
REVERT. Per-instruction stall samples at B put the loss on the copies' address adds, which wait
on the long scoreboard for the previous copies once no predicate work sits between them.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import v14, v16

NAME = "ladder.v18"
PARENT = "ladder.v16"
LEVER = "the prefetches of whole blocks issued without their row predicate"
HEAD_DIMS = v14.HEAD_DIMS
CONFIG = v14.CONFIG   # v16's tile and ring; the row sum deferred (v16's pick, every head dim and mask)
ROW_SUM = v16.SUM_DEFERRED


@gluon.jit
def whole_copy_trips(hi, split, BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr):
    """The end of the unmasked trips whose copies are whole. Trip j (``start_n = j·BLOCK_N``)
    copies block j+KV_STAGES-1, rows ``start_n + (KV_STAGES-1)·BLOCK_N`` onwards; that block lies
    below ``hi`` when ``start_n + KV_STAGES·BLOCK_N <= hi``, i.e. for the multiples of BLOCK_N
    below ``whole`` (``hi - (KV_STAGES-1)·BLOCK_N`` rounded down to one). Returns
    ``min(max(whole, 0), split)`` — a multiple of BLOCK_N or ``split`` — written as a select: as
    ``gl.minimum`` LLVM rewrote the ring's slot index into three counters and hoisted the 16
    swizzled copy offsets out of the loop, and the unmasked trip compiled to 636 instructions
    instead of 538 (census, sm_90a, d128 causal)."""
    whole = ((hi - (KV_STAGES - 1) * BLOCK_N) // BLOCK_N) * BLOCK_N
    return gl.where(whole < split, gl.maximum(whole, 0), split)


@gluon.jit
def attention_fwd_v18(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr, QK_AHEAD: gl.constexpr, KV_COPY: gl.constexpr, ROW_SUM: gl.constexpr,
):
    (q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi, m_i, acc, offs_m, l_i, causal_shift, s, _,
     split, last_trip) = v16.ring_prologue(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, ROW_SUM)
    # the copies stop being whole two blocks before hi: the unmasked loop ends there too, and an
    # interior trip past it runs masked (a no-op mask, at most one trip a tile: two copies of the
    # trip, as v16 has, rather than three)
    whole = whole_copy_trips(hi, split, BLOCK_N, KV_STAGES)
    for start_n in range(0, whole, BLOCK_N):
        s, m_i, l_i, acc = v16.ahead_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base,
                                          stride_ks, stride_vs, offs_m, seqlen_k, causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL,
                                          BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, False, ROW_SUM, True)
    for start_n in range(whole, last_trip, BLOCK_N):
        s, m_i, l_i, acc = v16.ahead_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base,
                                          stride_ks, stride_vs, offs_m, seqlen_k, causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL,
                                          BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, True, ROW_SUM)
    v16.ring_epilogue(s, None, m_i, l_i, acc, qk_scale, v_smem, hi, o_base, lse_base, start_m, seqlen_q,
                      stride_os, HEAD_DIM, BLOCK_M, BLOCK_N, KV_STAGES, ROW_SUM)


def unsupported_reason(problem) -> str | None:
    return v14.unsupported_reason(problem)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    return v14.launch_on_ring(attention_fwd_v18, q, k, v, causal, softmax_scale, config=config, out=out, lse=lse,
                              constexprs={"ROW_SUM": ROW_SUM}, needs_ahead=NAME)


def census_specs():
    return v14.ring_census_specs(NAME, attention_fwd_v18, {"ROW_SUM": ROW_SUM})
