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
ldsm wavefronts per instruction).
H200 timing (ladder --quick): 127.6 TFLOP/s at A (2.758x vs v1, paired in-process), 149.8 at B
(3.099x). Bank-conflict counters: not measured. docs/ladder.md.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import xor_swizzled_layout
from flashrung.kernels.ladder.v1 import attention_mma_scalar_staged

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
    # The lever: SMEM = the XOR swizzle (v1: row_major_layout()); everything else is v1's.
    attention_mma_scalar_staged(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, SMEM=xor_swizzled_layout())


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    return common.launch(attention_fwd_v2, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=False,
                         head_dims=HEAD_DIMS, out=out, lse=lse)


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v2, head_dim=d, causal=c, cfg=CONFIG)
            for d in HEAD_DIMS for c in (False, True)]
