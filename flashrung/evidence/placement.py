"""Does ``hopper.fwd``'s time depend on where its tensors lie? Each placement paired against offset 0.

The ``fa4-protocol`` suite's target row (d128 S16k non-causal) read about 3% slower with all seven
implementations in one process than with any subset tried, while FA4's time did not move
(docs/hopper.md, *Against the peers*). One candidate is the address the caching allocator hands
``hopper.fwd``'s tensors after the other implementations' allocations. This probe fixes the
addresses itself: each arm's tensors are carved at a chosen byte offset from 2 MiB-aligned pools
(the allocator's large segments are 2 MiB-aligned; within one it places blocks at 512-byte
granularity), and each offset is paired against offset 0.

- ``--move`` names what moves: ``out`` (O and its LSE), ``inputs`` (Q, K and V), ``workspace``
  (the split tail's partials: the arm's calls take them from its own pool, through
  ``fwd.tail_workspace``, instead of from the allocator), or ``all``. What does not move is shared
  by both arms (the workspace then comes from the allocator, as in a real call).
- **checked** first: every arm's O and LSE bit-identical to offset 0's on the same input values
  (a placement that changes the result would be a bug, not a speed).
- **timed**: ``flashrung.bench.timing.paired_run`` (AB then BA halves), each block preceded by
  ``--block-preheat-ms`` of its own arm's calls, as ``flashrung compare`` does. The margin is
  ``t(offset 0) ÷ t(offset)``: above 1, the moved placement is faster.

``python -m flashrung.evidence.placement [--batch 2 --seqlen 16384 --heads 16 --headdim 128]
[--causal] [--move out|inputs|workspace|all ...] [--offsets 512,4096,...] [--alternations 20]
[--json PATH]``. Needs an sm_90 GPU. Evidence level: timing (paired, one process).
"""
from __future__ import annotations

import argparse
import contextlib
import sys

from flashrung.evidence.probe_args import add_square_problem, require_positive

MOVES = ("out", "inputs", "workspace", "all")
POOL_ALIGN_BYTES = 2 << 20      # the caching allocator's large segments start 2 MiB-aligned
TMA_ALIGN_BYTES = 16            # a TMA descriptor's global address must be 16-byte aligned
# the allocator's block granularity, a page, 64 KiB, 1 MiB and 1 MiB + 512 B: the last two
# place a tensor off the 2 MiB boundary the way a second block in a segment would lie
DEFAULT_OFFSETS = (512, 4096, 65536, 1 << 20, (1 << 20) + 512)


def offsets_arg(text: str) -> tuple[int, ...]:
    """``--offsets``: comma-separated byte offsets, each a positive multiple of 16 below 2 MiB."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--offsets must be comma-separated integers (bytes), got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("--offsets names no offset")
    for v in values:
        if v <= 0 or v % TMA_ALIGN_BYTES or v >= POOL_ALIGN_BYTES:
            raise argparse.ArgumentTypeError(f"--offsets: each offset must be a positive multiple of {TMA_ALIGN_BYTES} "
                                             f"bytes (TMA's alignment) below {POOL_ALIGN_BYTES}, got {v}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--offsets repeats an offset: {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashrung.evidence.placement",
                                description="hopper.fwd with its tensors at chosen byte offsets, each paired "
                                            "against offset 0")
    add_square_problem(p, batch=2, seqlen=16384)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--move", nargs="+", default=["all"], choices=MOVES,
                   help="what each arm moves (default all); several values run one set of pairs each")
    p.add_argument("--offsets", type=offsets_arg, default=DEFAULT_OFFSETS,
                   help="byte offsets from a 2 MiB boundary, paired against 0 (default 512,4096,65536,1048576,1049088)")
    p.add_argument("--alternations", type=int, default=20, help="paired alternations, even (default 20)")
    p.add_argument("--reps", type=int, default=3, help="timed calls per arm per alternation (default 3)")
    p.add_argument("--block-preheat-ms", type=float, default=150.0,
                   help="each block preceded by this many ms of its own arm's calls (default 150)")
    p.add_argument("--json", default=None)
    return p


def check_args(args) -> None:
    """Refuse what cannot be timed, naming the argument."""
    require_positive(args, ("batch", "seqlen", "heads", "reps"))
    if args.alternations < 2 or args.alternations % 2:
        raise SystemExit(f"--alternations must be an even number >= 2, got {args.alternations}")
    if args.block_preheat_ms < 0:
        raise SystemExit(f"--block-preheat-ms must be >= 0, got {args.block_preheat_ms}")


def moved(move: str) -> frozenset[str]:
    """The tensor groups one ``--move`` value moves."""
    return frozenset(("out", "inputs", "workspace")) if move == "all" else frozenset((move,))


def carve(nbytes: int, offset: int, device, dtype, shape):
    """A fresh contiguous ``dtype`` tensor of ``shape`` (``nbytes`` bytes) whose first byte lies
    exactly ``offset`` bytes past a ``POOL_ALIGN_BYTES`` boundary, as a view of its own pool."""
    import torch

    if offset < 0 or offset % TMA_ALIGN_BYTES:
        raise ValueError(f"offset must be a non-negative multiple of {TMA_ALIGN_BYTES}, got {offset}")
    pool = torch.empty(nbytes + offset + POOL_ALIGN_BYTES, dtype=torch.uint8, device=device)
    start = (-pool.data_ptr()) % POOL_ALIGN_BYTES + offset
    return pool[start:start + nbytes].view(dtype).view(shape)


class PlacedWorkspace:
    """``fwd.tail_workspace``'s signature, carving the split tail's partials from a pool of its own at
    ``offset`` (made on the first call, which the check makes before anything is timed)."""

    def __init__(self, offset: int):
        self.offset = offset
        self._bufs: dict[tuple, object] = {}

    def __call__(self, items, tiles, block_m, head_dim, device):
        import torch

        from flashrung.kernels.hopper.tail_combine import carve_workspace, workspace_words

        key = (items, tiles, block_m, head_dim, str(device))
        if key not in self._bufs:
            words = workspace_words(items, tiles, block_m, head_dim)
            self._bufs[key] = carve(words * 4, self.offset, device, torch.float32, (words,))
        return carve_workspace(self._bufs[key], items, tiles, block_m, head_dim)


@contextlib.contextmanager
def _workspace_from(placed):
    from flashrung.kernels.hopper import fwd

    if placed is None:
        yield
        return
    allocator_workspace, fwd.tail_workspace = fwd.tail_workspace, placed
    try:
        yield
    finally:
        fwd.tail_workspace = allocator_workspace


class Arm:
    """One placement: the tensors it moves carved at ``offset``, the others shared."""

    def __init__(self, offset: int, groups: frozenset, shared: dict, causal: bool, scale: float):
        def place(like):
            return carve(like.numel() * like.element_size(), offset, like.device, like.dtype, like.shape)

        self.offset, self.causal, self.scale = offset, causal, scale
        self.identical = True
        if "inputs" in groups:
            self.q, self.k, self.v = (place(shared[name]).copy_(shared[name]) for name in ("q", "k", "v"))
        else:
            self.q, self.k, self.v = shared["q"], shared["k"], shared["v"]
        if "out" in groups:
            self.out, self.lse = place(shared["out"]), place(shared["lse"])
        else:
            self.out, self.lse = shared["out"], shared["lse"]
        self.workspace = PlacedWorkspace(offset) if "workspace" in groups else None

    def __call__(self):
        from flashrung.kernels.hopper import fwd

        with _workspace_from(self.workspace):
            return fwd.forward(self.q, self.k, self.v, self.causal, self.scale, out=self.out, lse=self.lse)


def _pairs_for(move: str, args, shared, protocol, timer) -> list[dict]:
    import numpy as np
    import torch

    from flashrung.bench import stats
    from flashrung.bench.timing import paired_run

    groups = moved(move)
    arms = [Arm(off, groups, shared, args.causal, args.headdim ** -0.5) for off in (0,) + tuple(args.offsets)]
    base = arms[0]
    results = []
    for arm in arms:
        arm.out.fill_(float("nan"))
        arm.lse.fill_(float("nan"))
        arm()
        torch.cuda.synchronize()
        # the shared out is rewritten by every arm that does not move it: keep offset 0's copy
        if arm is base:
            ref_out, ref_lse = base.out.clone(), base.lse.clone()
        else:
            arm.identical = bool(torch.equal(arm.out, ref_out) and torch.equal(arm.lse, ref_lse))
    for arm in arms[1:]:
        for fn in (base, arm):
            for _ in range(protocol.warmup_calls):
                fn()
        paired = paired_run(base, arm, protocol, timer)
        summary = stats.summarize(paired)
        results.append(dict(move=move, offset=arm.offset, identical=arm.identical,
                            ms_base=float(np.median(paired.baseline)), ms_moved=float(np.median(paired.candidate)),
                            paired=summary.to_json(), run=paired.to_json()))
    return results


def run(args) -> dict:
    import torch

    from flashrung.bench.timing import CudaEventTimer, PairedProtocol

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        raise SystemExit("placement needs an sm_90 GPU (hopper.fwd)")
    device = torch.device("cuda")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    shape_q = (args.batch, args.seqlen, args.heads, args.headdim)
    gen = torch.Generator(device=device).manual_seed(0)
    shared = {name: torch.randn(shape_q, generator=gen, device=device, dtype=dtype) for name in ("q", "k", "v")}
    shared["out"] = torch.empty(shape_q, device=device, dtype=dtype)
    shared["lse"] = torch.empty((args.batch, args.heads, args.seqlen), device=device, dtype=torch.float32)
    protocol = PairedProtocol(alternations=args.alternations, reps=args.reps, block_warmup=1, warmup_calls=5,
                              block_preheat_ms=args.block_preheat_ms)
    timer = CudaEventTimer()
    pairs = []
    for move in args.move:
        pairs += _pairs_for(move, args, shared, protocol, timer)
        torch.cuda.empty_cache()
    return {
        "gpu": torch.cuda.get_device_name(device),
        "problem": dict(batch=args.batch, seqlen=args.seqlen, heads=args.heads, headdim=args.headdim,
                        dtype=args.dtype, causal=args.causal),
        "pool_align_bytes": POOL_ALIGN_BYTES,
        "protocol": protocol.to_json(),
        "pairs": pairs,
        "evidence": "timing (paired, one process, CUDA events); outputs checked bit-identical to offset 0",
    }


def table(result: dict) -> str:
    pr = result["problem"]
    lines = [f"placement — {result['gpu']}, B{pr['batch']} H{pr['heads']} S{pr['seqlen']} d{pr['headdim']} "
             f"{pr['dtype']} {'causal' if pr['causal'] else 'non-causal'}; margin = t(offset 0) / t(offset)",
             f"  {'move':<10} {'offset B':>9} {'ms @0':>8} {'ms moved':>9} {'margin':>7} {'p10':>7} {'p90':>7} "
             f"{'AB':>7} {'BA':>7}  identical"]
    for r in result["pairs"]:
        p = r["paired"]
        lines.append(f"  {r['move']:<10} {r['offset']:>9} {r['ms_base']:>8.4f} {r['ms_moved']:>9.4f} "
                     f"{p['margin']:>7.4f} {p['lo']:>7.4f} {p['hi']:>7.4f} {p['margin_ab']:>7.4f} "
                     f"{p['margin_ba']:>7.4f}  {r['identical']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    result = run(args)
    print(table(result))
    if args.json:
        from flashrung.bench.report import write_json

        print(f"wrote {write_json(result, args.json)}")
    return 0 if all(r["identical"] for r in result["pairs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
