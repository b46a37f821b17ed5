"""Correctness and speed of ``hopper.fwd`` on an H200, in one command and about five minutes.

    python -m flashrung.kernels.hopper.selfcheck [--quick | --timing-only] [--json PATH]

Self-contained: its references are plain torch (an fp32 oracle and a same-dtype run), so it needs
neither the gate nor the bench layer. It

1. compiles every configuration it will run, in parallel worker processes (Triton's disk cache);
2. checks correctness at small odd shapes — every default (d ∈ {64, 128, 256} × causal × dtype)
   and every schedule switch — with the gate's rule ``err ≤ 2·err_lowp + 1e-4`` on out and LSE,
   NaN-poisoned outputs, ``-inf`` LSE exactly where the oracle has it, and a bit-identical
   rerun;
3. times the default, each single-switch ablation and the combinations worth pricing together
   (``triton.testing.do_bench`` median, warm, unpaired) next to torch SDPA's cuDNN backend at the
   issue's shapes, FLOPs ``4·B·H·S²·D`` (causal ÷ 2).

``--timing-only`` skips the correctness battery and keeps one sanity check (a multi-tile, GQA,
Sq < Sk shape) for every configuration it times, run right before that configuration's timing.

Rows run in a child process with a deadline, so a hang costs one row, not the whole run; every
row catches its own exception. The last thing printed is a compact table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import select
import subprocess
import sys
import time
from flashrung import jsonfile

ROW_TIMEOUT_S = 90          # one row, compile included if the parallel pre-compile missed it
TOTAL_BUDGET_S = 290        # stop starting rows after this; the rest are reported as skipped
PRECOMPILE_TIMEOUT_S = 150
MARK = "@@ROW "


# --------------------------------------------------------------------------- the rows


def _cfg_dict(head_dim: int, causal: bool, **changes) -> dict:
    from flashrung.kernels.hopper.fwd import default_config

    return dataclasses.asdict(_changed(default_config(head_dim, causal), changes, _online(head_dim, causal)))


def _online(head_dim: int, causal: bool):
    """The online step's default beside ``default_config(head_dim, causal)``: what a change that
    sets the frozen row max aside applies to (:func:`_changed`)."""
    from flashrung.kernels.hopper.fwd import default_config

    return default_config(head_dim, causal, frozen_step=False)


def _default(head_dim: int, causal: bool):
    from flashrung.kernels.hopper.fwd import default_config

    return default_config(head_dim, causal)


def _switches(head_dim: int, causal: bool) -> list[tuple[str, dict]]:
    """Single-switch ablations of the default at (head_dim, causal) that fit the budgets."""
    from flashrung.kernels.hopper.fwd import default_config

    base = default_config(head_dim, causal)
    candidates = [
        ("overlap", dict(overlap=not base.overlap)),
        # where the default has FA4's order or named turns, switching overlap or pingpong off
        # takes them along (they are levers of the overlapped pingpong)
        ("overlap", dict(overlap=False, wait_pv_early=False, named_turns=False)),
        ("pingpong", dict(pingpong=not base.pingpong)),
        ("pingpong", dict(pingpong=False, named_turns=False)),
        ("persistent", dict(persistent=not base.persistent)),
        # the balanced lists need the persistent grid: leaving it takes them along
        ("persistent", dict(persistent=False, balanced=False)),
        ("balanced", dict(balanced=not base.balanced)),
        ("balanced", dict(balanced=True, persistent=True, split_tail=False)),
        ("lpt", dict(lpt=not base.lpt)),
        ("stages", dict(num_kv_stages=base.num_kv_stages + 1)),
        ("stages", dict(num_kv_stages=base.num_kv_stages - 1)),
        ("block_n", dict(block_n=64 if base.block_n == 128 else 128)),
        ("regs", dict(consumer_regs=232 if base.consumer_regs == 240 else 240)),
        ("block_m", dict(block_m=64)),
    ]
    if head_dim == 64:   # three consumer warpgroups only fit their 160 registers at small head dims
        candidates.append(("block_m", dict(block_m=192, consumer_regs=160, block_n=64)))
    candidates += [
        ("late_rescale", dict(late_rescale=not base.late_rescale)),
        ("pack_p", dict(pack_p=not base.pack_p)),
        # the retained reference, warpgroup-wide as first timed (in FA3's order), and each warp on
        # its own vote in the default's order
        ("rescale_threshold", dict(rescale_threshold=RESCALE_THRESHOLD if base.rescale_threshold == 0 else 0.0,
                                   wait_pv_early=False)),
        ("rescale_by_warp", dict(rescale_threshold=RESCALE_THRESHOLD, rescale_by_warp=True)),
        ("wait_pv_early", dict(wait_pv_early=not base.wait_pv_early)),
        ("q_in_registers", dict(q_in_registers=not base.q_in_registers)),
        ("exp2_fma_every", dict(exp2_fma_every=4 if base.exp2_fma_every == 0 else 0)),
        ("tree_reduce", dict(tree_reduce=not base.tree_reduce, four_max_chains=False)),
        ("four_max_chains", dict(four_max_chains=not base.four_max_chains, tree_reduce=False)),
        ("separate_o", dict(separate_o=not base.separate_o)),
        ("defer_row_sum", dict(defer_row_sum=not base.defer_row_sum)),
        # the token's carrier is a switch of pingpong: where pingpong is off, both go on together
        ("named_turns", dict(named_turns=not base.named_turns)),
        ("named_turns", dict(named_turns=True, pingpong=True)),
        ("stagger_kv", dict(stagger_kv=not base.stagger_kv)),
        # the stagger cannot run on a paired default (kv_multicast): turning it on unpairs it
        ("stagger_kv", dict(stagger_kv=True, kv_multicast=False)),
        ("lag_v_loads", dict(lag_v_loads=not base.lag_v_loads)),
        ("late_k_release", dict(late_k_release=not base.late_k_release)),
        ("thread_release", dict(thread_release=not base.thread_release, asm_arrivals=False)),
        ("asm_arrivals", dict(asm_arrivals=not base.asm_arrivals, thread_release=False)),
        ("asm_waits", dict(asm_waits=not base.asm_waits)),
        ("hoist_smem_base", dict(hoist_smem_base=not base.hoist_smem_base)),
        ("gate_pv_wait", dict(gate_pv_wait=not base.gate_pv_wait)),
        ("row_bound_mask", dict(row_bound_mask=not base.row_bound_mask)),
        ("skip_empty_rows", dict(skip_empty_rows=not base.skip_empty_rows)),
        ("overlap_epilogue", dict(overlap_epilogue=not base.overlap_epilogue)),
        ("first_mask_on_need", dict(first_mask_on_need=not base.first_mask_on_need)),
        ("skip_unseen_half", dict(skip_unseen_half=not base.skip_unseen_half)),
        ("mask_second_half", dict(mask_second_half=not base.mask_second_half)),
        ("single_kv_loop", dict(single_kv_loop=not base.single_kv_loop)),
        ("carry_ring_slot", dict(carry_ring_slot=not base.carry_ring_slot)),
        ("row_sum_by_mma", dict(row_sum_by_mma=not base.row_sum_by_mma, defer_row_sum=False)),
    ]
    if not causal:      # the CTA pairs of kv_multicast read one K/V range: non-causal only
        candidates.append(("kv_multicast", dict(kv_multicast=not base.kv_multicast)))
    if not base.kv_multicast:   # a paired kernel's producer is its whole warpgroup already
        candidates.append(("producer_warpgroup", dict(producer_warpgroup=not base.producer_warpgroup)))
    else:                       # its producer's waits and Q copies: Gluon's or inline
        candidates.append(("producer_unsynced", dict(producer_unsynced=not base.producer_unsynced)))
        # the pair's releases: each consumer on both CTAs, or relayed by the producers
        candidates.append(("relay_release", dict(relay_release=not base.relay_release)))
    if head_dim == 64:   # the exponentials' ring was built for, gated and priced on d64's consumers
        # its token is passed on the running row sum: a deferred sum goes off with it
        candidates.append(("exp_turns", dict(exp_turns=not base.exp_turns, defer_row_sum=False)))
        # a quarter of the exponentials ahead of PV's wait: FA4's order, its own gate on that wait
        candidates.append(("early_exp_quarters", dict(early_exp_quarters=0 if base.early_exp_quarters else 1,
                                                      wait_pv_early=True, pingpong=True, gate_pv_wait=False)))
    return _feasible(base, head_dim, candidates, repeatable=("block_m",), online=_online(head_dim, causal))


RESCALE_THRESHOLD = 8.0      # FA4's τ for 16-bit inputs (log2 units): P ≤ 256


def _changed(base, change: dict, online=None):
    """``base`` with ``change``: a change that unpairs a paired default (kv_multicast) drops its
    producer's way of waiting with it, as ``hopper.fwd@...`` does (``config.unpaired_producer_follows``);
    one that forces a lever the frozen reference cannot join sets it aside (``config.frozen_follows``)
    and, given ``online`` (the online step's default, :func:`_online`), applies to that instead, as
    ``hopper.fwd@...`` does (``fwd.overridden_config``): what the freeze brought goes with it."""
    from flashrung.kernels.hopper.config import frozen_follows, unpaired_producer_follows

    def apply(cfg):
        return frozen_follows(unpaired_producer_follows(dataclasses.replace(cfg, **change), change), change)

    out = apply(base)
    if online is not None and base.freeze_row_max and not out.freeze_row_max:
        out = apply(online)
    return out


def _feasible(base, head_dim: int, candidates, repeatable=(), online=None) -> list[tuple[str, dict]]:
    """(label, change) for each candidate that fits the budgets (built as :func:`_changed` builds it,
    with ``online``), the first of each name only."""
    from flashrung.kernels.hopper.config import HopperFwdConfig

    out, seen = [], set()
    for name, change in candidates:
        cfg = _changed(base, change, online)
        if name in seen and name not in repeatable or cfg.num_kv_stages < 1:
            continue
        try:
            HopperFwdConfig.check(cfg, head_dim)
        except ValueError:
            continue
        seen.add(name)
        out.append((",".join(f"{k}={v}" for k, v in change.items()), change))
    return out


def _combos(head_dim: int, causal: bool) -> list[tuple[str, dict]]:
    """Combinations of switches that each measured near or above the default on the H200
    (do_bench, unpaired), and of the schedule levers with them: whether the gains add."""
    from flashrung.kernels.hopper.fwd import default_config

    base = default_config(head_dim, causal)
    pp, pers, regs = dict(pingpong=True), dict(persistent=True), dict(consumer_regs=232)
    levers = dict(late_rescale=True, pack_p=True)
    thr = dict(rescale_threshold=RESCALE_THRESHOLD)
    wide = dict(block_m=192, consumer_regs=160)          # d64: three consumer warpgroups
    table = {
        (128, False): [pp | pers, pp | regs, pers | regs, pp | pers | regs, levers, levers | thr,
                       levers | pp | pers, levers | pp | pers | regs],
        (128, True): [levers, levers | thr, levers | regs],
        (64, False): [wide | dict(block_n=64) | pers, wide | dict(block_n=128), wide | dict(block_n=128) | pers,
                      levers, levers | thr, wide | dict(block_n=64) | levers | pers],
        (64, True): [levers, levers | thr],
        (256, False): [pers | regs, levers, levers | pers],
        (256, True): [levers],
    }
    candidates = [(repr(sorted(c.items())), c) for c in table.get((head_dim, causal), [])]
    online = _online(head_dim, causal)
    singles = [_changed(base, change, online) for _, change in _switches(head_dim, causal)]
    return [(label, change) for label, change in _feasible(base, head_dim, candidates, online=online)
            if _changed(base, change, online) not in singles + [base]]


# (B, Sq, Sk, Hq, Hkv): why each shape is here
CHECK_SHAPES = [
    ((2, 1, 1, 4, 4), "one query, one key"),
    ((1, 17, 17, 8, 1), "a sub-tile, MQA 8:1"),
    ((2, 1000, 777, 4, 2), "Sq > Sk tails, GQA 2:1; causal: top rows see no key"),
    ((1, 333, 1000, 2, 2), "Sq < Sk; causal: every row sees a long prefix"),
]
SWITCH_SHAPES = [
    ((2, 1000, 777, 4, 2), "tails in both sequences, GQA"),
    ((1, 700, 1500, 3, 1), "Sq < Sk, 3:1 GQA, several K/V tiles per CTA"),
]
TIME_SHAPES = [
    # (B, S, H, D, causal)
    (2, 16384, 16, 128, False),
    (2, 16384, 16, 128, True),
    (4, 8192, 32, 64, False),
    (4, 8192, 16, 256, False),
]


SANITY_SHAPE = ((1, 700, 1500, 3, 1), "sanity: Sq < Sk, 3:1 GQA, several K/V tiles per CTA")


def build_rows(quick: bool = False, timing_only: bool = False) -> list[dict]:
    if timing_only:
        return _timing_rows(quick=False, sanity=True)
    rows = []
    dtypes = ("bfloat16",) if quick else ("float16", "bfloat16")
    for d in (64, 128, 256):
        for causal in (False, True):
            for dtype in dtypes:
                for shape, why in CHECK_SHAPES:
                    rows.append(dict(kind="check", variant="default", cfg=_cfg_dict(d, causal), d=d, causal=causal,
                                     dtype=dtype, shape=shape, why=why))
    rows.append(dict(kind="check", variant="default", cfg=_cfg_dict(128, True), d=128, causal=True,
                     dtype="bfloat16", shape=(1, 4097, 4097, 2, 2), why="4097: one key past a tile multiple"))
    rows.append(dict(kind="check", variant="default", cfg=_cfg_dict(64, False), d=64, causal=False,
                     dtype="float16", shape=(2, 300, 300, 2, 2), why="negative softmax scale", scale=-0.05))
    rows.append(dict(kind="check", variant="default", cfg=_cfg_dict(128, False), d=128, causal=False,
                     dtype="bfloat16", shape=(2, 500, 500, 4, 4), why="q, k, v as views of a packed qkv",
                     packed=True))
    rows.append(dict(kind="determinism", variant="default", cfg=_cfg_dict(128, True), d=128, causal=True,
                     dtype="bfloat16", shape=(2, 1000, 1000, 4, 1), why="bit-identical rerun"))
    for d in ((128,) if quick else (64, 128, 256)):
        for causal in (False, True):
            for label, change in _switches(d, causal):
                for shape, why in SWITCH_SHAPES[: 1 if quick else 2]:
                    rows.append(dict(kind="check", variant=label, cfg=_cfg_dict(d, causal, **change), d=d,
                                     causal=causal, dtype="bfloat16", shape=shape, why=why))
            for label, change in ([] if quick else _combos(d, causal)):
                shape, why = SWITCH_SHAPES[0]
                rows.append(dict(kind="check", variant=label, cfg=_cfg_dict(d, causal, **change), d=d,
                                 causal=causal, dtype="bfloat16", shape=shape, why=why))
    # the new numerics in the paths the bf16 rows above do not take: fp16 packing, a negative scale
    # FA3's order with the retained reference: PV's gated wait (FA4's order's, gate_pv_wait) goes with it
    levers = dict(late_rescale=True, pack_p=True, rescale_threshold=RESCALE_THRESHOLD, wait_pv_early=False,
                  gate_pv_wait=False)
    rows.append(dict(kind="check", variant="levers fp16", cfg=_cfg_dict(64, True, **levers), d=64, causal=True,
                     dtype="float16", shape=(2, 1000, 777, 4, 2), why="fp16 packed P, retained reference"))
    rows.append(dict(kind="check", variant="levers, scale<0", cfg=_cfg_dict(128, False, **levers), d=128,
                     causal=False, dtype="bfloat16", shape=(2, 300, 700, 2, 2),
                     why="negative softmax scale with a retained reference", scale=-0.05))
    rows.append(dict(kind="check", variant="levers, scale 0.5", cfg=_cfg_dict(64, False, **levers), d=64,
                     causal=False, dtype="bfloat16", shape=(2, 300, 2000, 4, 2), scale=0.5,
                     why="log2 scores spread ~6: the retained reference moves early, stays later"))
    split = dict(exp2_fma_every=2)
    rows.append(dict(kind="check", variant="exp2 split fp16", cfg=_cfg_dict(64, True, **split), d=64, causal=True,
                     dtype="float16", shape=(2, 1000, 777, 4, 2), why="emulated exp2 feeding fp16 packed P"))
    rows.append(dict(kind="check", variant="exp2 split, scale<0", cfg=_cfg_dict(128, False, **split), d=128,
                     causal=False, dtype="bfloat16", shape=(2, 300, 700, 2, 2), scale=-0.05,
                     why="emulated exp2 on re-masked scores of a negative scale"))
    return rows + _timing_rows(quick, sanity=False)


def _timing_rows(quick: bool, sanity: bool) -> list[dict]:
    """Timed rows at the issue's shapes; with ``sanity``, one check row before each configuration."""
    rows = []
    for b, s, h, d, causal in TIME_SHAPES:
        shape = (b, s, s, h, h)
        variants = [("default", {})] + ([] if quick else _switches(d, causal) + _combos(d, causal))
        seen = []
        for n, (label, change) in enumerate(variants):
            cfg = _cfg_dict(d, causal, **change)
            if cfg in seen:      # a switch the default already has set: the same kernel twice
                continue
            seen.append(cfg)
            if sanity:
                rows.append(dict(kind="check", variant=label, cfg=cfg, d=d, causal=causal, dtype="bfloat16",
                                 shape=SANITY_SHAPE[0], why=SANITY_SHAPE[1]))
            rows.append(dict(kind="time", variant=label, cfg=cfg, d=d, causal=causal, dtype="bfloat16", shape=shape))
            if n == 0:
                rows.append(dict(kind="time_cudnn", variant="cuDNN (SDPA)", cfg=None, d=d, causal=causal,
                                 dtype="bfloat16", shape=shape))
    return rows


# --------------------------------------------------------------------------- references


def reference(q, k, v, causal: bool, scale: float, dtype):
    """Attention in ``dtype`` for the products (fp32 softmax); (out fp32 (B,Sq,H,D), lse (B,H,Sq))."""
    import torch

    group = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2).to(dtype)
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1).to(dtype)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1).to(dtype)
    s = (qh @ kh.transpose(-1, -2)).float() * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(nan=0.0)      # rows with no key: p = 0
    out = (p.to(dtype) @ vh).float()
    return out.transpose(1, 2), lse


def _max_err(a, b, finite_only: bool = False):
    import torch

    if finite_only:
        keep = torch.isfinite(b)
        a, b = a[keep], b[keep]
    if a.numel() == 0:
        return 0.0
    return float((a.float() - b.float()).abs().max())


# --------------------------------------------------------------------------- one row


def _inputs(row, seed: int = 0):
    import torch

    b, sq, sk, hq, hkv = row["shape"]
    dtype = getattr(torch, row["dtype"])
    gen = torch.Generator(device="cuda").manual_seed(seed)
    d = row["d"]
    if row.get("packed"):
        qkv = torch.randn((b, sq, 3, hq, d), device="cuda", dtype=dtype, generator=gen)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q = torch.randn((b, sq, hq, d), device="cuda", dtype=dtype, generator=gen)
    k = torch.randn((b, sk, hkv, d), device="cuda", dtype=dtype, generator=gen)
    v = torch.randn((b, sk, hkv, d), device="cuda", dtype=dtype, generator=gen)
    return q, k, v


def _config(row):
    from flashrung.kernels.hopper.config import HopperFwdConfig

    return HopperFwdConfig(**row["cfg"])


def run_row(row) -> dict:
    import torch
    import triton

    from flashrung.kernels.hopper import fwd

    b, sq, sk, hq, hkv = row["shape"]
    d, causal = row["d"], row["causal"]
    scale = row.get("scale", 1.0 / math.sqrt(d))
    res = {}
    if row["kind"] in ("check", "determinism"):
        cfg = _config(row)
        q, k, v = _inputs(row)
        # NaN-poisoned outputs: a row the kernel forgets to write cannot pass
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
        lse = torch.full((b, hq, sq), float("nan"), dtype=torch.float32, device=q.device)
        out, lse = fwd.forward(q, k, v, causal, scale, config=cfg, out=out, lse=lse)
        torch.cuda.synchronize()
        ref_out, ref_lse = reference(q, k, v, causal, scale, torch.float32)
        low_out, low_lse = reference(q, k, v, causal, scale, q.dtype)
        res["nan"] = bool(torch.isnan(out).any() or torch.isnan(lse).any())
        res["inf_match"] = bool(torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)))
        res["out_err"], res["out_lowp"] = _max_err(out, ref_out), _max_err(low_out, ref_out)
        res["lse_err"], res["lse_lowp"] = _max_err(lse, ref_lse, True), _max_err(low_lse, ref_lse, True)
        ok = (not res["nan"] and res["inf_match"] and res["out_err"] <= 2 * res["out_lowp"] + 1e-4
              and res["lse_err"] <= 2 * res["lse_lowp"] + 1e-4)
        if row["kind"] == "determinism":
            out2, lse2 = fwd.forward(q, k, v, causal, scale, config=cfg)
            res["identical"] = bool(torch.equal(out, out2) and torch.equal(lse, lse2))
            ok = ok and res["identical"]
        res["ok"] = ok
        return res
    q, k, v = _inputs(row)
    flops = 4.0 * b * hq * sq * sk * d / (2.0 if causal else 1.0)
    if row["kind"] == "time":
        cfg = _config(row)
        fn = lambda: fwd.forward(q, k, v, causal, scale, config=cfg)  # noqa: E731
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))     # SDPA takes (B, H, S, D)

        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(qt, kt, vt, is_causal=causal, scale=scale)
    fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    res["ms"] = ms
    res["tflops"] = flops / (ms * 1e-3) / 1e12
    res["ok"] = True
    return res


# --------------------------------------------------------------------------- processes


def _worker(start: int, quick: bool, timing_only: bool, skip: set[int]) -> None:
    import traceback

    rows = build_rows(quick, timing_only)
    for i in range(start, len(rows)):
        if i in skip:
            continue
        t0 = time.time()
        try:
            res = run_row(rows[i])
        except Exception as exc:  # a row that fails is a result, not the end of the run
            res = dict(ok=False, error=f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                       trace=traceback.format_exc(limit=3)[-800:])
        res["i"] = i
        res["s"] = round(time.time() - t0, 2)
        print(MARK + json.dumps(res), flush=True)


def _compile_one(job):
    import torch

    from flashrung.kernels.hopper import fwd
    from flashrung.kernels.hopper.config import HopperFwdConfig

    cfg, d, causal, dtype, scale_positive = job
    try:
        fwd.warmup(HopperFwdConfig(**cfg), d, causal, getattr(torch, dtype), 1.0 if scale_positive else -1.0)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def _precompile(rows) -> None:
    """Fill Triton's disk cache with every configuration, one process per core."""
    import concurrent.futures as cf
    import multiprocessing as mp

    from flashrung.kernels.hopper import selfcheck   # pickled by module path, not as __main__

    jobs = {}
    for r in rows:
        if r["cfg"] is not None:
            job = (r["cfg"], r["d"], r["causal"], r["dtype"], r.get("scale", 1.0) > 0)
            jobs[json.dumps(job, sort_keys=True)] = job
    workers = max(1, min(len(jobs), (os.cpu_count() or 2), 16))
    t0 = time.time()
    print(f"pre-compiling {len(jobs)} configurations on {workers} processes ...", flush=True)
    failed = []
    pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    try:
        futures = {pool.submit(selfcheck._compile_one, job): job for job in jobs.values()}
        for fut in cf.as_completed(futures, timeout=PRECOMPILE_TIMEOUT_S):
            err = fut.result()
            if err:
                failed.append((futures[fut], err))
    except Exception as exc:  # compiling again on demand is slower, not wrong
        print(f"pre-compile stopped early ({type(exc).__name__}: {exc}); rows compile on demand", flush=True)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    print(f"pre-compiled in {time.time() - t0:.0f}s; {len(failed)} failed", flush=True)
    for job, err in failed[:5]:
        changed = {k: v for k, v in job[0].items()
                   if v != getattr(_default(job[1], job[2]), k)}
        print(f"  compile failed: d={job[1]} causal={job[2]} {job[3]} {changed or 'default'}: {err}", flush=True)


class _Lines:
    """Lines from a child's stdout with a deadline (select on the raw fd, our own buffer)."""

    def __init__(self, proc):
        self.fd = proc.stdout.fileno()
        self.pending = b""
        self.eof = False

    def next(self, deadline: float):
        """A line, ``""`` at end of output, ``None`` when ``deadline`` passes first."""
        while b"\n" not in self.pending:
            if self.eof:
                line, self.pending = self.pending, b""
                return line.decode(errors="replace")
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.time()))
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 16)
            self.pending += chunk
            self.eof = not chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode(errors="replace") + "\n"


def _run_all(rows, quick: bool, timing_only: bool, t_start: float) -> list:
    """Run every row in child workers; a row that hangs is killed and its configuration skipped."""
    results = [None] * len(rows)
    skip: set[int] = set()
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def cfg_key(row):
        return json.dumps(row["cfg"], sort_keys=True) if row["cfg"] is not None else None

    i = 0
    while i < len(rows):
        while i < len(rows) and i in skip:
            i += 1
        if i >= len(rows):
            break
        if time.time() - t_start > TOTAL_BUDGET_S:
            for j in range(i, len(rows)):
                if results[j] is None:
                    results[j] = dict(ok=False, error="skipped: time budget spent")
            break
        cmd = [sys.executable, "-m", "flashrung.kernels.hopper.selfcheck", "--worker", str(i)]
        cmd += ["--skip", ",".join(map(str, sorted(skip)))] if skip else []
        cmd += ["--quick"] if quick else []
        cmd += ["--timing-only"] if timing_only else []
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        lines = _Lines(proc)
        deadline = time.time() + ROW_TIMEOUT_S + 30          # first row pays for CUDA and torch start-up
        log = ""
        while True:
            line = lines.next(deadline)
            if line is None:                                   # the row at i hung (or is far too slow)
                proc.kill()
                proc.wait()
                results[i] = dict(ok=False, error=f"TIMEOUT after {ROW_TIMEOUT_S}s (hang?)")
                _print_progress(rows[i], results[i])
                key = cfg_key(rows[i])
                for j in range(i + 1, len(rows)):
                    if key is not None and cfg_key(rows[j]) == key:
                        skip.add(j)
                        results[j] = dict(ok=False, error="skipped: this configuration hung in an earlier row")
                i += 1
                break
            if line == "":                                     # the worker exited
                proc.wait()
                if i < len(rows) and results[i] is None and i not in skip:
                    results[i] = dict(ok=False, error=f"worker died (exit {proc.returncode}): {log[-300:]}")
                    _print_progress(rows[i], results[i])
                    i += 1
                break
            if line.startswith(MARK):
                res = json.loads(line[len(MARK):])
                j = res.pop("i")
                results[j] = res
                _print_progress(rows[j], res)
                i = j + 1
                while i < len(rows) and i in skip:
                    i += 1
                deadline = time.time() + ROW_TIMEOUT_S
                if i >= len(rows) or time.time() - t_start > TOTAL_BUDGET_S:
                    proc.kill()
                    proc.wait()
                    break
            else:
                log = (log + line)[-4000:]
    return results


# --------------------------------------------------------------------------- reporting


def _shape_str(shape) -> str:
    return "x".join(str(x) for x in shape)


def _print_progress(row, res) -> None:
    tag = "ok " if res.get("ok") else "BAD"
    if "tflops" in res:
        msg = f"{res['tflops']:7.1f} TFLOP/s {res['ms']:8.3f} ms"
    elif "out_err" in res:
        msg = f"out {res['out_err']:.2e} (lowp {res['out_lowp']:.2e}) lse {res['lse_err']:.2e} (lowp {res['lse_lowp']:.2e})"
    else:
        msg = res.get("error", "")[:120]
    print(f"[{tag}] {row['kind']:<11} d{row['d']:<3} {'causal' if row['causal'] else 'full  '} "
          f"{row['dtype']:<8} {_shape_str(row['shape']):<20} {row['variant']:<34} {msg}", flush=True)


def _table(rows, results) -> str:
    lines = []
    checks = [(r, x) for r, x in zip(rows, results) if r["kind"] in ("check", "determinism")]
    bad = [(r, x) for r, x in checks if not (x or {}).get("ok")]
    lines.append(f"== correctness: {len(checks) - len(bad)}/{len(checks)} rows pass "
                 "(err <= 2*lowp + 1e-4 on out and lse, no NaN, -inf where the oracle has it) ==")
    worst = {}
    for r, x in checks:
        if x and "out_err" in x:
            key = (r["d"], r["causal"], r["dtype"])
            ratio = x["out_err"] / (2 * x["out_lowp"] + 1e-4)
            worst[key] = max(worst.get(key, 0.0), ratio)
    for (d, causal, dtype), ratio in sorted(worst.items()):
        lines.append(f"  d{d:<3} {'causal' if causal else 'full  '} {dtype:<8} worst out_err/(2*lowp+1e-4) = {ratio:.3f}")
    errors = {}
    for r, x in bad:
        x = x or {}
        if x.get("error"):                 # the same exception in many rows is listed once
            errors.setdefault(x["error"][:160], []).append(r)
            continue
        detail = {k: x.get(k) for k in ("nan", "inf_match", "out_err", "out_lowp", "lse_err", "lse_lowp",
                                        "identical") if k in x}
        lines.append(f"  FAIL d{r['d']} {'causal' if r['causal'] else 'full'} {r['dtype']} {_shape_str(r['shape'])} "
                     f"{r['variant']} ({r['why']}): {detail}")
    for err, rs in errors.items():
        r = rs[0]
        lines.append(f"  ERROR x{len(rs)} (first: d{r['d']} {'causal' if r['causal'] else 'full'} {r['dtype']} "
                     f"{_shape_str(r['shape'])} {r['variant']}): {err}")
    lines.append("== timing: bf16, TFLOP/s = 4*B*H*S^2*D / t (causal /2), do_bench median ==")
    lines.append(f"  {'shape (B,S,H,D)':<24} {'variant':<36} {'ms':>8} {'TFLOP/s':>8} {'vs default':>10}")
    base = {}
    for r, x in zip(rows, results):
        if r["kind"] == "time" and r["variant"] == "default" and x and "ms" in x:
            base[(tuple(r["shape"]), r["d"], r["causal"])] = x["ms"]
    for r, x in zip(rows, results):
        if not r["kind"].startswith("time"):
            continue
        b, s, _, h, _ = r["shape"]
        shape = f"{b},{s},{h},{r['d']}{' causal' if r['causal'] else ''}"
        x = x or {}
        if "ms" in x:
            ref = base.get((tuple(r["shape"]), r["d"], r["causal"]))
            rel = f"{100.0 * (ref / x['ms'] - 1.0):+9.1f}%" if ref else ""
            lines.append(f"  {shape:<24} {r['variant']:<36} {x['ms']:8.3f} {x['tflops']:8.1f} {rel:>10}")
        else:
            lines.append(f"  {shape:<24} {r['variant']:<36} {'-':>8} {'-':>8}  {x.get('error', '')[:60]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="bf16 only, fewer switch rows, no timing ablations")
    mode.add_argument("--timing-only", action="store_true",
                      help="no correctness battery: every timed configuration gets one sanity check, then its timing")
    ap.add_argument("--json", default=None, help="write every row and result here "
                    "(default: $OUT/hopper_selfcheck.json when $OUT is set)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--skip", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no-precompile", action="store_true", help="compile each configuration on first use")
    args = ap.parse_args(argv)
    if args.worker is not None:
        _worker(args.worker, args.quick, args.timing_only, {int(x) for x in args.skip.split(",") if x})
        return 0
    t_start = time.time()
    rows = build_rows(args.quick, args.timing_only)
    print(f"hopper.fwd selfcheck: {len(rows)} rows", flush=True)
    if not args.no_precompile:
        _precompile(rows)
    results = _run_all(rows, args.quick, args.timing_only, t_start)
    path = args.json or (os.path.join(os.environ["OUT"], "hopper_selfcheck.json") if os.environ.get("OUT") else None)
    if path:
        jsonfile.write([dict(row=r, result=x) for r, x in zip(rows, results)], path)
    print(f"\n(total {time.time() - t_start:.0f}s)")
    print(_table(rows, results))
    return 0 if all(x and x.get("ok") for r, x in zip(rows, results) if r["kind"] != "time_cudnn") else 1


if __name__ == "__main__":
    sys.exit(main())
