"""Clock stamps of the Hopper forward's K/V steps (``HopperFwdConfig.trace_steps``).

Where one overlapped K/V step's cycles go — waiting for its K/V tiles, for the pingpong turn, for
its scores, in the softmax, for the previous PV — is what a profile's stall samples only hint at
and what the model of the loop has to be checked against. With ``trace_steps = N`` every CTA's
first work item records, for each consumer warpgroup and each of its first N steps, the SM's
``%clock`` at the :data:`EVENTS` of the step, halved (:data:`CLOCK_SHIFT`: a 31-bit stamp is never
negative, so -1 marks a step not stamped); thread 0 of the warpgroup writes them. The output is
exact (the stamps read a counter and store it beside the work); the times carry the few
instructions the stamps add. Off (N = 0) the stamps compile to nothing (census: the default
kernels' SASS is unchanged). With ``trace_item = K`` the CTA's item K is stamped instead of its
first (a CTA with fewer items stamps nothing). With ``trace_warps`` the first thread of each of the warpgroup's four
warps stamps its own row of events: how far apart the warps of one warpgroup run, which a
warpgroup-wide barrier or ``wgmma`` absorbs as a wait of the warps ahead.

The stamps go to the split tail's coordinate workspace pointer, which no launch without the split
tail dereferences, so the kernel keeps its signature: ``trace_steps`` needs ``split_tail=False``.

``trace_tiles = N`` (the same pointer, so not with ``trace_steps``; on a launch that splits its
tail, the balanced grid's table pointer instead, which such a launch never reads) records each
consumer warpgroup's first N work items whole: the clock at the item's start (before its Q wait)
and after its epilogue, the item's K/V steps and masked steps, the item's index, and the GPU's
global timer at its start and end (:data:`TILE_FIELDS`) — a tile's cost, to be split into what
every tile pays and what each of its steps pays, and, since every SM reads the same global timer,
when each item ran on one time axis: the last round, and the split items of a split tail, in
place.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# one stamp per event of a step, in program order (FA3's order: "mid" is the end of the softmax;
# FA4's order: the row max, before PV(j-1) is waited for and the exponentials run)
EVENTS = ("top", "ready", "turn", "issued", "scores", "mid", "pv", "end")
NUM_EVENTS = len(EVENTS)
E_TOP, E_READY, E_TURN, E_ISSUED, E_SCORES, E_MID, E_PV, E_END = (gl.constexpr(i) for i in range(NUM_EVENTS))
_NUM_EVENTS = gl.constexpr(NUM_EVENTS)
# stamps are %clock >> CLOCK_SHIFT: 2-cycle resolution, and the 32-bit counter's top bit (set half
# the time) never makes a stamp negative
CLOCK_SHIFT = 1
# with trace_warps every warp of a consumer warpgroup stamps its own row of events: wgmma's m64
# accumulator puts 16 rows in each of the warpgroup's four warps
WARPS_PER_WARPGROUP = 4
_WARPS_PER_WARPGROUP = gl.constexpr(WARPS_PER_WARPGROUP)
ROWS_PER_WARP = gl.constexpr(16)
_CLOCK_ASM = gl.constexpr("{ mov.u32 $0, %clock; shr.u32 $0, $0, " + str(CLOCK_SHIFT) + "; }")


@gluon.jit
def clock(rows):
    """The SM clock (``>> CLOCK_SHIFT``), one value per row of ``rows``' layout; not pure, so it
    stays where it is written."""
    return gl.inline_asm_elementwise(_CLOCK_ASM, "=r,r", [rows], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def step_record(coords_ptr, tile_iter, j, WG: gl.constexpr, c):
    """``(pointer to this step's record, whether to stamp it)``: every CTA's work item number
    ``TRACE_ITEM`` (0: its first), its first ``TRACE_STEPS`` steps; the record of (CTA,
    warpgroup, step) is NUM_EVENTS int32, or
    WARPS_PER_WARPGROUP × NUM_EVENTS with ``TRACE_WARPS`` (one row of events per warp)."""
    if c.TRACE_STEPS > 0:
        record = (gl.program_id(0) * c.NUM_CONSUMERS + WG) * c.TRACE_STEPS + j
        if c.TRACE_WARPS:
            record = record * _WARPS_PER_WARPGROUP
        out = (coords_ptr + record * _NUM_EVENTS, (tile_iter == c.TRACE_ITEM) & (j < c.TRACE_STEPS))
    else:
        out = (coords_ptr, False)
    return out


@gluon.jit
def stamp(trace, rows, first_row, EVENT: gl.constexpr, TRACE_STEPS: gl.constexpr, TRACE_WARPS: gl.constexpr):
    """The SM clock at ``EVENT`` into ``trace``'s record (thread 0's row of the warpgroup stores;
    with ``TRACE_WARPS``, the first row of each warp into that warp's row of events)."""
    if TRACE_STEPS > 0:
        base, on = trace
        if on:
            # %clock read by every thread holding a row; not pure, so it stays where it is written.
            # Written here rather than through clock(): through the helper the trace_steps builds
            # compiled to other SASS (census), and the traces measured before read these builds
            t = gl.inline_asm_elementwise(_CLOCK_ASM, "=r,r", [rows], dtype=gl.int32, is_pure=False, pack=1)
            if TRACE_WARPS:
                # wgmma's accumulator gives warp w of the warpgroup rows 16w..16w+15: the warps'
                # stamps differ by how far each runs ahead of the warpgroup's slowest
                within = rows - first_row
                gl.store(base + EVENT + (within // ROWS_PER_WARP) * _NUM_EVENTS, t,
                         mask=within % ROWS_PER_WARP == 0)
            else:
                gl.store(base + EVENT + rows * 0, t, mask=rows == first_row)


# one record per (CTA, consumer warpgroup, work item): its start and end stamps (SM clock), K/V
# steps, masked steps, the item's index, its start and end on the global timer
TILE_FIELDS = ("start", "end", "steps", "masked", "item", "start_ns", "end_ns")
NUM_TILE_FIELDS = len(TILE_FIELDS)
_NUM_TILE_FIELDS = gl.constexpr(NUM_TILE_FIELDS)
# global-timer stamps are its low word >> GLOBAL_TIMER_SHIFT: units of 2**GLOBAL_TIMER_SHIFT ns
# (32 ns, about the timer's own resolution), never negative, wrapping every 2**32 ns (4.3 s), far
# beyond a launch
GLOBAL_TIMER_SHIFT = 5
_GLOBAL_TIMER_ASM = gl.constexpr("{ mov.u32 $0, %globaltimer_lo; shr.u32 $0, $0, " + str(GLOBAL_TIMER_SHIFT) + "; }")


@gluon.jit
def global_time(rows):
    """The GPU's global timer (ns ``>> GLOBAL_TIMER_SHIFT``), one value per row of ``rows``'
    layout: the same clock on every SM, unlike ``%clock``."""
    return gl.inline_asm_elementwise(_GLOBAL_TIMER_ASM, "=r,r", [rows], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _tile_fields(coords_ptr, rows, first_row, tile_iter, WG: gl.constexpr, c):
    """(item ``tile_iter``'s record of this CTA's warpgroup ``WG``, the mask of the one thread that
    stores it: the thread holding ``first_row``)."""
    record = coords_ptr + ((gl.program_id(0) * c.NUM_CONSUMERS + WG) * c.TRACE_TILES + tile_iter) * _NUM_TILE_FIELDS
    return record + rows * 0, rows == first_row


@gluon.jit
def tile_start(coords_ptr, rows, first_row, tile_iter, item, n_steps, n_masked, WG: gl.constexpr, c):
    """Item ``tile_iter``'s start stamps, K/V steps, masked steps and index, stored at once while
    ``tile_iter < TRACE_TILES`` (nothing with ``TRACE_TILES = 0``): a stamp held in a register
    through the tile made the d128 kernel keep 88 B in local memory (census)."""
    if c.TRACE_TILES > 0:
        if tile_iter < c.TRACE_TILES:
            record, leader = _tile_fields(coords_ptr, rows, first_row, tile_iter, WG, c)
            gl.store(record + 0, clock(rows), mask=leader)
            gl.store(record + 5, global_time(rows), mask=leader)
            gl.store(record + 2, rows * 0 + n_steps, mask=leader)
            gl.store(record + 3, rows * 0 + n_masked, mask=leader)
            gl.store(record + 4, rows * 0 + item, mask=leader)


@gluon.jit
def tile_end(coords_ptr, rows, first_row, tile_iter, WG: gl.constexpr, c):
    """Item ``tile_iter``'s end stamps (after its epilogue)."""
    if c.TRACE_TILES > 0:
        if tile_iter < c.TRACE_TILES:
            record, leader = _tile_fields(coords_ptr, rows, first_row, tile_iter, WG, c)
            gl.store(record + 1, clock(rows), mask=leader)
            gl.store(record + 6, global_time(rows), mask=leader)
