"""GPU self-check of the ladder: correctness of every rung, then its speed at the seed's two
frozen configurations, against the mma.sync GEMM ceiling measured in the same run.

    python -m flashrung.kernels.ladder.selfcheck [--json PATH] [--skip-timing] [--only v4,v5]

Self-contained: its own fp32 reference and the frozen gate rule
``max|kernel - ref| <= 2 * max|same-dtype ref - ref| + 1e-4`` on out and LSE (plus exact -inf
positions of the LSE). Timing is ``triton.testing.do_bench`` median (CUDA events, L2 not
flushed between repetitions), one process, sequential — evidence level "timing, unpaired"; the
paired margins come from ``flashrung compare``. FLOPs: ``4*B*H*Sq*Sk*D``, halved for causal
(the FA papers' convention). Each row's failure is caught and printed; the table comes last.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import time
import traceback

import torch
from flashrung import jsonfile

FROZEN = {
    # name: (batch, heads, seqlen, head_dim, dtype, causal) — seed 000's two frozen configs
    "A": (2, 16, 2048, 128, torch.float16, False),
    "B": (1, 16, 32768, 128, torch.bfloat16, True),
}
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal): small, odd, masked.
CHECK_SHAPES = [
    (1, 17, 17, 2, 2, 64, torch.float16, False),
    (2, 129, 129, 4, 2, 128, torch.bfloat16, True),
    (1, 300, 77, 4, 1, 128, torch.float16, True),    # Sq > Sk: the first rows see no key
    (1, 77, 1000, 4, 4, 64, torch.bfloat16, False),
]
GEMM_SIZE = 8192


# --------------------------------------------------------------------------------------------
# Reference and gate
# --------------------------------------------------------------------------------------------

def reference(q, k, v, causal: bool, scale: float, low_precision: bool = False):
    """Attention in fp32 (``low_precision``: scores, P and PV rounded to the input dtype, the
    softmax in fp32) -> out (B, Sq, Hq, D) fp32, lse (B, Hq, Sq) fp32 natural log."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    dt = q.dtype if low_precision else torch.float32
    qh = q.to(dt).transpose(1, 2)                                        # (b, h, s_q, d)
    kh = k.to(dt).repeat_interleave(Hq // Hkv, dim=2).transpose(1, 2)    # (b, h, s_k, d)
    vh = v.to(dt).repeat_interleave(Hq // Hkv, dim=2).transpose(1, 2)
    s = (qh @ kh.transpose(-1, -2)).float() * scale
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(nan=0.0)   # rows with lse = -inf: p = 0
    out = (p.to(dt) @ vh).float()
    return out.transpose(1, 2), lse


def gate(out, lse, q, k, v, causal: bool, scale: float) -> tuple[bool, float, str]:
    ref_out, ref_lse = reference(q, k, v, causal, scale)
    low_out, low_lse = reference(q, k, v, causal, scale, low_precision=True)
    if not torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)):
        return False, math.inf, "lse -inf positions differ"
    finite = torch.isfinite(ref_lse)
    worst, notes = 0.0, []
    for name, got, ref, low in (("out", out.float(), ref_out, low_out),
                                ("lse", lse[finite], ref_lse[finite], low_lse[finite])):
        if got.numel() == 0:
            continue
        err = (got - ref).abs().max().item()
        bound = 2 * (low - ref).abs().max().item() + 1e-4
        if not math.isfinite(err):
            return False, math.inf, f"{name} not finite"
        worst = max(worst, err / bound)
        notes.append(f"{name} {err:.2e}/{bound:.2e}")
    return worst <= 1.0, worst, ", ".join(notes)


# --------------------------------------------------------------------------------------------
# What is checked and timed
# --------------------------------------------------------------------------------------------

def forwards(only: set[str] | None = None):
    """(label, forward) for every rung and the measured arms; ``only`` keeps the rungs named
    ("v3" keeps ladder.v3 and its arm)."""
    from flashrung.kernels.ladder import RUNGS, v3, v7

    out = [(r.name, r.load().forward) for r in RUNGS]
    out.append(("ladder.v3[kv2]", v3.forward_double_buffer))
    for name, cfg in (*v7.SWITCH_OFF.items(), ("regs168", v7.THREE_CTAS_PER_SM)):
        out.append((f"ladder.v7[{name}]", functools.partial(v7.forward, config=cfg)))
    if only:
        out = [(label, fn) for label, fn in out if label.split("[")[0].split(".")[1] in only]
    return out


@dataclasses.dataclass
class Row:
    section: str
    config: str
    kernel: str
    ms: float | None = None
    tflops: float | None = None
    status: str = ""
    extra: dict = dataclasses.field(default_factory=dict)


def _inputs(b, sq, sk, hq, hkv, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def check_correctness(rows: list[Row], only=None) -> None:
    for label, fwd in forwards(only):
        shapes = CHECK_SHAPES if "[" not in label else CHECK_SHAPES[2:3]
        for shape in shapes:
            b, sq, sk, hq, hkv, d, dtype, causal = shape
            desc = f"B{b} Sq{sq} Sk{sk} H{hq}/{hkv} d{d} {str(dtype)[6:]}{' causal' if causal else ''}"
            row = Row("gate", desc, label)
            try:
                q, k, v = _inputs(b, sq, sk, hq, hkv, d, dtype)
                scale = 1.0 / math.sqrt(d)
                # NaN-poisoned outputs: a row the kernel forgets to write fails instead of
                # inheriting a previous rung's answer from the allocator.
                out = torch.full_like(q, float("nan"))
                lse = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
                out, lse = fwd(q, k, v, causal, scale, out=out, lse=lse)
                torch.cuda.synchronize()
                ok, ratio, note = gate(out, lse, q, k, v, causal, scale)
                row.status = f"{'PASS' if ok else 'FAIL'} ratio {ratio:.3f} ({note})"
            except Exception as exc:  # a failing row is reported, the run goes on
                row.status = f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            rows.append(row)
            print(f"[gate] {label:26s} {desc:38s} {row.status}", flush=True)


def check_rescale_skip_bitwise(rows: list[Row]) -> None:
    from flashrung.kernels.ladder import v7

    row = Row("gate", "B2 S1000 H4 d128 bf16, causal and not", "v7 rescale_skip on == off (bitwise)")
    try:
        q, k, v = _inputs(2, 1000, 1000, 4, 4, 128, torch.bfloat16, seed=1)
        off = dataclasses.replace(v7.CONFIG, rescale_skip=False)
        same = True
        for causal in (False, True):
            a = v7.forward(q, k, v, causal, 0.088)
            b = v7.forward(q, k, v, causal, 0.088, off)
            same &= torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        row.status = "PASS" if same else "FAIL (outputs differ)"
    except Exception as exc:
        row.status = f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    rows.append(row)
    print(f"[gate] {row.kernel}: {row.status}", flush=True)


def measure_ceilings(rows: list[Row]) -> dict:
    """Best mma_v2 GEMM tile and cuBLAS, per dtype, at 8192^3."""
    import triton.testing
    from flashrung.kernels.ladder.ceiling import CEILING_TILES, mma_v2_gemm

    best = {}
    n = GEMM_SIZE
    flops = 2.0 * n ** 3
    for dtype in (torch.bfloat16, torch.float16):
        dname = str(dtype)[6:]
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        ref = None
        for tile in CEILING_TILES:
            row = Row("ceiling", f"gemm {n}^3 {dname}", f"mma_v2 {tile.label()}")
            try:
                c = mma_v2_gemm(a, b, tile)
                if ref is None:
                    ref = torch.mm(a, b.t()).float()
                err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
                if not err < 1e-2:
                    raise RuntimeError(f"GEMM result wrong: max rel err {err:.2e}")
                ms = triton.testing.do_bench(lambda a=a, b=b, tile=tile: mma_v2_gemm(a, b, tile),
                                             warmup=25, rep=100, return_mode="median")
                row.ms, row.tflops, row.status = ms, flops / ms * 1e-9, f"ok (rel err {err:.1e})"
                if row.tflops > best.get(("mma_v2", dtype), 0.0):
                    best[("mma_v2", dtype)] = row.tflops
            except Exception as exc:
                row.status = f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            rows.append(row)
            print(f"[ceiling] {row.kernel:30s} {dname:8s} {row.tflops or 0:8.1f} TFLOP/s {row.status}", flush=True)
        row = Row("ceiling", f"gemm {n}^3 {dname}", "cuBLAS torch.mm")
        try:
            ms = triton.testing.do_bench(lambda a=a, b=b: torch.mm(a, b.t()), warmup=25, rep=100,
                                         return_mode="median")
            row.ms, row.tflops, row.status = ms, flops / ms * 1e-9, "ok"
            best[("cublas", dtype)] = row.tflops
        except Exception as exc:
            row.status = f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        rows.append(row)
        print(f"[ceiling] {row.kernel:30s} {dname:8s} {row.tflops or 0:8.1f} TFLOP/s {row.status}", flush=True)
        del a, b, ref
        torch.cuda.empty_cache()
    return best


def measure_rungs(rows: list[Row], ceilings: dict, only=None) -> None:
    import triton.testing

    for cname, (b, h, s, d, dtype, causal) in FROZEN.items():
        q, k, v = _inputs(b, s, s, h, h, d, dtype)
        flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
        desc = f"{cname}: B{b} H{h} S{s} d{d} {str(dtype)[6:]}{' causal' if causal else ''}"
        for label, fwd in forwards(only):
            if label == "ladder.v0" and cname != "A":
                continue  # v0 at S=32768 takes minutes; the seed timed it at its own config only
            if label.startswith("ladder.v7[") and cname != "B":
                continue  # the keeps are measured at the seed's ladder config
            row = Row("timing", desc, label)
            try:
                fn = lambda q=q, k=k, v=v, fwd=fwd: fwd(q, k, v, causal, 1.0 / math.sqrt(d))  # noqa: E731
                fn()
                torch.cuda.synchronize()
                rep = 60 if label == "ladder.v0" else 100
                ms = triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")
                row.ms, row.tflops = ms, flops / ms * 1e-9
                mma = ceilings.get(("mma_v2", dtype))
                cub = ceilings.get(("cublas", dtype))
                row.extra = {"pct_mma_v2": 100 * row.tflops / mma if mma else None,
                             "pct_cublas": 100 * row.tflops / cub if cub else None}
                row.status = "ok"
            except Exception as exc:
                row.status = f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            rows.append(row)
            print(f"[time] {desc:36s} {label:26s} {row.ms or 0:9.3f} ms {row.tflops or 0:7.1f} TFLOP/s "
                  f"{row.status}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


def table(rows: list[Row]) -> str:
    lines = ["", "== gate ==", ]
    for r in rows:
        if r.section == "gate":
            lines.append(f"  {r.kernel:28s} {r.config:40s} {r.status}")
    lines += ["", "== ceilings (do_bench median, GEMM 2*n^3 FLOPs) =="]
    for r in rows:
        if r.section == "ceiling":
            tf = f"{r.tflops:8.1f}" if r.tflops else "       -"
            lines.append(f"  {r.config:18s} {r.kernel:30s} {tf} TFLOP/s  {r.status}")
    lines += ["", "== ladder (do_bench median; causal FLOPs halved) ==",
              f"  {'config':36s} {'kernel':26s} {'ms':>9s} {'TFLOP/s':>8s} {'%mma_v2':>8s} {'%cuBLAS':>8s}"]
    for r in rows:
        if r.section == "timing":
            if r.tflops is None:
                lines.append(f"  {r.config:36s} {r.kernel:26s} {r.status}")
                continue
            pm, pc = r.extra.get("pct_mma_v2"), r.extra.get("pct_cublas")
            lines.append(f"  {r.config:36s} {r.kernel:26s} {r.ms:9.3f} {r.tflops:8.1f} "
                         f"{(f'{pm:7.1f}%' if pm else '       -'):>8s} {(f'{pc:7.1f}%' if pc else '       -'):>8s}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrung.kernels.ladder.selfcheck")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--skip-timing", action="store_true", help="correctness only")
    parser.add_argument("--only", help="comma-separated rungs to run, e.g. v4,v5,v7 (default all)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("selfcheck needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    import triton

    start = time.time()
    print(f"device {torch.cuda.get_device_name()} cc {torch.cuda.get_device_capability()} "
          f"torch {torch.__version__} triton {triton.__version__}", flush=True)
    only = set(args.only.split(",")) if args.only else None
    rows: list[Row] = []
    check_correctness(rows, only)
    if only is None or "v7" in only:
        check_rescale_skip_bitwise(rows)
    if not args.skip_timing:
        ceilings = measure_ceilings(rows)
        measure_rungs(rows, ceilings, only)
    print(table(rows))
    print(f"\nselfcheck took {time.time() - start:.0f} s")
    if args.json:
        jsonfile.write([dataclasses.asdict(r) for r in rows], args.json)
    failed = [r for r in rows if r.section == "gate" and not r.status.startswith("PASS")]
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(3)
