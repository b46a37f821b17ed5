"""Dependency lower bounds for overlapped schedules (seed 001, 0x03-0x05).

Three idealised schedules, each with its serial baseline. All are scheduling bounds with no
issue cost, barrier, latency, occupancy or compiler placement: they say how much overlap the
dependency graph allows, not what a kernel will run at.

- :func:`producer_consumer` (0x03): a load stage (T_L per tile) feeding a compute stage (T_C)
  through an s-stage ring. ``T = T_L + T_C + (J-1)·max(T_L, T_C)`` for s >= 2; one stage
  serialises, as does J = 1. T_L=300, T_C=500, J=5: 4,000 serial, 2,800 overlapped (1.43x, not
  the asymptotic 1.6x).
- :func:`two_stage_wgmma` (0x05): one warpgroup issues QK(j) and PV(j-1) together and runs
  softmax(j) while PV(j-1) is in flight. ``T = M_Q + E + (J-1)·(M_Q + max(E, M_V)) + M_V``;
  with M_Q = M_V = E = 1 and J = 5: 15 serial vs 11.
- :func:`pingpong` (0x04): two consumer warpgroups alternate so one's softmax hides under the
  other's GEMM; N quanta take ``M + E + (N-1)·max(M, E)``, so the asymptotic ceiling is
  ``(M+E)/max(M,E) <= 2``.
"""
from __future__ import annotations

import dataclasses


def _nonneg(**xs: float) -> None:
    for k, v in xs.items():
        if v < 0:
            raise ValueError(f"{k} must be >= 0, got {v!r}")


def _count(**xs: int) -> None:
    for k, v in xs.items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")


@dataclasses.dataclass(frozen=True)
class OverlapBound:
    serial: float
    overlapped: float

    @property
    def speedup(self) -> float:
        return self.serial / self.overlapped if self.overlapped else 1.0

    def to_json(self) -> dict:
        return {"serial": self.serial, "overlapped": self.overlapped, "speedup": self.speedup}


def producer_consumer(t_load: float, t_compute: float, tiles: int, stages: int = 2) -> OverlapBound:
    """Seed 001 0x03: a load/compute pipeline over ``tiles`` tiles through a ``stages``-deep ring."""
    _nonneg(t_load=t_load, t_compute=t_compute)
    _count(tiles=tiles, stages=stages)
    serial = tiles * (t_load + t_compute)
    if stages == 1:
        # The next load cannot start before the consumer releases the only slot.
        return OverlapBound(serial, serial)
    overlapped = t_load + t_compute + (tiles - 1) * max(t_load, t_compute)
    return OverlapBound(serial, overlapped)


def two_stage_wgmma(m_qk: float, softmax: float, m_pv: float, tiles: int) -> OverlapBound:
    """Seed 001 0x05: the intra-warpgroup QK / softmax / PV two-stage pipeline over ``tiles``."""
    _nonneg(m_qk=m_qk, softmax=softmax, m_pv=m_pv)
    _count(tiles=tiles)
    serial = tiles * (m_qk + softmax + m_pv)
    # Startup QK(0)+softmax(0), steady pairs bounded by QK then the slower of softmax and PV,
    # drain PV(J-1).
    overlapped = m_qk + softmax + (tiles - 1) * (m_qk + max(softmax, m_pv)) + m_pv
    return OverlapBound(serial, overlapped)


def pingpong(mma: float, softmax: float, quanta: int) -> OverlapBound:
    """Seed 001 0x04: two consumers alternating GEMM and softmax over ``quanta`` work items."""
    _nonneg(mma=mma, softmax=softmax)
    _count(quanta=quanta)
    serial = quanta * (mma + softmax)
    overlapped = mma + softmax + (quanta - 1) * max(mma, softmax)
    return OverlapBound(serial, overlapped)


def asymptotic_speedup(a: float, b: float) -> float:
    """(a + b) / max(a, b): the long-stream ceiling of overlapping two stages."""
    _nonneg(a=a, b=b)
    top = max(a, b)
    return (a + b) / top if top else 1.0
