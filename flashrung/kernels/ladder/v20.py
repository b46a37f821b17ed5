"""ladder.v20 — v19's trip on one barrier: the ring's copies in inline PTX.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v19): v14's trip meets two ``bar.sync``: one after the wait for block j+1
(every warp's copies of it are visible) and one at its end (every warp is done reading slot j
before the next trip's copy overwrites it). With three slots one barrier can do both: past trip j's
barrier every warp has left trip j−1. Built with Gluon's copies, Triton's shared-memory barrier
analysis fences a copy (a write to the ring) from the ring reads of its barrier interval and puts
the second barrier back: it cannot tell the slots apart (docs/ladder.md, v14's notes). Here each
16-byte ``cp.async`` is inline PTX against the ring's byte offset in shared memory, which the
analysis never sees; the destination's swizzle is the ring's own layout
(``common.xor_swizzled_layout``) computed by hand (:func:`ring_chunks`), and the offset comes from
Triton's allocation pass through a compile-twice build (``hopper.pipeline.resolve_shared_offsets``,
as hopper.fwd's inline barrier arrivals).

The schedule splits K from V. K(j−1)'s slot was last read by QK(j−1) two trips back, so K(j+2) is
copied ahead of trip j's wait, v19's lead; V(j−1)'s slot was read by PV(j−1) a trip back, so V(j+2)
is copied after the barrier — and has two trips to land before PV(j+2) reads it.

Prediction (v14's profile at config B: barrier stalls 4.2% of samples): +1–2% at config B.
Measured (H200, paired compare over v19, t_keep 1.002515): config B 1.0242 / 1.0243, config A
1.0348 / 1.0352 KEEP; d64 at B's shape 0.9730 / 0.9731 REVERT. Profile at B: long-scoreboard
stalls 7.0 -> 2.1%, barrier 5.0 -> 3.0%, tensor pipe 55.0 -> 56.3% of active cycles; 80.7% of
the best mma.sync tile's FLOPs per cycle (v19 78.8%). The first build, with K's copy after the
barrier too, lost at B (0.9763 / 0.9762): the K copy then no longer overlaps the wait.
"""
from __future__ import annotations

import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from flashrung.kernels.hopper.pipeline import resolve_shared_offsets, smem_base
from flashrung.kernels.hopper.softmax import row_max
from flashrung.kernels.ladder import common, v14, v15, v16, v19
from flashrung.kernels.ladder.common import (COPY_BYTES, COPY_BYTES_K, ELEMENT_BYTES, ELEMENT_BYTES_K,
                                             SWIZZLE_PHASES, mma_scores)

NAME = "ladder.v20"
PARENT = "ladder.v19"
LEVER = "one barrier a trip: the K/V ring's copies in inline PTX, K's ahead of the wait, V's after the barrier"
HEAD_DIMS = v14.HEAD_DIMS
CONFIG = v19.CONFIG
ROW_SUM = v19.ROW_SUM

# The constexprs that carry the ring's byte offsets in shared memory into the inline copies, and
# the ``ttg.local_alloc`` each names (``common.ring_tile``). 0 until the first compile has run
# the allocation pass (:func:`ring_offsets`).
RING_OFFSETS = {"K_RING_AT": "k_smem", "V_RING_AT": "v_smem"}
CHUNK_ELEMS = gl.constexpr(COPY_BYTES // ELEMENT_BYTES)   # one cp.async moves 16 bytes: 8 halves
PHASES = gl.constexpr(SWIZZLE_PHASES)
COPY_ONE_STRIDE_K = v14.COPY_ONE_STRIDE_K
# cp.async with a source size: 16 copies the chunk, 0 zero-fills it without reading global memory
# (rows past the keys), the form Gluon's masked copies compile to
_CP_ASYNC = gl.constexpr("cp.async.cg.shared.global [$1], [$2], 16, $3; mov.u32 $0, 0;")


@gluon.constexpr_function
def chunk_layout(head_dim, num_warps):
    """One 16-byte chunk per thread: a pass of the CTA's threads covers [rows_per_pass(), head_dim / 8]
    chunks, a row's chunks on adjacent lanes (the thread-to-chunk map of
    ``common.vector_copy_layout``)."""
    chunks = head_dim // (COPY_BYTES // ELEMENT_BYTES)
    lanes = min(32, chunks)
    return gl.BlockedLayout([1, 1], [32 // lanes, lanes], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def rows_per_pass(head_dim, num_warps):
    """Rows one pass of the CTA's threads copies, one chunk each: 8 at d128, 16 at d64 for four
    warps — a multiple of the swizzle's 8 phases, so a thread's chunk keeps its swizzled column
    in every pass and only the row offset moves."""
    rows = 32 * num_warps // (head_dim // (COPY_BYTES // ELEMENT_BYTES))
    assert rows % SWIZZLE_PHASES == 0, f"{rows} rows a pass: not a multiple of the swizzle's {SWIZZLE_PHASES} phases"
    return rows


@gluon.jit
def ring_chunks(HEAD_DIM: gl.constexpr):
    """(rows, chunks, chunk_at) of this thread's chunk in a copy's first pass: its row and column
    chunk, and its shared-window address in a ring slot at offset 0 — the ring's XOR swizzle
    (``common.xor_swizzled_layout``: 16-byte chunk c of row r stored at chunk c ^ (r mod 8)) plus
    ``global_smem``. One register each, loop-invariant: K and V, every slot and every pass share
    them (pass p's chunk is ``p * rows_per_pass`` rows further, at a constant offset)."""
    L: gl.constexpr = chunk_layout(HEAD_DIM, gl.num_warps())
    ROWS: gl.constexpr = rows_per_pass(HEAD_DIM, gl.num_warps())
    rows = gl.arange(0, ROWS, gl.SliceLayout(1, L))[:, None]
    chunks = gl.arange(0, HEAD_DIM // CHUNK_ELEMS, gl.SliceLayout(0, L))[None, :]
    swizzled = chunks ^ (rows % PHASES)
    chunk_at = rows * (HEAD_DIM * ELEMENT_BYTES_K) + swizzled * COPY_BYTES_K
    return rows, chunks, chunk_at + smem_base(chunk_at)


@gluon.jit
def copy_chunks(dst_at, src, src_bytes):
    # side-effecting inline PTX: kept, and invisible to the shared-memory barrier analysis
    gl.inline_asm_elementwise(_CP_ASYNC, "=r,r,l,r", [dst_at, src, src_bytes], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def issue_block_inline(rows, chunks, chunk_at, slot, base, start_n, n_rows, stride, BLOCK_N: gl.constexpr,
                       HEAD_DIM: gl.constexpr, RING_AT: gl.constexpr):
    """Rows ``start_n`` .. ``start_n + BLOCK_N`` of K or V into slot ``slot`` of the ring at byte
    ``RING_AT`` by inline ``cp.async``, one chunk per thread per pass; rows at or past ``n_rows``
    zero-filled."""
    ROWS: gl.constexpr = rows_per_pass(HEAD_DIM, gl.num_warps())
    PASS_BYTES: gl.constexpr = ROWS * HEAD_DIM * ELEMENT_BYTES_K
    at = chunk_at + (slot * (BLOCK_N * HEAD_DIM * ELEMENT_BYTES_K) + RING_AT)
    src = base + start_n.to(gl.int64) * stride + (rows * stride + chunks * CHUNK_ELEMS)
    for p in gl.static_range(BLOCK_N // ROWS):
        src_bytes = gl.where(rows + p * ROWS < n_rows, COPY_BYTES_K, 0) + chunks * 0
        copy_chunks(at + p * PASS_BYTES, src + p * ROWS * stride, src_bytes)


@gluon.jit
def ring_start(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
               stride_kh, stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k,
               heads_q, group, rows, chunks, chunk_at, DOT_A: gl.constexpr, HEAD_DIM: gl.constexpr,
               IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr,
               KV_COPY: gl.constexpr, TAIL_HEAVIEST_FIRST: gl.constexpr, K_RING_AT: gl.constexpr,
               V_RING_AT: gl.constexpr):
    """v14's start with the commit groups the trips expect: Q (``common.ring_tile``'s), block 0,
    K(1), V(1), one group each (a trip's wait counts groups); Q and block 0 landed, Q's fragments
    loaded.
    Returns (q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi)."""
    q_smem, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi = common.ring_tile(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, TAIL_HEAVIEST_FIRST)
    first = gl.to_tensor(0)
    v14.issue_kv(k_smem.index(0), v_smem.index(0), k_base, v_base, first, hi, stride_ks, stride_vs, BLOCK_N,
                 HEAD_DIM, KV_COPY)
    async_copy.commit_group()
    second = gl.to_tensor(BLOCK_N)
    issue_block_inline(rows, chunks, chunk_at, 1, k_base, second, hi - second, stride_ks, BLOCK_N, HEAD_DIM,
                       K_RING_AT)
    async_copy.commit_group()
    issue_block_inline(rows, chunks, chunk_at, 1, v_base, second, hi - second, stride_vs, BLOCK_N, HEAD_DIM,
                       V_RING_AT)
    async_copy.commit_group()
    async_copy.wait_group(2)
    gl.thread_barrier()
    return q_smem.load(DOT_A), k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi


@gluon.jit
def one_barrier_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base, stride_ks, stride_vs,
                     rows, chunks, chunk_at, offs_m, seqlen_k, causal_shift, qk_scale, HEAD_DIM: gl.constexpr,
                     IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     KV_STAGES: gl.constexpr, KV_COPY: gl.constexpr, MASKED: gl.constexpr,
                     ROW_SUM: gl.constexpr, K_RING_AT: gl.constexpr, V_RING_AT: gl.constexpr,
                     ROW_MAX_TREE: gl.constexpr = False):
    """Trip j on one barrier: K(j+2) into the K slot QK(j−1) left, the wait for K(j+1) and V(j),
    the barrier, V(j+2) into the V slot PV(j−1) left, S(j+1) (masked only if ``MASKED``),
    softmax(j) and PV(j). Returns (s_next, m_i, l_i, acc)."""
    j = start_n // BLOCK_N
    ahead = start_n + 2 * BLOCK_N
    # K and V of one row stride (v14's copy form for d128) name one stride, so the two copies
    # share each chunk's offset: at d128 a second one spills (census)
    if KV_COPY == COPY_ONE_STRIDE_K:
        stride_v = stride_ks
    else:
        stride_v = stride_vs
    slot = (j + 2) % KV_STAGES
    # K(j-1) was read by QK(j-1) in trip j-2, and every warp has passed trip j-1's barrier since:
    # the K copy goes ahead of the wait, v19's lead, so K(j+2) is in flight while a warp waits.
    issue_block_inline(rows, chunks, chunk_at, slot, k_base, ahead, hi - ahead, stride_ks, BLOCK_N, HEAD_DIM,
                       K_RING_AT)
    async_copy.commit_group()
    # groups newer than K(j+1): V(j+1) and K(j+2); V(j) is older
    async_copy.wait_group(2)
    # Every warp's copies of K(j+1) and V(j) are visible past it, and every warp has left trip j-1
    # (PV(j-1) read V's slot (j-1) mod 3). The ring's only barrier in the trip.
    gl.thread_barrier()
    # V(j+2) is read two trips on: it has two trips to land
    issue_block_inline(rows, chunks, chunk_at, slot, v_base, ahead, hi - ahead, stride_v, BLOCK_N, HEAD_DIM,
                       V_RING_AT)
    async_copy.commit_group()
    s_next = mma_scores(q, k_smem.index((j + 1) % KV_STAGES), start_n + BLOCK_N, offs_m, seqlen_k,
                        causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, MASKED)
    # ladder.v21 forms the row max as a tree (``softmax.row_max``); v20 keeps Triton's chain
    acc, m_i, l_i = v16.softmax_pv(s, row_max(s, ROW_MAX_TREE), m_i, l_i, acc, qk_scale, v_smem.index(j % KV_STAGES),
                                   ROW_SUM)
    return s_next, m_i, l_i, acc


@gluon.jit
def attention_fwd_v20(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr, QK_AHEAD: gl.constexpr, KV_COPY: gl.constexpr, ROW_SUM: gl.constexpr,
    TAIL_HEAVIEST_FIRST: gl.constexpr, K_RING_AT: gl.constexpr, V_RING_AT: gl.constexpr,
    ROW_MAX_TREE: gl.constexpr = False,
):
    gl.static_assert(KV_STAGES == 3, "one barrier a trip is this three-slot ring's schedule")
    MMA: gl.constexpr = common.mma_layout(gl.num_warps())
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    rows, chunks, chunk_at = ring_chunks(HEAD_DIM)
    q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi = ring_start(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        rows, chunks, chunk_at, DOT_A, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY,
        TAIL_HEAVIEST_FIRST, K_RING_AT, V_RING_AT)
    # v16's flash state, S(0) and v15's split, as v16.ring_prologue forms them
    m_i, l_row, acc, offs_m = common.flash_state(start_m, BLOCK_M, HEAD_DIM, ROW, MMA)
    l_i = v16.init_row_sum(BLOCK_M, BLOCK_N, MMA, ROW_SUM)
    causal_shift = seqlen_k - seqlen_q
    s = v14.first_scores(q, k_smem, offs_m, seqlen_k, causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL)
    split, last_trip = v15.split_trips(start_m, seqlen_q, seqlen_k, hi, BLOCK_N, IS_CAUSAL)
    for start_n in range(0, split, BLOCK_N):
        s, m_i, l_i, acc = one_barrier_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base,
                                            stride_ks, stride_vs, rows, chunks, chunk_at, offs_m, seqlen_k,
                                            causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N,
                                            KV_STAGES, KV_COPY, False, ROW_SUM, K_RING_AT, V_RING_AT,
                                            ROW_MAX_TREE)
    for start_n in range(split, last_trip, BLOCK_N):
        s, m_i, l_i, acc = one_barrier_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base,
                                            stride_ks, stride_vs, rows, chunks, chunk_at, offs_m, seqlen_k,
                                            causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N,
                                            KV_STAGES, KV_COPY, True, ROW_SUM, K_RING_AT, V_RING_AT,
                                            ROW_MAX_TREE)
    # The last trip waited for K(last) and V(last - 1); V(last) is older than that trip's K(last+1)
    # and V(last+1) only (with no trip, V(0) came with Q). Then v16's end: its wait drains the
    # trailing zero-row copies, and the analysis puts a barrier after it.
    async_copy.wait_group(2)
    gl.thread_barrier()
    v16.ring_epilogue(s, None, m_i, l_i, acc, qk_scale, v_smem, hi, o_base, lse_base, start_m, seqlen_q, stride_os,
                      HEAD_DIM, BLOCK_M, BLOCK_N, KV_STAGES, ROW_SUM)


def unsupported_reason(problem) -> str | None:
    return v14.unsupported_reason(problem)


def config_with(problem, overrides: dict) -> v14.AheadConfig:
    """:data:`CONFIG` (v19's tile and ring); this rung takes no overrides."""
    from flashrung.dispatch import apply_overrides

    return apply_overrides(NAME, CONFIG, overrides, keys=())


def ring_offsets(compile_with, constexprs: dict, name: str = NAME, offsets: dict = RING_OFFSETS) -> dict:
    """``constexprs`` with the byte offsets its inline PTX names filled in (``offsets``: v20's K and
    V rings; ladder.v22 adds its copy barriers) — two compiles; raises, naming the rung ``name``, if
    the second allocated them elsewhere."""
    return resolve_shared_offsets(compile_with, constexprs, offsets, name)


def _offsets_unresolved(offsets: dict = RING_OFFSETS) -> dict:
    # offset 0 in the first compile; ring_offsets fills in the allocation pass's
    return {name: 0 for name in offsets}


def launch(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG, name: str = NAME,
           row_max_tree: bool = False, kernel=attention_fwd_v20, offsets: dict = RING_OFFSETS):
    """This kernel on these tensors, as the rung ``name`` builds it: v20 with Triton's row max, ladder.v21
    with the tree (``row_max_tree``); ladder.v22 and v23 pass their ``kernel`` and its ``offsets``."""
    return v14.launch_on_ring(kernel, q, k, v, causal, softmax_scale, config=config, out=out, lse=lse,
                              constexprs={"ROW_SUM": ROW_SUM, "TAIL_HEAVIEST_FIRST": bool(causal),
                                          "ROW_MAX_TREE": row_max_tree, **_offsets_unresolved(offsets)},
                              needs_ahead=name, resolve=functools.partial(ring_offsets, name=name, offsets=offsets))


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    return launch(q, k, v, causal, softmax_scale, out=out, lse=lse, config=config)


def kernel_census_specs(name: str = NAME, row_max_tree: bool = False, kernel=attention_fwd_v20,
                        offsets: dict = RING_OFFSETS, config=CONFIG, arches: tuple[str, ...] | None = None):
    """The census of this kernel as the rung ``name`` builds it (see :func:`launch`): each head dim
    and mask with K and V of one row stride, then d128's copy form for K and V laid out apart;
    ``arches`` narrows the architectures (ladder.v22's wait is sm_90's)."""
    cases = [(d, c, v14.copy_form(d, True)) for d in HEAD_DIMS for c in (False, True)]
    cases += [(128, c, v14.copy_form(128, False)) for c in (False, True)]
    return [common.census_spec(name, kernel, head_dim=d, causal=c, cfg=config,
                               extra={"KV_COPY": form, "ROW_SUM": ROW_SUM, "TAIL_HEAVIEST_FIRST": c,
                                      "ROW_MAX_TREE": row_max_tree, **_offsets_unresolved(offsets)},
                               config_extra={"kv_stages": config.kv_stages, "kv_copy": v14.COPY_NAMES[form]},
                               resolve=functools.partial(ring_offsets, name=name, offsets=offsets), arches=arches)
            for d, c, form in cases]


def census_specs():
    return kernel_census_specs()
