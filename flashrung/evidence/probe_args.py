"""Arguments the timing probes share: the square problem they time, counts that must be positive,
and the config keys a ``--set key=value,...`` names (refused by name where the probe fixes them
itself)."""
from __future__ import annotations

HEAD_DIMS = (64, 128, 256)      # hopper.fwd's head dims
DTYPES = ("bf16", "fp16")


def add_square_problem(p, batch: int, seqlen: int, heads: int = 16, any_head_dim: bool = False) -> None:
    """``--batch --seqlen --heads --headdim --dtype`` of a problem with Sq = Sk, with the probe's defaults.
    ``any_head_dim``: ``--headdim`` takes every head dim ``hopper.fwd`` runs (the padded ones too) and
    ``--headdim-v`` gives v its own (MLA's 192/128), both checked by :func:`checked_head_dims`; without
    it, the compiled head dims alone."""
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--seqlen", type=int, default=seqlen, help=f"Sq = Sk (default {seqlen})")
    p.add_argument("--heads", type=int, default=heads)
    if any_head_dim:
        p.add_argument("--headdim", type=int, default=128,
                       help="q's and k's head dim: any hopper.fwd runs, those between its compiled head dims "
                            f"{HEAD_DIMS} on the next one's kernel (default 128)")
        p.add_argument("--headdim-v", type=int, default=None, metavar="DV",
                       help="v's (and out's) head dim where it differs from --headdim (MLA: --headdim 192 "
                            "--headdim-v 128)")
    else:
        p.add_argument("--headdim", type=int, default=128, choices=HEAD_DIMS)
    p.add_argument("--dtype", default="bf16", choices=DTYPES)


def checked_head_dims(args) -> tuple[int, int]:
    """``(--headdim, --headdim-v)`` (v's defaulting to q's) once ``hopper.fwd`` takes them; one it
    does not exits naming the flag and what it takes."""
    from flashrung.kernels.hopper.config import kernel_head_dim

    head_dim = args.headdim
    head_dim_v = getattr(args, "headdim_v", None) or head_dim
    try:
        kernel_head_dim(head_dim, head_dim_v)
    except ValueError as exc:
        flag = "--headdim-v" if str(exc).startswith("head_dim_v") else "--headdim"
        raise SystemExit(f"{flag}: {exc}") from None
    return head_dim, head_dim_v


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
