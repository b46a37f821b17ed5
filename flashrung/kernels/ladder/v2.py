"""ladder.v2 — XOR-swizzled shared tiles: the ldmatrix reads stop colliding on banks.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v1): the shared tiles use the seed's swizzle,
``offset(r, c) = r*D + (c ^ ((r & 7) << 3))`` — ``SwizzledSharedLayout(vec=8, per_phase=1,
max_phase=8)``: each 16-byte chunk of a row moves to chunk ``(c/8) ^ (r & 7)``. Everything else
is v1's. Why: a row is 128 B (D=64) or 256 B (D=128), a multiple of the 128-byte bank period,
so in v1's row-major tile the eight 16-byte rows one ldmatrix phase reads all start on the same
bank group — 8 wavefronts where 1 suffices (seed: 32.00 -> 4.00 wavefronts per ldmatrix.x4).
Three XOR bits spread those eight rows over all eight 16-byte windows of the bank period; writer
and reader use the same map, so no byte moves between rows and no shared memory is added.

Prediction (seed 000 on sm_120: 1.68x, 51.03 -> 85.63 TFLOP/s, the conflict factor 8x -> 1x;
Amdahl caps the gain because shared-memory stalls were only ~35% of v1's stall weight): a
clear gain, smaller than 8x; afterwards global-load latency (long scoreboard) dominates.

Evidence: the census shows the same instruction mix as v1 (same ``HMMA``/``LDSM`` counts, same
shared bytes) — bank conflicts are an address property and cannot be seen in SASS; the
difference must come from ncu (``l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum``,
ldsm wavefronts per instruction). H200 timing and profile: docs/ladder.md (to be measured).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import (
    finalize, kv_loop_end, mask_scores, mma_layout, program_tile, softmax_update, stage_kv_scalar,
    stage_tile_scalar, store_tile, tile_bases, xor_swizzled_layout,
)

NAME = "ladder.v2"
PARENT = "ladder.v1"
LEVER = "XOR-swizzled shared tiles (3 XOR bits, 16-byte chunks) instead of row-major"
HEAD_DIMS = (64, 128)
CONFIG = common.TileConfig(block_m=64, block_n=64, num_warps=4)


@gluon.jit
def attention_fwd_v2(
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
    SMEM: gl.constexpr = xor_swizzled_layout()
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
    return common.launch(attention_fwd_v2, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=False,
                         head_dims=HEAD_DIMS, out=out, lse=lse)


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v2, head_dim=d, causal=c, cfg=CONFIG)
            for d in HEAD_DIMS for c in (False, True)]
