"""Timing runners: they only produce series; :mod:`flashrung.bench.stats` reads them.

A *timer* measures a block of back-to-back calls and returns one time per call in
milliseconds. :class:`CudaEventTimer` records a chain of CUDA events between calls (one event
between neighbours, so no call is timed twice and nothing but the kernels sits between them) and
resolves them after one synchronisation; :class:`ClockTimer` reads any clock and serves CPU runs
and synthetic tests, where the "kernel" advances a virtual clock.

Two schedules, one rule: implementations alternate inside one process, so every implementation is
measured next to every other under the same clock state, and no order favours one of them.

- :func:`interleave` — the bench: n implementations, round-robin blocks, per-call times kept. The
  bench's rounds follow a carryover-balanced design (:func:`balanced_orders`): every implementation
  runs in every position of a round and right after every other implementation equally often. An
  H200 at its power limit sets each block's clock from what ran in the seconds before it, which a
  block's preheat does not undo: with seven implementations in one fixed order and its reverse, the
  target row's ratio to FA4 read 0.984–0.990 with FA4 fifth and `flashrung` sixth and 1.036–1.038
  with the two swapped (docs/hopper.md, *Against the peers*). The halves schedule below is kept for
  the paired tools and as the bench's ``order="halves"``.
- :func:`paired_run` — compare / null / reanchor: two arms, AB then BA halves, one block time per
  arm per alternation (the median of its calls), returned as a :class:`~flashrung.bench.stats.PairedRun`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from flashrung.bench import stats


class ClockTimer:
    """Per-call times from a clock that reads seconds (``time.perf_counter`` by default).

    ``sync`` runs before each reading (e.g. ``torch.cuda.synchronize``) so asynchronous work is
    counted where it ran.
    """

    def __init__(self, now: Callable[[], float] = time.perf_counter, sync: Callable[[], None] | None = None,
                 wall: Callable[[], float] = time.time):
        self._now = now
        self._sync = sync or (lambda: None)
        self._wall = wall

    def block(self, fn: Callable[[], Any], reps: int):
        times = []
        self._sync()
        t0 = self._now()
        for _ in range(reps):
            fn()
            self._sync()
            t1 = self._now()
            times.append((t1 - t0) * 1e3)
            t0 = t1
        return times

    def resolve(self, handle) -> list[float]:
        return list(handle)

    # Marks place a block on the wall clock (:func:`interleave`'s ``spans``): an anchor read once,
    # a mark where a block's preheat, its timed calls and its end fall
    def anchor(self) -> tuple[float, float]:
        self._sync()
        return self._wall(), self._now()

    def mark(self) -> float:
        self._sync()
        return self._now()

    def seconds_between(self, earlier, later) -> float:
        return later - earlier


class CudaEventTimer:
    """Per-call times from a chain of CUDA events on the current stream."""

    def __init__(self):
        import torch
        self._torch = torch

    def block(self, fn: Callable[[], Any], reps: int):
        events = [self._torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        events[0].record()
        for i in range(reps):
            fn()
            events[i + 1].record()
        return events

    def resolve(self, handle) -> list[float]:
        handle[-1].synchronize()
        return [a.elapsed_time(b) for a, b in zip(handle, handle[1:])]

    def anchor(self):
        """The wall time of an event recorded on an empty queue: the GPU reaches it as the host reads
        the clock, so the events after it place themselves on the wall clock by their elapsed time."""
        self._torch.cuda.synchronize()
        event = self.mark()
        event.synchronize()
        return time.time(), event

    def mark(self):
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds_between(self, earlier, later) -> float:
        later.synchronize()
        return earlier.elapsed_time(later) / 1e3


def measure(timer, fn: Callable[[], Any], reps: int) -> list[float]:
    return timer.resolve(timer.block(fn, reps))


# calls per arm of the host-path probe (compare's workers, after warm-up; the bench's rows at most)
HOST_PATH_CALLS = 30
# At this share of its GPU time per call, a call's host path may bound what the events measure:
# the GPU waits for the host between calls, and the time per call is the entry point's, not the
# kernel's
HOST_BOUND_SHARE = 0.8


def finite_or_none(value) -> float | None:
    """``value`` as a finite float, or None (a probe or clock reading read back from JSON)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def host_bound(probe: dict | None) -> bool:
    """Whether a :func:`host_path` probe (as measured, or read back from JSON) says the calls were
    (nearly) host-bound; a probe without two finite numbers says nothing."""
    if not probe:
        return False
    host, device = finite_or_none(probe.get("host_ms")), finite_or_none(probe.get("device_ms"))
    return bool(host is not None and device and host >= HOST_BOUND_SHARE * device)


def host_path(timer, fn: Callable[[], Any], reps: int = HOST_PATH_CALLS, *,
              now: Callable[[], float] = time.perf_counter, sync: Callable[[], None] = lambda: None) -> dict:
    """Milliseconds per call the host takes to issue ``reps`` back-to-back calls, beside what the
    timer measures for them (``device_ms``). With CUDA events the host runs ahead of the GPU while
    ``host_ms`` is well below ``device_ms``; near or above it the GPU waits for the host between
    calls and the timer measures the host path too. ``sync`` empties the queue first."""
    if reps < 1:
        raise ValueError(f"reps must be ≥ 1, got {reps!r}")
    sync()
    t0 = now()
    handle = timer.block(fn, reps)
    host_ms = (now() - t0) * 1e3 / reps
    device_ms = float(sum(timer.resolve(handle))) / reps
    return {"host_ms": host_ms, "device_ms": device_ms, "calls": reps}


@dataclasses.dataclass(frozen=True)
class Warmup:
    calls: int
    estimate_ms: float      # median of the warm-up calls after the first


def warm_up(timer, fn: Callable[[], Any], *, min_calls: int, min_ms: float) -> Warmup:
    """Run ``fn`` at least ``min_calls`` times and for at least ``min_ms``; estimate one call.

    The estimate ignores the first call (it may compile or load) and sizes the timed blocks.
    """
    if min_calls < 2:
        raise ValueError(f"min_calls must be ≥ 2 (the first call is never an estimate), got {min_calls}")
    times = measure(timer, fn, min_calls)
    steady = times[1:]
    estimate = float(np.median(steady))
    remaining = min_ms - sum(steady)
    if remaining > 0:
        extra = min(10_000, math.ceil(remaining / max(estimate, 1e-6)))
        more = measure(timer, fn, extra)
        steady += more
        estimate = float(np.median(steady))
    return Warmup(calls=1 + len(steady), estimate_ms=estimate)


def reps_for(estimate_ms: float, *, target_ms: float, lo: int, hi: int) -> int:
    """Calls per block: enough to fill ``target_ms``, within [lo, hi]."""
    if estimate_ms <= 0:
        return hi
    return int(min(hi, max(lo, math.ceil(target_ms / estimate_ms))))


def half_reversed_orders(names: Sequence[str], rounds: int) -> list[tuple[str, ...]]:
    """Round ``r`` runs ``names`` in order for the first half of the rounds, reversed after."""
    if rounds < 2 or rounds % 2:
        raise ValueError(f"rounds must be an even number ≥ 2, got {rounds!r}")
    fwd, rev = tuple(names), tuple(reversed(names))
    return [fwd if r < rounds // 2 else rev for r in range(rounds)]


def balanced_orders(names: Sequence[str]) -> list[tuple[str, ...]]:
    """A Williams design over ``names``: n rounds for an even count n, 2n for an odd one (each round
    of the square and its mirror). Every name runs in every position equally often, right after
    every other name equally often, and before every other name in exactly half of the rounds — so
    neither a block's place in the round nor the implementation before it favours one of them, and
    every pair's paired ratio has rounds in both orders."""
    n = len(names)
    if n < 1 or len(set(names)) != n:
        raise ValueError(f"names must be distinct and at least one, got {list(names)!r}")
    # first row 0, 1, n-1, 2, n-2, ...; row i adds i (mod n): each name follows each other once
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low if len(first) % 2 else high)
        low, high = (low + 1, high) if len(first) % 2 == 0 else (low, high - 1)
    rows = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [tuple(names[x] for x in row) for row in rows]


def balanced_rounds(count: int, at_least: int) -> int:
    """Rounds for ``count`` implementations: the smallest whole number of balanced designs that gives
    at least ``at_least`` rounds."""
    design = count if count % 2 == 0 else 2 * count
    return design * max(1, math.ceil(at_least / design))


ORDERS = ("balanced", "halves")


@dataclasses.dataclass(frozen=True)
class BenchProtocol:
    """How each (row, implementation) is timed in ``flashrung bench``.

    Defaults keep the full fa4-protocol suite with six implementations to a few minutes on an
    H200 (seconds of kernel time per row, see the report); ``QUICK`` cuts them for a smoke run.
    """

    warmup_calls: int = 3          # at least, after the untimed first call
    warmup_ms: float = 25.0        # at least, ms of warm-up per implementation per row
    # round-robin rounds, at least: with order="balanced" rounded up to whole designs of the row's
    # implementations (six: 6; seven: 14); with "halves", half in order and half reversed
    rounds: int = 6
    order: str = "balanced"
    block_ms: float = 20.0         # target ms per block
    block_reps_min: int = 2
    block_reps_max: int = 20
    # Untimed calls of the same implementation right before each timed block, for at least this
    # long. An H200 running attention sits at its power limit (≈690 W) and its clock follows the
    # power drawn over the last tens of milliseconds: a 20 ms block that starts right after a
    # lighter implementation runs on the clock that one left behind. Interleaved without this,
    # FA4 and cuDNN read 735 and 668 TFLOP/s at B2 H16 S16k d128 (each following a lighter peer)
    # where each one run alone for 3 s measured 662–669 and 601–606 at the same 1.64–1.67 GHz.
    # Preheating times every implementation at its own steady state, as it runs in a model. The
    # clock's settling, measured per call (FA4 at that shape): up to +13 % after idle and +19 %
    # after a lighter kernel for the first ~75–100 ms, steady from ~150 ms on.
    block_preheat_ms: float = 150.0

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")

    def orders_for(self, names: Sequence[str]) -> list[tuple[str, ...]]:
        """Each round's order for a row timing ``names``."""
        if self.order == "halves":
            return half_reversed_orders(names, self.rounds)
        design = balanced_orders(names)
        return design * (balanced_rounds(len(names), self.rounds) // len(design))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


QUICK_BENCH = BenchProtocol(warmup_calls=2, warmup_ms=5.0, rounds=2, block_ms=5.0, block_reps_min=1,
                            block_reps_max=10, block_preheat_ms=20.0)


def preheat_calls(estimate_ms: float, preheat_ms: float) -> int:
    """Untimed calls before a block: enough to run ``preheat_ms`` (none when it is 0)."""
    if preheat_ms <= 0:
        return 0
    if estimate_ms <= 0:
        return 1
    return int(math.ceil(preheat_ms / estimate_ms))


@dataclasses.dataclass(frozen=True)
class PairedProtocol:
    """The paired keep-test protocol (seed 000, 2.8: 120 alternations, order halves)."""

    alternations: int = 120        # even; first half AB, second half BA
    reps: int = 5                  # timed calls per arm per alternation (block time = their median)
    block_warmup: int = 1          # untimed calls before each block, so a block never starts cold
    warmup_calls: int = 25         # per arm, before the first alternation
    # > 0: each block is preceded by at least this many ms of its own arm's calls (not fewer than
    # block_warmup), so an arm is timed at its own power/clock steady state rather than at the one
    # the other arm left (the bench's block_preheat_ms). 0 keeps the calibrated protocol.
    block_preheat_ms: float = 0.0

    def __post_init__(self):
        if self.block_preheat_ms < 0:
            raise ValueError(f"block_preheat_ms must be >= 0, got {self.block_preheat_ms}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


QUICK_PAIRED = PairedProtocol(alternations=40, reps=3, block_warmup=1, warmup_calls=10)


@dataclasses.dataclass
class Interleaved:
    """Per implementation: per-round lists of per-call times, the reps used and the order."""

    times: dict[str, list[list[float]]]
    reps: dict[str, int]
    orders: list[tuple[str, ...]]
    # per implementation, per round: the wall time (seconds since the epoch) where the block's
    # preheat began, its timed calls began and its last call ended; None unless asked for
    spans: dict[str, list[tuple[float, float, float]]] | None = None

    def per_call(self, name: str) -> list[float]:
        return [t for block in self.times[name] for t in block]

    def block_medians(self, name: str) -> list[float]:
        return [float(np.median(block)) for block in self.times[name]]

    def paired(self, baseline: str, candidate: str) -> stats.PairedRun:
        """The rounds as a paired run of ``candidate`` over ``baseline``."""
        order = tuple(stats.AB if o.index(baseline) < o.index(candidate) else stats.BA for o in self.orders)
        return stats.PairedRun(tuple(self.block_medians(baseline)), tuple(self.block_medians(candidate)), order)


def interleave(fns: Mapping[str, Callable[[], Any]], reps: Mapping[str, int], rounds: int, timer, *,
               block_warmup: int | Mapping[str, int] = 0,
               orders: Sequence[Sequence[str]] | None = None, spans: bool = False) -> Interleaved:
    """Round-robin blocks over ``fns``; times resolve after the last round (one synchronisation).

    ``block_warmup``: untimed calls before each block, one count for all or one per name.
    ``orders``: each round's order (``rounds`` of them, each naming every fn once); default: the
    halves schedule. ``spans``: place every block on the wall clock (``Interleaved.spans``) with the
    timer's marks, outside the timed calls, so a clock sampled beside the run can be read per block."""
    names = list(fns)
    if orders is None:
        orders = half_reversed_orders(names, rounds)
    else:
        orders = [tuple(o) for o in orders]
        if len(orders) != rounds or any(sorted(o) != sorted(names) for o in orders):
            raise ValueError(f"orders must give {rounds} rounds, each naming {names} once")
    warm = block_warmup if isinstance(block_warmup, Mapping) else {n: block_warmup for n in names}
    handles: dict[str, list] = {n: [] for n in names}
    marks: dict[str, list] = {n: [] for n in names}
    anchor = timer.anchor() if spans else None
    for order in orders:
        for name in order:
            before = timer.mark() if spans else None
            for _ in range(warm.get(name, 0)):
                fns[name]()
            start = timer.mark() if spans else None
            handles[name].append(timer.block(fns[name], reps[name]))
            if spans:
                marks[name].append((before, start, timer.mark()))
    times = {n: [timer.resolve(h) for h in handles[n]] for n in names}
    placed = None
    if spans:
        wall, origin = anchor
        placed = {n: [tuple(wall + timer.seconds_between(origin, m) for m in block) for block in marks[n]]
                  for n in names}
    return Interleaved(times=times, reps=dict(reps), orders=orders, spans=placed)


PREHEAT_ESTIMATE_CALLS = 3     # calls per arm timed to size the preheat (arms are already warm)


def paired_block_warmup(fns: Mapping[str, Callable[[], Any]], protocol: PairedProtocol, timer) -> dict[str, int]:
    """Untimed calls before each block, per arm: ``block_warmup``, or enough calls to run
    ``block_preheat_ms`` (estimated from a few timed calls of the warm arm), whichever is more."""
    if protocol.block_preheat_ms <= 0:
        return {name: protocol.block_warmup for name in fns}
    out = {}
    for name, fn in fns.items():
        estimate = float(np.median(measure(timer, fn, PREHEAT_ESTIMATE_CALLS)))
        out[name] = max(protocol.block_warmup, preheat_calls(estimate, protocol.block_preheat_ms))
    return out


def paired_run(baseline: Callable[[], Any], candidate: Callable[[], Any], protocol: PairedProtocol,
               timer) -> stats.PairedRun:
    """One paired, interleaved run of two arms (both already warm): AB halves, then BA."""
    fns = {"baseline": baseline, "candidate": candidate}
    result = interleave(fns, {"baseline": protocol.reps, "candidate": protocol.reps},
                        protocol.alternations, timer, block_warmup=paired_block_warmup(fns, protocol, timer))
    return result.paired("baseline", "candidate")
