"""Prices of FA4's two softmax levers (seed 001, 0x09) on a rate table.

1. **Partial software exp2.** A fraction φ of a tile's M·N exponentials leaves MUFU.EX2 for the
   degree-3 polynomial on the FP32 pipe (:data:`~flashrung.model.exp2poly.EMULATION_OPS`):

       T_exp(φ) = (1 - φ)·M·N / R_exp
       T_fma(φ) = M·N·(c0 + φ·k) / R_fma       k = FP32-pipe ops per emulated exp2

   where c0 is the FP32-pipe work per score the softmax already does (0 in the paper's model,
   which omits it). The two balance at φ* = (R_fma/R_exp - c0) / (R_fma/R_exp + k). The lever
   can only move the tile's lower bound when the exponential term is the largest one.

   Beside the tensor pipe the MUFU runs at R_exp·(1 − k·β) where the rate table carries the
   measured coupling k (:mod:`flashrung.model.ledger`): the split's exponential time is then
   (1 − φ)·T_exp + k·T_MMA, and the exponentials stop binding a tile from
   φ_min = 1 − (max(T_MMA, T_SMEM) − k·T_MMA) / T_exp (:func:`coupled_unbinding_fraction`).

2. **Conditional rescaling.** Rescaling O costs M·dv multiplies on the FP32 pipe per K/V tile;
   skipping a share s of them (threshold τ on the base-2 max increase, warp-uniform vote) saves
   s·M·dv / R_fma cycles per tile — an FP32-pipe saving, not an MMA or MUFU one.
"""
from __future__ import annotations

import dataclasses

from flashrung.model import exp2poly
from flashrung.model.ledger import Tile, bound_of, forward
from flashrung.model.rates import RateTable


def _fraction(name: str, v: float) -> None:
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {v!r}")


@dataclasses.dataclass(frozen=True)
class ExpSplitPrice:
    fraction: float
    mma_cycles: float
    smem_cycles: float
    exp_cycles: float
    fma_cycles: float

    def times(self) -> dict[str, float]:
        return {"mma": self.mma_cycles, "smem": self.smem_cycles, "exp": self.exp_cycles,
                "fma": self.fma_cycles}

    @property
    def bound(self) -> float:
        return bound_of(self.times())[0]

    @property
    def bound_resources(self) -> tuple[str, ...]:
        return bound_of(self.times())[1]

    def to_json(self) -> dict:
        return {**self.times(), "fraction": self.fraction, "bound": self.bound,
                "bound_resources": list(self.bound_resources)}


def price_exp_split(rates: RateTable, tile: Tile, fraction: float, element_bytes: int = 2,
                    base_fma_ops_per_score: float = 0.0,
                    fma_ops_per_emulated: int = exp2poly.FMA_PIPE_OPS) -> ExpSplitPrice:
    """The forward tile's resource times with ``fraction`` of its exponentials emulated."""
    _fraction("fraction", fraction)
    if base_fma_ops_per_score < 0:
        raise ValueError(f"base_fma_ops_per_score must be >= 0, got {base_fma_ops_per_score!r}")
    led = forward(rates, tile, element_bytes)
    scores = tile.m * tile.n
    return ExpSplitPrice(
        fraction=fraction,
        mma_cycles=led.mma_cycles,
        smem_cycles=led.smem_cycles,
        exp_cycles=(1.0 - fraction) * scores / rates.exp.value,
        fma_cycles=scores * (base_fma_ops_per_score + fraction * fma_ops_per_emulated) / rates.fma.value,
    )


def coupled_unbinding_fraction(rates: RateTable, tile: Tile, element_bytes: int = 2) -> float | None:
    """The smallest share φ of a forward tile's exponentials to emulate so that, with the MUFU
    slowed beside the tensor pipe, they no longer exceed the tile's MMA and SMEM times: 0 where
    they already fit, None without a measured coupling. Issue slots are not in the ledger: what
    each emulated exp2 costs there (about ten on sm_90) is the lever's other price."""
    led = forward(rates, tile, element_bytes)
    if led.exp_mma_coupling is None:
        return None
    room = max(led.mma_cycles, led.smem_cycles) - led.exp_mma_coupling * led.mma_cycles
    return min(1.0, max(0.0, 1.0 - room / led.exp_cycles))


def balanced_fraction(rates: RateTable, base_fma_ops_per_score: float = 0.0,
                      fma_ops_per_emulated: int = exp2poly.FMA_PIPE_OPS) -> float:
    """φ* at which MUFU and the FP32 pipe finish a tile's exponentials together (in [0, 1])."""
    ratio = rates.fma.value / rates.exp.value
    phi = (ratio - base_fma_ops_per_score) / (ratio + fma_ops_per_emulated)
    return min(1.0, max(0.0, phi))


@dataclasses.dataclass(frozen=True)
class RescalePrice:
    rescale_cycles_always: float     # FP32-pipe cycles per tile when every row rescales O
    saved_cycles: float              # with a share ``skipped`` of rescales skipped
    skipped: float
    share_of_bound: float            # saved / the tile's lower bound

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def price_conditional_rescale(rates: RateTable, tile: Tile, skipped: float,
                              element_bytes: int = 2) -> RescalePrice:
    _fraction("skipped", skipped)
    always = tile.m * tile.dv / rates.fma.value
    saved = skipped * always
    return RescalePrice(always, saved, skipped, saved / forward(rates, tile, element_bytes).bound)


def exp_binds(rates: RateTable, tile: Tile, element_bytes: int = 2) -> bool:
    """Whether the exponential path reaches the forward tile's lower bound (alone or tied)."""
    return "exp" in forward(rates, tile, element_bytes).bound_resources
