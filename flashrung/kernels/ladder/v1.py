"""ladder.v1 — tensor cores: both matmuls on mma.sync, operands fed by ldmatrix.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v0): QK^T and PV run as ``mma_v2`` (``mma.sync.aligned.m16n8k16``, fp32
accumulate) instead of CUDA-core FMA; the operands come from shared memory through
``smem.load(DotOperandLayout)``, which the compiler lowers to ``ldmatrix``. Grid (64-row CTAs,
query tile on the fastest launch axis), 64x64 tiles, the scalar 2-byte staging loop, the
row-major (unswizzled) shared tiles and the precise libdevice ``expf`` are v0's. One thing v0
needed disappears: the P staging buffer — the mma accumulator fragment of S is, register for
register, the A fragment PV needs (seed 000, 2.3, mechanism 1), so P never leaves registers.

Prediction (seed 000 on sm_120: 6.9x, 6.01 -> 41.60 TFLOP/s at N=512): a several-fold jump, the
tensor pipe going from idle to active; on the H200 the mma.sync path is the legacy one (wgmma is
Hopper's native instruction), so the jump is bounded by the mma.sync ceiling, not the GEMM one.

Evidence (census, no GPU; ``tests/test_ladder.py``): ``HMMA.16816.F32`` appears, exactly
``head_dim`` of them per loop body (64x64 tile, 4 warps: D/2 for QK^T plus D/2 for PV), fed by
``LDSM``; shared memory 3 tiles = 24 KiB (D=64) / 48 KiB (D=128). The ldmatrix bank conflicts of
the row-major tiles (the reason for v2) are not visible statically: they need ncu
(``smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm``).
H200 (ladder --quick, CUDA events; margin = in-process paired vs parent): 46.4 TFLOP/s at A,
3.716x vs v0; 48.0 at B (B1 H16 S32768 d128 bf16 causal). Profile: not measured. docs/ladder.md.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import (
    allocate_and_stage_q, finalize, flash_state, kv_loop_end, mma_block, mma_layout, row_major_layout,
    store_tile, tile_start,
)

NAME = "ladder.v1"
PARENT = "ladder.v0"
LEVER = "mma.sync (mma_v2) with ldmatrix-fed operands instead of CUDA-core FMA"
HEAD_DIMS = (64, 128)
CONFIG = common.TileConfig(block_m=64, block_n=64, num_warps=4)


@gluon.jit
def attention_mma_scalar_staged(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
    qk_scale, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, SMEM: gl.constexpr,
):
    """v1's kernel with the shared-tile layout as a parameter (v2's lever is that layout)."""
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    start_m, q_base, k_base, v_base, o_base, lse_base = tile_start(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        BLOCK_M, HEAD_DIM)
    # Scalar staging (v0's) into SMEM; mma_block runs both matmuls on mma_v2, and P stays in
    # registers: S's accumulator fragment is PV's A fragment.
    q, k_smem, v_smem = allocate_and_stage_q(q_base, seqlen_q - start_m, stride_qs, dtype, BLOCK_M, BLOCK_N,
                                             HEAD_DIM, SMEM, False)
    m_i, l_i, acc, offs_m = flash_state(start_m, BLOCK_M, HEAD_DIM, gl.SliceLayout(1, MMA), MMA)
    causal_shift = seqlen_k - seqlen_q
    hi = kv_loop_end(start_m, seqlen_q, seqlen_k, BLOCK_M, IS_CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        acc, m_i, l_i = mma_block(q, k_smem, v_smem, acc, m_i, l_i, start_n, hi, offs_m, seqlen_k, causal_shift,
                                  k_base, v_base, stride_ks, stride_vs, qk_scale,
                                  BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL, False, False)
    out, lse = finalize(acc, m_i, l_i, False)
    store_tile(o_base, lse_base, out, lse, seqlen_q - start_m, stride_os, BLOCK_M, HEAD_DIM)


@gluon.jit
def attention_fwd_v1(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
):
    attention_mma_scalar_staged(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, SMEM=row_major_layout())


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    return common.launch(attention_fwd_v1, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=False,
                         head_dims=HEAD_DIMS, out=out, lse=lse)


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v1, head_dim=d, causal=c, cfg=CONFIG)
            for d in HEAD_DIMS for c in (False, True)]
