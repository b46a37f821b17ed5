"""ladder.v22 — v20's trip with no barrier: the K/V ring's copies counted by mbarriers.

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA. Hopper and newer (``mbarrier.try_wait``).

Lever (parent ladder.v20): v20's trip meets one ``bar.sync``, after its wait for block j+1. It
does two jobs — every warp's copies of the block are visible past it, and every warp has left
trip j−1, so the slots trip j refills are no longer read — and it makes each warp wait for the
slowest of the CTA's four every trip. Here each thread's copies of a trip arrive on one of three
mbarriers (``cp.async.mbarrier.arrive.noinc``: the arrival fires when the thread's copies have
landed, 128 arrivals a phase), and trip j, between its softmax and its PV, waits for the copies
trip j−1 issued at that same point (``try_wait.parity`` on a spin), then issues its own. Both are
inline PTX, as hopper.fwd's: Triton's shared-memory barrier analysis sees neither, so it adds no
``bar.sync``. That one wait does both of the barrier's jobs: its phase completes once every thread
has issued trip j−1's copies — so every warp is past trip j−1's softmax, its QK(j) done — and they
have landed. So trip j refills only slots read no later than that: K(j+3) into K(j)'s slot (QK(j)
ran in trip j−1) and V(j+1) into V(j−2)'s (PV(j−2), trip j−2). A warp may run up to a trip ahead of
the slowest; nothing waits for a warp that is merely slower.

Every copy has a trip to land before the wait that needs it (v20: K a trip, V two), and K(j+3) a
trip and a half before QK(j+3) reads it. The wait's spin is a branch, and the copies' address
arithmetic issues after it, beside PV's loads and MMAs, not beside the softmax's chain.

Evidence: census (sm_90a): no ``BAR`` in either trip, one ``SYNCS`` try-wait and one ``ARRIVES`` a
trip; HMMA, LDSM, LDGSTS, MUFU.EX2, SHFL and FMNMX per trip equal v20's; the d128 causal trips 567
and 712 instructions (v20 552 and 704). The arithmetic is v20's, so the output must be bit-identical
to v20's (tests/test_ladder.py, on a GPU). Prediction: +1–3% at configs A and B (v20's barrier
stalls, 3.0% of its samples at B). Not yet measured.
"""
from __future__ import annotations

import dataclasses

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from flashrung.kernels.hopper.pipeline import THREADS_PER_WARPGROUP, copies_arrive_unsynced, wait_unsynced
from flashrung.kernels.hopper.softmax import row_max
from flashrung.kernels.ladder import common, v14, v15, v16, v20
from flashrung.kernels.ladder.common import mma_scores

NAME = "ladder.v22"
PARENT = "ladder.v20"
LEVER = "no barrier a trip: the K/V ring's copies counted by one mbarrier a trip, each warp waits for the copies alone"
HEAD_DIMS = v20.HEAD_DIMS
ROW_SUM = v20.ROW_SUM


@dataclasses.dataclass(frozen=True)
class BarrierFreeConfig(v14.AheadConfig):
    """v20's tile and ring; its shared memory counts the three copy barriers too."""

    def smem_bytes(self, head_dim: int) -> int:
        """v20's Q tile and K/V ring, and one 8-byte copy barrier per slot."""
        return super().smem_bytes(head_dim) + self.kv_stages * MBARRIER_BYTES


CONFIG = BarrierFreeConfig(**dataclasses.asdict(v20.CONFIG))
# mbarrier.try_wait (the wait's suspend-and-retry form) is sm_90's: the census skips sm_80
MIN_CAPABILITY = (9, 0)
CENSUS_ARCHES = ("sm_90a", "sm_120")

# v20's ring offsets and the copy barriers', each named by its ``ttg.local_alloc``
# (``ring_start``'s ``copy_bars``). 0 until the first compile has run the allocation pass.
RING_OFFSETS = {**v20.RING_OFFSETS, "COPY_BARS_AT": "copy_bars"}
MBARRIER_BYTES = 8
# Trip j refills K(j + K_REFILL_AHEAD) and V(j + V_REFILL_AHEAD) after waiting for trip j-1's copies:
# the furthest ahead the three-slot ring allows once every warp is past trip j-1's softmax
# (tests/test_ladder.py replays the schedule under every warp order it draws)
K_REFILL_AHEAD = gl.constexpr(3)
V_REFILL_AHEAD = gl.constexpr(1)
# one arrival per thread of the CTA's four warps: the barrier helpers' one-warpgroup layout
THREADS = THREADS_PER_WARPGROUP
_THREADS = gl.constexpr(THREADS)


@gluon.jit
def copy_barrier(n, KV_STAGES: gl.constexpr):
    """(slot, phase parity) of the barrier that counts the ``n``-th issue of copies: trip j's are
    ``n = j + 1``, the start's K(2) ``n = 0`` (a fresh barrier passes a wait for parity 1 at once,
    so numbering from 0 is what makes slot 0's first wait a real one)."""
    return n % KV_STAGES, (n // KV_STAGES) & 1


@gluon.jit
def ring_start(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
               stride_kh, stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k,
               heads_q, group, rows, chunks, chunk_at, DOT_A: gl.constexpr, HEAD_DIM: gl.constexpr,
               IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr,
               KV_COPY: gl.constexpr, TAIL_HEAVIEST_FIRST: gl.constexpr, K_RING_AT: gl.constexpr,
               COPY_BARS_AT: gl.constexpr):
    """v20's start on copy barriers: the barriers initialized; Q, then block 0 and K(1), as one
    commit group each, both waited; K(2) counted by copy barrier 0 (trip 0 waits for it); Q's
    fragments loaded.
    Returns (q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi)."""
    q_smem, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi = common.ring_tile(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, TAIL_HEAVIEST_FIRST)
    copy_bars = gl.allocate_shared_memory(gl.int64, [KV_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(KV_STAGES):
        mbarrier.init(copy_bars.index(i), count=_THREADS)
    # the initialized barriers visible to every thread before the first arrival (K(1)'s, below)
    gl.thread_barrier()
    first = gl.to_tensor(0)
    v14.issue_kv(k_smem.index(0), v_smem.index(0), k_base, v_base, first, hi, stride_ks, stride_vs, BLOCK_N,
                 HEAD_DIM, KV_COPY)
    async_copy.commit_group()
    second = gl.to_tensor(BLOCK_N)
    v20.issue_block_inline(rows, chunks, chunk_at, 1, k_base, second, hi - second, stride_ks, BLOCK_N, HEAD_DIM,
                           K_RING_AT)
    # K(1) joins block 0's group (a commit takes every earlier uncommitted copy, inline ones too):
    # trip 0's QK reads it before trip 0's wait
    async_copy.commit_group()
    third = gl.to_tensor(2 * BLOCK_N)
    v20.issue_block_inline(rows, chunks, chunk_at, 2, k_base, third, hi - third, stride_ks, BLOCK_N, HEAD_DIM,
                           K_RING_AT)
    slot, _ = copy_barrier(0, KV_STAGES)
    copies_arrive_unsynced(slot, COPY_BARS_AT)
    async_copy.wait_group(0)
    gl.thread_barrier()
    return q_smem.load(DOT_A), k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi


@gluon.jit
def barrier_free_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base, stride_ks, stride_vs,
                      rows, chunks, chunk_at, offs_m, seqlen_k, causal_shift, qk_scale, HEAD_DIM: gl.constexpr,
                      IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      KV_STAGES: gl.constexpr, KV_COPY: gl.constexpr, MASKED: gl.constexpr,
                      ROW_SUM: gl.constexpr, K_RING_AT: gl.constexpr, V_RING_AT: gl.constexpr,
                      COPY_BARS_AT: gl.constexpr, ROW_MAX_TREE: gl.constexpr = False):
    """Trip j with no barrier: S(j+1) (masked only if ``MASKED``) and softmax(j); the wait for trip
    j−1's copies (K(j+2), V(j)); K(j+3) and V(j+1) into the slots of K(j) and V(j−2) and their
    arrival; PV(j). Returns (s_next, m_i, l_i, acc)."""
    j = start_n // BLOCK_N
    # K and V of one row stride share each chunk's offset, as in v20
    if KV_COPY == v20.COPY_ONE_STRIDE_K:
        stride_v = stride_ks
    else:
        stride_v = stride_vs
    # K(j+1) landed before trip j-1's wait (the start's group for trip 0)
    s_next = mma_scores(q, k_smem.index((j + 1) % KV_STAGES), start_n + BLOCK_N, offs_m, seqlen_k,
                        causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, MASKED)
    p16, alpha, m_i, l_i = v16.softmax_p(s, row_max(s, ROW_MAX_TREE), m_i, l_i, qk_scale, v_smem.dtype, ROW_SUM)
    # Past this phase every thread has issued trip j-1's copies here — so every warp is past
    # trip j-1's softmax, its QK(j) done, and PV(j-2) before it — and they have landed: V(j) is
    # readable below, K(j+2) in trip j+1, and K(j)'s and V(j-2)'s slots are read by no one.
    waited, phase = copy_barrier(j, KV_STAGES)
    wait_unsynced(waited, phase, COPY_BARS_AT, True)
    ahead_k = start_n + K_REFILL_AHEAD * BLOCK_N
    ahead_v = start_n + V_REFILL_AHEAD * BLOCK_N
    # the ahead counts reduced first: (j + 3) % 3 is not folded to j % 3 (7 instructions a trip)
    k_slot = (j + K_REFILL_AHEAD % KV_STAGES) % KV_STAGES
    v_slot = (j + V_REFILL_AHEAD % KV_STAGES) % KV_STAGES
    v20.issue_block_inline(rows, chunks, chunk_at, k_slot, k_base, ahead_k, hi - ahead_k, stride_ks, BLOCK_N,
                           HEAD_DIM, K_RING_AT)
    v20.issue_block_inline(rows, chunks, chunk_at, v_slot, v_base, ahead_v, hi - ahead_v, stride_v, BLOCK_N,
                           HEAD_DIM, V_RING_AT)
    counted, _ = copy_barrier(j + 1, KV_STAGES)
    copies_arrive_unsynced(counted, COPY_BARS_AT)
    acc = v16.pv(p16, alpha, acc, v_smem.index(j % KV_STAGES))
    return s_next, m_i, l_i, acc


@gluon.jit
def attention_fwd_v22(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr, QK_AHEAD: gl.constexpr, KV_COPY: gl.constexpr, ROW_SUM: gl.constexpr,
    TAIL_HEAVIEST_FIRST: gl.constexpr, K_RING_AT: gl.constexpr, V_RING_AT: gl.constexpr,
    COPY_BARS_AT: gl.constexpr, ROW_MAX_TREE: gl.constexpr = False,
):
    gl.static_assert(KV_STAGES == 3, "the copy barriers' trip distance is this three-slot ring's")
    gl.static_assert(gl.num_warps() * 32 == _THREADS, "one arrival per thread: four warps")
    MMA: gl.constexpr = common.mma_layout(gl.num_warps())
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    rows, chunks, chunk_at = v20.ring_chunks(HEAD_DIM)
    q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi = ring_start(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        rows, chunks, chunk_at, DOT_A, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY,
        TAIL_HEAVIEST_FIRST, K_RING_AT, COPY_BARS_AT)
    m_i, l_row, acc, offs_m = common.flash_state(start_m, BLOCK_M, HEAD_DIM, ROW, MMA)
    l_i = v16.init_row_sum(BLOCK_M, BLOCK_N, MMA, ROW_SUM)
    causal_shift = seqlen_k - seqlen_q
    # S(0) reads K(0)'s slot, which trip 0 refills with K(3); the start's copy barrier was armed
    # before S(0), so its phase does not say S(0) is done everywhere — first_scores' fence does
    s = v14.first_scores(q, k_smem, offs_m, seqlen_k, causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL)
    split, last_trip = v15.split_trips(start_m, seqlen_q, seqlen_k, hi, BLOCK_N, IS_CAUSAL)
    for start_n in range(0, split, BLOCK_N):
        s, m_i, l_i, acc = barrier_free_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base,
                                             stride_ks, stride_vs, rows, chunks, chunk_at, offs_m, seqlen_k,
                                             causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N,
                                             KV_STAGES, KV_COPY, False, ROW_SUM, K_RING_AT, V_RING_AT,
                                             COPY_BARS_AT, ROW_MAX_TREE)
    for start_n in range(split, last_trip, BLOCK_N):
        s, m_i, l_i, acc = barrier_free_trip(q, k_smem, v_smem, s, m_i, l_i, acc, start_n, hi, k_base, v_base,
                                             stride_ks, stride_vs, rows, chunks, chunk_at, offs_m, seqlen_k,
                                             causal_shift, qk_scale, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N,
                                             KV_STAGES, KV_COPY, True, ROW_SUM, K_RING_AT, V_RING_AT,
                                             COPY_BARS_AT, ROW_MAX_TREE)
    # The last trip's copies (V(last), which the last PV reads, and the trailing zero-row K(last+2);
    # with no trip, the start's K(2)): waited here, so every copy the CTA issued has landed — and
    # every arrival fired — before it reads V(last) and before it exits.
    last = gl.maximum(gl.cdiv(hi, BLOCK_N), 1) - 1
    waited, phase = copy_barrier(last, KV_STAGES)
    wait_unsynced(waited, phase, COPY_BARS_AT, True)
    v16.ring_epilogue(s, None, m_i, l_i, acc, qk_scale, v_smem, hi, o_base, lse_base, start_m, seqlen_q, stride_os,
                      HEAD_DIM, BLOCK_M, BLOCK_N, KV_STAGES, ROW_SUM)


def unsupported_reason(problem) -> str | None:
    reason = common.unsupported_reason(problem, HEAD_DIMS)
    if reason is None and tuple(problem.capability) < MIN_CAPABILITY:
        return f"needs sm_90 or newer (mbarrier.try_wait), got capability {problem.capability}"
    return reason or common.shared_memory_reason(problem, CONFIG.smem_bytes(problem.head_dim))


def config_with(problem, overrides: dict) -> BarrierFreeConfig:
    """:data:`CONFIG` (v20's tile and ring); this rung takes no overrides."""
    from flashrung.dispatch import apply_overrides

    return apply_overrides(NAME, CONFIG, overrides, keys=())


def ring_offsets(compile_with, constexprs: dict, name: str = NAME) -> dict:
    """``constexprs`` with the rings' and the copy barriers' byte offsets filled in (v20's build)."""
    return v20.ring_offsets(compile_with, constexprs, name, RING_OFFSETS)


def launch(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG, name: str = NAME,
           row_max_tree: bool = False):
    """This kernel on these tensors through v20's launch, as the rung ``name`` builds it
    (``row_max_tree``: each block's row max as ``softmax.row_max``'s tree, v21's lever)."""
    return v20.launch(q, k, v, causal, softmax_scale, out=out, lse=lse, config=config, name=name,
                      row_max_tree=row_max_tree, kernel=attention_fwd_v22, offsets=RING_OFFSETS)


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config=CONFIG):
    return launch(q, k, v, causal, softmax_scale, out=out, lse=lse, config=config)


def kernel_census_specs(name: str = NAME, row_max_tree: bool = False):
    """v20's census cases for this kernel, on the architectures with mbarrier.try_wait."""
    return v20.kernel_census_specs(name, row_max_tree, kernel=attention_fwd_v22, offsets=RING_OFFSETS,
                                   config=CONFIG, arches=CENSUS_ARCHES)


def census_specs():
    return kernel_census_specs()
