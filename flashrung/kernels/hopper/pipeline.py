"""Pipeline state of the Hopper forward: ring slots, their phase parity, and the consumer turn.

The K/V ring has ``NUM_KV_STAGES`` slots. Item ``i`` (counted over every K/V tile the CTA has
loaded, across persistent tiles) lives in slot ``i % NUM_KV_STAGES`` and its barriers complete
generation ``i // NUM_KV_STAGES``; a wait names that generation by its parity
``(i // NUM_KV_STAGES) & 1`` (seed 001, 0x03). A freshly initialized mbarrier is in phase 0,
so waiting for parity 1 returns at once: producers wait on ``empty`` with ``parity ^ 1`` and
find every slot free the first time round.

The pingpong turn (which consumer warpgroup may issue its GEMMs) is passed either through one
mbarrier per consumer or through one hardware named barrier per consumer (``bar.sync`` /
``bar.arrive``, FA3's and FA4's warp-scheduler barrier). Gluon 3.6 has no named-barrier op, so
the latter is inline PTX; Triton's warp specialization itself uses named barriers 0 up to the
number of partitions, and the turn barriers start at ``TURN_BARRIER_BASE``, well above them.
"""
from __future__ import annotations

import threading

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma_wait

# Hardware named barriers are 0–15; Triton 3.6's warp specialization takes 0 to the partition
# count (at most 4 here: three consumers and the producer). tests/test_hopper.py checks the PTX.
TURN_BARRIER_BASE = 8
# the exponentials' ring (exp_turns): one barrier per consumer after the GEMM ring's (at most
# three consumers: 11-13, inside the hardware's 16)
EXP_TURN_BARRIER_BASE = 11
THREADS_PER_WARPGROUP = 128
_TURN_BARRIER_BASE = gl.constexpr(TURN_BARRIER_BASE)
_EXP_TURN_BARRIER_BASE = gl.constexpr(EXP_TURN_BARRIER_BASE)
_THREADS_PER_WARPGROUP = gl.constexpr(THREADS_PER_WARPGROUP)


@gluon.jit
def ring_slot(count, NUM_STAGES: gl.constexpr):
    """(slot index, phase parity) of ring item ``count``.

    Signed on purpose: the same arithmetic on the count taken as unsigned drops the sign fix-ups
    (census, d128: 4 instructions fewer per K/V tile, d64's 3-stage ring 2 more) and measured no
    faster (H200 screening, interleaved CUDA events: this form ÷ unsigned 1.007 at d128 S16k,
    1.005 at d64 S8k).
    """
    return count % NUM_STAGES, (count // NUM_STAGES) & 1


@gluon.jit
def next_ring_slot(idx, phase, NUM_STAGES: gl.constexpr):
    """The (slot index, phase parity) after ``(idx, phase)`` = ``ring_slot(count)``: ``ring_slot(count + 1)``.

    An add, a compare and a select where ``ring_slot`` divides by ``NUM_STAGES``: a loop that
    visits consecutive ring items carries the pair (FA4's pipeline state). The phase flips when
    the slot wraps to 0.
    """
    nxt = idx + 1
    wrap = (nxt == NUM_STAGES).to(gl.int32)
    return nxt - wrap * NUM_STAGES, phase ^ wrap


@gluon.constexpr_function
def _named_barrier_asm(op, barrier_id):
    # two warpgroups meet at each barrier: the one waiting for its turn and the one passing it
    if op not in ("sync", "arrive"):
        raise ValueError(f"named barrier op must be 'sync' or 'arrive', got {op!r}")
    return f"bar.{op} {barrier_id}, {2 * THREADS_PER_WARPGROUP}; mov.u32 $0, $1;"


@gluon.jit
def named_barrier(op: gl.constexpr, barrier_id: gl.constexpr):
    """``bar.sync`` / ``bar.arrive`` on a named barrier that 256 threads meet at.

    Inline PTX with side effects over a one-element-per-thread token: every thread of the
    partition executes the instruction once, and neither LLVM nor ptxas removes it or moves it
    across the ``wgmma`` issue (both are side-effecting asm; the SASS census checks the order).
    """
    token = gl.full([_THREADS_PER_WARPGROUP], 0, gl.int32,
                    gl.BlockedLayout([1], [32], [_THREADS_PER_WARPGROUP // 32], [0]))
    gl.inline_asm_elementwise(_named_barrier_asm(op, barrier_id), "=r,r", [token], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def start_turns(WG: gl.constexpr, NUM_CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, NAMED: gl.constexpr):
    """The bootstrap credit of named-barrier turns: the last consumer passes the token to WG0 once,
    before anyone waits (mbarrier turns need none: WG0's first wait is for a parity a fresh barrier
    already satisfies)."""
    if PINGPONG and NAMED:
        if WG == NUM_CONSUMERS - 1:
            named_barrier("arrive", _TURN_BARRIER_BASE)


@gluon.jit
def wait_turn(turn_bars, turn, WG: gl.constexpr, PINGPONG: gl.constexpr, NAMED: gl.constexpr,
              SMEM_OFFSET: gl.constexpr = -1, HOIST_BASE: gl.constexpr = False):
    """Block consumer ``WG`` until it holds the GEMM-issue token (its ``turn``-th time).

    The token circulates WG0 → WG1 (→ WG2) → WG0 through one barrier per consumer. With
    mbarriers, WG0's first wait is for parity 1, which a fresh barrier already satisfies: that is
    the bootstrap credit; with named barriers it is ``start_turns``' arrival. Every consumer takes
    the same number of turns per tile, so the token is back at WG0 when a tile ends and the next
    (persistent) tile starts where the ring expects it. With ``SMEM_OFFSET`` ≥ 0 (``asm_waits``) the
    mbarrier wait is :func:`wait_unsynced`.
    """
    if PINGPONG:
        if NAMED:
            named_barrier("sync", _TURN_BARRIER_BASE + WG)
        elif SMEM_OFFSET >= 0:
            wait_unsynced(WG, (turn & 1) ^ (1 if WG == 0 else 0), SMEM_OFFSET, HOIST_BASE)
        elif WG == 0:
            mbarrier.wait(turn_bars.index(WG), (turn & 1) ^ 1)
        else:
            mbarrier.wait(turn_bars.index(WG), turn & 1)
    return turn + 1


@gluon.jit
def pass_turn(turn_bars, WG: gl.constexpr, NUM_CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr,
              NAMED: gl.constexpr, SMEM_OFFSET: gl.constexpr = -1, HOIST_BASE: gl.constexpr = False):
    """Hand the GEMM-issue token to the next consumer warpgroup. An mbarrier takes one elected
    arrival (Gluon 3.6 syncs the partition before it; with ``SMEM_OFFSET`` ≥ 0 an inline one that
    does not, :func:`arrive_unsynced`); a named barrier takes every thread's ``bar.arrive``, which
    does not wait."""
    if PINGPONG:
        if NAMED:
            named_barrier("arrive", _TURN_BARRIER_BASE + (WG + 1) % NUM_CONSUMERS)
        elif SMEM_OFFSET >= 0:
            arrive_unsynced((WG + 1) % NUM_CONSUMERS, SMEM_OFFSET, HOIST_BASE)
        else:
            mbarrier.arrive(turn_bars.index((WG + 1) % NUM_CONSUMERS))


@gluon.jit
def start_exp_turns(WG: gl.constexpr, NUM_CONSUMERS: gl.constexpr, EXP_TURNS: gl.constexpr):
    """The bootstrap credit of the exponentials' ring, as :func:`start_turns` gives the GEMM ring's."""
    if EXP_TURNS:
        if WG == NUM_CONSUMERS - 1:
            named_barrier("arrive", _EXP_TURN_BARRIER_BASE)


@gluon.constexpr_function
def _exp_turn_asm(op, barrier_id):
    # one asm per thread: a row vector of the accumulator layout holds two rows per thread (rows r
    # and r + 8 of its warp's 16), taken together with pack=2. The values pass through ($0, $1).
    # A bar names no register, so ptxas moves arithmetic across it (census: wait and pass both
    # ahead of all 66 MUFU.EX2 when they were plain, or behind a branch, which ptxas predicated).
    # The pass is therefore predicated on the row sum it follows: l >= -1 or unordered holds for
    # every sum of exponentials (l >= 0, or NaN), and ptxas cannot know it, so the arrive waits
    # for the sum and the sum for every exponential. The wait returns the row max through a move
    # after it, which the exponentials read.
    if op == "sync":
        return f"bar.sync {barrier_id}, {2 * THREADS_PER_WARPGROUP}; mov.f32 $0, $2; mov.f32 $1, $3;"
    if op == "arrive":
        return ("{ .reg .pred p; setp.geu.f32 p, $2, 0fBF800000; "
                f"@p bar.arrive {barrier_id}, {2 * THREADS_PER_WARPGROUP}; }} mov.f32 $0, $2; mov.f32 $1, $3;")
    raise ValueError(f"named barrier op must be 'sync' or 'arrive', got {op!r}")


@gluon.jit
def _exp_turn(rows, op: gl.constexpr, barrier_id: gl.constexpr):
    return gl.inline_asm_elementwise(_exp_turn_asm(op, barrier_id), "=f,=f,f,f", [rows], dtype=gl.float32,
                                     is_pure=False, pack=2)


@gluon.jit
def wait_exp_turn(row_max, WG: gl.constexpr, EXP_TURNS: gl.constexpr):
    """Block consumer ``WG`` until it holds the exponentials' token (``exp_turns``); returns
    ``row_max`` through the barrier for the exponentials to subtract.

    The token follows the GEMM ring's order (WG0 → WG1 (→ WG2) → WG0), taken once per overlapped
    K/V step — as the GEMM token is — so a consumer waits only for the consumer before it in the
    same step, or the last one in the step before: no cycle with the GEMM ring or the K/V ring.
    Consumers with no rows walk the same turns (:func:`pass_exp_turn_through`)."""
    if EXP_TURNS:
        row_max = _exp_turn(row_max, "sync", _EXP_TURN_BARRIER_BASE + WG)
    return row_max


@gluon.jit
def pass_exp_turn(row_sum, WG: gl.constexpr, NUM_CONSUMERS: gl.constexpr, EXP_TURNS: gl.constexpr):
    """Hand the exponentials' token to the next consumer warpgroup once ``row_sum`` — the running
    sum over every exponential of the step — exists (every thread's ``bar.arrive``); returns it."""
    if EXP_TURNS:
        row_sum = _exp_turn(row_sum, "arrive", _EXP_TURN_BARRIER_BASE + (WG + 1) % NUM_CONSUMERS)
    return row_sum


@gluon.jit
def pass_exp_turn_through(WG: gl.constexpr, NUM_CONSUMERS: gl.constexpr, EXP_TURNS: gl.constexpr):
    """A consumer with no rows takes and passes the exponentials' token at once."""
    if EXP_TURNS:
        named_barrier("sync", _EXP_TURN_BARRIER_BASE + WG)
        named_barrier("arrive", _EXP_TURN_BARRIER_BASE + (WG + 1) % NUM_CONSUMERS)


@gluon.constexpr_function
def release_arrivals(per_thread):
    """Arrivals one consumer warpgroup makes when it releases a slot (see :func:`release`)."""
    return THREADS_PER_WARPGROUP if per_thread else 1


# the leader's arrival on the barrier at ``addr``'s offset in the other CTA of a two-CTA cluster
# (registers ``rank`` and ``remote`` declared by the caller)
_PEER_ARRIVE_PTX = ("mov.u32 rank, %cluster_ctarank; xor.b32 rank, rank, 1; mapa.shared::cluster.u32 remote, addr, "
                    "rank; @leader mbarrier.arrive.shared::cluster.b64 _, [remote]; ")


@gluon.constexpr_function
def _relay_asm(smem_offset):
    # $1: the thread's index in its (one-warpgroup) partition, $2: the barrier's slot. Only the
    # other CTA's barrier at this offset gets the arrival (``mapa``), none here: the relay's own
    # barrier is armed by the peer's producer alone
    return ("{ .reg .pred leader; .reg .b32 addr, rank, remote; setp.eq.u32 leader, $1, 0; "
            + _slot_address("$2", smem_offset, False) + _PEER_ARRIVE_PTX + "mov.u32 $0, 0; }")


@gluon.jit
def relay_to_peer(slot, SMEM_OFFSET: gl.constexpr):
    """One arrival, by the partition's thread 0, on barrier ``slot`` of the array at
    ``SMEM_OFFSET`` in the *other* CTA of a two-CTA cluster (``relay_release``: this CTA's consumers
    have released the slot, so the peer's producer may write its half into it). The plain arrive,
    as :func:`arrive_unsynced`'s: what it orders is the consumers' release, which the producer
    observed through its own wait before this."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [_THREADS_PER_WARPGROUP // 32], [0])
    lanes = gl.arange(0, _THREADS_PER_WARPGROUP, layout=layout)
    slots = gl.full([_THREADS_PER_WARPGROUP], 0, gl.int32, layout) + slot
    gl.inline_asm_elementwise(_relay_asm(SMEM_OFFSET), "=r,r,r", [lanes, slots], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.constexpr_function
def _arrive_asm(smem_offset, hoisted, peer=False):
    # $1: the thread's index in its (one-warpgroup) partition, $2: the barrier's slot; hoisted: $3
    # the shared window's base (smem_base). The index comes in a register rather than from %tid.x
    # in the PTX: read there, d256's kernel kept 236-264 B in local memory (census; 0-36 B this
    # way). ``global_smem`` is the kernel's one dynamic shared-memory symbol; the barrier array sits
    # ``smem_offset`` bytes into it, 8 bytes a slot (fwd.barrier_offsets reads the offset from the
    # allocation pass). ``peer``: the same barrier of the other CTA of a two-CTA cluster gets an
    # arrival too (``mapa`` to its address; the peer's producer then overwrites what this warpgroup
    # read). The plain arrive, not ``.release.cluster``: that form cost a MEMBAR, ERRBAR and
    # CGAERRBAR per arrival in the steady loop (census), and the reads it would order are the
    # wgmma's, complete once the warpgroup's wait returned (multicast.py)
    remote = _PEER_ARRIVE_PTX if peer else ""
    return ("{ .reg .pred leader; .reg .b32 addr" + (", rank, remote" if peer else "") + "; setp.eq.u32 leader, $1, 0; "
            + _slot_address("$2", smem_offset, hoisted)
            + "@leader mbarrier.arrive.shared::cta.b64 _, [addr]; " + remote + "mov.u32 $0, 0; }")


@gluon.constexpr_function
def _slot_address(slot, smem_offset, hoisted, base_operand="$3"):
    # PTX that leaves in ``addr`` the address of barrier ``slot`` (an operand) of the array at
    # ``smem_offset``: from global_smem, or (hoisted) from the base in operand ``base_operand``
    base = f"mov.u32 addr, {base_operand}; " if hoisted else "mov.u32 addr, global_smem; "
    return base + f"mad.lo.u32 addr, {slot}, 8, addr; add.u32 addr, addr, {smem_offset}; "


@gluon.jit
def smem_base(like):
    """``global_smem``'s shared-window address, one per element of ``like``'s layout, in pure
    inline PTX: LLVM may hoist and merge it, where each side-effecting arrival or wait that names
    ``global_smem`` itself reads it again (an ``S2UR SR_CgaCtaId`` in every K/V step; census)."""
    return gl.inline_asm_elementwise("mov.u32 $0, global_smem;", "=r,r", [like], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def arrive_unsynced(slot, SMEM_OFFSET: gl.constexpr, HOIST_BASE: gl.constexpr = False, PEER: gl.constexpr = False):
    """One arrival on barrier ``slot`` of the array at ``SMEM_OFFSET``, by the partition's thread 0,
    with no partition-wide ``bar.sync`` in front of it (FA3's consumer release).

    Inline PTX, so Triton's shared-memory barrier analysis never sees an arrive to fence. What the
    fence would have ordered is ordered otherwise: every use this makes of it follows a
    ``warpgroup_mma_wait``, and a ``wgmma`` group is the warpgroup's, so thread 0's wait returning
    means every warp's part of the GEMMs that read the slot is done. ``HOIST_BASE``: the shared
    window's base from :func:`smem_base` (``hoist_smem_base``). ``PEER``: the other CTA of the
    cluster's barrier too (``kv_multicast``).
    """
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [_THREADS_PER_WARPGROUP // 32], [0])
    lanes = gl.arange(0, _THREADS_PER_WARPGROUP, layout=layout)
    slots = gl.full([_THREADS_PER_WARPGROUP], 0, gl.int32, layout) + slot
    if HOIST_BASE:
        gl.inline_asm_elementwise(_arrive_asm(SMEM_OFFSET, True, PEER), "=r,r,r,r", [lanes, slots, smem_base(lanes)],
                                  dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise(_arrive_asm(SMEM_OFFSET, False, PEER), "=r,r,r", [lanes, slots], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.constexpr_function
def _copies_arrive_asm(smem_offset):
    # $1: the barrier's slot, $2: the shared window's base (smem_base). ``.noinc``: the barrier's
    # expected count already holds this arrival (one per thread, :func:`copies_arrive_unsynced`)
    return ("{ .reg .b32 addr; " + _slot_address("$1", smem_offset, True, "$2")
            + "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [addr]; mov.u32 $0, 0; }")


@gluon.jit
def copies_arrive_unsynced(slot, SMEM_OFFSET: gl.constexpr):
    """Every thread's arrival on barrier ``slot`` of the array at ``SMEM_OFFSET``, fired once the
    ``cp.async`` copies the thread issued before it have landed (``cp.async.mbarrier.arrive.noinc``;
    the barrier counts one arrival per thread, 128 for four warps).

    Inline PTX, as :func:`arrive_unsynced`: Triton's shared-memory barrier analysis never sees
    it, so it has no access to the barrier array to fence with a ``bar.sync`` — the barrier a ring
    on mbarriers exists to remove (ladder.v22). ``SMEM_OFFSET`` comes from the allocation pass
    (:func:`resolve_shared_offsets`).
    """
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [_THREADS_PER_WARPGROUP // 32], [0])
    slots = gl.full([_THREADS_PER_WARPGROUP], 0, gl.int32, layout) + slot
    gl.inline_asm_elementwise(_copies_arrive_asm(SMEM_OFFSET), "=r,r,r", [slots, smem_base(slots)],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.constexpr_function
def _wait_asm(smem_offset, hoisted, suspend_ns=0):
    # $1: the barrier's slot, $2: the phase parity waited for; hoisted: $3 the shared window's
    # base. The same spin as Gluon's mbarrier.wait (try_wait in a loop), on the address
    # arrive_unsynced computes; the label is local to the braces, so the block may appear many
    # times in one kernel. suspend_ns > 0: try_wait's suspend-time hint, the bound on how long the
    # thread may sleep in it before it retries (ptxas: NANOSLEEP.SYNCS after a failed try, woken by
    # the barrier's phase change, where the plain loop re-issues its try)
    hint = f", {int(suspend_ns)}" if suspend_ns else ""
    return ("{ .reg .pred complete; .reg .b32 addr; " + _slot_address("$1", smem_offset, hoisted)
            + "waitLoop: mbarrier.try_wait.parity.shared::cta.b64 complete, [addr], $2" + hint + "; "
            "@!complete bra.uni waitLoop; mov.u32 $0, 0; }")


@gluon.jit
def wait_unsynced(slot, phase, SMEM_OFFSET: gl.constexpr, HOIST_BASE: gl.constexpr = False,
                  SUSPEND_NS: gl.constexpr = 0):
    """Wait for barrier ``slot`` of the array at ``SMEM_OFFSET`` to complete phase ``phase``, in
    inline PTX: Triton's shared-memory barrier analysis sees no wait, and puts no ``bar.sync``
    before it (Gluon 3.6 fences a consumer's first wait of a K/V step with one: the wait on the
    same array a step before is a pending access to it). Every thread waits for itself, so
    nothing a barrier would order is left: what the wait makes visible — the TMA's bytes — is
    read only by the ``wgmma``s issued after it. ``HOIST_BASE`` as in :func:`arrive_unsynced`;
    ``SUSPEND_NS`` > 0: ``try_wait``'s suspend-time hint (:func:`_wait_asm`).
    """
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [_THREADS_PER_WARPGROUP // 32], [0])
    zeros = gl.full([_THREADS_PER_WARPGROUP], 0, gl.int32, layout)
    if HOIST_BASE:
        gl.inline_asm_elementwise(_wait_asm(SMEM_OFFSET, True, SUSPEND_NS), "=r,r,r,r",
                                  [zeros + slot, zeros + phase, smem_base(zeros)],
                                  dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise(_wait_asm(SMEM_OFFSET, False, SUSPEND_NS), "=r,r,r",
                                  [zeros + slot, zeros + phase], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def ready_wait(ready_bars, idx, phase, SMEM_OFFSET: gl.constexpr = -1, HOIST_BASE: gl.constexpr = False):
    """A consumer waits for K/V ring slot ``idx``'s ``ready`` barrier (phase ``phase``): Gluon's
    wait, or with ``SMEM_OFFSET`` ≥ 0 (``asm_waits``) :func:`wait_unsynced`."""
    if SMEM_OFFSET >= 0:
        wait_unsynced(idx, phase, SMEM_OFFSET, HOIST_BASE)
    else:
        mbarrier.wait(ready_bars.index(idx), phase)


@gluon.jit
def release(empty_bars, idx, PER_THREAD: gl.constexpr, SMEM_OFFSET: gl.constexpr = -1,
            HOIST_BASE: gl.constexpr = False, PEER: gl.constexpr = False):
    """A consumer warpgroup frees K/V ring slot ``idx``: its arrival on the slot's ``empty`` barrier.

    Elected (``PER_THREAD`` off): one thread arrives. Gluon 3.6 lowers that arrival with a
    partition-wide ``bar.sync`` in front of it (the elected thread speaks for the other 127), two
    per steady K/V step — the warpgroup's four warps meet there twice a step, where FA3 and FA4
    meet none. With ``SMEM_OFFSET`` ≥ 0 (``asm_arrivals``) the elected arrival is inline PTX
    (:func:`arrive_unsynced`) and meets no barrier. Per-thread: each of the 128 threads arrives for
    itself through ``cp.async.mbarrier.arrive.noinc`` (an arrival that fires once the thread's
    earlier ``cp.async`` copies have landed: a consumer issues none, so at once), and the barrier
    expects 128 arrivals per consumer (:func:`release_arrivals`). No ``bar.sync``: the slot is free
    when the last thread has arrived, and every thread arrives after its own
    ``warpgroup_mma_wait`` for the GEMM that read the slot, so no warp can still be reading it.
    ``PEER`` (``kv_multicast``, with ``asm_arrivals``): the elected arrival lands on the cluster
    peer's barrier as well, whose producer writes half of this CTA's slot.
    """
    if PER_THREAD:
        async_copy.mbarrier_arrive(empty_bars.index(idx), increment_count=False)
    elif SMEM_OFFSET >= 0:
        arrive_unsynced(idx, SMEM_OFFSET, HOIST_BASE, PEER)
    else:
        mbarrier.arrive(empty_bars.index(idx))


@gluon.jit
def wait_mma_after_softmax(gate, x, NUM_OUTSTANDING: gl.constexpr = 0):
    """``wait(0)`` in a basic block of its own, so ptxas cannot hoist it above the softmax.

    ptxas schedules within a basic block and treats a ``WARPGROUP.DEPBAR`` as always ready: it
    drops it into the first latency bubble of the softmax (the row-max shuffles), which stalls
    the warpgroup on PV(j-1) before a single exp2 and undoes the overlap (SASS census). Behind a
    branch on a runtime value (``gate == gate``: true unless NaN, which neither LLVM nor ptxas may
    fold) the wait stays after the exp2 block. The caller still waits unconditionally right
    after, to get its accumulator back: that second wait finds nothing outstanding. ``x`` is any
    register tensor, passed through (the wait op needs at least one dependency). FA4's order uses
    the same guard after the row max (``gate_pv_wait``), passing the new row max through it, and
    ``staged_scores`` after the first box's row max (``NUM_OUTSTANDING``: the groups left pending,
    there PV's and nothing of QK's).
    """
    if gate == gate:
        x = warpgroup_mma_wait(NUM_OUTSTANDING, deps=[x])
    return x


# the kernel's constexprs that name a shared-memory array's offset in inline PTX, and the array each
# names: the arrivals of ``asm_arrivals``, the waits of ``asm_waits``, the copies of ``kv_multicast``. -1: not used;
# 0 before the first compile (a placeholder fwd.barrier_offsets replaces)
BARRIER_OFFSETS = {
    "K_EMPTY_AT": "k_empty_bars", "V_EMPTY_AT": "v_empty_bars", "TURN_AT": "turn_bars",
    "K_READY_AT": "k_ready_bars", "V_READY_AT": "v_ready_bars", "TURN_WAIT_AT": "turn_bars",
    # kv_multicast's producer copies (multicast.load_half): the K/V rings and the ready barriers it arms
    "K_RING_AT": "k_bufs", "V_RING_AT": "v_bufs", "K_ARM_AT": "k_ready_bars", "V_ARM_AT": "v_ready_bars",
    # producer_unsynced's Q copies (multicast.load_q): the Q buffers and their ready barriers, and
    # the Q empty barriers its inline waits read
    "Q_BUFS_AT": "q_bufs", "Q_ARM_AT": "q_ready_bars", "Q_EMPTY_AT": "q_empty_bars",
    # relay_release: the K/V relay barriers the producers arrive on in each other's CTA (relay_to_peer)
    "K_RELAY_AT": "k_relay_bars", "V_RELAY_AT": "v_relay_bars",
}
# the config switch that puts each of them in inline PTX
BARRIER_SWITCHES = {"K_EMPTY_AT": "asm_arrivals", "V_EMPTY_AT": "asm_arrivals", "TURN_AT": "asm_arrivals",
                    "K_READY_AT": "asm_waits", "V_READY_AT": "asm_waits", "TURN_WAIT_AT": "asm_waits",
                    "K_RING_AT": "kv_multicast", "V_RING_AT": "kv_multicast", "K_ARM_AT": "kv_multicast",
                    "V_ARM_AT": "kv_multicast", "Q_BUFS_AT": "producer_unsynced", "Q_ARM_AT": "producer_unsynced",
                    "Q_EMPTY_AT": "producer_unsynced", "K_RELAY_AT": "relay_release", "V_RELAY_AT": "relay_release"}


def resolve_shared_offsets(compile_with, constexprs: dict, names: dict[str, str], owner: str,
                           offsets_of=None) -> dict:
    """``constexprs`` with the shared-memory byte offsets its inline PTX names filled in: each
    ``names`` key (a constexpr) not -1 gets the offset of the ``ttg.local_alloc`` its value names.

    ``compile_with(constexprs)`` compiles the kernel and returns the compiled object (its
    ``asm["ttgir"]``); ``compile_with(constexprs, ttgir_only=True)`` returns the TTGIR text alone,
    lowered no further (:func:`ttgir_of`, :func:`warmup_compiler`). The first build names offset 0
    in the inline PTX and stops at TTGIR: the allocation pass of its TTGIR (``offsets_of``,
    :func:`allocation_offsets` by default) gives the arrays' real offsets, and LLVM, PTX and ptxas
    would only make a kernel nobody launches. The second, the whole compile, names those offsets
    and must allocate them at the same places, or this raises rather than return a kernel whose
    inline PTX would address other memory. Used by hopper.fwd's barrier arrays
    (``fwd.barrier_offsets``) and the ladder's inline ring copies (ladder.v20).
    """
    offsets_of = offsets_of or allocation_offsets
    asked = {k: v for k, v in names.items() if constexprs.get(k, -1) != -1}
    first = offsets_of(compile_with(dict(constexprs, **{k: 0 for k in asked}), ttgir_only=True))
    filled = dict(constexprs, **{k: first[v] for k, v in asked.items()})
    second = offsets_of(compile_with(filled).asm["ttgir"])
    moved = {v: (first[v], second.get(v)) for v in asked.values() if second.get(v) != first[v]}
    if moved:
        raise RuntimeError(f"{owner}: the shared-memory arrays named in inline PTX moved between "
                           f"compiles (offset first, second): {moved}")
    return filled


def ttgir_of(src, target, options: dict | None = None) -> str:
    """The TTGIR ``triton.compile(src, target=target, options=options)`` lowers, and nothing after it:
    Triton's front end and TTGIR stage without LLVM, PTX or ptxas. A first build of
    :func:`resolve_shared_offsets` needs no more (the allocation pass reads TTGIR); the stages it
    skips are about two thirds of a hopper.fwd build's compile (d128 causal default, sm_90a,
    Triton's own stage times on a CI-class core: 0.9 s front end and 0.1 s TTGIR against 0.9 s LLVM
    IR, 0.4 s PTX and 0.9 s ptxas). The text is kept in Triton's cache beside the compiles, under the
    key ``triton.compile`` would file this source under (source, options, backend, environment), so
    a later process reads it back as it reads a compiled kernel, instead of building it again.

    Drives Triton 3.6's stages as ``triton.compile`` does (``src.make_ir``, the backend's
    ``add_stages``); ``tests/test_census.py`` checks its text against the compiled TTGIR, character
    for character."""
    import hashlib

    from triton._C.libtriton import get_cache_invalidating_env_vars, ir
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key, get_cache_manager

    backend = make_backend(target)
    parsed = backend.parse_options(dict(options or {}, **src.parse_options()))
    key = get_cache_key(src, backend, parsed, env_vars=get_cache_invalidating_env_vars())
    cache = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
    filename = f"{src.name[:150]}.ttgir-only"
    kept = cache.get_file(filename)
    if kept is not None:
        with open(kept) as f:
            return f.read()
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, parsed, backend.get_codegen_implementation(parsed), backend.get_module_map(),
                         context)
    stages: dict = {}
    backend.add_stages(stages, parsed, src.language)
    order = list(stages)
    metadata = {"target": target, **parsed.__dict__}
    for name in order[order.index(src.ext):order.index("ttgir") + 1]:
        module = stages[name](module, metadata)
    text = str(module)
    cache.put(text, filename, binary=False)
    return text


class _TTGIRProbe(Exception):
    """Carries a launch's TTGIR out of a JIT compile stopped there (:func:`warmup_compiler`)."""

    def __init__(self, ttgir: str):
        super().__init__("TTGIR probe")
        self.ttgir = ttgir


# one TTGIR probe at a time: a probe swaps the JIT function's compile for its own while it runs
_PROBE_LOCK = threading.Lock()


def warmup_compiler(kernel, *args, **kwargs):
    """``compile_with`` for :func:`resolve_shared_offsets` over a JIT launch:
    ``compile_with(constexprs)`` is ``kernel.warmup(*args, **constexprs, **kwargs)``;
    ``compile_with(constexprs, ttgir_only=True)`` goes through the same warmup — the JIT's own
    binding, specialization and options — with :func:`ttgir_of` in place of ``triton.compile``,
    and stops there by an exception raised before the JIT caches a kernel, so nothing half-built
    is ever launched. A kernel the JIT holds already gives its compiled TTGIR. While a probe runs,
    another thread's compile of the same kernel goes to Triton's compile as before."""
    def compile_with(constexprs: dict, ttgir_only: bool = False):
        if not ttgir_only:
            return kernel.warmup(*args, **constexprs, **kwargs)

        from triton.runtime.driver import driver

        with _PROBE_LOCK:
            # the JIT sets its compile function when it first builds a device's binder
            # (create_binder): built now, so that a first launch on this device cannot set it back
            # over the probe
            kernel.device_caches[driver.active.get_current_device()]
            compile_fn, prober = kernel.compile, threading.get_ident()

            def probe(src, **compile_args):
                if threading.get_ident() != prober:
                    return compile_fn(src, **compile_args)
                raise _TTGIRProbe(ttgir_of(src, compile_args.get("target"), compile_args.get("options")))

            kernel.compile = probe
            try:
                return kernel.warmup(*args, **constexprs, **kwargs).asm["ttgir"]
            except _TTGIRProbe as stopped:
                return stopped.ttgir
            finally:
                kernel.compile = compile_fn

    return compile_with


def allocation_offsets(ttgir: str, capability: int | None = None, ptx_version: int = 86) -> dict[str, int]:
    """Byte offsets into dynamic shared memory of every named ``ttg.local_alloc`` in ``ttgir``, as
    Triton's shared-memory allocation pass assigns them (the pass the compiler runs first when it
    lowers TTGIR to LLVM, run here on its own).

    The pass sees shapes, layouts and lifetimes, not inline PTX: a kernel that names an offset in
    its inline PTX (``arrive_unsynced``) allocates exactly as the same kernel with any other
    offset there, which is what makes a compile-twice build sound (``fwd.barrier_offsets`` checks
    the second compile against the first).
    """
    import re
    import tempfile

    from triton._C.libtriton import ir, nvidia, passes

    if capability is None:   # the target the TTGIR was lowered for (``ttg.target = "cuda:90"``)
        target = re.search(r'"?ttg\.target"?\s*=\s*"cuda:(\d+)"', ttgir)
        capability = int(target.group(1)) if target else 90

    ctx = ir.context()
    ir.load_dialects(ctx)
    nvidia.load_dialects(ctx)
    with tempfile.NamedTemporaryFile("w", suffix=".ttgir") as f:
        f.write(ttgir)
        f.flush()
        mod = ir.parse_mlir_module(f.name, ctx)
    pm = ir.pass_manager(ctx)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, capability, ptx_version)
    pm.run(mod, "allocation_offsets")
    pattern = re.compile(r"%(\w+) = ttg\.local_alloc \{allocation\.offset = (\d+) : i32\}")
    return {m.group(1): int(m.group(2)) for m in pattern.finditer(str(mod))}
