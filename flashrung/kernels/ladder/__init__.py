"""The FA5090 ladder (seed 000) rebuilt in Gluon: one lever per rung, one rung per file.

``v0`` naive (CUDA-core FMA, scalar staging, precise expf) -> ``v1`` mma.sync with ldmatrix ->
``v2`` XOR-swizzled shared tiles -> ``v3`` 16-byte cp.async -> ``v4`` exp2 with log2(e) folded
into the scale -> ``v5`` HeaviestFirst CTA order -> ``v7`` the four keeps as switches; ``v8``
branches from ``v4`` with FA2's d128 tile (two 16-row slabs per warp, Q re-read from shared
memory), ``v9`` from ``v5`` with its order kept inside L2-sized head sections, ``v10`` from ``v9`` with each
CTA's key sweep started at its own block, ``v11`` from ``v4`` under a 168-register cap (three
CTAs per SM), ``v12`` from ``v4`` with a double-buffered K/V ring, ``v13`` from ``v12`` with v8's
two-slab tile, ``v14`` from ``v12`` with the next block's scores issued under this block's
softmax, ``v15`` from ``v14`` with its key loop split where the mask begins, ``v16`` from ``v15``
with the running row sum off the softmax's path, ``v17`` from ``v16`` with the next block's row
max formed a trip early, ``v18`` from ``v16`` with its prefetches of whole blocks unpredicated, ``v19`` from ``v16`` with
the grid's last batch*head row run heaviest first, ``v20`` from ``v19`` with one barrier a trip (the
ring's copies in inline PTX), ``v21`` from ``v20`` with each block's row max as a tree, ``v22`` from
``v20`` with no barrier a trip (the ring's copies counted by mbarriers), ``v23`` from ``v22`` with
v21's tree. Each rung
module provides ``unsupported_reason(problem)``, ``forward(q, k, v, causal, softmax_scale)`` and
``census_specs()``; shared pieces live in :mod:`flashrung.kernels.ladder.common`.
"""
from __future__ import annotations

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Rung:
    """One rung: its dispatch name, module, parent and the lever that separates them."""

    name: str             # "ladder.v3": the name dispatch and the CLI use
    module: str           # dotted module path
    parent: str | None    # the rung its paired margin is measured against
    lever: str

    def load(self):
        return importlib.import_module(self.module)


RUNGS: tuple[Rung, ...] = (
    Rung("ladder.v0", "flashrung.kernels.ladder.v0", None,
         "baseline: CUDA-core FMA, scalar 2-byte staging, precise expf"),
    Rung("ladder.v1", "flashrung.kernels.ladder.v1", "ladder.v0",
         "mma.sync (mma_v2) with ldmatrix-fed operands"),
    Rung("ladder.v2", "flashrung.kernels.ladder.v2", "ladder.v1",
         "XOR-swizzled shared tiles"),
    Rung("ladder.v3", "flashrung.kernels.ladder.v3", "ladder.v2",
         "16-byte cp.async staging, single buffer"),
    Rung("ladder.v4", "flashrung.kernels.ladder.v4", "ladder.v3",
         "exp2 with log2(e) folded into the host-side scale"),
    Rung("ladder.v5", "flashrung.kernels.ladder.v5", "ladder.v4",
         "HeaviestFirst (LPT) CTA order for causal"),
    Rung("ladder.v7", "flashrung.kernels.ladder.v7", "ladder.v5",
         "four keeps: 64x32 tile, rescale skip, mask specialization, causal loop split"),
    # beyond the seed's ladder, branching from its fastest rung on the H200
    Rung("ladder.v8", "flashrung.kernels.ladder.v8", "ladder.v4",
         "FA2's d128 tile: two m16 slabs per warp (128x32), Q read from shared memory in chunks"),
    # v5's order kept to L2-sized head sections, as hopper.fwd orders its causal tiles
    Rung("ladder.v9", "flashrung.kernels.ladder.v9", "ladder.v5",
         "HeaviestFirst inside L2-sized head sections (causal)"),
    # v9's CTAs, resident together on equal tiles, no longer sweep their keys in step
    Rung("ladder.v10", "flashrung.kernels.ladder.v10", "ladder.v9",
         "staggered key sweeps: each CTA starts at its own key block and wraps"),
    # v4, latency-bound at 8 warps per SM (profile at config B), given the registers for 12
    Rung("ladder.v11", "flashrung.kernels.ladder.v11", "ladder.v4",
         "168-register cap: three 4-warp CTAs per SM instead of two"),
    # v4's wait for each block's copy, on the critical path at 8 warps per SM, hidden by a ring
    Rung("ladder.v12", "flashrung.kernels.ladder.v12", "ladder.v4",
         "double-buffered K/V ring: block j+1 in flight while block j is consumed"),
    # v12's warps, copies hidden, still one dependent MMA chain each: v8's two slabs per warp
    Rung("ladder.v13", "flashrung.kernels.ladder.v13", "ladder.v12",
         "FA2's d128 tile on the ring: two m16 slabs per warp (128x32), Q read from shared memory in chunks"),
    # v12's one chain per warp, given a second along the keys: QK(j+1) under softmax(j)
    Rung("ladder.v14", "flashrung.kernels.ladder.v14", "ladder.v12",
         "QK one block ahead: S(j+1) issued before block j's softmax, a three-slot K/V ring"),
    # v14's every trip masked its next block's scores: interior blocks need no mask
    Rung("ladder.v15", "flashrung.kernels.ladder.v15", "ladder.v14",
         "v14's key loop split where the mask begins: interior blocks run QK with no mask"),
    # v15's trips still add up each row's exponentials and shuffle the partials every block
    Rung("ladder.v16", "flashrung.kernels.ladder.v16", "ladder.v15",
         "the running row sum off the softmax's path: per-thread partials, one quad exchange per tile"),
    # v16's trips open on the row max of the block v14 computed a trip earlier
    Rung("ladder.v17", "flashrung.kernels.ladder.v17", "ladder.v16",
         "the next block's row max formed under this block's softmax (max one block ahead)"),
    # v16's trips predicate every prefetched row though only a tile's last two copy past its keys
    Rung("ladder.v18", "flashrung.kernels.ladder.v18", "ladder.v16",
         "the prefetches of whole blocks issued without their row predicate"),
    # v16's launch ends on the last head's heaviest tiles, dispatched last in the seed's order
    Rung("ladder.v19", "flashrung.kernels.ladder.v19", "ladder.v16",
         "the grid's last batch*head row dispatched heaviest first (causal): the launch ends on light tiles"),
    # v19's trip meets two barriers, one only because the shared-memory analysis cannot tell slots apart
    Rung("ladder.v20", "flashrung.kernels.ladder.v20", "ladder.v19",
         "one barrier a trip: the K/V ring's copies in inline PTX, K's ahead of the wait, V's after the barrier"),
    # v20's trip folds each row's 16 in-thread scores into its max one after another
    Rung("ladder.v21", "flashrung.kernels.ladder.v21", "ladder.v20",
         "each block's row max as a tree: the row halved inside the thread, depth 5 instead of 15"),
    # v20's one barrier makes every warp wait for the CTA's slowest each trip; copies need no such wait
    Rung("ladder.v22", "flashrung.kernels.ladder.v22", "ladder.v20",
         "no barrier a trip: the K/V ring's copies counted by mbarriers, each warp waits for the copies alone"),
    # v21's tree lost at config B to the barrier v22 removes
    Rung("ladder.v23", "flashrung.kernels.ladder.v23", "ladder.v22",
         "v21's tree-shaped row max on v22's barrier-free trip"),
)


def rung(name: str) -> Rung:
    """The rung called ``name`` ("ladder.v3" or "v3")."""
    for r in RUNGS:
        if name in (r.name, r.name.split(".")[1]):
            return r
    raise ValueError(f"name must be one of {[r.name for r in RUNGS]}, got {name!r}")


def census_specs():
    """Every rung's census configurations, in ladder order."""
    specs = []
    for r in RUNGS:
        specs.extend(r.load().census_specs())
    return specs
