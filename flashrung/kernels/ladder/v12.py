"""ladder.v12 — double-buffered K/V on top of v4: block j+1 in flight while block j is consumed.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v4): a ring of two K/V slots in shared memory (``cp.async``, one commit per
trip, ``wait_group(1)``, a final drain) instead of v4's single buffer, which copies each key
block, waits for it with ``wait_group(0)`` and only then computes on it. It is v3's measured
double-buffered arm (``common.attention_mma_cp_async_ring``) with v4's exponential (``exp2``,
log2(e) in the host-side scale); tile, grid order and warps are v4's.

Why this lever: the profile of v4 at config B (docs/ladder.md, `ladder-profile-config-b.json.gz`)
puts it at SM active 97.7%, L2 hit rate 98.9%, the tensor pipe busy 47.6% of active cycles and
long-scoreboard stalls at 15.5% with 8 warps per SM: the copy of the next block is waited for on
the critical path. Buying more warps with a register cap (v11) hid that latency but spilled onto
the MMA chain (0.862× v4). The ring hides it inside the same 8 warps: a second K/V slot costs
16 KiB of shared memory per CTA at d128 (48 → 80 KiB, 2 CTAs per SM still fit the H200's
228 KiB), no registers beyond the slot index.
Measured before (v3's arm over v3, do_bench, unpaired): +8.5% at config A, −2.1% at config B.
Prediction: a gain at A of that size; at B ±3%, decided by whether the long-scoreboard share
(15.5%) falls. Census: the block's MMA, fragment loads and exponentials equal v4's; the copies
add the prefetch's LDGSTS.
Measured (H200, docs/ladder.md): paired over v4 (`flashrung compare`, two fresh processes) 1.0989 /
1.1069 at config A and 1.0239 / 1.0243 at config B — KEEP, both as predicted; 306.6 TFLOP/s at
config B, 73.5% of the mma.sync ceiling of the same run (v4 70.1%). Profile at B: long-scoreboard
stalls 15.6% → 2.2%, the tensor pipe 47.6% → 48.8% (the stalls moved to the short scoreboard).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import attention_mma_cp_async_ring
from flashrung.kernels.ladder.v3 import DOUBLE_BUFFER

NAME = "ladder.v12"
PARENT = "ladder.v4"
LEVER = "double-buffered K/V ring (two cp.async slots): block j+1 in flight while block j is consumed"
HEAD_DIMS = (64, 128)
CONFIG = DOUBLE_BUFFER
EXP2 = gl.constexpr(True)


@gluon.jit
def attention_fwd_v12(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr,
):
    # The lever: the K/V ring (v4: single buffer); exp2, tiles and order are v4's.
    attention_mma_cp_async_ring(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, EXP2=EXP2)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    return common.launch(attention_fwd_v12, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=True,
                         head_dims=HEAD_DIMS, out=out, lse=lse)


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v12, head_dim=d, causal=c, cfg=CONFIG,
                               config_extra={"kv_stages": CONFIG.kv_stages})
            for d in HEAD_DIMS for c in (False, True)]
