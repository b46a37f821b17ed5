"""ladder.v7 — the seed's four keeps, each its own switch, on top of v5.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA. (v6 was the seed's FP8 side branch; it is not on this
ladder.)

Levers (parent ladder.v5), each a field of :class:`KeepsConfig`, all on by default:

1. ``block_n=32`` — the 64x32 tile. Half the K/V tiles: on sm_120 that bought a third CTA —
   a third independent ``__syncthreads`` domain — per SM, so one CTA's barrier did not stall
   another's issue (seed exp1: +0.38%, kept at 6.5x the A/A noise, with registers capped at
   168; the same 12 warps/SM as 4x2 or 2x6 warps lost). On the H200 registers, not shared
   memory, bound occupancy (244 per thread: 2 CTAs/SM either way), so the third CTA needs the
   ``max_registers=168`` arm, whose price the census shows in spills. The per-block fixed
   cost doubles; the measurement decides.
2. ``rescale_skip`` — identity-only rescale skip with a warp-uniform vote. ``acc *= alpha`` is
   skipped when every row of the warp has ``alpha == 1.0`` exactly (its running max did not
   move), decided by one ``vote.sync.any`` and a uniform branch around the multiplies (inline
   PTX: Gluon has no per-warp scalar to branch on). The test is on ``alpha``, which is taken
   against the effective max (a row that has seen only masked keys has ``alpha = 0`` and is
   rescaled). The running-sum update is the same expression either way, so outputs are bitwise
   identical with the switch on or off (seed exp3: +0.98% once exp1 had raised occupancy; it
   lost at 8 warps/SM).
3. ``mask_specialize`` — the mask predicate only where it can matter. The block body is one
   ``@gluon.jit`` function with a ``MASKED`` constexpr (a function template, inlined twice, not a
   second kernel); interior blocks — inside ``seqlen_k`` and at or left of the tile's first
   diagonal — take the unmasked copy (seed exp10: +2.18%, the largest keep; a kernel-level
   three-way specialization lost 5.4% to code size).
4. ``causal_split`` — the key loop split at the diagonal: one loop over the interior blocks with
   the unmasked body, one over the rest with the masked body, so the mode is a compile-time
   constant in each loop instead of a per-block branch (seed exp15: 168 -> 161 registers, the
   16 B spill gone). Requires ``mask_specialize``.

Prediction: each keep's sign on the H200 is open — the seed's keeps were measured at sm_120's
occupancy (99 KB, 3 CTAs/SM) and the H200's 227 KB moves every occupancy cliff; the
specialization keeps (3, 4) should transfer, the tile keep (1) is the most occupancy-dependent.

Evidence (census, no GPU; ``tests/test_ladder.py``): registers and spill instructions per switch
(each switch off in turn against all on); the rescale skip appears as ``VOTE.ANY`` and a
predicated ``BRA``; the specialized variants carry two copies of the block body (``MUFU.EX2`` =
2 x (BLOCK_M*BLOCK_N/128 + 2)).
H200 timing (ladder --quick): 0.715x vs v5 at A, 0.762x at B (paired in-process): the keeps
lose here (227 KB of SMEM never limits; registers cap occupancy at d128, so the 64x32 tile buys no
CTA). Per-switch figures and the condition: docs/ladder.md.
"""
from __future__ import annotations

import dataclasses

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import (
    allocate_and_stage_q, finalize, flash_state, kv_interior_end, kv_loop_end, mma_layout, mma_pv, mma_scores,
    softmax_update, stage_kv_block, store_tile, tile_start, xor_swizzled_layout,
)

NAME = "ladder.v7"
PARENT = "ladder.v5"
LEVER = ("four switches: 64x32 tile, identity rescale skip (warp vote), interior-block mask "
         "specialization, causal loop split")
HEAD_DIMS = (64, 128)

# How the key loop applies the mask (an enum of compile-time modes).
MASK_EVERY_BLOCK = gl.constexpr(0)  # v5's loop: the predicate evaluated on every block
MASK_BRANCH = gl.constexpr(1)       # one loop, a per-block branch between the two body copies
MASK_SPLIT = gl.constexpr(2)        # two loops, interior then diagonal/tail, mode fixed per loop


@dataclasses.dataclass(frozen=True)
class KeepsConfig(common.TileConfig):
    """v5's tile plus the four keeps; every field is a switch measured against the others."""

    block_n: int = 32              # keep 1: the 64x32 tile (v5: 64)
    rescale_skip: bool = True      # keep 2: skip acc *= alpha when alpha == 1 for the whole warp
    mask_specialize: bool = True   # keep 3: unmasked body for interior blocks
    causal_split: bool = True      # keep 4: loop split at the diagonal (needs keep 3)
    # Register cap per thread (ptxas ``maxnreg``), None = the compiler's choice. The seed reached
    # 3 CTAs/SM with the 64x32 tile by capping at 168 (65,536 regs / (3 * 128 threads)); here
    # the census prices that cap in spills and the H200 measurement decides.
    max_registers: int | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.max_registers is not None and not 24 <= self.max_registers <= 255:
            raise ValueError(f"max_registers must be None or in [24, 255], got {self.max_registers}")
        if self.causal_split and not self.mask_specialize:
            raise ValueError("causal_split=True needs mask_specialize=True: the split loops run the "
                             "unmasked body on interior blocks")

    @property
    def mask_mode(self) -> int:
        if self.causal_split:
            return MASK_SPLIT.value
        return MASK_BRANCH.value if self.mask_specialize else MASK_EVERY_BLOCK.value

    def constexprs(self) -> dict:
        return {**super().constexprs(), "RESCALE_SKIP": self.rescale_skip, "MASK_MODE": self.mask_mode}

    def compile_options(self) -> dict:
        return {} if self.max_registers is None else {"maxnreg": self.max_registers}

    def describe(self) -> dict:
        return {"rescale_skip": self.rescale_skip, "mask_specialize": self.mask_specialize,
                "causal_split": self.causal_split, "max_registers": self.max_registers}


CONFIG = KeepsConfig()
# Each keep switched off in turn (the census and the paired margins compare these with CONFIG).
SWITCH_OFF = {
    "tile_64x64": dataclasses.replace(CONFIG, block_n=64),
    "no_rescale_skip": dataclasses.replace(CONFIG, rescale_skip=False),
    "no_causal_split": dataclasses.replace(CONFIG, causal_split=False),
    "no_mask_specialize": dataclasses.replace(CONFIG, mask_specialize=False, causal_split=False),
}
# The seed's occupancy choice as an arm: registers capped for 3 CTAs (12 warps) per SM.
THREE_CTAS_PER_SM = dataclasses.replace(CONFIG, max_registers=168)


# --------------------------------------------------------------------------------------------
# Keep 2: the warp-uniform identity-rescale skip
# --------------------------------------------------------------------------------------------

@gluon.constexpr_function
def _row_element_indices(reg_bases):
    """Per-thread element indices that cover each distinct row the thread holds: the register
    bases with a row component span the rows; element i has register coordinate i."""
    row_bits = [1 << i for i, basis in enumerate(reg_bases) if basis[0] != 0]
    indices = [0]
    for bit in row_bits:
        indices += [i + bit for i in indices]
    return indices


@gluon.constexpr_function
def _rescale_skip_asm(n, row_indices):
    """PTX for n accumulator elements (operands 0..n-1 out, tied to n..2n-1 in) and their
    broadcast alphas (2n..3n-1): vote over the warp, branch around the multiplies."""
    lines = ["{", ".reg .pred %need, %any;",
             f"setp.neu.f32 %need, ${2 * n + row_indices[0]}, 0f3F800000;"]
    for i in row_indices[1:]:
        lines.append(f"setp.neu.or.f32 %need, ${2 * n + i}, 0f3F800000, %need;")
    lines += ["vote.sync.any.pred %any, %need, -1;", "@!%any bra.uni SKIP_${:uid};"]
    lines += [f"mul.f32 ${k}, ${k}, ${2 * n + k};" for k in range(n)]
    lines += ["SKIP_${:uid}:", "}"]
    return "\n".join(lines)


@gluon.constexpr_function
def _rescale_skip_constraints(n):
    return ",".join(["=f"] * n + [str(k) for k in range(n)] + ["f"] * n)


@gluon.jit
def rescale_unless_identity(acc, alpha):
    """``acc * alpha[:, None]``, skipped by the whole warp when every row it holds has
    ``alpha == 1.0`` (bitwise the identity). One asm instance per thread covers all of the
    thread's accumulator elements, so the branch skips them all."""
    N: gl.constexpr = acc.shape[0] * acc.shape[1] // (32 * gl.num_warps())
    LL: gl.constexpr = gl.to_linear_layout(acc.type.layout, acc.shape)
    ROWS: gl.constexpr = _row_element_indices(LL.reg_bases)
    return gl.inline_asm_elementwise(_rescale_skip_asm(N, ROWS), _rescale_skip_constraints(N),
                                     [acc, alpha[:, None]], dtype=gl.float32, is_pure=True, pack=N)


# --------------------------------------------------------------------------------------------
# The block body, specialized by MASKED (keep 3)
# --------------------------------------------------------------------------------------------

@gluon.jit
def _attend_block(q, k_smem, v_smem, acc, m_i, l_i, start_n, hi, offs_m, seqlen_k, causal_shift,
                  k_base, v_base, stride_ks, stride_vs, qk_scale,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, MASKED: gl.constexpr, RESCALE_SKIP: gl.constexpr):
    stage_kv_block(k_smem, v_smem, k_base, v_base, start_n, hi - start_n, stride_ks, stride_vs,
                   BLOCK_N, HEAD_DIM, True)
    s = mma_scores(q, k_smem, start_n, offs_m, seqlen_k, causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, MASKED)
    p, alpha, m_i, l_i = softmax_update(s, m_i, l_i, qk_scale, True)
    if RESCALE_SKIP:
        acc = rescale_unless_identity(acc, alpha)
    else:
        acc = acc * alpha[:, None]
    acc = mma_pv(acc, p, v_smem)
    gl.thread_barrier()  # every warp is done reading K/V before the next copy overwrites them
    return acc, m_i, l_i


@gluon.jit
def attention_fwd_v7(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    HEAVIEST_FIRST: gl.constexpr, RESCALE_SKIP: gl.constexpr, MASK_MODE: gl.constexpr,
):
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    start_m, q_base, k_base, v_base, o_base, lse_base = tile_start(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        BLOCK_M, HEAD_DIM, HEAVIEST_FIRST, False)
    hi = kv_loop_end(start_m, seqlen_q, seqlen_k, BLOCK_M, IS_CAUSAL)
    q, k_smem, v_smem = allocate_and_stage_q(q_base, seqlen_q - start_m, stride_qs, dtype, BLOCK_M, BLOCK_N,
                                             HEAD_DIM, xor_swizzled_layout(), True)
    m_i, l_i, acc, offs_m = flash_state(start_m, BLOCK_M, HEAD_DIM, gl.SliceLayout(1, MMA), MMA)
    causal_shift = seqlen_k - seqlen_q
    if MASK_MODE == MASK_SPLIT:
        mid = kv_interior_end(start_m, seqlen_q, seqlen_k, BLOCK_N, IS_CAUSAL)
        for start_n in range(0, mid, BLOCK_N):
            acc, m_i, l_i = _attend_block(
                q, k_smem, v_smem, acc, m_i, l_i, start_n, hi, offs_m, seqlen_k, causal_shift,
                k_base, v_base, stride_ks, stride_vs, qk_scale,
                BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL, False, RESCALE_SKIP)
        for start_n in range(mid, hi, BLOCK_N):
            acc, m_i, l_i = _attend_block(
                q, k_smem, v_smem, acc, m_i, l_i, start_n, hi, offs_m, seqlen_k, causal_shift,
                k_base, v_base, stride_ks, stride_vs, qk_scale,
                BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL, True, RESCALE_SKIP)
    elif MASK_MODE == MASK_BRANCH:
        mid = kv_interior_end(start_m, seqlen_q, seqlen_k, BLOCK_N, IS_CAUSAL)
        for start_n in range(0, hi, BLOCK_N):
            if start_n < mid:
                acc, m_i, l_i = _attend_block(
                    q, k_smem, v_smem, acc, m_i, l_i, start_n, hi, offs_m, seqlen_k, causal_shift,
                    k_base, v_base, stride_ks, stride_vs, qk_scale,
                    BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL, False, RESCALE_SKIP)
            else:
                acc, m_i, l_i = _attend_block(
                    q, k_smem, v_smem, acc, m_i, l_i, start_n, hi, offs_m, seqlen_k, causal_shift,
                    k_base, v_base, stride_ks, stride_vs, qk_scale,
                    BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL, True, RESCALE_SKIP)
    else:
        for start_n in range(0, hi, BLOCK_N):
            acc, m_i, l_i = _attend_block(
                q, k_smem, v_smem, acc, m_i, l_i, start_n, hi, offs_m, seqlen_k, causal_shift,
                k_base, v_base, stride_ks, stride_vs, qk_scale,
                BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL, True, RESCALE_SKIP)

    out, lse = finalize(acc, m_i, l_i, True)
    store_tile(o_base, lse_base, out, lse, seqlen_q - start_m, stride_os, BLOCK_M, HEAD_DIM)


def unsupported_reason(problem) -> str | None:
    return common.unsupported_reason(problem, HEAD_DIMS)


def config_with(problem, overrides: dict) -> KeepsConfig:
    """:data:`CONFIG` with each keep switched by ``overrides`` (``impl="ladder.v7@rescale_skip=false"``,
    ``@block_n=64``, ``@mask_specialize=false,causal_split=false``, ``@max_registers=168``), so
    that every keep is priced alone against the others with ``flashrung compare``."""
    from flashrung.dispatch import apply_overrides

    overrides = dict(overrides)
    cap = overrides.pop("max_registers", None)
    config = apply_overrides(NAME, CONFIG, overrides,
                             keys=("block_n", "rescale_skip", "mask_specialize", "causal_split", "max_registers"))
    if cap is not None:
        text = str(cap).strip().lower()
        if text == "none":
            return dataclasses.replace(config, max_registers=None)
        try:
            registers = int(text)
        except ValueError:
            raise ValueError(f"override max_registers={cap!r}: expected an integer or none") from None
        return dataclasses.replace(config, max_registers=registers)
    return config


def forward(q, k, v, causal: bool, softmax_scale: float, config: KeepsConfig = CONFIG, *,
            out=None, lse=None):
    heaviest_first = bool(causal)  # v5's lever, unchanged
    return common.launch(attention_fwd_v7, q, k, v, causal, softmax_scale, cfg=config, exp2=True,
                         heaviest_first=heaviest_first, head_dims=HEAD_DIMS,
                         constexprs={"HEAVIEST_FIRST": heaviest_first}, options=config.compile_options(),
                         out=out, lse=lse)


def _spec(config: KeepsConfig, head_dim: int, causal: bool, variant: str):
    return common.census_spec(NAME, attention_fwd_v7, head_dim=head_dim, causal=causal, cfg=config,
                              extra={"HEAVIEST_FIRST": causal},
                              config_extra={"variant": variant, **config.describe()},
                              options=config.compile_options())


def census_specs():
    specs = [_spec(CONFIG, d, c, "all_keeps") for d in HEAD_DIMS for c in (False, True)]
    specs += [_spec(cfg, 128, True, name) for name, cfg in SWITCH_OFF.items()]
    specs.append(_spec(THREE_CTAS_PER_SM, 128, True, "max_registers_168"))
    return specs
