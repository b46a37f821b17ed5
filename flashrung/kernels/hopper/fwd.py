"""hopper.fwd — the sm_90a attention forward in Gluon: TMA, wgmma, warp specialization.

What it computes: ``out = softmax(scale · q kᵀ [+ causal mask]) v`` and the natural-log LSE, for
q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D), fp16/bf16, D ∈ {64, 128, 256}, GQA ``Hq % Hkv == 0``,
causal masks aligned bottom-right. Any other D that is a multiple of 8 up to 256 runs the kernel
of the next of those, its TMA boxes that wide over the narrower tensors (``kernel_head_dim``); so
does a v (and out) with a head dim of its own, Dv, both padded to the kernel of the wider.

Its lever is the FA3 schedule (seed 001, 0x02–0x05, 0x0B), built from Gluon's primitives:

* a CTA owns ``BLOCK_M`` query rows, split into 64-row halves, one per *consumer warpgroup*, each
  its own ``gl.warp_specialize`` partition with a large register budget (``setmaxnreg``);
* one 1-warp *producer* partition with a tiny register budget issues every TMA load: Q once per
  tile (one box per consumer), K and V into an ``NUM_KV_STAGES``-deep ring guarded by
  ``*_ready_bars`` (TMA transaction bytes) and ``*_empty_bars`` (one arrival per consumer);
* QKᵀ runs on ``warpgroup_mma`` with both operands in shared memory; the online softmax runs in
  registers with ``exp2`` and the folded scale; P goes from registers straight into the PV
  ``warpgroup_mma`` as its A operand;
* switches: the intra-warpgroup overlap (issue QK(j) and PV(j-1) together, ``wait(1)`` → softmax(j)
  → ``wait(0)``, the last behind a branch so ptxas cannot hoist it above the exponentials: see
  ``pipeline.wait_mma_after_softmax``), or FA4's order (``wait_pv_early``: PV(j-1) waited right
  after the row max), the inter-warpgroup pingpong (a GEMM-issue token passed through mbarriers
  or, with ``named_turns``, hardware named barriers in inline PTX), Q in registers for QK
  (``q_in_registers``),
  heaviest-first (LPT) tile order, a persistent grid, and four softmax-side levers: the O rescale
  in the shadow of the next QK (``late_rescale``), P packed to 16 bits two at a time
  (``pack_p``), FA4's conditional rescaling with a retained reference (``rescale_threshold``;
  with ``rescale_by_warp`` each warp skips O's rescale on its own vote, in either order),
  FA4's exp2 split onto the FMA pipe (``exp2_fma_every``), tree-shaped row reductions
  (``tree_reduce``) or FA4's four interleaved row-max chains (``four_max_chains``) and FA4's
  deferred row sum (``defer_row_sum``); ``config_with`` applies
  ``impl="hopper.fwd@key=value"`` overrides;
* causal: K/V tiles above the diagonal are never loaded and only diagonal/tail tiles are masked,
  each score against one bound per row (``row_bound_mask``, the causal default); a work item's
  first tile is masked only where the loop's rule masks it (``first_mask_on_need``, the default;
  a non-causal launch with a key tail masks it always); a masked tile whose second half of keys
  none of a warpgroup's rows sees skips that half's softmax work (``skip_unseen_half``:
  ``_halves``, ``_masked_row_max_by_halves``, ``_exp_by_halves``; the default of d64's
  short-causal tile from 1025 to 2048 until change 31), and one whose first half every row sees
  may mask its second half only (``mask_second_half``, ``_first_half_seen``: measured, off); the
  unmasked and masked K/V steps may share one loop with the mask behind a branch
  (``single_kv_loop``: the default of d64's short-causal tile up to 2048);
* a consumer warpgroup whose rows all lie past ``seqlen_q`` keeps the ring's and the token's
  protocol and issues no GEMM (``skip_empty_rows``, ``_pass_tiles``);
* the consumers' elected arrivals (the K/V releases, the mbarrier turn) may be inline PTX by the
  warpgroup's thread 0 with no partition-wide ``bar.sync`` before them (``asm_arrivals``,
  ``pipeline.arrive_unsynced``: the default of d128 causal from S2k and d128 non-causal from S4k);
  the PTX names each barrier array by its shared-memory offset, which ``barrier_offsets`` reads
  from the allocation pass of a first compile and checks against the second;
* K/V multicast across clusters of two CTAs (``kv_multicast``, ``multicast.py``; the default of
  non-causal d64 and d128 from S4k, +0.6–2.2% paired): the CTAs of a cluster take
  neighbouring q-tiles of one head, each producer (then a whole warpgroup) loads half of every
  K/V tile into both, the empty barriers count both CTAs' releases, and the launch runs in
  clusters of two through ``DirectLaunch``; that producer's waits and Q copies in inline PTX, no
  partition ``bar.sync`` (``producer_unsynced``: the default of the paired d64 launches (from S4k)
  and d128's from S4096 to 8191, +0.3–0.6% paired; with the pairing +0.6–1.1% at d64 S32k); or
  the pair's K/V releases relayed by the producers, so no consumer arrives on the peer
  (``relay_release``, ``_relay``: the default of the d128 pairs from S8k, +0.6–2.2% paired); at
  d64 a pair is two consecutive tiles of the launch, so a head with an odd q-tile count leaves no
  CTA idle — a pair across two heads loads its own K/V in each CTA (``cross_head_pairs``,
  ``_solo_pair``, ``multicast.load_half``: +2.6–3.8% paired at odd counts);
* the overlapped K/V loop may carry its ring slot and phase from step to step
  (``carry_ring_slot``, ``pipeline.next_ring_slot``: measured, off) instead of recomputing both
  from the ring count;
* each partition decodes its work items (``_work_coords``) by run-time division, or by
  multiply-high with magic numbers from the host (``fast_divide_producer``,
  ``fast_divide_consumers``; ``schedule.fast_divisor``), the default up to S2k–S4k and at every
  length of d128 causal (``config.FAST_DIVIDE_MAX_SEQLEN``);
* P's conversions for the next PV may be issued ahead of O's rescale (``convert_before_rescale``:
  measured, off);
* the frozen row max (``freeze_row_max``, the default from ``config.FREEZE_ROW_MAX_MIN_SEQLEN``
  on calls of ``config.FREEZE_ROW_MAX_MIN_FLOP`` or more, with ``config.FREEZE_ROW_MAX_BRINGS``):
  an item's unmasked K/V steps keep the reference its first tile set — no row max, no ``alpha``, no O
  rescale (``softmax.softmax_exp_frozen``; in fp16 that reference raised by ``fp16_row_max_margin``,
  head room for P's 16-bit operand) — and each item's end tests O and ``l`` finite
  (:func:`_flag_overflow`): a row a later score overflowed gets a NaN LSE and sets a guard word, and
  ``portable.fwd.recompute_flagged`` rewrites such rows with the online softmax after the launch;
* the running row sum may be taken by the tensor pipe (``row_sum_by_mma``: beside each PV a
  wgmma of the same P against a tile of ones, ``_pv``; measured, off);
* P may reach PV from shared memory (``p_in_smem``: each consumer's ``p_bufs``, ``_operands``;
  FA3's order then fits d64's registers; measured, off);
* with ``overlap_epilogue`` a tile's epilogue (``_epilogue``) runs under the next tile's first QK
  (``_finish_previous``), the one product no softmax overlaps;
* wider K/V tiles (``extra_keys``): each ring stage holds a second TMA box of keys after the
  first ``BLOCK_N`` and each product is two wgmma groups; S and P travel as tuples of parts; with
  ``staged_scores`` the first box's row max runs between QK's two waits (measured, off);
* a balanced persistent grid (``balanced``, the default of every causal d64 and d128 problem):
  each CTA walks its own list of tiles, list-scheduled on the host (``schedule.balanced_schedule``)
  and kept on the device per shape, instead of a stride; with ``balanced_partial_tiles`` (the
  default on d64's causal 192-row tile) a partial last query tile is estimated by the consumer
  warpgroups that have rows (``schedule.tile_cost``);
* tiles handed out at run time (``dynamic_tiles``, or ``dynamic_pool_share`` after the balanced
  lists; measured, off): the producer draws each next tile from a self-resetting counter
  (``schedule.handout_next``) after the current tile's last load (``draw_ahead_steps``: that many
  K/V tiles before it) and hands it to its consumers in a word beside the tile's Q (``_hand_item``,
  ``_handed_item``; ``handout_barrier``: on a barrier of its own as soon as it is drawn,
  ``_post_item``); item -1 ends their loop;
* staggered K/V sweeps (``stagger_kv``, the default of d64 from max(Sq, Sk) = 3072): each work
  item visits its unmasked K/V tiles from its own start and wraps (``schedule.kv_stagger``), so
  CTAs that start together stop loading the same K/V lines at once; masked tiles stay last;
* the split tail (``split_tail``, non-causal): the tiles of a short last round are cut along the
  keys into work items over every SM, each leaving a partial O and LSE that ``tail_combine``
  merges (``schedule.tail_split``);
* O is normalized in registers, written to shared memory and stored by TMA: into its own buffer
  (``separate_o``: Q is released when the tile's K/V loop is done, before the epilogue, and the
  store is waited only before the buffer is reused), or into the consumer's Q buffer once the
  last QK is done;
* two Q buffers per consumer (``num_q_stages=2``, with ``separate_o``; the default up to S2k–S4k
  and at every length of d128 causal, ``config.TWO_Q_STAGES_MAX_SEQLEN``): the producer loads the
  next tile's Q while this tile still reads its own, instead of after this tile's loop.

Descriptors are 4-D over the untransposed (B, S, H, D) tensors, box ``[1, rows, 1, D]``: TMA
bounds every dimension, so a tile that runs past ``S`` reads zeros (never the next batch) and its
store is clipped (never writes the next batch); no transposed or padded copies are made.

Packed sequences (flash-attn's varlen, ``PACKED``) are one batch entry of rows: each work item reads
its sequence's first rows and lengths from ``cu_seqlens`` (``_sequence``) and every range, mask and
bound of the item uses them; the grid covers the longest sequence, an item past its sequence's rows
has no K/V tile. A tile past a sequence's end reads the next sequence's rows (masked, as a key tail
is), and its O box would write them: a sequence's partial last box of O goes out from registers,
masked (``_store_rows``), its whole boxes by TMA. The split tail and the pairs are off
(``config.PACKED_CLASHES``).

Evidence: SASS census (``census_specs``; HGMMA, UTMALDG, USETMAXREG, no local memory in the KV
loop, shared memory ≤ 227 KiB), the gate on the H200 (``flashrung check --kernel hopper.fwd``: 84/84), paired
margins of every default lever (``flashrung compare``) and the preheated ``fa4-protocol`` bench;
figures and their protocols are in docs/hopper.md.
"""
# No ``from __future__ import annotations`` here: aggregate fields are type-checked against their
# annotations at trace time, which must therefore be real classes, not strings.
import collections
import dataclasses
import functools
import types
from typing import Any, Mapping, NamedTuple

import numpy as np
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton._utils import validate_block_shape
from triton.language.core import _aggregate as aggregate
from triton.runtime import driver as triton_driver

from flashrung._device import sm_count as _sm_count
from flashrung.dispatch import score_options_reason
from flashrung.inputs import NO_WINDOW, check_softcap, host_offsets
from flashrung.kernels.direct_launch import DirectLaunch, enabled_by_environment
from flashrung.kernels.hopper.config import (
    PARTIAL_TILE_COST_SHARE,
    ROWS_PER_CONSUMER_WARPGROUP,
    ROW_SUM_COLS,
    SUPPORTED_HEAD_DIMS,
    WORK_ITEM_FIXED_KV_TILES,
    HopperFwdConfig,
    kernel_head_dim,
    kernel_head_dims,
    launches_causal,
    qk_boxes,
    window_clashes,
    packed_clashes,
    replace_following,
    select_config,
)
from flashrung.kernels.hopper.pipeline import (BARRIER_OFFSETS, BARRIER_SWITCHES, allocation_offsets, next_ring_slot,
                                              pass_exp_turn, pass_exp_turn_through, pass_turn, ready_wait, release,
                                              release_arrivals, ring_slot, resolve_shared_offsets, start_exp_turns,
                                              relay_to_peer, start_turns, wait_exp_turn, wait_mma_after_softmax,
                                              wait_turn, wait_unsynced, warmup_compiler)
from flashrung.kernels.hopper.schedule import (
    DIVIDEND_BITS,
    FastDivisor,
    divide,
    fast_divisor,
    fast_tile_coords,
    HANDOUT_WORDS,
    handout_finish,
    handout_item,
    handout_range,
    balanced_section,
    head_section,
    kv_split_range,
    kv_stagger,
    kv_visit,
    balanced_schedule,
    kv_tile_range,
    packed_handout_table,
    packed_schedule,
    PackedSections,
    last_section_width,
    TILE_OVERHEAD_KV_TILES,
    tail_split,
    tile_coords,
    work_at,
    work_item,
    work_range,
    window_tile_range,
)
from flashrung.kernels.hopper.tail_combine import combine_tail, workspace as tail_workspace
from flashrung.kernels.portable.fwd import check_guard, recompute_flagged
from flashrung.kernels.hopper.multicast import (_CLUSTER_CTAS, _TENSOR_MAP_BYTES, CLUSTER_CTAS, cta_rank,
                                               join_cluster, kv_tensor_maps, load_half, load_q, max_active_clusters)
from flashrung.kernels.hopper.trace import (E_END, E_ISSUED, E_MID, E_PV, E_READY, E_SCORES, E_TOP, E_TURN,
                                            NUM_EVENTS, NUM_TILE_FIELDS, WARPS_PER_WARPGROUP, stamp, step_record,
                                            tile_end, tile_start)
from flashrung.kernels.hopper.softmax import (
    capped,
    finalize,
    fold_scale,
    first_part_row_max,
    first_visible_key,
    init_row_sum,
    last_visible_key,
    mask_scores,
    mask_scores_by_bound,
    mask_scores_by_bounds,
    online_softmax,
    online_softmax_retained,
    rescale_factor,
    rescale_by_warp,
    rescaled_sum,
    retained_max,
    row_sum_total,
    softmax_exp,
    softmax_exp_ahead,
    softmax_exp_behind,
    softmax_exp_frozen,
    softmax_reduce_form,
    softcap_factors,
    softmax_row_max,
    staged_row_max,
    to_operand_dtype,
)

KERNEL_NAME = "hopper.fwd"
CONSUMER_WARPS = 4        # one warpgroup: the wgmma issue unit
PRODUCER_WARPS = 1        # TMA is issued by one thread; the rest of its warpgroup is padding
# with kv_multicast (or producer_warpgroup) the producer is the whole warpgroup: every thread meets
# the cluster barrier (multicast.join_cluster), and Triton's idle padding warps never would
MULTICAST_PRODUCER_WARPS = 4
TMA_ALIGN_BYTES = 16      # TMA: base address and every non-unit stride a multiple of 16 bytes
_ROWS = gl.constexpr(ROWS_PER_CONSUMER_WARPGROUP)
_CONSUMER_WARPS = gl.constexpr(CONSUMER_WARPS)
_PRODUCER_WARPS = gl.constexpr(PRODUCER_WARPS)
_MULTICAST_PRODUCER_WARPS = gl.constexpr(MULTICAST_PRODUCER_WARPS)
# the place of Q's tensor map in kv_tmaps_ptr (producer_unsynced): after K's (0) and V's (1)
_Q_MAP = gl.constexpr(2)
# columns of the running-sum accumulator with ``ROW_SUM_BY_MMA`` (every column holds the same sum:
# P times a tile of ones)
_SUM_COLS = gl.constexpr(ROW_SUM_COLS)

_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
_SIG_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


# --------------------------------------------------------------------------- shared state


@aggregate
class _Shared:
    """Shared-memory buffers and mbarriers, handed to every partition."""

    q_bufs: gl.shared_memory_descriptor        # [Q stages · consumers, 1, 64, 1, D]
    o_bufs: gl.shared_memory_descriptor        # O staging for the TMA store: q_bufs itself, or its own
    k_bufs: gl.shared_memory_descriptor        # [stages, 1, BLOCK_N, 1, D]
    v_bufs: gl.shared_memory_descriptor        # [stages, 1, BLOCK_N, 1, D]
    q_ready_bars: gl.shared_memory_descriptor  # per Q stage and consumer: its Q box landed
    q_empty_bars: gl.shared_memory_descriptor  # per Q stage and consumer: its Q buffer is free again
    k_ready_bars: gl.shared_memory_descriptor  # per stage: K tile landed
    k_empty_bars: gl.shared_memory_descriptor  # per stage: every consumer finished QK on it
    v_ready_bars: gl.shared_memory_descriptor
    v_empty_bars: gl.shared_memory_descriptor
    turn_bars: gl.shared_memory_descriptor     # per consumer: the pingpong GEMM-issue token
    k2_bufs: gl.shared_memory_descriptor       # [stages, 1, EXTRA_KEYS, 1, D]: the second box (k_bufs if none),
    v2_bufs: gl.shared_memory_descriptor       # or for K [stages, 1, BLOCK_N, 1, HEAD_DIM_TAIL] (split_head_dim)
    q2_bufs: gl.shared_memory_descriptor       # [Q stages · consumers, 1, 64, 1, HEAD_DIM_TAIL] (q_bufs if none)
    ones_bufs: gl.shared_memory_descriptor     # [consumers, 8, BLOCK_N] of ones (ROW_SUM_BY_MMA; k_bufs if off)
    p_bufs: gl.shared_memory_descriptor        # [consumers, 64, BLOCK_N]: P for PV (P_IN_SMEM; k_bufs if off)
    item_bufs: gl.shared_memory_descriptor     # int32 [item slots · consumers, 1]: the handed work item (DYNAMIC)
    item_ready_bars: gl.shared_memory_descriptor  # per item slot and consumer: its word is written (ITEM_BARRIER)
    k_relay_bars: gl.shared_memory_descriptor  # per stage: the peer's consumers released it (RELAY_RELEASE)
    v_relay_bars: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q_bufs, o_bufs, k_bufs, v_bufs, q_ready_bars, q_empty_bars, k_ready_bars,
                 k_empty_bars, v_ready_bars, v_empty_bars, turn_bars, k2_bufs, v2_bufs, ones_bufs, item_bufs,
                 k_relay_bars, v_relay_bars, q2_bufs, p_bufs, item_ready_bars):
        self.item_ready_bars = item_ready_bars
        self.p_bufs = p_bufs
        self.q2_bufs = q2_bufs
        self.item_bufs = item_bufs
        self.k_relay_bars = k_relay_bars
        self.v_relay_bars = v_relay_bars
        self.ones_bufs = ones_bufs
        self.k2_bufs = k2_bufs
        self.v2_bufs = v2_bufs
        self.q_bufs = q_bufs
        self.o_bufs = o_bufs
        self.k_bufs = k_bufs
        self.v_bufs = v_bufs
        self.q_ready_bars = q_ready_bars
        self.q_empty_bars = q_empty_bars
        self.k_ready_bars = k_ready_bars
        self.k_empty_bars = k_empty_bars
        self.v_ready_bars = v_ready_bars
        self.v_empty_bars = v_empty_bars
        self.turn_bars = turn_bars


@aggregate
class _Sizes:
    """Runtime scalars every partition needs to walk the same tiles; the work-item decode's
    divisors come with their multiply-high magic (schedule.FastDivisor)."""

    seqlen_q: gl.tensor
    seqlen_k: gl.tensor
    heads_q: FastDivisor
    group: FastDivisor          # q heads per K/V head (GQA)
    num_m_blocks: FastDivisor
    batch_heads: gl.tensor
    head_section: FastDivisor   # (batch, head) columns per LPT section
    last_section: FastDivisor   # columns of the last LPT section (schedule.last_section_width)
    per_section: FastDivisor    # tiles per LPT section: num_m_blocks · head_section
    num_items: gl.tensor        # work items: whole tiles, then the split tail's items
    num_full_tiles: gl.tensor
    tail_splits: FastDivisor    # work items per tail tile (1: no split tail)
    sched_ptr: gl.tensor        # int32 table of the balanced grid (schedule.balanced_schedule)
    handout_ptr: gl.tensor      # int32 [2]: the dynamic hand-out's counters (schedule.handout_next)
    kv_tmaps_ptr: gl.tensor     # kv_multicast: K's and V's tensor maps in global memory, then Q's with
                                # producer_unsynced (multicast.kv_tensor_maps)
    softcap_pre: gl.tensor      # HAS_SOFTCAP: softmax.capped's factors (softmax.softcap_factors)
    softcap_post: gl.tensor
    window_left: gl.tensor      # HAS_WINDOW: keys a row sees to the left of its diagonal (window_size[0])
    window_right: gl.tensor     # HAS_WINDOW: keys right of it (window_size[1]; 0 for the causal mask's own)
    rows_q: gl.tensor           # LSE's rows a head: seqlen_q, or with PACKED the packed rows of every sequence
    cu_seqlens_q: gl.tensor     # PACKED: int32 [batch + 1], flash-attn's cumulative lengths (never read otherwise)
    cu_seqlens_k: gl.tensor
    out_ptr: gl.tensor          # PACKED: out's base, for a sequence's last rows (_store_rows; never read otherwise)

    @gluon.constexpr_function
    def __init__(self, seqlen_q, seqlen_k, heads_q, group, num_m_blocks, batch_heads, head_section, last_section,
                 per_section, num_items, num_full_tiles, tail_splits, sched_ptr, handout_ptr, kv_tmaps_ptr,
                 softcap_pre, softcap_post, window_left, window_right, rows_q, cu_seqlens_q, cu_seqlens_k,
                 out_ptr):
        self.window_left = window_left
        self.window_right = window_right
        self.rows_q = rows_q
        self.cu_seqlens_q = cu_seqlens_q
        self.cu_seqlens_k = cu_seqlens_k
        self.out_ptr = out_ptr
        self.softcap_pre = softcap_pre
        self.softcap_post = softcap_post
        self.kv_tmaps_ptr = kv_tmaps_ptr
        self.sched_ptr = sched_ptr
        self.handout_ptr = handout_ptr
        self.seqlen_q = seqlen_q
        self.seqlen_k = seqlen_k
        self.heads_q = heads_q
        self.group = group
        self.num_m_blocks = num_m_blocks
        self.batch_heads = batch_heads
        self.head_section = head_section
        self.last_section = last_section
        self.per_section = per_section
        self.num_items = num_items
        self.num_full_tiles = num_full_tiles
        self.tail_splits = tail_splits


@aggregate
class _Partials:
    """Where the split tail's work items leave their results for ``tail_combine``, and the word
    that sends flagged rows to the frozen row max's recompute (:func:`_flag_overflow`)."""

    o_ptr: gl.tensor          # fp32 [items, BLOCK_M, D]: O normalized over the item's keys
    lse_ptr: gl.tensor        # fp32 [items, BLOCK_M]: natural-log LSE over the item's keys
    coords_ptr: gl.tensor     # int32 [tail tiles, 3]: (batch, q_head, m_block) of each tail tile
    guard_ptr: gl.tensor      # int32 word: set by an item with a row FREEZE_ROW_MAX left non-finite

    @gluon.constexpr_function
    def __init__(self, o_ptr, lse_ptr, coords_ptr, guard_ptr):
        self.o_ptr = o_ptr
        self.lse_ptr = lse_ptr
        self.coords_ptr = coords_ptr
        self.guard_ptr = guard_ptr


@aggregate
class _Schedule:
    """The kernel's compile-time arguments, handed to every partition as one value."""

    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    HEAD_DIM: gl.constexpr       # Q's and K's columns: QK's reduction (its first box with HEAD_DIM_TAIL)
    HEAD_DIM_TAIL: gl.constexpr  # split_head_dim: Q's and K's columns in a second box after HEAD_DIM; 0: none
    HEAD_DIM_V: gl.constexpr     # V's and O's columns: PV's N, O's accumulator (config.kernel_head_dims)
    NUM_KV_STAGES: gl.constexpr
    NUM_Q_STAGES: gl.constexpr   # Q buffers per consumer warpgroup: q_bufs[stage · NUM_CONSUMERS + wg]
    NUM_CONSUMERS: gl.constexpr
    IS_CAUSAL: gl.constexpr
    LPT: gl.constexpr
    OVERLAP: gl.constexpr
    PINGPONG: gl.constexpr
    SCALE_POSITIVE: gl.constexpr
    LATE_RESCALE: gl.constexpr
    PACK_P: gl.constexpr
    RESCALE_THRESHOLD: gl.constexpr
    Q_IN_REGISTERS: gl.constexpr
    WAIT_PV_EARLY: gl.constexpr
    EXP2_FMA_EVERY: gl.constexpr
    TREE_REDUCE: gl.constexpr
    SEPARATE_O: gl.constexpr
    O_FROM_REGISTERS: gl.constexpr
    DEFER_ROW_SUM: gl.constexpr
    NAMED_TURNS: gl.constexpr
    EXP_TURNS: gl.constexpr      # a second token ring around the overlapped step's exponentials
    SPLIT_TAIL: gl.constexpr
    EXTRA_KEYS: gl.constexpr     # keys of each K/V tile in a second box after the first BLOCK_N
    KV_TILE: gl.constexpr        # keys per K/V tile: BLOCK_N + EXTRA_KEYS
    NUM_PARTS: gl.constexpr      # wgmma groups per product and K/V tile: 1, or 2 with EXTRA_KEYS
    BALANCED: gl.constexpr       # each CTA walks its own list of tiles (schedule.balanced_schedule)
    DYNAMIC: gl.constexpr        # each CTA's producer draws its next tile from a counter and hands it on
    HANDOUT_TABLE: gl.constexpr  # the draws read a table of the tiles with a row (schedule.packed_handout_table)
    DRAW_AHEAD: gl.constexpr     # with DYNAMIC: the next item is drawn this many K/V tiles before an item's last load
    ITEM_BARRIER: gl.constexpr   # with DYNAMIC: a drawn item reaches the consumers on its own barrier, not beside Q
    STAGGER_KV: gl.constexpr     # each item starts its unmasked K/V sweep at its own tile (schedule.kv_stagger)
    STAGGER_SUBTRACT: gl.constexpr  # the sweep wraps by compare and subtract, not a run-time modulo
    STAGGER_FROM_ZERO: gl.constexpr  # only items whose first K/V tile is the first key's stagger
    LAG_V_LOADS: gl.constexpr    # the producer issues V(j) after K(j+1), in the consumers' order of need
    LATE_K_RELEASE: gl.constexpr  # a consumer releases K(j) with V(j-1), after PV(j-1)'s wait
    ROW_BOUND_MASK: gl.constexpr  # masked tiles compare each score's key offset with one bound per row
    SKIP_EMPTY_ROWS: gl.constexpr  # a consumer whose rows all lie past seqlen_q only keeps the protocol
    MEET_BEFORE_PASS: gl.constexpr  # such a consumer's warps meet between a turn's wait and its pass
    OVERLAP_EPILOGUE: gl.constexpr  # a tile's epilogue runs under the next tile's first QK
    FIRST_MASK_ON_NEED: gl.constexpr  # an item's first K/V tile is masked only if it is masked in the loop
    WINDOW_FIRST_MASK_ON_NEED: gl.constexpr  # HAS_WINDOW: the first tile masked only where the window or the diagonal cuts it
    WINDOW_DIAGONAL_ONE_BOUND: gl.constexpr  # HAS_WINDOW: the diagonal's run masked by the upper bound alone
    FAST_DIVIDE_PRODUCER: gl.constexpr  # the producer decodes work items by multiply-high (schedule.fast_divisor)
    FAST_DIVIDE_CONSUMERS: gl.constexpr  # so do the consumers
    THREAD_RELEASE: gl.constexpr  # every consumer thread arrives on a K/V slot's empty barrier (no bar.sync)
    SKIP_UNSEEN_HALF: gl.constexpr  # a masked tile's second half of keys, unseen by all 64 rows, is skipped
    MASK_SECOND_HALF: gl.constexpr  # a masked tile whose first half all 64 rows see masks its second half only
    SINGLE_KV_LOOP: gl.constexpr  # unmasked and masked K/V steps share one loop, the mask behind a branch
    RESCALE_BY_WARP: gl.constexpr  # with RESCALE_THRESHOLD: each warp skips O's rescale by its own vote
    CONVERT_BEFORE_RESCALE: gl.constexpr  # P's conversions before O's rescale in the overlapped step
    RESCALE_BEFORE_EXP: gl.constexpr  # FA4's order: O's rescale right after PV(j-1)'s wait, before the exponentials
    PRODUCER_WAIT_HINT_NS: gl.constexpr  # > 0: the inline producer's try_wait sleeps up to this long (NANOSLEEP.SYNCS)
    CARRY_RING_SLOT: gl.constexpr  # the K/V loop carries its ring slot and phase (pipeline.next_ring_slot)
    ROW_SUM_BY_MMA: gl.constexpr  # the running sum is P times a tile of ones on the tensor pipe, beside PV
    P_IN_SMEM: gl.constexpr      # PV reads P from the consumer's shared buffer (p_bufs), not registers
    FREEZE_ROW_MAX: gl.constexpr  # unmasked steps keep the item's first row max: no max, no O rescale (guarded)
    ROW_MAX_MARGIN: gl.constexpr  # log2 units every online row max is raised by (FREEZE_ROW_MAX in fp16); else 0
    STAGED_SCORES: gl.constexpr  # the first box's row max between the waits of QK's two boxes
    PV_GROUPS: gl.constexpr      # wgmma groups a PV issues: NUM_PARTS, one more with ROW_SUM_BY_MMA
    TRACE_STEPS: gl.constexpr    # K/V steps of each CTA's first item stamped with the SM clock (trace.py); 0: none
    TRACE_WARPS: gl.constexpr    # with TRACE_STEPS: every warp of a warpgroup stamps its own events
    TRACE_ITEM: gl.constexpr     # with TRACE_STEPS: which of each CTA's items is stamped (0: the first)
    TRACE_TILES: gl.constexpr    # work items of each CTA recorded whole, start and end stamps (trace.py); 0: none
    K_EMPTY_AT: gl.constexpr     # asm_arrivals: byte offsets of the K/V empty and turn barrier arrays in
    V_EMPTY_AT: gl.constexpr     # shared memory (barrier_offsets), the consumers' arrivals inline PTX
    TURN_AT: gl.constexpr        # with no bar.sync (pipeline.arrive_unsynced); -1: Gluon's arrivals
    K_READY_AT: gl.constexpr     # asm_waits: the same for the K/V ready and turn arrays, the consumers'
    V_READY_AT: gl.constexpr     # waits inline PTX (pipeline.wait_unsynced); -1: Gluon's waits
    TURN_WAIT_AT: gl.constexpr
    HOIST_SMEM_BASE: gl.constexpr  # the inline arrivals and waits take the shared window's base from one pure read
    GATE_PV_WAIT: gl.constexpr   # FA4's order: PV's wait in a block of its own after the row max
    EARLY_EXP_QUARTERS: gl.constexpr  # FA4's order: quarters of the tile's keys exponentiated ahead of PV's wait
    MULTICAST: gl.constexpr      # kv_multicast: a cluster of two CTAs shares each K/V tile (multicast.py)
    CROSS_HEAD_PAIRS: gl.constexpr  # cross_head_pairs: a cluster takes two consecutive tiles of the launch
    PRODUCER_WARPS: gl.constexpr
    ELEM_BYTES: gl.constexpr
    K_RING_AT: gl.constexpr      # kv_multicast: byte offsets of the K/V rings and their ready barriers,
    V_RING_AT: gl.constexpr      # which the producer's inline copies address (multicast.load_half)
    K_ARM_AT: gl.constexpr
    V_ARM_AT: gl.constexpr
    UNSYNCED_PRODUCER: gl.constexpr  # producer_unsynced: the producer's waits and Q copies in inline PTX
    Q_BUFS_AT: gl.constexpr      # producer_unsynced: byte offsets of the Q buffers and their ready
    Q_ARM_AT: gl.constexpr       # barriers, which its inline Q copies address (multicast.load_q), and
    Q_EMPTY_AT: gl.constexpr     # of the Q empty barriers, which it waits on in inline PTX
    RELAY_RELEASE: gl.constexpr  # relay_release: the pair's K/V releases relayed by the producers
    PEER_RELEASE: gl.constexpr   # each consumer release lands on the peer's empty barrier too (MULTICAST, unrelayed)
    K_RELAY_AT: gl.constexpr     # relay_release: byte offsets of the K/V relay barriers, which the
    V_RELAY_AT: gl.constexpr     # producers arrive on in each other's CTA and wait on in their own
    HAS_SOFTCAP: gl.constexpr    # flash-attn's softcap on the raw scores (softmax.capped)
    HAS_WINDOW: gl.constexpr     # a sliding window's left side (sz.window_left; the right is the causal mask or none)
    PACKED: gl.constexpr         # packed sequences (flash-attn's varlen): each item's lengths from cu_seqlens
    HAS_WINDOW_RIGHT: gl.constexpr   # a window's right side moves the causal diagonal (sz.window_right)

    @gluon.constexpr_function
    def __init__(self, **values):
        # by keyword, one per field; the aggregate rejects a name it lacks and a field left unset
        for name, value in values.items():
            setattr(self, name, gl.constexpr(value))


@gluon.jit
def _tile_trace_ptr(sz, parts, c):
    """Where ``trace_tiles`` records go: the split tail's coordinate pointer, which a launch with no
    split item never dereferences, or — when the launch splits its tail and needs that pointer —
    the balanced grid's table pointer, which a split-tail launch never reads (the two exclude each
    other: ``HopperFwdConfig.check``)."""
    if c.SPLIT_TAIL:
        ptr = sz.sched_ptr
    else:
        ptr = parts.coords_ptr
    return ptr


@gluon.jit
def _work_coords(item, sz, c, FAST_DIV: gl.constexpr):
    """(tile_id, split, batch, q_head, m_block) of work item ``item`` (schedule.work_item and
    tile_coords), its divisions by multiply-high with ``FAST_DIV``."""
    tile_id, split = work_item(item, sz.num_full_tiles, sz.tail_splits, c.SPLIT_TAIL, FAST_DIV)
    if c.CROSS_HEAD_PAIRS:
        # the pair is tiles 2·tile_id and 2·tile_id + 1 of the launch's plain order, each CTA its
        # own; past the launch's last tile (an odd total) lies a tile past the last head's rows
        own = tile_id * _CLUSTER_CTAS + cta_rank()
        decoded = gl.minimum(own, _tiles_in_launch(sz) - 1)
    else:
        decoded = tile_id
    if FAST_DIV:
        b, h, m_block = fast_tile_coords(decoded, sz.num_m_blocks, sz.batch_heads, sz.heads_q, sz.head_section,
                                         sz.last_section, sz.per_section, c.LPT)
    else:
        b, h, m_block = tile_coords(decoded, sz.num_m_blocks.d, sz.batch_heads, sz.heads_q.d, sz.head_section.d,
                                    c.LPT)
    if c.CROSS_HEAD_PAIRS:
        m_block += own - decoded
    elif c.MULTICAST:
        # the schedule hands out pairs of q-tiles; each CTA of the cluster takes its own
        m_block = m_block * _CLUSTER_CTAS + cta_rank()
    return tile_id, split, b, h, m_block


@gluon.jit
def _tiles_in_launch(sz):
    """Every (batch, head, m-block) tile of the launch."""
    return sz.batch_heads * sz.num_m_blocks.d


@gluon.jit
def _sequence(sz, b, c):
    """``(sizes, tma_b, q0, k0)`` of batch entry ``b``'s work items. With ``PACKED`` (flash-attn's
    varlen) ``sizes`` holds sequence ``b``'s own lengths, read from ``cu_seqlens`` (every K/V range,
    mask and store bound of its items reads them there), ``tma_b`` is 0 (the packed tensors are one
    batch entry) and ``q0``/``k0`` are its first query and key rows in them. Otherwise ``sz`` itself,
    ``b``, 0 and 0: the unpacked build's code is unchanged.

    Called again wherever an item's sizes are needed (producer, consumer, epilogue) rather than
    carried, so that an epilogue run under the next item (``overlap_epilogue``) reads its own
    sequence's: the loads hit L1."""
    if c.PACKED:
        q0 = gl.load(sz.cu_seqlens_q + b)
        k0 = gl.load(sz.cu_seqlens_k + b)
        seq = _Sizes(gl.load(sz.cu_seqlens_q + b + 1) - q0, gl.load(sz.cu_seqlens_k + b + 1) - k0, sz.heads_q,
                     sz.group, sz.num_m_blocks, sz.batch_heads, sz.head_section, sz.last_section, sz.per_section,
                     sz.num_items, sz.num_full_tiles, sz.tail_splits, sz.sched_ptr, sz.handout_ptr, sz.kv_tmaps_ptr,
                     sz.softcap_pre, sz.softcap_post, sz.window_left, sz.window_right, sz.rows_q, sz.cu_seqlens_q,
                     sz.cu_seqlens_k, sz.out_ptr)
        tma_b = 0
    else:
        seq = sz
        tma_b = b
        q0 = 0
        k0 = 0
    return seq, tma_b, q0, k0


@gluon.jit
def _diag_shift(sz, c):
    """How many keys right of the bottom-right diagonal a row sees: a window's right side
    (``window_size[1]``, the launch causal: the band a right side bounds is the causal schedule's
    with the diagonal moved; ``HAS_WINDOW_RIGHT``), 0 for the causal mask's own and without one. A
    constant where it is 0: the run-time shift kept one more value live per row, and the windowed
    d64 causal build's third consumer spilled in its left loop too (census)."""
    if c.HAS_WINDOW_RIGHT:
        shift = sz.window_right
    else:
        shift = 0
    return shift


@gluon.jit
def _kv_tiles(row0, seq, c):
    """:func:`schedule.kv_tile_range` of the item whose first row is ``row0``, with ``seq`` its
    sequence's sizes (:func:`_sequence`). With ``PACKED`` an item past its sequence's rows (the grid
    covers the longest) has no K/V tile: producer and consumers both skip its K/V, its Q still flows
    (the ring's phases stay in step) and its epilogue stores no row."""
    n_kv, n_unmasked = kv_tile_range(row0, seq.seqlen_q, seq.seqlen_k, c.BLOCK_M, c.KV_TILE, c.IS_CAUSAL,
                                     _diag_shift(seq, c))
    if c.PACKED:
        n_kv = gl.where(row0 < seq.seqlen_q, n_kv, 0)
        n_unmasked = gl.minimum(n_unmasked, n_kv)
    return n_kv, n_unmasked


@gluon.jit
def _solo_pair(tile_id, m_block, sz, c):
    """With ``CROSS_HEAD_PAIRS``: whether pair ``tile_id``'s two tiles belong to different heads — a
    head's last tile and the next head's first — so each CTA loads its own K/V (``m_block``: this
    CTA's). Both CTAs answer alike: rank 0's tile is the last of its head exactly when rank 1's is
    the first of the next (a tile past the launch's end is neither). False without the switch."""
    if c.CROSS_HEAD_PAIRS:
        own = tile_id * _CLUSTER_CTAS + cta_rank()
        last_of_head = (m_block == sz.num_m_blocks.d - 1) & (own + 1 < _tiles_in_launch(sz))
        solo = gl.where(cta_rank() == 0, last_of_head, m_block == 0)
    else:
        solo = False
    return solo


# --------------------------------------------------------------------------- producer


@gluon.jit
def _load_q(q_desc, q2_desc, sh, sz, b, h, row0, q_stage, q_phase, item, c):
    """The tile's Q, one box per consumer, into Q stage ``q_stage`` (``ring_slot`` of the tile's count);
    with the dynamic hand-out, work item ``item`` beside it (:func:`_hand_item`)."""
    for wg in gl.static_range(c.NUM_CONSUMERS):
        slot = q_stage * c.NUM_CONSUMERS + wg
        _producer_wait(sh.q_empty_bars, slot, q_phase ^ 1, c.Q_EMPTY_AT, c)
        if c.DYNAMIC and not c.ITEM_BARRIER:
            _hand_item(sh, slot, item)
        if c.UNSYNCED_PRODUCER:
            # Gluon's expect and copy fence the producer's four warps with a bar.sync on each
            # side; the inline copy is thread 0's alone and needs none
            load_q(_tensor_map(sz, _Q_MAP), slot, row0 + wg * _ROWS, h, b, c.Q_BUFS_AT, c.Q_ARM_AT, _ROWS,
                   c.HEAD_DIM, c.ELEM_BYTES, c.PRODUCER_WARPS)
        elif c.HEAD_DIM_TAIL > 0:
            # split_head_dim: the first HEAD_DIM columns and the tail box after them, one barrier
            mbarrier.expect(sh.q_ready_bars.index(slot), q_desc.block_type.nbytes + q2_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [b, row0 + wg * _ROWS, h, 0], sh.q_ready_bars.index(slot),
                                            sh.q_bufs.index(slot))
            tma.async_copy_global_to_shared(q2_desc, [b, row0 + wg * _ROWS, h, c.HEAD_DIM], sh.q_ready_bars.index(slot),
                                            sh.q2_bufs.index(slot))
        else:
            mbarrier.expect(sh.q_ready_bars.index(slot), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [b, row0 + wg * _ROWS, h, 0], sh.q_ready_bars.index(slot),
                                            sh.q_bufs.index(slot))


@gluon.jit
def _tensor_map(sz, WHICH: gl.constexpr):
    """The global address of tensor map ``WHICH`` in ``kv_tmaps_ptr``: K's (0), V's (1), Q's (``_Q_MAP``)."""
    return sz.kv_tmaps_ptr.to(gl.int64) + WHICH * _TENSOR_MAP_BYTES


@gluon.jit
def _producer_wait(bars, idx, phase, SMEM_OFFSET: gl.constexpr, c):
    """The producer waits for barrier ``idx`` of ``bars`` (at ``SMEM_OFFSET`` in shared memory) to
    complete ``phase``: Gluon's wait, or with ``UNSYNCED_PRODUCER`` the inline one — Gluon fences a
    four-warp partition's wait with a ``bar.sync`` (a wait on the same array before it is a pending
    access), where each thread only needs its own wait."""
    if c.UNSYNCED_PRODUCER:
        wait_unsynced(idx, phase, SMEM_OFFSET, SUSPEND_NS=c.PRODUCER_WAIT_HINT_NS)
    else:
        mbarrier.wait(bars.index(idx), phase)


@gluon.jit
def _load_kv_tile(desc, desc2, bufs, bufs2, ready_bars, empty_bars, relay_bars, b, kv_head, j, k0, count, solo, c, sz,
                  KV: gl.constexpr):
    """K/V tile ``j`` into ring slot ``count % stages``: one box, or two (BLOCK_N then EXTRA_KEYS keys)
    completing the same barrier; with ``MULTICAST``, this CTA's half of it into both CTAs of the
    cluster, or in a ``solo`` pair (:func:`_solo_pair`) both halves into this CTA (``KV``: 0 for K,
    1 for V, the tensor map and ring it names)."""
    idx, phase = ring_slot(count, c.NUM_KV_STAGES)
    # with MULTICAST the slot's empty barrier counts both CTAs' consumers: free in both; relayed,
    # it counts this CTA's, and the relay barrier the peer's
    _producer_wait(empty_bars, idx, phase ^ 1, c.K_EMPTY_AT if KV == 0 else c.V_EMPTY_AT, c)
    if c.RELAY_RELEASE:
        _relay(relay_bars, idx, phase, c, KV)
    # k0: the sequence's first key row in a packed K/V (0 unpacked)
    key0 = k0 + j * c.KV_TILE
    if c.MULTICAST:
        tmap = _tensor_map(sz, KV)
        RING_AT: gl.constexpr = c.K_RING_AT if KV == 0 else c.V_RING_AT
        ARM_AT: gl.constexpr = c.K_ARM_AT if KV == 0 else c.V_ARM_AT
        COLS: gl.constexpr = c.HEAD_DIM if KV == 0 else c.HEAD_DIM_V
        # ``solo`` is a constant False without CROSS_HEAD_PAIRS, and the branch vanishes. With it, a
        # branch uniform across the item, which ptxas unswitches the producer's loop on; a
        # predicated second copy would issue in every pair (census: d64's loop 54 -> 90
        # instructions, against 58 in a pair within a head this way)
        if solo:
            load_half(tmap, idx, key0, kv_head, b, RING_AT, ARM_AT, c.BLOCK_N, COLS, c.ELEM_BYTES,
                      c.PRODUCER_WARPS, True)
        else:
            load_half(tmap, idx, key0, kv_head, b, RING_AT, ARM_AT, c.BLOCK_N, COLS, c.ELEM_BYTES,
                      c.PRODUCER_WARPS)
    elif c.HEAD_DIM_TAIL > 0 and KV == 0:
        # split_head_dim: K's first HEAD_DIM columns and its tail box (in the second-box ring)
        mbarrier.expect(ready_bars.index(idx), desc.block_type.nbytes + desc2.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [b, key0, kv_head, 0], ready_bars.index(idx), bufs.index(idx))
        tma.async_copy_global_to_shared(desc2, [b, key0, kv_head, c.HEAD_DIM], ready_bars.index(idx), bufs2.index(idx))
    elif c.EXTRA_KEYS > 0:
        mbarrier.expect(ready_bars.index(idx), desc.block_type.nbytes + desc2.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [b, key0, kv_head, 0], ready_bars.index(idx), bufs.index(idx))
        tma.async_copy_global_to_shared(desc2, [b, key0 + c.BLOCK_N, kv_head, 0], ready_bars.index(idx),
                                        bufs2.index(idx))
    else:
        mbarrier.expect(ready_bars.index(idx), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [b, key0, kv_head, 0], ready_bars.index(idx), bufs.index(idx))


@gluon.jit
def _relay(relay_bars, idx, phase, c, KV: gl.constexpr):
    """The pair's release of K/V slot ``idx``, relayed (``relay_release``): this CTA's consumers have
    released it (the caller waited), so tell the peer's producer, then wait until the peer's have.
    Every fill relays, the first ones of each slot too, so fill ``n`` of a slot is the relay
    barrier's arrival ``n`` and its wait is for ``phase`` itself (not the empty barrier's ``phase ^
    1``, whose first wait passes on a fresh barrier). The peer cannot relay a slot's next fill before
    this one's wait: its consumers would first have to read this fill, which needs this CTA's half,
    copied after the wait."""
    RELAY_AT: gl.constexpr = c.K_RELAY_AT if KV == 0 else c.V_RELAY_AT
    relay_to_peer(idx, RELAY_AT)
    _producer_wait(relay_bars, idx, phase, RELAY_AT, c)


@gluon.jit
def _hand_item(sh, slot, item):
    """Work item ``item`` (-1: none left) into Q slot ``slot``'s word for its consumer, written before
    the slot's ready barrier is armed. Every lane of the producer's warp writes the same word, and
    the arrival that completes the phase (release, after the warp's ``bar.warp.sync``) orders it
    before the consumer's wait (acquire); the producer writes the word again only after the
    consumer has released the slot's Q buffer, after it read the word."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [_PRODUCER_WARPS], [0])
    sh.item_bufs.index(slot).store(gl.full([1], item, gl.int32, layout))


@gluon.jit
def _produce_item(q_desc, k_desc, v_desc, k2_desc, v2_desc, q2_desc, sh, sz, item, count, tile_iter, draw, c):
    """Every load of work item ``item``: its first K, its Q, the rest of its K/V tiles. Returns the
    ring count after it and, with the dynamic hand-out drawn ahead, the CTA's next item, drawn
    (``draw``: the hand-out's ``(pos, stop, pool)``) ``DRAW_AHEAD`` K/V tiles before this item's last
    load (:func:`_draw_next`); otherwise ``item``."""
    tile_id, split, b, h, m_block = _work_coords(item, sz, c, c.FAST_DIVIDE_PRODUCER)
    seq, tma_b, q0, k0 = _sequence(sz, b, c)
    kv_head = divide(h, sz.group, c.FAST_DIVIDE_PRODUCER)
    solo = _solo_pair(tile_id, m_block, sz, c)
    row0 = m_block * c.BLOCK_M
    n_kv, n_unmasked = _kv_tiles(row0, seq, c)
    kv_lo, kv_hi = kv_split_range(n_kv, split, sz.tail_splits, c.SPLIT_TAIL, c.FAST_DIVIDE_PRODUCER)
    kv_lo, left_unmasked = _window_range(row0, kv_lo, kv_hi, seq, c)
    rot_lo = _rotation_base(kv_lo, left_unmasked, c)
    n_rot, kv_start = kv_stagger(m_block, rot_lo, kv_hi, n_unmasked, c.STAGGER_KV, kv_first=kv_lo,
                                 FROM_ZERO=c.STAGGER_FROM_ZERO)
    # ring position of K/V tile j of this item: base + j
    base = count - kv_lo
    nxt = item
    q_stage, q_phase = ring_slot(tile_iter, c.NUM_Q_STAGES)
    if kv_hi > kv_lo:
        # the first K first: it streams while the previous tile still holds the Q buffers.
        first = kv_visit(kv_lo, rot_lo, n_rot, kv_start, c.STAGGER_KV, c.STAGGER_SUBTRACT, c.HAS_WINDOW)
        _load_kv_tile(k_desc, k2_desc, sh.k_bufs, sh.k2_bufs, sh.k_ready_bars, sh.k_empty_bars, sh.k_relay_bars, tma_b,
                      kv_head, first, k0, count, solo, c, sz, 0)
        _load_q(q_desc, q2_desc, sh, sz, tma_b, h, q0 + row0, q_stage, q_phase, item, c)
        # the K/V tile after whose loads the next item is drawn (the last one's with DRAW_AHEAD = 0)
        draw_at = gl.maximum(kv_hi - 1 - c.DRAW_AHEAD, kv_lo)
        if c.LAG_V_LOADS:
            # V(j-1) after K(j): the overlapped consumer waits for both before QK(j), so a V
            # slot is filled when its tile is next needed, not as soon as it frees
            prev = first
            for j in range(kv_lo + 1, kv_hi):
                t = kv_visit(j, rot_lo, n_rot, kv_start, c.STAGGER_KV, c.STAGGER_SUBTRACT, c.HAS_WINDOW)
                _load_kv_tile(k_desc, k2_desc, sh.k_bufs, sh.k2_bufs, sh.k_ready_bars, sh.k_empty_bars,
                              sh.k_relay_bars, tma_b, kv_head, t, k0, base + j, solo, c, sz, 0)
                _load_kv_tile(v_desc, v2_desc, sh.v_bufs, sh.v2_bufs, sh.v_ready_bars, sh.v_empty_bars,
                              sh.v_relay_bars, tma_b, kv_head, prev, k0, base + j - 1, solo, c, sz, 1)
                nxt = _draw_next(sh, sz, draw, nxt, tile_iter, j - 1 == draw_at, c)
                prev = t
            _load_kv_tile(v_desc, v2_desc, sh.v_bufs, sh.v2_bufs, sh.v_ready_bars, sh.v_empty_bars, sh.v_relay_bars,
                          tma_b, kv_head, prev, k0, base + kv_hi - 1, solo, c, sz, 1)
            nxt = _draw_next(sh, sz, draw, nxt, tile_iter, kv_hi - 1 == draw_at, c)
        else:
            _load_kv_tile(v_desc, v2_desc, sh.v_bufs, sh.v2_bufs, sh.v_ready_bars, sh.v_empty_bars, sh.v_relay_bars,
                          tma_b, kv_head, first, k0, count, solo, c, sz, 1)
            nxt = _draw_next(sh, sz, draw, nxt, tile_iter, kv_lo == draw_at, c)
            for j in range(kv_lo + 1, kv_hi):
                t = kv_visit(j, rot_lo, n_rot, kv_start, c.STAGGER_KV, c.STAGGER_SUBTRACT, c.HAS_WINDOW)
                _load_kv_tile(k_desc, k2_desc, sh.k_bufs, sh.k2_bufs, sh.k_ready_bars, sh.k_empty_bars,
                              sh.k_relay_bars, tma_b, kv_head, t, k0, base + j, solo, c, sz, 0)
                _load_kv_tile(v_desc, v2_desc, sh.v_bufs, sh.v2_bufs, sh.v_ready_bars, sh.v_empty_bars,
                              sh.v_relay_bars, tma_b, kv_head, t, k0, base + j, solo, c, sz, 1)
                nxt = _draw_next(sh, sz, draw, nxt, tile_iter, j == draw_at, c)
    else:
        # every row of this tile sees no key (causal, Sq > Sk): Q still flows so the
        # consumers' barrier phases stay in step; they write out = 0, lse = -inf
        _load_q(q_desc, q2_desc, sh, sz, tma_b, h, q0 + row0, q_stage, q_phase, item, c)
        nxt = _draw_next(sh, sz, draw, nxt, tile_iter, True, c)
    count += kv_hi - kv_lo
    return count, nxt


@gluon.jit
def _draw_next(sh, sz, draw, nxt, tile_iter, now, c):
    """The CTA's next item (``schedule.handout_item`` at ``draw``'s position) if ``now``, else
    ``nxt``; nothing without the dynamic hand-out drawn ahead (``DRAW_AHEAD > 0``: with 0 the
    producer's loop draws once the item's loads are all issued, :func:`_producer_partition`). The
    producer waits for a draw's atomic (its result comes back through the warp's scratch): drawn
    after a K/V tile's loads, that wait runs where the producer would wait for the ring's next empty
    slot anyway. With ``ITEM_BARRIER`` the item goes to the consumers at once (:func:`_post_item`,
    as the CTA's item ``tile_iter + 1``)."""
    if c.DYNAMIC and c.DRAW_AHEAD > 0:
        if now:
            nxt = _draw(sh, sz, draw, tile_iter + 1, c)
    return nxt


@gluon.jit
def _draw(sh, sz, draw, tile_iter, c):
    """The CTA's item ``tile_iter``: ``schedule.handout_item`` at ``draw``'s ``(pos, stop, pool)``,
    posted to the consumers at once with ``ITEM_BARRIER`` (:func:`_post_item`)."""
    pos, stop, pool = draw
    item = handout_item(sz.sched_ptr, sz.handout_ptr, pos, stop, pool, c.BALANCED, c.HANDOUT_TABLE)
    if c.ITEM_BARRIER:
        _post_item(sh, sz, tile_iter, item, c)
    return item


@gluon.constexpr_function
def _item_slots(num_q_stages, item_barrier):
    """Item words a consumer has (one per Q stage beside its Q, one more on their own barriers).

    With ``ITEM_BARRIER`` the word of the CTA's item t is written once item t is drawn, which is
    after item t-1's Q was loaded, which waited for the consumer to release the Q of item
    t-1-Q_STAGES, which it did after reading that item's word: so item t may take the slot of item
    t-1-Q_STAGES, one of Q_STAGES + 1."""
    return num_q_stages + 1 if item_barrier else num_q_stages


@gluon.jit
def _post_item(sh, sz, tile_iter, item, c):
    """The CTA's item ``tile_iter`` (a position past the work: -1, none left) into each consumer's
    word of its item slot, and that slot's ready barrier arrived on (``ITEM_BARRIER``): a consumer
    reads the item it runs next as soon as it finishes its current one, before the next Q lands.
    The arrival (release, after the warp's ``bar.warp.sync``) orders the word before the consumer's
    wait (acquire), as :func:`_hand_item`'s does."""
    slot, _ = ring_slot(tile_iter, _item_slots(c.NUM_Q_STAGES, c.ITEM_BARRIER))
    handed = gl.where(item < sz.num_items, item, -1)
    for wg in gl.static_range(c.NUM_CONSUMERS):
        _hand_item(sh, slot * c.NUM_CONSUMERS + wg, handed)
        mbarrier.arrive(sh.item_ready_bars.index(slot * c.NUM_CONSUMERS + wg))


@gluon.jit
def _end_handout(sh, tile_iter, c):
    """No work left: each consumer's next Q slot gets item -1 and a plain arrival (no bytes), which
    completes the phase its consumer waits on. (With ``ITEM_BARRIER`` the draw that found none
    posted -1 already: :func:`_post_item`.)"""
    if not c.ITEM_BARRIER:
        q_stage, q_phase = ring_slot(tile_iter, c.NUM_Q_STAGES)
        for wg in gl.static_range(c.NUM_CONSUMERS):
            slot = q_stage * c.NUM_CONSUMERS + wg
            mbarrier.wait(sh.q_empty_bars.index(slot), q_phase ^ 1)
            _hand_item(sh, slot, -1)
            mbarrier.arrive(sh.q_ready_bars.index(slot))


@gluon.jit
def _producer_partition(q_desc, k_desc, v_desc, k2_desc, v2_desc, q2_desc, sh, sz, c):
    count = 0      # K/V ring items loaded so far, across persistent tiles
    tile_iter = 0
    if c.MULTICAST:
        join_cluster(c.PRODUCER_WARPS)
    if c.DYNAMIC:
        # this CTA's listed items (its program id alone without the lists), then draws from the pool
        start, stop, pool = handout_range(sz.sched_ptr, c.BALANCED)
        pos = start
        item = _draw(sh, sz, (pos, stop, pool), tile_iter, c)
        while item < sz.num_items:
            # The next item is drawn DRAW_AHEAD K/V tiles before this one's last load (by default
            # once it is issued): the CTA commits to its next tile about a ring's depth of steps
            # before it needs it. Drawn at the item's start (after its Q; H200, 9ec0e08), each CTA
            # held a whole tile in reserve, the last tiles went to CTAs still busy with heavy ones,
            # and the launch ended unevenly (d128 causal B4 H16 S8192: 1.83% of the CTAs' time
            # idle at the end, 0.55% on the lists; modeled with the lists' estimate,
            # model.schedule.reserve_schedule: 2.02% with a tile in reserve, 0.05% drawn two steps
            # ahead).
            count, item = _produce_item(q_desc, k_desc, v_desc, k2_desc, v2_desc, q2_desc, sh, sz, item, count,
                                        tile_iter, (pos + 1, stop, pool), c)
            tile_iter += 1
            pos += 1
            if c.DRAW_AHEAD == 0:
                # the atomic's result comes back through the warp's scratch: the producer waits here
                item = _draw(sh, sz, (pos, stop, pool), tile_iter, c)
        _end_handout(sh, tile_iter, c)
        handout_finish(sz.handout_ptr)
    else:
        start, stop, step = work_range(sz.sched_ptr, sz.num_items, c.BALANCED, c.MULTICAST)
        for pos in range(start, stop, step):
            item = work_at(sz.sched_ptr, pos, c.BALANCED)
            count, _ = _produce_item(q_desc, k_desc, v_desc, k2_desc, v2_desc, q2_desc, sh, sz, item, count,
                                     tile_iter, (), c)
            tile_iter += 1
        if c.MULTICAST:
            _drain_ring(sh, count, c)


@gluon.jit
def _drain_ring(sh, count, c):
    """Wait until every K/V slot has been released by the consumers of both CTAs of the cluster:
    the peer's last remote arrivals land here, and its copies into this CTA have all landed
    (this CTA's consumers waited for each), so nothing reaches this CTA's shared memory after it
    exits. A slot never filled passes at once (a fresh barrier's parity)."""
    for i in gl.static_range(c.NUM_KV_STAGES):
        idx, phase = ring_slot(count + i, c.NUM_KV_STAGES)
        _producer_wait(sh.k_empty_bars, idx, phase ^ 1, c.K_EMPTY_AT, c)
        _producer_wait(sh.v_empty_bars, idx, phase ^ 1, c.V_EMPTY_AT, c)


# --------------------------------------------------------------------------- consumers


@gluon.constexpr_function
def _acc_layout(cols):
    """The wgmma accumulator of one consumer warpgroup, 64 rows × ``cols`` (S: BLOCK_N, O: HEAD_DIM_V)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, cols, 16])


@gluon.constexpr_function
def _a_operand_layout(cols):
    """A register operand of a wgmma whose accumulator is 64 × ``cols``: P for PV (cols = HEAD_DIM_V,
    the conversion from S's accumulator is free in SASS) and, with ``Q_IN_REGISTERS``, Q for QK
    (cols = BLOCK_N)."""
    return gl.DotOperandLayout(operand_index=0, parent=_acc_layout(cols), k_width=2)


# A K/V tile's scores and probabilities are tuples of parts: (S,) for one box of BLOCK_N keys, or
# (S, S2) with a second box of EXTRA_KEYS keys, each part its own wgmma group and accumulator.


@gluon.jit
def _qk_part(q, bufs, idx, N: gl.constexpr, HEAD_DIM: gl.constexpr):
    k = bufs.index(idx).reshape([N, HEAD_DIM])
    s0 = gl.zeros([_ROWS, N], gl.float32, _acc_layout(N))
    return warpgroup_mma(q, k.permute((1, 0)), s0, use_acc=False, is_async=True)


@gluon.jit
def _qk(q, sh, idx, c):
    """Issue S = Q Kᵀ for ring slot ``idx`` (async; K in shared memory, Q in shared memory or, with
    ``Q_IN_REGISTERS``, already in registers): a tuple of one group per part."""
    if c.HEAD_DIM_TAIL > 0:
        # split_head_dim: ``q`` is (first box, tail box); the tail's product accumulates onto the
        # first's, two wgmma groups that complete in order before any PV issued after them
        s = _qk_part(q[0], sh.k_bufs, idx, c.BLOCK_N, c.HEAD_DIM)
        k_tail = sh.k2_bufs.index(idx).reshape([c.BLOCK_N, c.HEAD_DIM_TAIL])
        parts = (warpgroup_mma(q[1], k_tail.permute((1, 0)), s, is_async=True),)
    else:
        s = _qk_part(q, sh.k_bufs, idx, c.BLOCK_N, c.HEAD_DIM)
        if c.EXTRA_KEYS > 0:
            parts = (s, _qk_part(q, sh.k2_bufs, idx, c.EXTRA_KEYS, c.HEAD_DIM))
        else:
            parts = (s,)
    return parts


@gluon.jit
def _pv(p_op, acc, l_i, sh, idx, WG: gl.constexpr, c):
    """Issue O += P V for ring slot ``idx`` (async; P from registers, one group per part) and, with
    ``ROW_SUM_BY_MMA``, l += P 1 (one more group: the row sums of the same 16-bit P that multiplies
    V, accumulated in fp32 by the tensor pipe instead of 64 FADDs per thread on the FMA pipe).
    Returns ``(acc, l_i)``."""
    acc = warpgroup_mma(p_op[0], sh.v_bufs.index(idx).reshape([c.BLOCK_N, c.HEAD_DIM_V]), acc, is_async=True)
    if c.EXTRA_KEYS > 0:
        acc = warpgroup_mma(p_op[1], sh.v2_bufs.index(idx).reshape([c.EXTRA_KEYS, c.HEAD_DIM_V]), acc,
                            is_async=True)
    if c.ROW_SUM_BY_MMA:
        # the A operand's registers are those of P for PV: the layout change moves nothing
        p_sum = gl.convert_layout(p_op[0], _a_operand_layout(_SUM_COLS))
        l_i = warpgroup_mma(p_sum, sh.ones_bufs.index(WG).permute((1, 0)), l_i, is_async=True)
    return acc, l_i


@gluon.jit
def _wait_scores(s, NUM_OUTSTANDING: gl.constexpr):
    """``warpgroup_mma_wait`` until at most ``NUM_OUTSTANDING`` groups are pending, tying ``s``'s parts."""
    if len(s) == 2:
        s0, s1 = warpgroup_mma_wait(NUM_OUTSTANDING, deps=[s[0], s[1]])
        out = (s0, s1)
    else:
        out = (warpgroup_mma_wait(NUM_OUTSTANDING, deps=[s[0]]),)
    return out


@gluon.jit
def _capped_scores(s, sz, c):
    """With ``HAS_SOFTCAP``, flash-attn's softcap on every part of a K/V tile's raw scores
    (:func:`softmax.capped`), as they come out of their wgmma wait: ahead of the mask, so masked
    keys still become ``-inf``, and of the row max. The scores as they are without it."""
    if c.HAS_SOFTCAP:
        if len(s) == 2:
            out = (capped(s[0], sz.softcap_pre, sz.softcap_post), capped(s[1], sz.softcap_pre, sz.softcap_post))
        else:
            out = (capped(s[0], sz.softcap_pre, sz.softcap_post),)
    else:
        out = s
    return out


@gluon.jit
def _wait_pv(acc, l_i, p_op, c):
    """Every group done (PV included): O (and, with ``ROW_SUM_BY_MMA``, the running sum) is final
    for this step, P's registers are free. Returns ``(acc, l_i, p_op)``."""
    if len(p_op) == 2:
        acc, p0, p1 = warpgroup_mma_wait(0, deps=[acc, p_op[0], p_op[1]])
        out = (p0, p1)
    elif c.ROW_SUM_BY_MMA:
        acc, l_i, p0 = warpgroup_mma_wait(0, deps=[acc, l_i, p_op[0]])
        out = (p0,)
    else:
        acc, p0 = warpgroup_mma_wait(0, deps=[acc, p_op[0]])
        out = (p0,)
    return acc, l_i, out


@gluon.jit
def _mask_part(s, rows, key0, sz, c, LOWER: gl.constexpr = True):
    """The keys of one part of a K/V tile (its first key ``key0``, absolute) that its rows may not
    see → ``-inf``: ``mask_scores``, or with ``ROW_BOUND_MASK`` one bound per row
    (``mask_scores_by_bound``); a window's launch always by bounds, its lower bound beside the upper
    (``mask_scores_by_bounds``) unless ``LOWER`` is off: a tile no row's window cuts (from the
    item's ``left_unmasked`` on), masked by the upper bound alone."""
    rows = gl.convert_layout(rows, gl.SliceLayout(1, s.type.layout))
    offs = gl.arange(0, s.type.shape[1], layout=gl.SliceLayout(0, s.type.layout))
    if c.HAS_WINDOW and not LOWER:
        out = mask_scores_by_bound(s, offs, last_visible_key(rows, key0, sz.seqlen_q, sz.seqlen_k, c.IS_CAUSAL,
                                                             _diag_shift(sz, c)))
    elif c.HAS_WINDOW:
        out = mask_scores_by_bounds(s, offs, first_visible_key(rows, key0, sz.seqlen_q, sz.seqlen_k, sz.window_left),
                                    last_visible_key(rows, key0, sz.seqlen_q, sz.seqlen_k, c.IS_CAUSAL,
                                                     _diag_shift(sz, c)))
    elif c.ROW_BOUND_MASK:
        out = mask_scores_by_bound(s, offs, last_visible_key(rows, key0, sz.seqlen_q, sz.seqlen_k, c.IS_CAUSAL))
    else:
        out = mask_scores(s, rows, key0 + offs, sz.seqlen_q, sz.seqlen_k, c.IS_CAUSAL)
    return out


@gluon.jit
def _masked_steps(kv_lo, kv_hi, n_unmasked, left_unmasked, c):
    """An item's K/V steps that run masked (the tile trace's count): the diagonal's and the key
    tail's run, and with ``HAS_WINDOW`` the tiles the window cuts and the peeled first one, which a
    windowed launch masks always (``_attend_overlapped``'s unmasked run starts after both) unless
    ``WINDOW_FIRST_MASK_ON_NEED``, where it is masked as the loops mask."""
    if c.HAS_WINDOW:
        if c.WINDOW_FIRST_MASK_ON_NEED:
            first_unmasked = gl.maximum(left_unmasked, kv_lo)
        else:
            first_unmasked = gl.maximum(left_unmasked, kv_lo + 1)
        unmasked = gl.maximum(gl.minimum(n_unmasked, kv_hi) - first_unmasked, 0)
        out = kv_hi - kv_lo - unmasked
    else:
        out = kv_hi - gl.maximum(kv_lo, gl.minimum(n_unmasked, kv_hi))
    return out


@gluon.jit
def _rotation_base(kv_lo, left_unmasked, c):
    """The first K/V tile a staggered sweep (``STAGGER_KV``) may rotate: ``kv_lo``, or with
    ``HAS_WINDOW`` the first tile no row's window cuts — the cut tiles run in place ahead of the
    rotated run, masked with their own indices, as the diagonal's run in place after it."""
    if c.HAS_WINDOW:
        out = gl.maximum(left_unmasked, kv_lo)
    else:
        out = kv_lo
    return out


@gluon.jit
def _window_range(row0, kv_lo, kv_hi, sz, c):
    """``(kv_lo, left_unmasked)``: with ``HAS_WINDOW``, the item's first K/V tile moved to the
    window's first (:func:`schedule.window_tile_range`; never past ``kv_hi``, so an item whose rows see
    no key stays empty) and the first tile no row's window cuts; without, ``kv_lo`` for both (no tile
    is masked on the left)."""
    if c.HAS_WINDOW:
        first, left_unmasked = window_tile_range(row0, sz.seqlen_q, sz.seqlen_k, sz.window_left, c.BLOCK_M,
                                                 c.KV_TILE)
        kv_lo = gl.minimum(gl.maximum(kv_lo, first), kv_hi)
    else:
        left_unmasked = kv_lo
    return kv_lo, left_unmasked


@gluon.jit
def _mask_tile(s, rows, kv_tile, sz, c, LOWER: gl.constexpr = True):
    """:func:`_mask_part` on every part of K/V tile ``kv_tile`` (absolute index)."""
    key0 = kv_tile * c.KV_TILE
    s0 = _mask_part(s[0], rows, key0, sz, c, LOWER)
    if len(s) == 2:
        out = (s0, _mask_part(s[1], rows, key0 + c.BLOCK_N, sz, c, LOWER))
    else:
        out = (s0,)
    return out


@gluon.jit
def _second_half_unseen(last_row, key0, sz, c):
    """Whether none of a consumer's rows may see a key at or past ``key0 + BLOCK_N / 2``: the last
    visible key of a row (:func:`softmax.last_visible_key`) grows with the row, so its last row
    ``last_row`` decides for all 64 (warpgroup-uniform). Rows past ``seqlen_q`` only make it false."""
    last = sz.seqlen_k - 1 - key0
    if c.IS_CAUSAL:
        last = gl.minimum(last, last_row + (sz.seqlen_k - sz.seqlen_q) - key0)
    return last < c.BLOCK_N // 2


@gluon.jit
def _first_half_seen(first_row, key0, sz, c):
    """Whether every one of a consumer's rows may see all keys ``[key0, key0 + BLOCK_N / 2)``: the
    bound of :func:`_second_half_unseen` taken at the consumer's first row ``first_row``, the row
    that sees the fewest keys (warpgroup-uniform). Then that half's mask is the identity."""
    last = sz.seqlen_k - 1 - key0
    if c.IS_CAUSAL:
        last = gl.minimum(last, first_row + (sz.seqlen_k - sz.seqlen_q) - key0)
    return last >= c.BLOCK_N // 2 - 1


@gluon.jit
def _halves(x):
    """``x`` [64, N] as its columns ``[0, N/2)`` and ``[N/2, N)``, each in the accumulator layout of
    N/2 columns: the column bit split off is a register bit of the wgmma accumulator (every bit
    above the n8 group is), so no value changes thread or register (census)."""
    HALF: gl.constexpr = x.shape[1] // 2
    a, b = gl.split(x.reshape([x.shape[0], 2, HALF]).permute((0, 2, 1)))
    return gl.convert_layout(a, _acc_layout(HALF)), gl.convert_layout(b, _acc_layout(HALF))


@gluon.jit
def _joined(a, b):
    """:func:`_halves` undone: ``[a | b]`` in the accumulator layout of twice the columns."""
    N: gl.constexpr = 2 * a.shape[1]
    return gl.convert_layout(gl.join(a, b).permute((0, 2, 1)).reshape([a.shape[0], N]), _acc_layout(N))


@gluon.jit
def _quarters_split(x, QUARTERS: gl.constexpr):
    """``x`` [64, N] as ``(ahead, behind)``, tuples of one or two column parts: its first
    ``QUARTERS`` quarters of columns and the rest (:func:`_halves`, halved again where needed)."""
    a, b = _halves(x)
    if QUARTERS == 2:
        ahead = (a,)
        behind = (b,)
    elif QUARTERS == 1:
        a0, a1 = _halves(a)
        ahead = (a0,)
        behind = (a1, b)
    else:
        b0, b1 = _halves(b)
        ahead = (a, b0)
        behind = (b1,)
    return ahead, behind


@gluon.jit
def _quarters_joined(ahead, behind, QUARTERS: gl.constexpr):
    """:func:`_quarters_split` undone."""
    if QUARTERS == 2:
        out = _joined(ahead[0], behind[0])
    elif QUARTERS == 1:
        out = _joined(_joined(ahead[0], behind[0]), behind[1])
    else:
        out = _joined(ahead[0], _joined(ahead[1], behind[0]))
    return out


@gluon.jit
def _rows_like(x, like):
    """A per-row vector (``m``, ``alpha``, an undeferred ``l``) in the row layout of ``like``'s
    accumulator; deferred per-thread partial sums (2-D) as they are. The rows each thread holds do
    not depend on N, so the conversion moves nothing."""
    if len(x.shape) == 1:
        out = gl.convert_layout(x, gl.SliceLayout(1, like.type.layout))
    else:
        out = x
    return out


@gluon.jit
def _masked_row_max_by_halves(s, rows, kv_tile, unseen, seen, m_i, qk_scale_log2, sz, c):
    """:func:`_mask_tile` and :func:`softmax.softmax_row_max` of masked K/V tile ``kv_tile``, its
    scores returned as two halves of keys ``t = (t_a, t_b)``. With ``unseen``
    (:func:`_second_half_unseen`) every row's second half is masked, so only the first half is
    masked and reduced and the second comes back untouched, never to be exponentiated; with
    ``seen`` (:func:`_first_half_seen`) no score of the first half is masked, so only the second
    half is masked and both are reduced; otherwise the tile is masked and reduced whole, exactly
    as without the switches."""
    if unseen:
        s_a, s_b = _halves(s[0])
        t1, scale1, m_h = softmax_row_max((_mask_part(s_a, rows, kv_tile * c.KV_TILE, sz, c),), _rows_like(m_i, s_a),
                                          qk_scale_log2, c.SCALE_POSITIVE, c.TREE_REDUCE, c.ROW_MAX_MARGIN)
        t_a = t1[0]
        t_b = s_b
        m_new = gl.convert_layout(m_h, m_i.type.layout)
    elif seen:
        s_a, s_b = _halves(s[0])
        HALF: gl.constexpr = s_a.shape[1]
        t1, scale1, m_h = softmax_row_max((s_a, _mask_part(s_b, rows, kv_tile * c.KV_TILE + HALF, sz, c)),
                                          _rows_like(m_i, s_a), qk_scale_log2, c.SCALE_POSITIVE, c.TREE_REDUCE,
                                          c.ROW_MAX_MARGIN)
        t_a = t1[0]
        t_b = t1[1]
        m_new = gl.convert_layout(m_h, m_i.type.layout)
    else:
        t2, scale2, m_new = softmax_row_max(_mask_tile(s, rows, kv_tile, sz, c), m_i, qk_scale_log2,
                                            c.SCALE_POSITIVE, c.TREE_REDUCE, c.ROW_MAX_MARGIN)
        t_a, t_b = _halves(t2[0])
    if c.SCALE_POSITIVE:
        scale = qk_scale_log2
    else:
        scale = 1.0
    return (t_a, t_b), scale, m_new


@gluon.jit
def _exp_by_halves(t, scale, m_i, m_new, l_i, unseen, c):
    """:func:`softmax.softmax_exp` of :func:`_masked_row_max_by_halves`' halves: ``(p, alpha, l)``,
    ``p`` one tile again. With ``unseen`` only the first half's exponentials and sums are taken
    and the second half of ``p`` is 0 (``exp2(-inf)``, what the whole tile gives there); otherwise
    the whole tile's, as without the switch."""
    if unseen:
        if c.ROW_SUM_BY_MMA:
            # l is the tensor pipe's (in FA3's order still pending here): the half's softmax
            # neither reads nor sums it
            p1, alpha_h, l_h = softmax_exp((t[0],), scale, _rows_like(m_i, t[0]), _rows_like(m_new, t[0]),
                                           _rows_like(m_i, t[0]), c.EXP2_FMA_EVERY, c.TREE_REDUCE, False)
            l_new = l_i
        else:
            p1, alpha_h, l_h = softmax_exp((t[0],), scale, _rows_like(m_i, t[0]), _rows_like(m_new, t[0]),
                                           _rows_like(l_i, t[0]), c.EXP2_FMA_EVERY, c.TREE_REDUCE)
            l_new = gl.convert_layout(l_h, l_i.type.layout)
        p = _joined(p1[0], gl.zeros_like(t[1]))
        alpha = gl.convert_layout(alpha_h, m_i.type.layout)
    else:
        p2, alpha, l_new = softmax_exp((_joined(t[0], t[1]),), scale, m_i, m_new, l_i, c.EXP2_FMA_EVERY,
                                       c.TREE_REDUCE, not c.ROW_SUM_BY_MMA)
        p = p2[0]
    return (p,), alpha, l_new


@gluon.jit
def _operands(p, sh, WG: gl.constexpr, PACKED: gl.constexpr, c):
    """P's parts as 16-bit register operands of the PV wgmma (the layout change is free in SASS),
    or with ``P_IN_SMEM`` this consumer's shared buffer holding P: written only after PV(j-1)'s
    wait (every caller), the only reader of the buffer before it."""
    dtype: gl.constexpr = sh.v_bufs.dtype
    if c.P_IN_SMEM:
        buf = sh.p_bufs.index(WG)
        buf.store(to_operand_dtype(p[0], dtype, PACKED))
        # generic-proxy writes, async-proxy reads: fenced by each writer, then every warp's rows
        # written before any warp issues the PV that reads the whole box
        fence_async_shared()
        gl.thread_barrier()
        out = (buf,)
    else:
        out = _register_operands(p, dtype, PACKED, c.HEAD_DIM_V)
    return out


@gluon.jit
def _register_operands(p, dtype: gl.constexpr, PACKED: gl.constexpr, HEAD_DIM_V: gl.constexpr):
    """P's parts converted to ``dtype`` in the A-operand layout of the PV wgmma."""
    p_layout: gl.constexpr = _a_operand_layout(HEAD_DIM_V)
    p0 = gl.convert_layout(to_operand_dtype(p[0], dtype, PACKED), p_layout)
    if len(p) == 2:
        out = (p0, gl.convert_layout(to_operand_dtype(p[1], dtype, PACKED), p_layout))
    else:
        out = (p0,)
    return out


@gluon.jit
def _rescale_acc(acc, alpha, rescale, o_layout: gl.constexpr, THRESHOLDED: gl.constexpr,
                 BY_WARP: gl.constexpr = False):
    """O ← O · alpha (per row). Thresholded: only when ``rescale`` (warpgroup-uniform) is set;
    otherwise every alpha of a row that has seen a key is exactly 1 and the multiply is skipped.
    ``BY_WARP``: ``rescale`` is each row's warp's vote, and each warp skips on its own."""
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    a = gl.convert_layout(alpha, row_layout)
    if THRESHOLDED:
        if BY_WARP:
            acc = rescale_by_warp(acc, a, gl.convert_layout(rescale, row_layout))
        else:
            if rescale:
                acc = acc * gl.expand_dims(a, 1)
    else:
        acc = acc * gl.expand_dims(a, 1)
    return acc


@gluon.jit
def _rescale_state(acc, l_i, alpha, rescale, o_layout: gl.constexpr, c):
    """O and, with ``ROW_SUM_BY_MMA``, its running-sum accumulator rescaled by ``alpha`` together
    (:func:`_rescale_acc` decides O's skip). The sum's 4 registers per thread are multiplied
    always: where O's rescale is skipped every ``alpha`` is exactly 1."""
    acc = _rescale_acc(acc, alpha, rescale, o_layout, c.RESCALE_THRESHOLD > 0, c.RESCALE_BY_WARP)
    if c.ROW_SUM_BY_MMA:
        l_i = rescaled_sum(l_i, alpha)
    return acc, l_i


@gluon.jit
def _init_sum(s_layout: gl.constexpr, c):
    """The running sum at the start of a tile: the ``[64, 8]`` wgmma accumulator of P times ones
    (``ROW_SUM_BY_MMA``) or :func:`softmax.init_row_sum`'s form."""
    if c.ROW_SUM_BY_MMA:
        l0 = gl.zeros([_ROWS, _SUM_COLS], gl.float32, _acc_layout(_SUM_COLS))
    else:
        l0 = init_row_sum(_ROWS, c.BLOCK_N, s_layout, c.DEFER_ROW_SUM)
    return l0


@gluon.jit
def _sum_total(l_i, c):
    """``l`` per row: any column of the ones product (all eight hold the same sum), or
    :func:`softmax.row_sum_total`."""
    if c.ROW_SUM_BY_MMA:
        out = gl.max(l_i, 1)
    else:
        out = row_sum_total(l_i)
    return out


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale_log2, SCALE_POSITIVE: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr,
                  EXP2_FMA_EVERY: gl.constexpr, TREE: gl.constexpr, BY_WARP: gl.constexpr = False,
                  SUM: gl.constexpr = True, MARGIN: gl.constexpr = 0.0):
    """(p, alpha, m, l, rescale); ``rescale`` is meaningful only with a threshold (else it is alpha);
    ``MARGIN`` as in :func:`softmax.softmax_row_max` (``c.ROW_MAX_MARGIN``)."""
    if RESCALE_THRESHOLD > 0:
        p, alpha, m_i, l_i, rescale = online_softmax_retained(s, m_i, l_i, qk_scale_log2, SCALE_POSITIVE,
                                                              RESCALE_THRESHOLD, EXP2_FMA_EVERY, TREE, BY_WARP, SUM,
                                                              MARGIN)
    else:
        p, alpha, m_i, l_i = online_softmax(s, m_i, l_i, qk_scale_log2, SCALE_POSITIVE, EXP2_FMA_EVERY, TREE, SUM,
                                            MARGIN)
        rescale = alpha
    return p, alpha, m_i, l_i, rescale


@gluon.jit
def _overlapped_step(q, sh, sz, acc, p_op, m_i, l_i, alpha, rescale, rows, last_row, j, kv_lo, count, v_idx, v_phase,
                     turn, qk_scale_log2, trace, WG: gl.constexpr, MASK: gl.constexpr, c, masked=False,
                     LOWER: gl.constexpr = True):
    """QK(j) and PV(j-1) in flight together; softmax(j) runs while PV(j-1) is still pending.

    ``j`` counts the work item's K/V tiles from its first, ``kv_lo`` (ring item ``count + j``);
    only the mask needs the absolute tile ``kv_lo + j``. ``MASK`` builds the masked step;
    ``masked`` (with ``SINGLE_KV_LOOP``, warpgroup-uniform) masks the tile behind a branch instead.
    ``LOWER`` off (a window's tiles no row's window cuts): masked by the upper bound alone.

    ``alpha``/``rescale`` come from softmax(j-1): with ``LATE_RESCALE`` O is rescaled here, after
    QK(j) is issued and before PV(j-1) is, so the multiplies run in the shadow of QK(j) (FA3's
    order); without it they were applied at the end of the previous step.

    ``(v_idx, v_phase)`` is the ring slot of V(j-1), K(j-1)'s: with ``CARRY_RING_SLOT`` K(j)'s is the
    next slot after it, and the step returns K(j)'s for the next step to carry; without it both
    are recomputed from the ring count.

    ``trace`` is this step's clock record (:func:`trace.step_record`; nothing with ``TRACE_STEPS = 0``).
    """
    o_layout: gl.constexpr = _acc_layout(c.HEAD_DIM_V)
    first_row = last_row - (_ROWS - 1)
    stamp(trace, rows, first_row, E_TOP, c.TRACE_STEPS, c.TRACE_WARPS)
    if c.CARRY_RING_SLOT:
        k_idx, k_phase = next_ring_slot(v_idx, v_phase, c.NUM_KV_STAGES)
    else:
        k_idx, k_phase = ring_slot(count + j, c.NUM_KV_STAGES)
        v_idx, v_phase = ring_slot(count + j - 1, c.NUM_KV_STAGES)
    ready_wait(sh.k_ready_bars, k_idx, k_phase, c.K_READY_AT, c.HOIST_SMEM_BASE)
    ready_wait(sh.v_ready_bars, v_idx, v_phase, c.V_READY_AT, c.HOIST_SMEM_BASE)
    stamp(trace, rows, first_row, E_READY, c.TRACE_STEPS, c.TRACE_WARPS)
    turn = wait_turn(sh.turn_bars, turn, WG, c.PINGPONG, c.NAMED_TURNS, c.TURN_WAIT_AT, c.HOIST_SMEM_BASE)
    stamp(trace, rows, first_row, E_TURN, c.TRACE_STEPS, c.TRACE_WARPS)
    s = _qk(q, sh, k_idx, c)
    if c.LATE_RESCALE:
        acc, l_i = _rescale_state(acc, l_i, alpha, rescale, o_layout, c)
    acc, l_i = _pv(p_op, acc, l_i, sh, v_idx, WG, c)
    pass_turn(sh.turn_bars, WG, c.NUM_CONSUMERS, c.PINGPONG, c.NAMED_TURNS, c.TURN_AT, c.HOIST_SMEM_BASE)
    stamp(trace, rows, first_row, E_ISSUED, c.TRACE_STEPS, c.TRACE_WARPS)
    # wait(1) (wait(2) with two parts or the sum's group): the older groups (QK) are done, PV may
    # still run. STAGED: the first box first, its row max under the second box's QK
    STAGED: gl.constexpr = (c.STAGED_SCORES and c.NUM_PARTS == 2 and c.WAIT_PV_EARLY and c.SCALE_POSITIVE
                            and not MASK and not c.SINGLE_KV_LOOP and not c.HAS_SOFTCAP
                            and not (c.SKIP_UNSEEN_HALF or c.MASK_SECOND_HALF))
    if STAGED:
        s0 = warpgroup_mma_wait(c.PV_GROUPS + 1, deps=[s[0]])
        # the second box's wait behind a branch, taking the first box's row max through it: in one
        # basic block ptxas sinks that max below the wait (census), and nothing runs under the
        # second box's product
        m_first = wait_mma_after_softmax(qk_scale_log2, first_part_row_max(s0, qk_scale_log2, c.TREE_REDUCE),
                                         c.PV_GROUPS)
        s = (s0, warpgroup_mma_wait(c.PV_GROUPS, deps=[s[1]]))
    else:
        s = _capped_scores(_wait_scores(s, c.PV_GROUPS), sz, c)
    stamp(trace, rows, first_row, E_SCORES, c.TRACE_STEPS, c.TRACE_WARPS)
    if not c.LATE_K_RELEASE:
        release(sh.k_empty_bars, k_idx, c.THREAD_RELEASE, c.K_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
    # masked tiles whose second half no row of this warpgroup sees skip that half (SKIP_UNSEEN_HALF);
    # those whose first half every row sees mask the second half only (MASK_SECOND_HALF)
    HALVES: gl.constexpr = MASK and (c.SKIP_UNSEEN_HALF or c.MASK_SECOND_HALF)
    if HALVES:
        key0 = (kv_lo + j) * c.KV_TILE
        if c.SKIP_UNSEEN_HALF:
            unseen = _second_half_unseen(last_row, key0, sz, c)
        else:
            unseen = False
        if c.MASK_SECOND_HALF:
            seen = _first_half_seen(last_row - (_ROWS - 1), key0, sz, c)
        else:
            seen = False
        t, scale, m_new = _masked_row_max_by_halves(s, rows, kv_lo + j, unseen, seen, m_i, qk_scale_log2, sz, c)
    elif MASK:
        s = _mask_tile(s, rows, kv_lo + j, sz, c, LOWER)
    elif c.SINGLE_KV_LOOP:
        if masked:
            s = _mask_tile(s, rows, kv_lo + j, sz, c)
    # O's rescale right after PV(j-1)'s wait, ahead of the exponentials (RESCALE_BEFORE_EXP): in
    # program order after them, ptxas leaves its multiplies at the trip's end, in front of the next
    # GEMM issue (d64: 32 FMUL and the sum's shuffles after the last MUFU.EX2), where FA4's d64
    # SASS interleaves them with its exponentials (ncu, B1 H32 S32768)
    RESCALE_FIRST: gl.constexpr = (c.RESCALE_BEFORE_EXP and c.WAIT_PV_EARLY and not HALVES
                                   and c.EARLY_EXP_QUARTERS == 0)
    # FREEZE_ROW_MAX: an unmasked step keeps the reference the item's earlier steps set, so it forms
    # no row max and O needs no rescale; alpha and rescale pass through untouched. A later score
    # past P's range above it leaves the row non-finite, which the epilogue's guard sends to the
    # recompute (_flag_overflow)
    FROZEN: gl.constexpr = (c.FREEZE_ROW_MAX and c.WAIT_PV_EARLY and c.SCALE_POSITIVE and not MASK
                            and not HALVES and not STAGED)
    if c.WAIT_PV_EARLY:
        # FA4's order: only the row max overlaps PV(j-1); the exponentials follow its wait(0),
        # so P(j) may take P(j-1)'s registers, and under pingpong they overlap the other
        # warpgroup's GEMMs instead
        if FROZEN:
            t = s
            scale = qk_scale_log2
            m_new = m_i
        elif not HALVES:
            if STAGED:
                t, scale, m_new = staged_row_max(s, m_first, m_i, qk_scale_log2, c.TREE_REDUCE, c.ROW_MAX_MARGIN)
            else:
                t, scale, m_new = softmax_row_max(s, m_i, qk_scale_log2, c.SCALE_POSITIVE, c.TREE_REDUCE,
                                                  c.ROW_MAX_MARGIN)
            if c.RESCALE_THRESHOLD > 0:
                m_new, retained = retained_max(m_new, m_i, c.RESCALE_THRESHOLD, c.RESCALE_BY_WARP)
        stamp(trace, rows, first_row, E_MID, c.TRACE_STEPS, c.TRACE_WARPS)
        if c.GATE_PV_WAIT:
            # the wait behind a branch, taking the new row max through it: ptxas otherwise hoists
            # it into the row max's first latency bubble (census), and the row max no longer
            # overlaps PV(j-1)
            m_new = wait_mma_after_softmax(qk_scale_log2, m_new)
        EARLY: gl.constexpr = c.EARLY_EXP_QUARTERS > 0 and not HALVES
        if EARLY:
            # FA4's placement (its d64 SASS: the row max and 12 of 66 exponentials ahead of PV's
            # wait): the first quarters' exponentials overlap PV(j-1) too. Their partial sums go
            # through the wait's branch, so ptxas keeps them ahead of it
            ahead, behind = _quarters_split(t[0], c.EARLY_EXP_QUARTERS)
            p_ahead, alpha, partial = softmax_exp_ahead(ahead, scale, m_i, m_new, c.EXP2_FMA_EVERY)
            partial = wait_mma_after_softmax(qk_scale_log2, partial)
        acc, l_i, p_op = _wait_pv(acc, l_i, p_op, c)
        stamp(trace, rows, first_row, E_PV, c.TRACE_STEPS, c.TRACE_WARPS)
        release(sh.v_empty_bars, v_idx, c.THREAD_RELEASE, c.V_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
        if c.LATE_K_RELEASE:
            release(sh.k_empty_bars, k_idx, c.THREAD_RELEASE, c.K_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
        # with EXP_TURNS one consumer at a time runs its MUFU block (taken once per overlapped
        # step, as the GEMM token is)
        m_new = wait_exp_turn(m_new, WG, c.EXP_TURNS)
        if RESCALE_FIRST:
            # in a basic block of its own (a branch on a runtime value, pipeline.wait_mma_after_softmax's
            # guard): in the exponentials' block ptxas sinks the multiplies to its end whatever
            # their program order (census); the scale is finite (inputs.softmax_scale), so the
            # branch is always taken. alpha ahead of the branch, where softmax_exp's own exp2 of the
            # same value folds into it (inside, it is a second MUFU.EX2 a row)
            alpha_first = rescale_factor(m_i, m_new)
            if qk_scale_log2 == qk_scale_log2:
                if c.RESCALE_THRESHOLD > 0:
                    acc, l_i = _rescale_state(acc, l_i, alpha_first, retained, o_layout, c)
                else:
                    acc, l_i = _rescale_state(acc, l_i, alpha_first, alpha_first, o_layout, c)
        if FROZEN:
            p, l_i = softmax_exp_frozen(t, scale, m_i, l_i, c.EXP2_FMA_EVERY, c.TREE_REDUCE)
        elif HALVES:
            p, alpha, l_i = _exp_by_halves(t, scale, m_i, m_new, l_i, unseen, c)
        elif EARLY:
            p_behind, l_i = softmax_exp_behind(behind, scale, m_new, l_i, alpha, partial, c.EXP2_FMA_EVERY)
            p = (_quarters_joined(p_ahead, p_behind, c.EARLY_EXP_QUARTERS),)
        else:
            p, alpha, l_i = softmax_exp(t, scale, m_i, m_new, l_i, c.EXP2_FMA_EVERY, c.TREE_REDUCE,
                                        not c.ROW_SUM_BY_MMA)
        l_i = pass_exp_turn(l_i, WG, c.NUM_CONSUMERS, c.EXP_TURNS)
        m_i = m_new
        if not FROZEN:
            if c.RESCALE_THRESHOLD > 0:
                rescale = retained
            else:
                rescale = alpha
    else:
        if HALVES:
            p, alpha, l_i = _exp_by_halves(t, scale, m_i, m_new, l_i, unseen, c)
            m_i = m_new
            rescale = alpha
        else:
            p, alpha, m_i, l_i, rescale = _softmax_step(s, m_i, l_i, qk_scale_log2, c.SCALE_POSITIVE,
                                                        c.RESCALE_THRESHOLD, c.EXP2_FMA_EVERY, c.TREE_REDUCE,
                                                        c.RESCALE_BY_WARP, not c.ROW_SUM_BY_MMA, c.ROW_MAX_MARGIN)
        stamp(trace, rows, first_row, E_MID, c.TRACE_STEPS, c.TRACE_WARPS)
        # wait(0): PV(j-1) is done: its P registers and V slot are free, O may be rescaled. The
        # gated early wait keeps ptxas from hoisting this above the exp2 block (see pipeline.py).
        if c.ROW_SUM_BY_MMA:
            # l is the pending sum's accumulator, not a register value to pass through: the
            # exponentials are (one box of keys)
            m_i = wait_mma_after_softmax(qk_scale_log2, m_i)
        else:
            l_i = wait_mma_after_softmax(qk_scale_log2, l_i)
        acc, l_i, p_op = _wait_pv(acc, l_i, p_op, c)
        stamp(trace, rows, first_row, E_PV, c.TRACE_STEPS, c.TRACE_WARPS)
        release(sh.v_empty_bars, v_idx, c.THREAD_RELEASE, c.V_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
        if c.LATE_K_RELEASE:
            release(sh.k_empty_bars, k_idx, c.THREAD_RELEASE, c.K_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
    if c.CONVERT_BEFORE_RESCALE:
        # P's conversions ahead of O's rescale: behind rescale_by_warp's branch ptxas keeps them
        # after the join, a block boundary they do not depend on
        p_op = _operands(p, sh, WG, c.PACK_P, c)
    if not c.LATE_RESCALE and not RESCALE_FIRST and not FROZEN:
        acc, l_i = _rescale_state(acc, l_i, alpha, rescale, o_layout, c)
    if not c.CONVERT_BEFORE_RESCALE:
        p_op = _operands(p, sh, WG, c.PACK_P, c)
    stamp(trace, rows, first_row, E_END, c.TRACE_STEPS, c.TRACE_WARPS)
    return acc, p_op, m_i, l_i, alpha, rescale, turn, k_idx, k_phase


@gluon.jit
def _attend_overlapped(q, sh, sz, acc, m_i, l_i, rows, last_row, kv_lo, kv_hi, n_unmasked, left_unmasked, first_kv,
                       count, turn, qk_scale_log2, prev, epi, tile_iter, WG: gl.constexpr, c):
    """Two-stage schedule (seed 001, 0x05) over K/V tiles ``[kv_lo, kv_hi)``: QK(lo)+softmax(lo);
    steady QK(j)‖PV(j-1); drain PV. ``count`` is the ring position of the first tile visited,
    ``first_kv`` (``kv_lo``, or the staggered start: ``schedule.kv_stagger``). With ``HAS_WINDOW`` the
    tiles before ``left_unmasked`` are masked too (:func:`_window_range`).

    With ``OVERLAP_EPILOGUE`` the previous tile's epilogue (``prev``, stored through ``epi``: see
    :func:`_finish_previous`) runs while this tile's first QK is in flight, the one product no
    softmax overlaps."""
    o_layout: gl.constexpr = _acc_layout(c.HEAD_DIM_V)
    if kv_hi > kv_lo:
        idx, phase = ring_slot(count, c.NUM_KV_STAGES)
        ready_wait(sh.k_ready_bars, idx, phase, c.K_READY_AT, c.HOIST_SMEM_BASE)
        s = _qk(q, sh, idx, c)
        if c.OVERLAP_EPILOGUE:
            _finish_previous(prev, epi, sh, sz, WG, c)
        s = _capped_scores(_wait_scores(s, 0), sz, c)
        release(sh.k_empty_bars, idx, c.THREAD_RELEASE, c.K_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
        if c.FIRST_MASK_ON_NEED:
            # masked as the loop masks: only the diagonal and the key tail (kv_tile_range). A
            # non-causal launch sets it only when its keys fill their tiles (_first_mask_on_need),
            # where no tile is masked and no branch is needed
            if c.IS_CAUSAL:
                if first_kv >= n_unmasked:
                    s = _mask_tile(s, rows, first_kv, sz, c)
        elif c.HAS_WINDOW and c.WINDOW_FIRST_MASK_ON_NEED:
            # masked as the loops mask (FIRST_MASK_ON_NEED is off with a window: its rule knows the
            # diagonal alone): a tile the window cuts by both bounds, the diagonal's or the key
            # tail's by the upper one; an uncut item's first tile (key 0) not at all. A staggered
            # start lies between the two and is never masked
            if first_kv < left_unmasked:
                s = _mask_tile(s, rows, first_kv, sz, c)
            elif first_kv >= n_unmasked:
                s = _mask_tile(s, rows, first_kv, sz, c, not c.WINDOW_DIAGONAL_ONE_BOUND)
        else:
            # the first tile is masked unconditionally: one tile, and it may be the only one
            s = _mask_tile(s, rows, first_kv, sz, c)
        # O is still zero: its first rescale (by alpha = 0 or 1) is a no-op wherever it happens
        p, alpha, m_i, l_i, rescale = _softmax_step(s, m_i, l_i, qk_scale_log2, c.SCALE_POSITIVE, c.RESCALE_THRESHOLD,
                                                    c.EXP2_FMA_EVERY, c.TREE_REDUCE, c.RESCALE_BY_WARP,
                                                    not c.ROW_SUM_BY_MMA, c.ROW_MAX_MARGIN)
        p_op = _operands(p, sh, WG, c.PACK_P, c)
        # j counts from the item's first tile, so the unmasked loop is the same code for a whole
        # tile and a split (the census pins it)
        n_tiles = kv_hi - kv_lo
        # the ring slot of the last K/V tile issued (carried with CARRY_RING_SLOT)
        ring_idx = idx
        ring_phase = phase
        if c.SINGLE_KV_LOOP:
            # one copy of the step's code: the masked tiles (the diagonal, the key tail) are the
            # last ones, masked behind a uniform branch
            for j in range(1, n_tiles):
                acc, p_op, m_i, l_i, alpha, rescale, turn, ring_idx, ring_phase = _overlapped_step(
                    q, sh, sz, acc, p_op, m_i, l_i, alpha, rescale, rows, last_row, j, kv_lo, count, ring_idx,
                    ring_phase, turn,
                    qk_scale_log2, step_record(epi[2].coords_ptr, tile_iter, j, WG, c), WG, False, c,
                    kv_lo + j >= n_unmasked)
        else:
            if c.HAS_WINDOW:
                # the tiles the window cuts on the left, masked (the peeled first one was); the
                # unmasked run starts after them, the diagonal's masked run after both
                for j in range(1, gl.minimum(left_unmasked - kv_lo, n_tiles)):
                    acc, p_op, m_i, l_i, alpha, rescale, turn, ring_idx, ring_phase = _overlapped_step(
                        q, sh, sz, acc, p_op, m_i, l_i, alpha, rescale, rows, last_row, j, kv_lo, count, ring_idx,
                        ring_phase, turn,
                        qk_scale_log2, step_record(epi[2].coords_ptr, tile_iter, j, WG, c), WG, True, c)
                unmasked_from = gl.maximum(left_unmasked - kv_lo, 1)
            else:
                unmasked_from = 1
            for j in range(unmasked_from, gl.minimum(n_unmasked - kv_lo, n_tiles)):
                acc, p_op, m_i, l_i, alpha, rescale, turn, ring_idx, ring_phase = _overlapped_step(
                    q, sh, sz, acc, p_op, m_i, l_i, alpha, rescale, rows, last_row, j, kv_lo, count, ring_idx,
                    ring_phase, turn,
                    qk_scale_log2, step_record(epi[2].coords_ptr, tile_iter, j, WG, c), WG, False, c)
            # computed after the unmasked run, as before the window: a bound computed ahead of the
            # loop stays live across it (census: the unwindowed builds' registers moved)
            if c.HAS_WINDOW:
                masked_from = gl.maximum(n_unmasked - kv_lo, unmasked_from)
            else:
                masked_from = gl.maximum(n_unmasked - kv_lo, 1)
            # the diagonal's and the key tail's run: at or past left_unmasked (masked_from), no row's
            # window cuts these tiles, so WINDOW_DIAGONAL_ONE_BOUND masks them by the upper bound alone
            for j in range(masked_from, n_tiles):
                acc, p_op, m_i, l_i, alpha, rescale, turn, ring_idx, ring_phase = _overlapped_step(
                    q, sh, sz, acc, p_op, m_i, l_i, alpha, rescale, rows, last_row, j, kv_lo, count, ring_idx,
                    ring_phase, turn,
                    qk_scale_log2, step_record(epi[2].coords_ptr, tile_iter, j, WG, c), WG, True, c,
                    LOWER=not c.WINDOW_DIAGONAL_ONE_BOUND)
        if c.CARRY_RING_SLOT:
            idx = ring_idx
            phase = ring_phase
        else:
            idx, phase = ring_slot(count + n_tiles - 1, c.NUM_KV_STAGES)
        ready_wait(sh.v_ready_bars, idx, phase, c.V_READY_AT, c.HOIST_SMEM_BASE)
        if c.LATE_RESCALE:
            acc, l_i = _rescale_state(acc, l_i, alpha, rescale, o_layout, c)
        acc, l_i = _pv(p_op, acc, l_i, sh, idx, WG, c)
        acc, l_i, p_op = _wait_pv(acc, l_i, p_op, c)
        release(sh.v_empty_bars, idx, c.THREAD_RELEASE, c.V_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
    if c.OVERLAP_EPILOGUE:
        if kv_hi <= kv_lo:
            # no K/V tile to hide it under (rows that see no key)
            _finish_previous(prev, epi, sh, sz, WG, c)
    return acc, m_i, l_i, turn


@gluon.jit
def _serial_step(q, sh, sz, acc, m_i, l_i, rows, j, kv_lo, count, turn, qk_scale_log2,
                 WG: gl.constexpr, MASK: gl.constexpr, c, LOWER: gl.constexpr = True):
    """QK(j) → softmax(j) → PV(j), each GEMM waited before the next step (``j``, ``kv_lo``, ``count``,
    ``LOWER`` as in :func:`_overlapped_step`)."""
    o_layout: gl.constexpr = _acc_layout(c.HEAD_DIM_V)
    idx, phase = ring_slot(count + j, c.NUM_KV_STAGES)
    ready_wait(sh.k_ready_bars, idx, phase, c.K_READY_AT, c.HOIST_SMEM_BASE)
    turn = wait_turn(sh.turn_bars, turn, WG, c.PINGPONG, c.NAMED_TURNS, c.TURN_WAIT_AT, c.HOIST_SMEM_BASE)
    s = _qk(q, sh, idx, c)
    pass_turn(sh.turn_bars, WG, c.NUM_CONSUMERS, c.PINGPONG, c.NAMED_TURNS, c.TURN_AT, c.HOIST_SMEM_BASE)
    s = _capped_scores(_wait_scores(s, 0), sz, c)
    release(sh.k_empty_bars, idx, c.THREAD_RELEASE, c.K_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
    if MASK:
        s = _mask_tile(s, rows, kv_lo + j, sz, c, LOWER)
    p, alpha, m_i, l_i = online_softmax(s, m_i, l_i, qk_scale_log2, c.SCALE_POSITIVE, 0, c.TREE_REDUCE,
                                        not c.ROW_SUM_BY_MMA, c.ROW_MAX_MARGIN)
    acc, l_i = _rescale_state(acc, l_i, alpha, alpha, o_layout, c)
    p_op = _operands(p, sh, WG, False, c)
    ready_wait(sh.v_ready_bars, idx, phase, c.V_READY_AT, c.HOIST_SMEM_BASE)
    turn = wait_turn(sh.turn_bars, turn, WG, c.PINGPONG, c.NAMED_TURNS, c.TURN_WAIT_AT, c.HOIST_SMEM_BASE)
    acc, l_i = _pv(p_op, acc, l_i, sh, idx, WG, c)
    pass_turn(sh.turn_bars, WG, c.NUM_CONSUMERS, c.PINGPONG, c.NAMED_TURNS, c.TURN_AT, c.HOIST_SMEM_BASE)
    acc, l_i, p_op = _wait_pv(acc, l_i, p_op, c)
    release(sh.v_empty_bars, idx, c.THREAD_RELEASE, c.V_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
    return acc, m_i, l_i, turn


@gluon.jit
def _attend_serial(q, sh, sz, acc, m_i, l_i, rows, kv_lo, kv_hi, n_unmasked, left_unmasked, count, turn,
                   qk_scale_log2, WG: gl.constexpr, c):
    """K/V tiles ``[kv_lo, kv_hi)`` one after another; ``count`` is the ring position of ``kv_lo``; with
    ``HAS_WINDOW`` those before ``left_unmasked`` masked first."""
    n_tiles = kv_hi - kv_lo
    if c.HAS_WINDOW:
        for j in range(0, gl.minimum(left_unmasked - kv_lo, n_tiles)):
            acc, m_i, l_i, turn = _serial_step(
                q, sh, sz, acc, m_i, l_i, rows, j, kv_lo, count, turn, qk_scale_log2, WG, True, c)
        unmasked_from = gl.maximum(left_unmasked - kv_lo, 0)
    else:
        unmasked_from = 0
    for j in range(unmasked_from, gl.minimum(n_unmasked - kv_lo, n_tiles)):
        acc, m_i, l_i, turn = _serial_step(
            q, sh, sz, acc, m_i, l_i, rows, j, kv_lo, count, turn, qk_scale_log2, WG, False, c)
    if c.HAS_WINDOW:
        masked_from = gl.maximum(n_unmasked - kv_lo, unmasked_from)
    else:
        masked_from = gl.maximum(n_unmasked - kv_lo, 0)
    for j in range(masked_from, n_tiles):
        acc, m_i, l_i, turn = _serial_step(
            q, sh, sz, acc, m_i, l_i, rows, j, kv_lo, count, turn, qk_scale_log2, WG, True, c,
            LOWER=not c.WINDOW_DIAGONAL_ONE_BOUND)
    return acc, m_i, l_i, turn


@gluon.jit
def _meet_before_pass(c):
    """With ``MEET_BEFORE_PASS``, the passing warpgroup's four warps meet before its thread 0 passes
    the turn: every warp has then read the turn it passes. Without a wgmma between the wait and the
    pass nothing else holds warps 1–3 to warp 0, and a parity wait cannot tell a turn from the one
    after the next (config.meet_before_pass)."""
    if c.MEET_BEFORE_PASS:
        gl.thread_barrier()


@gluon.jit
def _pass_tiles(sh, n_tiles, count, turn, WG: gl.constexpr, c):
    """A consumer whose rows all lie past the last query row walks ``n_tiles`` K/V tiles from ring
    position ``count`` issuing no GEMM: every wait, turn and release of :func:`_attend_overlapped`
    (or :func:`_attend_serial`) in the same order, so the ring's phases and the pingpong token stay
    where the other consumers expect them.

    A release must follow the tile's arrival: an arrival on an empty barrier before the producer
    has refilled the slot would count toward the phase the other consumers are still reading, and
    the producer would overwrite a tile in use."""
    if c.OVERLAP:
        if n_tiles > 0:
            idx, phase = ring_slot(count, c.NUM_KV_STAGES)
            ready_wait(sh.k_ready_bars, idx, phase, c.K_READY_AT, c.HOIST_SMEM_BASE)
            release(sh.k_empty_bars, idx, c.THREAD_RELEASE, c.K_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
            for j in range(1, n_tiles):
                k_idx, k_phase = ring_slot(count + j, c.NUM_KV_STAGES)
                v_idx, v_phase = ring_slot(count + j - 1, c.NUM_KV_STAGES)
                ready_wait(sh.k_ready_bars, k_idx, k_phase, c.K_READY_AT, c.HOIST_SMEM_BASE)
                ready_wait(sh.v_ready_bars, v_idx, v_phase, c.V_READY_AT, c.HOIST_SMEM_BASE)
                turn = wait_turn(sh.turn_bars, turn, WG, c.PINGPONG, c.NAMED_TURNS, c.TURN_WAIT_AT, c.HOIST_SMEM_BASE)
                _meet_before_pass(c)
                pass_turn(sh.turn_bars, WG, c.NUM_CONSUMERS, c.PINGPONG, c.NAMED_TURNS, c.TURN_AT, c.HOIST_SMEM_BASE)
                pass_exp_turn_through(WG, c.NUM_CONSUMERS, c.EXP_TURNS)
                release(sh.k_empty_bars, k_idx, c.THREAD_RELEASE, c.K_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
                release(sh.v_empty_bars, v_idx, c.THREAD_RELEASE, c.V_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
            idx, phase = ring_slot(count + n_tiles - 1, c.NUM_KV_STAGES)
            ready_wait(sh.v_ready_bars, idx, phase, c.V_READY_AT, c.HOIST_SMEM_BASE)
            release(sh.v_empty_bars, idx, c.THREAD_RELEASE, c.V_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
    else:
        for j in range(0, n_tiles):
            idx, phase = ring_slot(count + j, c.NUM_KV_STAGES)
            ready_wait(sh.k_ready_bars, idx, phase, c.K_READY_AT, c.HOIST_SMEM_BASE)
            turn = wait_turn(sh.turn_bars, turn, WG, c.PINGPONG, c.NAMED_TURNS, c.TURN_WAIT_AT, c.HOIST_SMEM_BASE)
            _meet_before_pass(c)
            pass_turn(sh.turn_bars, WG, c.NUM_CONSUMERS, c.PINGPONG, c.NAMED_TURNS, c.TURN_AT, c.HOIST_SMEM_BASE)
            release(sh.k_empty_bars, idx, c.THREAD_RELEASE, c.K_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
            ready_wait(sh.v_ready_bars, idx, phase, c.V_READY_AT, c.HOIST_SMEM_BASE)
            turn = wait_turn(sh.turn_bars, turn, WG, c.PINGPONG, c.NAMED_TURNS, c.TURN_WAIT_AT, c.HOIST_SMEM_BASE)
            _meet_before_pass(c)
            pass_turn(sh.turn_bars, WG, c.NUM_CONSUMERS, c.PINGPONG, c.NAMED_TURNS, c.TURN_AT, c.HOIST_SMEM_BASE)
            release(sh.v_empty_bars, idx, c.THREAD_RELEASE, c.V_EMPTY_AT, c.HOIST_SMEM_BASE, c.PEER_RELEASE)
    return turn


@gluon.jit
def _store_lse(lse_ptr, lse, sz, b, h, q0, my_row0, out_rows: gl.constexpr):
    """This warpgroup's rows of LSE ``(B, Hq, rows_q)``: ``b`` the TMA batch coordinate and ``q0`` the
    sequence's first row (:func:`_sequence`; 0 and the packed rows' count with ``PACKED``)."""
    lse_rows = my_row0 + gl.arange(0, _ROWS, layout=out_rows)
    lse_offs = (b * sz.heads_q.d + h).to(gl.int64) * sz.rows_q + q0 + lse_rows
    gl.store(lse_ptr + lse_offs, lse, mask=lse_rows < sz.seqlen_q)


@gluon.jit
def _store_rows(out_ptr, o_desc, out, b, h, q0, my_row0, seqlen_q, o_layout: gl.constexpr):
    """This warpgroup's O rows below ``seqlen_q`` (and columns below out's own head dim) of batch
    entry ``b`` from registers: a packed sequence's last, partial box (``PACKED``; ``b`` 0), or
    every tile's rows (``O_FROM_REGISTERS``). O's strides and width are ``o_desc``'s (its last
    stride 1)."""
    rows = my_row0 + gl.arange(0, _ROWS, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, o_desc.block_type.shape[3], layout=gl.SliceLayout(0, o_layout))
    offs = (gl.expand_dims((q0 + rows).to(gl.int64) * o_desc.strides[1], 1)
            + (gl.to_tensor(b).to(gl.int64) * o_desc.strides[0] + h.to(gl.int64) * o_desc.strides[2])
            + gl.expand_dims(cols, 0))
    keep = gl.expand_dims(rows < seqlen_q, 1) & gl.expand_dims(cols < o_desc.shape[3], 0)
    gl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=keep)


@gluon.jit
def _store_partial(parts, out, lse, part, tail_tile, split, b, h, m_block, WG: gl.constexpr, c):
    """A split-tail item's normalized O (fp32) and LSE, every row of the tile (the workspace has
    them all; ``tail_combine`` masks the tail), and the tile's coordinates from its first split."""
    o_layout: gl.constexpr = _acc_layout(c.HEAD_DIM_V)
    # 64-bit item base, 32-bit offsets inside the item (an item is BLOCK_M × D words). Census:
    # 0 spill at d128 with either form; outside the loop d64 spills 64 B with this form and 16 B
    # with 64-bit offsets per element, d256 80 B with both (the split tail is off at d64 and d256)
    first_row = part.to(gl.int64) * c.BLOCK_M
    rows = WG * _ROWS + gl.arange(0, _ROWS, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, c.HEAD_DIM_V, layout=gl.SliceLayout(0, o_layout))
    o_ptr = parts.o_ptr + first_row * c.HEAD_DIM_V
    gl.store(o_ptr + gl.expand_dims(rows, 1) * c.HEAD_DIM_V + gl.expand_dims(cols, 0), out)
    gl.store(parts.lse_ptr + first_row + rows, lse)
    if WG == 0:
        # written by the first split of the tile (any split would do: they agree)
        k = gl.arange(0, _ROWS, layout=gl.SliceLayout(1, o_layout))
        coords = gl.where(k == 0, b, gl.where(k == 1, h, m_block))
        gl.store(parts.coords_ptr + tail_tile * 3 + k, coords, mask=(k < 3) & (split == 0))


@gluon.jit
def _flag_overflow(acc, l_rows, lse, row_valid, guard_ptr):
    """FREEZE_ROW_MAX's guard: ``lse`` with NaN in every row whose O accumulator or running sum
    is not finite, and the guard word set if a row below the sequence's end is one. A frozen
    reference below the row's later scores overflows P (fp32 past 2^128, or the 16-bit operand of
    PV), and non-finite values stay so through every later step: O or ``l`` is ±inf or NaN at the
    end iff some step overflowed. A finite row is exact (the reference never exceeds the row's
    true max, so nothing that matters underflows; a finite P above 1 keeps its relative
    precision); a flagged one is rewritten by ``portable.fwd.recompute_flagged`` after the launch."""
    # x · 0 is 0 for finite x and NaN for ±inf or NaN: one multiply a row after the sum, whose own
    # overflow (a false alarm at worst) or NaN carries any element's
    probe = (gl.sum(acc, axis=1) + l_rows) * 0.0
    bad = probe != probe
    gl.store(guard_ptr + gl.zeros_like(l_rows.to(gl.int32)), gl.full_like(l_rows, 1, dtype=gl.int32), mask=bad & row_valid)
    return gl.where(bad, float("nan"), lse)


@gluon.jit
def _epilogue(acc, m_i, l_i, b, h, m_block, split, item, tile_id, epi, sh, sz, WG: gl.constexpr, c):
    """Work item ``item``'s O and LSE, normalized: LSE straight to global, O through shared memory
    and a TMA store (a split item's both to the workspace). ``epi`` is ``(o_desc, lse_ptr,
    parts)``."""
    o_desc, lse_ptr, parts = epi
    o_layout: gl.constexpr = _acc_layout(c.HEAD_DIM_V)
    if c.SEPARATE_O or c.HEAD_DIM_V == c.HEAD_DIM:
        o_buf = sh.o_bufs.index(WG)
    else:
        # O narrower than Q, staged in this consumer's own Q buffer: the same bytes seen as O's
        # box (reinterpreting the whole array instead would put consumer 1's O inside consumer
        # 0's Q, which may still be in use)
        o_buf = sh.o_bufs.index(WG)._reinterpret(o_desc.dtype, o_desc.block_type.shape, o_desc.layout)
    my_row0 = m_block * c.BLOCK_M + WG * _ROWS
    # the item's own sequence (PACKED), even when this runs under another item's first QK
    sz, tma_b, q0, _ = _sequence(sz, b, c)
    out_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    l_rows = gl.convert_layout(_sum_total(l_i, c), out_rows)
    out, lse = finalize(acc, gl.convert_layout(m_i, out_rows), l_rows)
    if c.FREEZE_ROW_MAX:
        lse = _flag_overflow(acc, l_rows, lse, my_row0 + gl.arange(0, _ROWS, layout=out_rows) < sz.seqlen_q,
                             parts.guard_ptr)
    if c.SPLIT_TAIL:
        if split >= 0:
            if c.MULTICAST:
                # the workspace holds every CTA's tile: tail tile t of the pair schedule is the two
                # tiles 2t and 2t + 1, each with its splits (tail_combine's order)
                tail_tile = (tile_id - sz.num_full_tiles) * _CLUSTER_CTAS + cta_rank()
                _store_partial(parts, out, lse, tail_tile * sz.tail_splits.d + split, tail_tile, split, b, h,
                               m_block, WG, c)
            else:
                _store_partial(parts, out, lse, item - sz.num_full_tiles, tile_id - sz.num_full_tiles, split, b, h,
                               m_block, WG, c)
        else:
            _store_lse(lse_ptr, lse, sz, tma_b, h, q0, my_row0, out_rows)
    else:
        _store_lse(lse_ptr, lse, sz, tma_b, h, q0, my_row0, out_rows)
    write_o = my_row0 < sz.seqlen_q
    if c.SPLIT_TAIL:
        write_o = write_o & (split < 0)      # a split item's O went to the workspace
    if c.O_FROM_REGISTERS:
        # every row below the sequence's end from registers; Q's buffer was released already
        if write_o:
            _store_rows(sz.out_ptr, o_desc, out, tma_b, h, q0, my_row0, sz.seqlen_q, o_layout)
        write_o = False
    elif c.PACKED:
        # a box past the sequence's last row would write the next sequence's first rows (TMA
        # clips at the packed tensor's end only): those rows go out from registers, masked
        whole = my_row0 + _ROWS <= sz.seqlen_q
        if write_o & (my_row0 + _ROWS > sz.seqlen_q):
            _store_rows(sz.out_ptr, o_desc, out, tma_b, h, q0, my_row0, sz.seqlen_q, o_layout)
        write_o = write_o & whole
    if write_o:
        # o_buf is O's own buffer (separate_o) or the Q buffer itself, free once the last QK
        # is done
        if c.SEPARATE_O:
            # the previous tile's store must have read the buffer; it ran under this tile
            tma.store_wait(0)
        o_buf.reshape([_ROWS, c.HEAD_DIM_V]).store(out.to(o_buf.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [tma_b, q0 + my_row0, h, 0], o_buf)
        if not c.SEPARATE_O:
            # the next Q may only land in the buffer once the store has read it
            tma.store_wait(0)


@gluon.jit
def _finish_previous(prev, epi, sh, sz, WG: gl.constexpr, c):
    """:func:`_epilogue` of the work item this consumer finished before the current one, if any:
    ``prev`` is its ``(acc, m_i, l_i, item, valid)``."""
    acc, m_i, l_i, item, valid = prev
    if valid:
        # the coordinates derived from the item again, as the loop derived them (carrying the
        # item alone keeps the loop's carried state to O and the row statistics)
        tile_id, split, b, h, m_block = _work_coords(item, sz, c, c.FAST_DIVIDE_CONSUMERS)
        _epilogue(acc, m_i, l_i, b, h, m_block, split, item, tile_id, epi, sh, sz, WG, c)


@gluon.jit
def _fill_ones(ones, c):
    """This consumer's tile of ones, the B operand of its row-sum wgmma, written once: every warp
    of the warpgroup stores its share, the generic-proxy writes are fenced for the tensor pipe's
    async reads, and the warpgroup meets once so no warp issues the wgmma before all shares land."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    ones.store(gl.full([_SUM_COLS, c.BLOCK_N], 1.0, ones.dtype, layout))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _consume_item(o_desc, lse_ptr, parts, sh, sz, qk_scale_log2, item, count, turn, tile_iter, prev, WG: gl.constexpr,
                  c):
    """This warpgroup's rows of work item ``item``: its Q wait, its K/V sweep and its epilogue (the
    previous item's, ``prev``, with OVERLAP_EPILOGUE). Returns the ring count and pingpong turn after
    it, and its unnormalized O and row statistics (what OVERLAP_EPILOGUE keeps for the next item)."""
    s_layout: gl.constexpr = _acc_layout(c.BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(c.HEAD_DIM_V)
    tile_id, split, b, h, m_block = _work_coords(item, sz, c, c.FAST_DIVIDE_CONSUMERS)
    # the item's sequence: sz itself unless PACKED, whose masks and ranges read its own lengths
    sz, _, _, _ = _sequence(sz, b, c)
    row0 = m_block * c.BLOCK_M
    my_row0 = row0 + WG * _ROWS
    n_kv, n_unmasked = _kv_tiles(row0, sz, c)
    kv_lo, kv_hi = kv_split_range(n_kv, split, sz.tail_splits, c.SPLIT_TAIL, c.FAST_DIVIDE_CONSUMERS)
    kv_lo, left_unmasked = _window_range(row0, kv_lo, kv_hi, sz, c)
    rot_lo = _rotation_base(kv_lo, left_unmasked, c)
    n_rot, kv_start = kv_stagger(m_block, rot_lo, kv_hi, n_unmasked, c.STAGGER_KV, kv_first=kv_lo,
                                 FROM_ZERO=c.STAGGER_FROM_ZERO)
    rows = my_row0 + gl.arange(0, _ROWS, layout=gl.SliceLayout(1, s_layout))
    tile_start(_tile_trace_ptr(sz, parts, c), rows, my_row0, tile_iter, item, kv_hi - kv_lo,
               _masked_steps(kv_lo, kv_hi, n_unmasked, left_unmasked, c), WG, c)
    m_i = gl.full([_ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = _init_sum(s_layout, c)
    acc = gl.zeros([_ROWS, c.HEAD_DIM_V], gl.float32, o_layout)
    q_stage, q_phase = ring_slot(tile_iter, c.NUM_Q_STAGES)
    q_slot = q_stage * c.NUM_CONSUMERS + WG
    # [1, 64, 1, D], the TMA box; reshaped, the same bytes as a wgmma operand
    q = sh.q_bufs.index(q_slot).reshape([_ROWS, c.HEAD_DIM])
    mbarrier.wait(sh.q_ready_bars.index(q_slot), q_phase)
    if c.Q_IN_REGISTERS:
        # one ldmatrix pass per tile; every QK of the tile then reads only K from shared memory
        q_op = q.load(_a_operand_layout(c.BLOCK_N))
    elif c.HEAD_DIM_TAIL > 0:
        q_op = (q, sh.q2_bufs.index(q_slot).reshape([_ROWS, c.HEAD_DIM_TAIL]))
    else:
        q_op = q
    if c.SKIP_EMPTY_ROWS and my_row0 >= sz.seqlen_q:
        # the tile's last rows lie past the sequence (a partial m-tile): this warpgroup's
        # GEMMs would only feed rows that are never stored; its rows stay empty (O = 0,
        # LSE = -inf, neither written) and the others get the tensor cores to themselves
        if c.OVERLAP_EPILOGUE:
            _finish_previous(prev, (o_desc, lse_ptr, parts), sh, sz, WG, c)
        turn = _pass_tiles(sh, kv_hi - kv_lo, count, turn, WG, c)
    elif c.OVERLAP:
        acc, m_i, l_i, turn = _attend_overlapped(
            q_op, sh, sz, acc, m_i, l_i, rows, my_row0 + _ROWS - 1, kv_lo, kv_hi, n_unmasked, left_unmasked,
            kv_visit(kv_lo, rot_lo, n_rot, kv_start, c.STAGGER_KV, c.STAGGER_SUBTRACT, c.HAS_WINDOW),
            count, turn, qk_scale_log2, prev, (o_desc, lse_ptr, parts), tile_iter, WG, c)
    else:
        acc, m_i, l_i, turn = _attend_serial(
            q_op, sh, sz, acc, m_i, l_i, rows, kv_lo, kv_hi, n_unmasked, left_unmasked, count, turn, qk_scale_log2,
            WG, c)
    count += kv_hi - kv_lo
    if c.SEPARATE_O or c.O_FROM_REGISTERS:
        # every QK of the tile is done: the producer may load the next tile's Q while this
        # one's epilogue runs
        mbarrier.arrive(sh.q_empty_bars.index(q_slot))
    if not c.OVERLAP_EPILOGUE:
        # (with OVERLAP_EPILOGUE the caller keeps this tile for the next one's first QK)
        _epilogue(acc, m_i, l_i, b, h, m_block, split, item, tile_id, (o_desc, lse_ptr, parts), sh, sz, WG, c)
    if not (c.SEPARATE_O or c.O_FROM_REGISTERS):
        mbarrier.arrive(sh.q_empty_bars.index(q_slot))
    tile_end(_tile_trace_ptr(sz, parts, c), rows, my_row0, tile_iter, WG, c)
    return count, turn, acc, m_i, l_i


@gluon.jit
def _handed_item(sh, tile_iter, WG: gl.constexpr, c):
    """The work item the producer handed this warpgroup for its ``tile_iter``-th Q slot (-1: none
    left), read once the slot's ready barrier completes (:func:`_hand_item`). The wait is the one
    :func:`_consume_item` makes again on the completed phase, which returns at once. With
    ``ITEM_BARRIER``, read once the item's own slot is written (:func:`_post_item`)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [_CONSUMER_WARPS], [0])
    if c.ITEM_BARRIER:
        # the item's own barrier (_post_item): the tile's Q may still be on its way
        stage, phase = ring_slot(tile_iter, _item_slots(c.NUM_Q_STAGES, c.ITEM_BARRIER))
        slot = stage * c.NUM_CONSUMERS + WG
        mbarrier.wait(sh.item_ready_bars.index(slot), phase)
    else:
        q_stage, q_phase = ring_slot(tile_iter, c.NUM_Q_STAGES)
        slot = q_stage * c.NUM_CONSUMERS + WG
        mbarrier.wait(sh.q_ready_bars.index(slot), q_phase)
    return gl.max(sh.item_bufs.index(slot).load(layout), 0)


@gluon.jit
def _consumer_partition(o_desc, lse_ptr, parts, sh, sz, qk_scale_log2,
                        WG: gl.constexpr, c):
    """Rows ``[WG·64, WG·64 + 64)`` of every tile this CTA owns."""
    s_layout: gl.constexpr = _acc_layout(c.BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(c.HEAD_DIM_V)
    count = 0
    turn = 0
    tile_iter = 0
    if c.MULTICAST:
        join_cluster(_CONSUMER_WARPS)
    start_turns(WG, c.NUM_CONSUMERS, c.PINGPONG, c.NAMED_TURNS)
    start_exp_turns(WG, c.NUM_CONSUMERS, c.EXP_TURNS)
    if c.ROW_SUM_BY_MMA:
        _fill_ones(sh.ones_bufs.index(WG), c)
    start, stop, step = work_range(sz.sched_ptr, sz.num_items, c.BALANCED, c.MULTICAST)
    if c.OVERLAP_EPILOGUE:
        # the finished tile whose epilogue is still to run: none before the first
        prev_acc = gl.zeros([_ROWS, c.HEAD_DIM_V], gl.float32, o_layout)
        prev_m = gl.full([_ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        prev_l = _init_sum(s_layout, c)
        prev_item = start
    if c.DYNAMIC:
        item = _handed_item(sh, tile_iter, WG, c)
        while item >= 0:
            count, turn, acc, m_i, l_i = _consume_item(o_desc, lse_ptr, parts, sh, sz, qk_scale_log2, item, count,
                                                       turn, tile_iter, (), WG, c)
            tile_iter += 1
            item = _handed_item(sh, tile_iter, WG, c)
    else:
        for pos in range(start, stop, step):
            item = work_at(sz.sched_ptr, pos, c.BALANCED)
            if c.OVERLAP_EPILOGUE:
                prev = (prev_acc, prev_m, prev_l, prev_item, tile_iter > 0)
            else:
                prev = ()
            count, turn, acc, m_i, l_i = _consume_item(o_desc, lse_ptr, parts, sh, sz, qk_scale_log2, item, count,
                                                       turn, tile_iter, prev, WG, c)
            if c.OVERLAP_EPILOGUE:
                # this tile's epilogue runs under the next tile's first QK, or after the loop
                prev_acc = acc
                prev_m = m_i
                prev_l = l_i
                prev_item = item
            tile_iter += 1
    if c.OVERLAP_EPILOGUE:
        _finish_previous((prev_acc, prev_m, prev_l, prev_item, tile_iter > 0), (o_desc, lse_ptr, parts),
                         sh, sz, WG, c)
    # a TMA store still reading shared memory must finish before the CTA exits
    tma.store_wait(0)


# --------------------------------------------------------------------------- kernel


# the sizes and the decode's magic numbers (schedule.fast_divisor: a shift of 1 would otherwise
# specialize into a constant and compile again)
_SIZE_ARGS = ("seqlen_q", "seqlen_k", "heads_q", "heads_q_mul", "heads_q_shift", "group", "group_mul", "group_shift",
              "num_m_blocks", "m_blocks_mul", "m_blocks_shift", "batch_heads", "head_section", "section_mul",
              "section_shift", "last_section", "last_section_mul", "last_section_shift", "per_section_mul",
              "per_section_shift", "num_items", "num_full_tiles", "tail_splits", "splits_mul", "splits_shift",
              "window_left", "window_right")


@gluon.jit(do_not_specialize=_SIZE_ARGS)
def _attn_fwd_kernel(q_desc, k_desc, v_desc, k2_desc, v2_desc, q2_desc, o_desc, lse_ptr, part_o_ptr, part_lse_ptr,
                     tail_coords_ptr, guard_ptr,
                     sched_ptr, handout_ptr, kv_tmaps_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, out_ptr,
                     seqlen_q, seqlen_k, heads_q, heads_q_mul, heads_q_shift, group, group_mul, group_shift,
                     num_m_blocks, m_blocks_mul, m_blocks_shift, batch_heads, head_section, section_mul,
                     section_shift, last_section, last_section_mul, last_section_shift, per_section_mul,
                     per_section_shift, num_items, num_full_tiles, tail_splits, splits_mul, splits_shift,
                     qk_scale_log2, softcap_pre, softcap_post, window_left, window_right,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                     HEAD_DIM_V: gl.constexpr, HEAD_DIM_TAIL: gl.constexpr,
                     NUM_KV_STAGES: gl.constexpr, NUM_Q_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, LPT: gl.constexpr,
                     OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, SCALE_POSITIVE: gl.constexpr,
                     LATE_RESCALE: gl.constexpr, PACK_P: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr,
                     Q_IN_REGISTERS: gl.constexpr, WAIT_PV_EARLY: gl.constexpr,
                     EXP2_FMA_EVERY: gl.constexpr, TREE_REDUCE: gl.constexpr, SEPARATE_O: gl.constexpr,
                     O_FROM_REGISTERS: gl.constexpr, DEFER_ROW_SUM: gl.constexpr, NAMED_TURNS: gl.constexpr,
                     EXP_TURNS: gl.constexpr,
                     SPLIT_TAIL: gl.constexpr,
                     EXTRA_KEYS: gl.constexpr, BALANCED: gl.constexpr, DYNAMIC: gl.constexpr,
                     HANDOUT_TABLE: gl.constexpr, DRAW_AHEAD: gl.constexpr, ITEM_BARRIER: gl.constexpr,
                     STAGGER_KV: gl.constexpr,
                     STAGGER_SUBTRACT: gl.constexpr,
                     STAGGER_FROM_ZERO: gl.constexpr,
                     LAG_V_LOADS: gl.constexpr, LATE_K_RELEASE: gl.constexpr, ROW_BOUND_MASK: gl.constexpr,
                     SKIP_EMPTY_ROWS: gl.constexpr, MEET_BEFORE_PASS: gl.constexpr, OVERLAP_EPILOGUE: gl.constexpr,
                     FIRST_MASK_ON_NEED: gl.constexpr,
                     WINDOW_FIRST_MASK_ON_NEED: gl.constexpr, WINDOW_DIAGONAL_ONE_BOUND: gl.constexpr,
                     FAST_DIVIDE_PRODUCER: gl.constexpr, FAST_DIVIDE_CONSUMERS: gl.constexpr,
                     THREAD_RELEASE: gl.constexpr, SKIP_UNSEEN_HALF: gl.constexpr,
                     MASK_SECOND_HALF: gl.constexpr, SINGLE_KV_LOOP: gl.constexpr, RESCALE_BY_WARP: gl.constexpr,
                     CONVERT_BEFORE_RESCALE: gl.constexpr, RESCALE_BEFORE_EXP: gl.constexpr,
                     PRODUCER_WAIT_HINT_NS: gl.constexpr,
                     CARRY_RING_SLOT: gl.constexpr,
                     ROW_SUM_BY_MMA: gl.constexpr, P_IN_SMEM: gl.constexpr, FREEZE_ROW_MAX: gl.constexpr,
                     FP16_ROW_MAX_MARGIN: gl.constexpr,
                     STAGED_SCORES: gl.constexpr, TRACE_STEPS: gl.constexpr,
                     TRACE_WARPS: gl.constexpr,
                     TRACE_ITEM: gl.constexpr, TRACE_TILES: gl.constexpr,
                     K_EMPTY_AT: gl.constexpr, V_EMPTY_AT: gl.constexpr, TURN_AT: gl.constexpr,
                     K_READY_AT: gl.constexpr, V_READY_AT: gl.constexpr, TURN_WAIT_AT: gl.constexpr,
                     HOIST_SMEM_BASE: gl.constexpr, GATE_PV_WAIT: gl.constexpr,
                     EARLY_EXP_QUARTERS: gl.constexpr, MULTICAST: gl.constexpr, CROSS_HEAD_PAIRS: gl.constexpr,
                     PRODUCER_WARPGROUP: gl.constexpr,
                     K_RING_AT: gl.constexpr, V_RING_AT: gl.constexpr, K_ARM_AT: gl.constexpr, V_ARM_AT: gl.constexpr,
                     PRODUCER_UNSYNCED: gl.constexpr, Q_BUFS_AT: gl.constexpr, Q_ARM_AT: gl.constexpr,
                     Q_EMPTY_AT: gl.constexpr, RELAY_RELEASE: gl.constexpr, K_RELAY_AT: gl.constexpr,
                     V_RELAY_AT: gl.constexpr,
                     CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
                     HAS_WINDOW: gl.constexpr, PACKED: gl.constexpr, HAS_WINDOW_RIGHT: gl.constexpr):
    NUM_CONSUMERS: gl.constexpr = BLOCK_M // _ROWS
    PRODUCER_WARPS_USED: gl.constexpr = _MULTICAST_PRODUCER_WARPS if MULTICAST or PRODUCER_WARPGROUP else _PRODUCER_WARPS
    # a K/V slot's release: each consumer of this CTA, and with MULTICAST each of the peer's too,
    # unless the producers relay the peer's (RELAY_RELEASE: its own barrier, one arrival)
    PEER_RELEASE: gl.constexpr = MULTICAST and not RELAY_RELEASE
    RELEASES_PER_SLOT: gl.constexpr = NUM_CONSUMERS * release_arrivals(THREAD_RELEASE) * (_CLUSTER_CTAS if PEER_RELEASE
                                                                                           else 1)
    dtype: gl.constexpr = q_desc.dtype
    # the frozen reference's head room where P's operand is fp16 (config.fp16_row_max_margin); bf16
    # has fp32's range and takes none
    ROW_MAX_MARGIN: gl.constexpr = FP16_ROW_MAX_MARGIN if FREEZE_ROW_MAX and dtype == gl.float16 else 0.0
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bufs = gl.allocate_shared_memory(dtype, [NUM_Q_STAGES * NUM_CONSUMERS] + q_desc.block_type.shape,
                                       q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [NUM_KV_STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [NUM_KV_STAGES] + v_desc.block_type.shape, v_desc.layout)
    if EXTRA_KEYS > 0:
        k2_bufs = gl.allocate_shared_memory(dtype, [NUM_KV_STAGES] + k2_desc.block_type.shape, k2_desc.layout)
        v2_bufs = gl.allocate_shared_memory(dtype, [NUM_KV_STAGES] + v2_desc.block_type.shape, v2_desc.layout)
    elif HEAD_DIM_TAIL > 0:
        k2_bufs = gl.allocate_shared_memory(dtype, [NUM_KV_STAGES] + k2_desc.block_type.shape, k2_desc.layout)
        v2_bufs = v_bufs
    else:
        k2_bufs = k_bufs
        v2_bufs = v_bufs
    if HEAD_DIM_TAIL > 0:
        q2_bufs = gl.allocate_shared_memory(dtype, [NUM_Q_STAGES * NUM_CONSUMERS] + q2_desc.block_type.shape,
                                            q2_desc.layout)
    else:
        q2_bufs = q_bufs
    if SEPARATE_O:
        o_bufs = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS] + o_desc.block_type.shape, o_desc.layout)
    else:
        o_bufs = q_bufs
    if ROW_SUM_BY_MMA:
        # K-major like K itself (permuted into the wgmma's B operand): 8 rows of BLOCK_N keys
        ones_bufs = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, _SUM_COLS, BLOCK_N],
                                              gl.NVMMASharedLayout.get_default_for([_SUM_COLS, BLOCK_N], dtype))
    else:
        ones_bufs = k_bufs
    if P_IN_SMEM:
        # K-major, as the A operand of a wgmma reads it from shared memory (Q is the other one)
        p_bufs = gl.allocate_shared_memory(dtype, [BLOCK_M // _ROWS, _ROWS, BLOCK_N],
                                           gl.NVMMASharedLayout.get_default_for([_ROWS, BLOCK_N], dtype))
    else:
        p_bufs = k_bufs
    q_ready_bars = gl.allocate_shared_memory(gl.int64, [NUM_Q_STAGES * NUM_CONSUMERS, 1], bar_layout)
    q_empty_bars = gl.allocate_shared_memory(gl.int64, [NUM_Q_STAGES * NUM_CONSUMERS, 1], bar_layout)
    turn_bars = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], bar_layout)
    k_ready_bars = gl.allocate_shared_memory(gl.int64, [NUM_KV_STAGES, 1], bar_layout)
    k_empty_bars = gl.allocate_shared_memory(gl.int64, [NUM_KV_STAGES, 1], bar_layout)
    v_ready_bars = gl.allocate_shared_memory(gl.int64, [NUM_KV_STAGES, 1], bar_layout)
    v_empty_bars = gl.allocate_shared_memory(gl.int64, [NUM_KV_STAGES, 1], bar_layout)
    if DYNAMIC:
        item_bufs = gl.allocate_shared_memory(gl.int32, [_item_slots(NUM_Q_STAGES, ITEM_BARRIER) * NUM_CONSUMERS, 1],
                                              gl.SwizzledSharedLayout(1, 1, 1, [0]))
    else:
        item_bufs = turn_bars       # never read
    if ITEM_BARRIER:
        item_ready_bars = gl.allocate_shared_memory(gl.int64, [_item_slots(NUM_Q_STAGES, ITEM_BARRIER) * NUM_CONSUMERS,
                                                               1], bar_layout)
        for i in gl.static_range(_item_slots(NUM_Q_STAGES, ITEM_BARRIER) * NUM_CONSUMERS):
            mbarrier.init(item_ready_bars.index(i), count=1)     # the producer, once the word is written
    else:
        item_ready_bars = q_ready_bars      # never read
    if RELAY_RELEASE:
        k_relay_bars = gl.allocate_shared_memory(gl.int64, [NUM_KV_STAGES, 1], bar_layout)
        v_relay_bars = gl.allocate_shared_memory(gl.int64, [NUM_KV_STAGES, 1], bar_layout)
        for i in gl.static_range(NUM_KV_STAGES):
            # one arrival a fill: the peer's producer, once the peer's consumers released the slot
            mbarrier.init(k_relay_bars.index(i), count=1)
            mbarrier.init(v_relay_bars.index(i), count=1)
    else:
        k_relay_bars = k_empty_bars     # never read
        v_relay_bars = v_empty_bars
    for i in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(q_ready_bars.index(i), count=1)     # the producer's expect-tx arrival
        mbarrier.init(q_empty_bars.index(i), count=1)     # its one consumer
        mbarrier.init(turn_bars.index(i), count=1)        # the previous consumer in the ring
    for i in gl.static_range(NUM_CONSUMERS, NUM_Q_STAGES * NUM_CONSUMERS):
        mbarrier.init(q_ready_bars.index(i), count=1)     # the further Q stages, as the first
        mbarrier.init(q_empty_bars.index(i), count=1)
    for i in gl.static_range(NUM_KV_STAGES):
        mbarrier.init(k_ready_bars.index(i), count=1)
        mbarrier.init(v_ready_bars.index(i), count=1)
        # every consumer warpgroup reads every K/V tile: each releases it once (pipeline.release:
        # one elected arrival per 4-warp partition, or one per thread)
        mbarrier.init(k_empty_bars.index(i), count=RELEASES_PER_SLOT)
        mbarrier.init(v_empty_bars.index(i), count=RELEASES_PER_SLOT)
    sh = _Shared(q_bufs, o_bufs, k_bufs, v_bufs, q_ready_bars, q_empty_bars, k_ready_bars, k_empty_bars,
                 v_ready_bars, v_empty_bars, turn_bars, k2_bufs, v2_bufs, ones_bufs, item_bufs, k_relay_bars,
                 v_relay_bars, q2_bufs, p_bufs, item_ready_bars)
    sz = _Sizes(seqlen_q, seqlen_k, FastDivisor(heads_q, heads_q_mul, heads_q_shift),
                FastDivisor(group, group_mul, group_shift), FastDivisor(num_m_blocks, m_blocks_mul, m_blocks_shift),
                batch_heads, FastDivisor(head_section, section_mul, section_shift),
                FastDivisor(last_section, last_section_mul, last_section_shift),
                FastDivisor(num_m_blocks * head_section, per_section_mul, per_section_shift), num_items,
                num_full_tiles, FastDivisor(tail_splits, splits_mul, splits_shift), sched_ptr, handout_ptr,
                kv_tmaps_ptr, softcap_pre, softcap_post, window_left, window_right,
                # with PACKED, seqlen_q and seqlen_k are the packed rows; each item reads its own
                # sequence's lengths (_sequence)
                seqlen_q, cu_seqlens_q_ptr, cu_seqlens_k_ptr, out_ptr)
    parts = _Partials(part_o_ptr, part_lse_ptr, tail_coords_ptr, guard_ptr)

    c = _Schedule(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, HEAD_DIM_V=HEAD_DIM_V,
                  HEAD_DIM_TAIL=HEAD_DIM_TAIL,
                  NUM_KV_STAGES=NUM_KV_STAGES,
                  NUM_Q_STAGES=NUM_Q_STAGES,
                  NUM_CONSUMERS=NUM_CONSUMERS, IS_CAUSAL=IS_CAUSAL, LPT=LPT, OVERLAP=OVERLAP, PINGPONG=PINGPONG,
                  SCALE_POSITIVE=SCALE_POSITIVE, LATE_RESCALE=LATE_RESCALE, PACK_P=PACK_P,
                  RESCALE_THRESHOLD=RESCALE_THRESHOLD, Q_IN_REGISTERS=Q_IN_REGISTERS,
                  WAIT_PV_EARLY=WAIT_PV_EARLY, EXP2_FMA_EVERY=EXP2_FMA_EVERY, TREE_REDUCE=TREE_REDUCE,
                  SEPARATE_O=SEPARATE_O, O_FROM_REGISTERS=O_FROM_REGISTERS, DEFER_ROW_SUM=DEFER_ROW_SUM,
                  NAMED_TURNS=NAMED_TURNS, EXP_TURNS=EXP_TURNS,
                  SPLIT_TAIL=SPLIT_TAIL, EXTRA_KEYS=EXTRA_KEYS, KV_TILE=BLOCK_N + EXTRA_KEYS,
                  NUM_PARTS=2 if EXTRA_KEYS > 0 else 1, BALANCED=BALANCED, DYNAMIC=DYNAMIC, HANDOUT_TABLE=HANDOUT_TABLE,
                  DRAW_AHEAD=DRAW_AHEAD, ITEM_BARRIER=ITEM_BARRIER, STAGGER_KV=STAGGER_KV,
                  STAGGER_SUBTRACT=STAGGER_SUBTRACT,
                  STAGGER_FROM_ZERO=STAGGER_FROM_ZERO,
                  LAG_V_LOADS=LAG_V_LOADS, LATE_K_RELEASE=LATE_K_RELEASE, ROW_BOUND_MASK=ROW_BOUND_MASK,
                  SKIP_EMPTY_ROWS=SKIP_EMPTY_ROWS, MEET_BEFORE_PASS=MEET_BEFORE_PASS, OVERLAP_EPILOGUE=OVERLAP_EPILOGUE,
                  FIRST_MASK_ON_NEED=FIRST_MASK_ON_NEED, FAST_DIVIDE_PRODUCER=FAST_DIVIDE_PRODUCER,
                  WINDOW_FIRST_MASK_ON_NEED=WINDOW_FIRST_MASK_ON_NEED,
                  WINDOW_DIAGONAL_ONE_BOUND=WINDOW_DIAGONAL_ONE_BOUND,
                  FAST_DIVIDE_CONSUMERS=FAST_DIVIDE_CONSUMERS, THREAD_RELEASE=THREAD_RELEASE,
                  SKIP_UNSEEN_HALF=SKIP_UNSEEN_HALF, MASK_SECOND_HALF=MASK_SECOND_HALF,
                  SINGLE_KV_LOOP=SINGLE_KV_LOOP, RESCALE_BY_WARP=RESCALE_BY_WARP,
                  CONVERT_BEFORE_RESCALE=CONVERT_BEFORE_RESCALE, RESCALE_BEFORE_EXP=RESCALE_BEFORE_EXP,
                  PRODUCER_WAIT_HINT_NS=PRODUCER_WAIT_HINT_NS,
                  CARRY_RING_SLOT=CARRY_RING_SLOT,
                  ROW_SUM_BY_MMA=ROW_SUM_BY_MMA, P_IN_SMEM=P_IN_SMEM, STAGED_SCORES=STAGED_SCORES,
                  FREEZE_ROW_MAX=FREEZE_ROW_MAX, ROW_MAX_MARGIN=ROW_MAX_MARGIN,
                  PV_GROUPS=(2 if EXTRA_KEYS > 0 else 1) + (1 if ROW_SUM_BY_MMA else 0), TRACE_STEPS=TRACE_STEPS,
                  TRACE_WARPS=TRACE_WARPS, TRACE_ITEM=TRACE_ITEM, TRACE_TILES=TRACE_TILES,
                  K_EMPTY_AT=K_EMPTY_AT, V_EMPTY_AT=V_EMPTY_AT, TURN_AT=TURN_AT, K_READY_AT=K_READY_AT,
                  V_READY_AT=V_READY_AT, TURN_WAIT_AT=TURN_WAIT_AT, HOIST_SMEM_BASE=HOIST_SMEM_BASE,
                  GATE_PV_WAIT=GATE_PV_WAIT, EARLY_EXP_QUARTERS=EARLY_EXP_QUARTERS, MULTICAST=MULTICAST,
                  CROSS_HEAD_PAIRS=CROSS_HEAD_PAIRS,
                  PRODUCER_WARPS=PRODUCER_WARPS_USED, ELEM_BYTES=dtype.primitive_bitwidth // 8, K_RING_AT=K_RING_AT,
                  V_RING_AT=V_RING_AT, K_ARM_AT=K_ARM_AT, V_ARM_AT=V_ARM_AT, UNSYNCED_PRODUCER=PRODUCER_UNSYNCED,
                  Q_BUFS_AT=Q_BUFS_AT, Q_ARM_AT=Q_ARM_AT, Q_EMPTY_AT=Q_EMPTY_AT, RELAY_RELEASE=RELAY_RELEASE,
                  PEER_RELEASE=PEER_RELEASE, K_RELAY_AT=K_RELAY_AT, V_RELAY_AT=V_RELAY_AT, HAS_SOFTCAP=HAS_SOFTCAP,
                  HAS_WINDOW=HAS_WINDOW, PACKED=PACKED, HAS_WINDOW_RIGHT=HAS_WINDOW_RIGHT)

    # Argument tuples are written inline: built in a variable first they lose their
    # constexpr-ness (Gluon 3.6); the constexpr fields of an aggregate (``c``) keep theirs. The
    # default partition is consumer 0; its register budget is what the compiler leaves after the
    # workers' requests.
    if NUM_CONSUMERS == 1:
        gl.warp_specialize([
            (_consumer_partition, (o_desc, lse_ptr, parts, sh, sz, qk_scale_log2, 0, c)),
            (_producer_partition, (q_desc, k_desc, v_desc, k2_desc, v2_desc, q2_desc, sh, sz, c)),
        ], [PRODUCER_WARPS_USED], [PRODUCER_REGS])
    elif NUM_CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer_partition, (o_desc, lse_ptr, parts, sh, sz, qk_scale_log2, 0, c)),
            (_consumer_partition, (o_desc, lse_ptr, parts, sh, sz, qk_scale_log2, 1, c)),
            (_producer_partition, (q_desc, k_desc, v_desc, k2_desc, v2_desc, q2_desc, sh, sz, c)),
        ], [_CONSUMER_WARPS, PRODUCER_WARPS_USED], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer_partition, (o_desc, lse_ptr, parts, sh, sz, qk_scale_log2, 0, c)),
            (_consumer_partition, (o_desc, lse_ptr, parts, sh, sz, qk_scale_log2, 1, c)),
            (_consumer_partition, (o_desc, lse_ptr, parts, sh, sz, qk_scale_log2, 2, c)),
            (_producer_partition, (q_desc, k_desc, v_desc, k2_desc, v2_desc, q2_desc, sh, sz, c)),
        ], [_CONSUMER_WARPS, _CONSUMER_WARPS, PRODUCER_WARPS_USED], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


# --------------------------------------------------------------------------- host


@functools.lru_cache(maxsize=None)
def _smem_layout(dtype: torch.dtype, rows: int, head_dim: int):
    """The shared layout of a [1, rows, 1, head_dim] box, its block shape validated once."""
    validate_block_shape([1, rows, 1, head_dim])
    return gl.NVMMASharedLayout.get_default_for([1, rows, 1, head_dim], _GL_DTYPES[dtype])


def _descriptor(t: torch.Tensor, rows: int, box_dim: int) -> TensorDescriptor:
    """4-D TMA descriptor over ``t`` (B, S, H, D) as it lies in memory, box [1, rows, 1, box_dim]:
    the kernel's head dim, which is D or (a padded head dim) wider — the box's columns past D read
    as zeros and are not written (``kernel_head_dim``).

    Filled in without ``TensorDescriptor.__post_init__``: what it asserts is the box (checked once
    per box by :func:`_smem_layout`) and the tensor's 16-byte base, 16-byte strides and unit last
    stride, which every caller has established with :func:`layout_reason`. Validating six
    descriptors per call cost about 60 µs of host time, more than the kernel at small shapes
    (``test_fast_descriptor_equals_the_validated_one`` pins the fields)."""
    desc = TensorDescriptor.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides = t, list(t.shape), list(t.stride())
    desc.block_shape, desc.padding = [1, rows, 1, box_dim], "zero"
    desc.layout = _smem_layout(t.dtype, rows, box_dim)
    return desc


def _constexprs(cfg: HopperFwdConfig, head_dim: int, causal: bool, scale_positive: bool = True,
                has_softcap: bool = False, head_dim_v: int | None = None, has_window: bool = False,
                packed: bool = False, has_window_right: bool = False) -> dict:
    """The kernel's compile-time arguments: derived from the config, never listed by hand elsewhere.
    A fresh dict each call (the launch edits it) from a per-configuration cache. ``head_dim_v``: the
    kernel's V and O width (``config.kernel_head_dims``), ``head_dim`` when None."""
    return dict(_constexpr_items(cfg, head_dim, bool(causal), bool(scale_positive), bool(has_softcap),
                                 head_dim if head_dim_v is None else head_dim_v, bool(has_window), bool(packed),
                                 bool(has_window_right)))


@functools.lru_cache(maxsize=None)
def _constexpr_items(cfg: HopperFwdConfig, head_dim: int, causal: bool, scale_positive: bool,
                     has_softcap: bool, head_dim_v: int, has_window: bool, packed: bool,
                     has_window_right: bool) -> tuple:
    return tuple(dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=qk_boxes(head_dim)[0], HEAD_DIM_V=head_dim_v,
        HEAD_DIM_TAIL=qk_boxes(head_dim)[1],
        NUM_KV_STAGES=cfg.num_kv_stages,
        NUM_Q_STAGES=cfg.num_q_stages,
        IS_CAUSAL=bool(causal), LPT=cfg.lpt, OVERLAP=cfg.overlap, PINGPONG=cfg.pingpong,
        SCALE_POSITIVE=bool(scale_positive), LATE_RESCALE=cfg.late_rescale, PACK_P=cfg.pack_p,
        RESCALE_THRESHOLD=float(cfg.rescale_threshold), Q_IN_REGISTERS=cfg.q_in_registers,
        WAIT_PV_EARLY=cfg.wait_pv_early, EXP2_FMA_EVERY=cfg.exp2_fma_every, TREE_REDUCE=softmax_reduce_form(cfg),
        SEPARATE_O=cfg.separate_o, O_FROM_REGISTERS=cfg.o_from_registers, DEFER_ROW_SUM=cfg.defer_row_sum,
        NAMED_TURNS=cfg.named_turns,
        EXP_TURNS=cfg.exp_turns,
        SPLIT_TAIL=cfg.split_tail, EXTRA_KEYS=cfg.extra_keys,
        # the hand-out's table has the balanced table's layout: its CTAs' lists are read as theirs
        BALANCED=cfg.balanced or cfg.handout_table, DYNAMIC=cfg.dynamic, HANDOUT_TABLE=cfg.handout_table,
        DRAW_AHEAD=cfg.draw_ahead_steps, ITEM_BARRIER=cfg.handout_barrier,
        STAGGER_KV=cfg.stagger_kv,
        STAGGER_SUBTRACT=cfg.stagger_subtract,
        STAGGER_FROM_ZERO=cfg.stagger_kv and cfg.stagger_from_zero,
        LAG_V_LOADS=cfg.lag_v_loads, LATE_K_RELEASE=cfg.late_k_release, ROW_BOUND_MASK=cfg.row_bound_mask,
        SKIP_EMPTY_ROWS=cfg.skip_empty_rows, MEET_BEFORE_PASS=cfg.meet_before_pass,
        OVERLAP_EPILOGUE=cfg.overlap_epilogue,
        FIRST_MASK_ON_NEED=_first_mask_on_need(cfg, causal, key_tail=True),
        WINDOW_FIRST_MASK_ON_NEED=cfg.window_first_mask_on_need,
        WINDOW_DIAGONAL_ONE_BOUND=cfg.window_diagonal_one_bound,
        FAST_DIVIDE_PRODUCER=cfg.fast_divide_producer, FAST_DIVIDE_CONSUMERS=cfg.fast_divide_consumers,
        THREAD_RELEASE=cfg.thread_release, SKIP_UNSEEN_HALF=cfg.skip_unseen_half,
        MASK_SECOND_HALF=cfg.mask_second_half, SINGLE_KV_LOOP=cfg.single_kv_loop, RESCALE_BY_WARP=cfg.rescale_by_warp,
        CONVERT_BEFORE_RESCALE=cfg.convert_before_rescale, RESCALE_BEFORE_EXP=cfg.rescale_before_exp,
        PRODUCER_WAIT_HINT_NS=cfg.producer_wait_hint_ns,
        CARRY_RING_SLOT=cfg.carry_ring_slot, ROW_SUM_BY_MMA=cfg.row_sum_by_mma, P_IN_SMEM=cfg.p_in_smem,
        STAGED_SCORES=cfg.staged_scores, FREEZE_ROW_MAX=cfg.freeze_row_max,
        FP16_ROW_MAX_MARGIN=float(cfg.fp16_row_max_margin),
        TRACE_STEPS=cfg.trace_steps,
        TRACE_WARPS=cfg.trace_warps, TRACE_ITEM=cfg.trace_item, TRACE_TILES=cfg.trace_tiles,
        # -1: Gluon's own arrivals and waits; 0: an offset the launch fills in (barrier_offsets)
        **{name: 0 if getattr(cfg, switch) else -1 for name, switch in BARRIER_SWITCHES.items()},
        HOIST_SMEM_BASE=cfg.hoist_smem_base, GATE_PV_WAIT=cfg.gate_pv_wait,
        EARLY_EXP_QUARTERS=cfg.early_exp_quarters, MULTICAST=cfg.kv_multicast, CROSS_HEAD_PAIRS=cfg.cross_head_pairs,
        PRODUCER_WARPGROUP=cfg.producer_warpgroup, PRODUCER_UNSYNCED=cfg.producer_unsynced,
        RELAY_RELEASE=cfg.relay_release,
        CONSUMER_REGS=cfg.consumer_regs,
        PRODUCER_REGS=cfg.producer_regs,
        HAS_SOFTCAP=has_softcap,
        HAS_WINDOW=has_window,
        PACKED=packed,
        HAS_WINDOW_RIGHT=has_window_right,
    ).items())


def _first_mask_on_need(cfg: HopperFwdConfig, causal: bool, key_tail: bool) -> bool:
    """The kernel's FIRST_MASK_ON_NEED for one launch. Causal: the config's switch. Non-causal: on
    only for a launch whose keys fill their K/V tiles (no ``key_tail``), which masks no tile and
    builds no branch; a launch with a key tail masks its first tile always, as the loop's one
    masked tile is the last — with the branch instead, ptxas kept per-tile values in local memory
    (census: 184 B on d64's 192-row tile, 12 B on d128's without the split tail)."""
    return cfg.first_mask_on_need and (causal or not key_tail)


def _skip_empty_rows(cfg: HopperFwdConfig, seqlen_q: int, batch_heads: int) -> bool:
    """The kernel's SKIP_EMPTY_ROWS for one launch: the config's switch, except on a ``kv_multicast``
    launch with a pair whose second tile lies wholly past the sequence, so that every consumer of
    its CTA would skip (unless ``meet_before_pass``): an odd count of q-tiles per head, or with
    ``cross_head_pairs`` an odd count in the whole launch (``batch_heads`` columns of them).

    Why: such launches hung on the H200 with the skip — the d64 non-causal default at B8 H32
    S4324 (23 q-tiles) in 3 of 3 runs, the pairing forced at S2048 (11) in 5 of 9 with Gluon's
    producer — and ran clean without it (3 × 1500–2000 calls each, bit-identical); even counts
    ran clean with it (docs/hopper.md, *A pair with a tile past the sequence*). The mechanism that
    fits, derived from the SASS: with every consumer of a CTA passing tiles, no wgmma holds a
    warpgroup's warps together between a turn's wait and thread 0's pass, and the token can
    complete a turn barrier twice before a lagging warp has read it by parity; with
    ``config.meet_before_pass`` the S4324 default ran clean (3 of 3), and every paired default
    carries it since change 51 (d128 B8 H16 S4160 1.0124 / 1.0177 over this rule's build): the rule
    remains for a pair built with it off. Without the skip, an empty warpgroup runs its GEMMs on
    zero rows and stores nothing."""
    tiles = triton.cdiv(seqlen_q, cfg.block_m)
    if cfg.cross_head_pairs:
        tiles *= batch_heads
    pair_has_empty_tile = cfg.kv_multicast and tiles % CLUSTER_CTAS != 0
    return cfg.skip_empty_rows and (cfg.meet_before_pass or not pair_has_empty_tile)


def _strides_reason(name: str, strides, ptr_alignment: int, elem_bytes: int) -> str | None:
    """Why TMA cannot address a (B, S, H, D) tensor with these strides and address alignment."""
    if strides[3] != 1:
        return f"{name}.stride(-1) must be 1 for TMA, got {strides[3]}"
    if any(st <= 0 or (st * elem_bytes) % TMA_ALIGN_BYTES for st in strides[:3]):
        return (f"{name} strides {tuple(strides)} must be positive multiples of "
                f"{TMA_ALIGN_BYTES // elem_bytes} elements for TMA")
    if ptr_alignment % TMA_ALIGN_BYTES:
        return f"{name}.data_ptr() must be {TMA_ALIGN_BYTES}-byte aligned for TMA"
    return None


def layout_reason(*tensors: torch.Tensor, names=("q", "k", "v")) -> str | None:
    """Why TMA cannot address these tensors where they lie, or ``None`` if it can."""
    for name, t in zip(names if len(tensors) > 1 else ("tensor",), tensors):
        if t.dim() != 4:
            return f"{name} must be 4-D (batch, seqlen, heads, head_dim), got {t.dim()}-D"
        address = t.data_ptr()
        reason = _strides_reason(name, t.stride(), address & -address if address else 256, t.element_size())
        if reason is not None:
            return reason
    return None


def window_reason(problem) -> str | None:
    """Why ``hopper.fwd`` cannot run ``problem``'s sliding window, or ``None``. It runs any window
    flash-attn's API takes: a left side bounds each row's first key, a right side moves the
    causal schedule's diagonal (``_window_sides``); a causal problem's right side is the mask's own
    (-1 or 0), as ``flashrung.attention`` keeps it."""
    if not problem.windowed:
        return None
    left, right = problem.window_size
    if problem.causal and right > 0:
        return f"a causal problem's window right side must be -1 or 0 (the mask's), got {tuple(problem.window_size)}"
    return None


@functools.lru_cache(maxsize=4096)
def unsupported_reason(problem) -> str | None:
    """Why ``hopper.fwd`` cannot run ``problem`` (a :class:`flashrung.dispatch.Problem`), or ``None``.

    Pure in the (frozen) problem, so cached: dispatch and :func:`forward` both ask on every call."""
    if problem.device_type != "cuda":
        return f"needs a CUDA tensor, got device {problem.device_type!r}"
    if problem.interpreter:
        return "Gluon kernels do not run under TRITON_INTERPRET=1"
    if problem.capability != (9, 0):
        return f"needs compute capability 9.0 (Hopper, sm_90a), got {problem.capability}"
    if problem.dtype not in _GL_DTYPES:
        return f"needs float16 or bfloat16, got {problem.dtype}"
    try:
        kernel_head_dim(problem.head_dim, problem.head_dim_v)
    except ValueError as e:
        return str(e)
    if problem.heads_kv <= 0 or problem.heads_q % problem.heads_kv:
        return f"heads_q ({problem.heads_q}) must be a multiple of heads_kv ({problem.heads_kv})"
    reason = (score_options_reason(problem, takes_softcap=True, takes_window=True, takes_varlen=True)
              or window_reason(problem))
    if reason is not None:
        return reason
    # Inputs TMA cannot address where they lie go to a kernel that can, visibly, rather than
    # through a hidden copy here.
    elem_bytes = problem.dtype.itemsize
    for name, strides in zip(("q", "k", "v"), problem.strides):
        reason = _strides_reason(name, strides, problem.ptr_alignment, elem_bytes)
        if reason is not None:
            return reason
    return None


# Head dims other than SUPPORTED_HEAD_DIMS, and a v with a head dim of its own, run on the kernel
# of the next compiled head dim up, the extra columns zero-filled by TMA (config.kernel_head_dim),
# whenever hopper.fwd is asked for by name. Automatic dispatch sends such a problem here only once
# its head dim (or its pair (head_dim, head_dim_v)) is listed: its gate on the H200
# (tests/test_hopper.py::test_gate_padded_head_dims, test_gate_value_head_dims) passed and a paired
# timing there put it ahead of portable.fwd, which pads too, but each tensor to the next power of
# two (d32 stays d32 there, d64 here; MLA's 192/128 is 256/128 there, 256/256 here).
# Listed (H200, bf16, 2026-12-05): the gates passed (110 tests, d32/d80/d96/d192 and 192/128,
# 128/64, 64/128); paired over portable.fwd, two fresh processes each, KEEP: d32 B4 H16 S8192
# non-causal 1.117 / 1.116, d96 B2 H16 S16384 non-causal 1.728 / 1.721 and causal 1.916 / 1.906,
# d192 B2 H16 S8192 non-causal 4.889 / 4.892 (h200-compare-padded-*-a42ecb2.json.gz); MLA's 192/128
# B2 H16 S8192 non-causal 3.501 / 3.526 (h200-compare-mla-192-128-s8192-6bf020f.json.gz); d80 B2 H16
# S16384 1.740 / 1.740, 128/64 B4 H16 S8192 1.582 / 1.575, 64/128 1.353 / 1.355, all non-causal
# (h200-compare-padded-d*-3d810b6.json.gz; timed padded, before v took its own width: config.own_value_dim).
PADDED_AUTO_HEAD_DIMS: frozenset[int | tuple[int, int]] = frozenset({32, 80, 96, 192, (192, 128), (128, 64), (64, 128)})
# softcap (softmax.capped) likewise: automatic dispatch sends capped problems here since its gate
# passed on the H200 (tests/test_hopper.py::test_gate_softcap, 60/60, d64/d128/d256, both masks) and
# the paired timing put it ahead of portable.fwd at a cap of 30, KEEP: d128 B4 H16 S8192 non-causal
# 1.381 / 1.380, d64 B4 H32 S8192 causal 1.152 / 1.153 (h200-compare-softcap30-*-a42ecb2.json.gz).
SOFTCAP_AUTO = True
# Sliding windows (either side or both) run here automatically: their gates passed on the H200
# (tests/test_hopper.py::test_gate_window and test_gate_window_right, d64/d128/d256, 2026-12-05),
# and paired over portable.fwd there (bf16 d128 B2 H16 S8192, two fresh processes each, KEEP):
# window (1024, 0) causal 1.850 / 1.860, (256, 256) 1.835 / 1.852 (h200-compare-window-*-03ee57d).
# False sends them back to portable.fwd, saying why.
WINDOW_AUTO = True
# Packed sequences (flash-attn's varlen, ``PACKED``): their gate passed on the H200
# (tests/test_hopper.py::test_gate_packed, 27 passed; flashrung check --packed, 84/84; 2026-12-05).
# Paired over portable.fwd there (bf16 d128 H16, sequences 8192, 4096 x2, 1024 x8, two fresh
# processes each): non-causal KEEP 1.404 / 1.389, so they run here automatically; causal REVERT
# 0.971 / 0.976 (h200-compare-packed-*-03ee57d): the balanced lists priced every sequence as the
# longest (derived makespan 3.8x the even share). Causal packs now draw their tiles at run time
# (config._packed): gated on an H100 (tests/test_hopper.py::test_gate_packed_grids, "dynamic", every
# head dim and mask; 57 passed) and there 1.36x portable.fwd (468.7 against 343.7 TFLOP/s, flashrung
# bench, one run; h100-bench-packed-causal-930178a), so they run here too; beside a window as well
# (PACKED_AUTO_CAUSAL_WINDOWED).
PACKED_AUTO = True
PACKED_AUTO_CAUSAL = True
# Causal packs (and bands) beside a window: gated on the run-time hand-out on an H100
# (test_gate_packed with a window of 100, d64/d128/d256, the tree of dec0b2d) and paired there over
# portable.fwd: bf16 d128 H16, 8192 + 4096 x2 + 1024 x8, window (1024, 0), KEEP 1.532 / 1.510
# (h100-compare-packed-causal-window-1024-58f5923)
PACKED_AUTO_CAUSAL_WINDOWED = True


def _padded_key(problem) -> int | tuple[int, int]:
    """What :data:`PADDED_AUTO_HEAD_DIMS` lists for ``problem``: its head dim, or the pair when v's differs."""
    if problem.head_dim_v == problem.head_dim:
        return problem.head_dim
    return (problem.head_dim, problem.head_dim_v)


def auto_declined_reason(problem) -> str | None:
    """Why automatic dispatch passes over ``hopper.fwd`` for a problem :func:`unsupported_reason`
    accepts (``impl="hopper.fwd"`` still runs it), or ``None``."""
    if problem.varlen and not PACKED_AUTO:
        return ("packed sequences (varlen) run on hopper.fwd only when asked for by name while fwd.PACKED_AUTO is "
                "off; impl='hopper.fwd' runs them")
    causal_launch = launches_causal(problem)
    if problem.varlen and causal_launch and not PACKED_AUTO_CAUSAL:
        return ("causal packed sequences (varlen) run on hopper.fwd only when asked for by name while "
                "fwd.PACKED_AUTO_CAUSAL is off; impl='hopper.fwd' runs them")
    if problem.varlen and causal_launch and problem.windowed and not PACKED_AUTO_CAUSAL_WINDOWED:
        return (f"causal packed sequences (varlen) with window_size {tuple(problem.window_size)} run on hopper.fwd "
                "only when asked for by name while fwd.PACKED_AUTO_CAUSAL_WINDOWED is off; impl='hopper.fwd' runs "
                "them")
    if problem.windowed and not WINDOW_AUTO:
        return (f"window_size {tuple(problem.window_size)} runs on hopper.fwd only when asked for by name while "
                "fwd.WINDOW_AUTO is off; impl='hopper.fwd' runs it")
    if problem.softcap and not SOFTCAP_AUTO:
        return (f"softcap {problem.softcap:g} runs on hopper.fwd only when asked for by name until its gate has "
                "passed on the H200 (tests/test_hopper.py::test_gate_softcap); impl='hopper.fwd' runs it")
    key = _padded_key(problem)
    if key in SUPPORTED_HEAD_DIMS or key in PADDED_AUTO_HEAD_DIMS:
        return None
    what = f"head_dim {key}" if isinstance(key, int) else f"head_dim {key[0]} with head_dim_v {key[1]}"
    listed = ", ".join("/".join(map(str, k)) if isinstance(k, tuple) else str(k)
                       for k in sorted(PADDED_AUTO_HEAD_DIMS, key=lambda k: k if isinstance(k, tuple) else (k, k)))
    return (f"{what} would run padded to {kernel_head_dim(problem.head_dim, problem.head_dim_v)}, which automatic "
            "dispatch picks only for head dims gated and timed against portable.fwd on the H200 "
            f"({listed or 'none yet'}); impl='hopper.fwd' runs it")


def _window_sides(window: tuple[int, int] | None, causal: bool, keys_and_rows: int) -> tuple[int, int, bool]:
    """``(window_left, window_right, causal)`` of a launch: the kernel's run-time sides of ``window``
    (flash-attn's ``(left, right)``, -1 unbounded; None: no window, -1 and 0) and the mask it
    launches. A side past every key (``keys_and_rows``, Sq + Sk) bounds nothing more: clamped, each
    stays an int32, and an unbounded left side is that far. A bounded right side makes the launch
    causal, its diagonal moved ``window_right`` keys right; the causal mask's own right side is 0."""
    if window is None:
        return -1, 0, bool(causal)
    left, right = window
    window_left = min(left, keys_and_rows) if left >= 0 else keys_and_rows
    if causal or right < 0:
        return window_left, 0, bool(causal)
    return window_left, min(right, keys_and_rows), True


class ScheduleKey(NamedTuple):
    """What a balanced grid's table depends on: ``balanced_schedule``'s arguments and the device."""
    num_m_blocks: int
    batch_heads: int
    section: int
    lpt: bool
    seqlen_q: int
    seqlen_k: int
    block_m: int
    kv_tile: int
    causal: bool
    ctas: int
    device: object
    consumer_share: tuple
    pool_share: float
    window_left: int
    window_right: int
    overhead: float


# the balanced grid's tables on the device, by shape and device: 4 bytes per tile and per CTA (16 KiB
# for 32k tokens of 16 heads at d128). Never evicted: a captured CUDA graph keeps the table's
# address, and a freed table would let the allocator hand that memory to something else.
_SCHEDULE_TABLES: dict[ScheduleKey, torch.Tensor] = {}


def partial_tile_share(cfg: HopperFwdConfig, head_dim: int) -> tuple[float, ...]:
    """The balanced schedule's ``consumer_share`` for ``cfg`` at ``head_dim``: the measured shares of
    ``PARTIAL_TILE_COST_SHARE`` with ``balanced_partial_tiles``, else none (every tile estimated
    whole). A tile with no measured shares refuses the switch rather than guess them."""
    if not cfg.balanced_partial_tiles:
        return ()
    share = PARTIAL_TILE_COST_SHARE.get((head_dim, cfg.block_m))
    if share is None:
        raise ValueError(f"{KERNEL_NAME}: balanced_partial_tiles has no measured shares for head_dim {head_dim} with "
                         f"block_m {cfg.block_m} (PARTIAL_TILE_COST_SHARE has {sorted(PARTIAL_TILE_COST_SHARE)})")
    return share


def _schedule_table(num_m_blocks, batch_heads, section, lpt, seqlen_q, seqlen_k, block_m, kv_tile, causal, ctas,
                    device, consumer_share=(), pool_share=0.0, window_left=-1, window_right=0,
                    overhead=TILE_OVERHEAD_KV_TILES) -> torch.Tensor:
    """The balanced grid's table on ``device``, built once per shape (``schedule.balanced_schedule``).

    Building one copies host memory to the device, which a CUDA graph capture cannot record: a
    shape's first call must run before the capture (the usual warm-up does it)."""
    key = ScheduleKey(num_m_blocks, batch_heads, section, lpt, seqlen_q, seqlen_k, block_m, kv_tile, causal, ctas,
                      device, consumer_share, pool_share, window_left, window_right, overhead)
    table = _SCHEDULE_TABLES.get(key)
    if table is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"hopper.fwd: the balanced persistent grid's tile table for this shape (seqlen_q={seqlen_q}, "
                f"seqlen_k={seqlen_k}, {batch_heads} batch x heads) is built on the first call, which a CUDA graph "
                "capture cannot record: call once with this shape before capturing, or pass a config with "
                "balanced=False")
        host = balanced_schedule(num_m_blocks, batch_heads, section, lpt, seqlen_q, seqlen_k, block_m, kv_tile,
                                 causal, ctas, consumer_share, pool_share, window_left, window_right, overhead)
        table = _SCHEDULE_TABLES[key] = torch.tensor(host, dtype=torch.int32, device=device)
    return table


# the balanced tables of packed launches (schedule.packed_schedule), by the pack's lengths and the
# launch: each pack has its own, so the most recent few are kept (a training loop's packs differ from
# call to call; a benchmark's or a server's repeat). A table evicted while a launch still reads it
# goes back to the caching allocator, which reuses it only in that launch's stream order.
_PACKED_TABLES: collections.OrderedDict[tuple, torch.Tensor] = collections.OrderedDict()
PACKED_TABLES_KEPT = 32


def _packed_schedule_table(cu_seqlens, heads_q, num_m_blocks, section, lpt, block_m, kv_tile, causal, ctas, device,
                           consumer_share=(), window_left=-1, window_right=0, handout_items=None,
                           l2_sections=None, pool_share=None, overhead=TILE_OVERHEAD_KV_TILES) -> torch.Tensor:
    """The balanced table of a packed launch (``schedule.packed_schedule``): its tiles with a row,
    priced and dealt by each sequence's own lengths, read from ``cu_seqlens`` on the host as the
    entry point's check reads them (``inputs.host_offsets``: once per tensor and in-place version,
    so a pack reused unchanged finds its table without waiting for the GPU). ``handout_items``: the
    launch's item count, for the run-time hand-out's table instead (``schedule.packed_handout_table``;
    ``pool_share``: its lists, then a pool of that share of the work; None: one listed tile a CTA).
    ``l2_sections``: the tiles in L2 sections (``schedule.PackedSections``; None: heaviest first)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        # the table is chosen by the lengths on the host: a replay with other lengths would walk
        # this capture's table, missing tiles or running past them
        switch = "balanced" if handout_items is None else "handout_table"
        raise RuntimeError(f"hopper.fwd: a packed launch's {switch} table is built from cu_seqlens' values on every "
                           f"call, which a CUDA graph capture cannot record; pass a config with {switch}=False "
                           "(impl='hopper.fwd@handout_table=false' draws every tile of the grid at run time)")
    cu = np.array([host_offsets(name, t) for name, t in zip(("cu_seqlens_q", "cu_seqlens_k"), cu_seqlens)],
                  dtype=np.int64)
    lens = cu[:, 1:] - cu[:, :-1]
    key = (lens.tobytes(), heads_q, num_m_blocks, section, lpt, block_m, kv_tile, causal, ctas, device,
           consumer_share, window_left, window_right, handout_items, l2_sections, pool_share, overhead)
    table = _PACKED_TABLES.get(key)
    if table is None:
        launch = (heads_q, num_m_blocks, section, lpt, block_m, kv_tile, causal, ctas)
        sides = (window_left, window_right)
        host = (packed_schedule(*lens, *launch, consumer_share, *sides, l2_sections, overhead) if handout_items is None
                else packed_handout_table(*lens, *launch, handout_items, consumer_share, *sides, l2_sections,
                                          pool_share, overhead))
        table = _PACKED_TABLES[key] = torch.from_numpy(host).to(device)
    else:
        _PACKED_TABLES.move_to_end(key)
    while len(_PACKED_TABLES) > PACKED_TABLES_KEPT:
        _PACKED_TABLES.popitem(last=False)
    return table


def _packed_sections(cfg: HopperFwdConfig, head_dim: int, head_dim_v: int, elem_bytes: int, heads_q: int,
                     heads_kv: int) -> PackedSections | None:
    """The L2 sections of a packed launch's table (``packed_section_mib`` of K/V; None: 0, off), K/V
    at the widths an unpacked launch's sections count (:func:`_plan`'s ``head_section``)."""
    if not cfg.packed_section_mib:
        return None
    return PackedSections(cfg.packed_section_mib << 20, 2 * ((head_dim + head_dim_v) // 2) * elem_bytes,
                          heads_q // heads_kv)


class StreamWords:
    """Small int32 buffers a launch's kernels leave at zero, one per device and stream: the launches
    of one stream, ordered, share one; launches in two streams may overlap, and each stream has its
    own. A CUDA graph capture records a zero-fill beside a buffer of its own, since the cached
    buffers' contents at replay are not the capture's to know; those are kept because the graph
    keeps their addresses."""

    def __init__(self, words: int):
        self.words = words
        self.by_stream: dict[tuple[int, int], torch.Tensor] = {}
        self.captured: list[torch.Tensor] = []

    def __call__(self, device_index: int) -> torch.Tensor:
        """The buffer of the current stream of device ``device_index``."""
        if torch.cuda.is_current_stream_capturing():
            words = torch.zeros(self.words, dtype=torch.int32, device=device_index)
            self.captured.append(words)
            return words
        # the raw stream handle, as Triton's launcher reads it (no Stream object built on every call)
        key = (device_index, triton_driver.active.get_current_stream(device_index))
        words = self.by_stream.get(key)
        if words is None:
            words = self.by_stream[key] = torch.zeros(self.words, dtype=torch.int32, device=device_index)
        return words


# The dynamic hand-out's counters (schedule.HANDOUT_WORDS): each launch leaves them at zero
# (schedule.handout_finish)
handout_counters = StreamWords(HANDOUT_WORDS)
# freeze_row_max's guard word and the recompute's count beside it: the recompute leaves both 0 (a
# trip reset by its last program)
GUARD_WORDS = 2
guard_word = StreamWords(GUARD_WORDS)


@dataclasses.dataclass(frozen=True)
class _LaunchPlan:
    """Everything a launch derives from its shape and configuration but not from its tensors:
    built once per (configuration, shape, device) by :func:`_plan`."""

    grid: int              # CTAs
    cluster_ctas: int      # CTAs a cluster: 2 with kv_multicast (the schedule's tiles are pairs), else 1
    num_m_blocks: int
    num_tiles: int
    num_items: int
    num_full_tiles: int
    splits: int
    section: int
    ints: tuple            # the kernel's integer arguments, seqlen_q to splits_shift, in order
    constexprs: Mapping[str, Any]
    build: tuple           # what, besides the integers and the tensors, picks the compiled kernel


@functools.lru_cache(maxsize=4096)
def _plan(cfg: HopperFwdConfig, batch: int, seqlen_q: int, seqlen_k: int, heads_q: int, heads_kv: int,
          head_dim: int, elem_bytes: int, causal: bool, scale_positive: bool, sm_count: int | None,
          has_softcap: bool = False, head_dim_v: int | None = None, has_window: bool = False,
          packed: bool = False, has_window_right: bool = False) -> _LaunchPlan:
    """The launch plan of one shape; ``sm_count`` None: a compile-only plan (one CTA per item).
    ``has_softcap``: the launch caps its scores (``HAS_SOFTCAP``; the factors are run-time arguments).
    ``head_dim`` and ``head_dim_v``: the kernel's Q/K and V/O widths (``config.kernel_head_dims``;
    ``head_dim_v`` None: ``head_dim``); the configuration's own tables are the wider one's.
    ``has_window``: the launch has a sliding window's left side (``HAS_WINDOW``; its width a run-time
    argument). ``packed``: packed sequences (``PACKED``): ``batch`` sequences of up to ``seqlen_q`` /
    ``seqlen_k`` rows (the longest), each item bounded by its own; any of them may end inside a K/V
    tile, so the launch is built as one with a key tail. ``has_window_right``: a window's right side
    moves the causal diagonal (``HAS_WINDOW_RIGHT``; its width a run-time argument).

    With ``kv_multicast`` the schedule's tiles are pairs of q-tiles (``num_m_blocks`` counts pairs;
    with ``cross_head_pairs`` it counts q-tiles, and a pair is two consecutive tiles of the launch)
    and its persistent workers are clusters of two; ``grid`` counts CTAs."""
    pair = CLUSTER_CTAS if cfg.kv_multicast else 1
    if cfg.cross_head_pairs:
        num_m_blocks = triton.cdiv(seqlen_q, cfg.block_m)
        num_tiles = triton.cdiv(num_m_blocks * batch * heads_q, pair)
    else:
        num_m_blocks = triton.cdiv(seqlen_q, cfg.block_m * pair)
        num_tiles = num_m_blocks * batch * heads_q
    num_full_tiles, splits = num_tiles, 1
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    row_dim = kernel_head_dim(max(head_dim, head_dim_v))      # the configuration's row (select_config)
    resident = None
    if sm_count is not None:
        resident = sm_count * cfg.resident_ctas_per_sm(head_dim, elem_bytes, head_dim_v) // pair
        if cfg.split_tail:
            fixed = WORK_ITEM_FIXED_KV_TILES[row_dim] if cfg.split_tail_rounds else None
            num_full_tiles, splits = tail_split(num_tiles, resident, triton.cdiv(seqlen_k, cfg.kv_tile), fixed)
    num_items = num_full_tiles + (num_tiles - num_full_tiles) * splits
    if num_items >= 1 << DIVIDEND_BITS:
        # every dividend of the work-item decode is below num_items (schedule.fast_divisor)
        raise ValueError(f"{KERNEL_NAME}: {num_items} work items; the kernel numbers them in int32")
    grid = (min(num_items, resident) if cfg.persistent and resident is not None else num_items) * pair
    # a section wider than every column is one section; clamped, its tile count stays an int32
    # K's and V's bytes a head: their mean width
    section = min(head_section(seqlen_k, heads_q, heads_kv, (head_dim + head_dim_v) // 2, elem_bytes,
                               cfg.l2_section_mib << 20), batch * heads_q)
    if cfg.balanced and cfg.divided_sections and sm_count is not None and not packed and not has_window:
        # no short last section at the end of the balanced lists where the model says it ends them
        # late (a pack's tiles differ by sequence, a window's by its run-time width: neither is
        # priced by the shape alone)
        section = balanced_section(num_m_blocks, batch * heads_q, section, heads_q // heads_kv, cfg.lpt, seqlen_q,
                                   seqlen_k, cfg.block_m, cfg.kv_tile, causal, grid,
                                   partial_tile_share(cfg, row_dim), cfg.tile_overhead_steps)
    ints = (seqlen_q, seqlen_k, *_decode_sizes(heads_q, heads_q // heads_kv, num_m_blocks, batch * heads_q, section),
            num_items, num_full_tiles, *_divisor_args(splits, "tail_splits"))
    constexprs = _constexprs(cfg, head_dim, causal, scale_positive, has_softcap, head_dim_v, has_window, packed,
                             has_window_right)
    if sm_count is not None:
        # a launch without split items runs the kernel without the split-tail code (screening on
        # the H200, B1 H33 S16384 d128, where 32 full rounds leave no tail: that code alone read
        # 0.988)
        constexprs["SPLIT_TAIL"] = splits > 1
    # a windowed item's first tile is cut by the window: masked always
    key_tail = packed or seqlen_k % cfg.kv_tile != 0
    constexprs["FIRST_MASK_ON_NEED"] = _first_mask_on_need(cfg, causal, key_tail=key_tail) and not has_window
    constexprs["SKIP_EMPTY_ROWS"] = _skip_empty_rows(cfg, seqlen_q, batch * heads_q)
    build = (cfg, head_dim, head_dim_v, elem_bytes, causal, scale_positive, has_softcap, has_window, packed,
             has_window_right,
             constexprs["SPLIT_TAIL"],
             constexprs["FIRST_MASK_ON_NEED"], constexprs["SKIP_EMPTY_ROWS"])
    return _LaunchPlan(grid, pair, num_m_blocks, num_tiles, num_items, num_full_tiles, splits, section, ints,
                       types.MappingProxyType(constexprs), build)


# Launches skip JITFunction.run's per-call binding (flashrung.kernels.direct_launch): the key of a
# launch is its plan's build, its integers and its pointers' dtypes and 16-byte alignment — all
# that Triton specializes on (the descriptors' dtype, box and layout follow from the build)
_DIRECT = DirectLaunch(_attn_fwd_kernel)


# False: every launch through JITFunction.run (the reference the direct path is tested against;
# FLASHRUNG_DIRECT_LAUNCH=0, direct_launch.enabled_by_environment)
DIRECT_LAUNCH = enabled_by_environment()


def _launch(q, k, v, out, lse, causal: bool, softmax_scale: float, cfg: HopperFwdConfig, warmup: bool = False,
            trace: torch.Tensor | None = None, softcap: float = 0.0, window: tuple[int, int] | None = None,
            cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None = None, max_seqlens: tuple[int, int] | None = None,
            guard: torch.Tensor | None = None):
    """Launch (or, with ``warmup``, only compile) the kernel on TMA-ready tensors. ``window``: a sliding
    window ``(left, right)`` as flash-attn's, -1 an unbounded side (:func:`forward` has checked it
    against the mask): a bounded right side launches the causal schedule with its diagonal moved that
    many keys right (``_diag_shift``). ``cu_seqlens``
    and ``max_seqlens``: packed sequences (q, k, v, out one batch entry of rows). ``trace``: the
    int32 buffer of :func:`traced_forward` (``cfg.trace_steps > 0`` or ``cfg.trace_tiles > 0``), in the split tail's
    coordinate pointer, which a launch without the split tail never dereferences otherwise, or with
    ``trace_tiles`` on a launch that splits its tail, in the balanced grid's table pointer."""
    batch, seqlen_q, heads_q = q.shape[:3]
    causal_arg = causal      # the caller's (a bounded right side launches the causal schedule)
    # the compiled kernel's widths: Q's and K's tiles have head_dim columns, V's, O's and the
    # workspace rows head_dim_v
    head_dim, head_dim_v = kernel_head_dims(q.shape[3], v.shape[3], cfg)
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    packed = cu_seqlens is not None
    if packed:
        # the kernel's seqlen_q / seqlen_k are the packed rows (LSE's stride); the grid and its
        # plan cover the longest sequence, each item bounded by its own (_sequence)
        packed_rows = (seqlen_q, seqlen_k)
        batch, (seqlen_q, seqlen_k) = cu_seqlens[0].numel() - 1, max_seqlens
    device_index = None if warmup else (q.device.index if q.device.index is not None else torch.cuda.current_device())
    scale = fold_scale(softmax_scale)
    window_left, window_right, causal = _window_sides(window, causal, seqlen_q + seqlen_k)
    plan = _plan(cfg, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, q.element_size(), causal,
                 softmax_scale > 0, None if warmup else _sm_count(device_index), has_softcap=softcap > 0,
                 head_dim_v=head_dim_v, has_window=window is not None, packed=packed,
                 has_window_right=window_right > 0)
    ints = packed_rows + plan.ints[2:] if packed else plan.ints
    if plan.splits > 1:
        # with kv_multicast a pair's split item leaves each CTA's tile its own partials
        part_o, part_lse, coords = tail_workspace((plan.num_items - plan.num_full_tiles) * plan.cluster_ctas,
                                                  (plan.num_tiles - plan.num_full_tiles) * plan.cluster_ctas,
                                                  cfg.block_m, head_dim_v, q.device)
    else:
        # never dereferenced: no work item is a split one (the clock stamps aside: trace.py)
        part_o, part_lse, coords = lse, lse, lse.view(torch.int32) if trace is None else trace
    if (cfg.balanced or cfg.handout_table) and not warmup and packed:
        sched = _packed_schedule_table(cu_seqlens, heads_q, plan.num_m_blocks, plan.section, cfg.lpt, cfg.block_m,
                                       cfg.kv_tile, causal, plan.grid, device_index,
                                       partial_tile_share(cfg, kernel_head_dim(max(head_dim, head_dim_v))),
                                       window_left, window_right, plan.num_items if cfg.handout_table else None,
                                       _packed_sections(cfg, head_dim, head_dim_v, q.element_size(), heads_q, heads_kv),
                                       cfg.dynamic_pool_share if cfg.balanced else None, cfg.tile_overhead_steps)
    elif cfg.balanced and not warmup:
        sched = _schedule_table(plan.num_m_blocks, batch * heads_q, plan.section, cfg.lpt, seqlen_q, seqlen_k,
                                cfg.block_m, cfg.kv_tile, causal, plan.grid, device_index,
                                partial_tile_share(cfg, kernel_head_dim(max(head_dim, head_dim_v))),
                                cfg.dynamic_pool_share, window_left, window_right, cfg.tile_overhead_steps)
    elif trace is not None and plan.splits > 1:
        sched = trace           # the split tail holds the coordinate pointer: the records go here
    else:
        sched = coords          # never dereferenced: the stride needs no table
    # never dereferenced without the dynamic hand-out
    handout = handout_counters(device_index) if cfg.dynamic and not warmup else coords
    # Q's and K's columns as one box, or (split_head_dim) a first box and a tail box after it
    first_cols, tail_cols = qk_boxes(head_dim)
    q_desc = _descriptor(q, ROWS_PER_CONSUMER_WARPGROUP, first_cols)
    k_desc, v_desc = _descriptor(k, cfg.block_n, first_cols), _descriptor(v, cfg.block_n, head_dim_v)
    # never dereferenced without kv_multicast (a compile-only call's stand-in has the maps' type)
    if cfg.kv_multicast:
        if warmup:
            tmaps = lse.view(torch.uint8)
        elif cfg.producer_unsynced:
            tmaps = kv_tensor_maps(k, v, cfg.block_n, q, ROWS_PER_CONSUMER_WARPGROUP)
        else:
            tmaps = kv_tensor_maps(k, v, cfg.block_n)
    else:
        tmaps = lse
    # the frozen row max's guard word: this stream's, which the recompute leaves 0 after a trip, or
    # the caller's (left set for it to read); never dereferenced without freeze_row_max
    own_guard = guard is None
    if cfg.freeze_row_max and not warmup:
        guard = guard_word(device_index) if own_guard else guard
    else:
        guard = coords
    # cu_seqlens and out's base: read only by a packed launch
    pointers = (lse, part_o, part_lse, coords, guard, sched, handout, tmaps, *(cu_seqlens or (coords, coords)), out)
    if tail_cols:
        k2_desc, v2_desc = _descriptor(k, cfg.block_n, tail_cols), v_desc
    elif cfg.extra_keys:
        k2_desc, v2_desc = _descriptor(k, cfg.extra_keys, head_dim), _descriptor(v, cfg.extra_keys, head_dim_v)
    else:
        k2_desc, v2_desc = k_desc, v_desc
    args = (
        q_desc, k_desc, v_desc,
        # K's second box: the tail of its columns (split_head_dim) or a second box of keys
        # (extra_keys, V's too); Q's tail box. The kernel never reads those it has no use for
        k2_desc, v2_desc, _descriptor(q, ROWS_PER_CONSUMER_WARPGROUP, tail_cols) if tail_cols else q_desc,
        _descriptor(out, ROWS_PER_CONSUMER_WARPGROUP, head_dim_v), *pointers, *ints, scale,
        *softcap_factors(softcap, softmax_scale), max(window_left, 0), window_right,
    )
    constexprs = plan.constexprs
    if cfg.asm_arrivals or cfg.asm_waits:
        constexprs = _launch_barrier_offsets(plan.build, q.dtype, args, constexprs, plan.grid)
    if warmup:
        return _attn_fwd_kernel.warmup(*args, **constexprs, num_warps=CONSUMER_WARPS, grid=(plan.grid,))
    if plan.cluster_ctas > 1 and not DIRECT_LAUNCH:
        # clusters of two, which JITFunction.run cannot start (it knows one CTA a program): Triton's
        # binding and launcher, the cluster size its one change
        _DIRECT.through_triton(plan.grid, args, constexprs, CONSUMER_WARPS, plan.cluster_ctas)
    elif plan.cluster_ctas > 1:
        key = (plan.build, q.dtype, plan.ints, tuple((t.dtype, t.data_ptr() % 16 == 0) for t in pointers))
        _DIRECT(plan.grid, key, args, constexprs, CONSUMER_WARPS, cluster_ctas=plan.cluster_ctas)
    elif DIRECT_LAUNCH:
        key = (plan.build, q.dtype, plan.ints, tuple((t.dtype, t.data_ptr() % 16 == 0) for t in pointers))
        _DIRECT(plan.grid, key, args, constexprs, CONSUMER_WARPS)
    else:
        _attn_fwd_kernel[(plan.grid,)](*args, **constexprs, num_warps=CONSUMER_WARPS)
    if plan.splits > 1:
        combine_tail(part_o, part_lse, coords, out, lse, plan.splits, loads_first=cfg.merge_loads_first)
    if cfg.freeze_row_max:
        # the rows the frozen reference overflowed (NaN LSE, _flag_overflow), through the online
        # softmax of portable.fwd; a launch that flagged none pays one small launch reading the word
        recompute_flagged(guard, q, k, v, out, lse, causal_arg, softmax_scale,
                          window_size=window if window is not None else NO_WINDOW, softcap=softcap,
                          cu_seqlens=cu_seqlens, max_seqlens=max_seqlens, reset=own_guard)


def barrier_offsets(compile_with, constexprs) -> dict:
    """``constexprs`` with the shared-memory offsets of an ``asm_arrivals`` / ``asm_waits`` build
    filled in: every ``pipeline.BARRIER_OFFSETS`` name not -1 (0, a placeholder, until now).

    ``compile_with(constexprs)`` compiles the kernel and returns the compiled object (its
    ``asm["ttgir"]``), ``compile_with(constexprs, ttgir_only=True)`` its TTGIR alone;
    ``pipeline.resolve_shared_offsets`` builds twice (the first to TTGIR only) and raises rather than
    return a kernel whose arrivals or waits would land on the wrong barriers.
    """
    return resolve_shared_offsets(compile_with, constexprs, BARRIER_OFFSETS, KERNEL_NAME, allocation_offsets)


# (plan.build, dtype) → the constexprs with their barrier offsets: a TTGIR build and a compile once per build
_ARRIVAL_CONSTEXPRS: dict = {}


def _launch_barrier_offsets(build, dtype, args, constexprs, grid) -> dict:
    key = (build, dtype)
    filled = _ARRIVAL_CONSTEXPRS.get(key)
    if filled is None:
        filled = barrier_offsets(warmup_compiler(_attn_fwd_kernel, *args, num_warps=CONSUMER_WARPS, grid=(grid,)),
                                 constexprs)
        _ARRIVAL_CONSTEXPRS[key] = filled
    return filled


@functools.lru_cache(maxsize=4096)
def _divisor_args(d: int, name: str) -> tuple[int, int, int]:
    """``(d, mul, shift)``: a divisor of the work-item decode and its magic numbers
    (schedule.fast_divisor), once per value."""
    return (d, *fast_divisor(d, name))


@functools.lru_cache(maxsize=4096)
def _decode_sizes(heads_q: int, group: int, num_m_blocks: int, batch_heads: int, section: int) -> tuple:
    """The kernel's arguments from ``heads_q`` to ``per_section_shift`` (``section``: the LPT
    section, at most ``batch_heads`` columns), once per shape."""
    return (*_divisor_args(heads_q, "heads_q"), *_divisor_args(group, "group"),
            *_divisor_args(num_m_blocks, "num_m_blocks"), batch_heads, *_divisor_args(section, "head_section"),
            *_divisor_args(last_section_width(batch_heads, section), "last_section"),
            *fast_divisor(num_m_blocks * section, "per_section"))


def warmup(cfg: HopperFwdConfig, head_dim: int, causal: bool, dtype: torch.dtype, softmax_scale: float = 1.0,
           head_dim_v: int | None = None):
    """Compile (into Triton's cache) what :func:`forward` will run for this configuration, without
    launching: the sizes are runtime arguments, so one compile serves every shape — two for a
    ``kv_multicast`` configuration, whose launches with a pair past the sequence (an odd count of
    q-tiles a head, or with ``cross_head_pairs`` in the launch) build without the skip of empty
    rows (:func:`_skip_empty_rows`); the build of even counts is returned. Needs a
    CUDA driver (the target is queried from it); the tensors stay on the CPU. A padded head dim
    compiles its kernel's (``kernel_head_dims``); ``head_dim_v``: v's own, when it differs."""
    head_dim, head_dim_v = kernel_head_dims(head_dim, head_dim_v, cfg)
    cfg.check(head_dim, torch.empty((), dtype=dtype).element_size(), head_dim_v)
    k = torch.empty((1, cfg.block_n, 1, head_dim), dtype=dtype)
    v = torch.empty((1, cfg.block_n, 1, head_dim_v), dtype=dtype)
    compiled = None
    for tiles in ((1, CLUSTER_CTAS) if cfg.kv_multicast else (1,)):
        q = torch.empty((1, tiles * cfg.block_m, 1, head_dim), dtype=dtype)
        out = torch.empty((1, tiles * cfg.block_m, 1, head_dim_v), dtype=dtype)
        lse = torch.empty((1, 1, tiles * cfg.block_m), dtype=torch.float32)
        compiled = _launch(q, k, v, out, lse, causal, softmax_scale, cfg, warmup=True)
    return compiled


def cluster_occupancy(cfg: HopperFwdConfig, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Clusters of two CTAs of ``cfg``'s kernel (``kv_multicast``) the current GPU holds at once
    (``cuOccupancyMaxActiveClusters`` on the compiled kernel): the persistent grid assumes one per
    two SMs."""
    if not cfg.kv_multicast:
        raise ValueError("cluster_occupancy asks about kv_multicast's clusters; got kv_multicast=False")
    kernel = warmup(cfg, head_dim, False, dtype)
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    kernel._init_handles()
    warps, _, shared = kernel.packed_metadata
    return max_active_clusters(kernel.function, warps * 32, shared, _sm_count(torch.cuda.current_device()) // 2)


# dispatch hands forward the Problem it built (flashrung.api): building it again cost a few µs of
# host time per call
FORWARD_TAKES_PROBLEM = True


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float,
            config: HopperFwdConfig | None = None, *, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None, problem=None, softcap: float = 0.0,
            window_size: tuple[int, int] = NO_WINDOW, cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None = None,
            max_seqlens: tuple[int, int] | None = None, _trace: torch.Tensor | None = None,
            _guard: torch.Tensor | None = None):
    """Attention forward on sm_90a.

    q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) → out (B, Sq, Hq, Dv), lse (B, Hq, Sq) fp32
    natural log.
    ``config`` overrides :func:`select_config` (for ablations). ``out``/``lse`` are written in
    place when given (``lse`` contiguous; ``out`` with strides TMA can take). Inputs TMA cannot
    address where they lie (see :func:`layout_reason`) raise, as :func:`unsupported_reason` says
    (dispatch sends them to a kernel that can, visibly). ``problem``: the
    :class:`flashrung.dispatch.Problem` of exactly these ``(q, k, v, causal)``, when the caller
    has built it from tensors it validated (``flashrung.api`` does); forward then skips its own
    argument checks. ``softcap`` > 0: flash-attn's ``softcap · tanh(scores / softcap)`` on the
    scaled scores (:func:`softmax.capped`), with a positive ``softmax_scale``. ``window_size``:
    flash-attn's sliding window, its left side (``(left, -1)``, or with ``causal`` ``(left, 0)``; a
    right side of its own runs on ``portable.fwd``), bottom-right aligned as the causal mask.

    Packed sequences (flash-attn's varlen): ``cu_seqlens`` = (cu_seqlens_q, cu_seqlens_k), int32
    cumulative lengths of B + 1 entries, and ``max_seqlens`` = (max_seqlen_q, max_seqlen_k); q, k, v,
    out are then (1, rows, heads, dim) and lse (1, Hq, rows of q), as ``portable.fwd`` takes them.
    Each sequence is its own problem (its causal diagonal and window bottom-right aligned on its own
    lengths); the grid covers the longest.

    ``_guard``: with ``freeze_row_max``, the int32 word its guard sets when a row overflowed and was
    recomputed (:func:`_flag_overflow`), for a caller that asks whether it did; otherwise the
    launch allocates its own.
    """
    softcap = check_softcap(softcap)
    window_size = tuple(window_size)
    packed = cu_seqlens is not None
    if packed != (max_seqlens is not None):
        raise ValueError(f"{KERNEL_NAME}: cu_seqlens and max_seqlens describe packed sequences together; got "
                         f"cu_seqlens {'without' if packed else 'None with'} max_seqlens")
    if problem is None:
        # a caller that hands its Problem over (dispatch) has validated the tensors already; a
        # direct call gets the same structural checks as flashrung.attention (flashrung.inputs),
        # and unsupported_reason below names what this kernel cannot run
        from flashrung.dispatch import Problem
        from flashrung.inputs import check_qkv

        check_qkv(q, k, v)
        if packed:
            from flashrung.api import check_packed

            check_packed(q, k, cu_seqlens, max_seqlens)
            problem = Problem.of_packed(q, k, v, causal, cu_seqlens[0].numel() - 1, tuple(max_seqlens),
                                        window_size=window_size, softcap=softcap)
        else:
            problem = Problem.of(q, k, v, causal, window_size=window_size, softcap=softcap)
    elif problem.varlen != packed:
        raise ValueError(f"{KERNEL_NAME}: the problem {'is' if problem.varlen else 'is not'} one of packed sequences "
                         f"but cu_seqlens is {'None' if not packed else 'given'}")
    elif bool(problem.causal) != bool(causal):
        raise ValueError(f"{KERNEL_NAME}: causal={bool(causal)} is not the problem's ({bool(problem.causal)})")
    elif problem.softcap != softcap:
        raise ValueError(f"{KERNEL_NAME}: softcap {softcap:g} is not the problem's ({problem.softcap:g})")
    elif tuple(problem.window_size) != window_size:
        raise ValueError(f"{KERNEL_NAME}: window_size {window_size} is not the problem's ({problem.window_size})")
    cfg = _default_config(problem) if config is None else _checked_config(problem, config)
    if bool(cfg.trace_steps or cfg.trace_tiles) != (_trace is not None):
        raise ValueError(f"{KERNEL_NAME}: a config with trace_steps > 0 or trace_tiles > 0 runs through "
                         f"traced_forward, which allocates its stamps; got trace_steps={cfg.trace_steps}, "
                         f"trace_tiles={cfg.trace_tiles}")
    if _guard is not None and not cfg.freeze_row_max:
        raise ValueError(f"{KERNEL_NAME}: _guard is the word of freeze_row_max's guard; this config runs without it")
    if _guard is not None:
        check_guard(_guard, q.device, f"{KERNEL_NAME}: _guard")
    softmax_scale = float(softmax_scale)
    if softcap and not softmax_scale > 0:
        raise ValueError(f"{KERNEL_NAME}: softcap needs a positive softmax_scale, got {softmax_scale:g}")

    batch, seqlen_q, heads_q = q.shape[:3]
    seqlen_k = k.shape[1]
    out_shape = (batch, seqlen_q, heads_q, v.shape[3])
    if out is None:
        out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    elif out.shape != out_shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must be {out_shape} {q.dtype} on {q.device}, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    elif layout_reason(out) is not None:
        raise ValueError(f"out cannot be written by TMA: {layout_reason(out)}")
    if lse is None:
        lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    elif lse.shape != (batch, heads_q, seqlen_q) or lse.dtype != torch.float32 or not lse.is_contiguous() \
            or lse.device != q.device:
        raise ValueError(f"lse must be a contiguous ({batch}, {heads_q}, {seqlen_q}) float32 tensor on {q.device}")
    if batch == 0 or seqlen_q == 0 or heads_q == 0:
        return out, lse
    if seqlen_k == 0:            # no key at all: every row is empty
        return out.zero_(), lse.fill_(float("-inf"))

    packing = {"cu_seqlens": tuple(cu_seqlens), "max_seqlens": tuple(max_seqlens)} if packed else {}
    if q.device.index == torch.cuda.current_device():
        _launch(q, k, v, out, lse, causal, softmax_scale, cfg, trace=_trace, softcap=softcap,
                window=window_size if problem.windowed else None, guard=_guard, **packing)
    else:
        with torch.cuda.device(q.device):      # Triton launches on the current device
            _launch(q, k, v, out, lse, causal, softmax_scale, cfg, trace=_trace, softcap=softcap,
                    window=window_size if problem.windowed else None, guard=_guard, **packing)
    return out, lse


def _checked_config(problem, cfg: HopperFwdConfig | None) -> HopperFwdConfig:
    """``cfg`` (None: :func:`select_config`'s) checked against ``problem``: this kernel runs the
    problem, the configuration builds at its head dims and element size, and none of its switches
    clashes with the problem's window, packing or mask. Raises ``ValueError`` naming what fails."""
    reason = unsupported_reason(problem)
    if reason is not None:
        raise ValueError(f"{KERNEL_NAME} cannot run this problem: {reason}")
    cfg = select_config(problem) if cfg is None else cfg
    _check(cfg, *kernel_head_dims(problem.head_dim, problem.head_dim_v, cfg), problem.dtype.itemsize)
    if problem.windowed:
        clashes = window_clashes(cfg)
        if clashes:
            raise ValueError(f"{KERNEL_NAME}: a sliding window runs without {', '.join(clashes)} (they assume whole or "
                             "diagonal K/V ranges); select_config's windowed default leaves them off")
    if problem.varlen:
        clashes = packed_clashes(cfg)
        if clashes:
            raise ValueError(f"{KERNEL_NAME}: packed sequences run without {', '.join(clashes)} (they share K/V ranges "
                             "or split them across the launch); select_config's packed default leaves them off")
        if cfg.balanced and cfg.dynamic_pool_share and not cfg.handout_table:
            raise ValueError(f"{KERNEL_NAME}: a packed launch's balanced lists hold only its tiles with a row, so a "
                             "run-time pool over the grid's ids would draw ids the lists leave out: packed sequences "
                             "draw their pool through the table (handout_table=True) or run dynamic_pool_share=0, "
                             f"got dynamic_pool_share={cfg.dynamic_pool_share}")
    elif cfg.handout_table:
        raise ValueError(f"{KERNEL_NAME}: handout_table draws a pack's tiles with a row: it needs packed sequences "
                         "(cu_seqlens); a launch of whole sequences draws every tile of its grid with "
                         "handout_table=False")
    if cfg.split_tail and problem.causal:
        raise ValueError(f"{KERNEL_NAME}: split_tail applies to non-causal problems (a causal grid runs "
                         "heaviest first and already ends on its lightest tiles); got causal=True")
    if cfg.kv_multicast and problem.causal:
        raise ValueError(f"{KERNEL_NAME}: kv_multicast applies to non-causal problems (the two q-tiles of a cluster "
                         "must read the same K/V tiles; causal ones end at different keys); got causal=True")
    return cfg


@functools.lru_cache(maxsize=4096)
def _default_config(problem) -> HopperFwdConfig:
    """:func:`_checked_config` of the default configuration, once per problem: a call without a
    configuration of its own pays one lookup of its ``Problem`` (about 2 µs on this project's CPU)
    where selecting and checking took 7-9 µs (a failing check raises every time: nothing is cached)"""
    return _checked_config(problem, None)


def traced_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float,
                config: HopperFwdConfig, window_size: tuple[int, int] = NO_WINDOW,
                cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None = None,
                max_seqlens: tuple[int, int] | None = None) -> _LaunchPlan:
    """The launch plan :func:`_launch` makes for :func:`traced_forward`'s call (no cap; a window's
    right side launches the causal schedule; ``cu_seqlens`` and ``max_seqlens``: packed sequences,
    the grid sized for the longest), ``config`` checked at the kernel's widths: the grid its stamps
    are sized for, and the split tail's items a probe reports."""
    from flashrung.dispatch import Problem

    packed = cu_seqlens is not None
    if packed:
        batch, (seqlen_q, seqlen_k) = cu_seqlens[0].numel() - 1, tuple(max_seqlens)
        problem = Problem.of_packed(q, k, v, causal, batch, (seqlen_q, seqlen_k), window_size=tuple(window_size))
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        problem = Problem.of(q, k, v, causal, window_size=tuple(window_size))
    head_dim, head_dim_v = kernel_head_dims(problem.head_dim, problem.head_dim_v, config)
    config.check(head_dim, q.element_size(), head_dim_v)
    heads_q = q.shape[2]
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    window = problem.window_size if problem.windowed else None
    _, window_right, launch_causal = _window_sides(window, causal, seqlen_q + seqlen_k)
    return _plan(config, batch, seqlen_q, seqlen_k, heads_q, k.shape[2], head_dim, q.element_size(), launch_causal,
                 float(softmax_scale) > 0, _sm_count(device_index), head_dim_v=head_dim_v,
                 has_window=window is not None, packed=packed, has_window_right=window_right > 0)


def traced_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float,
                   config: HopperFwdConfig, *, window_size: tuple[int, int] = NO_WINDOW,
                   cu_seqlens: tuple[torch.Tensor, torch.Tensor] | None = None,
                   max_seqlens: tuple[int, int] | None = None):
    """:func:`forward` with ``config.trace_steps > 0`` or ``config.trace_tiles > 0``: ``(out, lse,
    stamps)``. With ``trace_steps``, ``stamps`` is int32 ``[CTAs, consumer warpgroups, trace_steps,
    len(trace.EVENTS)]`` (``[..., trace_steps, trace.WARPS_PER_WARPGROUP, len(trace.EVENTS)]`` with
    ``trace_warps``: each warp's own stamps): the SM clock (shifted right by ``trace.CLOCK_SHIFT``) at each event of each
    overlapped K/V step of every CTA's first work item (steps counted from the item's first K/V
    tile, whose peeled step is not stamped: row 0 stays -1, as do steps past the item's last). With
    ``trace_tiles``, int32 ``[CTAs, consumer warpgroups, trace_tiles, len(trace.TILE_FIELDS)]``:
    each of the CTA's first work items' start and end stamps, K/V steps and masked steps (-1 for
    items the CTA does not have). ``window_size``: a sliding window, and ``cu_seqlens`` /
    ``max_seqlens`` packed sequences, as :func:`forward` takes them (the stamps are sized for that
    launch's grid)."""
    if (config.trace_steps > 0) == (config.trace_tiles > 0):
        raise ValueError("traced_forward needs exactly one of config.trace_steps > 0 and config.trace_tiles > 0, "
                         f"got trace_steps={config.trace_steps}, trace_tiles={config.trace_tiles}")
    window_size = tuple(window_size)
    plan = traced_plan(q, k, v, causal, softmax_scale, config, window_size, cu_seqlens, max_seqlens)
    if config.trace_steps:
        record = (config.trace_steps, WARPS_PER_WARPGROUP, NUM_EVENTS) if config.trace_warps else \
            (config.trace_steps, NUM_EVENTS)
    else:
        record = (config.trace_tiles, NUM_TILE_FIELDS)
    stamps = torch.full((plan.grid, config.num_consumers, *record), -1, dtype=torch.int32, device=q.device)
    out, lse = forward(q, k, v, causal, softmax_scale, config, window_size=window_size, cu_seqlens=cu_seqlens,
                       max_seqlens=max_seqlens, _trace=stamps)
    return out, lse, stamps


@functools.lru_cache(maxsize=None)
def _check(cfg: HopperFwdConfig, head_dim: int, head_dim_v: int, elem_bytes: int) -> None:
    """``cfg.check`` once per configuration (a failing check raises every time: nothing is cached)."""
    cfg.check(head_dim, elem_bytes, head_dim_v)


# --------------------------------------------------------------------------- census


def census_spec(cfg: HopperFwdConfig, head_dim: int, causal: bool, dtype: torch.dtype = torch.bfloat16,
                key_tail: bool = True, softcap: bool = False, head_dim_v: int | None = None, window: bool = False,
                packed: bool = False, window_right: bool = False):
    """The :class:`CensusSpec` of one configuration (what ``forward`` would compile); ``key_tail``
    False is the build of a launch whose keys fill their K/V tiles (``_first_mask_on_need``);
    ``softcap``: the build of a capped launch; ``head_dim_v``: v's head dim where it differs
    (``config.kernel_head_dims`` gives the widths built); ``window``: the build of a launch with a
    sliding window's left side, with ``window_right`` its right side too (a causal build whose
    diagonal the window moves); ``packed``: of packed sequences (built as with a key tail)."""
    from flashrung.evidence.census import CensusSpec

    t = _SIG_DTYPES[dtype]
    given_v = head_dim_v
    head_dim, head_dim_v = kernel_head_dims(head_dim, head_dim_v, cfg)

    def box(rows, cols):
        return f"tensordesc<{t}[1, {rows}, 1, {cols}],{_smem_layout(dtype, rows, cols)!r}>"

    first_cols, tail_cols = qk_boxes(head_dim)
    box2 = cfg.extra_keys or cfg.block_n
    rows = ROWS_PER_CONSUMER_WARPGROUP
    signature = {
        "q_desc": box(rows, first_cols), "k_desc": box(cfg.block_n, first_cols), "v_desc": box(cfg.block_n, head_dim_v),
        "k2_desc": box(cfg.block_n, tail_cols) if tail_cols else box(box2, head_dim),
        "v2_desc": box(box2, head_dim_v), "q2_desc": box(rows, tail_cols or first_cols),
        "o_desc": box(rows, head_dim_v), "lse_ptr": "*fp32",
        "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "tail_coords_ptr": "*i32", "guard_ptr": "*i32",
        "sched_ptr": "*i32",
        "handout_ptr": "*i32", "kv_tmaps_ptr": "*u8" if cfg.kv_multicast else "*fp32",
        "cu_seqlens_q_ptr": "*i32", "cu_seqlens_k_ptr": "*i32", "out_ptr": f"*{t}",
        **{name: "i32" for name in _SIZE_ARGS}, "qk_scale_log2": "fp32", "softcap_pre": "fp32", "softcap_post": "fp32",
    }
    config = dict(dataclasses.asdict(cfg), head_dim=head_dim, causal=causal, dtype=t, key_tail=key_tail)
    if softcap:
        config["softcap"] = True
    if given_v is not None:
        config["head_dim_v"] = head_dim_v
    if window:
        config["window"] = True
    if window_right:
        config["window_right"] = True
    if packed:
        config["packed"] = True
        key_tail = True
    return CensusSpec(kernel=KERNEL_NAME, config=config, fn=_attn_fwd_kernel, signature=signature,
                      constexprs=dict(_constexprs(cfg, head_dim, causal, has_softcap=softcap, head_dim_v=head_dim_v,
                                                  has_window=window or window_right, packed=packed,
                                                  has_window_right=window_right),
                                      FIRST_MASK_ON_NEED=_first_mask_on_need(cfg, causal, key_tail) and not window
                                      and not window_right),
                      num_warps=CONSUMER_WARPS, gluon=True,
                      arches=("sm_90a",), resolve=barrier_offsets if cfg.asm_arrivals or cfg.asm_waits else None,
                      # as forward launches them: LSE, workspace and table from torch allocations
                      # (a caller's lse at an odd offset compiles without it: the launch key has
                      # each pointer's alignment)
                      aligned=tuple(name for name, kind in signature.items() if kind.startswith("*")))


def config_with(problem, overrides: dict) -> HopperFwdConfig:
    """:func:`select_config` for ``problem`` with ``overrides`` applied (``{"pingpong": "true"}``).

    Values may be strings (as parsed from ``impl="hopper.fwd@pingpong=true,block_n=64"``) or typed.
    Raises ``ValueError`` for an unknown key (listing the valid ones), a value of the wrong type,
    or a combination that does not fit the hardware budgets at ``problem.head_dim``.
    """
    cfg = overridden_config(problem, overrides)
    head_dim, head_dim_v = kernel_head_dims(problem.head_dim, problem.head_dim_v, cfg)
    cfg.check(head_dim, problem.dtype.itemsize, head_dim_v)
    return cfg


def overridden_config(problem, overrides: dict) -> HopperFwdConfig:
    """:func:`select_config` with ``overrides`` parsed and applied, the defaults derived from the
    fields they change carried along (``config.replace_following``); not yet checked. A default
    frozen row max turned off, or set aside for a forced lever it cannot join, takes what it
    brought (``config.FREEZE_ROW_MAX_BRINGS``) with it: the overrides then apply to the online
    step's default, as on a call under the work threshold."""
    from flashrung.dispatch import apply_overrides

    base = select_config(problem)
    given = apply_overrides(KERNEL_NAME, base, overrides)
    changes = {key: getattr(given, key) for key in overrides}
    head_dim = kernel_head_dim(problem.head_dim, problem.head_dim_v)
    out = replace_following(base, head_dim, **changes)
    if base.freeze_row_max and not out.freeze_row_max:
        # the frozen step's companions were priced with it, not without: e.g. FA4's order at d128
        # non-causal S2048-8191 lost to FA3's on the online step (change 35)
        out = replace_following(select_config(problem, frozen_step=False), head_dim, **changes)
    return out


def config_at_scale(problem) -> HopperFwdConfig:
    """The configuration a call of ``problem``'s shape runs once its batch carries the work every rule
    that reads a call's size asks for (``config.FREEZE_ROW_MAX_MIN_FLOP``): :func:`select_config` of
    ``problem`` with its batch entries repeated until it does. Most gate-sized calls are far below
    it and never take the frozen row max and what it brings; ``flashrung check --at-scale`` gates
    this configuration at the case's own size, so the builds a large call runs are gated at the
    envelope's odd shapes (key tails, Sq != Sk, GQA, one row)."""
    import math

    from flashrung.kernels.hopper.config import FREEZE_ROW_MAX_MIN_FLOP, call_flop

    per_entry = call_flop(dataclasses.replace(problem, batch=1))
    batch = max(problem.batch, math.ceil(FREEZE_ROW_MAX_MIN_FLOP / per_entry))
    return select_config(dataclasses.replace(problem, batch=batch))


# default_config's batch and heads: the benchmark suite's rows (32k tokens a batch, 32 heads), work
# enough for every rule that reads the call's size (config.FREEZE_ROW_MAX_MIN_FLOP)
DEFAULT_CONFIG_TOKENS = 32768
DEFAULT_CONFIG_HEADS = 32


def default_config(head_dim: int, causal: bool, seqlen: int = 16384, key_tail: bool = False,
                   dtype: torch.dtype = torch.bfloat16, frozen_step: bool = True) -> HopperFwdConfig:
    """:func:`select_config` for a problem of this head dim, mask, sequence length and dtype (bf16
    unless given), of the benchmark suite's size (``DEFAULT_CONFIG_TOKENS`` a batch,
    ``DEFAULT_CONFIG_HEADS`` heads). ``frozen_step=False``, or a smaller call, gives the online
    step's default: the configuration without ``freeze_row_max`` and what it brings
    (``config.FREEZE_ROW_MAX_BRINGS``).
    The length picks the host-side grid (``persistent``) and, for short causal problems,
    d64's tile and d128's schedule (``config.SHORT_CAUSAL_MAX_SEQLEN``); the default length is a
    long one. ``key_tail``: a problem whose keys end one short of ``seqlen`` (its last K/V tile
    partial), which some rules tell apart (``config.ASM_ARRIVALS_WHOLE_KEY_TILES``)."""
    from flashrung.dispatch import Problem

    if key_tail and seqlen < 2:
        raise ValueError(f"default_config: a key tail needs seqlen >= 2 (its keys end at seqlen - 1), got {seqlen}")
    return select_config(Problem(batch=max(1, DEFAULT_CONFIG_TOKENS // seqlen), seqlen_q=seqlen,
                                 seqlen_k=seqlen - 1 if key_tail else seqlen, heads_q=DEFAULT_CONFIG_HEADS,
                                 heads_kv=DEFAULT_CONFIG_HEADS, head_dim=head_dim, head_dim_v=head_dim,
                                 dtype=dtype, causal=causal, device_type="cuda", capability=(9, 0)),
                         frozen_step=frozen_step)


# lengths that between them reach every compiled default (test_census_lengths_reach_every_default_kernel
# checks each 1k step to 64k): 32k (d128's split tail masking its first tile always, the balanced
# causal grids), 8k and 4k (d128 non-causal's split tail in FA4's and FA3's named orders, first tile
# masked on need), 6k (d128 non-causal's FA3 order on the mbarrier token; d128 causal between the two
# Q buffers and the per-warp rescale), 3k (d64 causal's staggered sweeps; non-causal d64 pairs
# from 2k), 4k and 2k (the multiply-high decode with two Q buffers on d64's 192-row tile — at 2k
# non-causal, paired with Gluon's producer — and d128 causal), 2.5k (d64 non-causal's pair on one Q
# buffer before the 4k kernels; d128 non-causal's one Q buffer before the pairing), 1.5k (d128
# causal before the inline arrivals; d64 non-causal's unpaired 192-row tile), 1k
# (the short-causal configurations of d64 and d128, on the balanced lists like every causal d64 and
# d128 problem)
_CENSUS_SEQLENS = (32768, 8192, 6144, 4096, 3072, 2560, 2048, 1536, 1024)


def _census_kernel(cfg: HopperFwdConfig) -> HopperFwdConfig:
    """The configuration as the kernel sees it: ``persistent`` alone is host-side (``balanced`` is
    not: the CTA reads its list)."""
    return dataclasses.replace(cfg, persistent=cfg.balanced)


def census_specs():
    """Every default configuration this module ships: d ∈ {64, 128, 256} × causal × dtype, the
    short-causal ones and the balanced grids; ``persistent`` alone is host-side and does not change
    the kernel (``balanced`` does: the CTA reads its list). A non-causal configuration comes twice:
    built for a launch with a key tail, and for one whose keys fill their K/V tiles (every
    benchmark row), whose first tile is not masked (``_first_mask_on_need``); a paired one comes
    twice more, built for a launch with a pair past the sequence (``_skip_empty_rows``)."""
    specs, seen = [], set()
    dtypes = (torch.float16, torch.bfloat16)
    for d in SUPPORTED_HEAD_DIMS:
        for causal in (False, True):
            for seqlen in _CENSUS_SEQLENS:
                # the online step's default (a call under the work threshold) and the frozen step's,
                # where the length takes it: each built for both dtypes (fp16's frozen build raises
                # its online row max by fp16_row_max_margin)
                for frozen_step in (False, True):
                    cfg = default_config(d, causal, seqlen, frozen_step=frozen_step)
                    kernel = (_census_kernel(cfg), d, causal)
                    if kernel in seen:
                        continue
                    seen.add(kernel)
                    tails = (True, False) if cfg.first_mask_on_need and not causal else (True,)
                    # a paired launch with a pair past the sequence builds its kernel without the
                    # skip of empty rows (_skip_empty_rows); a launch with a key tail runs the
                    # configuration of a problem with one
                    skips = (True, False) if cfg.kv_multicast and cfg.skip_empty_rows else (True,)
                    specs += [census_spec(dataclasses.replace(
                                  default_config(d, causal, seqlen, key_tail, frozen_step=frozen_step) if key_tail
                                  else cfg, skip_empty_rows=skip), d, causal, dtype, key_tail=key_tail)
                              for skip in skips for key_tail in tails for dtype in dtypes]
    return specs
