"""ladder.v5 — HeaviestFirst (LPT) CTA order for causal attention.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v4): under causal masking a CTA's cost is the number of key blocks left of
its diagonal — query tile t does about t+1 blocks (a 32x spread at N=2048, 512x at N=32768) —
and v4 puts the query tile on the fastest launch axis, so each head's cheapest tiles are
dispatched first and its most expensive last, the worst order for a greedy scheduler: the long
jobs start when nothing is left to overlap them. v5 launches one flat grid whose index runs over
query tiles in descending order (primary key), then batch*heads (secondary key): longest
processing time first, a 4/3-approximation of the optimal makespan. The loop body and the
instructions are v4's; only which program gets which tile changes. Non-causal problems have no
cost skew and keep v4's grid (the lever is switched on only where its mechanism exists).

Prediction (seed 000: 1.349x at causal N=2048, inert — 0.92-1.08x, centred on 1 — at
non-causal shapes; SM-idle share of elapsed time 21.7% -> 2.8%): a large causal gain at the
ladder config, none non-causal.

The seed's persistent-grid arm is ``persistent=True`` (``impl="ladder.v5@persistent=true"``): as
many programs as the GPU holds at once (``common.persistent_programs``), each walking the work
items of the same order with a stride of the grid (``common.attention_mma_cp_async_persistent``),
so no wave is left part full; each item after a program's first pays its decode and a CTA barrier
on the reused shared tiles. Seed 000 measured it at 0.9875x against its plain grid (N=2048, before
LPT) and the persistent LPT grid at 1.168x against 1.349x for the plain LPT grid.

Evidence (census): the loop body's instruction families (HMMA, MUFU.EX2, LDGSTS, FFMA, FMUL)
equal v4's; the difference is the tile decode before the loop (and, persistent, the item loop
around the tile). H200 timing (ladder --quick): 0.997x vs v4 at A (no causal work to reorder)
and 0.931x at B (paired in-process): LPT loses on the H200 at config B. docs/ladder.md.
"""
from __future__ import annotations

import dataclasses

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import attention_mma_cp_async, attention_mma_cp_async_persistent

NAME = "ladder.v5"
PARENT = "ladder.v4"
LEVER = "HeaviestFirst (LPT) CTA order when causal: descending query tile, then batch*heads"
HEAD_DIMS = (64, 128)
EXP2 = gl.constexpr(True)


@dataclasses.dataclass(frozen=True)
class OrderConfig(common.TileConfig):
    """v4's tile; ``persistent`` launches the persistent-grid arm instead of one program per tile."""

    persistent: bool = False


CONFIG = OrderConfig(block_m=64, block_n=64, num_warps=4)
PERSISTENT = dataclasses.replace(CONFIG, persistent=True)


@gluon.jit
def attention_fwd_v5(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    HEAVIEST_FIRST: gl.constexpr,
):
    # The lever: HEAVIEST_FIRST (v4: False; the host sets it when causal); the rest is v4's.
    attention_mma_cp_async(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, EXP2=EXP2, HEAVIEST_FIRST=HEAVIEST_FIRST)


@gluon.jit
def attention_fwd_v5_persistent(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale, batch_heads,
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    HEAVIEST_FIRST: gl.constexpr,
):
    # The arm: the same tiles in the same order, walked by a grid of resident programs.
    attention_mma_cp_async_persistent(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, batch_heads, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, EXP2=EXP2, HEAVIEST_FIRST=HEAVIEST_FIRST)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def config_with(problem, overrides: dict) -> OrderConfig:
    """:data:`CONFIG` with ``overrides`` applied (``{"persistent": "true"}``)."""
    from flashrung.dispatch import apply_overrides

    return apply_overrides(NAME, CONFIG, overrides, keys=("persistent",))


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config: OrderConfig = CONFIG):
    heaviest_first = bool(causal)  # the cost skew exists only under causal masking
    kernel = attention_fwd_v5_persistent if config.persistent else attention_fwd_v5
    return common.launch(kernel, q, k, v, causal, softmax_scale, cfg=config, exp2=True,
                         heaviest_first=heaviest_first, head_dims=HEAD_DIMS,
                         constexprs={"HEAVIEST_FIRST": heaviest_first}, out=out, lse=lse,
                         persistent=config.persistent)


def census_specs():
    plain = [common.census_spec(NAME, attention_fwd_v5, head_dim=d, causal=c, cfg=CONFIG,
                                extra={"HEAVIEST_FIRST": c}, config_extra={"heaviest_first": c, "persistent": False})
             for d in HEAD_DIMS for c in (False, True)]
    return plain + [common.census_spec(NAME, attention_fwd_v5_persistent, head_dim=d, causal=c, cfg=PERSISTENT,
                                       extra={"HEAVIEST_FIRST": c}, config_extra={"heaviest_first": c,
                                                                                  "persistent": True},
                                       runtime_extra=("batch_heads",))
                    for d in HEAD_DIMS for c in (False, True)]
