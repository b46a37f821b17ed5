"""L2 reuse of a forward's tile order: how many bytes a launch reads from DRAM.

Every CTA reads each K/V tile of its query tile's head; whether that read is served by L2 or by
DRAM depends on what the other CTAs touched since the head's K/V was last read — on the order in
which the grid walks its tiles. This module replays that order. CTAs run at one speed: a query
tile with ``n`` live K/V tiles occupies its CTA for ``n + TILE_OVERHEAD_KV_TILES`` steps (the
balanced schedule's own cost estimate, ``schedule.tile_cost``: a partial last tile's steps
shortened by its ``consumer_share`` where the launch has one), reading K/V tile ``k`` at its
``k``-th step (or in the staggered order). Three grids, as ``hopper.fwd`` launches them:

* ``stride`` — the persistent grid: CTA ``i`` walks items ``i, i + P, i + 2P, …`` of the order;
* ``balanced`` — the persistent grid walking ``schedule.balanced_schedule``'s lists;
* ``per-tile`` — one CTA per tile, ``P`` resident at a time, each freed slot taking the next tile
  in order (the hardware's hand-out).

The L2 is one LRU of ``capacity_bytes`` over whole K/V tiles (K and V of ``kv_tile`` keys of one
K/V head, fewer at the key tail); each query tile's Q and O also pass through it (read once,
written once), taking room. Reads of one tile by several CTAs at the same step count as one miss
and hits (the model's only form of the coalescing that merges them on the GPU).
What it returns is modelled, not measured: the H200's 60 MiB are two partitions with their own
hashing and replacement, and requests of several SMs for one line in flight count once there
(the request coalescer) where the model counts each. ``docs/hopper.md`` sets it against the DRAM
bytes `ncu` read for the same orders (``capacity_bytes`` is the one fitted number).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import heapq

from flashrung.kernels.hopper import schedule
from flashrung.kernels.hopper.schedule import TILE_OVERHEAD_KV_TILES, tile_position
from flashrung.model.schedule import check_positive_ints, live_blocks

# The staggered sweep's low-discrepancy step (``hopper.schedule.kv_stagger``, the kernel's own
# constants): start fraction (m · STEP mod 2^BITS) / 2^BITS of the item's unmasked K/V tiles
STAGGER_BITS = schedule.STAGGER_BITS.value
STAGGER_STEP = schedule.STAGGER_STEP.value
GRIDS = ("stride", "balanced", "per-tile")


@dataclasses.dataclass(frozen=True)
class Launch:
    """One forward launch: the problem, its tiles and the order the grid walks them."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    block_m: int = 128
    kv_tile: int = 128
    elem_bytes: int = 2
    grid: str = "stride"          # "stride", "balanced" or "per-tile"
    ctas: int = 132               # resident CTAs (the persistent grid's size)
    lpt: bool = True              # heaviest-first inside head sections (causal default)
    section_mib: int = 48         # K/V MiB of one LPT section (``l2_section_mib``)
    # the balanced grid's sections narrowed to divide the columns (``divided_sections``)
    divided_sections: bool = True
    stagger: bool = False         # staggered K/V sweeps (``stagger_kv``)
    # a partial last query tile's share of a whole tile's time, per consumer warpgroup with rows
    # (``balanced_partial_tiles``: the balanced table's estimate, ``schedule.tile_cost``); () = whole
    consumer_share: tuple = ()

    def __post_init__(self):
        check_positive_ints(**{name: getattr(self, name) for name in (
            "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "block_m", "kv_tile", "elem_bytes",
            "ctas", "section_mib")})
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        if self.grid not in GRIDS:
            raise ValueError(f"grid must be one of {GRIDS}, got {self.grid!r}")
        schedule.check_consumer_share(self.consumer_share, self.block_m)

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def kv_tile_bytes(self) -> int:
        """K and V of one K/V tile: the unit the model caches."""
        return 2 * self.kv_tile * self.head_dim * self.elem_bytes

    @property
    def q_tile_bytes(self) -> int:
        return self.block_m * self.head_dim * self.elem_bytes

    @property
    def num_m_blocks(self) -> int:
        return -(-self.seqlen_q // self.block_m)

    @functools.cached_property
    def section(self) -> int:
        """(batch, q-head) columns per LPT section, as the kernel's launch plan sizes it:
        ``hopper.schedule.head_section``, narrowed to divide the columns on the balanced grid
        (``schedule.balanced_section``)."""
        columns = self.batch * self.heads_q
        section = min(schedule.head_section(self.seqlen_k, self.heads_q, self.heads_kv, self.head_dim,
                                            self.elem_bytes, self.section_mib << 20), columns)
        if self.grid == "balanced" and self.divided_sections:
            return schedule.balanced_section(self.num_m_blocks, columns, section, self.group, self.lpt, self.seqlen_q,
                                             self.seqlen_k, self.block_m, self.kv_tile, self.causal,
                                             min(self.ctas, self.num_m_blocks * columns), self.consumer_share)
        return section

    def compulsory_bytes(self) -> int:
        """Q, K and V read once each: what no order can go below."""
        q = self.batch * self.heads_q * self.seqlen_q * self.head_dim * self.elem_bytes
        kv = 2 * self.batch * self.heads_kv * self.seqlen_k * self.head_dim * self.elem_bytes
        return q + kv


@dataclasses.dataclass(frozen=True)
class Traffic:
    """What one launch reads from DRAM under the model."""

    dram_read_bytes: int
    compulsory_bytes: int
    kv_accesses: int
    kv_misses: int
    makespan_steps: float         # the last CTA's finish, in K/V-tile steps

    @property
    def kv_hit_rate(self) -> float:
        return 1.0 - self.kv_misses / self.kv_accesses if self.kv_accesses else 1.0

    @property
    def excess(self) -> float:
        """DRAM reads over the compulsory ones (1.0: every byte read once)."""
        return self.dram_read_bytes / self.compulsory_bytes


def _tile_coords(tile_id: int, launch: Launch) -> tuple[int, int]:
    """(batch · heads_q + q_head, m_block) of a linear tile id: the kernel's own mapping."""
    return tile_position(tile_id, launch.num_m_blocks, launch.batch * launch.heads_q, launch.section, launch.lpt)


def _kv_order(m_block: int, launch: Launch) -> list[int]:
    """The K/V tiles a query tile reads, in the order it reads them."""
    n = live_blocks(m_block, launch.block_m, launch.kv_tile, launch.seqlen_q, launch.seqlen_k, launch.causal)
    if not launch.stagger or n == 0:
        return list(range(n))
    if launch.causal:
        first_row_key = m_block * launch.block_m + launch.seqlen_k - launch.seqlen_q
        unmasked = max(0, min(launch.seqlen_k, first_row_key + 1)) // launch.kv_tile
    else:
        unmasked = launch.seqlen_k // launch.kv_tile
    n_rot = max(0, min(unmasked, n))
    start = (((m_block * STAGGER_STEP) & ((1 << STAGGER_BITS) - 1)) * n_rot) >> STAGGER_BITS
    return [(k + start) % n_rot if k < n_rot else k for k in range(n)]


def _tile_cost(m_block: int, launch: Launch) -> float:
    """Steps query tile ``m_block`` occupies its CTA: the balanced schedule's estimate."""
    return schedule.tile_cost(m_block, launch.block_m, launch.kv_tile, launch.seqlen_q, launch.seqlen_k,
                              launch.causal, launch.consumer_share)


def _cta_tiles(launch: Launch) -> list[tuple[float, int, int]]:
    """(start step, CTA, tile id) of every tile under the launch's grid."""
    num_tiles = launch.num_m_blocks * launch.batch * launch.heads_q
    cost = [_tile_cost(m, launch) for m in range(launch.num_m_blocks)]
    ctas = min(launch.ctas, num_tiles)
    if launch.grid == "stride":
        lists = [range(cta, num_tiles, ctas) for cta in range(ctas)]
    else:
        # the balanced lists: the kernel's own table, a greedy hand-out made on the host with the
        # estimate; the per-tile grid makes the same hand-out in hardware as slots free up (with
        # equal speeds, the same lists)
        table = schedule.balanced_schedule(launch.num_m_blocks, launch.batch * launch.heads_q, launch.section,
                                           launch.lpt, launch.seqlen_q, launch.seqlen_k, launch.block_m,
                                           launch.kv_tile, launch.causal, ctas, launch.consumer_share)
        offsets, order = table[:ctas + 1], table[ctas + 1:]
        lists = [order[offsets[cta]:offsets[cta + 1]] for cta in range(ctas)]
    out = []
    for cta, tiles in enumerate(lists):
        t = 0.0
        for tile_id in tiles:
            out.append((t, cta, tile_id))
            t += cost[_tile_coords(tile_id, launch)[1]]
    if launch.grid != "stride":
        out.sort(key=lambda item: item[2])     # in launch order, as the hand-out meets them
    return out


def _check_capacity(capacity_bytes, kv_tile_bytes: int) -> None:
    if not isinstance(capacity_bytes, int) or capacity_bytes < kv_tile_bytes:
        raise ValueError(f"capacity_bytes must be an integer of at least one K/V tile "
                         f"({kv_tile_bytes} bytes), got {capacity_bytes!r}")


def _tile_events(events: list, start: float, launch: Launch, m: int, q_key, kv_key) -> float:
    """Append query tile ``m``'s Q read, its K/V reads in their order and its O write, from step
    ``start`` (``launch``: its sequence's sizes; ``kv_key(kv)``: the cache key of K/V tile ``kv``);
    returns its end."""
    row_bytes = launch.head_dim * launch.elem_bytes
    order = _kv_order(m, launch)
    # a step's length: 1, or a partial last tile's share (its steps run fewer warpgroups)
    step_len = _tile_cost(m, launch) / (len(order) + TILE_OVERHEAD_KV_TILES)
    q_bytes = min(launch.block_m, launch.seqlen_q - m * launch.block_m) * row_bytes
    events.append((start, len(events), 0, ("q", q_key), q_bytes))
    for step, kv in enumerate(order):
        kv_bytes = 2 * min(launch.kv_tile, launch.seqlen_k - kv * launch.kv_tile) * row_bytes
        events.append((start + (TILE_OVERHEAD_KV_TILES / 2 + step) * step_len, len(events), 1, kv_key(kv), kv_bytes))
    end = start + (len(order) + TILE_OVERHEAD_KV_TILES) * step_len
    events.append((end, len(events), 2, ("o", q_key), q_bytes))
    return end


def _replay(events: list, capacity_bytes: int, compulsory_bytes: int, makespan: float) -> Traffic:
    """The DRAM reads of ``events`` (``_tile_events``' records) through an LRU of ``capacity_bytes``."""
    events.sort()
    lru: collections.OrderedDict = collections.OrderedDict()
    held = 0
    dram = accesses = misses = 0
    for _t, _s, kind, key, size in events:
        if kind == 1:
            accesses += 1
            if key in lru:
                lru.move_to_end(key)
                continue
            misses += 1
            dram += size
        elif kind == 0:
            dram += size
        lru[key] = size
        held += size
        while held > capacity_bytes:
            _, evicted = lru.popitem(last=False)
            held -= evicted
    return Traffic(dram_read_bytes=dram, compulsory_bytes=compulsory_bytes, kv_accesses=accesses,
                   kv_misses=misses, makespan_steps=makespan)


def simulate(launch: Launch, capacity_bytes: int) -> Traffic:
    """Replay ``launch``'s K/V reads through an LRU L2 of ``capacity_bytes``."""
    _check_capacity(capacity_bytes, launch.kv_tile_bytes)
    events = []      # (step, order, kind, key, bytes): kind 0 = Q read, 1 = K/V read, 2 = O write
    makespan = 0.0
    for start, _cta, tile_id in _cta_tiles(launch):
        bh, m = _tile_coords(tile_id, launch)
        b, h = divmod(bh, launch.heads_q)
        kv_head = b * launch.heads_kv + h // launch.group
        end = _tile_events(events, start, launch, m, (bh, m), lambda kv: (kv_head, kv))
        makespan = max(makespan, end)
    return _replay(events, capacity_bytes, launch.compulsory_bytes(), makespan)


@dataclasses.dataclass(frozen=True)
class PackLaunch:
    """A launch of packed sequences (flash-attn's varlen; queries and keys of ``lengths`` alike) as
    ``hopper.fwd`` runs it: the table of its tiles with a row (``schedule.packed_tiles``) — heaviest
    first across the pack, or in L2 sections of ``section_mib`` of K/V (``packed_section_mib``; 0:
    none) — handed out at run time, each tile to the first CTA free."""

    lengths: tuple
    heads_q: int
    heads_kv: int
    head_dim: int
    causal: bool
    block_m: int = 128
    kv_tile: int = 128
    elem_bytes: int = 2
    ctas: int = 132
    section_mib: int = 0
    stagger: bool = False

    def __post_init__(self):
        check_positive_ints(heads_q=self.heads_q, heads_kv=self.heads_kv, head_dim=self.head_dim,
                            block_m=self.block_m, kv_tile=self.kv_tile, elem_bytes=self.elem_bytes, ctas=self.ctas)
        if not self.lengths or any(not isinstance(n, int) or n < 1 for n in self.lengths):
            raise ValueError(f"lengths must be positive integers, one per sequence, got {self.lengths!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        if not isinstance(self.section_mib, int) or self.section_mib < 0:
            raise ValueError(f"section_mib must be a non-negative integer (0: no sections), got {self.section_mib!r}")

    def sequence(self, n: int) -> Launch:
        """One sequence of ``n`` rows and keys, for its tiles' costs and K/V orders."""
        return Launch(batch=1, heads_q=self.heads_q, heads_kv=self.heads_kv, seqlen_q=n, seqlen_k=n,
                      head_dim=self.head_dim, causal=self.causal, block_m=self.block_m, kv_tile=self.kv_tile,
                      elem_bytes=self.elem_bytes, ctas=self.ctas, stagger=self.stagger)

    def compulsory_bytes(self) -> int:
        rows = sum(self.lengths)
        return (self.heads_q + 2 * self.heads_kv) * rows * self.head_dim * self.elem_bytes


def simulate_pack(pack: PackLaunch, capacity_bytes: int) -> Traffic:
    """Replay ``pack``'s K/V reads through an LRU L2 of ``capacity_bytes``; CTAs at one speed, each
    tile of the table's order to the CTA free first (the run-time hand-out)."""
    _check_capacity(capacity_bytes, 2 * pack.kv_tile * pack.head_dim * pack.elem_bytes)
    lens = list(pack.lengths)
    num_m_blocks = -(-max(lens) // pack.block_m)
    columns = len(lens) * pack.heads_q
    sections = (schedule.PackedSections(pack.section_mib << 20, 2 * pack.head_dim * pack.elem_bytes,
                                        pack.heads_q // pack.heads_kv) if pack.section_mib else None)
    # the tile ids' own mapping needs only to be the one the table was made with: one column a section
    tiles, _ = schedule.packed_tiles(lens, lens, pack.heads_q, num_m_blocks, 1, True, pack.block_m, pack.kv_tile,
                                     pack.causal, pack.ctas, (), -1, 0, sections)
    per_sequence = {n: pack.sequence(n) for n in set(lens)}
    free = [(0.0, cta) for cta in range(min(pack.ctas, len(tiles)))]
    events, makespan = [], 0.0
    group = pack.heads_q // pack.heads_kv
    for tile_id in tiles.tolist():
        column, m = tile_position(tile_id, num_m_blocks, columns, 1, True)
        b, h = divmod(column, pack.heads_q)
        start, cta = free[0]
        end = _tile_events(events, start, per_sequence[lens[b]], m, (column, m),
                           lambda kv, key=(b, h // group): (key, kv))
        heapq.heapreplace(free, (end, cta))
        makespan = max(makespan, end)
    return _replay(events, capacity_bytes, pack.compulsory_bytes(), makespan)


def launch_of(cfg, *, batch: int, heads_q: int, heads_kv: int, seqlen_q: int, seqlen_k: int, head_dim: int,
              causal: bool, sms: int = 132, elem_bytes: int = 2) -> Launch:
    """The :class:`Launch` a ``hopper.fwd`` configuration (``HopperFwdConfig``) makes of a problem:
    its tile, grid (persistent stride, balanced lists or one CTA per tile), order and sweeps. The
    split tail is not modelled (it re-reads only the last round's K/V)."""
    from flashrung.kernels.hopper.fwd import partial_tile_share

    grid = "balanced" if cfg.balanced else ("stride" if cfg.persistent else "per-tile")
    return Launch(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                  head_dim=head_dim, causal=causal, block_m=cfg.block_m, kv_tile=cfg.kv_tile,
                  elem_bytes=elem_bytes, grid=grid, ctas=sms * cfg.resident_ctas_per_sm(head_dim, elem_bytes),
                  lpt=cfg.lpt, section_mib=cfg.l2_section_mib, divided_sections=cfg.divided_sections,
                  stagger=cfg.stagger_kv,
                  consumer_share=partial_tile_share(cfg, head_dim))


# The L2 the model holds, fitted once: with 40 MiB it reproduces the DRAM bytes `ncu` read for
# seven tile orders of `hopper.fwd` at d128 causal B32 H16 S1024 within 7% (403–962 MB measured;
# `h200-ncu-order-d128-causal-s1k.txt`) and ranks every other measured order the same way
# (docs/hopper.md, *A model of the L2*)
H200_CAPACITY_MIB = 40
# the alternatives the report prices for causal rows: both persistent grids × section sizes
VARIANT_SECTIONS_MIB = (2, 4, 8, 16, 48)


@dataclasses.dataclass(frozen=True)
class Variant:
    grid: str
    section_mib: int
    traffic: Traffic
    makespan_ratio: float         # makespan ÷ the default's (modelled steps; < 1 finishes earlier)


@dataclasses.dataclass(frozen=True)
class RowReport:
    label: str
    default_grid: str
    default_section_mib: int
    default_stagger: bool
    default: Traffic
    variants: tuple[Variant, ...]

    def to_json(self) -> dict:
        def t(x: Traffic) -> dict:
            return {"dram_read_bytes": x.dram_read_bytes, "compulsory_bytes": x.compulsory_bytes,
                    "excess": round(x.excess, 4), "kv_hit_rate": round(x.kv_hit_rate, 4),
                    "makespan_steps": x.makespan_steps}
        return {"row": self.label, "default": {"grid": self.default_grid, "section_mib": self.default_section_mib,
                                               "stagger": self.default_stagger, **t(self.default)},
                "variants": [{"grid": v.grid, "section_mib": v.section_mib,
                              "makespan_ratio": round(v.makespan_ratio, 4),
                              **t(v.traffic)} for v in self.variants]}


def report_row(*, batch: int, heads_q: int, heads_kv: int, seqlen_q: int, seqlen_k: int, head_dim: int,
               causal: bool, capacity_mib: int = H200_CAPACITY_MIB, sms: int = 132,
               sections: tuple[int, ...] = VARIANT_SECTIONS_MIB) -> RowReport:
    """``hopper.fwd``'s default launch of one problem and, for causal problems, the persistent
    stride and the balanced lists at each LPT section size, through the model."""
    import torch

    from flashrung.dispatch import Problem
    from flashrung.kernels.hopper.config import select_config

    problem = Problem(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
                      head_dim=head_dim, head_dim_v=head_dim, dtype=torch.bfloat16, causal=causal,
                      device_type="cuda", capability=(9, 0))
    cfg = select_config(problem)
    dims = dict(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                head_dim=head_dim, causal=causal, sms=sms)
    cap = capacity_mib << 20
    base_launch = launch_of(cfg, **dims)
    base = simulate(base_launch, cap)
    variants = []
    if causal:
        for grid in ("stride", "balanced"):
            for sec in sections:
                launch = dataclasses.replace(base_launch, grid=grid, section_mib=sec, lpt=True)
                r = simulate(launch, cap)
                variants.append(Variant(grid, sec, r, r.makespan_steps / base.makespan_steps))
    label = (f"B{batch} H{heads_q}{'' if heads_q == heads_kv else f'/{heads_kv}'} S{seqlen_q}"
             f"{'' if seqlen_q == seqlen_k else f'x{seqlen_k}'} d{head_dim} {'causal' if causal else 'full'}")
    return RowReport(label, base_launch.grid, cfg.l2_section_mib, cfg.stagger_kv, base, tuple(variants))


def report_pack(lengths: tuple, *, heads_q: int, heads_kv: int, head_dim: int, causal: bool,
                capacity_mib: int = H200_CAPACITY_MIB, sms: int = 132,
                sections: tuple[int, ...] = VARIANT_SECTIONS_MIB) -> RowReport:
    """``hopper.fwd``'s default launch of packed sequences of ``lengths`` (its tile, sweep and
    ``packed_section_mib``) and the same hand-out heaviest first across the pack (section 0) and in
    sections of each of ``sections`` MiB, through the model."""
    import torch

    from flashrung.dispatch import Problem
    from flashrung.kernels.hopper.config import select_config

    problem = Problem(batch=len(lengths), seqlen_q=max(lengths), seqlen_k=max(lengths), heads_q=heads_q,
                      heads_kv=heads_kv, head_dim=head_dim, head_dim_v=head_dim, dtype=torch.bfloat16, causal=causal,
                      device_type="cuda", capability=(9, 0), varlen=True)
    cfg = select_config(problem)
    base_pack = PackLaunch(tuple(lengths), heads_q, heads_kv, head_dim, causal, block_m=cfg.block_m,
                           kv_tile=cfg.kv_tile, ctas=sms * cfg.resident_ctas_per_sm(head_dim, 2),
                           section_mib=cfg.packed_section_mib, stagger=cfg.stagger_kv)
    cap = capacity_mib << 20
    base = simulate_pack(base_pack, cap)
    variants = []
    for sec in (0, *sections):
        # the default's own size is among the variants: replayed once
        r = (base if sec == base_pack.section_mib
             else simulate_pack(dataclasses.replace(base_pack, section_mib=sec), cap))
        variants.append(Variant("table", sec, r, r.makespan_steps / base.makespan_steps))
    label = (f"pack of {len(lengths)} (longest {max(lengths)}) H{heads_q}"
             f"{'' if heads_q == heads_kv else f'/{heads_kv}'} d{head_dim} {'causal' if causal else 'full'}")
    return RowReport(label, "table", cfg.packed_section_mib, cfg.stagger_kv, base, tuple(variants))


def format_reports(reports: list[RowReport], capacity_mib: int) -> str:
    lines = [f"modelled DRAM reads of hopper.fwd's tile orders (LRU L2 of {capacity_mib} MiB, equal-speed CTAs); "
             "x = DRAM bytes / compulsory (Q, K, V once); t = modelled makespan / the default's",
             f"{'row':32s} {'default':>22s}  variants (s = persistent stride, b = balanced lists, t = a pack's "
             "table handed out; MiB per section, t0 = heaviest first across the pack)"]
    for r in reports:
        stagger = " stag" if r.default_stagger else ""
        d = f"{r.default_grid[:3]} {r.default_section_mib}M{stagger} x{r.default.excess:.2f}"
        var = "  ".join(f"{v.grid[0]}{v.section_mib} x{v.traffic.excess:.2f} t{v.makespan_ratio:.3f}"
                        for v in r.variants)
        lines.append(f"{r.label:32s} {d:>22s}  {var}")
    return "\n".join(lines)
