"""Pipeline state of the Hopper forward: ring slots, their phase parity, and the consumer turn.

The K/V ring has ``NUM_KV_STAGES`` slots. Item ``i`` (counted over every K/V tile the CTA has
loaded, across persistent tiles) lives in slot ``i % NUM_KV_STAGES`` and its barriers complete
generation ``i // NUM_KV_STAGES``; a wait names that generation by its parity
``(i // NUM_KV_STAGES) & 1`` (seed 001, 0x03). A freshly initialized mbarrier is in phase 0,
so waiting for parity 1 returns at once: producers wait on ``empty`` with ``parity ^ 1`` and
find every slot free the first time round.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma_wait


@gluon.jit
def ring_slot(count, NUM_STAGES: gl.constexpr):
    """(slot index, phase parity) of ring item ``count``."""
    return count % NUM_STAGES, (count // NUM_STAGES) & 1


@gluon.jit
def wait_turn(turn_bars, turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Block consumer ``WG`` until it holds the GEMM-issue token (its ``turn``-th time).

    The token circulates WG0 → WG1 (→ WG2) → WG0 through one mbarrier per consumer. WG0's first
    wait is for parity 1, which a fresh barrier already satisfies: that is the bootstrap credit.
    Every consumer takes the same number of turns per tile, so the token is back at WG0 when a
    tile ends and the next (persistent) tile starts where the ring expects it.
    """
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(turn_bars.index(WG), (turn & 1) ^ 1)
        else:
            mbarrier.wait(turn_bars.index(WG), turn & 1)
    return turn + 1


@gluon.jit
def pass_turn(turn_bars, WG: gl.constexpr, NUM_CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr):
    """Hand the GEMM-issue token to the next consumer warpgroup."""
    if PINGPONG:
        mbarrier.arrive(turn_bars.index((WG + 1) % NUM_CONSUMERS))


@gluon.jit
def wait_mma_after_softmax(gate, x):
    """``wait(0)`` in a basic block of its own, so ptxas cannot hoist it above the softmax.

    ptxas schedules within a basic block and treats a ``WARPGROUP.DEPBAR`` as always ready: it
    drops it into the first latency bubble of the softmax (the row-max shuffles), which stalls
    the warpgroup on PV(j-1) before a single exp2 and undoes the overlap (SASS census). Behind a
    branch on a runtime value (``gate == gate``: true unless NaN, which neither LLVM nor ptxas may
    fold) the wait stays after the exp2 block. The caller still waits unconditionally right
    after, to get its accumulator back: that second wait finds nothing outstanding. ``x`` is any
    register tensor, passed through (the wait op needs at least one dependency).
    """
    if gate == gate:
        x = warpgroup_mma_wait(0, deps=[x])
    return x
