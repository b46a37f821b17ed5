"""ladder.v0 — the naive rung: CUDA-core FMA dot products, scalar staging, precise ``expf``.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA. It is the ladder's baseline: every later rung is measured
against its parent, and the chain is re-anchored here.

What it is: 64-row CTAs (4 warps), 64-key blocks, the flash loop with the online softmax in
fp32. Q, K and V are staged global -> shared by a scalar loop (one 2-byte element per thread
per load, 64 B per warp-instruction) into row-major, unswizzled tiles. Both matmuls are CUDA-core
FMA (``gl.dot_fma``: operands widened to fp32, ``FFMA``), fed from shared memory 16 columns at a
time. P goes back through a shared buffer because the FMA operand layout of PV is not the
layout S was produced in. The exponential is libdevice ``expf`` (precise: range reduction, one
``MUFU.EX2`` and eight FMA/ALU instructions per call), not ``ex2.approx``; Triton's own ``exp``
is the approximate one (``FMUL`` by log2(e) + ``MUFU.EX2``), so the rung calls libdevice.

Differences from the seed's v0, stated because they move its numbers: the seed materialised the
score matrix in global memory; here the scores stay on chip (an online-softmax flash loop from
the start), so this v0 is not limited by the O(N^2) traffic and runs the long-context config.
Causal block skipping (the loop stops at the diagonal) is part of the common loop here; the seed
added it in v2.

Prediction (seed 000: 3.23% of speed-of-light, latency-bound, tensor pipe 0.0%): a few percent
of the H200's FMA/tensor ceiling; no tensor-pipe activity at all.

Evidence (census, no GPU; ``tests/test_ladder.py``): no ``HMMA``/``HGMMA`` in the SASS;
``FFMA`` dominates: 64*D per loop body from the two FMA matmuls (per thread 64*64*D/128 for
QK^T plus 64*D*64/128 for PV) on top of the softmax's; ``MUFU.EX2`` = 36 per body (32 scores
and 4 row rescales per thread: the FMA layout gives each thread 4 rows). Shared memory: three
tiles plus the 64x64 P buffer, 32 KiB (D=64) / 56 KiB (D=128).
H200 (ladder --quick, CUDA events): 12.0 TFLOP/s at config A (B2 H16 S2048 d128 fp16); not timed at B.
Profile: not measured. Walkthrough: docs/ladder.md.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import (
    finalize, fma_layout, kv_loop_end, mask_scores, row_major_layout, softmax_update, stage_kv_scalar,
    stage_tile_scalar, store_tile, tile_start,
)

NAME = "ladder.v0"
PARENT = None
LEVER = "baseline: CUDA-core FMA, scalar staging, precise expf"
HEAD_DIMS = (64, 128)
CONFIG = common.TileConfig(block_m=64, block_n=64, num_warps=4)
FMA_K_STEP = gl.constexpr(16)  # columns per FMA step: the smallest K gl.dot_fma accepts


@gluon.jit
def attention_fwd_v0(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
):
    # S and O accumulators share one row distribution, so row statistics move between them free.
    S_L: gl.constexpr = fma_layout(BLOCK_N, gl.num_warps())
    O_L: gl.constexpr = fma_layout(HEAD_DIM, gl.num_warps())
    S_A: gl.constexpr = gl.DotOperandLayout(0, S_L, 0)
    S_B: gl.constexpr = gl.DotOperandLayout(1, S_L, 0)
    O_A: gl.constexpr = gl.DotOperandLayout(0, O_L, 0)
    O_B: gl.constexpr = gl.DotOperandLayout(1, O_L, 0)
    ROW: gl.constexpr = gl.SliceLayout(1, S_L)
    COL: gl.constexpr = gl.SliceLayout(0, S_L)
    O_ROW: gl.constexpr = gl.SliceLayout(1, O_L)
    SMEM: gl.constexpr = row_major_layout()
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    start_m, q_base, k_base, v_base, o_base, lse_base = tile_start(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        BLOCK_M, HEAD_DIM)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], SMEM)
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], SMEM)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], SMEM)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], SMEM)
    stage_tile_scalar(q_smem, q_base, seqlen_q - start_m, stride_qs, BLOCK_M, HEAD_DIM)
    gl.thread_barrier()
    k_t = k_smem.permute([1, 0])

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW)
    l_i = gl.zeros([BLOCK_M], gl.float32, ROW)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, O_L)
    offs_m = start_m + gl.arange(0, BLOCK_M, ROW)
    causal_shift = seqlen_k - seqlen_q
    hi = kv_loop_end(start_m, seqlen_q, seqlen_k, BLOCK_M, IS_CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        stage_kv_scalar(k_smem, v_smem, k_base, v_base, start_n, hi - start_n, stride_ks, stride_vs,
                        BLOCK_N, HEAD_DIM)
        gl.thread_barrier()
        s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)
        for i in gl.static_range(HEAD_DIM // FMA_K_STEP):
            a = q_smem.slice(i * FMA_K_STEP, FMA_K_STEP, dim=1).load(S_A).to(gl.float32)
            bt = k_t.slice(i * FMA_K_STEP, FMA_K_STEP, dim=0).load(S_B).to(gl.float32)
            s = gl.dot_fma(a, bt, s)
        s = mask_scores(s, offs_m, start_n + gl.arange(0, BLOCK_N, COL), seqlen_k, causal_shift, IS_CAUSAL)
        p, alpha, m_i, l_i = softmax_update(s, m_i, l_i, qk_scale, False)
        acc = acc * gl.convert_layout(alpha, O_ROW)[:, None]
        p_smem.store(p.to(dtype))
        gl.thread_barrier()
        for i in gl.static_range(BLOCK_N // FMA_K_STEP):
            a = p_smem.slice(i * FMA_K_STEP, FMA_K_STEP, dim=1).load(O_A).to(gl.float32)
            bv = v_smem.slice(i * FMA_K_STEP, FMA_K_STEP, dim=0).load(O_B).to(gl.float32)
            acc = gl.dot_fma(a, bv, acc)
        gl.thread_barrier()  # every warp is done reading K/V/P before the next block overwrites them

    out, lse = finalize(acc, gl.convert_layout(m_i, O_ROW), gl.convert_layout(l_i, O_ROW), False)
    store_tile(o_base, lse_base, out, lse, seqlen_q - start_m, stride_os, BLOCK_M, HEAD_DIM)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    return common.launch(attention_fwd_v0, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=False,
                         head_dims=HEAD_DIMS, out=out, lse=lse)


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v0, head_dim=d, causal=c, cfg=CONFIG)
            for d in HEAD_DIMS for c in (False, True)]
