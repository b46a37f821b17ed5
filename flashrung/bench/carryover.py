"""What a block inherits from the block before it: each implementation's time by its predecessor.

The bench runs a row's implementations in blocks, back to back on one stream with no synchronisation
between them, and the GPU's clock follows the power drawn over the last hundreds of milliseconds —
longer than a block's preheat. The balanced design (``timing.balanced_orders``) puts every
implementation right after every other equally often, so a carryover averages out of each row's
ratio; it does not vanish from the single rounds, and with six rounds a row a large one decides a
paired median. This module reads it back from a run's stored blocks.

For each row, each implementation and each of its blocks but the row's first (which follows the
previous row's work, its gate and warm-up): the block's median time divided by the median of that
implementation's block medians in the row — 1.03 is a block 3% slower than the implementation's
typical one there — keyed by the implementation whose block ran just before (the previous one in
the round's order, or the previous round's last). Pooled over rows (and runs), the mean of those
ratios by (implementation, predecessor) is the table the bench report prints
(``report.carryover_table``); an implementation that
slows whatever follows it reads as a column above 1, one slowed by a particular predecessor as a
cell above its row's others.

:func:`two_speeds` reads a row the other way: an implementation whose blocks ran at two speeds by
round beside a best peer whose blocks held (the report's "two speeds" line), where the row's median
margin counts the rounds that fell on each side.

Derived from the stored timing, not a measurement of its own: which mechanism carries over (the
clock the power left, L2 contents) is for ``flashrung sustain`` (per-block clock and power) to say.
Pure: no GPU.
"""
from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping, Sequence

# a predecessor's effect on one implementation is named below the table when its slowest cell is at
# least this much (1%) above its fastest
NOTABLE_SPREAD = 0.01
# An implementation's blocks in one row run at two speeds when its slowest round's block is this much
# (8%) slower than its fastest while the best peer's blocks stay within a third of that: the two did
# not share one clock state, and a median over six rounds then counts how many rounds fell on each
# side. Seen on an H100 at the target row (flashrung 5.50-5.65 ms or 6.39-6.63 ms by round, FA4
# within 3%): what a kernel sustains there is flashrung sustain's to say, not the suite's
TWO_SPEEDS_SPREAD = 0.08
TWO_SPEEDS_PEER_SHARE = 1 / 3


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def row_ratios(row: Mapping) -> dict[tuple[str, str], list[float]]:
    """``{(impl, predecessor): [block median ÷ the impl's row median, …]}`` for one bench row, from
    its ``round_orders`` and each implementation's ``blocks_ms``; empty where the row has no stored
    blocks or rounds (a run before they were kept, an implementation that did not run)."""
    orders = [tuple(o) for o in row.get("round_orders") or ()]
    results = row.get("results") or {}
    blocks = {impl: r.get("blocks_ms") for impl, r in results.items() if r.get("status") == "ok"}
    if not orders or not blocks or any(not b or len(b) != len(orders) for b in blocks.values()):
        return {}
    if any(set(o) != set(blocks) for o in orders):
        return {}
    medians = {impl: [_median(block) for block in b] for impl, b in blocks.items()}
    typical = {impl: _median(m) for impl, m in medians.items()}
    sequence = [(r, impl) for r, order in enumerate(orders) for impl in order]
    out: dict[tuple[str, str], list[float]] = {}
    for (_, before), (r, impl) in zip(sequence, sequence[1:]):
        value, base = medians[impl][r], typical[impl]
        if base > 0 and math.isfinite(value):
            out.setdefault((impl, before), []).append(value / base)
    return out


def pooled(docs: Iterable[Mapping]) -> dict[tuple[str, str], list[float]]:
    """:func:`row_ratios` of every row of ``docs`` (bench runs), pooled by (impl, predecessor)."""
    out: dict[tuple[str, str], list[float]] = {}
    for doc in docs:
        for row in doc.get("rows", []):
            for key, values in row_ratios(row).items():
                out.setdefault(key, []).extend(values)
    return out


def summary(docs: Iterable[Mapping]) -> dict:
    """The pooled table as data: ``impls`` (in the runs' order), ``cells`` ``{impl: {predecessor:
    {"mean", "n"}}}`` and ``notable`` — per implementation whose cells differ by
    :data:`NOTABLE_SPREAD` or more, its slowest and fastest predecessor with their means."""
    docs = list(docs)
    ratios = pooled(docs)
    impls = list(dict.fromkeys(i for doc in docs for i in doc.get("impls", []) if any(k[0] == i for k in ratios)))
    cells: dict[str, dict[str, dict]] = {}
    for (impl, before), values in ratios.items():
        cells.setdefault(impl, {})[before] = dict(mean=float(sum(values) / len(values)), n=len(values))
    notable = []
    for impl in impls:
        row = cells.get(impl, {})
        if len(row) < 2:
            continue
        slow = max(row, key=lambda b: row[b]["mean"])
        fast = min(row, key=lambda b: row[b]["mean"])
        if row[slow]["mean"] >= (1 + NOTABLE_SPREAD) * row[fast]["mean"]:
            notable.append(dict(impl=impl, slowest_after=slow, slow_mean=row[slow]["mean"], fastest_after=fast,
                                fast_mean=row[fast]["mean"]))
    return dict(impls=impls, cells=cells, notable=notable)


def two_speeds(row: Mapping, impl: str, peer: str) -> dict | None:
    """Where ``impl``'s blocks in ``row`` run at two speeds beside ``peer``'s (:data:`TWO_SPEEDS_SPREAD`):
    ``spread`` and ``peer_spread`` (slowest block median ÷ fastest, minus 1), ``slow_rounds`` (1-based:
    the rounds whose block lies nearer ``impl``'s slowest than its fastest) and the paired ratio of each
    side (``peer``'s block ÷ ``impl``'s in the same round: least and most, slow rounds and the others).
    None where either has no stored blocks, or the spread is smaller, or ``peer`` spread as much."""
    results = row.get("results") or {}
    mine, theirs = (results.get(name) or {} for name in (impl, peer))
    if mine.get("status") != "ok" or theirs.get("status") != "ok":
        return None
    ours, peers_ = ([_median(b) for b in r.get("blocks_ms") or ()] for r in (mine, theirs))
    if len(ours) < 2 or len(ours) != len(peers_) or min(ours) <= 0 or min(peers_) <= 0:
        return None
    spread, peer_spread = max(ours) / min(ours) - 1, max(peers_) / min(peers_) - 1
    if spread < TWO_SPEEDS_SPREAD or peer_spread > TWO_SPEEDS_PEER_SHARE * spread:
        return None
    middle = (max(ours) + min(ours)) / 2
    slow = [r for r, t in enumerate(ours) if t > middle]
    ratios = [p / t for p, t in zip(peers_, ours)]
    sides = {name: [ratios[r] for r in rounds] for name, rounds in
             (("slow", slow), ("fast", [r for r in range(len(ours)) if r not in slow]))}
    return dict(impl=impl, peer=peer, spread=spread, peer_spread=peer_spread, slow_rounds=[r + 1 for r in slow],
                ratios={name: (min(v), max(v)) for name, v in sides.items()})
