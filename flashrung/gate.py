"""The correctness gate (seed 000, 2.1), frozen.

A kernel passes iff, for every checked tensor T (out, lse, and dq/dk/dv for the backward),

    max_abs(T_kernel − T_oracle) ≤ 2 · max_abs(T_lowp − T_oracle) + 1e-4

where the oracle is exact attention (fp64 on CPU, fp32 on GPU) and ``lowp`` the same math in the
inputs' dtype: the floor the dtype imposes. Every check draws fresh random inputs (never zeros),
and the kernel writes into outputs poisoned with NaN, so a row it forgets to write fails loudly.
``ratio`` is the worst ``error / bound`` over the checked tensors: < 1 passes.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
from typing import Callable, Sequence

import torch

from flashrung import reference
from flashrung.inputs import NO_WINDOW, score_kwargs

ATOL = 1e-4          # absolute slack of the rule, as frozen in seed 000
FLOOR_FACTOR = 2.0   # how many times the same-dtype floor a kernel may err


@dataclasses.dataclass(frozen=True)
class Case:
    """One gate configuration."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    causal: bool
    softmax_scale: float | None = None
    head_dim_v: int | None = None     # v's (and out's) head dim; None: head_dim
    window_size: tuple[int, int] = NO_WINDOW   # flash-attn's sliding window (left, right); -1: unbounded
    softcap: float = 0.0                      # flash-attn's cap on the scaled scores; 0: none
    # packed sequences (flash-attn's varlen): each sequence's query and key lengths; batch is their
    # count and seqlen_q / seqlen_k the longest
    varlen: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    @property
    def value_head_dim(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    def label(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        d = f"d{self.head_dim}" + (f"/{self.head_dim_v}" if self.value_head_dim != self.head_dim else "")
        s = f"B{self.batch} Sq{self.seqlen_q} Sk{self.seqlen_k} H{self.heads_q}/{self.heads_kv} {d} {dt}"
        s += " causal" if self.causal else ""
        s += f" window{tuple(self.window_size)}" if tuple(self.window_size) != NO_WINDOW else ""
        s += f" varlen q{self.varlen[0]} k{self.varlen[1]}" if self.varlen else ""
        return s + (f" softcap{self.softcap:g}" if self.softcap else "")


@dataclasses.dataclass
class TensorCheck:
    name: str
    error: float      # max |kernel − oracle|
    floor: float      # max |lowp − oracle|
    bound: float      # FLOOR_FACTOR · floor + ATOL

    @property
    def ratio(self) -> float:
        return self.error / self.bound

    @property
    def passed(self) -> bool:
        return self.error <= self.bound


@dataclasses.dataclass
class GateResult:
    case: Case
    checks: list[TensorCheck]
    kernel: str = ""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def ratio(self) -> float:
        return max(c.ratio for c in self.checks)

    def __str__(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        worst = max(self.checks, key=lambda c: c.ratio)
        return (f"{status} {self.kernel} {self.case.label()}: worst {worst.name} "
                f"err {worst.error:.3e} bound {worst.bound:.3e} ratio {self.ratio:.3f}")

    def to_json(self) -> dict:
        return {
            "kernel": self.kernel, "case": self.case.label(), "passed": self.passed,
            "ratio": self.ratio,
            "checks": [dict(dataclasses.asdict(c), ratio=c.ratio, passed=c.passed) for c in self.checks],
        }


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| in fp64, where equal infinities (a row that sees no key: lse = −inf) count as
    equal and any NaN counts as an infinite error."""
    a = a.detach().to(torch.float64)
    b = b.detach().to(b.device).to(torch.float64)
    a = a.to(b.device)
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    d = (a - b).abs()
    d = torch.where(same_inf, torch.zeros_like(d), d)
    d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
    return float(d.max()) if d.numel() else 0.0


def check_tensor(name, kernel_value, oracle_value, lowp_value) -> TensorCheck:
    err = max_abs_diff(kernel_value, oracle_value)
    floor = max_abs_diff(lowp_value, oracle_value)
    return TensorCheck(name, err, floor, FLOOR_FACTOR * floor + ATOL)


def random_inputs(case: Case, device, generator: torch.Generator | None = None):
    """Fresh Gaussian q, k, v for ``case`` — never zeros, never a constant."""
    def randn(*shape):
        t = torch.randn(*shape, generator=generator, dtype=torch.float32, device="cpu")
        return t.to(device=device, dtype=case.dtype)
    q = randn(case.batch, case.seqlen_q, case.heads_q, case.head_dim)
    k = randn(case.batch, case.seqlen_k, case.heads_kv, case.head_dim)
    v = randn(case.batch, case.seqlen_k, case.heads_kv, case.value_head_dim)
    return q, k, v


def _generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else torch.randint(0, 2**62, (1,)).item())
    return g


def _accepts(fn: Callable, *names: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(n in params for n in names) or any(p.kind is p.VAR_KEYWORD for p in params.values())


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def run_forward(forward_fn: Callable, q, k, v, causal: bool, scale: float, window_size=NO_WINDOW,
                softcap: float = 0.0):
    """Run a kernel's forward into NaN-poisoned outputs when it takes them."""
    B, Sq, Hq, D = q.shape
    extra = score_kwargs(window_size, softcap)
    if _accepts(forward_fn, "out", "lse"):
        out = poisoned((B, Sq, Hq, v.shape[3]), q.dtype, q.device)
        lse = poisoned((B, Hq, Sq), torch.float32, q.device)
        got_out, got_lse = forward_fn(q, k, v, causal, scale, out=out, lse=lse, **extra)
        return got_out, got_lse
    if q.device.type == "cuda":
        _poison_allocator(q.device)
    return forward_fn(q, k, v, causal, scale, **extra)


def _poison_allocator(device, nbytes: int = 1 << 28) -> None:
    """For kernels that allocate their own outputs: hand the caching allocator blocks full of
    NaN, so freshly allocated outputs start poisoned rather than zeroed or stale."""
    blocks = [torch.full((n // 2,), float("nan"), dtype=torch.float16, device=device)
              for n in (nbytes, nbytes // 16, nbytes // 256, 1 << 16)]
    del blocks


def check_forward(forward_fn: Callable, *, batch: int, seqlen_q: int, seqlen_k: int, heads_q: int,
                  heads_kv: int, head_dim: int, dtype: torch.dtype, causal: bool, device,
                  softmax_scale: float | None = None, seed: int | None = None,
                  kernel: str = "", head_dim_v: int | None = None,
                  window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0) -> GateResult:
    """Gate a forward ``forward_fn(q, k, v, causal, softmax_scale[, out=, lse=][, window_size=,
    softcap=]) -> (out, lse)``."""
    case = Case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal, softmax_scale, head_dim_v,
                tuple(window_size), softcap)
    return check_forward_case(forward_fn, case, device, seed=seed, kernel=kernel)


def check_forward_case(forward_fn, case: Case, device, seed=None, kernel="") -> GateResult:
    q, k, v = random_inputs(case, device, _generator(seed))
    return check_forward_inputs(forward_fn, q, k, v, case.causal, case.softmax_scale, kernel=kernel,
                                window_size=case.window_size, softcap=case.softcap)


def check_forward_inputs(forward_fn: Callable, q, k, v, causal: bool, softmax_scale: float | None = None,
                         kernel: str = "", window_size: tuple[int, int] = NO_WINDOW,
                         softcap: float = 0.0) -> GateResult:
    """The gate's rule on given inputs: for a property that fresh Gaussians do not reach (scores
    whose row maximum jumps late in the keys, say); every other check draws its own."""
    B, Sq, Hq, D = q.shape
    case = Case(B, Sq, k.shape[1], Hq, k.shape[2], D, q.dtype, causal, softmax_scale, head_dim_v=v.shape[3],
                window_size=tuple(window_size), softcap=softcap)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    out, lse = run_forward(forward_fn, q, k, v, causal, scale, window_size, softcap)
    ref_out, ref_lse = reference.oracle(q, k, v, causal, scale, window_size, softcap)
    low_out, low_lse = reference.lowp(q, k, v, causal, scale, window_size, softcap)
    checks = [check_tensor("out", out, ref_out, low_out), check_tensor("lse", lse, ref_lse, low_lse)]
    return GateResult(case, checks, kernel)


def check_backward(forward_fn: Callable, backward_fn: Callable, case: Case, device, seed=None,
                   kernel: str = "") -> GateResult:
    """Gate a backward ``backward_fn(do, q, k, v, out, lse, causal, scale[, dq=, dk=, dv=])``.

    The forward that feeds it is ``forward_fn``'s (out, lse), itself gated here too, so the
    backward is judged on what it will really be given."""
    g = _generator(seed)
    q, k, v = random_inputs(case, device, g)
    do = torch.randn(q.shape[:3] + (v.shape[3],), generator=g).to(device=device, dtype=case.dtype)
    scale = case.softmax_scale if case.softmax_scale is not None else 1.0 / math.sqrt(case.head_dim)
    out, lse = run_forward(forward_fn, q, k, v, case.causal, scale, case.window_size, case.softcap)
    extra = score_kwargs(case.window_size, case.softcap)
    if _accepts(backward_fn, "dq", "dk", "dv"):
        dq, dk, dv = (poisoned(t.shape, t.dtype, device) for t in (q, k, v))
        dq, dk, dv = backward_fn(do, q, k, v, out, lse, case.causal, scale, dq=dq, dk=dk, dv=dv, **extra)
    else:
        if q.device.type == "cuda":
            _poison_allocator(q.device)
        dq, dk, dv = backward_fn(do, q, k, v, out, lse, case.causal, scale, **extra)
    ref = reference.oracle_grads(q, k, v, do, case.causal, scale, window_size=case.window_size,
                                 softcap=case.softcap)
    low = reference.oracle_grads(q, k, v, do, case.causal, scale, low_precision=True,
                                 window_size=case.window_size, softcap=case.softcap)
    checks = [check_tensor(name, got, r, l)
              for name, got, r, l in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low)]
    return GateResult(case, checks, kernel)


# The envelope the gate is calibrated over: every property a kernel can get wrong, at sizes the
# CPU interpreter finishes in seconds ("small") or the ones users run ("device"). ``head_dims``
# replaces the size's own; an entry may be a pair (q's and k's head dim, v's head dim).
def envelope(size: str = "small", dtypes: Sequence[torch.dtype] = (torch.float16, torch.bfloat16),
             head_dims: Sequence[int | tuple[int, int]] | None = None) -> list[Case]:
    cases: list[Case] = []
    if size == "small":
        head_dims = head_dims or (32, 64, 128)
        shapes = [
            # (B, Sq, Sk, Hq, Hkv)   why it is here
            (1, 1, 1, 2, 1),        # one query, one key: the degenerate tile
            (2, 17, 17, 2, 2),      # odd length: masked tails in both directions
            (1, 64, 64, 2, 2),      # exactly one tile: no tail
            (1, 33, 95, 4, 1),      # Sq < Sk, MQA: bottom-right causal offset, K/V head sharing
            (1, 80, 24, 2, 1),      # Sq > Sk: causal rows that see no key
            (1, 130, 130, 8, 1),    # GQA 8:1 across more than two tiles
        ]
    elif size == "device":
        head_dims = head_dims or (64, 128, 256)
        shapes = [
            (1, 1, 1, 2, 2),
            (2, 17, 17, 4, 4),
            (2, 1000, 1000, 4, 2),
            (1, 4097, 4097, 8, 1),     # GQA 8:1 at an odd length
            (1, 1000, 4097, 4, 4),     # Sq < Sk
            (1, 4097, 1000, 4, 4),     # Sq > Sk
            (1, 16384, 16384, 2, 2),   # long sequence: accumulator and max-drift over many tiles
        ]
    else:
        raise ValueError(f"size must be 'small' or 'device', got {size!r}")
    for entry in head_dims:
        d, dv = entry if isinstance(entry, tuple) else (entry, None)
        for dtype in dtypes:
            for causal in (False, True):
                for B, Sq, Sk, Hq, Hkv in shapes:
                    cases.append(Case(B, Sq, Sk, Hq, Hkv, d, dtype, causal, head_dim_v=dv))
    return cases


def cu_seqlens(lengths: Sequence[int], device) -> torch.Tensor:
    """flash-attn's cumulative lengths: int32, ``len(lengths) + 1`` entries from 0."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def check_varlen(forward_fn: Callable, backward_fn: Callable | None, case: Case, device, seed=None,
                 kernel: str = "") -> GateResult:
    """Gate packed sequences (``case.varlen``): ``forward_fn(q, k, v, causal, scale, cu_seqlens=,
    max_seqlens=[, out=, lse=][, window_size=, softcap=])`` on q (1, total_q, Hq, D), k/v (1,
    total_k, Hkv, D/Dv), and with ``backward_fn`` its gradients, each sequence against the
    references run on it alone — so a row that reads another sequence's keys fails."""
    lens_q, lens_k = case.varlen
    g = _generator(seed)
    whole = dataclasses.replace(case, batch=1, seqlen_q=sum(lens_q), seqlen_k=sum(lens_k), varlen=None)
    q, k, v = random_inputs(whole, device, g)
    do = torch.randn(q.shape[:3] + (v.shape[3],), generator=g).to(device=device, dtype=case.dtype)
    scale = case.softmax_scale if case.softmax_scale is not None else 1.0 / math.sqrt(case.head_dim)
    packed = dict(cu_seqlens=(cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)),
                  max_seqlens=(max(lens_q), max(lens_k)))
    extra = score_kwargs(case.window_size, case.softcap)
    out = poisoned(q.shape[:3] + (v.shape[3],), q.dtype, device)
    lse = poisoned((1, case.heads_q, q.shape[1]), torch.float32, device)
    out, lse = forward_fn(q, k, v, case.causal, scale, out=out, lse=lse, **packed, **extra)
    # the references, one sequence at a time, in the packed order
    qs, ks = cu_seqlens(lens_q, "cpu").tolist(), cu_seqlens(lens_k, "cpu").tolist()
    spans = [(slice(qs[i], qs[i + 1]), slice(ks[i], ks[i + 1])) for i in range(len(lens_q))]
    refs = {"oracle": [], "lowp": []}
    for rows, keys in spans:
        args = (q[:, rows], k[:, keys], v[:, keys], case.causal, scale, case.window_size, case.softcap)
        refs["oracle"].append(reference.oracle(*args))
        refs["lowp"].append(reference.lowp(*args))
    joined = {name: (torch.cat([o for o, _ in parts], 1), torch.cat([l for _, l in parts], 2))
              for name, parts in refs.items()}
    checks = [check_tensor("out", out, joined["oracle"][0], joined["lowp"][0]),
              check_tensor("lse", lse, joined["oracle"][1], joined["lowp"][1])]
    if backward_fn is not None:
        dq, dk, dv = (poisoned(t.shape, t.dtype, device) for t in (q, k, v))
        dq, dk, dv = backward_fn(do, q, k, v, out, lse, case.causal, scale, dq=dq, dk=dk, dv=dv, **packed, **extra)
        grads = {"oracle": [], "lowp": []}
        for rows, keys in spans:
            for name, low in (("oracle", False), ("lowp", True)):
                grads[name].append(reference.oracle_grads(q[:, rows], k[:, keys], v[:, keys], do[:, rows], case.causal,
                                                          scale, low_precision=low, window_size=case.window_size,
                                                          softcap=case.softcap))
        for i, (name, got) in enumerate(zip(("dq", "dk", "dv"), (dq, dk, dv))):
            exact = torch.cat([parts[i] for parts in grads["oracle"]], 1)
            low = torch.cat([parts[i] for parts in grads["lowp"]], 1)
            checks.append(check_tensor(name, got, exact, low))
    return GateResult(case, checks, kernel)
