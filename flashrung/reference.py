"""The two references every kernel is judged against (seed 000, 2.1).

* :func:`oracle` — exact attention in fp64 on the CPU, fp32 on a GPU: the truth.
* :func:`lowp` — the same math carried out in the inputs' own dtype (scores, probabilities and
  the output rounded to fp16/bf16 as a plain PyTorch program would): the error floor that the
  dtype itself imposes. A kernel may be at most twice as far from the truth as this.

Conventions shared with the kernels: q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv);
causal is aligned bottom-right (query i sees key j iff j <= i + Sk - Sq, as flash-attn >= 2.1), and
so is a sliding window ``(left, right)`` (i sees j iff i + Sk - Sq - left <= j <= i + Sk - Sq +
right, −1 for an unbounded side, flash-attn's ``window_size``); ``softcap`` > 0 caps the scaled
scores as flash-attn does, ``softcap · tanh(scores / softcap)``, before the mask; a query that sees
no key has out = 0 and lse = -inf; lse is the natural-log sum of exp of the (capped) scores.
"""
from __future__ import annotations

import math

import torch


def attention_mask(seqlen_q: int, seqlen_k: int, causal: bool, window_size: tuple[int, int], device,
                   query_rows: torch.Tensor | None = None):
    """Boolean (Sq, Sk) mask, True where query i may attend key j, or None where every query sees
    every key: causal and the sliding window, both bottom-right aligned. ``query_rows``: only
    these queries' rows of it (their positions in 0..Sq-1), (len(query_rows), Sk)."""
    left, right = window_size
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    rows = torch.arange(seqlen_q, device=device) if query_rows is None else query_rows.to(device)
    # j − (i + Sk − Sq)
    rel = torch.arange(seqlen_k, device=device)[None, :] - rows[:, None] - (seqlen_k - seqlen_q)
    mask = torch.ones(rows.numel(), seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= rel >= -left
    if right >= 0:
        mask &= rel <= right
    return mask


def _expand_kv(x: torch.Tensor, heads_q: int) -> torch.Tensor:
    group = heads_q // x.shape[2]
    return x if group == 1 else x.repeat_interleave(group, dim=2)


def _attention(q, k, v, causal, softmax_scale, compute_dtype, window_size=(-1, -1), softcap=0.0, query_rows=None):
    """Attention with every operation carried out in ``compute_dtype`` — fp64/fp32 for the
    oracle; the inputs' own dtype for the same-dtype reference, where each matmul, the scaling,
    the softmax and the output round to fp16/bf16 exactly as a plain PyTorch program does.
    ``query_rows``: only these queries (positions in 0..Sq-1, masks aligned as for all of them)."""
    B, Sq, Hq, D = q.shape
    Sk = k.shape[1]
    if query_rows is not None:
        q = q[:, query_rows.to(q.device)]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    qh = q.to(compute_dtype).transpose(1, 2)                      # (B, Hq, Sq, D)
    kh = _expand_kv(k, Hq).to(compute_dtype).transpose(1, 2)       # (B, Hq, Sk, D)
    vh = _expand_kv(v, Hq).to(compute_dtype).transpose(1, 2)       # (B, Hq, Sk, Dv)
    scores = (qh @ kh.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    mask = attention_mask(Sq, Sk, causal, window_size, q.device, query_rows)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # rows that see no key (causal with Sq > Sk, a window past the keys) are defined as out = 0,
    # lse = -inf
    dead = ~torch.isfinite(scores).any(dim=-1, keepdim=True) if mask is not None else None
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.softmax(scores, dim=-1)
    if dead is not None:
        probs = torch.where(dead, torch.zeros_like(probs), probs)
    out = probs @ vh
    return out.transpose(1, 2), lse.squeeze(-1)                   # (B, Sq, Hq, Dv), (B, Hq, Sq)


def oracle_dtype(device) -> torch.dtype:
    return torch.float64 if torch.device(device).type == "cpu" else torch.float32


def oracle(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, query_rows=None):
    """Exact attention: fp64 on the CPU, fp32 on a GPU. Returns (out, lse) in that dtype; with
    ``query_rows`` (a 1-D index tensor), those queries' rows only."""
    return _attention(q, k, v, causal, softmax_scale, oracle_dtype(q.device), window_size, softcap, query_rows)


def lowp(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, query_rows=None):
    """Same-dtype reference: what a straightforward fp16/bf16 program computes."""
    return _attention(q, k, v, causal, softmax_scale, q.dtype, window_size, softcap, query_rows)


def oracle_grads(q, k, v, out_grad, causal=False, softmax_scale=None, low_precision=False, window_size=(-1, -1),
                 softcap=0.0):
    """Gradients of sum(out * out_grad) w.r.t. q, k, v through the oracle (or the same-dtype
    reference when ``low_precision``). Returned in the computing dtype."""
    dtype = oracle_dtype(q.device)
    if low_precision:
        qs, ks, vs = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        out, _ = lowp(qs, ks, vs, causal, softmax_scale, window_size, softcap)
        out.backward(out_grad.to(out.dtype))
        return tuple(t.grad.to(dtype) for t in (qs, ks, vs))
    qs, ks, vs = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    out, _ = _attention(qs, ks, vs, causal, softmax_scale, dtype, window_size, softcap)
    out.backward(out_grad.to(dtype))
    return qs.grad, ks.grad, vs.grad
