"""What a K/V step costs a CTA whose other consumer warpgroups have no rows: the lone warpgroup's step.

``hopper.fwd`` splits a CTA's query rows over its consumer warpgroups, 64 rows each; a warpgroup
whose rows lie past the sequence passes its K/V tiles without a GEMM (``skip_empty_rows``). How
much of a full step such a CTA still costs is the number a schedule that leaves warpgroups idle
(a partial last tile; causal CTA pairs whose slices end one key tile apart, docs/hopper.md, *Why
causal problems do not pair*) is priced with: the skip of empty rows found it far above the
warpgroup's share of the rows.

Arms: ``w`` live warpgroups, ``w = 1 … block_m / 64``, each a launch of one query tile per head
(Sq = 64·w) against ``--seqlen-k`` keys, non-causal, so every CTA runs the same K/V loop with ``w``
warpgroups attending; ``--batch`` × ``--heads`` tiles (default 33 × 8 = 264, two rounds of 132
SMs). Every arm runs one configuration: the default of the full arm's problem, unpaired
(``kv_multicast=false``: a pair's empty second tile builds without the skip) and without the split
tail (its last round is the same in every arm then); ``--set`` applies on top. Each arm passes the
correctness gate (``flashrung.gate``: poisoned outputs, the fp32 oracle and the low-precision
reference) on its first batch before anything is timed.

Timing: ``--blocks`` blocks of ``--calls`` calls per arm, round-robin over the arms, CUDA events
around each block; medians and p10/p90. ``L_w = t_w / t_full`` against ``w / (block_m / 64)``,
what the arm would cost if a step shortened in proportion to its attending warpgroups.

``python -m flashrung.evidence.lone_warpgroup [--headdim 128] [--seqlen-k 8192] [--batch 33]
[--heads 8] [--blocks 30] [--calls 5] [--set key=value,...] [--json PATH]``. Needs an sm_90 GPU.
Evidence level: timing (one process, interleaved blocks, CUDA events; not a paired keep verdict).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from flashrung.evidence.probe_args import require_positive, set_keys, set_overrides
from flashrung.kernels.hopper.config import ROWS_PER_CONSUMER_WARPGROUP

FIXED = {"kv_multicast": "false", "split_tail": "false"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashrung.evidence.lone_warpgroup",
                                description="a CTA's K/V step with 1 … all of its consumer warpgroups attending")
    p.add_argument("--headdim", type=int, default=128, choices=(64, 128, 256))
    p.add_argument("--seqlen-k", type=int, default=8192, help="keys per head (default 8192)")
    p.add_argument("--batch", type=int, default=33)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--blocks", type=int, default=30, help="timed blocks per arm (default 30)")
    p.add_argument("--calls", type=int, default=5, help="calls per block (default 5)")
    p.add_argument("--set", default="", help="config overrides for every arm, key=value,... "
                                             "(as impl='hopper.fwd@...'; not block_m, kv_multicast, split_tail)")
    p.add_argument("--json", default=None)
    return p


def check_args(args) -> None:
    """Refuse what cannot be timed, naming the argument."""
    require_positive(args, ("seqlen_k", "batch", "heads", "blocks", "calls"))
    fixed = set_keys(args.set) & (set(FIXED) | {"block_m"})
    if fixed:
        raise SystemExit(f"--set must not name {', '.join(sorted(fixed))}: the probe sets it for every arm")


def _dtype(args):
    import torch

    return torch.bfloat16 if args.dtype == "bf16" else torch.float16


def _problem(args, seqlen_q: int, capability=(9, 0)):
    from flashrung.dispatch import Problem

    return Problem(batch=args.batch, seqlen_q=seqlen_q, seqlen_k=args.seqlen_k, heads_q=args.heads,
                   heads_kv=args.heads, head_dim=args.headdim, head_dim_v=args.headdim, dtype=_dtype(args),
                   causal=False, device_type="cuda", capability=capability)


def arm_config(args, capability=(9, 0)):
    """The one configuration every arm runs: the full arm's default (its tile of ``block_m`` rows),
    unpaired, without the split tail, ``--set`` applied."""
    from flashrung.kernels.hopper import fwd

    overrides = set_overrides(args.set)
    block_m = fwd.select_config(_problem(args, 1, capability)).block_m
    return fwd.config_with(_problem(args, block_m, capability), dict(overrides, **FIXED))


def arm_rows(cfg) -> dict[int, int]:
    """``{live warpgroups: Sq}``: one query tile per head, its first ``w`` warpgroups holding rows."""
    warpgroups = cfg.block_m // ROWS_PER_CONSUMER_WARPGROUP
    return {w: w * ROWS_PER_CONSUMER_WARPGROUP for w in range(1, warpgroups + 1)}


def derive(ms: dict[int, float], warpgroups: int) -> dict[int, dict]:
    """Per arm: ``L = t_w / t_full`` and ``in_proportion = w / warpgroups``, what ``L`` would be if
    a step shortened with its attending warpgroups."""
    full = ms[warpgroups]
    return {w: dict(over_full=t / full, in_proportion=w / warpgroups) for w, t in ms.items()}


def run(args) -> dict:
    import functools

    import numpy as np
    import torch

    from flashrung import gate
    from flashrung.kernels.hopper import fwd

    if not torch.cuda.is_available():
        raise SystemExit("lone_warpgroup needs a CUDA GPU")
    device = torch.device("cuda")
    capability = torch.cuda.get_device_capability(device)
    cfg = arm_config(args, capability)
    rows = arm_rows(cfg)
    warpgroups = max(rows)
    dtype = _dtype(args)
    gen = torch.Generator(device).manual_seed(0)
    shape_k = (args.batch, args.seqlen_k, args.heads, args.headdim)
    k, v = (torch.randn(shape_k, device=device, dtype=dtype, generator=gen) for _ in range(2))
    qs = {w: torch.randn(args.batch, sq, args.heads, args.headdim, device=device, dtype=dtype, generator=gen)
          for w, sq in rows.items()}
    scale = args.headdim ** -0.5
    for w, q in qs.items():
        # the first batch: the same build (one configuration, unpaired, so the skip of empty rows is
        # on at every launch) with the oracles' score matrices a batch's worth
        result = gate.check_forward_inputs(functools.partial(fwd.forward, config=cfg), q[:1], k[:1], v[:1], False,
                                           scale, kernel=f"hopper.fwd ({w} of {warpgroups} warpgroups)")
        if not result.passed:
            raise SystemExit(f"{result} — not timed")

    def calls(w, n):
        for _ in range(n):
            fwd.forward(qs[w], k, v, False, scale, cfg)

    for w in qs:
        calls(w, 3)
    torch.cuda.synchronize()
    times = {w: [] for w in qs}
    for _ in range(args.blocks):
        for w in qs:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            calls(w, args.calls)
            end.record()
            end.synchronize()
            times[w].append(start.elapsed_time(end) / args.calls)
    ms = {w: float(np.median(t)) for w, t in times.items()}
    spread = {w: [float(np.percentile(t, 10)), float(np.percentile(t, 90))] for w, t in times.items()}
    plan = fwd._plan(cfg, args.batch, rows[warpgroups], args.seqlen_k, args.heads, args.heads, args.headdim,
                     k.element_size(), False, True, torch.cuda.get_device_properties(device).multi_processor_count)
    return {
        "gpu": torch.cuda.get_device_name(device),
        "problem": dict(batch=args.batch, heads=args.heads, seqlen_k=args.seqlen_k, headdim=args.headdim,
                        dtype=args.dtype, causal=False, seqlen_q_by_arm={str(w): sq for w, sq in rows.items()}),
        "launch": dict(num_tiles=plan.num_tiles, ctas=plan.grid),
        "config": dataclasses.asdict(cfg),
        "ms_per_call": {str(w): t for w, t in ms.items()}, "p10_p90": {str(w): s for w, s in spread.items()},
        "derived": {str(w): d for w, d in derive(ms, warpgroups).items()},
        "protocol": dict(blocks=args.blocks, calls=args.calls, order="round-robin over arms"),
        "evidence": "timing (one process, interleaved blocks, CUDA events; not a paired keep verdict)",
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    r = run(args)
    print(f"the lone warpgroup — {r['gpu']}, d{args.headdim} {args.dtype} non-causal, B{args.batch} H{args.heads} "
          f"Sk {args.seqlen_k}, one query tile a head ({r['launch']['num_tiles']} tiles on {r['launch']['ctas']} CTAs); "
          f"ms per call, median of {args.blocks} blocks of {args.calls} calls [p10, p90]")
    print(f"{'warpgroups':>10} {'Sq':>5} {'ms per call':>28} {'÷ full':>8} {'in proportion':>14}")
    for w, sq in r["problem"]["seqlen_q_by_arm"].items():
        t, (lo, hi), d = r["ms_per_call"][w], r["p10_p90"][w], r["derived"][w]
        print(f"{w:>10} {sq:>5} {f'{t:.4f} [{lo:.4f}, {hi:.4f}]':>28} {d['over_full']:>8.3f} {d['in_proportion']:>14.3f}")
    if args.json:
        from flashrung.bench.report import write_json

        print(f"wrote {write_json(r, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
