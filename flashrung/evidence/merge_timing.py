"""The split tail's merge alone: ``tail_combine`` timed by itself, the chunked merge against ``loads_first``.

``hopper.fwd``'s split tail ends with a second launch (``tail_combine``) that merges every split's
fp32 partial of each tail tile. Its cost is a few microseconds of a call of one to thirteen
milliseconds, under the paired protocol's keep threshold on a whole call (0.22% of 0.93 ms is
2 µs): a change to the merge is priced here, on the merge alone.

For one problem, the split of the launch ``hopper.fwd`` would make (its default configuration with
``split_tail=True``: tail tiles, splits, work items, from the kernel's own launch plan) gets a
workspace of random partials — finite LSEs, some rows every split saw and some (one in eight) no
split saw — and both merges run on it:

- **checked**: the two outputs write the same rows, none past Sq, and agree within 2e-3 (whether
  they agree bit for bit is reported, not required: compiled, the two sums run over differently
  laid out blocks — on the H200 they differed in the last bits at 16 and 33 splits);
- **timed**: each arm as a CUDA graph of ``--calls`` launches (the host's launch cost is not the
  merge's: in a forward the merge's launch is queued behind the attention kernel), paired and
  interleaved (``flashrung.bench.timing.paired_run``, AB then BA halves); per launch, µs.

``python -m flashrung.evidence.merge_timing --batch 2 --seqlen 16384 --heads 16 [--headdim 128]
[--alternations 40] [--calls 50] [--json PATH]``. Needs a CUDA GPU. Evidence level: timing
(paired, the merge alone).
"""
from __future__ import annotations

import argparse
import sys

from flashrung.evidence.probe_args import add_square_problem, require_positive

# one row in this many gets -inf from every split: a row no split saw, merged to 0 / -inf
EMPTY_ROW_EVERY = 8


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashrung.evidence.merge_timing",
                                description="the split tail's merge alone: the chunked merge against loads_first (the default), paired")
    add_square_problem(p, batch=2, seqlen=16384)
    p.add_argument("--alternations", type=int, default=40, help="paired alternations, even (default 40)")
    p.add_argument("--reps", type=int, default=3, help="graph replays per arm per alternation (default 3)")
    p.add_argument("--calls", type=int, default=50, help="merge launches per CUDA graph (default 50)")
    p.add_argument("--json", default=None)
    return p


def check_args(args) -> None:
    """Refuse what cannot be timed, naming the argument."""
    require_positive(args, ("batch", "seqlen", "heads", "reps", "calls"))
    if args.alternations < 2 or args.alternations % 2:
        raise SystemExit(f"--alternations must be an even number >= 2, got {args.alternations}")


def split_of(args, sm_count: int):
    """``(plan, config)``: the launch plan of ``hopper.fwd``'s default configuration with the split
    tail on, for ``args``' problem on ``sm_count`` SMs."""
    from flashrung.kernels.hopper import fwd

    # unpaired: a paired launch (kv_multicast) splits its tail over pairs and clusters, and leaves
    # each pair's two tiles their own partials — with an even q-tile count the same tiles and
    # splits the unpaired plan counts directly (t pairs over P/2 clusters: 2t tiles, the same splits)
    cfg = fwd.replace_following(fwd.default_config(args.headdim, False, args.seqlen), args.headdim, split_tail=True,
                                kv_multicast=False)
    elem_bytes = 2
    plan = fwd._plan(cfg, args.batch, args.seqlen, args.seqlen, args.heads, args.heads, args.headdim, elem_bytes,
                     False, True, sm_count)
    return plan, cfg


def workspace_of(plan, cfg, args, device, generator):
    """Random partials for the plan's tail: ``(part_o, part_lse, coords, tiles, splits)``."""
    import torch

    from flashrung.kernels.hopper.tail_combine import workspace

    tiles, items = plan.num_tiles - plan.num_full_tiles, plan.num_items - plan.num_full_tiles
    part_o, part_lse, coords = workspace(items, tiles, cfg.block_m, args.headdim, device)
    part_o.copy_(torch.randn(part_o.shape, generator=generator).to(device))
    lse = torch.randn(part_lse.shape, generator=generator) * 4
    lse[:, ::EMPTY_ROW_EVERY] = float("-inf")
    part_lse.copy_(lse.to(device))
    # the tail tiles' coordinates as the kernel writes them: (batch, q_head, m_block), distinct
    m_blocks = -(-args.seqlen // cfg.block_m)
    flat = torch.arange(plan.num_full_tiles, plan.num_tiles)
    coords.copy_(torch.stack([flat // (args.heads * m_blocks) % args.batch, flat // m_blocks % args.heads,
                              flat % m_blocks], dim=1).to(torch.int32).to(device))
    return part_o, part_lse, coords, tiles, plan.splits


def merged_both_ways(part_o, part_lse, coords, splits: int, args, device) -> tuple[dict, dict]:
    """Both merges of one workspace into their own poisoned ``out``/``lse`` (``out`` a view of a
    buffer one row longer than Sq, whose extra rows must stay poisoned): ``(buffers, check)`` —
    ``buffers[name] = (out, lse, loads_first)`` for ``chunked`` and ``loads_first``, ``check`` whether
    they wrote the same rows and none past Sq, agree bit for bit, and agree within 2e-3."""
    import torch

    from flashrung.kernels.hopper.tail_combine import combine_tail

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    buffers, past_sq = {}, []
    for name, first in (("chunked", False), ("loads_first", True)):
        whole = torch.full((args.batch, args.seqlen + 1, args.heads, args.headdim), float("nan"), dtype=dtype,
                           device=device)
        out = whole[:, :args.seqlen]
        lse = torch.full((args.batch, args.heads, args.seqlen), float("nan"), device=device)
        combine_tail(part_o, part_lse, coords, out, lse, splits, loads_first=first)
        buffers[name] = (out, lse, first)
        past_sq.append(whole[:, args.seqlen:])
    (o0, l0, _), (o1, l1, _) = buffers["chunked"], buffers["loads_first"]
    written = ~o0.isnan()
    untouched = all(bool(rows.isnan().all()) for rows in past_sq)
    check = dict(same_rows_written=bool(torch.equal(written, ~o1.isnan())) and untouched,
                 bit_identical=bool(torch.equal(o0[written], o1[written])
                                    and torch.equal(l0.nan_to_num(), l1.nan_to_num())),
                 close=bool(torch.allclose(o0[written].float(), o1[written].float(), atol=2e-3, rtol=0)))
    return buffers, check


def run(args) -> dict:
    import numpy as np
    import torch

    from flashrung.bench import stats
    from flashrung.bench.timing import CudaEventTimer, PairedProtocol, paired_run
    from flashrung.kernels.hopper.tail_combine import SPLITS_PER_LOAD, combine_tail

    if not torch.cuda.is_available():
        raise SystemExit("merge_timing needs a CUDA GPU")
    device = torch.device("cuda")
    plan, cfg = split_of(args, torch.cuda.get_device_properties(device).multi_processor_count)
    if plan.splits <= 1:
        raise SystemExit(f"B{args.batch} H{args.heads} S{args.seqlen} d{args.headdim}: the launch plan leaves no "
                         f"split tail ({plan.num_tiles} tiles, none split on this GPU's SMs)")
    part_o, part_lse, coords, tiles, splits = workspace_of(plan, cfg, args, device, torch.Generator().manual_seed(0))
    buffers, check = merged_both_ways(part_o, part_lse, coords, splits, args, device)
    torch.cuda.synchronize()

    # each arm a CUDA graph of args.calls launches (captured after the compile above, on a side
    # stream as torch.cuda.graph requires), so the timing is the merge's, not the host's launch
    graphs = {}
    for name, (out, lse, first) in buffers.items():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(args.calls):
                combine_tail(part_o, part_lse, coords, out, lse, splits, loads_first=first)
        graphs[name] = g
    protocol = PairedProtocol(alternations=args.alternations, reps=args.reps, block_warmup=1, warmup_calls=5)
    for g in graphs.values():
        for _ in range(protocol.warmup_calls):
            g.replay()
    paired = paired_run(graphs["chunked"].replay, graphs["loads_first"].replay, protocol, CudaEventTimer())
    summary = stats.summarize(paired)
    us = {name: float(np.median(getattr(paired, arm))) * 1e3 / args.calls
          for name, arm in (("chunked", "baseline"), ("loads_first", "candidate"))}
    return {
        "gpu": torch.cuda.get_device_name(device),
        "problem": dict(batch=args.batch, seqlen=args.seqlen, heads=args.heads, headdim=args.headdim,
                        dtype=args.dtype, causal=False),
        "tail": dict(tiles=tiles, splits=splits, block_m=cfg.block_m, one_chunked_load=splits <= SPLITS_PER_LOAD),
        "check": check,
        "us_per_merge": us,
        "paired": dict(summary.to_json(), calls_per_graph=args.calls, protocol=protocol.to_json()),
        "evidence": "timing (paired, CUDA graphs of the merge alone, CUDA events)",
        "run": paired.to_json(),
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    result = run(args)
    t, c, p, us = result["tail"], result["check"], result["paired"], result["us_per_merge"]
    print(f"tail_combine alone — {result['gpu']}, B{args.batch} H{args.heads} S{args.seqlen} d{args.headdim} "
          f"{args.dtype}: {t['tiles']} tail tiles x {t['splits']} splits ({t['block_m']} rows a tile)")
    print(f"  chunked      {us['chunked']:.2f} µs per merge")
    print(f"  loads_first  {us['loads_first']:.2f} µs per merge")
    print(f"  paired margin chunked/loads_first {p['margin']:.4f} [p10 {p['lo']:.4f}, p90 {p['hi']:.4f}], "
          f"AB {p['margin_ab']:.4f} / BA {p['margin_ba']:.4f}")
    print(f"  check: rows written alike {c['same_rows_written']}, bit-identical {c['bit_identical']}, "
          f"within 2e-3 {c['close']}")
    if args.json:
        from flashrung.bench.report import write_json

        print(f"wrote {write_json(result, args.json)}")
    ok = c["same_rows_written"] and c["close"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
