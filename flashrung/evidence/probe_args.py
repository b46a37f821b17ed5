"""Arguments the timing probes share: the square problem they time, counts that must be positive,
and the config keys a ``--set key=value,...`` names (refused by name where the probe fixes them
itself)."""
from __future__ import annotations

HEAD_DIMS = (64, 128, 256)      # hopper.fwd's head dims
DTYPES = ("bf16", "fp16")


def add_square_problem(p, batch: int, seqlen: int, heads: int = 16) -> None:
    """``--batch --seqlen --heads --headdim --dtype`` of a problem with Sq = Sk, with the probe's defaults."""
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--seqlen", type=int, default=seqlen, help=f"Sq = Sk (default {seqlen})")
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--headdim", type=int, default=128, choices=HEAD_DIMS)
    p.add_argument("--dtype", default="bf16", choices=DTYPES)


def require_positive(args, names) -> None:
    """Refuse a count below 1, naming its flag (``seqlen_k`` → ``--seqlen-k``)."""
    for name in names:
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")


def set_overrides(text: str) -> dict[str, str]:
    """``--set key=value,...`` as ``impl="hopper.fwd@..."`` reads it: ``{key: value}``, a malformed
    item refused by name before anything runs."""
    from flashrung.dispatch import parse_impl

    try:
        return parse_impl(f"hopper.fwd@{text}")[1]
    except ValueError as exc:
        raise SystemExit(f"--set: {exc}") from None


def set_keys(text: str) -> set[str]:
    """The config keys ``--set`` names."""
    return set(set_overrides(text))
