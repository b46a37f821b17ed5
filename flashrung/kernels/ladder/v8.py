"""ladder.v8 — FA2's d128 tile: two m16 row slabs per warp, Q read from shared memory per key block.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v4): each of the 4 warps owns 32 query rows — two m16 slabs, a 128×32 tile
instead of 64×64 — so every K and V fragment a warp loads with ``ldmatrix`` feeds twice the
MMAs. The profile of v1–v5 puts the bound on shared-memory operand traffic (ldmatrix
wavefronts, MIO throttle) at ≤ 12.5% occupancy, and the mma.sync path that reaches 78–79% of the
ceiling on the H200 (FA2, CUDA C++) runs this tile. The O accumulator of 32 rows × 128 fp32 takes
128 registers per thread, so Q cannot stay in registers as in v1–v5: it stays in shared memory
and the score MMA reads it 64 head dims at a time with the matching columns of K
(``common.mma_scores`` with ``Q_CHUNK``), so only one chunk of Q's fragments is ever live.

Evidence (census, sm_90a, d128 causal fp16, compiled with no GPU): 255 registers, **0 spill**,
128 HMMA against 48 LDSM per loop body — 0.375 fragment loads per MMA against v4's 72 per 128
(0.56), the −33% the tile predicts; 128×64 with the same Q reads spills 288 B and the same 128×32
tile with all of Q's fragments loaded at once spills 16 B (``tests/test_ladder.py``). Prediction:
fewer ldmatrix wavefronts per MMA, a higher tensor-pipe share at config B. Measured on the H200
(paired against v4): config B 0.947×, config A 0.868× — lost. ldmatrix fell by the predicted
quarter and its stalls with it, but the 128-row tile doubles the causal tail and the 32-key block
doubles the O rescale per key in a latency-bound loop; non-causal d128 spills 160 B. Kept as the
measured record of that lever. docs/ladder.md.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import attention_mma_cp_async

NAME = "ladder.v8"
PARENT = "ladder.v4"
LEVER = "FA2's d128 tile: two m16 slabs per warp (128x32, 4 warps), Q read from shared memory in 64-dim chunks"
HEAD_DIMS = (64, 128)
CONFIG = common.TileConfig(block_m=128, block_n=32, num_warps=4, slabs_per_warp=2)
# head dims of Q (and K) per score MMA: one XOR-swizzle group of eight 16-byte chunks, so a chunk
# is a plain sub-view of the swizzled tile
Q_CHUNK = 64
EXP2 = gl.constexpr(True)


@gluon.jit
def attention_fwd_v8(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    Q_CHUNK: gl.constexpr,
):
    # The lever: the 128x32 two-slab tile (CONFIG) and Q_CHUNK (v4: Q in registers); the rest is v4's.
    attention_mma_cp_async(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, EXP2=EXP2, HEAVIEST_FIRST=False, Q_CHUNK=Q_CHUNK)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    return common.launch(attention_fwd_v8, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=True,
                         head_dims=HEAD_DIMS, out=out, lse=lse, constexprs={"Q_CHUNK": Q_CHUNK})


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v8, head_dim=d, causal=c, cfg=CONFIG,
                               extra={"Q_CHUNK": Q_CHUNK}, config_extra={"q_chunk": Q_CHUNK})
            for d in HEAD_DIMS for c in (False, True)]
