"""ladder.v11 — three CTAs per SM: v4 under a 168-register cap.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v4): ptxas's register cap (``maxnreg``) at 168 per thread instead of the
255 v4 takes. The H200's 64 Ki registers per SM then hold three 4-warp CTAs (12 warps) where v4
holds two (8); shared memory (48 KiB per CTA) is not what binds either way. The kernel is v4's own
``attention_fwd_v4``, compiled with the cap; grid and tile are v4's.

Why this lever: the profile of v4 at config B itself (docs/ladder.md, `ladder-profile-config-b.json.gz`)
puts it at SM active 97.7%, L2 hit rate 98.9%, HBM reads at the compulsory 0.40 GB, the tensor
pipe busy 47.6% of active cycles and long-scoreboard stalls at 15.5%: latency with 8 warps per SM,
not traffic. v7's 64x32 arm measured the same cap at +11% (timing (selfcheck): ~215 → 239.1
TFLOP/s at B, 320 B of spill traffic).
Cost (census, sm_90a, d128 causal): 248 B of spill, 28 LDL and 2 STL in the 794-instruction
block loop (255 registers and 0 spill in v4); 3 CTAs × 128 threads × 248 B = 93 KiB of local
memory per SM, which the L1 left beside 144 KiB of shared memory can hold.
Prediction: +5–10% over v4 at config B if the 12 warps hide the latency the profile shows and the
spill reloads hit L1; a loss if they do not.
Measured (H200, paired `flashrung compare` over v4, two fresh processes): config B 0.8622 /
0.8630, config A 0.8519 / 0.8501 — REVERT. ncu at config B: occupancy 12.4% → 18.4% and
long-scoreboard stalls 15.6% → 9.3% (the latency is hidden), short-scoreboard 16.2% → 20.5% and
local-load conflicts 4.7 M → 24.6 M (the reloads sit on the MMA chain), tensor pipe 47.6% → 41.4%.
"""
from __future__ import annotations

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.v4 import CONFIG, attention_fwd_v4

NAME = "ladder.v11"
PARENT = "ladder.v4"
LEVER = "168-register cap: three 4-warp CTAs (12 warps) per SM instead of two"
HEAD_DIMS = (64, 128)
# 65536 registers per SM / (3 CTAs × 128 threads) = 170, rounded down to ptxas's allocation
# granule of 8 registers per thread
MAX_REGISTERS = 168
COMPILE_OPTIONS = {"maxnreg": MAX_REGISTERS}


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    # v4's kernel itself: the lever is the compile option alone (a separate compiled variant)
    return common.launch(attention_fwd_v4, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=True,
                         head_dims=HEAD_DIMS, options=COMPILE_OPTIONS, out=out, lse=lse)


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v4, head_dim=d, causal=c, cfg=CONFIG, options=COMPILE_OPTIONS,
                               config_extra={"max_registers": MAX_REGISTERS})
            for d in HEAD_DIMS for c in (False, True)]
