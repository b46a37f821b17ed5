"""tail_combine — merges the split tail of ``hopper.fwd`` into its output.

What it computes: for each tail tile (``schedule.tail_split``) and each of its rows, the exact
softmax output over all keys from ``splits`` partial results over disjoint key ranges, each
normalized over its own keys with its natural-log LSE ``lse_s``:

    lse = log Σ_s exp(lse_s),   out = Σ_s exp(lse_s − lse) · O_s

evaluated against the largest ``lse_s`` (no overflow); a row every split saw no key for keeps
out = 0, lse = −inf. The order of the sum is fixed, so the result is deterministic. Two variants
(``loads_first``, the default since the merge alone was timed on the H200, and the chunked one
before it) sum over differently laid out blocks: compiled, their last bits may differ at any split
count; under the interpreter, which adds in source order, they agree bit for bit up to
``SPLITS_PER_LOAD`` splits.

Its lever is the split tail itself: a short last round of tiles runs over every SM instead of a
few (docs/hopper.md). This kernel is plain Triton — it runs under ``TRITON_INTERPRET=1``, which is
how CI checks it against the same merge written in torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# One program per row of a tail tile: every split's O row is loaded at once (a [splits, D] block,
# SPLITS_PER_LOAD splits per load), so the merge pays one or two memory latencies instead of one
# per split (the suite's d128 rows split 4 tiles 33 ways: 512 programs, two loads each).
SPLITS_PER_LOAD = 32
# With ``loads_first`` a program issues its partials' loads before it reads its tile's coordinates
# back (the row's bound masks the stores instead of a branch around the loads), and loads up to
# this many splits at once: the 33-way split is one [64, COLS] load. Census (sm_90a, d128, 33
# splits, pointers 16-byte aligned as a launch specializes them): the dependent memory latencies
# per program drop from five (the coordinates, then the LSEs behind the row's branch, two O
# chunks of the loop, the stores) to three (the coordinates with the LSEs, every O load, the
# stores: ptxas issues the O loads after the LSE max's first shuffle, not with the LSEs). Derived:
# at about 1 µs a latency, 2 µs of the merge's 8.7 µs at d128 S16k (ncu): 0.2% of a d128 S2k call
# (0.93 ms, fa4-protocol bench), 0.1% at S4k (1.71 ms) — under the paired protocol's keep
# threshold on a whole call, so it is priced on the merge alone (flashrung.evidence.merge_timing)
SPLITS_PER_LOAD_FIRST = 64
# ... over this many of a row's columns per program (a second grid axis over the rest): 64
# registers at 4 warps, so d128's 512 tail rows run as 1024 programs, eight CTAs an SM, one wave
# on 132 SMs; a whole [64, 128] row takes 109 registers (four CTAs an SM, two waves) — census
LOADS_FIRST_COLS = 64


@triton.jit
def _merge_row(part_o_ptr, part_lse_ptr, tile, row, splits, col0,
               BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_POW2: tl.constexpr, CHUNK: tl.constexpr,
               ONE_LOAD: tl.constexpr, COLS: tl.constexpr):
    # one tail row's merge over its columns [col0, col0 + COLS): (Σ_s w_s · O_s / Σ_s w_s, the
    # row's LSE), w_s = exp(lse_s − the largest)
    first = tile * splits                                    # work item of split 0
    s = tl.arange(0, SPLITS_POW2)
    items = (first + s).to(tl.int64) * BLOCK_M + row
    cols = col0 + tl.arange(0, COLS)
    lse_s = tl.load(part_lse_ptr + items, mask=s < splits, other=float("-inf"))
    if ONE_LOAD:
        # every split's O row in the same load as the LSEs: nothing waits between them (the loop
        # below reloads the LSEs and cannot start its loads before the max is known)
        o = tl.load(part_o_ptr + items[:, None] * HEAD_DIM + cols[None, :], mask=(s < splits)[:, None], other=0.0)
    lse_max = tl.max(lse_s, 0)
    ref = tl.where(lse_max == float("-inf"), 0.0, lse_max)   # a row no split saw: weights 0
    total = tl.sum(tl.exp(lse_s - ref), 0)
    if ONE_LOAD:
        acc = tl.sum(tl.exp(lse_s - ref)[:, None] * o, 0)
    else:
        acc = tl.zeros([COLS], tl.float32)
        for s0 in range(0, splits, CHUNK):
            c = s0 + tl.arange(0, CHUNK)
            chunk = (first + c).to(tl.int64) * BLOCK_M + row
            w = tl.exp(tl.load(part_lse_ptr + chunk, mask=c < splits, other=float("-inf")) - ref)
            o = tl.load(part_o_ptr + chunk[:, None] * HEAD_DIM + cols[None, :], mask=(c < splits)[:, None],
                        other=0.0)
            acc += tl.sum(w[:, None] * o, 0)
    safe = tl.where(total == 0.0, 1.0, total)
    lse = tl.where(total == 0.0, float("-inf"), ref + tl.log(safe))
    return acc / safe, lse


@triton.jit
def _combine_kernel(part_o_ptr, part_lse_ptr, coords_ptr, out_ptr, lse_ptr,
                    seqlen_q, heads_q, splits, stride_ob, stride_os, stride_oh,
                    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_POW2: tl.constexpr,
                    CHUNK: tl.constexpr, LOADS_FIRST: tl.constexpr, COLS: tl.constexpr, OUT_DIM: tl.constexpr):
    # OUT_DIM < HEAD_DIM: a padded head dim (config.kernel_head_dim); the workspace's columns past
    # the output's are the zero columns' (exact zeros) and are not stored
    tile = tl.program_id(0) // BLOCK_M
    row = tl.program_id(0) % BLOCK_M
    b = tl.load(coords_ptr + tile * 3 + 0)
    h = tl.load(coords_ptr + tile * 3 + 1)
    m_block = tl.load(coords_ptr + tile * 3 + 2)
    q_row = m_block * BLOCK_M + row
    if LOADS_FIRST:
        # rows past Sq merge whatever their partials hold (finite garbage or -inf) and are not
        # stored: the loads need not wait for the coordinates. Each program takes COLS of the
        # row's columns (grid axis 1), so every split's slice of O fits one load without spilling
        col0 = tl.program_id(1) * COLS
        o, lse = _merge_row(part_o_ptr, part_lse_ptr, tile, row, splits, col0, BLOCK_M, HEAD_DIM, SPLITS_POW2,
                            CHUNK, CHUNK >= SPLITS_POW2, COLS)
        inside = q_row < seqlen_q
        o_offs = b.to(tl.int64) * stride_ob + q_row.to(tl.int64) * stride_os + h.to(tl.int64) * stride_oh
        lse_offs = (b * heads_q + h).to(tl.int64) * seqlen_q + q_row
        cols = col0 + tl.arange(0, COLS)
        keep = inside
        if OUT_DIM < HEAD_DIM:
            keep = keep & (cols < OUT_DIM)
        tl.store(out_ptr + o_offs + cols, o.to(out_ptr.dtype.element_ty), mask=keep)
        tl.store(lse_ptr + lse_offs, lse, mask=inside & (col0 == 0))
    else:
        if q_row < seqlen_q:
            o, lse = _merge_row(part_o_ptr, part_lse_ptr, tile, row, splits, 0, BLOCK_M, HEAD_DIM, SPLITS_POW2,
                                CHUNK, False, HEAD_DIM)
            o_offs = b.to(tl.int64) * stride_ob + q_row.to(tl.int64) * stride_os + h.to(tl.int64) * stride_oh
            cols = tl.arange(0, HEAD_DIM)
            if OUT_DIM < HEAD_DIM:
                tl.store(out_ptr + o_offs + cols, o.to(out_ptr.dtype.element_ty), mask=cols < OUT_DIM)
            else:
                tl.store(out_ptr + o_offs + cols, o.to(out_ptr.dtype.element_ty))
            tl.store(lse_ptr + (b * heads_q + h).to(tl.int64) * seqlen_q + q_row, lse)


def workspace_words(items: int, tiles: int, block_m: int, head_dim: int) -> int:
    """The 4-byte words of the split tail's workspace: every item's O and LSE, every tile's coordinates."""
    return items * block_m * head_dim + items * block_m + tiles * 3


def carve_workspace(buf: torch.Tensor, items: int, tiles: int, block_m: int,
                    head_dim: int) -> tuple[torch.Tensor, ...]:
    """``(part_o, part_lse, coords)`` as views of ``buf``, a contiguous fp32 tensor of exactly
    :func:`workspace_words` words."""
    words = workspace_words(items, tiles, block_m, head_dim)
    if buf.dtype != torch.float32 or buf.dim() != 1 or not buf.is_contiguous() or buf.numel() != words:
        raise ValueError(f"buf must be a contiguous 1-D fp32 tensor of {words} words, got "
                         f"{tuple(buf.shape)} {buf.dtype}")
    o_words, lse_words = items * block_m * head_dim, items * block_m
    return (buf[:o_words].view(items, block_m, head_dim), buf[o_words:o_words + lse_words].view(items, block_m),
            buf[o_words + lse_words:].view(torch.int32).view(tiles, 3))


def workspace(items: int, tiles: int, block_m: int, head_dim: int, device) -> tuple[torch.Tensor, ...]:
    """``(part_o, part_lse, coords)`` for ``items`` work items over ``tiles`` tail tiles, carved from
    one allocation (one allocator call per forward)."""
    buf = torch.empty(workspace_words(items, tiles, block_m, head_dim), dtype=torch.float32, device=device)
    return carve_workspace(buf, items, tiles, block_m, head_dim)


def combine_tail(part_o: torch.Tensor, part_lse: torch.Tensor, coords: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, splits: int, loads_first: bool = True) -> None:
    """Write the merged rows of every tail tile into ``out`` (B, Sq, Hq, D_out) and ``lse`` (B, Hq, Sq).

    ``part_o`` fp32 ``[tiles · splits, BLOCK_M, D]`` and ``part_lse`` fp32 ``[tiles · splits,
    BLOCK_M]`` hold work item ``tile · splits + s`` at index ``tile · splits + s``; ``coords``
    int32 ``[tiles, 3]`` holds each tail tile's (batch, q_head, m_block). ``loads_first`` (the
    default): each program's loads issued ahead of its coordinates, up to ``SPLITS_PER_LOAD_FIRST``
    splits a load; ``False``: the chunked merge, ``SPLITS_PER_LOAD`` splits a load behind the row's
    branch. Both are deterministic; compiled, their sums run over differently laid out blocks and
    their last bits may differ (on the H200 they did at 16 and 33 splits, agreeing to rounding).
    ``D_out`` is ``D`` or, for a padded head dim (``config.kernel_head_dim``), fewer: the first
    ``D_out`` of the workspace's columns are stored.
    """
    if part_o.dim() != 3 or part_o.dtype != torch.float32 or not part_o.is_contiguous():
        raise ValueError(f"part_o must be a contiguous fp32 [items, BLOCK_M, D] tensor, got "
                         f"{tuple(part_o.shape)} {part_o.dtype}")
    items, block_m, head_dim = part_o.shape
    if not isinstance(splits, int) or splits < 1 or items % splits:
        raise ValueError(f"splits must be a positive integer dividing the {items} work items, got {splits!r}")
    tiles = items // splits
    if part_lse.shape != (items, block_m) or part_lse.dtype != torch.float32 or not part_lse.is_contiguous():
        raise ValueError(f"part_lse must be a contiguous fp32 {(items, block_m)} tensor, got "
                         f"{tuple(part_lse.shape)} {part_lse.dtype}")
    if coords.shape != (tiles, 3) or coords.dtype != torch.int32 or not coords.is_contiguous():
        raise ValueError(f"coords must be a contiguous int32 {(tiles, 3)} tensor, got {tuple(coords.shape)} "
                         f"{coords.dtype}")
    if out.dim() != 4 or not 1 <= out.shape[3] <= head_dim or out.stride(3) != 1:
        raise ValueError(f"out must be (B, Sq, Hq, D_out) with 1 <= D_out <= {head_dim} (the workspace's D) and "
                         f"unit stride in the last dimension, got {tuple(out.shape)} strides {out.stride()}")
    batch, seqlen_q, heads_q, _ = out.shape
    if lse.shape != (batch, heads_q, seqlen_q) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"lse must be a contiguous fp32 {(batch, heads_q, seqlen_q)} tensor")
    if head_dim & (head_dim - 1):
        raise ValueError(f"D must be a power of two, got {head_dim}")
    if not isinstance(loads_first, bool):
        raise ValueError(f"loads_first must be a bool, got {loads_first!r}")
    if tiles == 0:
        return
    per_load = SPLITS_PER_LOAD_FIRST if loads_first else SPLITS_PER_LOAD
    cols = min(head_dim, LOADS_FIRST_COLS) if loads_first else head_dim
    _combine_kernel[(tiles * block_m, head_dim // cols)](
        part_o, part_lse, coords, out, lse, seqlen_q, heads_q, splits, out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=block_m, HEAD_DIM=head_dim, SPLITS_POW2=triton.next_power_of_2(splits),
        CHUNK=min(per_load, triton.next_power_of_2(splits)), LOADS_FIRST=loads_first, COLS=cols,
        OUT_DIM=out.shape[3])
