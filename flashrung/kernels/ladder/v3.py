"""ladder.v3 — 16-byte cp.async staging (LDGSTS), single buffer.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v2): Q, K and V reach shared memory by ``cp.async.cg`` 16 bytes per thread
(8 halves, 512 B per warp-instruction) instead of v2's scalar loop (one 2-byte load and one
2-byte shared store per element, through a register). The copy has no register destination,
so nothing is scoreboarded on the data and the staged values stop occupying registers; the
instruction count of staging falls by the width ratio (8x). Rows past the sequence are
zero-filled by the copy itself (src-size 0). Still single-buffered: each key block is copied,
waited for (``wait_group(0)``) and consumed before the next is issued — the copy mechanism is
the only change.

The double-buffered arm (``PipelineConfig(kv_stages=2)``) prefetches block j+1 into the second
slot while block j is consumed (one commit per iteration, ``wait_group(1)``, a final drain). It
is measured against the single buffer and kept only if it wins here; on sm_120 it lost 12.9%
because the second stage cost a CTA per SM under the 99 KB budget — on the H200's 227 KB it does
not, so the seed's reason to reject it is gone and only a measurement can decide.

Prediction (seed 000: 1.512x from the copy width alone, 129.46 TFLOP/s): a gain driven by the
8x fewer staging instructions and the freed registers; on the H200 the scalar staging of v2
already keeps all of a tile's loads in flight (the compiler issues them before any store), so
the latency part of the seed's gain should be smaller here.

Evidence (census, no GPU; ``tests/test_ladder.py``): ``LDGSTS`` appears (v2 has none) and the
scalar ``LDG``/``STS`` of the K/V staging disappear; fewer registers and no spills at D=128.
Shared memory: single buffer as v2; the double-buffered arm adds one K and one V tile.
H200 timing (ladder --quick): 232.5 TFLOP/s at A (1.826x vs v2, paired in-process), 255.5 at B
(1.702x); the double-buffered arm read +8.5% at A and -2.1% at B (do_bench, unpaired): not kept.
docs/ladder.md.
"""
from __future__ import annotations

import dataclasses

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import attention_mma_cp_async, attention_mma_cp_async_ring

NAME = "ladder.v3"
PARENT = "ladder.v2"
LEVER = "16-byte cp.async (LDGSTS) staging instead of the scalar 2-byte loop; single buffer"
HEAD_DIMS = (64, 128)


@dataclasses.dataclass(frozen=True)
class PipelineConfig(common.TileConfig):
    """The tile plus the depth of its K/V ring: 1 is the shipped single buffer
    (``attention_fwd_v3``), 2 the double-buffered arm (one prologue commit, so exactly two slots;
    ``attention_fwd_v3_kv2``)."""

    kv_stages: int = 2

    def __post_init__(self):
        super().__post_init__()
        if self.kv_stages not in (1, 2):
            raise ValueError(f"kv_stages must be 1 (the single buffer, the shipped kernel) or 2 (the "
                             f"double-buffered arm), got {self.kv_stages}")

    def constexprs(self) -> dict:
        return {**super().constexprs(), "KV_STAGES": self.kv_stages}


CONFIG = common.TileConfig(block_m=64, block_n=64, num_warps=4)   # ships: single buffer
DOUBLE_BUFFER = PipelineConfig(block_m=64, block_n=64, num_warps=4, kv_stages=2)


@gluon.jit
def attention_fwd_v3(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
):
    # The lever: the cp.async body (v2: scalar staging); tiles, expf and order are v2's.
    attention_mma_cp_async(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, EXP2=False, HEAVIEST_FIRST=False)


@gluon.jit
def attention_fwd_v3_kv2(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr,
):
    """The double-buffered arm: a ring of KV_STAGES (= 2) K/V slots, block j+1 in flight while
    block j is consumed (``common.attention_mma_cp_async_ring``, with v3's ``expf``)."""
    attention_mma_cp_async_ring(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, EXP2=False)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def config_with(problem, overrides: dict) -> PipelineConfig:
    """The ring depth from ``overrides`` (``impl="ladder.v3@kv_stages=2"``: the double-buffered
    arm; 1: the shipped single buffer)."""
    from flashrung.dispatch import apply_overrides

    return apply_overrides(NAME, dataclasses.replace(DOUBLE_BUFFER, kv_stages=1), overrides, keys=("kv_stages",))


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    if getattr(config, "kv_stages", 1) == 2:
        return forward_double_buffer(q, k, v, causal, softmax_scale, out=out, lse=lse)
    return common.launch(attention_fwd_v3, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=False,
                         head_dims=HEAD_DIMS, out=out, lse=lse)


def forward_double_buffer(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    """The double-buffered arm (same signature as ``forward``), for paired measurement."""
    return common.launch(attention_fwd_v3_kv2, q, k, v, causal, softmax_scale, cfg=DOUBLE_BUFFER,
                         exp2=False, head_dims=HEAD_DIMS, out=out, lse=lse)


def census_specs():
    specs = [common.census_spec(NAME, attention_fwd_v3, head_dim=d, causal=c, cfg=CONFIG,
                                config_extra={"kv_stages": 1})
             for d in HEAD_DIMS for c in (False, True)]
    specs += [common.census_spec(NAME, attention_fwd_v3_kv2, head_dim=d, causal=False,
                                 cfg=DOUBLE_BUFFER, config_extra={"kv_stages": 2})
              for d in HEAD_DIMS]
    return specs
