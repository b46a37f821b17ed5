"""``flashrung census``: the resource and SASS census of every registered kernel."""
from __future__ import annotations

import json
import subprocess
import sys

from flashrung.evidence import census
from flashrung import jsonfile

DEFAULT_FAMILIES = ("HGMMA", "HMMA", "MUFU.EX2", "LDGSTS", "UTMALDG", "USETMAXREG", "LDSM", "BAR", "SYNCS")


def register(sub) -> None:
    p = sub.add_parser("census", help="compile every kernel ahead of time (no GPU) and report "
                       "registers, shared memory, spills and SASS instruction families")
    p.add_argument("--arch", default="sm_90a", choices=sorted(census.ARCHES))
    p.add_argument("--kernel", default=None, help="only kernels with this name or prefix (e.g. portable, hopper.fwd)")
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    p.add_argument("--out", default=None, help="also write the JSON list to this file")
    p.add_argument("--opcodes", action="store_true", help="keep the full opcode histogram in the JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    # Kernels decorated under TRITON_INTERPRET=1 cannot be compiled: rerun in a clean process.
    if census.needs_reexec():
        cmd = [sys.executable, "-m", "flashrung.cli"] + sys.argv[1:]
        return subprocess.call(cmd, env=census.interpreter_free_env())
    rows = census.run_census(args.arch, args.kernel, progress=sys.stderr.isatty())
    data = [r.to_json() for r in rows]
    if not args.opcodes:
        for d in data:
            d.get("sass", {}).pop("opcodes", None)
    if args.out:
        jsonfile.write(data, args.out)
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        print(table(rows, args.arch))
    return 1 if any(r.error for r in rows) else 0


def _config_label(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def table(rows, arch: str) -> str:
    head = ["kernel", "config", "regs", "smem B", "spill B"] + list(DEFAULT_FAMILIES) + ["total"]
    lines = [head]
    for r in rows:
        if r.error:
            lines.append([r.kernel, _config_label(r.config), "ERROR", r.error[:60]] + [""] * (len(head) - 4))
            continue
        lines.append([r.kernel, _config_label(r.config), str(r.regs), str(r.smem_bytes), str(r.spill_bytes)]
                     + [str(r.sass.get(f, 0)) for f in DEFAULT_FAMILIES] + [str(r.sass.get("total", 0))])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = [f"census {arch} (static SASS counts; evidence level: SASS)"]
    for i, row in enumerate(lines):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
