"""``flashrung defaults``: which schedule ``hopper.fwd`` runs for a problem, by head dim, mask and length.

    flashrung defaults                                   every head dim and mask, one row per length range
    flashrung defaults --headdim 128 --causal            one head dim and mask
    flashrung defaults --headdim 64 --seqlen 8192        the schedule of one problem (--json: every field)
    flashrung defaults --headdim 64 --seqlen 8192 --set kv_multicast=false
                                                         what impl="hopper.fwd@kv_multicast=false" builds there
    flashrung defaults --markdown                        the table as docs/hopper.md carries it
    flashrung defaults --json                            the ranges and their configurations

``config.select_config`` reads a problem's head dim, mask and ``max(Sq, Sk)``; its work (batch,
heads) only for ``freeze_row_max`` and what it brings (``config.FREEZE_ROW_MAX_BRINGS``, and d64
causal S2048's tile: ``config.FREEZE_ROW_MAX_SHORT_CAUSAL_MAX_SEQLEN``; the ranges here are a
suite-sized call's, and a call under ``config.FREEZE_ROW_MAX_MIN_FLOP`` runs the online step's rows;
fp16 and bf16 select alike, fp16's build raising its online row max by ``fp16_row_max_margin``) —
so the defaults are constant between the lengths its rules name (the module's ``*_SEQLEN``
tables). This module lists those lengths, evaluates the selection once per range and
merges neighbours that select the same configuration: the ranges are exact at any length, not
sampled (tests/test_hopper_defaults.py checks them against every length up to 70,000).

Two rules also read whether the keys fill their last K/V tile, and the table reads the common
case, Sk a multiple of 128: a non-causal launch with a key tail masks its first tile always (decided
per launch, ``fwd._first_mask_on_need``), and d256 non-causal takes the inline arrivals only with
whole 64-key tiles (``config.ASM_ARRIVALS_WHOLE_KEY_TILES``, in the selection itself).
"""
from __future__ import annotations

import dataclasses
import json
import sys

import torch

from flashrung.kernels.hopper import config as C

# the config's rules write "no upper end" and "never" as 1 << 62: ranges end below it
NO_BOUND = 1 << 62
MAX_SEQLEN = NO_BOUND - 1
# a multiple of every head dim's K/V tile: the table's problems have keys in whole tiles
WHOLE_KEY_TILE = 128

# the fields shown in the tile and grid columns; every other field that differs from
# HopperFwdConfig()'s value is listed under the switches
_TILE_FIELDS = ("block_m", "block_n", "num_kv_stages", "consumer_regs", "producer_regs", "num_q_stages")
_GRID_FIELDS = ("persistent", "lpt", "balanced", "balanced_partial_tiles", "divided_sections", "split_tail",
                "split_tail_rounds", "l2_section_mib", "stagger_kv", "stagger_subtract", "kv_multicast",
                "cross_head_pairs",
                "dynamic_tiles", "handout_table", "packed_section_mib", "dynamic_pool_share", "merge_loads_first")
_BASE = C.HopperFwdConfig()
KEY_TAIL_NOTE = ("Keys in whole K/V tiles. With a key tail a non-causal launch masks its first tile always, "
                 "and d256 non-causal keeps Gluon's arrivals (no asm_arrivals).")


@dataclasses.dataclass(frozen=True)
class DefaultRange:
    """``config`` is the default of every problem of this head dim and mask whose ``max(Sq, Sk)``
    lies in [``seqlen_min``, ``seqlen_max``] (keys in whole K/V tiles)."""

    head_dim: int
    causal: bool
    seqlen_min: int
    seqlen_max: int
    config: C.HopperFwdConfig


def problem(head_dim: int, causal: bool, seqlen: int, head_dim_v: int | None = None, packed: bool = False):
    """The :class:`flashrung.dispatch.Problem` the table evaluates for ``max(Sq, Sk) = seqlen``:
    Sq = seqlen, Sk the largest whole number of 128-key tiles not above it (Sk = seqlen below one
    tile), bf16, the suite's size (32k tokens a batch, 32 heads; a smaller call keeps the online step:
    ``config.FREEZE_ROW_MAX_MIN_FLOP``); otherwise only the head dims, the mask, ``max(Sq, Sk)`` and
    Sk's tail matter.
    ``packed``: packed sequences (flash-attn's varlen), the longest ``seqlen``."""
    from flashrung.dispatch import Problem

    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    C.kernel_head_dim(head_dim, head_dim_v)         # raises naming the head dims hopper.fwd takes
    if not 1 <= seqlen <= MAX_SEQLEN:
        raise ValueError(f"seqlen must be between 1 and 2**62 - 1, got {seqlen}")
    seqlen_k = seqlen - seqlen % WHOLE_KEY_TILE if seqlen >= WHOLE_KEY_TILE else seqlen
    from flashrung.kernels.hopper.fwd import DEFAULT_CONFIG_HEADS, DEFAULT_CONFIG_TOKENS

    # of the suite's size, as default_config's (a rule reads the call's work: FREEZE_ROW_MAX_MIN_FLOP)
    return Problem(batch=max(1, DEFAULT_CONFIG_TOKENS // seqlen), seqlen_q=seqlen, seqlen_k=seqlen_k,
                   heads_q=DEFAULT_CONFIG_HEADS, heads_kv=DEFAULT_CONFIG_HEADS, head_dim=head_dim,
                   head_dim_v=head_dim_v, dtype=torch.bfloat16, causal=causal, device_type="cuda",
                   capability=(9, 0), varlen=packed)


def selected(head_dim: int, causal: bool, seqlen: int, head_dim_v: int | None = None,
             packed: bool = False) -> C.HopperFwdConfig:
    """``select_config`` of :func:`problem` (a pair's own: MLA's splits, ``config.SPLIT_DEFAULT_HEAD_DIMS``)."""
    return C.select_config(problem(head_dim, causal, seqlen, head_dim_v, packed))


def _threshold_lengths() -> list[int]:
    """Every length at which a rule of ``config`` can change the selection: each value v its
    ``*_SEQLEN`` tables name starts a range (a "from v" rule) or ends one (an "up to v" rule, so
    v + 1 starts the next)."""
    values: set[int] = set()

    def collect(x):
        if isinstance(x, bool):
            return
        if isinstance(x, int):
            values.add(x)
        elif isinstance(x, (tuple, list)):
            for y in x:
                collect(y)

    for name, table in vars(C).items():
        if name.endswith("SEQLEN") and isinstance(table, dict):
            for value in table.values():
                collect(value)
    starts = {1}
    for v in values:
        starts.update(s for s in (v, v + 1) if 1 <= s < NO_BOUND)
    return sorted(starts)


def default_ranges(head_dim: int, causal: bool) -> list[DefaultRange]:
    """The ranges of ``max(Sq, Sk)`` over which ``hopper.fwd``'s default is one configuration,
    shortest lengths first, neighbours with the same configuration merged."""
    starts = _threshold_lengths()
    out: list[DefaultRange] = []
    for i, lo in enumerate(starts):
        hi = starts[i + 1] - 1 if i + 1 < len(starts) else MAX_SEQLEN
        cfg = selected(head_dim, causal, lo)
        if out and out[-1].config == cfg:
            out[-1] = dataclasses.replace(out[-1], seqlen_max=hi)
        else:
            out.append(DefaultRange(head_dim, causal, lo, hi, cfg))
    return out


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value == int(value):
        return str(int(value))
    return str(value)


def tile_text(cfg: C.HopperFwdConfig) -> str:
    q = "Q buffer" if cfg.num_q_stages == 1 else "Q buffers"
    return (f"{cfg.block_m}×{cfg.block_n}, {cfg.num_consumers} consumers × {cfg.consumer_regs} regs, "
            f"{cfg.num_kv_stages} K/V stages, {cfg.num_q_stages} {q}")


def grid_text(cfg: C.HopperFwdConfig) -> str:
    # a pack's table: its own order replaces the launch's LPT sections (they only number the tiles)
    pack_order = (f"in {cfg.packed_section_mib} MiB L2 sections of each sequence's K/V, each heaviest first"
                  if cfg.packed_section_mib else "heaviest first across the pack")
    partial = " (partial tiles estimated)" if cfg.balanced_partial_tiles else ""
    described = set()
    if cfg.balanced and cfg.handout_table:
        parts = [f"lists of the tiles with a row{partial}, then the last {cfg.dynamic_pool_share:.0%} of the work "
                 f"handed out at run time through the table, {pack_order}"]
        described.add("dynamic_pool_share")
    elif cfg.balanced:
        parts = ["balanced lists" + partial]
    elif cfg.handout_table:
        parts = ["tiles handed out at run time through the table of the tiles with a row, " + pack_order]
    elif cfg.dynamic_tiles:
        parts = ["tiles handed out at run time"]
    else:
        parts = ["persistent" if cfg.persistent else "one CTA per tile"]
    if cfg.lpt and not cfg.handout_table:
        parts.append(f"LPT, {cfg.l2_section_mib} MiB sections"
                     + (" (as they fall, the last one short)" if cfg.balanced and not cfg.divided_sections else ""))
    if cfg.split_tail:
        parts.append("split tail" + (" by rounds" if cfg.split_tail_rounds else ""))
    if cfg.stagger_kv:
        parts.append("staggered sweeps" + (" (wrap by subtract)" if cfg.stagger_subtract else ""))
    if cfg.kv_multicast:
        parts.append("K/V multicast pairs" + (" across heads" if cfg.cross_head_pairs else ""))
    for name in ("dynamic_pool_share", "merge_loads_first"):
        if getattr(cfg, name) != getattr(_BASE, name) and name not in described:
            parts.append(f"{name}={_value(getattr(cfg, name))}")
    return ", ".join(parts)


def switches(cfg: C.HopperFwdConfig) -> list[str]:
    """The fields outside the tile and the grid whose value differs from ``HopperFwdConfig()``'s
    (every switch off there but the ones on by default), as ``name`` for a switch turned on and
    ``name=value`` otherwise, in field order."""
    out = []
    for f in dataclasses.fields(cfg):
        if f.name in _TILE_FIELDS or f.name in _GRID_FIELDS:
            continue
        value = getattr(cfg, f.name)
        if value == getattr(_BASE, f.name):
            continue
        out.append(f.name if value is True else f"{f.name}={_value(value)}")
    return out


def _length(n: int) -> str:
    """A length as written in the config: 2^k (+ 1) past a million, digits below."""
    for offset in (0, 1):
        k = (n - offset).bit_length() - 1
        if n - offset >= 1 << 20 and n - offset == 1 << k:
            return f"2^{k}" + (" + 1" if offset else "")
    return str(n)


def length_text(lo: int, hi: int) -> str:
    if hi >= MAX_SEQLEN:
        return f"≥ {_length(lo)}"
    return _length(lo) if lo == hi else f"{_length(lo)}–{_length(hi)}"


def _mask(causal: bool) -> str:
    return "causal" if causal else "non-causal"


def markdown(ranges: list[DefaultRange]) -> str:
    """One table: head dim and mask, the length range, the tile, the grid, the switches."""
    lines = ["| d, mask | max(Sq, Sk) | tile | grid | switches on |", "| --- | --- | --- | --- | --- |"]
    for r in ranges:
        lines.append(f"| d{r.head_dim} {_mask(r.causal)} | {length_text(r.seqlen_min, r.seqlen_max)} | "
                     f"{tile_text(r.config)} | {grid_text(r.config)} | "
                     f"{', '.join(f'`{s}`' for s in switches(r.config))} |")
    return "\n".join(lines) + "\n"


def text(ranges: list[DefaultRange]) -> str:
    """The same rows for a terminal: a block per head dim and mask, a line per range."""
    out, current = [], None
    for r in ranges:
        if (r.head_dim, r.causal) != current:
            current = (r.head_dim, r.causal)
            out.append(f"{'' if not out else chr(10)}d{r.head_dim} {_mask(r.causal)}")
        out.append(f"  max(Sq, Sk) {length_text(r.seqlen_min, r.seqlen_max)}")
        out.append(f"    tile      {tile_text(r.config)}")
        out.append(f"    grid      {grid_text(r.config)}")
        out.append(f"    switches  {', '.join(switches(r.config)) or '-'}")
    out.append(f"\n{KEY_TAIL_NOTE}")
    return "\n".join(out) + "\n"


def all_ranges(head_dims=C.SUPPORTED_HEAD_DIMS, masks=(False, True)) -> list[DefaultRange]:
    return [r for d in head_dims for causal in masks for r in default_ranges(d, causal)]


def _as_json(ranges: list[DefaultRange], requested: int | None = None) -> list[dict]:
    """The ranges as JSON rows; ``requested``: a padded head dim the ranges' kernel runs, named as
    ``head_dim`` beside the kernel's ``kernel_head_dim``."""
    return [dict(head_dim=requested or r.head_dim, kernel_head_dim=r.head_dim, causal=r.causal, seqlen_min=r.seqlen_min,
                 seqlen_max=None if r.seqlen_max >= MAX_SEQLEN else r.seqlen_max,
                 switches=switches(r.config), config=dataclasses.asdict(r.config)) for r in ranges]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "defaults", help="which schedule hopper.fwd runs by default, by head dim, mask and length",
        description="The default configuration of hopper.fwd (config.select_config) as ranges of "
                    "max(Sq, Sk) per head dim and mask, or the whole configuration of one problem. "
                    "These are a suite-sized call's (32k tokens a batch, 32 heads): the call's work "
                    "decides only freeze_row_max and what it brings (config.FREEZE_ROW_MAX_BRINGS; at "
                    "d64 causal S2048 also the tile) — a call under config.FREEZE_ROW_MAX_MIN_FLOP "
                    "runs the online step's order without it. fp16 and bf16 select alike.")
    p.add_argument("--headdim", type=int, default=None,
                   help=f"one head dim (default: all compiled ones, {', '.join(map(str, C.SUPPORTED_HEAD_DIMS))}; "
                        f"any other multiple of {C.PADDED_HEAD_DIM_MULTIPLE} up to {C.SUPPORTED_HEAD_DIMS[-1]} "
                        "runs the next one's kernel, padded)")
    p.add_argument("--headdim-v", type=int, default=None, metavar="DV",
                   help="v's head dim where it differs from --headdim (MLA's 192/128: --headdim 192 --headdim-v "
                        "128): the row of the wider, and with --seqlen the widths each tensor is compiled at")
    mask = p.add_mutually_exclusive_group()
    mask.add_argument("--causal", dest="causal", action="store_true", default=None, help="causal only")
    mask.add_argument("--no-causal", dest="causal", action="store_false", help="non-causal only")
    p.add_argument("--seqlen", type=int, default=None,
                   help="max(Sq, Sk) of one problem: print its schedule (with --json, every field of its "
                        "configuration; needs --headdim)")
    p.add_argument("--packed", action="store_true",
                   help="with --seqlen: packed sequences (flash-attn's varlen), the longest --seqlen")
    p.add_argument("--set", default=None, metavar="KEY=VALUE,...",
                   help="with --seqlen: what impl='hopper.fwd@KEY=VALUE,...' builds for that problem, and "
                        "which fields it changes beyond those named (derived from them)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="a markdown table (docs/hopper.md's)")
    fmt.add_argument("--json", action="store_true", help="JSON: each range, its switches and configuration")
    p.set_defaults(func=run)


def with_overrides(head_dim: int, causal: bool, seqlen: int, spec: str,
                   head_dim_v: int | None = None, packed: bool = False) -> tuple[C.HopperFwdConfig, list[str]]:
    """What ``impl="hopper.fwd@<spec>"`` builds for :func:`problem`: ``fwd.config_with`` (the
    overrides parsed and checked, the fields derived from them carried along), and each field the
    spec does not name whose value still moved, as ``name: old → new``. Raises ``ValueError`` as
    the dispatch would (an unknown key, a wrong value, a combination ``check()`` refuses)."""
    from flashrung.dispatch import parse_impl
    from flashrung.kernels.hopper import fwd

    _, overrides = parse_impl(f"{fwd.KERNEL_NAME}@{spec}")
    if not overrides:
        raise ValueError(f"--set must be key=value,... (as in impl='hopper.fwd@...'), got {spec!r}")
    base_problem = problem(head_dim, causal, seqlen, head_dim_v, packed)
    base = C.select_config(base_problem)
    cfg = fwd.config_with(base_problem, overrides)
    derived = [f"{f.name}: {_value(getattr(base, f.name))} → {_value(getattr(cfg, f.name))}"
               for f in dataclasses.fields(cfg)
               if f.name not in overrides and getattr(cfg, f.name) != getattr(base, f.name)]
    return cfg, derived


def padding_note(head_dim: int, head_dim_v: int | None = None) -> str | None:
    """For a padded head dim, or a v with a head dim of its own: which kernel's row runs it and
    whether automatic dispatch picks it; None for a compiled one."""
    from flashrung.kernels.hopper import fwd

    pair = head_dim_v is not None and head_dim_v != head_dim
    kernel = C.kernel_head_dim(head_dim, head_dim_v if pair else None)
    if kernel == head_dim and not pair:
        return None
    key = (head_dim, head_dim_v) if pair else head_dim
    auto = ("automatic dispatch picks it" if key in fwd.PADDED_AUTO_HEAD_DIMS else
            "automatic dispatch runs portable.fwd instead; impl='hopper.fwd' runs it")
    if pair:
        return (f"d{head_dim}/{head_dim_v} runs the d{kernel} row, each tensor padded to the widths its "
                f"configuration compiles (config.kernel_head_dims); {auto}. The d{kernel} schedule:")
    return (f"d{head_dim} runs the d{kernel} kernel, its columns {head_dim}–{kernel - 1} zero-filled by TMA "
            f"(config.kernel_head_dim); {auto}. The d{kernel} schedule:")


def run(args) -> int:
    # a padded head dim (--headdim 96) is answered with its kernel's schedule, under a note
    requested = kernel = args.headdim
    value = args.headdim_v if args.headdim_v != requested else None
    if value is not None and requested is None:
        print("flashrung defaults: --headdim-v needs --headdim (q's and k's head dim)", file=sys.stderr)
        return 2
    if requested is not None:
        try:
            kernel = C.kernel_head_dim(requested, value)
        except ValueError as exc:
            flag = "--headdim-v" if "head_dim_v" in str(exc) else "--headdim"
            print(f"flashrung defaults: {flag}: {exc}", file=sys.stderr)
            return 2
        note = padding_note(requested, value)
        if note is not None and not args.json:
            print(note)
    head_dims = C.SUPPORTED_HEAD_DIMS if kernel is None else (kernel,)
    masks = (False, True) if args.causal is None else (args.causal,)
    if args.seqlen is not None:
        if kernel is None:
            print("flashrung defaults: --seqlen needs --headdim (the configuration of one problem)",
                  file=sys.stderr)
            return 2
        try:
            if args.set:
                # a pair is checked at its own widths (the row is the wider's either way)
                configs = [(causal, *(with_overrides(requested, causal, args.seqlen, args.set, value, args.packed)
                                      if value else with_overrides(kernel, causal, args.seqlen, args.set,
                                                                   packed=args.packed)))
                           for causal in masks]
            else:
                configs = [(causal, selected(requested, causal, args.seqlen, value, args.packed) if value
                            else selected(kernel, causal, args.seqlen, packed=args.packed), []) for causal in masks]
        except ValueError as exc:
            print(f"flashrung defaults: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps([dict(head_dim=requested, head_dim_v=value or requested, kernel_head_dim=kernel,
                                   kernel_widths=C.kernel_head_dims(requested, value, cfg), causal=causal,
                                   seqlen=args.seqlen, packed=args.packed, overrides=args.set,
                                   derived=derived, switches=switches(cfg), config=dataclasses.asdict(cfg))
                              for causal, cfg, derived in configs], indent=1))
            return 0
        for causal, cfg, derived in configs:
            forced = f", hopper.fwd@{args.set}" if args.set else ""
            length = f"packed sequences, the longest {args.seqlen}" if args.packed else f"max(Sq, Sk) = {args.seqlen}"
            print(f"d{kernel} {_mask(causal)}, {length}{forced}")
            print(f"  tile      {tile_text(cfg)}")
            print(f"  grid      {grid_text(cfg)}")
            print(f"  switches  {', '.join(switches(cfg)) or '-'}")
            if value is not None:
                qk, vo = C.kernel_head_dims(requested, value, cfg)
                boxes = C.qk_boxes(qk)
                split = f" ({boxes[0]} + {boxes[1]} columns)" if boxes[1] else ""
                print(f"  widths    Q/K {qk}{split}, V/O {vo} (config.kernel_head_dims)")
            if args.set:
                print(f"  derived   {'; '.join(derived) or '-'}")
        return 0
    if args.set:
        print("flashrung defaults: --set needs --headdim and --seqlen (it changes one problem's configuration)",
              file=sys.stderr)
        return 2
    if args.packed:
        print("flashrung defaults: --packed needs --headdim and --seqlen (the longest sequence of one pack)",
              file=sys.stderr)
        return 2
    ranges = all_ranges(head_dims, masks)
    if args.json:
        print(json.dumps(_as_json(ranges, requested), indent=1))
    elif args.markdown:
        print(markdown(ranges), end="")
    else:
        print(text(ranges), end="")
    return 0
