"""``flashrung bench`` on a GPU: rows × implementations → one results document.

Per shape, the inputs are made once and shared by every implementation. Per row, every
implementation is prepared (or marked unsupported with its reason), warmed, and then all of them
are timed round-robin in the same process (:func:`flashrung.bench.timing.interleave`), so the
ratio of ours to the best peer is a paired statistic, not a ratio of medians from different
moments. Ceilings are measured first, in the same run. Then the correctness gates of the flashrung
kernels, at a reduced size, once per build and problem family (each row's gate runs the build the
row times: :func:`timed_build`): a kernel that fails its gate is not timed on the rows that gate
stands for (status ``"gate failed"``, the check's text as the reason) — a
time would price a wrong kernel. The gates leave nothing behind that the timing sees (every timed
block is warmed and preheated by its own implementation), but they compile flashrung's kernels, so
its rows' ``first_call_s`` no longer include that compile.

On each forward row, every implementation's first output — peers' too — is checked against the
fp32 oracle on a sample of its query rows (:func:`output_agreement`): one whose error there is many
times the gate's bound computes another function than the row asks for (another window or mask
convention) and is not timed (status ``"wrong output"``), since its rate would price other work.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Callable, Sequence

from flashrung.bench import block_clocks
from flashrung.bench import ceilings as ceilings_mod
from flashrung.bench import manifest as manifest_mod
from flashrung.bench import numerators, peers, stats, timing
from flashrung.bench.suites import Row
from flashrung.inputs import NO_WINDOW

# The gate's oracle materialises Sq × Sk scores in fp32: keep it small (seed 000's "C1
# reduced-sequence oracle"); the kernel, dtype, heads, head dim and mask stay the row's.
GATE_MAX_SEQLEN = 1024
GATE_MAX_BATCH = 2
# a packed row's gate: its first sequences, each at most GATE_MAX_SEQLEN long
GATE_MAX_SEQUENCES = 4
# Each forward output against the fp32 oracle (:func:`output_agreement`): this many query rows,
# spread evenly over the sequence (its first and last included), every head, in the first and the
# last batch entry (a packed row: its first non-empty and its longest sequence)
AGREEMENT_ROWS = 64
# An output whose error at those rows exceeds this many times the gate's bound (FLOOR_FACTOR · the
# same-dtype floor + ATOL) computes another function: a different window convention or mask moves
# outputs by 10-100x that bound, while an exact kernel sits below 1 and a less careful one at a few
WRONG_OUTPUT_RATIO = 8.0
# The host-path probe after a row's timing: back-to-back calls filling about this many ms
# (between HOST_PROBE_MIN_CALLS and timing.HOST_PATH_CALLS), host time to issue them beside the
# events' time for them
HOST_PROBE_MS = 50.0
HOST_PROBE_MIN_CALLS = 5


def gate_config(row: Row) -> dict:
    config = {"batch": min(row.batch, GATE_MAX_BATCH), "seqlen_q": min(row.seqlen_q, GATE_MAX_SEQLEN),
              "seqlen_k": min(row.seqlen_k, GATE_MAX_SEQLEN), "heads_q": row.heads_q, "heads_kv": row.heads_kv,
              "head_dim": row.headdim, "dtype": row.dtype, "causal": row.causal}
    if row.dv != row.headdim:
        config["head_dim_v"] = row.dv
    if row.softcap:
        config["softcap"] = row.softcap
    if row.window is not None:
        config["window_size"] = row.window
    if row.packed is not None:
        # the pack's first sequences, shortened (its first non-empty ones if those are all empty):
        # each checked against the references run on it alone
        first = row.packed[:GATE_MAX_SEQUENCES]
        if not any(first):
            first = tuple(n for n in row.packed if n)[:GATE_MAX_SEQUENCES]
        lengths = tuple(min(n, GATE_MAX_SEQLEN) for n in first)
        config.update(batch=len(lengths), seqlen_q=max(lengths), seqlen_k=max(lengths), varlen=(lengths, lengths))
    return config


def _row_problem(row: Row, device: str):
    """The :class:`~flashrung.dispatch.Problem` of ``row`` at its own size, as the entry point builds
    it for the row's contiguous inputs on ``device`` (no tensor is allocated)."""
    import torch
    from flashrung import _device, dispatch
    from flashrung.api import _score_options

    dtype = peers.torch_dtype(row.dtype)
    causal, window, softcap = _score_options(row.causal, row.window if row.window is not None else NO_WINDOW,
                                             row.softcap)
    # (batch, rows) of q and of k/v: a pack is one batch entry of every sequence's rows
    rows_q, rows_k = ((1, sum(row.packed)),) * 2 if row.packed is not None else (
        (row.batch, row.seqlen_q), (row.batch, row.seqlen_k))
    shapes = ((*rows_q, row.heads_q, row.headdim), (*rows_k, row.heads_kv, row.headdim),
              (*rows_k, row.heads_kv, row.dv))
    q, k, v = (torch.empty(shape, dtype=dtype, device="meta") for shape in shapes)
    if row.packed is not None:
        problem = dispatch.Problem.of_packed(q, k, v, causal, len(row.packed), (max(row.packed),) * 2, window,
                                             softcap)
    else:
        problem = dispatch.Problem.of(q, k, v, causal, window, softcap)
    where = torch.device(device)
    return dataclasses.replace(problem, device_type=where.type, capability=_device.capability(where))


def timed_build(impl: str, row: Row, device: str = "cuda") -> str:
    """``impl`` pinned to what ``row`` runs at its own size: the kernel dispatch picks for it and,
    for a kernel with a configuration (``hopper.fwd``), every field of that configuration
    (``flashrung:hopper.fwd@block_m=128,...``). The gate runs at a reduced size, where dispatch and
    ``select_config`` would pick for the reduced problem — another schedule, or an override that
    does not build there; pinned, it checks the build the row times. Forward rows only (a backward
    row's gate names both directions' kernels); a peer, or a row dispatch cannot place: as given."""
    if not peers.is_ours(impl) or row.mode != "fwd":
        return impl
    from flashrung import dispatch

    try:
        problem = _row_problem(row, device)
        _, chosen = dispatch.select(problem, "fwd", peers.kernel_name(impl))
        config = chosen.config()
    except Exception:     # the gate itself says why the kernel cannot run
        return impl
    # the kernel dispatch picked, with the overrides it was given (a forced variant's label)
    picked = f"{peers.OURS}:{chosen.kernel}"
    if config is None:
        return picked
    fields = [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)]
    pinned = f"{peers.OURS}:{chosen.kernel.split('@')[0]}@" + ",".join(f"{name}={value}" for name, value in fields)
    try:
        # a kernel whose configuration does not depend on the problem may take few of its fields
        # as overrides (the ladder's rungs): there the kernel and its overrides pin it already
        _, again = dispatch.select(problem, "fwd", peers.kernel_name(pinned))
        return pinned if again.config() == config else picked
    except (ValueError, TypeError):
        return picked


def carried_changes(impl: str, row: Row, device: str = "cuda") -> dict[str, tuple]:
    """The fields of a ``flashrung:<kernel>@key=value,...`` arm's configuration at ``row`` that its
    overrides change without naming them, ``{field: (default, run)}``: the defaults derived from
    the fields it names (``config.replace_following``: a K/V pairing stepping aside for a change it
    cannot run with, say), so a report can say what the arm runs beyond what it asked for. Empty
    for a peer, an arm without overrides, or one dispatch cannot place."""
    from flashrung import dispatch

    name = peers.kernel_name(impl) if peers.is_ours(impl) else None
    if not name or "@" not in name:
        return {}
    kernel, overrides = dispatch.parse_impl(name)
    try:
        problem = _row_problem(row, device)
        base = dispatch.select(problem, "fwd", kernel)[1].config()
        run = dispatch.select(problem, "fwd", name)[1].config()
    except Exception:     # the gate itself says why the arm cannot run
        return {}
    if base is None or run is None or type(base) is not type(run):
        return {}
    return {f.name: (getattr(base, f.name), getattr(run, f.name)) for f in dataclasses.fields(run)
            if f.name not in overrides and getattr(base, f.name) != getattr(run, f.name)}


def _gate_key(impl: str, row: Row) -> tuple:
    """What one gate run stands for: the build it checks, the direction and the reduced problem."""
    return timed_build(impl, row), row.mode, tuple(sorted(gate_config(row).items()))


def run_gate(impl: str, row: Row, seed: int = 0, device: str = "cuda", build: str | None = None) -> dict:
    """flashrung's correctness gate for ``impl`` at ``row``'s configuration (reduced in size): the
    forward for forward rows, run on the build the row times (:func:`timed_build`, or ``build`` when
    the caller has it; ``build`` in the result); forward and gradients (through autograd) for backward
    rows."""
    config = gate_config(row)
    build = build or timed_build(impl, row, device)
    try:
        from flashrung import gate
        dtype = peers.torch_dtype(row.dtype)
        if row.packed is not None:
            backward_fn = peers.flashrung_backward_fn(impl) if row.mode == "bwd" else None
            result = gate.check_varlen(peers.flashrung_forward_fn(build), backward_fn,
                                       gate.Case(**{**config, "dtype": dtype}), device, seed=seed, kernel=impl)
        elif row.mode == "fwd":
            result = gate.check_forward(peers.flashrung_forward_fn(build), **{**config, "dtype": dtype},
                                        device=device, seed=seed, kernel=impl)
        else:
            result = gate.check_backward(peers.flashrung_forward_fn(impl), peers.flashrung_backward_fn(impl),
                                         gate.Case(**{**config, "dtype": dtype}), device, seed=seed, kernel=impl)
        return {"impl": impl, "build": build, "mode": row.mode, "config": config, "passed": bool(result.passed),
                "ratio": float(result.ratio), "text": str(result)}
    except Exception as exc:   # a gate that cannot run is reported as not passed, with why
        return {"impl": impl, "build": build, "mode": row.mode, "config": config, "passed": False, "ratio": None,
                "text": f"gate could not run: {type(exc).__name__}: {peers._one_line(exc)}"}


def gate_arms(arms, row: Row, seed: int = 0, device: str = "cuda") -> dict:
    """:func:`run_gate` of each arm (``{role: impl}``) that is flashrung's; None for a peer. Correct
    first: a paired or sustained run times no arm that fails it."""
    return {role: run_gate(impl, row, seed=seed, device=device) if peers.is_ours(impl) else None
            for role, impl in arms.items()}


def _agreement_slices(row: Row, inputs: peers.Inputs) -> list[tuple[str, slice, slice]]:
    """Where :func:`output_agreement` looks: (label, batch slice, token slice) per sample — the first
    and the last batch entry, or a pack's first non-empty and its longest sequence."""
    if inputs.cu_seqlens is None:
        entries = sorted({0, row.batch - 1})
        return [(f"batch entry {b}", slice(b, b + 1), slice(None)) for b in entries]
    cu = [int(x) for x in inputs.cu_seqlens.tolist()]
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    nonempty = [i for i, n in enumerate(lengths) if n]
    picks = sorted({nonempty[0], max(nonempty, key=lambda i: lengths[i])}) if nonempty else []
    return [(f"sequence {i}", slice(0, 1), slice(cu[i], cu[i + 1])) for i in picks]


def check_outputs(row: Row, inputs: peers.Inputs, prepared: dict) -> tuple[dict, list]:
    """Each prepared implementation's first forward output ({key: :class:`peers.Prepared`}) read by
    :func:`output_agreement`, every ``first_out`` released after: ``(agreement, refused)``, refused
    the keys past :data:`WRONG_OUTPUT_RATIO` (not to be timed). A backward row keeps no output: ``({}, [])``."""
    outs = {key: p.first_out for key, p in prepared.items() if p.first_out is not None}
    agreement = output_agreement(row, inputs, outs) if outs else {}
    for p in prepared.values():
        p.first_out = None
    return agreement, [key for key, a in agreement.items() if a["ratio"] > WRONG_OUTPUT_RATIO]


def output_check_record(agreement: dict) -> dict:
    """A refused output as a failed gate's record (``passed``, ``text``): how compare and sustain,
    which gate only flashrung's kernels, report an arm :func:`check_outputs` refused."""
    return {"passed": False, "agreement": agreement, "text": "FAIL output check: " + wrong_output_reason(agreement)}


def wrong_output_reason(agreement: dict) -> str:
    """Why an output :func:`output_agreement` read past :data:`WRONG_OUTPUT_RATIO` is not timed."""
    a = agreement
    return (f"its output differs from the row's attention — max error {a['err']:.3g} {a['vs']}, {a['ratio']:.0f}x "
            f"the gate's bound {a['bound']:.3g} (more than {WRONG_OUTPUT_RATIO:g}x): it computes another function "
            "here (a window, mask or scale convention), so its rate would price other work")


def output_agreement(row: Row, inputs: peers.Inputs, outs: dict) -> dict[str, dict]:
    """Each forward output in ``outs`` ({impl: out}) against the fp32 oracle at
    :data:`AGREEMENT_ROWS` query rows of each :func:`_agreement_slices` sample, every head: the
    gate's rule (err ≤ FLOOR_FACTOR · floor + ATOL, the floor the same-dtype reference's error at
    the same rows) read as ``ratio`` = err ÷ bound, over all samples."""
    import torch

    from flashrung import gate, reference
    options = dict(causal=row.causal, softmax_scale=inputs.scale, softcap=row.softcap or 0.0,
                   window_size=row.window if row.window is not None else NO_WINDOW)
    err = {impl: 0.0 for impl in outs}
    floor, checked = 0.0, []
    for label, batch, tokens in _agreement_slices(row, inputs):
        q, k, v = (t[batch, tokens] for t in (inputs.q, inputs.k, inputs.v))
        rows = torch.linspace(0, q.shape[1] - 1, min(q.shape[1], AGREEMENT_ROWS), device=q.device).round().long()
        rows = torch.unique(rows)
        truth = reference.oracle(q, k, v, query_rows=rows, **options)[0]
        floor = max(floor, gate.max_abs_diff(reference.lowp(q, k, v, query_rows=rows, **options)[0], truth))
        for impl, out in outs.items():
            err[impl] = max(err[impl], gate.max_abs_diff(out[batch, tokens][:, rows.to(out.device)], truth))
        checked.append(f"{label} ({rows.numel()} query rows)")
    bound = gate.FLOOR_FACTOR * floor + gate.ATOL
    where = "against the fp32 oracle at " + ", ".join(checked) + ", every head"
    return {impl: {"vs": where, "err": e, "bound": bound, "ratio": e / bound} for impl, e in err.items()}


def time_row(row: Row, impls: Sequence[str], inputs: peers.Inputs, protocol: timing.BenchProtocol,
             timer, causal_convention: str, on_impl: Callable[[str], None] = lambda s: None,
             peer_options: peers.PeerOptions = peers.PeerOptions(), *,
             sync: Callable[[], None] = lambda: None, host_clock: Callable[[], float] = time.perf_counter,
             spans: bool = False) -> dict:
    """Prepare, warm and time every implementation on one row; returns the row's results.

    After the timing, each implementation's host path is probed (``timing.host_path``: the host's
    time to issue back-to-back calls beside the events' time for them, ``sync`` emptying the queue
    first): a result whose calls were host-bound says so (``host_bound``), since its time per call
    is then its entry point's, not its kernel's. ``spans``: each block placed on the wall clock
    (``blocks_span_s``), for the clock sampled beside the run (:mod:`block_clocks`)."""
    flops, convention = row.flops(causal_convention)
    results: dict[str, dict] = {}
    prepared: dict[str, peers.Prepared] = {}
    for impl in impls:
        on_impl(f"prepare {impl}")
        try:
            prepared[impl] = peers.prepare(impl, row, inputs, peer_options)
        except peers.Unsupported as exc:
            results[impl] = {"status": exc.status, "reason": exc.reason}

    # forward rows: every output against the oracle, to catch an implementation computing something else
    agreement, refused = check_outputs(row, inputs, prepared)
    for impl in refused:
        results[impl] = {"status": peers.WRONG_OUTPUT, "agreement": agreement[impl],
                         "reason": "not timed: " + wrong_output_reason(agreement[impl])}
        del prepared[impl]

    warm, reps = {}, {}
    for impl, p in list(prepared.items()):
        on_impl(f"warm {impl}")
        try:
            warm[impl] = timing.warm_up(timer, p.fn, min_calls=max(2, protocol.warmup_calls),
                                        min_ms=protocol.warmup_ms)
        except Exception as exc:   # e.g. a backward that cannot run twice on one graph
            results[impl] = {"status": "error", "reason": f"during warm-up: {type(exc).__name__}: "
                                                          f"{peers._one_line(exc)}"}
            del prepared[impl]
            continue
        reps[impl] = timing.reps_for(warm[impl].estimate_ms, target_ms=protocol.block_ms,
                                     lo=protocol.block_reps_min, hi=protocol.block_reps_max)
    inter = None
    preheat = {i: timing.preheat_calls(warm[i].estimate_ms, protocol.block_preheat_ms) for i in prepared}
    if prepared:
        on_impl("timing")
        orders = protocol.orders_for(list(prepared))
        inter = timing.interleave({i: p.fn for i, p in prepared.items()}, reps, len(orders), timer,
                                  block_warmup=preheat, orders=orders, spans=spans)

    for impl in list(prepared):
        times = inter.per_call(impl)
        if min(times) <= 0:     # an implementation that did no measurable work cannot be rated
            results[impl] = {"status": "error", "reason": f"non-positive time measured ({min(times)} ms)"}
            del prepared[impl]
    probes = {}
    for impl, p in prepared.items():
        on_impl(f"host path {impl}")
        calls = timing.reps_for(warm[impl].estimate_ms, target_ms=HOST_PROBE_MS, lo=HOST_PROBE_MIN_CALLS,
                                hi=timing.HOST_PATH_CALLS)
        try:
            probes[impl] = timing.host_path(timer, p.fn, calls, now=host_clock, sync=sync)
        except Exception as exc:    # the row's timing stands; only the probe is missing, and says why
            probes[impl] = {"error": f"{type(exc).__name__}: {peers._one_line(exc)}"}
    for impl, p in prepared.items():
        dist = stats.Distribution.of(inter.per_call(impl))
        results[impl] = {
            "status": "ok", "ms": dist.median, "tflops": numerators.tflops(flops, dist.median),
            "distribution": dist.to_json(), "reps_per_block": reps[impl], "rounds": len(inter.orders),
            "preheat_calls_per_block": preheat[impl],
            # every timed call, block by block in round order (``round_orders`` says which ran before it)
            "blocks_ms": inter.times[impl],
            "warmup_calls": warm[impl].calls, "first_call_s": p.first_call_s, "note": p.note,
            "dispatch": p.dispatch, "host_path": probes[impl], "host_bound": timing.host_bound(probes[impl]),
        }
        if inter.spans is not None:
            # per round: where its preheat began, its timed calls began and its last call ended (s since the epoch)
            results[impl]["blocks_span_s"] = [list(span) for span in inter.spans[impl]]
        if impl in agreement:
            results[impl]["agreement"] = agreement[impl]

    ok = [i for i in impls if results.get(i, {}).get("status") == "ok"]
    ok_peers = [i for i in ok if not peers.is_ours(i)]
    best_peer = min(ok_peers, key=lambda i: results[i]["ms"]) if ok_peers else None
    comparisons = {}
    for ours in (i for i in ok if peers.is_ours(i)):
        # margin > 1: ours is faster than the peer, per round, paired
        comparisons[ours] = {peer: stats.summarize(inter.paired(peer, ours)).to_json() for peer in ok_peers}
    del prepared
    return {**row.plan(causal_convention), "label": row.label(), "results": results, "best_peer": best_peer,
            "comparisons": comparisons, "flops_convention_label": numerators.LABELS[convention],
            "round_orders": [list(o) for o in inter.orders] if inter is not None else []}


def _group_by_shape(rows: Sequence[Row]):
    """Consecutive rows sharing a shape share inputs; order is kept."""
    return [(key, list(group)) for key, group in itertools.groupby(rows, key=Row.shape_key)]


def run(rows: Sequence[Row], impls: Sequence[str], *, protocol: timing.BenchProtocol,
        causal_convention: str = numerators.FA_HALF, gate: bool = True, suite: str = "free",
        progress: bool = True, command: list[str] | None = None, seed: int = 0,
        peer_options: peers.PeerOptions = peers.PeerOptions(),
        clock_sample_ms: int = block_clocks.SAMPLE_MS) -> dict:
    """Measure ``rows`` × ``impls`` on the current GPU; returns the results document.

    ``clock_sample_ms``: nvidia-smi samples the SM clock and board power this often through the
    rows, and each timed block gets the clock it ran at (``blocks_clock``; the document's
    ``clocks``); 0 samples nothing."""
    import torch
    from tqdm import tqdm

    started = time.perf_counter()
    manifest = manifest_mod.start(command)
    timer = timing.CudaEventTimer()
    ceilings = {k: c.to_json() for k, c in ceilings_mod.measure_all({r.dtype for r in rows},
                                                                     protocol.block_preheat_ms).items()}
    # correct first: each flashrung kernel is gated (reduced size, once per build and problem family) before
    # any row times it; a kernel that fails is not timed on the rows its gate stands for
    # each row's gate key per flashrung kernel, once (timed_build dispatches at the row's own size)
    gate_keys = {row: {impl: _gate_key(impl, row) for impl in impls if peers.is_ours(impl)} for row in rows}
    gates = {}
    if gate:
        for row in rows:
            for impl, key in gate_keys[row].items():
                if key not in gates:
                    gates[key] = run_gate(impl, row, seed=seed, build=key[0])
                # the rows a gate stands for: builds that differ in schedule alone gate alike, and
                # the report says which rows each line covers rather than repeat a bare shape
                gates[key].setdefault("rows", []).append(row.label())
    correctness = list(gates.values())
    out_rows = []
    sampler = (block_clocks.SuiteSampler(torch.cuda.current_device(), clock_sample_ms)
               if clock_sample_ms and torch.cuda.is_available() else None)
    bar = tqdm(total=len(rows), desc="bench", unit="row", disable=not progress, dynamic_ncols=True)
    for _, group in _group_by_shape(rows):
        shape_row = dataclasses.replace(group[0], mode="bwd" if any(r.mode == "bwd" for r in group) else "fwd")
        inputs = peers.make_inputs(shape_row, seed=seed)
        for row in group:
            bar.set_description(row.label())
            t0 = time.perf_counter()
            failed = {impl: g for impl, key in gate_keys[row].items() if (g := gates.get(key)) and not g["passed"]}
            result = time_row(row, [i for i in impls if i not in failed], inputs, protocol, timer, causal_convention,
                              on_impl=lambda s: bar.set_postfix_str(s, refresh=True), peer_options=peer_options,
                              sync=torch.cuda.synchronize, spans=sampler is not None and sampler.running)
            if sampler is not None:
                sampler.check()
            if failed:
                # in the column order of the other rows, each untimed kernel says which check it failed
                timed = result["results"]
                result["results"] = {i: timed[i] if i in timed else
                                     {"status": peers.GATE_FAILED, "reason": f"not timed: {failed[i]['text']}"}
                                     for i in impls}
            result["wall_s"] = time.perf_counter() - t0
            gemm = ceilings.get(f"gemm:{row.dtype}")
            for impl, r in result["results"].items():
                if r["status"] == "ok" and gemm:
                    r["percent_of_gemm_ceiling"] = 100.0 * r["tflops"] / gemm["value"]
            out_rows.append(result)
            bar.update(1)
        del inputs
        torch.cuda.empty_cache()
    bar.close()
    clocks = sampler.finish(out_rows) if sampler is not None else None

    manifest_mod.finish(manifest)
    order_text = ("implementations interleaved round-robin in a carryover-balanced design (each in every position "
                  "and right after every other equally often; round_orders in each row)"
                  if protocol.order == "balanced" else
                  "implementations interleaved round-robin, first half of the rounds in order, second half reversed")
    return {"suite": suite, "impls": list(impls), "causal_convention": causal_convention,
            "protocol": protocol.to_json(), "peer_options": dataclasses.asdict(peer_options), "timing": "CUDA events between back-to-back calls; warm kernel time "
            "(compile, allocation of inputs, and the forward of backward rows excluded); statistic: median per call; "
            f"{order_text}; "
            "each block preceded by untimed calls of the same implementation for block_preheat_ms (its own "
            "power/clock steady state); after each row, a host-path probe per implementation (host_path: host "
            "time to issue back-to-back calls beside their GPU time; host_bound when the host took at least "
            f"{timing.HOST_BOUND_SHARE:.0%} of it)",
            "ceilings": ceilings, "rows": out_rows, "correctness": correctness, "clocks": clocks, "manifest": manifest,
            "wall_s": time.perf_counter() - started}
