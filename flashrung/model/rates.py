"""Per-SM rate tables for the resource model, each figure labelled with where it came from.

Seed 001 (0x08) prices one attention tile with three per-SM rates — tensor FLOPs per cycle,
shared-memory bytes per cycle and exponentials per cycle — and counts shared-memory operand reads
at the granularity of the MMA instruction. A :class:`RateTable` holds those rates for one GPU,
plus the FP32 FMA rate (to price software exp2, seed 001 0x09), the SM count and the clock (to
turn cycles into time), and the instruction-shape facts that decide how often an operand is
re-read (:class:`OperandTile`).

Every number is a :class:`Figure` with a provenance:

- ``quoted``: copied from a stated source (a seed, a vendor document);
- ``derived``: computed from quoted figures, the arithmetic written in ``source``;
- ``measured``: produced by ``flashrung model --measure`` (:mod:`flashrung.model.measure`) on
  the GPU itself, with the run's manifest stored next to it.

The ``h200`` table is the quoted Hopper table until a measured table exists in
``flashrung/model/measured/h200.json``; then the measured figures replace the quoted ones field
by field (:func:`get_table`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping
from flashrung import jsonfile

QUOTED = "quoted"
DERIVED = "derived"
MEASURED = "measured"
PROVENANCES = (QUOTED, DERIVED, MEASURED)

# The rate fields a ledger reads, with their units. Their names are the JSON keys too.
RATE_FIELDS = {
    "mma_flops": "dense 16-bit-input FLOP/cycle/SM (FP32 accumulate)",
    "smem_bytes": "B/cycle/SM (shared-memory operand reads)",
    "exp": "exp2 results/cycle/SM (MUFU.EX2)",
    "fma": "FP32 FMA results/cycle/SM",
    "sm_count": "SMs",
    "clock_ghz": "GHz (SM clock)",
}

# The exponential unit's loss beside the tensor pipe: not a rate of its own, so not in RATE_FIELDS
# (a table may lack it; the ledger then prices the exponentials at R_exp whatever the pipe does)
COUPLING_UNIT = "fraction of the exp2 rate lost per unit of tensor-pipe busy share"

MEASURED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "measured")


@dataclasses.dataclass(frozen=True)
class Figure:
    """One number with its unit and where it came from."""

    value: float
    unit: str
    provenance: str
    source: str

    def __post_init__(self):
        if self.provenance not in PROVENANCES:
            raise ValueError(f"provenance must be one of {PROVENANCES}, got {self.provenance!r}")
        if not self.value > 0:
            raise ValueError(f"a rate must be positive, got {self.value!r} ({self.unit})")

    def scaled(self, factor: float, why: str) -> "Figure":
        return Figure(self.value * factor, self.unit, DERIVED, f"{why}: {factor:g} x ({self.source})")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class OperandTile:
    """How the MMA instruction covers a tile, which decides how often SMEM operands are re-read.

    ``m`` query rows share one fetch of the B operand (K for QKᵀ, V for PV); a B operand wider
    than ``n_max`` columns takes several instructions, each re-reading the A operand; B-operand
    widths are padded up to ``n_granule``. ``qk_a_in_smem`` / ``pv_a_in_smem`` say whether the A
    operand (Q, P) is read from shared memory by each instruction (it is not when it lives in
    TMEM or registers).
    """

    m: int
    n_max: int
    n_granule: int
    qk_a_in_smem: bool
    pv_a_in_smem: bool
    source: str

    def __post_init__(self):
        for name in ("m", "n_max", "n_granule"):
            if getattr(self, name) <= 0:
                raise ValueError(f"OperandTile.{name} must be positive, got {getattr(self, name)!r}")
        if self.n_max % self.n_granule:
            raise ValueError(f"OperandTile.n_max ({self.n_max}) must be a multiple of n_granule ({self.n_granule})")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RateTable:
    name: str
    gpu: str
    mma_flops: Figure
    smem_bytes: Figure
    exp: Figure
    fma: Figure
    sm_count: Figure
    clock_ghz: Figure
    operand_tile: OperandTile
    note: str = ""
    # k: beside a tensor pipe busy a share β of the time, the exponentials run at R_exp·(1 − k·β)
    # (:func:`fit_exp_mma_coupling`); None where it was never measured
    exp_mma_coupling: Figure | None = None

    def figures(self) -> dict[str, Figure]:
        return {k: getattr(self, k) for k in RATE_FIELDS}

    def with_figures(self, name: str | None = None, **figures: Figure) -> "RateTable":
        unknown = set(figures) - set(RATE_FIELDS)
        if unknown:
            raise ValueError(f"unknown rate fields {sorted(unknown)}; known: {sorted(RATE_FIELDS)}")
        return dataclasses.replace(self, name=name or self.name, **figures)

    def to_json(self) -> dict:
        out = {
            "name": self.name,
            "gpu": self.gpu,
            "figures": {k: f.to_json() for k, f in self.figures().items()},
            "operand_tile": self.operand_tile.to_json(),
            "note": self.note,
        }
        if self.exp_mma_coupling is not None:
            out["exp_mma_coupling"] = self.exp_mma_coupling.to_json()
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RateTable":
        try:
            figs = {k: Figure(**d["figures"][k]) for k in RATE_FIELDS}
            tile = OperandTile(**d["operand_tile"])
            coupling = Figure(**d["exp_mma_coupling"]) if d.get("exp_mma_coupling") else None
            return cls(name=d["name"], gpu=d["gpu"], operand_tile=tile, note=d.get("note", ""),
                       exp_mma_coupling=coupling, **figs)
        except KeyError as exc:
            raise ValueError(f"rate table JSON lacks {exc}; it needs name, gpu, figures "
                             f"({', '.join(RATE_FIELDS)}) and operand_tile") from None


def _q(value, unit, source):
    return Figure(float(value), unit, QUOTED, source)


def _d(value, unit, source):
    return Figure(float(value), unit, DERIVED, source)


_U = RATE_FIELDS
_SEED001_07 = "seed 001, 0x07 rate table (FA4 paper's per-SM model)"

# --- B200: the FA4 paper's simplified model (seed 001, 0x08) -----------------------------------
B200_PAPER = RateTable(
    name="b200",
    gpu="NVIDIA B200 (FA4 paper model)",
    mma_flops=_d(8192, _U["mma_flops"], "seed 001, 0x08: derived in the FA4 paper from its cited B200 "
                 "peak, clock and SM count"),
    smem_bytes=_q(128, _U["smem_bytes"], "seed 001, 0x08: source-reported microbenchmark rate"),
    exp=_q(16, _U["exp"], "seed 001, 0x08: paper-reported B200/GB200 MUFU rate"),
    fma=_q(128, _U["fma"], "CUDA C++ Programming Guide, arithmetic instruction throughput, cc 10.0 "
           "(32-bit FMA: 128 results/clock/SM)"),
    sm_count=_q(148, _U["sm_count"], "NVIDIA B200 specification (not in the seeds)"),
    clock_ghz=_d(2.25e15 / (148 * 8192) / 1e9, _U["clock_ghz"],
                 "2.25 PFLOP/s dense BF16 (NVIDIA B200 specification; seed 001 0x0D: 1613 TFLOP/s is "
                 "about 71% of it) / (148 SMs x 8192 FLOP/cycle/SM)"),
    operand_tile=OperandTile(
        m=128, n_max=128, n_granule=128, qk_a_in_smem=True, pv_a_in_smem=False,
        source="seed 001, 0x08: the paper counts 128x128 MMA output tiles; QK reads Q and K from "
               "SMEM, PV reads P from TMEM and V from SMEM"),
    note="The paper's deliberately simplified machine: it omits FP32/FMA work, register and TMEM "
         "movement, barriers, issue limits, L2/HBM, occupancy, tails and epilogue.",
)

# --- Hopper: H100 (quoted) and H200 (same GH100 SM; quoted until measured) --------------------
_HOPPER_TILE = OperandTile(
    m=64, n_max=256, n_granule=8, qk_a_in_smem=True, pv_a_in_smem=False,
    source="wgmma.mma_async m64nNk16: one warpgroup covers 64 query rows, N a multiple of 8 up to "
           "256 (PTX ISA); FA3 reads Q and K from SMEM for QK (SS) and P from registers for PV "
           "(RS) (seed 001, 0x05)")

H100 = RateTable(
    name="h100",
    gpu="NVIDIA H100 SXM5",
    mma_flops=_q(4096, _U["mma_flops"], _SEED001_07 + ", Hopper column: 4096 BF16 ops/cycle/SM"),
    smem_bytes=_q(128, _U["smem_bytes"], _SEED001_07 + ", Hopper column: 128 B/cycle/SM"),
    exp=_q(16, _U["exp"], _SEED001_07 + ", Hopper column: 16 ops/cycle/SM"),
    fma=_q(128, _U["fma"], "CUDA C++ Programming Guide, arithmetic instruction throughput, cc 9.0 "
           "(32-bit FMA: 128 results/clock/SM)"),
    sm_count=_q(132, _U["sm_count"], "H100 SXM5: 132 SMs (NVIDIA Hopper whitepaper)"),
    clock_ghz=_d(989e12 / (132 * 4096) / 1e9, _U["clock_ghz"],
                 "989 TFLOP/s dense FP16 tensor peak (seed 000 quotes it for H100) / (132 SMs x 4096 "
                 "FLOP/cycle/SM); the exponential check: 132 x 16 x 1.83 GHz = 3.9 TFLOP/s, the "
                 "figure seed 000 quotes"),
    operand_tile=_HOPPER_TILE,
    note="Seed 001 0x04: H100 matmul/exponential throughput is about 256x (4096/16).",
)

def fit_exp_mma_coupling(rows) -> tuple[float, int]:
    """``k`` of ``R_exp(β) = R_exp·(1 − k·β)`` from the rows of ``python -m
    flashrung.evidence.wgmma_neighbor``: every ``ex2`` row beside ``wgmma`` (queued or paced) gives
    the loss ``1 − rate/rate_alone`` at the pipe's busy share ``β``; ``k`` is their least-squares
    slope through the origin. Returns ``(k, rows used)``."""
    alone = [r["per_sm_cycle"] for r in rows if r.get("op") == "ex2" and r.get("mode") == "idle"]
    beside = [r for r in rows if r.get("op") == "ex2" and r.get("mode") in ("queued", "paced")]
    if len(alone) != 1 or not beside:
        raise ValueError("the probe's rows need one ex2 row beside an idle pipe and ex2 rows beside "
                         f"queued or paced wgmma, got {len(alone)} idle and {len(beside)} beside")
    xs = [r["tensor_share"] for r in beside]
    ys = [1.0 - r["per_sm_cycle"] / alone[0] for r in beside]
    return sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs), len(beside)


# The committed probe's own run (f8c8015): five ex2 rows beside wgmma at 55-77% busy, loss
# 0.236-0.262 per unit of busy share; the first run's 99.9%-busy row (de41376, an older schema)
# gives 0.249. tests/test_model_rates.py refits it from the stored JSON
H200_EXP_MMA_COUPLING = Figure(
    0.2515, COUPLING_UNIT, MEASURED,
    "python -m flashrung.evidence.wgmma_neighbor on NVIDIA H200 "
    "(docs/results/h200-wgmma-neighbor-f8c8015.json.gz): ex2 15.92/cycle/SM alone, 12.82-13.67 beside "
    "wgmma keeping the pipe 55-77% busy; fit_exp_mma_coupling over its 5 rows")

H200_QUOTED = dataclasses.replace(
    H100,
    name="h200",
    gpu="NVIDIA H200 SXM",
    sm_count=_q(132, _U["sm_count"], "project brief: the lent H200 has 132 SMs"),
    exp_mma_coupling=H200_EXP_MMA_COUPLING,
    note="The H200 carries the H100's GH100 SM, so its per-SM rates are the H100's quoted ones until "
         "`flashrung model --measure` replaces them (HBM3e changes memory, not these rates).",
)

# --- RTX 5090 (seed 000) -------------------------------------------------------------------------
_RTX5090_CLOCK = 104.8e12 / (2 * 128 * 170)          # Hz, from the FP32 peak
RTX5090 = RateTable(
    name="rtx5090",
    gpu="NVIDIA GeForce RTX 5090 (sm_120)",
    mma_flops=_d(512, _U["mma_flops"],
                 f"seed 000: 209.5 TFLOP/s FP16/BF16 with FP32 accumulate / (170 SMs x "
                 f"{_RTX5090_CLOCK / 1e9:.3f} GHz) = 511.8, the instruction rate 512"),
    smem_bytes=_d(128, _U["smem_bytes"], "seed 000, 2.4: 32 banks x 4 B per wavefront cycle"),
    exp=_d(16, _U["exp"], "seed 000, 2.6: MUFU.EX2 takes 8.00003 SMSP-cycles per warp instruction "
           "-> 32/8 results/cycle/SMSP x 4 SMSPs"),
    fma=_q(128, _U["fma"], "seed 000, 2.3: 128 CUDA cores per SM"),
    sm_count=_q(170, _U["sm_count"], "seed 000, 1: 170 SMs"),
    clock_ghz=_d(_RTX5090_CLOCK / 1e9, _U["clock_ghz"],
                 "seed 000: 104.8 TFLOP/s FP32 peak / (2 FLOP x 128 FMA/cycle/SM x 170 SMs)"),
    operand_tile=OperandTile(
        m=16, n_max=4096, n_granule=8, qk_a_in_smem=False, pv_a_in_smem=False,
        source="seed 000: mma.sync m16n8k16 fed by ldmatrix; each warp owns 16 query rows, keeps Q "
               "and P in registers and reads the whole K/V tile from SMEM once per tile"),
    note="Seed 000 runs mma.sync with FP32 accumulation, which halves the 419 TFLOP/s FP16 headline.",
)

TABLES = {t.name: t for t in (B200_PAPER, H100, H200_QUOTED, RTX5090)}


def measured_path(name: str) -> str:
    return os.path.join(MEASURED_DIR, f"{name}.json")


def load_measured(path: str) -> RateTable:
    """The rate table stored by ``flashrung model --measure`` (a JSON with ``table`` and ``manifest``)."""
    d = jsonfile.read(path)
    return RateTable.from_json(d["table"] if "table" in d else d)


def overlay(base: RateTable, measured: RateTable) -> RateTable:
    """``base`` with every measured figure of ``measured`` in place of its quoted one."""
    figs = {k: f for k, f in measured.figures().items() if f.provenance == MEASURED}
    out = base.with_figures(name=base.name, **figs)
    if measured.exp_mma_coupling is not None and measured.exp_mma_coupling.provenance == MEASURED:
        out = dataclasses.replace(out, exp_mma_coupling=measured.exp_mma_coupling)
    return out


def get_table(name: str, rates_file: str | None = None) -> RateTable:
    """The named table; measured figures replace quoted ones where a measurement is stored.

    ``rates_file`` names a measured JSON explicitly; otherwise ``measured/<name>.json`` inside the
    package is used when it exists.
    """
    key = name.lower()
    if key not in TABLES:
        raise ValueError(f"gpu must be one of {sorted(TABLES)}, got {name!r}")
    base = TABLES[key]
    path = rates_file or measured_path(key)
    if rates_file is not None and not os.path.exists(rates_file):
        raise ValueError(f"rates file {rates_file!r} does not exist")
    if os.path.exists(path):
        return overlay(base, load_measured(path))
    return base
