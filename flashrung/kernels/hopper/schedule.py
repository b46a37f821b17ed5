"""Which tile a CTA computes, which K/V tiles it visits, and which of those need a mask.

Tiles are ``(batch, q_head, m_block)``. The linear tile order is the lever (seed 001, 0x0B):

* plain order: ``m_block`` fastest, so the CTAs of one head run together and share its K/V in L2;
* LPT order (``LPT=True``): heads are grouped in sections whose K/V fit the L2 budget; within a
  section ``m_block`` runs from the last (the heaviest under a causal mask) to the first, heads
  fastest. The hardware block scheduler hands out CTAs in this order as SMs free up, which is a
  greedy longest-first list schedule; a persistent grid walks the same order with a stride.

Causal masks are bottom-right aligned: query ``i`` sees key ``j`` iff ``j <= i + (Sk - Sq)``.
K/V tiles fully above the diagonal are never loaded; tiles fully below it (and fully inside
``Sk``) run without any mask; only the remaining tiles pay for one.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# K/V bytes of the heads that run together should stay in L2 (H200: 60 MiB; FA4 uses ~50 MB).
L2_BUDGET_BYTES = 48 * 1024 * 1024


def head_section(seqlen_k: int, heads_q: int, heads_kv: int, head_dim: int, elem_bytes: int) -> int:
    """How many consecutive (batch, q_head) columns the LPT order keeps together.

    A multiple of the GQA group, so every q-head that shares a K/V head runs in the same section.
    """
    group = heads_q // heads_kv
    kv_bytes_per_kv_head = 2 * seqlen_k * head_dim * elem_bytes
    kv_heads = max(1, L2_BUDGET_BYTES // max(kv_bytes_per_kv_head, 1))
    return group * kv_heads


@gluon.jit
def tile_coords(tile_id, num_m_blocks, batch_heads, heads_q, head_section, LPT: gl.constexpr):
    """(batch, q_head, m_block) of linear tile ``tile_id``."""
    if LPT:
        per_section = num_m_blocks * head_section
        section = tile_id // per_section
        first_bh = section * head_section
        width = gl.minimum(head_section, batch_heads - first_bh)
        r = tile_id - section * per_section
        m_block = num_m_blocks - 1 - r // width
        bh = first_bh + r % width
    else:
        bh = tile_id // num_m_blocks
        m_block = tile_id % num_m_blocks
    return bh // heads_q, bh % heads_q, m_block


@gluon.jit
def kv_tile_range(row0, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  IS_CAUSAL: gl.constexpr):
    """(num_tiles, num_unmasked) K/V tiles for the query rows ``[row0, row0 + BLOCK_M)``.

    Tiles ``[0, num_unmasked)`` need no mask for any row of the CTA; tiles
    ``[num_unmasked, num_tiles)`` are masked (key tail ``>= Sk`` and/or the causal diagonal).
    """
    if IS_CAUSAL:
        diag = seqlen_k - seqlen_q
        last_row = gl.minimum(row0 + BLOCK_M, seqlen_q) - 1
        kv_end = gl.maximum(gl.minimum(seqlen_k, last_row + diag + 1), 0)
        # keys every row of the tile sees: those the first row sees
        full_end = gl.maximum(gl.minimum(seqlen_k, row0 + diag + 1), 0)
        num_tiles = gl.cdiv(kv_end, BLOCK_N)
        num_unmasked = full_end // BLOCK_N
    else:
        num_tiles = gl.cdiv(seqlen_k, BLOCK_N)
        num_unmasked = seqlen_k // BLOCK_N
    return num_tiles, num_unmasked
