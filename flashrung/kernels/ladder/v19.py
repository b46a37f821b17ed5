"""ladder.v19 — v16 with the grid's last batch*head row dispatched heaviest first (causal).

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v16): v16 keeps the seed's grid, (query tiles, batch*heads) with the query
tile fastest, so the hardware dispatches each head's tiles lightest first — the order that kept
one head's K/V in L2 at a time and beat every LPT order at config B (v5, v9, v10). Its cost is the
end of the launch: the last tiles dispatched are the last head's heaviest (512 key blocks at config
B, twice the mean), and they run while the slots around them empty. Here the last batch*head row
alone runs its tiles heaviest first: the launch ends on that head's lightest tiles, and every
other head keeps v16's order and its L2 locality (the last head's K/V, 16 MiB at config B, fits L2
either way). Only the tile decode changes (``common.program_tile``); the trips are v16's
(``v16.attend_tile``). Non-causal tiles cost the same, so the lever is switched on only when causal.

Prediction (derived: list scheduling of config B's 8,192 tiles, cost = key blocks, on 264 slots):
the launch's makespan over its ideal falls from 3.3% to 0.2%; v16's profile at B has the SMs idle
2.3% of the elapsed cycles. So +1.5-3% at config B, nothing at config A (non-causal).
Measured (H200, paired compare over v16, t_keep 1.002515): config B 1.0305 / 1.0303 KEEP, d64 at
B's shape 1.0296 / 1.0306 KEEP; profile at B: SM active 97.4% -> 99.9% of elapsed cycles, the
tensor pipe's share unchanged (54.8% -> 55.0%) — the tail, nothing in the trip.

Measured arm (``impl="ladder.v19@num_warps=8"``, :data:`WIDE`): one 8-warp CTA of 128 query rows
per SM in place of two 4-warp CTAs of 64, each warp's work unchanged (16 rows, 255 registers, no
spill). Each K/V block is then copied into shared memory once per 128 rows, not twice: the cp.async
writes, a fifth of the shared-memory traffic of v16's trip beside its ldmatrix reads, and the L2
reads are halved. Its costs: every trip's barrier spans eight warps instead of four, and a CTA's
start and end leave the SM with no second CTA to cover them. Measured (paired compare over v19):
config B 0.8978 / 0.8955, config A 0.8437 / 0.8430 — REVERT; the costs win.
"""
from __future__ import annotations

import dataclasses

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common, v14, v16

NAME = "ladder.v19"
PARENT = "ladder.v16"
LEVER = "the grid's last batch*head row dispatched heaviest first (causal): the launch ends on light tiles"
HEAD_DIMS = v14.HEAD_DIMS
CONFIG = v14.CONFIG   # v16's tile and ring; the row sum deferred (v16's pick, every head dim and mask)
ROW_SUM = v16.SUM_DEFERRED
# the measured arm: one 8-warp, 128-row CTA per SM (16 rows per warp, as in CONFIG)
WIDE = dataclasses.replace(CONFIG, block_m=128, num_warps=8)
CTA_WARPS = (CONFIG.num_warps, WIDE.num_warps)


@gluon.jit
def attention_fwd_v19(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr, QK_AHEAD: gl.constexpr, KV_COPY: gl.constexpr, ROW_SUM: gl.constexpr,
    TAIL_HEAVIEST_FIRST: gl.constexpr,
):
    # The lever: TAIL_HEAVIEST_FIRST (v16: False; the host sets it when causal); the rest is v16's.
    v16.attend_tile(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
                    stride_kh, stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k,
                    heads_q, group, qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, ROW_SUM,
                    TAIL_HEAVIEST_FIRST)


def unsupported_reason(problem) -> str | None:
    return v14.unsupported_reason(problem)


@dataclasses.dataclass(frozen=True)
class _CtaWarps:
    num_warps: int = CONFIG.num_warps


def config_with(problem, overrides: dict) -> v14.AheadConfig:
    """:data:`CONFIG` with ``overrides`` applied: ``num_warps`` (4 or 8; the CTA's query rows
    follow it, 16 per warp — ``{"num_warps": "8"}`` is :data:`WIDE`)."""
    from flashrung.dispatch import apply_overrides

    warps = apply_overrides(NAME, _CtaWarps(), overrides, keys=("num_warps",)).num_warps
    if warps not in CTA_WARPS:
        raise ValueError(f"{NAME}@num_warps={warps}: expected one of {', '.join(map(str, CTA_WARPS))}")
    cfg = WIDE if warps == WIDE.num_warps else CONFIG
    reason = common.shared_memory_reason(problem, cfg.smem_bytes(problem.head_dim))
    if reason is not None:
        raise ValueError(f"{NAME}@num_warps={warps}: {reason}")
    return cfg


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    return v14.launch_on_ring(attention_fwd_v19, q, k, v, causal, softmax_scale, config=config, out=out, lse=lse,
                              constexprs={"ROW_SUM": ROW_SUM, "TAIL_HEAVIEST_FIRST": bool(causal)},
                              needs_ahead=NAME)


def census_specs():
    cases = [(CONFIG, d, c, v14.copy_form(d, True)) for d in HEAD_DIMS for c in (False, True)]
    cases += [(CONFIG, 128, c, v14.copy_form(128, False)) for c in (False, True)]
    cases += [(WIDE, d, c, v14.copy_form(d, True)) for d in HEAD_DIMS for c in (False, True)]
    return [common.census_spec(NAME, attention_fwd_v19, head_dim=d, causal=c, cfg=cfg,
                               extra={"KV_COPY": form, "ROW_SUM": ROW_SUM, "TAIL_HEAVIEST_FIRST": c},
                               config_extra={"kv_stages": cfg.kv_stages, "kv_copy": v14.COPY_NAMES[form]})
            for cfg, d, c, form in cases]
