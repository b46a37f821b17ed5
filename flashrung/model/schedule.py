"""Tile costs across a launch: causal live-block counts and makespan on identical machines
(seed 001, 0x0B).

With causal masking, query tile m sees only the K/V tiles up to its last visible key, so tile
costs differ; the kernel finishes when the most-loaded SM finishes. For M = N and a square
aligned problem, tile m has ``m + 1`` live K/V blocks. Seed 001's toy: costs [1..6] on three
workers take 9 in lexical order and 7 in longest-processing-time-first (LPT) order, which meets
the lower bound ``max(sum/P, max)``.

The causal convention is the project's (bottom-right aligned): query i sees key j iff
``j <= i + (Sk - Sq)``.
"""
from __future__ import annotations

import dataclasses
import heapq
from typing import Sequence


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_positive_ints(**xs: int) -> None:
    """Raise a ValueError naming the first argument that is not a positive integer."""
    for k, v in xs.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")


def kv_blocks(seqlen_k: int, block_n: int) -> int:
    check_positive_ints(seqlen_k=seqlen_k, block_n=block_n)
    return _ceil_div(seqlen_k, block_n)


def q_blocks(seqlen_q: int, block_m: int) -> int:
    check_positive_ints(seqlen_q=seqlen_q, block_m=block_m)
    return _ceil_div(seqlen_q, block_m)


def live_blocks(q_tile: int, block_m: int, block_n: int, seqlen_q: int, seqlen_k: int,
                causal: bool = True, window_left: int = -1, diag_shift: int = 0) -> int:
    """K/V tiles that hold at least one visible score for query tile ``q_tile``. With ``window_left``
    >= 0 (a sliding window's left side, flash-attn's ``window_size[0]``), the tiles before the one
    holding the tile's first row's first visible key (:func:`window_first_block`) are not counted;
    ``diag_shift`` (with ``causal``: a window's right side) moves the diagonal that many keys right."""
    nq = q_blocks(seqlen_q, block_m)
    nk = kv_blocks(seqlen_k, block_n)
    if not 0 <= q_tile < nq:
        raise ValueError(f"q_tile must be in [0, {nq}), got {q_tile!r}")
    if causal:
        last_row = min((q_tile + 1) * block_m, seqlen_q) - 1
        last_key = last_row + (seqlen_k - seqlen_q) + diag_shift
        if last_key < 0:
            return 0      # every row of this tile sees no key (Sq > Sk, bottom-right aligned)
        end = min(nk, last_key // block_n + 1)
    else:
        end = nk
    return max(0, end - window_first_block(q_tile, block_m, block_n, seqlen_q, seqlen_k, window_left))


def window_first_block(q_tile: int, block_m: int, block_n: int, seqlen_q: int, seqlen_k: int,
                       window_left: int = -1) -> int:
    """The first K/V tile any row of ``q_tile`` sees under a sliding window of ``window_left`` keys to
    the left, bottom-right aligned as the causal mask (row ``i`` sees no key before
    ``i + Sk - Sq - window_left``): the one holding the tile's first row's first visible key; 0
    without a window (``window_left`` < 0)."""
    if not isinstance(window_left, int) or isinstance(window_left, bool):
        raise ValueError(f"window_left must be an integer (-1: no window), got {window_left!r}")
    if window_left < 0:
        return 0
    return max(0, q_tile * block_m + seqlen_k - seqlen_q - window_left) // block_n


def masked_blocks(q_tile: int, block_m: int, block_n: int, seqlen_q: int, seqlen_k: int) -> int:
    """Live K/V tiles of ``q_tile`` that need the causal mask (they hold a hidden score)."""
    live = live_blocks(q_tile, block_m, block_n, seqlen_q, seqlen_k)
    first_row = q_tile * block_m
    first_row_last_key = first_row + (seqlen_k - seqlen_q)   # the first row sees keys <= this
    # A K/V tile is mask-free when its last key is visible to the tile's first row.
    unmasked = 0
    for j in range(live):
        if min((j + 1) * block_n, seqlen_k) - 1 <= first_row_last_key:
            unmasked += 1
    return live - unmasked


def causal_costs(block_m: int, block_n: int, seqlen_q: int, seqlen_k: int,
                 causal: bool = True) -> list[int]:
    """Live K/V block count per query tile: the cheap cost proxy J_m of seed 001 0x0B."""
    return [live_blocks(m, block_m, block_n, seqlen_q, seqlen_k, causal)
            for m in range(q_blocks(seqlen_q, block_m))]


@dataclasses.dataclass(frozen=True)
class Assignment:
    tile: int
    worker: int
    start: float
    finish: float


@dataclasses.dataclass(frozen=True)
class Schedule:
    assignments: tuple[Assignment, ...]
    loads: tuple[float, ...]

    @property
    def makespan(self) -> float:
        return max(self.loads)


def _check_order(costs: Sequence[float], order: Sequence[int], workers: int) -> None:
    check_positive_ints(workers=workers)
    if sorted(order) != list(range(len(costs))):
        raise ValueError("order must be a permutation of range(len(costs))")


def list_schedule(costs: Sequence[float], order: Sequence[int], workers: int) -> Schedule:
    """Greedy first-free list scheduling: each tile in ``order`` goes to the least-loaded worker
    (lowest index on ties), as a persistent kernel's next free SM would take it."""
    _check_order(costs, order, workers)
    loads = [0.0] * workers
    out = []
    for tile in order:
        w = min(range(workers), key=lambda p: (loads[p], p))
        start = loads[w]
        loads[w] = start + costs[tile]
        out.append(Assignment(tile, w, start, loads[w]))
    return Schedule(tuple(out), tuple(loads))


def reserve_schedule(costs: Sequence[float], order: Sequence[int], workers: int, lead: float | None) -> Schedule:
    """A run-time hand-out of ``order`` in which each worker draws its next tile ``lead`` before its
    current one ends (``None``: as soon as it starts it, so it always holds one tile in reserve);
    the first ``workers`` tiles go to workers ``0 .. workers - 1``. With ``lead=0`` it is
    :func:`list_schedule`; drawn at the start, a worker busy with a heavy tile still takes the
    next one, and the launch ends as unevenly as that reserve makes it."""
    _check_order(costs, order, workers)
    if lead is not None and lead < 0:
        raise ValueError(f"lead must be None or >= 0, got {lead!r}")
    loads = [0.0] * workers
    draws = []                                   # (time of the worker's next draw, worker)
    out = []
    for tile in order:
        if len(out) < workers:
            w = len(out)
        else:
            _, w = heapq.heappop(draws)
        start = loads[w]
        loads[w] = start + costs[tile]
        out.append(Assignment(tile, w, start, loads[w]))
        heapq.heappush(draws, (start if lead is None else max(start, loads[w] - lead), w))
    return Schedule(tuple(out), tuple(loads))


def lexical_order(costs: Sequence[float]) -> list[int]:
    return list(range(len(costs)))


def lpt_order(costs: Sequence[float]) -> list[int]:
    """Longest first; equal costs keep the later tile first, as reversing the m-block order does."""
    return sorted(range(len(costs)), key=lambda i: (-costs[i], -i))


def makespan_lower_bound(costs: Sequence[float], workers: int) -> float:
    """max(sum/P, max): no schedule on P identical workers finishes earlier."""
    check_positive_ints(workers=workers)
    if not costs:
        return 0.0
    return max(sum(costs) / workers, max(costs))
