"""The instrument's commands: ``bench``, ``null``, ``compare``, ``reanchor``, ``sustain``.

``register(subparsers)`` adds them to the ``flashrung`` command line; each handler takes the
parsed arguments and returns an exit code. Nothing here imports torch until a command needs a GPU,
so ``flashrung bench --dry-run`` plans without one.

- ``flashrung bench`` — every implementation on every row of a suite (default ``fa4-protocol``)
  or of shapes given by flags; table, JSON (``--json``), PNG (``--plot``). Without a GPU it says
  so and prints the plan.
- ``flashrung null`` — ≥ 10 fresh-process A/A pairs of one kernel; stores
  ``t_noise = p95 |margin − 1|`` for this GPU.
- ``flashrung compare BASELINE CANDIDATE`` — two paired runs in fresh processes, the correctness
  gate, and the keep gate: KEEP / REVERT / NULL with its figures.
- ``flashrung reanchor --links …`` — the product of kept links against a direct paired run.
- ``flashrung sustain BASELINE CANDIDATE`` — both arms in alternating blocks of sustained load
  with nvidia-smi sampling SM clock and board power: ms/call, MHz, W, J/call and Mcycles/call per
  block and per arm, and whether the time moved with the clock or with the cycles.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys

from flashrung.bench import (block_clocks, calibration, manifest, numerators, peers, report, stats, suites, sustain,
                             timing)
from flashrung.inputs import check_softcap
from flashrung import jsonfile

DEFAULT_PAIR_SHAPE = dict(batch=8, seqlen=4096, heads=16, headdim=128, dtype="bfloat16")


def _int_at_least(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "a whole number >= 0")


def even_rounds(text: str) -> int:
    """``--rounds``: an even count (a balanced design's rounds are even; the halves schedule needs it)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an even integer >= 2, got {text!r}") from None
    if value < 2 or value % 2:
        raise argparse.ArgumentTypeError(f"expected an even integer >= 2 (a balanced design's rounds, or half "
                                         f"in order and half reversed), got {text!r}")
    return value


def _softcap(text: str) -> float:
    try:
        return check_softcap(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"softcap must be 0 (none) or a finite positive number, "
                                         f"got {text!r}") from None


def _window(text: str) -> tuple[int, int]:
    """``--window``'s value: ``LEFT,RIGHT`` as flash-attn's ``window_size`` (-1: unbounded). Whether
    it suits the mask is the row's to say (``suites.check_window``)."""
    try:
        left, right = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LEFT,RIGHT (two integers, -1 unbounded), got {text!r}") from None
    if left < -1 or right < -1:
        raise argparse.ArgumentTypeError(f"expected LEFT,RIGHT, each >= -1 (-1 unbounded), got {text!r}")
    return left, right


def _packed(text: str) -> tuple[int, ...]:
    """``--packed``'s value: the sequences' lengths (``suites.parse_packed``)."""
    try:
        return suites.parse_packed(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:      # also rejects nan
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _block_count(text: str) -> int:
    value = positive_int(text)
    if value < 2 or value % 2:
        raise argparse.ArgumentTypeError(f"expected an even number ≥ 2 (as many blocks of each arm), got {value}")
    return value


def _cuda_device(text: str) -> str:
    index = text.partition(":")[2] if text.startswith("cuda:") else None
    if text != "cuda" and not (index and index.isdigit()):
        raise argparse.ArgumentTypeError(f"expected cuda or cuda:N (clock and power are a GPU's), got {text!r}")
    return text


def _even_int(text: str) -> int:
    value = positive_int(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"expected an even number (half AB, half BA), got {value}")
    return value


def _impl(text: str) -> str:
    try:
        return peers.validate_impl(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dtype(text: str) -> str:
    try:
        return suites.normalize_dtype(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shape_flags(p: argparse.ArgumentParser, *, many: bool) -> None:
    g = p.add_argument_group("shape")
    g.add_argument("--batch", type=positive_int,
                   help="batch size" + (" (default: 32k tokens / seqlen)" if many else
                                        f" (default {DEFAULT_PAIR_SHAPE['batch']})"))
    g.add_argument("--seqlen", type=positive_int, nargs="+" if many else None,
                   help="query (and key) length" + ("s; with --suite, keeps only these" if many else
                                                    f" (default {DEFAULT_PAIR_SHAPE['seqlen']})"))
    g.add_argument("--seqlen-k", type=positive_int, help="key length when it differs from --seqlen")
    g.add_argument("--heads", type=positive_int, help="query heads (default 16)")
    g.add_argument("--kv-heads", type=positive_int, help="key/value heads (default: --heads; fewer = GQA)")
    g.add_argument("--headdim", type=positive_int, nargs="+" if many else None,
                   help="head dim (default 128)" + ("; with --suite, keeps only these" if many else ""))
    g.add_argument("--headdim-v", type=positive_int, metavar="DV",
                   help="v's (and the output's) head dim when it differs from --headdim (192/128: --headdim 192 "
                        "--headdim-v 128); FLOPs count 2·B·H·Sq·Sk·(D + DV)")
    g.add_argument("--softcap", type=_softcap, metavar="C",
                   help="cap the scaled scores as flash-attn does, C·tanh(scores / C) (Gemma 2's 50); peers "
                        "without a cap are marked unsupported; the FLOPs do not count it")
    g.add_argument("--window", type=_window, metavar="LEFT,RIGHT",
                   help="a sliding window as flash-attn's window_size, bottom-right aligned (-1 unbounded; "
                        "causal: RIGHT -1 or 0): --window 4096,0 with --causal is Mistral's; peers without one "
                        "are marked unsupported; the FLOPs count the (query, key) pairs inside it")
    g.add_argument("--packed", type=_packed, metavar="LENGTHS",
                   help="packed sequences (flash-attn's varlen) of these lengths, queries and keys alike, LxN for N "
                        "of length L: --packed 8192,4096x2,1024x8; instead of --batch/--seqlen/--seqlen-k; SDPA's "
                        "backends are marked unsupported; the FLOPs sum each sequence's")
    g.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="causal mask, bottom-right aligned" + ("; with --suite, --causal/--no-causal keeps "
                                                              "only that half" if many else ""))
    g.add_argument("--dtype", type=_dtype, help="bf16 (default) or fp16")
    g.add_argument("--mode", choices=suites.MODE_CHOICES if many else suites.MODES,
                   help="direction" + (" (default: the suite's; fwd for free shapes)" if many else " (default fwd)"))
    if not many:
        g.add_argument("--row-from", metavar="FILE[#N]",
                       help="the row of a stored result instead of the flags above: a compare's or a sustain's "
                            "JSON (plain or .gz), or row N (from 0) of a bench run's — to run again, on this "
                            "GPU, the problem a stored reading ran")


def _paired_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("paired protocol (defaults: seed 000's keep protocol)")
    d = timing.PairedProtocol()
    g.add_argument("--alternations", type=_even_int, help=f"alternations per run (default {d.alternations}, "
                                                           f"--quick {timing.QUICK_PAIRED.alternations})")
    g.add_argument("--reps", type=positive_int, help=f"timed calls per arm per alternation (default {d.reps})")
    g.add_argument("--warmup", type=positive_int,
                   help=f"calls per arm before the first alternation (default {d.warmup_calls})")
    g.add_argument("--block-preheat-ms", type=non_negative_float, metavar="MS",
                   help="run each arm for at least MS before each of its timed blocks, so it is timed at its own "
                        "clock (default 0: the calibrated protocol; an A/A null calibrates with the same value)")
    g.add_argument("--quick", action="store_true", help="the shorter protocol, for a smoke run")
    g.add_argument("--calibration", type=pathlib.Path,
                   help=f"calibration file (default {calibration.default_path()})")
    g.add_argument("--json", type=pathlib.Path, metavar="PATH", help="write the full result here")
    g.add_argument("--seed", type=int, default=0, help="input seed")
    g.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu runs the whole path under the Triton interpreter with a wall clock: a check of "
                        "the machinery, not a measurement (its calibration is keyed 'cpu')")


def register(subparsers) -> None:
    b = subparsers.add_parser("bench", help="time flashrung against every peer (the project's main job)",
                              description="Time every implementation on every row of a suite (default "
                                          "fa4-protocol) or of the shapes given by flags, interleaved in one "
                                          "process, with the GEMM and copy ceilings measured in the same run. "
                                          "Prints a table; writes JSON and a PNG. Without a GPU it prints the plan.")
    b.add_argument("--suite", choices=suites.SUITES, help="a frozen suite (default fa4-protocol when no "
                                                          "shape is given)")
    _shape_flags(b, many=True)
    b.add_argument("--impl", type=_impl, action="append",
                   help=f"an implementation to time, repeatable: {', '.join(peers.PEERS)}, flashrung, "
                        f"flashrung:<kernel> (default: all peers and flashrung)")
    b.add_argument("--causal-flops", choices=numerators.CAUSAL_CONVENTIONS, default=numerators.FA_HALF,
                   help="causal numerator: fa-half (dense/2, FlashAttention papers; default) or exact "
                        "(bottom-right triangle)")
    b.add_argument("--dry-run", action="store_true", help="print the plan (rows, FLOPs) and exit; no GPU needed")
    b.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="write JSON to PATH, gzip-compressed when it ends in .gz (no PATH: print JSON instead of the "
                        "table)")
    b.add_argument("--plot", type=pathlib.Path, metavar="PNG",
                   help="write the plot here (default: next to --json PATH, same stem)")
    b.add_argument("--quick", action="store_true", help="fewer rounds and repetitions (a smoke run)")
    b.add_argument("--rounds", type=even_rounds, metavar="N",
                   help=f"round-robin rounds per row, at least (default {timing.BenchProtocol().rounds}), even; "
                        "with --order balanced rounded up to whole designs (six implementations: 6, seven: 14); "
                        "more rounds, more pairs behind each row's ratio")
    b.add_argument("--order", choices=timing.ORDERS, default=None,
                   help="each round's order: balanced (default: every implementation in every position and right "
                        "after every other equally often) or halves (one fixed order, then reversed)")
    b.add_argument("--block-preheat-ms", type=non_negative_float, metavar="MS",
                   help=f"untimed calls of an implementation before each of its timed blocks, in ms (default "
                        f"{timing.BenchProtocol().block_preheat_ms:g}, the suite's protocol); longer, for a GPU "
                        "whose clock takes longer to leave the state the previous block left (a 'two speeds' "
                        "line in the report)")
    b.add_argument("--clock-sample-ms", type=non_negative_int, default=block_clocks.SAMPLE_MS, metavar="MS",
                   help=f"sample the SM clock and board power with nvidia-smi every MS through the rows and give each "
                        f"timed block the clock it ran at (default {block_clocks.SAMPLE_MS}; 0: none). The report's "
                        "'two speeds' line then says whether the slow rounds were slow in clock or in cycles")
    b.add_argument("--no-gate", action="store_true", help="skip the correctness gate of flashrung kernels")
    b.add_argument("--flex-dynamic", action="store_true",
                   help="compile FlexAttention once with dynamic shapes instead of once per shape (saves "
                        "minutes of compile on a full suite; flex may lose a few percent)")
    b.add_argument("--from-json", type=pathlib.Path, metavar="PATH", action="append",
                   help="re-render the table (and --plot) from a saved result (.json or .json.gz); no GPU needed. "
                        "Given more than once (runs of one suite): each row's reading in every run against its "
                        "target, how many runs met it and what the median still needs, and each implementation's "
                        "rates run by run (did one move alone: a rebuilt peer, a new default). Given parts of one "
                        "suite (runs of disjoint rows, e.g. --headdim 128 and --headdim 64 under one protocol): "
                        "the parts as one run, one table and one reading of the targets (and --plot)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--seed", type=int, default=0, help="input seed")
    b.set_defaults(func=cmd_bench)

    n = subparsers.add_parser("null", help="A/A null: calibrate t_noise for this GPU",
                              description="Run one kernel against itself in ≥ 10 fresh processes through the "
                                          "exact paired path `compare` uses; store t_noise = p95 |margin − 1|.")
    n.add_argument("--impl", type=_impl, default="flashrung", help="the kernel (default: flashrung's dispatch)")
    n.add_argument("--pairs", type=positive_int, default=stats.MIN_NULL_PAIRS,
                   help=f"fresh-process A/A pairs (≥ {stats.MIN_NULL_PAIRS}; default {stats.MIN_NULL_PAIRS})")
    _shape_flags(n, many=False)
    _paired_flags(n)
    n.set_defaults(func=cmd_null)

    c = subparsers.add_parser("compare", help="keep gate: KEEP / REVERT / NULL for CANDIDATE over BASELINE",
                              description="Two paired interleaved runs, each in a fresh process, AB/BA halves, "
                                          "the correctness gate, and the keep threshold 1 + t_noise from "
                                          "`flashrung null`. Margin = t_baseline / t_candidate (> 1: faster).")
    c.add_argument("baseline", type=_impl, help="the kernel kept so far: flashrung:<kernel>, flashrung or a peer")
    c.add_argument("candidate", type=_impl, help="the change under test, same forms")
    c.add_argument("--t-noise", type=float, help="use this t_noise (a fraction, 0.000591 = 0.0591%%) instead of "
                                                 "the calibration file")
    c.add_argument("--no-gate", action="store_true", help="skip the correctness gate (the verdict says so)")
    _shape_flags(c, many=False)
    _paired_flags(c)
    c.set_defaults(func=cmd_compare)

    r = subparsers.add_parser("reanchor", help="product of kept links vs a direct paired run to the anchor",
                              description="Multiply the paired margins of KEEP links (from `compare --json`) "
                                          "and compare with a direct paired run of the current kernel against "
                                          "the anchor, within √(links + 1)·t_noise.")
    r.add_argument("--links", type=pathlib.Path, nargs="+", required=True,
                   help="JSON files: `compare --json` outputs, or lists / {\"links\": [...]} of links")
    r.add_argument("--anchor", type=_impl, help="default: the first kept link's baseline")
    r.add_argument("--current", type=_impl, help="default: the last kept link's candidate")
    r.add_argument("--t-noise", type=float, help="use this t_noise instead of the calibration file")
    _shape_flags(r, many=False)
    _paired_flags(r)
    r.set_defaults(func=cmd_reanchor)

    s = subparsers.add_parser("sustain", help="time per call beside SM clock and board power under sustained load",
                              description="Both arms in alternating blocks of back-to-back calls (ABBA order) "
                                          "while nvidia-smi samples the SM clock and board power. Per block and "
                                          "per arm: ms/call, MHz, W, J/call and Mcycles/call over the block's "
                                          "settled part; candidate ÷ baseline for each; and a reading of whether "
                                          "the time moved with the clock (energy per call, at the power cap) or "
                                          "with the cycles. A reading, not a verdict: `compare` keeps or reverts.")
    s.add_argument("baseline", type=_impl, help="flashrung:<kernel>, flashrung or a peer")
    s.add_argument("candidate", type=_impl, help="the same forms")
    _shape_flags(s, many=False)
    g = s.add_argument_group("sustained protocol")
    g.add_argument("--blocks", type=_block_count, default=sustain.BLOCKS,
                   help=f"blocks in all, ABBA order, half per arm (default {sustain.BLOCKS})")
    g.add_argument("--block-s", type=positive_float, default=sustain.BLOCK_S, metavar="S",
                   help=f"seconds of back-to-back calls per block (default {sustain.BLOCK_S:g})")
    g.add_argument("--settle-s", type=non_negative_float, default=sustain.SETTLE_S, metavar="S",
                   help=f"seconds at a block's start whose samples do not count, the clock settling (default "
                        f"{sustain.SETTLE_S:g}; the last {sustain.TAIL_S:g} s never count)")
    g.add_argument("--sample-ms", type=positive_int, default=sustain.SAMPLE_MS, metavar="MS",
                   help=f"nvidia-smi sampling period (default {sustain.SAMPLE_MS})")
    g.add_argument("--json", type=pathlib.Path, metavar="PATH", help="write the full result here")
    g.add_argument("--seed", type=int, default=0, help="input seed")
    g.add_argument("--device", type=_cuda_device, default="cuda", help="cuda (default) or cuda:N")
    s.set_defaults(func=cmd_sustain)


# ----------------------------------------------------------------------------------------------
# bench


def rows_from_args(args) -> tuple[str, list[suites.Row]]:
    """The rows a ``bench`` invocation asks for, and the suite name they belong to."""
    shape_flags = ("batch", "heads", "kv_heads", "dtype", "seqlen_k", "headdim_v", "softcap", "window", "packed")
    shape_given = any(getattr(args, a) is not None for a in shape_flags)
    window = _window_of(args)
    if args.suite is None and (shape_given or args.seqlen or args.headdim):
        headdims = args.headdim or [128]
        if len(headdims) > 1:
            raise ValueError("free shapes take one --headdim")
        if args.packed is not None:
            _check_packed_flags(args)
            return "free", suites.packed_rows(lengths=args.packed, heads=args.heads or 16, kv_heads=args.kv_heads,
                                              headdim=headdims[0], headdim_v=args.headdim_v,
                                              softcap=args.softcap or 0.0, window=window,
                                              dtype=args.dtype or "bfloat16", causal=bool(args.causal),
                                              mode=args.mode or "fwd")
        if not args.seqlen:
            raise ValueError("free shapes need --seqlen (or pick a --suite)")
        rows = suites.free_rows(seqlens=args.seqlen, batch=args.batch, heads=args.heads or 16,
                                kv_heads=args.kv_heads, headdim=headdims[0], headdim_v=args.headdim_v,
                                seqlen_k=args.seqlen_k, softcap=args.softcap or 0.0, window=window,
                                dtype=args.dtype or "bfloat16", causal=bool(args.causal), mode=args.mode or "fwd")
        return "free", rows
    if shape_given:
        bad = [f"--{a.replace('_', '-')}" for a in shape_flags if getattr(args, a) is not None]
        raise ValueError(f"{', '.join(bad)} would change the suite's definition; drop --suite to give free "
                         "shapes (--seqlen, --headdim and --causal/--no-causal narrow a suite)")
    name = args.suite or "fa4-protocol"
    rows = suites.filter_rows(suites.suite_rows(name, args.mode), seqlens=args.seqlen, headdims=args.headdim,
                              causal=args.causal)
    if not rows:
        raise ValueError(f"the filters leave no row of suite {name}")
    return name, rows


def _emit_json(doc: dict, target: str) -> None:
    if target == "-":
        json.dump(doc, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        path = report.write_json(doc, target)
        print(f"wrote {path}", file=sys.stderr)


def _plot(doc: dict, args) -> None:
    from flashrung.bench import plot
    plot.write_for_cli(plot.plot, doc, args.plot, args.json)


def gpu_available() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)"
    return True, torch.cuda.get_device_name()


def cmd_bench(args) -> int:
    if args.from_json and len(args.from_json) > 1:
        # runs of the same rows are read across runs; runs of disjoint rows of one suite, as one run
        try:
            docs = [jsonfile.read(p) for p in args.from_json]
            names = [str(p) for p in args.from_json]
            labels = [{row["label"] for row in doc["rows"]} for doc in docs]
            if all(not (a & b) for n, a in enumerate(labels) for b in labels[n + 1:]):
                doc = report.join_parts(docs, names)
                print(report.results_table(doc))
                _plot(doc, args)
                return 0
            if args.plot:
                print("flashrung bench: --plot draws one run (or the parts of one); runs of the same rows are "
                      "read as a table only", file=sys.stderr)
                return 2
            print(report.runs_table(docs, names))
        except (OSError, ValueError, KeyError) as exc:
            print(f"flashrung bench: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.from_json:
        doc = jsonfile.read(args.from_json[0])
        print(report.results_table(doc))
        _plot(doc, args)
        return 0
    try:
        suite, rows = rows_from_args(args)
    except ValueError as exc:
        print(f"flashrung bench: {exc}", file=sys.stderr)
        return 2
    impls = list(dict.fromkeys(args.impl or peers.DEFAULT_IMPLS))
    plan = {"suite": suite, "impls": impls, **suites.plan_json(rows, args.causal_flops)}
    if not args.dry_run:
        ok, what = gpu_available()
        if not ok:
            print(f"flashrung bench: no GPU to measure on: {what}. Here is the plan it would run "
                  f"({len(rows)} rows × {len(impls)} implementations); nothing was timed.", file=sys.stderr)
            args.dry_run = True
    if args.dry_run:
        if args.json:
            _emit_json(plan, args.json)
        else:
            print(f"suite {suite}: {len(rows)} rows × implementations {', '.join(impls)}")
            print(report.plan_table(plan))
        return 0
    from flashrung.bench import runner
    protocol = bench_protocol(args)
    kind = "quick" if args.quick else "default"
    print(f"flashrung bench on {what}: suite {suite}, {len(rows)} rows × {len(impls)} implementations "
          f"({', '.join(impls)}), {kind} protocol {protocol.to_json()}",
          file=sys.stderr)
    doc = runner.run(rows, impls, protocol=protocol, causal_convention=args.causal_flops, gate=not args.no_gate,
                     suite=suite, progress=not args.no_progress, command=list(sys.argv),
                     seed=args.seed, peer_options=peers.PeerOptions(flex_dynamic=args.flex_dynamic),
                     clock_sample_ms=args.clock_sample_ms)
    table = report.results_table(doc)
    if args.json == "-":
        print(table, file=sys.stderr)
    else:
        print(table)
    if args.json:
        _emit_json(report.with_targets(doc), args.json)
    _plot(doc, args)
    return 0


# ----------------------------------------------------------------------------------------------
# null / compare / reanchor


def bench_protocol(args) -> timing.BenchProtocol:
    """The bench protocol: the default or ``--quick``'s, with ``--rounds``, ``--order`` and
    ``--block-preheat-ms`` if given (a preheat of 0 is given, and kept)."""
    base = timing.QUICK_BENCH if args.quick else timing.BenchProtocol()
    changes = {name: getattr(args, name) for name in ("rounds", "order") if getattr(args, name, None)}
    if getattr(args, "block_preheat_ms", None) is not None:
        changes["block_preheat_ms"] = args.block_preheat_ms
    return dataclasses.replace(base, **changes)


def _window_of(args) -> tuple[int, int] | None:
    """``--window`` checked against the mask (``suites.check_window``); a ``ValueError`` names the
    argument."""
    window = getattr(args, "window", None)
    if window is None:
        return None
    try:
        return suites.check_window(window, bool(args.causal))
    except ValueError as exc:
        raise ValueError(f"--window: {exc}") from None


def _checked_window(args) -> tuple[int, int] | None:
    """:func:`_window_of` for the commands built on :func:`pair_row`, which exit naming the argument."""
    try:
        return _window_of(args)
    except ValueError as exc:
        raise SystemExit(f"flashrung: {exc}") from None


def _check_packed_flags(args) -> None:
    """``--packed`` gives the batch and the lengths: the flags that would too are refused, named."""
    clash = [flag for flag, attr in (("--batch", "batch"), ("--seqlen", "seqlen"), ("--seqlen-k", "seqlen_k"))
             if getattr(args, attr, None)]
    if clash:
        raise ValueError(f"--packed gives the sequences and their lengths; drop {', '.join(clash)}")


# the flags --row-from stands in for (argparse dest, flag)
_ROW_FLAGS = (("batch", "--batch"), ("seqlen", "--seqlen"), ("seqlen_k", "--seqlen-k"), ("heads", "--heads"),
              ("kv_heads", "--kv-heads"), ("headdim", "--headdim"), ("headdim_v", "--headdim-v"),
              ("softcap", "--softcap"), ("window", "--window"), ("packed", "--packed"), ("causal", "--causal"),
              ("dtype", "--dtype"), ("mode", "--mode"))


def stored_row(spec: str) -> suites.Row:
    """The row of a stored result: ``FILE`` (a compare's ``link.row``, a sustain's or a profile's
    ``row``, a bench run of one row) or ``FILE#N`` (row ``N`` of a bench run's ``rows``). A
    ``ValueError`` names the file and what it holds."""
    path, sep, index = spec.rpartition("#") if "#" in spec else (spec, "", "")
    try:
        doc = jsonfile.read(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--row-from {spec}: cannot read it as JSON ({exc})") from None
    rows = None
    if isinstance(doc, dict):
        if isinstance(doc.get("link"), dict) and isinstance(doc["link"].get("row"), dict):
            rows = [doc["link"]["row"]]
        elif isinstance(doc.get("row"), dict):
            rows = [doc["row"]]
        elif isinstance(doc.get("rows"), list) and all(isinstance(r, dict) for r in doc["rows"]):
            rows = doc["rows"]
    if not rows:
        raise ValueError(f"--row-from {spec}: holds no row (expected a compare's, a sustain's or a bench "
                         "run's JSON)")
    if sep:
        try:
            n = int(index)
        except ValueError:
            raise ValueError(f"--row-from {spec}: the row's index after '#' must be an integer, got {index!r}") \
                from None
        if not 0 <= n < len(rows):
            raise ValueError(f"--row-from {spec}: row {n} asked for, the file holds {len(rows)} (0 to "
                             f"{len(rows) - 1})")
        plan = rows[n]
    elif len(rows) > 1:
        raise ValueError(f"--row-from {spec}: the file holds {len(rows)} rows; name one as {path}#N (0 to "
                         f"{len(rows) - 1})")
    else:
        plan = rows[0]
    try:
        return suites.Row.from_plan(plan)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"--row-from {spec}: its row is not one this version reads ({exc!r})") from None


def pair_row(args) -> suites.Row:
    d = DEFAULT_PAIR_SHAPE
    if getattr(args, "row_from", None) is not None:
        given = [flag for dest, flag in _ROW_FLAGS if getattr(args, dest, None) is not None]
        if given:
            raise SystemExit(f"flashrung: --row-from gives the whole row; drop {', '.join(given)}")
        try:
            return stored_row(args.row_from)
        except ValueError as exc:
            raise SystemExit(f"flashrung: {exc}") from None
    if getattr(args, "packed", None) is not None:
        try:
            _check_packed_flags(args)
        except ValueError as exc:
            raise SystemExit(f"flashrung: {exc}") from None
        return suites.packed_rows(lengths=args.packed, heads=args.heads or d["heads"],
                                  kv_heads=args.kv_heads or args.heads or d["heads"],
                                  headdim=args.headdim or d["headdim"],
                                  headdim_v=args.headdim_v, dtype=args.dtype or d["dtype"], causal=bool(args.causal),
                                  mode=args.mode or "fwd", softcap=args.softcap or 0.0,
                                  window=_checked_window(args))[0]
    seqlen = args.seqlen or d["seqlen"]
    return suites.Row(batch=args.batch or d["batch"], seqlen_q=seqlen, seqlen_k=args.seqlen_k or seqlen,
                      heads_q=args.heads or d["heads"], heads_kv=args.kv_heads or args.heads or d["heads"],
                      headdim=args.headdim or d["headdim"],
                      headdim_v=args.headdim_v if args.headdim_v not in (None, args.headdim or d["headdim"]) else None,
                      dtype=args.dtype or d["dtype"],
                      causal=bool(args.causal), mode=args.mode or "fwd", softcap=args.softcap or 0.0,
                      window=_checked_window(args))


def pair_protocol(args) -> timing.PairedProtocol:
    base = timing.QUICK_PAIRED if args.quick else timing.PairedProtocol()
    changes = {k: v for k, v in (("alternations", args.alternations), ("reps", args.reps),
                                 ("warmup_calls", args.warmup),
                                 ("block_preheat_ms", getattr(args, "block_preheat_ms", None))) if v is not None}
    return timing.PairedProtocol(**{**base.to_json(), **changes})


def _require_device(command: str, args, *, cpu_path: bool = True) -> str | None:
    """The calibration key of the device the command will run on, or None (after saying why);
    ``cpu_path``: the command has a ``--device cpu`` check of its machinery to point to."""
    if args.device == "cpu":
        return "cpu"
    ok, what = gpu_available()
    if not ok:
        hint = " (--device cpu exercises the path without one)" if cpu_path else ""
        print(f"flashrung {command}: needs a GPU: {what}{hint}", file=sys.stderr)
        return None
    return what


def _pct(x: float) -> str:
    return f"{100 * x:.4f}%"


def _summary_line(label: str, s: stats.PairedSummary) -> str:
    return (f"{label}: margin {s.margin:.6f} [p10 {s.lo:.6f}, p90 {s.hi:.6f}]  AB {s.margin_ab:.6f}  "
            f"BA {s.margin_ba:.6f}  ({'agree' if s.halves_agree else 'DISAGREE'})  n={s.n}  "
            f"unpaired {s.unpaired_ratio:.6f}"
            + (f"  shared slowdowns {s.shared_slow}" if s.shared_slow else ""))


def cmd_null(args) -> int:
    from flashrung.bench import worker
    gpu = _require_device("null", args)
    if gpu is None:
        return 2
    if args.pairs < stats.MIN_NULL_PAIRS:
        print(f"flashrung null: --pairs must be ≥ {stats.MIN_NULL_PAIRS}", file=sys.stderr)
        return 2
    row, protocol = pair_row(args), pair_protocol(args)
    spec = worker.Spec(baseline=args.impl, candidate=args.impl, row=row, protocol=protocol, seed=args.seed,
                       device=args.device)
    print(f"A/A null on {gpu}: {args.impl} vs itself, {row.label()}, {args.pairs} fresh processes, "
          f"{protocol.alternations} alternations × {protocol.reps} reps")
    from tqdm import tqdm
    results = []
    for i in tqdm(range(args.pairs), desc="A/A pairs", unit="pair"):
        try:
            results.append(worker.run_fresh(spec))
        except worker.WorkerError as exc:
            print(f"flashrung null: pair {i + 1}: {exc}", file=sys.stderr)
            return 1
    summaries = [stats.PairedSummary.from_json(r["summary"]) for r in results]
    margins = [s.margin for s in summaries]
    for i, (s, r) in enumerate(zip(summaries, results), 1):
        print(_summary_line(f"pair {i:2d}", s) + f"  {r['wall_s']:.1f} s")
    entry = calibration.entry_from_margins(margins, impl=args.impl, row=row.plan(), protocol=protocol.to_json(),
                                           runs=[{"summary": r["summary"], "clocks_start": r["clocks_start"],
                                                  "clocks_end": r["clocks_end"], "dispatch": r["dispatch"]}
                                                 for r in results])
    gpu_key = results[0]["gpu"]
    path = calibration.store(gpu_key, entry, args.calibration)
    print(f"t_noise = {_pct(entry['t_noise'])} (p95 |margin − 1|, nearest rank: with n = {len(margins)} this is "
          f"the largest deviation); {entry['positive']} above 1, {entry['negative']} below; t_keep = "
          f"{1 + entry['t_noise']:.6f}")
    print(f"stored for {gpu_key!r} in {path}")
    if args.json:
        report.write_json({"gpu": gpu_key, **entry}, args.json)
    return 0


def _protocol_json(stored) -> dict | None:
    """A stored protocol with the fields it predates at their defaults (so an entry written before
    a field existed matches a run that leaves that field at its default)."""
    try:
        return timing.PairedProtocol(**stored).to_json()
    except (TypeError, ValueError):
        return stored


def _t_noise(args, gpu: str, row: suites.Row, protocol: timing.PairedProtocol) -> tuple[float | None, str]:
    """t_noise for ``gpu`` (from --t-noise or the calibration file) and where it came from; a
    calibration taken on another row or protocol is used but said so."""
    if args.t_noise is not None:
        if not (args.t_noise >= 0 and math.isfinite(args.t_noise)):
            return None, "--t-noise must be a finite non-negative fraction"
        return args.t_noise, "given by --t-noise"
    entry = calibration.lookup(gpu, args.calibration)
    if entry is None:
        where = args.calibration or calibration.default_path()
        return None, (f"no A/A calibration for {gpu!r} in {where}: run `flashrung null` on this GPU first "
                      "(or pass --t-noise)")
    cal_row = suites.Row.from_plan(entry["row"]) if entry.get("row") else None
    source = f"A/A null of {entry['impl']} on {cal_row.label() if cal_row else '?'}, {entry['n']} pairs, {entry['date']}"
    if cal_row is not None and cal_row.shape_key() != row.shape_key():
        source += f"; NOTE: calibrated on another shape than {row.label()}"
    if _protocol_json(entry.get("protocol")) != protocol.to_json():
        source += f"; NOTE: calibrated with protocol {entry.get('protocol')}, this run uses {protocol.to_json()}"
    return float(entry["t_noise"]), source


_number = timing.finite_or_none


def regime_line(runs, protocol: timing.PairedProtocol) -> str | None:
    """One line on the power regime the paired runs ended in (the nvidia-smi snapshot each run takes
    at its end), or None when no run has one.

    Under sustained attention the H200 runs at its power limit; an unpreheated comparison whose runs
    end well below it timed both arms above their sustained clock, where a lever that moves memory
    traffic (watts) can rank differently than at the limit (docs/hopper.md, the staggered sweeps:
    1.0218 unpreheated, 0.9796 preheated). One snapshot per run is a hint, not a measurement.
    """
    ends = []
    for r in runs:
        c = r.get("clocks_end") or {}
        power, limit, sm = _number(c.get("power.draw")), _number(c.get("power.limit")), _number(c.get("clocks.sm"))
        if power is not None and limit:
            ends.append((power, limit, sm))
    if not ends:
        return None
    parts = ", ".join(f"{p:.0f} W of {lim:.0f} W" + (f" at {sm:.0f} MHz" if sm is not None else "")
                      for p, lim, sm in ends)
    line = f"regime: runs ended at {parts}; blocks preheated {protocol.block_preheat_ms:g} ms"
    if protocol.block_preheat_ms == 0 and any(p < manifest.POWER_LIMITED_SHARE * lim for p, lim, _ in ends):
        line += ("; NOTE: below the power limit and not preheated — a lever that moves memory traffic can "
                 "rank differently at sustained load (--block-preheat-ms 150 with a null calibrated the same way)")
    return line


def host_path_line(runs) -> str | None:
    """One line when an arm's host path comes within timing.HOST_BOUND_SHARE of its GPU time in any run
    (the worker's probe after warm-up), or None. There the GPU can wait for the host between calls:
    a moment of a slower host then slows that arm alone, and an arm with the longer host path
    (another dispatch path, a variant) carries it into the margin."""
    near = []
    for i, r in enumerate(runs, 1):
        for role, h in (r.get("host_path") or {}).items():
            if timing.host_bound(h):
                host, device = float(h["host_ms"]), float(h["device_ms"])
                near.append(f"run {i} {role} {host:.3f} ms/call issued against {device:.3f} ms/call on the GPU "
                            f"({host / device:.2f}×)")
    if not near:
        return None
    return ("host path: " + "; ".join(near) + " — calls this short can be timed host-bound: a larger batch, or "
            "CUDA graphs on both sides, keep the GPU ahead")


def cmd_compare(args) -> int:
    from flashrung.bench import worker
    gpu = _require_device("compare", args)
    if gpu is None:
        return 2
    row, protocol = pair_row(args), pair_protocol(args)
    t_noise, source = _t_noise(args, gpu, row, protocol)
    if t_noise is None:
        print(f"flashrung compare: {source}", file=sys.stderr)
        return 2
    print(f"compare on {gpu}: baseline {args.baseline}, candidate {args.candidate}, {row.label()}")
    if row.mode == "fwd":
        from flashrung.bench import runner
        for role, impl in (("baseline", args.baseline), ("candidate", args.candidate)):
            carried = runner.carried_changes(impl, row, args.device)
            if carried:
                print(f"{role} also runs, as its overrides carry (config.replace_following): "
                      + ", ".join(f"{k}={run} (default {base})" for k, (base, run) in carried.items()))
    print(f"t_noise {_pct(t_noise)} → t_keep {1 + t_noise:.6f} ({source})")
    runs = []
    for i, gate in enumerate((not args.no_gate, False), 1):
        spec = worker.Spec(baseline=args.baseline, candidate=args.candidate, row=row, protocol=protocol,
                           gate=gate, seed=args.seed + i - 1, device=args.device)
        try:
            runs.append(worker.run_fresh(spec))
        except worker.WorkerError as exc:
            print(f"flashrung compare: run {i}: {exc}", file=sys.stderr)
            return 1
        if runs[-1]["summary"] is None:
            # the gate (run 1) failed an arm: nothing is timed, and no second run is needed
            print(f"run {i}: {runs[-1]['untimed']}")
            break
    summaries = [stats.PairedSummary.from_json(r["summary"]) for r in runs if r["summary"] is not None]
    gates = runs[0]["gate"] or {}

    def passed(role):
        g = gates.get(role)
        return None if g is None else bool(g["passed"])
    verdict = stats.keep_gate(summaries, t_noise, baseline_correct=passed("baseline"),
                              candidate_correct=passed("candidate"))
    for i, s in enumerate(summaries, 1):
        print(_summary_line(f"run {i}", s))
    if args.no_gate:
        print("correctness gate skipped (--no-gate): the verdict rests on timing alone")
    for role in ("baseline", "candidate"):
        g = gates.get(role)
        if g is not None:
            print(f"gate {role}: {g['text']}" if g["text"].startswith(("PASS", "FAIL"))
                  else f"gate {role}: FAIL {g['text']}")
    margin = "not timed" if verdict.margin is None else f"margin {verdict.margin:.6f}"
    print(f"\n{verdict.verdict}: {margin} vs t_keep {verdict.t_keep:.6f}")
    for reason in verdict.reasons:
        print(f"  - {reason}")
    regime = regime_line(runs, protocol)
    if regime is not None:
        print(regime)
    host = host_path_line(runs)
    if host is not None:
        print(host)
    if args.json:
        link = stats.Link(baseline=args.baseline, candidate=args.candidate, margin=verdict.margin,
                          verdict=verdict.verdict, paired=True)
        report.write_json({"link": {**link.to_json(), "row": row.plan()}, "verdict": verdict.to_json(),
                           "t_noise_source": source, "regime": regime, "host_path": host, "runs": runs},
                          args.json)
    return 0


def load_links(paths) -> list[stats.Link]:
    links = []
    for path in paths:
        data = jsonfile.read(path)
        items = data.get("links", [data]) if isinstance(data, dict) else data
        links.extend(stats.Link.from_json(item) for item in items)
    return links


def cmd_reanchor(args) -> int:
    from flashrung.bench import worker
    try:
        links = load_links(args.links)
        kept = stats.kept_chain(links)
        product = stats.chain_product(links)
    except (ValueError, KeyError) as exc:
        print(f"flashrung reanchor: {exc}", file=sys.stderr)
        return 2
    anchor = args.anchor or kept[0].baseline
    current = args.current or kept[-1].candidate
    gpu = _require_device("reanchor", args)
    if gpu is None:
        return 2
    row, protocol = pair_row(args), pair_protocol(args)
    t_noise, source = _t_noise(args, gpu, row, protocol)
    if t_noise is None:
        print(f"flashrung reanchor: {source}", file=sys.stderr)
        return 2
    print(f"reanchor on {gpu}: {len(kept)} kept links " + " → ".join([kept[0].baseline] + [k.candidate for k in kept])
          + f", product {product:.6f}")
    try:
        direct = worker.run_fresh(worker.Spec(baseline=anchor, candidate=current, row=row, protocol=protocol,
                                              seed=args.seed, device=args.device))
    except worker.WorkerError as exc:
        print(f"flashrung reanchor: {exc}", file=sys.stderr)
        return 1
    summary = stats.PairedSummary.from_json(direct["summary"])
    result = stats.Reanchor(product=product, measured=summary.margin, n_links=len(kept), t_noise=t_noise)
    print(_summary_line(f"direct {current} over {anchor}", summary))
    print(f"{result.verdict}: product {product:.6f} vs measured {summary.margin:.6f}, gap {_pct(result.gap)} "
          f"against tolerance {_pct(result.tolerance)} (√{len(kept) + 1} · t_noise, {source})")
    if args.json:
        report.write_json({"reanchor": result.to_json(), "links": [k.to_json() for k in kept], "anchor": anchor,
                           "current": current, "direct": direct}, args.json)
    return 0


# ----------------------------------------------------------------------------------------------
# sustain


def cmd_sustain(args) -> int:
    try:
        sustain.check_parameters(args.blocks, args.block_s, args.settle_s, args.sample_ms)
    except ValueError as exc:
        print(f"flashrung sustain: {exc}", file=sys.stderr)
        return 2
    # clock and power are a GPU's: there is no CPU path to point to
    gpu = _require_device("sustain", args, cpu_path=False)
    if gpu is None:
        return 2
    row = pair_row(args)
    print(f"sustain on {gpu}: baseline {args.baseline}, candidate {args.candidate}, {row.label()}; {args.blocks} "
          f"blocks × {args.block_s:g} s in ABBA order, nvidia-smi every {args.sample_ms} ms, settled window "
          f"[start + {args.settle_s:g} s, end − {sustain.TAIL_S:g} s]")
    try:
        doc = sustain.run(args.baseline, args.candidate, row, blocks=args.blocks, block_s=args.block_s,
                          settle_s=args.settle_s, sample_ms=args.sample_ms, device=args.device, seed=args.seed,
                          command=list(sys.argv))
    except sustain.SustainError as exc:
        print(f"flashrung sustain: {exc}", file=sys.stderr)
        return 2
    for role in sustain.ARMS:
        g = doc["arms"][role].get("gate")
        if g is not None:
            verdict = "" if g["text"].startswith(("PASS", "FAIL")) else "FAIL "
            print(f"gate {role}: {verdict}{g['text']}")
    print(sustain.text(doc))
    if args.json:
        path = report.write_json(doc, args.json)
        print(f"wrote {path}", file=sys.stderr)
    return 0 if doc["summary"] is not None else 1
