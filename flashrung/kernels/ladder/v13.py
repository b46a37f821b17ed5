"""ladder.v13 — FA2's d128 tile on v12's ring: two m16 row slabs per warp, fed by the K/V ring.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v12): v8's tile — each of the 4 warps owns 32 query rows in two m16 slabs
(128×32 instead of 64×64), Q left in shared memory and read 64 head dims at a time with the
matching columns of K — on v12's double-buffered K/V ring. It is the lever v8 applied to v4,
applied to v12 instead.

Why this lever: v12's profile at config B (docs/ladder.md) has the copies hidden (long scoreboard
15.6% → 2.2%) and the tensor pipe still at 48.8%, its stalls on the short scoreboard (ldmatrix and
MUFU results) and the barrier: each warp runs one dependent chain (ldmatrix → HMMA → softmax →
HMMA) and two warps per scheduler do not cover it. Two slabs per warp give each warp two
independent MMA chains over every K/V fragment it loads (0.375 fragment loads per MMA against
0.56, census); v8 measured that tile on v4 at 0.947× at config B, its loop then waiting on each
block's copy (the latency the ring now hides) and its 128-row causal tail twice v4's. FA2, on the
same instructions, runs this tile at 77–79% of the mma.sync ceiling on the H200.
Census (sm_90a, d128, compiled with no GPU): causal 255 registers, **0 spill**, 64 KiB of shared
memory, HMMA 128 and LDSM 48 per loop body (v8's), LDGSTS 32 (v8: 16 — the prefetch); non-causal
spills 160 B, as v8 does. Prediction: at config B between v8's loss and a gain over v12 — the
ring removes what v8 lost to latency, the tail remains; a loss at config A (non-causal, the
spill and the 32-key block's doubled O rescale per key, as v8's 0.868×). Measured on the H200
(paired, `flashrung compare` over v12, docs/ladder.md): config B 1.0041 / 0.9974, NULL; config A
0.9145 / 0.9146, REVERT — the ring took back v8's loss and no more. Kept as a measured rung.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import attention_mma_cp_async_ring
from flashrung.kernels.ladder.v3 import PipelineConfig
from flashrung.kernels.ladder.v8 import Q_CHUNK

NAME = "ladder.v13"
PARENT = "ladder.v12"
LEVER = "FA2's d128 tile on the ring: two m16 slabs per warp (128x32, 4 warps), Q read from shared memory in chunks"
HEAD_DIMS = (64, 128)
CONFIG = PipelineConfig(block_m=128, block_n=32, num_warps=4, slabs_per_warp=2, kv_stages=2)
EXP2 = gl.constexpr(True)


@gluon.jit
def attention_fwd_v13(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr, Q_CHUNK: gl.constexpr,
):
    # The lever: the 128x32 two-slab tile (CONFIG) and Q_CHUNK (v12: 64x64, Q in registers); the
    # ring, exp2 and order are v12's.
    attention_mma_cp_async_ring(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, EXP2=EXP2, Q_CHUNK=Q_CHUNK)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    return common.launch(attention_fwd_v13, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=True,
                         head_dims=HEAD_DIMS, out=out, lse=lse, constexprs={"Q_CHUNK": Q_CHUNK})


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v13, head_dim=d, causal=c, cfg=CONFIG,
                               extra={"Q_CHUNK": Q_CHUNK},
                               config_extra={"kv_stages": CONFIG.kv_stages, "q_chunk": Q_CHUNK})
            for d in HEAD_DIMS for c in (False, True)]
