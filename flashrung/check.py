"""``flashrung check`` and ``flashrung gate``: the correctness gate over an envelope.

``check`` gates every automatic kernel, forward and backward, on the device it finds: on a GPU
the real kernels at realistic sizes, on the CPU the portable kernels under the Triton
interpreter at small sizes; ``--at-scale`` runs each forward case on the configuration a large
call of its shape runs (``hopper.fwd``'s rules that read a call's work). ``gate --calibrate``
reports the gate's own margins: the worst correct kernel's ratio to the bound and the smallest
injected defect's.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys

import torch
from flashrung import jsonfile

# what the caching allocator guarantees a fresh tensor's address to be a multiple of
ALLOCATION_ALIGNMENT_BYTES = 256
# distinct reasons printed per kernel when it declines cases (the JSON keeps them all)
MAX_REASONS_SHOWN = 3


def gate_problem(case, device):
    """The :class:`~flashrung.dispatch.Problem` of the inputs the gate will pass for ``case``:
    contiguous, freshly allocated (B, S, H, D) tensors, described without allocating them."""
    from flashrung import dispatch, gate

    q, k, v = gate.random_inputs(dataclasses.replace(case, batch=1, seqlen_q=1, seqlen_k=1, varlen=None), device)
    # a packed case's tensors are one batch entry of every sequence's rows
    batch, rows_q, rows_k = (1, sum(case.varlen[0]), sum(case.varlen[1])) if case.varlen else \
        (case.batch, case.seqlen_q, case.seqlen_k)
    q, k, v = q.expand(batch, rows_q, -1, -1), k.expand(batch, rows_k, -1, -1), v.expand(batch, rows_k, -1, -1)
    if case.varlen:
        problem = dispatch.Problem.of_packed(q, k, v, case.causal, len(case.varlen[0]),
                                             (max(case.varlen[0]), max(case.varlen[1])), case.window_size,
                                             case.softcap)
    else:
        problem = dispatch.Problem.of(q, k, v, case.causal, case.window_size, case.softcap)
    # expanded views have zero strides: describe the contiguous tensors instead, or a kernel with
    # layout rules (TMA) would decline every case the gate is about to run
    shapes = ((batch, rows_q, case.heads_q, case.head_dim),
              (batch, rows_k, case.heads_kv, case.head_dim),
              (batch, rows_k, case.heads_kv, case.value_head_dim))
    return dataclasses.replace(problem, strides=tuple(torch.empty(s, device="meta").stride() for s in shapes),
                               ptr_alignment=ALLOCATION_ALIGNMENT_BYTES)


def _prepare_device(requested: str | None) -> str:
    """Pick the device; on the CPU switch the Triton interpreter on before kernels import."""
    device = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return device


def _progress(it, desc: str, **_):
    from tqdm import tqdm
    return tqdm(it, desc=desc, unit="case", file=sys.stderr, disable=not sys.stderr.isatty())


@dataclasses.dataclass
class KernelSummary:
    kernel: str
    direction: str
    cases: int = 0
    passed: int = 0
    unsupported: int = 0
    worst: object = None
    declined: dict = dataclasses.field(default_factory=dict)    # reason -> cases
    failures: list = dataclasses.field(default_factory=list)


def packed_case(case):
    """``case`` as a pack of sequences (flash-attn's varlen): its own lengths beside a third of them, a
    one-row and a one-key sequence, an empty query range and an empty key range (a row that reads
    another sequence's keys, or a store past a sequence's rows, fails the packed gate)."""
    lengths_q = (case.seqlen_q, max(1, case.seqlen_q // 3), 1, 0, 5)
    lengths_k = (case.seqlen_k, max(1, case.seqlen_k // 3), 7, 3, 0)
    return dataclasses.replace(case, batch=len(lengths_q), seqlen_q=max(lengths_q), seqlen_k=max(lengths_k),
                               varlen=(lengths_q, lengths_k))


def _compile_group(job) -> tuple:
    """Jobs that share a compiled kernel: the same backend, direction, head dims, dtype, mask."""
    direction, backend, _, case, _ = job
    return (backend.name, direction, case.head_dim, case.value_head_dim, str(case.dtype), case.causal)


def run_check(device: str, size: str, kernels: list[str] | None = None,
              directions=("fwd", "bwd"), progress=_progress,
              shard: tuple[int, int] = (0, 1),
              head_dims: tuple[int | tuple[int, int], ...] | None = None,
              window_size: tuple[int, int] | None = None, softcap: float = 0.0,
              packed: bool = False, at_scale: bool = False) -> list[KernelSummary]:
    """The gate over the envelope of ``size`` (its head dims, or ``head_dims``: each a head dim or a
    pair (q's and k's, v's)) for every automatically dispatched kernel, or those named in ``kernels``;
    with ``window_size``, every case under that sliding window (a causal case keeps its mask: the
    window's right side must then be -1 or 0); with ``softcap``, every case's scores capped by it;
    with ``packed``, every case as a pack of sequences (:func:`packed_case`); with ``at_scale``, a
    forward kernel with rules that read a call's size (``config_at_scale``: ``hopper.fwd``) runs each
    case on the configuration a call of the case's shape runs at scale — at the case's own size."""
    from flashrung import dispatch, gate
    cases = gate.envelope(size, head_dims=head_dims)
    if packed:
        cases = [packed_case(c) for c in cases]
    if window_size is not None:
        cases = [dataclasses.replace(c, window_size=window_size) for c in cases]
    if softcap:
        cases = [dataclasses.replace(c, softcap=softcap) for c in cases]
    if device == "cpu" and size == "small" and not head_dims:
        cases = [c for c in cases if c.head_dim <= 64]
    summaries: dict[tuple[str, str], KernelSummary] = {}
    fwd_backends = [b for b in dispatch.FORWARD_BACKENDS if b.auto]
    bwd_backends = list(dispatch.BACKWARD_BACKENDS)
    jobs = []
    for case in cases:
        problem = gate_problem(case, device)
        if "fwd" in directions:
            for b in fwd_backends:
                jobs.append(("fwd", b, None, case, problem))
        if "bwd" in directions:
            # the backward is gated on the forward that really feeds it: the one dispatch picks;
            # where dispatch picks none (a head dim only a kernel named by impl= runs), the
            # backward has nothing to gate and is counted as declined, with dispatch's reason
            try:
                fwd_module, _ = dispatch.select(problem, "fwd")
            except dispatch.UnsupportedError as err:
                fwd_module = f"no forward feeds it: {err}"
            for b in bwd_backends:
                jobs.append(("bwd", b, fwd_module, case, problem))
    if kernels:
        jobs = [j for j in jobs if any(j[1].name == k or j[1].name.startswith(k) for k in kernels)]
    index, count = shard
    if count > 1:
        # whole compile groups per shard, so shards compile in parallel instead of all compiling all
        groups = sorted({_compile_group(j) for j in jobs})
        mine = {g for i, g in enumerate(groups) if i % count == index}
        jobs = [j for j in jobs if _compile_group(j) in mine]
    for direction, backend, fwd_module, case, problem in progress(jobs, desc=f"gate on {device}"):
        s = summaries.setdefault((backend.name, direction), KernelSummary(backend.name, direction))
        module = backend.load()
        reason = fwd_module if isinstance(fwd_module, str) else module.unsupported_reason(problem)
        if reason is not None:
            s.unsupported += 1
            s.declined[reason] = s.declined.get(reason, 0) + 1
            continue
        if case.varlen:
            result = gate.check_varlen(fwd_module.forward if direction == "bwd" else module.forward,
                                       module.backward if direction == "bwd" else None, case, device,
                                       kernel=backend.name)
        elif direction == "fwd":
            forward = module.forward
            if at_scale and hasattr(module, "config_at_scale"):
                forward = functools.partial(module.forward, config=module.config_at_scale(problem))
            result = gate.check_forward_case(forward, case, device, kernel=backend.name)
        else:
            result = gate.check_backward(fwd_module.forward, module.backward, case, device,
                                         kernel=backend.name)
        s.cases += 1
        s.passed += result.passed
        if s.worst is None or result.ratio > s.worst.ratio:
            s.worst = result
        if not result.passed:
            s.failures.append(result)
    return list(summaries.values())


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _device_label(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "CPU (Triton interpreter)"


def _summary_json(s: KernelSummary) -> dict:
    return {"kernel": s.kernel, "direction": s.direction, "cases": s.cases, "passed": s.passed,
            "unsupported": s.unsupported, "worst": s.worst.to_json() if s.worst else None,
            "failures": [f.to_json() for f in s.failures], "declined": dict(s.declined)}


def _merge(parts: list[list[dict]]) -> list[dict]:
    merged: dict[tuple[str, str], dict] = {}
    for part in parts:
        for s in part:
            m = merged.setdefault((s["kernel"], s["direction"]), {
                "kernel": s["kernel"], "direction": s["direction"], "cases": 0, "passed": 0,
                "unsupported": 0, "worst": None, "failures": [], "declined": {}})
            for key in ("cases", "passed", "unsupported"):
                m[key] += s[key]
            for reason, n in s.get("declined", {}).items():
                m["declined"][reason] = m["declined"].get(reason, 0) + n
            m["failures"] += s["failures"]
            if s["worst"] and (m["worst"] is None or s["worst"]["ratio"] > m["worst"]["ratio"]):
                m["worst"] = s["worst"]
    return list(merged.values())


def _run_sharded(args, jobs: int) -> list[dict]:
    """Run the check in ``jobs`` processes (compiles are CPU-bound and dominate on a GPU)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i in range(jobs):
            out = os.path.join(tmp, f"shard{i}.json")
            cmd = [sys.executable, "-m", "flashrung.cli", "check", "--shard", f"{i}/{jobs}", "--json", out,
                   "--size", args.size] + (["--device", args.device] if args.device else [])
            for k in args.kernel or []:
                cmd += ["--kernel", k]
            for d in args.direction:
                cmd += ["--direction", d]
            for d in getattr(args, "head_dim", None) or []:
                cmd += ["--head-dim", _head_dim_text(d)]
            if getattr(args, "softcap", 0.0):
                cmd += ["--softcap", repr(args.softcap)]
            if getattr(args, "window", None) is not None:
                # one token: a left side of -1 would read as an option of its own
                cmd += ["--window=" + ",".join(map(str, args.window))]
            if getattr(args, "packed", False):
                cmd += ["--packed"]
            if getattr(args, "at_scale", False):
                cmd += ["--at-scale"]
            procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL), out))
        parts = []
        for proc, out in procs:
            if proc.wait() not in (0, 1) or not os.path.exists(out):
                raise RuntimeError(f"check shard failed with exit code {proc.returncode}")
            with open(out) as fh:
                parts.append(json.load(fh)["summaries"])
    return _merge(parts)


def check_command(args) -> int:
    device = _prepare_device(args.device)
    args.size = args.size or ("device" if device == "cuda" else "small")
    size = args.size
    index, count = (int(x) for x in args.shard.split("/")) if args.shard else (0, 1)
    if args.jobs > 1 and count == 1:
        summaries = _run_sharded(args, args.jobs)
    else:
        head_dims = tuple(getattr(args, "head_dim", None) or ()) or None
        summaries = [_summary_json(s) for s in run_check(device, size, args.kernel, tuple(args.direction),
                                                         shard=(index, count), head_dims=head_dims,
                                                         window_size=getattr(args, "window", None),
                                                         softcap=getattr(args, "softcap", 0.0),
                                                         packed=getattr(args, "packed", False),
                                                         at_scale=getattr(args, "at_scale", False))]
    rows = [["kernel", "dir", "cases", "passed", "not supported", "worst ratio", "worst case"]]
    for s in summaries:
        worst = s["worst"]
        rows.append([s["kernel"], s["direction"], str(s["cases"]), str(s["passed"]), str(s["unsupported"]),
                     f"{worst['ratio']:.3f}" if worst else "-", worst["case"] if worst else "-"])
    failures = [f for s in summaries for f in s["failures"]]
    if args.json:
        jsonfile.write({"device": _device_label(device), "size": size,
                        "at_scale": bool(getattr(args, "at_scale", False)), "summaries": summaries}, args.json)
    if count > 1:
        return 1 if failures else 0
    scale = " at scale (each case on the configuration its shape runs in a large call)" \
        if getattr(args, "at_scale", False) else ""
    print(f"flashrung check on {_device_label(device)}, envelope '{size}'{scale} "
          f"(pass iff max|kernel-oracle| <= 2*max|lowp-oracle| + 1e-4; ratio < 1 passes)")
    print(_table(rows))
    # a kernel that declines cases passes only what it ran: say what it left out and why
    for s in summaries:
        for reason, n in sorted(s.get("declined", {}).items(), key=lambda kv: -kv[1])[:MAX_REASONS_SHOWN]:
            print(f"  {s['kernel']} {s['direction']} declined {n} case{'s' if n > 1 else ''}: {reason}")
    for f in failures:
        print(f"  FAIL {f['kernel']} {f['case']}: ratio {f['ratio']:.3f}")
    checked = sum(s["cases"] for s in summaries)
    if checked == 0:
        print("no kernel could run any case on this device", file=sys.stderr)
        return 1
    print(f"{'FAIL' if failures else 'PASS'}: {checked - len(failures)}/{checked} gated runs passed")
    return 1 if failures else 0


def gate_command(args) -> int:
    device = _prepare_device(args.device)
    from flashrung import gate, gate_mutations
    size = args.size or ("device" if device == "cuda" else "small")
    cases = gate.envelope(size)
    if device == "cpu" and size == "small":
        cases = [c for c in cases if c.head_dim <= 64]
    if not args.calibrate:
        print("flashrung gate: use --calibrate to sweep the envelope and the mutation battery; "
              "`flashrung check` gates the kernels", file=sys.stderr)
        return 2
    cal = gate_mutations.calibrate(cases, device, progress=_progress)
    data = cal.to_json()
    data["device"] = _device_label(device)
    data["rule"] = "max|kernel-oracle| <= 2*max|lowp-oracle| + 1e-4"
    print(f"gate calibration on {data['device']} over {cal.configurations} configurations")
    print(f"  worst correct kernel: ratio {data['worst_correct_ratio']:.3f} ({data['worst_correct_case']})")
    print(f"  smallest defect:      ratio {data['smallest_defect_ratio']:.2f} "
          f"({data['smallest_defect']}, {data['smallest_defect_case']})")
    rows = [["mutation", "what it breaks", "smallest ratio"]]
    for m in gate_mutations.MUTATIONS:
        rows.append([m.name, m.why, f"{cal.defect_ratios.get(m.name, float('nan')):.2f}"])
    print(_table(rows))
    if args.json:
        jsonfile.write(data, args.json)
    if not cal.ok:
        for r in cal.correct_failures:
            print(f"  correct kernel failed: {r}")
        for n, r in cal.defects_passed:
            print(f"  defect NOT caught: {n}: {r}")
        return 1
    return 0


def _head_dim(text: str) -> int | tuple[int, int]:
    """``--head-dim``'s value: a head dim flashrung takes (``api.head_dim_supported``), or two as
    ``D/DV`` (q's and k's, v's), a pair (D, DV)."""
    from flashrung.api import HEAD_DIM_MULTIPLE, MAX_HEAD_DIM, head_dim_supported

    try:
        dims = tuple(int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or two as D/DV, got {text!r}") from None
    if len(dims) > 2:
        raise argparse.ArgumentTypeError(f"expected an integer or two as D/DV, got {text!r}")
    for d in dims:
        if not head_dim_supported(d):
            raise argparse.ArgumentTypeError(f"expected a multiple of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM}, "
                                             f"got {d}")
    return dims[0] if len(dims) == 1 else dims


def _window(text: str) -> tuple[int, int]:
    """``--window``'s value: ``LEFT,RIGHT`` as flash-attn's ``window_size`` (-1: unbounded), right
    -1 or 0 (the envelope's causal cases keep their mask)."""
    try:
        left, right = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LEFT,RIGHT (two integers, -1 unbounded), got {text!r}") from None
    if left < -1 or right not in (-1, 0) or (left, right) == (-1, -1):
        raise argparse.ArgumentTypeError(f"expected LEFT >= -1 and RIGHT -1 or 0, not both -1, got {text!r}")
    return left, right


def _softcap(text: str) -> float:
    """``--softcap``'s value: a finite positive number (flash-attn's ``softcap``)."""
    try:
        cap = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (cap > 0 and cap != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {text!r}")
    return cap


def _head_dim_text(entry: int | tuple[int, int]) -> str:
    """A ``--head-dim`` value as :func:`_head_dim` reads it back."""
    return "/".join(map(str, entry)) if isinstance(entry, tuple) else str(entry)


def register(sub) -> None:
    p = sub.add_parser("check", help="run the correctness gate on every kernel for this device")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--size", choices=("small", "device"), default=None,
                   help="envelope: 'small' (interpreter-sized) or 'device' (S up to 16384)")
    p.add_argument("--kernel", action="append", default=None, help="only this kernel (repeatable)")
    p.add_argument("--head-dim", action="append", type=_head_dim, default=None, metavar="D[/DV]",
                   help="gate at this head dim instead of the envelope's (repeatable; a multiple of 8 up to "
                        "256: e.g. --kernel hopper.fwd --head-dim 96 gates hopper.fwd's padded head dims); "
                        "D/DV gives v its own head dim (192/128: MLA's)")
    p.add_argument("--window", type=_window, default=None, metavar="LEFT,RIGHT",
                   help="gate every case under this sliding window (flash-attn's window_size, -1 unbounded; "
                        "RIGHT -1 or 0, since the envelope's causal cases keep their mask): --window 64,0; "
                        "an unbounded left side as --window=-1,0")
    p.add_argument("--softcap", type=_softcap, default=0.0, metavar="C",
                   help="gate every case with its scores capped by C·tanh(scores/C) (flash-attn's softcap)")
    p.add_argument("--packed", action="store_true",
                   help="gate every case as packed sequences (flash-attn's varlen): its own lengths beside "
                        "shorter, one-row and empty ones, each sequence against the references run on it alone")
    p.add_argument("--at-scale", action="store_true",
                   help="gate each forward case on the configuration a call of its shape runs once it is "
                        "large (hopper.fwd: the frozen row max and what it brings, which gate-sized calls "
                        "never select), at the case's own size")
    p.add_argument("--direction", action="append", choices=("fwd", "bwd"), default=None)
    p.add_argument("--json", default=None, help="write the results to this file")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes to spread the check over (whole compile groups each)")
    p.add_argument("--shard", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=lambda a: check_command(_defaults(a)))

    g = sub.add_parser("gate", help="the gate's calibration and mutation battery")
    g.add_argument("--calibrate", action="store_true", help="sweep the envelope and the mutations")
    g.add_argument("--device", choices=("cuda", "cpu"), default=None)
    g.add_argument("--size", choices=("small", "device"), default=None)
    g.add_argument("--json", default=None)
    g.set_defaults(func=gate_command)


def _defaults(args):
    if not args.direction:
        args.direction = ["fwd", "bwd"]
    return args
