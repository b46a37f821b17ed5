"""Can this toolchain express K/V multicast across a two-CTA cluster? A census probe (no GPU).

``hopper.fwd``'s L2 slices serve 2.3x FA4's read sectors at d128 B2 H16 S16384 non-causal
(docs/hopper.md, *What is left*: L2 traffic), and FA3 runs that problem on two-CTA clusters whose
CTAs each load half of every K/V tile into both (TMA multicast). Gluon 3.6 has no API for it:
``tma.async_copy_global_to_shared`` takes no CTA mask, and ``num_ctas=2`` makes one program span
the cluster (every layout must then name two CTAs). This probe compiles, for one CTA compiled
alone, the pieces a cluster version would write in inline PTX instead, in the order it would use
them:

* its rank in the cluster (``%cluster_ctarank``) and a cluster-wide barrier, so that no copy
  lands in a peer whose mbarrier is not yet initialised;
* the multicast copy: ``cp.async.bulk.tensor.2d...multicast::cluster`` of this CTA's half of a
  tile into the same shared offset of both CTAs (mask ``0b11``), completing on the mbarrier at
  the same offset in each, the tensor map read from global memory (a 64-bit address);
* the release of a slot to the CTA that issued its copy: ``mapa`` to the peer's barrier and a
  cluster-scope remote ``mbarrier.arrive``.

Result on sm_90a (Triton 3.6, its ptxas): ``UTMALDG.2D.MULTICAST``, ``UCGABAR_ARV`` /
``UCGABAR_WAIT`` and a remote ``SYNCS.ARRIVE.TRANS64.RED``, no local memory. Nothing is run: the
launch would hand Triton's C launcher a metadata tuple with ``num_ctas=2``, from which it sets the
cluster (docs/hopper.md, Open items). Run: ``python -m flashrung.evidence.cluster_probe``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.evidence import census

THREADS = 128
# the copied tile (int32 words); the probe reserves twice that, its barriers right after the tile
TILE_WORDS = 2048
TILE_BYTES = TILE_WORDS * 4
PAIR_MASK = 0b11          # both CTAs of a two-CTA cluster

# $1: the tensor map's global address, $2: the thread's index (thread 0 issues the copy and the
# release, as a producer's elected lane would). The tile sits at the start of the kernel's shared
# window (the probe's only allocation) and its full barrier right after it.
_CLUSTER_ASM = gl.constexpr(
    "{ .reg .pred leader; .reg .b32 rank, peer, dst, full, remote; .reg .b64 tm; .reg .b16 mask; "
    "setp.eq.u32 leader, $2, 0; "
    "mov.u32 rank, %cluster_ctarank; xor.b32 peer, rank, 1; "
    "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
    f"mov.u32 dst, global_smem; add.u32 full, dst, {TILE_BYTES}; "
    f"mov.b64 tm, $1; mov.u16 mask, {PAIR_MASK}; "
    "@leader cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
    "[dst], [tm, {0, rank}], [full], mask; "
    "mapa.shared::cluster.u32 remote, full, peer; "
    "@leader mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote]; "
    "mov.u32 $0, rank; }")


@gluon.jit
def _cluster_probe(tmap_ptr, out_ptr, WORDS: gl.constexpr, THREADS_: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [THREADS_ // 32], [0])
    # reserves the window the inline PTX addresses (the tile, then its barriers; a power-of-two
    # shape, as every Gluon allocation); read after the copy, so the allocation is kept
    window = gl.allocate_shared_memory(gl.int32, [2 * WORDS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    offs = gl.arange(0, THREADS_, layout=layout)
    tmap = gl.load(tmap_ptr + offs * 0)
    rank = gl.inline_asm_elementwise(_CLUSTER_ASM, "=r,l,r", [tmap, offs], dtype=gl.int32, is_pure=False, pack=1)
    gl.store(out_ptr + offs, rank + window.slice(0, THREADS_).load(layout))


# SASS the cluster pieces compile to: name -> pattern
PIECES = {
    "multicast_copy": r"UTMALDG\.2D\.MULTICAST",
    "cluster_barrier_arrive": r"UCGABAR_ARV",
    "cluster_barrier_wait": r"UCGABAR_WAIT",
    "remote_arrive": r"SYNCS\.ARRIVE\.TRANS64\.RED",
}


def probe(arch: str = "sm_90a") -> dict:
    """``{"pieces": {name: count in the SASS}, "spill_bytes": n, "regs": n}`` for ``arch``."""
    if census.needs_reexec():
        raise RuntimeError("compile without TRITON_INTERPRET=1 (python -m flashrung.evidence.cluster_probe)")
    spec = census.CensusSpec(kernel="probe.cluster", config={"pair_mask": PAIR_MASK}, fn=_cluster_probe,
                             signature={"tmap_ptr": "*i64", "out_ptr": "*i32"},
                             constexprs={"WORDS": TILE_WORDS, "THREADS_": THREADS}, num_warps=THREADS // 32,
                             gluon=True, arches=("sm_90a",))
    row = census.census_one(spec, arch)
    if row.error:
        raise RuntimeError(row.error)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.cubin")
        with open(path, "wb") as f:
            f.write(census.compile_spec(spec, arch).asm["cubin"])
        sass = census.sass_text(path)
    return {"pieces": {name: len(re.findall(pattern, sass)) for name, pattern in PIECES.items()},
            "spill_bytes": row.spill_bytes, "regs": row.regs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90a", choices=["sm_90a"])
    args = ap.parse_args(argv)
    if census.needs_reexec():
        import subprocess
        return subprocess.run([sys.executable, "-m", "flashrung.evidence.cluster_probe", *(argv or sys.argv[1:])],
                              env=census.interpreter_free_env()).returncode
    result = probe(args.arch)
    for name, count in result["pieces"].items():
        print(f"{args.arch} {name:24s} {count}")
    print(f"{args.arch} spill bytes {result['spill_bytes']}, registers {result['regs']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
