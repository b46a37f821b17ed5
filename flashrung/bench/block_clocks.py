"""The SM clock and board power at each of the bench's timed blocks.

A block of the suite is a few tens of milliseconds of calls after its preheat. At the power limit
the SM clock is not steady over such spans: under sustained attention an H100 at its 700 W cap
swings about ±7% with a period near a second (``flashrung sustain``'s samples), and after a
heavier or lighter block it moves further for a few hundred milliseconds. A block's time then
depends on the clock it happened to meet as much as on its cycles, and an implementation can read
at two speeds by round (``carryover.two_speeds``). With the clock beside each block the report
can say which it was: blocks apart in time at one clock are apart in cycles; blocks apart in time
at clocks apart as much are the clock's.

``nvidia-smi`` samples the clock and power in the background for the whole suite (the sampler of
:mod:`flashrung.bench.sustain`); :func:`timing.interleave` places each block on the wall clock
(``spans``); each block's figures are the means of the samples within its timed calls, widened by
half a sampling period on each side so that every block has one at the sampler's rate. Everything
but :class:`SuiteSampler` is pure, and tested without a GPU.
"""
from __future__ import annotations

import shutil
import statistics
import time
from typing import Mapping, Sequence

from flashrung.bench import sustain

SAMPLE_MS = sustain.SAMPLE_MS   # nvidia-smi's sampling period over the suite
SOURCE = "nvidia-smi"
FIRST_SAMPLE_TIMEOUT_S = 10.0   # how long the run waits for nvidia-smi's first sample before its rows


def block_window(span: Sequence[float], sample_s: float) -> tuple[float, float]:
    """The wall-clock window whose samples describe a block: its timed calls (``span``'s start and
    end, :attr:`timing.Interleaved.spans`), half a sampling period wider on each side."""
    _, start, end = span
    return start - sample_s / 2, end + sample_s / 2


def block_clock(span: Sequence[float], samples: Sequence[sustain.Sample], sample_s: float) -> dict:
    """``{"mhz", "watts", "samples"}`` of one block; without a sample in its window the figures are
    None (none is made up)."""
    within = sustain.samples_within(samples, *block_window(span, sample_s))
    if not within:
        return {"mhz": None, "watts": None, "samples": 0}
    return {"mhz": statistics.fmean(s.mhz for s in within), "watts": statistics.fmean(s.watts for s in within),
            "samples": len(within)}


def attach(rows: Sequence[dict], samples: Sequence[sustain.Sample], sample_ms: float) -> int:
    """Give every timed result in ``rows`` that placed its blocks (``blocks_span_s``) its
    ``blocks_clock``, round by round; returns how many blocks found no sample."""
    missing = 0
    for row in rows:
        for result in (row.get("results") or {}).values():
            spans = result.get("blocks_span_s")
            if not spans:
                continue
            result["blocks_clock"] = [block_clock(span, samples, sample_ms / 1e3) for span in spans]
            missing += sum(1 for c in result["blocks_clock"] if c["samples"] == 0)
    return missing


def rounds_mhz(result: Mapping, rounds: Sequence[int]) -> float | None:
    """The mean SM clock of ``result``'s blocks in ``rounds`` (1-based), over those with a sample;
    None without ``blocks_clock`` or a sampled block among them."""
    clocks = result.get("blocks_clock") or []
    mhz = [clocks[r - 1]["mhz"] for r in rounds if 0 < r <= len(clocks) and clocks[r - 1]["mhz"] is not None]
    return statistics.fmean(mhz) if mhz else None


def split_reading(result: Mapping, slow_rounds: Sequence[int]) -> dict | None:
    """How much of a split by round (``carryover.two_speeds``'s ``slow_rounds``, 1-based) the clock
    explains: the mean block median and the mean clock of the slow rounds and of the others, and
    ``clock_share`` = (clock of the others ÷ that of the slow rounds − 1) ÷ (time of the slow ÷ that
    of the others − 1) — near 1 the slow rounds ran at a lower clock for the same cycles, near 0
    at the same clock for more cycles. None where either side has no sampled block."""
    blocks = result.get("blocks_ms") or []
    rounds = range(1, len(blocks) + 1)
    fast_rounds = [r for r in rounds if r not in slow_rounds]
    mhz_slow, mhz_fast = rounds_mhz(result, slow_rounds), rounds_mhz(result, fast_rounds)
    if mhz_slow is None or mhz_fast is None or not fast_rounds or not slow_rounds:
        return None

    def mean_median(side):
        return statistics.fmean(statistics.median(blocks[r - 1]) for r in side if blocks[r - 1])
    ms_slow, ms_fast = mean_median(slow_rounds), mean_median(fast_rounds)
    time_apart = ms_slow / ms_fast - 1
    share = (mhz_fast / mhz_slow - 1) / time_apart if time_apart > 0 else None
    return {"ms_slow": ms_slow, "ms_fast": ms_fast, "mhz_slow": mhz_slow, "mhz_fast": mhz_fast, "clock_share": share}


def series_json(samples: Sequence[sustain.Sample]) -> list[list[float]]:
    """The samples as stored: seconds since the epoch to the millisecond, MHz, W to 0.1 W."""
    return [[round(s.t, 3), s.mhz, round(s.watts, 1)] for s in samples]


class SuiteSampler:
    """nvidia-smi sampling the SM clock and board power of torch's device ``device_index`` for a
    whole bench run; :meth:`finish` attaches the samples to the rows and returns the document's
    ``clocks`` entry. A sampler that cannot start or dies leaves the timings as they are and says
    why in that entry: the clocks are a reading beside the bench, never a condition of it."""

    def __init__(self, device_index: int, sample_ms: int = SAMPLE_MS):
        self.sample_ms = sample_ms
        self.error: str | None = None
        self._sampler = None
        self._samples: list[sustain.Sample] = []
        self._skipped = 0
        exe = shutil.which("nvidia-smi")
        if exe is None:
            self.error = "nvidia-smi is not on PATH: no clock per block"
            return
        try:
            self._sampler = sustain.Sampler(exe, sustain.smi_id(device_index, sustain.smi_uuids(exe)), sample_ms)
            # the first row's blocks need samples around them: wait for nvidia-smi's first line
            # (its start can take a second), then a lead as sustain's
            if not self._sampler.wait_for_first_sample(FIRST_SAMPLE_TIMEOUT_S):
                self.error = f"nvidia-smi wrote no sample in its first {FIRST_SAMPLE_TIMEOUT_S:g} s"
            time.sleep(sustain.SAMPLER_LEAD_S)
            self._sampler.check_alive()
        except (sustain.SustainError, OSError, ValueError) as exc:
            self.error = f"the clock sampler did not start: {exc}"
            self._stop()

    @property
    def running(self) -> bool:
        return self._sampler is not None

    def check(self) -> None:
        """Between rows: a sampler that died is stopped and its reason kept (the run goes on; the
        blocks after it find no sample)."""
        if self._sampler is None:
            return
        try:
            self._sampler.check_alive()
        except sustain.SustainError as exc:
            self.error = str(exc)
            self._stop()

    def _stop(self) -> None:
        if self._sampler is not None:
            try:
                samples, skipped = self._sampler.stop()
                self._samples += samples
                self._skipped += skipped
            finally:
                self._sampler = None

    def finish(self, rows: Sequence[dict]) -> dict:
        """Stop sampling, give the rows' blocks their clocks, and return the ``clocks`` entry."""
        self._stop()
        missing = attach(rows, self._samples, self.sample_ms)
        out = {"source": SOURCE, "sample_ms": self.sample_ms, "count": len(self._samples),
               "skipped_lines": self._skipped, "blocks_without_sample": missing,
               "series": series_json(self._samples)}
        if self.error is not None:
            out["error"] = self.error
        return out
