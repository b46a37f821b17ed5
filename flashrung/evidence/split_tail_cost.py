"""Where a split tail's time goes, call by call: whole tiles, the split tail, and its kernel alone.

``hopper.fwd``'s split tail (``split_tail``) shortens the attention kernel's last round and adds a
second launch, the merge (``tail_combine``). A paired margin prices the whole change; this probe
takes it apart for one problem, three arms run in the same process, interleaved block by block:

- ``whole``: the problem's configuration with ``split_tail=False``;
- ``split``: the same with ``split_tail=True`` (and the default merge);
- ``split_kernel``: ``split`` with the merge's launch skipped — its output is not the attention
  (the tail tiles stay unmerged), so it is timed, never checked or returned.

Each arm is timed two ways, ``--calls`` calls a block, ``--blocks`` blocks an arm, round-robin:
launched from the host back to back (CUDA events around the block; the host's launch cost
is in it only where the host falls behind the GPU), and as a CUDA graph of the same calls (the
host's launch cost removed, the kernel boundaries kept). The host's own time per call is the
wall time to enqueue a block (the GPU still busy with the block before). From the medians:
``split − split_kernel`` is the merge with its kernel boundary, ``whole − split_kernel`` what the
shorter last round saves. ``whole`` and ``split`` outputs are checked against each other first.

``python -m flashrung.evidence.split_tail_cost --batch 16 --seqlen 2048 --heads 16 [--headdim 128]
[--blocks 15] [--calls 20] [--set key=value,...] [--json PATH]``. Needs an sm_90 GPU. Evidence
level: timing (one process, interleaved blocks, CUDA events; not a paired keep verdict).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys

from flashrung.evidence.probe_args import add_square_problem, require_positive, set_keys, set_overrides

ARMS = ("whole", "split", "split_kernel")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashrung.evidence.split_tail_cost",
                                description="a split tail's time taken apart: whole tiles, the split tail, "
                                            "its kernel without the merge")
    add_square_problem(p, batch=16, seqlen=2048)
    p.add_argument("--blocks", type=int, default=15, help="timed blocks per arm and way (default 15)")
    p.add_argument("--calls", type=int, default=20, help="calls per block (default 20)")
    p.add_argument("--set", default="", help="config overrides for every arm, key=value,... "
                                             "(as impl='hopper.fwd@...'; not split_tail)")
    p.add_argument("--json", default=None)
    return p


def check_args(args) -> None:
    """Refuse what cannot be timed, naming the argument."""
    require_positive(args, ("batch", "seqlen", "heads", "blocks", "calls"))
    if "split_tail" in set_keys(args.set):
        raise SystemExit("--set must not name split_tail: the arms set it themselves")


def arm_configs(args, capability=(9, 0)) -> dict:
    """``{arm: HopperFwdConfig}``: the problem's configuration (``--set`` applied) with the split
    tail off, and on (``split`` and ``split_kernel`` share it)."""
    import torch

    from flashrung.dispatch import Problem
    from flashrung.kernels.hopper import fwd

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    problem = Problem(batch=args.batch, seqlen_q=args.seqlen, seqlen_k=args.seqlen, heads_q=args.heads,
                      heads_kv=args.heads, head_dim=args.headdim, head_dim_v=args.headdim, dtype=dtype, causal=False,
                      device_type="cuda", capability=capability)
    overrides = set_overrides(args.set)
    whole = fwd.config_with(problem, dict(overrides, split_tail="false"))
    split = fwd.config_with(problem, dict(overrides, split_tail="true"))
    return {"whole": whole, "split": split, "split_kernel": split}


@contextlib.contextmanager
def merge_skipped():
    """``hopper.fwd`` launches with the split tail's merge not launched (timing only: the output's
    tail tiles stay unmerged)."""
    from flashrung.kernels.hopper import fwd

    saved = fwd.combine_tail
    fwd.combine_tail = lambda *a, **k: None
    try:
        yield
    finally:
        fwd.combine_tail = saved


def derive(ms: dict) -> dict:
    """From each way's per-call medians (ms): the merge with its boundary (``split − split_kernel``),
    the last round's saving (``whole − split_kernel``) and the split's net (``whole − split``), in
    µs, and ``split ÷ whole``."""
    out = {}
    for way, t in ms.items():
        out[way] = dict(merge_us=(t["split"] - t["split_kernel"]) * 1e3,
                        round_saved_us=(t["whole"] - t["split_kernel"]) * 1e3,
                        net_us=(t["whole"] - t["split"]) * 1e3,
                        whole_over_split=t["whole"] / t["split"])
    return out


def run(args) -> dict:
    import time

    import numpy as np
    import torch

    from flashrung.kernels.hopper import fwd

    if not torch.cuda.is_available():
        raise SystemExit("split_tail_cost needs a CUDA GPU")
    device = torch.device("cuda")
    cfgs = arm_configs(args, torch.cuda.get_device_capability(device))
    plan = fwd._plan(cfgs["split"], args.batch, args.seqlen, args.seqlen, args.heads, args.heads, args.headdim, 2,
                     False, True, torch.cuda.get_device_properties(device).multi_processor_count)
    if plan.splits <= 1:
        raise SystemExit(f"B{args.batch} H{args.heads} S{args.seqlen} d{args.headdim}: the launch plan splits no "
                         f"tile on this GPU ({plan.num_tiles} tiles)")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    gen = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.seqlen, args.heads, args.headdim, device=device, dtype=dtype,
                           generator=gen) for _ in range(3))
    scale = args.headdim ** -0.5
    ref = fwd.forward(q, k, v, False, scale, cfgs["whole"])
    got = fwd.forward(q, k, v, False, scale, cfgs["split"])
    torch.testing.assert_close(got[0], ref[0], atol=2e-3, rtol=0)
    torch.testing.assert_close(got[1], ref[1], atol=1e-4, rtol=1e-5)

    def calls(arm, n):
        # the merge is skipped around the whole block, so the arm's host time holds no patching
        with merge_skipped() if arm == "split_kernel" else contextlib.nullcontext():
            for _ in range(n):
                fwd.forward(q, k, v, False, scale, cfgs[arm])

    graphs = {}
    for arm in ARMS:
        calls(arm, 3)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            calls(arm, args.calls)
        graphs[arm] = g
        g.replay()
    torch.cuda.synchronize()

    times = {way: {arm: [] for arm in ARMS} for way in ("launched", "graph")}
    host_us = {arm: [] for arm in ARMS}
    for _ in range(args.blocks):
        for arm in ARMS:
            for way in ("launched", "graph"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                if way == "graph":
                    graphs[arm].replay()
                else:
                    calls(arm, args.calls)
                    host_us[arm].append((time.perf_counter() - t0) * 1e6 / args.calls)
                end.record()
                end.synchronize()
                times[way][arm].append(start.elapsed_time(end) / args.calls)
    ms = {way: {arm: float(np.median(t)) for arm, t in by_arm.items()} for way, by_arm in times.items()}
    spread = {way: {arm: [float(np.percentile(t, 10)), float(np.percentile(t, 90))] for arm, t in by_arm.items()}
              for way, by_arm in times.items()}
    return {
        "gpu": torch.cuda.get_device_name(device),
        "problem": dict(batch=args.batch, seqlen=args.seqlen, heads=args.heads, headdim=args.headdim,
                        dtype=args.dtype, causal=False),
        "tail": dict(num_tiles=plan.num_tiles, num_full_tiles=plan.num_full_tiles, num_items=plan.num_items,
                     splits=plan.splits),
        "configs": {arm: dataclasses.asdict(c) for arm, c in cfgs.items() if arm != "split_kernel"},
        "ms_per_call": ms, "p10_p90": spread,
        "host_us_per_call": {arm: float(np.median(t)) for arm, t in host_us.items()},
        "derived": derive(ms),
        "protocol": dict(blocks=args.blocks, calls=args.calls, order="round-robin over arms, launched then graph"),
        "evidence": "timing (one process, interleaved blocks, CUDA events; not a paired keep verdict)",
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    r = run(args)
    t = r["tail"]
    print(f"split tail taken apart — {r['gpu']}, B{args.batch} H{args.heads} S{args.seqlen} d{args.headdim} "
          f"{args.dtype} non-causal: {t['num_tiles']} tiles, {t['num_tiles'] - t['num_full_tiles']} split "
          f"{t['splits']} ways; ms per call, median of {args.blocks} blocks of {args.calls} calls [p10, p90]")
    print(f"{'arm':<13} {'launched':>24} {'CUDA graph':>24} {'host µs/call':>13}")
    for arm in ARMS:
        cells = [f"{r['ms_per_call'][w][arm]:.4f} [{r['p10_p90'][w][arm][0]:.4f}, {r['p10_p90'][w][arm][1]:.4f}]"
                 for w in ("launched", "graph")]
        print(f"{arm:<13} {cells[0]:>24} {cells[1]:>24} {r['host_us_per_call'][arm]:>13.1f}")
    for way, d in r["derived"].items():
        print(f"{way:<9} merge + boundary {d['merge_us']:6.1f} µs, last round saved {d['round_saved_us']:6.1f} µs, "
              f"net {d['net_us']:+6.1f} µs (whole ÷ split {d['whole_over_split']:.4f})")
    if args.json:
        from flashrung.bench.report import write_json

        print(f"wrote {write_json(r, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
