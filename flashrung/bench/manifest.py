"""The run manifest (seed 001, 0x0D, "Reproduction and rollback manifest").

A number without its manifest cannot be reproduced or rolled back. Every bench, null, compare
and reanchor run records:

- identity: package version, git commit (and whether the tree was dirty), a hash of the kernel
  sources, hashes of the compiled kernels that were loaded, peer library versions;
- environment: GPU product, SM count, memory, clocks and power read at the start and at the end
  (recorded, never asserted: clocks are not locked on the lent machines), driver, CUDA, torch,
  Triton, cuDNN, ptxas;
- per row: dispatch (which kernel actually ran and who declined), problem, measurement
  (FLOP convention, warm-up, repetitions, statistic and distribution), correctness (gate results).
"""
from __future__ import annotations

import datetime
import hashlib
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
from typing import Any

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]     # flashrung/
REPO_ROOT = PACKAGE_ROOT.parent
KERNELS_DIR = PACKAGE_ROOT / "kernels"

NVIDIA_SMI_FIELDS = ("name", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.draw",
                     "power.limit", "temperature.gpu", "pstate", "driver_version", "memory.total")
THROTTLE_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def source_hash(directory: pathlib.Path = KERNELS_DIR, suffixes=(".py",)) -> dict:
    """sha256 over every source file under ``directory`` (relative path and bytes, sorted)."""
    h = hashlib.sha256()
    files = sorted(p for p in pathlib.Path(directory).rglob("*") if p.is_file() and p.suffix in suffixes
                   and "__pycache__" not in p.parts)
    for p in files:
        h.update(p.relative_to(directory).as_posix().encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return {"sha256": h.hexdigest(), "files": len(files), "root": str(directory.relative_to(REPO_ROOT))
            if directory.is_relative_to(REPO_ROOT) else str(directory)}


def package_version() -> str | None:
    from importlib import metadata
    try:
        return metadata.version("flashrung")
    except metadata.PackageNotFoundError:
        pass
    pyproject = REPO_ROOT / "pyproject.toml"
    if pyproject.exists():
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
        if m:
            return m.group(1) + " (pyproject, not installed)"
    return None


def _git_of_tree() -> dict | None:
    if not (shutil.which("git") and (REPO_ROOT / ".git").exists()):
        return None
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        status = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "flashrung"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode != 0:
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip()), "source": "git"}


def git_state() -> dict:
    """Commit and dirtiness of the source tree.

    ``FLASHRUNG_GIT_COMMIT``, when set, names the commit the tree was copied from and wins: a copied
    tree (as on the lent GPU machines) may carry no ``.git`` or a stale one. What the local
    repository says is kept beside it when it disagrees."""
    env = os.environ.get("FLASHRUNG_GIT_COMMIT")
    tree = _git_of_tree()
    if env:
        state = {"commit": env, "dirty": None, "source": "FLASHRUNG_GIT_COMMIT"}
        if tree is not None and tree["commit"] != env:
            state["local_git"] = tree
        return state
    if tree is not None:
        return tree
    return {"commit": None, "dirty": None,
            "source": "no git metadata (copied tree?); set FLASHRUNG_GIT_COMMIT to record it"}


def _jit_function(obj):
    """The Triton/Gluon JIT function behind ``obj`` (through autotuner wrappers and launchers that
    keep it as ``.fn``), or ``obj`` itself."""
    from triton.runtime.jit import JITFunction
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn
    return obj


def _compiled_kernels_of(obj, seen: set) -> list:
    """Compiled kernels cached on a Triton/Gluon JIT function (through autotuner wrappers)."""
    from triton.runtime.jit import JITFunction
    obj = _jit_function(obj)
    if not isinstance(obj, JITFunction) or id(obj) in seen:
        return []
    seen.add(id(obj))
    kernels = []
    for entry in getattr(obj, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(cache, dict):
            kernels.extend(cache.values())
    return kernels


def compiled_kernel_hashes() -> list[dict]:
    """Identity of every flashrung kernel compiled in this process: Triton's cache hash and a
    sha256 of the cubin that was loaded."""
    out, seen = [], set()
    for modname, module in sorted(sys.modules.items()):
        if not modname.startswith("flashrung.kernels") or module is None:
            continue
        for attr, value in sorted(vars(module).items()):
            try:
                kernels = _compiled_kernels_of(value, seen)
            except Exception:   # an object that only looks like a kernel
                continue
            for k in kernels:
                asm = getattr(k, "asm", {}) or {}
                cubin = asm.get("cubin")
                out.append({
                    # the JIT function's own name, whichever module attribute reached it first
                    "module": modname, "function": getattr(_jit_function(value), "__name__", attr),
                    "name": getattr(k, "name", None),
                    "triton_hash": getattr(k, "hash", None),
                    "cubin_sha256": hashlib.sha256(cubin).hexdigest() if isinstance(cubin, bytes) else None,
                })
    return out


def _nvidia_smi(fields, index: int) -> dict | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, f"--id={index}", f"--query-gpu={','.join(fields)}",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    values = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(fields, values)) if len(values) == len(fields) else None


# A run that drew less than this share of the board's power limit was not power-limited (compare's
# regime line; sustain's reading of a clock that moved)
POWER_LIMITED_SHARE = 0.9


def clocks(index: int | str = 0) -> dict:
    """Clocks, power, temperature and throttle reasons now (nvidia-smi, else pynvml, else torch).
    ``index``: nvidia-smi's id of the GPU, its index or its UUID (the fallbacks take an index)."""
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    smi = _nvidia_smi(NVIDIA_SMI_FIELDS, index)
    if smi is not None:
        for field in THROTTLE_FIELDS:
            extra = _nvidia_smi((field,), index)
            if extra is not None:
                smi["throttle_reasons"] = extra[field]
                break
        return {"time": now, "source": "nvidia-smi", **smi}
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        return {"time": now, "source": "pynvml",
                "clocks.sm": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "clocks.mem": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "temperature.gpu": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}
    except Exception:
        pass
    try:
        import torch
        return {"time": now, "source": "torch", "clocks.sm": torch.cuda.clock_rate(index)}
    except Exception as exc:
        return {"time": now, "source": None, "error": f"no clock source: {type(exc).__name__}"}


def _ptxas_version() -> str | None:
    try:
        import triton
        ptxas = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        if ptxas.exists():
            r = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True, timeout=20)
            lines = [ln for ln in r.stdout.splitlines() if "release" in ln.lower()]
            return lines[-1].strip() if lines else None
    except (OSError, subprocess.SubprocessError):
        return None
    return None


def environment(index: int = 0) -> dict:
    import torch
    import triton
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "triton": triton.__version__, "cuda": torch.version.cuda,
                           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                           "ptxas": _ptxas_version()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(index)
        env.update({"gpu": props.name, "sm_count": props.multi_processor_count,
                    "capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2 ** 30, 1)})
        smi = _nvidia_smi(("driver_version",), index)
        env["driver"] = smi["driver_version"] if smi else None
    else:
        env["gpu"] = None
    return env


def identity() -> dict:
    from flashrung.bench import peers
    return {"package": "flashrung", "version": package_version(), "git": git_state(),
            "kernel_source": source_hash(), "peer_versions": peers.versions()}


def start(command: list[str] | None = None) -> dict:
    """The manifest's head, taken before any timing: identity, environment, clocks at start."""
    return {"command": command if command is not None else sys.argv,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "identity": identity(), "environment": environment(), "clocks_start": clocks()}


def finish(manifest: dict) -> dict:
    """Clocks at the end and the kernels that were actually compiled and loaded."""
    manifest["clocks_end"] = clocks()
    manifest["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    manifest["identity"]["compiled_kernels"] = compiled_kernel_hashes()
    return manifest
