"""The Hopper forward's frozen configuration and the one function that chooses it.

Every schedule switch of ``hopper.fwd`` is a field of :class:`HopperFwdConfig`; the compile-cache
key is the config itself (``dataclasses.astuple``), never a hand-written list. Budgets (shared
memory, the register file, warpgroup counts) are checked here on the host, so a configuration
that cannot fit fails with a ``ValueError`` before anything is compiled or launched.
"""
from __future__ import annotations

import dataclasses
import functools

# Hardware budgets of sm_90a (seed 001, 0x02).
SMEM_PER_BLOCK_BYTES = 227 * 1024          # opt-in dynamic shared memory per block
SMEM_PER_SM_BYTES = 228 * 1024             # shared memory of one SM, shared by its resident CTAs
REGISTER_FILE_WORDS = 65536                # 32-bit registers per SM
MIN_REGS_PER_THREAD, MAX_REGS_PER_THREAD = 24, 256   # setmaxnreg range, multiples of 8
THREADS_PER_WARPGROUP = 128
ROWS_PER_CONSUMER_WARPGROUP = 64           # one wgmma M atom (m64) per consumer warpgroup
BARRIER_BYTES = 8
ROW_SUM_COLS = 8                           # wgmma's narrowest N: the row-sum accumulator's columns
# The compiler reserves a little shared memory next to our buffers (barriers, alignment);
# keep this margin so the host check errs on the safe side of the 227 KiB ceiling.
SMEM_MARGIN_BYTES = 1024

SUPPORTED_HEAD_DIMS = (64, 128, 256)
# Any other head dim that is a multiple of this runs the kernel compiled for the next supported one
# up (kernel_head_dim): TMA zero-fills the columns past the tensor's own on every load and drops
# them on every store, so the extra columns add 0 to QK and leave O's real columns exact. A row of
# 8 16-bit elements is TMA's 16-byte stride unit.
PADDED_HEAD_DIM_MULTIPLE = 8
# split_head_dim: q's head dim as a box of 128 columns and a tail box of one of these widths (each
# a power of two: a Triton block, and a multiple of wgmma's K of 16), for head dims up to 192
SPLIT_FIRST_BOX_COLS = 128
SPLIT_TAIL_BOX_COLS = (16, 32, 64)
SPLIT_MAX_HEAD_DIM = SPLIT_FIRST_BOX_COLS + SPLIT_TAIL_BOX_COLS[-1]
# Conditional rescaling lets unnormalized probabilities reach 2^τ: τ ≤ 15 keeps them below the
# fp16 maximum (65504) with margin; FA4 uses τ = 8 for 16-bit inputs (seed 001, 0x09).
MAX_RESCALE_THRESHOLD = 15.0
# the τ the defaults run where they skip O's rescale per warp (RESCALE_BY_WARP_MIN_SEQLEN): FA4's
# for 16-bit operands, P ≤ 2^8 = 256 in the PV operand
DEFAULT_RESCALE_THRESHOLD = 8.0
# exp2 split: one emulated exponential in this many (0: every exponential on MUFU); each value is
# one inline-PTX block in softmax.exp2_split
EXP2_FMA_CHOICES = (0, 2, 4, 8, 16)
# K/V MiB of one LPT section unless select_config says otherwise (schedule.L2_BUDGET_BYTES, which
# the ladder keeps); a section larger than MAX_L2_SECTION_MIB cannot stay in any L2 we target
L2_SECTION_MIB = 48
MAX_L2_SECTION_MIB = 1024


@dataclasses.dataclass(frozen=True)
class HopperFwdConfig:
    """One compiled schedule of the Hopper forward.

    ``block_m`` query rows per CTA are split over ``block_m // 64`` consumer warpgroups, each its
    own warp-specialized partition; one extra 1-warp partition issues every TMA load.
    """

    # the hash every host-path cache takes (config._frozen, fwd._check, fwd._plan) is kept in a slot
    # beside the instance's __dict__: over 90 fields it costs 3-4 µs a hash on this project's CPU,
    # three a frozen call; a slot is no field and not in vars(), so HopperFwdConfig(**vars(cfg)),
    # equality, asdict and replace never see it
    __slots__ = ("_fields_hash", "__dict__", "__weakref__")

    block_m: int = 128           # query rows per CTA: 64 × consumer warpgroups (128 → 2, 192 → 3)
    block_n: int = 128           # keys per K/V tile (one ring stage)
    num_kv_stages: int = 2       # depth of the K/V shared-memory ring
    overlap: bool = True         # intra-warpgroup: softmax(j) overlaps PV(j-1) (wait(1)/wait(0))
    pingpong: bool = False       # inter-warpgroup: consumers take turns issuing their GEMMs
    persistent: bool = False     # grid = #SMs, each CTA walks tiles with a stride (host-side only)
    lpt: bool = False            # heaviest-first tile order (reverse m-blocks, L2-sized head sections)
    consumer_regs: int = 240     # per-thread registers of each worker consumer warpgroup
    producer_regs: int = 24      # per-thread registers of the TMA producer warp
    # Levers of the overlapped schedule, off until paired timing on the H200 says otherwise:
    late_rescale: bool = False   # O *= alpha after QK(j+1) is issued, in its shadow (FA3's order)
    pack_p: bool = False         # P → 16 bits two at a time in the accumulator layout (no PRMT repair)
    rescale_threshold: float = 0.0   # > 0: FA4's conditional rescale, τ in log2 units (8.0); 0: always
    # with rescale_threshold: each warp decides on its own 16 rows whether O needs the rescale (one
    # vote.any, no shared memory, no barrier) and skips the multiplies behind one warp-uniform
    # branch over its whole accumulator, inline PTX (FA4's per-warp skip) — where the warpgroup-wide
    # decision pays 2 STS/LDS and 3 bar.sync per step (it lost 1.8-6.4%, unpaired, and 13% paired at d64)
    rescale_by_warp: bool = False
    # P's 16-bit conversions for the next PV issued before O's rescale in the overlapped step, not
    # after it: with rescale_by_warp ptxas keeps them behind the rescale's branch (census)
    convert_before_rescale: bool = False
    # the consumers' K/V ring slot and phase carried through the K/V loop and advanced by an add, a
    # compare and a select (FA4's pipeline state, pipeline.next_ring_slot) instead of recomputed from
    # the ring count as ``count % S`` and ``(count // S) & 1`` twice per step (K(j) and V(j-1)):
    # with d64's three stages that division is a multiply-high and its sign fix-ups on the uniform
    # datapath, 24 UIMAD per steady trip where FA4 has none (ncu, d64). Census (sm_90a): steady trip
    # d64 428 -> 424, d128 causal 479 -> 474, d256 437 -> 419, no local memory (d128 non-causal keeps
    # 16-32 B). Paired on the H200, preheated, t_keep 1.002164: d256 B2 S8192 1.0010 / 1.0029 and
    # causal 1.0004 / 1.0004, d64 B2 H32 S16384 1.0011 / 1.0020 (NULL), d128 causal B2 S16384
    # 1.0080 / 1.0110 (KEEP) but as its default B1 S32768 0.9893 / 0.9941 and B8 S4096 1.0011 /
    # 0.9946 (NULL): off
    carry_ring_slot: bool = False
    # Q loaded once per tile into registers, QK as a register-A wgmma: shared-memory operand
    # traffic drops from Q+K+V to K+V per consumer and K/V tile (−20% at d128), for 64·D/128
    # more registers per thread
    q_in_registers: bool = False
    # FA4's order inside the overlapped step: wait(0) for PV(j-1) right after the row max, so
    # only the max overlaps PV(j-1) and the exponentials overlap the other consumer's GEMMs
    # (which takes pingpong to line up); False: the whole softmax runs under PV(j-1) (FA3)
    wait_pv_early: bool = False
    # FA4's exp2 split (seed 001, 0x09): one exponential in N on the FMA pipe (degree-3
    # polynomial), the rest on MUFU; 0: all on MUFU. N in (2, 4, 8, 16). Off uncapped: each
    # instruction it adds costs a consumer's trip ~2 cycles and the MUFU time it frees nothing
    # (H200, paired, d64 S32k non-causal: 0.978 at N = 16, 0.956 at N = 8; d128 S16k 0.98 at N = 8);
    # capped problems, with two more MUFU operations a score, take it (CAPPED_EXP2_FMA_EVERY)
    exp2_fma_every: int = 0
    # row max and row sum of the softmax as trees (halving inside each thread's registers) rather
    # than Triton's in-thread chain: the same instructions, dependency depth 31 → 5 at N = 128.
    # With FA3's order on d64's 192-row tile (wait_pv_early=False, late_rescale) the trees are what
    # fit P(j-1) into the 160 registers with the K/V pairs and pack_p (one local load a step; 12
    # local loads and stores without them, census); timed there 0.79-0.83 against FA4's order: off
    tree_reduce: bool = False
    # the row max as FA4's four interleaved chains (its sm90 ``fmax_reduce``): each thread folds
    # its scores of a row into four running maxima, one per (register pair, n8-group parity),
    # then two in-thread steps and the quad's shuffles — depth N/16 + 3 instead of N/4 + 1, the
    # row sum left a chain; an alternative to ``tree_reduce``'s halving (not both)
    four_max_chains: bool = False
    # O staged in its own shared buffer instead of Q's: Q is released when the tile's K/V loop is
    # done, before the epilogue (the next tile's Q loads under this tile's epilogue), and the O
    # store is waited only before the buffer is written again (it runs under the next tile's
    # mainloop)
    separate_o: bool = False
    # without O's own buffer (d256, MLA's split: no shared memory left for one), O leaves the
    # registers by plain stores instead of staged in Q's buffer and stored by TMA: Q is released
    # as soon as the tile's K/V loop is done, so the next tile's Q loads under this tile's epilogue
    # instead of after its store has read the buffer (the tile trace: MLA's causal tile pays 3500
    # cycles past one step for its prologue and epilogue, d128's with two Q buffers 1900). Paired
    # on an H100 (MLA causal B2 H16 S8192 bf16): 0.929 / 0.929, REVERT — each thread's 64 four-byte
    # stores cost the consumer more than the Q load they uncover: off
    o_from_registers: bool = False
    # FA4's deferred row sum: l kept as per-thread partials and reduced across the quad once per
    # tile of rows instead of every K/V tile (census: 4 SHFL + 4 FADD fewer per K/V tile); on at
    # d128 (paired margins in _LEVERS), on d64's causal 192-row tile, and at d256 with the per-warp
    # rescale (_RESCALE_BY_WARP_LEVERS); off on d64's other tiles (screening 0.989 at B4 H32 S8192
    # non-causal)
    defer_row_sum: bool = False
    # the pingpong token through hardware named barriers (``bar.sync`` / ``bar.arrive``, FA3's and
    # FA4's warp-scheduler barrier) instead of mbarriers: no polling, no partition-wide sync
    # before an elected arrival
    named_turns: bool = False
    # a second token ring around each overlapped step's exponentials (FA4's order): one consumer
    # warpgroup at a time runs its MUFU block, the others their GEMM issue, row max and waits.
    # Three d64 consumers share each scheduler's MUFU, and the step trace measured their
    # exponentials at 1220-1260 cycles a step against 512 of one warp's own MUFU time
    # (pipeline.wait_exp_turn; hardware named barriers, inline PTX). Measured, lost: paired
    # 0.962 / 0.963 at d64 B2 H32 S16384 non-causal, 0.974 at B8 S4096 — serialized, the phases
    # outlast the period they shared (docs/hopper.md, The exponentials one consumer at a time)
    exp_turns: bool = False
    # the split tail (schedule.tail_split): when the last round of tiles is short, its tiles are
    # split along the keys over every SM and merged by ``tail_combine``; non-causal only (a
    # causal grid runs heaviest first and already ends on its lightest tiles)
    split_tail: bool = False
    # the split tail's count chosen by its modeled length (schedule.tail_split with the work
    # item's fixed cost, WORK_ITEM_FIXED_KV_TILES): the split items may take more than one round,
    # where one round of whole tiles would end later — d256's last round of 68 tiles of 132 in five
    # splits each, three rounds of 26 + 3 K/V step-times against one of 131 (modeled −2.1% at
    # B2 H16 S8192). Host-side only: the kernel splits whatever tiles the launch plan names
    split_tail_rounds: bool = False
    # the split tail's merge with each program's loads issued ahead of its tile's coordinates and
    # every split's O slice in one load (tail_combine, ``loads_first``): three dependent memory
    # latencies a program instead of five. Host-side choice of the merge kernel's variant, read only
    # by a launch that splits its tail; the attention kernel is untouched. Default: the merge alone,
    # paired on the H200 (flashrung.evidence.merge_timing, CUDA graphs of 50 merges, 40
    # alternations), B2 H16 S16384 d128 bf16 (4 tail tiles x 33 splits, the split of every d128
    # non-causal suite row from S4k): 5.99 -> 4.21 us, 1.4258 [p10 1.4239, p90 1.4273]; B16 H16
    # S2048 (x 16 splits) 3.61 -> 3.36 us, 1.0733 (h200-merge-timing-d128-s*-a472f36.json.gz). Gated:
    # test_gate_split_tail_merge_loads_first. On a whole call 0.03-0.1%, under any paired keep
    # threshold: priced on the merge alone, as predicted (about 2 us)
    merge_loads_first: bool = True
    # keys of each K/V tile in a second TMA box and a second wgmma per product, after the first
    # block_n (0: none): the tile holds block_n + extra_keys keys, so the per-tile costs of the
    # softmax (row statistics, O rescale, barrier round trips) spread over more keys. FA3's d128
    # tile has 176 keys, which a Triton block (a power of two) cannot; 128 + 64 = 192 can. With
    # either softmax (the retained reference's decision covers both parts). Paired on the H200 at
    # d128 non-causal with the retained reference in FA4's order: 0.984 / 0.981 at S16k, 0.963 /
    # 0.964 at S8k (REVERT): off
    extra_keys: int = 0
    # the persistent grid's tiles list-scheduled on the host (schedule.balanced_schedule): each CTA
    # walks its own list instead of a stride, so unequal causal tiles spread evenly (modeled
    # makespan ÷ mean at d64 causal B1 H32 S32768: stride 1.045, balanced 1.007)
    balanced: bool = False
    # with balanced: a partial last query tile (Sq not a multiple of block_m) is estimated at the
    # share of a whole tile's cost its consumer warpgroups with rows run (PARTIAL_TILE_COST_SHARE;
    # skip_empty_rows idles the others). Counted whole, such a tile is estimated ~1.5x its cost at
    # d64's 192-row tile with one warpgroup of rows, and the CTAs it lands on run out of work early
    # (tile trace timeline, H200, B8 H32 S4096 causal: 3.95% of the CTAs' time idle at the end;
    # the list schedule re-run with the measured costs: 3.0%, 0.3% with the shares). Host-side
    # only: the table is another permutation of the same tiles, each computed as before
    balanced_partial_tiles: bool = False
    # with balanced: the lists' estimate of a tile's prologue and epilogue (its Q load, the ring's
    # fill, O's store), in K/V steps (schedule.tile_cost). The tile trace reads about three steps
    # at d64's 192-row tile (fixed cost 7,600-8,100 cycles against a 2,560-cycle step, H100) where
    # the estimate says one; host-side only, as above. Repriced at three, the lists' modeled
    # makespan drops 0.4-0.8% at d64 causal S2k-S8k (derived); paired on an H100 (bf16, H32,
    # docs/hopper.md, *Tiles handed out at run time*): B8 S4096 3 steps 0.9998 / 1.0007, 2 steps
    # 0.9997 / 0.9980, B4 S8192 3 steps 0.9978 / 0.9985 — NULL: kept at one
    tile_overhead_steps: float = 1.0
    # with balanced: the LPT section narrowed to one that divides batch x heads within the L2
    # budget where the lists' model ends them sooner (schedule.balanced_section), so no short last
    # section puts heavy tiles at the end of the lists. Host-side only (the section is a run-time
    # argument): same SASS. Changes only problems whose budget's width does not divide the columns
    # — MLA's 192/128 (5 MiB of K/V a head at S8k: sections of 3 of 32 columns, the lists' makespan
    # 1.050x the mean; of 2, 1.0005). Paired on an H100 (MLA causal bf16 H16): B2 S8192 1.0459 /
    # 1.0451, B4 S8192 1.0395 / 1.0410, B8 S4096 1.0323 / 1.0323, KEEP
    divided_sections: bool = True
    # the persistent grid's tiles handed out at run time (schedule.handout_next): each CTA's producer
    # draws its next tile from a counter in the stride's heaviest-first order and hands it to its
    # consumers beside the tile's Q, so the launch ends as evenly as the tiles' real costs allow (the
    # balanced lists end unevenly by what their estimate misses: SM clocks, partial tiles, the L2).
    # One self-resetting counter pair per device and stream (fwd.handout_counters). Paired over the
    # balanced default on the H200 (bf16, causal; docs/hopper.md, *Tiles handed out at run time*):
    # 0.987-1.000 at d128 H16 S4k-S16k, 0.964-0.966 at d64 H32 S4096 (REVERT, one NULL): off
    dynamic_tiles: bool = False
    # with dynamic_tiles, packed sequences only: the hand-out draws from a table of the launch's
    # tiles that hold a row, heaviest first by their own sequence's lengths (schedule.
    # packed_handout_table; each CTA's first tile listed; with balanced and dynamic_pool_share
    # instead of dynamic_tiles, the pack's own lists, then a pool drawn through the table),
    # instead of every id of a grid sized for the longest sequence: on a pack of one long sequence
    # and many short ones most ids are tiles past their sequence's rows, each a draw, a Q load and
    # a consumer's turn that compute nothing (73% of the ids of the pack 8192 + 4096 x2 + 1024 x8 at
    # d128). One load of the table after each draw. The table is built on the host from the
    # lengths, like the balanced lists
    handout_table: bool = False
    # packed sequences only: the table's tiles (handout_table, or the balanced lists of a pack) in
    # L2 sections of this many MiB of K/V by each sequence's own keys, each section heaviest first
    # (schedule.PackedSections); 0: heaviest first across the pack, whose first rounds run the last
    # q-tile of every (sequence, head) column at once, every head's K/V in flight. Host-side only.
    # A pack's default takes PACKED_SECTION_MIB
    packed_section_mib: int = 0
    # with balanced: the launch order's last tiles, up to this share of the estimated work
    # (schedule.pool_start; under LPT the lightest), are left out of the lists and handed out at run
    # time as CTAs finish their lists: the lists keep their look-ahead (the next tile's K and Q
    # loaded under the current one) and the pool absorbs what their estimate misses. 0.0: none.
    # At 0.03, paired over the default (H200, bf16, causal): d128 H16 S4k 1.0035 / 1.0069 (NULL),
    # S8k and S16k 0.993-0.998 (REVERT), d64 H32 S4096 0.996-0.997 (NULL): off
    dynamic_pool_share: float = 0.0
    # with the run-time hand-out (dynamic_tiles or dynamic_pool_share): the producer draws its next
    # tile this many K/V tiles before its current tile's last load (an item shorter than that: after
    # its first tile's loads). 0: after the last load. The draw's atomic returns through the warp's
    # scratch, so the producer waits for it; after the last load that wait delays the next tile's
    # first K and Q, earlier it runs where the producer waits for a free ring slot anyway. Paired on
    # an H100 (bf16, causal, the packs' hand-out, two K/V tiles ahead): d64 H32 8192, 4096 x2,
    # 1024 x8 1.0014 / 1.0003 (NULL), d128 H16 512 x128 0.9977 / 0.9887 (REVERT); the traced fixed
    # cost a tile did not move (docs/hopper.md, *Causal packs: what the draw costs*): off
    draw_ahead_steps: int = 0
    # with the run-time hand-out: each item reaches the consumers on an mbarrier of its own as soon as
    # it is drawn (a ring of Q stages + 1 words a consumer; fwd._post_item), instead of in a word
    # beside its Q that a consumer reads only once that Q has landed: a consumer then reads its next
    # item as it finishes the current one, as it reads a list, and decodes it (its sequence's
    # lengths read from cu_seqlens) while the next Q is on its way. Paired on an H100 (bf16, causal,
    # the packs' hand-out): d64 H32 8192, 4096 x2, 1024 x8 0.9997 / 0.9989, 64 documents 1.0031 /
    # 1.0014, d128 H16 the mixed pack 0.9992 / 0.9990, 512 x128 0.9938 / 0.9923: NULL to REVERT, off
    handout_barrier: bool = False
    # each work item visits its unmasked K/V tiles from its own start and wraps around
    # (schedule.kv_stagger): CTAs that start together on equal tiles of one head (the plain
    # order, the persistent grid) otherwise request the same K/V lines at the same moment
    stagger_kv: bool = False
    # with stagger_kv: the producer wraps each step's K/V tile by one compare and subtract instead of
    # a modulo by the item's run-time tile count (schedule.kv_visit), a division at every step —
    # I2F.RP, MUFU.RCP, F2I and about twenty integer instructions — on the scheduler its warp
    # shares with one warp of every consumer (the step trace's --warps: that warp of each consumer
    # warpgroup runs 80-130 cycles behind its siblings at d64 with the modulo, 34-38 without it, the
    # others 10-18). Default wherever the sweep staggers (change 41). Without stagger_kv
    # there is no sweep to wrap and it changes nothing
    stagger_subtract: bool = False
    # with stagger_kv: only the items whose sweep starts at key 0 stagger it — under a sliding window
    # the items whose rows' windows reach the first key (every unwindowed item does, but a split
    # tail's later parts). The window's tile traces (d64 causal B4 H16 S8192, window 4096, H100) run
    # those items 3-4% more cycles a step than the causal launch, which staggers, on the same loop;
    # the cut items start apart
    # already, and the stagger on every windowed item read 0.995 (WINDOW_STAGGER_KV). Built and
    # census-checked; not yet gated or priced on a GPU. Without stagger_kv it changes nothing
    stagger_from_zero: bool = False
    # K/V bytes (MiB) of the (batch, head) columns the LPT order keeps together (a section of
    # schedule.head_section): the heads that run at once under a causal mask should find their
    # K/V in L2. Host-side only: it picks the tile order, never what a tile computes
    l2_section_mib: int = L2_SECTION_MIB
    # the producer issues V(j) after K(j+1) (FA4's order) instead of right after K(j): the order
    # the overlapped consumer waits in (K(j+1) and V(j) before QK(j+1)), so no V load runs a step
    # ahead of its need. Probes whether loads issued at need line the CTAs' L2 requests up (the L2
    # request coalescer merged 61% of FA4's read sectors at d128 S16k, 11% of ours). Measured on
    # the H200: merged 6.5% against 7.5%, screening 0.981 at d128 S16k non-causal, 0.989 at d64
    # S8k, 1.010 at d128 causal S16k (preheated, not A/A-gated): off
    lag_v_loads: bool = False
    # each consumer releases its K slot after PV(j-1)'s wait, with the V slot, instead of right
    # after QK(j): the producer's next K load issues about a softmax later, so tiles land nearer
    # the moment they are needed. FA4's consumers wait for their tiles (4.4% of their samples on
    # the full barriers at d128 S16k, ours 0.5%), and CTAs released by a tile's arrival stay in
    # step, which the L2 request coalescer rewards (a one-stage ring: 62% of reads merged).
    # Measured on the H200 at d128 B2 H16 S16384 non-causal: merged 10.4% (the default's 8-11%),
    # paired preheated 1.0025 / 0.9998 with AB/BA halves disagreeing (NULL): off
    late_k_release: bool = False
    # masked K/V tiles compare each score's key offset with one bound per row (the key length and
    # the causal diagonal folded with a min: softmax.last_visible_key) instead of two conditions
    # per score. Census (sm_90a, bf16, the masked step of one consumer warp, no local memory in
    # any loop): d128 causal 726-737 -> 609-610 instructions (FSEL 130 -> 66, ISETP 98-105 -> 65),
    # d64 686-696 -> 569-570 on both its tiles, d256 594-595 -> 535-545 (and 64 B of spill outside
    # the loop, where the two compares keep none); short causal d128 16 -> 0 B of spill. On for
    # every causal problem (_LEVERS, with the margins); off here, where the only masked tiles are
    # key tails and one compare per score is all the two-condition mask pays
    row_bound_mask: bool = False
    # a consumer warpgroup whose 64 rows all lie past seqlen_q (the last m-tile of a sequence that
    # is not a multiple of block_m) keeps the barrier protocol and issues no GEMM. d64's 192-row
    # tile leaves one or two of its three consumers idle on the last m-tile at S1024 (5⅓ tiles),
    # S2048, S4096. Paired on the H200 with each block preheated for 150 ms (t_keep 1.002164),
    # bf16, over computing the empty rows: d64 B32 H32 S1024 non-causal 1.0240 / 1.0199, B16 H32
    # S2048 1.0075 / 1.0105, B8 H32 S4096 causal 1.0219 / 1.0175. Predicted 5-8% at S1024 (a
    # sixth of the tiles with two thirds of their GEMMs gone): a lone warpgroup's QK → softmax →
    # PV chain does not fill the tensor cores, so its tile shortens by far less than two thirds.
    # Census: every steady loop within two instructions of computing them, no new local memory.
    # Where every m-tile is full the branch is one compare per tile: on everywhere
    skip_empty_rows: bool = True
    # a passing consumer's four warps meet (bar.sync) between the pingpong turn's wait and its pass,
    # so thread 0 passes a turn that every warp of the warpgroup has read. The hazard it answers
    # (derived from the SASS, not measured): a skipping warpgroup's warps otherwise meet only at the
    # top of each step, and where every consumer of a CTA skips (the second tile of a kv_multicast
    # pair past the sequence) the token can complete a turn barrier twice before a lagging warp has
    # read it by parity, a deadlock. Such launches build without the skip (fwd._skip_empty_rows)
    # unless this is on. On the H200: the d64 default at B8 H32 S4324, which hung 3 of 3 with the
    # skip alone, ran 3 x 2000 calls clean with this on; gated (d64, d128, both pairings, eight
    # shapes) and bit-identical to the build without the skip. Paired over the rule's build
    # (H200, bf16, non-causal, preheated 150 ms): d128 B8 H16 S4160 (33 q-tiles a head, the pair
    # past the end every 17th) 1.0124 / 1.0177 KEEP, d64 B1 H31 S4324 (one such tile in the
    # launch) 1.0012 / 1.0019 NULL. On with every kv_multicast default (change 51): the passing
    # loops gain the meeting, the steady loops are unchanged (census)
    meet_before_pass: bool = False
    # each tile's epilogue (normalization, LSE store, O through shared memory and TMA) runs after
    # the next tile's first QK is issued, under that product: the first QK of a tile is the one
    # GEMM no softmax overlaps, and at S = 1k a tile has 4.5 K/V steps on average (causal), so its
    # prologue and epilogue weigh. Needs the overlapped schedule and O in its own buffer (the
    # next tile's Q lands in the Q buffer while the previous O is still being staged). Census
    # (sm_90a, bf16): no local memory on the short-causal d64 tile (128 rows, 240 registers), its
    # steady loop 427 -> 432 instructions; 16 B of spill on d64's 192-row tile; at d128 the held O
    # spills (92-180 B, local memory in the tile loop). Gated on the H200 (tests/test_hopper.py),
    # then paired with each block preheated 150 ms (t_keep 1.002164), bf16: d64 B32 H32 S1024
    # causal 0.9566 / 0.9594, B16 S2048 causal 0.9705 / 0.9758, B32 S1024 non-causal 0.9713 /
    # 0.9717 — REVERT at all three: off, kept for the record and its gates. Predicted +1-3%; its
    # code is 38% larger (75 -> 104 KiB of SASS on the short-causal d64 kernel, four inlined
    # epilogues per consumer), and why it loses was not profiled
    overlap_epilogue: bool = False
    # the first K/V tile a work item visits is masked only when it needs the mask (the causal
    # diagonal or the key tail: the tile lies at or past num_unmasked), as the loop's tiles are;
    # otherwise its scores go straight to the softmax. Off, that first tile is masked
    # unconditionally: one compare and one select per score (128 per thread at 128 keys) on the
    # first step, the one step no GEMM of the same warpgroup overlaps, on every tile whose first
    # K/V tile is unmasked — 7 of 8 causal tiles at S1k, every non-causal tile without a key tail.
    # A warpgroup-uniform branch, no second copy of the softmax. Paired on the H200 with each
    # block preheated 150 ms, bf16, over masking it always (S1024: B32, H32 at d64, H16 at d128):
    # d64 causal 1.0074 / 1.0163 (t_keep 1.006339, the null at that shape), d64 non-causal
    # 1.0063 / 1.0037, d128 causal 1.0138 / 1.0038 (KEEP, t_keep 1.002164), d128 non-causal
    # 1.0075 / 1.0057 (NULL: run 1's halves disagree). Predicted +1-3% at S1k from the census
    # (about 130 of ~2700 instructions per causal d64 tile), less at longer S; then over the new
    # default, d64 B8 H32 S4096 causal 1.0079 / 1.0079 (KEEP). The K/V loops are unchanged, but
    # on two non-causal kernels ptxas keeps per-tile values in local memory across the branch
    # (census: d64's 192-row tile below S3072 184 B, 23 LDL + 23 STL outside the K/V loops; d128
    # without the split tail 12 B); every causal default keeps none (causal d256's 64 B prologue
    # spill goes too). So a non-causal launch takes it only when its keys fill their K/V tiles,
    # with no branch at all (fwd._first_mask_on_need: no local memory on either kernel, census);
    # one with a key tail masks its first tile always. Paired (preheated, t_keep 1.002164) over
    # masking always, non-causal, no key tail: d64 (H32) B32 S1024 1.0226 / 1.0243, B16 S2048
    # 1.0136 / 1.0137, B8 S4096 1.0138 / 1.0164 (KEEP); d128 (H16) B32 S1024 1.0078 / 1.0096
    # (KEEP), B16 S2048 1.0050 / 1.0017, B8 S4096 1.0006 / 1.0040 (NULL); d256 (H16) B2 S8192
    # 0.9959 / 1.0000, B8 S2048 1.0018 / 0.9974 (NULL). On for every problem but one: the split-tail
    # kernel (d128 non-causal from S16384) lost with it, B2 H16 S16384 0.9935 / 0.9936 (REVERT),
    # though its K/V loops compile to the same code (census: 474 and 675 instructions either way;
    # only the peeled first step differs, 1/128 of the item's tiles) — why is not profiled
    first_mask_on_need: bool = True
    # A sliding window's launch masks its peeled first K/V tile always (FIRST_MASK_ON_NEED is off
    # with a window: the rule above masks by the diagonal alone). With this on, it masks the first
    # tile where the loops would mask it: the window cuts it (before the item's left_unmasked), or
    # the diagonal or the key tail does (from n_unmasked) — a run-time test per item. The window's
    # tile traces (d64 causal B4 H16 S8192, window 4096, H100) carry 4.5-5 k cycles more fixed cost
    # an item than the causal launch's; an uncut item's first tile (key 0) is one of those costs.
    # Without a window it changes nothing
    window_first_mask_on_need: bool = False
    # A sliding window's launch masks the diagonal's run (and the key tail's) by the window's lower
    # bound beside the upper one (softmax.mask_scores_by_bounds: two compares and a select per
    # score). Those tiles lie at or past left_unmasked, where no row's window cuts a key: with this
    # on they are masked by the upper bound alone (mask_scores_by_bound, the causal launch's), the
    # lower bound kept for the tiles the window cuts. Census (sm_90a, bf16, d64 causal 192-row
    # windowed build; docs/hopper.md, *A sliding window*): the diagonal's step 697-732 -> 557-558
    # instructions with both switches (the causal build's 558), the item loop 1186 -> 974, and the
    # 168 B of local memory gone (either switch alone takes it out); d128 causal 759 -> 620, 48 B ->
    # none. Built, gated in tests; not yet priced. Without a window it changes nothing
    window_diagonal_one_bound: bool = False
    # Each work item is decoded into (batch, head, m-block) by dividing by sizes fixed per launch;
    # a 32-bit division by a run-time value compiles to a reciprocal and its corrections (I2F.RP,
    # MUFU.RCP, F2I, IMAD.HI, fix-ups: 15-20 instructions each, in every tile's head). With these the
    # producer / the consumers divide by multiply-high with magic numbers from the host
    # (schedule.fast_divisor). Census (sm_90a, bf16 defaults): the producer's tile head 115-204 ->
    # 48-116 instructions, every K/V loop unchanged; the consumers' tile heads 50-80 instructions
    # shorter, but their decode moves to the uniform datapath and ptxas lays out the K/V loops'
    # uniform registers anew: 5 UMOV more per steady step of every d128 default, 3 moves more at
    # d64's 128-row tile, 1-3 fewer at d64's 192-row tiles, -6..+3 at d256; the split-tail kernel
    # keeps 16 B in local memory. Paired on the H200, preheated, B32 S1024 (t_keep 1.002164), both
    # over neither: d64 causal (the short-causal 128-row tile, H32) 1.0412 / 1.0305 (KEEP; the
    # producer alone 1.0293 / 1.0239), d64 non-causal (H32) 1.0055 / 0.9979, d128 causal (H16)
    # 1.0017 / 1.0059 (NULL). On where tiles have the fewest K/V steps to hide their heads behind:
    # d64's 128-row tiles and, with two Q buffers, d128 and d64's 192-row tile up to S2048-S4096,
    # where together they paid though each alone was NULL (FAST_DIVIDE_MAX_SEQLEN, with the
    # margins); off elsewhere
    fast_divide_producer: bool = False
    fast_divide_consumers: bool = False
    # Q buffers per consumer warpgroup (1 or 2). With one, the producer loads a tile's Q only once
    # the consumers have released the previous tile's (after its last PV), so the next tile's first
    # QK waits out a Q load that only the epilogue overlaps; with two, the producer loads Q(t+1)
    # into the other buffer as soon as it reaches the tile's head, about a ring's depth of K/V
    # steps before tile t ends. Needs O in its own buffer (the epilogue stages O outside the Q
    # ring); costs block_m·D·2 bytes of shared memory more. Census (sm_90a, bf16): every K/V loop
    # within 4 instructions of the one-buffer build, no local memory. Default where it was priced
    # a KEEP (TWO_Q_STAGES_MAX_SEQLEN, with the margins)
    num_q_stages: int = 1
    # every consumer thread releases a K/V slot for itself (pipeline.release: 128 per-thread
    # ``cp.async.mbarrier.arrive.noinc`` arrivals per consumer) instead of one elected arrival,
    # which Gluon 3.6 precedes with a partition-wide ``bar.sync``: the steady K/V step meets the
    # warpgroup's barrier once (before its waits) instead of three times (census). Measured on
    # the H200 at d128 B2 H16 S16384 non-causal: paired preheated 0.9562 / 0.9575 (REVERT); ncu:
    # MIO throttle 0.16 -> 0.32 and dispatch stalls 0.75 -> 0.91 warps per issue — the arrivals
    # cost more in the memory pipe's queue than the barriers they replace: off
    thread_release: bool = False
    # the consumers' elected arrivals (K/V releases, the mbarrier turn) as inline PTX by the
    # partition's thread 0 with no partition-wide ``bar.sync`` before them, as FA3 releases
    # (pipeline.arrive_unsynced). Gluon 3.6 has no such arrive; the PTX names each barrier by its
    # byte offset in shared memory, read from the allocation pass of a first compile
    # (fwd.barrier_offsets)
    asm_arrivals: bool = False
    # the consumers' K/V ready waits and mbarrier turn waits as inline PTX (pipeline.wait_unsynced):
    # Gluon 3.6 puts a partition-wide ``bar.sync`` before the first wait of every K/V step (the
    # same array's wait a step before is a pending access to it); the PTX names each array by its
    # offset as asm_arrivals does. Census (sm_90a, bf16) on top of asm_arrivals: the steady loop meets
    # no bar.sync at d128 non-causal (1 before), two at d128 causal (its named turns; 3 before); alone,
    # without asm_arrivals, it removes none and keeps 16 B in local memory at d128 non-causal S16k.
    # Paired on the H200, preheated (t_keep 1.002164), on top of the default's asm_arrivals: d128
    # non-causal B4 H16 S8192 0.9958 / 0.9936, causal B2 H16 S16384 0.9899 / 0.9937 (REVERT;
    # h200-compare-asm-waits-d128-{full,causal}-s*-8f401a7.json.gz): off
    asm_waits: bool = False
    # with asm_arrivals / asm_waits: the inline PTX takes the shared window's base address as an
    # operand from one pure read of ``global_smem`` (pipeline.smem_base), which LLVM hoists out of
    # the K/V loop, instead of naming ``global_smem`` itself — each side-effecting block then reads
    # it again, an ``S2UR SR_CgaCtaId`` in every step, with asm_waits at the loop's top ahead of its
    # first wait (census)
    hoist_smem_base: bool = False
    # FA4's order (wait_pv_early): PV(j-1)'s wait(0) in a basic block of its own after the row max
    # (pipeline.wait_mma_after_softmax, FA3's order's guard), so ptxas cannot hoist it into the row
    # max's first latency bubble. Census (sm_90a, bf16): on the FA4-order kernels with the mbarrier
    # token ptxas puts that wait 16 instructions after QK's (d64 both masks: PV's wait at trip
    # position 88-89, the row max's FMNMX at 72-206; d128 with the mbarrier token: 127 within
    # 94-231) — the warpgroup stalls on PV(j-1) before its row max; with named turns (d128) and at
    # d256 the wait already follows the row max (266-276 after 218-219; 210-214 after 179-194).
    # Default at d128 non-causal from S16k (GATE_PV_WAIT_MIN_SEQLEN, change 37); paired REVERT at d64
    gate_pv_wait: bool = False
    # FA4's order with the first quarters (1-3 of 4) of a K/V tile's keys exponentiated ahead of
    # PV(j-1)'s wait, their per-thread partial sums passed through the wait's branch
    # (pipeline.wait_mma_after_softmax) so ptxas keeps them there; the rest after it. FA4's d64
    # steady loop (SASS of its profile) waits for PV(j-1) after the whole row max and 12 of its 66
    # MUFU.EX2; ours after 14 of 68 FMNMX and none (and gate_pv_wait's, after the row max and none).
    # Unmasked steps and the masked steps that exponentiate the tile whole; 0: off. Measured, lost:
    # paired at d64 B2 H32 S16384 non-causal, one quarter 0.9880 / 0.9879, half 0.9778 / 0.9780;
    # B8 S4096 one quarter 0.9948 / 0.9944 (REVERT). The step trace: the early exponentials cost
    # the same 17-19 cycles apiece ahead of the wait as behind it (docs/hopper.md, Part of the
    # exponentials ahead of PV's wait)
    early_exp_quarters: int = 0
    # FA4's order with O's rescale right after PV(j-1)'s wait, ahead of the exponentials, not after
    # them. In program order after them ptxas leaves the 32 FMUL (d64) and the row sum's shuffles
    # at the trip's end, after the last MUFU.EX2 and in front of the next GEMM issue, where FA4's d64
    # SASS interleaves its rescale with the exponentials (ncu source pages, B1 H32 S32768 non-causal,
    # H100: a warp's trip 2496 cycles against FA4's 2354, the difference after QK's wait). Off: lost
    # 2.4-3.5% paired at d64 (H100), the multiplies at the end had filled the loop top's wait and ahead
    # of the exponentials they lengthen the shared MUFU's phase (docs/hopper.md, O's rescale ahead of
    # the exponentials)
    rescale_before_exp: bool = False
    # a masked K/V tile whose second half of keys none of a consumer's 64 rows may see skips that
    # half's mask, row max, exponentials and row sum (P there is 0): the first consumer of a
    # 128-row tile on the causal diagonal (its rows end where the tile's 64th key is), and a key
    # tail of at most half a tile. Both products keep their full width (one wgmma each, whose
    # group counts and registers no branch may touch); a warpgroup-uniform branch chooses between
    # the halves' two code paths after the scores are waited for. Census (sm_90a, bf16): no data
    # moved, no local memory, unmasked loops unchanged; the masked loop holds both paths (d64
    # short-causal 568 -> 777 instructions; the half path about 370). Measured faster on d64's
    # short-causal tile from S1025 (change 29), then replaced there by single_kv_loop
    # (SKIP_UNSEEN_HALF_SEQLEN)
    skip_unseen_half: bool = False
    # a masked K/V tile whose first half of keys every one of a consumer's 64 rows sees masks its
    # second half only: the second consumer of a 128-row tile on the causal diagonal (its first
    # row sees the tile's first 64 keys), and a key tail of more than half a tile. The row max,
    # exponentials and row sum still cover the whole tile; only the mask's compares and selects of
    # the first half go. Shares skip_unseen_half's split into halves and its warpgroup-uniform
    # branch after the scores are waited for
    mask_second_half: bool = False
    # the unmasked and the masked K/V steps share one loop, the mask applied behind a
    # warpgroup-uniform branch, instead of two loops each with its own copy of the step: 18-22%
    # less kernel code (census: d64 causal S1k 4632 -> 3696 instructions), no trip longer than
    # the loop it replaces by more than 4 instructions. The lead is
    # the d64 causal S1k profile (instruction-fetch stalls 6.6% of samples against cuDNN's 1.2%,
    # on code fetched once per tile after the K/V loops). Default where it measured faster
    # (SINGLE_KV_LOOP_MAX_SEQLEN: d64 causal up to S2048, +1.8-3.0% paired at S1k)
    single_kv_loop: bool = False
    # the running row sum l on the tensor pipe: beside each PV a second wgmma multiplies the same
    # 16-bit P by a [BLOCK_N, 8] tile of ones in shared memory into a [64, 8] fp32 accumulator
    # (every column the row's sum), rescaled with O by alpha. It takes the row sum's 64 FADDs per
    # thread and K/V tile (and the quad's SHFL/FADD reduction) off the FMA pipe and the issue
    # slots for 8 m64n8k16 wgmmas (1/8 of PV's tensor work at d64, 1/16 at d128) and 4 FMULs.
    # l then sums the rounded P that multiplies V (the normalization matches the weights used).
    # Needs one box of keys (extra_keys=0) and is the deferred sum's alternative, not its partner.
    # Census (sm_90a, bf16): d64 steady trip 428 -> 369, d128 non-causal 490 -> 472 (no local
    # memory; the d128 split-tail kernel keeps 140 B). Paired on the H200 (preheated, t_keep
    # 1.002164): d64 B2 H32 S16384 non-causal 1.0035 / 1.0013, causal 1.0001 / 0.9970 (NULL), B4
    # S8192 causal 1.0036 / 1.0040; d128 B2 H16 S16384 non-causal 0.9220 / 0.9238 (REVERT). ncu at
    # d64: 13.5% fewer instructions executed, issue slots 51% -> 44% busy, cycles +1%: the loop
    # waits on its chain, not on issue. Off
    row_sum_by_mma: bool = False
    # P for PV from shared memory instead of registers (FA3's ``MmaPV_is_RS = false``, its d64
    # non-causal choice): after PV(j-1)'s wait each consumer converts P(j) to 16 bits and stores it
    # in its own [64, kv_tile] buffer, fences it for the tensor pipe and meets its warps; PV(j)
    # reads it from there. P(j-1) then holds no registers while PV(j-1) runs, so FA3's order
    # (softmax(j) under PV(j-1): S, P(j-1) and O live together) fits d64's 160 registers, which
    # spills 416 B with P in registers (census: none with P here). Costs one buffer a consumer, its
    # stmatrix stores, a proxy fence and a warpgroup barrier a K/V step on the chain to PV, and the
    # wgmma reads P from shared memory beside V. Gated on an H100 (74 gates); paired there (bf16,
    # --quick --t-noise 0.001): d64 H32 non-causal B2 S16384 FA3's order 0.809 / 0.810, FA4's order
    # staged 0.804 / 0.797, causal B4 S8192 0.824 / 0.823, B8 S4096 0.822 / 0.822; d128 H16 B2
    # S16384 FA4's order 0.872 / 0.871: REVERT everywhere. Needs one box of keys and the sum on the
    # FMA pipe. Off
    p_in_smem: bool = False
    # with a second box of keys (extra_keys) in FA4's order: QK's two boxes are two wgmma groups
    # that complete in order, so the first box's row max runs between their waits, under the
    # second box's product, instead of after both (unmasked steps; a masked step, a cap or a
    # non-positive scale waits for both as before). The same row max, bit for bit. With two boxes
    # of 64 keys (block_n=64, extra_keys=64: the default's 128-key tile as two QK groups), gated on
    # an H100 (32 gates) and paired there over the default (bf16, --quick --t-noise 0.001): d128
    # H16 B2 S16384 non-causal 0.904 / 0.904 (two boxes unstaged 0.894 / 0.894: the stage wins back
    # 1.1% of a 10.6% loss; the K/V pairs step aside for two boxes), causal 0.927 / 0.926; d64 H32
    # B2 S16384 non-causal 0.866 / 0.868, B4 S8192 causal 0.808 / 0.805. REVERT. Off
    staged_scores: bool = False
    # the unmasked K/V steps of an item keep the row max its first tile set (no row max, no alpha, no
    # O rescale in them; masked steps keep the online rule). Exact while no later score exceeds that
    # max by more than P's range (2^128 in fp32; 2^16 for fp16's PV operand); its guard (fwd._flag_overflow)
    # tests each item's O and l finite at its end, marks a row that is not (NaN LSE, a guard word),
    # and portable.fwd.recompute_flagged rewrites such rows with the online softmax after the launch.
    # The default from FREEZE_ROW_MAX_MIN_SEQLEN (bf16 paired there, +4–13%; fp16 with
    # fp16_row_max_margin, FREEZE_ROW_MAX_DTYPES). Needs FA4's
    # overlapped order (wait_pv_early) without the levers that move the rescale or the max
    # (late_rescale, rescale_before_exp, early_exp_quarters, exp_turns, row_sum_by_mma,
    # staged_scores, single_kv_loop), MUFU's exp2 (exp2_fma_every=0) and no sliding window
    freeze_row_max: bool = False
    # with freeze_row_max on an fp16 call: every online step's row max (the item's first tile, the
    # masked steps) is raised by this many log2 units, so the frozen steps' P reach fp16's 2^16 only
    # on a rise of 16 + margin above the reference instead of 16 (a key 11 natural units above the
    # first tile's max, which ordinary scores reach, overflows without it: a guard trip and the
    # recompute). The cost is P's low end: the first tile's P start at 2^-margin, so those under
    # 2^(margin-14) of the row max fall in fp16's subnormals, each rounded by up to 2^(margin-25) of
    # the max's P — at 8, 2^-17, under fp16's own rounding of the max (2^-12). Below 14, so the
    # max's P stays a normal number. bf16 (fp32's range) takes no margin
    fp16_row_max_margin: float = 8.0
    # an instrument, not a lever: every CTA's first work item stamps the SM clock at the events of
    # its first trace_steps overlapped K/V steps, per consumer warpgroup (hopper/trace.py; read
    # with fwd.traced_forward and `python -m flashrung.evidence.step_trace`). 0: no stamps, the
    # kernel as it is (census: the same SASS)
    trace_steps: int = 0
    # instrument, with trace_steps: each of a consumer warpgroup's four warps stamps its own events
    # (trace.py), so the step trace reads how far apart the warps run — what a warpgroup-wide
    # barrier or wgmma waits out in the warps ahead of the slowest
    trace_warps: bool = False
    # instrument, with trace_steps: which of each CTA's work items is stamped (0: the first). A
    # CTA's first item starts from the launch (and, paired, from the cluster barrier, both CTAs
    # together); a later one shows the steps as the CTA runs once it has settled. A CTA with fewer
    # items stamps nothing (its records stay -1)
    trace_item: int = 0
    # instrument, not a lever: every CTA's first trace_tiles work items stamp the SM clock at each
    # consumer warpgroup's start of the item (before its Q wait) and after its epilogue, beside the
    # item's K/V steps and masked steps (hopper/trace.py, fwd.traced_forward; read by
    # ``python -m flashrung.evidence.tile_trace``): a tile's cost split into a fixed part and its
    # steps'. The same workspace pointer as trace_steps: one or the other. With the split tail the
    # records go to the balanced grid's table pointer (a split-tail launch reads no table), so the
    # last round's split items are recorded too
    trace_tiles: int = 0
    # K/V multicast across a cluster of two CTAs (multicast.py): the CTAs of a cluster take the
    # neighbouring q-tiles 2p and 2p + 1 of one head, and each producer loads half of every K/V
    # tile into both, so each tile leaves L2 once per pair. Non-causal only (the pair's tiles need
    # the same K/V range), on the stride schedule (no balanced lists, no dynamic hand-out, no
    # stagger), with asm_arrivals (a consumer's release is inline PTX that also arrives on the
    # peer's barrier). The producer becomes a whole warpgroup: the cluster barrier at each
    # partition's start waits for every thread, Triton's idle padding warps included
    kv_multicast: bool = False
    # the producer partition as its whole warpgroup (four warps) without kv_multicast, which needs
    # it: the pairing's costs and gains separated — with four warps Gluon's TMA copy of a 256-B-wide
    # row issues its two 128-B column chunks from two warps. Built to price what of kv_multicast's
    # +1.5-1.9% at d128 non-causal S4k-S8k the four-warp producer alone accounts for
    producer_warpgroup: bool = False
    # with kv_multicast: the producer's mbarrier waits and Q copies in inline PTX (Q's from a tensor
    # map, as the K/V halves), so its four warps meet no bar.sync — Gluon fences each of a
    # four-warp partition's waits, expects and copies with one. Its warps 1-3 leaving after the
    # cluster barrier instead (a branch or an exit on the warp's index, or their waits skipped)
    # made ptxas reschedule the consumers' K/V loop (d128 S16k: 495 -> 585 instructions, every
    # exponential after PV's wait: census), so all four keep running the loop and waiting. On by
    # default where it priced KEEP (PRODUCER_UNSYNCED_NONCAUSAL_SEQLEN, changes 44 and 45)
    producer_unsynced: bool = False
    # with producer_unsynced: its inline try_wait carries a suspend-time hint of this many ns (0: none),
    # so a failed try sleeps in NANOSLEEP.SYNCS until the barrier's phase changes instead of re-issuing.
    # Why: outside the consumers' loops the d64 S32k launch executes 0.41 G warp instructions, FA4's
    # 0.16 G, nearly all the producer's try_wait spin, which takes issue slots from the consumers'
    # warps on the same schedulers; FA4 (CUTLASS's barrier wait) sleeps with 10 ms (0x989680). Off: lost
    # 0.2% paired at d64 (S4k, S32k), NULL at d128 S6144 (H100): the wake costs more than the slots
    # return (docs/hopper.md, The producer asleep in its waits)
    producer_wait_hint_ns: int = 0
    # with kv_multicast: the pair's K/V releases relayed by the producers. Each consumer releases
    # its slot in its own CTA only; the producer, once its CTA's consumers have released the slot,
    # arrives on the peer's relay barrier for it and waits for the peer's before refilling — the
    # remote arrival leaves the consumers' K/V loop (two a step, inside the softmax) for the producer,
    # which idles between loads. Why: the paired step traced 3% longer than the unpaired one at d128
    # S4k, the consumers' softmax carrying it, at either clock (step_trace, with and without
    # --preheat-ms). The cost: the refill waits one more hop (the slower CTA's producer wakes and
    # relays) inside the ring's slack. On by default on the d128 pairs from S8k, where it priced
    # KEEP (RELAY_RELEASE_NONCAUSAL_SEQLEN, change 46); NULL at d128 S4k and d64 S16k
    relay_release: bool = False
    # with kv_multicast: a cluster takes two consecutive tiles of the launch's whole (batch, head,
    # m-block) order, not two of one head. Where a head's q-tile count is odd, its last tile pairs
    # with the next head's first, and that pair ("solo") loads its own K/V in each CTA, both halves,
    # without multicast. Why: pairs within a head leave one CTA of the head's last pair without a
    # tile — a CTA's whole K/V loop idle, one in cdiv(Sq, block_m) + 1 (d64 S4324: 23 q-tiles, the
    # pairing read 0.982 over the unpaired kernel there, H200). Needs the plain tile order (the LPT
    # order puts other heads' tiles next to each other). On by default on the d64 pairs
    # (CROSS_HEAD_PAIRS_NONCAUSAL_SEQLEN, change 49)
    cross_head_pairs: bool = False
    # a v with a head dim of its own (MLA's 192/128) compiled at its own width: V's ring, PV's
    # wgmma N, O's accumulator and O's buffer are the next compiled head dim up from v's, Q's and
    # K's from q's (kernel_head_dims), instead of all four at the wider of the two. At 192/128 the
    # products a K/V tile are QK's 256 columns and PV's 128 instead of 256 + 256, and O holds 64
    # fp32 registers per consumer thread instead of 128. Off: every tensor padded to the wider
    # (the build before). A v wider than q's kernel needs O's own buffer (separate_o): O staged in
    # Q's would not fit; without it such a pair runs padded. Off by default until its gate has run on
    # the H200 (tests/test_hopper.py::test_gate_value_head_dims with it on): census only so far
    own_value_dim: bool = False
    # q's head dim between 136 and 192 as two TMA boxes and two wgmma per QK: the first 128 columns
    # and a narrower tail (16, 32 or 64 columns: kernel_head_dims), instead of padding Q and K to 256.
    # At MLA's 192 QK reads 192 columns a key, not 256 (with own_value_dim, 192/128 runs 192/128,
    # FA3's and FA4's build). Both boxes complete the Q and K ready barriers; the tail reuses the
    # second-box descriptors and ring of extra_keys, so the two exclude each other, as do the
    # single-box inline copies (kv_multicast, producer_unsynced) and Q in registers. O must fit the
    # first box (v's width at most 128, or separate_o); otherwise q pads as without the switch. Off
    # by default until its gate has run on the H200: census only so far
    split_head_dim: bool = False

    @property
    def dynamic(self) -> bool:
        """Work items reach the consumers through the producer (the dynamic hand-out, alone or after
        the balanced lists)."""
        return self.dynamic_tiles or (self.balanced and self.dynamic_pool_share > 0)

    @property
    def kv_tile(self) -> int:
        """Keys per K/V tile (one ring stage): ``block_n + extra_keys``."""
        return self.block_n + self.extra_keys

    @property
    def num_consumers(self) -> int:
        return self.block_m // ROWS_PER_CONSUMER_WARPGROUP

    def smem_bytes(self, head_dim: int, elem_bytes: int, head_dim_v: int | None = None) -> int:
        """Shared memory the kernel allocates: Q (also O's staging unless ``separate_o``), the K and V
        rings, barriers. ``head_dim_v``: the kernel's V and O width where it is not ``head_dim``'s
        (``kernel_head_dims``)."""
        head_dim_v = head_dim if head_dim_v is None else head_dim_v
        q = self.num_q_stages * self.block_m * head_dim * elem_bytes
        o = self.block_m * head_dim_v * elem_bytes if self.separate_o else 0
        kv = self.num_kv_stages * self.kv_tile * (head_dim + head_dim_v) * elem_bytes
        # row_sum_by_mma: each consumer's [8, block_n] tile of ones
        ones = self.num_consumers * ROW_SUM_COLS * self.block_n * elem_bytes if self.row_sum_by_mma else 0
        # p_in_smem: each consumer's [64, kv_tile] P
        p = self.num_consumers * ROWS_PER_CONSUMER_WARPGROUP * self.kv_tile * elem_bytes if self.p_in_smem else 0
        # q ready/empty per consumer and Q stage, k/v ready/empty per stage, one turn barrier per
        # consumer
        bars = ((2 * self.num_q_stages + 1) * self.num_consumers + 4 * self.num_kv_stages) * BARRIER_BYTES
        # handout_barrier: a ready barrier per item slot (Q stages + 1) and consumer
        bars += (self.num_q_stages + 1) * self.num_consumers * BARRIER_BYTES if self.handout_barrier else 0
        return q + o + kv + ones + p + bars

    @property
    def register_words(self) -> int:
        """Registers one CTA holds: the ``setmaxnreg`` budgets of the consumers and of the producer's
        warpgroup (its 1 warp is padded to a warpgroup)."""
        return THREADS_PER_WARPGROUP * (self.num_consumers * self.consumer_regs + self.producer_regs)

    def smem_budget_bytes(self, head_dim: int, elem_bytes: int = 2, head_dim_v: int | None = None) -> int:
        """:meth:`smem_bytes` with the margin the compiler's own allocations may take."""
        return self.smem_bytes(head_dim, elem_bytes, head_dim_v) + SMEM_MARGIN_BYTES

    def resident_ctas_per_sm(self, head_dim: int, elem_bytes: int = 2, head_dim_v: int | None = None) -> int:
        """CTAs of this configuration one SM holds at once: the tighter of the register file and
        shared memory."""
        return max(1, min(REGISTER_FILE_WORDS // self.register_words,
                          SMEM_PER_SM_BYTES // self.smem_budget_bytes(head_dim, elem_bytes, head_dim_v)))

    def __hash__(self) -> int:
        try:
            return self._fields_hash
        except AttributeError:
            fields_hash = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_fields_hash", fields_hash)
            return fields_hash

    def __getstate__(self) -> dict:
        # the fields alone: a string's hash differs between processes, so a pickled copy (check's
        # jobs, a shard) hashes itself again
        return self.__dict__

    def check(self, head_dim: int, elem_bytes: int = 2, head_dim_v: int | None = None) -> None:
        """Raise ``ValueError`` if this configuration cannot be built for ``head_dim`` (and
        ``head_dim_v``, the kernel's V and O width, where it is not ``head_dim``'s)."""
        if head_dim not in SUPPORTED_HEAD_DIMS:
            if not self.split_head_dim:
                raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
            qk_boxes(head_dim)
            value = head_dim if head_dim_v is None else head_dim_v
            if value > SPLIT_FIRST_BOX_COLS and not self.separate_o:
                raise ValueError(f"split_head_dim stages O in Q's first box of {SPLIT_FIRST_BOX_COLS} columns: "
                                 f"head_dim_v must be at most that or separate_o on, got {value}")
            clashes = [name for name in ("extra_keys", "q_in_registers", "kv_multicast", "producer_unsynced")
                       if getattr(self, name)]
            if clashes:
                raise ValueError(f"split_head_dim loads Q and K as two boxes each: it excludes {', '.join(clashes)} "
                                 "(the second-box ring, Q's one register operand, the single-box inline copies)")
        if head_dim_v is not None and head_dim_v != head_dim:
            if head_dim_v not in SUPPORTED_HEAD_DIMS:
                raise ValueError(f"head_dim_v must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim_v}")
            if head_dim_v > qk_boxes(head_dim)[0] and not self.separate_o:
                raise ValueError(f"head_dim_v {head_dim_v} wider than head_dim {head_dim} needs separate_o "
                                 "(O is staged in Q's buffer otherwise, which is narrower)")
        if self.block_m % ROWS_PER_CONSUMER_WARPGROUP or not 1 <= self.num_consumers <= 3:
            raise ValueError(f"block_m must be 64, 128 or 192 (64 rows per consumer warpgroup), got {self.block_m}")
        # Triton block shapes (the TMA box) are powers of two; wgmma needs N, K multiples of 16.
        if self.block_n not in (16, 32, 64, 128, 256):
            raise ValueError(f"block_n must be a power of two in [16, 256], got {self.block_n}")
        if self.extra_keys and (self.extra_keys not in (16, 32, 64, 128) or self.extra_keys > self.block_n):
            raise ValueError(f"extra_keys must be 0 or a power of two in [16, block_n] (a TMA box and a wgmma N), "
                             f"got {self.extra_keys} with block_n={self.block_n}")
        if self.four_max_chains and self.tree_reduce:
            raise ValueError("four_max_chains and tree_reduce are two forms of the row max: set at most one")
        if self.extra_keys and self.q_in_registers:
            raise ValueError("extra_keys reads Q from shared memory for its second box: it cannot be combined with "
                             "q_in_registers")
        if not 0 <= self.packed_section_mib <= MAX_L2_SECTION_MIB:
            raise ValueError(f"packed_section_mib must be in [0, {MAX_L2_SECTION_MIB}] (MiB of K/V per section of a "
                             f"pack's table; 0: heaviest first across the pack), got {self.packed_section_mib}")
        if not 1 <= self.l2_section_mib <= MAX_L2_SECTION_MIB:
            raise ValueError(f"l2_section_mib must be in [1, {MAX_L2_SECTION_MIB}] (MiB of K/V per LPT section), "
                             f"got {self.l2_section_mib}")
        if self.num_kv_stages < 1:
            raise ValueError(f"num_kv_stages must be >= 1, got {self.num_kv_stages}")
        if not 0.0 <= self.rescale_threshold <= MAX_RESCALE_THRESHOLD:
            raise ValueError(f"rescale_threshold must be in [0, {MAX_RESCALE_THRESHOLD}] (log2 units; 0 = off), "
                             f"got {self.rescale_threshold}")
        if not self.overlap and (self.late_rescale or self.rescale_threshold > 0 or self.wait_pv_early):
            raise ValueError("late_rescale, rescale_threshold and wait_pv_early are levers of the overlapped "
                             "schedule: they need overlap=True")
        if self.split_tail_rounds and not self.split_tail:
            raise ValueError("split_tail_rounds chooses the split tail's count: it needs split_tail=True")
        if self.balanced and (not self.persistent or self.split_tail):
            raise ValueError("balanced schedules the persistent grid's whole tiles: it needs persistent=True and "
                             "split_tail=False")
        if self.dynamic_tiles and (not self.persistent or self.balanced or self.split_tail or self.overlap_epilogue):
            raise ValueError("dynamic_tiles hands the persistent grid's whole tiles out at run time: it needs "
                             "persistent=True, balanced=False (the host's lists), split_tail=False and "
                             f"overlap_epilogue=False, got persistent={self.persistent}, balanced={self.balanced}, "
                             f"split_tail={self.split_tail}, overlap_epilogue={self.overlap_epilogue}")
        if self.handout_table and not (self.dynamic_tiles or self.balanced and self.dynamic_pool_share > 0):
            raise ValueError("handout_table draws the run-time hand-out's tiles from a table: it needs "
                             "dynamic_tiles=True, or balanced=True with a dynamic_pool_share above 0 (the pack's "
                             f"lists, then a pool), got dynamic_tiles={self.dynamic_tiles}, balanced={self.balanced}, "
                             f"dynamic_pool_share={self.dynamic_pool_share}")
        if not 0.0 <= self.dynamic_pool_share < 1.0 or self.dynamic_pool_share > 0 and (
                not self.balanced or self.overlap_epilogue):
            raise ValueError("dynamic_pool_share leaves a share in [0, 1) of the balanced lists' work to the "
                             "dynamic hand-out: it needs balanced=True and overlap_epilogue=False, got "
                             f"dynamic_pool_share={self.dynamic_pool_share}, balanced={self.balanced}, "
                             f"overlap_epilogue={self.overlap_epilogue}")
        if self.draw_ahead_steps < 0:
            raise ValueError(f"draw_ahead_steps counts K/V tiles: it must be 0 or more, got {self.draw_ahead_steps}")
        for name, value, what in (("draw_ahead_steps", self.draw_ahead_steps, "moves its draw earlier in an item"),
                                  ("handout_barrier", self.handout_barrier,
                                   "hands its items on a barrier of their own")):
            if value and not self.dynamic:
                raise ValueError(f"{name} {what}: it needs the run-time hand-out (dynamic_tiles=True, or "
                                 f"balanced=True with a dynamic_pool_share above 0), got {name}={value}, "
                                 f"dynamic_tiles={self.dynamic_tiles}, dynamic_pool_share={self.dynamic_pool_share}")
        if self.meet_before_pass and not (self.skip_empty_rows and self.pingpong):
            raise ValueError("meet_before_pass makes a consumer that skips its empty rows meet before it passes the "
                             "pingpong turn: it needs skip_empty_rows=True and pingpong=True, got skip_empty_rows="
                             f"{self.skip_empty_rows}, pingpong={self.pingpong}")
        if not 0.0 <= self.tile_overhead_steps <= 64.0:
            raise ValueError(f"tile_overhead_steps estimates a tile's prologue and epilogue in K/V steps: it must be "
                             f"in [0, 64], got {self.tile_overhead_steps}")
        if self.balanced_partial_tiles and not (self.balanced and self.skip_empty_rows):
            raise ValueError("balanced_partial_tiles estimates a partial query tile by the consumer warpgroups "
                             "that have rows, as skip_empty_rows runs it: it needs balanced=True and "
                             "skip_empty_rows=True")
        if self.late_k_release and not self.overlap:
            raise ValueError("late_k_release moves the K release of the overlapped step: it needs overlap=True")
        if self.overlap_epilogue and not (self.overlap and self.separate_o):
            raise ValueError("overlap_epilogue runs a tile's epilogue under the next tile's first QK of the "
                             "overlapped schedule, with O staged in its own buffer: it needs overlap=True and "
                             "separate_o=True")
        if self.num_q_stages not in (1, 2):
            raise ValueError(f"num_q_stages must be 1 or 2 (Q buffers per consumer warpgroup), got {self.num_q_stages}")
        if self.o_from_registers and self.separate_o:
            raise ValueError("o_from_registers stores O from registers instead of staging it in Q's buffer; with "
                             "separate_o O has its own buffer and Q is released early already: it needs "
                             "separate_o=False")
        if self.num_q_stages > 1 and not self.separate_o:
            raise ValueError("num_q_stages=2 keeps O's staging out of the Q buffers: it needs separate_o=True")
        for name in ("skip_unseen_half", "mask_second_half"):
            if getattr(self, name) and (not self.overlap or self.extra_keys or self.rescale_threshold > 0
                                        or self.block_n < 32):
                raise ValueError(f"{name} splits one box of keys of the overlapped schedule's plain online "
                                 "softmax in halves: it needs overlap=True, extra_keys=0, rescale_threshold=0 and "
                                 f"block_n >= 32, got overlap={self.overlap}, extra_keys={self.extra_keys}, "
                                 f"rescale_threshold={self.rescale_threshold}, block_n={self.block_n}")
        if self.single_kv_loop and (not self.overlap or self.skip_unseen_half or self.mask_second_half):
            raise ValueError("single_kv_loop shares the overlapped step between unmasked and masked tiles: it needs "
                             "overlap=True and neither skip_unseen_half nor mask_second_half (they build the masked "
                             f"step apart), got overlap={self.overlap}, skip_unseen_half={self.skip_unseen_half}, "
                             f"mask_second_half={self.mask_second_half}")
        if self.named_turns and not self.pingpong:
            raise ValueError("named_turns is how the pingpong token is passed: it needs pingpong=True")
        if self.exp_turns and not (self.overlap and self.pingpong and self.wait_pv_early and self.block_m >= 128
                                   and not self.row_sum_by_mma and not self.defer_row_sum):
            raise ValueError("exp_turns passes a token around the exponentials of FA4's overlapped order between "
                             "consumer warpgroups, passed on the running row sum: it needs overlap=True, "
                             "pingpong=True, wait_pv_early=True, block_m >= 128, row_sum_by_mma=False and "
                             f"defer_row_sum=False, got overlap={self.overlap}, pingpong={self.pingpong}, "
                             f"wait_pv_early={self.wait_pv_early}, block_m={self.block_m}, "
                             f"row_sum_by_mma={self.row_sum_by_mma}, defer_row_sum={self.defer_row_sum}")
        if self.exp2_fma_every not in EXP2_FMA_CHOICES:
            raise ValueError(f"exp2_fma_every must be one of {EXP2_FMA_CHOICES} (0 = off), got {self.exp2_fma_every}")
        if self.exp2_fma_every and not self.overlap:
            raise ValueError("exp2_fma_every is a lever of the overlapped schedule: it needs overlap=True")
        if self.row_sum_by_mma and (self.extra_keys or self.defer_row_sum):
            raise ValueError("row_sum_by_mma sums P on the tensor pipe for one box of keys: it needs extra_keys=0 and "
                             f"defer_row_sum=False, got extra_keys={self.extra_keys}, "
                             f"defer_row_sum={self.defer_row_sum}")
        if self.staged_scores and not (self.extra_keys and self.overlap and self.wait_pv_early):
            raise ValueError("staged_scores takes the first box's row max between the waits of QK's two boxes in "
                             "FA4's overlapped order: it needs extra_keys > 0, overlap=True and wait_pv_early=True, "
                             f"got extra_keys={self.extra_keys}, overlap={self.overlap}, "
                             f"wait_pv_early={self.wait_pv_early}")
        if self.freeze_row_max and not _freeze_order(self):
            raise ValueError("freeze_row_max keeps an item's first row max through its unmasked steps in FA4's "
                             "overlapped order: it needs overlap=True and wait_pv_early=True, and none of "
                             "late_rescale, rescale_before_exp, early_exp_quarters, exp_turns, row_sum_by_mma, "
                             f"staged_scores, single_kv_loop; got overlap={self.overlap}, "
                             f"wait_pv_early={self.wait_pv_early}, late_rescale={self.late_rescale}, "
                             f"rescale_before_exp={self.rescale_before_exp}, "
                             f"early_exp_quarters={self.early_exp_quarters}, exp_turns={self.exp_turns}, "
                             f"row_sum_by_mma={self.row_sum_by_mma}, staged_scores={self.staged_scores}, "
                             f"single_kv_loop={self.single_kv_loop}")
        if not 0.0 <= self.fp16_row_max_margin < 14.0:
            raise ValueError("fp16_row_max_margin raises an fp16 call's online row max by this many log2 units; it "
                             "must be at least 0 and below 14 (fp16's P of the row max stays a normal number), "
                             f"got {self.fp16_row_max_margin}")
        if self.freeze_row_max and self.exp2_fma_every:
            # the emulated exp2 clamps below but not above: past 2^128 its exponent field wraps to
            # a finite, wrong P where MUFU.EX2 gives inf, which the guard (fwd._flag_overflow) sees
            raise ValueError("freeze_row_max's guard sees an overflowed P as inf, which the FMA pipe's exp2 does "
                             f"not give: it needs exp2_fma_every=0, got {self.exp2_fma_every}")
        if self.p_in_smem and (self.extra_keys or self.row_sum_by_mma):
            raise ValueError("p_in_smem stages one box of P for PV in shared memory: it needs extra_keys=0 and "
                             "row_sum_by_mma=False (whose wgmma reads P's registers), got "
                             f"extra_keys={self.extra_keys}, row_sum_by_mma={self.row_sum_by_mma}")
        if self.trace_steps < 0 or self.trace_steps and (not self.overlap or self.split_tail):
            raise ValueError("trace_steps stamps the overlapped K/V steps into the split tail's workspace pointer: it "
                             f"needs trace_steps >= 0, overlap=True and split_tail=False, got trace_steps="
                             f"{self.trace_steps}, overlap={self.overlap}, split_tail={self.split_tail}")
        if self.gate_pv_wait and not (self.overlap and self.wait_pv_early):
            raise ValueError("gate_pv_wait keeps FA4's order's PV wait after the row max: it needs overlap=True and "
                             f"wait_pv_early=True, got overlap={self.overlap}, wait_pv_early={self.wait_pv_early}")
        if self.early_exp_quarters not in (0, 1, 2, 3) or self.early_exp_quarters and not (
                self.overlap and self.wait_pv_early and not self.gate_pv_wait and not self.exp_turns
                and not self.row_sum_by_mma and not self.extra_keys):
            raise ValueError("early_exp_quarters takes 0-3 quarters of a tile's exponentials ahead of PV's wait in "
                             "FA4's overlapped order, gating that wait itself: it needs overlap=True, "
                             "wait_pv_early=True, and neither gate_pv_wait, exp_turns, row_sum_by_mma nor "
                             f"extra_keys, got early_exp_quarters={self.early_exp_quarters}, overlap={self.overlap}, "
                             f"wait_pv_early={self.wait_pv_early}, gate_pv_wait={self.gate_pv_wait}, "
                             f"exp_turns={self.exp_turns}, row_sum_by_mma={self.row_sum_by_mma}, "
                             f"extra_keys={self.extra_keys}")
        if self.rescale_before_exp and not (self.overlap and self.wait_pv_early and not self.late_rescale
                                            and not self.early_exp_quarters):
            raise ValueError("rescale_before_exp moves O's rescale ahead of the exponentials in FA4's overlapped "
                             "order: it needs overlap=True and wait_pv_early=True, and neither late_rescale (O "
                             "rescaled under the next QK instead) nor early_exp_quarters, got "
                             f"overlap={self.overlap}, wait_pv_early={self.wait_pv_early}, "
                             f"late_rescale={self.late_rescale}, early_exp_quarters={self.early_exp_quarters}")
        if self.hoist_smem_base and not (self.asm_arrivals or self.asm_waits):
            raise ValueError("hoist_smem_base is how asm_arrivals and asm_waits address their barriers: it needs one "
                             "of them")
        if self.producer_warpgroup and self.dynamic:
            raise ValueError("producer_warpgroup widens the producer to four warps, and the dynamic hand-out's item "
                             "words are written by a one-warp producer: it needs dynamic_tiles=False and "
                             f"dynamic_pool_share=0, got dynamic_tiles={self.dynamic_tiles}, "
                             f"dynamic_pool_share={self.dynamic_pool_share}")
        if isinstance(self.producer_wait_hint_ns, bool) or not isinstance(self.producer_wait_hint_ns, int) \
                or not 0 <= self.producer_wait_hint_ns < 2 ** 32:
            raise ValueError(f"producer_wait_hint_ns must be an int in [0, 2**32) (nanoseconds), "
                             f"got {self.producer_wait_hint_ns!r}")
        if self.producer_wait_hint_ns and not self.producer_unsynced:
            raise ValueError("producer_wait_hint_ns is a hint on the producer's inline try_wait: it needs "
                             f"producer_unsynced=True, got producer_unsynced={self.producer_unsynced}")
        if self.producer_unsynced and not self.kv_multicast:
            raise ValueError("producer_unsynced is how kv_multicast's four-warp producer waits and copies Q without "
                             "bar.sync: it needs kv_multicast=True, got kv_multicast=False")
        if self.producer_unsynced and not _can_run_unsynced(self):
            # Forced with both (d64 non-causal B16 H32 S2048, the 192-row tile's default there), its
            # launches hung on the H200 in 3 of 4 runs. S2048 has 11 q-tiles: the hang was later
            # found with Gluon's producer too, with one Q buffer and with division, and not without
            # skip_empty_rows — the pair whose second tile lies past the sequence, which launches
            # now build without the skip (fwd._skip_empty_rows, change 48). The two are still
            # refused here: with them the unsynced producer has not run clean at any length since.
            # Every default with it has one Q buffer and the decode by division
            # (PRODUCER_UNSYNCED_NONCAUSAL_SEQLEN starts past both rules)
            raise ValueError("producer_unsynced runs only with one Q buffer and the decode by division (with them "
                             "it has not run clean on the H200): it needs num_q_stages=1, "
                             f"fast_divide_producer=False and fast_divide_consumers=False, got num_q_stages="
                             f"{self.num_q_stages}, fast_divide_producer={self.fast_divide_producer}, "
                             f"fast_divide_consumers={self.fast_divide_consumers}")
        if self.relay_release and not (self.kv_multicast and not self.thread_release):
            raise ValueError("relay_release has the producers of a kv_multicast pair relay its K/V releases: it needs "
                             f"kv_multicast=True and thread_release=False, got kv_multicast={self.kv_multicast}, "
                             f"thread_release={self.thread_release}")
        if self.cross_head_pairs and not (self.kv_multicast and not self.lpt):
            raise ValueError("cross_head_pairs pairs consecutive tiles of the plain (batch, head, m-block) order "
                             "across a cluster: it needs kv_multicast=True and lpt=False, got kv_multicast="
                             f"{self.kv_multicast}, lpt={self.lpt}")
        if self.kv_multicast and not _can_multicast(self):
            raise ValueError("kv_multicast pairs neighbouring q-tiles on the stride schedule and releases K/V slots "
                             "to both CTAs in inline PTX: it needs asm_arrivals=True, balanced=False, "
                             "dynamic_tiles=False, dynamic_pool_share=0, stagger_kv=False, extra_keys=0 and a block_n "
                             f"that halves into whole 8-row swizzle atoms, got asm_arrivals={self.asm_arrivals}, "
                             f"balanced={self.balanced}, dynamic_tiles={self.dynamic_tiles}, "
                             f"dynamic_pool_share={self.dynamic_pool_share}, stagger_kv={self.stagger_kv}, "
                             f"extra_keys={self.extra_keys}, block_n={self.block_n}")
        if self.asm_arrivals and self.thread_release:
            raise ValueError("asm_arrivals and thread_release are two ways to release a K/V slot without the "
                             "partition's bar.sync: choose one")
        if self.trace_item < 0 or self.trace_item and not self.trace_steps:
            raise ValueError("trace_item picks which of a CTA's work items trace_steps stamps: it needs trace_item "
                             f">= 0 and, when above 0, trace_steps > 0, got trace_item={self.trace_item}, "
                             f"trace_steps={self.trace_steps}")
        if self.trace_warps and not self.trace_steps:
            raise ValueError("trace_warps gives each warp its own row of the step trace's stamps: it needs "
                             f"trace_steps > 0, got trace_steps={self.trace_steps}")
        if self.trace_tiles < 0 or self.trace_tiles and self.trace_steps:
            raise ValueError("trace_tiles records each work item into the pointer trace_steps stamps into: it needs "
                             f"trace_tiles >= 0 and trace_steps=0, got trace_tiles={self.trace_tiles}, "
                             f"trace_steps={self.trace_steps}")
        if self.rescale_by_warp and not self.rescale_threshold > 0:
            raise ValueError("rescale_by_warp decides per warp when rescale_threshold skips O's rescale: it needs "
                             f"rescale_threshold > 0, got {self.rescale_threshold}")
        for name in ("consumer_regs", "producer_regs"):
            regs = getattr(self, name)
            if regs % 8 or not MIN_REGS_PER_THREAD <= regs <= MAX_REGS_PER_THREAD:
                raise ValueError(f"{name} must be a multiple of 8 in [24, 256] (setmaxnreg), got {regs}")
        # The register file is shared by every warpgroup of the CTA
        words = self.register_words
        if words > REGISTER_FILE_WORDS:
            raise ValueError(
                f"{self.num_consumers} consumer warpgroups × {self.consumer_regs} regs + producer "
                f"{self.producer_regs} regs need {words} registers per SM, more than {REGISTER_FILE_WORDS}")
        smem = self.smem_budget_bytes(head_dim, elem_bytes, head_dim_v)
        if smem > SMEM_PER_BLOCK_BYTES:
            dims = f"head_dim={head_dim}" + (f", head_dim_v={head_dim_v}" if head_dim_v not in (None, head_dim) else "")
            raise ValueError(
                f"block_m={self.block_m}, block_n={self.block_n}, num_kv_stages={self.num_kv_stages}, "
                f"num_q_stages={self.num_q_stages}, separate_o={self.separate_o} at "
                f"{dims} needs {smem} bytes of shared memory, more than {SMEM_PER_BLOCK_BYTES}")


# Default per head dim. Starting points from the feasibility probe on our H200 (d128: 2 consumer
# warpgroups × 64 rows, 128-key tiles, 240/24 registers: 628 TFLOP/s, a 3-stage ring measured the
# same) and from FA4's sm90 table (d256 needs a narrower K/V tile to fit Q + ring in 227 KiB and
# the 64×256 fp32 O accumulator in registers; FA4's 80-key tile is not a power of two, which a
# Triton block must be, so 64). d64 takes FA4's 192×128 tile (three consumer warpgroups at 160
# registers): with FA4's order P(j) reuses P(j-1)'s registers, and with Q left in shared memory
# it fits (0 spill non-causal; causal keeps 8–12 bytes per consumer live across the first tile's
# QK, outside the KV loop). Against the 192×64 tile with Q in registers it measured (paired,
# `flashrung compare`, B4 H32 S8192 bf16): 1.1228 / 1.1231 non-causal, 1.0705 / 1.0703 causal.
# Levers below carry their paired margins (`flashrung compare`, two fresh-process runs, AB/BA
# halves agreeing, t_keep 1.000411 from the A/A null; H200, bf16).
# O gets its own staging buffer at d64 and d128 (`separate_o`; d256 has no shared memory left for
# it): screening on the H200 (bf16, interleaved CUDA events, ÷ the default of the time) d128
# S1024 1.066 / 1.037 (non-causal / causal), S2048 1.048, S4096 1.002 / 1.003 (1.055 / 1.056 with
# the persistent grid), S16384 1.002; d64 S1024 1.067, S2048 causal 1.022, S8192 1.000.
_BY_HEAD_DIM = {
    64: HopperFwdConfig(block_m=192, block_n=128, num_kv_stages=3, consumer_regs=160, separate_o=True),
    128: HopperFwdConfig(block_m=128, block_n=128, num_kv_stages=2, separate_o=True),
    256: HopperFwdConfig(block_m=128, block_n=64, num_kv_stages=2),
}
# FA4's schedule (pingpong between the consumer warpgroups, PV waited right after the row max),
# with packed P: at d64 (then on 192×64 tiles with Q in registers, B4 H32 S8192) 1.0872
# non-causal, 1.0942 causal; at d256 (B2 H16 S8192) 1.0802 non-causal, 1.0100 causal. At d128
# non-causal it did not beat the FA3 order (screening, B2 H16 S16384, interleaved CUDA events:
# 0.989; with named turns, paired and preheated at the same shape, 1.0024 / 0.9990, NULL; again
# on change 30's kernel 1.0060 / 1.0069, under the mbarrier token in FA3's order: PINGPONG_NONCAUSAL_SEQLEN).
# With the arrivals inline it wins there from S8k (FA4_ORDER_NONCAUSAL_MIN_SEQLEN, change 35).
_FA4_SCHEDULE = dict(pingpong=True, wait_pv_early=True)
# Causal masked tiles compare each score with one bound per row (`row_bound_mask`): paired with
# each block preheated for 150 ms (t_keep 1.002164) over the two-condition mask, on each head
# dim's causal default (bf16): d64 B32 H32 S1024 1.0465 / 1.0396, B16 H32 S2048 1.0242 / 1.0257,
# B8 H32 S4096 1.0281 / 1.0355; d128 B16 H16 S2048 1.0247 / 1.0273, B8 H16 S4096 1.0145 /
# 1.0177; d256 B8 H16 S2048 1.0322 / 1.0304 (its 64 B of spill sit outside the loop). At d128
# B32 H16 S1024 the first run's halves disagreed (0.890, AB 0.693 / BA 1.029), the second read
# 1.0219 — NULL there, where the census puts the same 17% off the masked step.
# causal masks: one bound per row (change 19)
_CAUSAL_MASK = dict(row_bound_mask=True)
_LEVERS = {
    # (head_dim, causal) -> switches on top of _BY_HEAD_DIM
    (64, False): dict(_FA4_SCHEDULE, pack_p=True),
    # the deferred row sum on d64's causal 192-row tile: census 428 -> 420 instructions in the
    # steady loop, no spill (the 72 B of an earlier build are gone); paired, preheated, B8 H32
    # S4096 1.0072 / 1.0070, B4 H32 S8192 1.0077 / 1.0071, B1 H32 S32768 1.0076 / 1.0070. NULL
    # where it stays off: non-causal B4 H32 S8192 0.9979 / 1.0008 and
    # B32 H32 S1024 0.9960 / 0.9999; the short-causal tile at B32 H32 S1024 1.0011 / 1.0076
    # (run 1's halves disagreeing). On today's non-causal kernel (dd5eb5c), B2 H32 S16384: alone
    # 1.0005 / 1.0035; with asm_arrivals (418 instructions a trip, FA4's count) 1.0025 / 1.0033,
    # then 1.0014 / 1.0042, B1 S32768 1.0028 / 1.0005, B8 S4096 1.0054 / 1.0016 — NULL, off.
    # On the paired kernel (K/V multicast, census 434 -> 426), on an H100 (t_noise 0.001, no H100
    # A/A calibration): B8 S4096 1.0020 / 1.0020, B4 S8192 1.0012 / 1.0016, B2 S16384 1.0015 /
    # 1.0015 — a third of the +0.5-0.7% predicted, under the H200's t_keep (1.0022): off
    # (h100-compare-d64-paired-defer-row-sum-*-7f95815.json.gz)
    (64, True): dict(_FA4_SCHEDULE, pack_p=True, defer_row_sum=True, **_CAUSAL_MASK),
    # packed P at d128: 1.0145 non-causal, 1.0118 causal (B2 H16 S16384); the deferred row sum on
    # top of it: 1.0366 / 1.0367 non-causal, 1.0200 / 1.0201 causal (B2 H16 S16384; at B32 H16
    # S1024 non-causal the two runs disagreed, 1.018 and 0.858, verdict NULL)
    (128, False): dict(pack_p=True, defer_row_sum=True),
    # causal d128 also takes FA4's schedule with the token on named barriers (short problems
    # drop it again, below): paired over the FA3 order, B16 S2048 1.0424 / 1.0526, B8 S4096
    # 1.0362 / 1.0335, B2 S16384 1.0034 / 1.0034 (H16)
    (128, True): dict(_FA4_SCHEDULE, pack_p=True, defer_row_sum=True, named_turns=True, **_CAUSAL_MASK),
    # the FA3-order rescale with packed P at d256 non-causal: +4.3% (do_bench, unpaired); the
    # paired margin above was taken on top of it. Causal d256 spills with them. With the per-warp
    # rescale (every d256 length since change 32) _RESCALE_BY_WARP_LEVERS puts the rescale back in
    # FA4's place and adds the partial row sums (and packed P, causal): the plain online softmax
    # keeps this row's levers, which were priced on it
    (256, False): dict(_FA4_SCHEDULE, late_rescale=True, pack_p=True),
    (256, True): dict(_FA4_SCHEDULE, **_CAUSAL_MASK),
}
# The persistent grid (one CTA per SM walking the heaviest-first order with a stride) up to this
# max(Sq, Sk); longer problems launch one CTA per tile and let the hardware hand out tiles as SMs
# free up. Screening on the H200 (bf16, interleaved CUDA events, persistent ÷ per-tile grid; O
# still staged in Q's buffer): d128 S1024 1.051 / 1.138 (non-causal / causal), S2048 1.046 /
# 1.064, S16384 1.009 / 0.984; d64 (192×128) S1024 1.113 non-causal, S2048 1.066 causal, S8192
# 1.012 / 1.048; d256 S8192 1.009 / 0.890. With O in its own buffer, d128 S4096: 1.055 / 1.056.
# A static stride balances unequal causal tiles worse than the hardware's dynamic hand-out once
# tiles are long; shorter problems gain the tile prologues and epilogues the persistent CTA
# overlaps with loads. d128 non-causal longer than 4096, once O had its own buffer (and with the
# split tail from 16384), paired persistent over the per-tile grid (B·S = 32k, H16): S8192
# 1.0217 / 1.0214, S16384 1.0151 / 1.0166, S32768 1.0093 / 1.0075 — so d128 is persistent at
# every length (causal d128 from 4096 runs the balanced lists, below).
PERSISTENT_MAX_SEQLEN = {64: 1 << 30, 128: 1 << 30, 256: 0}
# Causal problems from this max(Sq, Sk) up launch the persistent grid (whatever
# PERSISTENT_MAX_SEQLEN says) with each CTA walking a host-built list of tiles (`balanced`): list
# scheduling evens out the unequal causal tiles that a stride (modeled makespan ÷ mean at d64
# S32768: 1.045 → 1.007; d128 S8192: 1.030 → 1.000) and, at d128, the hardware's per-tile hand-out
# leave uneven. Paired on the H200 (bf16; B·S = 32k, H32 at d64 and H16 at d128): d64 balanced
# over the stride at S16384 1.0103 / 1.0116, S32768 1.0295 / 1.0284; d128 balanced over the
# stride at S4096 1.0158 / 1.0118, balanced persistent over the per-tile grid at S8192 1.0624 /
# 1.0623, S16384 1.0282 / 1.0283, S32768 1.0096 / 1.0100. Screening (interleaved CUDA events)
# below the thresholds, over the stride: d64 S2048 0.977 (128-row tiles), S4096 0.968 (preheated,
# 128-row tiles); d128 S1024 0.949. d64 S8192 screened 0.996 with 48 MiB LPT sections; once they
# were 16 MiB (CAUSAL_L2_SECTION_MIB) it measured, paired with each block preheated for 150 ms
# (t_keep 1.002164), B4 H32 S8192 1.0194 / 1.0267 over the stride: d64 took it from 8192.
# Below those lengths the lists lost only while the sections were 48 MiB: the L2 model
# (`flashrung model --l2`) put the short rows' DRAM reads at 1.8-2.7x the compulsory bytes under
# the stride and 48 MiB sections, 1.00x with the lists and 16 MiB. Paired, preheated, the lists
# with 16 MiB sections over the stride with 48 MiB: d128 B32 H16 S1024 1.1001 / 1.1105, B16 H16
# S2048 1.0774 / 1.0846; d64 B32 H32 S1024 1.0340 / 1.0319, B8 H32 S4096 1.0632 / 1.0607. So every
# causal d64 and d128 problem runs the lists (max(Sq, Sk) from 1).
# d256 (otherwise one CTA per tile, PERSISTENT_MAX_SEQLEN) takes them too: paired, preheated, the
# lists with 16 MiB sections over the per-tile grid with 48 MiB, B8 H16 S2048 1.0758 / 1.0844, B4
# H16 S4096 1.0474 / 1.0473; at B2 H16 S8192 (16 MiB both sides) the lists read 1.0083 / 1.0043
# with the second run's halves disagreeing — NULL, no loss — and one rule serves every length.
BALANCED_CAUSAL_MIN_SEQLEN = {64: 1, 128: 1, 256: 1}
# Short causal problems (max(Sq, Sk) up to this) change the schedule of their head dim:
# - d64 takes a 128-row tile (two consumer warpgroups at 240 registers): with few K/V tiles per
#   query tile, the 192-row tile's diagonal waste and coarser grid cost more than its cheaper
#   steady state earns. Screening on the H200 (bf16, interleaved CUDA events, 128×128 ÷ 192×128,
#   both persistent, 3 stages): S1024 1.094, S2048 1.083, S4096 1.058, S8192 0.920, S16384
#   0.890; non-causal it loses already at S1024 (0.974). Paired: B16 H32 S2048 1.0908 / 1.0877;
#   against portable.fwd at B32 H32 S1024 1.1739 / 1.1751. Once every causal problem ran the
#   balanced lists with 16 MiB sections, the 192-row tile (with the staggered sweeps its long
#   rows take) came back above 2048, paired and preheated over the 128-row tile: B10 H32 S3072
#   1.0274 / 1.0263, B8 H32 S4096 1.0062 / 1.0109 (1.0048 / 1.0056 without the stagger); at B16
#   H32 S2048 it still lost (0.9747 / 0.9732, without the stagger).
#   On it every partition decodes its work items by multiply-high (fast_divide_*; change 24;
#   FAST_DIVIDE_MAX_SEQLEN):
#   paired, preheated, B32 H32 S1024, both 1.0412 / 1.0305, the producer alone 1.0293 / 1.0239
#   (KEEP, t_keep 1.002164; both clear the shape's own null, 1.006339).
# - d128 keeps FA3's order without pingpong: at B32 H16 S1024 FA4's schedule with named turns
#   measured 0.827 / 0.794 paired.
SHORT_CAUSAL_MAX_SEQLEN = {64: 2048, 128: 1024}
_SHORT_CAUSAL = {
    64: dict(block_m=128, consumer_regs=240, defer_row_sum=False),
    128: dict(pingpong=False, wait_pv_early=False, named_turns=False),
}
# Short non-causal problems (max(Sq, Sk) up to this) take the short-causal tile's stack at d64:
# the 128-row tile, the multiply-high decode in every partition (FAST_DIVIDE_MAX_SEQLEN) and two
# Q buffers (TWO_Q_STAGES_MAX_SEQLEN). At S1024 the 192-row tile covers 1024 rows with six tiles, the last a third full;
# 128 rows cover them with eight. Alone the 128-row tile lost here (screening 0.974 at S1024, and
# paired 0.985 / 0.985 with neither the decode nor the second Q buffer), and each of those two
# alone stayed under the shape's null on the 192-row tile (1.0055 / 0.9979; 1.0044 / 1.0050);
# together, paired and preheated over
# the 192-row default (t_keep 1.002164, the S1024 shape's own null 1.006339): B32 H32 S1024
# 1.0225 / 1.0230 (KEEP), B16 H32 S2048 0.9452 / 0.9418 (REVERT) — h200-compare-d64-full-s*k-
# short-tile-stack.json. Between 1024 and 2048 it is not priced; the rule keeps the length timed.
SHORT_NONCAUSAL_MAX_SEQLEN = {64: 1024}
_SHORT_NONCAUSAL = {
    64: dict(block_m=128, consumer_regs=240),
}


# The split tail (non-causal) from this max(Sq, Sk) up: the tail tile it spreads over every SM
# lasts as long as its K/V loop, against a fixed cost (the split items' prologues and partial
# stores, the merge launch). Paired on the H200 (d128 bf16 H16, split ÷ whole tiles; 4096 tiles
# on 132 SMs leave 4 for a 32nd round): B2 S16384 1.0138 / 1.0136, B1 S32768 1.0181 / 1.0185.
# Screening (interleaved CUDA events, on older defaults): S8192 1.003, S4096 1.002, S2048 0.990,
# S1024 0.956. Change 38 priced it paired, preheated 150 ms, over today's defaults (FA4's named
# order from S8192, FA3's named order at S4096, inline arrivals): B4 S8192 1.0351 / 1.0389, B8
# S4096 1.0212 / 1.0193 (KEEP, t_keep 1.002164; h200-compare-split-tail-d128-full-s{8192,4096}-
# 93f2fae.json.gz), with the first tile masked only where needed (below). d64 and d256 rows of the
# suite leave tails too full to split (one split per tile); d256 with split_tail_rounds lost,
# B2 H16 S8192 0.9609 / 0.9543 (REVERT, h200-compare-split-tail-rounds-d256-full-s8192-93f2fae.json.gz).
SPLIT_TAIL_MIN_SEQLEN = {128: 4096}
# From this max(Sq, Sk) up the split-tail kernel masks its first tile always: first_mask_on_need
# lost on it at B2 H16 S16384, 0.9935 / 0.9936 (change 23). Below it the split tail was priced
# with first_mask_on_need on (change 38), which is what the rule runs there.
SPLIT_TAIL_MASK_FIRST_MIN_SEQLEN = {128: 16384}
# A work item's fixed cost beyond its K/V steps, in steps (the tile trace, H200, default kernels:
# 2226 cycles against 2377 a step at d128, 2410 against 2495 at d64, 5870 against 2051 at d256 —
# its peeled first step, drain and epilogue; profile, h200-tile-trace-*-0298876.json.gz): what
# split_tail_rounds weighs each split item's range against
WORK_ITEM_FIXED_KV_TILES = {64: 1, 128: 1, 256: 3}

# The balanced grid's estimate of a query tile whose rows fill only k of its consumer warpgroups
# (a partial last tile: Sq mod block_m), as a share of a whole tile's (entry k - 1), by
# (head_dim, block_m); `balanced_partial_tiles`. From the tile trace (H200, bf16, causal, default
# kernels, h200-tile-trace-timeline-d64-causal-*-9095872.json.gz): at d64's 192-row tile the
# one-warpgroup tile of B2 H32 S16384 runs its 128 K/V steps in 204,800-206,500 cycles against
# 318,700-319,400 for a whole tile of 128 steps (0.64-0.65 of it); the two-warpgroup tile was
# taken halfway (0.83) and then measured (B4 H32 S8192, its 64 steps in 133,400-136,500 cycles
# against the whole tile's fit, 0.80-0.82; h200-tile-trace-timeline-partial-d64-causal-s8192-1366f73.json.gz).
# Paired over the whole-tile estimate (compare, preheated, t_keep 1.002164, bf16, B·S = 32k, H32,
# causal): S4096 1.0094 / 1.0140 KEEP, S8192 1.0011 / 1.0002 NULL, S16384 1.0079 / 1.0081 KEEP
# (modeled +2.8%, +0.7%, +0.7%; h200-compare-balanced-partial-tiles-d64-causal-*-cef0b5d.json.gz);
# the traced idle at the end of S4096 3.95% -> 1.13%. Change 42. Tiles not listed are estimated
# whole, as before.
PARTIAL_TILE_COST_SHARE = {(64, 192): (0.65, 0.83, 1.0)}


# Staggered K/V sweeps (`stagger_kv`) from this max(Sq, Sk) up. Paired on the H200 (bf16, d64
# H32, B·S = 32k), staggered over the default: S8192 1.0119 / 1.0117 non-causal, 1.0101 / 1.0120
# causal; S32768 1.0117 / 1.0116 non-causal, 1.0218 / 1.0251 causal. Screening (interleaved CUDA
# events) where it is off: d64 S1024 0.965, S2048 1.009 non-causal and 0.962 causal (the
# 128-row short-causal tile); d128 lost at every row timed (non-causal S2048 0.981, S8192 0.997,
# S16384 0.985; causal S16384 0.976) — its two consumer warpgroups on 128-key tiles already keep
# the SMs out of step, and the spread costs L2 locality. Below 8192 on d64's 192-row tile, paired
# and preheated: B8 H32 S4096 non-causal 1.0060 / 1.0080; causal with the tile (above) B10 H32
# S3072 1.0274 / 1.0263 and B8 H32 S4096 1.0062 / 1.0109 over the 128-row tile — so d64 staggers
# from 3072 (the shortest length timed), where causal problems are on the 192-row tile too.
# Non-causal d64 pairs its CTAs from 2048 instead, unstaggered (KV_MULTICAST_NONCAUSAL_SEQLEN).
STAGGER_KV_MIN_SEQLEN = {64: 3072}
# ... and wherever the sweep staggers it wraps by compare and subtract (stagger_subtract, change 41):
# the same tiles in the same order (outputs bit-identical), the producer's step 70 -> 44
# instructions without its division. Paired, preheated 150 ms (t_keep 1.002164), bf16, d64 H32,
# over the modulo: B2 S16384 non-causal 1.0041 / 1.0035 (KEEP), B8 S4096 non-causal 1.0017 /
# 1.0016 and B2 S16384 causal 1.0016 / 1.0049 (NULL; no reading below 1.0015); the step trace
# (--warps, B2 S16384 non-causal): the producer's scheduler's consumer warp 80-126 -> 34-38
# cycles behind its siblings at the step's top (h200-compare-stagger-subtract-d64-*-c8d2335.json.gz,
# h200-step-trace-warps-*-d64-full-s16384-{5ab2a8c,c435661}.json.gz)


# The LPT section (the (batch, head) columns whose K/V the heads running together share, sized in
# MiB of K/V: schedule.head_section). The budget was 48 MiB of the H200's 60 MiB L2; causal
# problems take 16 MiB (from max(Sq, Sk) = 8192 first, every length since).
# Profile (ncu, one launch each, --clock-control none, bf16): d64 causal B4 H32 S8192, L2 hit
# rate 57.9% → 82.8% and DRAM reads 1.83 → 0.65 GB (FA4's same launch: 85.3%); d128 causal B2
# H16 S16384, 90.2% → 95.9% and 907 → 408 MB. The duration of a single launch barely moves
# (2.19 → 2.20 ms at 1.76–1.79 GHz): what the L2 misses cost is power, and under sustained load
# every kernel here runs at the H200's power limit.
# Paired with each block preheated for 150 ms (`flashrung compare --block-preheat-ms 150`, t_keep
# 1.002164 from the preheated A/A null), 16 MiB over 48: d64 B4 H32 S8192 1.0224 / 1.0243, d64 B1
# H32 S32768 1.0416 / 1.0376, d128 B4 H16 S8192 1.0235 / 1.0238, d128 B2 H16 S16384 1.0201 /
# 1.0236; 8 over 16 MiB at d128 S16384 1.0013 / 0.9975 (NULL). Preheated screening below the
# threshold (interleaved blocks, ÷ 48 MiB): d128 B16 H16 S2048 0.942 (the persistent stride then
# deals each CTA the heavy end of many short heaviest-first sections), d128 B8 H16 S4096 1.006 and
# 0.937 (two blocks), d64 B8 H32 S4096 0.987 and 0.968; d128 B1 H16 S32768 0.998 (neutral; a head
# there is 16 MiB already). Those short rows lost on the stride; on the balanced lists (which
# every causal problem now runs) 16 MiB won there too, paired and preheated: d128 B8
# H16 S4096 1.0369 / 1.0396 over 48 MiB, and the S1024-S4096 margins above (the lists and the
# sections together). 8 MiB at d128 B32 H16 S1024: 1.1160 / 1.1113 over the old default, within
# 16 MiB's spread (1.1001 / 1.1105). d256 below 8192 took the 16 MiB sections with the lists
# (BALANCED_CAUSAL_MIN_SEQLEN: 1.0758 / 1.0844 at S2048, 1.0474 / 1.0473 at S4096, together).
CAUSAL_L2_SECTION_MIB = 16
CAUSAL_SMALL_SECTION_MIN_SEQLEN = {64: 1, 128: 1, 256: 1}


# Two Q buffers per consumer (num_q_stages=2) up to this max(Sq, Sk), per (head dim, causal): where
# a tile has few K/V steps, the next tile's Q load was waited for at every tile boundary. Paired on
# the H200 with each block preheated 150 ms (t_keep 1.002164; the S1024 shape's own null 1.006339),
# bf16, two stages over one: d64 causal (the short-causal 128-row tile, H32) B32 S1024 1.0167 /
# 1.0214, B16 S2048 1.0113 / 1.0074; d128 non-causal (H16) B32 S1024 1.0154 / 1.0158, B16 S2048
# 1.0041 / 1.0033 (KEEP). Not taken: d64 non-causal B32 H32 S1024 1.0044 / 1.0050 (clears t_keep,
# not the S1024 null), B16 H32 S2048 1.0010 / 1.0006 (NULL); d128 causal B32 H16 S1024 0.9969 /
# 1.0017 (NULL; run 1's halves disagree), B16 H16 S2048 0.9952 / 1.0025 (NULL).
# d256 has no room (its O is staged in Q's buffer). d64 non-causal up to S1024 runs the 128-row
# tile with two Q buffers as part of one stack (SHORT_NONCAUSAL_MAX_SEQLEN); d128 causal up to
# S4096, d64 causal up to S4096 (its 192-row tile from 2049) and d64 non-causal up to S2048 (the
# 192-row tile from 1025) take them together with the multiply-high decode (FAST_DIVIDE_MAX_SEQLEN).
# d128 causal takes the pair at every length since change 52 (margins under FAST_DIVIDE_MAX_SEQLEN).
TWO_Q_STAGES_MAX_SEQLEN = {(64, True): 4096, (64, False): 2048, (128, False): 2048, (128, True): 1 << 62}


# The work-item decode by multiply-high in every partition (fast_divide_producer and
# fast_divide_consumers) up to this max(Sq, Sk), per (head dim, causal): where tiles are short, a
# tile's head is a larger share of its work. Paired on the H200, each block preheated 150 ms
# (t_keep 1.002164; the S1024 shape's own null 1.006339), bf16: d64's 128-row tiles — causal
# (change 24) B32 H32 S1024 1.0412 / 1.0305, B16 H32 S2048 +2.0-2.2%; non-causal with two Q
# buffers (change 26, above) — and, change 27, d128 at B32 H16 S1024: causal, together with two Q
# buffers, 1.0173 / 1.0185 over neither (each alone had been NULL there: the decode 1.0017 /
# 1.0059, two Q buffers 0.9969 / 1.0017), non-causal on top of its two Q buffers 1.0155 / 1.0123
# (h200-compare-d128-{causal,full}-s1k-fast-divide-*.json.gz). Change 28, with two Q buffers (over
# neither where a row had one): d128 B16 H16 S2048 causal 1.0134 / 1.0116, non-causal 1.0064 /
# 1.0067 (that shape's own null: t_noise 0.2112%, h200-null-preheat150-d128-full-s2k.json.gz), d128
# B8 H16 S4096 causal 1.0071 / 1.0052 (the calibration's shape, non-causal there: 0.2164%); d64's
# 192-row tile, B8 H32 S4096 causal 1.0101 / 1.0092, B16 H32 S2048 non-causal 1.0066 / 1.0058 and,
# in fresh processes on another day, 1.0067 / 1.0073 (h200-compare-d128-causal-s2k-fd-2q.json.gz,
# -d128-full-s2k-fd, -d128-causal-s4k-fd-2q, -d64-causal-s4k-fd-2q, -d64-full-s2k-fd-2q-rerun and
# h200-compare-d64-full-s2k-fast-divide-two-q.json.gz). Not taken: d128 B8 H16 S4096 non-causal
# 0.9985 / 0.9968 (NULL, h200-compare-d128-full-s4k-fd-2q.json.gz). Change 52, d128 causal past S4096,
# both with two Q buffers over neither (quick protocol, n = 40 a run): B4 H16 S8192 1.0108 / 1.0008
# (run 2's halves disagreeing: NULL), again 1.0038 / 1.0058 (KEEP); B2 S16384 1.0039 / 1.0069, again
# 1.0083 / 1.0093; B1 S32768 1.0081 / 1.0076 (KEEP) — a gain that did not shrink with the items'
# length, as a cost paid once per tile head would; what else it shortens was not traced
# (h200-compare-fd-2q-d128-causal-*-4744f2d.json.gz). Not taken: d64 causal B4 H32 S8192
# 1.0007 / 1.0024 (NULL, h200-compare-fd-2q-d64-causal-s8192-4744f2d.json.gz).
FAST_DIVIDE_MAX_SEQLEN = {(64, True): 4096, (64, False): 2048, (128, True): 1 << 62, (128, False): 2048}


# A masked tile's unseen second half skipped (skip_unseen_half) for max(Sq, Sk) in [first, last],
# per (head dim, causal). On the short-causal d64 tile (128 rows, 128 keys) the first consumer's
# rows see half of each diagonal tile: at S2k 16 of a head's 136 K/V steps are diagonal, so the
# skipped exponentials and sums are about 3% of the row's softmax work (5.6% at S1k, 8 of 36).
# Paired on the H200, preheated 150 ms (t_keep 1.002164), bf16, H32, over the default: B16 S2048
# 1.0050 / 1.0049 (KEEP); B32 S1024 0.9984 / 1.0026, run 2's halves disagreeing (NULL) — with
# pingpong the other consumer's full diagonal step still sets the pace at the tile's end
# (h200-compare-skip-unseen-half-d64-causal-s{1024,2048}.json.gz). Not priced elsewhere. One K/V loop
# (SINGLE_KV_LOOP_SEQLEN, below) took its place there: 1.0104 / 1.0097 over it at B16 S2048; the two
# build the masked step differently and do not combine
SKIP_UNSEEN_HALF_SEQLEN: dict = {}


# The pingpong token between d128's non-causal consumers, in FA3's order (the schedule of FA3's
# paper: the whole softmax under the warpgroup's own PV, the token on mbarriers), for max(Sq, Sk)
# in [first, last]. Paired on the H200, preheated 150 ms (t_keep 1.002164), bf16, H16, over the
# default without it: B16 S2048 1.0430 / 1.0400, B8 S4096 1.0244 / 1.0187, B4 S8192 1.0096 /
# 1.0154, B2 S16384 (split tail) 1.0101 / 1.0087 (KEEP); B1 S32768 1.0017 / 0.9985 (NULL, off).
# The token on named barriers lost at S16k (0.9911 / 0.9908; with the inline arrivals it won at S4k:
# FA3_NAMED_NONCAUSAL_SEQLEN, change 36)
# (h200-compare-pingpong-d128-full-s{2048,4096,8192,16384,32768}-20b1de3.json.gz). Change 31: B32 S1024
# 1.0124 / 1.0090 (KEEP; that shape's own null 1.006339), so the rule reaches down to the shortest
# problems as the other short-tile rules do (h200-compare-pingpong-d128-full-s1024-df0281e.json.gz).
# Not taken at d128 causal S1024 (0.9998 / 0.9979, NULL: change 8's named turns stay off there).
# From S8k FA4's order with named turns takes over (FA4_ORDER_NONCAUSAL_MIN_SEQLEN, change 35), with
# pingpong at every length above it, S32k included.
PINGPONG_NONCAUSAL_SEQLEN = {128: (1, 16384)}


# The unmasked and masked K/V steps in one loop (single_kv_loop) up to this max(Sq, Sk), per (head
# dim, causal): the short tiles' instruction-fetch stalls (the d64 causal S1k profile: 6.6% of
# samples against cuDNN's 1.2%, on once-per-tile code fetched cold after the K/V loops) fall with
# 18-22% less kernel code. Paired on the H200, preheated 150 ms (t_keep 1.002164; the S1024 shape's
# own null 1.006339), bf16, over the default: d64 causal B32 H32 S1024 1.0298 / 1.0180, B16 H32
# S2048 (with skip_unseen_half off, over the default that had it) 1.0104 / 1.0097 (KEEP). Not taken:
# d64 non-causal B32 H32 S1024 1.0047 / 1.0026 (clears t_keep, not the S1024 null), d128 B32 H16
# S1024 causal 1.0012 / 1.0031 and non-causal 1.0045 / 1.0019 (NULL)
# (h200-compare-single-kv-loop-d{64,128}-{causal,full}-s{1024,2048}-df0281e.json.gz)
SINGLE_KV_LOOP_MAX_SEQLEN = {(64, True): 2048}


# FA4's conditional rescale with each warp's own decision (rescale_threshold=DEFAULT_RESCALE_THRESHOLD,
# rescale_by_warp) from this max(Sq, Sk), per (head dim, causal): once a row's reference max has
# settled, a warp whose 16 rows all keep it skips the d/2 multiplies of its O accumulator — the
# skipping trip of the steady loop is 10.8-11.3% shorter at d128, 26-28% at d256 (census), and the
# long rows are close to issue-bound. Paired on the H200, preheated 150 ms (t_keep 1.002164), bf16,
# H16, over the default: d128 non-causal B8 S4096 1.0191 / 1.0168, B4 S8192 1.0304 / 1.0297, B2
# S16384 1.0214 / 1.0216, B1 S32768 1.0212 / 1.0200; d128 causal B2 S16384 1.0080 / 1.0084, B1
# S32768 1.0044 / 1.0052; d256 non-causal B8 S2048 1.0514 / 1.0491, B2 S8192 1.0731 / 1.0694; d256
# causal B8 S2048 1.0350 / 1.0386, B2 S8192 1.0361 / 1.0402 (KEEP); d256 B16 S1024, O rescaled at
# every step priced over the default with it: 0.9670 / 0.9716 non-causal, 0.9723 / 0.9735 causal.
# Not taken: d128 non-causal B16 S2048 0.9988 / 1.0004 and causal B8 S4096 1.0042 / 1.0013 (NULL,
# halves disagreeing); d64 non-causal B4 H32 S8192 0.9941 / 0.9927 (REVERT: a 4.9% shorter trip, and
# the vote and the two paths cost more) — d64 stays off
# (h200-compare-rescale-by-warp-d{128,256,64}-{full,causal}-s*-fffbb14.json.gz,
# h200-compare-always-rescale-d256-{full,causal}-s1024-ae07105.json.gz). d128 causal from S8192
# since change 40: B4 H16 S8192 1.0080 / 1.0058 over the default of the day (KEEP, halves agreeing;
# h200-compare-rescale-by-warp-d128-causal-s8192-5ab2a8c.json.gz) — the S16k kernel, unchanged
RESCALE_BY_WARP_MIN_SEQLEN = {(128, False): 4096, (128, True): 8192, (256, False): 1, (256, True): 1}
# Softmax-side levers on top of the per-warp rescale, per (head dim, causal) (change 33): on d256's
# kernel the per-thread partial row sums (defer_row_sum) and, causal, P packed in the accumulator
# layout (pack_p); non-causal, O's rescale back in FA4's place (late_rescale off: behind the warp's
# branch the rescale no longer needs QK's shadow). Census (sm_90a): the trip that skips O's
# rescale 320 -> 309 instructions non-causal, 334 -> 310 causal, no local memory (packed P with
# late_rescale had kept 60 B on causal d256). Paired on the H200, preheated 150 ms (t_keep
# 1.002164), bf16, H16, over change 32's default: non-causal B16 S1024 1.0060 / 1.0079, B8 S2048
# 1.0077 / 1.0064, B2 S8192 1.0078 / 1.0070; causal B16 S1024 1.0067 / 1.0067, B8 S2048 1.0069 /
# 1.0067, B2 S8192 1.0076 / 1.0074 (KEEP;
# h200-compare-d256-levers-d256-{full,causal}-s{1024,2048,8192}-37f7706.json.gz)
_RESCALE_BY_WARP_LEVERS = {
    (256, False): dict(defer_row_sum=True, late_rescale=False),
    (256, True): dict(pack_p=True, defer_row_sum=True),
}



# The consumers' elected arrivals in inline PTX with no partition bar.sync (asm_arrivals) for
# max(Sq, Sk) in [first, last], per (head dim, causal). Census (sm_90a): the steady K/V loop meets
# one bar.sync a step instead of four (d64, d128 non-causal, d256) or three instead of five (d128
# causal, whose named turns stay); no registers or spills moved. Paired on the H200, preheated
# 150 ms (t_keep 1.002164), bf16, H16, over the default: d128 causal B16 S2048 1.0206 / 1.0209, B8
# S4096 1.0220 / 1.0208, B4 S8192 1.0189 / 1.0220, B2 S16384 1.0159 / 1.0202, B1 S32768 1.0134 /
# 1.0165; d128 non-causal B8 S4096 1.0047 / 1.0071, B4 S8192 1.0047 / 1.0049; d256 non-causal B8
# S2048 1.0099 / 1.0077, B2 S8192 1.0046 / 1.0062 (KEEP). Not taken: d128 non-causal B2 S16384
# 1.0024 / 1.0021 and 1.0020 / 1.0027 (NULL twice, the split-tail kernel); d256 causal B2 S8192
# 1.0010 / 1.0010; d64 B2 S16384 0.9991 / 1.0010 non-causal, 1.0002 / 1.0010 causal (NULL)
# (h200-compare-asm-arrivals-d{64,128,256}-{causal,full}-s*-6b5bae9.json.gz). d256 non-causal's KEEP is
# taken only where the keys fill their K/V tiles (ASM_ARRIVALS_WHOLE_KEY_TILES, the build that was
# priced): its build for a launch with a key tail keeps 36 B in local memory (5 LDL, 4 STL; one access
# in each per-tile loop), which the build without one does not. d128 causal B32 S1024: 1.0076 / 1.0031
# (clears t_keep, not that shape's own null 1.006339; h200-compare-asm-arrivals-d128-causal-s1024-8b45a1d.json.gz)
# Change 35 carries the non-causal d128 rule on from S8k (with FA4_ORDER_NONCAUSAL_MIN_SEQLEN, below),
# where the two were priced together.
ASM_ARRIVALS_SEQLEN = {(128, True): (2048, 1 << 62), (128, False): (4096, 1 << 62), (256, False): (2048, 1 << 62)}

# FA4's schedule with the token on named barriers (pingpong, wait_pv_early, named_turns) at d128
# non-causal from this max(Sq, Sk) up, with the inline arrivals (change 35). Priced before the
# arrivals were inline it lost or tied here (see _FA4_SCHEDULE, PINGPONG_NONCAUSAL_SEQLEN): the
# mbarrier token's elected arrival then cost a partition bar.sync, the named token's bar.arrive
# none, and FA3's order kept the whole softmax under PV. With the K/V releases inline as well,
# the tile trace reads 305.0k cycles per 128-step item against 314.1k for FA3's order with the
# mbarrier token (-2.9%; FA3's order with named turns 308.3k, FA4's order with the mbarrier
# token 324.2k: B2 H16 S16384, split tail off, h200-tile-trace-d128-full-s16384-*-edd8b80.json.gz;
# the census since places the mbarrier token's loss: with it ptxas hoists PV's wait into the row
# max, with named turns it does not — gate_pv_wait).
# Paired on the H200, preheated 150 ms (t_keep 1.002164), bf16, H16, over the default: B4 S8192
# 1.0071 / 1.0079 (FA4's order with the mbarrier token 0.9787 / 0.9793, REVERT), B2 S16384 (the
# split-tail kernel, which had neither) 1.0266 / 1.0300, B1 S32768 (which had no pingpong)
# 1.0137 / 1.0139 (KEEP). Not taken: B8 S4096 0.9947 / 0.9924 (REVERT), B16 S2048 0.9941 /
# 0.9986 (NULL) (h200-compare-{fa4-named,asm-fa4-named}-d128--no-causal-s*-edd8b80.json.gz).
FA4_ORDER_NONCAUSAL_MIN_SEQLEN = {128: 8192}
_FA4_NAMED = dict(_FA4_SCHEDULE, named_turns=True)

# The pingpong token on named barriers in FA3's order at d128 non-causal, for max(Sq, Sk) in
# [first, last] (change 36), beside the inline arrivals that run there (ASM_ARRIVALS_SEQLEN). At
# S16k before the arrivals were inline it lost (0.9911 / 0.9908, PINGPONG_NONCAUSAL_SEQLEN); with
# them the tile trace reads 308.3k cycles per 128-step item against 314.1k for the mbarrier token
# (B2 H16 S16384, h200-tile-trace-d128-full-s16384-fa3-named-edd8b80.json.gz), and FA4's order took
# S8k and up. Paired on the H200, preheated 150 ms (t_keep 1.002164), bf16, H16, over the default:
# B8 S4096 1.0056 / 1.0022 (h200-compare-fa3-named-d128--no-causal-s4096-e9c85f9.json.gz) and again
# 1.0067 / 1.0073 (…-fa3-named-again-…-94eb3eb.json.gz), KEEP. Not taken: B5 S6144 0.9934 / 1.0037
# (NULL, run 2's halves disagreeing) — the rule ends below it; B16 S2048, with the arrivals inline
# as well, 0.9921 / 0.9893 (REVERT, h200-compare-asm-fa3-named-d128--no-causal-s2048-e9c85f9.json.gz).
FA3_NAMED_NONCAUSAL_SEQLEN = {128: (4096, 6143)}

# PV's wait kept behind the row max in FA4's order (gate_pv_wait) for max(Sq, Sk) from this up,
# per (head dim, causal) (change 37). On change 35's kernel the census puts 32 of the 68 row-max
# FMNMX ahead of PV's wait in one of its four K/V loops (68 in the other three); gated, 68 in all,
# and ptxas then takes the tile's 64 exponentials ahead of the wait's branch too (ungated 0-30):
# the whole softmax under PV(j-1), FA3's placement inside FA4's pingpong. At d64 they stay after it.
# Paired on the H200, preheated 150 ms (t_keep 1.002164), bf16, H16, over the default: d128
# non-causal B2 S16384 1.0136 / 1.0123, B1 S32768 1.0102 / 1.0161 (KEEP). Not taken: B4 S8192
# 0.9991 / 1.0011 (NULL); d64, where ptxas hoists the wait furthest (13-14 FMNMX ahead of it):
# non-causal B2 H32 S16384 0.9873 / 0.9874, B8 H32 S4096 0.9868 / 0.9919, causal B2 H32 S16384
# 0.9916 / 0.9858 (REVERT) (h200-compare-gate-pv-wait-d{64,128}-*-{94eb3eb,d598e92}.json.gz)
GATE_PV_WAIT_MIN_SEQLEN = {(128, False): 16384}
ASM_ARRIVALS_WHOLE_KEY_TILES = {(256, False)}

# K/V multicast across clusters of two CTAs (kv_multicast, multicast.py) on non-causal problems of
# this max(Sq, Sk) range, with the inline arrivals and unstaggered sweeps it needs. Paired on the
# H200 against the default, preheated 150 ms (t_keep 1.002164), bf16, every gate passed
# (h200-compare-kv-multicast-d{64,128}-full-s*-2bb38ea.json.gz): d128 H16 B8 S4096 1.0191 / 1.0152,
# B4 S8192 1.0144 / 1.0150 (KEEP); B2 S16384 0.9949 / 0.9949 and B16 S2048 (there with the inline
# arrivals, which S2k lacks) 0.9892 / 0.9928 (REVERT). d64 H32 (with asm_arrivals, stagger_kv off)
# B8 S4096 1.0153 / 1.0170, B2 S16384 1.0056 / 1.0110 (KEEP). At d128 S16k the L2's request
# coalescer already merges 51.5% of the reads (ncu, lrc counters): the slices serve 0.523e9 sectors
# without multicast and 0.541e9 with it (h200-ncu-lrc-kv-multicast-{base,mc}-2bb38ea.txt), so the
# halved requests buy nothing there and the remote arrivals (7 instructions a K/V step) cost.
# d64 B1 S32768 1.0039 / 1.0050 (NULL, run 2's halves disagreeing); with the unsynced producer
# (PRODUCER_UNSYNCED_NONCAUSAL_SEQLEN) 1.0056 / 1.0105 over the staggered unpaired default (KEEP,
# halves agreeing; h200-compare-pair-unsynced-d64-full-s32768-7dc08ba.json.gz), so d64 pairs from S4k
# up (change 47; lengths past 32k not priced, as at d128); d256 H16 B4 S8192
# 0.9873 / 0.9879 (REVERT, h200-compare-kv-multicast-d256-full-s8192-36f1f1f.json.gz): off.
# What the pairing buys is clock: under sustained load at the power cap it holds a 1.7% (d128 S4k) /
# 2.2% (S16k) higher SM clock at equal power, and spends 0.85% / 2.26% more cycles a call — a win at
# S4k, even at S16k (h200-sustain-kv-multicast-d128-full-s*-575d248.json.gz). From S8k at d128 the pair
# relays its releases through the producers (RELAY_RELEASE_NONCAUSAL_SEQLEN), which took the remote
# arrivals out of the consumers' loop and made the pairing win past S8k (change 46).
# d64 below S4k, with the pairs across heads (CROSS_HEAD_PAIRS_NONCAUSAL_SEQLEN), each kernel of the
# range over its default (h200-compare-pair-s*-d64-full-5682a49.json.gz): the 128-row short tile, B32
# S1024, 0.9880 / 0.9875 (REVERT); the 192-row tile with two Q buffers and the multiply-high decode
# (Gluon's producer), B16 S1536 1.0026 / 1.0032 (NULL, run 2's halves disagreeing) and B16 S2048
# 1.0211 / 1.0175 (KEEP; with the unsynced producer on one Q buffer 1.0154 / 1.0196); one Q buffer
# with the unsynced producer, B12 S2560 1.0157 / 1.0169 and, over the staggered sweep, B10 S3072
# 1.0180 / 1.0158 (KEEP). So d64 pairs from S2048 (change 50)
KV_MULTICAST_NONCAUSAL_SEQLEN = {64: (2048, 1 << 62), 128: (4096, 1 << 62)}

# The paired producer's waits and Q copies in inline PTX (producer_unsynced) on the paired defaults
# of this range. Paired on the H200 over the paired default with Gluon's producer, preheated 150 ms
# (t_keep 1.002164), bf16, both gates passed: d64 H32 B8 S4096 1.0057 / 1.0054, B2 S16384 1.0039 /
# 1.0050; d128 H16 B8 S4096 (FA3's order with named turns) 1.0036 / 1.0032 (KEEP); d128 H16 B5 S6144
# (FA3's order with the mbarrier token) 1.0030 / 1.0037 (KEEP, change 45). Not taken: d128 B4 S8192,
# on FA4's order, 0.9981 / 0.9982 (NULL) — the d128 rule ends where FA4's order begins
# (FA4_ORDER_NONCAUSAL_MIN_SEQLEN). d64 B1 S32768, the pairing with it over the staggered unpaired
# default: 1.0056 / 1.0105 (KEEP; the pairing alone had read 1.0039 / 1.0050, NULL), so both carry
# on past S16k at d64 (change 47)
# (h200-compare-producer-unsynced-d{64,128}-full-s*-{275c781,c34cdb1,b2d3fe9,36f1f1f}.json.gz,
# h200-compare-kv-multicast-d64-full-s32768-c34cdb1.json.gz, h200-compare-pair-unsynced-d64-full-s32768-7dc08ba.json.gz).
# d64 from where its kernel has one Q buffer and the decode by division (check() refuses the rest),
# the pairs below S4k priced with it (KV_MULTICAST_NONCAUSAL_SEQLEN, change 50)
PRODUCER_UNSYNCED_NONCAUSAL_SEQLEN = {64: (max(TWO_Q_STAGES_MAX_SEQLEN[(64, False)], FAST_DIVIDE_MAX_SEQLEN[(64, False)]) + 1,
                                           1 << 62),
                                      128: (4096, FA4_ORDER_NONCAUSAL_MIN_SEQLEN[128] - 1)}

# The pair's releases relayed by the producers (relay_release): each consumer releases its K/V slot
# in its own CTA, and the producer that sees the release passes it to the peer, one remote arrival a
# fill instead of one a consumer warpgroup a step (census, d128 S16k: the consumers' steady loop
# 495 -> 488 instructions, the unpaired kernel's length). Paired on the H200, preheated 150 ms
# (t_keep 1.002164), bf16 d128 H16 non-causal, both gates passed: over the unpaired default, B2
# S12288 1.0218 / 1.0187, B2 S16384 1.0138 / 1.0145, B1 S32768 1.0099 / 1.0096 (KEEP: where the
# pairing alone had lost, 0.9949 at S16k); over the paired default at S8192, B4 1.0059 / 1.0058
# (KEEP), B2 H32 0.9984 / 1.0040 (NULL, run 1's halves disagreeing). Not taken: over the paired
# defaults with the unsynced producer, d128 B8 S4096 1.0020 / 0.9952 and d64 H32 B2 S16384 1.0017 /
# 1.0026 (NULL) (h200-compare-relay-release-*-6f7c09a.json.gz).
RELAY_RELEASE_NONCAUSAL_SEQLEN = {128: (FA4_ORDER_NONCAUSAL_MIN_SEQLEN[128], 1 << 62)}

# A cluster's pair as two consecutive tiles of the launch (cross_head_pairs), so a head with an odd
# count of q-tiles leaves no CTA without a tile. Paired on the H200 over the paired default
# (pairs within a head), preheated 150 ms (t_keep 1.002164), bf16 d64 H32 non-causal, both gates
# passed: B8 S4324 (23 q-tiles of 192 rows a head) 1.0340 / 1.0384, B2 S8192 (43) 1.0260 / 1.0256
# (KEEP; the pairs within a head had read 0.982 against the unpaired kernel at S4324). Predicted
# from the idle CTAs alone, 1/24 and 1/44 of the CTA-time: 4.2% and 2.3%
# (h200-compare-cross-head-d64-full-s{4324,8192}-70cc28e.json.gz). Even counts (S4096, S16384) pair
# as before, through the same decode. Not at d128: there the producer's branch between the two
# copies made ptxas reschedule the consumers' steady loop (census, d128 S16k: 488 -> 573
# instructions, 68 B of spill) — and d128's 128-row tiles give its power-of-two lengths even counts
CROSS_HEAD_PAIRS_NONCAUSAL_SEQLEN = {64: KV_MULTICAST_NONCAUSAL_SEQLEN[64]}


@functools.lru_cache(maxsize=None)
def _select(head_dim: int, causal: bool, persistent: bool, short: bool, split_tail: bool,
            balanced: bool, stagger_kv: bool, l2_section_mib: int, num_q_stages: int,
            fast_divide: bool, skip_unseen_half: bool, pingpong: bool, single_kv_loop: bool,
            rescale_by_warp: bool, asm_arrivals: bool = False, fa4_named: bool = False,
            fa3_named: bool = False, gate_pv_wait: bool = False,
            mask_first_always: bool = False, kv_multicast: bool = False,
            producer_unsynced: bool = False, relay_release: bool = False,
            cross_head_pairs: bool = False) -> HopperFwdConfig:
    base = dataclasses.replace(_BY_HEAD_DIM[head_dim], **_LEVERS.get((head_dim, causal), {}))
    if rescale_by_warp:
        base = dataclasses.replace(base, rescale_threshold=DEFAULT_RESCALE_THRESHOLD, rescale_by_warp=True,
                                   **_RESCALE_BY_WARP_LEVERS.get((head_dim, causal), {}))
    if short:
        base = dataclasses.replace(base, **(_SHORT_CAUSAL if causal else _SHORT_NONCAUSAL)[head_dim])
    if pingpong:
        base = dataclasses.replace(base, pingpong=True)
    if fa4_named:
        base = dataclasses.replace(base, **_FA4_NAMED)
    if fa3_named:
        base = dataclasses.replace(base, named_turns=True)
    if gate_pv_wait:
        base = dataclasses.replace(base, gate_pv_wait=True)
    # Causal tiles have unequal cost: start the heaviest first (seed 001, 0x0B). The long split-tail
    # kernel keeps its first tile masked always (SPLIT_TAIL_MASK_FIRST_MIN_SEQLEN).
    return dataclasses.replace(base, lpt=causal, persistent=persistent or balanced, split_tail=split_tail,
                               balanced=balanced, stagger_kv=stagger_kv, stagger_subtract=stagger_kv,
                               l2_section_mib=l2_section_mib,
                               first_mask_on_need=base.first_mask_on_need and not mask_first_always,
                               num_q_stages=num_q_stages, fast_divide_producer=fast_divide,
                               fast_divide_consumers=fast_divide, skip_unseen_half=skip_unseen_half,
                               single_kv_loop=single_kv_loop, asm_arrivals=asm_arrivals, kv_multicast=kv_multicast,
                               producer_unsynced=producer_unsynced, relay_release=relay_release,
                               cross_head_pairs=cross_head_pairs,
                               meet_before_pass=kv_multicast and _can_meet_before_pass(base),
                               balanced_partial_tiles=_partial_tiles_estimable(base, balanced, head_dim))


def _partial_tiles_estimable(cfg: HopperFwdConfig, balanced: bool, head_dim: int) -> bool:
    """``balanced_partial_tiles``' default: on wherever the balanced lists can estimate a partial
    tile by its warpgroups with rows (``skip_empty_rows`` idles the others; the share is measured
    for this head dim's tile)."""
    return balanced and cfg.skip_empty_rows and (head_dim, cfg.block_m) in PARTIAL_TILE_COST_SHARE


# The fields balanced_partial_tiles' default is derived from: a change to one of them carries
# the estimate along, unless the change names it too (then check() refuses what cannot run).
# Without it, `hopper.fwd@balanced=false` on a d64 causal problem kept the estimate of lists it
# no longer has and was refused.
_PARTIAL_TILES_DERIVED_FROM = frozenset({"balanced", "skip_empty_rows", "block_m"})


def replace_following(cfg: HopperFwdConfig, head_dim: int, **changes) -> HopperFwdConfig:
    """``dataclasses.replace(cfg, **changes)`` with the defaults derived from the changed fields
    re-derived; a derived field named in ``changes`` keeps the value given. ``kv_multicast`` turned
    on brings the inline arrivals and unstaggered sweeps it is selected with. A default
    ``kv_multicast`` steps aside for a change it cannot run with (the staggered sweep, Gluon's
    arrivals, ...), a default ``producer_unsynced`` for a second Q buffer or the multiply-high
    decode, and a default ``cross_head_pairs`` for the LPT order, unless the change names it too
    (then check() refuses). ``meet_before_pass`` follows the pairing, the skip of empty rows and the
    pingpong, as ``select_config`` derives it, and ``named_turns`` the pingpong turned off;
    ``stagger_subtract`` follows ``stagger_kv``; the
    split turned off takes its own K/V tile (``SPLIT_KV_TILE_KEYS``) with it."""
    out = dataclasses.replace(cfg, **changes)
    if changes.get("kv_multicast") and not cfg.kv_multicast:
        # the pairing forced onto an unpaired default brings what select_config pairs with (the
        # inline arrivals, the sweeps unstaggered), unless the change names them (then check()
        # refuses what cannot pair)
        brought = {name: value for name, value in _PAIRING_BRINGS.items() if name not in changes}
        out = dataclasses.replace(out, **brought)
    if "balanced_partial_tiles" not in changes and _PARTIAL_TILES_DERIVED_FROM & set(changes):
        out = dataclasses.replace(out, balanced_partial_tiles=_partial_tiles_estimable(out, out.balanced, head_dim))
    if out.kv_multicast and "kv_multicast" not in changes and not _can_multicast(out):
        out = dataclasses.replace(out, kv_multicast=False)
    if out.producer_unsynced and "producer_unsynced" not in changes and not _can_run_unsynced(out):
        # a second Q buffer or the multiply-high decode forced on a paired default: the pair keeps
        # Gluon's producer (check() refuses the unsynced one beside them)
        out = dataclasses.replace(out, producer_unsynced=False)
    out = frozen_follows(out, changes)
    if out.cross_head_pairs and "cross_head_pairs" not in changes and out.lpt:
        # the LPT order forced on a paired default: its pairs stay within a head
        out = dataclasses.replace(out, cross_head_pairs=False)
    if changes.get("split_head_dim") is False and cfg.split_head_dim and "block_n" not in changes \
            and out.block_n > _BY_HEAD_DIM.get(head_dim, out).block_n:
        # the split's own K/V tile (SPLIT_KV_TILE_KEYS) goes with it: the row's rings at full width
        # hold only the row's tile
        out = dataclasses.replace(out, block_n=_BY_HEAD_DIM[head_dim].block_n)
    if "stagger_kv" in changes and "stagger_subtract" not in changes:
        # every staggered sweep select_config builds wraps by compare and subtract (change 41): the
        # stagger forced on builds that sweep, forced off takes its wrap with it
        out = dataclasses.replace(out, stagger_subtract=out.stagger_kv)
    if changes.get("pingpong") is False and out.named_turns and "named_turns" not in changes:
        # the named barriers are a way of passing the pingpong's turn: the pingpong forced off a
        # default that passes it so (d128 from S8k, d64's frozen step) leaves no turn to pass
        out = dataclasses.replace(out, named_turns=False)
    if "meet_before_pass" not in changes and _MEET_DERIVED_FROM & set(changes):
        # the meeting follows the pairing as select_config derives it: the skip of empty rows or the
        # pingpong forced off a paired default leaves no turn to meet before; the pairing forced
        # onto an unpaired default gains it, so a tile past the sequence keeps the skip there too
        out = dataclasses.replace(out, meet_before_pass=out.kv_multicast and _can_meet_before_pass(out))
    return unpaired_producer_follows(out, changes)


# What select_config gives every kv_multicast default beside the pairing (the arrivals in inline
# PTX that release a slot to both CTAs, and one sweep order for the pair), and replace_following
# brings along when a change turns the pairing on
_PAIRING_BRINGS = {"asm_arrivals": True, "stagger_kv": False, "stagger_subtract": False}


# The fields meet_before_pass's default is derived from (select_config: every pairing that skips
# its empty rows and passes a pingpong turn meets before the pass)
_MEET_DERIVED_FROM = frozenset({"kv_multicast", "skip_empty_rows", "pingpong"})


# the switches that are ways of running a kv_multicast pair, and mean nothing without one
# (meet_before_pass runs unpaired, but only a pair's tile past the sequence needs it: dropped with
# the pairing, `@kv_multicast=false` builds the unpaired kernel that was priced before change 51)
PAIRED_ONLY = ("producer_unsynced", "relay_release", "cross_head_pairs", "meet_before_pass")


def unpaired_producer_follows(cfg: HopperFwdConfig, changes) -> HopperFwdConfig:
    """``producer_unsynced`` and ``relay_release`` are ways of running a kv_multicast pair, each
    on by default over part of the pairing's range: a configuration left unpaired (by the change, or
    by a default stepping aside) drops them, unless the change names them too (then check()
    refuses). Without this, ``hopper.fwd@kv_multicast=false`` on a paired default would be refused."""
    if cfg.kv_multicast:
        return cfg
    dropped = {name: False for name in PAIRED_ONLY if getattr(cfg, name) and name not in changes}
    return dataclasses.replace(cfg, **dropped) if dropped else cfg


def _can_run_unsynced(cfg: HopperFwdConfig) -> bool:
    """What ``producer_unsynced`` needs besides the pairing (``HopperFwdConfig.check``): one Q
    buffer and the decode by division."""
    return cfg.num_q_stages == 1 and not (cfg.fast_divide_producer or cfg.fast_divide_consumers)


def _can_meet_before_pass(cfg: HopperFwdConfig) -> bool:
    """What ``meet_before_pass`` needs (``HopperFwdConfig.check``): a consumer that skips its empty
    rows, and a pingpong turn for it to pass."""
    return cfg.skip_empty_rows and cfg.pingpong


def _can_multicast(cfg: HopperFwdConfig) -> bool:
    """What ``kv_multicast`` needs of the rest of a configuration (``HopperFwdConfig.check``)."""
    return (cfg.asm_arrivals and not (cfg.balanced or cfg.dynamic or cfg.stagger_kv or cfg.extra_keys)
            and cfg.block_n % 16 == 0)


def _freeze_order(cfg: HopperFwdConfig) -> bool:
    """Whether ``cfg``'s step is one ``freeze_row_max`` can keep a reference through: FA4's overlapped
    order, without the levers that move the rescale or the max."""
    return bool(cfg.overlap and cfg.wait_pv_early and not (cfg.late_rescale or cfg.rescale_before_exp
                                                           or cfg.early_exp_quarters or cfg.exp_turns
                                                           or cfg.row_sum_by_mma or cfg.staged_scores
                                                           or cfg.single_kv_loop))


def _can_freeze(cfg: HopperFwdConfig) -> bool:
    """What ``freeze_row_max`` needs of the rest of a configuration (``HopperFwdConfig.check``): that
    order, and MUFU's exp2 (its guard reads an overflowed P as inf)."""
    return _freeze_order(cfg) and not cfg.exp2_fma_every


def frozen_follows(cfg: HopperFwdConfig, changes) -> HopperFwdConfig:
    """``cfg`` with a default ``freeze_row_max`` set aside where ``changes`` (which do not name it)
    forced a lever it cannot join — one that moves the row max or the rescale, or the FMA pipe's
    exp2, which its guard cannot read: the steps keep the online rule."""
    if cfg.freeze_row_max and "freeze_row_max" not in changes and not _can_freeze(cfg):
        return dataclasses.replace(cfg, freeze_row_max=False)
    return cfg


def kernel_head_dim(head_dim: int, head_dim_v: int | None = None) -> int:
    """The head dim of the kernel that runs a problem of ``head_dim``: itself where it is compiled
    (``SUPPORTED_HEAD_DIMS``), else the next one up, its extra columns zero-filled by TMA
    (``PADDED_HEAD_DIM_MULTIPLE``). With ``head_dim_v``, v's own head dim, the kernel of the wider
    of the two: the kernel has one head dim, and each tensor's descriptor pads it to that (MLA's
    192/128 runs the d256 kernel). Raises ``ValueError`` naming what it takes."""
    for name, dim in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if dim is None or dim in SUPPORTED_HEAD_DIMS:
            continue
        if not isinstance(dim, int) or dim % PADDED_HEAD_DIM_MULTIPLE \
                or not PADDED_HEAD_DIM_MULTIPLE <= dim <= SUPPORTED_HEAD_DIMS[-1]:
            raise ValueError(f"{name} must be a multiple of {PADDED_HEAD_DIM_MULTIPLE} in "
                             f"[{PADDED_HEAD_DIM_MULTIPLE}, {SUPPORTED_HEAD_DIMS[-1]}] (compiled for "
                             f"{SUPPORTED_HEAD_DIMS}, others padded to the next), got {dim}")
    widest = head_dim if head_dim_v is None else max(head_dim, head_dim_v)
    return next(d for d in SUPPORTED_HEAD_DIMS if d >= widest)


def kernel_head_dims(head_dim: int, head_dim_v: int | None, cfg: HopperFwdConfig) -> tuple[int, int]:
    """``(Q's and K's, V's and O's)`` compiled widths of a problem run with ``cfg``. The
    configuration is the wider one's (:func:`kernel_head_dim`, :func:`select_config`); with
    ``cfg.own_value_dim`` each side is the next compiled head dim up from its own (MLA's 192/128:
    (256, 128)), unless v's would be wider than q's without O's own buffer (``separate_o``), where
    both are the wider (as with the switch off). With ``cfg.split_head_dim``, Q's and K's width of
    136–192 is 128 columns and a tail box (:func:`qk_boxes`; MLA's: (192, 128)) where O fits the
    first box."""
    wide = kernel_head_dim(head_dim, head_dim_v)
    if head_dim_v is None or head_dim_v == head_dim or not cfg.own_value_dim:
        qk = value = wide
    else:
        qk, value = kernel_head_dim(head_dim), kernel_head_dim(head_dim_v)
        if value > qk and not cfg.separate_o:
            qk = value = wide
    if cfg.split_head_dim and SPLIT_FIRST_BOX_COLS < head_dim <= SPLIT_MAX_HEAD_DIM \
            and (value <= SPLIT_FIRST_BOX_COLS or cfg.separate_o):
        qk = SPLIT_FIRST_BOX_COLS + _tail_box_cols(head_dim - SPLIT_FIRST_BOX_COLS)
    return qk, value


def _tail_box_cols(cols: int) -> int:
    """The narrowest tail box (``SPLIT_TAIL_BOX_COLS``) holding ``cols`` columns."""
    return next((c for c in SPLIT_TAIL_BOX_COLS if c >= cols), SPLIT_TAIL_BOX_COLS[-1])


def qk_boxes(width: int) -> tuple[int, int]:
    """Q's and K's compiled width as TMA boxes: ``(width, 0)`` for a compiled head dim, ``(128,
    tail)`` for a split one (``split_head_dim``: 144, 160, 192). Raises ``ValueError`` otherwise."""
    if width in SUPPORTED_HEAD_DIMS:
        return width, 0
    tail = width - SPLIT_FIRST_BOX_COLS
    if tail not in SPLIT_TAIL_BOX_COLS:
        raise ValueError(f"Q's and K's width must be one of {SUPPORTED_HEAD_DIMS} or, split, "
                         f"{tuple(SPLIT_FIRST_BOX_COLS + t for t in SPLIT_TAIL_BOX_COLS)}; got {width}")
    return SPLIT_FIRST_BOX_COLS, tail


def launches_causal(problem) -> bool:
    """Whether ``problem`` runs the causal schedule: a causal mask, or a window's right side (-1
    unbounded aside), which bounds a band the kernel runs as the causal schedule with its diagonal
    moved (``fwd._window_sides``)."""
    return bool(problem.causal) or (problem.windowed and problem.window_size[1] >= 0)


# The steady steps' reference kept from an item's first tile (freeze_row_max, with its guard: the
# item's end tests O and l finite, a flagged row is recomputed by portable.fwd.recompute_flagged), from
# these lengths on. Paired on the H200 (bf16, both arms gated, the guard's word, test and recompute
# launch in the timed call; flashrung compare --quick, calibrated; docs/hopper.md, *The frozen row
# max, guarded*): d64 non-causal S2k / 4k / 8k / 16k 1.074 / 1.079 / 1.084 / 1.085; d64 causal S4k /
# 8k / 16k 1.099 / 1.127 / 1.132, and on an H100 S2k 1.040 with the two K/V loops (change 58), S3k
# 1.090 / 1.084; d128 non-causal S8k / 16k 1.127 / 1.071, and on an H100 in FA4's order S2k / 3k /
# 4k / 6k 1.141 / 1.161 / 1.125 / 1.142 (changes 57, 59); d128
# causal S2k / 4k / 16k 1.043 / 1.076 / 1.103. Non-causal from S1024 since change 61, paired on an H100
# (blocks preheated 150 ms; t_noise 0.1%): d64 S1024 on the short 128-row tile 1.0665 / 1.0589, S1536 on
# the 192-row tile 1.0619 / 1.0588, d128 S1024 in FA4's order 1.0630 / 1.0462; below S1024 unpriced (an
# item of one K/V tile has no steady step). d64 non-causal from S512 since change 64, paired on an H100
# (the same protocol, B64 H32, 137 GFLOP, the call size FREEZE_ROW_MAX_MIN_FLOP admits; the 128-row tile
# of S1024): frozen over online 1.0338 / 1.0347, its named turns over that 1.0091 / 1.0094; d128
# non-causal there NULL (B64 H16 S512 0.9987 / 1.0309, the frozen arm near host-bound, 0.89x), not
# taken; below S512 unpriced. Not d256 (non-causal S16k 0.998); not with a window, packed
# sequences or a softcap (ungated or refused there)
FREEZE_ROW_MAX_MIN_SEQLEN = {(64, False): 512, (64, True): 2048, (128, False): 1024, (128, True): 2048}
# fp16 too since change 63, with its margin (fp16_row_max_margin): fp16's P is a 16-bit operand that
# overflows 2^16 above the reference, which ordinary scores reach (a later key 11 above the first
# tile's max, in natural units); the guard kept such rows exact, but by a recompute on the portable
# kernel, so fp16 ran the online step until the margin (8 log2 units) moved the overflow to a rise of
# 24 (16.6 natural). Paired on an H100 (fp16, @freeze_row_max=false against the default, preheated
# 150 ms, both arms gated, flashrung compare --quick, t_noise 0.1%): d64 non-causal B2 H32 S16384
# 1.1014 / 1.0954, B32 S1024 1.0596 / 1.0612; d128 non-causal B2 H16 S16384 1.0905 / 1.0868, B16
# S2048 1.0881 / 1.0689; causal S16384 d64 1.1125 / 1.1016, d128 1.0936 / 1.0840
FREEZE_ROW_MAX_DTYPES = ("torch.bfloat16", "torch.float16")
# What the frozen step brings where the default at its length differs (each paired on an H100, bf16,
# both arms gated, flashrung compare --quick, t_noise 0.1%; docs/hopper.md, *What the frozen row max
# brings*): FA4's order, which it needs, at d128 non-causal S2048–8191 (FA3's order there
# before; change 57: B8 H16 S4096 1.1252 / 1.1241; change 59: B16 H16 S2048 1.1408 / 1.1414);
# the two K/V loops at d64 causal up to S2048, where the single loop it cannot join was the default (change 58: B16 H32 S2048 1.0401 / 1.0407);
# PV's wait no longer held behind a row max the frozen step does not take (change 56: d128
# non-causal B2 H16 S16384 1.0669 / 1.0670)
FREEZE_ROW_MAX_BRINGS = {"wait_pv_early": True, "single_kv_loop": False, "gate_pv_wait": False}
# ... and, at d64 non-causal, the pingpong turn passed on named barriers (`named_turns`) instead of
# its mbarriers (change 62), at these ranges of max(Sq, Sk). The frozen trip is short enough that its
# loop top waits on the turn: the d64 S16k profile (H100, d7e1bed) spent 431 cycles a trip there
# against FA4's 259, the K and V tiles already landed, most of it the turn's mbarrier retry. On the
# online step the named turns lost at d64 (0.987); under the frozen one, paired on an H100 (bf16,
# preheated 150 ms, both arms gated, flashrung compare --quick, t_noise 0.1%), one build a length:
# B32 H32 S1024 (the 128-row tile) 1.0089 / 1.0020 (B64 S512, change 64: 1.0091 / 1.0094), B16 S1536
# (the unpaired 192-row tile) 1.0338 / 1.0327, B2 S16384 and B1 S32768 (the pair on one Q buffer,
# S2049 on) 1.0142 / 1.0150 and 1.0126 / 1.0107. Not S2048's build, the pair with two Q buffers and
# the multiply-high decode: 0.9956 / 0.9979 (B16 H32), again 1.0047 / 1.0012 (NULL; the second run's
# halves disagreeing) — level there, where every other build gains 1-3%
FREEZE_ROW_MAX_NAMED_TURNS_SEQLEN = {(64, False): ((512, 2047), (2049, 1 << 62))}
# ... and d64 causal's 192-row tile from S2048 (the short causal tile, SHORT_CAUSAL_MAX_SEQLEN,
# up to S2047 only): on the online step that tile lost at S2048 (0.975, above), under the frozen one
# it wins there — paired on an H100 (bf16, both arms gated on the build each times, flashrung
# compare --quick, t_noise 0.1%; change 60): B16 H32 S2048 1.0986 / 1.1031; at S1024 it still loses
# (B32 H32 S1024 0.932 frozen with its two K/V loops, 0.900 online), where the frozen step is
# not taken
FREEZE_ROW_MAX_SHORT_CAUSAL_MAX_SEQLEN = {**SHORT_CAUSAL_MAX_SEQLEN, 64: 2047}
# ... and only on calls of this much work or more (FLOPs, ``call_flop``): each frozen call adds the
# recompute's launch (a few µs of GPU, more of host time), and a small call's time is its host
# path. Paired on an H100 (d64 S2048 non-causal H32, freeze_row_max=true over false, f162df9, the
# recompute's plan cached): B1 (34 GFLOP) 0.844 / 0.857, host-bound both sides (0.597 before the
# cache); B4 (137 GFLOP) 1.060 / 1.062, its host probe near bound (0.99×); B8 (275 GFLOP) 1.066 /
# 1.064. Between 34 and 137 unpriced: the online step
FREEZE_ROW_MAX_MIN_FLOP = 128e9


def call_flop(problem) -> float:
    """A forward call's matmul FLOPs as its kernel runs them, QKᵀ and PV at the kernel's head dim
    (4·Sq·Sk·D a head: a padded head dim computes its padding), halved under a causal mask (the
    FlashAttention convention; a window is not counted down)."""
    flop = 4.0 * problem.batch * problem.heads_q * problem.seqlen_q * problem.seqlen_k * kernel_head_dim(
        problem.head_dim, problem.head_dim_v)
    return flop / 2 if problem.causal else flop


@functools.lru_cache(maxsize=None)
def _frozen(cfg: HopperFwdConfig, head_dim: int, named_turns: bool = False) -> HopperFwdConfig:
    """``cfg`` (``_select``'s, one object a schedule) with the frozen row max and what it brings
    where it differs (``FREEZE_ROW_MAX_BRINGS``). Cached, as the windowed, packed, capped and split
    rows are: ``replace_following``'s copies cost a call's host path about 30 µs (on this project's
    CPU: ``select_config`` of a frozen call 33–35 µs against the online call's 4–5), and a fresh
    configuration each call also costs ``fwd._plan``'s cache a field-by-field comparison"""
    brings = {name: value for name, value in FREEZE_ROW_MAX_BRINGS.items() if getattr(cfg, name) != value}
    if named_turns and cfg.pingpong:
        brings["named_turns"] = True
    return replace_following(cfg, head_dim, freeze_row_max=True, **brings)


def select_config(problem, frozen_step: bool = True) -> HopperFwdConfig:
    """The default configuration for a :class:`flashrung.dispatch.Problem`: that of its kernel's head
    dim (:func:`kernel_head_dim`). Pure; ``_select`` caches the configuration it builds. A window's
    right side bounds a band, which the kernel runs on the causal schedule with its diagonal moved
    (``fwd._window_sides``): such a problem gets the causal default. ``frozen_step=False``: the online
    step's default even where the frozen row max would be taken (``FREEZE_ROW_MAX_MIN_SEQLEN``), without
    what it brings — what a call under FREEZE_ROW_MAX_MIN_FLOP runs."""
    if launches_causal(problem) and not problem.causal:
        problem = dataclasses.replace(problem, causal=True)
    head_dim = kernel_head_dim(problem.head_dim, problem.head_dim_v)
    seqlen = max(problem.seqlen_q, problem.seqlen_k)
    frozen = (frozen_step and str(problem.dtype) in FREEZE_ROW_MAX_DTYPES
              and seqlen >= FREEZE_ROW_MAX_MIN_SEQLEN.get((head_dim, bool(problem.causal)), 1 << 62)
              and call_flop(problem) >= FREEZE_ROW_MAX_MIN_FLOP
              and not (problem.windowed or problem.varlen or problem.softcap))
    persistent = seqlen <= PERSISTENT_MAX_SEQLEN[head_dim]
    short_max = ((FREEZE_ROW_MAX_SHORT_CAUSAL_MAX_SEQLEN if frozen else SHORT_CAUSAL_MAX_SEQLEN)
                 if problem.causal else SHORT_NONCAUSAL_MAX_SEQLEN)
    short = seqlen <= short_max.get(head_dim, 0)
    split_tail = not problem.causal and seqlen >= SPLIT_TAIL_MIN_SEQLEN.get(head_dim, 1 << 62)
    mask_first_always = split_tail and seqlen >= SPLIT_TAIL_MASK_FIRST_MIN_SEQLEN.get(head_dim, 1 << 62)
    balanced = bool(problem.causal) and seqlen >= BALANCED_CAUSAL_MIN_SEQLEN.get(head_dim, 1 << 62)
    stagger_kv = seqlen >= STAGGER_KV_MIN_SEQLEN.get(head_dim, 1 << 62)
    small_section = bool(problem.causal) and seqlen >= CAUSAL_SMALL_SECTION_MIN_SEQLEN[head_dim]
    two_q_stages = seqlen <= TWO_Q_STAGES_MAX_SEQLEN.get((head_dim, bool(problem.causal)), 0)
    fast_divide = seqlen <= FAST_DIVIDE_MAX_SEQLEN.get((head_dim, bool(problem.causal)), 0)
    first, last = SKIP_UNSEEN_HALF_SEQLEN.get((head_dim, bool(problem.causal)), (1, 0))
    pp_first, pp_last = (1, 0) if problem.causal else PINGPONG_NONCAUSAL_SEQLEN.get(head_dim, (1, 0))
    single_kv_loop = seqlen <= SINGLE_KV_LOOP_MAX_SEQLEN.get((head_dim, bool(problem.causal)), 0)
    rescale_by_warp = seqlen >= RESCALE_BY_WARP_MIN_SEQLEN.get((head_dim, bool(problem.causal)), 1 << 62)
    aa_first, aa_last = ASM_ARRIVALS_SEQLEN.get((head_dim, bool(problem.causal)), (1, 0))
    fa4_named = not problem.causal and seqlen >= FA4_ORDER_NONCAUSAL_MIN_SEQLEN.get(head_dim, 1 << 62)
    n_first, n_last = (1, 0) if problem.causal else FA3_NAMED_NONCAUSAL_SEQLEN.get(head_dim, (1, 0))
    gate_pv_wait = seqlen >= GATE_PV_WAIT_MIN_SEQLEN.get((head_dim, bool(problem.causal)), 1 << 62)
    if (head_dim, bool(problem.causal)) in ASM_ARRIVALS_WHOLE_KEY_TILES \
            and problem.seqlen_k % _BY_HEAD_DIM[head_dim].kv_tile:
        aa_first, aa_last = 1, 0
    mc_first, mc_last = (1, 0) if problem.causal else KV_MULTICAST_NONCAUSAL_SEQLEN.get(head_dim, (1, 0))
    kv_multicast = mc_first <= seqlen <= mc_last
    if kv_multicast:
        # what the pairs were priced with: the inline arrivals, the sweeps unstaggered
        aa_first, aa_last, stagger_kv = 1, 1 << 62, False
    pu_first, pu_last = PRODUCER_UNSYNCED_NONCAUSAL_SEQLEN.get(head_dim, (1, 0))
    producer_unsynced = kv_multicast and pu_first <= seqlen <= pu_last
    rr_first, rr_last = RELAY_RELEASE_NONCAUSAL_SEQLEN.get(head_dim, (1, 0))
    relay_release = kv_multicast and rr_first <= seqlen <= rr_last
    ch_first, ch_last = CROSS_HEAD_PAIRS_NONCAUSAL_SEQLEN.get(head_dim, (1, 0))
    cross_head_pairs = kv_multicast and ch_first <= seqlen <= ch_last
    cfg = _select(head_dim, bool(problem.causal), persistent, short, split_tail, balanced, stagger_kv,
                  CAUSAL_L2_SECTION_MIB if small_section else L2_SECTION_MIB, 2 if two_q_stages else 1,
                  fast_divide, first <= seqlen <= last, pp_first <= seqlen <= pp_last, single_kv_loop,
                  rescale_by_warp, aa_first <= seqlen <= aa_last, fa4_named, n_first <= seqlen <= n_last,
                  gate_pv_wait, mask_first_always, kv_multicast, producer_unsynced, relay_release,
                  cross_head_pairs)
    if frozen:
        named = any(first <= seqlen <= last
                    for first, last in FREEZE_ROW_MAX_NAMED_TURNS_SEQLEN.get((head_dim, bool(problem.causal)), ()))
        cfg = _frozen(cfg, head_dim, named)
    if problem.windowed:
        cfg = _windowed(cfg, head_dim)
    if problem.windowed and problem.causal and 0 <= problem.window_size[0] <= NARROW_WINDOW_MAX_LEFT.get(head_dim, -1):
        cfg = _narrow_window(cfg, head_dim)
    if problem.varlen:
        cfg = _packed(cfg, head_dim, bool(problem.causal), bool(problem.windowed))
    if problem.softcap and (head_dim, bool(problem.causal)) in CAPPED_EXP2_FMA_EVERY:
        cfg = _capped(cfg, head_dim, bool(problem.causal))
    if (problem.head_dim, problem.head_dim_v) in SPLIT_DEFAULT_HEAD_DIMS and (
            SPLIT_DEFAULT_WITH_SCORE_OPTIONS or not (problem.windowed or problem.varlen or problem.softcap)):
        cfg = _split(cfg, head_dim, SPLIT_KV_TILE_KEYS.get((problem.head_dim, problem.head_dim_v), cfg.block_n))
    return cfg


# q and k as 128 columns and a tail box, v at its own width (split_head_dim, own_value_dim) by
# default for these (head_dim, head_dim_v): gated on the H200 (tests/test_hopper.py::
# test_gate_value_head_dims, build "split") and paired there against the padded build (every
# tensor at 256 columns): bf16 B2 H16 S8192, two fresh processes each, KEEP: non-causal 1.229 /
# 1.230, causal 1.427 / 1.176 (the causal runs disagree on how much; both clear the threshold)
# (h200-compare-split-192-128-*-03ee57d). MLA's pair; the split's other pairs are gated, not timed.
SPLIT_DEFAULT_HEAD_DIMS = frozenset({(192, 128)})
# The split beside a window, packed sequences or a cap: gated on an H100 on today's defaults
# (tests/test_hopper.py::test_gate_split_with_score_options, 9 gates, the tree of dec0b2d) and
# paired there over the padded build beside a window: bf16 B2 H16 S8192 causal (1024, 0), KEEP
# 1.249 / 1.578 (the runs disagree on how much; h100-compare-split-window-1024-58f5923).
SPLIT_DEFAULT_WITH_SCORE_OPTIONS = True


# K/V tiles of the split builds by (head_dim, head_dim_v), where they differ from their row's: the
# d256 row takes 64 keys because its 256-wide rings leave no room for 128, but MLA's 192/128 rings
# of 128 keys fit (213 KiB with Q's buffer), and QK's wgmma at N = 128 reads each Q row from shared
# memory once per 128 keys instead of per 64 (census, sm_90a: the unmasked K/V loop 345
# instructions per 64 keys -> 511 per 128 non-causal, 352 -> 520 causal; no local memory in the
# K/V loops, 16-88 B outside them). Paired on an H100 (bf16 B2 H16 S8192, flashrung compare --quick
# --t-noise 0.001, two fresh processes, both arms gated; timing, paired): non-causal KEEP 1.1720 /
# 1.1721, causal 1.1550 / 1.1552 (h100-compare-mla-128-keys-*-1bcd744); gated there
# (test_gate_value_head_dims' split-128-keys builds, 28 gates, h100-pytest-stagger-window-mla-1bcd744).
SPLIT_KV_TILE_KEYS = {(192, 128): 128}


@functools.lru_cache(maxsize=None)
def _split(cfg: HopperFwdConfig, head_dim: int, block_n: int) -> HopperFwdConfig:
    """``cfg`` with q's split boxes and v's own width on (:data:`SPLIT_DEFAULT_HEAD_DIMS`), on K/V
    tiles of ``block_n`` keys (:data:`SPLIT_KV_TILE_KEYS`)."""
    return replace_following(cfg, head_dim, own_value_dim=True, split_head_dim=True, block_n=block_n)


# What a sliding window's launch runs without: levers that assume every item's K/V range is whole
# or ends at the causal diagonal (the split tail splits whole ranges; a pair shares one range between
# two q-tiles; the halves and the single loop mask by the diagonal alone). Off, the default's other
# switches stay.
WINDOW_CLASHES = ("split_tail", "kv_multicast", "skip_unseen_half", "mask_second_half", "single_kv_loop",
                  # a window's first tile may show a row no key (its max -inf) where later ones do
                  "freeze_row_max")
# The staggered sweep under a window: it rotates only the run between the tiles the window cuts and
# the diagonal's (fwd._rotation_base), so it runs with one (gated on an H100: test_gate_window_staggered,
# 105 gates). Off: paired on an H100 at d64 causal B4 H16 S8192, window (4096, 0) — the one windowed
# default the unwindowed stagger reaches with the 192-row tile — 0.9949 / 0.9968, REVERT
# (h100-compare-stagger-window-4096-d64-1bcd744); a window's items already start apart.
WINDOW_STAGGER_KV = False
# A window's lower bound only on the tiles it cuts (window_first_mask_on_need and
# window_diagonal_one_bound together; fwd._mask_part's LOWER), by the kernel's head dim: census, the
# d64 causal 192-row windowed build's local memory gone and its diagonal step the causal build's.
# Paired on an H100 (bf16, d64 B4 H16 S8192 causal, window (4096, 0), three fresh processes, both
# arms gated): 1.0457 / 1.0456 / 1.0423, KEEP (h100-compare-window-4096-d64-masks-where-cut-2a340aa).
# Gated at d64, d128 and d256 with both (126 passed); d128 and d256 not yet priced, so off there
# (docs/hopper.md, *A sliding window*)
WINDOW_MASKS_WHERE_CUT = frozenset({64})
WINDOW_MASK_FIELDS = ("window_first_mask_on_need", "window_diagonal_one_bound")


# A narrow window on the causal schedule (a left side up to this many keys) at d64 runs the
# 128-row tile of two consumers instead of the 192-row tile of three: of a tile's ~10 K/V steps
# under a window of 1024, four or five are masked (the diagonal's and the window's edge), and the
# 192-row build keeps per-step values in local memory there (census, sm_90a: 168 B, 2 LDL / 2 STL
# in a masked loop, 9 LDL in each item loop; the 128-row build none, at 168 registers). Paired on
# an H100 (bf16 B2 H16 S8192 causal, two fresh processes each), 128 rows over 192 by the window's
# left side: 1024 KEEP 1.379 / 1.440 (and 1.245 / 1.239 over portable.fwd, where 192 rows read
# 0.897 / 0.899); 2048 1.140 / 1.120 and 1.123 / 1.132; 3072 1.038 / 1.028; 3584 1.008 / 1.005;
# 4096 0.994 / 0.997 (REVERT), where a masked step is one in ten
# (h100-compare-window-*-d64-*-{58f5923,dfe5314}).
NARROW_WINDOW_MAX_LEFT = {64: 3584}
NARROW_WINDOW_BLOCK_M = {64: 128}


@functools.lru_cache(maxsize=None)
def _narrow_window(cfg: HopperFwdConfig, head_dim: int) -> HopperFwdConfig:
    """``cfg`` on :data:`NARROW_WINDOW_BLOCK_M`'s tile, what follows from it re-derived."""
    return replace_following(cfg, head_dim, block_m=NARROW_WINDOW_BLOCK_M[head_dim])


# FA4's exp2 split (exp2_fma_every: one exponential in N on the FMA pipe) on capped problems, by
# (head dim, causal). A cap puts two more MUFU operations on every score (the tanh's exponential
# and its reciprocal: softmax.capped), which made the split look worth it where it had lost
# uncapped (d64 0.960 at N = 8, 0.905 at N = 4; d128 0.98 at N = 8). Census (sm_90a, capped
# defaults, no local memory in any loop): d64 causal S8k steady loop 739 -> 852 (N = 4) / 964
# (N = 2), MUFU a trip 192 -> 176 / 160 a thread; d128 non-causal S8k 804 -> 917 / 1029. Derived
# if MUFU bound the capped step (16 results a cycle a SM): +9% at N = 4, +17-20% at N = 2.
# Measured on an H100 (bf16, cap 30, B4 S8192, flashrung compare --quick --t-noise 0.001, both arms
# gated; timing, paired): d64 causal H32 N = 2 0.7587 / 0.7585, N = 4 0.9007 / 0.9008 (REVERT);
# d128 non-causal H16 N = 2 0.9741 / 0.9740 (REVERT), N = 4 1.0280 / 1.0272 (KEEP); d128 causal
# N = 4 1.0024 / 1.0021 (under the H200's t_keep 1.0022: NULL). The model missed: MUFU is not what
# the capped d64 step waits on. The capped defaults with the split gated there
# (test_gate_softcap, 60 passed, at N = 2 for d64 and d128 and at N = 4 for d128)
# (h100-compare-cap30-*-49842e1.json.gz, h100-pytest-gate-softcap-*.txt)
CAPPED_EXP2_FMA_EVERY: dict[tuple[int, bool], int] = {(128, False): 4}


def _capped(cfg: HopperFwdConfig, head_dim: int, causal: bool) -> HopperFwdConfig:
    """``cfg`` for a capped problem: the exp2 split of :data:`CAPPED_EXP2_FMA_EVERY`."""
    return replace_following(cfg, head_dim, exp2_fma_every=CAPPED_EXP2_FMA_EVERY[head_dim, causal])


def window_clashes(cfg: HopperFwdConfig) -> list[str]:
    """The switches of ``cfg`` a sliding window cannot run with (``WINDOW_CLASHES``) that are on."""
    return [name for name in WINDOW_CLASHES if getattr(cfg, name)]


@functools.lru_cache(maxsize=None)
def _windowed(cfg: HopperFwdConfig, head_dim: int) -> HopperFwdConfig:
    """``cfg`` with ``WINDOW_CLASHES`` off, and the staggered sweep unless :data:`WINDOW_STAGGER_KV`,
    the window's masks where it cuts with :data:`WINDOW_MASKS_WHERE_CUT`, what follows from them
    re-derived (:func:`replace_following`); ``cfg`` itself when nothing changes."""
    off = window_clashes(cfg) + (["stagger_kv"] if cfg.stagger_kv and not WINDOW_STAGGER_KV else [])
    changes = {name: False for name in off}
    if head_dim in WINDOW_MASKS_WHERE_CUT:
        changes.update(dict.fromkeys(WINDOW_MASK_FIELDS, True))
    return replace_following(cfg, head_dim, **changes) if changes else cfg


# What a launch of packed sequences runs without: the split tail (its tail tiles are counted and
# split launch-wide, from the longest sequence's keys) and the pairs of kv_multicast (two q-tiles
# share one K/V range; a pair across two sequences would not). Off, the default's other switches
# stay; every item reads its own sequence's lengths (fwd._sequence). Where the row's default runs
# the persistent grid (balanced lists or the stride), a pack draws its tiles at run time through
# the table of its tiles with a row (dynamic_tiles, handout_table). On an H100 (bf16 d128 H16,
# sequences 8192, 4096 x2, 1024 x8; flashrung bench, one run, rates by the sum of the sequences'
# FLOPs, no cell host-bound; h100-bench-packed-*-58f5923), TFLOP/s: causal — hand-out over every id
# 542.9, over the table 531.3, the pack's own lists 533.8, FA4 559.9; paired, the table over every
# id 1.017 / 1.019 (KEEP); non-causal — stride 604.8, table 649.0, lists 639.6, FA4 655.7.
PACKED_CLASHES = ("split_tail", "kv_multicast")

# The L2 sections of a pack's table (packed_section_mib), by the row's head dim. Heaviest first
# across the pack, a causal pack's first rounds ran the last q-tile of every (sequence, head) column
# at once. Paired on an H100 (bf16, causal, sequences 8192, 4096 x2, 1024 x8, over heaviest first;
# flashrung compare --quick --t-noise 0.001; docs/hopper.md, *Packed sequences*): d128 H16 16 MiB
# 1.0889 / 1.0886 (48 MiB 1.069 / 1.067), four of 8192 1.043 / 1.040; d256 H16 1.094 / 1.094;
# MLA's 192/128 1.077 / 1.080; d64 H32 16 MiB 0.986 / 0.986, 48 MiB 1.018 / 1.014 (96 MiB NULL,
# 32 MiB 0.994); blocks preheated 150 ms (at the power limit): d128 the default over heaviest first
# 1.149 / 1.138, d64 16 MiB under 48 0.966 / 0.965 — all on the run-time hand-out, the default.
# Where causal packs walk lists (PACKED_CAUSAL_POOL_SHARE, by name), d64's 16 MiB over 48 measured
# 1.0062 / 1.0074 on that pack, 1.072 / 1.069 on 1024 x32, 1.072 / 1.088 preheated (24 MiB 1.0075 /
# 1.0073): 16 there, as the unpacked launch prefers; d128 32 MiB 0.994, 8 MiB 0.999 over 16.
# Non-causal d128, d64, d256 NULL (1.0000-1.0004; d64 16 over 48 1.0001 / 1.0003): the ties there
# already fall in the launch's sections
PACKED_SECTION_MIB = {64: 48, 128: 16, 256: 16}

# Where a causal pack walks lists of its own tiles (balanced, schedule.deal_packed) and draws only
# the last tiles, up to this share of the estimated work, at run time through the table
# (handout_table, dynamic_pool_share), by the row's head dim; elsewhere it draws every tile after
# its first. A draw waits for its atomic's round trip before the tile's Q and first K can load; from
# a list the producer knows the next tile and loads them under the current one (the tile trace, d64
# H32 on the mixed pack: a tile's fixed cost 11066-11176 cycles drawn, 7595-7951 listed). Paired on
# an H100 over the hand-out (bf16, causal; flashrung compare --quick --t-noise 0.001; docs/hopper.md,
# *Packed sequences*), a pool of 0.03: on 8192, 4096 x2, 1024 x8 d64 H32 1.0516 / 1.0539, d128 H16
# 1.0091 / 1.0093, d256 NULL, MLA 1.0058 / 1.0053, d128 H64 beside a window (1024, 0) 1.0548 /
# 1.0537; 1024 x32 at d64 H64 1.0368 / 1.0365; 64 documents of 24-3811 tokens at d128 H32/8 1.0264 /
# 1.0256 — but on the same documents at d64 H32 0.9285 / 0.9403 and on 512 x128 at d128 H16
# 0.8851 / 0.8996, where a makespan model with the traced fixed costs and the draw's stall predicts
# the lists ahead by 1.11-1.12x (docs/results/cpu-model-packed-lists-vs-handout-73c7963.txt): the
# cause is not known. Not a default while it loses there: none listed. By name: impl="hopper.fwd@balanced=true,
# dynamic_tiles=false,handout_table=true,dynamic_pool_share=0.03" (at d64 with packed_section_mib=16;
# tile_overhead_steps prices the fixed cost: built, not measured on packs)
PACKED_CAUSAL_POOL_SHARE: dict[int, float] = {}

# Q buffers a non-causal pack's consumers take (num_q_stages), by the row's head dim: the next
# item's Q (in a pack, often a short sequence's, whose tile runs few K/V steps) loads under this
# one's. Paired on an H100 over one buffer (bf16, non-causal; flashrung compare --quick --t-noise
# 0.001, two fresh processes, both arms gated; docs/hopper.md, *Packed sequences*): 1024 x32 d128
# H16 1.0177 / 1.0182, d64 H32 1.0262 / 1.0283; 2048 x8 + 512 x16 d128 1.0161 / 1.0147; 8192,
# 4096 x2, 1024 x8 d128 1.0102 / 1.0102, d64 1.0027 / 1.0031 (KEEP), with blocks preheated 150 ms
# NULL at both; 16384, 8192 x2 d128 NULL (0.9995): the shorter the sequences, the more it pays;
# d96 on the d128 row 1.0076 / 1.0077. Causal d64 lost (0.993 / 0.992), and so did a non-causal
# pack under a window of 1024 keys to the left (d128, 0.9946 / 0.9928: its tiles run at most 9 K/V
# steps, each Q wait already short): windowed packs keep the row's. d128 causal has two already;
# d256 has no room (a Q box is 64 KiB)
PACKED_NONCAUSAL_Q_STAGES = {64: 2, 128: 2}


def packed_clashes(cfg: HopperFwdConfig) -> list[str]:
    """The switches of ``cfg`` packed sequences cannot run with (``PACKED_CLASHES``) that are on."""
    return [name for name in PACKED_CLASHES if getattr(cfg, name)]


@functools.lru_cache(maxsize=None)
def _packed(cfg: HopperFwdConfig, head_dim: int, causal: bool, windowed: bool = False) -> HopperFwdConfig:
    """``cfg`` with ``PACKED_CLASHES`` off, what follows from them re-derived (:func:`replace_following`),
    and the persistent grid's lists or stride replaced by the table of the pack's tiles with a row,
    in L2 sections of :data:`PACKED_SECTION_MIB`: a causal pack (a band too) at a head dim listed in
    :data:`PACKED_CAUSAL_POOL_SHARE` walks its own lists and draws a pool of that share of the work
    through it, every other pack draws every tile after its first at run time; a non-causal pack
    without a window takes :data:`PACKED_NONCAUSAL_Q_STAGES` Q buffers where O has its own."""
    off = dict.fromkeys(packed_clashes(cfg), False)
    if windowed:
        # the window's masks where it cuts (WINDOW_MASKS_WHERE_CUT) are gated on unpacked launches
        # only: a windowed pack keeps both bounds on every masked tile until gated packed
        off.update({name: False for name in WINDOW_MASK_FIELDS if getattr(cfg, name)})
    out = replace_following(cfg, head_dim, **off) if off else cfg
    if out.persistent and not out.overlap_epilogue and causal and head_dim in PACKED_CAUSAL_POOL_SHARE:
        out = replace_following(out, head_dim, balanced=True, dynamic_tiles=False, handout_table=True,
                                dynamic_pool_share=PACKED_CAUSAL_POOL_SHARE[head_dim],
                                packed_section_mib=PACKED_SECTION_MIB[head_dim])
    elif out.persistent and not out.overlap_epilogue:
        out = replace_following(out, head_dim, balanced=False, dynamic_pool_share=0.0, dynamic_tiles=True,
                                handout_table=True, packed_section_mib=PACKED_SECTION_MIB[head_dim])
    q_stages = PACKED_NONCAUSAL_Q_STAGES.get(head_dim, 1)
    if not causal and not windowed and out.separate_o and out.num_q_stages < q_stages:
        out = replace_following(out, head_dim, num_q_stages=q_stages)
    return out
