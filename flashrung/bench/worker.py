"""One paired run in a fresh process: the single path that compare, null and reanchor share.

``python -m flashrung.bench.worker SPEC.json OUT.json`` reads a spec (baseline, candidate, row,
protocol, whether to run the correctness gate, seed), gates both arms first when asked — an arm
that fails its gate is not timed: the document then carries the gate results, ``"summary": None``
and ``"untimed"`` saying why; with the gate, a forward row's two outputs (a peer's too) are then read
against the oracle at the row's own size (``runner.output_agreement``), and an arm computing another
function is not timed either — prepares both arms on the same inputs, warms them, runs
:func:`flashrung.bench.timing.paired_run` and writes the series, its summary, the GPU, the
dispatch records, clocks at start and end, and gate results.

A fresh process per run is the point: the second run of a keep test and every A/A pair start
from a new CUDA context, allocator and JIT state, so a result that depends on what happened to be
warm in one process does not replicate.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from flashrung.bench import manifest as manifest_mod
from flashrung.bench import peers, stats, timing
from flashrung.bench.suites import Row


@dataclasses.dataclass(frozen=True)
class Spec:
    baseline: str
    candidate: str
    row: Row
    protocol: timing.PairedProtocol
    gate: bool = False
    seed: int = 0
    device: str = "cuda"    # "cpu" exercises the path (interpreter, wall clock); its numbers say nothing of a GPU

    def to_json(self) -> dict:
        return {"baseline": self.baseline, "candidate": self.candidate, "row": self.row.plan(),
                "protocol": self.protocol.to_json(), "gate": self.gate, "seed": self.seed, "device": self.device}

    @classmethod
    def from_json(cls, d: dict) -> "Spec":
        return cls(baseline=d["baseline"], candidate=d["candidate"], row=Row.from_plan(d["row"]),
                   protocol=timing.PairedProtocol(**d["protocol"]), gate=bool(d["gate"]), seed=int(d["seed"]),
                   device=d.get("device", "cuda"))


class WorkerError(RuntimeError):
    pass


def device_name(device: str) -> str:
    """The calibration key: the GPU's product name, or "cpu"."""
    import torch
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def run_in_process(spec: Spec) -> dict:
    """The paired run itself (call it in a fresh process: see :func:`run_fresh`)."""
    import torch
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise WorkerError("no CUDA GPU is visible")
    from flashrung.bench import runner
    started = time.perf_counter()
    clocks_start = manifest_mod.clocks()
    # correct first: an arm that fails its gate is not timed (its time would price a wrong kernel)
    gates = (runner.gate_arms({"baseline": spec.baseline, "candidate": spec.candidate}, spec.row, seed=spec.seed,
                              device=spec.device) if spec.gate else {})

    def untimed(why: str) -> dict:
        return {
            "spec": spec.to_json(), "gpu": device_name(spec.device), "run": None, "summary": None,
            "untimed": why, "dispatch": {}, "notes": {}, "gate": gates, "pid": os.getpid(),
            "clocks_start": clocks_start, "clocks_end": manifest_mod.clocks(), "host_path": None,
            "wall_s": time.perf_counter() - started,
        }
    failed = [role for role, g in gates.items() if g is not None and not g["passed"]]
    if failed:
        return untimed(f"{' and '.join(failed)} failed the correctness gate: not timed")
    inputs = peers.make_inputs(spec.row, device=spec.device, seed=spec.seed)
    arms = {}
    for role, impl in (("baseline", spec.baseline), ("candidate", spec.candidate)):
        try:
            arms[role] = peers.prepare(impl, spec.row, inputs)
        except peers.Unsupported as exc:
            raise WorkerError(f"{role} {impl} cannot run {spec.row.label()}: {exc.reason}") from None
    # with the gate, a forward row's arms (a peer's too) are read against the oracle at the row's own
    # size, as the bench reads them: an arm computing another function fails as a gate does
    if spec.gate:
        agreement, refused = runner.check_outputs(spec.row, inputs, arms)
        for role in refused:
            gates[role] = runner.output_check_record(agreement[role])
        if refused:
            return untimed(f"{' and '.join(refused)} computes another function than the row asks for: not timed")
    timer = timing.CudaEventTimer() if spec.device == "cuda" else timing.ClockTimer()
    for p in arms.values():
        p.first_out = None
        timing.measure(timer, p.fn, spec.protocol.warmup_calls)
    # how close each arm's host path comes to its GPU time (CUDA only: on the CPU they are one clock)
    host = ({r: timing.host_path(timer, p.fn, sync=torch.cuda.synchronize) for r, p in arms.items()}
            if spec.device == "cuda" else None)
    run = timing.paired_run(arms["baseline"].fn, arms["candidate"].fn, spec.protocol, timer)
    summary = stats.summarize(run)
    return {
        "spec": spec.to_json(), "gpu": device_name(spec.device), "run": run.to_json(),
        "summary": summary.to_json(), "dispatch": {r: p.dispatch for r, p in arms.items()},
        "notes": {r: p.note for r, p in arms.items()}, "gate": gates, "pid": os.getpid(),
        "clocks_start": clocks_start, "clocks_end": manifest_mod.clocks(), "host_path": host,
        "wall_s": time.perf_counter() - started,
    }


def run_fresh(spec: Spec, *, timeout_s: float | None = None) -> dict:
    """Run ``spec`` in a new Python process and return its result document."""
    with tempfile.TemporaryDirectory(prefix="flashrung-pair-") as tmp:
        spec_path, out_path = pathlib.Path(tmp, "spec.json"), pathlib.Path(tmp, "out.json")
        spec_path.write_text(json.dumps(spec.to_json()))
        env = dict(os.environ)
        # the child must import this same flashrung, installed or not
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(manifest_mod.REPO_ROOT), env.get("PYTHONPATH")) if p)
        if spec.device == "cpu":
            env["TRITON_INTERPRET"] = "1"      # kernels run on the CPU only under the interpreter
        proc = subprocess.run([sys.executable, "-m", "flashrung.bench.worker", str(spec_path), str(out_path)],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
        if proc.returncode != 0 or not out_path.exists():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise WorkerError(f"paired run failed (exit {proc.returncode}):\n{tail}")
        return json.loads(out_path.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m flashrung.bench.worker SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = Spec.from_json(json.loads(pathlib.Path(argv[0]).read_text()))
    try:
        result = run_in_process(spec)
    except WorkerError as exc:
        print(f"flashrung worker: {exc}", file=sys.stderr)
        return 1
    pathlib.Path(argv[1]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
