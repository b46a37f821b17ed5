"""The gate's calibration: how close correct kernels come to the bound, and how far past it the
smallest real defect lands (seed 000, 2.1).

Each mutation is a deliberate bug compiled into the portable forward (its ``DEFECT`` constexpr);
a gate that lets any of them through is too loose, and a correct kernel near ratio 1 says it is
too tight. ``calibrate`` reports both margins over an envelope of configurations.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterable

import torch

from flashrung import gate
from flashrung.kernels.portable import common
from flashrung.kernels.portable import fwd as portable_fwd
from flashrung.kernels.portable.common import TileConfig


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    defect: int
    why: str
    # Whether the bug must change the result at a case, given the forward's tiles: a causal
    # bug needs a causal mask, a skipped rescale needs a second KV tile, an unwritten last tile
    # row needs a full Q tile. Elsewhere a pass is not a miss, and the case is not run.
    shows: Callable[[gate.Case, TileConfig], bool] = lambda case, tile: True


MUTATIONS = (
    Mutation("skipped_rescale", portable_fwd.DEFECT_SKIP_RESCALE,
             why="accumulator not rescaled when the running max grows",
             shows=lambda c, t: c.seqlen_k > t.block_n),
    Mutation("causal_off_by_one", portable_fwd.DEFECT_CAUSAL_OFF_BY_ONE,
             why="each query sees one future key",
             shows=lambda c, t: c.causal and c.seqlen_k >= 2),
    Mutation("unfolded_scale", portable_fwd.DEFECT_UNFOLDED_SCALE,
             why="exp2 of scores scaled for exp: log2(e) never folded in"),
    Mutation("permuted_k_tile", portable_fwd.DEFECT_PERMUTED_K_TILE,
             why="K rows of a tile reversed against their V rows",
             shows=lambda c, t: c.seqlen_k >= 2),
    Mutation("dropped_last_kv_tile", portable_fwd.DEFECT_DROP_LAST_KV_TILE,
             why="KV loop ends one tile early"),
    Mutation("unwritten_output_row", portable_fwd.DEFECT_UNWRITTEN_ROW,
             why="last row of each Q tile never stored (stays poisoned)",
             shows=lambda c, t: c.seqlen_q >= t.block_m),
    Mutation("lse_in_log2", portable_fwd.DEFECT_LSE_LOG2,
             why="LSE written in base 2, not natural log"),
)


def mutant_forward(defect: int):
    return functools.partial(portable_fwd.forward, defect=defect)


@dataclasses.dataclass
class Calibration:
    configurations: int
    worst_correct: gate.GateResult
    smallest_defect: tuple[str, gate.GateResult]
    correct_failures: list[gate.GateResult]
    defects_passed: list[tuple[str, gate.GateResult]]
    defect_ratios: dict[str, float]

    @property
    def ok(self) -> bool:
        return not self.correct_failures and not self.defects_passed

    def to_json(self) -> dict:
        name, res = self.smallest_defect
        return {
            "configurations": self.configurations,
            "worst_correct_ratio": self.worst_correct.ratio,
            "worst_correct_case": self.worst_correct.case.label(),
            "smallest_defect_ratio": res.ratio,
            "smallest_defect": name, "smallest_defect_case": res.case.label(),
            "defect_ratios": self.defect_ratios,
            "correct_failures": [r.to_json() for r in self.correct_failures],
            "defects_passed": [{"mutation": n, **r.to_json()} for n, r in self.defects_passed],
            "ok": self.ok,
        }


def mutation_cases(cases: Iterable[gate.Case], mutation: Mutation, device) -> list[gate.Case]:
    """The configurations where ``mutation`` must change the result on ``device``."""
    cap = common.capability_of(torch.empty(0, device=device))
    return [c for c in cases if mutation.shows(c, common.forward_config(max(c.head_dim, c.value_head_dim), cap))]


def calibrate(cases: list[gate.Case], device, progress=None) -> Calibration:
    """Gate the correct portable forward over ``cases``, then every mutation over the cases
    where it can show. ``progress`` wraps an iterable (e.g. tqdm)."""
    wrap = progress or (lambda it, **_: it)
    correct = [gate.check_forward_case(portable_fwd.forward, c, device, kernel="portable.fwd")
               for c in wrap(cases, desc="correct kernel")]
    mutated: list[tuple[str, gate.GateResult]] = []
    jobs = [(m, c) for m in MUTATIONS for c in mutation_cases(cases, m, device)]
    for m, c in wrap(jobs, desc="mutations"):
        mutated.append((m.name, gate.check_forward_case(mutant_forward(m.defect), c, device,
                                                        kernel=f"mutant:{m.name}")))
    defect_ratios = {}
    for name, res in mutated:
        # a mutation is caught by the configuration where it shows most; its weakest showing
        # across configurations is what says how close the gate came to missing it
        defect_ratios[name] = min(defect_ratios.get(name, float("inf")), res.ratio)
    return Calibration(
        configurations=len(cases),
        worst_correct=max(correct, key=lambda r: r.ratio),
        smallest_defect=min(((n, r) for n, r in mutated if not r.passed), key=lambda nr: nr[1].ratio,
                            default=("none", correct[0])),
        correct_failures=[r for r in correct if not r.passed],
        defects_passed=[(n, r) for n, r in mutated if r.passed],
        defect_ratios=defect_ratios,
    )
