"""``flashrung`` command line: one parser, subcommands registered by the modules that own them.

    flashrung check      gate every kernel on the device found (CPU: interpreter, small sizes)
    flashrung gate       the gate's calibration and mutation battery
    flashrung census     compile every kernel ahead of time, report registers/smem/spills/SASS
    flashrung defaults   which schedule hopper.fwd runs by default, by head dim, mask and length
    flashrung stalls     read ncu source pages: stall reasons over a kernel and its hot loop
    flashrung profile    one launch of an implementation under ncu --set full, its pages and stalls
    flashrung bench      timing against the peers (also: null, compare, reanchor, sustain)
    flashrung model      the feeds-and-speeds resource model
    flashrung ladder     the optimization ladder
"""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules exposing ``register(subparsers)``. Missing optional pieces are reported, not hidden.
SUBCOMMAND_MODULES = (
    "flashrung.check",
    "flashrung.evidence.cli",
    "flashrung.kernels.hopper.defaults",
    "flashrung.evidence.stalls",
    "flashrung.evidence.profile",
    "flashrung.bench.cli",
    "flashrung.model.cli",
    "flashrung.kernels.ladder.cli",
)


def build_parser() -> argparse.ArgumentParser:
    from flashrung import __version__
    parser = argparse.ArgumentParser(prog="flashrung", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"flashrung {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:   # one broken subcommand must not take the others down, loudly
            print(f"flashrung: the commands of {name} are unavailable: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
