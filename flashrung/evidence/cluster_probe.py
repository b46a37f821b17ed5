"""K/V multicast across a two-CTA cluster, built from inline PTX: a pair-copy probe.

``hopper.fwd``'s L2 slices serve 2.3x FA4's read sectors at d128 B2 H16 S16384 non-causal
(docs/hopper.md, *What is left*: L2 traffic), and FA3 runs that problem on two-CTA clusters whose
CTAs each load half of every K/V tile into both (TMA multicast). Gluon 3.6 has no API for it:
``tma.async_copy_global_to_shared`` takes no CTA mask, and ``num_ctas=2`` makes one program span
the cluster (every layout must then name two CTAs). This probe is the protocol a cluster version
of the kernel's K/V ring would use, written in inline PTX in a kernel compiled for one CTA and
launched in clusters of two (Triton's C launcher takes the cluster size from the metadata tuple
it is handed at each launch):

* each CTA initialises its barriers, and a cluster-wide barrier keeps any copy from landing in a
  peer whose barrier is not yet initialised;
* each CTA's elected thread arms its full barrier for the whole tile and copies **its half** into
  the same shared offset of **both** CTAs (``cp.async.bulk.tensor...multicast::cluster``, mask
  ``0b11``), the tensor map read from global memory; every thread waits for the full barrier, and
  the CTA stores the tile it holds, both halves;
* each CTA then tells its peer it is done with what the peer sent (``mapa`` to the peer's
  barrier and a cluster-scope remote ``mbarrier.arrive``: the release a consumer would send to
  the CTA that issued a slot's copy) and waits for the peer's word before it exits.

``python -m flashrung.evidence.cluster_probe`` compiles it for sm_90a and counts those pieces in
the SASS (no GPU: ``UTMALDG.2D.MULTICAST``, ``UCGABAR_ARV`` / ``UCGABAR_WAIT``, a remote
``SYNCS.ARRIVE.TRANS64.RED``); ``--run`` launches it on an sm_90 GPU and checks that every CTA read
both halves of its cluster's tile.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import TYPE_CHECKING

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashrung.evidence import census
from flashrung.kernels.hopper.multicast import encode_tiled_map
from flashrung.kernels.hopper.pipeline import allocation_offsets

if TYPE_CHECKING:  # the probe's CPU path (the census) runs without touching torch
    import torch

CLUSTER_CTAS = 2
PAIR_MASK = (1 << CLUSTER_CTAS) - 1      # the copy lands in both CTAs of the pair
THREADS = 128
HALF_ROWS = 32                           # rows of the tile each CTA copies for both
COLS = 32                                # int32 words a row: 128 B, one TMA box row
TILE_WORDS = CLUSTER_CTAS * HALF_ROWS * COLS
WORD_BYTES = 4

# The shared window (the probe's one allocation, so it starts at global_smem): the tile, then the
# full barrier and the peer's "done" barrier, 8 bytes each.
_FULL = TILE_WORDS * WORD_BYTES
_DONE = _FULL + 8
_HALF_BYTES = HALF_ROWS * COLS * WORD_BYTES

# $1: the thread's index, $2: the tensor map's global address, $3: the cluster's first row
_COPY_ASM = gl.constexpr(
    "{ .reg .pred leader; .reg .b32 rank, base, full, done, dst, row; .reg .b16 mask; "
    "setp.eq.u32 leader, $1, 0; mov.u32 rank, %cluster_ctarank; "
    f"mov.u32 base, global_smem; add.u32 full, base, {_FULL}; add.u32 done, base, {_DONE}; "
    "@leader mbarrier.init.shared::cta.b64 [full], 1; @leader mbarrier.init.shared::cta.b64 [done], 1; "
    "@leader fence.mbarrier_init.release.cluster; "
    "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
    f"@leader mbarrier.arrive.expect_tx.shared::cta.b64 _, [full], {TILE_WORDS * WORD_BYTES}; "
    f"mad.lo.u32 dst, rank, {_HALF_BYTES}, base; mad.lo.u32 row, rank, {HALF_ROWS}, $3; "
    f"mov.u16 mask, {PAIR_MASK}; "
    "@leader cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
    "[dst], [$2, {0, row}], [full], mask; "
    "mov.u32 $0, rank; }")

# $1: the thread's index (every thread waits for the whole tile, both halves)
_WAIT_ASM = gl.constexpr(
    "{ .reg .pred complete; .reg .b32 full; "
    f"mov.u32 full, global_smem; add.u32 full, full, {_FULL}; "
    "waitFull: mbarrier.try_wait.parity.shared::cta.b64 complete, [full], 0; @!complete bra.uni waitFull; "
    "mov.u32 $0, $1; }")

# $1: the thread's index. After the reads: side-effecting asm keeps its place among the loads
_RELEASE_ASM = gl.constexpr(
    "{ .reg .pred leader, complete; .reg .b32 peer, base, done, remote; "
    "setp.eq.u32 leader, $1, 0; mov.u32 peer, %cluster_ctarank; xor.b32 peer, peer, 1; "
    f"mov.u32 base, global_smem; add.u32 done, base, {_DONE}; "
    "mapa.shared::cluster.u32 remote, done, peer; "
    "@leader mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote]; "
    "waitDone: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 complete, [done], 0; "
    "@!complete bra.uni waitDone; "
    "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
    "mov.u32 $0, $1; }")


@gluon.jit
def _pair_copy(tmap_addr, out_ptr, ROWS_PER_CTA: gl.constexpr, COLS_: gl.constexpr, THREADS_: gl.constexpr,
               CTAS: gl.constexpr):
    WORDS: gl.constexpr = CTAS * ROWS_PER_CTA * COLS_
    per_thread: gl.constexpr = gl.BlockedLayout([1], [32], [THREADS_ // 32], [0])
    per_word: gl.constexpr = gl.BlockedLayout([WORDS // THREADS_], [32], [THREADS_ // 32], [0])
    # the window the inline PTX addresses: the tile, then its barriers (a power-of-two shape, as
    # every Gluon allocation; the kernel's only one, so it starts at global_smem: probe() checks)
    window = gl.allocate_shared_memory(gl.int32, [2 * WORDS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    cta = gl.program_id(0)
    tid = gl.arange(0, THREADS_, layout=per_thread)
    first_row = gl.full([THREADS_], 0, gl.int32, per_thread) + (cta // CTAS) * (CTAS * ROWS_PER_CTA)
    tmap = gl.full([THREADS_], 0, gl.int64, per_thread) + tmap_addr
    gl.inline_asm_elementwise(_COPY_ASM, "=r,r,l,r", [tid, tmap, first_row], dtype=gl.int32, is_pure=False, pack=1)
    gl.inline_asm_elementwise(_WAIT_ASM, "=r,r", [tid], dtype=gl.int32, is_pure=False, pack=1)
    words = gl.arange(0, WORDS, layout=per_word)
    gl.store(out_ptr + cta * WORDS + words, window.slice(0, WORDS).load(per_word))
    gl.inline_asm_elementwise(_RELEASE_ASM, "=r,r", [tid], dtype=gl.int32, is_pure=False, pack=1)


_CONSTEXPRS = {"ROWS_PER_CTA": HALF_ROWS, "COLS_": COLS, "THREADS_": THREADS, "CTAS": CLUSTER_CTAS}

# SASS the cluster pieces compile to: name -> pattern
PIECES = {
    "multicast_copy": r"UTMALDG\.2D\.MULTICAST",
    "cluster_barrier_arrive": r"UCGABAR_ARV",
    "cluster_barrier_wait": r"UCGABAR_WAIT",
    "remote_arrive": r"SYNCS\.ARRIVE\.TRANS64\.RED",
}


def probe(arch: str = "sm_90a") -> dict:
    """``{"pieces": {name: count in the SASS}, "allocations": {name: byte offset}, "shared_bytes": n,
    "spill_bytes": n, "regs": n}`` for ``arch``."""
    if census.needs_reexec():
        raise RuntimeError("compile without TRITON_INTERPRET=1 (python -m flashrung.evidence.cluster_probe)")
    spec = census.CensusSpec(kernel="probe.cluster", config={"pair_mask": PAIR_MASK}, fn=_pair_copy,
                             signature={"tmap_addr": "i64", "out_ptr": "*i32"}, constexprs=dict(_CONSTEXPRS),
                             num_warps=THREADS // 32, gluon=True, arches=("sm_90a",))
    row = census.census_one(spec, arch)
    if row.error:
        raise RuntimeError(row.error)
    compiled = census.compile_spec(spec, arch)
    sass = census.compiled_sass(compiled)
    # the inline PTX addresses the window from global_smem: it must be the one allocation, at 0,
    # and the kernel's whole shared memory
    return {"pieces": {name: len(re.findall(pattern, sass)) for name, pattern in PIECES.items()},
            "allocations": allocation_offsets(compiled.asm["ttgir"]), "shared_bytes": compiled.metadata.shared,
            "spill_bytes": row.spill_bytes, "regs": row.regs}


def _tensor_map(tensor) -> "torch.Tensor":
    """A 2-D tiled TMA descriptor over the int32 ``tensor`` (rows × ``COLS``), box ``HALF_ROWS`` ×
    ``COLS``, encoded by the driver and copied to global memory, where the copy reads it."""
    import torch

    # CUtensorMapDataType INT32, no swizzle, L2 promotion to 128 B
    int32_type, no_swizzle, l2_promotion_128b = 3, 0, 2
    encoded = encode_tiled_map(tensor.data_ptr(), int32_type, (COLS, tensor.shape[0]), (tensor.stride(0) * WORD_BYTES,),
                               (COLS, HALF_ROWS), no_swizzle, l2_promotion_128b)
    return torch.frombuffer(bytearray(encoded), dtype=torch.uint8).to(tensor.device)


def run(clusters: int = 66) -> dict:
    """Launch the probe on the current sm_90 GPU in ``clusters`` clusters of two; every CTA must
    read its cluster's whole tile, its own half and its peer's. Returns the counts it checked."""
    import torch
    from triton.runtime import driver

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise RuntimeError("the pair-copy probe needs an sm_90 GPU")
    rows = clusters * CLUSTER_CTAS * HALF_ROWS
    source = torch.randint(1, 1 << 30, (rows, COLS), dtype=torch.int32, device="cuda")
    tmap = _tensor_map(source)
    out = torch.full((clusters * CLUSTER_CTAS * TILE_WORDS,), -1, dtype=torch.int32, device="cuda")
    kernel = _pair_copy.warmup(tmap.data_ptr(), out, **_CONSTEXPRS, grid=(1,), num_warps=THREADS // 32)
    stream = driver.active.get_current_stream(torch.cuda.current_device())
    num_warps, _, shared = kernel.packed_metadata
    # the launcher starts grid × CLUSTER_CTAS CTAs in clusters of CLUSTER_CTAS
    kernel.run(clusters, 1, 1, stream, kernel.function, (num_warps, CLUSTER_CTAS, shared), None, None, None,
               tmap.data_ptr(), out, *_CONSTEXPRS.values())
    torch.cuda.synchronize()
    seen = out.view(clusters, CLUSTER_CTAS, TILE_WORDS)
    want = source.view(clusters, 1, TILE_WORDS).expand(-1, CLUSTER_CTAS, -1)
    wrong = (seen != want).view(clusters * CLUSTER_CTAS, CLUSTER_CTAS, -1).any(dim=2)
    return {"ctas": clusters * CLUSTER_CTAS, "halves_wrong": int(wrong.sum()),
            "ctas_missing_peer_half": int(wrong.any(dim=1).sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90a", choices=["sm_90a"])
    ap.add_argument("--run", action="store_true", help="launch it on this machine's sm_90 GPU and check the copies")
    args = ap.parse_args(argv)
    if census.needs_reexec():
        import subprocess
        return subprocess.run([sys.executable, "-m", "flashrung.evidence.cluster_probe", *(argv or sys.argv[1:])],
                              env=census.interpreter_free_env()).returncode
    result = run() if args.run else probe(args.arch)
    if args.run:
        print(f"{result['ctas']} CTAs in pairs: {result['halves_wrong']} halves wrong, "
              f"{result['ctas_missing_peer_half']} CTAs without their whole tile")
    else:
        for name, count in result["pieces"].items():
            print(f"{args.arch} {name:24s} {count}")
        print(f"{args.arch} spill bytes {result['spill_bytes']}, registers {result['regs']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
