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
(``smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm``). H200 timing and profile:
docs/ladder.md (to be measured).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import (
    finalize, kv_loop_end, mask_scores, mma_layout, program_tile, row_major_layout, softmax_update,
    stage_kv_scalar, stage_tile_scalar, store_tile, tile_bases,
)

NAME = "ladder.v1"
PARENT = "ladder.v0"
LEVER = "mma.sync (mma_v2) with ldmatrix-fed operands instead of CUDA-core FMA"
HEAD_DIMS = (64, 128)
CONFIG = common.TileConfig(block_m=64, block_n=64, num_warps=4)


@gluon.jit
def attention_fwd_v1(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
):
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    SMEM: gl.constexpr = row_major_layout()
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    b, h, start_m = program_tile(heads_q, BLOCK_M)
    q_base, k_base, v_base, o_base, lse_base = tile_bases(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, b, h, start_m, stride_qb, stride_qs, stride_qh,
        stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_os, stride_oh,
        seqlen_q, heads_q, group)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], SMEM)
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], SMEM)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], SMEM)
    stage_tile_scalar(q_smem, q_base, seqlen_q - start_m, stride_qs, BLOCK_M, HEAD_DIM)
    gl.thread_barrier()
    q = q_smem.load(DOT_A)  # ldmatrix, once per CTA

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW)
    l_i = gl.zeros([BLOCK_M], gl.float32, ROW)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, MMA)
    offs_m = start_m + gl.arange(0, BLOCK_M, ROW)
    causal_shift = seqlen_k - seqlen_q
    hi = kv_loop_end(start_m, seqlen_q, seqlen_k, BLOCK_M, IS_CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        stage_kv_scalar(k_smem, v_smem, k_base, v_base, start_n, hi - start_n, stride_ks, stride_vs,
                        BLOCK_N, HEAD_DIM)
        gl.thread_barrier()
        s = mma_v2(q, k_smem.permute([1, 0]).load(DOT_B), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA))
        s = mask_scores(s, offs_m, start_n + gl.arange(0, BLOCK_N, COL), seqlen_k, causal_shift, IS_CAUSAL)
        p, alpha, m_i, l_i = softmax_update(s, m_i, l_i, qk_scale, False)
        acc = acc * alpha[:, None]
        # S's accumulator fragment is PV's A fragment: this conversion moves no data.
        acc = mma_v2(gl.convert_layout(p.to(dtype), DOT_A), v_smem.load(DOT_B), acc)
        gl.thread_barrier()  # every warp is done reading K/V before the next block overwrites them

    out, lse = finalize(acc, m_i, l_i, False)
    store_tile(o_base, lse_base, out, lse, seqlen_q - start_m, stride_os, BLOCK_M, HEAD_DIM)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    return common.launch(attention_fwd_v1, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=False,
                         head_dims=HEAD_DIMS, out=out, lse=lse)


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v1, head_dim=d, causal=c, cfg=CONFIG)
            for d in HEAD_DIMS for c in (False, True)]
