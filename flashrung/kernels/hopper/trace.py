"""Clock stamps of the Hopper forward's K/V steps (``HopperFwdConfig.trace_steps``).

Where one overlapped K/V step's cycles go — waiting for its K/V tiles, for the pingpong turn, for
its scores, in the softmax, for the previous PV — is what a profile's stall samples only hint at
and what the model of the loop has to be checked against. With ``trace_steps = N`` every CTA's
first work item records, for each consumer warpgroup and each of its first N steps, the SM's
``%clock`` at the :data:`EVENTS` of the step, halved (:data:`CLOCK_SHIFT`: a 31-bit stamp is never
negative, so -1 marks a step not stamped); thread 0 of the warpgroup writes them. The output is
exact (the stamps read a counter and store it beside the work); the times carry the few
instructions the stamps add. Off (N = 0) the stamps compile to nothing (census: the default
kernels' SASS is unchanged).

The stamps go to the split tail's coordinate workspace pointer, which no launch without the split
tail dereferences, so the kernel keeps its signature: ``trace_steps`` needs ``split_tail=False``.
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


@gluon.jit
def step_record(coords_ptr, tile_iter, j, WG: gl.constexpr, c):
    """``(pointer to this step's record, whether to stamp it)``: every CTA's first work item, its
    first ``TRACE_STEPS`` steps; the record of (CTA, warpgroup, step) is NUM_EVENTS int32."""
    if c.TRACE_STEPS > 0:
        record = (gl.program_id(0) * c.NUM_CONSUMERS + WG) * c.TRACE_STEPS + j
        out = (coords_ptr + record * _NUM_EVENTS, (tile_iter == 0) & (j < c.TRACE_STEPS))
    else:
        out = (coords_ptr, False)
    return out


@gluon.jit
def stamp(trace, rows, first_row, EVENT: gl.constexpr, TRACE_STEPS: gl.constexpr):
    """The SM clock at ``EVENT`` into ``trace``'s record (thread 0's row of the warpgroup stores)."""
    if TRACE_STEPS > 0:
        base, on = trace
        if on:
            # %clock read by every thread holding a row; not pure, so it stays where it is written
            t = gl.inline_asm_elementwise("{ mov.u32 $0, %clock; shr.u32 $0, $0, 1; }", "=r,r", [rows],
                                          dtype=gl.int32, is_pure=False, pack=1)
            gl.store(base + EVENT + rows * 0, t, mask=rows == first_row)
