"""Pieces every ladder rung shares, written once: host validation and launch, layouts, tile
staging, masking, the online-softmax update and the epilogue.

A rung file holds only its kernel (the loop that composes these pieces) and the switch that is
its lever; everything here is the common ground the rungs stand on, so that two neighbouring
rungs differ by their lever alone.

Conventions (flashrung-wide): q ``(B, Sq, Hq, D)``, k/v ``(B, Sk, Hkv, D)`` with
``Hq % Hkv == 0``; causal masking aligned bottom-right (query ``i`` sees key ``j`` iff
``j <= i + Sk - Sq``); the returned LSE is ``(B, Hq, Sq)`` fp32 in the natural-log base; a query
row that sees no key has ``out = 0`` and ``lse = -inf``.

Numerics, in one place:

* ``softmax_update`` is the one online-softmax step. ``EXP2=False`` (v0–v3) keeps the running
  max ``m`` in the natural-log domain and calls libdevice ``expf`` (precise: one ``MUFU.EX2``
  and eight FMA/ALU instructions of range reduction per call). ``EXP2=True`` (v4 on) keeps
  ``m`` in the log2 domain and calls ``exp2`` (``ex2.approx.ftz.f32``, one ``MUFU.EX2``); the
  host folds ``log2(e)`` into the score scale (``host_scale``), so the base change costs no
  instruction in the loop.
* The fully-masked-row guard: the exponent is taken against ``m_eff`` (0 where the running max
  is still ``-inf``), so a row that has seen only masked keys keeps ``p = 0``, ``l = 0`` and a
  zero accumulator instead of ``exp(-inf - -inf) = NaN``; ``finalize`` turns ``l = 0`` into
  ``out = 0`` and ``lse = -inf``.
"""
from __future__ import annotations

import dataclasses
import torch

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from flashrung.dispatch import score_options_reason
from flashrung.inputs import check_qkv, check_softmax_scale
from flashrung.kernels.hopper.pipeline import warmup_compiler
from flashrung.kernels.hopper.schedule import L2_BUDGET_BYTES, kv_stagger, kv_visit, tile_coords

LOG2E = 1.4426950408889634  # log2(e): folded into the score scale from v4 on
LN2 = 0.6931471805599453    # ln(2): turns a log2-domain LSE back into the natural base

DTYPES = (torch.float16, torch.bfloat16)
MIN_CAPABILITY = (8, 0)        # mma.sync m16n8k16 with bf16 and cp.async: Ampere and newer
COPY_BYTES = 16                # one cp.async / one ldmatrix row: 16 bytes
ELEMENT_BYTES = 2              # fp16 / bf16
MAX_GRID_Y = 65535             # CUDA limit of the second grid dimension (batch * heads_q here)
# Opt-in dynamic shared memory per block, bytes, by compute capability (CUDA programming guide,
# compute capabilities table): a rung whose tiles need more cannot launch there.
SMEM_OPTIN_BYTES = {(8, 0): 163 * 1024, (8, 6): 99 * 1024, (8, 7): 163 * 1024, (8, 9): 99 * 1024,
                    (9, 0): 227 * 1024, (12, 0): 99 * 1024}
SWIZZLE_PHASES = 8             # 128-byte bank period / 16-byte chunk: eight phases, 3 XOR bits
# Residency limits of one SM, for the persistent grid's size (CUDA programming guide, compute
# capabilities 8.x-12.x; Hopper tuning guide): registers are granted per warp in 256-register units
REGISTERS_PER_SM = 65536
REGISTER_ALLOC_UNIT = 256      # registers per warp, the allocation granule
MAX_THREADS_PER_SM = {(8, 0): 2048, (8, 6): 1536, (8, 7): 2048, (8, 9): 1536, (9, 0): 2048, (12, 0): 1536}
MAX_CTAS_PER_SM = 32
SMEM_RESERVED_PER_CTA_BYTES = 1024   # the driver's shared memory per resident CTA (sm_80 on)
# K/V bytes of the heads whose tiles run together under v9's order: the Hopper forward's L2 budget
L2_SECTION_BYTES = gl.constexpr(L2_BUDGET_BYTES)
# v10's staggered sweeps start within the first this-many key blocks of a CTA's sweep (0: anywhere)
STAGGER_WINDOW_BLOCKS = gl.constexpr(0)

# The same constants as seen from inside a kernel (jit code reads only constexpr globals).
COPY_BYTES_K = gl.constexpr(COPY_BYTES)
ELEMENT_BYTES_K = gl.constexpr(ELEMENT_BYTES)
LN2_K = gl.constexpr(LN2)


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Tile and launch shape shared by the rungs (seed 000: 64-row CTAs, 64-key blocks)."""

    block_m: int = 64    # query rows per CTA
    block_n: int = 64    # keys per inner-loop block
    num_warps: int = 4   # 16 query rows per warp and slab: one m16n8k16 row slab each
    # m16 row slabs per warp: the mma layout repeats along the rows by itself, so a warp of a
    # 2-slab tile issues twice the MMAs for every K/V fragment it loads (FA2's d128 tile)
    slabs_per_warp: int = 1

    def __post_init__(self):
        if self.slabs_per_warp not in (1, 2):
            raise ValueError(f"slabs_per_warp must be 1 or 2, got {self.slabs_per_warp}")
        if self.block_m != 16 * self.num_warps * self.slabs_per_warp:
            raise ValueError(f"block_m must be 16 * num_warps * slabs_per_warp (16-row mma slabs), got "
                             f"block_m={self.block_m}, num_warps={self.num_warps}, "
                             f"slabs_per_warp={self.slabs_per_warp}")
        if self.block_n not in (16, 32, 64, 128):
            raise ValueError(f"block_n must be one of 16, 32, 64, 128, got {self.block_n}")

    def constexprs(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n}


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------

def unsupported_reason(problem, head_dims: tuple[int, ...]) -> str | None:
    """Why a ladder rung cannot run ``problem``; ``None`` when it can."""
    if problem.interpreter:
        return "Gluon kernels do not run under TRITON_INTERPRET=1"
    if problem.device_type != "cuda":
        return f"needs a CUDA device, got {problem.device_type!r}"
    if problem.capability is None or tuple(problem.capability) < MIN_CAPABILITY:
        return f"needs sm_80 or newer (mma.sync, cp.async), got capability {problem.capability}"
    if problem.dtype not in DTYPES:
        return f"supports float16 and bfloat16, got {problem.dtype}"
    if problem.head_dim not in head_dims:
        return f"supports head_dim in {head_dims}, got {problem.head_dim}"
    if problem.head_dim_v != problem.head_dim:
        return f"needs head_dim_v == head_dim, got {problem.head_dim_v} != {problem.head_dim}"
    if problem.heads_kv <= 0 or problem.heads_q % problem.heads_kv != 0:
        return f"needs heads_q % heads_kv == 0, got {problem.heads_q} and {problem.heads_kv}"
    reason = score_options_reason(problem)
    if reason is not None:
        return reason
    if problem.batch * problem.heads_q > MAX_GRID_Y:
        return (f"needs batch * heads_q <= {MAX_GRID_Y} (the second launch axis), "
                f"got {problem.batch * problem.heads_q}")
    return None


def shared_memory_reason(problem, smem_bytes: int) -> str | None:
    """Why tiles of ``smem_bytes`` cannot launch on ``problem``'s device (``None`` when they can,
    or when the device's limit is not in :data:`SMEM_OPTIN_BYTES`: the launch then reports it)."""
    limit = SMEM_OPTIN_BYTES.get(tuple(problem.capability or ()))
    if limit is not None and smem_bytes > limit:
        return (f"needs {smem_bytes // 1024} KiB of shared memory per block at head_dim {problem.head_dim}, "
                f"capability {tuple(problem.capability)} allows {limit // 1024} KiB")
    return None


def validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
             head_dims: tuple[int, ...]) -> None:
    """Raise ``TypeError``/``ValueError`` naming the argument and the fix: the structure every entry
    point checks (``flashrung.inputs``), then what the ladder's kernels need."""
    check_qkv(q, k, v, DTYPES, "float16 or bfloat16")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
        if t.stride(3) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides "
                             f"{t.stride()}: pass {name}.contiguous()")
        # Batch/head strides of a size-1 dimension are never used; the sequence stride always is
        # (the copies of masked tail rows still form their addresses).
        strides = [st for i, (st, n) in enumerate(zip(t.stride()[:3], t.shape[:3])) if n > 1 or i == 1]
        if any(st % (COPY_BYTES // ELEMENT_BYTES) for st in strides) or t.data_ptr() % COPY_BYTES:
            raise ValueError(f"{name} must be 16-byte aligned with strides that are multiples of 8 "
                             f"elements (16-byte copies), got strides {t.stride()}: pass {name}.contiguous()")
    B, _, Hq, D = q.shape
    if D not in head_dims:
        raise ValueError(f"head_dim must be one of {head_dims}, got {D}")
    if v.shape[3] != D:
        raise ValueError(f"v's head_dim ({v.shape[3]}) must equal q's ({D}): the ladder's kernels have one head dim")
    Hkv = k.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"heads_q ({Hq}) must be a multiple of heads_kv ({Hkv})")
    if q.shape[0] * Hq > MAX_GRID_Y:
        raise ValueError(f"batch * heads_q must be <= {MAX_GRID_Y}, got {q.shape[0] * Hq}: split the batch")
    check_softmax_scale(softmax_scale)


def host_scale(softmax_scale: float, exp2: bool) -> float:
    """The one scale fold: the kernel multiplies raw scores by this; log2(e) joins it for exp2."""
    return softmax_scale * LOG2E if exp2 else softmax_scale


def launch(kernel, q, k, v, causal: bool, softmax_scale: float, *, cfg: TileConfig, exp2: bool,
           heaviest_first: bool = False, head_dims: tuple[int, ...], constexprs: dict | None = None,
           options: dict | None = None, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
           persistent: bool = False, resolve=None):
    """Validate, allocate (or check the caller's) ``out``/``lse`` and launch ``kernel`` with the
    ladder's argument list. ``persistent``: ``kernel`` walks work items (its argument list ends in
    ``batch_heads``) and is launched on as many programs as the GPU holds at once
    (:func:`persistent_programs`), never more than there are items. ``resolve(compile_with,
    kwargs)`` fills in constexprs only a first compile can decide (:func:`resolved_constexprs`)."""
    validate(q, k, v, softmax_scale, head_dims)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    if out is None:
        out = torch.empty((B, Sq, Hq, D), dtype=q.dtype, device=q.device)       # (b, s_q, h, d)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(3) != 1:
        raise ValueError(f"out must be like q {tuple(q.shape)} {q.dtype} with a contiguous last dimension, "
                         f"got {tuple(out.shape)} {out.dtype} strides {out.stride()}")
    if lse is None:
        lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)    # (b, h, s_q)
    elif (lse.shape != (B, Hq, Sq) or lse.dtype != torch.float32 or not lse.is_contiguous()
          or lse.device != q.device):
        raise ValueError(f"lse must be a contiguous float32 tensor of shape {(B, Hq, Sq)} on {q.device}, "
                         f"got {tuple(lse.shape)} {lse.dtype}")
    if B == 0 or Sq == 0 or Hq == 0:
        return out, lse
    n_m = cdiv(Sq, cfg.block_m)
    # HeaviestFirst launches one flat grid ordered by descending query tile; the others keep the
    # query tile on the fastest launch axis, as the seed's baseline did.
    grid = (n_m * B * Hq,) if heaviest_first else (n_m, B * Hq)
    args = (q, k, v, out, lse,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            Sq, Sk, Hq, Hq // Hkv, host_scale(float(softmax_scale), exp2))
    kwargs = dict(HEAD_DIM=D, IS_CAUSAL=bool(causal), **cfg.constexprs(), **(constexprs or {}),
                  num_warps=cfg.num_warps, num_stages=1, **(options or {}))
    if resolve is not None:
        kwargs = resolved_constexprs(kernel, args, kwargs, resolve)
    if persistent:
        args += (B * Hq,)
        grid = (min(n_m * B * Hq, persistent_programs(kernel, args, kwargs, q.device)),)
    kernel[grid](*args, **kwargs)
    return out, lse


# (kernel, device, specialization, constexprs) -> the constexprs ``resolve`` filled in
_RESOLVED: dict = {}


def resolved_constexprs(kernel, args, kwargs, resolve) -> dict:
    """``kwargs`` as ``resolve(compile_with, kwargs)`` fills them in (ladder.v20: its rings'
    shared-memory offsets, read from the allocation pass of a first compile), once per kernel,
    device and specialization: Triton specializes integers equal to 1 or divisible by 16 and
    pointers by 16-byte alignment, so the key carries each."""
    def spec(a):
        if isinstance(a, torch.Tensor):
            return (a.dtype, a.data_ptr() % 16 == 0)
        if isinstance(a, int):
            return (a == 1, a % 16 == 0)
        return type(a).__name__
    key = (kernel.fn.__qualname__ if hasattr(kernel, "fn") else id(kernel), args[0].device.index,
           tuple(spec(a) for a in args), tuple(sorted((k, v) for k, v in kwargs.items())))
    if key not in _RESOLVED:
        _RESOLVED[key] = resolve(warmup_compiler(kernel, *args, grid=(1,)), dict(kwargs))
    return _RESOLVED[key]


_PERSISTENT_PROGRAMS: dict = {}


def persistent_programs(kernel, args, kwargs, device) -> int:
    """SMs × the CTAs of ``kernel`` (compiled for these arguments) one SM holds at once: the
    size of a persistent grid. Cached per kernel, device and specialization."""
    key = (kernel.fn.__qualname__ if hasattr(kernel, "fn") else id(kernel), device.index, args[0].dtype,
           tuple(sorted((k, v) for k, v in kwargs.items() if not isinstance(v, torch.Tensor))))
    if key not in _PERSISTENT_PROGRAMS:
        compiled = kernel.warmup(*args, grid=(1,), **kwargs)
        compiled._init_handles()    # loads the module: n_regs is read from it
        props = torch.cuda.get_device_properties(device)
        per_sm = resident_ctas_per_sm(compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared,
                                      (props.major, props.minor), props.shared_memory_per_multiprocessor)
        _PERSISTENT_PROGRAMS[key] = props.multi_processor_count * per_sm
    return _PERSISTENT_PROGRAMS[key]


def resident_ctas_per_sm(regs_per_thread: int, num_warps: int, smem_bytes: int, capability: tuple[int, int],
                         smem_per_sm_bytes: int) -> int:
    """CTAs of one kernel an SM holds at once: the least of what its registers (granted per warp
    in :data:`REGISTER_ALLOC_UNIT` units), its shared memory (plus the driver's reserve per CTA),
    its thread slots and the CTA limit allow."""
    regs_per_warp = -(-regs_per_thread * 32 // REGISTER_ALLOC_UNIT) * REGISTER_ALLOC_UNIT
    by_regs = (REGISTERS_PER_SM // regs_per_warp) // num_warps
    by_smem = smem_per_sm_bytes // (smem_bytes + SMEM_RESERVED_PER_CTA_BYTES)
    by_threads = MAX_THREADS_PER_SM.get(capability, 2048) // (32 * num_warps)
    per_sm = min(by_regs, by_smem, by_threads, MAX_CTAS_PER_SM)
    if per_sm < 1:
        raise ValueError(f"a CTA of {num_warps} warps at {regs_per_thread} registers per thread and "
                         f"{smem_bytes} B of shared memory does not fit one SM")
    return per_sm


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# The kernel argument list, shared by every rung (census signature and launcher agree on it).
RUNTIME_ARGS = (
    "q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr",
    "stride_qb", "stride_qs", "stride_qh",
    "stride_kb", "stride_ks", "stride_kh",
    "stride_vb", "stride_vs", "stride_vh",
    "stride_ob", "stride_os", "stride_oh",
    "seqlen_q", "seqlen_k", "heads_q", "group", "qk_scale",
)


def signature(dtype: str = "fp16", runtime_extra: tuple[str, ...] = ()) -> dict:
    """Triton type strings for the runtime arguments (for the ahead-of-time census);
    ``runtime_extra`` names integer arguments a kernel takes after the shared list."""
    sig = {}
    for name in RUNTIME_ARGS + tuple(runtime_extra):
        if name == "lse_ptr":
            sig[name] = "*fp32"
        elif name.endswith("_ptr"):
            sig[name] = f"*{dtype}"
        elif name == "qk_scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def launch_values(batch: int, seqlen: int, heads: int, head_dim: int, group: int = 1) -> dict:
    """The integer arguments :func:`launch` passes for contiguous ``(B, S, H, D)`` tensors of one
    problem — what Triton specializes the launched binary on (``census.as_launched``); the
    persistent rungs' ``batch_heads`` too."""
    from flashrung.evidence.census import contiguous_strides

    return {**contiguous_strides("qkvo", seqlen, heads, head_dim), "seqlen_q": seqlen, "seqlen_k": seqlen,
            "heads_q": heads, "group": group, "batch_heads": batch * heads}


def census_spec(kernel_name: str, fn, *, head_dim: int, causal: bool, cfg: TileConfig,
                extra: dict | None = None, config_extra: dict | None = None, options: dict | None = None,
                runtime_extra: tuple[str, ...] = (), resolve=None, arches: tuple[str, ...] | None = None):
    """One :class:`CensusSpec` of a rung kernel with the shared signature (and ``runtime_extra``);
    ``resolve`` fills in constexprs a first compile decides (``CensusSpec.resolve``), ``arches``
    narrows the architectures it is compiled for."""
    from flashrung.evidence.census import CensusSpec

    constexprs = {"HEAD_DIM": head_dim, "IS_CAUSAL": causal, **cfg.constexprs(), **(extra or {})}
    config = {"head_dim": head_dim, "causal": causal, "dtype": "fp16",
              "tile": f"{cfg.block_m}x{cfg.block_n}", "num_warps": cfg.num_warps, **(config_extra or {})}
    more = {} if arches is None else {"arches": tuple(arches)}
    return CensusSpec(kernel=kernel_name, config=config, fn=fn, signature=signature("fp16", runtime_extra),
                      constexprs=constexprs, num_warps=cfg.num_warps, num_stages=1, gluon=True,
                      extra_options=dict(options or {}), resolve=resolve, **more)


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------

@gluon.constexpr_function
def mma_layout(num_warps):
    """mma.sync m16n8k16 accumulator layout: warps stacked along the query rows."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])


@gluon.constexpr_function
def fma_layout(cols, num_warps):
    """CUDA-core accumulator layout for v0: each thread owns a 4-row x (cols/8) block, warps
    stacked along rows; the S (cols = BLOCK_N) and O (cols = HEAD_DIM) accumulators then share
    one row distribution, so row statistics move between them without data movement."""
    return gl.BlockedLayout([4, cols // 8], [4, 8], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def row_major_layout():
    """Unswizzled row-major shared tile: element (r, c) at r*D + c (v0, v1). A ring of tiles
    ``[stages, rows, cols]`` takes the same 2-D layout (indexed along its leading dimension)."""
    return gl.SwizzledSharedLayout(1, 1, 1, [1, 0])


@gluon.constexpr_function
def xor_swizzled_layout():
    """The seed's XOR swizzle, offset(r, c) = r*D + (c ^ ((r & 7) << 3)): 16-byte chunks
    (8 halves) permuted within each row by the low three row bits (v2 on)."""
    return gl.SwizzledSharedLayout(COPY_BYTES // ELEMENT_BYTES, 1, SWIZZLE_PHASES, [1, 0])


@gluon.constexpr_function
def scalar_copy_layout(num_warps):
    """One 2-byte element per thread per load: the seed's scalar staging loop (64 B per warp)."""
    return gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def vector_copy_layout(cols, num_warps):
    """Eight halves (16 bytes) per thread per copy: one cp.async.cg per chunk, 512 B per warp."""
    vec = COPY_BYTES // ELEMENT_BYTES
    lanes_per_row = min(32, cols // vec)
    return gl.BlockedLayout([1, vec], [32 // lanes_per_row, lanes_per_row], [num_warps, 1], [1, 0])


# --------------------------------------------------------------------------------------------
# Staging global -> shared
# --------------------------------------------------------------------------------------------

@gluon.jit
def stage_tile_scalar(smem, base, n_rows, stride_row, ROWS: gl.constexpr, COLS: gl.constexpr):
    """Load a (ROWS, COLS) tile through registers, 2 bytes per thread per load; rows at or past
    ``n_rows`` are zero (a finite value the mask then removes)."""
    L: gl.constexpr = scalar_copy_layout(gl.num_warps())
    r = gl.arange(0, ROWS, gl.SliceLayout(1, L))
    c = gl.arange(0, COLS, gl.SliceLayout(0, L))
    x = gl.load(base + r[:, None] * stride_row + c[None, :], mask=(r < n_rows)[:, None], other=0.0)
    smem.store(x)


@gluon.jit
def row_keep(r, n_rows, WHOLE: gl.constexpr):
    """The copy predicate of rows ``r``: those below ``n_rows``. With ``WHOLE`` (the caller knows
    every row of the block lies inside the tensor, ladder.v18) a mask the compiler folds to true:
    the copies carry no predicate and no zero-fill (census: no ISETP in v18's unmasked trip)."""
    if WHOLE:
        keep = (r < r.shape[0])[:, None]
    else:
        keep = (r < n_rows)[:, None]
    return keep


@gluon.jit
def stage_tile_async(smem, base, n_rows, stride_row, ROWS: gl.constexpr, COLS: gl.constexpr,
                     WHOLE: gl.constexpr = False):
    """Issue cp.async copies of a (ROWS, COLS) tile, 16 bytes per thread per copy, no register
    destination; rows at or past ``n_rows`` are zero-filled (src-size 0) unless ``WHOLE``
    (:func:`row_keep`). The caller commits and waits. The host guarantees 16-byte alignment
    (``validate``); the hint lets the compiler see it without launch-time specialization, so
    ahead-of-time and JIT code agree."""
    L: gl.constexpr = vector_copy_layout(COLS, gl.num_warps())
    r = gl.arange(0, ROWS, gl.SliceLayout(1, L))
    c = gl.arange(0, COLS, gl.SliceLayout(0, L))
    ptrs = gl.multiple_of(base + r[:, None] * stride_row + c[None, :], [1, COPY_BYTES_K])
    async_copy.async_copy_global_to_shared(smem, ptrs, mask=row_keep(r, n_rows, WHOLE))


@gluon.jit
def stage_rows_async(smem, base, first_row, n_rows, stride_row, ROWS: gl.constexpr, COLS: gl.constexpr,
                     WHOLE: gl.constexpr = False):
    """:func:`stage_tile_async` of the rows ``first_row + r`` of a tensor at ``base``, each row's
    64-bit offset formed from ``first_row + r`` where it is used: the whole-tile form adds the
    block's offset to the base and keeps the tile's per-row offsets, one 64-bit pair per row a
    thread copies (8 at 64 × 128), live across a key loop."""
    L: gl.constexpr = vector_copy_layout(COLS, gl.num_warps())
    r = gl.arange(0, ROWS, gl.SliceLayout(1, L))
    c = gl.arange(0, COLS, gl.SliceLayout(0, L))
    rows = (first_row + r).to(gl.int64)
    ptrs = gl.multiple_of(base + rows[:, None] * stride_row + c[None, :], [1, COPY_BYTES_K])
    async_copy.async_copy_global_to_shared(smem, ptrs, mask=row_keep(r, n_rows, WHOLE))


@gluon.jit
def issue_kv_async_one_stride(k_dst, v_dst, k_base, v_base, start_n, n_rows, stride_kv,
                              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, WHOLE: gl.constexpr = False):
    """:func:`issue_kv_async` for K and V with one row stride (the usual case: both
    ``(B, S, H, D)`` of one shape): the two tiles share each thread's row offsets, so the key
    loop keeps one 64-bit offset per row a thread copies instead of two."""
    L: gl.constexpr = vector_copy_layout(HEAD_DIM, gl.num_warps())
    r = gl.arange(0, BLOCK_N, gl.SliceLayout(1, L))
    c = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, L))
    offs = r[:, None] * stride_kv + c[None, :]
    row0 = start_n.to(gl.int64) * stride_kv
    keep = row_keep(r, n_rows, WHOLE)
    async_copy.async_copy_global_to_shared(k_dst, gl.multiple_of(k_base + row0 + offs, [1, COPY_BYTES_K]), mask=keep)
    async_copy.async_copy_global_to_shared(v_dst, gl.multiple_of(v_base + row0 + offs, [1, COPY_BYTES_K]), mask=keep)


@gluon.jit
def stage_kv_scalar(k_dst, v_dst, k_base, v_base, start_n, n_rows, stride_ks, stride_vs,
                    BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Stage the key block starting at ``start_n`` through registers, 2 bytes per load."""
    stage_tile_scalar(k_dst, k_base + start_n.to(gl.int64) * stride_ks, n_rows, stride_ks, BLOCK_N, HEAD_DIM)
    stage_tile_scalar(v_dst, v_base + start_n.to(gl.int64) * stride_vs, n_rows, stride_vs, BLOCK_N, HEAD_DIM)


@gluon.jit
def issue_kv_async(k_dst, v_dst, k_base, v_base, start_n, n_rows, stride_ks, stride_vs,
                   BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, WHOLE: gl.constexpr = False):
    """cp.async the key block starting at ``start_n`` into ``k_dst``/``v_dst`` (one commit
    group for both tiles; the caller commits)."""
    stage_tile_async(k_dst, k_base + start_n.to(gl.int64) * stride_ks, n_rows, stride_ks, BLOCK_N, HEAD_DIM, WHOLE)
    stage_tile_async(v_dst, v_base + start_n.to(gl.int64) * stride_vs, n_rows, stride_vs, BLOCK_N, HEAD_DIM, WHOLE)


@gluon.jit
def stage_q_tile(q_smem, q_base, n_rows, stride_qs, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                 ASYNC_COPY: gl.constexpr):
    """Stage the query tile and make it visible to every warp: through registers (v0-v2) or by
    cp.async, waited for at once (v3 on)."""
    if ASYNC_COPY:
        stage_tile_async(q_smem, q_base, n_rows, stride_qs, BLOCK_M, HEAD_DIM)
        async_copy.commit_group()
        async_copy.wait_group(0)
    else:
        stage_tile_scalar(q_smem, q_base, n_rows, stride_qs, BLOCK_M, HEAD_DIM)
    gl.thread_barrier()


@gluon.jit
def stage_kv_block(k_smem, v_smem, k_base, v_base, start_n, n_rows, stride_ks, stride_vs,
                   BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, ASYNC_COPY: gl.constexpr):
    """Stage the key block starting at ``start_n`` into the single K/V buffer and make it visible
    to every warp: through registers (v0-v2) or by cp.async, waited for at once (v3 on)."""
    if ASYNC_COPY:
        issue_kv_async(k_smem, v_smem, k_base, v_base, start_n, n_rows, stride_ks, stride_vs,
                       BLOCK_N, HEAD_DIM)
        async_copy.commit_group()
        async_copy.wait_group(0)
    else:
        stage_kv_scalar(k_smem, v_smem, k_base, v_base, start_n, n_rows, stride_ks, stride_vs,
                        BLOCK_N, HEAD_DIM)
    gl.thread_barrier()


# --------------------------------------------------------------------------------------------
# Which tile a program owns
# --------------------------------------------------------------------------------------------

@gluon.jit
def program_tile(heads_q, BLOCK_M: gl.constexpr, TAIL_HEAVIEST_FIRST: gl.constexpr = False):
    """Grid (query tiles, batch*heads) with the query tile on the fastest launch axis: each
    head's cheapest causal tile is dispatched first (the order v0-v4 inherit from the seed).
    ``TAIL_HEAVIEST_FIRST`` (v19): the grid's last batch*head row, dispatched last, runs its tiles
    heaviest first, so the launch does not end on that head's heaviest tiles."""
    pid_bh = gl.program_id(1)
    m_block = gl.program_id(0)
    if TAIL_HEAVIEST_FIRST:
        if pid_bh == gl.num_programs(1) - 1:
            m_block = gl.num_programs(0) - 1 - m_block
    return pid_bh // heads_q, pid_bh % heads_q, m_block * BLOCK_M


@gluon.jit
def program_tile_heaviest_first(seqlen_q, heads_q, BLOCK_M: gl.constexpr):
    """Flat grid in HeaviestFirst (LPT) order: primary key the query tile, descending (under
    causality a tile's cost grows with its index), secondary key batch*heads."""
    n_m = gl.cdiv(seqlen_q, BLOCK_M)
    return item_tile(gl.program_id(0), n_m, gl.num_programs(0) // n_m, heads_q, BLOCK_M, True)


@gluon.jit
def item_tile(item, n_m, n_bh, heads_q, BLOCK_M: gl.constexpr, HEAVIEST_FIRST: gl.constexpr):
    """(batch, head, first query row) of work item ``item`` of ``n_m`` query tiles times ``n_bh``
    batch*heads, in the order the launch-per-tile grids dispatch them: HeaviestFirst (descending
    query tile, then batch*heads) or the seed's (query tile fastest)."""
    if HEAVIEST_FIRST:
        pid_bh = item % n_bh
        tile = n_m - 1 - item // n_bh
    else:
        pid_bh = item // n_m
        tile = item % n_m
    return pid_bh // heads_q, pid_bh % heads_q, tile * BLOCK_M


@gluon.jit
def program_tile_heaviest_first_in_sections(seqlen_q, seqlen_k, heads_q, group, BLOCK_M: gl.constexpr,
                                            HEAD_DIM: gl.constexpr):
    """Flat grid in HeaviestFirst order inside sections of batch*heads whose K/V fit in L2
    (``hopper.schedule.head_section``'s rule, here from the runtime key length): descending query
    tile, then the section's columns; sections one after another. v5's order runs every head's
    heaviest tiles together, so at long sequences the resident CTAs stream the K/V of all heads
    at once; here they share the K/V of one section."""
    n_m = gl.cdiv(seqlen_q, BLOCK_M)
    n_bh = gl.num_programs(0) // n_m
    kv_heads = gl.maximum(L2_SECTION_BYTES // (2 * seqlen_k * HEAD_DIM * ELEMENT_BYTES_K), 1)
    b, h, m_block = tile_coords(gl.program_id(0), n_m, n_bh, heads_q, group * kv_heads, True)
    return b, h, m_block * BLOCK_M


@gluon.jit
def cta_tile(seqlen_q, seqlen_k, heads_q, group, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
             HEAVIEST_FIRST: gl.constexpr, L2_SECTIONS: gl.constexpr, TAIL_HEAVIEST_FIRST: gl.constexpr = False):
    """(batch, head, first query row) of this program, in HeaviestFirst order (v5 on, causal),
    HeaviestFirst inside L2-sized head sections (v9, causal) or the seed's order."""
    if HEAVIEST_FIRST:
        if L2_SECTIONS:
            b, h, start_m = program_tile_heaviest_first_in_sections(seqlen_q, seqlen_k, heads_q, group, BLOCK_M,
                                                                    HEAD_DIM)
        else:
            b, h, start_m = program_tile_heaviest_first(seqlen_q, heads_q, BLOCK_M)
    else:
        b, h, start_m = program_tile(heads_q, BLOCK_M, TAIL_HEAVIEST_FIRST)
    return b, h, start_m


@gluon.jit
def tile_start(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
               stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
               BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, HEAVIEST_FIRST: gl.constexpr = False,
               L2_SECTIONS: gl.constexpr = False, TAIL_HEAVIEST_FIRST: gl.constexpr = False):
    """This program's first query row in the rung's order (:func:`cta_tile`) and the base
    pointers of its tile (:func:`tile_bases`): (start_m, q_base, k_base, v_base, o_base, lse_base)."""
    b, h, start_m = cta_tile(seqlen_q, seqlen_k, heads_q, group, BLOCK_M, HEAD_DIM, HEAVIEST_FIRST, L2_SECTIONS,
                             TAIL_HEAVIEST_FIRST)
    q_base, k_base, v_base, o_base, lse_base = tile_bases(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, b, h, start_m, stride_qb, stride_qs, stride_qh,
        stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_os, stride_oh,
        seqlen_q, heads_q, group)
    return start_m, q_base, k_base, v_base, o_base, lse_base


# --------------------------------------------------------------------------------------------
# Masking and loop bounds
# --------------------------------------------------------------------------------------------

@gluon.jit
def kv_loop_end(start_m, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """One past the last key any row of this query tile may see (bottom-right causal)."""
    if IS_CAUSAL:
        hi = gl.minimum(seqlen_k, gl.maximum(start_m + BLOCK_M + seqlen_k - seqlen_q, 0))
    else:
        hi = seqlen_k
    return hi


@gluon.jit
def kv_interior_end(start_m, seqlen_q, seqlen_k, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Key blocks starting before this offset need no mask for any row of the tile: they lie
    inside ``seqlen_k`` and, causal, at or left of the first row's diagonal. A multiple of
    BLOCK_N (blocks start at 0)."""
    if IS_CAUSAL:
        limit = gl.minimum(seqlen_k, gl.maximum(start_m + seqlen_k - seqlen_q + 1, 0))
    else:
        limit = seqlen_k
    return (limit // BLOCK_N) * BLOCK_N


@gluon.jit
def mask_scores(s, offs_m, offs_n, seqlen_k, causal_shift, IS_CAUSAL: gl.constexpr):
    """-inf where the key is past ``seqlen_k`` or, causal, right of the row's diagonal."""
    keep = offs_n[None, :] < seqlen_k
    if IS_CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None] + causal_shift)
    return gl.where(keep, s, float("-inf"))


# --------------------------------------------------------------------------------------------
# Online softmax and epilogue
# --------------------------------------------------------------------------------------------

@gluon.jit
def softmax_update(s, m_i, l_i, qk_scale, EXP2: gl.constexpr):
    """One online-softmax step on raw scores ``s`` (masked entries -inf).

    Returns ``p`` (unnormalised probabilities), ``alpha`` (the factor for the previous
    accumulator and sum), the new running max and the new running sum. ``qk_scale`` is
    ``host_scale(softmax_scale, EXP2)``; with ``EXP2`` everything is in the log2 domain.
    """
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    m_eff = gl.where(m_new == float("-inf"), 0.0, m_new)
    x = s * qk_scale - m_eff[:, None]
    if EXP2:
        p = gl.exp2(x)
        alpha = gl.exp2(m_i - m_eff)
    else:
        p = gl.extra.libdevice.exp(x)
        alpha = gl.extra.libdevice.exp(m_i - m_eff)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def finalize(acc, m_i, l_i, EXP2: gl.constexpr):
    """Normalise the accumulator and form the natural-log LSE; rows that saw no key
    (``l == 0``) give ``out = 0`` and ``lse = -inf``."""
    empty = l_i == 0.0
    inv_l = gl.where(empty, 0.0, 1.0 / gl.where(empty, 1.0, l_i))
    out = acc * inv_l[:, None]
    if EXP2:
        lse = (m_i + gl.log2(l_i)) * LN2_K
    else:
        lse = m_i + gl.log(l_i)
    lse = gl.where(empty, float("-inf"), lse)
    return out, lse


@gluon.jit
def store_tile(o_base, lse_base, out, lse, n_rows, stride_os, BLOCK_M: gl.constexpr,
               HEAD_DIM: gl.constexpr):
    """Write ``out`` (BLOCK_M, HEAD_DIM) in the caller's layout and the row LSE; rows at or
    past ``n_rows`` (the query tail) are not written."""
    L: gl.constexpr = out.type.layout
    rows = gl.arange(0, BLOCK_M, gl.SliceLayout(1, L))
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, L))
    keep = rows < n_rows
    gl.store(o_base + rows[:, None] * stride_os + cols[None, :], out.to(o_base.dtype.element_ty),
             mask=keep[:, None])
    gl.store(lse_base + rows, lse, mask=keep)


@gluon.jit
def tile_bases(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, b, h, start_m,
               stride_qb, stride_qs, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh,
               stride_ob, stride_os, stride_oh, seqlen_q, heads_q, group):
    """Base pointers of this CTA's query tile, its (shared, GQA) K/V head, output and LSE.
    Batch/head/tile offsets in 64-bit: (b, h, s) products overflow 32 bits at long context."""
    b64 = b.to(gl.int64)
    h64 = h.to(gl.int64)
    hk64 = (h // group).to(gl.int64)
    m64 = start_m.to(gl.int64)
    q_base = q_ptr + b64 * stride_qb + h64 * stride_qh + m64 * stride_qs
    k_base = k_ptr + b64 * stride_kb + hk64 * stride_kh
    v_base = v_ptr + b64 * stride_vb + hk64 * stride_vh
    o_base = o_ptr + b64 * stride_ob + h64 * stride_oh + m64 * stride_os
    lse_base = lse_ptr + (b64 * heads_q + h64) * seqlen_q + m64
    return q_base, k_base, v_base, o_base, lse_base


# --------------------------------------------------------------------------------------------
# The mma.sync flash loop (v1 on)
# --------------------------------------------------------------------------------------------

@gluon.jit
def mma_scores(q, k_smem, start_n, offs_m, seqlen_k, causal_shift, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, MASKED: gl.constexpr, Q_CHUNK: gl.constexpr = 0):
    """Raw scores S = Q K^T of one key block on ``mma_v2`` (K fed by ldmatrix), masked unless the
    caller knows the block is interior (``MASKED=False``). ``q`` is Q's A fragments, or with
    ``Q_CHUNK > 0`` Q's shared tile, read ``Q_CHUNK`` head dims at a time with the matching
    columns of K (v8: only one chunk of Q's fragments is ever live)."""
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA)
    if Q_CHUNK > 0:
        HEAD_DIM: gl.constexpr = k_smem.shape[1]
        for d0 in gl.static_range(0, HEAD_DIM, Q_CHUNK):
            s = mma_v2(q.slice(d0, Q_CHUNK, dim=1).load(DOT_A),
                       k_smem.slice(d0, Q_CHUNK, dim=1).permute([1, 0]).load(DOT_B), s)
    else:
        s = mma_v2(q, k_smem.permute([1, 0]).load(DOT_B), s)
    if MASKED:
        s = mask_scores(s, offs_m, start_n + gl.arange(0, BLOCK_N, COL), seqlen_k, causal_shift, IS_CAUSAL)
    return s


@gluon.jit
def mma_pv(acc, p, v_smem):
    """O += P V on ``mma_v2``. S's accumulator fragment is PV's A fragment: the conversion of P
    moves no data (seed 000, 2.3, mechanism 1)."""
    MMA: gl.constexpr = acc.type.layout
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    return mma_v2(gl.convert_layout(p.to(v_smem.dtype), DOT_A), v_smem.load(DOT_B), acc)


@gluon.jit
def allocate_tiles(dtype: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                   SMEM: gl.constexpr):
    """The single-buffered Q, K and V shared tiles. Returns (q_smem, k_smem, v_smem)."""
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], SMEM)
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], SMEM)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], SMEM)
    return q_smem, k_smem, v_smem


@gluon.jit
def stage_and_read_q(q_smem, q_base, n_rows, stride_qs, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                     ASYNC_COPY: gl.constexpr, Q_CHUNK: gl.constexpr = 0):
    """Q staged and read into mma A fragments (ldmatrix, once per tile), or with ``Q_CHUNK > 0``
    left in shared memory for :func:`mma_scores` to read with every key block."""
    stage_q_tile(q_smem, q_base, n_rows, stride_qs, BLOCK_M, HEAD_DIM, ASYNC_COPY)
    if Q_CHUNK > 0:
        q = q_smem
    else:
        q = q_smem.load(gl.DotOperandLayout(0, mma_layout(gl.num_warps()), 2))
    return q


@gluon.jit
def allocate_and_stage_q(q_base, n_rows, stride_qs, dtype: gl.constexpr, BLOCK_M: gl.constexpr,
                         BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, SMEM: gl.constexpr,
                         ASYNC_COPY: gl.constexpr, Q_CHUNK: gl.constexpr = 0):
    """:func:`allocate_tiles` and :func:`stage_and_read_q`. Returns (q, k_smem, v_smem)."""
    q_smem, k_smem, v_smem = allocate_tiles(dtype, BLOCK_M, BLOCK_N, HEAD_DIM, SMEM)
    q = stage_and_read_q(q_smem, q_base, n_rows, stride_qs, BLOCK_M, HEAD_DIM, ASYNC_COPY, Q_CHUNK)
    return q, k_smem, v_smem


@gluon.jit
def flash_state(start_m, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, ROW: gl.constexpr,
                ACC: gl.constexpr):
    """The running max (-inf), running sum (0), output accumulator (0) and absolute query rows
    of a fresh tile; ``ROW`` is the row layout of the scores, ``ACC`` the accumulator's."""
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW)
    l_i = gl.zeros([BLOCK_M], gl.float32, ROW)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, ACC)
    offs_m = start_m + gl.arange(0, BLOCK_M, ROW)
    return m_i, l_i, acc, offs_m


@gluon.jit
def mma_block(q, k_smem, v_smem, acc, m_i, l_i, start_n, hi, offs_m, seqlen_k, causal_shift,
              k_base, v_base, stride_ks, stride_vs, qk_scale, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr,
              ASYNC_COPY: gl.constexpr, EXP2: gl.constexpr, Q_CHUNK: gl.constexpr = 0):
    """One key block of the single-buffered loop (v1-v5, v8): stage K/V, S = Q K^T, mask, online
    softmax, rescale O, O += P V. Returns (acc, m_i, l_i)."""
    stage_kv_block(k_smem, v_smem, k_base, v_base, start_n, hi - start_n, stride_ks, stride_vs,
                   BLOCK_N, HEAD_DIM, ASYNC_COPY)
    s = mma_scores(q, k_smem, start_n, offs_m, seqlen_k, causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, True, Q_CHUNK)
    p, alpha, m_i, l_i = softmax_update(s, m_i, l_i, qk_scale, EXP2)
    acc = mma_pv(acc * alpha[:, None], p, v_smem)
    gl.thread_barrier()  # every warp is done reading K/V before the next block overwrites them
    return acc, m_i, l_i


@gluon.jit
def attention_mma_cp_async(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
    qk_scale, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, EXP2: gl.constexpr, HEAVIEST_FIRST: gl.constexpr, Q_CHUNK: gl.constexpr = 0,
    L2_SECTIONS: gl.constexpr = False, STAGGER: gl.constexpr = False,
):
    """The whole single-buffered cp.async kernel of v3-v5 and v8 (XOR-swizzled tiles), one query
    tile per program; each switch is one rung's lever: ``EXP2`` the exponential (v4: exp2, log2
    domain), ``HEAVIEST_FIRST`` the CTA order (v5; with ``L2_SECTIONS`` inside L2-sized head
    sections, v9), ``Q_CHUNK`` Q read from shared memory in head-dim chunks with every key block
    (v8, with its two-slab tile), ``STAGGER`` each CTA's key sweep started at its own block and
    wrapped around (v10: ``hopper.schedule.kv_stagger``; every block is masked here, so any order
    is exact). (v1/v2's scalar-staged body reads the loop bound later, after Q is staged:
    moving that one line changes their SASS, so the two bodies stay apart.)"""
    b, h, start_m = cta_tile(seqlen_q, seqlen_k, heads_q, group, BLOCK_M, HEAD_DIM, HEAVIEST_FIRST, L2_SECTIONS)
    q_smem, k_smem, v_smem = allocate_tiles(q_ptr.dtype.element_ty, BLOCK_M, BLOCK_N, HEAD_DIM, xor_swizzled_layout())
    cp_async_tile(q_smem, k_smem, v_smem, b, h, start_m, q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                  stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                  stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group, qk_scale,
                  HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, EXP2, Q_CHUNK, STAGGER)


@gluon.jit
def attention_mma_cp_async_persistent(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
    qk_scale, batch_heads, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, EXP2: gl.constexpr, HEAVIEST_FIRST: gl.constexpr,
):
    """The same kernel on a persistent grid (v5's measured arm): as many programs as fit on the
    GPU at once, each walking the work items ``program_id, program_id + num_programs, ...`` of the
    launch-per-tile grid's order (:func:`item_tile`) with one set of shared tiles. The wave
    quantization of the launch-per-tile grid goes; in its place every item after a program's first
    pays the decode and a CTA barrier (below)."""
    q_smem, k_smem, v_smem = allocate_tiles(q_ptr.dtype.element_ty, BLOCK_M, BLOCK_N, HEAD_DIM, xor_swizzled_layout())
    n_m = gl.cdiv(seqlen_q, BLOCK_M)
    for item in range(gl.program_id(0), n_m * batch_heads, gl.num_programs(0)):
        b, h, start_m = item_tile(item, n_m, batch_heads, heads_q, BLOCK_M, HEAVIEST_FIRST)
        # write-after-read on the shared tiles: this item's Q (and first K/V) copies must not
        # land before every warp has read the previous item's Q fragments and last K/V block (a
        # previous item with no key block passes no barrier of the loop's own)
        gl.thread_barrier()
        cp_async_tile(q_smem, k_smem, v_smem, b, h, start_m, q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                      stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                      stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group, qk_scale,
                      HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, EXP2, 0, False)


@gluon.jit
def cp_async_tile(q_smem, k_smem, v_smem, b, h, start_m, q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                  stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                  stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group, qk_scale,
                  HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  EXP2: gl.constexpr, Q_CHUNK: gl.constexpr, STAGGER: gl.constexpr):
    """One query tile of the single-buffered cp.async kernel on the given shared tiles: stage Q,
    sweep the key blocks (:func:`mma_block`), write O and the LSE."""
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    q_base, k_base, v_base, o_base, lse_base = tile_bases(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, b, h, start_m, stride_qb, stride_qs, stride_qh,
        stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_os, stride_oh,
        seqlen_q, heads_q, group)
    hi = kv_loop_end(start_m, seqlen_q, seqlen_k, BLOCK_M, IS_CAUSAL)
    q = stage_and_read_q(q_smem, q_base, seqlen_q - start_m, stride_qs, BLOCK_M, HEAD_DIM, True, Q_CHUNK)
    m_i, l_i, acc, offs_m = flash_state(start_m, BLOCK_M, HEAD_DIM, gl.SliceLayout(1, MMA), MMA)
    causal_shift = seqlen_k - seqlen_q
    n_blocks = gl.cdiv(hi, BLOCK_N)
    n_rot, first = kv_stagger(start_m // BLOCK_M, 0, n_blocks, n_blocks, STAGGER, STAGGER_WINDOW_BLOCKS)
    for start_n in range(0, hi, BLOCK_N):
        # the block this trip visits: start_n itself, or its place in the staggered sweep (v10)
        block_n0 = start_n
        if STAGGER:
            block_n0 = kv_visit(start_n // BLOCK_N, 0, n_rot, first, True) * BLOCK_N
        acc, m_i, l_i = mma_block(q, k_smem, v_smem, acc, m_i, l_i, block_n0, hi, offs_m, seqlen_k, causal_shift,
                                  k_base, v_base, stride_ks, stride_vs, qk_scale,
                                  BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL, True, EXP2, Q_CHUNK)
    out, lse = finalize(acc, m_i, l_i, EXP2)
    store_tile(o_base, lse_base, out, lse, seqlen_q - start_m, stride_os, BLOCK_M, HEAD_DIM)


@gluon.jit
def ring_tile(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
              stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
              HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              KV_STAGES: gl.constexpr, TAIL_HEAVIEST_FIRST: gl.constexpr = False):
    """The start every ring kernel shares (v3's arm, v12, v13, v14): this program's tile in the
    seed's order (``TAIL_HEAVIEST_FIRST``: v19's, :func:`program_tile`), its base pointers and
    key-loop end, the Q tile and a ``KV_STAGES``-slot K/V ring (XOR-swizzled) in shared memory,
    and Q's copy issued as the first commit group.
    Returns (q_smem, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi)."""
    SMEM: gl.constexpr = xor_swizzled_layout()
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    start_m, q_base, k_base, v_base, o_base, lse_base = tile_start(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        BLOCK_M, HEAD_DIM, False, False, TAIL_HEAVIEST_FIRST)
    hi = kv_loop_end(start_m, seqlen_q, seqlen_k, BLOCK_M, IS_CAUSAL)
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], SMEM)
    k_smem = gl.allocate_shared_memory(dtype, [KV_STAGES, BLOCK_N, HEAD_DIM], SMEM)
    v_smem = gl.allocate_shared_memory(dtype, [KV_STAGES, BLOCK_N, HEAD_DIM], SMEM)
    stage_tile_async(q_smem, q_base, seqlen_q - start_m, stride_qs, BLOCK_M, HEAD_DIM)
    async_copy.commit_group()
    return q_smem, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi


@gluon.jit
def attention_mma_cp_async_ring(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
    qk_scale, HEAD_DIM: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, KV_STAGES: gl.constexpr, EXP2: gl.constexpr, Q_CHUNK: gl.constexpr = 0,
):
    """The double-buffered cp.async kernel (v3's measured arm, v12): a ring of ``KV_STAGES`` (= 2)
    K/V slots, block j+1 in flight while block j is consumed; one commit per trip, so
    ``wait_group(KV_STAGES - 1)`` always means "block j has landed". ``EXP2`` as in
    :func:`attention_mma_cp_async` (v3: expf, v12: v4's exp2); ``Q_CHUNK`` as there (v13: v8's
    two-slab tile on the ring)."""
    MMA: gl.constexpr = mma_layout(gl.num_warps())
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)

    q_smem, k_smem, v_smem, k_base, v_base, o_base, lse_base, start_m, hi = ring_tile(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, heads_q, group,
        HEAD_DIM, IS_CAUSAL, BLOCK_M, BLOCK_N, KV_STAGES)
    # Prologue: block 0 into slot 0 (zero rows, no global reads, when the loop is empty).
    issue_kv_async(k_smem.index(0), v_smem.index(0), k_base, v_base, gl.to_tensor(0), hi,
                   stride_ks, stride_vs, BLOCK_N, HEAD_DIM)
    async_copy.commit_group()
    async_copy.wait_group(KV_STAGES - 1)  # groups complete in order: Q is in
    gl.thread_barrier()
    if Q_CHUNK > 0:
        q = q_smem
    else:
        q = q_smem.load(DOT_A)

    m_i, l_i, acc, offs_m = flash_state(start_m, BLOCK_M, HEAD_DIM, ROW, MMA)
    causal_shift = seqlen_k - seqlen_q
    for start_n in range(0, hi, BLOCK_N):
        j = start_n // BLOCK_N
        # Block j+1 into the other slot (a zero-row copy past the end keeps one commit per
        # iteration, so wait_group(KV_STAGES - 1) always means "block j has landed").
        nxt = start_n + BLOCK_N
        issue_kv_async(k_smem.index((j + 1) % KV_STAGES), v_smem.index((j + 1) % KV_STAGES),
                       k_base, v_base, nxt, hi - nxt, stride_ks, stride_vs, BLOCK_N, HEAD_DIM)
        async_copy.commit_group()
        async_copy.wait_group(KV_STAGES - 1)
        gl.thread_barrier()
        k_cur = k_smem.index(j % KV_STAGES)
        v_cur = v_smem.index(j % KV_STAGES)
        s = mma_scores(q, k_cur, start_n, offs_m, seqlen_k, causal_shift, BLOCK_M, BLOCK_N, IS_CAUSAL, True,
                       Q_CHUNK)
        p, alpha, m_i, l_i = softmax_update(s, m_i, l_i, qk_scale, EXP2)
        acc = mma_pv(acc * alpha[:, None], p, v_cur)
        gl.thread_barrier()  # every warp is done reading this slot before a copy overwrites it
    async_copy.wait_group(0)  # drain the trailing zero-row prefetch before the CTA exits

    out, lse = finalize(acc, m_i, l_i, EXP2)
    store_tile(o_base, lse_base, out, lse, seqlen_q - start_m, stride_os, BLOCK_M, HEAD_DIM)
