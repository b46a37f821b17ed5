"""Probes for ``compute-sanitizer`` on warp-specialized Gluon kernels.

``racecheck`` reports hazards on ``hopper.fwd`` between a read at the kernel's ``def`` line and
writes at its ``gl.warp_specialize`` line: shared-memory bytes that hold Triton's own dispatch
state (each worker warp reads its partition id with ``LDS.U8`` after a CTA-wide ``BAR.SYNC 1``;
the default partition writes the ids before that barrier and the exit code after the join
barrier). These kernels tell whether the report belongs to ``hopper.fwd`` or to the dispatch:

* ``minimal`` — a 4-warp default partition and one 1-warp worker, each writing its half of a
  global vector; no shared memory of its own, no partition-local barrier.
* ``hopper-shaped`` — the partition shape of ``hopper.fwd`` at d64 (a 4-warp default, two 4-warp
  workers, one 1-warp worker padded to a warpgroup, ``setmaxnreg`` budgets 160/160/24), each
  partition with its own shared buffer and a barrier of its own (a store, then a load by other
  threads); no mbarrier, TMA or wgmma.
* ``hopper-fwd`` — ``hopper.fwd`` itself at B1 S300 Hq2 Hkv1 d64 bf16, non-causal then causal.
* ``hopper-fwd-schedules`` — ``hopper.fwd`` at B1 S300 Hq2 Hkv1 bf16 under every distinct default
  configuration (:func:`default_schedules`: each head dim and mask at every length from 128 to 64k,
  the last key tile whole or partial, the frozen row max's step and the online one — the inline-PTX
  arrivals and named turns, the split tail and its merge, PV's gated wait, one or two Q buffers,
  staggered sweeps, the balanced lists, K/V multicast across clusters of two CTAs, the frozen step's
  guard and recompute, each head dim's tiles), each forced onto the small problem so the
  sanitizer's cost stays small. ``--shard I/N`` runs every N-th of them from the I-th (1-based), so
  that N processes under the sanitizer share the work; ``--list`` prints them without a GPU.
* ``hopper-fwd-features`` — the same for the configurations of calls with a feature the dense
  defaults do not have (:func:`feature_schedules`: packed sequences, sliding windows, softcap,
  MLA's 192/128 head dims, dense and packed), each forced onto a small call with that feature:
  three packed sequences of 300, 129 and 17 rows; S300 under a window narrowed to cut there (the
  configuration, not the width, is what is probed); S300 capped at 30; MLA at S300 and packed.

Run under the sanitizer on a GPU, e.g.
``compute-sanitizer --tool racecheck python -m flashrung.evidence.ws_probe hopper-shaped``.
Each probe checks its own output and exits non-zero if it is wrong.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

PROBES = ("minimal", "hopper-shaped", "hopper-fwd", "hopper-fwd-schedules", "hopper-fwd-features")
SCHEDULE_PROBES = ("hopper-fwd-schedules", "hopper-fwd-features")
# every default configuration a call of hopper.fwd can get (select_config without overrides) is
# the default of one (head dim, mask, length, key tail, step) on this grid: the lengths every
# SCHEDULE_LENGTH_STEP tokens (the rules' thresholds are multiples of it), the last key tile whole or
# one key short. tests/test_ws_probe.py checks that random problems — batch, GQA, Sq != Sk, both
# dtypes — land on one of them, so a new default cannot escape the sanitizers unprobed
SCHEDULE_HEAD_DIMS = (64, 128, 256)
SCHEDULE_LENGTH_STEP = 128
SCHEDULE_MAX_LENGTH = 65536


def default_schedules() -> tuple[tuple[int, bool, int, bool, bool], ...]:
    """``(head_dim, causal, seqlen, key_tail, frozen_step)`` of each distinct default
    configuration of ``hopper.fwd``, the first reached in the order head dim, mask, length, key
    tail, step — so each is forced from its shortest length. The probe runs them on bf16 inputs; an
    fp16 call gets the same configurations (its frozen step raises the online row max by the
    configuration's margin: a number, not a synchronisation). CPU only, about 0.1 s."""
    from flashrung.kernels.hopper import fwd

    found: dict = {}
    for head_dim in SCHEDULE_HEAD_DIMS:
        for causal in (False, True):
            for seqlen in range(SCHEDULE_LENGTH_STEP, SCHEDULE_MAX_LENGTH + 1, SCHEDULE_LENGTH_STEP):
                for key_tail in (False, True):
                    for frozen_step in (False, True):
                        cfg = fwd.default_config(head_dim, causal, seqlen, key_tail=key_tail, frozen_step=frozen_step)
                        found.setdefault((head_dim, causal, cfg), (head_dim, causal, seqlen, key_tail, frozen_step))
    return tuple(found.values())


# the features whose calls select configurations of their own (config._packed, _windowed, _capped,
# MLA's split head dims), each enumerated as default_schedules is, on a suite-sized call; window
# widths on a grid that reaches every width rule (narrow windows' tile, masks where the window cuts)
FEATURE_KINDS = ("packed", "window", "softcap", "mla")
FEATURE_WINDOW_LEFTS = (0, 64, 128, 256, 512, 1024, 2048, 3584, 4096, 8192, 16384)
FEATURE_SOFTCAP = 30.0
FEATURE_LENGTH_STEP = 512
MLA_HEAD_DIMS = (192, 128)
PACKED_PROBE_LENGTHS = (300, 129, 17)      # a whole tile and partial ones, a sequence shorter than a tile
WINDOW_PROBE_WIDTHS = (96, 64)              # the most of left / right a window keeps at S300, so it cuts


def _feature_variants(kind: str, causal: bool) -> list[tuple[bool, tuple[int, int], float]]:
    """``(packed, window_size, softcap)`` of the calls of ``kind`` enumerated at each length."""
    if kind == "packed":
        return [(True, (-1, -1), 0.0)]
    if kind == "softcap":
        return [(False, (-1, -1), FEATURE_SOFTCAP)]
    if kind == "mla":
        return [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0)]
    return [(False, (left, right), 0.0) for left in FEATURE_WINDOW_LEFTS
            for right in ((-1, 0) if causal else (-1, 0, left))]


def _suite_problem(head_dim: int, head_dim_v: int, causal: bool, seqlen: int, packed: bool,
                   window: tuple[int, int], softcap: float):
    """A suite-sized call (``fwd.default_config``'s tokens and heads) with these features."""
    from flashrung.dispatch import Problem
    from flashrung.kernels.hopper import fwd

    return Problem(batch=max(1, fwd.DEFAULT_CONFIG_TOKENS // seqlen), seqlen_q=seqlen, seqlen_k=seqlen,
                   heads_q=fwd.DEFAULT_CONFIG_HEADS, heads_kv=fwd.DEFAULT_CONFIG_HEADS, head_dim=head_dim,
                   head_dim_v=head_dim_v, dtype=torch.bfloat16, causal=causal, device_type="cuda",
                   capability=(9, 0), window_size=window, softcap=softcap, varlen=packed)


def feature_schedules() -> tuple:
    """``(kind, head_dim, head_dim_v, causal, seqlen, packed, window_size, softcap, frozen_step)`` of
    each distinct configuration a call with one of :data:`FEATURE_KINDS` selects (head dims 64 /
    128 / 256, MLA's 192 / 128; lengths every :data:`FEATURE_LENGTH_STEP` to 64k; both steps),
    the first reached. CPU only, under a second."""
    from flashrung.kernels.hopper import fwd

    found: dict = {}
    for kind in FEATURE_KINDS:
        dims = (MLA_HEAD_DIMS,) if kind == "mla" else tuple((d, d) for d in SCHEDULE_HEAD_DIMS)
        for head_dim, head_dim_v in dims:
            for causal in (False, True):
                for seqlen in range(FEATURE_LENGTH_STEP, SCHEDULE_MAX_LENGTH + 1, FEATURE_LENGTH_STEP):
                    for packed, window, softcap in _feature_variants(kind, causal):
                        problem = _suite_problem(head_dim, head_dim_v, causal, seqlen, packed, window, softcap)
                        for frozen_step in (False, True):
                            cfg = fwd.select_config(problem, frozen_step=frozen_step)
                            key = (kind, head_dim, head_dim_v, causal, packed, window != (-1, -1), softcap > 0, cfg)
                            found.setdefault(key, (kind, head_dim, head_dim_v, causal, seqlen, packed, window,
                                                   softcap, frozen_step))
    return tuple(found.values())


def feature_probe_call(schedule) -> dict:
    """The small call a feature schedule is forced onto: ``{"lengths", "window_size", "softcap"}``
    (``lengths``: the packed sequences' rows, or the one dense length)."""
    _, _, _, _, _, packed, window, softcap, _ = schedule
    if window != (-1, -1):
        left, right = window
        window = (min(left, WINDOW_PROBE_WIDTHS[0]), right if right <= 0 else min(right, WINDOW_PROBE_WIDTHS[1]))
    return {"lengths": PACKED_PROBE_LENGTHS if packed else (PROBE_SEQLEN,), "window_size": window,
            "softcap": softcap}


def schedule_config(schedule, dtype=None):
    """The configuration a schedule of :func:`default_schedules` or :func:`feature_schedules` names
    (``dtype``: bf16 unless given; a default's fp16 configuration carries fp16's margin)."""
    from flashrung.kernels.hopper import fwd

    dtype = torch.bfloat16 if dtype is None else dtype
    if len(schedule) == 5:
        head_dim, causal, seqlen, key_tail, frozen_step = schedule
        return fwd.default_config(head_dim, causal, seqlen, key_tail=key_tail, dtype=dtype, frozen_step=frozen_step)
    _, head_dim, head_dim_v, causal, seqlen, packed, window, softcap, frozen_step = schedule
    problem = dataclasses.replace(_suite_problem(head_dim, head_dim_v, causal, seqlen, packed, window, softcap),
                                  dtype=dtype)
    return fwd.select_config(problem, frozen_step=frozen_step)


def schedules_of(probe: str) -> tuple:
    """The schedules a schedule probe forces: :func:`default_schedules` or :func:`feature_schedules`."""
    return default_schedules() if probe == "hopper-fwd-schedules" else feature_schedules()


def describe(probe: str, schedule) -> str:
    """One line naming a schedule of ``probe`` (``--list``, the probe's output)."""
    if probe == "hopper-fwd-schedules":
        head_dim, causal, seqlen, key_tail, frozen_step = schedule
        return f"{_schedule_name(head_dim, causal, seqlen, key_tail)}, {'frozen' if frozen_step else 'online'} step"
    kind, head_dim, head_dim_v, causal, seqlen, packed, window, softcap, frozen_step = schedule
    dims = f"d{head_dim}" if head_dim == head_dim_v else f"d{head_dim}/{head_dim_v}"
    what = ", ".join(filter(None, ("packed" if packed else "", f"window {window}" if window != (-1, -1) else "",
                                   f"softcap {softcap:g}" if softcap else "")))
    return (f"{kind}: {dims} {'causal' if causal else 'non-causal'} S{seqlen}{', ' + what if what else ''}, "
            f"{'frozen' if frozen_step else 'online'} step")


def shard(schedules: tuple, spec: str | None) -> tuple:
    """Every N-th of ``schedules`` from the I-th for ``spec`` = ``"I/N"`` (1 <= I <= N), all for None."""
    if spec is None:
        return schedules
    try:
        index, count = (int(part) for part in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be I/N with integers 1 <= I <= N, got {spec!r}") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard must be I/N with integers 1 <= I <= N, got {spec!r}")
    return schedules[index - 1::count]


PROBE_SEQLEN = 300                             # partial query and key tiles at every tile shape
PROBE_MAX_ERR = 2e-2                           # bf16 outputs against the fp32 reference
VECTOR = 128                                   # elements each partition writes
HOPPER_SHAPED_WORKERS = ((4, 160), (4, 160), (1, 24))   # (warps, registers) as hopper.fwd at d64
DEFAULT_WARPS = 4


@gluon.jit
def _write_half(ptr, BASE: gl.constexpr, N: gl.constexpr, WARPS: gl.constexpr):
    offs = gl.arange(0, N, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    gl.store(ptr + BASE + offs, offs.to(gl.float32) + BASE)


@gluon.jit
def minimal_kernel(ptr, N: gl.constexpr):
    gl.warp_specialize([(_write_half, (ptr, 0, N, 4)), (_write_half, (ptr, N, N, 1))], [1], [24])


@gluon.jit
def _through_shared(ptr, buf, BASE: gl.constexpr, N: gl.constexpr, WARPS: gl.constexpr):
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    offs = gl.arange(0, N, layout=lay)
    buf.store(offs.to(gl.float32) + BASE)
    # the load reads what other threads stored: the partition's own barrier sits between them
    gl.store(ptr + BASE + offs, buf.load(lay))


@gluon.jit
def hopper_shaped_kernel(ptr, N: gl.constexpr):
    lay: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    b0 = gl.allocate_shared_memory(gl.float32, [N], lay)
    b1 = gl.allocate_shared_memory(gl.float32, [N], lay)
    b2 = gl.allocate_shared_memory(gl.float32, [N], lay)
    b3 = gl.allocate_shared_memory(gl.float32, [N], lay)
    gl.warp_specialize([
        (_through_shared, (ptr, b0, 0, N, 4)),
        (_through_shared, (ptr, b1, N, N, 4)),
        (_through_shared, (ptr, b2, 2 * N, N, 4)),
        (_through_shared, (ptr, b3, 3 * N, N, 1)),
    ], [4, 4, 1], [160, 160, 24])


def census_specs():
    """Both probe kernels as census specs (compiled without a GPU by the tests)."""
    from flashrung.evidence.census import CensusSpec

    return [CensusSpec(kernel=f"ws_probe.{name}", config={"N": VECTOR}, fn=fn, signature={"ptr": "*fp32"},
                       constexprs={"N": VECTOR}, num_warps=DEFAULT_WARPS, gluon=True, arches=("sm_90a",))
            for name, fn in (("minimal", minimal_kernel), ("hopper-shaped", hopper_shaped_kernel))]


def _max_err(out, q, k, v, causal: bool, scale: float) -> float:
    """Largest |out - reference| for ``(B, S, H, D)`` inputs, the reference in fp32 on the inputs'
    device with K/V heads repeated for GQA."""
    group = q.shape[2] // k.shape[2]
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).repeat_interleave(group, 1).float(),
        v.transpose(1, 2).repeat_interleave(group, 1).float(), is_causal=causal, scale=scale).transpose(1, 2)
    return (out.float().to(ref.device) - ref).abs().max().item()


def _schedule_name(head_dim: int, causal: bool, seqlen: int, key_tail: bool) -> str:
    keys = f"S{seqlen}" + (f"/Sk{seqlen - 1}" if key_tail else "")
    return f"d{head_dim} {'causal' if causal else 'non-causal'} {keys}"


def _schedule_outputs_right(schedules: tuple) -> bool:
    """``hopper.fwd`` under each schedule at B1 S300 Hq2 Hkv1 bf16, against an fp32 reference
    computed on the CPU (so the sanitizer sees only hopper.fwd's launches); prints one line each."""
    from flashrung.kernels.hopper import fwd

    gen = torch.Generator(device="cpu").manual_seed(0)
    ok = True
    for schedule in schedules:
        head_dim, causal, seqlen, key_tail, _ = schedule
        cfg = schedule_config(schedule)
        q = torch.randn(1, PROBE_SEQLEN, 2, head_dim, generator=gen).to(torch.bfloat16)
        k, v = (torch.randn(1, PROBE_SEQLEN, 1, head_dim, generator=gen).to(torch.bfloat16) for _ in range(2))
        scale = head_dim ** -0.5
        out, _ = fwd.forward(q.cuda(), k.cuda(), v.cuda(), causal, scale, config=cfg)
        torch.cuda.synchronize()
        err = _max_err(out, q, k, v, causal, scale)
        right = err < PROBE_MAX_ERR
        ok &= right
        print(f"{_schedule_name(head_dim, causal, seqlen, key_tail)}'s schedule ({_config_line(cfg)}): "
              f"max |err| {err:.2e} {'ok' if right else 'WRONG'}", flush=True)
    return ok


def _config_line(cfg) -> str:
    on = [name for name in ("named_turns", "asm_arrivals", "split_tail", "gate_pv_wait", "balanced", "stagger_kv",
                            "kv_multicast", "producer_unsynced", "relay_release", "cross_head_pairs", "handout_table",
                            "freeze_row_max")
          if getattr(cfg, name)]
    return f"{cfg.block_m}x{cfg.block_n}, q_stages={cfg.num_q_stages}{', ' if on else ''}{', '.join(on)}"


def _feature_outputs_right(schedules: tuple) -> bool:
    """``hopper.fwd`` under each feature schedule, forced onto its small call (bf16, Hq2 Hkv1),
    against the fp64 oracle on the CPU, sequence by sequence; prints one line each."""
    import itertools

    from flashrung import reference
    from flashrung.kernels.hopper import fwd

    gen = torch.Generator(device="cpu").manual_seed(0)
    ok = True
    for schedule in schedules:
        _, head_dim, head_dim_v, causal, _, packed, _, _, _ = schedule
        cfg = schedule_config(schedule)
        call = feature_probe_call(schedule)
        lengths = call["lengths"]
        bounds = [0, *itertools.accumulate(lengths)]
        rows = bounds[-1]
        q = torch.randn(1, rows, 2, head_dim, generator=gen).to(torch.bfloat16)
        k = torch.randn(1, rows, 1, head_dim, generator=gen).to(torch.bfloat16)
        v = torch.randn(1, rows, 1, head_dim_v, generator=gen).to(torch.bfloat16)
        scale = head_dim ** -0.5
        kwargs = {"window_size": call["window_size"], "softcap": call["softcap"]}
        if packed:
            offsets = torch.tensor(bounds, dtype=torch.int32, device="cuda")
            kwargs.update(cu_seqlens=(offsets, offsets), max_seqlens=(max(lengths), max(lengths)))
        out, _ = fwd.forward(q.cuda(), k.cuda(), v.cuda(), causal, scale, config=cfg, **kwargs)
        torch.cuda.synchronize()
        ref = torch.cat([reference.oracle(q[:, a:b], k[:, a:b], v[:, a:b], causal, scale, call["window_size"],
                                          call["softcap"])[0] for a, b in zip(bounds, bounds[1:])], dim=1)
        err = (out.float().cpu() - ref.float()).abs().max().item()
        right = err < PROBE_MAX_ERR
        ok &= right
        print(f"{describe('hopper-fwd-features', schedule)} on {call}'s schedule ({_config_line(cfg)}): "
              f"max |err| {err:.2e} {'ok' if right else 'WRONG'}", flush=True)
    return ok


def run(probe: str, schedule_shard: str | None = None) -> bool:
    """Launch ``probe`` on the current GPU; True if its output is right. ``schedule_shard``: a
    schedule probe's share (:func:`shard`)."""
    if probe in SCHEDULE_PROBES:
        outputs_right = _schedule_outputs_right if probe == "hopper-fwd-schedules" else _feature_outputs_right
        return outputs_right(shard(schedules_of(probe), schedule_shard))
    if probe == "hopper-fwd":
        from flashrung.kernels.hopper import fwd

        gen = torch.Generator(device="cuda").manual_seed(0)
        ok = True
        for causal in (False, True):
            q = torch.randn(1, 300, 2, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
            k = torch.randn(1, 300, 1, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
            v = torch.randn(1, 300, 1, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
            out, _ = fwd.forward(q, k, v, causal, 0.125)
            ok &= _max_err(out, q, k, v, causal, 0.125) < PROBE_MAX_ERR
        return ok
    parts = 2 if probe == "minimal" else 4
    out = torch.full((parts * VECTOR,), float("nan"), device="cuda")
    kernel = minimal_kernel if probe == "minimal" else hopper_shaped_kernel
    kernel[(2,)](out, VECTOR, num_warps=DEFAULT_WARPS)
    torch.cuda.synchronize()
    return torch.equal(out, torch.arange(parts * VECTOR, device="cuda", dtype=torch.float32))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=PROBES)
    parser.add_argument("--shard", metavar="I/N", default=None,
                        help="a schedule probe: every N-th schedule from the I-th (1-based), for N processes")
    parser.add_argument("--list", action="store_true",
                        help="a schedule probe: print the schedules (of this shard) and exit; no GPU needed")
    args = parser.parse_args(argv)
    if (args.shard is not None or args.list) and args.probe not in SCHEDULE_PROBES:
        parser.error(f"--shard and --list belong to the schedule probes ({', '.join(SCHEDULE_PROBES)})")
    try:
        schedules = shard(schedules_of(args.probe), args.shard) if args.probe in SCHEDULE_PROBES else ()
    except ValueError as exc:
        parser.error(str(exc))
    if args.list:
        for schedule in schedules:
            print(describe(args.probe, schedule))
        return 0
    if not torch.cuda.is_available():
        print("ws_probe needs a CUDA GPU (sm_90)", file=sys.stderr)
        return 2
    ok = run(args.probe, args.shard)
    what = args.probe + (f" (shard {args.shard}, {len(schedules)} schedules)" if args.shard else "")
    print(f"ws_probe {what}: {'output correct' if ok else 'OUTPUT WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
