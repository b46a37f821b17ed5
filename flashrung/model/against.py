"""Measured time against the modeled lower bound, per benchmark row.

A whole attention call is many tiles. Its modeled lower bound adds every tile's resource work
(the ledger with instruction ceilings, ragged edge tiles priced at their real size, causal tiles
counted only where live) and takes the larger of

- the machine bound: ``max over resources of total work / SM count`` (every SM busy), and
- the chain bound: the largest single CTA's own ``max over resources`` (one CTA runs on one SM),

then divides by the rate table's clock. ``measured / bound`` says how far a kernel is from what
the model allows; it is >= 1 unless the model's rates are wrong.

The input is a results JSON (``flashrung bench --json`` or the baseline files): a list of rows,
or ``{"rows": [...]}``. A row names its shape with ``batch``/``B``, ``seqlen_q``/``seqlen_k`` or
``seqlen``/``S``, ``heads_q``/``heads``/``H``, ``headdim``/``D`` (``headdim_v`` optional),
``causal`` and ``mode`` (``fwd``, ``bwd``, ``fwd+bwd``); a time is any ``*_ms`` or ``*_us``
field, in the row or in dicts nested under it (one per implementation); ``fwd_ms`` / ``bwd_ms``
set the mode of their own measurement. Rows without a shape or a time are listed as skipped.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator, Mapping

from flashrung.model import ledger as L
from flashrung.model import schedule as S
from flashrung.model.rates import RateTable
from flashrung import jsonfile

MODES = ("fwd", "bwd", "fwd+bwd")
_LABEL_KEYS = ("impl", "kind", "backend", "name", "kernel", "peer", "tag")


@dataclasses.dataclass(frozen=True)
class Problem:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    headdim: int
    headdim_v: int
    causal: bool
    mode: str = "fwd"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for k in ("batch", "seqlen_q", "seqlen_k", "heads", "headdim", "headdim_v"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{k} must be a positive integer, got {v!r}")

    def short(self) -> str:
        c = " causal" if self.causal else ""
        return (f"B{self.batch} H{self.heads} Sq{self.seqlen_q} Sk{self.seqlen_k} "
                f"d{self.headdim}{c} {self.mode}")


@dataclasses.dataclass(frozen=True)
class ProblemBound:
    cycles: float
    machine_cycles: float
    chain_cycles: float
    bound_resources: tuple[str, ...]   # of the machine bound
    resource_cycles: dict              # total per resource, all SMs together
    seconds: float

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["bound_resources"] = list(self.bound_resources)
        return d


def _add(acc: dict, times: Mapping[str, float], k: float = 1.0) -> None:
    for r, v in times.items():
        acc[r] = acc.get(r, 0.0) + k * v


def _tile_times(rates: RateTable, direction: str, m: int, n: int, d: int, dv: int,
                element_bytes: int, cache: dict) -> dict:
    key = (direction, m, n)
    if key not in cache:
        tile = L.Tile(m, n, d, dv)
        led = L.forward(rates, tile, element_bytes) if direction == "fwd" else L.backward(rates, tile, element_bytes)
        cache[key] = led.times()
    return cache[key]


def _direction_bound(rates: RateTable, p: Problem, direction: str, tile: tuple[int, int],
                     element_bytes: int) -> tuple[dict, float]:
    """(total resource cycles over the problem, the costliest CTA's own bound)."""
    bm, bn = tile
    nq = S.q_blocks(p.seqlen_q, bm)
    nk = S.kv_blocks(p.seqlen_k, bn)
    live = S.causal_costs(bm, bn, p.seqlen_q, p.seqlen_k, p.causal)
    cache: dict = {}
    total: dict = {}
    # Per-CTA work: the forward walks K/V tiles for one query tile, the backward walks query
    # tiles for one K/V tile.
    chains = [dict() for _ in range(nq if direction == "fwd" else nk)]
    for m in range(nq):
        rows = min(bm, p.seqlen_q - m * bm)
        for j in range(live[m]):
            cols = min(bn, p.seqlen_k - j * bn)
            t = _tile_times(rates, direction, rows, cols, p.headdim, p.headdim_v, element_bytes, cache)
            _add(total, t)
            _add(chains[m if direction == "fwd" else j], t)
    heads = p.batch * p.heads
    total = {r: v * heads for r, v in total.items()}
    chain = max((max(c.values()) for c in chains if c), default=0.0)
    return total, chain


def problem_bound(rates: RateTable, p: Problem, tile: tuple[int, int] = (128, 128),
                  element_bytes: int = 2) -> ProblemBound:
    directions = ("fwd", "bwd") if p.mode == "fwd+bwd" else (p.mode,)
    cycles = machine = chain = 0.0
    totals: dict = {}
    resources: tuple[str, ...] = ()
    for direction in directions:
        total, ch = _direction_bound(rates, p, direction, tile, element_bytes)
        if not total:   # no live tile (every row masked)
            continue
        per_sm = {r: v / rates.sm_count.value for r, v in total.items()}
        mach, res = L.bound_of(per_sm)
        # The directions run one after the other, so their bounds add.
        cycles += max(mach, ch)
        machine += mach
        chain += ch
        resources = res if not resources else resources
        _add(totals, total)
    seconds = cycles / (rates.clock_ghz.value * 1e9)
    return ProblemBound(cycles, machine, chain, resources, totals, seconds)


@dataclasses.dataclass(frozen=True)
class AgainstRow:
    label: str
    problem: Problem | None
    measured_ms: float | None
    bound_ms: float | None
    bound_resources: tuple[str, ...] = ()
    skipped: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.measured_ms is None or not self.bound_ms:
            return None
        return self.measured_ms / self.bound_ms

    def to_json(self) -> dict:
        return {
            "label": self.label,
            "problem": dataclasses.asdict(self.problem) if self.problem else None,
            "measured_ms": self.measured_ms,
            "bound_ms": self.bound_ms,
            "ratio": self.ratio,
            "bound_resources": list(self.bound_resources),
            "skipped": self.skipped,
        }


def _first(row: Mapping, *keys: str) -> Any:
    for k in keys:
        if k in row and row[k] is not None:
            return row[k]
    return None


def _problem_of(row: Mapping, mode: str) -> Problem | None:
    b = _first(row, "batch", "B")
    sq = _first(row, "seqlen_q", "seqlen", "S")
    sk = _first(row, "seqlen_k", "seqlen", "S")
    h = _first(row, "heads_q", "heads", "H")
    d = _first(row, "headdim", "head_dim", "D")
    if None in (b, sq, sk, h, d):
        return None
    dv = _first(row, "headdim_v", "head_dim_v", "Dv") or d
    return Problem(int(b), int(sq), int(sk), int(h), int(d), int(dv), bool(row.get("causal", False)), mode)


def _times_in(obj: Any, path: str) -> Iterator[tuple[str, str, float]]:
    """(label path, time key, milliseconds) for every time found in ``obj`` and below it."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if isinstance(v, bool):
                continue
            if isinstance(v, (int, float)) and (k.endswith("_ms") or k == "ms"):
                yield path, k, float(v)
            elif isinstance(v, (int, float)) and (k.endswith("_us") or k == "us"):
                yield path, k, float(v) / 1e3
            elif isinstance(v, (Mapping, list)):
                label = _label(v) if isinstance(v, Mapping) else None
                yield from _times_in(v, f"{path}/{label or k}" if path else (label or k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            label = _label(v) if isinstance(v, Mapping) else None
            yield from _times_in(v, f"{path}/{label or i}" if path else (label or str(i)))


def _label(row: Mapping) -> str | None:
    parts = [str(row[k]) for k in _LABEL_KEYS if isinstance(row.get(k), (str, int)) and not isinstance(row.get(k), bool)]
    return ":".join(parts[:2]) if parts else None


def _mode_of(key: str, row_mode: str) -> str:
    if key.startswith("fwd_") or key.startswith("forward_"):
        return "fwd"
    if key.startswith("bwd_") or key.startswith("backward_"):
        return "bwd"
    return row_mode


def rows_of(doc: Any) -> list[Mapping]:
    if isinstance(doc, Mapping):
        for k in ("rows", "results"):
            if isinstance(doc.get(k), list):
                return doc[k]
        raise ValueError("results JSON must be a list of rows or an object with a 'rows' list")
    if isinstance(doc, list):
        return doc
    raise ValueError("results JSON must be a list of rows or an object with a 'rows' list")


def against(rates: RateTable, doc: Any, tile: tuple[int, int] = (128, 128),
            element_bytes: int = 2) -> list[AgainstRow]:
    out: list[AgainstRow] = []
    bound_cache = functools.lru_cache(maxsize=None)(
        lambda p: problem_bound(rates, p, tile, element_bytes))
    for i, row in enumerate(rows_of(doc)):
        if not isinstance(row, Mapping):
            out.append(AgainstRow(f"row {i}", None, None, None, skipped="not an object"))
            continue
        label = _label(row) or f"row {i}"
        row_mode = str(row.get("mode", "fwd"))
        if row_mode not in MODES:
            out.append(AgainstRow(label, None, None, None, skipped=f"mode {row_mode!r} not modeled"))
            continue
        shape = _problem_of(row, row_mode)
        if shape is None:
            out.append(AgainstRow(label, None, None, None, skipped="no attention shape"))
            continue
        found = list(_times_in(row, ""))
        if not found:
            out.append(AgainstRow(label, shape, None, None, skipped="no measured time"))
            continue
        for path, key, ms in found:
            p = dataclasses.replace(shape, mode=_mode_of(key, row_mode))
            pb = bound_cache(p)
            name = label if not path else f"{label} {path}"
            if key not in ("ms", "median_ms", "time_ms", "fwd_ms", "bwd_ms", "us"):
                name = f"{name} [{key}]"
            out.append(AgainstRow(name, p, ms, pb.seconds * 1e3, pb.bound_resources))
    return out


def load(path: str) -> Any:
    return jsonfile.read(path)


def format_table(rows: list[AgainstRow], rates: RateTable) -> str:
    lines = [f"measured time / modeled lower bound on {rates.name} ({rates.gpu}), "
             f"clock {rates.clock_ghz.value:.3f} GHz ({rates.clock_ghz.provenance})",
             f"{'row':<40} {'problem':<38} {'measured ms':>12} {'bound ms':>10} {'ratio':>7}  bound by"]
    for r in rows:
        if r.skipped:
            lines.append(f"{r.label:<40} skipped: {r.skipped}")
            continue
        lines.append(f"{r.label[:40]:<40} {r.problem.short()[:38]:<38} {r.measured_ms:>12.4f} "
                     f"{r.bound_ms:>10.4f} {r.ratio:>7.3f}  {L.describe_bound(r.bound_resources)}")
    return "\n".join(lines)
