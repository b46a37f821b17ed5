"""FLOP numerators: which operations a TFLOP/s figure counts (seed 001, 0x0D).

Dense forward attention is two matmuls, ``QKᵀ`` and ``PV``:
``F_fwd = 2·B·Hq·Sq·Sk·(d_qk + d_v)``. With a causal mask two conventions exist and both are
computed here; every table says which one its numbers use:

- ``fa-half``: the FlashAttention papers' convention, dense forward divided by two. Peers and
  published figures use it, so it is the default for comparisons.
- ``exact``: the triangular count of (query, key) pairs a query may actually see, with the mask
  aligned bottom-right (query ``i`` sees key ``j`` iff ``j <= i + Sk - Sq``). For ``Sq = Sk = S``
  this is ``S(S+1)/2`` pairs instead of ``S²/2``; the relative difference is ``1/S``.

With a sliding window (flash-attn's ``window_size = (left, right)``) one convention applies:

- ``window``: the exact count of (query, key) pairs inside the window, aligned as the causal mask
  (query ``i`` sees key ``j`` iff ``i + Sk − Sq − left <= j <= i + Sk − Sq + right``, a side of -1
  unbounded, ``right`` at most 0 with a causal mask). Halving a dense count means nothing here.

Backward counts five matmuls against forward's two: ``F_bwd = 2.5·F_fwd`` under either
convention. The count omits softmax, preprocessing and recomputation, so TFLOP/s is an accounting
throughput, not a statement that every cycle issued tensor-core work.

All counts are exact Python integers (``F_fwd`` is always even, so ``2.5·F_fwd`` is an integer).
"""
from __future__ import annotations

import dataclasses
import functools

DENSE = "dense"
FA_HALF = "fa-half"
EXACT = "exact"
WINDOW = "window"
CAUSAL_CONVENTIONS = (FA_HALF, EXACT)

# What a table prints beside its numbers, per convention.
LABELS = {
    DENSE: "dense 2·B·Hq·Sq·Sk·(d_qk+d_v)",
    FA_HALF: "causal = dense/2 (FlashAttention convention)",
    EXACT: "causal = exact bottom-right triangle",
    WINDOW: "windowed = exact (query, key) pairs inside the window",
}

# Backward performs five dominant matmuls to forward's two.
BACKWARD_NUMERATOR = 5
BACKWARD_DENOMINATOR = 2


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def causal_pairs(seqlen_q: int, seqlen_k: int) -> int:
    """Number of (query, key) pairs a bottom-right-aligned causal mask allows.

    Query ``i`` sees keys ``0 … i + Sk − Sq`` (clamped to ``[0, Sk)``). The last query always
    sees all ``Sk`` keys, so counts run ``…, Sk−1, Sk`` downward until they reach zero; when
    ``Sq > Sk`` the first ``Sq − Sk`` queries see nothing.
    """
    _check_positive(seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    if seqlen_q <= seqlen_k:
        # counts Sk−Sq+1 … Sk, an arithmetic series of Sq terms
        return seqlen_q * (2 * seqlen_k - seqlen_q + 1) // 2
    return seqlen_k * (seqlen_k + 1) // 2


@functools.lru_cache(maxsize=256)
def window_pairs(seqlen_q: int, seqlen_k: int, left: int, right: int, causal: bool = False) -> int:
    """Number of (query, key) pairs a sliding window allows (flash-attn's ``window_size``, bottom-right
    aligned as the causal mask; -1 an unbounded side; ``causal`` caps the right side at 0).

    Query ``i`` sees keys ``max(0, i + off − left) … min(Sk − 1, i + off + right)``, ``off = Sk − Sq``,
    summed row by row (a long row's count takes tens of ms once; cached)."""
    _check_positive(seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    for name, side in (("left", left), ("right", right)):
        if not isinstance(side, int) or isinstance(side, bool) or side < -1:
            raise ValueError(f"window {name} must be an integer >= -1 (-1: unbounded), got {side!r}")
    if causal:
        right = 0 if right == -1 else right
        if right != 0:
            raise ValueError(f"a causal window's right side must be -1 or 0, got {right}")
    off = seqlen_k - seqlen_q
    # an unbounded side reaches past every key: the clamp does the rest
    reach_left = seqlen_q + seqlen_k if left == -1 else left
    reach_right = seqlen_q + seqlen_k if right == -1 else right
    total = 0
    for i in range(seqlen_q):
        lo = max(0, i + off - reach_left)
        hi = min(seqlen_k - 1, i + off + reach_right)
        if hi >= lo:
            total += hi - lo + 1
    return total


def dense_pairs(seqlen_q: int, seqlen_k: int) -> int:
    _check_positive(seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    return seqlen_q * seqlen_k


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """Forward and backward FLOPs of one problem under every applicable convention."""

    dense_fwd: int
    fa_half_fwd: int | None    # None when the problem is not causal, or has a window
    exact_fwd: int | None
    window_fwd: int | None = None    # only with a sliding window

    def forward(self, convention: str) -> int:
        if convention == DENSE:
            return self.dense_fwd
        if convention == FA_HALF and self.fa_half_fwd is not None:
            return self.fa_half_fwd
        if convention == EXACT and self.exact_fwd is not None:
            return self.exact_fwd
        if convention == WINDOW and self.window_fwd is not None:
            return self.window_fwd
        raise ValueError(f"convention {convention!r} does not apply to this problem "
                         f"(causal conventions: {CAUSAL_CONVENTIONS}; non-causal: {DENSE!r}; windowed: {WINDOW!r})")

    def backward(self, convention: str) -> int:
        return backward_from_forward(self.forward(convention))


def backward_from_forward(fwd: int) -> int:
    """``2.5 × fwd``, exactly."""
    return fwd * BACKWARD_NUMERATOR // BACKWARD_DENOMINATOR


def count(*, batch: int, heads_q: int, seqlen_q: int, seqlen_k: int, head_dim: int,
          head_dim_v: int | None = None, causal: bool, window: tuple[int, int] | None = None) -> FlopCount:
    """FLOPs of ``softmax(Q Kᵀ) V`` for ``Hq`` query heads (GQA shares K/V, not work); with
    ``window`` (left, right), those of the pairs inside it (:func:`window_pairs`) alone."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    _check_positive(batch=batch, heads_q=heads_q, head_dim=head_dim, head_dim_v=head_dim_v)
    per_pair = 2 * batch * heads_q * (head_dim + head_dim_v)
    dense = per_pair * dense_pairs(seqlen_q, seqlen_k)
    if window is not None:
        pairs = window_pairs(seqlen_q, seqlen_k, *window, causal=causal)
        return FlopCount(dense_fwd=dense, fa_half_fwd=None, exact_fwd=None, window_fwd=per_pair * pairs)
    if not causal:
        return FlopCount(dense_fwd=dense, fa_half_fwd=None, exact_fwd=None)
    return FlopCount(dense_fwd=dense, fa_half_fwd=dense // 2,
                     exact_fwd=per_pair * causal_pairs(seqlen_q, seqlen_k))


def count_packed(*, lengths, heads_q: int, head_dim: int, head_dim_v: int | None = None, causal: bool,
                 window: tuple[int, int] | None = None) -> FlopCount:
    """FLOPs of packed sequences (flash-attn's varlen): each sequence of ``lengths`` (queries and keys
    alike) its own problem, the counts summed convention by convention (an empty sequence counts
    none; under ``fa-half`` each sequence's dense count is halved)."""
    parts = [count(batch=1, heads_q=heads_q, seqlen_q=n, seqlen_k=n, head_dim=head_dim, head_dim_v=head_dim_v,
                   causal=causal, window=window) for n in lengths if n > 0]
    if not parts:
        raise ValueError(f"packed sequences need one of at least one row, got lengths {tuple(lengths)}")

    def total(field):
        values = [getattr(fc, field) for fc in parts]
        return None if values[0] is None else sum(values)
    return FlopCount(dense_fwd=total("dense_fwd"), fa_half_fwd=total("fa_half_fwd"), exact_fwd=total("exact_fwd"),
                     window_fwd=total("window_fwd"))


def convention_for(causal: bool, causal_convention: str, windowed: bool = False) -> str:
    """The convention a row reports: ``window`` with a sliding window, else ``dense`` unless causal,
    then the chosen causal one."""
    if causal_convention not in CAUSAL_CONVENTIONS:
        raise ValueError(f"causal_convention must be one of {CAUSAL_CONVENTIONS}, got {causal_convention!r}")
    if windowed:
        return WINDOW
    return causal_convention if causal else DENSE


def tflops(flops: int, milliseconds: float) -> float:
    """Accounting throughput in TFLOP/s (10¹² FLOP per second) of ``flops`` done in ``milliseconds``."""
    if not milliseconds > 0:
        raise ValueError(f"milliseconds must be positive, got {milliseconds!r}")
    return flops / (milliseconds * 1e-3) / 1e12
