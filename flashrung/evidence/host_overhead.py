"""Host time per call of ``flashrung.attention`` and of the peers' Python entry points.

At small problems the host path, not the kernel, sets the rate: a call whose host path takes longer
than its kernel leaves the GPU idle between launches however fast the kernel is. This probe times
that path alone: a shape whose kernel is far shorter than any host path (B1 S128 H1 by default),
``--calls`` calls back to back after a warm-up, no synchronisation between them, wall time divided
by the count. Rows for each layer of flashrung's path (the public call, the forced kernel, the
kernel's ``forward``, the same through ``JITFunction.run`` instead of the direct launch) say
where the time goes; cuDNN (through SDPA) and FA4 (when
``flash_attn.cute`` imports) are the yardsticks. ``--profile PATH`` adds a cProfile of the public
call. Needs a CUDA GPU; numbers are host-CPU specific (compare rows of one run, not across
machines).

``--frozen`` adds the frozen row max's host price in parts where the default is the online step
(:func:`frozen_rows`).

``python -m flashrung.evidence.host_overhead [--headdim 128] [--calls 400] [--frozen] [--profile out.txt]``
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch


def per_call_us(fn, calls: int, warmup: int = 20) -> float:
    """Mean wall time of ``fn()`` over ``calls`` back-to-back calls, in µs (no synchronisation
    between calls; one before and one after)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def frozen_rows(module, kernel: str, problem, q, k, v, causal: bool, scale: float, calls: int,
                mask: str) -> list[tuple[str, float]]:
    """The frozen row max's host price in parts, at a call below its work threshold (where the
    default is the online step): the kernel's ``forward`` with the frozen step given as its
    configuration, the public call forcing it by ``impl="hopper.fwd@freeze_row_max=true,..."`` (a
    compare's arm, with what the frozen step brings: ``config.FREEZE_ROW_MAX_BRINGS``), and the guard's recompute launched alone on a clear word (what the frozen call adds to
    the online one's launches). The online ``forward`` row beside them is the baseline."""
    import flashrung
    from flashrung.kernels.hopper.config import FREEZE_ROW_MAX_BRINGS
    from flashrung.kernels.portable.fwd import recompute_flagged

    # the frozen step as a default takes it: with what it brings (FA4's order, two K/V loops), so
    # that every head dim and mask can force it
    overrides = {"freeze_row_max": "true", **{key: str(value).lower() for key, value in FREEZE_ROW_MAX_BRINGS.items()}}
    frozen = module.config_with(problem, overrides)
    impl = f"{kernel}@" + ",".join(f"{key}={value}" for key, value in overrides.items())
    out = [(f"{kernel} forward, frozen step given ({mask})",
            per_call_us(lambda: module.forward(q, k, v, causal, scale, frozen), calls)),
           (f"flashrung.attention, impl=...@freeze_row_max=true ({mask})",
            per_call_us(lambda: flashrung.attention(q, k, v, causal=causal, impl=impl), calls))]
    o, lse = module.forward(q, k, v, causal, scale, frozen)
    guard = module.guard_word(q.device.index)
    out.append((f"recompute_flagged alone, guard clear ({mask})",
                per_call_us(lambda: recompute_flagged(guard, q, k, v, o, lse, causal, scale, reset=True), calls)))
    return out


def rows(batch: int, seqlen: int, heads: int, head_dim: int, calls: int,
         frozen: bool = False) -> list[tuple[str, float]]:
    import flashrung
    from flashrung import dispatch

    q = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    scale = head_dim ** -0.5
    out = []
    for causal in (True, False):
        mask = "causal" if causal else "full"
        public = per_call_us(lambda: flashrung.attention(q, k, v, causal=causal), calls)
        out.append((f"flashrung.attention ({mask})", public))
        problem = dispatch.Problem.of(q, k, v, causal)
        module, chosen = dispatch.select(problem, "fwd")
        direct = per_call_us(lambda: module.forward(q, k, v, causal, scale), calls)
        out.append((f"{chosen.kernel} forward ({mask})", direct))
        if hasattr(module, "DIRECT_LAUNCH"):
            # the same call with every launch through JITFunction.run: what the direct launch saves
            saved, module.DIRECT_LAUNCH = module.DIRECT_LAUNCH, False
            try:
                ordinary = per_call_us(lambda: module.forward(q, k, v, causal, scale), calls)
            finally:
                module.DIRECT_LAUNCH = saved
            out.append((f"{chosen.kernel} forward, JITFunction.run ({mask})", ordinary))
        cfg = module.select_config(problem) if hasattr(module, "select_config") else None
        if getattr(cfg, "freeze_row_max", False):
            # the frozen row max's guard adds a recompute launch to the call: the online step's
            # default on the same call, so that its host price reads as the difference of two rows
            online = module.select_config(problem, frozen_step=False)
            out.append((f"{chosen.kernel} forward, freeze_row_max off ({mask})",
                        per_call_us(lambda: module.forward(q, k, v, causal, scale, online), calls)))
        elif frozen and hasattr(module, "guard_word"):
            out += frozen_rows(module, chosen.kernel, problem, q, k, v, causal, scale, calls, mask)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    try:
        out.append(("cuDNN (torch SDPA, causal)", per_call_us(cudnn, calls)))
    except RuntimeError as exc:
        out.append((f"cuDNN unavailable: {str(exc).splitlines()[0][:60]}", float("nan")))
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError:
        out.append(("FA4 (flash_attn.cute) not installed", float("nan")))
    else:
        out.append(("FA4 flash_attn_func (causal)", per_call_us(lambda: flash_attn_func(q, k, v, causal=True), calls)))
    out.append(("two torch.empty (floor)", per_call_us(lambda: (torch.empty_like(q), torch.empty_like(q)), calls)))
    return out


def profile_text(batch: int, seqlen: int, heads: int, head_dim: int, calls: int) -> str:
    import flashrung

    q = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    fn = lambda: flashrung.attention(q, k, v, causal=True)  # noqa: E731
    per_call_us(fn, 1)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(50)
    return text.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashrung.evidence.host_overhead",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqlen", type=int, default=128)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--calls", type=int, default=400, help="timed calls per row (default 400)")
    ap.add_argument("--frozen", action="store_true",
                    help="on Hopper, also the frozen row max's host price in parts (its forward given the frozen "
                         "step, the public call forcing it, its recompute launched alone) where the default is online")
    ap.add_argument("--profile", metavar="PATH", help="also write a cProfile of flashrung.attention to PATH")
    args = ap.parse_args(argv)
    for name in ("batch", "seqlen", "heads", "headdim", "calls"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not torch.cuda.is_available():
        print("host_overhead needs a CUDA GPU: it times real launches", file=sys.stderr)
        return 2
    shape = (args.batch, args.seqlen, args.heads, args.headdim)
    print(f"host time per call, B{args.batch} S{args.seqlen} H{args.heads} d{args.headdim} bf16, "
          f"{args.calls} back-to-back calls on {torch.cuda.get_device_name()}")
    for name, us in rows(*shape, args.calls, frozen=args.frozen):
        print(f"  {name:44s} {us:8.1f} µs")
    if args.profile:
        with open(args.profile, "w") as fh:
            fh.write(profile_text(*shape, args.calls))
        print(f"wrote {args.profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
