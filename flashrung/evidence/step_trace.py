"""Where one K/V step of ``hopper.fwd`` spends its cycles: the clock stamps of ``trace_steps``.

``hopper.fwd`` built with ``trace_steps = N`` (``flashrung/kernels/hopper/trace.py``) stamps the
SM clock at eight events of each of the first N overlapped K/V steps of every CTA's first work
item, for each consumer warpgroup: the step's top, its K/V tiles ready, the pingpong turn held,
its GEMMs issued, its scores back (QK done), the softmax done (FA3's order) or the row max done
(FA4's order), PV(j-1) waited for, and the step's end. This probe runs one traced call after
warm-up calls and prints, per consumer warpgroup, the median [p10, p90] cycles of each phase over
every CTA and every whole step, the step's period, and how long each warpgroup waits for the turn
after the one before it passed it. It also times the traced kernel against the untraced one
(CUDA events, interleaved), since the stamps add instructions to the loop; both kernels' outputs
must be bit-identical, which it checks.

``python -m flashrung.evidence.step_trace --headdim 128 --seqlen 16384 --batch 2 --heads 16
[--causal] [--window LEFT,RIGHT] [--steps 64] [--warps] [--item K] [--set key=value,...] [--json PATH]``.
Needs an sm_90 GPU. ``--window``: a sliding window's launch, on the windowed default.
With ``--warps`` (``trace_warps``) each of a warpgroup's four warps stamps its own events; the
phases are read from warp 0 as before, and beside them how far apart the warps reach each event
(:func:`warp_spread`). The split
tail is switched off (its workspace pointer carries the stamps), so at d128 non-causal S ≥ 16k
the traced kernel is the S8k one.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from flashrung.evidence.probe_args import add_square_problem, checked_head_dims, set_overrides

# the phases between consecutive events of one step (trace.EVENTS), and what each is
PHASES = (
    ("kv_wait", "top", "ready", "waiting for K(j) and V(j-1) to land"),
    ("turn_wait", "ready", "turn", "waiting for the pingpong turn"),
    ("issue", "turn", "issued", "issuing QK(j) and PV(j-1), passing the turn"),
    ("scores_wait", "issued", "scores", "waiting for QK(j)'s scores"),
    ("mid", "scores", "mid", "the softmax (FA3's order) or the row max (FA4's order)"),
    ("pv_wait", "mid", "pv", "waiting for PV(j-1)"),
    ("tail", "pv", "end", "O's rescale and P's conversion (FA4's order: the exponentials too)"),
)
def _cycles(later, earlier):
    """Signed cycles from ``earlier`` to ``later`` (``%clock >> CLOCK_SHIFT``: 31 bits that wrap;
    a hand-off can come before the stamp it is measured from: named turns let the next warpgroup
    go at the ``bar.arrive``, before the passer stamps "issued")."""
    from flashrung.kernels.hopper.trace import CLOCK_SHIFT

    wrap = 1 << (32 - CLOCK_SHIFT)
    return (((later.astype("int64") - earlier.astype("int64") + wrap // 2) % wrap) - wrap // 2) << CLOCK_SHIFT


def summarize(stamps, events: tuple[str, ...], first_step: int = 2) -> dict:
    """Per consumer warpgroup: median, p10 and p90 cycles of each phase (:data:`PHASES`) and of
    the step's period (top to the next step's top), over every CTA and every step from
    ``first_step`` whose stamps are all present; and the turn hand-off: from one warpgroup's
    "issued" of step j to the next warpgroup's "turn" of the same step (the last warpgroup's to
    the first's of step j+1).

    ``stamps`` is the int32 array of ``fwd.traced_forward``: [CTAs, warpgroups, steps, events],
    -1 where nothing was stamped."""
    import numpy as np

    stamps = np.asarray(stamps)
    if stamps.ndim != 4 or stamps.shape[3] != len(events):
        raise ValueError(f"stamps must be [CTAs, warpgroups, steps, {len(events)}], got {stamps.shape}")
    ev = {name: i for i, name in enumerate(events)}
    ctas, groups, steps, _ = stamps.shape
    whole = (stamps >= 0).all(axis=3)          # [ctas, groups, steps]
    out = {"ctas": int(ctas), "warpgroups": int(groups), "steps": int(steps), "first_step": first_step,
           "by_warpgroup": []}

    def stats(values):
        values = np.asarray(values, dtype="float64")
        if values.size == 0:
            return None
        return {"median": float(np.median(values)), "p10": float(np.percentile(values, 10)),
                "p90": float(np.percentile(values, 90)), "n": int(values.size)}

    for g in range(groups):
        rows = {}
        sel = whole[:, g, first_step:]
        rec = stamps[:, g, first_step:]
        for name, a, b, _ in PHASES:
            rows[name] = stats(_cycles(rec[..., ev[b]], rec[..., ev[a]])[sel])
        nxt = whole[:, g, first_step + 1:] & whole[:, g, first_step:-1]
        rows["period"] = stats(_cycles(stamps[:, g, first_step + 1:, ev["top"]],
                                       stamps[:, g, first_step:-1, ev["top"]])[nxt])
        rows["loop"] = stats(_cycles(stamps[:, g, first_step + 1:, ev["top"]],
                                     stamps[:, g, first_step:-1, ev["end"]])[nxt])
        # the turn: warpgroup g takes it after g-1 issued the same step (g = 0: after the last
        # warpgroup issued the step before)
        if groups > 1:
            if g > 0:
                prev_issued = stamps[:, g - 1, first_step:, ev["issued"]]
                mine = stamps[:, g, first_step:, ev["turn"]]
                ok = whole[:, g - 1, first_step:] & whole[:, g, first_step:]
            else:
                prev_issued = stamps[:, groups - 1, first_step:-1, ev["issued"]]
                mine = stamps[:, 0, first_step + 1:, ev["turn"]]
                ok = whole[:, groups - 1, first_step:-1] & whole[:, 0, first_step + 1:]
            rows["handoff"] = stats(_cycles(mine, prev_issued)[ok])
        out["by_warpgroup"].append(rows)
    if groups > 1:
        out["company"] = phase_company(stamps, events, first_step)
    return out


def phase_company(stamps, events: tuple[str, ...], first_step: int = 2) -> list[dict]:
    """Per consumer warpgroup and phase (:data:`PHASES`): how many of the CTA's other warpgroups
    are in the same phase, on average over the cycles this warpgroup spends in it — the
    contention of the units a phase uses (the exponentials' tail shares each scheduler's MUFU
    with the other consumers' warps in their tails).

    Each CTA's stamps are placed on one time line (cycles from its first stamped top, so the
    clock's wrap drops out); a warpgroup's phase intervals of steps ``first_step + 1`` to the
    second-to-last are measured against every whole step's intervals of the others (the first and
    last steps measured have neighbours on both sides). ``None`` where no interval is measured."""
    import numpy as np

    stamps = np.asarray(stamps)
    ev = {name: i for i, name in enumerate(events)}
    ctas, groups, steps, _ = stamps.shape
    whole = (stamps >= 0).all(axis=3)
    overlap = np.zeros((groups, len(PHASES)))
    length = np.zeros((groups, len(PHASES)))
    for c in range(ctas):
        if not whole[c, :, first_step:].any():
            continue
        g0, s0 = np.argwhere(whole[c, :, first_step:])[0]
        ref = stamps[c, g0, first_step + s0, ev["top"]]
        rec = stamps[c, :, first_step:]
        when = _cycles(rec, np.full(rec.shape, ref)).astype("float64")   # [groups, steps', events]
        ok = whole[c, :, first_step:]                            # [groups, steps']
        for k, (_, a, b, _) in enumerate(PHASES):
            start, end = when[..., ev[a]], when[..., ev[b]]
            for g in range(groups):
                mine = ok[g].copy()
                mine[0] = mine[-1] = False                       # both neighbours present
                others = [h for h in range(groups) if h != g]
                if not mine.any() or not others:
                    continue
                ms, me = start[g][mine][:, None], end[g][mine][:, None]
                os_ = np.concatenate([start[h][ok[h]] for h in others])[None, :]
                oe = np.concatenate([end[h][ok[h]] for h in others])[None, :]
                overlap[g, k] += np.clip(np.minimum(me, oe) - np.maximum(ms, os_), 0, None).sum()
                length[g, k] += np.clip(me - ms, 0, None).sum()
    return [{name: (float(overlap[g, k] / length[g, k]) if length[g, k] > 0 else None)
             for k, (name, *_) in enumerate(PHASES)} for g in range(groups)]


def warp_spread(stamps, events: tuple[str, ...], first_step: int = 2) -> list[dict]:
    """Per consumer warpgroup and event, from a ``trace_warps`` trace ([CTAs, warpgroups, steps,
    warps, events]): how far apart the warpgroup's warps reach the event — the spread (the last
    warp's stamp minus the first's: median, p10, p90 over every CTA and whole step from
    ``first_step``), each warp's median lateness behind the first, and the share of steps in which
    each warp is the last. A spread that collapses from one event to the next is a wait of the
    warps ahead (a warpgroup-wide ``bar.sync`` or ``wgmma`` holds them for the slowest)."""
    import numpy as np

    stamps = np.asarray(stamps)
    if stamps.ndim != 5 or stamps.shape[4] != len(events):
        raise ValueError(f"stamps must be [CTAs, warpgroups, steps, warps, {len(events)}], got {stamps.shape}")
    ctas, groups, steps, warps, _ = stamps.shape
    whole = (stamps >= 0).all(axis=(3, 4))        # [ctas, groups, steps]
    out = []
    for g in range(groups):
        sel = whole[:, g, first_step:]
        rec = stamps[:, g, first_step:]                      # [ctas, steps', warps, events]
        rows = {}
        for e, name in enumerate(events):
            ahead = np.stack([_cycles(rec[..., w, e], rec[..., 0, e]) for w in range(warps)], axis=-1)[sel]
            if ahead.size == 0:
                rows[name] = None
                continue
            late = ahead - ahead.min(axis=-1, keepdims=True)          # [n, warps]
            spread = late.max(axis=-1)
            last = np.bincount(late.argmax(axis=-1), minlength=warps) / late.shape[0]
            rows[name] = {"spread": {"median": float(np.median(spread)), "p10": float(np.percentile(spread, 10)),
                                     "p90": float(np.percentile(spread, 90)), "n": int(spread.size)},
                          "late_median": [float(np.median(late[:, w])) for w in range(warps)],
                          "last_share": [float(x) for x in last]}
        out.append(rows)
    return out


def table(summary: dict) -> str:
    """The summary as text: one row per phase, one column per warpgroup (median [p10, p90])."""
    names = [p[0] for p in PHASES] + ["loop", "period", "handoff"]
    what = {p[0]: p[3] for p in PHASES}
    what.update(loop="the loop's back edge to the next step's top", period="top to the next step's top",
                handoff="the turn taken after the warpgroup before issued")
    head = ["phase"] + [f"warpgroup {g}" for g in range(summary["warpgroups"])] + ["what"]
    lines = [head]
    for name in names:
        cells = [name]
        for rows in summary["by_warpgroup"]:
            s = rows.get(name)
            cells.append("-" if s is None else f"{s['median']:.0f} [{s['p10']:.0f}, {s['p90']:.0f}]")
        cells.append(what[name])
        lines.append(cells)
    if summary.get("company"):
        lines.append([""] * len(head))
        lines.append(["in company"] + ["" for _ in summary["company"]]
                     + ["the CTA's other warpgroups in the same phase, mean over its cycles"])
        for name, *_ in PHASES:
            lines.append([name] + ["-" if rows[name] is None else f"{rows[name]:.2f}" for rows in summary["company"]]
                         + [""])
    if summary.get("warps"):
        lines.append([""] * len(head))
        lines.append(["warps apart"] + ["" for _ in summary["warps"]]
                     + ["last warp's stamp minus the first's; behind: each warp's median lateness"])
        for name in next(r for r in summary["warps"] if r):
            cells = [name]
            for rows in summary["warps"]:
                r = rows.get(name)
                cells.append("-" if r is None else
                             f"{r['spread']['median']:.0f} [{r['spread']['p10']:.0f}, {r['spread']['p90']:.0f}]"
                             f" behind {'/'.join(f'{x:.0f}' for x in r['late_median'])}")
            cells.append("")
            lines.append(cells)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)


def problem_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments every clock-stamp probe of ``hopper.fwd`` takes: the problem, overrides, timing, JSON."""
    from flashrung.bench.cli import _packed as packed_arg
    from flashrung.bench.cli import _window as window_arg
    from flashrung.bench.cli import non_negative_float

    p = argparse.ArgumentParser(prog=prog, description=description)
    add_square_problem(p, batch=2, seqlen=16384, any_head_dim=True)
    # None until read: --packed refuses them by name where they were given (resolve_problem)
    p.set_defaults(batch=None, seqlen=None)
    p.add_argument("--packed", type=packed_arg, default=None, metavar="LENGTHS",
                   help="packed sequences (flash-attn's varlen) of these lengths, queries and keys alike, LxN for N "
                        "of length L: --packed 8192,4096x2,1024x8; instead of --batch and --seqlen")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--window", type=window_arg, default=None, metavar="LEFT,RIGHT",
                   help="a sliding window as flash-attn's window_size (-1 unbounded; causal: RIGHT -1 or 0): the "
                        "windowed default, or --set's overrides of it")
    p.add_argument("--set", default="", help="config overrides, key=value,... (as impl='hopper.fwd@...')")
    p.add_argument("--timing-calls", type=int, default=30, help="calls of each kernel timed (default 30)")
    p.add_argument("--preheat-ms", type=non_negative_float, default=0.0, metavar="MS",
                   help="run the traced kernel back to back for this long before the launch whose stamps are "
                        "kept, so that they record the clock the GPU holds under load (at the power cap), not "
                        "an idle GPU's boost (default 0)")
    p.add_argument("--json", default=None)
    p.add_argument("--raw", default=None, metavar="PATH",
                   help="also write the launch's stamps as they came back (numpy .npy, int32, the shape "
                        "fwd.traced_forward gives): every record, for reading what the summary folds away")
    return p


# calls queued between synchronizations while preheating: enough to keep the GPU busy across the
# host's round trip, few enough that the deadline is overshot by a handful of calls at most
PREHEAT_CALLS_PER_SYNC = 4


def preheat(fn, ms: float, sync=None) -> int:
    """Call ``fn`` back to back for ``ms`` milliseconds of wall time, synchronizing (``sync``, CUDA's
    by default) every few calls so that the queue does not run ahead of the clock; returns the
    number of calls."""
    import time

    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    calls, deadline = 0, time.perf_counter() + ms / 1e3
    while time.perf_counter() < deadline:
        for _ in range(PREHEAT_CALLS_PER_SYNC):
            fn()
        calls += PREHEAT_CALLS_PER_SYNC
        sync()
    return calls


def build_parser() -> argparse.ArgumentParser:
    p = problem_parser("python -m flashrung.evidence.step_trace",
                       "clock stamps of hopper.fwd's K/V steps: where a step's cycles go")
    p.add_argument("--steps", type=int, default=64, help="steps stamped per warpgroup (default 64)")
    p.add_argument("--warps", action="store_true",
                   help="every warp of a warpgroup stamps its own events (trace_warps): how far apart they run; "
                        "the phase table reads warp 0, as without it")
    p.add_argument("--item", type=int, default=0,
                   help="which of each CTA's work items is stamped (trace_item; default 0, the first): a later "
                        "one reads the steps once the CTAs have settled, away from the launch's start; CTAs with "
                        "fewer items stamp nothing")
    return p


def summarize_warps(stamps, events: tuple[str, ...]) -> dict:
    """:func:`summarize` of warp 0's stamps (the table's phases, as a trace without ``trace_warps``
    reads them) with :func:`warp_spread` of all four beside it; a 4-D trace as :func:`summarize`."""
    import numpy as np

    stamps = np.asarray(stamps)
    if stamps.ndim == 4:
        return summarize(stamps, events)
    out = summarize(stamps[:, :, :, 0], events)
    out["warps"] = warp_spread(stamps, events, out["first_step"])
    return out


# the problem the probes trace when --batch and --seqlen are not given
DEFAULT_BATCH, DEFAULT_SEQLEN = 2, 16384


def resolve_problem(args) -> None:
    """``--batch`` and ``--seqlen`` filled in: their defaults, or with ``--packed`` the number of
    sequences and the longest (the launch's grid is sized for it), refused by name beside it."""
    packed = getattr(args, "packed", None)
    if packed is not None:
        given = [flag for flag, value in (("--batch", args.batch), ("--seqlen", args.seqlen)) if value is not None]
        if given:
            raise SystemExit(f"--packed gives the sequences and their lengths; drop {', '.join(given)}")
        args.batch, args.seqlen = len(packed), max(packed)
    else:
        args.batch = DEFAULT_BATCH if args.batch is None else args.batch
        args.seqlen = DEFAULT_SEQLEN if args.seqlen is None else args.seqlen


def traced_run(args, **trace) -> dict:
    """One traced call of ``hopper.fwd`` (``trace``: the config's trace fields) after warm-up, its
    output checked bit-identical to the untraced kernel's, and both timed in alternation (CUDA
    events, median per call). Returns the stamps (numpy), the traced config, the check, the times
    and the summary's common fields. Needs an sm_90 GPU."""
    import torch

    from flashrung.bench.cli import _checked_window
    from flashrung.dispatch import NO_WINDOW, Problem
    from flashrung.kernels.hopper import fwd

    # checked before the GPU is touched; a bad one exits naming the flag
    window = _checked_window(args)
    head_dim, head_dim_v = checked_head_dims(args)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit(f"{args.prog} needs an sm_90 GPU")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    lengths = getattr(args, "packed", None)
    window_size = NO_WINDOW if window is None else window
    packing = {}
    if lengths is not None:
        from flashrung.gate import cu_seqlens

        # one batch entry of every sequence's rows, as flash-attn's varlen takes them
        shape = (1, sum(lengths), args.heads)
        cu = cu_seqlens(lengths, "cuda")
        packing = dict(cu_seqlens=(cu, cu), max_seqlens=(max(lengths), max(lengths)))
    else:
        shape = (args.batch, args.seqlen, args.heads)
    q, k, v = (torch.randn(*shape, dim, device="cuda", dtype=dtype) for dim in (head_dim, head_dim, head_dim_v))
    if lengths is not None:
        problem = Problem.of_packed(q, k, v, args.causal, len(lengths), packing["max_seqlens"], window_size=window_size)
    else:
        problem = Problem.of(q, k, v, args.causal, window_size=window_size)
    base = fwd.overridden_config(problem, set_overrides(args.set))
    # whole tiles unless the split tail is asked for (tile_trace --split-tail); then on, whatever
    # the problem's default (d128 non-causal splits from S4k; S2k's split is priced, not default)
    base = dataclasses.replace(base, split_tail=bool(getattr(args, "split_tail", False)))
    traced = dataclasses.replace(base, **trace)
    scale = head_dim ** -0.5
    plan = fwd.traced_plan(q, k, v, args.causal, scale, traced, window_size, **packing)

    def plain():
        return fwd.forward(q, k, v, args.causal, scale, base, window_size=window_size, **packing)

    def stamped():
        return fwd.traced_forward(q, k, v, args.causal, scale, traced, window_size=window_size, **packing)

    out_ref, lse_ref = plain()
    for _ in range(3):
        out, lse, stamps = stamped()
    torch.cuda.synchronize()
    preheat_ms = getattr(args, "preheat_ms", 0.0)
    if preheat_ms:
        # the kept launch follows the load directly: its stamps count cycles at the sustained clock,
        # where a memory wait timed in nanoseconds is more cycles than on an idle GPU's boost
        preheat(stamped, preheat_ms)
        out, lse, stamps = stamped()
        torch.cuda.synchronize()
    identical = bool(torch.equal(out, out_ref) and torch.equal(lse, lse_ref))

    # the stamps' cost: both kernels timed in alternation, median of CUDA-event times per call
    times = {"untraced": [], "traced": []}
    for _ in range(args.timing_calls):
        for name, fn in (("untraced", plain), ("traced", stamped)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    ms = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    common = dict(shape=dict(batch=args.batch, seqlen=args.seqlen, heads=args.heads, headdim=head_dim,
                             headdim_v=head_dim_v, causal=args.causal, dtype=args.dtype, window=window,
                             packed=None if lengths is None else list(lengths)),
                  config=dataclasses.asdict(traced), gpu=torch.cuda.get_device_name(),
                  tail=dict(num_items=plan.num_items, num_full_tiles=plan.num_full_tiles, splits=plan.splits),
                  outputs_bit_identical=identical, median_ms=ms, preheat_ms=preheat_ms,
                  evidence="profile (SM clock stamps of one traced launch; the traced kernel's time beside "
                           "the untraced one's, CUDA events, interleaved)")
    return dict(stamps=stamps.cpu().numpy(), identical=identical, ms=ms, common=common)


def run_probe(args, trace: dict, fields, summarize_fn, table_fn, name: str, scope) -> int:
    """Run :func:`traced_run` with ``trace``, summarize its stamps (``summarize_fn(stamps,
    fields, common)``, ``common`` the run's shape, configuration and launch plan), print the table
    and the timing line, write the JSON; exit status 1 if the outputs moved. ``scope(summary)``:
    what the stamps cover, for the heading."""
    set_overrides(args.set)        # a malformed --set is refused before the GPU is touched
    if getattr(args, "raw", None) and not args.raw.endswith(".npy"):
        raise SystemExit(f"--raw writes a numpy .npy file: the path must end in .npy, got {args.raw!r}")
    resolve_problem(args)
    run = traced_run(args, **trace)
    summary = summarize_fn(run["stamps"], fields, run["common"])
    summary.update(run["common"])
    heat = getattr(args, "preheat_ms", 0.0)
    dims = f"d{args.headdim}" + (f"/{args.headdim_v}" if args.headdim_v not in (None, args.headdim) else "")
    packed = getattr(args, "packed", None)
    sizes = f"packed {','.join(map(str, packed))} H{args.heads}" if packed else \
        f"B{args.batch} H{args.heads} S{args.seqlen}"
    print(f"hopper.fwd {name} — {summary['gpu']}, {sizes} {dims} "
          f"{args.dtype} {'causal' if args.causal else 'non-causal'}"
          + (f", window {tuple(args.window)}" if getattr(args, "window", None) else "")
          + f"; {summary['ctas']} CTAs x "
          f"{summary['warpgroups']} consumer warpgroups, {scope(summary)}"
          + (f"; the launch after {heat:g} ms of back-to-back calls" if heat else ""))
    print(table_fn(summary))
    ms = run["ms"]
    print(f"traced kernel {ms['traced']:.3f} ms, untraced {ms['untraced']:.3f} ms per call "
          f"(x{ms['traced'] / ms['untraced']:.3f}); outputs bit-identical: {run['identical']}")
    if args.json:
        from flashrung.bench.report import write_json

        print(f"wrote {write_json(summary, args.json)}")
    if getattr(args, "raw", None):
        print(f"wrote {write_raw(run['stamps'], args.raw)}")
    return 0 if run["identical"] else 1


def write_raw(stamps, path: str) -> str:
    """``stamps`` (``fwd.traced_forward``'s int32 records) to ``path`` as a numpy ``.npy`` file, as
    they came back: not-stamped entries keep their -1. Returns the path written."""
    import numpy as np

    array = np.asarray(stamps.cpu() if hasattr(stamps, "cpu") else stamps)
    if array.dtype != np.int32:
        raise ValueError(f"the stamps are int32 records, got {array.dtype}")
    if not path.endswith(".npy"):
        raise ValueError(f"--raw writes a numpy .npy file: the path must end in .npy, got {path!r}")
    np.save(path, array)
    return path


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.prog = "step_trace"
    if args.steps < 3:
        raise SystemExit("--steps must be at least 3 (the first two steps are not summarized)")
    if args.item < 0:
        raise SystemExit(f"--item must be 0 or more (which of each CTA's work items is stamped), got {args.item}")
    from flashrung.kernels.hopper.trace import EVENTS

    trace = dict(trace_steps=args.steps, **({"trace_warps": True} if args.warps else {}),
                 **({"trace_item": args.item} if args.item else {}))
    return run_probe(args, trace, EVENTS, lambda stamps, events, common: summarize_warps(stamps, events),
                     table, "step trace",
                     lambda s: f"steps {s['first_step']}..{args.steps - 1} of each CTA's "
                               f"{'first tile' if not args.item else f'item {args.item}'}; cycles (SM clock), "
                               "median [p10, p90]")


if __name__ == "__main__":
    sys.exit(main())
