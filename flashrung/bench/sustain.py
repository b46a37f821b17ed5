"""Sustained load: time per call beside the SM clock and the board power (``flashrung sustain``).

Under sustained attention an H200 runs at its board power limit, and the SM clock settles where
the power allows. A change can then pay in time per call in two ways: by needing fewer cycles per
call (the clock stays; the time falls with the cycles), or by spending less energy per call (the
clock settles higher; the cycles per call stay). A paired timing (``flashrung compare``) sees only
the time; this instrument puts the clock and the power beside it.

Protocol: both arms are gated (flashrung's kernels), prepared on the same inputs and warmed; then
``nvidia-smi`` samples the SM clock and the board power every ``sample_ms`` in the background
while the arms alternate in blocks of back-to-back calls, ``block_s`` each, in ABBA order
(baseline, candidate, candidate, baseline, …). A block issues its calls in groups of
:data:`CALLS_PER_SYNC`, synchronising after each group (the host never runs far ahead of the GPU,
so a block ends when its time is up), and CUDA events around the whole block give its
milliseconds per call (the short gaps at the synchronisations included, alike for both arms).

Figures per block, over the samples in its *settled window* ``[start + settle_s, end − TAIL_S]``
(the clock takes about a second to settle after the arms swap; the last samples may straddle the
next block): ms/call, MHz and W (means of the samples), J/call = W × ms / 1000 and Mcycles/call
= MHz × ms / 1000. A block without a sample in its window is marked (its figures None) and left
out of its arm's means, all quantities alike, so time and clock are averaged over the same blocks.
Per arm: the mean of each quantity over its blocks with samples; then candidate ÷ baseline for
each quantity, and a reading (:func:`moved_with`) — a description, not a gate: the keep verdict
is ``flashrung compare``'s.

Everything but :func:`run` is pure, so the arithmetic is tested without a GPU.
"""
from __future__ import annotations

import datetime
import math
import os
import shutil
import subprocess
import tempfile
import time
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from flashrung.bench.manifest import POWER_LIMITED_SHARE

BLOCKS = 10               # blocks in all, half per arm
BLOCK_S = 2.5             # seconds of back-to-back calls per block
SETTLE_S = 1.0            # seconds at a block's start before its samples count (the clock settling)
TAIL_S = 0.1              # seconds at a block's end whose samples do not count (they may straddle the next)
SAMPLE_MS = 50            # nvidia-smi's sampling period
CALLS_PER_SYNC = 20       # calls issued between two synchronisations inside a block
WARMUP_CALLS = 3          # untimed calls per arm after its first (compiling) call
SAMPLER_LEAD_S = 0.5      # the sampler runs this long before the first block, so it is sampling when it starts
SAMPLER_STOP_S = 10.0     # how long to wait for nvidia-smi to exit once asked


SMI_QUERY = ("timestamp", "clocks.sm", "power.draw")
SMI_TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"       # nvidia-smi's timestamp, local time like time.time()

ARMS = ("baseline", "candidate")
QUANTITIES = ("ms_per_call", "mhz", "watts", "joules_per_call", "mcycles_per_call")
# the ratio line's name of each quantity, in the order it prints them
RATIO_NAMES = {"ms_per_call": "time", "mhz": "clock", "watts": "power", "mcycles_per_call": "cycles/call",
               "joules_per_call": "energy/call"}

CLOCK, CYCLES, NEITHER = "clock", "cycles", "neither"


class SustainError(RuntimeError):
    """The sustained run cannot be made here, or its sampler failed; the message says why."""


class Sample(NamedTuple):
    t: float          # seconds since the epoch (time.time()'s clock)
    mhz: float        # SM clock
    watts: float      # board power draw


# ----------------------------------------------------------------------------------------------
# pure: samples, blocks, figures, reading


def parse_smi_line(line: str) -> Sample | None:
    """One ``timestamp, clocks.sm, power.draw`` line (csv, noheader, nounits), or None when it is
    not one: blank, ``[N/A]`` or ``[Unknown Error]`` in a field, garbled, or a non-finite number."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != len(SMI_QUERY):
        return None
    try:
        t = datetime.datetime.strptime(fields[0], SMI_TIME_FORMAT).timestamp()
        mhz, watts = float(fields[1]), float(fields[2])
    except ValueError:
        return None
    if not (math.isfinite(mhz) and math.isfinite(watts)):
        return None
    return Sample(t, mhz, watts)


def parse_smi(lines: Iterable[str]) -> tuple[list[Sample], int]:
    """The samples of nvidia-smi's output and how many lines were skipped as not samples."""
    samples, skipped = [], 0
    for line in lines:
        sample = parse_smi_line(line)
        if sample is None:
            skipped += 1
        else:
            samples.append(sample)
    return samples, skipped


def abba_order(n: int, arms: Sequence[str] = ARMS) -> list[str]:
    """The arm of each of ``n`` blocks: A B B A A B B A …, so a drift in the machine over the run
    (warming, throttling) falls on both arms alike instead of on whichever ran later."""
    if n < 1:
        raise ValueError(f"blocks must be ≥ 1, got {n}")
    a, b = arms
    return [a if i % 4 in (0, 3) else b for i in range(n)]


def settled_window(start: float, end: float, settle_s: float = SETTLE_S, tail_s: float = TAIL_S) -> tuple[float, float]:
    """The part of a block whose samples count, edges included."""
    return start + settle_s, end - tail_s


def samples_within(samples: Iterable[Sample], lo: float, hi: float) -> list[Sample]:
    return [s for s in samples if lo <= s.t <= hi]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def block_figures(ms_per_call: float, samples: Sequence[Sample]) -> dict:
    """ms/call, MHz, W, J/call and Mcycles/call of one block from its settled samples; without a
    sample the clock and power figures are None (no figure is made up for them)."""
    if not samples:
        return {"ms_per_call": ms_per_call, "samples": 0, "mhz": None, "watts": None, "joules_per_call": None,
                "mcycles_per_call": None}
    mhz, watts = _mean([s.mhz for s in samples]), _mean([s.watts for s in samples])
    return {"ms_per_call": ms_per_call, "samples": len(samples), "mhz": mhz, "watts": watts,
            "joules_per_call": watts * ms_per_call / 1e3, "mcycles_per_call": mhz * ms_per_call / 1e3}


def assign_samples(blocks: Sequence[Mapping], samples: Sequence[Sample], settle_s: float = SETTLE_S,
                   tail_s: float = TAIL_S) -> list[dict]:
    """Each timed block (``start``, ``end``, ``ms_per_call``, …) with its settled window and figures."""
    out = []
    for b in blocks:
        lo, hi = settled_window(b["start"], b["end"], settle_s, tail_s)
        out.append({**b, "window": [lo, hi], **block_figures(b["ms_per_call"], samples_within(samples, lo, hi))})
    return out


def _ratio(candidate: float | None, baseline: float | None) -> float | None:
    if candidate is None or not baseline:
        return None
    return candidate / baseline


def summarize(blocks: Sequence[Mapping], arms: Sequence[str] = ARMS) -> dict:
    """Per arm, the mean of each quantity over its blocks with samples (and how many had none);
    then candidate ÷ baseline for each quantity (None where an arm has no block with samples)."""
    per_arm = {}
    for arm in arms:
        mine = [b for b in blocks if b["arm"] == arm]
        used = [b for b in mine if b["samples"] > 0]
        per_arm[arm] = {"blocks": len(mine), "blocks_with_samples": len(used),
                        "blocks_without_samples": len(mine) - len(used),
                        "means": {q: _mean([b[q] for b in used]) if used else None for q in QUANTITIES}}
    base, cand = (per_arm[a]["means"] for a in arms)
    return {"arms": per_arm, "ratios": {q: _ratio(cand[q], base[q]) for q in QUANTITIES}}


def moved_with(ratios: Mapping[str, float | None]) -> str | None:
    """What the time per call moved with: ``"clock"``, ``"cycles"``, ``"neither"``, or None
    without the three ratios.

    The rule: time = cycles / clock, so log(time ratio) = log(cycles ratio) + log(1 / clock ratio).
    Each term's share of log(time ratio) is how much of the time's move it carries; the time moved
    with the clock when the clock's share, −log(clock) / log(time), exceeds the cycles' share,
    log(cycles) / log(time), and with the cycles otherwise. (Per-arm means of per-block figures
    make the shares sum to 1 only nearly; the comparison does not need them to.) A time ratio of
    exactly 1 moved with neither. It is a reading of means, not a test: the blocks in the table
    show how far to trust it.
    """
    time_r, clock_r, cycles_r = (ratios.get(q) for q in ("ms_per_call", "mhz", "mcycles_per_call"))
    if not (time_r and clock_r and cycles_r):
        return None
    log_time = math.log(time_r)
    if log_time == 0:
        return NEITHER
    clock_share, cycles_share = -math.log(clock_r) / log_time, math.log(cycles_r) / log_time
    return CLOCK if clock_share > cycles_share else CYCLES


def at_power_cap(arm_watts: Iterable[float | None], power_limit_w: float | None) -> bool | None:
    """Whether every arm drew at least POWER_LIMITED_SHARE of the board's limit; None when unknown."""
    watts = list(arm_watts)
    if not power_limit_w or any(w is None for w in watts):
        return None
    return all(w >= POWER_LIMITED_SHARE * power_limit_w for w in watts)


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def ratio_text(ratios: Mapping[str, float | None]) -> str:
    return ", ".join(f"{name} {_fmt(ratios.get(q), '.4f')}" for q, name in RATIO_NAMES.items())


def reading_line(ratios: Mapping[str, float | None], at_cap: bool | None = None) -> str:
    """``candidate ÷ baseline: time …, clock …, power …, cycles/call …, energy/call … — <reading>``."""
    head = f"candidate ÷ baseline: {ratio_text(ratios)}"
    moved = moved_with(ratios)
    if moved is None:
        return f"{head} — no reading: an arm has no block with samples in its settled window"
    if moved == NEITHER:
        return f"{head} — the time did not move"
    if moved == CYCLES:
        return f"{head} — the time moved with the cycles"
    cap = {True: " (energy-bound at the power cap)", False: " (below the power cap)",
           None: " (power limit unknown)"}[at_cap]
    return f"{head} — the time moved with the clock{cap}"


# ----------------------------------------------------------------------------------------------
# what a person reads


def _cell(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def blocks_table(doc: Mapping) -> str:
    from flashrung.bench import report
    lines = [[b["index"], b["arm"], _cell(b["ms_per_call"], ".4f"), _cell(b["mhz"], ".0f"), _cell(b["watts"], ".1f"),
              _cell(b["joules_per_call"], ".4f"), _cell(b["mcycles_per_call"], ".4f"),
              b["samples"] if b["samples"] else "no samples"] for b in doc["blocks"]]
    return report._table(["block", "arm", "ms/call", "MHz", "W", "J/call", "Mcycles/call", "samples"], lines, left=2)


def arm_line(arm: str, impl: str, s: Mapping) -> str:
    m = s["means"]
    line = (f"{arm} {impl}: ms/call {_fmt(m['ms_per_call'], '.4f')}, MHz {_fmt(m['mhz'], '.0f')}, "
            f"W {_fmt(m['watts'], '.1f')}, J/call {_fmt(m['joules_per_call'], '.4f')}, "
            f"Mcycles/call {_fmt(m['mcycles_per_call'], '.4f')} (mean of {s['blocks_with_samples']} "
            f"block{'' if s['blocks_with_samples'] == 1 else 's'}")
    if s["blocks_without_samples"]:
        line += f"; {s['blocks_without_samples']} without samples left out"
    return line + ")"


def text(doc: Mapping) -> str:
    """The table, the two arms' means, the ratios and the reading."""
    if doc.get("summary") is None:
        return f"not measured: {doc.get('untimed')}"
    out = [blocks_table(doc), ""]
    out += [arm_line(arm, doc["arms"][arm]["impl"], doc["summary"]["arms"][arm]) for arm in ARMS]
    out.append(doc["reading"])
    samples = doc["samples"]
    if samples["skipped_lines"]:
        out.append(f"nvidia-smi: {samples['skipped_lines']} lines were not samples ([N/A], blank or garbled) "
                   f"and were skipped; {samples['count']} samples read")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# the GPU run


def check_parameters(blocks: int, block_s: float, settle_s: float, sample_ms: int) -> None:
    """Raise ValueError when the protocol cannot give each block a settled window."""
    if blocks < 2 or blocks % 2:
        raise ValueError(f"blocks must be even and ≥ 2 (as many of each arm), got {blocks}")
    if not (sample_ms >= 1 and int(sample_ms) == sample_ms):
        raise ValueError(f"sample_ms must be a whole number of milliseconds ≥ 1, got {sample_ms}")
    if not (settle_s >= 0 and block_s > 0 and settle_s + TAIL_S < block_s):
        raise ValueError(f"a block of {block_s:g} s leaves no settled window after {settle_s:g} s of settling and "
                         f"the last {TAIL_S:g} s: make --block-s longer than --settle-s + {TAIL_S:g}")


def smi_id(device_index: int, listed: Sequence[str]) -> str:
    """The id nvidia-smi knows this torch device by. CUDA_VISIBLE_DEVICES renumbers torch's devices,
    not nvidia-smi's, so the device is named by its UUID, checked against the UUIDs nvidia-smi
    lists (``listed``); where the two do not meet and nvidia-smi sees one GPU only, that GPU."""
    import torch
    uuid = getattr(torch.cuda.get_device_properties(device_index), "uuid", None)
    return match_smi_id(None if uuid is None else str(uuid), listed)


def match_smi_id(uuid: str | None, listed: Sequence[str]) -> str:
    """:func:`smi_id`'s rule, pure: torch's UUID (with or without nvidia-smi's ``GPU-`` prefix)
    if nvidia-smi lists it, else the one GPU nvidia-smi lists, else an error naming both."""
    listed = [u.strip() for u in listed if u.strip()]
    if uuid is not None:
        wanted = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        if wanted in listed:
            return wanted
    if len(listed) == 1:
        return listed[0]
    raise SustainError(f"cannot tell which of nvidia-smi's GPUs ({', '.join(listed) or 'none listed'}) is torch's "
                       f"device (UUID {uuid}): run with one GPU visible to nvidia-smi")


def smi_uuids(exe: str) -> list[str]:
    """The UUIDs of the GPUs nvidia-smi sees."""
    proc = subprocess.run([exe, "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True,
                          timeout=SAMPLER_STOP_S)
    if proc.returncode != 0:
        raise SustainError(f"nvidia-smi could not list the GPUs (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout.splitlines()


class Sampler:
    """``nvidia-smi -lms`` writing SM clock and board power to a file in the background."""

    def __init__(self, exe: str, gpu: str, sample_ms: int):
        self.command = [exe, f"--id={gpu}", f"--query-gpu={','.join(SMI_QUERY)}", "--format=csv,noheader,nounits",
                        "-lms", str(int(sample_ms))]
        self._dir = tempfile.TemporaryDirectory(prefix="flashrung-sustain-")
        self._out = open(os.path.join(self._dir.name, "smi.csv"), "w+")
        self._err = open(os.path.join(self._dir.name, "smi.err"), "w+")
        self._proc = subprocess.Popen(self.command, stdout=self._out, stderr=self._err, text=True)

    def wait_for_first_sample(self, timeout_s: float, poll_s: float = 0.02) -> bool:
        """Wait until nvidia-smi has written a line (its start can take longer than a lead), at most
        ``timeout_s``; whether it has."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if os.path.getsize(self._out.name) > 0:
                return True
            time.sleep(poll_s)
        return os.path.getsize(self._out.name) > 0

    def check_alive(self) -> None:
        if self._proc.poll() is not None:
            self._err.seek(0)
            raise SustainError(f"nvidia-smi exited (code {self._proc.returncode}) while sampling: "
                               f"{self._err.read().strip()[-500:] or 'no message'}; command: {' '.join(self.command)}")

    def stop(self) -> tuple[list[Sample], int]:
        """Stop sampling; the samples read and the count of lines that were not samples."""
        try:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=SAMPLER_STOP_S)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._out.seek(0)
            return parse_smi(self._out.read().splitlines())
        finally:
            self._out.close()
            self._err.close()
            self._dir.cleanup()


def cuda_block(fn: Callable[[], object], block_s: float) -> dict:
    """Back-to-back calls of ``fn`` for ``block_s``: wall start and end (nvidia-smi's clock) and
    milliseconds per call between CUDA events around the block."""
    import torch
    begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start, t0, calls = time.time(), time.perf_counter(), 0
    begin.record()
    while time.perf_counter() - t0 < block_s:
        for _ in range(CALLS_PER_SYNC):
            fn()
        calls += CALLS_PER_SYNC
        torch.cuda.synchronize()     # the host stays with the GPU, so the block ends on time
    finish.record()
    finish.synchronize()
    return {"start": start, "end": time.time(), "calls": calls, "ms_per_call": begin.elapsed_time(finish) / calls}


def time_blocks(fns: Mapping[str, Callable[[], object]], order: Sequence[str], block_s: float, *,
                block: Callable[[Callable[[], object], float], dict] = cuda_block,
                between: Callable[[], None] = lambda: None) -> list[dict]:
    """One timed block per entry of ``order`` (an arm of ``fns``); ``between`` runs after each."""
    out = []
    for i, arm in enumerate(order):
        out.append({"index": i, "arm": arm, **block(fns[arm], block_s)})
        between()
    return out


def _power_limit(*clock_readings: Mapping) -> float | None:
    from flashrung.bench.timing import finite_or_none
    for c in clock_readings:
        limit = finite_or_none((c or {}).get("power.limit"))
        if limit:
            return limit
    return None


def run(baseline: str, candidate: str, row, *, blocks: int = BLOCKS, block_s: float = BLOCK_S,
        settle_s: float = SETTLE_S, sample_ms: int = SAMPLE_MS, device: str = "cuda", seed: int = 0,
        gate: bool = True, command: list[str] | None = None) -> dict:
    """The sustained ABBA run of ``baseline`` against ``candidate`` on ``row``; returns its document.

    Raises :class:`SustainError` when it cannot run here (no CUDA GPU, no nvidia-smi, an arm that
    cannot run the row, parameters without a settled window). An arm that fails flashrung's gate
    is not timed: the document then has ``"summary": None`` and ``"untimed"`` saying why."""
    try:
        check_parameters(blocks, block_s, settle_s, sample_ms)
    except ValueError as exc:
        raise SustainError(str(exc)) from None
    import torch
    if not device.startswith("cuda") or not torch.cuda.is_available():
        raise SustainError(f"needs a CUDA GPU (device {device!r}; torch {torch.__version__} sees "
                           f"{torch.cuda.device_count()} CUDA devices): clock and power are a GPU's")
    chosen = torch.device(device)
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise SustainError("nvidia-smi is not on PATH: the SM clock and board power are sampled with it")
    from flashrung.bench import manifest as manifest_mod
    from flashrung.bench import peers, runner

    if chosen.index is not None:
        torch.cuda.set_device(chosen.index)      # kernels, events and synchronisations all use the current device
    index = torch.cuda.current_device()
    gpu_id = smi_id(index, smi_uuids(exe))
    started = time.perf_counter()
    manifest = manifest_mod.start(command)
    arms = dict(zip(ARMS, (baseline, candidate)))
    order = abba_order(blocks)
    doc = {"instrument": "sustain", "gpu": torch.cuda.get_device_name(index), "device": device,
           "nvidia_smi_id": gpu_id, "row": row.plan(), "label": row.label(), "seed": seed,
           "protocol": {"blocks": blocks, "block_s": block_s, "settle_s": settle_s, "tail_s": TAIL_S,
                        "sample_ms": sample_ms, "calls_per_sync": CALLS_PER_SYNC, "warmup_calls": WARMUP_CALLS,
                        "order": order},
           "timing": "blocks of back-to-back calls in ABBA order, CUDA events around each block / its calls; "
                     "SM clock and board power from nvidia-smi, averaged over each block's settled window "
                     "[start + settle_s, end - tail_s]; J/call = W x ms / 1000, Mcycles/call = MHz x ms / 1000; "
                     "per arm the mean over its blocks with samples",
           "clocks_start": manifest_mod.clocks(gpu_id)}
    # correct first: an arm that fails its gate is not timed (its figures would describe a wrong kernel)
    gates = runner.gate_arms(arms, row, seed=seed, device=device) if gate else {role: None for role in ARMS}

    def untimed(why: str) -> dict:
        doc.update(arms={role: {"impl": impl, "gate": gates[role]} for role, impl in arms.items()}, blocks=[],
                   samples={"count": 0, "skipped_lines": 0, "series": []}, summary=None, reading=None,
                   moved_with=None, untimed=why, clocks_end=manifest_mod.clocks(gpu_id),
                   manifest=manifest_mod.finish(manifest), wall_s=time.perf_counter() - started)
        return doc
    failed = [role for role, g in gates.items() if g is not None and not g["passed"]]
    if failed:
        return untimed(f"{' and '.join(failed)} failed the correctness gate: not timed")

    inputs = peers.make_inputs(row, device=device, seed=seed)
    prepared = {}
    for role, impl in arms.items():
        try:
            prepared[role] = peers.prepare(impl, row, inputs)
        except peers.Unsupported as exc:
            raise SustainError(f"{role} {impl} cannot run {row.label()}: {exc.reason}") from None
    # with the gate, a forward row's outputs (a peer's too) against the oracle, as compare reads them
    agreement, refused = runner.check_outputs(row, inputs, prepared) if gate else ({}, [])
    if refused:
        gates.update({role: runner.output_check_record(agreement[role]) for role in refused})
        return untimed(f"{' and '.join(refused)} computes another function than the row asks for: not timed")
    for p in prepared.values():
        p.first_out = None      # (check_outputs released them; without the gate nothing read them)
    fns = {role: p.fn for role, p in prepared.items()}
    for fn in fns.values():
        for _ in range(WARMUP_CALLS):
            fn()
    torch.cuda.synchronize()

    sampler = Sampler(exe, gpu_id, sample_ms)
    try:
        time.sleep(SAMPLER_LEAD_S)
        sampler.check_alive()
        timed = time_blocks(fns, order, block_s, between=sampler.check_alive)
    finally:
        samples, skipped = sampler.stop()
    for b in timed:
        b["impl"] = arms[b["arm"]]
    measured = assign_samples(timed, samples, settle_s)
    summary = summarize(measured)
    clocks_end = manifest_mod.clocks(gpu_id)
    limit = _power_limit(clocks_end, doc["clocks_start"])
    cap = at_power_cap((summary["arms"][a]["means"]["watts"] for a in ARMS), limit)
    doc.update(arms={role: {"impl": impl, "gate": gates[role], "dispatch": prepared[role].dispatch,
                            "note": prepared[role].note, "first_call_s": prepared[role].first_call_s}
                     for role, impl in arms.items()},
               blocks=measured, samples={"count": len(samples), "skipped_lines": skipped,
                                         "series": [list(s) for s in samples]},
               summary=summary, power_limit_w=limit, at_power_cap=cap, moved_with=moved_with(summary["ratios"]),
               reading=reading_line(summary["ratios"], cap), clocks_end=clocks_end,
               manifest=manifest_mod.finish(manifest), wall_s=time.perf_counter() - started)
    return doc
