"""Argument checks the timing probes share: counts that must be positive, and the config keys a
``--set key=value,...`` names (refused by name where the probe fixes them itself)."""
from __future__ import annotations


def require_positive(args, names) -> None:
    """Refuse a count below 1, naming its flag (``seqlen_k`` → ``--seqlen-k``)."""
    for name in names:
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")


def set_keys(text: str) -> set[str]:
    """The config keys ``--set`` names, read as ``impl="hopper.fwd@..."`` reads them."""
    from flashrung.dispatch import parse_impl

    try:
        return set(parse_impl(f"hopper.fwd@{text}")[1])
    except ValueError as exc:
        raise SystemExit(f"--set: {exc}") from None
