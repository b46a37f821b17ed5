"""FA4's software exp2 (seed 001, 0x09): Cody-Waite range reduction and a degree-3 Horner
polynomial, evaluated in FP32 with FMA rounding, and its error against exact 2^x.

    x  <- max(x, -127)
    n  =  floor(x)          (the magic constant C = 2^23 + 2^22 leaves n in the low bits)
    f  =  x - n  in [0, 1)
    2^f ~ p(f) = p0 + f (p1 + f (p2 + f p3))   three dependent FMAs
    2^x =  2^n * p(f)       n added straight into the FP32 exponent field

Below x = -126 the exponent field underflows and the result is not 2^x; the kernels flush such
values to zero anyway (FTZ), and a softmax probability that small is zero in BF16.

The kernel version rounds ``x + C`` toward minus infinity to get floor(x) in one add. Torch has
no directed rounding, so here ``x + C`` rounds to nearest and the result steps down by one where
it rounded up; for |x| < 2^22 both give floor(x). FMA rounding is reproduced by evaluating
``a*b + c`` once in FP64 and rounding once to FP32 (the FP32 product is exact in FP64).

Seed 001 reports, on a 65,536-point uniform grid of [0, 1): raw FP32 maximum relative error
8.7683755e-5 (mean 5.4271432e-5); after rounding to BF16, 3.8975323e-3 (mean 1.4095395e-3) —
BF16 rounding, not the polynomial, dominates once P is consumed at BF16.

:func:`emulated_per_row` reproduces FA4's fragment predicate that decides which score pairs take
the polynomial instead of MUFU.EX2, and :data:`EMULATION_OPS` lists the instructions one emulated
exp2 costs, by pipe, so the ledger can price moving a fraction of exponentials onto the FMA pipe.
"""
from __future__ import annotations

import dataclasses

import torch

# p0..p3, lowest power first (FA4 beta23 utils.ex2_emulation_2; seed 001 0x09).
COEFFS = (1.0, 0.6951461434364319, 0.22756439447402954, 0.07711908966302872)
CLAMP_LO = -127.0
MAGIC = float(2 ** 23 + 2 ** 22)       # 12,582,912: adding it leaves floor(x) in the low mantissa bits

# One emulated exp2, instruction by instruction (seed 001 0x09's six steps), with the pipe each
# issues to. ``fma`` is the FP32 pipe that MUFU work is moved onto.
EMULATION_OPS = (
    ("FMNMX", "alu"),     # clamp at -127
    ("FADD.RM", "fma"),   # x + C rounded toward -inf -> floor in the low bits
    ("FADD", "fma"),      # - C
    ("FADD", "fma"),      # f = x - n
    ("FFMA", "fma"),      # Horner step 1
    ("FFMA", "fma"),      # Horner step 2
    ("FFMA", "fma"),      # Horner step 3
    ("SHF", "alu"),       # n << 23 into the exponent field
    ("IADD", "alu"),      # combine with the bits of p(f)
)
FMA_PIPE_OPS = sum(1 for _, pipe in EMULATION_OPS if pipe == "fma")


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a*b + c rounded once to FP32, as one FP32 FMA instruction does."""
    return (a.double() * b.double() + c.double()).float()


def exp2_degree3(x: torch.Tensor) -> torch.Tensor:
    """FA4's degree-3 software 2^x on an FP32 tensor (any device), element by element."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got {x.dtype}")
    x = x.float().clamp_min(CLAMP_LO)
    if torch.any(x >= 128):
        raise ValueError("exp2_degree3 assumes x < 128 (the softmax reference keeps x <= 0 + offset)")
    magic = torch.tensor(MAGIC, dtype=torch.float32, device=x.device)
    n = (x + magic) - magic                      # round to nearest integer (FP32 adds)
    n = torch.where(n > x, n - 1, n)             # ... stepped down to floor(x)
    f = x - n                                    # exact: x and n share the binade's spacing
    p = [torch.tensor(c, dtype=torch.float32, device=x.device) for c in COEFFS]
    frac = _fma32(p[3], f, p[2])
    frac = _fma32(frac, f, p[1])
    frac = _fma32(frac, f, p[0])
    # 2^n * p(f): add n to the exponent field (p(f) is in [1, 2), so no carry into the sign).
    bits = frac.view(torch.int32) + (n.to(torch.int32) << 23)
    return bits.view(torch.float32)


def _bf16_rne(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).double()


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    points: int
    fp32_max_rel: float
    fp32_mean_rel: float
    bf16_max_rel: float
    bf16_mean_rel: float
    bf16_exact_match: float        # share of points whose BF16 code equals the exact one's
    bf16_within_one_code: float
    vs_torch_exp2_max_rel: float   # against torch.exp2 in FP32 (what the hardware path gives)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def uniform_grid(points: int = 65536) -> torch.Tensor:
    """i / points for i in [0, points): the deterministic grid of [0, 1) the oracle uses."""
    return torch.arange(points, dtype=torch.float64).div(points).float()


def error_report(x: torch.Tensor | None = None) -> ErrorReport:
    """Relative errors of :func:`exp2_degree3` against exact 2^x (FP64) and against torch.exp2."""
    if x is None:
        x = uniform_grid()
    x = x.float()
    approx = exp2_degree3(x)
    exact = torch.exp2(x.double())
    rel = ((approx.double() - exact) / exact).abs()
    rel_bf = ((_bf16_rne(approx) - exact) / exact).abs()
    codes_a = approx.to(torch.bfloat16).view(torch.int16).int()
    codes_e = exact.to(torch.bfloat16).view(torch.int16).int()
    hw = torch.exp2(x)
    rel_hw = ((approx.double() - hw.double()) / hw.double()).abs()
    return ErrorReport(
        points=x.numel(),
        fp32_max_rel=rel.max().item(),
        fp32_mean_rel=rel.mean().item(),
        bf16_max_rel=rel_bf.max().item(),
        bf16_mean_rel=rel_bf.mean().item(),
        bf16_exact_match=(codes_a == codes_e).double().mean().item(),
        bf16_within_one_code=((codes_a - codes_e).abs() <= 1).double().mean().item(),
        vs_torch_exp2_max_rel=rel_hw.max().item(),
    )


def emulated_per_row(row: int, freq: int, res: int, start: int, fragment: int = 32) -> int:
    """How many of a row's ``row`` scores FA4 sends through the polynomial (seed 001 0x09).

    The row is cut into ``fragment``-element fragments j = 0..F-1 visited in element pairs
    (k, k+1); a pair is emulated iff ``k mod freq >= freq - res`` and ``start <= j < F-1`` (the
    last fragment always uses MUFU). ``freq == 0`` means all hardware.
    """
    for name, v in (("row", row), ("fragment", fragment)):
        if v <= 0 or v % 2:
            raise ValueError(f"{name} must be a positive even integer, got {v!r}")
    if row % fragment:
        raise ValueError(f"row ({row}) must be a multiple of fragment ({fragment})")
    if freq < 0 or res < 0 or start < 0:
        raise ValueError(f"freq, res and start must be >= 0, got {freq}, {res}, {start}")
    if freq == 0:
        return 0
    frags = row // fragment
    count = 0
    for j in range(start, frags - 1):
        for k in range(0, fragment, 2):
            if k % freq >= freq - res:
                count += 2
    return count
