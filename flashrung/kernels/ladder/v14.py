"""ladder.v14 — the next block's scores issued under this block's softmax (QK one block ahead).

Computes exact attention forward (out, natural-log LSE) for fp16/bf16, head_dim 64 or 128,
any Sq/Sk, bottom-right causal, GQA.

Lever (parent ladder.v12): software pipelining of the key loop. Trip j computes S(j+1) = Q K(j+1)ᵀ
*before* the online softmax of S(j) and O += P(j) V(j), so each warp carries two independent
chains through the trip: the mma.sync of the next block's scores and the exponentials of this
block. It is the mma.sync form of FA3's intra-warpgroup overlap (seed 001, 0x05), where the
``wgmma`` of QK(j+1) runs under softmax(j); here ptxas interleaves the two chains' instructions
inside one basic block instead of an asynchronous tensor unit running one under the other. K(j+1)
must be in shared memory while V(j) is read, and block j+2 in flight meanwhile: the ring is three
slots (v12: two), 112 KiB per CTA at d128, two CTAs per SM still fit the H200's 228 KiB.

Why this lever: v12's profile at config B (docs/ladder.md) has the copies hidden (long scoreboard
2.2%) and the tensor pipe at 48.8% with the stalls on the short scoreboard (ldmatrix and MUFU
results, 18.9%) and the barrier: one dependent chain per warp, ldmatrix → HMMA → row max →
exponentials → HMMA, and two warps per scheduler to cover it. v13 gave each warp a second chain by
a second row slab (two slabs over one K/V fragment) and came out level (the 128-row causal tail
and a 32-key block's O rescale paid for it); this rung gives the second chain along the keys
instead, with v12's 64×64 tile and nothing else changed.
The second 16×64 score tile costs 32 registers a thread: at d128 v12's copies (a 64-bit offset
per copied row, for K and for V, held across the loop) then spill 120 B, so K and V of one row
stride share each row's offset (``copy_form``); d64 keeps v12's copies.
Prediction: at config B the short-scoreboard share falls and the tensor pipe rises; +3–8% where
the copies fit without spilling, a loss where they spill.
Measured (H200, docs/ladder.md, paired `flashrung compare`, two fresh processes): over v12 at
config B **1.0446 / 1.0471, KEEP** (the lever alone, over ``qk_ahead=false`` on the same ring:
1.0623 / 1.0598; the ring and copies alone 0.9849 / 0.9859); config A 0.9956 / 0.9958, REVERT;
d64 at config B's shape 1.1811 / 1.1793. 320.8 TFLOP/s at config B, 77.0% of the mma.sync ceiling
of the same run (v12 71.8%); profile: tensor pipe 48.8 → 51.1%, MIO throttle 3.5 → 0.8%. With
v12's copies at d128 (spilling) it measured 0.967, with per-row offsets 0.978 — both REVERT.
Since: the peeled first QK is fenced before the loop (``first_scores``), which took out a
bar.sync the compiler had put in every trip: 1.0071 / 1.0072 at config B, 1.0102 / 1.0103 at A
(paired, over the build without it).
"""
from __future__ import annotations

import dataclasses

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from flashrung.kernels.ladder import common
from flashrung.kernels.ladder.common import finalize, flash_state, mma_layout, mma_pv, mma_scores, softmax_update, store_tile

NAME = "ladder.v14"
PARENT = "ladder.v12"
LEVER = "QK of block j+1 issued before block j's softmax (software-pipelined key loop, 3-slot ring)"
HEAD_DIMS = (64, 128)
EXP2 = gl.constexpr(True)


@dataclasses.dataclass(frozen=True)
class AheadConfig(common.TileConfig):
    """v12's tile with a ring deep enough for QK one block ahead: slot j is read by PV(j), slot
    j+1 by QK(j+1), slot j+2 is being filled — three slots, no fewer.

    ``qk_ahead=False`` is the lever switched off on the same ring and copies: each trip waits
    for its own block and computes S(j) itself, v12's order (the A/B that prices the lever
    alone; ``impl="ladder.v14@qk_ahead=false"``)."""

    kv_stages: int = 3
    qk_ahead: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.kv_stages < 3:
            raise ValueError(f"kv_stages must be >= 3 (blocks j, j+1 resident and j+2 in flight), "
                             f"got {self.kv_stages}")

    def constexprs(self) -> dict:
        return {**super().constexprs(), "KV_STAGES": self.kv_stages, "QK_AHEAD": self.qk_ahead}

    def smem_bytes(self, head_dim: int) -> int:
        """Q's tile and the K/V ring (the census reads the same from the compiled kernel)."""
        return (self.block_m + 2 * self.kv_stages * self.block_n) * head_dim * common.ELEMENT_BYTES


CONFIG = AheadConfig(block_m=64, block_n=64, num_warps=4, kv_stages=3)
OFF = dataclasses.replace(CONFIG, qk_ahead=False)   # the lever switched off: v12's order, this ring

# How the K/V copies form their addresses (what the second score tile's registers leave room for):
# v12's whole-tile copies keep one 64-bit offset per row a thread copies, for K and for V, live
# across the loop (16 at 64 × 128: 32 registers); K and V of one row stride can share them; K and
# V laid out apart at d128 form each row's offset at the copy instead.
COPY_TILE = 0        # v12's copies (common.issue_kv_async)
COPY_ONE_STRIDE = 1  # common.issue_kv_async_one_stride
COPY_ROWS = 2        # common.stage_rows_async for K and for V
COPY_NAMES = {COPY_TILE: "tile", COPY_ONE_STRIDE: "one_stride", COPY_ROWS: "rows"}
# the same as seen from inside a kernel (jit code reads only constexpr globals)
COPY_TILE_K = gl.constexpr(COPY_TILE)
COPY_ONE_STRIDE_K = gl.constexpr(COPY_ONE_STRIDE)


def copy_form(head_dim: int, one_stride: bool) -> int:
    """The copy form per head dim. d64 keeps v12's copies: with them v14 fits (232 registers, no
    spill) and measured 1.18× v12 at config B's shape where the shared-offset form measured
    0.99× (paired; docs/ladder.md). At d128 v12's copies spill (120 B: 15 local loads per trip)."""
    if head_dim <= 64:
        return COPY_TILE
    return COPY_ONE_STRIDE if one_stride else COPY_ROWS


@gluon.jit
def issue_kv(k_dst, v_dst, k_base, v_base, start_n, n_rows, stride_ks, stride_vs,
             BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, KV_COPY: gl.constexpr, WHOLE: gl.constexpr = False):
    """Block ``start_n``'s K and V in ``KV_COPY``'s form; ``WHOLE``: no row predicate (the
    caller knows all BLOCK_N rows lie inside the tensor; ``common.row_keep``)."""
    if KV_COPY == COPY_TILE_K:
        common.issue_kv_async(k_dst, v_dst, k_base, v_base, start_n, n_rows, stride_ks, stride_vs, BLOCK_N, HEAD_DIM,
                              WHOLE)
    elif KV_COPY == COPY_ONE_STRIDE_K:
        common.issue_kv_async_one_stride(k_dst, v_dst, k_base, v_base, start_n, n_rows, stride_ks, BLOCK_N, HEAD_DIM,
                                         WHOLE)
    else:
        common.stage_rows_async(k_dst, k_base, start_n, n_rows, stride_ks, BLOCK_N, HEAD_DIM, WHOLE)
        common.stage_rows_async(v_dst, v_base, start_n, n_rows, stride_vs, BLOCK_N, HEAD_DIM, WHOLE)


@gluon.jit
def ring_start(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
               stride_kh, stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k,
               heads_q, group, DOT_A: gl.constexpr, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr, KV_COPY: gl.constexpr,
               TAIL_HEAVIEST_FIRST: gl.constexpr = False):
    """The start of v14 and of the rungs on its loop: ``common.ring_tile``, then blocks 0 ..
    KV_STAGES-2 into their slots, one commit each (zero rows, no global reads, past hi), then Q
    and block 0 landed (groups complete in order) and Q's fragments loaded.
    Returns (q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi)."""
    q_smem, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi = common.ring_tile(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, TAIL_HEAVIEST_FIRST)
    for i in gl.static_range(KV_STAGES - 1):
        first = gl.to_tensor(i * BLOCK_N)
        issue_kv(k_smem.index(i), v_smem.index(i), k_base, v_base, first, hi - first,
                 stride_ks, stride_vs, BLOCK_N, HEAD_DIM, KV_COPY)
        async_copy.commit_group()
    async_copy.wait_group(KV_STAGES - 2)
    gl.thread_barrier()
    return q_smem.load(DOT_A), k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi


@gluon.jit
def refill_and_wait(k_smem, v_smem, start_n, hi, k_base, v_base, stride_ks, stride_vs, BLOCK_N: gl.constexpr,
                    HEAD_DIM: gl.constexpr, KV_STAGES: gl.constexpr, KV_COPY: gl.constexpr,
                    IN_FLIGHT: gl.constexpr, WHOLE: gl.constexpr = False):
    """The head of trip j: block j+KV_STAGES-1 into the slot block j-1 left (every warp passed the
    barrier that closed trip j-1, so nothing reads it), one commit per trip so the wait's count
    is fixed, then wait until ``IN_FLIGHT`` groups remain and meet the barrier that makes every
    warp's copies visible. ``WHOLE``: the caller knows that block ends at or before ``hi``."""
    j = start_n // BLOCK_N
    ahead = start_n + (KV_STAGES - 1) * BLOCK_N
    issue_kv(k_smem.index((j + KV_STAGES - 1) % KV_STAGES), v_smem.index((j + KV_STAGES - 1) % KV_STAGES),
             k_base, v_base, ahead, hi - ahead, stride_ks, stride_vs, BLOCK_N, HEAD_DIM, KV_COPY, WHOLE)
    async_copy.commit_group()
    async_copy.wait_group(IN_FLIGHT)
    gl.thread_barrier()


@gluon.jit
def first_scores(q, k_smem, offs_m, seqlen_k, causal_shift, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 IS_CAUSAL: gl.constexpr):
    """S(0), peeled before the key loop (masked: one block per tile), and the fence after it."""
    s = mma_scores(q, k_smem.index(0), 0, offs_m, seqlen_k, causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, True)
    # Not needed by the ring (trip 0 copies into slot 2, which nothing has read), but without
    # it Triton's shared-memory barrier analysis sees this read of the K ring reach the loop
    # head unfenced and puts a bar.sync before every trip's copy — a third barrier per trip
    # (census). One barrier here instead of one per trip.
    gl.thread_barrier()
    return s


@gluon.jit
def attention_fwd_v14(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q/o (b, s_q, h, d), k/v (b, s_k, h_kv, d), lse (b, h, s_q)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    seqlen_q, seqlen_k, heads_q, group, qk_scale,  # qk_scale = softmax_scale * log2(e)
    HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    KV_STAGES: gl.constexpr, QK_AHEAD: gl.constexpr, KV_COPY: gl.constexpr,
):
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    # Copy groups still in flight when a trip's operands have landed: after block j+1 (QK ahead)
    # only the newest prefetch, j + KV_STAGES - 1; after block j also block j+1's.
    IN_FLIGHT: gl.constexpr = KV_STAGES - 2 if QK_AHEAD else KV_STAGES - 1

    q, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi = ring_start(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        DOT_A, HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES, KV_COPY)

    m_i, l_i, acc, offs_m = flash_state(start_m, BLOCK_M, HEAD_DIM, ROW, MMA)
    causal_shift = seqlen_k - seqlen_q
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA)
    if QK_AHEAD:
        s = first_scores(q, k_smem, offs_m, seqlen_k, causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL)
    # Every trip but the last: S(j+1) first, then softmax(j) and PV(j) — the two chains a warp
    # interleaves. The last block's softmax and PV follow the loop, so no trip computes scores of
    # a block past hi.
    for start_n in range(0, hi - BLOCK_N, BLOCK_N):
        j = start_n // BLOCK_N
        # block j+1 (QK ahead) or block j has landed
        refill_and_wait(k_smem, v_smem, start_n, hi, k_base, v_base, stride_ks, stride_vs, BLOCK_N, HEAD_DIM,
                        KV_STAGES, KV_COPY, IN_FLIGHT)
        if QK_AHEAD:
            s_next = mma_scores(q, k_smem.index((j + 1) % KV_STAGES), start_n + BLOCK_N, offs_m, seqlen_k,
                                causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, True)
        else:
            s = mma_scores(q, k_smem.index(j % KV_STAGES), start_n, offs_m, seqlen_k, causal_shift,
                           BLOCK_M, BLOCK_N, IS_CAUSAL, True)
        p, alpha, m_i, l_i = softmax_update(s, m_i, l_i, qk_scale, EXP2)
        acc = mma_pv(acc * alpha[:, None], p, v_smem.index(j % KV_STAGES))
        if QK_AHEAD:
            s = s_next
        gl.thread_barrier()  # every warp is done reading slot j before trip j+1's copy overwrites it
    # The last block (block 0 when the loop is empty; a tile that sees no key has every score
    # masked here, so p = 0 and the zero-filled V slot adds nothing).
    last = gl.maximum(gl.cdiv(hi, BLOCK_N), 1) - 1
    if not QK_AHEAD:
        async_copy.wait_group(KV_STAGES - 2)  # the last block (the newest group is the one after it)
        gl.thread_barrier()
        s = mma_scores(q, k_smem.index(last % KV_STAGES), last * BLOCK_N, offs_m, seqlen_k, causal_shift,
                       BLOCK_M, BLOCK_N, IS_CAUSAL, True)
    p, alpha, m_i, l_i = softmax_update(s, m_i, l_i, qk_scale, EXP2)
    acc = mma_pv(acc * alpha[:, None], p, v_smem.index(last % KV_STAGES))
    async_copy.wait_group(0)  # drain the trailing zero-row prefetches before the CTA exits

    out, lse = finalize(acc, m_i, l_i, EXP2)
    store_tile(o_base, lse_base, out, lse, seqlen_q - start_m, stride_os, BLOCK_M, HEAD_DIM)


def unsupported_reason(problem) -> str | None:
    # The third slot is what the seed's card cannot hold: 112 KiB at d128 over sm_120's 99 KiB.
    return (common.unsupported_reason(problem, HEAD_DIMS)
            or common.shared_memory_reason(problem, CONFIG.smem_bytes(problem.head_dim)))


def config_with(problem, overrides: dict) -> AheadConfig:
    """:data:`CONFIG` with ``overrides`` applied (``{"qk_ahead": "false"}``, from
    ``impl="ladder.v14@qk_ahead=false"``); raises ``ValueError`` naming an unknown key."""
    from flashrung.dispatch import apply_overrides

    cfg = apply_overrides(NAME, CONFIG, overrides, keys=("qk_ahead", "kv_stages"))
    reason = common.shared_memory_reason(problem, cfg.smem_bytes(problem.head_dim))
    if reason is not None:
        raise ValueError(f"{NAME}@kv_stages={cfg.kv_stages}: {reason}")
    return cfg


def launch_on_ring(kernel, q, k, v, causal: bool, softmax_scale: float, *, config: AheadConfig, out=None, lse=None,
                   constexprs: dict | None = None, needs_ahead: str | None = None, resolve=None):
    """Launch ``kernel`` (v14's, or a rung built on its loop) with the copy form of these K and V.
    ``needs_ahead`` names a rung built on QK one block ahead: it refuses ``qk_ahead=False``;
    ``resolve``: constexprs a first compile decides (``common.launch``)."""
    if needs_ahead and not config.qk_ahead:
        raise ValueError(f"{needs_ahead} is built on QK one block ahead: config.qk_ahead must be True "
                         f"(v12's order on the ring is {NAME}@qk_ahead=false)")
    form = copy_form(q.shape[-1], k.dim() == v.dim() == 4 and k.stride(1) == v.stride(1))
    return common.launch(kernel, q, k, v, causal, softmax_scale, cfg=config, exp2=True, head_dims=HEAD_DIMS,
                         out=out, lse=lse, constexprs={"KV_COPY": form, **(constexprs or {})}, resolve=resolve)


def ring_census_specs(name: str, kernel, constexprs: dict | None = None, config: AheadConfig = CONFIG) -> list:
    """The census of a rung on v14's ring (v15, v17, v18): each head dim and mask with K and V of
    one row stride (what the bench and the gate pass), then d128's copy form for K and V laid out
    apart; ``constexprs`` are the rung's own (v17's and v18's row sum)."""
    cases = [(d, c, copy_form(d, True)) for d in HEAD_DIMS for c in (False, True)]
    cases += [(128, c, copy_form(128, False)) for c in (False, True)]
    return [common.census_spec(name, kernel, head_dim=d, causal=c, cfg=config,
                               extra={"KV_COPY": form, **(constexprs or {})},
                               config_extra={"kv_stages": config.kv_stages, "kv_copy": COPY_NAMES[form]})
            for d, c, form in cases]


def forward(q, k, v, causal: bool, softmax_scale: float, *, out=None, lse=None, config: AheadConfig = CONFIG):
    return launch_on_ring(attention_fwd_v14, q, k, v, causal, softmax_scale, config=config, out=out, lse=lse)


def census_specs():
    # K and V with one row stride (contiguous tensors of one shape, what the bench and the gate
    # pass), the lever on and off; then d128's copy form for K and V laid out apart
    cases = [(cfg, d, c, copy_form(d, True)) for cfg in (CONFIG, OFF) for d in HEAD_DIMS for c in (False, True)]
    cases += [(CONFIG, 128, c, copy_form(128, False)) for c in (False, True)]
    return [common.census_spec(NAME, attention_fwd_v14, head_dim=d, causal=c, cfg=cfg, extra={"KV_COPY": form},
                               config_extra={"kv_stages": cfg.kv_stages, "qk_ahead": cfg.qk_ahead,
                                             "kv_copy": COPY_NAMES[form]})
            for cfg, d, c, form in cases]
