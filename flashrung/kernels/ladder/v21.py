"""ladder.v21 — v20's trip with each block's row max formed as a tree.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v20): a thread holds 16 of a row's 64 scores (two per n8 group of the
mma.sync accumulator, eight groups), and Triton folds them one after another: 15 dependent
``FMNMX`` per row before the quad's two shuffles, for each of the thread's two rows (v20's SASS at
d128: the first row's chain runs under the wait for block j+1, the second after the barrier,
ahead of that row's exponentials). Every column bit above the n8 group is a register bit, so the
row can be halved inside the thread (``hopper.softmax.row_max``, shared with hopper.fwd's
``tree_reduce``): the same 15 ``FMNMX`` per row, a dependency depth of 4 + 1 instead of 15, no
data moved between threads. The kernel is v20's (its ``ROW_MAX_TREE`` switch); only the trip's
max changes, not the peeled first block's or the epilogue's.

Prediction: at 8 warps per SM (two per scheduler) the other warp hides part of the chain; the
second row's 11 saved latencies (≈ 50 cycles of a ≈ 1,360-cycle trip per warp, derived from
v20's profile at config B) bound the gain: +0.5–2% at config B.
Measured (H200, paired compare over v20, t_keep 1.002515): config B 0.9836 / 0.9837 REVERT, config A
0.9989 / 0.9992 NULL, d64 at B's shape 1.0408 / 1.0408 KEEP. The census explains the sign: with the
chain short, ptxas lifts the first row's exponentials and O-rescale multiplies over the trip's
barrier (d128: 5 MUFU and 9 FMUL ahead of it, none in v20), so each warp reaches the barrier later;
profile at B (one launch each): barrier stalls 3.0 -> 5.9% of samples, math-pipe throttle 5.9 ->
10.1%, short scoreboard 25.1 -> 19.6%, 12.12 -> 12.31 ms. At d64, where the trip has half the MMAs
to hide the chain behind, FMNMX samples fall 19.3 -> 9.3% and the launch 7.05 -> 6.79 ms. Not the top
rung at config B: v20 stays.
"""
from __future__ import annotations

from flashrung.kernels.ladder import v14, v20

NAME = "ladder.v21"
PARENT = "ladder.v20"
LEVER = "each block's row max as a tree: the row halved inside the thread, depth 5 instead of 15"
HEAD_DIMS = v20.HEAD_DIMS
CONFIG = v20.CONFIG
ROW_SUM = v20.ROW_SUM


def unsupported_reason(problem) -> str | None:
    return v20.unsupported_reason(problem)


def config_with(problem, overrides: dict) -> v14.AheadConfig:
    """:data:`CONFIG` (v20's tile and ring); this rung takes no overrides."""
    from flashrung.dispatch import apply_overrides

    return apply_overrides(NAME, CONFIG, overrides, keys=())


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    return v20.launch(q, k, v, causal, softmax_scale, out=out, lse=lse, config=config, name=NAME, row_max_tree=True)


def census_specs():
    return v20.kernel_census_specs(NAME, row_max_tree=True)
