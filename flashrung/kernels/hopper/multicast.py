"""K/V multicast across a two-CTA cluster: the pieces ``hopper.fwd`` uses with ``kv_multicast``.

What it does: the two CTAs of a cluster work on neighbouring q-tiles of one head (m-blocks
``2p`` and ``2p + 1``), which read the same K/V tiles. Each CTA's producer loads **half** of every
K/V tile (``BLOCK_N / 2`` rows) and multicasts it into the same ring slot of both CTAs
(``cp.async.bulk.tensor...multicast::cluster``, mask ``0b11``), so each tile leaves L2 once per
pair instead of once per CTA. The ring's protocol grows by one rule each way:

* a slot's **ready** barrier in each CTA is armed by its own producer for the whole tile's bytes
  and completes when both halves have landed (each half's copy signals the barrier at the same
  offset in both CTAs);
* a slot's **empty** barrier counts the releases of both CTAs' consumers: a producer may refill its
  half of a slot only once neither CTA reads the slot any more, so every consumer release also
  arrives, remotely (``mapa`` + ``mbarrier.arrive.release.cluster``), on the peer's barrier
  (``pipeline.arrive_unsynced`` with ``peer``).

With ``producer_unsynced`` the producer's Q copies are inline PTX too (:func:`load_q`, from a
third tensor map) and its barrier waits ``pipeline.wait_unsynced``: Gluon fences each wait, expect
and copy of a four-warp partition with a ``bar.sync``, which one thread's copy does not need.

Gluon 3.6 has none of this (its TMA copy takes no CTA mask; ``num_ctas=2`` makes one program span
the cluster and asks for CGA layouts everywhere): the copies and the remote arrivals are inline
PTX in a kernel compiled for one CTA and launched in clusters of two, addressing shared memory by
the allocation pass's offsets (``pipeline.resolve_shared_offsets``) and the K/V tensors through
tensor maps this module encodes into global memory. ``flashrung.evidence.cluster_probe`` is the
same protocol on one tile, checked on the GPU.

Hazards the kernel answers:

* **init before remote use**: no copy or arrival may reach a peer whose barriers are not yet
  initialized. Every thread of each CTA meets a cluster barrier at its partition's start
  (:func:`join_cluster`), after the barriers' init; ``barrier.cluster`` waits for *every* thread of
  the cluster, so the producer is a whole warpgroup (Triton pads a one-warp partition with idle
  warps that would never arrive).
* **exit with traffic in flight**: a CTA exits only after its producer has seen every slot released
  by both CTAs' consumers (``fwd._drain_ring``), i.e. after the peer's last remote arrival on it;
  every copy into it has landed by then, as its consumers waited for each one.
"""
from __future__ import annotations

import collections
import ctypes
import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

CLUSTER_CTAS = 2
PAIR_MASK = (1 << CLUSTER_CTAS) - 1       # each half lands in both CTAs
SWIZZLE_BYTES = 128                       # a box row's bytes under the K/V tiles' 128-B swizzle
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN_BYTES = 64
# one thread per element: the inline PTX below runs once per thread
_THREADS_PER_WARP = gl.constexpr(32)

_CLUSTER_CTAS = gl.constexpr(CLUSTER_CTAS)
_TENSOR_MAP_BYTES = gl.constexpr(TENSOR_MAP_BYTES)
_SWIZZLE_BYTES = gl.constexpr(SWIZZLE_BYTES)


@gluon.jit
def cta_rank():
    """This CTA's rank in its cluster of two: clusters are consecutive CTA ids along x."""
    return gl.program_id(0) % _CLUSTER_CTAS


@gluon.jit
def cluster_index():
    """``(cluster id, clusters in the launch)``: a persistent cluster's stride over the work items."""
    return gl.program_id(0) // _CLUSTER_CTAS, gl.num_programs(0) // _CLUSTER_CTAS


@gluon.jit
def join_cluster(WARPS: gl.constexpr):
    """Every thread of the partition (``WARPS`` warps) meets the cluster barrier once, at its
    start: after it, each CTA's barriers are initialized and visible to the peer (the init fence
    is release at cluster scope, the barrier's arrive release and its wait acquire)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [_THREADS_PER_WARP], [WARPS], [0])
    token = gl.full([WARPS * _THREADS_PER_WARP], 0, gl.int32, layout)
    gl.inline_asm_elementwise(
        "fence.mbarrier_init.release.cluster; barrier.cluster.arrive.release.aligned; "
        "barrier.cluster.wait.acquire.aligned; mov.u32 $0, $1;",
        "=r,r", [token], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def load_q(tmap_addr, slot, row0, h, b, BUFS_AT: gl.constexpr, READY_AT: gl.constexpr, ROWS: gl.constexpr,
           HEAD_DIM: gl.constexpr, ELEM_BYTES: gl.constexpr, WARPS: gl.constexpr):
    """Arm Q slot ``slot``'s ready barrier and copy rows ``[row0, row0 + ROWS)`` of query head ``h``
    into it (``BUFS_AT``, ``READY_AT``: the byte offsets of the Q buffers and their ready barriers in
    shared memory); rows past the end read as zero."""
    layout: gl.constexpr = gl.BlockedLayout([1], [_THREADS_PER_WARP], [WARPS], [0])
    threads: gl.constexpr = WARPS * _THREADS_PER_WARP
    zeros = gl.full([threads], 0, gl.int32, layout)
    row_bytes: gl.constexpr = HEAD_DIM * ELEM_BYTES
    gl.inline_asm_elementwise(
        _copy_asm(BUFS_AT, READY_AT, ROWS * row_bytes, ROWS * _SWIZZLE_BYTES, row_bytes // _SWIZZLE_BYTES,
                    _SWIZZLE_BYTES // ELEM_BYTES),
        "=r,r,l,r,r,r,r",
        [gl.arange(0, threads, layout=layout), gl.full([threads], 0, gl.int64, layout) + tmap_addr, zeros + slot,
         zeros + row0, zeros + h, zeros + b],
        dtype=gl.int32, is_pure=False, pack=1)


@gluon.constexpr_function
def _copy_asm(bufs_at, ready_at, tile_bytes, chunk_bytes, chunks, chunk_cols, half_rows=0, half_bytes=0,
              both_halves=False):
    # $1: the thread's index in the producer, $2: the tensor map's global address, $3: the slot,
    # $4: the box's first row, $5: the head, $6: the batch; with ``half_rows`` (multicast), $7: this
    # CTA's rank. The producer's thread 0 arms its own ready barrier for the whole tile and copies
    # it in ``chunks`` 128-B column chunks. Triton lays a [rows, D] NVMMA tile out as column chunks
    # of [rows, 64 bf16] one after the other (its own TMA copy issues one box per chunk at
    # chunk · rows · 128 B).
    # Multicast (K/V): the copy is this CTA's half — rows [rank · half_rows, +half_rows) — into the
    # same offset of both CTAs, and a half's rows sit at rank · half_bytes inside each chunk; the
    # half is a multiple of the 1024-B swizzle period, so the swizzle agrees. With ``both_halves``
    # (a solo pair, K/V): both halves into this CTA alone. Without either (Q): the whole box into
    # this CTA alone
    multicast = half_rows > 0 and not both_halves
    suffix = ".multicast::cluster" if multicast else ""
    tail = ", mask" if multicast else ""

    def copy_chunks(pred, dst, row):
        out = []
        for chunk in range(chunks):
            if chunk:
                out.append(f"add.u32 {dst}, {dst}, {chunk_bytes}; ")
            out.append(
                f"@{pred} cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes{suffix} "
                f"[{dst}], [$2, {{{chunk * chunk_cols}, $5, {row}, $6}}], [ready]{tail}; ")
        return out

    copies = copy_chunks("leader", "dst", "row" if multicast else "$4")
    if both_halves:
        # a solo pair's copy: both halves of the K/V tile, each into this CTA alone, where the
        # multicast copies of the pair place them (the ready barrier's bytes are the same)
        regs = ".reg .b32 base, ready, dst, dst2, row2; "
        half = f"add.u32 dst2, dst, {half_bytes}; add.u32 row2, $4, {half_rows}; "
        copies += copy_chunks("leader", "dst2", "row2")
    elif multicast:
        regs = ".reg .b32 base, ready, dst, row; .reg .b16 mask; "
        half = (f"mad.lo.u32 dst, $7, {half_bytes}, dst; mad.lo.u32 row, $7, {half_rows}, $4; "
                f"mov.u16 mask, {PAIR_MASK}; ")
    else:
        regs, half = ".reg .b32 base, ready, dst; ", ""
    return ("{ .reg .pred leader; " + regs +
            "setp.eq.u32 leader, $1, 0; mov.u32 base, global_smem; "
            f"mad.lo.u32 ready, $3, 8, base; add.u32 ready, ready, {ready_at}; "
            f"mad.lo.u32 dst, $3, {tile_bytes}, base; add.u32 dst, dst, {bufs_at}; " + half +
            f"@leader mbarrier.arrive.expect_tx.shared::cta.b64 _, [ready], {tile_bytes}; "
            + "".join(copies) + "mov.u32 $0, 0; }")


@gluon.jit
def load_half(tmap_addr, idx, key0, kv_head, b, BUFS_AT: gl.constexpr, READY_AT: gl.constexpr,
              ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, ELEM_BYTES: gl.constexpr, WARPS: gl.constexpr,
              BOTH_HALVES: gl.constexpr = False):
    """Arm ring slot ``idx``'s ready barrier for a whole ``ROWS``-key tile and multicast this CTA's
    half of keys ``[key0, key0 + ROWS)`` into slot ``idx`` of both CTAs (``BUFS_AT``, ``READY_AT``:
    the byte offsets of the ring's buffers and ready barriers in shared memory). With
    ``BOTH_HALVES`` (a pair whose CTAs read different heads, ``cross_head_pairs``): both halves
    into slot ``idx`` of this CTA alone, through the same half-tile map."""
    layout: gl.constexpr = gl.BlockedLayout([1], [_THREADS_PER_WARP], [WARPS], [0])
    threads: gl.constexpr = WARPS * _THREADS_PER_WARP
    zeros = gl.full([threads], 0, gl.int32, layout)
    chunk_cols: gl.constexpr = _SWIZZLE_BYTES // ELEM_BYTES
    row_bytes: gl.constexpr = HEAD_DIM * ELEM_BYTES
    thread = gl.arange(0, threads, layout=layout)
    tmap = gl.full([threads], 0, gl.int64, layout) + tmap_addr
    if BOTH_HALVES:
        # no rank: each CTA copies both halves
        gl.inline_asm_elementwise(
            _copy_asm(BUFS_AT, READY_AT, ROWS * row_bytes, ROWS * _SWIZZLE_BYTES, row_bytes // _SWIZZLE_BYTES,
                      chunk_cols, ROWS // 2, ROWS // 2 * _SWIZZLE_BYTES, True),
            "=r,r,l,r,r,r,r", [thread, tmap, zeros + idx, zeros + key0, zeros + kv_head, zeros + b],
            dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise(
            _copy_asm(BUFS_AT, READY_AT, ROWS * row_bytes, ROWS * _SWIZZLE_BYTES, row_bytes // _SWIZZLE_BYTES,
                      chunk_cols, ROWS // 2, ROWS // 2 * _SWIZZLE_BYTES),
            "=r,r,l,r,r,r,r,r",
            [thread, tmap, zeros + idx, zeros + key0, zeros + kv_head, zeros + b, zeros + cta_rank()],
            dtype=gl.int32, is_pure=False, pack=1)


# --------------------------------------------------------------------------- host

_TMAP_DTYPES = {torch.float16: 6, torch.bfloat16: 9}        # CU_TENSOR_MAP_DATA_TYPE_FLOAT16 / BFLOAT16
# CUtensorMap enums: no interleave, 128-B swizzle, L2 promotion to 256 B, out-of-bounds reads as zero
_NO_INTERLEAVE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_ZERO = 0, 3, 3, 0


@functools.lru_cache(maxsize=None)
def libcuda():
    """The CUDA driver library, loaded once."""
    return ctypes.CDLL("libcuda.so.1")


def encode_tiled_map(data_ptr: int, data_type: int, dims, strides_bytes, box, swizzle: int, l2_promotion: int) -> bytes:
    """A 128-byte tiled TMA descriptor (``cuTensorMapEncodeTiled``), encoded by the driver for a copy
    that reads it from global memory: ``dims`` and ``box`` innermost first, ``strides_bytes`` every
    dimension's but the innermost, unit element strides, no interleave, zero fill past the end."""
    rank = len(dims)
    raw = ctypes.create_string_buffer(TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN_BYTES)
    start = -(-ctypes.addressof(raw) // TENSOR_MAP_ALIGN_BYTES) * TENSOR_MAP_ALIGN_BYTES
    encode = libcuda().cuTensorMapEncodeTiled
    encode.restype = ctypes.c_int
    status = encode(ctypes.c_void_p(start), data_type, rank, ctypes.c_void_p(data_ptr), (ctypes.c_uint64 * rank)(*dims),
                    (ctypes.c_uint64 * (rank - 1))(*strides_bytes), (ctypes.c_uint32 * rank)(*box),
                    (ctypes.c_uint32 * rank)(*([1] * rank)), _NO_INTERLEAVE, swizzle, l2_promotion, _OOB_ZERO)
    if status != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {status} for dims {tuple(dims)}, strides "
                           f"{tuple(strides_bytes)} B, box {tuple(box)}")
    return ctypes.string_at(start, TENSOR_MAP_BYTES)


def encode_row_map(t: torch.Tensor, box_rows: int) -> bytes:
    """A TMA descriptor over ``t`` (B, S, H, D): box of ``box_rows`` rows × one head × a 128-B
    column chunk, 128-B swizzle, zero fill past the end (:func:`load_half` reads K's and V's with
    half a K/V tile's rows, :func:`load_q` Q's with a consumer's rows)."""
    if t.dtype not in _TMAP_DTYPES:
        raise ValueError(f"kv_multicast maps fp16 and bf16 tensors, got {t.dtype}")
    elem = t.element_size()
    b, s, h, d = t.shape
    sb, ss, sh, _ = t.stride()
    return encode_tiled_map(t.data_ptr(), _TMAP_DTYPES[t.dtype], (d, h, s, b), (sh * elem, ss * elem, sb * elem),
                            (SWIZZLE_BYTES // elem, 1, box_rows, 1), _SWIZZLE_128B, _L2_PROMOTION_256B)


# Device copies of the maps by what they encode. A map holds the tensor's address, so a tensor
# allocated again at the same address with the same shape and strides reuses its map — which is
# still exact. Bounded; a map a captured CUDA graph reads is kept for good (the graph keeps its
# address), and a map is never built during a capture (its copy to the device would be recorded
# from host memory the graph does not own).
MAX_MAPS = 256
_MAPS: "collections.OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]]" = collections.OrderedDict()
_CAPTURED_MAPS: list = []


def kv_tensor_maps(k: torch.Tensor, v: torch.Tensor, rows: int, q: torch.Tensor | None = None,
                   q_rows: int = 0) -> torch.Tensor:
    """K's and V's maps (:func:`encode_row_map`, half of a ``rows``-key tile) side by side in one
    device tensor, 128 bytes each; with ``q``, Q's map (``q_rows`` rows) after them."""
    tensors = (k, v) if q is None else (k, v, q)
    key = tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors) + (rows, q_rows, k.device)
    entry = _MAPS.get(key)
    capturing = torch.cuda.is_current_stream_capturing()
    if entry is None:
        if capturing:
            raise RuntimeError(
                "hopper.fwd: kv_multicast encodes the K/V tensor maps on a tensor's first call, which a CUDA graph "
                "capture cannot record: call once with these k and v before capturing, or pass a config with "
                "kv_multicast=False")
        # pinned, so the copy is asynchronous; the host buffer lives as long as the device copy
        maps = encode_row_map(k, rows // 2) + encode_row_map(v, rows // 2)
        if q is not None:
            maps += encode_row_map(q, q_rows)
        host = torch.frombuffer(bytearray(maps), dtype=torch.uint8).pin_memory()
        entry = (host, host.to(k.device, non_blocking=True))
        _MAPS[key] = entry
        while len(_MAPS) > MAX_MAPS:
            _MAPS.popitem(last=False)
    else:
        _MAPS.move_to_end(key)
    if capturing:
        _CAPTURED_MAPS.append(entry)
    return entry[1]


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union (cluster dims first)
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint32 * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_CLUSTER_DIMENSION_ATTRIBUTE = 4          # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


def max_active_clusters(function: int, threads: int, shared_bytes: int, clusters: int) -> int:
    """How many clusters of two CTAs of the compiled kernel ``function`` the GPU holds at once
    (``cuOccupancyMaxActiveClusters``): a persistent grid of more would run some in a second wave."""
    attr = _LaunchAttribute(id=_CLUSTER_DIMENSION_ATTRIBUTE)
    attr.value[0], attr.value[1], attr.value[2] = CLUSTER_CTAS, 1, 1
    config = _LaunchConfig(gridDimX=clusters * CLUSTER_CTAS, gridDimY=1, gridDimZ=1, blockDimX=threads, blockDimY=1,
                           blockDimZ=1, sharedMemBytes=shared_bytes, hStream=None, attrs=ctypes.pointer(attr),
                           numAttrs=1)
    count = ctypes.c_int(0)
    status = libcuda().cuOccupancyMaxActiveClusters(ctypes.byref(count), ctypes.c_void_p(function),
                                                    ctypes.byref(config))
    if status != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed with CUresult {status}")
    return count.value
