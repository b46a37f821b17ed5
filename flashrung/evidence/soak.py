"""Many back-to-back calls of one attention configuration, watched for hangs and moving results.

A race between partitions, or between the two CTAs of a ``kv_multicast`` pair, may show once in
hundreds of launches: as a launch that never returns (a wait for a barrier phase that never
comes) or as an output that differs between calls on the same inputs. A hung kernel cannot be
interrupted from the process that launched it, so the calls run in a child process that reports
its progress on stdout; the parent kills it when no report comes in time and calls the run a
hang. Each run is a fresh process (its own allocations, compile cache hits and launch order).

The child calls :func:`flashrung.attention` (``impl`` as everywhere: ``hopper.fwd``, or
``hopper.fwd@key=value,...`` for a forced configuration) on seeded inputs, keeps the first call's
output and LSE, and every ``--check-every`` calls synchronizes and compares the latest call's
output and LSE with them bit for bit.

``python -m flashrung.evidence.soak --headdim 64 --seqlen 2048 --batch 16 --heads 32 --no-causal
[--impl 'hopper.fwd@...'] [--calls 4000] [--check-every 250] [--runs 3] [--timeout-s 30]
[--json PATH]``. Exit status 0 when every run completed with identical outputs, 1 otherwise, 2
without a CUDA GPU or with bad arguments. Evidence level: correctness (a hang or a moving result
is a finding; runs without one bound how rare it is, they do not rule it out).
"""
from __future__ import annotations

import argparse
import dataclasses
import queue
import subprocess
import sys
import threading
import time
from flashrung import jsonfile

# what the child prints, one report per line
READY, PROGRESS, MOVED, DONE = "ready", "progress", "moved", "done"
# the first report follows the first call, which compiles the kernel
FIRST_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One child process: ``verdict`` is ``ok`` (every call returned, every checked output equal to
    the first), ``hang`` (no report within the timeout; the child was killed), ``moved`` (an output
    differed from the first call's) or ``error`` (the child failed; ``detail`` ends its stderr)."""

    run: int
    verdict: str
    calls: int          # calls known to have completed
    seconds: float
    detail: str = ""


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def watch(cmd: list[str], run: int, timeout_s: float, first_timeout_s: float = FIRST_TIMEOUT_S) -> RunResult:
    """Run the child ``cmd`` and follow its reports; kill it when none comes for ``timeout_s``
    (``first_timeout_s`` before the first, which waits for a compile)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    err_lines: list[str] = []
    err_reader = threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True)
    err_reader.start()
    calls, limit = 0, first_timeout_s
    while True:
        try:
            line = lines.get(timeout=limit)
        except queue.Empty:
            proc.kill()
            proc.wait()
            return RunResult(run, "hang", calls, time.monotonic() - t0,
                             f"no report for {limit:g} s after {calls} completed calls; killed")
        if line is None:
            break
        word, *rest = line.split()
        if word == READY:
            calls, limit = 1, timeout_s
        elif word == PROGRESS:
            calls = int(rest[0])
        elif word == MOVED:
            proc.kill()
            proc.wait()
            return RunResult(run, "moved", int(rest[0]), time.monotonic() - t0,
                             f"call {rest[0]}'s output differs from the first call's")
        elif word == DONE:
            calls = int(rest[0])
    rc = proc.wait()
    seconds = time.monotonic() - t0
    if rc != 0:
        err_reader.join(timeout=5)     # the child has exited: its stderr ends
        tail = "".join(err_lines).strip().splitlines()[-3:]
        return RunResult(run, "error", calls, seconds, f"exit status {rc}: " + " | ".join(tail))
    return RunResult(run, "ok", calls, seconds)


def _child(args) -> int:
    import torch

    import flashrung

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn(args.batch, args.seqlen, args.heads, args.headdim, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(args.batch, args.seqlen, args.heads_kv or args.heads, args.headdim, device="cuda",
                        dtype=dtype, generator=g) for _ in range(2))
    t0 = time.monotonic()

    def call():
        return flashrung.attention(q, k, v, causal=args.causal, return_lse=True, impl=args.impl)

    ref_out, ref_lse = (t.clone() for t in call())
    torch.cuda.synchronize()
    print(READY, 1, flush=True)
    for n in range(2, args.calls + 1):
        out, lse = call()
        if n % args.check_every == 0 or n == args.calls:
            torch.cuda.synchronize()
            if not (torch.equal(out, ref_out) and torch.equal(lse, ref_lse)):
                print(MOVED, n, flush=True)
                return 1
            print(PROGRESS, n, f"{time.monotonic() - t0:.3f}", flush=True)
    print(DONE, args.calls, f"{time.monotonic() - t0:.3f}", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from flashrung.bench.cli import positive_float, positive_int

    p = argparse.ArgumentParser(prog="python -m flashrung.evidence.soak",
                                description="back-to-back calls of one configuration in fresh processes, "
                                            "watched for hangs and for outputs that move between calls")
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--seqlen", type=positive_int, default=2048)
    p.add_argument("--heads", type=positive_int, default=32)
    p.add_argument("--heads-kv", type=positive_int, default=None, help="K/V heads (GQA); default: --heads")
    p.add_argument("--headdim", type=positive_int, default=64)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--impl", default="hopper.fwd", help="the forward kernel, as impl= takes it (default hopper.fwd)")
    p.add_argument("--calls", type=positive_int, default=4000, help="calls per run (default 4000)")
    p.add_argument("--check-every", type=positive_int, default=250,
                   help="calls between a synchronization and a bit comparison with the first call (default 250)")
    p.add_argument("--runs", type=positive_int, default=3, help="fresh processes (default 3)")
    p.add_argument("--timeout-s", type=positive_float, default=30.0,
                   help="seconds without a report before a run is called a hang (default 30; the first "
                        f"report, after the compile, gets {FIRST_TIMEOUT_S:g})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) and 2
    if args.heads_kv is not None and args.heads % args.heads_kv:
        print(f"--heads ({args.heads}) must be a multiple of --heads-kv ({args.heads_kv})", file=sys.stderr)
        return 2
    if args.child:
        return _child(args)
    import torch

    if not torch.cuda.is_available():
        print("soak needs a CUDA GPU", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "flashrung.evidence.soak", "--child", *argv]
    label = (f"{args.impl} B{args.batch} H{args.heads}/{args.heads_kv or args.heads} S{args.seqlen} "
             f"d{args.headdim} {args.dtype} {'causal' if args.causal else 'non-causal'}")
    print(f"soak on {torch.cuda.get_device_name()}: {label}, {args.runs} × {args.calls} calls", flush=True)
    results = []
    for run in range(1, args.runs + 1):
        r = watch(cmd, run, args.timeout_s)
        results.append(r)
        print(f"run {run}: {r.verdict.upper():5} {r.calls} calls in {r.seconds:.1f} s"
              + (f" — {r.detail}" if r.detail else ""), flush=True)
    bad = [r for r in results if r.verdict != "ok"]
    print(f"{len(results) - len(bad)} of {len(results)} runs completed with every checked output equal to "
          f"the first call's" + (f"; {len(bad)} did not" if bad else ""))
    if args.json:
        jsonfile.write(dict(label=label, device=torch.cuda.get_device_name(),
                            args={k: v for k, v in vars(args).items() if k not in ("json", "child")},
                            runs=[dataclasses.asdict(r) for r in results]), args.json)
        print(f"wrote {args.json}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
