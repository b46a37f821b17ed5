"""The mma.sync ceiling: a Gluon ``mma_v2`` GEMM, the denominator the ladder is read against.

The ladder's kernels issue ``mma.sync.aligned.m16n8k16`` (Hopper runs it on the legacy path;
its native instruction is wgmma), so their speed-of-light is not the cuBLAS GEMM ceiling but the
best a GEMM built from the same instruction, the same ldmatrix operand path and the same cp.async
staging reaches. This kernel is that GEMM: ``C = A @ B^T`` (A (M, K), B (N, K), both K-contiguous
— the QK^T orientation), a ``NUM_STAGES``-deep cp.async ring of swizzled A/B tiles, one commit
per k-step, fp32 accumulation, fp16/bf16 output. Measure it at several tiles and take the best
(``CEILING_TILES``); the selfcheck does.
"""
from __future__ import annotations

import dataclasses

import torch

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from flashrung.kernels.ladder.common import COPY_BYTES, vector_copy_layout
from flashrung import jsonfile


@dataclasses.dataclass(frozen=True)
class GemmTile:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    warps_m: int = 2
    warps_n: int = 4
    num_stages: int = 3   # cp.async ring depth: NUM_STAGES - 1 k-steps in flight

    @property
    def num_warps(self) -> int:
        return self.warps_m * self.warps_n

    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} w{self.warps_m}x{self.warps_n} "
                f"s{self.num_stages}")


# Tiles the ceiling is taken over (the best one is the ceiling).
CEILING_TILES = (
    GemmTile(128, 128, 32, 2, 4, 3),
    GemmTile(128, 128, 32, 2, 4, 4),
    GemmTile(128, 256, 32, 2, 4, 3),
    GemmTile(128, 128, 32, 2, 2, 4),
)


@gluon.constexpr_function
def _smem_layout(block_k, element_bytes):
    """XOR swizzle over 16-byte chunks with the phase period of the row length."""
    row_bytes = block_k * element_bytes
    per_phase = max(1, 128 // row_bytes)
    return gl.SwizzledSharedLayout(COPY_BYTES // element_bytes, per_phase, 8 // per_phase, [1, 0])


@gluon.jit
def _issue_tiles(a_dst, b_dst, a_ptr, b_ptr, off_m, off_n, k0, K,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    LA: gl.constexpr = vector_copy_layout(BLOCK_K, gl.num_warps())
    ra = gl.arange(0, BLOCK_M, gl.SliceLayout(1, LA))
    rb = gl.arange(0, BLOCK_N, gl.SliceLayout(1, LA))
    c = gl.arange(0, BLOCK_K, gl.SliceLayout(0, LA))
    a_ptrs = a_ptr + (off_m + ra).to(gl.int64)[:, None] * K + (k0 + c)[None, :]
    b_ptrs = b_ptr + (off_n + rb).to(gl.int64)[:, None] * K + (k0 + c)[None, :]
    async_copy.async_copy_global_to_shared(a_dst, gl.multiple_of(a_ptrs, [1, 16]))
    async_copy.async_copy_global_to_shared(b_dst, gl.multiple_of(b_ptrs, [1, 16]))


@gluon.jit
def mma_v2_gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,  # a (M, K), b (N, K), c (M, N); K % 8 == 0
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                       WARPS_M: gl.constexpr, WARPS_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS_M, WARPS_N],
                                                  instr_shape=[16, 8])
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_B: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    SMEM: gl.constexpr = _smem_layout(BLOCK_K, 2)

    # Grouped launch order: consecutive programs share B tiles in L2.
    GROUP: gl.constexpr = 8
    pid = gl.program_id(0)
    n_m = gl.cdiv(M, BLOCK_M)
    n_n = gl.cdiv(N, BLOCK_N)
    group_id = pid // (GROUP * n_n)
    first_m = group_id * GROUP
    group_size = gl.minimum(n_m - first_m, GROUP)
    pid_m = first_m + (pid % group_size)
    pid_n = (pid % (GROUP * n_n)) // group_size
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    a_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, BLOCK_K], SMEM)
    b_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, BLOCK_K], SMEM)
    k_steps = gl.cdiv(K, BLOCK_K)
    for s in gl.static_range(NUM_STAGES - 1):
        _issue_tiles(a_smem.index(s), b_smem.index(s), a_ptr, b_ptr, off_m, off_n, s * BLOCK_K, K,
                     BLOCK_M, BLOCK_N, BLOCK_K)
        async_copy.commit_group()

    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA)
    for ki in range(k_steps):
        async_copy.wait_group(NUM_STAGES - 2)   # step ki has landed
        gl.thread_barrier()                     # ...for every warp; slot (ki-1) % S is free
        slot = ki % NUM_STAGES
        a = a_smem.index(slot).load(DOT_A)
        b = b_smem.index(slot).permute([1, 0]).load(DOT_B)
        nxt = ki + NUM_STAGES - 1
        if nxt < k_steps:
            _issue_tiles(a_smem.index(nxt % NUM_STAGES), b_smem.index(nxt % NUM_STAGES), a_ptr, b_ptr,
                         off_m, off_n, nxt * BLOCK_K, K, BLOCK_M, BLOCK_N, BLOCK_K)
        async_copy.commit_group()               # one group per step, empty at the tail
        acc = mma_v2(a, b, acc)
    async_copy.wait_group(0)

    rows = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, MMA))
    cols = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, MMA))
    gl.store(c_ptr + rows.to(gl.int64)[:, None] * N + cols[None, :], acc.to(dtype),
             mask=(rows < M)[:, None] & (cols < N)[None, :])


def mma_v2_gemm(a: torch.Tensor, b: torch.Tensor, tile: GemmTile = CEILING_TILES[0]) -> torch.Tensor:
    """``a @ b.T`` with the mma.sync GEMM; a (M, K), b (N, K) contiguous fp16/bf16 on a GPU."""
    if a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype:
        raise TypeError(f"a and b must share a float16/bfloat16 dtype, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"a must be (M, K) and b (N, K), got {tuple(a.shape)} and {tuple(b.shape)}")
    if not (a.is_contiguous() and b.is_contiguous()) or a.data_ptr() % COPY_BYTES or b.data_ptr() % COPY_BYTES:
        raise ValueError("a and b must be contiguous and 16-byte aligned: pass a.contiguous(), b.contiguous()")
    M, K = a.shape
    N = b.shape[0]
    if M % tile.block_m or N % tile.block_n or K % tile.block_k:
        raise ValueError(f"M, N, K must be multiples of the tile {tile.label()}, got {M}, {N}, {K}")
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = ((M // tile.block_m) * (N // tile.block_n),)
    mma_v2_gemm_kernel[grid](a, b, c, M, N, K, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
                             BLOCK_K=tile.block_k, WARPS_M=tile.warps_m, WARPS_N=tile.warps_n,
                             NUM_STAGES=tile.num_stages, num_warps=tile.num_warps, num_stages=1)
    return c


def census_specs():
    from flashrung.evidence.census import CensusSpec

    return [CensusSpec(kernel="ladder.ceiling", config={"tile": t.label(), "dtype": "fp16"},
                       fn=mma_v2_gemm_kernel,
                       signature={"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16",
                                  "M": "i32", "N": "i32", "K": "i32"},
                       constexprs={"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "BLOCK_K": t.block_k,
                                   "WARPS_M": t.warps_m, "WARPS_N": t.warps_n, "NUM_STAGES": t.num_stages},
                       num_warps=t.num_warps, num_stages=1, gluon=True)
            for t in CEILING_TILES]


# How long a GEMM runs on its own before it is timed, ms: the burst clock (0), the quick and default
# protocols' preheat (20, 150), and twice that
SETTLING_PREHEATS_MS = (0.0, 20.0, 150.0, 300.0)
SETTLING_REPEATS = 3
SETTLING_ESTIMATE_CALLS = 3    # calls that size each preheat (the GEMM is already warm)


def settling(dtypes=("bfloat16", "float16"), preheats_ms=SETTLING_PREHEATS_MS, repeats: int = SETTLING_REPEATS,
             *, size: int | None = None, out=print) -> list[dict]:
    """cuBLAS and the best tile of :data:`CEILING_TILES` (the last one, in every run so far) timed
    as ``flashrung bench`` times its ceilings (``ceilings.timed_median``) after each preheat,
    ``repeats`` times, each repeat after a light
    kernel (as a previous tile or an idle GPU leaves the clock): how far a ceiling timed without a
    preheat reads above the one the GPU sustains. Needs a GPU. One row per reading."""
    from flashrung.bench import ceilings, timing
    from flashrung.kernels.ladder import cli

    size = size or cli.GEMM_SIZE
    timer = timing.CudaEventTimer()
    flops = 2 * size ** 3
    light = torch.randn(4096, 4096, device="cuda")
    rows = []
    for dtype in dtypes:
        fns, _ = cli.gemm_fns(dtype, size=size)
        for name in (cli.CUBLAS, CEILING_TILES[-1].label()):
            fn = fns[name]
            timing.measure(timer, fn, 5)
            for preheat in preheats_ms:
                values = []
                for _ in range(repeats):
                    for _ in range(200):
                        light.add_(1.0)
                    torch.cuda.synchronize()
                    ms, _ = ceilings.timed_median(fn, timer, preheat, warmup_calls=SETTLING_ESTIMATE_CALLS)
                    values.append(flops / ms * 1e-9)
                rows.append({"dtype": dtype, "gemm": name, "preheat_ms": preheat, "tflops": values})
                out(f"{dtype:9} {name:22} preheat {preheat:5.0f} ms: "
                    + "  ".join(f"{v:6.1f}" for v in values) + " TFLOP/s")
        del fns
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="How the GEMM ceilings read after 0-300 ms of their own calls "
                                                 "(the clock's settling; needs a GPU).")
    parser.add_argument("--json", help="write the readings here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashrung.kernels.ladder.ceiling: needs a CUDA GPU")
    readings = settling()
    if args.json:
        jsonfile.write(readings, args.json)
