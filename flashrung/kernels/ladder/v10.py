"""ladder.v10 — staggered key sweeps: each CTA starts at its own key block.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v9): under v9's order (as under v5's) the CTAs resident together are equal
tiles launched together, and each sweeps its keys from block 0 upward, so they ask for the same
K/V block at the same moment, every block of the sweep. The sweep of query tile ``m`` here starts
at the fraction frac(m / φ) of its key blocks and wraps around (``hopper.schedule.kv_stagger``,
the same offsets as ``hopper.fwd``'s ``stagger_kv``); every block is masked by its own offsets, so
the order changes only the summation order of the online softmax. Grid and loop body are v9's;
the loop adds the wrap of the block index.

Evidence that led here (H200, config B, docs/ladder.md): v9's L2 budget swept 16/32/48/1024 MiB
(1/2/3/16 heads per section) measured 0.922/0.946/0.949/0.937× v4 — the fewer heads resident
CTAs share, the slower, although the L2 hit rate rises (v5 86.5%, v9 95.7%, v4 98.9%). v4's
order staggers its CTAs by itself: neighbouring query tiles have different lengths.
Prediction: if the lockstep is what v5/v9 lose to v4, v10 ≥ v4 at config B (≥ 1.05× v9). At
config A (non-causal, v4's grid, all tiles equal) each wave of CTAs also starts together and sweeps
in step, so the same mechanism predicts a gain there too.
Evidence: census — block-body families equal v9's, 0 spill. H200, paired (flashrung compare) over
v9: config A 1.0547 / 1.0569 (KEEP; ncu: long-scoreboard stalls 22.4% → 16.8%, L2 hit rate 83.3%
→ 92.2%), config B 0.9414 / 0.9416 (REVERT; ncu: L2 hit rate 97.1% → 78.0%, HBM reads 0.92 →
8.69 GB: at S = 32768 the staggered sweeps spread over more K/V than the L2 holds).
docs/ladder.md.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import attention_mma_cp_async

NAME = "ladder.v10"
PARENT = "ladder.v9"
LEVER = "staggered key sweeps: each CTA starts at its own key block (low-discrepancy offsets) and wraps"
HEAD_DIMS = (64, 128)
CONFIG = common.TileConfig(block_m=64, block_n=64, num_warps=4)
EXP2 = gl.constexpr(True)


@gluon.jit
def attention_fwd_v10(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    HEAVIEST_FIRST: gl.constexpr,
):
    # The lever: STAGGER on top of v9's HEAVIEST_FIRST + L2_SECTIONS.
    attention_mma_cp_async(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, EXP2=EXP2, HEAVIEST_FIRST=HEAVIEST_FIRST, L2_SECTIONS=True,
        STAGGER=True)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    heaviest_first = bool(causal)  # v9's order: the cost skew exists only under causal masking
    return common.launch(attention_fwd_v10, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=True,
                         heaviest_first=heaviest_first, head_dims=HEAD_DIMS,
                         constexprs={"HEAVIEST_FIRST": heaviest_first}, out=out, lse=lse)


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v10, head_dim=d, causal=c, cfg=CONFIG,
                               extra={"HEAVIEST_FIRST": c}, config_extra={"heaviest_first": c})
            for d in HEAD_DIMS for c in (False, True)]
