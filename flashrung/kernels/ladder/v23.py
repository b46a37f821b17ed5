"""ladder.v23 — v22's barrier-free trip with each block's row max formed as a tree.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA. Hopper and newer, as v22.

Lever (parent ladder.v22): v21's — each row's 16 in-thread scores folded as a tree
(``hopper.softmax.row_max``), a ``FMNMX`` chain 6 deep instead of 17 — on the trip that has no
barrier. On v20's trip the same tree lost at config B (0.984×): with the chain short, ptxas lifted a
row's exponentials above the trip's ``bar.sync`` and each warp arrived there later, so the CTA's
other three waited (barrier stalls 3.0 -> 5.9% of samples). v22's trip has no barrier to arrive at
late; what a short chain saves stays saved, as at d64 on v20 (1.041×), where half the MMAs a trip
leave the chain exposed.

Evidence: census (sm_90a): the trip's FMNMX chain 17 -> 6 with the same HMMA, LDSM, LDGSTS,
MUFU.EX2, SHFL and FMNMX as v22's; bit-identical to v22 (a maximum is exact in any order).
"""
from __future__ import annotations

from flashrung.kernels.ladder import v14, v22

NAME = "ladder.v23"
PARENT = "ladder.v22"
LEVER = "v21's tree-shaped row max on v22's barrier-free trip: no barrier for the lifted softmax to delay"
HEAD_DIMS = v22.HEAD_DIMS
CONFIG = v22.CONFIG
ROW_SUM = v22.ROW_SUM


def unsupported_reason(problem) -> str | None:
    return v22.unsupported_reason(problem)


def config_with(problem, overrides: dict) -> v14.AheadConfig:
    """:data:`CONFIG` (v22's tile and ring); this rung takes no overrides."""
    from flashrung.dispatch import apply_overrides

    return apply_overrides(NAME, CONFIG, overrides, keys=())


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    return v22.launch(q, k, v, causal, softmax_scale, out=out, lse=lse, config=config, name=NAME, row_max_tree=True)


def census_specs():
    return v22.kernel_census_specs(NAME, row_max_tree=True)
