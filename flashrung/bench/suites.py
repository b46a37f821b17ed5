"""What to measure: the named suites and free shapes, expanded into rows.

A row is one problem in one direction (``fwd`` or ``bwd``) with its FLOP numerator; every
implementation is timed on every row. The suites are frozen here so a figure can always be
traced back to the exact problem it measured:

- ``fa4-protocol`` — the FlashAttention-4 paper's benchmark contract (seed 001, 0x0D): BF16,
  batch × seqlen = 32k tokens, hidden 2048 as (d=128, H=16) and (d=64, H=32),
  S ∈ {1k … 32k}, causal and not, forward and backward.
- ``seed-frozen`` — the two FA5090 configurations (seed 000): B=2, H=16, S=2048, d=128, fp16,
  non-causal (the frozen core config) and B=1, H=16, S=32768, d=128, bf16, causal (the v7
  ladder config). Forward only by default: seed 000 measured no backward.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from flashrung.bench import numerators
from flashrung.inputs import check_softcap


def check_window(window, causal: bool) -> tuple[int, int]:
    """A row's sliding window, flash-attn's ``window_size`` as the API takes it (-1 an unbounded
    side; with ``causal`` the right side -1 or 0, the mask's own), as integers. Two windows that are
    no window — ``(-1, -1)``, and ``(-1, 0)`` without ``causal``, the causal mask itself — are refused:
    such a row is a plain or a causal one (``--causal``)."""
    try:
        left, right = (int(x) for x in window)
    except (TypeError, ValueError):
        raise ValueError(f"window must be (left, right), two integers (-1 unbounded), got {window!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window sides must be integers >= -1 (-1: unbounded), got {(left, right)}")
    if causal and right not in (-1, 0):
        raise ValueError(f"a causal row's window right side must be -1 or 0 (the mask's), got {right}")
    if (left, right) == (-1, -1) or (left == -1 and (causal or right == 0)):
        raise ValueError(f"window {(left, right)} bounds no side the mask does not: give a plain or a causal row "
                         "(--causal) instead")
    return left, right


def check_packed(lengths) -> tuple[int, ...]:
    """A packed row's sequence lengths (queries and keys alike) as a tuple of integers: each >= 0,
    at least one of them positive."""
    try:
        out = tuple(int(n) for n in lengths)
    except (TypeError, ValueError):
        raise ValueError(f"packed must be the sequences' lengths, integers, got {lengths!r}") from None
    if not out or min(out) < 0 or max(out) < 1 or any(n != m for n, m in zip(out, lengths)):
        raise ValueError(f"packed must be integer lengths >= 0, one of them positive, got {tuple(lengths)!r}")
    return out


def packed_text(lengths: Sequence[int]) -> str:
    """``lengths`` as ``--packed`` takes them, runs of one length as ``LxN``: ``4096x2,1024x8``."""
    runs: list[list[int]] = []
    for n in lengths:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(f"{n}x{c}" if c > 1 else f"{n}" for n, c in runs)


def parse_packed(text: str) -> tuple[int, ...]:
    """``--packed``'s value: lengths separated by commas, ``LxN`` for N sequences of length L
    (``4096x2,1024x8,17``)."""
    lengths = []
    for part in text.split(","):
        length, sep, times = part.strip().partition("x")
        try:
            # an "x" names a count: "1024x" is refused, not read as one sequence
            n, c = int(length), int(times) if sep else 1
        except ValueError:
            raise ValueError(f"expected lengths such as 4096x2,1024x8,17 (LxN: N sequences of L), got {text!r}") \
                from None
        if c < 1:
            raise ValueError(f"a run's count must be positive, got {part.strip()!r} in {text!r}")
        lengths += [n] * c
    return check_packed(lengths)


MODES = ("fwd", "bwd")
MODE_CHOICES = ("fwd", "bwd", "fwd+bwd")
DTYPES = ("bfloat16", "float16")
DTYPE_ALIASES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                 "half": "float16"}

FA4_TOKENS = 32 * 1024      # batch × seqlen, tokens
FA4_HIDDEN = 2048           # heads × head_dim
FA4_HEAD_DIMS = (128, 64)
FA4_SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768)

SUITES = ("fa4-protocol", "seed-frozen")


def normalize_dtype(dtype: str) -> str:
    try:
        return DTYPE_ALIASES[str(dtype).replace("torch.", "")]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_ALIASES)}, got {dtype!r}") from None


def expand_mode(mode: str) -> tuple[str, ...]:
    if mode not in MODE_CHOICES:
        raise ValueError(f"mode must be one of {MODE_CHOICES}, got {mode!r}")
    return MODES if mode == "fwd+bwd" else (mode,)


@dataclasses.dataclass(frozen=True)
class Row:
    """One problem in one direction. Shapes follow flash-attn: q (B, Sq, Hq, D)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    headdim: int
    dtype: str            # "bfloat16" | "float16"
    causal: bool
    mode: str             # "fwd" | "bwd"
    headdim_v: int | None = None
    suite: str = "free"
    softcap: float = 0.0  # flash-attn's cap on the scaled scores (0: none); the FLOPs do not count it
    # flash-attn's sliding window (left, right), -1 an unbounded side; None: none. The FLOPs count the
    # pairs inside it (numerators.window_pairs)
    window: tuple[int, int] | None = None
    # packed sequences (flash-attn's varlen): each sequence's length, queries and keys alike; None:
    # none. The tensors are then (1, total, heads, dim); batch is the count of sequences and
    # seqlen_q = seqlen_k the longest (numerators.count_packed sums each sequence's count)
    packed: tuple[int, ...] | None = None

    def __post_init__(self):
        for name in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "headdim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads ({self.heads_q}) must be a multiple of kv-heads ({self.heads_kv})")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        check_softcap(self.softcap)
        if self.window is not None:
            object.__setattr__(self, "window", check_window(self.window, self.causal))
        if self.packed is not None:
            object.__setattr__(self, "packed", check_packed(self.packed))
            longest = max(self.packed)
            if (self.batch, self.seqlen_q, self.seqlen_k) != (len(self.packed), longest, longest):
                raise ValueError(f"a packed row's batch is its count of sequences ({len(self.packed)}) and its "
                                 f"seqlen_q and seqlen_k the longest ({longest}); got batch {self.batch}, "
                                 f"seqlen_q {self.seqlen_q}, seqlen_k {self.seqlen_k}")

    @property
    def dv(self) -> int:
        return self.headdim if self.headdim_v is None else self.headdim_v

    def flop_count(self) -> numerators.FlopCount:
        if self.packed is not None:
            return numerators.count_packed(lengths=self.packed, heads_q=self.heads_q, head_dim=self.headdim,
                                           head_dim_v=self.dv, causal=self.causal, window=self.window)
        return numerators.count(batch=self.batch, heads_q=self.heads_q, seqlen_q=self.seqlen_q,
                                seqlen_k=self.seqlen_k, head_dim=self.headdim, head_dim_v=self.dv,
                                causal=self.causal, window=self.window)

    def flops(self, causal_convention: str = numerators.FA_HALF) -> tuple[int, str]:
        """(FLOPs, convention) this row reports under the chosen causal convention (a windowed row:
        the window's own, whatever the causal one)."""
        convention = numerators.convention_for(self.causal, causal_convention, self.window is not None)
        fc = self.flop_count()
        return (fc.forward(convention) if self.mode == "fwd" else fc.backward(convention)), convention

    def flops_by_convention(self) -> dict[str, int]:
        fc = self.flop_count()
        if self.window is not None:
            conventions = (numerators.WINDOW,)
        else:
            conventions = numerators.CAUSAL_CONVENTIONS if self.causal else (numerators.DENSE,)
        return {c: (fc.forward(c) if self.mode == "fwd" else fc.backward(c)) for c in conventions}

    def shape_key(self) -> tuple:
        """Everything but the direction: rows sharing it share inputs."""
        return (self.batch, self.seqlen_q, self.seqlen_k, self.heads_q, self.heads_kv, self.headdim,
                self.dv, self.dtype, self.causal, self.softcap, self.window, self.packed)

    def label(self) -> str:
        s = f"{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"{self.seqlen_q}x{self.seqlen_k}"
        h = f"H{self.heads_q}" if self.heads_q == self.heads_kv else f"H{self.heads_q}/{self.heads_kv}"
        d = f"d{self.headdim}" if self.dv == self.headdim else f"d{self.headdim}/{self.dv}"
        dt = {"bfloat16": "bf16", "float16": "fp16"}[self.dtype]
        cap = f" cap{self.softcap:g}" if self.softcap else ""
        win = f" win{self.window[0]},{self.window[1]}" if self.window is not None else ""
        if self.packed is not None:
            return (f"packed {packed_text(self.packed)} {h} {d} {dt} {'causal' if self.causal else 'full'}{win}{cap} "
                    f"{self.mode}")
        return f"B{self.batch} {h} S{s} {d} {dt} {'causal' if self.causal else 'full'}{win}{cap} {self.mode}"

    def plan(self, causal_convention: str = numerators.FA_HALF) -> dict:
        flops, convention = self.flops(causal_convention)
        return {
            "batch": self.batch, "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k,
            "heads_q": self.heads_q, "heads_kv": self.heads_kv, "headdim": self.headdim,
            "headdim_v": self.dv, "dtype": self.dtype, "causal": self.causal, "mode": self.mode,
            "flops": flops, "flops_convention": convention,
            "flops_by_convention": self.flops_by_convention(), "suite": self.suite, "softcap": self.softcap,
            "window": list(self.window) if self.window is not None else None,
            "packed": list(self.packed) if self.packed is not None else None,
        }

    @classmethod
    def from_plan(cls, d: dict) -> "Row":
        return cls(batch=d["batch"], seqlen_q=d["seqlen_q"], seqlen_k=d["seqlen_k"], heads_q=d["heads_q"],
                   heads_kv=d["heads_kv"], headdim=d["headdim"],
                   headdim_v=d.get("headdim_v") if d.get("headdim_v") != d["headdim"] else None,
                   dtype=d["dtype"], causal=bool(d["causal"]), mode=d["mode"], suite=d.get("suite", "free"),
                   softcap=d.get("softcap", 0.0),
                   window=tuple(d["window"]) if d.get("window") is not None else None,
                   packed=tuple(d["packed"]) if d.get("packed") is not None else None)


def fa4_protocol(modes: Sequence[str] = MODES) -> list[Row]:
    rows = []
    for headdim in FA4_HEAD_DIMS:
        heads = FA4_HIDDEN // headdim
        for causal in (False, True):
            for seqlen in FA4_SEQLENS:
                for mode in modes:
                    rows.append(Row(batch=FA4_TOKENS // seqlen, seqlen_q=seqlen, seqlen_k=seqlen,
                                    heads_q=heads, heads_kv=heads, headdim=headdim, dtype="bfloat16",
                                    causal=causal, mode=mode, suite="fa4-protocol"))
    return rows


def seed_frozen(modes: Sequence[str] = ("fwd",)) -> list[Row]:
    configs = (
        dict(batch=2, seqlen=2048, heads=16, headdim=128, dtype="float16", causal=False),   # frozen core
        dict(batch=1, seqlen=32768, heads=16, headdim=128, dtype="bfloat16", causal=True),  # v7 ladder
    )
    return [Row(batch=c["batch"], seqlen_q=c["seqlen"], seqlen_k=c["seqlen"], heads_q=c["heads"],
                heads_kv=c["heads"], headdim=c["headdim"], dtype=c["dtype"], causal=c["causal"],
                mode=mode, suite="seed-frozen")
            for c in configs for mode in modes]


SUITE_DEFAULT_MODE = {"fa4-protocol": "fwd+bwd", "seed-frozen": "fwd"}


def suite_rows(name: str, mode: str | None = None) -> list[Row]:
    if name not in SUITES:
        raise ValueError(f"suite must be one of {SUITES}, got {name!r}")
    modes = expand_mode(mode or SUITE_DEFAULT_MODE[name])
    return fa4_protocol(modes) if name == "fa4-protocol" else seed_frozen(modes)


def free_rows(*, seqlens: Iterable[int], batch: int | None, heads: int, kv_heads: int | None,
              headdim: int, headdim_v: int | None = None, seqlen_k: int | None = None,
              dtype: str = "bfloat16", causal: bool = False, mode: str = "fwd", softcap: float = 0.0,
              window: tuple[int, int] | None = None) -> list[Row]:
    """Rows for shapes given on the command line. ``batch=None`` keeps 32k tokens per row."""
    rows = []
    for s in seqlens:
        if not isinstance(s, int) or s < 1:
            raise ValueError(f"seqlen must be a positive integer, got {s!r}")
        b = batch if batch is not None else max(1, FA4_TOKENS // s)
        for m in expand_mode(mode):
            rows.append(Row(batch=b, seqlen_q=s, seqlen_k=seqlen_k or s, heads_q=heads,
                            heads_kv=kv_heads or heads, headdim=headdim,
                            headdim_v=headdim_v if headdim_v not in (None, headdim) else None,
                            dtype=normalize_dtype(dtype), causal=causal, mode=m, softcap=softcap, window=window))
    return rows


def packed_rows(*, lengths: Sequence[int], heads: int, kv_heads: int | None, headdim: int,
                headdim_v: int | None = None, dtype: str = "bfloat16", causal: bool = False, mode: str = "fwd",
                softcap: float = 0.0, window: tuple[int, int] | None = None) -> list[Row]:
    """Rows of one pack of sequences (``--packed``), one per direction."""
    lengths = check_packed(lengths)
    return [Row(batch=len(lengths), seqlen_q=max(lengths), seqlen_k=max(lengths), heads_q=heads,
                heads_kv=kv_heads or heads, headdim=headdim,
                headdim_v=headdim_v if headdim_v not in (None, headdim) else None, dtype=normalize_dtype(dtype),
                causal=causal, mode=m, softcap=softcap, window=window, packed=lengths) for m in expand_mode(mode)]


def filter_rows(rows: Iterable[Row], *, seqlens: Sequence[int] | None = None,
                headdims: Sequence[int] | None = None, causal: bool | None = None) -> list[Row]:
    """Narrow a suite (``--seqlen 4096 --headdim 128 --no-causal``)."""
    out = [r for r in rows
           if (not seqlens or r.seqlen_q in seqlens)
           and (not headdims or r.headdim in headdims)
           and (causal is None or r.causal == causal)]
    return out


def plan_json(rows: Iterable[Row], causal_convention: str = numerators.FA_HALF) -> dict:
    return {"rows": [r.plan(causal_convention) for r in rows]}
