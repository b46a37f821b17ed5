"""Numerics of the Hopper forward, in one place.

* One scale fold: scores are multiplied by ``softmax_scale · log2(e)`` so every exponential is a
  single ``exp2`` (``MUFU.EX2``), fused with the max subtraction into one FFMA per element.
* One online update: running max ``m`` (in the folded log2 domain), running sum ``l``, and the
  factor ``alpha`` that moves the output accumulator to the new max.
  The scores of one K/V tile arrive as a tuple of parts — one per TMA box of keys, so two with
  ``extra_keys`` — and the row max, the exponentials and the row sum cover every part.
* One fully-masked-row guard: a row whose max is still ``-inf`` subtracts 0 instead, so it keeps
  ``p = 0`` and ``alpha = 1`` rather than NaN.
* The LSE is returned in natural log: ``lse = (m + log2 l) · ln 2``; a row that saw no key has
  ``l = 0``, output 0 and ``lse = -inf``.
* Optional conditional rescaling (FA4, seed 001 0x09): ``m`` is a *retained reference*, moved to
  the row's running max only when that max grew by more than a threshold τ (log2 domain). ``l`` and O stay in the retained frame, so ``O / l`` and the LSE
  ``(m + log2 l) · ln 2`` are exact as before; unnormalized probabilities are bounded by ``2^τ``
  (τ = 8: 256, far inside bf16 and fp16). Each row decides for itself; one warpgroup-wide
  reduction decides whether any row moved, so the branch that skips the O rescale is uniform.
* Optional exp2 split (FA4, seed 001 0x09): one exponential in ``N`` is evaluated on the FMA
  pipe instead of MUFU, by Cody–Waite range reduction and FA4's degree-3 polynomial
  (``flashrung.model.exp2poly`` is its reference: max relative error 8.77e-5 in FP32).
* Row reductions (max, sum) as a chain or as a tree. A chain folds a row's 2·N/8 values per
  thread one after another: N/4 − 1 dependent ``FMNMX``/``FADD``, latency no other warp of the
  warpgroup hides while the next GEMM waits for this P. The tree halves the row while both halves
  sit in the same thread (every column bit above the n8 group is a register bit of the wgmma
  accumulator), so each level is independent instructions and the depth is log2(N/8) + 1 before
  the quad's two shuffles. Same instruction count, no data movement (SASS census).
* Optional deferred row sum (FA4): the running sum ``l`` is kept per thread — one partial per lane
  of the quad that shares a row in the wgmma accumulator, a ``[rows, 4]`` tensor — and reduced
  across the quad once per tile of rows (:func:`row_sum_total`), not every K/V tile: 4 shuffles
  and 4 adds fewer per K/V tile and thread (SASS census). Every partial is rescaled by the same
  ``alpha``, so the total is the same sum in another order. The mode follows from ``l``'s rank.
* Optional softcap (flash-attn's ``softcap · tanh(scale · s / softcap)``, :func:`capped`): applied to
  the raw scores as they leave their wgmma and returned in the same units, so everything above
  (the scale fold, the mask, the online update) is unchanged; two more MUFU operations per score.
* Optional packed conversion of P to 16 bits: ``cvt.rn.{bf16,f16}x2.f32`` on adjacent pairs of the
  accumulator layout, in place of the per-element conversions the compiler emits once P is in the
  wgmma operand layout (which ptxas then repairs with one ``PRMT`` per register).
"""
from __future__ import annotations

import math
import struct

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.model import exp2poly

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
_LN_2 = gl.constexpr(LN_2)


def _f32_hex(x: float) -> str:
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", x))[0]


def _emulated_exp2_ptx(out: str, x: str, k: int) -> str:
    """PTX for ``out = 2^x`` on the FP32/ALU pipes (FA4's steps; seed 001 0x09).

    x ← max(x, −127); t = x + C rounded toward −∞ (C = 2^23 + 2^22 leaves floor(x) in t's low
    mantissa bits); f = x − (t − C) ∈ [0, 1); p(f) by three FMAs; 2^x = p(f) with floor(x) added
    into the exponent field (t's bits shifted left by 23). No MUFU, no F2I/FRND.
    """
    c0, c1, c2, c3 = (_f32_hex(c) for c in exp2poly.COEFFS)
    magic = _f32_hex(exp2poly.MAGIC)
    return (f"mov.b32 xf{k}, {x}; max.f32 xf{k}, xf{k}, {_f32_hex(exp2poly.CLAMP_LO)}; "
            f"add.rm.f32 tf{k}, xf{k}, {magic}; sub.f32 nf{k}, tf{k}, {magic}; sub.f32 ff{k}, xf{k}, nf{k}; "
            f"fma.rn.f32 pf{k}, ff{k}, {c3}, {c2}; fma.rn.f32 pf{k}, pf{k}, ff{k}, {c1}; "
            f"fma.rn.f32 pf{k}, pf{k}, ff{k}, {c0}; mov.b32 tb{k}, tf{k}; shl.b32 tb{k}, tb{k}, 23; "
            f"mov.b32 pb{k}, pf{k}; add.s32 {out}, pb{k}, tb{k};")


def _exp2_split_asm(every: int) -> str:
    """Inline PTX over ``every`` adjacent exponentials: the last on the FMA pipe, the rest MUFU."""
    k = every - 1
    lines = [f".reg .f32 xf{k}, tf{k}, nf{k}, ff{k}, pf{k}, mf;", f".reg .b32 tb{k}, pb{k};"]
    for i in range(k):
        lines.append(f"mov.b32 mf, ${every + i}; ex2.approx.ftz.f32 mf, mf; mov.b32 ${i}, mf;")
    lines.append(_emulated_exp2_ptx(f"${k}", f"${2 * every - 1}", k))
    return "{ " + " ".join(lines) + " }"


def _constraints(every: int) -> str:
    return ",".join(["=r"] * every + ["r"] * every)


# Triton evaluates these at trace time; one compiled variant per split
_SPLIT2_ASM, _SPLIT2_CON = gl.constexpr(_exp2_split_asm(2)), gl.constexpr(_constraints(2))
_SPLIT4_ASM, _SPLIT4_CON = gl.constexpr(_exp2_split_asm(4)), gl.constexpr(_constraints(4))
_SPLIT8_ASM, _SPLIT8_CON = gl.constexpr(_exp2_split_asm(8)), gl.constexpr(_constraints(8))
_SPLIT16_ASM, _SPLIT16_CON = gl.constexpr(_exp2_split_asm(16)), gl.constexpr(_constraints(16))


@gluon.jit
def exp2_split(x, EVERY: gl.constexpr):
    """``2^x`` elementwise (FP32); with ``EVERY = N > 0`` one element in N is computed on the FMA
    pipe (the MUFU pipe, 16 results/cycle/SM, is what the softmax of a d = 64 tile waits on)."""
    if EVERY == 2:
        y = gl.inline_asm_elementwise(_SPLIT2_ASM, _SPLIT2_CON, [x], dtype=gl.float32, is_pure=True, pack=2)
    elif EVERY == 4:
        y = gl.inline_asm_elementwise(_SPLIT4_ASM, _SPLIT4_CON, [x], dtype=gl.float32, is_pure=True, pack=4)
    elif EVERY == 8:
        y = gl.inline_asm_elementwise(_SPLIT8_ASM, _SPLIT8_CON, [x], dtype=gl.float32, is_pure=True, pack=8)
    elif EVERY == 16:
        y = gl.inline_asm_elementwise(_SPLIT16_ASM, _SPLIT16_CON, [x], dtype=gl.float32, is_pure=True, pack=16)
    else:
        y = gl.exp2(x)
    return y


def _warp_any_asm() -> str:
    """A row flag's warp-wide vote: each thread holds two rows of the accumulator (its lane's row
    and the row 8 below), so one ``or`` of the two and one ``vote.any`` give every lane the same
    answer — the warp's, with no shared memory and no barrier."""
    return ("{ .reg .pred p, q; setp.ne.b32 p, $2, 0; setp.ne.b32 q, $3, 0; or.pred p, p, q; "
            "vote.sync.any.pred p, p, 0xffffffff; selp.b32 $0, 1, 0, p; mov.b32 $1, $0; }")


def _rescale_by_warp_asm(pack: int) -> str:
    """O ← O · alpha over all ``pack`` accumulator elements a thread holds, behind one warp-uniform
    branch on the warp's vote (operand ``3·pack``; every lane holds the same value): a warp none of
    whose 16 rows moved its reference skips the multiplies. The accumulator's inputs are tied to
    the outputs (:func:`_rescale_by_warp_constraints`), so the skipping path's moves copy each
    register onto itself and compile to nothing (census)."""
    acc0, alpha0, vote0 = pack, 2 * pack, 3 * pack
    keep = " ".join(f"mov.f32 ${i}, ${acc0 + i};" for i in range(pack))
    scale = " ".join(f"mul.f32 ${i}, ${acc0 + i}, ${alpha0 + i};" for i in range(pack))
    return ("{ .reg .pred p; setp.ne.b32 p, $" + str(vote0) + ", 0; @p bra.uni RESCALE_O; " + keep
            + " bra.uni RESCALED_O; RESCALE_O: " + scale + " RESCALED_O: }")


def _rescale_by_warp_constraints(pack: int) -> str:
    # each accumulator input tied to its output register ("0", "1", …): the block rewrites O in
    # place, so no second copy of the accumulator is ever live (a free second copy spilled
    # 0.8-1.5 KB in the mma.sync ladder's 255 registers)
    return ",".join(["=f"] * pack + [str(i) for i in range(pack)] + ["f"] * pack + ["r"] * pack)


# one variant per accumulator size: head_dim / 2 fp32 elements per thread (64 rows × d over 128 threads)
_WARP_ANY_ASM, _WARP_ANY_CON = gl.constexpr(_warp_any_asm()), gl.constexpr("=r,=r,r,r")
_RESCALE32_ASM, _RESCALE32_CON = gl.constexpr(_rescale_by_warp_asm(32)), gl.constexpr(_rescale_by_warp_constraints(32))
_RESCALE64_ASM, _RESCALE64_CON = gl.constexpr(_rescale_by_warp_asm(64)), gl.constexpr(_rescale_by_warp_constraints(64))
_RESCALE128_ASM, _RESCALE128_CON = (gl.constexpr(_rescale_by_warp_asm(128)),
                                    gl.constexpr(_rescale_by_warp_constraints(128)))


@gluon.jit
def warp_any(flags):
    """``flags`` (int32, one per row, in the accumulator's row layout) as the vote of each warp.
    Not pure: a warp-collective must not be moved or merged by the compiler."""
    return gl.inline_asm_elementwise(_WARP_ANY_ASM, _WARP_ANY_CON, [flags], dtype=gl.int32, is_pure=False, pack=2)


@gluon.jit
def rescale_by_warp(acc, alpha, vote):
    """``acc · alpha`` (alpha per row, broadcast over the row) where the warp's ``vote`` (per row,
    from :func:`warp_any`) is set; ``acc`` as it is elsewhere, without a multiply (FA4's per-warp
    skip of the O rescale, seed 001 0x09). One inline-PTX block over a thread's whole accumulator,
    so the branch is taken once per warp and step."""
    # one block per thread needs its element count: 64 rows over a warpgroup's 128 threads
    gl.static_assert(acc.shape[0] == 64 and gl.num_warps() == 4, "rescale_by_warp: a 64-row, 4-warp accumulator")
    a = gl.broadcast(gl.expand_dims(alpha, 1), acc)[0]
    v = gl.broadcast(gl.expand_dims(vote, 1), acc)[0]
    PACK: gl.constexpr = acc.shape[1] // 2
    if PACK == 32:
        out = gl.inline_asm_elementwise(_RESCALE32_ASM, _RESCALE32_CON, [acc, a, v], dtype=gl.float32,
                                        is_pure=True, pack=32)
    elif PACK == 64:
        out = gl.inline_asm_elementwise(_RESCALE64_ASM, _RESCALE64_CON, [acc, a, v], dtype=gl.float32,
                                        is_pure=True, pack=64)
    else:
        out = gl.inline_asm_elementwise(_RESCALE128_ASM, _RESCALE128_CON, [acc, a, v], dtype=gl.float32,
                                        is_pure=True, pack=128)
    return out


def fold_scale(softmax_scale: float) -> float:
    """The factor applied to raw ``q·k`` scores: ``softmax_scale · log2(e)``."""
    return float(softmax_scale) * LOG2_E


def softcap_factors(softcap: float, softmax_scale: float) -> tuple[float, float]:
    """``(softcap_pre, softcap_post)`` of :func:`capped` for flash-attn's ``softcap`` (> 0):
    ``2·log2(e)·scale / softcap`` and ``softcap / scale``; ``(0, 0)`` without a cap (never read)."""
    if not softcap:
        return 0.0, 0.0
    return 2.0 * LOG2_E * float(softmax_scale) / softcap, softcap / float(softmax_scale)


@gluon.jit
def capped(s, softcap_pre, softcap_post):
    """flash-attn's softcap, ``softcap · tanh(scale · s / softcap)``, on raw ``q·k`` products ``s``
    and returned in their units (divided by the scale again): the scale fold, the mask and the
    online softmax that follow are the uncapped kernel's, unchanged.

    The tanh as ``1 − 2 / (2^(2x·log2 e) + 1)``: one ``MUFU.EX2`` and one ``MUFU.RCP`` per score (a
    plain division adds a range check, three multiplies and a select to each: census), each good
    to about an ulp, so the capped score is off by about ``softcap · 1e-7`` — where
    ``tanh.approx.f32`` (2^-11 relative) would move a score of 30 by 0.015, a 1.5% error in its
    exponential. Exactly ±1 at both infinities (the reciprocal of inf is 0)."""
    r = gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [gl.exp2(s * softcap_pre) + 1.0],
                                  dtype=gl.float32, is_pure=True, pack=1)
    return softcap_post - (2.0 * softcap_post) * r


@gluon.jit
def mask_scores(s, rows, cols, seqlen_q, seqlen_k, IS_CAUSAL: gl.constexpr):
    """Scores of keys ``>= Sk`` (and, if causal, right of the bottom-right diagonal) → ``-inf``.

    ``rows``/``cols`` are absolute query/key indices in the slice layouts of ``s``.
    """
    keep = gl.expand_dims(cols, 0) < seqlen_k
    if IS_CAUSAL:
        keep = keep & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + (seqlen_k - seqlen_q))
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def first_visible_key(rows, key0, seqlen_q, seqlen_k, window_left):
    """Per row, the offset from ``key0`` of the first key a sliding window lets the row see: row ``i``
    sees no key before ``i + Sk − Sq − window_left`` (flash-attn's ``window_size[0]``, bottom-right
    aligned as the causal mask). The window's lower bound in :func:`last_visible_key`'s form, for
    :func:`mask_scores_by_bounds`."""
    return rows + (seqlen_k - seqlen_q - window_left - key0)


@gluon.jit
def last_visible_key(rows, key0, seqlen_q, seqlen_k, IS_CAUSAL: gl.constexpr, diag_shift=0):
    """Per row, the offset from ``key0`` of the last key the row may see: ``Sk - 1``, and if causal
    at most the bottom-right diagonal ``row + Sk - Sq`` (negative: the row sees none of the tile),
    moved ``diag_shift`` keys right (a sliding window's right side: ``window_size[1]``).

    :func:`mask_scores`' two conditions folded into one bound per row, so that
    :func:`mask_scores_by_bound` pays one compare and one select per score. ptxas compiles
    ``mask_scores`` to about 3 compares and 4 selects per pair of scores (the key-length bound and
    the diagonal apart); with absolute key indices against a per-row bound LLVM rewrote the
    compares into bit arithmetic instead (census). Against a constant offset per register it does
    not."""
    last = gl.zeros_like(rows) + (seqlen_k - 1 - key0)
    if IS_CAUSAL:
        last = gl.minimum(last, rows + (seqlen_k - seqlen_q - key0 + diag_shift))
    return last


@gluon.jit
def mask_scores_by_bound(s, offs, last):
    """Scores whose key offset ``offs`` (from the tile's first key, an ``arange`` in the column
    slice of ``s``) is past the row's ``last`` (:func:`last_visible_key`) → ``-inf``.

    ``offs <= last`` is evaluated as ``high <= last - low``, split at one n8 group of the wgmma
    accumulator (``TREE_LEAF_COLS``: a thread holds columns 8·j + 2·(lane % 4) + e, so the bits
    below come from the lane and the pair element, those above from the register): ``high``
    folds to an immediate of each compare, and ``last - low`` takes two values per row
    and thread. Compared whole, the offsets are loop-invariant registers (lane bits OR'd with a
    constant) that LLVM hoists out of the K/V loop and ptxas keeps live across it: 12-14 LDL/STL
    in the masked loop of d64's 192-row tile at 160 registers (census)."""
    low = offs % _N8_COLS
    high = offs - low
    return gl.where(gl.expand_dims(high, 0) <= gl.expand_dims(last, 1) - gl.expand_dims(low, 0), s, float("-inf"))


@gluon.jit
def mask_scores_by_bounds(s, offs, first, last):
    """Scores whose key offset ``offs`` lies outside ``[first, last]`` of its row → ``-inf``: the
    sliding window's lower bound (:func:`first_visible_key`) beside :func:`mask_scores_by_bound`'s
    upper one, split at the same n8 group so that each compare's ``high`` is an immediate and each
    bound ``- low`` two values per row and thread. Against absolute key indices (``key0 + offs``
    and a per-row bound) the lower bound cost a compare and select of its own per score and the
    offsets stayed live across the loop: d128 causal's masked loops grew 619 → 980 instructions,
    d64 causal's spilled 3-6 ``LDL``/``STL`` (census)."""
    low = gl.expand_dims(offs % _N8_COLS, 0)
    high = gl.expand_dims(offs, 0) - low
    keep = (high <= gl.expand_dims(last, 1) - low) & (high >= gl.expand_dims(first, 1) - low)
    return gl.where(keep, s, float("-inf"))


# Columns of one n8 group of the wgmma accumulator: 2 registers × 4 lanes of a quad. Above it every
# column bit is a register bit, so halving a row there moves no data between threads.
TREE_LEAF_COLS = 8


@gluon.constexpr_function
def _tree_levels(cols):
    levels = 0
    while cols > TREE_LEAF_COLS and cols % 2 == 0:
        cols //= 2
        levels += 1
    return levels


@gluon.jit
def _reduce_cols(x, MAX: gl.constexpr):
    if MAX:
        out = gl.max(x, 1)
    else:
        out = gl.sum(x, 1)
    return out


@gluon.jit
def _row_reduce(x, TREE: gl.constexpr, MAX: gl.constexpr):
    """Max or sum over a row: a chain (Triton's in-thread order) or, with ``TREE``, halving first.

    The result is correct for any layout; only in the wgmma accumulator layout is every halving
    free of shuffles. It comes back in ``SliceLayout(1, layout of x)`` either way."""
    if TREE:
        rows_layout: gl.constexpr = gl.SliceLayout(1, x.type.layout)
        for _ in gl.static_range(_tree_levels(x.shape[1])):
            x = _reduce_cols(x.reshape([x.shape[0], 2, x.shape[1] // 2]), MAX)
        out = gl.convert_layout(_reduce_cols(x, MAX), rows_layout)
    else:
        out = _reduce_cols(x, MAX)
    return out


# The ``TREE`` constexpr of the reductions below: Triton's chain, the halving tree (max and sum),
# or FA4's four interleaved chains (max only; the sum stays a chain)
REDUCE_CHAIN = 0
REDUCE_TREE = 1
REDUCE_FOUR_MAX_CHAINS = 2
_REDUCE_TREE = gl.constexpr(REDUCE_TREE)
_REDUCE_FOUR_MAX_CHAINS = gl.constexpr(REDUCE_FOUR_MAX_CHAINS)


def softmax_reduce_form(cfg) -> int:
    """The ``TREE`` constexpr for a configuration's ``tree_reduce`` / ``four_max_chains``."""
    if cfg.four_max_chains:
        return REDUCE_FOUR_MAX_CHAINS
    return REDUCE_TREE if cfg.tree_reduce else REDUCE_CHAIN


@gluon.jit
def _four_chain_max(x):
    """FA4's sm90 row max: column ``16h + 8g + 2t + r`` of the accumulator is register pair ``r`` of
    n8 group ``2h + g`` in lane ``t``, so folding over ``h`` leaves four independent running maxima
    per thread and row (one per ``g, r``), then two in-thread steps and the quad's shuffles."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, x.type.layout)
    parts = x.reshape([x.shape[0], x.shape[1] // (2 * _N8_COLS), 2, _QUAD_LANES, _PAIR])
    chains = gl.max(parts, 1)
    return gl.convert_layout(gl.max(gl.max(gl.max(chains, 3), 1), 1), rows_layout)


@gluon.jit
def row_max(x, TREE: gl.constexpr):
    """``max(x, 1)``: a chain, by halving (:func:`_row_reduce`), or FA4's four chains."""
    if TREE == _REDUCE_FOUR_MAX_CHAINS:
        out = _four_chain_max(x)
    else:
        out = _row_reduce(x, TREE == _REDUCE_TREE, True)
    return out


@gluon.jit
def row_sum(x, TREE: gl.constexpr):
    """``sum(x, 1)``; pairwise by halving only for the tree form (:func:`_row_reduce`)."""
    return _row_reduce(x, TREE == _REDUCE_TREE, False)


# Lanes of the quad that share one accumulator row (the n8 group's 8 columns: 2 registers × 4 lanes)
QUAD_LANES = 4
_QUAD_LANES = gl.constexpr(QUAD_LANES)
_N8_COLS = gl.constexpr(TREE_LEAF_COLS)
_PAIR = gl.constexpr(TREE_LEAF_COLS // QUAD_LANES)


@gluon.jit
def thread_partial_sum(p):
    """Per-thread partial row sums of a wgmma accumulator tile ``p`` [rows, N]: ``[rows, 4]``, one
    per lane of the quad (column ``8g + 2t + r`` lives in lane ``t``'s register pair ``r`` of group
    ``g``; summing ``g`` and ``r`` stays inside each thread)."""
    cols: gl.constexpr = p.shape[1]
    parts = p.reshape([p.shape[0], cols // _N8_COLS, _QUAD_LANES, _PAIR])
    return gl.sum(gl.sum(parts, 3), 1)


@gluon.jit
def init_row_sum(rows: gl.constexpr, cols: gl.constexpr, s_layout: gl.constexpr, DEFERRED: gl.constexpr):
    """The running sum ``l`` at the start of a tile: ``[rows]`` in the rows' slice layout or, deferred,
    ``[rows, 4]`` per-thread partials (see :func:`thread_partial_sum`)."""
    if DEFERRED:
        l0 = thread_partial_sum(gl.zeros([rows, cols], gl.float32, s_layout))
    else:
        l0 = gl.zeros([rows], gl.float32, gl.SliceLayout(1, s_layout))
    return l0


@gluon.jit
def row_sum_total(l_i):
    """``l`` per row: the quad reduction of deferred partials, or ``l_i`` itself."""
    if len(l_i.shape) == 2:
        out = gl.sum(l_i, 1)
    else:
        out = l_i
    return out


@gluon.jit
def _to_rows_of(x, like):
    """Row vector ``x`` in the row layout of ``like`` (the same rows per thread in every wgmma
    accumulator of a warpgroup, whatever its N)."""
    return gl.convert_layout(x, gl.SliceLayout(1, like.type.layout))


@gluon.jit
def _parts_row_max(parts, TREE: gl.constexpr):
    m = row_max(parts[0], TREE)
    if len(parts) == 2:
        m = gl.maximum(m, _to_rows_of(row_max(parts[1], TREE), parts[0]))
    return m


@gluon.jit
def _scaled(s, qk_scale_log2):
    # c <= 0 would turn a masked -inf into +inf (or NaN): scale first, then re-mask
    return gl.where(s == float("-inf"), float("-inf"), s * qk_scale_log2)


@gluon.jit
def _raised_max(m_i, m_tile, MARGIN: gl.constexpr):
    """The new running max from the tile's: ``max(m_i, m_tile + MARGIN)`` (:func:`softmax_row_max`'s
    ``MARGIN``; 0 adds nothing to the build)."""
    if MARGIN != 0.0:
        m_tile = m_tile + MARGIN
    return gl.maximum(m_i, m_tile)


@gluon.jit
def softmax_row_max(parts, m_i, qk_scale_log2, SCALE_POSITIVE: gl.constexpr, TREE: gl.constexpr = False,
                    MARGIN: gl.constexpr = 0.0):
    """First phase of :func:`online_softmax`: the new running max (log2 domain).

    ``parts`` are the raw scores of one K/V tile: a tuple of one ``[rows, N]`` tensor, or of two
    when the tile holds a second box of keys (``extra_keys``); ``m_i`` is in the row layout of the
    first. Returns ``(t, c, m_new)``: the exponent of score ``i`` of part ``k`` is
    ``t[k][i]·c − m_new``. Split out so a schedule may wait for the previous PV between the max and
    the exponentials (FA4's order).

    ``MARGIN`` (log2 units): the tile's max enters raised by it, ``m_new = max(m_i, max(t·c) +
    MARGIN)``, so this step's P stay at or below 2^-MARGIN — head room for later steps that keep
    the reference (the frozen row max) when P's operand is fp16, whose range ends at 2^16. Any
    reference at or above the row's max gives the same softmax; only P's rounding moves.
    """
    if SCALE_POSITIVE:
        # max(s)·c == max(s·c) for c > 0: one multiply per row instead of one per score, and
        # the scale folds into the exp2 argument as one FFMA per score
        m_tile = _parts_row_max(parts, TREE) * qk_scale_log2
        t = parts
        c = qk_scale_log2
    else:
        if len(parts) == 2:
            t = (_scaled(parts[0], qk_scale_log2), _scaled(parts[1], qk_scale_log2))
        else:
            t = (_scaled(parts[0], qk_scale_log2),)
        m_tile = _parts_row_max(t, TREE)
        c = 1.0
    return t, c, _raised_max(m_i, m_tile, MARGIN)


@gluon.jit
def first_part_row_max(s0, qk_scale_log2, TREE: gl.constexpr = False):
    """The first box's share of :func:`softmax_row_max` (positive scale), taken on its own: a
    schedule that waits for the second box's QK after it runs this under that product."""
    return row_max(s0, TREE) * qk_scale_log2


@gluon.jit
def staged_row_max(parts, m_first, m_i, qk_scale_log2, TREE: gl.constexpr = False, MARGIN: gl.constexpr = 0.0):
    """:func:`softmax_row_max` of two parts (positive scale) given the first's
    :func:`first_part_row_max`: the same ``(t, c, m_new)``, bit for bit (a positive scale commutes
    with the max and its rounding), ``MARGIN`` as there."""
    m_tile = gl.maximum(m_first, _to_rows_of(row_max(parts[1], TREE), parts[0]) * qk_scale_log2)
    return parts, qk_scale_log2, _raised_max(m_i, m_tile, MARGIN)


@gluon.jit
def _exp_part(t, c, m_safe, EXP2_FMA_EVERY: gl.constexpr):
    return exp2_split(t * c - gl.expand_dims(_to_rows_of(m_safe, t), 1), EXP2_FMA_EVERY)


@gluon.jit
def _sum_into(l_i, p, TREE: gl.constexpr):
    """``p``'s contribution to the running sum, in ``l_i``'s form (per-thread partials or rows)."""
    if len(l_i.shape) == 2:
        out = gl.convert_layout(thread_partial_sum(p), l_i.type.layout)
    else:
        out = gl.convert_layout(row_sum(p, TREE), l_i.type.layout)
    return out


@gluon.jit
def _safe_max(m):
    """The max the exponentials subtract: 0 for a row with no visible key yet (``-inf``), so its
    exponentials are ``exp2(-inf) = 0`` rather than NaN."""
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def rescale_factor(m_i, m_new):
    """``alpha``: what O and the running sum are multiplied by when the row max moves from
    ``m_i`` to ``m_new`` (log2 domain; 0 before a row's first visible key, as :func:`_safe_max`)."""
    return gl.exp2(m_i - _safe_max(m_new))


@gluon.jit
def rescaled_sum(l_i, alpha):
    """The running sum times ``alpha`` (per row): ``l_i`` per row, or per-thread partials
    ``[rows, k]`` (a deferred sum, or the tensor pipe's ``[64, 8]`` accumulator)."""
    if len(l_i.shape) == 2:
        out = l_i * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, l_i.type.layout)), 1)
    else:
        out = l_i * alpha
    return out


@gluon.jit
def softmax_exp(t, c, m_i, m_new, l_i, EXP2_FMA_EVERY: gl.constexpr = 0, TREE: gl.constexpr = False,
                SUM: gl.constexpr = True):
    """Second phase of :func:`online_softmax`: ``(p, alpha, l_new)`` for the max ``m_new``; ``p`` is a
    tuple like ``t``. Without ``SUM`` the running sum is kept elsewhere (a wgmma of P against a
    tile of ones beside PV, rescaled with O by ``alpha``) and ``l_i`` comes back untouched."""
    m_safe = _safe_max(m_new)
    p0 = _exp_part(t[0], c, m_safe, EXP2_FMA_EVERY)
    alpha = rescale_factor(m_i, m_new)
    if SUM:
        l_new = rescaled_sum(l_i, alpha) + _sum_into(l_i, p0, TREE)
    else:
        l_new = l_i
    if len(t) == 2:
        p1 = _exp_part(t[1], c, m_safe, EXP2_FMA_EVERY)
        if SUM:
            l_new = l_new + _sum_into(l_i, p1, TREE)
        p = (p0, p1)
    else:
        p = (p0,)
    return p, alpha, l_new


@gluon.jit
def _exp_parts_sum(t, c, m_safe, EXP2_FMA_EVERY: gl.constexpr):
    """The exponentials of a tuple of one or two parts and their per-thread partial row sums
    (:func:`thread_partial_sum`, in the first part's form)."""
    p0 = _exp_part(t[0], c, m_safe, EXP2_FMA_EVERY)
    partial = thread_partial_sum(p0)
    if len(t) == 2:
        p1 = _exp_part(t[1], c, m_safe, EXP2_FMA_EVERY)
        partial = partial + gl.convert_layout(thread_partial_sum(p1), partial.type.layout)
        p = (p0, p1)
    else:
        p = (p0,)
    return p, partial


@gluon.jit
def softmax_exp_frozen(t, c, m_i, l_i, EXP2_FMA_EVERY: gl.constexpr = 0, TREE: gl.constexpr = False):
    """:func:`softmax_exp` against a reference ``m_i`` the step leaves as it is: ``(p, l_new)`` with
    ``l_new = l_i`` plus the tile's exponentials — no ``alpha``, so nothing to rescale. Exact while
    ``t·c − m_i`` stays inside fp32's range (the caller's guarantee)."""
    m_safe = _safe_max(m_i)
    p0 = _exp_part(t[0], c, m_safe, EXP2_FMA_EVERY)
    l_new = l_i + _sum_into(l_i, p0, TREE)
    if len(t) == 2:
        p1 = _exp_part(t[1], c, m_safe, EXP2_FMA_EVERY)
        l_new = l_new + _sum_into(l_i, p1, TREE)
        p = (p0, p1)
    else:
        p = (p0,)
    return p, l_new


@gluon.jit
def softmax_exp_ahead(t, c, m_i, m_new, EXP2_FMA_EVERY: gl.constexpr = 0):
    """:func:`softmax_exp` of the parts of a tile taken first, their row sums left per thread:
    ``(p, alpha, partial)``. A schedule waits for the previous PV between this and
    :func:`softmax_exp_behind`, which takes the rest of the tile and finishes the running sum.
    Two partial reductions and one quad reduction, as the whole tile's sum has."""
    m_safe = _safe_max(m_new)
    p, partial = _exp_parts_sum(t, c, m_safe, EXP2_FMA_EVERY)
    return p, gl.exp2(m_i - m_safe), partial


@gluon.jit
def softmax_exp_behind(t, c, m_new, l_i, alpha, partial, EXP2_FMA_EVERY: gl.constexpr = 0):
    """The rest of the tile after :func:`softmax_exp_ahead`: ``(p, l_new)``, ``l_new = l_i·alpha``
    plus the whole tile's exponentials (``l_i`` per row or deferred per-thread partials)."""
    p, rest = _exp_parts_sum(t, c, _safe_max(m_new), EXP2_FMA_EVERY)
    partial = partial + gl.convert_layout(rest, partial.type.layout)
    if len(l_i.shape) == 2:
        tile_sum = gl.convert_layout(partial, l_i.type.layout)
    else:
        tile_sum = gl.convert_layout(gl.sum(partial, 1), l_i.type.layout)
    return p, rescaled_sum(l_i, alpha) + tile_sum


@gluon.jit
def online_softmax(s, m_i, l_i, qk_scale_log2, SCALE_POSITIVE: gl.constexpr, EXP2_FMA_EVERY: gl.constexpr = 0,
                   TREE: gl.constexpr = False, SUM: gl.constexpr = True, MARGIN: gl.constexpr = 0.0):
    """One online-softmax step on raw scores ``s`` (a tuple of parts, see :func:`softmax_row_max`).

    Returns ``p = exp2(s·c − m_new)`` (fp32, unnormalized, a tuple like ``s``), ``alpha =
    exp2(m_i − m_new)``, the new max and the new running sum. The caller rescales its output
    accumulator by ``alpha`` (and, without ``SUM``, the running sum it keeps beside it).
    ``MARGIN``: :func:`softmax_row_max`'s.
    """
    t, c, m_new = softmax_row_max(s, m_i, qk_scale_log2, SCALE_POSITIVE, TREE, MARGIN)
    p, alpha, l_new = softmax_exp(t, c, m_i, m_new, l_i, EXP2_FMA_EVERY, TREE, SUM)
    return p, alpha, m_new, l_new


@gluon.jit
def online_softmax_retained(s, m_i, l_i, qk_scale_log2, SCALE_POSITIVE: gl.constexpr, THRESHOLD: gl.constexpr,
                            EXP2_FMA_EVERY: gl.constexpr = 0, TREE: gl.constexpr = False,
                            BY_WARP: gl.constexpr = False, SUM: gl.constexpr = True, MARGIN: gl.constexpr = 0.0):
    """:func:`online_softmax` with a retained reference per row (FA4, seed 001 0x09), on the scores
    ``s`` of one K/V tile (a tuple of parts, as :func:`softmax_row_max` takes them).

    A row moves its reference ``m`` to its running max only when that max grew by more than
    ``THRESHOLD`` (log2 units); otherwise its ``alpha`` is exactly 1. Also returns ``rescale``, a
    scalar for the whole warpgroup: false when no row moved, so the caller may skip the O rescale.
    The decision per row needs nothing beyond the row max, so the exponentials never wait for the
    warpgroup-wide reduction; only the O rescale does. ``BY_WARP``: ``rescale`` is instead each
    row's warp's vote (:func:`warp_any`), for :func:`rescale_by_warp` — no reduction across warps.
    ``MARGIN``: :func:`softmax_row_max`'s.
    """
    t, c, m_cand = softmax_row_max(s, m_i, qk_scale_log2, SCALE_POSITIVE, TREE, MARGIN)
    m_new, rescale = retained_max(m_cand, m_i, THRESHOLD, BY_WARP)
    p, alpha, l_new = softmax_exp(t, c, m_i, m_new, l_i, EXP2_FMA_EVERY, TREE, SUM)
    return p, alpha, m_new, l_new, rescale


@gluon.jit
def retained_max(m_cand, m_i, THRESHOLD: gl.constexpr, BY_WARP: gl.constexpr = False):
    """The reference each row keeps (:func:`online_softmax_retained`), from its candidate max
    ``m_cand`` (:func:`softmax_row_max`'s): ``(m_new, rescale)``. Split out so FA4's order may
    decide between the row max and the previous PV's wait, as it forms the max there."""
    # growth of the max; 0 where it did not grow (also where both are -inf: no NaN from inf - inf)
    grow = gl.where(m_cand > m_i, m_cand - m_i, 0.0)
    m_new = gl.where(grow > THRESHOLD, m_cand, m_i)
    if BY_WARP:
        rescale = warp_any((grow > THRESHOLD).to(gl.int32))
    else:
        rescale = gl.max(grow, 0) > THRESHOLD
    return m_new, rescale


@gluon.jit
def _cvt_pair_bf16(a):
    return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [a], dtype=gl.bfloat16,
                                     is_pure=True, pack=2)


@gluon.jit
def _cvt_pair_f16(a):
    return gl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [a], dtype=gl.float16,
                                     is_pure=True, pack=2)


@gluon.jit
def to_operand_dtype(p, dtype: gl.constexpr, PACKED: gl.constexpr):
    """``p`` (fp32) as ``dtype``; with ``PACKED``, two elements per instruction in p's own layout."""
    if PACKED:
        if dtype == gl.bfloat16:
            out = _cvt_pair_bf16(p)
        else:
            out = _cvt_pair_f16(p)
    else:
        out = p.to(dtype)
    return out


@gluon.jit
def finalize(acc, m_i, l_i):
    """Normalized output (fp32) and natural-log LSE of a finished row block."""
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    out = acc * gl.expand_dims(1.0 / l_safe, 1)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * _LN_2)
    return out, lse
