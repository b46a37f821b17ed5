"""The statistics of the timing protocol, as pure functions over timing series (seed 000, 2.1, 2.8).

Nothing here touches a GPU: the runners in :mod:`flashrung.bench.timing` produce series, and
everything a verdict rests on is computed from them here, so it can be tested on synthetic data.

- **Paired margins.** Baseline and candidate alternate inside one process; each alternation
  yields one ratio ``margin = t_baseline / t_candidate`` (> 1: the candidate is faster). Both
  arms of an alternation ran microseconds apart under the same clock state, so drift shared by
  neighbouring launches divides out. The reported margin is the median of these ratios, with its
  spread. Dividing two medians taken from different blocks (the *unpaired* ratio) does not cancel
  drift; it is kept only to show the difference.
- **Order halves.** The first half of the alternations runs baseline-then-candidate (AB), the
  second half candidate-then-baseline (BA). An honest margin agrees in sign across halves; a
  margin produced by running second (a warmer clock, a primed cache) flips.
- **A/A null.** The same kernel against itself through the same path, in fresh processes:
  ``t_noise = p95 |margin − 1|`` over the runs sets the keep threshold ``t_keep = 1 + t_noise``
  before any result exists.
- **Keep gate.** KEEP needs a paired margin ≥ t_keep, a second paired run in a fresh process
  clearing it too, AB/BA halves agreeing in sign, and both kernels passing the correctness gate.
  A margin at or below ``1 − t_noise`` in every run, halves agreeing, is a measured slowdown:
  REVERT (as is a candidate failing the gate). Anything else cannot be told from the null: NULL.
- **Shared slowdowns.** An alternation in which *both* arms ran well above their own medians was
  slowed by the machine (another process, a clock or power excursion), not by either kernel; its
  ratio still pairs, but a window of them widens the spread and can split the AB/BA halves. Each
  summary counts them (``shared_slow``) and the verdict names them; they are not dropped.
- **Chains.** A margin over a grandparent is a product of paired links, never a ratio of medians;
  a re-anchor compares that product with a direct paired run, within ``√(links + 1) · t_noise``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np

KEEP, REVERT, NULL = "KEEP", "REVERT", "NULL"
AB, BA = "AB", "BA"   # AB: baseline ran first in the alternation
# an alternation is a shared slowdown when both arms ran at least this much above their own run
# medians: on the H200 the environment's excursions put both arms at 1.3-2x for several
# alternations, while a kernel's own run-to-run spread stays within a few percent
SHARED_SLOW_FACTOR = 1.2


def _array(values: Iterable[float], name: str) -> np.ndarray:
    a = np.asarray(list(values), dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty sequence of numbers")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name} must hold positive finite times")
    return a


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def nearest_rank(values: Sequence[float], fraction: float) -> float:
    """The ``ceil(fraction·n)``-th smallest value: a quantile that never interpolates below the
    data (at n = 10, p95 is the maximum, which is the honest reading of ten samples)."""
    a = np.sort(np.asarray(values, dtype=np.float64))
    if a.size == 0:
        raise ValueError("values must not be empty")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    return float(a[max(0, math.ceil(fraction * a.size) - 1)])


@dataclasses.dataclass(frozen=True)
class Distribution:
    """Per-call timing distribution of one implementation on one row (milliseconds)."""

    n: int
    median: float
    p10: float
    p90: float
    min: float
    max: float

    @property
    def dispersion(self) -> float:
        """(p90 − p10) / median: the spread of single measurements, not the median's uncertainty."""
        return (self.p90 - self.p10) / self.median

    @classmethod
    def of(cls, times: Sequence[float]) -> "Distribution":
        a = _array(times, "times")
        return cls(n=int(a.size), median=float(np.median(a)), p10=percentile(a, 10),
                   p90=percentile(a, 90), min=float(a.min()), max=float(a.max()))

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "dispersion": self.dispersion}


@dataclasses.dataclass(frozen=True)
class PairedRun:
    """One paired, interleaved run: per alternation, each arm's block time and which ran first."""

    baseline: tuple[float, ...]
    candidate: tuple[float, ...]
    order: tuple[str, ...]

    def __post_init__(self):
        b = _array(self.baseline, "baseline")
        c = _array(self.candidate, "candidate")
        if b.size != c.size or len(self.order) != b.size:
            raise ValueError("baseline, candidate and order must have one entry per alternation")
        if any(o not in (AB, BA) for o in self.order):
            raise ValueError(f"order entries must be {AB!r} or {BA!r}")

    def margins(self) -> np.ndarray:
        return np.asarray(self.baseline) / np.asarray(self.candidate)

    def to_json(self) -> dict:
        return {"baseline": list(self.baseline), "candidate": list(self.candidate), "order": list(self.order)}

    @classmethod
    def from_json(cls, d: dict) -> "PairedRun":
        return cls(tuple(d["baseline"]), tuple(d["candidate"]), tuple(d["order"]))


def half_orders(alternations: int) -> tuple[str, ...]:
    """AB for the first half of the alternations, BA for the second."""
    if alternations < 2 or alternations % 2:
        raise ValueError(f"alternations must be an even number ≥ 2, got {alternations!r}")
    return (AB,) * (alternations // 2) + (BA,) * (alternations // 2)


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


@dataclasses.dataclass(frozen=True)
class PairedSummary:
    """A paired run reduced to the figures a verdict reads."""

    n: int
    margin: float          # median per-alternation margin
    lo: float              # p10 of the per-alternation margins
    hi: float              # p90
    margin_ab: float       # median over the AB half
    margin_ba: float       # median over the BA half
    unpaired_ratio: float  # median(baseline blocks) / median(candidate blocks), for contrast
    shared_slow: int = 0   # alternations with both arms ≥ SHARED_SLOW_FACTOR × their own medians

    @property
    def halves_agree(self) -> bool:
        """The AB and BA halves put the margin on the same side of 1 (exactly 1 agrees with nothing)."""
        s_ab, s_ba = _sign(self.margin_ab - 1.0), _sign(self.margin_ba - 1.0)
        return s_ab != 0 and s_ab == s_ba

    @property
    def order_effect(self) -> float:
        """margin_AB / margin_BA − 1: how much running first or second moves the margin."""
        return self.margin_ab / self.margin_ba - 1.0

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "halves_agree": self.halves_agree,
                "order_effect": self.order_effect}

    @classmethod
    def from_json(cls, d: dict) -> "PairedSummary":
        # summaries written before shared_slow was counted read as 0 (not counted)
        return cls(**{f.name: d[f.name] if f.default is dataclasses.MISSING else d.get(f.name, f.default)
                      for f in dataclasses.fields(cls)})


def summarize(run: PairedRun) -> PairedSummary:
    m = run.margins()
    order = np.asarray(run.order)
    ab, ba = m[order == AB], m[order == BA]
    if ab.size == 0 or ba.size == 0:
        raise ValueError("a paired run needs alternations in both orders (AB and BA)")
    return PairedSummary(n=int(m.size), margin=float(np.median(m)), lo=percentile(m, 10),
                         hi=percentile(m, 90), margin_ab=float(np.median(ab)),
                         margin_ba=float(np.median(ba)),
                         unpaired_ratio=unpaired_ratio(run.baseline, run.candidate),
                         shared_slow=shared_slowdowns(run.baseline, run.candidate))


def shared_slowdowns(baseline: Sequence[float], candidate: Sequence[float],
                     factor: float = SHARED_SLOW_FACTOR) -> int:
    """Alternations in which both arms took at least ``factor`` × their own median time."""
    b, c = _array(baseline, "baseline"), _array(candidate, "candidate")
    if b.size != c.size:
        raise ValueError("baseline and candidate must have one entry per alternation")
    if not factor > 1:
        raise ValueError(f"factor must be > 1, got {factor!r}")
    return int(np.sum((b >= factor * np.median(b)) & (c >= factor * np.median(c))))


def unpaired_ratio(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """median(baseline) / median(candidate): what dividing two separate medians reports."""
    return float(np.median(_array(baseline, "baseline")) / np.median(_array(candidate, "candidate")))


# ---------------------------------------------------------------------------------------------
# A/A null and the keep gate


def t_noise(aa_margins: Sequence[float], quantile: float = 0.95) -> float:
    """p95 of |margin − 1| over A/A margins (nearest rank: at n = 10 it is the maximum)."""
    a = np.asarray(list(aa_margins), dtype=np.float64)
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError("aa_margins must be a non-empty sequence of positive margins")
    return nearest_rank(np.abs(a - 1.0), quantile)


MIN_NULL_PAIRS = 10


@dataclasses.dataclass(frozen=True)
class Verdict:
    verdict: str                   # KEEP | REVERT | NULL
    t_noise: float
    reasons: tuple[str, ...]       # every check, passed or not, in words
    runs: tuple[PairedSummary, ...]

    @property
    def t_keep(self) -> float:
        return 1.0 + self.t_noise

    @property
    def margin(self) -> float | None:
        """The margin a chain multiplies: the first run's paired median (None: nothing was timed,
        an arm failed its correctness gate)."""
        return self.runs[0].margin if self.runs else None

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "t_noise": self.t_noise, "t_keep": self.t_keep,
                "margin": self.margin, "reasons": list(self.reasons),
                "runs": [r.to_json() for r in self.runs]}


def keep_gate(runs: Sequence[PairedSummary], t_noise_value: float, *,
              baseline_correct: bool | None, candidate_correct: bool | None) -> Verdict:
    """Apply the keep gate to one or two paired runs (the second from a fresh process).

    ``*_correct`` is the correctness-gate result, ``None`` when the gate does not apply (a peer
    that returns no LSE); only ``False`` blocks. ``runs`` may be empty only when an arm failed its
    gate (it is then not timed): the verdict follows from the gate alone and has no margin.
    """
    if not runs and baseline_correct is not False and candidate_correct is not False:
        raise ValueError("runs must hold at least one paired run (none only when an arm failed its gate)")
    if not (t_noise_value >= 0 and math.isfinite(t_noise_value)):
        raise ValueError(f"t_noise must be a finite non-negative number, got {t_noise_value!r}")
    t_keep, t_revert = 1.0 + t_noise_value, 1.0 - t_noise_value
    reasons = []
    for i, r in enumerate(runs, 1):
        where = "run 1" if i == 1 else f"run {i} (fresh process)"
        reasons.append(f"{where}: margin {r.margin:.6f} [p10 {r.lo:.6f}, p90 {r.hi:.6f}] vs t_keep {t_keep:.6f}"
                       f" → {'clears' if r.margin >= t_keep else 'does not clear'}")
        reasons.append(f"{where}: AB half {r.margin_ab:.6f}, BA half {r.margin_ba:.6f} → "
                       f"{'agree' if r.halves_agree else 'disagree'} in sign")
        if r.shared_slow:
            reasons.append(f"{where}: {r.shared_slow} of {r.n} alternations ran ≥ {SHARED_SLOW_FACTOR:g}× "
                           "their medians on both sides (the machine, not either kernel): they widen "
                           "this run's spread; a rerun may resolve it")
    for name, ok in (("baseline", baseline_correct), ("candidate", candidate_correct)):
        reasons.append(f"{name} correctness gate: "
                       + {True: "passed", False: "FAILED", None: "not applicable"}[ok])

    if candidate_correct is False:
        why = "candidate fails the correctness gate" + ("" if runs else ": not timed")
        return Verdict(REVERT, t_noise_value, tuple(reasons + [why]), tuple(runs))
    if not runs:
        return Verdict(NULL, t_noise_value, tuple(reasons + ["baseline fails the correctness gate: nothing can be "
                                                             "compared against it; not timed"]), ())
    replicated = len(runs) >= 2
    if not replicated:
        reasons.append("no second paired run in a fresh process: a single run cannot keep")
    halves = all(r.halves_agree for r in runs)
    if (replicated and all(r.margin >= t_keep for r in runs) and halves
            and all(r.margin_ab > 1 and r.margin_ba > 1 for r in runs) and baseline_correct is not False):
        return Verdict(KEEP, t_noise_value, tuple(reasons), tuple(runs))
    if all(r.margin <= t_revert for r in runs) and halves and all(r.margin_ab < 1 for r in runs):
        return Verdict(REVERT, t_noise_value, tuple(reasons + ["candidate is measurably slower"]), tuple(runs))
    if baseline_correct is False:
        reasons.append("baseline fails the correctness gate: nothing can be kept against it")
    reasons.append("indistinguishable from the A/A null: keep the baseline")
    return Verdict(NULL, t_noise_value, tuple(reasons), tuple(runs))


# ---------------------------------------------------------------------------------------------
# Chains and re-anchoring


@dataclasses.dataclass(frozen=True)
class Link:
    """One kept step of a chain: a paired margin of ``candidate`` over ``baseline``."""

    baseline: str
    candidate: str
    margin: float | None      # None: not timed (an arm failed its correctness gate)
    verdict: str
    paired: bool = True

    @classmethod
    def from_json(cls, d: dict) -> "Link":
        if "link" in d:   # a whole `flashrung compare --json` document
            d = d["link"]
        margin = None if d["margin"] is None else float(d["margin"])
        return cls(baseline=d["baseline"], candidate=d["candidate"], margin=margin,
                   verdict=d["verdict"], paired=bool(d.get("paired", False)))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def kept_chain(links: Sequence[Link]) -> list[Link]:
    """The KEEP links, checked to be paired and to chain (each starts where the last ended)."""
    kept = [link for link in links if link.verdict == KEEP]
    for link in kept:
        if not link.paired:
            raise ValueError(f"link {link.baseline} → {link.candidate} is not a paired margin; a chain "
                             "multiplies paired links only, never ratios of medians")
        if link.margin is None or not link.margin > 0:
            raise ValueError(f"link {link.baseline} → {link.candidate} has no positive margin")
    for prev, nxt in zip(kept, kept[1:]):
        if prev.candidate != nxt.baseline:
            raise ValueError(f"chain is broken: {prev.baseline} → {prev.candidate} is followed by "
                             f"{nxt.baseline} → {nxt.candidate}")
    return kept


def chain_product(links: Sequence[Link]) -> float:
    kept = kept_chain(links)
    if not kept:
        raise ValueError("no KEEP links to multiply")
    return float(np.prod([link.margin for link in kept]))


CONSISTENT, OVERSHOOT, UNDERSHOOT = "CONSISTENT", "OVERSHOOT", "UNDERSHOOT"


@dataclasses.dataclass(frozen=True)
class Reanchor:
    product: float
    measured: float
    n_links: int
    t_noise: float

    @property
    def gap(self) -> float:
        """product / measured − 1."""
        return self.product / self.measured - 1.0

    @property
    def tolerance(self) -> float:
        """√(links + 1) · t_noise: k independent link errors and one anchor error, added in quadrature."""
        return math.sqrt(self.n_links + 1) * self.t_noise

    @property
    def verdict(self) -> str:
        if abs(self.gap) <= self.tolerance:
            return CONSISTENT
        # product above the direct run: a keep counted twice or keeps that interfere
        return OVERSHOOT if self.gap > 0 else UNDERSHOOT

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "gap": self.gap, "tolerance": self.tolerance,
                "verdict": self.verdict}
