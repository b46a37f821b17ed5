"""ladder.v4 — exp2 softmax with log2(e) folded into the host-side scale.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v3, single buffer): the exponentials become ``exp2`` (``ex2.approx.ftz.f32``,
one ``MUFU.EX2``) instead of libdevice ``expf``, and the base change is paid once on the host:
the kernel's score scale is ``softmax_scale * log2(e)`` (``common.host_scale``), the running max
is carried in the log2 domain, and the LSE is brought back to the natural base once per row in
the epilogue. ``ex2.approx.ftz`` gives exactly +0 for -inf (a masked key contributes nothing)
and exactly 1 for 0.

Prediction (seed 000, 2.6): the ``MUFU.EX2`` count does not change — ``expf`` already used one
``MUFU.EX2`` per call — so the lever does not relieve the SFU; it deletes ``expf``'s range
reduction from the FMA/ALU pipes, on the serial QK -> softmax -> PV chain (seed: 1.0906x,
+238 instructions removed over 34 call sites, 1.85 cycles returned per removed instruction).

Closed form (census, verified per head dim in ``tests/test_ladder.py``): per loop body each
thread makes E = BLOCK_M*BLOCK_N/(32*num_warps) + 2 exponential calls (its 32 scores of the
64x64 tile and the rescale factors of its 2 rows) = 34, independent of head_dim.
``MUFU.EX2`` = E in both v3 and v4. libdevice ``expf`` lowers (ptxas 12.8/13, sm_90a/80/120) to
``MUFU.EX2`` plus 8 FMA/ALU instructions (FFMA x4 with FFMA.RM and the FADD.SAT clamp, FADD,
SHF.L, FMUL by 2^k), ``ex2.approx.ftz`` to ``MUFU.EX2`` alone, so the FMA/ALU count drops by
8*E = 272 per loop body at every head dim (the seed's nvcc lowering was 7 per call, 238).
H200 timing (ladder --quick): 261.3 TFLOP/s at A (1.117x vs v3, paired in-process), 303.1 at B
(1.178x): the top rung on the H200, 70.4% of the measured mma_v2 GEMM ceiling. docs/ladder.md.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import attention_mma_cp_async

NAME = "ladder.v4"
PARENT = "ladder.v3"
LEVER = "exp2 (ex2.approx.ftz) with log2(e) folded into the host-side scale, max in log2 domain"
HEAD_DIMS = (64, 128)
CONFIG = common.TileConfig(block_m=64, block_n=64, num_warps=4)
EXP2 = gl.constexpr(True)


@gluon.jit
def attention_fwd_v4(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
):
    # The lever: EXP2 (v3: False); everything else is v3's.
    attention_mma_cp_async(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, EXP2=EXP2, HEAVIEST_FIRST=False)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None):
    return common.launch(attention_fwd_v4, q, k, v, causal, softmax_scale, cfg=CONFIG, exp2=True,
                         head_dims=HEAD_DIMS, out=out, lse=lse)


def census_specs():
    return [common.census_spec(NAME, attention_fwd_v4, head_dim=d, causal=c, cfg=CONFIG)
            for d in HEAD_DIMS for c in (False, True)]
