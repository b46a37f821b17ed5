"""Where every kernel module is listed once: the census and the dispatcher read this list."""
from __future__ import annotations

import importlib

# Modules that define ``census_specs() -> list[CensusSpec]``.
CENSUS_MODULES = (
    "flashrung.kernels.portable.fwd",
    "flashrung.kernels.portable.bwd",
    "flashrung.kernels.hopper.fwd",
    "flashrung.kernels.ladder",
)


def census_specs():
    specs = []
    for name in CENSUS_MODULES:
        specs.extend(importlib.import_module(name).census_specs())
    return specs
