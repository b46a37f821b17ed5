"""``python -m flashrung.bench bench|null|compare|reanchor|sustain …``: the instrument's commands on their own."""
from __future__ import annotations

import argparse
import sys

from flashrung.bench import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrung.bench")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
