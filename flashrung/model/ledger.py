"""Feeds-and-speeds ledgers for one attention tile (seed 001, 0x08 forward and 0x0A backward).

For a forward tile Q[M,d], K[N,d], V[N,dv] on one SM:

    T_MMA  = 2·M·N·(d + dv) / R_MMA                 (= 4MNd/R_MMA when dv = d)
    T_SMEM = (B_QK + B_PV) / R_SMEM, with operand reads counted per MMA instruction:
             B_QK = b · ceil(M/m) · (n_instr(N) · m·d · [Q from SMEM] + pad(N)·d)
             B_PV = b · ceil(M/m) · (N·pad(dv) + n_instr(dv) · m·N · [P from SMEM])
    T_exp  = M·N / R_exp

where (m, n_max, granule) is the rate table's :class:`~flashrung.model.rates.OperandTile`. For
the paper's B200 model (m = n_max = granule = 128) this is exactly seed 001's
``B_QK = b·I_QK·(128d + 128d)`` and ``B_PV = b·I_PV·128N``; when M, N, d divide by 128 it
simplifies to ``3bMNd/(128 R_SMEM)``. ``max(T)`` is an optimistic lower bound (perfect overlap),
``sum(T)`` the no-overlap subtotal; neither is a runtime. The crossover head dimension where
exponentials tie the MMAs is ``d* = R_MMA / (4 R_exp)``.

Where the rate table carries the exponential unit's coupling to the tensor pipe — measured on the
H200, the exponentials run at ``R_exp·(1 − k·β)`` beside a pipe busy a share ``β`` of the time — the
ledger also reports the *coupled* bound. Over a tile of time ``T`` the pipe is busy ``β = T_MMA/T``;
if the exponentials bind, ``T = M·N / (R_exp(1 − k·T_MMA/T))``, that is ``T = T_exp + k·T_MMA``; if
the MMAs bind (``β = 1``) the exponentials take ``T_exp/(1 − k) ≤ T_MMA``, the same condition. So
``max(T_MMA, T_SMEM, T_exp + k·T_MMA)``, and the crossover moves to ``d* = R_MMA / (4 R_exp (1 − k))``.

The backward ledger follows seed 001 0x0A's one-CTA model: five MMAs (10MNd FLOPs), the MMA
operand reads ``b(4Md + 3Nd + MN)``, the dS write ``b·MN``, the FP32 dQ staging write plus read
``8·M·d`` bytes, and ``M·N`` exponentials; the seed states it for divisible tiles, without
instruction ceilings.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable

from flashrung.model.rates import RateTable

RESOURCES = ("mma", "smem", "exp")
# Two resource times closer than this (relative) are a tie: "mma and exp" in seed 001's table.
_TIE_RTOL = 1e-9

ELEMENT_BYTES = {"bf16": 2, "fp16": 2}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pad(x: int, granule: int) -> int:
    return _ceil_div(x, granule) * granule


def _check_dims(**dims: int) -> None:
    for name, v in dims.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


@dataclasses.dataclass(frozen=True)
class Tile:
    """One work tile: M query rows against N keys at head dimensions d (QK) and dv (PV)."""

    m: int
    n: int
    d: int
    dv: int | None = None

    def __post_init__(self):
        if self.dv is None:
            object.__setattr__(self, "dv", self.d)
        _check_dims(m=self.m, n=self.n, d=self.d, dv=self.dv)

    @classmethod
    def parse(cls, tile: str, headdim: int, headdim_v: int | None = None) -> "Tile":
        """``"128x128"`` plus a head dimension."""
        try:
            m, n = (int(x) for x in tile.lower().split("x"))
        except ValueError:
            raise ValueError(f"tile must look like '128x128' (M x N), got {tile!r}") from None
        return cls(m, n, headdim, headdim_v)


def bound_of(times: dict[str, float]) -> tuple[float, tuple[str, ...]]:
    """The largest resource time and every resource that reaches it (ties included)."""
    top = max(times.values())
    names = tuple(k for k, v in times.items() if math.isclose(v, top, rel_tol=_TIE_RTOL))
    return top, names


class _ResourceTotals:
    """What a ledger derives from its three resource times (``mma_cycles``, ``smem_cycles``,
    ``exp_cycles``): the lower bound (perfect overlap), the resources that set it, and the serial
    subtotal (no overlap)."""

    def times(self) -> dict[str, float]:
        return {"mma": self.mma_cycles, "smem": self.smem_cycles, "exp": self.exp_cycles}

    @property
    def bound(self) -> float:
        return bound_of(self.times())[0]

    @property
    def bound_resources(self) -> tuple[str, ...]:
        return bound_of(self.times())[1]

    @property
    def serial(self) -> float:
        return sum(self.times().values())

    @property
    def coupled_exp_cycles(self) -> float | None:
        """``T_exp + k·T_MMA``: the exponentials' time beside the tensor pipe (module docstring);
        None without a measured coupling."""
        if self.exp_mma_coupling is None:
            return None
        return self.exp_cycles + self.exp_mma_coupling * self.mma_cycles

    def coupled_times(self) -> dict[str, float] | None:
        if self.exp_mma_coupling is None:
            return None
        return {"mma": self.mma_cycles, "smem": self.smem_cycles, "exp": self.coupled_exp_cycles}

    def coupled_json(self) -> dict | None:
        """The coupled bound for ``to_json`` (None without a coupling)."""
        times = self.coupled_times()
        if times is None:
            return None
        top, names = bound_of(times)
        return {"k": self.exp_mma_coupling, "exp_cycles": times["exp"], "bound": top,
                "bound_resources": list(names)}


@dataclasses.dataclass(frozen=True)
class ForwardLedger(_ResourceTotals):
    tile: Tile
    rates: str
    element_bytes: int
    flops: int
    exps: int
    qk_instructions: int     # MMA instructions (m x n_max coverage) for S = QKᵀ
    pv_instructions: int     # ... for O += PV
    qk_smem_bytes: int
    pv_smem_bytes: int
    mma_cycles: float
    smem_cycles: float
    exp_cycles: float
    exp_mma_coupling: float | None = None   # k of the rate table (None: not measured)

    def to_json(self) -> dict:
        return {
            "direction": "fwd",
            "rates": self.rates,
            "tile": dataclasses.asdict(self.tile),
            "element_bytes": self.element_bytes,
            "flops": self.flops,
            "exps": self.exps,
            "qk_instructions": self.qk_instructions,
            "pv_instructions": self.pv_instructions,
            "qk_smem_bytes": self.qk_smem_bytes,
            "pv_smem_bytes": self.pv_smem_bytes,
            "mma_cycles": self.mma_cycles,
            "smem_cycles": self.smem_cycles,
            "exp_cycles": self.exp_cycles,
            "bound": self.bound,
            "bound_resources": list(self.bound_resources),
            "serial": self.serial,
            "coupled": self.coupled_json(),
        }


def _coupling(rates: RateTable) -> float | None:
    return None if rates.exp_mma_coupling is None else rates.exp_mma_coupling.value


def forward(rates: RateTable, tile: Tile, element_bytes: int = 2) -> ForwardLedger:
    """Seed 001 0x08's forward ledger for ``tile`` on ``rates``, instruction ceilings included."""
    _check_dims(element_bytes=element_bytes)
    op = rates.operand_tile
    m, n, d, dv = tile.m, tile.n, tile.d, tile.dv
    m_blocks = _ceil_div(m, op.m)

    # S = Q Kᵀ: the B operand is K (N wide); each n-instruction re-reads the A operand Q.
    n_pad = _pad(n, op.n_granule)
    qk_n_instr = _ceil_div(n_pad, op.n_max)
    qk_bytes = element_bytes * m_blocks * (qk_n_instr * op.m * d * op.qk_a_in_smem + n_pad * d)

    # O = P V: the B operand is V (dv wide, contraction over N).
    dv_pad = _pad(dv, op.n_granule)
    pv_n_instr = _ceil_div(dv_pad, op.n_max)
    pv_bytes = element_bytes * m_blocks * (n * dv_pad + pv_n_instr * op.m * n * op.pv_a_in_smem)

    flops = 2 * m * n * (d + dv)
    exps = m * n
    return ForwardLedger(
        tile=tile, rates=rates.name, element_bytes=element_bytes, flops=flops, exps=exps,
        qk_instructions=m_blocks * qk_n_instr, pv_instructions=m_blocks * pv_n_instr,
        qk_smem_bytes=qk_bytes, pv_smem_bytes=pv_bytes,
        mma_cycles=flops / rates.mma_flops.value,
        smem_cycles=(qk_bytes + pv_bytes) / rates.smem_bytes.value,
        exp_cycles=exps / rates.exp.value,
        exp_mma_coupling=_coupling(rates),
    )


@dataclasses.dataclass(frozen=True)
class BackwardLedger(_ResourceTotals):
    tile: Tile
    rates: str
    element_bytes: int
    flops: int
    exps: int
    mma_operand_bytes: int
    ds_write_bytes: int
    dq_stage_bytes: int
    mma_cycles: float
    smem_mma_cycles: float
    smem_ds_cycles: float
    smem_dq_cycles: float
    exp_cycles: float
    exp_mma_coupling: float | None = None   # k of the rate table (None: not measured)

    @property
    def smem_cycles(self) -> float:
        return self.smem_mma_cycles + self.smem_ds_cycles + self.smem_dq_cycles

    def to_json(self) -> dict:
        return {
            "direction": "bwd",
            "rates": self.rates,
            "tile": dataclasses.asdict(self.tile),
            "element_bytes": self.element_bytes,
            "flops": self.flops,
            "exps": self.exps,
            "mma_operand_bytes": self.mma_operand_bytes,
            "ds_write_bytes": self.ds_write_bytes,
            "dq_stage_bytes": self.dq_stage_bytes,
            "mma_cycles": self.mma_cycles,
            "smem_mma_cycles": self.smem_mma_cycles,
            "smem_ds_cycles": self.smem_ds_cycles,
            "smem_dq_cycles": self.smem_dq_cycles,
            "smem_cycles": self.smem_cycles,
            "exp_cycles": self.exp_cycles,
            "bound": self.bound,
            "bound_resources": list(self.bound_resources),
            "serial": self.serial,
            "coupled": self.coupled_json(),
        }


# FP32 dQ is staged through SMEM once written and once read before the global reduce-add.
_DQ_BYTES_PER_ELEMENT = 4 * 2


def backward(rates: RateTable, tile: Tile, element_bytes: int = 2) -> BackwardLedger:
    """Seed 001 0x0A's one-CTA backward ledger (five MMAs, SMEM operands, dS, dQ staging, exp)."""
    _check_dims(element_bytes=element_bytes)
    m, n, d = tile.m, tile.n, tile.d
    if tile.dv != d:
        raise ValueError(f"the backward ledger models d_v == d (seed 001 0x0A), got d={d}, dv={tile.dv}")
    # S: Q + K, dP: dO + V, dQ: dS + K, then dV and dK each read one M x d operand.
    operand_elems = 4 * m * d + 3 * n * d + m * n
    operand_bytes = element_bytes * operand_elems
    ds_bytes = element_bytes * m * n
    dq_bytes = _DQ_BYTES_PER_ELEMENT * m * d
    flops = 5 * 2 * m * n * d
    r_smem = rates.smem_bytes.value
    return BackwardLedger(
        tile=tile, rates=rates.name, element_bytes=element_bytes, flops=flops, exps=m * n,
        mma_operand_bytes=operand_bytes, ds_write_bytes=ds_bytes, dq_stage_bytes=dq_bytes,
        mma_cycles=flops / rates.mma_flops.value,
        smem_mma_cycles=operand_bytes / r_smem,
        smem_ds_cycles=ds_bytes / r_smem,
        smem_dq_cycles=dq_bytes / r_smem,
        exp_cycles=m * n / rates.exp.value,
        exp_mma_coupling=_coupling(rates),
    )


def crossover_headdim(rates: RateTable) -> float:
    """d* = R_MMA / (4 R_exp): the head dimension (d = dv) at which exponentials tie the MMAs.

    Below d* the exponential unit bounds the forward tile; above it the tensor path does.
    """
    return rates.mma_flops.value / (4 * rates.exp.value)


def coupled_crossover_headdim(rates: RateTable) -> float | None:
    """d* = R_MMA / (4 R_exp (1 − k)) with the exponential unit's measured coupling to the tensor
    pipe (module docstring); None where the table has none."""
    k = _coupling(rates)
    return None if k is None else rates.mma_flops.value / (4 * rates.exp.value * (1.0 - k))


def smem_to_mma_ratio(rates: RateTable, element_bytes: int = 2) -> float:
    """T_SMEM / T_MMA for tiles that divide the instruction shape, with the paper's 128-wide
    operand tile: 3·b·R_MMA / (512·R_SMEM) (0.75 for the B200 paper model)."""
    return 3 * element_bytes * rates.mma_flops.value / (512 * rates.smem_bytes.value)


# Seed 001 0x08's four synthetic mutations of one table, in its order.
SENSITIVITY_MUTATIONS = (
    ("as quoted", {}),
    ("double only exponential throughput", {"exp": 2.0}),
    ("double only tensor throughput", {"mma_flops": 2.0}),
    ("halve only SMEM bandwidth", {"smem_bytes": 0.5}),
)


@dataclasses.dataclass(frozen=True)
class SensitivityRow:
    mutation: str
    ledger: ForwardLedger

    def to_json(self) -> dict:
        return {
            "mutation": self.mutation,
            "mma_cycles": self.ledger.mma_cycles,
            "smem_cycles": self.ledger.smem_cycles,
            "exp_cycles": self.ledger.exp_cycles,
            "bound": self.ledger.bound,
            "bound_resources": list(self.ledger.bound_resources),
        }


def mutate(rates: RateTable, factors: dict[str, float], why: str) -> RateTable:
    figs = {k: getattr(rates, k).scaled(f, why) for k, f in factors.items()}
    return rates.with_figures(**figs) if figs else rates


def sensitivity(rates: RateTable, tile: Tile, element_bytes: int = 2,
                mutations: Iterable[tuple[str, dict[str, float]]] = SENSITIVITY_MUTATIONS,
                ) -> list[SensitivityRow]:
    """Seed 001 0x08's sensitivity table: the same tile under one synthetic rate change per row."""
    return [SensitivityRow(label, forward(mutate(rates, f, label), tile, element_bytes))
            for label, f in mutations]


def describe_bound(resources: tuple[str, ...]) -> str:
    names = {"mma": "MMA", "smem": "SMEM", "exp": "exp", "fma": "FMA pipe"}
    return " and ".join(names[r] for r in resources)
