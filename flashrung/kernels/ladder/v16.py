"""ladder.v16 — the running row sum off the softmax's critical path (on the tensor core, or deferred).

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v15): v15's trip forms the running sum l of each row as every flash kernel
on mma.sync does — each thread adds its 16 exponentials of the row (15 dependent FADDs per row),
then the four lanes of the quad that share the row exchange partials (2 SHFL + 2 FADD per row).
The sum is needed only at the end of the tile, yet it sits in every trip's instruction stream
beside the exponentials. Two forms move it (``row_sum``):

* ``mma``: l is an n8 MMA accumulator and l += P·1 is one more mma.sync per k-step of PV — P's
  fragments are already in registers for PV, the ones are a constant B fragment — so the adds
  become 4 HMMA on a tensor pipe that is half idle (51% at config B, profile). Every column
  holds the row's sum; the tile's end reads one. The sum is of the 16-bit P that PV multiplies,
  so the normalization divides by the sum of the weights actually applied.
* ``deferred``: each thread keeps its own partial of the row (the quad's four partials live on,
  FA4's form; ``hopper.softmax.thread_partial_sum``) and the quad exchange happens once per tile.

``auto`` is ``deferred``. The tensor-core form has the shorter trip (census, sm_90a: d128
non-causal 594 -> 534 instructions, d64 404 -> 374, where deferred gives 566 and 395) and lost
wherever it was priced (H200, paired over v15): config A 0.9423 / 0.9420, d64 at config B's shape
0.9847 / 0.9819, config B 0.9669 / 0.9643 (there it also spills the copies' row offsets: 120 B,
10 local loads per trip). Deferred: config B 1.0377 / 1.0385, KEEP (docs/ladder.md for A and d64).
Prediction (before the H200): +1-4% where mma runs, about +0.5% at config B (deferred: the trip
only 3 instructions shorter, 563 -> 560). Measured: the reverse. A reading of the SASS order (not
profiled): the quad's shuffles feed the next trip's rescale, a chain the deferred form cuts; the
four HMMA of the mma form join PV's chain after the exponentials and add to it.
"""
from __future__ import annotations

import dataclasses

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from flashrung.kernels.ladder import common, v14, v15
from flashrung.kernels.hopper.softmax import thread_partial_sum
from flashrung.kernels.ladder.common import finalize, flash_state, mma_layout, mma_scores, store_tile

NAME = "ladder.v16"
PARENT = "ladder.v15"
LEVER = "the running row sum off the softmax's path: per-thread partials, one quad exchange per tile"
HEAD_DIMS = v14.HEAD_DIMS
EXP2 = gl.constexpr(True)


# How the running row sum l is formed (what each trip keeps off its softmax's critical path):
SUM_MMA = 0        # on the tensor core: l += P·1, an n8 accumulator fed P's fragments
SUM_DEFERRED = 1   # per-thread partials, quad-reduced once per tile (FA4's; hopper.softmax)
SUM_NAMES = {SUM_MMA: "mma", SUM_DEFERRED: "deferred"}
SUM_MMA_K = gl.constexpr(SUM_MMA)
ROW_SUM_COLS = gl.constexpr(8)   # one n8 MMA tile: the narrowest B operand mma.sync takes


@gluon.jit
def init_row_sum(BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, MMA: gl.constexpr, ROW_SUM: gl.constexpr):
    if ROW_SUM == SUM_MMA_K:
        l0 = gl.zeros([BLOCK_M, ROW_SUM_COLS], gl.float32, MMA)
    else:
        l0 = thread_partial_sum(gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA))
    return l0


@gluon.jit
def softmax_pv(s, tile_max, m_i, l_i, acc, qk_scale, v_smem, ROW_SUM: gl.constexpr):
    """Online softmax of ``s`` and O += P V, the row sum kept off the exponentials' chain.

    v15 (``common.softmax_update``) adds each thread's 16 scores of a row and then shuffles the
    partials across the quad that shares the row, every trip. ``SUM_MMA``: ``l_i`` is an n8
    accumulator and l += P·1 is one more mma.sync per k-step of PV on P's fragments, already in
    registers (a constant ones B fragment); every column holds the row's sum. ``SUM_DEFERRED``:
    ``l_i`` is the quad's per-thread partials ([rows, 4]), added to in-thread and reduced once
    per tile (:func:`row_sum`). ``tile_max`` is ``s``'s row max, formed by the caller (v16 here,
    ladder.v17 a trip early)."""
    p16, alpha, m_new, l_i = softmax_p(s, tile_max, m_i, l_i, qk_scale, v_smem.dtype, ROW_SUM)
    return pv(p16, alpha, acc, v_smem), m_new, l_i


@gluon.jit
def softmax_p(s, tile_max, m_i, l_i, qk_scale, DTYPE: gl.constexpr, ROW_SUM: gl.constexpr):
    """:func:`softmax_pv` up to its PV: (P in ``DTYPE`` as mma.sync's A operand, the rescale
    ``alpha``, the new running max, the updated row sum). ladder.v22 waits between the two halves."""
    MMA: gl.constexpr = s.type.layout
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    m_new = gl.maximum(m_i, tile_max * qk_scale)
    m_eff = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_eff[:, None])
    alpha = gl.exp2(m_i - m_eff)
    p16 = gl.convert_layout(p.to(DTYPE), DOT_A)
    if ROW_SUM == SUM_MMA_K:
        ones = gl.full([s.shape[1], ROW_SUM_COLS], 1.0, DTYPE, DOT_B)
        l_i = mma_v2(p16, ones, l_i * alpha[:, None])
    else:
        l_alpha = gl.convert_layout(alpha, gl.SliceLayout(1, l_i.type.layout))
        l_i = l_i * l_alpha[:, None] + gl.convert_layout(thread_partial_sum(p), l_i.type.layout)
    return p16, alpha, m_new, l_i


@gluon.jit
def pv(p16, alpha, acc, v_smem):
    """O = O·alpha + P V for one block, V's fragments loaded from ``v_smem``."""
    DOT_B: gl.constexpr = gl.DotOperandLayout(1, acc.type.layout, 2)
    return mma_v2(p16, v_smem.load(DOT_B), acc * alpha[:, None])


@gluon.jit
def row_sum(l_i, ROW: gl.constexpr, ROW_SUM: gl.constexpr):
    """l per row in the layout ``ROW``: any column of the n8 accumulator, or the quad's partials summed."""
    if ROW_SUM == SUM_MMA_K:
        out = gl.max(l_i, 1)
    else:
        out = gl.sum(l_i, 1)
    return gl.convert_layout(out, ROW)


@gluon.jit
def ahead_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base, stride_ks, stride_vs, offs_m,
               seqlen_k, causal_shift, qk_scale, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr, KV_COPY: gl.constexpr,
               MASKED: gl.constexpr, ROW_SUM: gl.constexpr, WHOLE: gl.constexpr = False):
    """v14's trip j: block j+KV_STAGES-1's copy, the wait for block j+1, S(j+1) (masked only if
    ``MASKED``), then softmax(j) and PV(j). ``WHOLE``: the copy without its row predicate
    (ladder.v18). Returns (s_next, m_i, l_i, acc)."""
    j = start_n // BLOCK_N
    v14.refill_and_wait(k_smem, v_smem, start_n, hi, k_base, v_base, stride_ks, stride_vs, BLOCK_N, HEAD_DIM,
                        KV_STAGES, KV_COPY, KV_STAGES - 2, WHOLE)  # block j+1 has landed
    s_next = mma_scores(q, k_smem.index((j + 1) % KV_STAGES), start_n + BLOCK_N, offs_m, seqlen_k,
                        causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, MASKED)
    acc, m_i, l_i = softmax_pv(s, gl.max(s, 1), m_i, l_i, acc, qk_scale, v_smem.index(j % KV_STAGES), ROW_SUM)
    gl.thread_barrier()  # every warp is done reading slot j before trip j+1's copy overwrites it
    return s_next, m_i, l_i, acc


@gluon.jit
def ring_prologue(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
                  stride_kh, stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k,
                  heads_q, group, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr, KV_COPY: gl.constexpr, ROW_SUM: gl.constexpr,
                  TAIL_HEAVIEST_FIRST: gl.constexpr = False):
    """A tile's start on v14's ring with this rung's row sum — shared by the rungs built on v16
    (v17, v18), which differ from it in their trips only: the ring's first blocks, the flash state,
    S(0) and v15's loop split. Returns (q, k_smem, v_smem, k_base, v_base, o_base, lse_base,
    start_m, hi, m_i, acc, offs_m, l_i, causal_shift, s, s_max, split, last_trip), in the order the rungs'
    bodies defined them: the loops' carried values keep their order, and the SASS its schedule."""
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)

    q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi = v14.ring_start(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        DOT_A, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, TAIL_HEAVIEST_FIRST)

    m_i, l_row, acc, offs_m = flash_state(start_m, BLOCK_M, HEAD_DIM, ROW, MMA)
    l_i = init_row_sum(BLOCK_M, BLOCK_N, MMA, ROW_SUM)
    causal_shift = seqlen_k - seqlen_q
    s = v14.first_scores(q, k_smem, offs_m, seqlen_k, causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL)
    s_max = gl.max(s, 1)     # v17's first row max; a rung that forms it in its trips leaves it dead
    split, last_trip = v15.split_trips(start_m, seqlen_q, seqlen_k, hi, BLOCK_N, IS_CAUSAL)
    return (q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi, m_i, acc, offs_m, l_i, causal_shift,
            s, s_max, split, last_trip)


@gluon.jit
def ring_epilogue(s, s_max, m_i, l_i, acc, qk_scale, v_smem, hi, o_base, lse_base, start_m, seqlen_q, stride_os,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr,
                  ROW_SUM: gl.constexpr):
    """A tile's end, shared as :func:`ring_prologue` is: the last block's softmax and PV, the drain
    of the trailing prefetches, the store. ``s_max`` is the last block's row max where the rung
    formed it a trip early (v17), or None: formed here, after the slot's index, in the order v16
    compiled to (the SASS of v16 and v18 is that of their bodies before this helper)."""
    ROW: gl.constexpr = gl.SliceLayout(1, mma_layout(gl.num_warps()))
    last = gl.maximum(gl.cdiv(hi, BLOCK_N), 1) - 1
    if s_max is None:
        tile_max = gl.max(s, 1)
    else:
        tile_max = s_max
    acc, m_i, l_i = softmax_pv(s, tile_max, m_i, l_i, acc, qk_scale, v_smem.index(last % KV_STAGES), ROW_SUM)
    async_copy.wait_group(0)  # drain the trailing zero-row prefetches before the CTA exits

    out, lse = finalize(acc, m_i, row_sum(l_i, ROW, ROW_SUM), EXP2)
    store_tile(o_base, lse_base, out, lse, seqlen_q - start_m, stride_os, BLOCK_M, HEAD_DIM)


@gluon.jit
def attention_fwd_v16(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr, QK_AHEAD: gl.constexpr, KV_COPY: gl.constexpr, ROW_SUM: gl.constexpr,
):
    attend_tile(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
                qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, ROW_SUM, False)


@gluon.jit
def attend_tile(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
                qk_scale, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr, KV_COPY: gl.constexpr, ROW_SUM: gl.constexpr,
                TAIL_HEAVIEST_FIRST: gl.constexpr):
    """This program's tile, whole: v16's start, its unmasked then masked trips, its end. Shared
    with v19, which changes only which tile a program takes (``TAIL_HEAVIEST_FIRST``)."""
    (q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi, m_i, acc, offs_m, l_i, causal_shift, s, _,
     split, last_trip) = ring_prologue(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, ROW_SUM, TAIL_HEAVIEST_FIRST)
    for start_n in range(0, split, BLOCK_N):
        s, m_i, l_i, acc = ahead_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base, stride_ks,
                                      stride_vs, offs_m, seqlen_k, causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL,
                                      BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, False, ROW_SUM)
    for start_n in range(split, last_trip, BLOCK_N):
        s, m_i, l_i, acc = ahead_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base, stride_ks,
                                      stride_vs, offs_m, seqlen_k, causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL,
                                      BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY, True, ROW_SUM)
    ring_epilogue(s, None, m_i, l_i, acc, qk_scale, v_smem, hi, o_base, lse_base, start_m, seqlen_q, stride_os,
                  HEAD_DIM, BLOCK_M, BLOCK_N, KV_STAGES, ROW_SUM)


def unsupported_reason(problem) -> str | None:
    return v14.unsupported_reason(problem)


def row_sum_form(head_dim: int, causal: bool, choice: str = "auto") -> int:
    """The row sum's form for a launch: ``auto`` is deferred at every head dim and mask (the
    tensor-core form lost at each of configs A, B and d64; module docstring)."""
    if choice != "auto":
        return {name: form for form, name in SUM_NAMES.items()}[choice]
    return SUM_DEFERRED


@dataclasses.dataclass(frozen=True)
class RowSumConfig(v14.AheadConfig):
    """v15's tile and ring, and the row sum's form: ``auto`` (:func:`row_sum_form`), ``mma`` or
    ``deferred`` (``impl="ladder.v16@row_sum=deferred"``: each form priced alone)."""

    row_sum: str = "auto"

    def __post_init__(self):
        super().__post_init__()
        if self.row_sum not in ("auto", *SUM_NAMES.values()):
            raise ValueError(f"row_sum must be one of auto, {', '.join(SUM_NAMES.values())}, got {self.row_sum!r}")


CONFIG = RowSumConfig(**{f.name: getattr(v14.CONFIG, f.name) for f in dataclasses.fields(v14.CONFIG)})


def config_with(problem, overrides: dict) -> RowSumConfig:
    """:data:`CONFIG` with ``overrides`` applied (``{"row_sum": "deferred"}``)."""
    from flashrung.dispatch import apply_overrides

    return apply_overrides(NAME, CONFIG, overrides, keys=("row_sum",))


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    return v14.launch_on_ring(attention_fwd_v16, q, k, v, causal, softmax_scale, config=config, out=out, lse=lse,
                              constexprs={"ROW_SUM": row_sum_form(q.shape[-1], causal, config.row_sum)},
                              needs_ahead=NAME)


def census_specs():
    # K and V with one row stride (what the bench and the gate pass); then d128's copy form for K
    # and V laid out apart
    cases = [(d, c, v14.copy_form(d, True), rs) for d in HEAD_DIMS for c in (False, True) for rs in SUM_NAMES]
    cases += [(128, c, v14.copy_form(128, False), row_sum_form(128, c)) for c in (False, True)]
    return [common.census_spec(NAME, attention_fwd_v16, head_dim=d, causal=c, cfg=CONFIG,
                               extra={"KV_COPY": form, "ROW_SUM": rs},
                               config_extra={"kv_stages": CONFIG.kv_stages, "kv_copy": v14.COPY_NAMES[form],
                                             "row_sum": SUM_NAMES[rs]})
            for d, c, form, rs in cases]
