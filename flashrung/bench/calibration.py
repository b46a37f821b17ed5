"""The A/A-null calibration file: ``t_noise`` per GPU, read by every keep decision.

The file is JSON keyed by GPU name (``torch.cuda.get_device_name()``); each entry keeps the
margins it came from, the kernel and row it was measured on, the protocol and the date, so a
threshold is never a bare number. Default location: ``$XDG_CACHE_HOME/flashrung/calibration.json``
(``~/.cache/flashrung/calibration.json``); ``--calibration PATH`` overrides it, which is how a
calibration measured on a lent machine is kept with the results it licenses.
"""
from __future__ import annotations

import datetime
import os
import pathlib

from flashrung.bench import stats
from flashrung import jsonfile


def default_path() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "flashrung" / "calibration.json"


def load(path: pathlib.Path | str | None = None) -> dict:
    path = pathlib.Path(path) if path else default_path()
    if not path.exists():
        return {}
    data = jsonfile.read(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a calibration file maps GPU names to entries, got {type(data).__name__}")
    return data


def entry_from_margins(margins, *, impl: str, row: dict, protocol: dict, runs: list[dict]) -> dict:
    if len(margins) < stats.MIN_NULL_PAIRS:
        raise ValueError(f"an A/A null needs at least {stats.MIN_NULL_PAIRS} fresh-process pairs, got {len(margins)}")
    abs_dev = [abs(m - 1.0) for m in margins]
    return {
        "t_noise": stats.t_noise(margins), "statistic": "p95 |margin - 1| (nearest rank)",
        "margins": list(margins), "n": len(margins),
        "positive": sum(m > 1 for m in margins), "negative": sum(m < 1 for m in margins),
        "max_abs_deviation": max(abs_dev), "impl": impl, "row": row, "protocol": protocol,
        "runs": runs, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def store(gpu: str, entry: dict, path: pathlib.Path | str | None = None) -> pathlib.Path:
    path = pathlib.Path(path) if path else default_path()
    data = load(path)
    data[gpu] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    # written beside and moved over, so a reader never sees half a file; the prefix keeps the
    # name's suffix, so a .gz calibration stays compressed
    tmp = jsonfile.write(data, path.with_name(".tmp-" + path.name))
    tmp.replace(path)
    return path


def lookup(gpu: str, path: pathlib.Path | str | None = None) -> dict | None:
    return load(path).get(gpu)
