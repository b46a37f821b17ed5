"""Which tile a CTA computes, which K/V tiles it visits, and which of those need a mask.

Tiles are ``(batch, q_head, m_block)``. The linear tile order is the lever (seed 001, 0x0B):

* plain order: ``m_block`` fastest, so the CTAs of one head run together and share its K/V in L2;
* LPT order (``LPT=True``): heads are grouped in sections whose K/V fit the L2 budget; within a
  section ``m_block`` runs from the last (the heaviest under a causal mask) to the first, heads
  fastest. The hardware block scheduler hands out CTAs in this order as SMs free up, which is a
  greedy longest-first list schedule; a persistent grid walks the same order with a stride.

The last wave (the split tail): with one resident CTA per SM, ``num_tiles`` tiles run in
``ceil(num_tiles / SMs)`` rounds; when the last round is short (at d128 the suite's 4096 tiles
on 132 SMs leave 4 tiles for a 32nd round, 3% of the time spent by 4 SMs while 128 wait) its
tiles are split along the keys into ``tail_splits`` work items each (:func:`tail_split`), so the
last round spreads over every SM. Each such item writes a partial, normalized O and its LSE to a
workspace; ``tail_combine`` merges them (non-causal only: under a causal mask the heaviest-first
order already ends on the lightest tiles).

A balanced persistent grid (``balanced``): a static stride hands CTA ``i`` tiles ``i, i + P, …``
of the heaviest-first order, so under a causal mask the low CTAs keep drawing the heavier tile of
each round. Instead the host list-schedules the same order once per problem shape — each tile to
the CTA with the least work so far, the work of a tile priced as its live K/V tiles plus one for
its prologue and epilogue (:func:`balanced_schedule`) — and each CTA walks its own list. The
schedule is a permutation of the tiles, so the estimate decides only the balance, never what is
computed.

Causal masks are bottom-right aligned: query ``i`` sees key ``j`` iff ``j <= i + (Sk - Sq)``.
K/V tiles fully above the diagonal are never loaded; tiles fully below it (and fully inside
``Sk``) run without any mask; only the remaining tiles pay for one.

Every work item is decoded into ``(batch, q_head, m_block)`` by dividing by sizes fixed per launch.
A 32-bit ``//`` by a run-time value compiles to a reciprocal and its corrections (I2F.RP, MUFU.RCP,
F2I, IMAD.HI and fix-ups: 15-20 instructions, in every tile's head); with a magic number computed
on the host it is one multiply-high and a shift (:func:`fast_divisor`, :class:`FastDivisor`:
Granlund and Montgomery's division by invariant integers).
"""
# No ``from __future__ import annotations`` here: aggregate fields are type-checked against their
# annotations at trace time, which must therefore be real classes, not strings.
import dataclasses
import heapq

import numpy as np

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.core import _aggregate as aggregate

from flashrung.model.schedule import live_blocks
from flashrung.kernels.hopper.multicast import cluster_index

# K/V bytes of the heads that run together should stay in L2 (H200: 60 MiB; FA4 uses ~50 MB).
L2_BUDGET_BYTES = 48 * 1024 * 1024


def head_section(seqlen_k: int, heads_q: int, heads_kv: int, head_dim: int, elem_bytes: int,
                 budget_bytes: int = L2_BUDGET_BYTES) -> int:
    """How many consecutive (batch, q_head) columns the LPT order keeps together: as many K/V heads
    as ``budget_bytes`` of K/V hold (at least one).

    A multiple of the GQA group, so every q-head that shares a K/V head runs in the same section.
    """
    if not isinstance(budget_bytes, int) or budget_bytes < 1:
        raise ValueError(f"budget_bytes must be a positive integer, got {budget_bytes!r}")
    group = heads_q // heads_kv
    kv_bytes_per_kv_head = 2 * seqlen_k * head_dim * elem_bytes
    kv_heads = max(1, budget_bytes // max(kv_bytes_per_kv_head, 1))
    return group * kv_heads


def tail_split(num_tiles: int, resident_ctas: int, num_kv_tiles: int,
               item_fixed_kv_tiles: int | None = None) -> tuple[int, int]:
    """``(num_full_tiles, tail_splits)``: tiles ``[0, num_full_tiles)`` run whole, each of the
    remaining ``num_tiles % resident_ctas`` tiles becomes ``tail_splits`` work items over disjoint
    K/V ranges (at least one K/V tile each). ``tail_splits == 1``: nothing is split (the last
    round is full, or too full to gain from splitting).

    ``item_fixed_kv_tiles`` None: as many splits as one round holds, so the last round never grows.
    An integer (a work item's fixed cost, in K/V steps: its peeled first step, drain and
    epilogue): the split count that minimizes :func:`tail_step_times` — the split items may take
    several rounds of shorter items when that ends sooner than one round of whole tiles."""
    for name, value in (("num_tiles", num_tiles), ("resident_ctas", resident_ctas), ("num_kv_tiles", num_kv_tiles)):
        if not isinstance(value, int) or value < 0 or (name != "num_tiles" and value == 0):
            raise ValueError(f"{name} must be a {'non-negative' if name == 'num_tiles' else 'positive'} "
                             f"integer, got {value!r}")
    if item_fixed_kv_tiles is not None and (not isinstance(item_fixed_kv_tiles, int) or item_fixed_kv_tiles < 0):
        raise ValueError(f"item_fixed_kv_tiles must be None or a non-negative integer, got {item_fixed_kv_tiles!r}")
    rem = num_tiles % resident_ctas
    if not rem:
        return num_tiles, 1
    if item_fixed_kv_tiles is None:
        splits = min(resident_ctas // rem, num_kv_tiles)
    else:
        # fewest step-times; on a tie the most splits (the one-round rule's choice where it is one)
        splits = min(range(1, num_kv_tiles + 1),
                     key=lambda s: (tail_step_times(rem, resident_ctas, num_kv_tiles, s, item_fixed_kv_tiles), -s))
    if splits < 2:
        return num_tiles, 1
    return num_tiles - rem, splits


def tail_step_times(tail_tiles: int, resident_ctas: int, num_kv_tiles: int, splits: int, item_fixed_kv_tiles: int) -> int:
    """The modeled length of the last round(s), in K/V step-times: ``tail_tiles`` tiles, each cut
    into ``splits`` items, run in rounds of ``resident_ctas``, each round as long as its longest
    item's K/V range plus an item's fixed cost. With ``splits`` 1, the whole tiles' round."""
    rounds = -(-tail_tiles * splits // resident_ctas)
    return rounds * (-(-num_kv_tiles // splits) + item_fixed_kv_tiles)


# every dividend of the work-item decode is a non-negative int32
DIVIDEND_BITS = 31


def fast_divisor(d: int, name: str = "divisor") -> tuple[int, int]:
    """``(mul, shift)`` such that ``x // d == umulhi(2·x, mul) >> shift`` for every
    ``0 <= x < 2**31`` (:func:`fast_div` on the device).

    ``shift = ceil(log2(d))`` and ``mul = ceil(2**(31 + shift) / d)``, which lies in
    ``[2**31, 2**32)``; it is returned as the int32 of the same bits, so the kernel argument stays
    ``i32``. Exact: with ``e = mul·d - 2**(31 + shift)``, ``0 <= e < d <= 2**shift``, the product
    is ``x/d + x·e / (d·2**(31 + shift))`` and the excess stays below ``2**-shift <= 1/d``, too
    little to carry ``x/d`` (whose fraction is at most ``(d - 1)/d``) to the next integer."""
    if not isinstance(d, int) or isinstance(d, bool) or not 1 <= d < 1 << DIVIDEND_BITS:
        raise ValueError(f"{name} must be an integer in [1, 2**{DIVIDEND_BITS}), got {d!r}")
    shift = (d - 1).bit_length()
    mul = -(-(1 << (DIVIDEND_BITS + shift)) // d)
    return mul - (1 << 32), shift


@aggregate
class FastDivisor:
    """A divisor fixed per launch and :func:`fast_divisor`'s ``(mul, shift)`` for it."""

    d: gl.tensor
    mul: gl.tensor
    shift: gl.tensor

    @gluon.constexpr_function
    def __init__(self, d, mul, shift):
        self.d = d
        self.mul = mul
        self.shift = shift


@gluon.jit
def fast_div(x, dv):
    """``x // dv.d`` for ``0 <= x < 2**31``: one multiply-high and a shift."""
    # umulhi reads its operands as unsigned (mul.hi.u32): 2·x fits 32 bits and mul is the int32
    # of a value in [2**31, 2**32). The high half may reach 2**31, so the shift is a logical one
    hi = gl.umulhi(x + x, dv.mul)
    return (hi.to(gl.uint32, bitcast=True) >> dv.shift).to(gl.int32, bitcast=True)


@gluon.jit
def fast_divmod(x, dv):
    """``(x // dv.d, x % dv.d)`` for ``0 <= x < 2**31``."""
    q = fast_div(x, dv)
    return q, x - q * dv.d


@gluon.jit
def divide(x, dv, FAST_DIV: gl.constexpr):
    """``x // dv.d``: by multiply-high (:func:`fast_div`) with ``FAST_DIV``, else by the hardware's
    division."""
    if FAST_DIV:
        q = fast_div(x, dv)
    else:
        q = x // dv.d
    return q


@gluon.jit
def divide_mod(x, dv, FAST_DIV: gl.constexpr):
    """``(x // dv.d, x % dv.d)``, as :func:`divide`."""
    if FAST_DIV:
        q, r = fast_divmod(x, dv)
    else:
        q = x // dv.d
        r = x % dv.d
    return q, r


@gluon.jit
def _pick_divisor(cond, a, b):
    """:class:`FastDivisor` ``a`` where ``cond`` holds, else ``b``."""
    return FastDivisor(gl.where(cond, a.d, b.d), gl.where(cond, a.mul, b.mul), gl.where(cond, a.shift, b.shift))


def last_section_width(batch_heads: int, section: int) -> int:
    """The (batch, q_head) columns of the LPT order's last section: ``section``, or the fewer left
    over when ``batch_heads`` is not a multiple of it."""
    return batch_heads - (batch_heads - 1) // section * section


# a tile's prologue (Q load, ring fill) and epilogue (O store), in K/V tiles of its loop: an
# estimate that orders the balanced schedule, never what a tile computes
TILE_OVERHEAD_KV_TILES = 1.0


def tile_position(tile_id: int, num_m_blocks: int, batch_heads: int, section: int, lpt: bool) -> tuple[int, int]:
    """``(batch · heads_q + q_head, m_block)`` of a linear tile id, as :func:`tile_coords` maps it
    on the device (host-side: the balanced schedule and the L2 model walk the same order)."""
    if lpt:
        per_section = num_m_blocks * section
        first = (tile_id // per_section) * section
        width = min(section, batch_heads - first)
        r = tile_id - (tile_id // per_section) * per_section
        return first + r % width, num_m_blocks - 1 - r // width
    return tile_id // num_m_blocks, tile_id % num_m_blocks


def tile_m_blocks(num_m_blocks: int, batch_heads: int, section: int, lpt: bool) -> list[int]:
    """The m-block of every linear tile id, as :func:`tile_coords` (and :func:`tile_position`)
    orders them: per section, m-blocks from the last down, each once per head of the section;
    without LPT, every head's m-blocks in order. Built section by section rather than tile by tile:
    a new shape's first call pays it on the host."""
    if not lpt:
        return list(range(num_m_blocks)) * batch_heads
    out = []
    for first in range(0, batch_heads, section):
        width = min(section, batch_heads - first)
        for m in range(num_m_blocks - 1, -1, -1):
            out += [m] * width
    return out


def check_consumer_share(consumer_share: tuple[float, ...], block_m: int) -> None:
    """Refuse a ``consumer_share`` (:func:`tile_cost`) that is not one share in (0, 1] per consumer
    warpgroup of a ``block_m``-row tile, the last 1.0; an empty one (every tile whole) passes."""
    share = tuple(consumer_share)
    if share and (block_m % len(share) or share[-1] != 1.0 or not all(0.0 < x <= 1.0 for x in share)):
        raise ValueError("consumer_share must hold one share in (0, 1] per consumer warpgroup of the tile "
                         f"(block_m {block_m} divisible by their count), the last 1.0; got {consumer_share!r}")


def tile_cost(m_block: int, block_m: int, kv_tile: int, seqlen_q: int, seqlen_k: int, causal: bool,
              consumer_share: tuple[float, ...] = (), window_left: int = -1, window_right: int = 0,
              overhead: float = TILE_OVERHEAD_KV_TILES) -> float:
    """The balanced schedule's estimate of query tile ``m_block``, in K/V steps: its live K/V tiles
    and :data:`TILE_OVERHEAD_KV_TILES`. With ``consumer_share`` (one entry per consumer warpgroup
    of the tile, the last 1.0), a tile whose rows fill only ``k`` of its warpgroups — the partial
    last one — costs ``consumer_share[k - 1]`` of that: the empty warpgroups issue no GEMM and no
    softmax (``skip_empty_rows``), so its steps are shorter. ``window_left`` >= 0: a sliding
    window's launch, whose tiles start at the window's first (:func:`window_tile_range`) — under a
    causal mask every tile past the window's width costs about the same, where the causal count
    alone grows with the row; ``window_right`` its right side, the causal launch's diagonal moved.
    ``overhead``: the prologue's and epilogue's estimate in K/V steps (``tile_overhead_steps``)."""
    cost = live_blocks(m_block, block_m, kv_tile, seqlen_q, seqlen_k, causal, window_left,
                       window_right) + overhead
    if consumer_share:
        rows = min(block_m, seqlen_q - m_block * block_m)
        rows_per_consumer = block_m // len(consumer_share)
        cost *= consumer_share[-(-rows // rows_per_consumer) - 1]
    return cost


def balanced_schedule(num_m_blocks: int, batch_heads: int, section: int, lpt: bool, seqlen_q: int, seqlen_k: int,
                      block_m: int, kv_tile: int, causal: bool, ctas: int,
                      consumer_share: tuple[float, ...] = (), pool_share: float = 0.0,
                      window_left: int = -1, window_right: int = 0,
                      overhead: float = TILE_OVERHEAD_KV_TILES) -> tuple[int, ...]:
    """``offsets (ctas + 1) + order (tiles)``: CTA ``i`` runs tiles ``order[offsets[i]:offsets[i + 1]]``.

    Greedy list scheduling of the launch order (each tile to the CTA with the least estimated
    work, the lowest index on ties), the schedule a dynamic hand-out would make if tiles took
    their estimated time; every CTA keeps its tiles in launch order (heaviest first under LPT).
    The kernel reads it as one int32 table, which ``fwd`` builds once per shape and keeps.
    ``consumer_share``: the estimate of a partial query tile (:func:`tile_cost`). ``pool_share``:
    the launch order's last tiles, up to that share of the estimated work (:func:`pool_start`), are
    left out of the lists for the dynamic hand-out; ``offsets[ctas]`` is then the first of them.
    ``window_left``, ``window_right``: a sliding window's sides (:func:`tile_cost`), -1 and 0 for none;
    ``overhead``: a tile's prologue and epilogue in K/V steps (:func:`tile_cost`).
    """
    for name, value in (("num_m_blocks", num_m_blocks), ("batch_heads", batch_heads), ("section", section),
                        ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k), ("block_m", block_m),
                        ("kv_tile", kv_tile), ("ctas", ctas)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    check_consumer_share(consumer_share, block_m)
    cost = [tile_cost(m, block_m, kv_tile, seqlen_q, seqlen_k, causal, tuple(consumer_share), window_left,
                      window_right, overhead) for m in range(num_m_blocks)]
    lists = [[] for _ in range(ctas)]
    m_blocks = tile_m_blocks(num_m_blocks, batch_heads, section, lpt)
    listed = pool_start([cost[m] for m in m_blocks], pool_share)
    for tile_id, i in enumerate(_deal([cost[m] for m in m_blocks[:listed]], ctas)[1]):
        lists[i].append(tile_id)
    offsets = [0]
    for tiles in lists:
        offsets.append(offsets[-1] + len(tiles))
    return tuple(offsets) + tuple(t for tiles in lists for t in tiles)


def lists_makespan(num_m_blocks: int, batch_heads: int, section: int, lpt: bool, seqlen_q: int, seqlen_k: int,
                   block_m: int, kv_tile: int, causal: bool, ctas: int, consumer_share: tuple[float, ...] = (),
                   overhead: float = TILE_OVERHEAD_KV_TILES) -> float:
    """The balanced lists' makespan over the mean work a CTA, both in :func:`tile_cost`'s estimate:
    how far past the mean the last CTA's list ends (1.0: evenly)."""
    cost = [tile_cost(m, block_m, kv_tile, seqlen_q, seqlen_k, causal, tuple(consumer_share), overhead=overhead)
            for m in range(num_m_blocks)]
    loads, _ = _deal([cost[m] for m in tile_m_blocks(num_m_blocks, batch_heads, section, lpt)], ctas)
    return max(loads) * ctas / sum(loads)


def _deal(costs, ctas: int) -> tuple[list[float], list[int]]:
    """Greedy list scheduling: each tile of the launch order (priced ``costs``, in that order) to
    the CTA with the least estimated work, the lowest index on ties. Returns every CTA's estimated
    work and each tile's CTA. One heap: a pack's table is built on every call with new lengths.

    Whole costs (the estimate without ``consumer_share``: K/V steps and a whole overhead) sum
    exactly in float64, so the heap holds one Python integer a CTA, ``load << bits | cta``: it
    orders as the ``(load, cta)`` pairs do, and compares and adds without a tuple a tile — the
    same owners, 1.6x faster on the project's CPU host (about 0.17 us a tile against 0.28).
    Fractional costs keep the pairs, whose float sums the owners depend on."""
    costs = np.asarray(costs, dtype=np.float64).reshape(-1)
    if costs.size and (costs >= 0).all() and (costs == np.floor(costs)).all() and costs.sum() < 2.0 ** 52:
        bits = ctas.bit_length()
        free = list(range(ctas))                   # already a heap: equal loads, ascending index
        keys = []
        take, replace = keys.append, heapq.heapreplace
        for step in (costs.astype(np.int64) << bits).tolist():
            key = free[0]
            take(key)
            replace(free, key + step)
        loads = [0.0] * ctas
        for key in free:
            loads[key & ((1 << bits) - 1)] = float(key >> bits)
        return loads, (np.array(keys, dtype=np.int64) & ((1 << bits) - 1)).tolist()
    free = [(0.0, i) for i in range(ctas)]         # already a heap: equal loads, ascending index
    owner = []
    take, replace = owner.append, heapq.heapreplace
    for cost in costs.tolist():
        load, i = free[0]
        take(i)
        replace(free, (load + cost, i))
    loads = [0.0] * ctas
    for load, i in free:
        loads[i] = load
    return loads, owner


# a divided section is taken where the lists' modeled makespan drops by more than this fraction
# of the mean work a CTA: a closer call keeps the budget's wider section (more heads share L2)
DIVIDED_SECTION_MIN_GAIN = 0.005


def balanced_section(num_m_blocks: int, batch_heads: int, section: int, group: int, lpt: bool, seqlen_q: int,
                     seqlen_k: int, block_m: int, kv_tile: int, causal: bool, ctas: int,
                     consumer_share: tuple[float, ...] = (), overhead: float = TILE_OVERHEAD_KV_TILES) -> int:
    """The LPT section a balanced launch walks: ``section`` (the L2 budget's width), or the widest
    narrower one that divides ``batch_heads`` (a multiple of the GQA ``group``, at least half of
    ``section``) where the lists' modeled makespan (:func:`lists_makespan`) is lower by more than
    :data:`DIVIDED_SECTION_MIN_GAIN`.

    Why: inside a section the tiles go heaviest first, so a short last section puts heavy tiles at
    the very end of the launch order, where the greedy lists have nothing light left to fill the
    gaps. MLA's 192/128 at B2 H16 S8192 causal sizes its sections at 3 of 32 columns (16 MiB of
    K/V a section, 5 MiB a head): the last holds 2, the lists' makespan is 1.050x the mean, and the
    tile trace measured 4.6% of the CTAs' time idle at the end (H100); sections of 2: 1.0005.
    Narrower is not always better: with fewer tiles than CTAs a section's heavy tiles are what the
    others fill around (B3 H5 S4096 d128: 8 columns 1.037, 5 columns 1.147), hence the model.
    Power-of-two head dims and head counts already divide; only the K/V bytes a section holds can
    shrink, never grow past the budget."""
    if not lpt or batch_heads % section == 0:
        return section
    divided = next((w for w in range(section - 1, 0, -1)
                    if 2 * w >= section and batch_heads % w == 0 and w % group == 0), None)
    if divided is None:
        return section
    args = (lpt, seqlen_q, seqlen_k, block_m, kv_tile, causal, ctas, consumer_share, overhead)
    if lists_makespan(num_m_blocks, batch_heads, divided, *args) \
            < lists_makespan(num_m_blocks, batch_heads, section, *args) - DIVIDED_SECTION_MIN_GAIN:
        return divided
    return section


def tile_id_of(head, m_block, num_m_blocks: int, batch_heads: int, section: int, lpt: bool):
    """The linear tile id :func:`tile_position` maps to ``(head, m_block)`` (``head``: batch · heads_q
    + q_head): its inverse, host-side; ``head`` and ``m_block`` integers or numpy arrays alike."""
    if not lpt:
        return head * num_m_blocks + m_block
    first = (head // section) * section
    width = np.minimum(section, batch_heads - first)
    return first * num_m_blocks + (num_m_blocks - 1 - m_block) * width + (head - first)


@dataclasses.dataclass(frozen=True)
class PackedSections:
    """The L2 sections of a packed launch's hand-out order (:func:`packed_tiles`): runs of (sequence,
    K/V head) columns whose K and V fit ``budget_bytes`` together, by each sequence's own keys.

    Why: heaviest first across the whole pack, a causal pack's first round is the last q-tile of
    every (sequence, head) column at once — every head's whole K/V in flight (four sequences of
    8192 at d128 H16: 256 MiB against the L2's 50), where an unpacked launch walks 16 MiB sections
    (:func:`head_section`). ``kv_bytes_per_key``: K's and V's bytes of one key of one K/V head;
    ``group``: q-heads a K/V head (GQA), kept in one section."""
    budget_bytes: int
    kv_bytes_per_key: int
    group: int = 1

    def __post_init__(self):
        for name in ("budget_bytes", "kv_bytes_per_key", "group"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PackedSections.{name} must be a positive integer, got {value!r}")

    def of(self, lens_q, lens_k, heads_q: int, block_m: int, kv_tile: int, causal: bool,
           window_left: int = -1, window_right: int = 0) -> np.ndarray:
        """The section rank of every (sequence · ``heads_q`` + q-head) column. The sequences go
        heaviest first (by their heaviest q-tile, ties in pack order), their K/V heads in order,
        each section filled until the next K/V head would overflow the budget (one at least); the
        sections keep that order, so the pack's tail is its lightest sequences' tiles."""
        if heads_q % self.group:
            raise ValueError(f"heads_q ({heads_q}) must be a multiple of PackedSections.group ({self.group})")
        lens_q = np.asarray(lens_q, dtype=np.int64).reshape(-1)
        lens_k = np.asarray(lens_k, dtype=np.int64).reshape(-1)
        seq, _, cost = sequence_tile_costs(lens_q, lens_k, block_m, kv_tile, causal, (), window_left, window_right)
        heaviest = np.zeros(lens_q.size)
        np.maximum.at(heaviest, seq, cost)
        kv_heads = heads_q // self.group
        budget = self.budget_bytes
        # each sequence's first section, how many of its heads fit there, and the heads a later
        # section holds: the walk in Python integers (a pack of 2000 sequences walks them all on
        # every new pack), the ranks filled at once after it
        first = [0] * lens_q.size
        fit_first = [kv_heads] * lens_q.size
        per = [1] * lens_q.size
        section, used = 0, 0
        lens_k_list = lens_k.tolist()
        # every K/V head of a sequence has its bytes: a sequence's heads fill the open section as far
        # as they fit, then whole sections of ``per_section`` each (a head alone where one overflows)
        for b in np.argsort(-heaviest, kind="stable").tolist():
            head_bytes = lens_k_list[b] * self.kv_bytes_per_key
            if head_bytes == 0:
                if used > budget:
                    section, used = section + 1, 0
                first[b] = section
                continue
            per_section = max(1, budget // head_bytes)
            fit = min(kv_heads, per_section if used == 0 else max(0, (budget - used) // head_bytes))
            first[b], fit_first[b], per[b] = section, fit, per_section
            if kv_heads > fit:
                section += 1 + (kv_heads - fit - 1) // per_section
                used = ((kv_heads - fit - 1) % per_section + 1) * head_bytes
            else:
                used += fit * head_bytes
        first_a, fit_a, per_a = (np.array(x, dtype=np.int64)[:, None] for x in (first, fit_first, per))
        later = np.arange(kv_heads)[None, :] - fit_a
        rank = np.where(later < 0, first_a, first_a + 1 + np.maximum(later, 0) // per_a)
        return np.repeat(rank.reshape(-1), self.group)


def packed_schedule(lens_q, lens_k, heads_q: int, num_m_blocks: int, section: int, lpt: bool, block_m: int,
                    kv_tile: int, causal: bool, ctas: int, consumer_share: tuple[float, ...] = (),
                    window_left: int = -1, window_right: int = 0,
                    l2_sections: PackedSections | None = None,
                    overhead: float = TILE_OVERHEAD_KV_TILES) -> np.ndarray:
    """The balanced table (:func:`balanced_schedule`'s layout: ``offsets (ctas + 1) + order``, int32)
    of a launch of packed sequences, from their own lengths (``lens_q``, ``lens_k``, one entry per
    sequence; the launch covers ``num_m_blocks`` q-tiles of each, the longest's). Only the tiles
    that hold a row are listed (:func:`packed_tiles`), each priced by its own sequence's lengths,
    and dealt in :func:`packed_tiles`' order by :func:`deal_packed`; each CTA keeps its tiles in
    that order."""
    tile, cost = packed_tiles(lens_q, lens_k, heads_q, num_m_blocks, section, lpt, block_m, kv_tile, causal, ctas,
                              consumer_share, window_left, window_right, l2_sections, overhead)
    return np.concatenate(_packed_lists(tile, cost, ctas)).astype(np.int32)


def _packed_lists(tile: np.ndarray, cost: np.ndarray, ctas: int) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets (ctas + 1), tiles)`` of ``tile`` (a pack's launch order, priced ``cost``) dealt by
    :func:`deal_packed`: CTA ``i`` walks ``tiles[offsets[i]:offsets[i + 1]]``, in the launch order."""
    owner = deal_packed(cost, ctas)
    by_owner = np.argsort(owner, kind="stable")
    return np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=ctas))]), tile[by_owner]


# Up to this many tiles a CTA a pack's lists are dealt tile by tile (the greedy list schedule,
# about 0.17 us a tile on the project's CPU host); past it by rounds, which cost a quarter of that
# and end within 0.1% of the greedy's makespan there (packs of 64-2000 sequences, d64 and d128
# causal, 132 CTAs; derived in tile_cost's estimate): with a hundred tiles a CTA, a round's error
# is a hundredth.
PACKED_GREEDY_TILES_PER_CTA = 64


def deal_packed(cost: np.ndarray, ctas: int) -> np.ndarray:
    """The CTA of each tile of a pack's launch order (``cost``: each tile's estimate, in that order).

    Up to :data:`PACKED_GREEDY_TILES_PER_CTA` tiles a CTA, greedy list scheduling (each tile to the
    CTA with the least work so far, the lowest index on ties: :func:`_deal`). Past it, a round of
    ``ctas`` tiles at a time, the round's heaviest to the least-loaded CTA. Why not rounds always:
    in L2 sections (:class:`PackedSections`) the order is heaviest first section by section, so a
    round can hold one section's lightest tiles and the next one's heaviest; dealt in order, one
    tile a CTA each round, the pack of 8192, 4096 x2, 1024 x8 at d128 H16 ended its lists at 1.24x
    the mean work a CTA (greedy: 1.004x) and ran 20% slower than the run-time hand-out."""
    cost = np.asarray(cost, dtype=np.float64).reshape(-1)
    if not isinstance(ctas, int) or ctas < 1:
        raise ValueError(f"ctas must be a positive integer, got {ctas!r}")
    if cost.size <= PACKED_GREEDY_TILES_PER_CTA * ctas:
        return np.array(_deal(cost, ctas)[1], dtype=np.int64)
    owner = np.empty(cost.size, dtype=np.int64)
    load = np.zeros(ctas)
    # every whole round's tiles heaviest first in one sort (ties in order), so a round costs one
    # sort of the loads: 1.8x faster on 42-93 thousand tiles, the same owners
    full = cost.size - cost.size % ctas
    rounds = np.argsort(-cost[:full].reshape(-1, ctas), axis=1, kind="stable") + np.arange(0, full, ctas)[:, None]
    for heaviest in rounds:
        ctas_by_load = np.argsort(load, kind="stable")
        owner[heaviest] = ctas_by_load
        load[ctas_by_load] += cost[heaviest]
    if full < cost.size:
        owner[full + np.argsort(-cost[full:], kind="stable")] = np.argsort(load, kind="stable")[:cost.size - full]
    return owner


def packed_handout_table(lens_q, lens_k, heads_q: int, num_m_blocks: int, section: int, lpt: bool, block_m: int,
                         kv_tile: int, causal: bool, ctas: int, num_items: int, consumer_share: tuple[float, ...] = (),
                         window_left: int = -1, window_right: int = 0,
                         l2_sections: PackedSections | None = None, pool_share: float | None = None,
                         overhead: float = TILE_OVERHEAD_KV_TILES) -> np.ndarray:
    """The table the run-time hand-out of a packed launch draws from (``handout_table``), in the
    balanced table's layout: ``offsets (ctas + 1) + order + ctas × num_items``, int32. ``order``
    holds the launch's tiles that hold a row: CTA ``i`` walks ``order[offsets[i]:offsets[i + 1]]``,
    and every tile past ``offsets[ctas]`` is drawn (:func:`handout_item`: the draw is a position in
    ``order``), in :func:`packed_tiles`' order. ``pool_share`` None: CTA ``i`` lists the ``i``-th
    tile (none past the last) and draws every later one. A share in [0, 1): the tiles before the
    pool (:func:`pool_start`: the order's last tiles, up to that share of the estimated work) are
    dealt into lists (:func:`deal_packed`), each kept in the order, and only the pool is drawn —
    the lists keep the producer's look-ahead (the next tile's Q and first K load under this one,
    where a draw waits for its atomic's round trip first). The ``ctas`` entries of ``num_items``
    after it are each CTA's "none left": a CTA stops at its first, so the draws of a launch never
    run past them."""
    if not isinstance(num_items, int) or num_items < 1:
        raise ValueError(f"num_items must be a positive integer, got {num_items!r}")
    tile, cost = packed_tiles(lens_q, lens_k, heads_q, num_m_blocks, section, lpt, block_m, kv_tile, causal, ctas,
                              consumer_share, window_left, window_right, l2_sections, overhead)
    if tile.size and int(tile.max()) >= num_items:
        raise ValueError(f"num_items ({num_items}) must exceed every tile id of the launch, got tile {int(tile.max())}")
    if pool_share is None:
        offsets = np.minimum(np.arange(ctas + 1), tile.size)
        return np.concatenate([offsets, tile, np.full(ctas, num_items)]).astype(np.int32)
    listed = pool_start(cost, pool_share)
    offsets, lists = _packed_lists(tile[:listed], cost[:listed], ctas)
    return np.concatenate([offsets, lists, tile[listed:], np.full(ctas, num_items)]).astype(np.int32)


def packed_tiles(lens_q, lens_k, heads_q: int, num_m_blocks: int, section: int, lpt: bool, block_m: int,
                 kv_tile: int, causal: bool, ctas: int, consumer_share: tuple[float, ...] = (),
                 window_left: int = -1, window_right: int = 0,
                 l2_sections: PackedSections | None = None,
                 overhead: float = TILE_OVERHEAD_KV_TILES) -> tuple[np.ndarray, np.ndarray]:
    """``(tile, cost)`` of a launch of packed sequences: the launch's ids of the tiles that hold a
    row (a tile past its sequence's rows computes and stores nothing, and is never listed), each
    priced by its own sequence's lengths (:func:`tile_cost`), not the longest's. Without
    ``l2_sections``, heaviest first, ties in launch order; with it, section by section
    (:meth:`PackedSections.of`), each heaviest first — the LPT order of an unpacked launch, its
    sections sized by each sequence's own keys."""
    lens_q = np.asarray(lens_q, dtype=np.int64).reshape(-1)
    lens_k = np.asarray(lens_k, dtype=np.int64).reshape(-1)
    if lens_q.shape != lens_k.shape:
        raise ValueError(f"lens_q and lens_k must describe as many sequences, got {lens_q.size} and {lens_k.size}")
    for name, value in (("heads_q", heads_q), ("num_m_blocks", num_m_blocks), ("section", section),
                        ("block_m", block_m), ("kv_tile", kv_tile), ("ctas", ctas)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    check_consumer_share(consumer_share, block_m)
    if (lens_q < 0).any() or (lens_k < 0).any():
        raise ValueError("lens_q and lens_k must not be negative")
    m_blocks = -(-lens_q // block_m)
    if (m_blocks > num_m_blocks).any():
        b = int(np.argmax(m_blocks > num_m_blocks))
        raise ValueError(f"sequence {b} has {lens_q[b]} rows: more than the launch's {num_m_blocks} q-tiles of "
                         f"{block_m}")
    # each (sequence, q-tile) with a row
    seq, m, cost = sequence_tile_costs(lens_q, lens_k, block_m, kv_tile, causal, tuple(consumer_share), window_left,
                                       window_right, overhead)
    # every head of each: (batch · heads_q + q_head, m_block) → the launch's tile id
    head = (seq * heads_q)[None, :] + np.arange(heads_q)[:, None]
    tile = tile_id_of(head, m[None, :], num_m_blocks, lens_q.size * heads_q, section, lpt).reshape(-1)
    # heaviest first, ties in launch order (within each L2 section, in section order): one int64 key
    # (section, the cost's rank among the pack's distinct costs, tile) sorted once — 2-3x faster
    # than a three-key lexsort on a pack's tens of thousands of tiles (timsort finds its runs)
    levels, cost_rank = np.unique(cost, return_inverse=True)
    heavier = np.broadcast_to((levels.size - 1 - cost_rank.reshape(-1))[None, :], head.shape).reshape(-1)
    tiles_per = int(tile.max()) + 1 if tile.size else 1
    column_section = (l2_sections.of(lens_q, lens_k, heads_q, block_m, kv_tile, causal, window_left, window_right)
                      if l2_sections is not None else np.zeros(lens_q.size * heads_q, dtype=np.int64))
    sections = int(column_section.max()) + 1 if column_section.size else 1
    if sections * levels.size * tiles_per >= 1 << 62:
        raise ValueError(f"a pack of {lens_q.size} sequences in {sections} L2 sections of {tiles_per} tile ids is too "
                         "large to order")
    key = (column_section[head.reshape(-1)] * levels.size + heavier) * tiles_per + tile
    order = np.argsort(key, kind="stable")
    cost = np.broadcast_to(cost[None, :], head.shape).reshape(-1)
    return tile[order], cost[order]


def sequence_tile_costs(lens_q, lens_k, block_m: int, kv_tile: int, causal: bool,
                        consumer_share: tuple[float, ...] = (), window_left: int = -1,
                        window_right: int = 0,
                        overhead: float = TILE_OVERHEAD_KV_TILES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(seq, m_block, cost)`` of every q-tile of every sequence (``lens_q``, ``lens_k``, one entry
    each; sequence order, then q-tile order): :func:`tile_cost` of each, or its prologue and
    epilogue alone for a sequence without a key — computed for the whole pack at once, because a
    pack's table is built on every call with new lengths (a training loop's packs differ from step
    to step), where a call of :func:`tile_cost` per tile took most of a 256-sequence table's 6 ms."""
    lens_q = np.asarray(lens_q, dtype=np.int64).reshape(-1)
    lens_k = np.asarray(lens_k, dtype=np.int64).reshape(-1)
    m_blocks = -(-lens_q // block_m)
    seq = np.repeat(np.arange(lens_q.size), m_blocks)
    m = np.arange(seq.size) - np.repeat(np.cumsum(m_blocks) - m_blocks, m_blocks)
    lq, lk = lens_q[seq], lens_k[seq]
    # model.schedule.live_blocks, elementwise
    end = -(-lk // kv_tile)
    if causal:
        last_key = np.minimum((m + 1) * block_m, lq) - 1 + (lk - lq) + window_right
        end = np.where(last_key < 0, 0, np.minimum(end, np.maximum(last_key, 0) // kv_tile + 1))
    first = np.maximum(0, m * block_m + lk - lq - window_left) // kv_tile if window_left >= 0 else 0
    live = np.maximum(0, end - first)
    cost = np.where(lk == 0, overhead, live + overhead).astype(np.float64)
    if consumer_share:
        rows = np.minimum(block_m, lq - m * block_m)
        share = np.asarray(consumer_share, dtype=np.float64)
        scaled = cost * share[-(-rows // (block_m // len(consumer_share))) - 1]
        cost = np.where(lk == 0, cost, scaled)
    return seq, m, cost


def pool_start(costs, pool_share: float) -> int:
    """The first tile of the run-time pool: the longest suffix of the launch order (``costs``, each
    tile's estimate in order) whose estimated work is at most ``pool_share`` of the whole. Under LPT
    it holds the lightest tiles, drawn as CTAs run out of their lists; 0.0 leaves it empty."""
    if not 0.0 <= pool_share < 1.0:
        raise ValueError(f"pool_share must be in [0, 1), got {pool_share!r}")
    costs = np.asarray(costs, dtype=np.float64).reshape(-1)
    # the longest suffix within the budget: the suffix sums, from the last tile back, against it
    within = np.cumsum(costs[::-1]) <= pool_share * costs.sum()
    return int(costs.size - (np.argmin(within) if not within.all() else costs.size))


@gluon.jit
def work_range(sched_ptr, num_items, BALANCED: gl.constexpr, CLUSTER_PAIRS: gl.constexpr = False):
    """``(start, stop, step)`` of the positions this CTA walks: its stretch of the balanced table, or
    the stride ``pid, pid + P, …`` over the work items themselves — with ``CLUSTER_PAIRS``
    (``kv_multicast``) over the clusters of two, both CTAs of a cluster walking the same items."""
    pid = gl.program_id(0)
    if BALANCED:
        first = gl.num_programs(0) + 1          # the order follows the offsets
        out = (first + gl.load(sched_ptr + pid), first + gl.load(sched_ptr + pid + 1), 1)
    elif CLUSTER_PAIRS:
        cluster, clusters = cluster_index()
        out = (cluster, num_items, clusters)
    else:
        out = (pid, num_items, gl.num_programs(0))
    return out


@gluon.jit
def work_at(sched_ptr, pos, BALANCED: gl.constexpr):
    """The work item at position ``pos`` of :func:`work_range`."""
    if BALANCED:
        item = gl.load(sched_ptr + pos)
    else:
        item = pos
    return item


# The dynamic hand-out: work items drawn at run time from a counter shared by the launch, in the
# launch order (heaviest first under LPT), so a CTA that finishes early takes the next tile instead
# of idling while a list estimated on the host runs out unevenly. ``dynamic_tiles``: every item
# past each CTA's first (its program id) is drawn; ``dynamic_pool_share`` with the balanced lists:
# each CTA walks its list, then draws from the pool of the order's last tiles (:func:`pool_start`);
# ``handout_table`` (packed launches): each CTA's first tile listed, then draws through a table of
# the tiles with a row (:func:`packed_handout_table`). Two int32 words: the draws, and the CTAs
# done. The last CTA to finish zeroes both, so the next launch on the stream (or the next replay of
# a captured graph) starts from zero without a memset.
HANDOUT_WORDS = 2


@gluon.jit
def handout_next(counter_ptr, first):
    """The next work item of the dynamic hand-out: ``first`` (the pool's first item) plus the draws
    so far (``num_items`` or more: none left). Relaxed: the draw orders nothing but itself; the
    count of CTAs done orders the draws before the reset."""
    return first + gl.atomic_add(counter_ptr, 1, sem="relaxed")


@gluon.jit
def handout_range(sched_ptr, BALANCED: gl.constexpr):
    """``(start, stop, pool)`` of the dynamic hand-out: the positions of this CTA's listed items
    (:func:`work_at`) and the pool's first item. Without the lists, a CTA's one listed item is its
    program id and the pool starts past the grid's."""
    pid = gl.program_id(0)
    if BALANCED:
        start, stop, _ = work_range(sched_ptr, 0, BALANCED)
        pool = gl.load(sched_ptr + gl.num_programs(0))     # offsets[ctas]: the tiles listed
    else:
        start = pid
        stop = pid + 1
        pool = gl.num_programs(0)
    return start, stop, pool


@gluon.jit
def handout_item(sched_ptr, counter_ptr, pos, stop, pool, BALANCED: gl.constexpr, TABLE: gl.constexpr = False):
    """The item at position ``pos`` of this CTA's list while it lasts, then a draw from the pool:
    the item itself, or with ``TABLE`` (:func:`packed_handout_table`) a position in the table's
    order, whose entry is the item (``num_items`` past the last: none left)."""
    if pos < stop:
        item = work_at(sched_ptr, pos, BALANCED)
    else:
        item = handout_next(counter_ptr, pool)
        if TABLE:
            item = gl.load(sched_ptr + gl.num_programs(0) + 1 + item)
    return item


@gluon.jit
def handout_finish(counter_ptr):
    """This CTA has drawn its last item. Acquire-release on the count of CTAs done: every CTA's
    draws happen before its count, so the last CTA's reset follows every draw of the launch."""
    done = gl.atomic_add(counter_ptr + 1, 1, sem="acq_rel")
    if done == gl.num_programs(0) - 1:
        gl.store(counter_ptr, 0)
        gl.store(counter_ptr + 1, 0)


@gluon.jit
def work_item(item, num_full_tiles, tail_splits, SPLIT_TAIL: gl.constexpr, FAST_DIV: gl.constexpr):
    """(tile_id, split) of work item ``item``: a whole tile (``split = -1``) or split ``split`` of a
    tail tile (see :func:`tail_split`). ``tail_splits`` is a :class:`FastDivisor`, divided as
    :func:`divide` does with ``FAST_DIV``."""
    if SPLIT_TAIL:
        tail = gl.maximum(item - num_full_tiles, 0)
        is_split = item >= num_full_tiles
        tail_tile, split_of_tile = divide_mod(tail, tail_splits, FAST_DIV)
        tile_id = gl.where(is_split, num_full_tiles + tail_tile, item)
        split = gl.where(is_split, split_of_tile, -1)
    else:
        tile_id = item
        split = -1
    return tile_id, split


@gluon.jit
def kv_split_range(num_kv_tiles, split, tail_splits, SPLIT_TAIL: gl.constexpr, FAST_DIV: gl.constexpr):
    """``[kv_lo, kv_hi)``: the K/V tiles of a work item; every tile for a whole one (``split < 0``).
    ``tail_splits`` as in :func:`work_item`."""
    if SPLIT_TAIL:
        # a whole tile's (negative) products are divided too, and discarded
        kv_lo = gl.where(split < 0, 0, divide(split * num_kv_tiles, tail_splits, FAST_DIV))
        kv_hi = gl.where(split < 0, num_kv_tiles, divide((split + 1) * num_kv_tiles, tail_splits, FAST_DIV))
    else:
        kv_lo = 0
        kv_hi = num_kv_tiles
    return kv_lo, kv_hi


@gluon.jit
def tile_coords(tile_id, num_m_blocks, batch_heads, heads_q, head_section, LPT: gl.constexpr):
    """(batch, q_head, m_block) of linear tile ``tile_id``, by the hardware's division
    (:func:`fast_tile_coords` divides by multiply-high)."""
    if LPT:
        per_section = num_m_blocks * head_section
        section = tile_id // per_section
        first_bh = section * head_section
        width = gl.minimum(head_section, batch_heads - first_bh)
        r = tile_id - section * per_section
        m_block = num_m_blocks - 1 - r // width
        bh = first_bh + r % width
    else:
        bh = tile_id // num_m_blocks
        m_block = tile_id % num_m_blocks
    return bh // heads_q, bh % heads_q, m_block


@gluon.jit
def fast_tile_coords(tile_id, num_m_blocks, batch_heads, heads_q, head_section, last_section, per_section,
                     LPT: gl.constexpr):
    """:func:`tile_coords` dividing by :class:`FastDivisor` values: ``num_m_blocks``, ``heads_q``,
    ``head_section``, ``last_section`` (its width: :func:`last_section_width`) and ``per_section``
    (``num_m_blocks · head_section`` tiles)."""
    if LPT:
        section, r = fast_divmod(tile_id, per_section)
        first_bh = section * head_section.d
        # only the last section may be narrower; a run-time width would need a division again
        width = _pick_divisor(first_bh + head_section.d > batch_heads, last_section, head_section)
        m_from_last, col = fast_divmod(r, width)
        m_block = num_m_blocks.d - 1 - m_from_last
        bh = first_bh + col
    else:
        bh, m_block = fast_divmod(tile_id, num_m_blocks)
    b, h = fast_divmod(bh, heads_q)
    return b, h, m_block


# Staggered K/V sweeps (``stagger_kv``): work item ``m`` starts its unmasked K/V tiles at the
# fraction frac(m / φ) of them and wraps around, so CTAs launched together (equal tiles of one
# head under the plain order) stop requesting the same K/V lines at the same moment. The
# fraction is STAGGER_STEP / 2**STAGGER_BITS ≈ 1/φ per m-block (a low-discrepancy sequence:
# neighbouring m-blocks land far apart) in integer arithmetic: (m · 633 mod 1024) · n / 1024.
STAGGER_BITS = gl.constexpr(10)
STAGGER_STEP = gl.constexpr(633)


@gluon.jit
def kv_stagger(m_block, kv_lo, kv_hi, num_unmasked, STAGGER: gl.constexpr, WINDOW: gl.constexpr = 0,
               kv_first=0, FROM_ZERO: gl.constexpr = False):
    """``(n_rot, start)``: the item's unmasked K/V tiles ``[kv_lo, kv_lo + n_rot)`` are visited from
    ``kv_lo + start`` on, wrapping (masked tiles keep their place at the end: a mask is never
    applied out of order). ``start`` spreads over the first ``WINDOW`` tiles (0: all ``n_rot``);
    ``start = 0`` without ``STAGGER``. ``FROM_ZERO``: only an item whose first K/V tile
    ``kv_first`` is the first of the keys staggers (a sliding window's uncut items; the others
    start at their window's edge, apart already)."""
    n_rot = gl.maximum(gl.minimum(num_unmasked, kv_hi) - kv_lo, 0)
    if STAGGER:
        if WINDOW > 0:
            span = gl.minimum(n_rot, WINDOW)
        else:
            span = n_rot
        if FROM_ZERO:
            # a cut item spreads over no tile: start = 0, its sweep in order
            span = gl.where(kv_first == 0, span, 0)
        start = (((m_block * STAGGER_STEP) & ((1 << STAGGER_BITS) - 1)) * span) >> STAGGER_BITS
    else:
        start = 0
    return n_rot, start


@gluon.jit
def kv_visit(j, kv_lo, n_rot, start, STAGGER: gl.constexpr, BY_SUBTRACT: gl.constexpr = False,
             KEEP_BEFORE: gl.constexpr = False):
    """The absolute K/V tile an item visits at its step for tile ``j`` (``kv_lo <= j < kv_hi``).

    ``BY_SUBTRACT`` wraps with one compare and subtract, exact because ``0 <= k < n_rot`` and
    ``0 <= start < n_rot``: ``n_rot`` is a run-time value, so ``%`` compiles to a division
    (``I2F.RP``, ``MUFU.RCP``, ``F2I`` and about twenty integer instructions, census) at every
    step of the producer, whose warp shares a scheduler with one warp of every consumer.
    ``KEEP_BEFORE``: tiles before ``kv_lo`` keep their place too (``j`` may then be below it: the
    tiles a sliding window cuts, masked ahead of the rotated run)."""
    if STAGGER:
        k = j - kv_lo
        t = j
        if KEEP_BEFORE:
            if k < 0:
                # past the run's reach, as a masked tile after it is
                k = n_rot
        if k < n_rot:
            if BY_SUBTRACT:
                w = k + start
                if w >= n_rot:
                    w -= n_rot
                t = kv_lo + w
            else:
                t = kv_lo + (k + start) % n_rot
    else:
        t = j
    return t


@gluon.jit
def window_tile_range(row0, seqlen_q, seqlen_k, window_left, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(first, left_unmasked) K/V tiles of the query rows ``[row0, row0 + BLOCK_M)`` under a sliding
    window of ``window_left`` keys to the left (flash-attn's ``window_size[0]``, bottom-right aligned:
    row ``r`` sees no key before ``r + Sk − Sq − window_left``). Tile ``first`` holds the first row's
    first visible key; from tile ``left_unmasked`` on, every row sees the tile's keys on the left
    (the last row's bound decides). Tiles ``[first, left_unmasked)`` need the window's mask."""
    off = seqlen_k - seqlen_q
    last_row = gl.minimum(row0 + BLOCK_M, seqlen_q) - 1
    first = gl.maximum(row0 + off - window_left, 0) // BLOCK_N
    left_unmasked = gl.cdiv(gl.maximum(last_row + off - window_left, 0), BLOCK_N)
    return first, left_unmasked


@gluon.jit
def kv_tile_range(row0, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, diag_shift=0):
    """(num_tiles, num_unmasked) K/V tiles for the query rows ``[row0, row0 + BLOCK_M)``.

    Tiles ``[0, num_unmasked)`` need no mask for any row of the CTA; tiles
    ``[num_unmasked, num_tiles)`` are masked (key tail ``>= Sk`` and/or the causal diagonal).
    ``diag_shift``: the diagonal moved that many keys right (a sliding window's right side).
    """
    if IS_CAUSAL:
        diag = seqlen_k - seqlen_q + diag_shift
        last_row = gl.minimum(row0 + BLOCK_M, seqlen_q) - 1
        kv_end = gl.maximum(gl.minimum(seqlen_k, last_row + diag + 1), 0)
        # keys every row of the tile sees: those the first row sees
        full_end = gl.maximum(gl.minimum(seqlen_k, row0 + diag + 1), 0)
        num_tiles = gl.cdiv(kv_end, BLOCK_N)
        num_unmasked = full_end // BLOCK_N
    else:
        num_tiles = gl.cdiv(seqlen_k, BLOCK_N)
        num_unmasked = seqlen_k // BLOCK_N
    return num_tiles, num_unmasked
