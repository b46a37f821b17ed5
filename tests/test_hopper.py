"""hopper.fwd: what the compiler made of it (CPU, ahead-of-time) and what it computes (sm_90 GPU).

CPU tests compile the shipped configurations for sm_90a and read the SASS back (census): tensor
cores (HGMMA), TMA (UTMALDG), register reallocation (USETMAXREG), no local-memory traffic, shared
memory within 227 KiB, and the softmax placed between the QK wait and the PV wait. GPU tests run
the correctness gate and need compute capability 9.0.
"""
import collections
import dataclasses
import functools
import itertools
import math
import re
import types

import pytest
import torch
import triton

from flashrung.dispatch import Problem
from flashrung.kernels.hopper import config, fwd, pipeline, schedule
from flashrung.kernels.hopper.config import SMEM_PER_BLOCK_BYTES, HopperFwdConfig, replace_following, select_config
from flashrung.kernels.hopper.schedule import head_section, tail_split
from conftest import Subprocesses, early_start

HEAD_DIMS = (64, 128, 256)


def _problem(**changes) -> Problem:
    base = dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=8, heads_kv=2, head_dim=128, head_dim_v=128,
                dtype=torch.bfloat16, causal=False, device_type="cuda", capability=(9, 0), interpreter=False)
    base.update(changes)
    return Problem(**base)


def _d128_unpaired(causal, seqlen=16384):
    """d128's default at this length without the pairing (non-causal from S4k pairs its CTAs,
    change 46; unpairing gives back the earlier default field for field): the kernel the d128
    switches in this file were built and gated on, most of which the pairing cannot run with."""
    return replace_following(fwd.default_config(128, causal, seqlen), 128, kv_multicast=False)


def _d64_unpaired_32k():
    """d64 non-causal's 32k default before change 47 paired it: the staggered sweep with Gluon's
    arrivals (unpairing alone leaves the inline arrivals and the unstaggered sweep the pair needs)."""
    return replace_following(fwd.default_config(64, False, 32768), 64, kv_multicast=False, asm_arrivals=False,
                             stagger_kv=True, stagger_subtract=True)


# --------------------------------------------------------------------------- census (CPU)


# Gluon cannot compile in a process that imported Triton under TRITON_INTERPRET=1 (the CPU test
# set-up), so the compiles run in a clean child process, like the census command does.
_CENSUS_SCRIPT = r"""
import collections, dataclasses, json, os, re, sys, tempfile
import torch
from flashrung.evidence.census import census_one, compile_spec, innermost_loops, sass_text
from flashrung.kernels.hopper import fwd
from flashrung.kernels.hopper.pipeline import BARRIER_OFFSETS, allocation_offsets

def windows(sass):
    # for each wgmma wait(1) (QK done, PV pending): MUFU.EX2 count up to the next wgmma wait
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(?:\s+(gsb0, 0x[012]))?", sass)
    out, cur = [], None
    for op, arg in ops:
        if op == "WARPGROUP.DEPBAR.LE" and arg in ("gsb0, 0x1", "gsb0, 0x2"):
            cur = 0
        elif op == "WARPGROUP.DEPBAR.LE" and cur is not None:
            out.append(cur)
            cur = None
        elif cur is not None and op == "MUFU.EX2":
            cur += 1
    return out

def steady_loop(sass):
    # the steady-state KV loop: from the back-edge target to the back edge around the first wait
    # with groups outstanding (wait(1); wait(2) when each product is two wgmma groups)
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    where = {a: i for i, (a, _) in enumerate(ins)}
    first = next((i for i, (_, t) in enumerate(ins) if re.search(r"DEPBAR.LE gsb0, 0x[12]", t)), None)
    if first is None:
        return None
    for j in range(first, len(ins)):
        m = re.search(r"\bBRA (0x[0-9a-f]+)", ins[j][1])
        if m and int(m.group(1), 16) < ins[first][0] and not ins[j][1].startswith("@!P"):
            body = ins[where[int(m.group(1), 16)]: j + 1]
            break
    ops = [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for _, t in body]
    rs = lambda t: re.search(r"HGMMA\S* R\d+, R\d+", t) is not None     # P from registers: PV
    pv = [k for k, (_, t) in enumerate(body) if t.startswith("HGMMA") and rs(t)]
    # P from shared memory (p_in_smem): no PV reads registers, and no rescale precedes one
    return dict(prmt=ops.count("PRMT"), fmul=ops.count("FMUL"), ldl=ops.count("LDL") + ops.count("STL"),
                fmul_before_pv=sum(op == "FMUL" for op in ops[:pv[0]]) if pv else None, length=len(ops),
                pv_from_registers=len(pv), stsm=sum(op.startswith("STSM") for op in ops),
                bar=sum(op.startswith("BAR.") for op in ops),
                hgmma_n64=sum(t.startswith("HGMMA.64x64x16") for _, t in body), mufu=ops.count("MUFU.EX2"))

def kv_loops(sass):
    # every innermost loop of 151+ instructions that issues a wgmma (the K/V loops of each consumer
    # partition, masked and unmasked): its length and its mask and local-memory opcodes
    return [dict(length=loop["length"], fsel=loop["FSEL"], isetp=loop["ISETP"], ldl=loop["LDL"] + loop["STL"],
                 mufu=loop["MUFU"], bar=loop["BAR"], arrives=loop["sequence"].split().count("ARRIVES"),
                 forward_skip=loop["forward_skip"], fadd=loop["FADD"], fmul=loop["FMUL"], hgmma=loop["HGMMA"],
                 s2ur=loop["sequence"].split().count("S2UR"), fmnmx=loop["sequence"].split().count("FMNMX"),
                 fmnmx_before_last_wait=fmnmx_before_last_wait(loop["sequence"].split()),
                 mufu_before_last_wait=mufu_before_last_wait(loop["sequence"].split()),
                 fmul_after_last_mufu=fmul_after_last_mufu(loop["sequence"].split()))
            for loop in innermost_loops(sass, min_length=151) if loop["HGMMA"]]

def fmnmx_before_last_wait(seq):
    # the row max's FMNMX issued before the trip's last WARPGROUP instruction (PV's wait(0) in
    # FA4's order): all of them when the row max overlaps PV(j-1), a few when ptxas hoisted the
    # wait into the row max
    last = max((i for i, op in enumerate(seq) if op == "WARPGROUP"), default=-1)
    return sum(op == "FMNMX" for op in seq[:last])

def mufu_before_last_wait(seq):
    # the exponentials (MUFU.EX2, alpha's included) issued before the trip's last WARPGROUP
    # instruction: in FA4's order, those that overlap PV(j-1)
    last = max((i for i, op in enumerate(seq) if op == "WARPGROUP"), default=-1)
    return sum(op.startswith("MUFU") for op in seq[:last])

def fmul_after_last_mufu(seq):
    # the multiplies (O's rescale, in FA4's order) issued after the trip's last exponential: in
    # front of the next GEMM issue, none of them under the MUFU's latency
    last = max((i for i, op in enumerate(seq) if op.startswith("MUFU")), default=len(seq))
    return sum(op == "FMUL" for op in seq[last:])

def exp_turn_loops(sass):
    # every innermost K/V loop: where the exponentials' turn (named barriers 11-13) is taken and
    # passed against its first and last MUFU.EX2, and its FSEL count (masked loops select)
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    where = {a: i for i, (a, _) in enumerate(ins)}
    back = lambda a, t: (m := re.search(r"\bBRA (0x[0-9a-f]+)", t)) and int(m.group(1), 16) < a
    out = []
    for j, (a, t) in enumerate(ins):
        if not back(a, t):
            continue
        body = ins[where[int(re.search(r"\bBRA (0x[0-9a-f]+)", t).group(1), 16)]: j + 1]
        if not any("HGMMA" in x for _, x in body) or any(back(b, x) for b, x in body[:-1]):
            continue
        mufu = [k for k, (_, x) in enumerate(body) if "MUFU.EX2" in x]
        syncs = [k for k, (_, x) in enumerate(body) if re.search(r"BAR\.SYNC\S* 0x[bcd],", x)]
        arrives = [k for k, (_, x) in enumerate(body) if re.search(r"BAR\.ARV 0x[bcd],", x)]
        out.append(dict(length=len(body), mufu=len(mufu), fsel=sum(x.startswith("FSEL") for _, x in body),
                        syncs=syncs, arrives=arrives, first_mufu=mufu[0] if mufu else -1,
                        last_mufu=mufu[-1] if mufu else -1))
    return out

def producer_loops(sass):
    # every innermost loop that issues TMA loads and no wgmma (the producer's K/V loops): its
    # length and its division's MUFU.RCP
    return [dict(length=loop["length"], rcp=loop["MUFU.RCP"], utmaldg=loop["UTMALDG"])
            for loop in innermost_loops(sass, min_length=20) if loop["UTMALDG"] and not loop["HGMMA"]]

def barrier_inits(ptx):
    # {byte offset into global_smem: arrival count} of every mbarrier.init, and the array offsets
    # the inline arrivals (asm_arrivals) name
    defs = dict(re.findall(r"add\.s32\s+(%r\d+), %r\d+, (\d+);", ptx))
    inits = {int(defs[r]): int(n) for r, n in re.findall(r"mbarrier\.init\.shared::cta\.b64 \[(%r\d+)\], (\d+);", ptx)
             if r in defs}
    arrives = sorted({int(o) for o in re.findall(r"add\.u32 addr, addr, (\d+); @leader mbarrier\.arrive", ptx)})
    return inits, arrives

def named_barriers(sass):
    # every BAR.SYNC / BAR.ARV with an immediate id: [op, id, thread count or 0 for the whole CTA]
    found = re.findall(r"BAR\.(SYNC|ARV)\S*\s+(0x[0-9a-f]+)(?:,\s*(0x[0-9a-f]+))?", sass)
    return sorted({(op, int(i, 16), int(n, 16) if n else 0) for op, i, n in found})

result = {}
for label, d, causal, changes in json.loads(sys.argv[1]):
    # "_key_tail": False builds a launch whose keys fill their K/V tiles (fwd.census_spec)
    key_tail = changes.pop("_key_tail", True)
    # "_seqlen": the default of a problem this long (fwd.default_config), 16k unless given — 32k
    # for d64 non-causal, whose 16k default paired its CTAs (kv_multicast) first: the 32k label is
    # the unpaired kernel the d64 levers below were built and priced on
    seqlen = changes.pop("_seqlen", 32768 if (d, causal) == (64, False) else 16384)
    # the online step every label was built and priced on (no frozen reference, nor what it
    # brings), unless a label names freeze_row_max: then the frozen step's default
    frozen = "freeze_row_max" in changes
    cfg = fwd.default_config(d, causal, seqlen, key_tail=key_tail, frozen_step=frozen)
    paired = changes.pop("_paired", False)
    if (d, causal) == (64, False) and seqlen == 32768 and not paired:
        # d64 non-causal pairs its CTAs at every length from 4k (change 47): unless "_paired" asks
        # for the default itself, the 32k label builds the 32k default before change 47 (the
        # staggered sweep, Gluon's arrivals), which unpairing alone does not give back
        cfg = fwd.replace_following(cfg, d, kv_multicast=False, asm_arrivals=False, stagger_kv=True,
                                    stagger_subtract=True)
    if (d, causal) == (128, False) and seqlen == 16384 and not paired:
        # d128 non-causal pairs its CTAs at every length from 4k (change 46): unless "_paired"
        # asks for the default itself, the 16k label builds the unpaired kernel the d128 levers
        # below were built and priced on (the 16k default before change 46, which unpairing the
        # default gives back field for field)
        cfg = fwd.replace_following(cfg, d, kv_multicast=False)
    # "_softcap": True builds the capped kernel (HAS_SOFTCAP)
    softcap = changes.pop("_softcap", False)
    # "_qv": (q's head dim, v's) on the row of d: a v with a head dim of its own
    q_dim, v_dim = changes.pop("_qv", (d, None))
    # "_window": True builds a launch with a sliding window's left side (HAS_WINDOW) on the windowed
    # default (config.select_config leaves config.WINDOW_CLASHES off)
    window = changes.pop("_window", False)
    # "_window_right": True, with "_window", its right side too (HAS_WINDOW_RIGHT: the causal build's
    # diagonal moved by a run-time width)
    window_right = changes.pop("_window_right", False)
    if window:
        from flashrung.kernels.hopper import config as hopper_config
        cfg = hopper_config._windowed(cfg, d)
    # "_narrow_window": True, with "_window", the tile a narrow window runs (config._narrow_window)
    if changes.pop("_narrow_window", False):
        from flashrung.kernels.hopper import config as hopper_config
        cfg = hopper_config._narrow_window(cfg, d)
    # "_packed": True builds a launch of packed sequences (PACKED) on the packed default
    # (config._packed: config.PACKED_CLASHES off, the balanced lists traded for the run-time
    # hand-out); "_plain_of_packed" the same configuration unpacked, its baseline
    packed = changes.pop("_packed", False)
    if packed or changes.pop("_plain_of_packed", False):
        from flashrung.kernels.hopper import config as hopper_config
        cfg = hopper_config._packed(cfg, d, causal)
    cfg = dataclasses.replace(cfg, **changes)
    spec = fwd.census_spec(cfg, q_dim, causal, torch.bfloat16, key_tail=key_tail, softcap=softcap, head_dim_v=v_dim,
                           window=window, packed=packed, window_right=window_right)
    row = census_one(spec, "sm_90a")
    entry = dict(row=row.to_json())
    if row.error is None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.cubin")
            compiled = compile_spec(spec, "sm_90a")
            with open(path, "wb") as f:
                f.write(compiled.asm["cubin"])
            entry["inits"], entry["arrives"] = barrier_inits(compiled.asm["ptx"])
            arrays = allocation_offsets(compiled.asm["ttgir"])
            # an array a build does not allocate (relay_release's relay barriers) has no offset
            entry["barrier_offsets"] = {k: arrays[v] for k, v in BARRIER_OFFSETS.items() if v in arrays}
            sass = sass_text(path)
            entry["windows"] = windows(sass)
            entry["loop"] = steady_loop(sass)
            entry["bars"] = named_barriers(sass)
            entry["kv_loops"] = kv_loops(sass)
            entry["producer_loops"] = producer_loops(sass)
            # the loops that wait and arrive with neither a wgmma nor a TMA copy: a consumer passing
            # tiles without rows (fwd._pass_tiles), with its named-barrier meetings
            entry["pass_loops"] = [dict(length=loop["length"], bar=loop["BAR"])
                                   for loop in innermost_loops(sass, min_length=20)
                                   if loop["SYNCS"] and not loop["HGMMA"] and not loop["UTMALDG"]]
            entry["exp_turn_loops"] = exp_turn_loops(sass)
            entry["clock_reads"] = sass.count("SR_CLOCKLO")
            entry["nanosleeps"] = sass.count("NANOSLEEP.SYNCS")
            entry["global_stores"] = len(re.findall(r"\bSTG\.", sass))
            entry["global_timer_reads"] = sass.count("SR_GLOBALTIMERLO")
            entry["atomics"] = sass.count("ATOMG")
            entry["multicast_copies"] = len(re.findall(r"UTMALDG\.\dD\.MULTICAST", sass))
            entry["cluster_barriers"] = sass.count("UCGABAR_ARV")
            entry["remote_arrivals"] = len(re.findall(r"SYNCS\.ARRIVE\.TRANS64\.RED", sass))
            # wgmma instructions by shape, "64x128x16" (M x N x K of one instruction)
            entry["hgmma_shapes"] = dict(collections.Counter(re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass)))
    result[label] = entry
print(json.dumps(result))
"""

CENSUS_CONFIGS = [(f"d{d}-{'causal' if c else 'full'}", d, c, {}) for d in HEAD_DIMS for c in (False, True)]
# O rescaled at every K/V step (the plain online softmax): the long defaults without FA4's retained
# reference (config.RESCALE_BY_WARP_MIN_SEQLEN), the kernel the switches below were built and priced on
_ALWAYS_RESCALE = {"rescale_threshold": 0.0, "rescale_by_warp": False}
# one Q buffer and the decode by division: d128 causal's long kernel before change 52
_ONE_Q_DIVIDE = {"num_q_stages": 1, "fast_divide_producer": False, "fast_divide_consumers": False}
# d128 non-causal's long kernel before change 35 (FA3's order, the token on mbarriers, Gluon's
# arrivals), the kernel the d128 switches below were built and measured on
_D128_FA3_ORDER = {"wait_pv_early": False, "named_turns": False, "asm_arrivals": False}
CENSUS_CONFIGS += [(f"d{d}-{'causal' if c else 'full'}-always-rescale", d, c, _ALWAYS_RESCALE)
                   for d in (128, 256) for c in (False, True)]
CENSUS_CONFIGS.append(("d128-full-serial", 128, False, {"overlap": False, **_ALWAYS_RESCALE, **_D128_FA3_ORDER}))
# (as measured, without skip_empty_rows: with it, on the split tail, ptxas keeps 16 B in local memory)
CENSUS_CONFIGS.append(("d128-full-late-packed", 128, False, {"late_rescale": True, "pack_p": True,
                                                             "skip_empty_rows": False, **_D128_FA3_ORDER}))
# the plain schedule, without the softmax-side levers, to show what each lever removes or moves
CENSUS_CONFIGS.append(("d128-full-plain", 128, False, {"late_rescale": False, "pack_p": False, **_D128_FA3_ORDER}))
_D64_QREG = {"block_n": 64, "q_in_registers": True}      # the 192×64 tile with Q in registers
CENSUS_CONFIGS.append(("d64-full-threshold", 64, False, {"rescale_threshold": 8.0, "wait_pv_early": False,
                                                          "pingpong": False, **_D64_QREG}))
# the FA3 order at d64 (whose default is FA4's order), to keep the gated wait(0) under test
CENSUS_CONFIGS.append(("d64-full-fa3-order", 64, False, {"wait_pv_early": False, "pingpong": False, **_D64_QREG}))
CENSUS_CONFIGS.append(("d64-full-qreg", 64, False, _D64_QREG))
# the retained reference with each warp skipping O's rescale on its own vote, where d64 does not
# take it (FA4's order); d128 and d256 run it by default at S16k (above)
_BY_WARP = {"rescale_threshold": 8.0, "rescale_by_warp": True}
CENSUS_CONFIGS.append(("d64-full-rescale-by-warp", 64, False, _BY_WARP))
# d256's kernel without the softmax-side levers change 33 put on the per-warp rescale
# (config._RESCALE_BY_WARP_LEVERS): change 32's default as it was priced
D256_WITHOUT_SOFTMAX_LEVERS = {False: {"defer_row_sum": False, "late_rescale": True},
                               True: {"pack_p": False, "defer_row_sum": False}}
CENSUS_CONFIGS += [(f"d256-{'causal' if c else 'full'}-without-softmax-levers", 256, c,
                    D256_WITHOUT_SOFTMAX_LEVERS[c]) for c in (False, True)]
# the K/V ring slot carried through the loop (carry_ring_slot), on the three ring depths it was
# priced at: d64's three stages, d128 causal's and d256's two
CARRY_RING_SLOT_CONFIGS = [("d64-full", 64, False), ("d128-causal", 128, True), ("d256-full", 256, False)]
CENSUS_CONFIGS += [(f"{name}-carry-ring-slot", d, c, {"carry_ring_slot": True})
                   for name, d, c in CARRY_RING_SLOT_CONFIGS]
# the exp2 split as it was measured (before the staggered sweep was d64's default; with both, ptxas
# keeps 40 B of the split's constants in local memory)
CENSUS_CONFIGS.append(("d64-full-exp2-split4", 64, False, {"exp2_fma_every": 4, "stagger_kv": False}))
# one exponential in sixteen on the FMA pipe, on d64 S32k's own build (the MUFU queue its three
# consumers share binds the step: *Where the shorter row max goes*)
CENSUS_CONFIGS.append(("d64-full-exp2-split16", 64, False, {"exp2_fma_every": 16}))
CENSUS_CONFIGS.append(("d128-full-tree", 128, False, {"tree_reduce": True}))
# FA4's four interleaved chains for the row max, on d64's long non-causal kernel (the rows it was
# priced at)
CENSUS_CONFIGS.append(("d64-full-four-max-chains", 64, False, {"four_max_chains": True}))
# the running sum on the tensor pipe (row_sum_by_mma) on d64's two long kernels and on d128's
# non-causal one without the split tail (S4k-S8k), beside that kernel as the default builds it (on
# the split-tail kernel, S16k+, ptxas keeps 140 B in local memory outside the K/V loops)
ROW_SUM_BY_MMA = {"row_sum_by_mma": True, "defer_row_sum": False}
CENSUS_CONFIGS += [(f"d64-{mask}-row-sum-by-mma", 64, mask == "causal", ROW_SUM_BY_MMA) for mask in ("full", "causal")]
# the S8k kernel: FA4's order with named turns, no split tail, PV's wait as change 35 left it
# (gate_pv_wait is the default from S16k only, change 37)
_D128_WHOLE_TILES = {"split_tail": False, "first_mask_on_need": True, "_key_tail": False, "gate_pv_wait": False}
CENSUS_CONFIGS.append(("d128-full-whole-tiles", 128, False, _D128_WHOLE_TILES))
CENSUS_CONFIGS.append(("d128-full-whole-tiles-row-sum-by-mma", 128, False, {**_D128_WHOLE_TILES, **ROW_SUM_BY_MMA}))
# the clock stamps of the step trace (trace_steps), on the same kernel
CENSUS_CONFIGS.append(("d128-full-whole-tiles-traced", 128, False, {**_D128_WHOLE_TILES, "trace_steps": 16}))
# ... stamping a later item of each CTA (trace_item)
CENSUS_CONFIGS.append(("d128-full-whole-tiles-traced-item", 128, False,
                       {**_D128_WHOLE_TILES, "trace_steps": 16, "trace_item": 8}))
# each work item recorded whole (trace_tiles), on d128 causal's kernel
CENSUS_CONFIGS.append(("d128-causal-tiles-traced", 128, True, {"trace_tiles": 8, "split_tail": False}))
# ... and on the split-tail kernel (d128 non-causal S16k's default), the records in the table pointer
CENSUS_CONFIGS.append(("d128-full-tiles-traced", 128, False, {"trace_tiles": 8}))
CENSUS_CONFIGS.append(("d128-full-summed", 128, False, {"defer_row_sum": False}))
# the short-causal d64 tile exactly as select_config builds it on top of the causal default
_FAST_DIVIDE = {"fast_divide_producer": True, "fast_divide_consumers": True}
# (on S16k's default, so these builds stagger their sweep, which select_config's short tile does
# not; they keep the modulo wrap they were measured with before change 41)
_D64_SHORT = {**config._SHORT_CAUSAL[64], **_FAST_DIVIDE, "stagger_subtract": False}
CENSUS_CONFIGS.append(("d64-causal-short", 64, True, _D64_SHORT))
# the masked tiles' two-condition mask (key length and diagonal tested apart), which the causal
# defaults' one bound per row replaced: on d128's and d64's causal tiles and d64's short-causal one
CENSUS_CONFIGS.append(("d128-causal-two-compare", 128, True, {"row_bound_mask": False, **_ALWAYS_RESCALE}))
CENSUS_CONFIGS.append(("d64-causal-short-two-compare", 64, True, {**_D64_SHORT, "row_bound_mask": False}))
CENSUS_CONFIGS.append(("d64-causal-two-compare", 64, True, {"row_bound_mask": False}))
# the epilogue deferred under the next tile's first QK, on the short-causal d64 tile it targets
CENSUS_CONFIGS.append(("d64-causal-short-overlap-epilogue", 64, True,
                       {**_D64_SHORT, "overlap_epilogue": True}))
# the first K/V tile masked unconditionally, as before first_mask_on_need (change 22), on two causal
# tiles it was priced on; and the non-causal kernels below S3072 (d64) and S16k (d128) as a launch
# with a key tail builds them: first tile masked always, as a branch around it made ptxas keep
# per-tile values in local memory (census)
CENSUS_CONFIGS.append(("d64-causal-short-first-mask-always", 64, True, {**_D64_SHORT, "first_mask_on_need": False}))
CENSUS_CONFIGS.append(("d128-causal-first-mask-always", 128, True, {"first_mask_on_need": False}))
# d128 causal's long kernel before change 52: one Q buffer, the work-item decode by division
CENSUS_CONFIGS.append(("d128-causal-one-q-divide", 128, True, dict(_ONE_Q_DIVIDE)))
CENSUS_CONFIGS.append(("d64-full-unstaggered", 64, False, {"stagger_kv": False}))
# the staggered sweep wrapped by a run-time modulo, as before change 41's compare and subtract
CENSUS_CONFIGS.append(("d64-full-stagger-modulo", 64, False, {"stagger_subtract": False}))
# d64's short non-causal kernel (S <= 1024) as select_config builds it: the short-causal tile's
# stack with two Q buffers, for a launch with a key tail and for one without
_D64_SHORT_FULL = {**config._SHORT_NONCAUSAL[64], **_FAST_DIVIDE, "stagger_kv": False, "num_q_stages": 2}
CENSUS_CONFIGS.append(("d64-full-short", 64, False, _D64_SHORT_FULL))
CENSUS_CONFIGS.append(("d64-full-short-first-mask-no-tail", 64, False, {**_D64_SHORT_FULL, "_key_tail": False}))
# the same two non-causal kernels built for keys that fill their K/V tiles (the launches of every
# benchmark row): no key tail, so no mask on the first tile and no branch around it
CENSUS_CONFIGS.append(("d64-full-unstaggered-first-mask-no-tail", 64, False,
                       {"stagger_kv": False, "_key_tail": False}))
CENSUS_CONFIGS.append(("d128-full-whole-first-mask-no-tail", 128, False,
                       {"split_tail": False, "first_mask_on_need": True, "_key_tail": False}))
# the short-causal d64 tile dividing by the hardware's sequence (change 24 decodes by multiply-high)
CENSUS_CONFIGS.append(("d64-causal-short-hardware-divide", 64, True,
                       {**_D64_SHORT, "fast_divide_producer": False, "fast_divide_consumers": False}))
# two Q buffers per consumer (the next tile's Q loads during this one) on the short-causal d64
# tile and on d128's non-causal S1k kernel
CENSUS_CONFIGS.append(("d64-causal-short-two-q-stages", 64, True, {**_D64_SHORT, "num_q_stages": 2}))
CENSUS_CONFIGS.append(("d128-full-whole-no-tail-two-q-stages", 128, False,
                       {"split_tail": False, "num_q_stages": 2, "_key_tail": False}))
# the multiply-high decode with two Q buffers between S1k and S4k (change 28): d64's 192-row tile
# non-causal up to S2048 (no stagger; with and without a key tail) and causal up to S4096, d128
# causal (FA4's schedule with named turns) up to S4096
_MID_DECODE = {"fast_divide_producer": True, "fast_divide_consumers": True, "num_q_stages": 2}
CENSUS_CONFIGS.append(("d64-full-mid", 64, False, {"stagger_kv": False, **_MID_DECODE}))
CENSUS_CONFIGS.append(("d64-full-mid-no-tail", 64, False, {"stagger_kv": False, **_MID_DECODE, "_key_tail": False}))
CENSUS_CONFIGS.append(("d64-causal-mid", 64, True, _MID_DECODE))
CENSUS_CONFIGS.append(("d128-causal-mid", 128, True, _MID_DECODE))
# a masked tile's unseen second half skipped (skip_unseen_half) on the short-causal d64 tile and
# on d128 causal's FA4 schedule
CENSUS_CONFIGS.append(("d64-causal-short-skip-half", 64, True, {**_D64_SHORT, "skip_unseen_half": True}))
CENSUS_CONFIGS.append(("d128-causal-skip-half", 128, True, {"skip_unseen_half": True, **_ALWAYS_RESCALE}))
# a masked tile whose first half every row sees masks its second half only (mask_second_half),
# alone and with skip_unseen_half, on the same two kernels
CENSUS_CONFIGS.append(("d64-causal-short-mask-half", 64, True, {**_D64_SHORT, "mask_second_half": True}))
CENSUS_CONFIGS.append(("d64-causal-short-both-halves", 64, True,
                       {**_D64_SHORT, "mask_second_half": True, "skip_unseen_half": True}))
CENSUS_CONFIGS.append(("d128-causal-mask-half", 128, True, {"mask_second_half": True, **_ALWAYS_RESCALE}))
# one K/V loop for the unmasked and the masked steps, the mask behind a branch (single_kv_loop):
# d64's short-causal tile, d128 causal's FA4 schedule, d128 non-causal's key tail
CENSUS_CONFIGS.append(("d64-causal-short-single-loop", 64, True, {**_D64_SHORT, "single_kv_loop": True}))
CENSUS_CONFIGS.append(("d128-causal-single-loop", 128, True, {"single_kv_loop": True}))
CENSUS_CONFIGS.append(("d128-full-single-loop", 128, False, {"single_kv_loop": True}))
# short causal d128 (config._SHORT_CAUSAL: FA3's order, no pingpong) on the balanced lists
CENSUS_CONFIGS.append(("d128-causal-short", 128, True, {"pingpong": False, "wait_pv_early": False, "named_turns": False}))
CENSUS_CONFIGS.append(("d64-full-named", 64, False, {"named_turns": True}))
# d128 S16k's default without it: the S1k-S8k kernel (first_mask_on_need is off with the split tail)
CENSUS_CONFIGS.append(("d128-full-whole", 128, False, {"split_tail": False, "first_mask_on_need": True}))
# the producer's V loads a step behind its K loads (FA4's order)
CENSUS_CONFIGS.append(("d128-full-lag-v", 128, False, {"lag_v_loads": True}))
# K/V multicast across a cluster of two CTAs (multicast.py), and its four-warp producer alone
CENSUS_CONFIGS.append(("d128-full-multicast", 128, False, {"kv_multicast": True}))
CENSUS_CONFIGS.append(("d128-full-producer-wg", 128, False, {"producer_warpgroup": True}))
# multicast's producer with its waits and Q copies in inline PTX (no partition bar.sync)
CENSUS_CONFIGS.append(("d128-full-unsynced-producer", 128, False, {"kv_multicast": True, "producer_unsynced": True}))
# the same, its producer's try_wait with CUTLASS's suspend-time hint (10 ms)
CENSUS_CONFIGS.append(("d128-full-unsynced-producer-sleep", 128, False,
                       {"kv_multicast": True, "producer_unsynced": True, "producer_wait_hint_ns": 10_000_000}))
# the consumers' K release moved after PV(j-1)'s wait
CENSUS_CONFIGS.append(("d128-full-late-k", 128, False, {"late_k_release": True}))
# every consumer thread releases its K/V slots (no partition bar.sync before an elected arrival),
# on the consumers without the pingpong token, as it was measured (change 30 put the token on
# d128 S16k's default; its own arrival keeps a bar.sync in the loop)
CENSUS_CONFIGS.append(("d128-full-free", 128, False, {"pingpong": False, **_D128_FA3_ORDER}))
CENSUS_CONFIGS.append(("d128-full-thread-release", 128, False, {"thread_release": True, "pingpong": False,
                                                                **_D128_FA3_ORDER}))
# the consumers' elected arrivals in inline PTX (asm_arrivals) on d128 non-causal's split-tail
# kernel in FA3's order with the mbarrier token (its default before change 35, which has it) and
# d64's (three consumers, FA4's order)
CENSUS_CONFIGS.append(("d128-full-fa3-order", 128, False, _D128_FA3_ORDER))
CENSUS_CONFIGS.append(("d128-full-asm-arrivals", 128, False, dict(_D128_FA3_ORDER, asm_arrivals=True)))
CENSUS_CONFIGS.append(("d64-full-asm-arrivals", 64, False, {"asm_arrivals": True}))
# the shared window's base read once and hoisted (hoist_smem_base), on d128 non-causal S8k's
# default of change 34 (FA3's order with the inline arrivals), where it was measured
CENSUS_CONFIGS.append(("d128-full-s8k", 128, False, {"split_tail": False, "first_mask_on_need": True,
                                                     **_D128_FA3_ORDER, "asm_arrivals": True, "_key_tail": False}))
CENSUS_CONFIGS.append(("d128-full-s8k-hoisted", 128, False, {"split_tail": False, "first_mask_on_need": True,
                                                             **_D128_FA3_ORDER, "asm_arrivals": True,
                                                             "hoist_smem_base": True, "_key_tail": False}))
# FA4's order with PV's wait kept after the row max (gate_pv_wait): on d64's defaults (the
# mbarrier token) and on d128 non-causal's S16k kernel with the mbarrier token instead of named
# turns; d128 non-causal's S16k default has it (change 37), its build without it is change 35's
CENSUS_CONFIGS += [("d64-full-gate-pv", 64, False, {"gate_pv_wait": True}),
                   ("d64-causal-gate-pv", 64, True, {"gate_pv_wait": True}),
                   ("d128-full-fa4-mbar", 128, False, {"named_turns": False, "gate_pv_wait": False}),
                   ("d128-full-fa4-mbar-gate-pv", 128, False, {"named_turns": False, "gate_pv_wait": True}),
                   ("d128-full-ungated", 128, False, {"gate_pv_wait": False})]
# d128 non-causal's split-tail defaults below 16k (change 38), built for keys that fill their
# tiles (the first tile unmasked) and for a key tail
CENSUS_CONFIGS += [(f"d128-full-s{s // 1024}k-split{'' if tail else '-no-tail'}", 128, False,
                    {"_seqlen": s, "_key_tail": tail}) for s in (4096, 6144, 8192) for tail in (True, False)]
CENSUS_CONFIGS.append(("d128-full-s8k-whole-no-tail", 128, False, {"_seqlen": 8192, "_key_tail": False,
                                                                   "split_tail": False}))
# d64 non-causal's paired defaults (kv_multicast with producer_unsynced, from S4k; S16k's is S32k's)
CENSUS_CONFIGS += [(f"d64-full-s{s // 1024}k-paired", 64, False, {"_seqlen": s}) for s in (4096, 16384)]
# the pair's releases relayed by the producers (relay_release) on the paired defaults of d128 S4k
# (keys filling their tiles, as d128-full-s4k-split-no-tail) and d64 S16k
CENSUS_CONFIGS += [("d128-full-s4k-relay", 128, False, {"_seqlen": 4096, "_key_tail": False, "relay_release": True}),
                   ("d64-full-s16k-relay", 64, False, {"_seqlen": 16384, "relay_release": True})]
# d128 non-causal's paired default from S8k, which relays (change 46), and the same pair with the
# consumers' own remote releases, for keys that fill their tiles (every benchmark row)
CENSUS_CONFIGS += [("d128-full-s16k-paired", 128, False, {"_seqlen": 16384, "_key_tail": False, "_paired": True}),
                   ("d128-full-s16k-consumers-release", 128, False,
                    {"_seqlen": 16384, "_key_tail": False, "_paired": True, "relay_release": False})]
# the paired defaults as a launch with an odd count of q-tiles builds them: no warpgroup skips
# its empty rows (fwd._skip_empty_rows, change 48)
CENSUS_CONFIGS += [("d64-full-s4k-paired-odd", 64, False, {"_seqlen": 4096, "skip_empty_rows": False}),
                   ("d64-full-s16k-paired-odd", 64, False, {"_seqlen": 16384, "skip_empty_rows": False}),
                   ("d128-full-s4k-paired-odd", 128, False, {"_seqlen": 4096, "skip_empty_rows": False}),
                   ("d128-full-s16k-paired-odd", 128, False,
                    {"_seqlen": 16384, "_key_tail": False, "_paired": True, "skip_empty_rows": False})]
# the paired default before change 51, whose passing warpgroups' warps did not meet before each
# turn's pass (meet_before_pass, on with every pairing since: those launches keep the skip)
CENSUS_CONFIGS.append(("d64-full-s4k-paired-no-meet", 64, False, {"_seqlen": 4096, "meet_before_pass": False}))
# the d64 pairs as they were before change 49: two tiles of one head (no cross_head_pairs)
CENSUS_CONFIGS.append(("d64-full-s4k-paired-within", 64, False, {"_seqlen": 4096, "cross_head_pairs": False}))
# d256 non-causal's default where the keys fill their tiles takes them (a key tail's does not)
CENSUS_CONFIGS.append(("d256-full-whole-tiles", 256, False, {"_key_tail": False}))
# a 192-key K/V tile (128 + 64 extra keys) on FA4's schedule, O staged in Q's buffer (shared
# memory), built as it was measured: with skip_empty_rows on top ptxas keeps 112 B in local memory
# outside the loop (census)
_EXTRA_KEYS = {"extra_keys": 64, "separate_o": False, "pingpong": True, "wait_pv_early": True, "named_turns": True,
               "skip_empty_rows": False, "asm_arrivals": False, **_ALWAYS_RESCALE}
CENSUS_CONFIGS.append(("d128-full-extra-keys", 128, False, _EXTRA_KEYS))
# the exponentials' token ring on d64's three consumers (192-row tile, non-causal)
CENSUS_CONFIGS.append(("d64-full-exp-turns", 64, False, {"exp_turns": True}))
# a quarter of each tile's exponentials ahead of PV's wait in FA4's order, on d64's three consumers
CENSUS_CONFIGS.append(("d64-full-early-exps", 64, False, {"early_exp_quarters": 1}))
# O's rescale in its own block ahead of the exponentials, in FA4's order on d64's three consumers
CENSUS_CONFIGS.append(("d64-full-rescale-first", 64, False, {"rescale_before_exp": True}))
# the row max frozen after an item's first tile (a measurement: no max, no rescale in the steady step),
# its pingpong turn on mbarriers as the online default's (the frozen default's named turns: change 62)
CENSUS_CONFIGS.append(("d64-full-freeze-row-max", 64, False, {"freeze_row_max": True, "named_turns": False}))
# P for PV from shared memory, in FA3's order, on d64's three consumers (192-row tile, non-causal)
CENSUS_CONFIGS.append(("d64-full-p-in-smem", 64, False, {"p_in_smem": True, "wait_pv_early": False}))
# FA3's order with P in registers on d64's three consumers, S16k non-causal, as it runs at S8k-S32k
# (keys filling their tiles), with the default K/V pairs and pack_p: O rescaled late and the row
# reductions as trees keep one local load in a steady K/V step, 440 instructions against FA4's order's
# 434 (without the trees: 12-23 local loads and stores in two consumers' steps, paired or not)
D64_FA3_ORDER_CHANGES = {False: dict(wait_pv_early=False, late_rescale=True, tree_reduce=True),
                         # the causal tile's defer_row_sum puts 8 local loads and stores in two steps
                         True: dict(wait_pv_early=False, late_rescale=True, tree_reduce=True, defer_row_sum=False)}
D64_FA3_ORDER = {"_seqlen": 16384, "_key_tail": False, **D64_FA3_ORDER_CHANGES[False]}
CENSUS_CONFIGS.append(("d64-full-s16k-fa3-order", 64, False, D64_FA3_ORDER))
# the dynamic hand-out in place of the balanced lists, on the causal defaults of d64 and d128
DYNAMIC_TILES = {"balanced": False, "balanced_partial_tiles": False, "dynamic_tiles": True}
CENSUS_CONFIGS += [(f"d{d}-causal-dynamic", d, True, DYNAMIC_TILES) for d in (64, 128)]
# softcap (softmax.capped) on d128 non-causal's S16k default (the relayed pair) and d64's causal one
CENSUS_CONFIGS += [("d128-full-s16k-paired-softcap", 128, False, {"_seqlen": 16384, "_key_tail": False,
                                                                  "_paired": True, "_softcap": True}),
                   ("d64-causal-softcap", 64, True, {"_softcap": True})]
# ... and the capped d128 non-causal default itself: one exponential in four on the FMA pipe
# (config.CAPPED_EXP2_FMA_EVERY)
CENSUS_CONFIGS += [("d128-full-s16k-paired-softcap-split-exp2", 128, False,
                    {"_seqlen": 16384, "_key_tail": False, "_paired": True, "_softcap": True,
                     "exp2_fma_every": config.CAPPED_EXP2_FMA_EVERY[128, False]})]
# a v with a head dim of its own (config.own_value_dim): MLA's 192/128 on d256's rows (Q and K
# padded to 256, V and O 128 wide; with split_head_dim, Q and K as 128 + 64 columns), and 128/64
# and 64/128 on d128 non-causal's S16k default (the relayed pair: its multicast copies take each
# tensor's own width)
_OWN = {"own_value_dim": True}
_SPLIT = {"own_value_dim": True, "split_head_dim": True}
OWN_VALUE_DIM_CENSUS = [("d256-full-v128", "d256-full", 256, False, (192, 128), _OWN),
                        ("d256-causal-v128", "d256-causal", 256, True, (192, 128), _OWN),
                        ("d256-full-q192-v128", "d256-full", 256, False, (192, 128), _SPLIT),
                        ("d256-causal-q192-v128", "d256-causal", 256, True, (192, 128), _SPLIT),
                        ("d256-full-q160-v128", "d256-full", 256, False, (160, 128), _SPLIT),
                        ("d128-full-s16k-paired-v64", "d128-full-s16k-paired", 128, False, (128, 64), _OWN),
                        ("d128-full-s16k-paired-q64", "d128-full-s16k-paired", 128, False, (64, 128), _OWN)]
CENSUS_CONFIGS += [(label, d, causal, {"_qv": qv, **switches,
                                       **({"_seqlen": 16384, "_key_tail": False, "_paired": True} if d == 128 else {})})
                   for label, _, d, causal, qv, switches in OWN_VALUE_DIM_CENSUS]
# MLA's split on K/V tiles of 128 keys (the d256 row's 64-key tile is for 256-wide rings; 192/128's
# fit 128 keys: 213 KiB), non-causal and causal
MLA_128_KEYS_CENSUS = [(f"d256-{m}-q192-v128-128-keys", f"d256-{m}-q192-v128", causal)
                       for m, causal in (("full", False), ("causal", True))]
CENSUS_CONFIGS += [(label, 256, causal, {"_qv": (192, 128), **_SPLIT, "block_n": 128})
                   for label, _, causal in MLA_128_KEYS_CENSUS]
# a sliding window's left side (HAS_WINDOW) on the windowed defaults: d64 and d128 causal and not, d256 causal
WINDOW_CENSUS = [("d64-causal-window", "d64-causal", 64, True), ("d64-full-window", "d64-full", 64, False),
                 ("d128-causal-window", "d128-causal", 128, True), ("d128-full-window", "d128-full", 128, False),
                 ("d256-causal-window", "d256-causal", 256, True),
                 # a right side of its own: the causal build, its diagonal moved by a run-time width
                 ("d128-causal-band-window", "d128-causal", 128, True)]
CENSUS_CONFIGS += [(label, d, causal, {"_window": True, **({"_window_right": True} if "band" in label else {})})
                   for label, _, d, causal in WINDOW_CENSUS]
# the staggered sweep under a window (schedule.kv_visit's KEEP_BEFORE: the cut tiles in place) on
# d64's 192-row causal windowed build, beside the same build unstaggered above
CENSUS_CONFIGS += [("d64-causal-window-stagger", 64, True, {"_window": True, "stagger_kv": True,
                                                            "stagger_subtract": True})]
# ... and staggering only the items whose window reaches the first key (stagger_from_zero)
CENSUS_CONFIGS += [("d64-causal-window-stagger-from-zero", 64, True,
                    {"_window": True, "stagger_kv": True, "stagger_subtract": True, "stagger_from_zero": True})]
# the window's lower bound only where it cuts (window_first_mask_on_need, window_diagonal_one_bound)
# on d64's and d128's causal windowed builds and d64's non-causal one (a key tail's masked run): the
# other side of each head dim's windowed default (config.WINDOW_MASKS_WHERE_CUT), so each pair is
# one default build and one forced
WINDOW_MASKS_WHERE_CUT = dict.fromkeys(config.WINDOW_MASK_FIELDS, True)
WINDOW_MASK_PAIRS = [("d64-causal-window", 64, True), ("d128-causal-window", 128, True), ("d64-full-window", 64, False)]


def _window_mask_labels(label, d):
    """``(cut, both bounds)``: the census labels of a windowed build with and without the switches."""
    if d in config.WINDOW_MASKS_WHERE_CUT:
        return label, f"{label}-both-bounds"
    return f"{label}-masks-where-cut", label


def _forced_window_mask_build(label, d, causal):
    """The census build of ``label``'s pair that is not the default: the switches forced on where
    d's windowed default lacks them, forced off where it has them."""
    cut, both = _window_mask_labels(label, d)
    forced_on = cut != label
    return (cut if forced_on else both, d, causal,
            {"_window": True, **dict.fromkeys(config.WINDOW_MASK_FIELDS, forced_on)})


CENSUS_CONFIGS += [_forced_window_mask_build(label, d, causal) for label, d, causal in WINDOW_MASK_PAIRS]
# d64's narrow causal window on its own tile (config.NARROW_WINDOW_BLOCK_M), beside the 192-row one above
CENSUS_CONFIGS += [("d64-causal-narrow-window", 64, True, {"_window": True, "_narrow_window": True})]
# packed sequences (flash-attn's varlen) on a packed default of each head dim, beside the same
# configuration unpacked (d64 causal: local memory outside its K/V loops; d256 non-causal: the
# masked loop that grew most; all six compiled at the switch's introduction, 2026-12-05)
PACKED_CENSUS = [("d64-causal", 64, True), ("d128-full", 128, False), ("d256-full", 256, False)]
CENSUS_CONFIGS += [(f"{label}-{kind}", d, causal, {f"_{kind}": True}) for label, d, causal in PACKED_CENSUS
                   for kind in ("packed", "plain_of_packed")]
# the balanced lists with a run-time pool of the order's last tiles
DYNAMIC_POOL = {"dynamic_pool_share": 0.03}
CENSUS_CONFIGS += [(f"d{d}-causal-pool", d, True, DYNAMIC_POOL) for d in (64, 128)]
# the causal packs' hand-out drawing each next tile two K/V tiles before the current one's last load,
# and handing each on a barrier of its own
CENSUS_CONFIGS += [(f"d{d}-causal-packed-draw-ahead", d, True, {"_packed": True, "draw_ahead_steps": 2})
                   for d in (64, 128)]
CENSUS_CONFIGS += [(f"d{d}-causal-packed-handout-barrier", d, True, {"_packed": True, "handout_barrier": True})
                   for d in (64, 128)]


# local memory each head dim's default may keep outside its K/V loops: none. (Causal d256 with one
# bound per row kept 64 B there until its first tile's mask went behind a branch, change 22;
# d64 causal's 192-row tile once kept 64 B across its first tile's QK.) A build that needs an
# allowance names it here, with the paired margin that pays for it
PROLOGUE_SPILL_BYTES = {}
# short causal d128 on the balanced lists kept 16 B in local memory outside the KV loop with the
# two-condition mask (3 LDL, 1 STL; the same schedule on the stride kept none); one bound per row
# keeps none
SHORT_CAUSAL_D128_SPILL_BYTES = 0
# the 192-key tile keeps a few registers per consumer in local memory outside the loop (census:
# 8 B without the split tail, 40 B with it, as in d128 S16k's default)
EXTRA_KEYS_SPILL_BYTES = 40


def _start_census() -> Subprocesses:
    # one process per core, each compiling every n-th configuration: the builds are independent
    # and single-threaded (LLVM, ptxas), and on CI's two cores this fixture was most of the suite
    # (started when collection ends: conftest.EARLY_STARTS)
    import json
    import os
    import sys

    from flashrung.evidence.census import interpreter_free_env

    jobs = max(1, min(os.cpu_count() or 1, 4))
    return Subprocesses([[sys.executable, "-c", _CENSUS_SCRIPT, json.dumps(CENSUS_CONFIGS[i::jobs])]
                         for i in range(jobs)], interpreter_free_env())


EARLY_STARTS = {"census": _start_census}


@pytest.fixture(scope="module")
def census():
    import json

    result = {}
    for out in early_start(__name__, "census", _start_census).result(timeout=1500):
        result.update(json.loads(out.strip().splitlines()[-1]))
    assert set(result) == {label for label, *_ in CENSUS_CONFIGS}
    return result


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_default_config_census(census, head_dim, causal):
    entry = census[f"d{head_dim}-{'causal' if causal else 'full'}"]
    row = entry["row"]
    assert "error" not in row, row["error"]
    sass = row["sass"]
    assert sass["HGMMA"] > 0, "QKᵀ and PV must run on wgmma"
    assert sass["UTMALDG"] > 0, "Q, K, V must arrive by TMA"
    assert sass["UTMASTG"] > 0, "O must leave by TMA"
    assert sass["USETMAXREG"] > 0, "producer/consumer register reallocation missing"
    # spills land in the stack frame; LDL/STL in the SASS is the direct evidence. The steady KV
    # loop never touches local memory; outside it only the allowance below may
    assert entry["loop"]["ldl"] == 0, f"local-memory traffic in the KV loop: {sass['opcodes']}"
    allowance = PROLOGUE_SPILL_BYTES.get((head_dim, causal), 0)
    assert row["spill_bytes"] <= allowance
    if not allowance:
        assert sass["LDL"] == 0 and sass["STL"] == 0, f"local-memory traffic: {sass['opcodes']}"
    # the configuration the label built (d128 non-causal's is unpaired: the census script)
    cfg = HopperFwdConfig(**{f.name: row["config"][f.name] for f in dataclasses.fields(HopperFwdConfig)})
    assert cfg.smem_bytes(head_dim, 2) <= row["smem_bytes"] <= SMEM_PER_BLOCK_BYTES


_FAST_DIV_SCRIPT = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from flashrung.kernels.hopper.schedule import FastDivisor, fast_div

@gluon.jit
def probe(out_ptr, x, d, mul, shift):
    gl.store(out_ptr, fast_div(x, FastDivisor(d, mul, shift)))

signature = {"out_ptr": "*i32", "x": "i32", "d": "i32", "mul": "i32", "shift": "i32"}
compiled = triton.compile(GluonASTSource(fn=probe, signature=signature, constexprs={}),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))
ops = re.findall(r"\b((?:mul\.hi|shr|div|rem)\.[usb]32)\b", compiled.asm["ptx"])
print(json.dumps(sorted(set(ops))))
"""


def test_fast_div_is_an_unsigned_multiply_high_and_a_logical_shift(tmp_path):
    # the int32 multiplier is read as unsigned, and the high half (up to 2**32 - 1) is shifted in
    # without its sign: an arithmetic shift or a signed multiply-high would be wrong for a
    # multiplier or a high half of 2**31 or more
    import json
    import os
    import pathlib
    import subprocess
    import sys

    import flashrung
    from flashrung.evidence.census import interpreter_free_env

    script = tmp_path / "fast_div_probe.py"     # a jit function needs a source file
    script.write_text(_FAST_DIV_SCRIPT)
    env = interpreter_free_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pathlib.Path(flashrung.__file__).parents[1]),
                                                      env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["mul.hi.u32", "shr.u32"]


def _steady_steps(entry):
    # the K/V loops that run a whole tile's softmax (its exponentials), not the producer's ring or
    # the per-tile loops around them
    return [loop for loop in entry["kv_loops"] if loop["mufu"] >= 32 and loop["length"] < 800]


def _assert_no_local_memory(row, name=None):
    assert "error" not in row, row.get("error")
    assert row["spill_bytes"] == 0 and row["sass"]["LDL"] == 0 and row["sass"]["STL"] == 0, name


def _steady_step_pairs(census, name, base):
    """The steady loops of ``name`` beside ``base``'s, one for one (the same partitions)."""
    loops, base_loops = _steady_steps(census[name]), _steady_steps(census[base])
    assert loops and len(loops) == len(base_loops), (name, loops, base_loops)
    return zip(loops, base_loops)


def _masked_steps(entry):
    # the K/V loops that mask: one K/V tile's exponentials, as many as the unmasked steady loop
    # issues (the loop around a tile's first, masked step also holds its epilogue), and more
    # selects than the unmasked loop's 2
    step_mufu = {loop["mufu"] for loop in entry["kv_loops"] if loop["fsel"] <= 4 and loop["mufu"] >= 32}
    assert len(step_mufu) == 1, entry["kv_loops"]
    return [loop for loop in entry["kv_loops"] if loop["fsel"] > 8 and loop["mufu"] in step_mufu]


@pytest.mark.parametrize("label, base", [("d128-causal-always-rescale", "d128-causal-two-compare"),
                                         ("d64-causal-short", "d64-causal-short-two-compare"),
                                         ("d64-causal", "d64-causal-two-compare")])
def test_row_bound_mask_pays_one_compare_and_one_select_per_score(census, label, base):
    # row_bound_mask folds the key-length bound and the diagonal into one bound per row: each of
    # a thread's 64 scores (64 × 128 per warpgroup) takes one ISETP and one FSEL in the masked
    # step, where mask_scores takes about 3 compares and 4 selects per pair; the step shrinks by
    # 100+ instructions, and nothing reaches local memory — on d64's 192-row tile at 160
    # registers too, where comparing whole offsets kept them live across the loop and spilled
    new, old = _masked_steps(census[label]), _masked_steps(census[base])
    assert new and len(new) == len(old), (new, old)
    scores = 64 * 128 // 128
    for n, o in zip(sorted(new, key=lambda x: x["length"]), sorted(old, key=lambda x: x["length"])):
        assert n["fsel"] <= scores + 2 and n["isetp"] <= scores + 2, n
        assert o["fsel"] >= 2 * scores, o
        assert n["length"] <= o["length"] - 100, (n, o)
        assert n["ldl"] == 0 and n["mufu"] == o["mufu"], n
    assert census[label]["row"]["spill_bytes"] <= census[base]["row"]["spill_bytes"]


def test_short_causal_d128_census(census):
    # the schedule short causal d128 problems run (config.SHORT_CAUSAL_MAX_SEQLEN): FA3's order on
    # the balanced lists; no local memory in the KV loop, at most the allowance outside it
    from flashrung.kernels.hopper.config import SHORT_CAUSAL_MAX_SEQLEN

    cfg = fwd.default_config(128, True, SHORT_CAUSAL_MAX_SEQLEN[128])
    assert cfg.balanced and not cfg.pingpong and not cfg.wait_pv_early
    entry = census["d128-causal-short"]
    row = entry["row"]
    assert {k: row["config"][k] for k in ("pingpong", "wait_pv_early", "balanced")} == dict(
        pingpong=False, wait_pv_early=False, balanced=True)
    assert "error" not in row and entry["loop"]["ldl"] == 0
    assert row["spill_bytes"] <= SHORT_CAUSAL_D128_SPILL_BYTES
    assert row["sass"]["HGMMA"] > 0 and row["sass"]["USETMAXREG"] > 0


def test_overlap_epilogue_census(census):
    # the deferred epilogue is inlined where it can run: under the next tile's first QK, on a
    # tile with no K/V tile, at the start of an idle warpgroup's walk, and after the loop for the
    # last tile — four O stores per consumer where the default has one; on
    # the short-causal d64 tile (240 registers) nothing reaches local memory and the steady loop
    # stays within a few instructions. (At d128 the previous tile's O, held across the first QK,
    # spills: 92-180 B with local-memory traffic in the tile loop, census.)
    base, oe = census["d64-causal-short"], census["d64-causal-short-overlap-epilogue"]
    assert "error" not in oe["row"], oe["row"].get("error")
    assert oe["row"]["spill_bytes"] == 0 and oe["row"]["sass"]["LDL"] == 0 and oe["row"]["sass"]["STL"] == 0
    assert oe["row"]["sass"]["UTMASTG"] == 4 * base["row"]["sass"]["UTMASTG"]
    assert abs(oe["loop"]["length"] - base["loop"]["length"]) <= 8


def test_fast_divide_census(census):
    # the multiply-high decode removes every run-time division from the short-causal d64 kernel
    # (each a reciprocal on MUFU.RCP and its corrections) and leaves its K/V loops as they were
    # but for a few uniform-register moves (census: 427/565 -> 430/568), with no local memory
    base, fast = census["d64-causal-short-hardware-divide"], census["d64-causal-short"]
    assert fast["row"]["config"]["fast_divide_producer"] and fast["row"]["config"]["fast_divide_consumers"]
    for e in (base, fast):
        assert "error" not in e["row"], e["row"].get("error")
        assert e["row"]["spill_bytes"] == 0 and e["row"]["sass"]["LDL"] == 0
    divisions = base["row"]["sass"]["MUFU.RCP"] - fast["row"]["sass"]["MUFU.RCP"]
    assert divisions >= 8, divisions
    assert fast["row"]["sass"]["total"] < base["row"]["sass"]["total"] - 10 * divisions
    assert len(fast["kv_loops"]) == len(base["kv_loops"])
    for a, b in zip(fast["kv_loops"], base["kv_loops"]):
        assert abs(a["length"] - b["length"]) <= 6 and (a["fsel"], a["mufu"]) == (b["fsel"], b["mufu"])


def test_two_q_stages_census(census):
    # the second Q buffer changes where the producer loads Q and which buffer a tile reads, not
    # the K/V loops: each within a few instructions of the one-buffer build, no local memory, and
    # one more Q tile of shared memory
    pairs = [("d64-causal-short", "d64-causal-short-two-q-stages", 64),
             ("d128-full-whole-first-mask-no-tail", "d128-full-whole-no-tail-two-q-stages", 128)]
    for one, two, head_dim in pairs:
        base, q2 = census[one], census[two]
        for e in (base, q2):
            assert "error" not in e["row"], e["row"].get("error")
            assert e["row"]["spill_bytes"] == 0 and e["row"]["sass"]["LDL"] == 0 and e["row"]["sass"]["STL"] == 0
        assert q2["row"]["config"]["num_q_stages"] == 2
        assert q2["row"]["smem_bytes"] >= base["row"]["smem_bytes"] + 128 * head_dim * 2
        assert len(q2["kv_loops"]) == len(base["kv_loops"])
        for a, b in zip(q2["kv_loops"], base["kv_loops"]):
            assert abs(a["length"] - b["length"]) <= 6 and (a["fsel"], a["mufu"]) == (b["fsel"], b["mufu"])


def test_first_mask_on_need_census(census):
    # the lever touches the peeled first step only (a uniform branch around its mask): every K/V
    # loop of each consumer keeps its length and its mask, and nothing reaches local memory
    for name, base_name in (("d64-causal-short", "d64-causal-short-first-mask-always"),
                            ("d128-causal", "d128-causal-first-mask-always")):
        base, lever = census[base_name], census[name]
        assert lever["row"]["config"]["first_mask_on_need"] and not base["row"]["config"]["first_mask_on_need"]
        assert "error" not in lever["row"], lever["row"].get("error")
        assert lever["row"]["spill_bytes"] == 0 and lever["row"]["sass"]["LDL"] == 0
        assert len(lever["kv_loops"]) == len(base["kv_loops"])
        for a, b in zip(lever["kv_loops"], base["kv_loops"]):
            assert abs(a["length"] - b["length"]) <= 16 and a["fsel"] == b["fsel"] and a["mufu"] == b["mufu"]


def test_short_non_causal_defaults_keep_no_local_memory(census):
    # the non-causal kernels of the shorter problems (no stagger at d64, no split tail at d128) as
    # a launch with a key tail builds them: with a branch around the first tile's mask they kept
    # 184 B and 12 B in local memory (census), so that launch masks its first tile always; and
    # d64's short non-causal kernel (S <= 1024: the 128-row tile, the multiply-high decode, two Q
    # buffers), with and without a key tail
    for name in ("d64-full-unstaggered", "d128-full-whole", "d64-full-short", "d64-full-short-first-mask-no-tail"):
        row = census[name]["row"]
        _assert_no_local_memory(row, name)
        assert row["config"]["first_mask_on_need"]


def test_skip_unseen_half_moves_no_data_and_leaves_the_unmasked_loop(census):
    # the halves are register bits of the accumulator: no shared-memory round trip, no shuffle
    # beyond the row reductions' butterflies, no local memory; the unmasked loop is untouched and
    # the masked one holds both paths (a whole tile's and a half's exponentials)
    for name, base in (("d64-causal-short-skip-half", "d64-causal-short"),
                       ("d128-causal-skip-half", "d128-causal-always-rescale")):
        row = census[name]["row"]
        _assert_no_local_memory(row)
        loops, base_loops = census[name]["kv_loops"], census[base]["kv_loops"]
        assert len(loops) == len(base_loops)
        for a, b in zip(loops, base_loops):
            if b["fsel"] <= 4:                       # unmasked
                assert abs(a["length"] - b["length"]) <= 4, (name, a["length"], b["length"])
            elif b["mufu"] >= 32:                    # masked: the whole tile's path and the half's
                assert a["mufu"] >= b["mufu"] + 32, (name, a["mufu"], b["mufu"])
        assert row["sass"]["STS"] == census[base]["row"]["sass"]["STS"]
        assert row["sass"]["LDS"] == census[base]["row"]["sass"]["LDS"]


def test_mask_second_half_masks_half_a_tile_and_moves_no_data(census):
    # the seen-first-half path masks 64 keys instead of 128: the masked loop gains about half a
    # tile's selects (its own copy of the second half's mask) and no exponential; the unmasked
    # loop, shared and local memory stay as they were
    for name, base in (("d64-causal-short-mask-half", "d64-causal-short"),
                       ("d128-causal-mask-half", "d128-causal-always-rescale"),
                       ("d64-causal-short-both-halves", "d64-causal-short-skip-half")):
        row = census[name]["row"]
        _assert_no_local_memory(row)
        loops, base_loops = census[name]["kv_loops"], census[base]["kv_loops"]
        assert len(loops) == len(base_loops)
        for a, b in zip(loops, base_loops):
            if b["fsel"] <= 4:                       # unmasked
                assert abs(a["length"] - b["length"]) <= 4, (name, a["length"], b["length"])
            elif b["mufu"] >= 32:                    # masked: one more half-tile mask
                assert b["fsel"] + 24 <= a["fsel"] <= b["fsel"] + 40, (name, a["fsel"], b["fsel"])
                assert a["mufu"] == b["mufu"], (name, a["mufu"], b["mufu"])
        assert row["sass"]["STS"] == census[base]["row"]["sass"]["STS"]
        assert row["sass"]["LDS"] == census[base]["row"]["sass"]["LDS"]


def test_single_kv_loop_keeps_both_steps_in_one_copy(census):
    # the two K/V loops of each consumer become one whose mask sits behind a forward branch: the
    # trip that skips it is no longer than the unmasked loop, the trip that takes it no longer than
    # the masked loop, and the kernel loses about one copy of the step per consumer partition; no
    # local memory
    for name, base in (("d64-causal-short-single-loop", "d64-causal-short"), ("d128-causal-single-loop", "d128-causal"),
                       ("d128-full-single-loop", "d128-full")):
        row, base_row = census[name]["row"], census[base]["row"]
        _assert_no_local_memory(row)
        steps = _steady_steps(census[base])
        unmasked = [loop["length"] for loop in steps if loop["fsel"] <= 4]
        masked = [loop["length"] for loop in steps if loop["fsel"] > 4]
        single = _steady_steps(census[name])
        assert unmasked and masked and len(single) == len(unmasked), (name, steps, single)
        for loop, u, m in zip(single, unmasked, masked):
            # census, sm_90a: 567 / 431 against 568 / 430 (d64 short causal), 596 / 460 against
            # 607 / 468 (d128 causal), 598 / 470 against 682 / 481 (d128 non-causal, key tail)
            assert loop["forward_skip"] >= 100, (name, loop)
            assert loop["length"] <= m + 8, (name, loop["length"], m)
            assert loop["length"] - loop["forward_skip"] <= u + 4, (name, loop["length"], loop["forward_skip"], u)
        assert row["sass"]["total"] <= base_row["sass"]["total"] - 300 * len(single), (name, row["sass"]["total"])


def test_rescale_by_warp_skips_o_rescale_behind_one_branch(census):
    # each warp votes on its own 16 rows and branches over its whole accumulator (d/2 multiplies a
    # thread): the trip that skips is shorter than the default's by at least those multiplies,
    # less the vote's few instructions; no barrier joins the loop (the warpgroup-wide decision adds
    # a shared-memory round trip and 3 bar.sync) and nothing goes to local memory (it kept 80 B).
    # d128 and d256 take it by default at S16k; d64 does not
    pairs = [(f"d{d}-{mask}", f"d{d}-{mask}-always-rescale", d) for d in (128, 256) for mask in ("full", "causal")]
    for name, base, d in pairs + [("d64-full-rescale-by-warp", "d64-full", 64)]:
        assert census[name]["row"]["config"]["rescale_by_warp"], name
        _assert_no_local_memory(census[name]["row"], name)
        for loop, b in _steady_step_pairs(census, name, base):
            # census, sm_90a: d128 non-causal 493 skipping 64 against 481; d128 causal (FA4's order)
            # 479 / 618 skipping 64 against 468 / 607; d256 non-causal 448 skipping 128 against 443,
            # causal 462 skipping 128 against 451; d64 non-causal 439 / 636 skipping 32 against
            # 428 / 625
            assert loop["forward_skip"] >= d // 2, (name, loop)
            assert loop["bar"] == b["bar"], (name, loop, b)
            assert loop["length"] - loop["forward_skip"] <= b["length"] - d // 2 + 16, (name, loop, b)


def test_d256_softmax_levers_shorten_the_skipping_trip_without_local_memory(census):
    # change 33 on d256's per-warp-rescale default: packed P (causal) and the per-thread partial row
    # sums (both masks; non-causal with the rescale in FA4's place, late_rescale off) build without
    # local memory — packed P with late_rescale on causal d256 once kept 60 B — and shorten the trip
    # that skips O's rescale (census, sm_90a: non-causal 320 -> 309, causal 334 -> 310) with the
    # skip itself intact
    for causal, mask, shorter in ((False, "full", 8), (True, "causal", 16)):
        cfg = fwd.default_config(256, causal)
        assert cfg.rescale_by_warp and cfg.defer_row_sum and cfg.pack_p and not cfg.late_rescale, cfg
        name, base = f"d256-{mask}", f"d256-{mask}-without-softmax-levers"
        _assert_no_local_memory(census[name]["row"], name)
        for loop, b in _steady_step_pairs(census, name, base):
            assert loop["forward_skip"] >= 128, (name, loop)
            assert loop["length"] - loop["forward_skip"] <= b["length"] - b["forward_skip"] - shorter, (name, loop, b)


def test_carry_ring_slot_shortens_every_steady_step_without_local_memory(census):
    # the consumers' ring slot and phase carried through the K/V loop (pipeline.next_ring_slot)
    # replace two ``count % S`` / ``(count // S) & 1`` per step: every steady loop is shorter and
    # keeps its barriers, no local memory (census, sm_90a, the default builds: d64 non-causal
    # 428 -> 424, d128 causal 479 -> 474, d256 non-causal 437 -> 419)
    for name, d, causal in CARRY_RING_SLOT_CONFIGS:
        carried = f"{name}-carry-ring-slot"
        assert census[carried]["row"]["config"]["carry_ring_slot"], carried
        assert not census[name]["row"]["config"]["carry_ring_slot"], name
        _assert_no_local_memory(census[carried]["row"], carried)
        for loop, b in _steady_step_pairs(census, carried, name):
            assert loop["length"] <= b["length"] - 3, (carried, loop, b)
            assert loop["bar"] == b["bar"] and loop["mufu"] == b["mufu"], (carried, loop, b)


@pytest.mark.parametrize("name, base, shorter", [("d64-full-row-sum-by-mma", "d64-full", 40),
                                                  ("d64-causal-row-sum-by-mma", "d64-causal", 35),
                                                  ("d128-full-whole-tiles-row-sum-by-mma", "d128-full-whole-tiles", 12)])
def test_row_sum_by_mma_moves_the_row_sum_onto_the_tensor_pipe(census, name, base, shorter):
    # P times a tile of ones beside PV: each steady step issues 8 more wgmma instructions (m64n8k16
    # over the tile's keys), the row sum's 64 FADDs per thread leave (a few remain: the softmax's
    # own), and the step is shorter by most of what they were (census, sm_90a, unmasked / masked
    # step: d64 non-causal 428 -> 369 / 625 -> 580, causal 419 -> 368 / 558 -> 521, d128
    # non-causal without the split tail 490 -> 472 / 687 -> 658: its deferred sum had taken the
    # quad's shuffles already); no local memory
    _assert_no_local_memory(census[name]["row"], name)
    for loop, b in _steady_step_pairs(census, name, base):
        assert loop["hgmma"] == b["hgmma"] + 8, (name, loop, b)
        assert loop["fadd"] <= 4 < 60 <= b["fadd"], (name, loop, b)
        assert loop["length"] <= b["length"] - shorter, (name, loop, b)
        assert loop["mufu"] == b["mufu"] and loop["bar"] == b["bar"], (name, loop, b)


def test_mid_length_decode_defaults_keep_no_local_memory(census):
    # change 28's kernels (the decode and two Q buffers on d64's 192-row tile and d128 causal's
    # FA4 schedule) are the defaults from S1025 to S2048-S4096: no local memory, and their K/V
    # loops within a few instructions of the same kernels without the decode (which only moves
    # work-item bookkeeping out of the tile heads)
    for name, base in (("d64-full-mid", "d64-full-unstaggered"), ("d64-causal-mid", "d64-causal"),
                       ("d128-causal-mid", "d128-causal")):
        row = census[name]["row"]
        _assert_no_local_memory(row, name)
        assert row["config"]["num_q_stages"] == 2 and row["config"]["fast_divide_consumers"]
        assert len(census[name]["kv_loops"]) == len(census[base]["kv_loops"])
        for a, b in zip(census[name]["kv_loops"], census[base]["kv_loops"]):
            assert abs(a["length"] - b["length"]) <= 8, (name, a["length"], b["length"])
    row = census["d64-full-mid-no-tail"]["row"]
    assert row["spill_bytes"] == 0 and row["sass"]["LDL"] == 0 and row["config"]["first_mask_on_need"]


def test_two_q_buffers_hand_the_tensor_pipe_its_qk_sooner_after_the_turn(census):
    # change 52's reading (docs/hopper.md, *Two Q buffers per consumer*): d128 causal's long loops
    # with two Q buffers and the multiply-high decode are the one-buffer build's instructions but for
    # the QK issue, whose descriptor arithmetic moves behind the first HGMMA — that HGMMA issues 17
    # instructions after the pingpong turn's BAR.SYNC instead of 24. What the tile trace's per-step
    # fit is predicted to show; a compiler that schedules the two alike would void the reading
    pair, one = census["d128-causal"], census["d128-causal-one-q-divide"]
    assert pair["row"]["config"]["num_q_stages"] == 2 and one["row"]["config"]["num_q_stages"] == 1
    loops = lambda row: [l for l in row["loops"] if l["HGMMA"] and l["MUFU"] >= 64]     # the K/V loops
    assert len(loops(pair["row"])) == len(loops(one["row"]))
    for a, b in zip(loops(pair["row"]), loops(one["row"])):
        assert abs(a["length"] - b["length"]) <= 4, (a["length"], b["length"])
        assert a["turn_to_first_hgmma"] <= b["turn_to_first_hgmma"] - 5, (a["turn_to_first_hgmma"],
                                                                        b["turn_to_first_hgmma"])
    _assert_no_local_memory(one["row"], "d128-causal-one-q-divide")


def test_mid_length_split_tail_defaults_keep_no_local_memory(census):
    # d128 non-causal's split tail from 4k (change 38) on FA3's and FA4's named orders: the split
    # items' bookkeeping and partial stores keep no local memory, with the first tile masked on
    # need (no key tail: no mask built at all) or always (a key tail), and the K/V loops are the
    # whole-tile kernels' within a few instructions (the split only changes each item's range)
    # Since change 43 these lengths pair their CTAs (kv_multicast): ptxas keeps one value held
    # across the partitions' split in 16 B of local memory, stored once at the start and read once
    # per partition — none inside a loop (test_kv_multicast_copies_halves_and_releases_both_ctas).
    # Since change 44 S4k's producer waits and copies Q in inline PTX (producer_unsynced), and since
    # change 45 S6144's (FA3's order with the mbarrier token): 28 B, 5 LDL, all outside the loops
    # (census)
    for s in (4, 6, 8):
        for suffix in ("", "-no-tail"):
            name = f"d128-full-s{s}k-split{suffix}"
            row = census[name]["row"]
            assert row["config"]["kv_multicast"] and row["config"]["producer_unsynced"] is (s < 8)
            spill, ldl = (28, 5) if s < 8 else (16, 3)
            assert "error" not in row and row["spill_bytes"] <= spill and row["sass"]["LDL"] <= ldl, \
                (name, row["spill_bytes"])
            assert row["config"]["split_tail"] and row["config"]["first_mask_on_need"]
            assert all(loop["ldl"] == 0 for loop in census[name]["kv_loops"])
    # S8k's build against the same default without the split (change 35's S8k kernel)
    # (the K/V steps: the census's longer loops wrap a whole work item, and the split changes those)
    split, whole = ([loop for loop in census[name]["kv_loops"] if loop["length"] < 800 and loop["mufu"] >= 32]
                    for name in ("d128-full-s8k-split-no-tail", "d128-full-s8k-whole-no-tail"))
    assert len(split) == len(whole) >= 2
    for a, b in zip(split, whole):
        assert abs(a["length"] - b["length"]) <= 8, (a["length"], b["length"])


def test_d64_paired_defaults_keep_no_local_memory(census):
    # d64 non-causal pairs its CTAs from S4k and runs the paired producer without bar.sync (changes
    # 43, 44 and 47): its halves multicast into both CTAs, nothing reaches local memory, and the
    # consumers' steady loop keeps every exponential and the inline releases it was priced with
    for s in (4, 16):
        entry = census[f"d64-full-s{s}k-paired"]
        row = entry["row"]
        assert "error" not in row, row["error"]
        assert row["config"]["kv_multicast"] and row["config"]["producer_unsynced"]
        _assert_no_local_memory(row, f"d64-full-s{s}k-paired")
        assert entry["multicast_copies"] > 0 and entry["remote_arrivals"] > 0
        assert entry["loop"]["ldl"] == 0 and entry["loop"]["mufu"] == census["d64-full"]["loop"]["mufu"]


@pytest.mark.parametrize("label, base_label", [("d64-full-s4k-paired-odd", "d64-full-s4k-paired"),
                                               ("d64-full-s16k-paired-odd", "d64-full-s16k-paired"),
                                               ("d128-full-s4k-paired-odd", "d128-full-s4k-split"),
                                               ("d128-full-s16k-paired-odd", "d128-full-s16k-paired")])
def test_paired_defaults_without_the_skip_keep_their_loops(census, label, base_label):
    # a paired launch with an odd count of q-tiles builds its default without skip_empty_rows (change
    # 48): the same pair (multicast copies, remote arrivals), no local memory in the K/V loops, and
    # the steady loop within a few instructions of the build with the skip, whose branch is outside it
    entry = census[label]
    row = entry["row"]
    assert "error" not in row, row["error"]
    assert row["config"]["kv_multicast"] and not row["config"]["skip_empty_rows"]
    assert entry["multicast_copies"] > 0 and entry["remote_arrivals"] > 0
    assert all(loop["ldl"] == 0 for loop in entry["kv_loops"]) and entry["loop"]["ldl"] == 0
    base = census[base_label]
    assert base["row"]["config"]["kv_multicast"] and base["row"]["config"]["skip_empty_rows"]
    assert row["spill_bytes"] <= base["row"]["spill_bytes"]
    assert abs(entry["loop"]["length"] - base["loop"]["length"]) <= 8, (entry["loop"], base["loop"])
    assert entry["loop"]["mufu"] == base["loop"]["mufu"]


def test_meet_before_pass_adds_a_barrier_to_the_passing_loops_only(census):
    # the passing consumers' loops gain one bar.sync a turn; the steady K/V loop, which a consumer
    # with rows runs, is the build without it instruction for instruction (the paired default
    # carries it since change 51)
    entry, base = census["d64-full-s4k-paired"], census["d64-full-s4k-paired-no-meet"]
    row = entry["row"]
    assert "error" not in row, row["error"]
    assert row["config"]["meet_before_pass"] and row["config"]["skip_empty_rows"]
    assert not base["row"]["config"]["meet_before_pass"]
    # d64's three consumers each pass tiles in one loop: the warps meet at its top, and now also
    # between the turn's wait and its pass
    assert [loop["bar"] for loop in base["pass_loops"]] == [1, 1, 1]
    assert [loop["bar"] for loop in entry["pass_loops"]] == [2, 2, 2]
    assert [b["length"] + 1 for b in base["pass_loops"]] == [loop["length"] for loop in entry["pass_loops"]]
    assert entry["loop"] == base["loop"]
    assert [loop["length"] for loop in entry["kv_loops"]] == [loop["length"] for loop in base["kv_loops"]]
    assert row["spill_bytes"] == base["row"]["spill_bytes"] == 0


def test_cross_head_pairs_change_the_producer_only(census):
    # the d64 pairs take two consecutive tiles of the launch (change 49), and a pair across two
    # heads copies both halves of each K/V tile into its own CTA: ptxas unswitches
    # the producer's K/V loop on that (uniform) choice, so a pair within a head runs a loop of two
    # multicast copies within a few instructions of the paired default's, and a solo pair one of
    # four plain copies. The consumers' steady loop is the paired default's instruction for
    # instruction, and no loop touches local memory
    entry, base = census["d64-full-s4k-paired"], census["d64-full-s4k-paired-within"]
    row = entry["row"]
    assert "error" not in row, row["error"]
    assert row["config"]["cross_head_pairs"] and not base["row"]["config"]["cross_head_pairs"]
    assert entry["multicast_copies"] == base["multicast_copies"] > 0
    (base_loop,) = base["producer_loops"]
    paired = [loop for loop in entry["producer_loops"] if loop["utmaldg"] == base_loop["utmaldg"]]
    solo = [loop for loop in entry["producer_loops"] if loop["utmaldg"] == 2 * base_loop["utmaldg"]]
    assert len(paired) == len(solo) == 1, entry["producer_loops"]
    assert paired[0]["length"] <= base_loop["length"] + 8
    assert entry["loop"] == base["loop"]
    assert [loop["length"] for loop in entry["kv_loops"]][:6] == [loop["length"] for loop in base["kv_loops"]][:6]
    assert all(loop["ldl"] == 0 for loop in entry["kv_loops"])
    assert entry["remote_arrivals"] == base["remote_arrivals"]
    assert row["spill_bytes"] == base["row"]["spill_bytes"] == 0


def test_d128_paired_default_relays_and_keeps_the_unpaired_loop(census):
    # d128 non-causal from S8k pairs its CTAs and relays the pair's releases through the producers
    # (change 46): the consumers' steady loop is the unpaired kernel's (the remote arrivals moved
    # to the producer), every exponential stays, nothing reaches local memory inside a loop, and
    # the 16 B ptxas keeps outside them are the pairing's (as d128-full-multicast's)
    entry, unpaired = census["d128-full-s16k-paired"], census["d128-full"]
    row = entry["row"]
    assert "error" not in row, row["error"]
    config_ = row["config"]
    assert config_["kv_multicast"] and config_["relay_release"] and not config_["producer_unsynced"]
    assert not unpaired["row"]["config"]["kv_multicast"]
    assert all(loop["ldl"] == 0 for loop in entry["kv_loops"]) and row["spill_bytes"] <= 16
    assert entry["loop"]["length"] == unpaired["loop"]["length"]
    assert entry["loop"]["mufu"] == unpaired["loop"]["mufu"]
    assert entry["multicast_copies"] > 0 and entry["remote_arrivals"] == 4


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_first_mask_on_need_reaches_a_non_causal_kernel_only_without_a_key_tail(head_dim):
    # a non-causal launch with the switch builds no mask for its first tile at all: right only when
    # no key lies past seqlen_k inside a K/V tile (a one-tile item's zero-filled keys would get
    # weight); a causal launch keeps the config's switch (its branch tests the tile at run time)
    for causal in (False, True):
        for on in (False, True):
            cfg = dataclasses.replace(fwd.default_config(head_dim, causal), first_mask_on_need=on)
            for key_tail in (False, True):
                built = fwd.census_spec(cfg, head_dim, causal, key_tail=key_tail).constexprs["FIRST_MASK_ON_NEED"]
                assert built == (on and (causal or not key_tail)), (causal, on, key_tail)
    assert fwd.default_config(head_dim, False, 4096).first_mask_on_need


def test_first_mask_on_need_without_a_key_tail_keeps_no_local_memory(census):
    # a non-causal launch whose keys fill their K/V tiles compiles the switch without its branch
    # (fwd._first_mask_on_need): the first tile is simply not masked, and the per-tile values the branch
    # pushed to local memory stay in registers; the K/V loops keep their masks and exponentials
    # (ptxas schedules them a few percent apart: 427 -> 428, 643 -> 625 at d64)
    for name, base_name in (("d64-full-unstaggered-first-mask-no-tail", "d64-full-unstaggered"),
                            ("d128-full-whole-first-mask-no-tail", "d128-full-whole")):
        row, base = census[name]["row"], census[base_name]
        _assert_no_local_memory(row, name)
        assert row["config"]["first_mask_on_need"]
        # (the K/V loops: the census's other 'loops' are mbarrier retry branches that jump back
        # across a whole tile or an epilogue, and measure that code, not a K/V step)
        loops, base_loops = ([l for l in e["kv_loops"] if l["length"] < 800 and l["mufu"] >= 32]
                             for e in (census[name], base))
        assert len(loops) == len(base_loops) >= 2
        for a, b in zip(loops, base_loops):
            assert abs(a["length"] - b["length"]) <= 0.04 * b["length"]
            assert (a["fsel"], a["mufu"], a["ldl"]) == (b["fsel"], b["mufu"], 0)


def test_short_causal_tile_census(census):
    # the tile short causal d64 problems run on the online step (config.SHORT_CAUSAL_MAX_SEQLEN; the
    # frozen step's ends a length earlier): two consumer warpgroups at 240 registers, no local memory
    from flashrung.kernels.hopper.config import SHORT_CAUSAL_MAX_SEQLEN

    cfg = fwd.default_config(64, True, SHORT_CAUSAL_MAX_SEQLEN[64], frozen_step=False)
    changes = census["d64-causal-short"]["row"]["config"]
    assert (cfg.block_m, cfg.consumer_regs) == (changes["block_m"], changes["consumer_regs"]) == (128, 240)
    # the row sum reduced every step there (the deferred sum priced NULL on this tile)
    assert cfg.defer_row_sum is False and changes["defer_row_sum"] is False
    assert fwd.default_config(64, True, SHORT_CAUSAL_MAX_SEQLEN[64] + 1).defer_row_sum is True
    row = census["d64-causal-short"]["row"]
    assert "error" not in row and row["spill_bytes"] == 0
    assert row["sass"]["LDL"] == 0 and row["sass"]["STL"] == 0
    assert row["sass"]["HGMMA"] > 0 and row["sass"]["USETMAXREG"] > 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_softmax_placement_in_sass(census, head_dim, causal):
    # FA3's order: ptxas hoists a plain wait(0) above the exp2 block (softmax(j) would wait for
    # PV(j-1)); the kernel keeps it behind a branch, so every steady-state window between wait(1)
    # and wait(0) holds a whole tile of exponentials (BLOCK_N·64 scores over 128 threads).
    # FA4's order (wait_pv_early): only the row max sits in that window; the tile's exponentials
    # come after PV(j-1)'s wait, where the other warpgroup's GEMMs (pingpong) cover them.
    entry = census[f"d{head_dim}-{'causal' if causal else 'full'}"]
    windows = entry["windows"]
    # the label's build: the online step's default, as the census script builds it
    cfg = types.SimpleNamespace(**entry["row"]["config"])
    per_tile = cfg.block_n * 64 // 128
    assert windows, "no wgmma wait(1): the overlapped schedule is missing"
    if cfg.gate_pv_wait:
        # PV's wait behind its branch after the row max (d128 non-causal from S16k, change 37):
        # ptxas takes the tile's exponentials ahead of that branch too, so the whole softmax runs
        # under PV(j-1) again, FA3's placement inside FA4's pingpong (ungated: 0-30 of 64)
        assert all(n >= per_tile for n in windows), windows
    elif cfg.wait_pv_early:
        assert all(n < per_tile for n in windows), windows
    else:
        assert all(n >= per_tile for n in windows), windows


def test_fa3_order_keeps_the_gated_wait(census):
    entry = census["d64-full-fa3-order"]
    per_tile = entry["row"]["config"]["block_n"] * 64 // 128
    assert entry["windows"] and all(n >= per_tile for n in entry["windows"]), entry["windows"]


def test_exp2_split_moves_exponentials_off_mufu(census):
    # one exponential in four on the FMA pipe: a quarter of the tile's MUFU.EX2 disappear, each
    # replaced by FA4's FADD.RM range reduction and three FFMAs, with no F2I/FRND (MUFU-pipe) help
    base, split = census["d64-full"]["row"], census["d64-full-exp2-split4"]["row"]
    assert split["spill_bytes"] == 0
    # every P exponential goes through the split; the per-row alpha exponentials stay on MUFU
    assert 0.70 * base["sass"]["MUFU.EX2"] <= split["sass"]["MUFU.EX2"] <= 0.80 * base["sass"]["MUFU.EX2"]
    assert split["sass"]["opcodes"].get("FADD.RM", 0) > 0
    assert not any(op.startswith("FRND") for op in split["sass"]["opcodes"])


def test_exp2_split16_moves_one_exponential_in_sixteen_off_mufu(census):
    # N = 16: each K/V loop with a softmax issues 4 of a thread's 64 score exponentials as FMA-pipe
    # polynomials and the rest, with the rescale's, on MUFU; the same wgmma, no local memory (census
    # of d64 S32k's paired default with the switch: steady loop 433 -> 462 instructions, MUFU.EX2 66 -> 62)
    base, split = census["d64-full"], census["d64-full-exp2-split16"]
    assert "error" not in split["row"], split["row"]["error"]
    assert split["row"]["config"]["exp2_fma_every"] == 16 and split["row"]["spill_bytes"] == 0
    scores_per_thread = 64
    assert len(split["kv_loops"]) == len(base["kv_loops"])
    softmax_loops = 0
    for s_loop, b_loop in zip(split["kv_loops"], base["kv_loops"]):
        assert s_loop["hgmma"] == b_loop["hgmma"] and s_loop["ldl"] == b_loop["ldl"] == 0
        softmax = b_loop["mufu"] >= scores_per_thread
        softmax_loops += softmax
        assert b_loop["mufu"] - s_loop["mufu"] == (scores_per_thread // 16 if softmax else 0), (s_loop, b_loop)
    assert softmax_loops > 0


def test_q_in_registers_in_sass(census):
    # with the switch, Q is loaded once per tile with ldmatrix and feeds QK as a register-A wgmma;
    # the defaults keep Q in shared memory (d64's 192×128 tile has no registers for it)
    assert not fwd.default_config(64, False).q_in_registers
    assert census["d64-full-qreg"]["row"]["sass"]["LDSM"] > 0
    assert census["d64-full"]["row"]["sass"]["LDSM"] == 0
    assert census["d128-full"]["row"]["sass"]["LDSM"] == 0


def test_deferred_row_sum_drops_the_quad_reduction_from_the_loop(census):
    # l as per-thread partials: the row sum's two butterfly shuffles and two adds per row (two rows
    # per thread) leave the KV loop — 4 + 4 per loop trip, in each of the two loop copies (masked
    # and unmasked) — and come back once per tile of rows in the epilogue
    assert fwd.default_config(128, False).defer_row_sum
    base, defer = census["d128-full-summed"], census["d128-full"]
    assert defer["row"]["spill_bytes"] == 0 and defer["loop"]["ldl"] == 0
    ops, ops0 = defer["row"]["sass"]["opcodes"], base["row"]["sass"]["opcodes"]
    assert ops0["SHFL.BFLY"] - ops["SHFL.BFLY"] == 16 and ops0["FADD"] - ops["FADD"] == 16


def test_named_turns_use_their_own_hardware_barriers(census):
    # the pingpong token as FA3's warp-scheduler barrier: each consumer syncs on its own named
    # barrier (its 128 threads plus the 128 that pass the token) before its GEMMs and arrives on
    # the next one's after them. Triton's warp specialization keeps its own barrier ids below
    # TURN_BARRIER_BASE, so the two never meet at one barrier.
    from flashrung.kernels.hopper.pipeline import TURN_BARRIER_BASE

    entry = census["d64-full-named"]
    assert entry["row"]["spill_bytes"] == 0
    consumers = fwd.default_config(64, False).num_consumers
    turns = {(op, i) for op, i, n in entry["bars"] if n == 256}
    expected = {(op, TURN_BARRIER_BASE + wg) for op in ("SYNC", "ARV") for wg in range(consumers)}
    assert turns == expected, entry["bars"]
    assert all(i < TURN_BARRIER_BASE for _, i, n in entry["bars"] if n != 256), entry["bars"]
    # the mbarrier-token default has no 256-thread barrier
    assert not any(n == 256 for _, _, n in census["d64-full"]["bars"])


def test_split_tail_leaves_the_kv_loop_alone(census):
    # the split tail changes which tiles and K/V ranges an item walks and where its epilogue
    # writes; nothing spills at d128 and the steady loop keeps its exponentials, growing by at
    # most 4 instructions (measured on FA3's order: 470 → 474, six UMOV more and two compares
    # fewer on the uniform datapath, where the loop's ring and descriptor arithmetic lives). Since
    # change 35 the kernel runs FA4's order, where the exponentials follow PV's wait except the
    # dozen or so ptxas starts before it (24-30 here), a count of its scheduling, not of the split;
    # with PV's gated wait (change 37, both builds here) the loop grows by 5 (483 -> 488)
    split, base = census["d128-full"], census["d128-full-whole"]
    assert split["row"]["config"]["split_tail"] and not base["row"]["config"]["split_tail"]
    assert "error" not in split["row"], split["row"]["error"]
    assert split["row"]["spill_bytes"] == 0 and split["loop"]["ldl"] == 0
    assert base["loop"]["length"] <= split["loop"]["length"] <= base["loop"]["length"] + 6
    assert split["loop"]["mufu"] == base["loop"]["mufu"]
    assert split["loop"]["fmul"] == base["loop"]["fmul"] and split["loop"]["prmt"] == base["loop"]["prmt"]


def test_lag_v_loads_changes_the_producer_only(census):
    # V(j) issued after K(j+1) reorders the producer's loads: the consumers' steady loop and its
    # softmax windows are the same code, nothing spills, and the producer keeps its count of TMA
    # load sites (the V before the loop moves after it: an item's last V)
    lag, base = census["d128-full-lag-v"], census["d128-full"]
    assert lag["row"]["config"]["lag_v_loads"] and not base["row"]["config"]["lag_v_loads"]
    assert "error" not in lag["row"], lag["row"]["error"]
    assert lag["row"]["spill_bytes"] == 0 and lag["loop"]["ldl"] == 0
    assert lag["loop"] == base["loop"]
    assert lag["windows"] == base["windows"]
    assert lag["row"]["sass"]["UTMALDG"] == base["row"]["sass"]["UTMALDG"], \
        (lag["row"]["sass"]["UTMALDG"], base["row"]["sass"]["UTMALDG"])


def test_kv_multicast_copies_halves_and_releases_both_ctas(census):
    # kv_multicast: every K/V load is this CTA's half multicast into both CTAs (two 128-B column
    # chunks at d128, at each of the producer's four load sites), each partition meets the cluster
    # barrier once (two consumers and the producer), the consumers' releases also arrive on the
    # peer (remote arrivals), and each empty barrier counts the releases of both CTAs' consumers.
    # The steady loop grows by the remote arrivals only and keeps nothing in local memory; the
    # 16 B ptxas spills sit outside every loop (a value computed before the partitions split)
    mc, base = census["d128-full-multicast"], census["d128-full"]
    assert mc["row"]["config"]["kv_multicast"] and not base["row"]["config"]["kv_multicast"]
    assert "error" not in mc["row"], mc["row"]["error"]
    assert mc["multicast_copies"] == 8 and base["multicast_copies"] == 0
    assert mc["cluster_barriers"] == 3 and base["cluster_barriers"] == 0
    assert mc["remote_arrivals"] > 0 and base["remote_arrivals"] == 0
    for array in ("K_EMPTY_AT", "V_EMPTY_AT"):
        assert mc["inits"][str(mc["barrier_offsets"][array])] == 2 * base["inits"][str(base["barrier_offsets"][array])]
    assert mc["loop"]["ldl"] == 0 and mc["row"]["spill_bytes"] <= 16
    assert base["loop"]["length"] < mc["loop"]["length"] <= base["loop"]["length"] + 8
    assert mc["loop"]["mufu"] == base["loop"]["mufu"]


@pytest.mark.parametrize("relay_label, paired_label", [("d128-full-s4k-relay", "d128-full-s4k-split-no-tail"),
                                                       ("d64-full-s16k-relay", "d64-full-s16k-paired"),
                                                       ("d128-full-s16k-paired", "d128-full-s16k-consumers-release")])
def test_relay_release_takes_the_remote_arrivals_out_of_the_consumers_loop(census, relay_label, paired_label):
    # relay_release: the consumers release in their own CTA only (the empty barriers count this
    # CTA's consumers, half the pair's), the producer relays to the peer (its relay barriers one
    # arrival each, one remote arrival per K and per V load site left in the kernel), so the
    # consumers' steady loop loses the remote arrivals' instructions (7 at d128 S4k: 495 -> 488, the
    # unpaired kernel's length) and keeps its exponentials; nothing new in local memory
    relay, paired = census[relay_label], census[paired_label]
    assert relay["row"]["config"]["relay_release"] and paired["row"]["config"]["kv_multicast"]
    assert "error" not in relay["row"], relay["row"]["error"]
    assert relay["row"]["spill_bytes"] <= paired["row"]["spill_bytes"]
    assert all(loop["ldl"] == 0 for loop in relay["kv_loops"])
    assert relay["loop"]["length"] <= paired["loop"]["length"] - 5 and relay["loop"]["mufu"] == paired["loop"]["mufu"]
    assert relay["multicast_copies"] == paired["multicast_copies"]
    assert 0 < relay["remote_arrivals"] < paired["remote_arrivals"]
    stages = relay["row"]["config"]["num_kv_stages"]
    offsets, inits = relay["barrier_offsets"], {int(k): v for k, v in relay["inits"].items()}
    paired_inits = {int(k): v for k, v in paired["inits"].items()}
    for empty, relay_at in (("K_EMPTY_AT", "K_RELAY_AT"), ("V_EMPTY_AT", "V_RELAY_AT")):
        for slot in range(stages):
            assert 2 * inits[offsets[empty] + 8 * slot] == paired_inits[paired["barrier_offsets"][empty] + 8 * slot]
            assert inits[offsets[relay_at] + 8 * slot] == 1
    assert "K_RELAY_AT" not in paired["barrier_offsets"]


def test_relay_release_is_a_way_of_running_a_pair():
    # refused without the pairing (or with per-thread releases, which it does not relay); a change
    # that unpairs a configuration drops it with producer_unsynced, unless it names it
    paired = fwd.default_config(128, False, 4096)
    relayed = dataclasses.replace(paired, relay_release=True)
    relayed.check(128)
    with pytest.raises(ValueError, match="relay_release"):
        dataclasses.replace(relayed, kv_multicast=False, producer_unsynced=False).check(128)
    unpaired = replace_following(relayed, 128, kv_multicast=False)
    assert not unpaired.relay_release and not unpaired.producer_unsynced
    unpaired.check(128)
    with pytest.raises(ValueError, match="relay_release"):
        replace_following(relayed, 128, kv_multicast=False, relay_release=True).check(128)
    # the self-check prices it as a switch of d64 non-causal's default (16k: paired)
    from flashrung.kernels.hopper import selfcheck

    assert ("relay_release=True", {"relay_release": True}) in selfcheck._switches(64, False)


def test_producer_warpgroup_is_multicasts_producer_without_the_pairing(census):
    # four producer warps, no cluster: Gluon's copies (none multicast) with each 256-B row's two
    # 128-B column chunks issued by two warps, one instruction each where one warp issued both (half
    # the UTMALDG sites), no cluster barrier or remote arrival, the empty barriers counting this
    # CTA's consumers only, and nothing in local memory
    wg, base = census["d128-full-producer-wg"], census["d128-full"]
    assert wg["row"]["config"]["producer_warpgroup"] and not wg["row"]["config"]["kv_multicast"]
    _assert_no_local_memory(wg["row"], "d128-full-producer-wg")
    assert 2 * wg["row"]["sass"]["UTMALDG"] == base["row"]["sass"]["UTMALDG"]
    assert wg["multicast_copies"] == wg["cluster_barriers"] == wg["remote_arrivals"] == 0
    assert wg["inits"] == base["inits"]
    assert wg["loop"]["mufu"] == base["loop"]["mufu"]
    with pytest.raises(ValueError, match="producer_warpgroup"):
        dataclasses.replace(fwd.default_config(128, False), producer_warpgroup=True, dynamic_tiles=True,
                            split_tail=False).check(128)


def test_producer_unsynced_meets_no_bar_sync(census):
    # the same kernel as kv_multicast's but for the producer's waits and Q copies, now inline PTX:
    # the producer partition's own bar.sync (Gluon's fence around each of its mbarrier waits,
    # expects and Q copies) is gone from the whole kernel and from its K/V loop, Q's two 128-B
    # column chunks are one inline copy each (four more UTMALDG sites than Gluon's copy issued from
    # two warps), and the consumers' K/V loops are the same (their exponentials still ahead of PV's
    # wait); ptxas keeps 28 B in local memory outside every loop (16 B with Gluon's producer)
    unsynced, mc = census["d128-full-unsynced-producer"], census["d128-full-multicast"]
    assert unsynced["row"]["config"]["producer_unsynced"] and unsynced["row"]["config"]["kv_multicast"]
    assert "error" not in unsynced["row"], unsynced["row"]["error"]
    assert unsynced["multicast_copies"] == mc["multicast_copies"] == 8
    assert unsynced["cluster_barriers"] == mc["cluster_barriers"]
    assert unsynced["remote_arrivals"] == mc["remote_arrivals"]
    kept, before = {tuple(b) for b in unsynced["bars"]}, {tuple(b) for b in mc["bars"]}
    gone = before - kept
    assert kept <= before and len(gone) == 1, gone
    assert next(iter(gone))[0] == "SYNC" and next(iter(gone))[2] == 128, gone
    assert unsynced["row"]["sass"]["UTMALDG"] == mc["row"]["sass"]["UTMALDG"] + 4
    assert [loop["utmaldg"] for loop in unsynced["producer_loops"]] == [4] * len(mc["producer_loops"])
    assert [loop["mufu_before_last_wait"] for loop in unsynced["kv_loops"]] == \
        [loop["mufu_before_last_wait"] for loop in mc["kv_loops"]]
    assert all(abs(a["length"] - b["length"]) <= 8 and a["ldl"] == b["ldl"]
               for a, b in zip(unsynced["kv_loops"], mc["kv_loops"], strict=True))
    assert unsynced["loop"] == mc["loop"] and unsynced["loop"]["ldl"] == 0
    assert unsynced["row"]["spill_bytes"] <= 32
    with pytest.raises(ValueError, match="producer_unsynced"):
        dataclasses.replace(fwd.default_config(128, False, 2048), producer_unsynced=True).check(128)
    # a change that unpairs a paired default drops its producer's switch with it
    paired = dataclasses.replace(fwd.default_config(128, False, 4096), producer_unsynced=True)
    assert paired.kv_multicast
    unpaired = replace_following(paired, 128, stagger_kv=True)
    assert not unpaired.kv_multicast and not unpaired.producer_unsynced
    unpaired.check(128)


def test_producer_wait_hint_sleeps_the_producer_only(census):
    # the hint turns each of the producer's failed tries into a NANOSLEEP.SYNCS (woken by the
    # barrier's phase change) where the plain loop re-issues its try; the consumers' waits keep
    # theirs: their K/V loops (a trip's 66 exponentials) are the same instructions. The spans
    # innermost_loops reads from a wait to its retry block at the kernel's end grow by the sleeps
    # in between, and only in length
    sleep, plain = census["d128-full-unsynced-producer-sleep"], census["d128-full-unsynced-producer"]
    assert "error" not in sleep["row"], sleep["row"]["error"]
    assert plain["nanosleeps"] == 0 and sleep["nanosleeps"] > 0
    assert sleep["row"]["spill_bytes"] == plain["row"]["spill_bytes"]
    steady = [loop for loop in plain["kv_loops"] if loop["mufu"] == 66]
    assert steady and [loop for loop in sleep["kv_loops"] if loop["mufu"] == 66] == steady
    assert len(sleep["kv_loops"]) == len(plain["kv_loops"])
    for a, b in zip(sleep["kv_loops"], plain["kv_loops"]):
        assert a["length"] >= b["length"] and dict(a, length=0) == dict(b, length=0), (a, b)
    assert sleep["producer_loops"] == plain["producer_loops"]
    assert sleep["bars"] == plain["bars"] and sleep["multicast_copies"] == plain["multicast_copies"]


def test_producer_wait_hint_needs_the_inline_producer():
    paired = fwd.default_config(64, False, 16384)
    assert paired.producer_unsynced and paired.producer_wait_hint_ns == 0
    dataclasses.replace(paired, producer_wait_hint_ns=10_000_000).check(64)
    with pytest.raises(ValueError, match="producer_wait_hint_ns is a hint on the producer's inline try_wait"):
        dataclasses.replace(fwd.default_config(64, True, 16384), producer_wait_hint_ns=1000).check(64)
    for bad in (-1, 2 ** 32, 1.5, True):
        with pytest.raises(ValueError, match="producer_wait_hint_ns must be an int"):
            dataclasses.replace(paired, producer_wait_hint_ns=bad).check(64)
    problem = _problem(head_dim=64, head_dim_v=64, seqlen_q=16384, seqlen_k=16384, heads_q=2, heads_kv=2)
    assert fwd.config_with(problem, {"producer_wait_hint_ns": "10000000"}).producer_wait_hint_ns == 10_000_000


@pytest.mark.parametrize("changes", [dict(num_q_stages=2), dict(fast_divide_producer=True),
                                     dict(fast_divide_consumers=True)])
def test_producer_unsynced_is_refused_beside_two_q_buffers_or_the_multiply_high_decode(changes):
    # forced beside them (d64 non-causal S2048's default), the unsynced producer's launches hung on
    # the H200 — a hang since traced to S2048's odd count of q-tiles (change 48), but the combination
    # has not run clean since: check() names the switches instead of launching one, and a pairing
    # of that default runs Gluon's producer
    paired = fwd.default_config(64, False, 16384)
    assert paired.producer_unsynced and paired.num_q_stages == 1 and not paired.fast_divide_producer
    with pytest.raises(ValueError, match="producer_unsynced runs only with one Q buffer"):
        dataclasses.replace(paired, **changes).check(64)
    # forced on a paired default without naming the producer, the pair keeps Gluon's (the gates of
    # the second Q buffer and the multiply-high decode at S4097 force them so); named, refused
    stepped = replace_following(paired, 64, **changes)
    assert stepped.kv_multicast and not stepped.producer_unsynced
    stepped.check(64)
    with pytest.raises(ValueError, match="producer_unsynced"):
        replace_following(paired, 64, producer_unsynced=True, **changes).check(64)
    problem = _problem(head_dim=64, head_dim_v=64, seqlen_q=4097, seqlen_k=1000, heads_q=2, heads_kv=2)
    forced = fwd.config_with(problem, {key: str(value).lower() for key, value in changes.items()})
    assert forced.kv_multicast and not forced.producer_unsynced
    short = fwd.default_config(64, False, 2048)
    assert short.num_q_stages == 2 and short.fast_divide_producer and short.fast_divide_consumers
    replace_following(short, 64, kv_multicast=True, asm_arrivals=True).check(64)
    with pytest.raises(ValueError, match="num_q_stages=1, fast_divide_producer=False"):
        replace_following(short, 64, kv_multicast=True, asm_arrivals=True, producer_unsynced=True).check(64)


@pytest.mark.parametrize("head_dim, seqlen, paired, unsynced, relay", [
    (64, 1024, False, False, False), (64, 2047, False, False, False), (64, 2048, True, False, False),
    (64, 2049, True, True, False), (64, 3071, True, True, False), (64, 3072, True, True, False),
    (64, 4095, True, True, False), (64, 4096, True, True, False), (64, 16384, True, True, False),
    (64, 16385, True, True, False), (64, 32768, True, True, False), (64, 1 << 20, True, True, False),
    (128, 4095, False, False, False), (128, 4096, True, True, False),
    (128, 6143, True, True, False), (128, 6144, True, True, False), (128, 8191, True, True, False),
    (128, 8192, True, False, True), (128, 8193, True, False, True), (128, 16384, True, False, True),
    (128, 1 << 20, True, False, True), (256, 8192, False, False, False)])
def test_paired_ways_follow_the_measured_rule(head_dim, seqlen, paired, unsynced, relay):
    # the pairing where it priced KEEP (d64 from S2k — NULL at S1536, REVERT on the short tile at
    # S1k; d128 from S4k, past S8k with the relay); the paired producer waits and copies Q in inline
    # PTX where that priced KEEP over Gluon's (d64 S2560-S32k, not with S2048's two Q buffers and
    # multiply-high decode; d128 S4k and S6144 in FA3's order), not on d128's FA4 order (S8k: NULL), where
    # the producers relay the pair's releases instead (S8k-S32k: KEEP); never on a causal problem
    # (never paired); unpairing the default, by name or by a change the pairing cannot run with,
    # drops both switches and leaves a configuration check() accepts
    for causal in (False, True):
        for sq, sk in ((seqlen, seqlen), (300, seqlen), (seqlen, 1000)):
            cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal, seqlen_q=sq,
                                         seqlen_k=sk))
            assert cfg.kv_multicast is (paired and not causal), (head_dim, causal, sq, sk)
            assert cfg.producer_unsynced is (unsynced and not causal), (head_dim, causal, sq, sk)
            assert cfg.relay_release is (relay and not causal), (head_dim, causal, sq, sk)
            cfg.check(head_dim)
            for change in (dict(kv_multicast=False), dict(stagger_kv=True), dict(asm_arrivals=False)):
                unpaired = replace_following(cfg, head_dim, **change)
                assert not (unpaired.kv_multicast or unpaired.producer_unsynced or unpaired.relay_release), change
                unpaired.check(head_dim)
    if unsynced:   # named with the unpairing change, the switch is refused, not dropped
        with pytest.raises(ValueError, match="producer_unsynced"):
            replace_following(cfg, head_dim, kv_multicast=False, producer_unsynced=True).check(head_dim)
    if relay:
        with pytest.raises(ValueError, match="relay_release"):
            replace_following(cfg, head_dim, kv_multicast=False, relay_release=True).check(head_dim)


def test_kv_multicast_refuses_what_it_cannot_pair():
    # the pair of q-tiles needs the stride schedule and inline releases; each refusal names the
    # switch that stands in the way
    base = _d128_unpaired(False)
    dataclasses.replace(base, kv_multicast=True).check(128)
    for change in (dict(asm_arrivals=False), dict(stagger_kv=True), dict(dynamic_tiles=True, split_tail=False),
                   dict(extra_keys=64)):
        with pytest.raises(ValueError, match="kv_multicast"):
            dataclasses.replace(base, kv_multicast=True, **change).check(128)


def test_the_stagger_forced_builds_the_sweep_the_defaults_stagger_with():
    # select_config wraps every staggered sweep by compare and subtract (change 41): the stagger
    # forced on builds that wrap unless the modulo is named; forced off, it takes the wrap with it
    # and builds the unstaggered default field for field
    from flashrung.kernels.hopper import defaults as D

    unstaggered = D.problem(128, False, 2000)
    assert fwd.config_with(unstaggered, {"stagger_kv": "true"}).stagger_subtract
    assert not fwd.config_with(unstaggered, {"stagger_kv": "true", "stagger_subtract": "false"}).stagger_subtract
    staggered = D.problem(64, True, 8192)
    base = select_config(staggered)
    assert base.stagger_kv and base.stagger_subtract
    off = fwd.config_with(staggered, {"stagger_kv": "false"})
    assert off == dataclasses.replace(base, stagger_kv=False, stagger_subtract=False)
    assert fwd.config_with(staggered, {"stagger_subtract": "false"}).stagger_kv


def test_kv_multicast_forced_on_brings_what_select_config_pairs_with():
    # `@kv_multicast=true` on an unpaired default takes the inline arrivals and the unstaggered
    # sweeps with it (select_config's pairing) and the meeting before each pass, so the override
    # builds; naming one of them keeps the value named, and check() refuses what cannot pair
    for d, seqlen in ((128, 2048), (64, 1536)):
        base = fwd.default_config(d, False, seqlen)
        assert not base.kv_multicast and not base.asm_arrivals, (d, seqlen)
        paired = replace_following(base, d, kv_multicast=True)
        assert paired.kv_multicast and paired.asm_arrivals and paired.meet_before_pass, (d, seqlen)
        assert not (paired.stagger_kv or paired.stagger_subtract), (d, seqlen)
        paired.check(d)
        with pytest.raises(ValueError, match="kv_multicast"):
            replace_following(base, d, kv_multicast=True, asm_arrivals=False).check(d)
    staggered = _d64_unpaired_32k()
    assert staggered.stagger_kv
    assert not replace_following(staggered, 64, kv_multicast=True).stagger_kv
    with pytest.raises(ValueError, match="kv_multicast"):    # causal: the balanced lists cannot pair
        replace_following(fwd.default_config(128, True, 8192), 128, kv_multicast=True).check(128)


def test_kv_multicast_plan_pairs_q_tiles():
    # the schedule's tiles are pairs of q-tiles and its workers clusters of two: an odd number of
    # q-tiles rounds up to a whole pair, the persistent grid holds whole clusters, and the split
    # tail is decided over pairs and clusters
    cfg = fwd.default_config(128, False, 16384)
    assert cfg.kv_multicast
    plan = fwd._plan(cfg, 2, 16384, 16384, 16, 16, 128, 2, False, True, 132)
    base = fwd._plan(_d128_unpaired(False), 2, 16384, 16384, 16, 16, 128, 2, False, True, 132)
    assert plan.num_m_blocks == base.num_m_blocks // 2 and plan.num_tiles == base.num_tiles // 2
    assert plan.grid == 132 and plan.grid % 2 == 0
    assert (plan.num_full_tiles, plan.splits) == tail_split(plan.num_tiles, 66, 128)
    odd = fwd._plan(cfg, 1, 3 * 128 + 1, 1000, 2, 2, 128, 2, False, True, 132)
    assert odd.num_m_blocks == 2 and odd.grid == 2 * odd.num_items


def test_cross_head_pairs_plan_pairs_the_launch_tiles():
    # with cross_head_pairs a pair is two consecutive tiles of the whole launch: the decode divides
    # by the per-head q-tile count, and the launch's tiles round up to whole pairs once, not once
    # per head (d64 B8 H32 S4324: 23 q-tiles a head, 2944 pairs instead of 3072)
    cfg = fwd.default_config(64, False, 4096)
    assert cfg.kv_multicast and not cfg.lpt and cfg.cross_head_pairs
    cross = cfg
    cross.check(64)
    # d128's pairs stay within a head (its census: the consumers' loop rescheduled)
    assert not fwd.default_config(128, False, 4096).cross_head_pairs
    within = fwd._plan(dataclasses.replace(cfg, cross_head_pairs=False), 8, 4324, 4324, 32, 32, 64, 2, False, True, 132)
    plan = fwd._plan(cross, 8, 4324, 4324, 32, 32, 64, 2, False, True, 132)
    assert within.num_m_blocks == 12 and within.num_tiles == 12 * 256
    assert plan.num_m_blocks == 23 and plan.num_tiles == 23 * 256 // 2
    assert plan.grid == 132 and plan.cluster_ctas == 2
    # the kernel's num_m_blocks divisor is the per-head count
    assert plan.ints[plan_ints_index("num_m_blocks")] == 23
    # an odd launch total leaves one pair with a tile past the end: only then is the skip of empty
    # rows off (fwd._skip_empty_rows) where the passing warps do not meet (meet_before_pass, on by
    # default since change 51); per-head odd counts no longer matter
    for batch, heads, seqlen in ((8, 32, 4324), (1, 3, 4324), (1, 4, 17), (1, 3, 17), (3, 1, 192 * 4)):
        tiles = triton.cdiv(seqlen, cross.block_m) * batch * heads
        p = fwd._plan(dataclasses.replace(cross, meet_before_pass=False), batch, seqlen, seqlen, heads, heads, 64, 2,
                      False, True, 132)
        assert p.num_tiles == triton.cdiv(tiles, 2)
        assert p.constexprs["SKIP_EMPTY_ROWS"] == (tiles % 2 == 0), (batch, heads, seqlen)
        assert p.build[-1] == p.constexprs["SKIP_EMPTY_ROWS"]
        assert fwd._plan(cross, batch, seqlen, seqlen, heads, heads, 64, 2, False, True, 132).constexprs["SKIP_EMPTY_ROWS"]


def test_meet_before_pass_keeps_the_skip_where_the_rule_drops_it():
    # change 48's rule builds a launch whose last pair has a tile past the sequence without the skip
    # of empty rows; with the passing warps meeting before each pass (meet_before_pass) the same
    # launches keep it — d64 pairing across heads (an odd launch total), d128 within a head (an odd
    # count a head) — and launches without such a pair keep it either way
    for head_dim, batch, heads, seqlen, odd in ((64, 1, 3, 17, True), (64, 1, 3, 4324, True),
                                                (64, 8, 32, 4324, False), (128, 1, 2, 300, True),
                                                (128, 8, 16, 4160, True), (128, 8, 16, 4096, False)):
        rule = dataclasses.replace(fwd.default_config(head_dim, False, 4096), meet_before_pass=False)
        meet = dataclasses.replace(rule, meet_before_pass=True)
        meet.check(head_dim)
        plans = [fwd._plan(cfg, batch, seqlen, seqlen, heads, heads, head_dim, 2, False, True, 132)
                 for cfg in (rule, meet)]
        assert [p.constexprs["SKIP_EMPTY_ROWS"] for p in plans] == [not odd, True], (head_dim, batch, heads, seqlen)
        assert plans[0].build != plans[1].build


def plan_ints_index(name):
    """Where argument ``name`` sits in a plan's ``ints`` (the kernel's size arguments in order)."""
    return fwd._SIZE_ARGS.index(name)


def test_cross_head_pairs_need_the_plain_order_of_a_pair():
    paired = fwd.default_config(64, False, 4096)
    with pytest.raises(ValueError, match="cross_head_pairs"):
        dataclasses.replace(paired, cross_head_pairs=True, lpt=True).check(64)
    with pytest.raises(ValueError, match="cross_head_pairs"):
        HopperFwdConfig(cross_head_pairs=True).check(64)
    # a way of running a pair: unpairing a configuration drops it unless the change names it
    cross = dataclasses.replace(paired, cross_head_pairs=True)
    assert not fwd.replace_following(cross, 64, kv_multicast=False).cross_head_pairs
    with pytest.raises(ValueError, match="cross_head_pairs"):
        fwd.replace_following(cross, 64, kv_multicast=False, cross_head_pairs=True).check(64)


def test_every_paired_default_meets_before_it_passes_and_keeps_the_skip():
    # change 51: meet_before_pass replaces change 48's rule on the defaults — every kv_multicast
    # default carries it, so a launch whose last pair has a tile past the sequence keeps the skip
    # of empty rows (priced KEEP at d128 B8 H16 S4160); unpairing or forcing the skip or the
    # pingpong off drops it with the pairing's other ways, unless the change names it
    import torch

    from flashrung.dispatch import Problem

    for d, seqlen in ((64, 2048), (64, 4324), (64, 32768), (128, 4160), (128, 8320), (128, 32768)):
        cfg = fwd.select_config(Problem(1, seqlen, seqlen, 3, 3, d, d, torch.bfloat16, False, "cuda", (9, 0)))
        assert cfg.kv_multicast and cfg.meet_before_pass, (d, seqlen)
        assert fwd._plan(cfg, 1, seqlen, seqlen, 3, 3, d, 2, False, True, 132).constexprs["SKIP_EMPTY_ROWS"]
        for change in ({"kv_multicast": False}, {"skip_empty_rows": False}, {"pingpong": False}):
            assert not fwd.replace_following(cfg, d, **change).meet_before_pass, (d, seqlen, change)
        with pytest.raises(ValueError, match="meet_before_pass"):
            fwd.replace_following(cfg, d, skip_empty_rows=False, meet_before_pass=True).check(d)
    for d, causal, seqlen in ((64, False, 1024), (128, False, 2048), (128, True, 8192), (256, False, 8192)):
        cfg = fwd.select_config(Problem(1, seqlen, seqlen, 3, 3, d, d, torch.bfloat16, causal, "cuda", (9, 0)))
        assert not cfg.kv_multicast and not cfg.meet_before_pass, (d, causal, seqlen)


def test_the_pairing_forced_onto_an_unpaired_default_meets_before_it_passes():
    # meet_before_pass follows the pairing in replace_following as select_config derives it: the
    # pairing forced onto an unpaired default (`@kv_multicast=true`) meets before each pass, so a
    # launch whose last pair has a tile past the sequence (odd q-tile count) keeps the skip of
    # empty rows; naming the switch keeps the value given, and forcing the pingpong off with the
    # pairing leaves no turn to meet before
    for d, seqlen in ((64, 1024), (128, 2048)):
        base = fwd.default_config(d, False, seqlen)
        assert not base.kv_multicast and not base.meet_before_pass, (d, seqlen)
        paired = fwd.replace_following(base, d, **_MULTICAST)
        assert paired.kv_multicast and paired.meet_before_pass, (d, seqlen)
        paired.check(d)
        odd = 2 * paired.block_m * 3 + 1  # seven q-tiles a head: the last pair's second tile lies past it
        plan = fwd._plan(paired, 1, odd, odd, 2, 2, d, 2, False, True, 132)
        assert plan.constexprs["SKIP_EMPTY_ROWS"], (d, seqlen)
        named = fwd.replace_following(base, d, **_MULTICAST, meet_before_pass=False)
        assert not named.meet_before_pass
        assert not fwd._plan(named, 1, odd, odd, 2, 2, d, 2, False, True, 132).constexprs["SKIP_EMPTY_ROWS"]
        assert not fwd.replace_following(base, d, **_MULTICAST, pingpong=False).meet_before_pass


def test_meet_before_pass_needs_the_skip_and_the_pingpong():
    paired = dataclasses.replace(fwd.default_config(64, False, 4096), meet_before_pass=True)
    paired.check(64)
    with pytest.raises(ValueError, match="meet_before_pass"):
        dataclasses.replace(paired, skip_empty_rows=False).check(64)
    with pytest.raises(ValueError, match="meet_before_pass"):
        HopperFwdConfig(meet_before_pass=True, pingpong=False).check(64)


def test_a_pair_with_a_tile_past_the_sequence_runs_without_skipping_empty_rows():
    # an odd count of q-tiles leaves a pair whose second tile lies wholly past the sequence; with
    # skip_empty_rows such launches hung on the H200 (d64 S4324, S2048), so their build computes
    # the empty rows (change 48). Even counts, unpaired launches and a config without the skip
    # are unchanged, and the build (what picks the compiled kernel) tells the two apart. Pairs
    # within a head (d128's; d64's before change 49, whose launch-wide count is
    # test_cross_head_pairs_plan_pairs_the_launch_tiles')
    for d in (64, 128):
        # the build before change 51 (the passing warps meeting is the default since)
        cfg = dataclasses.replace(fwd.default_config(d, False, 4096), cross_head_pairs=False, meet_before_pass=False)
        assert cfg.kv_multicast and cfg.skip_empty_rows
        for seqlen in (4096, 4224, 4324, 4416, 8320, 17, 1):
            plan = fwd._plan(cfg, 2, seqlen, seqlen, 4, 4, d, 2, False, True, 132)
            odd = triton.cdiv(seqlen, cfg.block_m) % 2 == 1
            assert plan.constexprs["SKIP_EMPTY_ROWS"] == (not odd), (d, seqlen)
            assert plan.build[-1] == plan.constexprs["SKIP_EMPTY_ROWS"]
            unpaired = fwd.replace_following(cfg, d, kv_multicast=False)
            assert fwd._plan(unpaired, 2, seqlen, seqlen, 4, 4, d, 2, False, True, 132).constexprs["SKIP_EMPTY_ROWS"]
            off = dataclasses.replace(cfg, skip_empty_rows=False)
            assert not fwd._plan(off, 2, seqlen, seqlen, 4, 4, d, 2, False, True, 132).constexprs["SKIP_EMPTY_ROWS"]
            # the warps meeting before each pass (the hazard's fix, soaked clean at d64 S4324) keep it
            meet = dataclasses.replace(cfg, meet_before_pass=True)
            assert fwd._plan(meet, 2, seqlen, seqlen, 4, 4, d, 2, False, True, 132).constexprs["SKIP_EMPTY_ROWS"]
    # the count that matters is the query's: keys do not pair
    cfg = dataclasses.replace(fwd.default_config(64, False, 4096), cross_head_pairs=False, meet_before_pass=False)
    assert not fwd._plan(cfg, 1, 4324, 4096, 4, 4, 64, 2, False, True, 132).constexprs["SKIP_EMPTY_ROWS"]
    assert fwd._plan(cfg, 1, 4096, 4324, 4, 4, 64, 2, False, True, 132).constexprs["SKIP_EMPTY_ROWS"]


def test_late_k_release_moves_one_arrive(census):
    # the K slot is released after PV(j-1)'s wait instead of after QK(j)'s: the steady loop keeps
    # its length and its softmax windows, nothing spills
    late, base = census["d128-full-late-k"], census["d128-full"]
    assert late["row"]["config"]["late_k_release"] and not base["row"]["config"]["late_k_release"]
    assert "error" not in late["row"], late["row"]["error"]
    assert late["row"]["spill_bytes"] == 0 and late["loop"]["ldl"] == 0
    assert abs(late["loop"]["length"] - base["loop"]["length"]) <= 4, (late["loop"], base["loop"])
    assert late["row"]["sass"]["SYNCS"] == base["row"]["sass"]["SYNCS"]


@pytest.mark.parametrize("asm_label, base_label, head_dim", [
    ("d64-full-asm-arrivals", "d64-full", 64), ("d128-full-asm-arrivals", "d128-full-fa3-order", 128),
    # d256's default with whole key tiles beside its default with a key tail (ptxas schedules the
    # loops across the gone barriers: 14-19 instructions shorter)
    ("d256-full-whole-tiles", "d256-full", 256)])
def test_asm_arrivals_leave_one_barrier_in_the_steady_step_and_arrive_where_the_barriers_are(census, asm_label,
                                                                                              base_label, head_dim):
    # Gluon's elected arrivals each bring a partition-wide BAR.SYNC; in inline PTX they bring none:
    # the steady K/V step keeps only the loop-top barrier, with the same exponentials, registers
    # and no local memory. The PTX names each barrier array by a byte offset read from the
    # allocation pass: every offset it names must be one the kernel initializes, the K/V empties
    # with one arrival per consumer (on every slot), the turn with one
    asm, base = census[asm_label], census[base_label]
    assert asm["row"]["config"]["asm_arrivals"] and not base["row"]["config"]["asm_arrivals"]
    assert "error" not in asm["row"], asm["row"]["error"]
    assert asm["row"]["spill_bytes"] == 0 and asm["row"]["regs"] == base["row"]["regs"]
    assert asm["row"]["sass"]["LDL"] == 0 and asm["row"]["sass"]["STL"] == 0
    assert len(asm["kv_loops"]) == len(base["kv_loops"]) > 0
    for a, b in zip(asm["kv_loops"], base["kv_loops"]):
        assert a["bar"] < b["bar"] and a["mufu"] == b["mufu"] and a["ldl"] == 0, (a, b)
        assert -20 <= a["length"] - b["length"] <= 4, (a, b)
    for loop in _steady_steps(asm):
        assert loop["bar"] == 1, loop
    cfg = fwd.default_config(head_dim, False)
    offsets, inits = asm["barrier_offsets"], {int(k): v for k, v in asm["inits"].items()}
    assert base["arrives"] == [] and sorted(asm["arrives"]) == sorted(offsets[k] for k in ("K_EMPTY_AT", "V_EMPTY_AT",
                                                                                           "TURN_AT"))
    for name in ("K_EMPTY_AT", "V_EMPTY_AT"):
        for slot in range(cfg.num_kv_stages):
            assert inits[offsets[name] + 8 * slot] == cfg.num_consumers, (name, slot, inits)
    assert inits[offsets["TURN_AT"]] == 1


@pytest.mark.parametrize("gated_label, plain_label, hoisted", [
    ("d64-full-gate-pv", "d64-full", True), ("d64-causal-gate-pv", "d64-causal", True),
    ("d128-full-fa4-mbar-gate-pv", "d128-full-fa4-mbar", True),
    # change 35's kernel (named turns): ptxas hoisted the wait in one of its steady loops only;
    # change 37 made the gated build d128 non-causal's default from S16k
    ("d128-full", "d128-full-ungated", False)])
def test_gate_pv_wait_keeps_the_row_max_ahead_of_pvs_wait(census, gated_label, plain_label, hoisted):
    # FA4's order waits for PV(j-1) after the row max; ptxas treats the wait as always ready and,
    # on the kernels with the mbarrier token, drops it into the row max's first latency bubble
    # (measured: 13-14 of the 68 FMNMX ahead of it in d64's steady loops, 1 in d64 causal's other
    # loop, 31 at d128 with the mbarrier token). Behind its branch every FMNMX of the trip comes
    # first, with the same exponentials and no local memory (steady loops 2-4 instructions longer,
    # the masked ones within 10 either way)
    gated, plain = census[gated_label], census[plain_label]
    assert gated["row"]["config"]["gate_pv_wait"] and not plain["row"]["config"]["gate_pv_wait"]
    assert "error" not in gated["row"], gated["row"]["error"]
    assert gated["row"]["spill_bytes"] == 0 and gated["row"]["regs"] == plain["row"]["regs"]
    steps = [(a, b) for a, b in zip(gated["kv_loops"], plain["kv_loops"]) if b["mufu"] >= 32]
    assert len(gated["kv_loops"]) == len(plain["kv_loops"]) and steps
    for a, b in steps:
        assert a["mufu"] == b["mufu"] and a["ldl"] == 0 and abs(a["length"] - b["length"]) <= 10, (a, b)
        assert a["fmnmx_before_last_wait"] == a["fmnmx"] > 0, a
    # the hazard it removes, as the census reads it on the build without it
    hoisted_loops = [b for _, b in steps if b["fmnmx_before_last_wait"] < b["fmnmx"] // 2]
    assert hoisted_loops if hoisted else len(hoisted_loops) <= len(steps) // 2, [b["fmnmx_before_last_wait"]
                                                                                 for _, b in steps]


def test_early_exps_overlap_pv(census):
    # early_exp_quarters=1: every steady loop issues its whole row max and a quarter of the tile's
    # exponentials (16 a thread, and alpha's) before PV(j-1)'s wait — FA4's d64 placement — where the
    # default (ptxas hoisting the wait) issues none; same MUFU count, no local memory
    # (the unmasked loops; the key tail's masked loops move 18-24 ahead against the default's 1-4)
    early, base = census["d64-full-early-exps"], census["d64-full"]
    assert "error" not in early["row"] and early["row"]["spill_bytes"] == 0
    pairs = [(a, b) for a, b in zip(early["kv_loops"], base["kv_loops"]) if b["mufu"] >= 32]
    assert len(early["kv_loops"]) == len(base["kv_loops"]) and pairs
    steady = [(a, b) for a, b in pairs if b["fsel"] <= 4]
    assert len(steady) == 3, pairs              # one per consumer warpgroup
    quarter = 128 * 64 // 128 // 4
    for a, b in steady:
        assert a["mufu"] == b["mufu"] and a["ldl"] == 0 and abs(a["length"] - b["length"]) <= 10, (a, b)
        assert a["fmnmx_before_last_wait"] == a["fmnmx"] > 0, a
        assert quarter <= a["mufu_before_last_wait"] < a["mufu"] // 2, a
        assert b["mufu_before_last_wait"] == 0, b
    for a, b in pairs:
        assert a["ldl"] == 0 and a["mufu_before_last_wait"] >= b["mufu_before_last_wait"], (a, b)


def test_rescale_before_exp_moves_os_rescale_off_the_trips_end(census):
    # FA4's order leaves O's 32 multiplies (d64) after the last MUFU.EX2 of every steady trip, in
    # front of the next GEMM issue; rescale_before_exp issues them ahead of the exponentials (its
    # own block): none after the last one, the same exponentials, no local memory
    first, base = census["d64-full-rescale-first"], census["d64-full"]
    assert "error" not in first["row"] and first["row"]["spill_bytes"] == 0
    pairs = [(a, b) for a, b in zip(first["kv_loops"], base["kv_loops"]) if b["mufu"] >= 32]
    steady = [(a, b) for a, b in pairs if b["fsel"] <= 4]
    assert len(first["kv_loops"]) == len(base["kv_loops"]) and len(steady) == 3, pairs
    for a, b in steady:
        assert b["fmul_after_last_mufu"] >= 32, b
        assert a["fmul_after_last_mufu"] <= 2 and a["mufu"] == b["mufu"] and a["ldl"] == 0, (a, b)


def test_a_frozen_row_max_leaves_the_steady_step_the_exponentials_alone(census):
    # freeze_row_max (a measurement of what the row max and O's rescale cost the steady step): the
    # three consumers' unmasked loops keep their 12 wgmma and their exponentials but form no row
    # max (no FMNMX), no alpha (64 MUFU.EX2, not 66) and no O rescale (no FMUL); d64 non-causal
    # 427-428 -> 311-312 instructions (census, sm_90a; 433-437 -> 317-322 at S16k). Masked loops and
    # the rest unchanged
    frozen, base = census["d64-full-freeze-row-max"], census["d64-full"]
    assert "error" not in frozen["row"] and frozen["row"]["spill_bytes"] == 0
    assert frozen["row"]["config"]["freeze_row_max"] and not base["row"]["config"]["freeze_row_max"]
    assert len(frozen["kv_loops"]) == len(base["kv_loops"])
    steady = [(a, b) for a, b in zip(frozen["kv_loops"], base["kv_loops"]) if b["fsel"] <= 4 and b["mufu"] >= 32]
    assert len(steady) == 3, steady
    for a, b in steady:
        assert b["fmnmx"] >= 64 and b["mufu"] == 66 and b["fmul"] >= 32, b
        assert a["fmnmx"] == 0 and a["mufu"] == 64 and a["fmul"] == 0 and a["ldl"] == 0, a
        assert a["hgmma"] == b["hgmma"] and a["length"] < 0.8 * b["length"], (a, b)
    # masked loops unchanged; the loops that hold an item's epilogue (the item loop around the K/V
    # loops) take the guard's row sums, NaN test and store: +57 instructions at d64 (census)
    others = [(a["length"], b["length"]) for a, b in zip(frozen["kv_loops"], base["kv_loops"]) if b["fsel"] > 4]
    assert all(-8 <= x - y <= 64 for x, y in others), others
    # its guard, outside the loops: each epilogue tests its rows for NaN (FSETP.NAN) and may store
    # the guard word (one more STG a store site), where the online build has neither
    opcodes = frozen["row"]["sass"]["opcodes"]
    assert opcodes.get("FSETP.NAN.AND", 0) > 0 and "FSETP.NAN.AND" not in base["row"]["sass"]["opcodes"]
    assert frozen["global_stores"] == 2 * base["global_stores"], (frozen["global_stores"], base["global_stores"])


@pytest.mark.parametrize("window", [(4096, 0), (1024, 0), (300, 45)])
def test_d64s_windowed_default_masks_where_the_window_cuts_except_in_a_pack(window):
    # WINDOW_MASKS_WHERE_CUT (priced at d64: 1.046 at window (4096, 0)) on the 192- and 128-row
    # windowed tiles and the band; d128 and d256 keep both bounds until priced, and a windowed pack
    # keeps them (gated unpacked only)
    q = torch.empty(1, 8192, 16, 64, dtype=torch.bfloat16)
    cfg = select_config(Problem.of(q, q, q, True, window_size=window))
    assert all(getattr(cfg, name) for name in config.WINDOW_MASK_FIELDS)
    packed = config._packed(cfg, 64, True, True)
    assert not any(getattr(packed, name) for name in config.WINDOW_MASK_FIELDS)
    for d in (128, 256):
        wide = torch.empty(1, 8192, 16, d, dtype=torch.bfloat16)
        other = select_config(Problem.of(wide, wide, wide, True, window_size=window))
        assert not any(getattr(other, name) for name in config.WINDOW_MASK_FIELDS)


def test_the_frozen_row_max_is_the_default_from_its_lengths_in_both_dtypes():
    # config.FREEZE_ROW_MAX_MIN_SEQLEN (changes 55, 57-59, paired from those lengths): at and past
    # each row's first length, not one key before, in bf16 and fp16 alike (fp16's build raises its
    # online row max by fp16_row_max_margin, a field of both); never d256 (0.998), a window, packed
    # sequences or a cap; the configuration with it otherwise the online step's and what it brings
    # (config.FREEZE_ROW_MAX_BRINGS: FA4's order, two K/V loops, PV's wait ungated; at d64
    # non-causal the named turns but at S2048, config.FREEZE_ROW_MAX_NAMED_TURNS_SEQLEN)
    for (d, causal), first in config.FREEZE_ROW_MAX_MIN_SEQLEN.items():
        for seqlen in (first - 1, first, 4 * first):
            bf16 = _problem(head_dim=d, head_dim_v=d, causal=causal, seqlen_q=seqlen, seqlen_k=seqlen,
                            batch=max(1, 32768 // seqlen), heads_q=32, heads_kv=32)
            fp16 = dataclasses.replace(bf16, dtype=torch.float16)
            cfg, plain = select_config(bf16), select_config(bf16, frozen_step=False)
            assert cfg.freeze_row_max == (seqlen >= first) and not plain.freeze_row_max, (d, causal, seqlen)
            assert select_config(fp16) == cfg, (d, causal, seqlen)
            brought = {name: value for name, value in config.FREEZE_ROW_MAX_BRINGS.items()
                       if cfg.freeze_row_max and getattr(plain, name) != value}
            if cfg.freeze_row_max and any(a <= seqlen <= b for a, b in
                                          config.FREEZE_ROW_MAX_NAMED_TURNS_SEQLEN.get((d, causal), ())):
                brought["named_turns"] = True      # change 62: the turn on named barriers
            if cfg.freeze_row_max and causal and config.FREEZE_ROW_MAX_SHORT_CAUSAL_MAX_SEQLEN.get(d, 0) \
                    < seqlen <= config.SHORT_CAUSAL_MAX_SEQLEN.get(d, 0):
                # the frozen step's short causal tile ends earlier (change 60): its tile, not the
                # online step's, and otherwise its own brings
                assert cfg.block_m != plain.block_m, (d, causal, seqlen)
            else:
                assert cfg == dataclasses.replace(plain, freeze_row_max=cfg.freeze_row_max, **brought)
            for options in (dict(window_size=(256, -1 if not causal else 0)), dict(varlen=True), dict(softcap=30.0)):
                for problem in (bf16, fp16):
                    assert not select_config(dataclasses.replace(problem, **options)).freeze_row_max, \
                        (d, causal, options)
    for causal in (False, True):
        d256 = _problem(head_dim=256, head_dim_v=256, causal=causal, seqlen_q=16384, seqlen_k=16384)
        assert not select_config(d256).freeze_row_max


def test_the_fp16_margin_is_checked_by_name():
    # fp16_row_max_margin raises fp16's online row max (log2 units); at 14 or more the row max's own
    # P would leave fp16's normal range, and a negative one would let the first tile's P exceed 1
    cfg = fwd.default_config(64, False, 16384)
    assert cfg.fp16_row_max_margin == 8.0
    for bad in (-1.0, 14.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="fp16_row_max_margin"):
            dataclasses.replace(cfg, fp16_row_max_margin=bad).check(64)
    for good in (0.0, 13.5):
        dataclasses.replace(cfg, fp16_row_max_margin=good).check(64)


def test_the_frozen_row_max_brings_what_was_priced_with_it():
    # changes 56-60: at d128 non-causal S2048-8191 the frozen step runs FA4's order (the default
    # there was FA3's, which it cannot join), at d64 causal up to S2048 the two K/V loops (the
    # single one it cannot join), and from S16384 PV's wait ungated; the online step keeps its own
    fa3 = fwd.default_config(128, False, 4096, frozen_step=False)
    assert not fa3.wait_pv_early and fwd.default_config(128, False, 4096).wait_pv_early
    loop = fwd.default_config(64, True, 2048, frozen_step=False)
    assert loop.single_kv_loop and not fwd.default_config(64, True, 2048).single_kv_loop
    gated = fwd.default_config(128, False, 16384, frozen_step=False)
    assert gated.gate_pv_wait and not fwd.default_config(128, False, 16384).gate_pv_wait
    # change 60: at d64 causal S2048 the frozen step runs the 192-row tile of the lengths past it
    # (config.FREEZE_ROW_MAX_SHORT_CAUSAL_MAX_SEQLEN), the online step the short 128-row tile; a key
    # shorter, neither freezes nor leaves the short tile
    assert (loop.block_m, loop.consumer_regs) == (128, 240)
    assert fwd.default_config(64, True, 2048) == fwd.default_config(64, True, 2560)
    for seqlen in (1024, 2047):
        short = fwd.default_config(64, True, seqlen)
        assert not short.freeze_row_max and short.block_m == 128, seqlen
    # change 62: at d64 non-causal the frozen step passes the pingpong turn on named barriers
    # (config.FREEZE_ROW_MAX_NAMED_TURNS_SEQLEN), the online step on mbarriers — and so does S2048's
    # build, the pair with two Q buffers, where the named turns lost (0.9956 / 0.9979); d128
    # non-causal keeps its own rule (named from S8k in FA4's order), d64 causal runs no such turn at S2k
    for seqlen in (512, 1024, 1536, 2047, 2048, 2049, 16384, 32768):
        frozen = fwd.default_config(64, False, seqlen)
        online = fwd.default_config(64, False, seqlen, frozen_step=False)
        assert frozen.freeze_row_max and frozen.pingpong and frozen.named_turns is (seqlen != 2048), seqlen
        assert not online.named_turns, seqlen
        assert {f.name for f in dataclasses.fields(frozen) if getattr(frozen, f.name) != getattr(online, f.name)} \
            <= {"freeze_row_max", "named_turns", *config.FREEZE_ROW_MAX_BRINGS}, seqlen
    for seqlen in (1024, 2048, 4096, 16384):
        assert fwd.default_config(128, False, seqlen).named_turns \
            is fwd.default_config(128, False, seqlen, frozen_step=False).named_turns, seqlen
    for d, causal, seqlen in ((128, False, 4096), (64, True, 2048), (128, False, 16384), (64, False, 8192)):
        fwd.default_config(d, causal, seqlen).check(d)


def test_the_pingpong_forced_off_takes_its_named_turns_with_it():
    # replace_following: named barriers are a way of passing the pingpong's turn, so hopper.fwd@pingpong=false
    # on a default that passes it so (d64's frozen step since change 62, d128 non-causal from S8k)
    # builds a configuration check() accepts, without them; named with it, the value given stays
    # (and check() refuses it by name)
    for d, seqlen in ((64, 16384), (64, 1024), (128, 16384)):
        cfg = fwd.default_config(d, False, seqlen)
        assert cfg.pingpong and cfg.named_turns, (d, seqlen)
        off = replace_following(cfg, d, pingpong=False)
        assert not off.pingpong and not off.named_turns, (d, seqlen)
        off.check(d)
        problem = _problem(head_dim=d, head_dim_v=d, seqlen_q=seqlen, seqlen_k=seqlen, batch=max(1, 32768 // seqlen),
                           heads_q=32, heads_kv=32)
        assert not fwd.config_with(problem, {"pingpong": "false"}).named_turns, (d, seqlen)
        with pytest.raises(ValueError, match="named_turns"):
            replace_following(cfg, d, pingpong=False, named_turns=True).check(d)


def test_the_frozen_row_max_waits_for_a_call_worth_its_launch():
    # config.FREEZE_ROW_MAX_MIN_FLOP: a call below it keeps the online step (its time is its host
    # path, which the recompute's launch lengthens: B1 H32 S2048 d64 ran 0.844x), one at or above it
    # takes the frozen one (B4 there, 137 GFLOP: 1.060x); the suite's rows, and default_config's
    # problems, are above it
    small = _problem(head_dim=64, head_dim_v=64, seqlen_q=2048, seqlen_k=2048, batch=1, heads_q=32, heads_kv=32)
    assert config.call_flop(small) < config.FREEZE_ROW_MAX_MIN_FLOP and not select_config(small).freeze_row_max
    suite = dataclasses.replace(small, batch=4)
    assert config.call_flop(suite) >= config.FREEZE_ROW_MAX_MIN_FLOP and select_config(suite).freeze_row_max
    # the work counts the mask: a causal call is half its non-causal one
    causal = dataclasses.replace(suite, causal=True)
    assert config.call_flop(causal) == config.call_flop(suite) / 2
    for (d, causal), first in config.FREEZE_ROW_MAX_MIN_SEQLEN.items():
        assert fwd.default_config(d, causal, first).freeze_row_max, (d, causal)


def test_a_frozen_calls_configuration_is_built_once():
    # select_config runs on every call's host path: the frozen step's copy of the schedule's
    # configuration is cached (config._frozen), so each call gets the same object — not a fresh
    # copy (about 30 µs of replace_following) that fwd._plan's cache must then compare field by field
    for d, causal in ((128, False), (64, True), (64, False), (128, True)):
        problem = _problem(head_dim=d, head_dim_v=d, causal=causal, seqlen_q=4096, seqlen_k=4096, batch=8,
                           heads_q=32, heads_kv=32)
        first = select_config(problem)
        assert first.freeze_row_max and select_config(dataclasses.replace(problem)) is first, (d, causal)


def test_a_configurations_kept_hash_stays_out_of_its_fields_and_other_processes():
    # each host-path cache hashes a call's configuration, so the hash is kept on the instance
    # (HopperFwdConfig._fields_hash): equal configurations must hash alike however they were made
    # (replace, the fields' dict, a pickled copy), and the kept value must never reach equality,
    # the fields, vars() — HopperFwdConfig(**vars(cfg)) rebuilds one — or another process, where a
    # string's hash differs (check's jobs and shards pickle configurations)
    import os
    import pickle
    import subprocess
    import sys

    first = select_config(_problem(head_dim=128, head_dim_v=128, causal=False, seqlen_q=4096, seqlen_k=4096,
                                   batch=8, heads_q=32, heads_kv=32))
    kept = hash(first)
    assert hash(first) == kept and first._fields_hash == kept
    assert kept == hash(tuple(getattr(first, f.name) for f in dataclasses.fields(first)))
    for copy in (dataclasses.replace(first), HopperFwdConfig(**vars(first)), pickle.loads(pickle.dumps(first))):
        assert copy is not first and copy == first and hash(copy) == kept
    assert "_fields_hash" not in vars(first) and "_fields_hash" not in dataclasses.asdict(first)
    assert dataclasses.replace(first, block_n=64) != first
    assert hash(dataclasses.replace(first, block_n=64)) != kept
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.block_n = 64
    # a copy pickled here, loaded under another string-hash seed, finds its equal in a dict there
    code = ("import pickle, sys\nfrom flashrung.kernels.hopper.config import HopperFwdConfig\n"
            "cfg = pickle.loads(sys.stdin.buffer.read())\n"
            "fresh = HopperFwdConfig(**vars(cfg))\n"
            "print(hash(cfg) == hash(fresh), {fresh: 1}.get(cfg))")
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(first), capture_output=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, timeout=120)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert done.stdout.decode().split() == ["True", "1"], (seed, done.stdout)


def test_a_frozen_step_set_aside_takes_what_it_brought():
    # hopper.fwd@... on a frozen default: turned off, or set aside for a lever it cannot join (the
    # FMA pipe's exp2), the freeze leaves FA4's order, the two K/V loops and PV's wait ungated
    # behind (config.FREEZE_ROW_MAX_BRINGS): the overrides apply to the online step's default,
    # whose order won there (FA3's at d128 non-causal S2048-8191, change 35)
    for d, causal, seqlen in ((128, False, 4096), (64, True, 2048), (128, False, 16384)):
        bf16 = _problem(head_dim=d, head_dim_v=d, causal=causal, seqlen_q=seqlen, seqlen_k=seqlen,
                        batch=max(1, 32768 // seqlen), heads_q=32, heads_kv=32)
        online = select_config(bf16, frozen_step=False)
        assert select_config(bf16).freeze_row_max and not online.freeze_row_max, (d, causal, seqlen)
        assert online != dataclasses.replace(select_config(bf16), freeze_row_max=False), (d, causal, seqlen)
        assert fwd.config_with(bf16, {"freeze_row_max": "false"}) == online
        assert fwd.config_with(bf16, {"exp2_fma_every": "16"}) == replace_following(online, d, exp2_fma_every=16)
        # a companion named with it keeps the value given; the freeze named on keeps its companions
        named = fwd.config_with(bf16, {"freeze_row_max": "false", "wait_pv_early": "true"})
        assert named.wait_pv_early and not named.freeze_row_max
        assert fwd.config_with(bf16, {"freeze_row_max": "true"}) == select_config(bf16)


def test_a_frozen_row_max_needs_fa4s_order():
    cfg = dataclasses.replace(fwd.default_config(64, False, 16384), freeze_row_max=True)
    cfg.check(64)
    for bad in (dict(wait_pv_early=False), dict(late_rescale=True), dict(rescale_before_exp=True),
                dict(early_exp_quarters=1), dict(single_kv_loop=True)):
        with pytest.raises(ValueError, match="freeze_row_max"):
            dataclasses.replace(cfg, **bad).check(64)
    # its guard reads an overflowed P as inf, which the FMA pipe's exp2 wraps into a finite value
    with pytest.raises(ValueError, match="exp2_fma_every=0"):
        dataclasses.replace(cfg, exp2_fma_every=16).check(64)
    # a sliding window takes it off, visibly (config.WINDOW_CLASHES), as it does the K/V pairs
    assert "freeze_row_max" in config.WINDOW_CLASHES


def test_early_exps_need_fa4s_order():
    cfg = replace_following(fwd.default_config(64, False, 16384), 64, early_exp_quarters=1)
    cfg.check(64)
    for bad in (dict(wait_pv_early=False), dict(gate_pv_wait=True), dict(early_exp_quarters=4),
                dict(row_sum_by_mma=True)):
        with pytest.raises(ValueError, match="early_exp_quarters"):
            dataclasses.replace(cfg, **bad).check(64)


def test_rescale_before_exp_needs_fa4s_order():
    cfg = replace_following(fwd.default_config(64, False, 16384), 64, rescale_before_exp=True)
    cfg.check(64)
    for bad in (dict(wait_pv_early=False), dict(late_rescale=True), dict(early_exp_quarters=1)):
        with pytest.raises(ValueError, match="rescale_before_exp"):
            dataclasses.replace(cfg, **bad).check(64)


def test_gate_pv_wait_needs_fa4s_order():
    cfg = dataclasses.replace(fwd.default_config(128, False, 4096, frozen_step=False), gate_pv_wait=True)
    assert not cfg.wait_pv_early
    with pytest.raises(ValueError, match="gate_pv_wait"):
        cfg.check(128)
    dataclasses.replace(cfg, wait_pv_early=True).check(128)


def test_barrier_offsets_refuse_a_second_compile_that_moved_the_barriers(monkeypatch):
    # the inline arrivals name their barriers by offset: if the compile that names them allocated
    # the arrays elsewhere, building it must fail, naming the arrays, not return a kernel whose
    # arrivals land on other barriers
    layouts = iter([dict(k_empty_bars=64, v_empty_bars=80, turn_bars=96),
                    dict(k_empty_bars=64, v_empty_bars=88, turn_bars=96)])
    monkeypatch.setattr(fwd, "allocation_offsets", lambda ttgir: next(layouts))
    seen = []

    class _Compiled:
        asm = {"ttgir": ""}

    def compile_with(constexprs, ttgir_only=False):
        seen.append({k: constexprs[k] for k in ("K_EMPTY_AT", "V_EMPTY_AT", "TURN_AT")} | {"ttgir_only": ttgir_only})
        return "" if ttgir_only else _Compiled()

    asked = dict(BLOCK_M=128, K_EMPTY_AT=0, V_EMPTY_AT=0, TURN_AT=0, K_READY_AT=-1, V_READY_AT=-1, TURN_WAIT_AT=-1)
    with pytest.raises(RuntimeError, match="v_empty_bars"):
        fwd.barrier_offsets(compile_with, asked)
    # the first build (the placeholders) stops at TTGIR; the second, which names the offsets, compiles
    assert seen == [dict(K_EMPTY_AT=0, V_EMPTY_AT=0, TURN_AT=0, ttgir_only=True),
                    dict(K_EMPTY_AT=64, V_EMPTY_AT=80, TURN_AT=96, ttgir_only=False)]


def test_barrier_offsets_fill_what_the_allocation_pass_gave(monkeypatch):
    monkeypatch.setattr(fwd, "allocation_offsets",
                        lambda ttgir: dict(k_empty_bars=64, v_empty_bars=80, turn_bars=96, k_ready_bars=0))

    class _Compiled:
        asm = {"ttgir": ""}

    # only the names the build asked for (0, a placeholder) are filled; -1 stays Gluon's own
    asked = dict(BLOCK_M=128, K_EMPTY_AT=0, V_EMPTY_AT=0, TURN_AT=-1, K_READY_AT=0, V_READY_AT=-1, TURN_WAIT_AT=0)
    filled = fwd.barrier_offsets(lambda cx, ttgir_only=False: "" if ttgir_only else _Compiled(), asked)
    assert filled == dict(BLOCK_M=128, K_EMPTY_AT=64, V_EMPTY_AT=80, TURN_AT=-1, K_READY_AT=0, V_READY_AT=-1,
                          TURN_WAIT_AT=96)


# the runtime's first build of an inline-arrivals launch through Triton's own JIT (fwd.warmup: its
# binding, specialization and options) on a machine with no GPU: a stand-in driver gives the JIT an
# sm_90 target and a device index, and nothing is launched
_JIT_TTGIR_SCRIPT = r"""
import json, torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class CompileOnlyDriver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


driver.set_active(CompileOnlyDriver())
from flashrung.kernels.hopper import fwd

seen = {}
resolve = fwd.barrier_offsets


def spy(compile_with, constexprs):
    seen.update(compile_with=compile_with, placeholders=dict(constexprs))
    return resolve(compile_with, constexprs)


fwd.barrier_offsets = spy
cfg = fwd.default_config(128, True, 16384)
assert cfg.asm_arrivals
fwd.warmup(cfg, 128, True, torch.bfloat16)
kernel_cache = fwd._attn_fwd_kernel.device_caches[0][0]
cached = sorted(map(repr, kernel_cache))
ttgir = seen["compile_with"](seen["placeholders"], ttgir_only=True)
print(json.dumps(dict(cache_unchanged=sorted(map(repr, kernel_cache)) == cached, ttgir_chars=len(ttgir),
                      equal=ttgir == seen["compile_with"](seen["placeholders"]).asm["ttgir"])))
"""


def test_a_launchs_ttgir_only_first_build_through_the_jit_is_its_compiled_ttgir():
    # property: the runtime's first build (pipeline.warmup_compiler) stops at TTGIR inside the JIT's
    # own compile — its binding and specialization, not the census's — gives the TTGIR the whole
    # compile of the same launch lowers from, and leaves nothing in the JIT's kernel cache; and it
    # does so on a JIT that had built no binder for the device before (a fresh process)
    import json
    import subprocess
    import sys

    from flashrung.evidence.census import interpreter_free_env

    out = subprocess.run([sys.executable, "-c", _JIT_TTGIR_SCRIPT], capture_output=True, text=True,
                         env=interpreter_free_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["equal"] and found["cache_unchanged"] and found["ttgir_chars"] > 10_000, found


def test_a_ttgir_probe_leaves_another_threads_compile_alone(monkeypatch):
    # property: while one thread's first build stops the JIT's compile at TTGIR (the probe swaps
    # the kernel's compile function), a compile of the same kernel in another thread is the JIT's
    # own, and the kernel's compile function is its own again once the probe is done
    import threading

    from triton.runtime.driver import driver

    class Driver:
        def get_current_device(self):
            return 0

    monkeypatch.setattr(driver, "_active", Driver())
    monkeypatch.setattr(pipeline, "ttgir_of", lambda src, target, options: f"ttgir of {src}")
    inside, release = threading.Event(), threading.Event()

    class Kernel:
        def __init__(self):
            self.device_caches = {0: "binder"}
            self.compile = self.whole

        def whole(self, src, **compile_args):
            return f"compiled {src}"

        def warmup(self, **constexprs):
            inside.set()
            release.wait(timeout=30)
            return self.compile(constexprs["SRC"], target="cuda:90", options={})

    kernel = Kernel()
    probed = {}
    prober = threading.Thread(target=lambda: probed.update(
        ttgir=pipeline.warmup_compiler(kernel)({"SRC": "a"}, ttgir_only=True)))
    prober.start()
    assert inside.wait(timeout=30)
    other = kernel.compile("b", target="cuda:90", options={})
    release.set()
    prober.join(timeout=30)
    assert probed == {"ttgir": "ttgir of a"} and other == "compiled b"
    assert kernel.compile == kernel.whole


@pytest.mark.gpu
def test_a_launchs_ttgir_only_first_build_is_its_compiled_ttgir_and_caches_nothing(monkeypatch):
    # property: the runtime's first build of an inline-arrivals launch (pipeline.warmup_compiler)
    # stops at TTGIR through the JIT's own binding and specialization, gives the very TTGIR the
    # whole compile of the same constexprs lowers from, and leaves nothing in the JIT's kernel
    # cache that a launch could pick up
    seen = {}
    resolve = fwd.barrier_offsets

    def spy(compile_with, constexprs):
        seen.update(compile_with=compile_with, placeholders=dict(constexprs))
        return resolve(compile_with, constexprs)

    monkeypatch.setattr(fwd, "barrier_offsets", spy)
    monkeypatch.setattr(fwd, "_ARRIVAL_CONSTEXPRS", {})
    cfg = fwd.default_config(128, True, 16384)
    assert cfg.asm_arrivals
    fwd.warmup(cfg, 128, True, torch.bfloat16)
    kernel_cache = fwd._attn_fwd_kernel.device_caches[torch.cuda.current_device()][0]
    cached = set(kernel_cache)
    ttgir = seen["compile_with"](seen["placeholders"], ttgir_only=True)
    assert set(kernel_cache) == cached
    assert ttgir == seen["compile_with"](seen["placeholders"]).asm["ttgir"]


def test_hoisted_smem_base_takes_the_window_read_out_of_the_kv_step(census):
    # naming global_smem inside each side-effecting arrival reads the shared window's base again in
    # every K/V step (S2UR SR_CgaCtaId); one pure read hoisted by LLVM leaves none in the loop, the
    # same barriers, and no local memory
    hoisted, plain = census["d128-full-s8k-hoisted"], census["d128-full-s8k"]
    assert hoisted["row"]["config"]["hoist_smem_base"] and not plain["row"]["config"]["hoist_smem_base"]
    assert "error" not in hoisted["row"], hoisted["row"]["error"]
    assert hoisted["row"]["spill_bytes"] == 0 and hoisted["row"]["sass"]["LDL"] == 0
    for a, b in _steady_step_pairs(census, "d128-full-s8k-hoisted", "d128-full-s8k"):
        assert a["s2ur"] == 0 < b["s2ur"], (a, b)
        assert a["bar"] == b["bar"] == 1 and a["length"] < b["length"], (a, b)
    assert sorted(hoisted["arrives"]) == sorted(plain["arrives"])


def test_hoist_smem_base_needs_an_inline_arrival_or_wait():
    # d64 non-causal's unpaired 32k kernel (before change 47): neither inline arrivals nor waits
    cfg = dataclasses.replace(_d64_unpaired_32k(), hoist_smem_base=True)
    with pytest.raises(ValueError, match="hoist_smem_base"):
        cfg.check(64)


def test_d256_takes_asm_arrivals_only_where_the_keys_fill_their_tiles():
    # its key-tail build keeps 36 B in local memory (census); the whole-tile build is the one priced
    for seqlen in (2048, 8192, 16384):
        assert fwd.default_config(256, False, seqlen).asm_arrivals
        assert not fwd.default_config(256, False, seqlen, key_tail=True).asm_arrivals
    assert not fwd.default_config(256, False, 1024).asm_arrivals
    assert not fwd.default_config(256, True, 8192).asm_arrivals
    # d128's rules do not look at the key tail
    assert fwd.default_config(128, True, 8192, key_tail=True).asm_arrivals
    with pytest.raises(ValueError, match="key tail needs seqlen >= 2"):
        fwd.default_config(256, False, 1, key_tail=True)


def test_every_inline_barrier_offset_has_its_array_and_its_switch():
    from flashrung.kernels.hopper.config import HopperFwdConfig
    from flashrung.kernels.hopper.pipeline import BARRIER_SWITCHES

    assert set(BARRIER_SWITCHES) == set(fwd.BARRIER_OFFSETS)
    fields = {f.name for f in dataclasses.fields(HopperFwdConfig)}
    assert set(BARRIER_SWITCHES.values()) <= fields
    on = fwd._constexprs(dataclasses.replace(fwd.default_config(128, False), asm_arrivals=False, asm_waits=True),
                         128, False)
    assert [on[k] for k in ("K_EMPTY_AT", "K_READY_AT", "TURN_WAIT_AT")] == [-1, 0, 0]


def test_asm_arrivals_and_thread_release_do_not_combine():
    cfg = dataclasses.replace(_d128_unpaired(False), asm_arrivals=True, thread_release=True)
    with pytest.raises(ValueError, match="asm_arrivals and thread_release"):
        cfg.check(128)


def test_thread_release_takes_one_barrier_out_with_each_release(census):
    # K and V slots released by every thread (cp.async.mbarrier.arrive.noinc, one ARRIVES per
    # warp) instead of one elected thread behind a partition-wide BAR.SYNC: each release in a K/V
    # loop takes one barrier with it (the steady step: K(j) and V(j-1), two of its three), the loop
    # keeps its exponentials, and nothing goes to local memory
    tr, base = census["d128-full-thread-release"], census["d128-full-free"]
    assert tr["row"]["config"]["thread_release"] and not base["row"]["config"]["thread_release"]
    assert "error" not in tr["row"], tr["row"]["error"]
    assert tr["row"]["spill_bytes"] == 0 and tr["loop"]["ldl"] == 0
    assert len(tr["kv_loops"]) == len(base["kv_loops"]) > 0
    for a, b in zip(tr["kv_loops"], base["kv_loops"]):
        assert b["arrives"] == 0 and a["arrives"] >= 1, (a, b)
        assert a["bar"] == b["bar"] - a["arrives"], (a, b)
        assert a["mufu"] == b["mufu"] and a["ldl"] == 0, (a, b)
    # the first consumer's steady loops (unmasked, masked): one barrier left (before its waits),
    # two releases, the same code within a few instructions
    for a, b in zip(tr["kv_loops"][:2], base["kv_loops"][:2]):
        assert a["bar"] == 1 and a["arrives"] == 2 and abs(a["length"] - b["length"]) <= 8, (a, b)


def test_extra_keys_spread_the_loop_over_192_keys(census):
    # the second box of keys is its own wgmma (N = 64: 8 HGMMA.64x64x16 for QK at d128), the
    # softmax covers both parts (96 = 1.5 × 64 exponentials of the loop's 66, plus alpha), and the
    # loop costs fewer instructions per key than the 128-key tile's, with no local memory in it
    # (census: 648 per 192 keys against 474 per 128, −9% per key)
    extra, base = census["d128-full-extra-keys"], census["d128-full-always-rescale"]
    row = extra["row"]
    assert "error" not in row, row["error"]
    assert extra["loop"]["ldl"] == 0 and row["spill_bytes"] <= EXTRA_KEYS_SPILL_BYTES
    assert extra["loop"]["hgmma_n64"] == 8 and base["loop"]["hgmma_n64"] == 0
    assert extra["loop"]["mufu"] == 98 and base["loop"]["mufu"] == 66
    assert extra["loop"]["length"] / 192 < 0.95 * base["loop"]["length"] / 128
    assert row["smem_bytes"] <= SMEM_PER_BLOCK_BYTES


def test_p_in_smem_fits_fa3_order_in_d64_registers(census):
    # FA3's order keeps S(j), O and P(j-1) (still read by PV(j-1)) live together: at d64's 160
    # registers it spilled 416 B with P in registers (53 LDL / 51 STL, part in the loop; census,
    # docs/hopper.md). With P in shared memory P(j-1) holds no register: no local memory at all,
    # every PV reads P from shared memory, written by stmatrix and met by one barrier a step more
    # than the default's loop, whose PV reads registers
    entry, base = census["d64-full-p-in-smem"], census["d64-full"]
    _assert_no_local_memory(entry["row"], "d64-full-p-in-smem")
    loop, base_loop = entry["loop"], base["loop"]
    assert loop["pv_from_registers"] == 0 and base_loop["pv_from_registers"] > 0
    assert loop["stsm"] > 0 and base_loop["stsm"] == 0
    assert loop["bar"] == base_loop["bar"] + 1
    assert loop["mufu"] == base_loop["mufu"]
    cfg = HopperFwdConfig(**{f.name: entry["row"]["config"][f.name] for f in dataclasses.fields(HopperFwdConfig)})
    assert cfg.p_in_smem and not cfg.wait_pv_early
    assert cfg.smem_bytes(64, 2) <= entry["row"]["smem_bytes"] <= SMEM_PER_BLOCK_BYTES


def test_p_in_smem_needs_one_box_of_keys_and_the_sum_on_the_fma_pipe():
    # on the online step it was built on (the frozen reference refuses the sum on the tensor pipe)
    base = dataclasses.replace(fwd.default_config(64, False, 16384), freeze_row_max=False)
    for clash in (dict(extra_keys=64), dict(row_sum_by_mma=True, defer_row_sum=False)):
        with pytest.raises(ValueError, match="p_in_smem"):
            dataclasses.replace(base, p_in_smem=True, **clash).check(64)
    # each consumer's buffer is counted: 64 rows of the K/V tile, 16 bits each
    staged = dataclasses.replace(base, p_in_smem=True)
    assert staged.smem_bytes(64, 2) - base.smem_bytes(64, 2) == base.num_consumers * 64 * base.kv_tile * 2


def test_staged_scores_needs_two_boxes_in_fa4_order():
    # the first box's row max between QK's two waits exists only with a second box (extra_keys) in
    # FA4's overlapped order; two boxes of 64 keys make a 128-key tile (extra_keys up to block_n),
    # on the online step (the frozen reference refuses it)
    base = dataclasses.replace(fwd.default_config(128, True, 16384), freeze_row_max=False)
    for clash in (dict(), dict(block_n=64, extra_keys=64, wait_pv_early=False, named_turns=False)):
        with pytest.raises(ValueError, match="staged_scores"):
            dataclasses.replace(base, staged_scores=True, **clash).check(128)
    staged = dataclasses.replace(base, staged_scores=True, block_n=64, extra_keys=64)
    staged.check(128)
    assert staged.kv_tile == base.kv_tile == 128
    with pytest.raises(ValueError, match=r"extra_keys must be 0 or a power of two in \[16, block_n\]"):
        dataclasses.replace(base, block_n=64, extra_keys=128).check(128)


def test_tree_reduce_moves_no_data(census):
    # the tree reshapes the row reductions inside each thread's registers: the same FMNMX, FADD
    # and shuffles as the chain, no shared-memory round trip, no spill
    base, tree = census["d128-full"]["row"], census["d128-full-tree"]["row"]
    assert tree["spill_bytes"] == 0
    for op in ("FMNMX", "FADD", "SHFL.BFLY", "STS", "LDS"):
        assert tree["sass"]["opcodes"].get(op, 0) == base["sass"]["opcodes"].get(op, 0), op


def test_exp_turns_hold_the_unmasked_exponentials(census):
    # exp_turns: each consumer takes the exponentials' token once and passes it once per K/V step
    # (the ring's count; masked loops included), and in the unmasked loops — all of a non-causal
    # problem without a key tail — the whole MUFU block lies between the two. In the masked loops
    # ptxas lifts the exponentials over the wait (census; the order of the ring holds, the
    # exclusion does not), which costs those steps only the overlap the token was to remove
    entry, base = census["d64-full-exp-turns"], census["d64-full"]
    assert "error" not in entry["row"] and entry["row"]["spill_bytes"] == 0
    kv = [l for l in entry["exp_turn_loops"] if l["mufu"]]
    assert kv and all(len(l["syncs"]) == 1 and len(l["arrives"]) == 1 and l["syncs"][0] < l["arrives"][0]
                      for l in kv)
    unmasked = [l for l in kv if l["fsel"] <= 4]
    assert len(unmasked) == 3, kv           # one per consumer warpgroup
    for l in unmasked:
        assert l["syncs"][0] < l["first_mufu"] and l["arrives"][0] > l["last_mufu"], l
    # off, no barrier of the ring is built
    assert not any(l["syncs"] or l["arrives"] for l in base["exp_turn_loops"])
    ring = {(op, i, n) for op, i, n in entry["bars"] if i >= pipeline.EXP_TURN_BARRIER_BASE}
    assert ring == {(op, pipeline.EXP_TURN_BARRIER_BASE + wg, 256) for op in ("SYNC", "ARV") for wg in range(3)}
    assert not any(i >= pipeline.EXP_TURN_BARRIER_BASE for _, i, _ in base["bars"])


def test_four_max_chains_shorten_the_max_not_the_sum(census):
    # FA4's form: the same FMNMX, FADD and shuffles as the chain, nothing through shared memory; the
    # longest dependent FMNMX chain of each K/V loop 33 -> 11 at N = 128 (7 per running maximum,
    # two in-thread steps, the quad's two shuffles; the tree's is 7)
    base, four = census["d64-full"]["row"], census["d64-full-four-max-chains"]["row"]
    assert four["spill_bytes"] == 0
    for op in ("FMNMX", "FADD", "SHFL.BFLY", "STS", "LDS"):
        assert four["sass"]["opcodes"].get(op, 0) == base["sass"]["opcodes"].get(op, 0), op
    chains = lambda row: {l["FMNMX_chain"] for l in row["loops"] if l["HGMMA"] and l["FMNMX"]}
    assert chains(base) == {33} and chains(four) == {11}


def test_serial_schedule_has_no_overlap_window(census):
    entry = census["d128-full-serial"]
    assert "error" not in entry["row"] and entry["windows"] == []


def test_levers_in_sass(census):
    base = census["d128-full-plain"]["loop"]
    late = census["d128-full-late-packed"]
    assert late["row"]["spill_bytes"] == 0 and late["loop"]["ldl"] == 0
    # packed conversion: the PRMT repair of every P register is gone
    assert base["prmt"] >= 32 and late["loop"]["prmt"] == 0
    # late rescale: the 64 multiplies of O (64 rows × 128 columns over 128 threads) come before the
    # PV issue, around the QK issue (in its shadow); the default has them after wait(0)
    assert base["fmul_before_pv"] == 0 and late["loop"]["fmul_before_pv"] >= 64
    assert all(n >= 64 for n in late["windows"]), late["windows"]      # the softmax still overlaps PV


def test_threshold_keeps_overlap_and_registers(census):
    entry = census["d64-full-threshold"]
    assert entry["row"]["spill_bytes"] == 0 and entry["loop"]["ldl"] == 0
    # every exp2 of a 64-row × block_n tile (block_n / 2 per thread) still sits between the waits
    per_thread = entry["row"]["config"]["block_n"] * 64 // 128
    assert entry["windows"] and all(n >= per_thread for n in entry["windows"]), entry["windows"]


# --------------------------------------------------------------------------- config and dispatch (CPU)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_select_config_defaults_fit(head_dim):
    for causal in (False, True):
        cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal))
        cfg.check(head_dim)
        assert cfg.lpt == causal        # heaviest-first order only pays when tiles are unequal
        assert select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal)) is cfg


@pytest.mark.parametrize("head_dim, seqlen, persistent", [
    (128, 1024, True), (128, 4096, True), (128, 4097, True), (128, 16384, True), (128, 1 << 20, True),
    (64, 1024, True), (64, 32768, True), (256, 1024, False), (256, 8192, False)])
def test_persistent_grid_follows_the_measured_rule(head_dim, seqlen, persistent):
    # one CTA per SM only where it measured faster: every d128 and d64 problem and every causal
    # problem (on the balanced lists), no non-causal d256 problem; the longer of Sq and Sk decides
    # (config.PERSISTENT_MAX_SEQLEN, config.BALANCED_CAUSAL_MIN_SEQLEN)
    for causal in (False, True):
        balanced = causal
        for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
            cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal, seqlen_q=sq,
                                         seqlen_k=sk))
            assert cfg.persistent is (persistent or balanced), (head_dim, causal, sq, sk)


@pytest.mark.parametrize("head_dim, seqlen, stagger", [
    (64, 1024, False), (64, 3071, False), (64, 3072, True), (64, 8192, True), (64, 1 << 20, True),
    (128, 2048, False), (128, 16384, False), (256, 16384, False)])
def test_staggered_sweeps_follow_the_measured_rule(head_dim, seqlen, stagger):
    # staggered K/V sweeps only where they measured faster: d64 from 3072, both masks
    # (config.STAGGER_KV_MIN_SEQLEN); d128 lost at every row timed; the longer of Sq and Sk decides —
    # except where the non-causal default pairs its CTAs (kv_multicast, priced without the stagger,
    # which it cannot run with: d64 from S2048, d128 from S4096)
    for causal in (False, True):
        for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
            cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal, seqlen_q=sq,
                                         seqlen_k=sk))
            paired = not causal and seqlen >= {64: 2048, 128: 4096}.get(head_dim, 1 << 62)
            assert cfg.kv_multicast is paired, (head_dim, causal, sq, sk)
            assert cfg.stagger_kv is (stagger and not paired), (head_dim, causal, sq, sk)
            cfg.check(head_dim)


@pytest.mark.parametrize("head_dim, seqlen, short, short_full", [
    (64, 1, True, True), (64, 1024, True, True), (64, 1025, True, False), (64, 2048, True, False),
    (64, 2049, False, False), (64, 3072, False, False), (64, 4096, False, False),
    (128, 1024, True, False), (128, 1025, False, False), (128, 2048, False, False), (256, 1024, False, False)])
def test_short_schedules_follow_the_measured_rule(head_dim, seqlen, short, short_full):
    # the short-causal schedule only where it measured faster (config.SHORT_CAUSAL_MAX_SEQLEN): d64's
    # 128-row tile up to 2048 (the 192-row tile won from 3072 on the balanced lists), d128 without
    # pingpong up to 1024; non-causal d64 takes the same tile with the multiply-high decode up to
    # 1024 (SHORT_NONCAUSAL_MAX_SEQLEN: a KEEP at S1024, a loss at S2048); the longer of Sq and Sk
    # decides
    for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
        causal = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=True, seqlen_q=sq, seqlen_k=sk))
        full = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, seqlen_q=sq, seqlen_k=sk))
        if head_dim == 64:
            assert (causal.block_m, causal.consumer_regs) == ((128, 240) if short else (192, 160)), (sq, sk)
            # the decode itself runs further (test_fast_divide_follows_the_measured_rule)
            assert (full.block_m, full.consumer_regs) == ((128, 240) if short_full else (192, 160)), (sq, sk)
            assert not short_full or (full.fast_divide_producer and full.fast_divide_consumers), (sq, sk)
            full.check(head_dim)
        elif head_dim == 128:
            assert causal.pingpong is not short and full.block_m == 128, (sq, sk)
        causal.check(head_dim)


@pytest.mark.parametrize("head_dim, seqlen, causal_on, full_on", [
    (64, 1, True, True), (64, 1024, True, True), (64, 2048, True, True), (64, 2049, True, False),
    (64, 4096, True, False), (64, 4097, False, False), (128, 1, True, True), (128, 1024, True, True),
    (128, 2048, True, True), (128, 2049, True, False), (128, 4096, True, False), (128, 4097, True, False),
    (128, 8192, True, False), (128, 16384, True, False), (128, 32768, True, False), (256, 1024, False, False)])
def test_fast_divide_follows_the_measured_rule(head_dim, seqlen, causal_on, full_on):
    # the multiply-high decode in every partition only where it measured faster
    # (config.FAST_DIVIDE_MAX_SEQLEN): d64's 128-row tiles and, with two Q buffers, d64's 192-row
    # tile up to 4096 causal, d128 up to 2048 non-causal and d128 causal at every length (change
    # 52); both partitions' switches together; the longer of Sq and Sk decides
    for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
        for causal, on in ((True, causal_on), (False, full_on)):
            cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal, seqlen_q=sq,
                                         seqlen_k=sk))
            assert cfg.fast_divide_producer is on and cfg.fast_divide_consumers is on, (head_dim, causal, sq, sk)
            cfg.check(head_dim)


@pytest.mark.parametrize("head_dim, seqlen, causal_stages, full_stages", [
    (64, 1, 2, 2), (64, 1024, 2, 2), (64, 2048, 2, 2), (64, 2049, 2, 1), (64, 4096, 2, 1), (64, 4097, 1, 1),
    (64, 8192, 1, 1), (128, 1, 2, 2), (128, 1024, 2, 2), (128, 2048, 2, 2), (128, 2049, 2, 1), (128, 4096, 2, 1),
    (128, 4097, 2, 1), (128, 8192, 2, 1), (128, 16384, 2, 1), (128, 32768, 2, 1),
    (256, 1024, 1, 1)])
def test_q_stages_follow_the_measured_rule(head_dim, seqlen, causal_stages, full_stages):
    # two Q buffers only where they measured faster (config.TWO_Q_STAGES_MAX_SEQLEN): d64's
    # short-causal tile and, with the multiply-high decode, d64's 192-row tile up to 4096 causal and
    # d128 causal at every length (change 52); d64 and d128 non-causal up to 2048; the longer of Sq
    # and Sk decides
    for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
        for causal, stages in ((True, causal_stages), (False, full_stages)):
            cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal, seqlen_q=sq,
                                         seqlen_k=sk))
            assert cfg.num_q_stages == stages, (head_dim, causal, sq, sk)
            cfg.check(head_dim)


@pytest.mark.parametrize("head_dim, seqlen", [(64, 1), (64, 1025), (64, 2048), (64, 2049), (128, 2048), (256, 2048)])
def test_skip_unseen_half_is_off_by_default(head_dim, seqlen):
    # a masked tile's unseen half skipped measured faster on d64's short-causal tile (change 29),
    # then one K/V loop took its place there (config.SKIP_UNSEEN_HALF_SEQLEN is empty); the two
    # build the masked step apart, so no default may carry both
    for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
        for causal in (True, False):
            cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal, seqlen_q=sq,
                                         seqlen_k=sk))
            assert not cfg.skip_unseen_half and not cfg.mask_second_half, (head_dim, causal, sq, sk)
            cfg.check(head_dim)


@pytest.mark.parametrize("head_dim, seqlen, causal_on", [
    (64, 1, True), (64, 17, True), (64, 1024, True), (64, 2048, True), (64, 2049, False), (64, 16384, False),
    (128, 1024, False), (128, 2048, False), (256, 1024, False)])
def test_single_kv_loop_follows_the_measured_rule(head_dim, seqlen, causal_on):
    # one K/V loop for the unmasked and masked steps only where it measured faster
    # (config.SINGLE_KV_LOOP_MAX_SEQLEN): d64 causal up to 2048 (the short-causal 128-row tile;
    # NULL at d128 S1k, below the S1k null at d64 non-causal); the longer of Sq and Sk decides
    for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
        for causal, on in ((True, causal_on), (False, False)):
            cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal, seqlen_q=sq,
                                         seqlen_k=sk))
            assert cfg.single_kv_loop is on, (head_dim, causal, sq, sk)
            assert not on or cfg.block_m == 128, (head_dim, causal, sq, sk)
            cfg.check(head_dim)


@pytest.mark.parametrize("seqlen, fa4_order, named", [(1, False, False), (17, False, False), (1024, False, False),
                                                     (1025, False, False), (4095, False, False), (4096, False, True),
                                                     (6143, False, True), (6144, False, False), (8191, False, False),
                                                     (8192, True, True), (16384, True, True), (16385, True, True),
                                                     (32768, True, True)])
def test_noncausal_d128_pingpong_follows_the_measured_rule(seqlen, fa4_order, named):
    # the pingpong token between d128's non-causal consumers at every length, in the order that
    # measured faster: FA3's up to 8191 (config.PINGPONG_NONCAUSAL_SEQLEN, priced from S1024), the
    # token on named barriers from S4096 to 6143 (config.FA3_NAMED_NONCAUSAL_SEQLEN, change 36: NULL
    # at S6144, REVERT at S2048) and on mbarriers elsewhere; FA4's with named turns and the inline
    # arrivals from 8192 (config.FA4_ORDER_NONCAUSAL_MIN_SEQLEN, change 35: it lost at S4096); the
    # longer of Sq and Sk decides; the other head dims and d128 causal keep theirs
    # the online step's rules (the frozen step brings FA4's order and PV's wait ungated:
    # test_the_frozen_row_max_brings_what_was_priced_with_it)
    for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
        cfg = select_config(_problem(head_dim=128, head_dim_v=128, causal=False, seqlen_q=sq, seqlen_k=sk),
                            frozen_step=False)
        assert cfg.pingpong, (sq, sk)
        assert cfg.wait_pv_early is fa4_order and cfg.named_turns is named, (sq, sk)
        assert not named or cfg.asm_arrivals, (sq, sk)
        # PV's wait kept behind the row max from S16k (config.GATE_PV_WAIT_MIN_SEQLEN, change 37:
        # NULL at S8k)
        assert cfg.gate_pv_wait is (seqlen >= 16384), (sq, sk)
        cfg.check(128)
    for head_dim in (64, 256):
        other = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=False, seqlen_q=seqlen,
                                       seqlen_k=seqlen))
        assert other.pingpong and not other.gate_pv_wait      # FA4's schedule at every length; d64 REVERT
    causal = select_config(_problem(head_dim=128, head_dim_v=128, causal=True, seqlen_q=seqlen, seqlen_k=seqlen))
    assert causal.pingpong is (seqlen > 1024)                          # change 8's rule, unchanged


@pytest.mark.parametrize("head_dim, seqlen, balanced", [
    (64, 1, True), (64, 1024, True), (64, 4096, True), (64, 8192, True), (64, 1 << 20, True),
    (128, 1, True), (128, 1024, True), (128, 2048, True), (128, 16384, True), (128, 1 << 20, True),
    (256, 1, True), (256, 2048, True), (256, 4096, True), (256, 8192, True), (256, 1 << 20, True)])
def test_balanced_grid_follows_the_measured_rule(head_dim, seqlen, balanced):
    # the host-listed persistent grid where it measured faster: every causal problem
    # (config.BALANCED_CAUSAL_MIN_SEQLEN; paired with the 16 MiB sections from S1k at d64 and d128,
    # S2k at d256, NULL at d256 S8k); non-causal tiles (all equal) never take it
    for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
        cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=True, seqlen_q=sq, seqlen_k=sk))
        assert cfg.balanced is balanced, (head_dim, sq, sk)
        assert not balanced or (cfg.persistent and not cfg.split_tail)
        cfg.check(head_dim)
        full = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, seqlen_q=sq, seqlen_k=sk))
        assert full.balanced is False


@pytest.mark.parametrize("head_dim, seqlen, split", [
    (128, 16384, True), (128, 32768, True), (128, 16383, True), (128, 8192, True), (128, 4096, True),
    (128, 4095, False), (128, 1024, False), (64, 32768, False), (256, 32768, False)])
def test_split_tail_follows_the_measured_rule(head_dim, seqlen, split):
    # the split tail only where it measured faster: d128 non-causal from 4k (the longer of Sq and
    # Sk decides, config.SPLIT_TAIL_MIN_SEQLEN); never causal, where forward refuses it
    for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
        cfg = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, seqlen_q=sq, seqlen_k=sk))
        assert cfg.split_tail is split, (head_dim, sq, sk)
        # from 16k the split-tail kernel keeps its first tile masked (first_mask_on_need lost
        # there, paired); below it the split tail was priced with first_mask_on_need on
        assert cfg.first_mask_on_need is not (split and seqlen >= 16384), (head_dim, sq, sk)
        causal = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=True, seqlen_q=sq, seqlen_k=sk))
        assert causal.split_tail is False and causal.first_mask_on_need


@pytest.mark.parametrize("changes, match", [
    (dict(num_kv_stages=3), "shared memory"),             # d256: 64 KiB Q + 3 × 64 KiB ring
    (dict(block_n=80), "power of two"),
    (dict(block_m=96), "block_m"),
    (dict(block_m=192), "registers"),                     # 3 × 240 regs do not fit the file
    (dict(consumer_regs=244), "multiple of 8"),
    (dict(num_kv_stages=0), "num_kv_stages"),
    (dict(rescale_threshold=-1.0), "rescale_threshold"),
    (dict(rescale_threshold=16.0), "rescale_threshold"),      # 2^16 > the fp16 maximum
    (dict(overlap=False, late_rescale=True), "overlap"),
    (dict(overlap=False, rescale_threshold=8.0), "overlap"),
    (dict(overlap=False, wait_pv_early=True), "overlap"),
    (dict(rescale_by_warp=True), "rescale_by_warp"),             # the per-warp skip of a threshold of 0
    (dict(exp2_fma_every=3), "exp2_fma_every"),
    (dict(overlap=False, exp2_fma_every=4), "overlap"),
    (dict(overlap_epilogue=True), "separate_o"),                  # d256: O staged in Q's buffer
    (dict(overlap_epilogue=True, separate_o=True, overlap=False), "overlap=True"),
    (dict(num_q_stages=3), "num_q_stages"),
    (dict(num_q_stages=0), "num_q_stages"),
    (dict(num_q_stages=2), "separate_o"),                         # d256: O staged in Q's buffer
    (dict(num_q_stages=2, separate_o=True), "shared memory"),     # d256: 2 × 32 KiB Q + O + ring
    (dict(four_max_chains=True, tree_reduce=True), "at most one"),  # two forms of one row max
])
def test_config_check_rejects(changes, match):
    cfg = dataclasses.replace(HopperFwdConfig(block_n=64), **changes)
    with pytest.raises(ValueError, match=match):
        cfg.check(256)


def test_config_check_rejects_what_the_dynamic_hand_out_cannot_run():
    # the hand-out deals whole tiles of the persistent grid; the host's lists, the split tail's
    # items and a tile kept for the next one's epilogue are other schedules of the same grid
    base = HopperFwdConfig(persistent=True, dynamic_tiles=True)
    base.check(128)
    for changes in (dict(persistent=False), dict(balanced=True), dict(split_tail=True),
                    dict(overlap_epilogue=True)):
        with pytest.raises(ValueError, match="dynamic_tiles"):
            dataclasses.replace(base, **changes).check(128)
    pool = HopperFwdConfig(persistent=True, balanced=True, dynamic_pool_share=0.03)
    pool.check(128)
    assert pool.dynamic and base.dynamic and not HopperFwdConfig(persistent=True, balanced=True).dynamic
    for changes in (dict(balanced=False), dict(overlap_epilogue=True, separate_o=True),
                    dict(dynamic_pool_share=1.0), dict(dynamic_pool_share=-0.1)):
        with pytest.raises(ValueError, match="dynamic_pool_share"):
            dataclasses.replace(pool, **changes).check(128)


def test_dynamic_tiles_census(census):
    # every draw is one global atomic, after the item's last load, and the CTAs' count of done is
    # a second; the consumers' K/V loops are the balanced default's (within ptxas's noise of two
    # instructions), with no local memory
    for d, kind in ((64, "dynamic"), (128, "dynamic"), (64, "pool"), (128, "pool")):
        dynamic, default = census[f"d{d}-causal-{kind}"], census[f"d{d}-causal"]
        assert "error" not in dynamic["row"], dynamic["row"]["error"]
        assert dynamic["row"]["spill_bytes"] == 0
        assert dynamic["atomics"] == 2 and default["atomics"] == 0
        assert abs(dynamic["loop"]["length"] - default["loop"]["length"]) <= 2
        assert dynamic["loop"]["mufu"] == default["loop"]["mufu"] and dynamic["loop"]["ldl"] == 0


def test_handout_barrier_census(census):
    # the items' own barriers: a ready barrier per item slot (Q stages + 1) and consumer, initialized
    # for one arrival; the consumers' K/V loops and local memory as the pack's default has them
    for d in (64, 128):
        entry = census[f"d{d}-causal-packed-handout-barrier"]
        assert "error" not in entry["row"], entry["row"]["error"]
        cfg = HopperFwdConfig(**{f.name: entry["row"]["config"][f.name] for f in dataclasses.fields(HopperFwdConfig)})
        assert cfg.handout_barrier and cfg.handout_table
        plain = dataclasses.replace(cfg, handout_barrier=False)
        extra = (cfg.num_q_stages + 1) * cfg.num_consumers
        assert len(entry["inits"]) >= extra
        assert cfg.smem_bytes(d, 2) - plain.smem_bytes(d, 2) == extra * 8
        assert entry["row"]["spill_bytes"] == (census["d64-causal-packed"]["row"]["spill_bytes"] if d == 64 else 0)
        step_hgmma = collections.Counter(loop["hgmma"] for loop in entry["kv_loops"]).most_common(1)[0][0]
        assert all(loop["ldl"] == 0 for loop in entry["kv_loops"] if loop["hgmma"] == step_hgmma)
    with pytest.raises(ValueError, match="handout_barrier"):
        HopperFwdConfig(persistent=True, balanced=True, handout_barrier=True).check(128)


def test_fa3_order_fits_d64_registers_with_tree_reductions(census):
    # FA3's order keeps P(j-1) live through softmax(j): on d64's 160 registers ptxas spills inside
    # the K/V loops unless the row max and sum reduce as trees (and O is rescaled late); with them a
    # steady step keeps one local load (a value the loop does not change) and the masked steps two,
    # with the K/V pairs and pack_p on — the build timed against FA4's order, 0.79-0.83 (docs/hopper.md,
    # *P for PV from shared memory*)
    entry = census["d64-full-s16k-fa3-order"]
    assert "error" not in entry["row"], entry["row"]["error"]
    config = entry["row"]["config"]
    assert not config["wait_pv_early"] and config["late_rescale"] and config["tree_reduce"]
    assert config["pack_p"] and config["kv_multicast"]
    step_hgmma = collections.Counter(loop["hgmma"] for loop in entry["kv_loops"]).most_common(1)[0][0]
    steady = [loop for loop in entry["kv_loops"] if loop["hgmma"] == step_hgmma]
    assert len(steady) >= 6 and all(loop["ldl"] <= 2 for loop in steady)
    assert sum(loop["ldl"] <= 1 for loop in steady) >= 3          # each consumer's unmasked step
    # and ptxas keeps the order: every exponential of a step (64 of P, 2 of the rescale) issues
    # between QK(j)'s wait and PV(j-1)'s, under PV(j-1)
    assert entry["windows"] and min(entry["windows"]) >= 64


def test_draw_ahead_needs_the_hand_out():
    # the draw moves only where there is one: on the lists alone it would be a switch that
    # silently does nothing, and a negative count has no meaning
    with pytest.raises(ValueError, match="draw_ahead_steps"):
        HopperFwdConfig(persistent=True, balanced=True, draw_ahead_steps=2).check(128)
    with pytest.raises(ValueError, match="draw_ahead_steps"):
        HopperFwdConfig(persistent=True, dynamic_tiles=True, draw_ahead_steps=-1).check(128)
    HopperFwdConfig(persistent=True, dynamic_tiles=True, draw_ahead_steps=2).check(128)
    HopperFwdConfig(persistent=True, balanced=True, dynamic_pool_share=0.03, draw_ahead_steps=1).check(128)


def test_draw_ahead_census(census):
    # the draw moves into the producer's K/V loop (behind a branch) and leaves the consumers' K/V
    # loops and local memory as the pack's default has them: d64's packed build keeps its 48 B
    # outside the loops, d128's none
    ahead, default = census["d64-causal-packed-draw-ahead"], census["d64-causal-packed"]
    for entry in (ahead, census["d128-causal-packed-draw-ahead"]):
        assert "error" not in entry["row"], entry["row"]["error"]
        assert entry["row"]["config"]["draw_ahead_steps"] == 2 and entry["row"]["config"]["handout_table"]
    assert census["d128-causal-packed-draw-ahead"]["row"]["spill_bytes"] == 0
    assert ahead["row"]["spill_bytes"] == default["row"]["spill_bytes"]
    # the K/V steps' loops (the most common wgmma count; the loops around a whole item hold more)
    step_hgmma = collections.Counter(loop["hgmma"] for loop in default["kv_loops"]).most_common(1)[0][0]
    steady = [(a["length"], b["length"]) for a, b in zip(ahead["kv_loops"], default["kv_loops"])
              if b["hgmma"] == step_hgmma]
    assert len(steady) >= 2 and all(abs(a - b) <= 2 for a, b in steady), steady
    for entry in (ahead, census["d128-causal-packed-draw-ahead"]):
        assert all(loop["ldl"] == 0 for loop in entry["kv_loops"] if loop["hgmma"] == step_hgmma)
    assert ahead["producer_loops"][0]["length"] > default["producer_loops"][0]["length"]


def test_config_check_rejects_balanced_without_a_persistent_grid():
    with pytest.raises(ValueError, match="balanced"):
        HopperFwdConfig(balanced=True, persistent=False).check(128)
    with pytest.raises(ValueError, match="balanced"):
        HopperFwdConfig(balanced=True, persistent=True, split_tail=True).check(128)
    HopperFwdConfig(balanced=True, persistent=True).check(128)


def test_balanced_partial_tiles_is_the_d64_causal_default_and_refuses_what_it_cannot_estimate():
    # the partial-tile estimate rides on the balanced lists of d64's 192-row tile, where its
    # shares were measured; the short 128-row tile and d128 keep the whole-tile estimate
    def selected(head_dim, causal, seqlen):
        return select_config(Problem(1, seqlen, seqlen, 8, 8, head_dim, head_dim, torch.bfloat16, causal, "cuda",
                                     (9, 0)))

    for seqlen in (3000, 4096, 32768):
        cfg = selected(64, True, seqlen)
        assert cfg.block_m == 192 and cfg.balanced and cfg.balanced_partial_tiles
        assert fwd.partial_tile_share(cfg, 64) == config.PARTIAL_TILE_COST_SHARE[(64, 192)]
    for head_dim, causal, seqlen in ((64, True, 2048), (64, False, 4096), (128, True, 4096), (256, True, 8192)):
        cfg = selected(head_dim, causal, seqlen)
        assert not cfg.balanced_partial_tiles and fwd.partial_tile_share(cfg, head_dim) == ()
    with pytest.raises(ValueError, match="balanced_partial_tiles"):
        HopperFwdConfig(balanced_partial_tiles=True, persistent=True).check(64)
    with pytest.raises(ValueError, match="skip_empty_rows"):
        HopperFwdConfig(balanced=True, persistent=True, balanced_partial_tiles=True, skip_empty_rows=False).check(64)
    d128 = dataclasses.replace(selected(128, True, 4096), balanced_partial_tiles=True)
    with pytest.raises(ValueError, match="no measured shares for head_dim 128"):
        fwd.partial_tile_share(d128, 128)


def test_o_from_registers_needs_q_to_hold_o_staging():
    # O's own buffer already releases Q before the epilogue: the switch is for builds without one
    with pytest.raises(ValueError, match="o_from_registers .* needs separate_o=False"):
        dataclasses.replace(fwd.default_config(128, False), separate_o=True, o_from_registers=True).check(128)
    cfg = dataclasses.replace(fwd.default_config(256, True), o_from_registers=True)
    cfg.check(256)
    assert fwd._constexprs(cfg, 256, True)["O_FROM_REGISTERS"]


def test_divided_sections_change_mla_causal_sections_alone_and_no_build():
    # MLA's 192/128 causal launch walks sections of 2 columns of its 32 (the budget's 3 leaves a
    # short last one); turned off, the budget's 3. The section is a run-time integer: the build
    # (what picks the compiled kernel) is the same but for the config field itself. A d128 causal
    # launch's 4 columns already divide: unchanged; a packed launch keeps the budget's
    def plan_of(head_dim, head_dim_v, **changes):
        problem = Problem(2, 8192, 8192, 16, 16, head_dim, head_dim_v, torch.bfloat16, True, "cuda", (9, 0))
        cfg = dataclasses.replace(select_config(problem), **changes)
        qk, v = config.kernel_head_dims(head_dim, head_dim_v, cfg)
        return cfg, fwd._plan(cfg, 2, 8192, 8192, 16, 16, qk, 2, True, True, 132, head_dim_v=v)

    cfg, divided = plan_of(192, 128)
    _, budget = plan_of(192, 128, divided_sections=False)
    assert cfg.balanced and cfg.divided_sections
    assert (divided.section, budget.section) == (2, 3)
    assert divided.ints != budget.ints and divided.build[1:] == budget.build[1:]
    assert divided.constexprs == budget.constexprs
    assert plan_of(128, 128)[1].section == plan_of(128, 128, divided_sections=False)[1].section == 4
    cfg_packed = plan_of(192, 128)[0]
    qk, v = config.kernel_head_dims(192, 128, cfg_packed)
    packed = fwd._plan(cfg_packed, 2, 8192, 8192, 16, 16, qk, 2, True, True, 132, head_dim_v=v, packed=True)
    assert packed.section == 3


@pytest.mark.parametrize("overrides, expected", [
    ({"balanced": "false"}, False),
    ({"skip_empty_rows": "false"}, False),
    ({"block_m": "128"}, False),                       # a tile whose shares were never measured
    ({"balanced": "false", "persistent": "true"}, False),
    ({"num_q_stages": "2"}, True),                     # a change the estimate does not depend on
    ({"balanced": "true"}, True),
])
def test_a_switch_carries_the_partial_tile_estimate_it_decides(overrides, expected):
    # the estimate is a default derived from the balanced lists: switching the lists (or the
    # empty-row skip, or the tile) off through an override turns it off too, instead of a refusal
    # of the user's one change; naming it as well keeps the value given, so check() still refuses
    # an estimate of lists that are not there
    problem = Problem(1, 4096, 4096, 8, 8, 64, 64, torch.bfloat16, True, "cuda", (9, 0))
    assert select_config(problem).balanced_partial_tiles
    assert fwd.config_with(problem, overrides).balanced_partial_tiles is expected
    with pytest.raises(ValueError, match="balanced_partial_tiles"):
        fwd.config_with(problem, {"balanced": "false", "balanced_partial_tiles": "true"})
    assert not fwd.config_with(problem, {"balanced_partial_tiles": "false"}).balanced_partial_tiles
    # the tests' forced configurations follow the same rule
    base = select_config(problem)
    assert replace_following(base, 64, balanced=False) == dataclasses.replace(
        base, balanced=False, balanced_partial_tiles=False)
    kept = dataclasses.replace(base, balanced_partial_tiles=False)
    assert replace_following(kept, 64, num_q_stages=2) == dataclasses.replace(kept, num_q_stages=2)


@pytest.mark.parametrize("changes, match", [
    (dict(extra_keys=48), "power of two"),                     # no TMA box
    (dict(block_n=64, extra_keys=128), "\\[16, block_n\\]"),    # wider than block_n (64)
    (dict(extra_keys=64, q_in_registers=True), "q_in_registers"),
    (dict(extra_keys=64, separate_o=True), "shared memory"),   # 192-key ring + Q + O > 227 KiB at d128
])
def test_config_check_rejects_extra_keys(changes, match):
    cfg = dataclasses.replace(HopperFwdConfig(), **changes)
    with pytest.raises(ValueError, match=match):
        cfg.check(128)
    # the same tile fits with O staged in Q's buffer, with either softmax
    dataclasses.replace(HopperFwdConfig(), extra_keys=64, separate_o=False).check(128)
    dataclasses.replace(HopperFwdConfig(), extra_keys=64, separate_o=False, rescale_threshold=8.0).check(128)


def test_config_with_parses_string_overrides():
    problem = _problem()
    cfg = fwd.config_with(problem, {"pingpong": "true", "persistent": "True", "consumer_regs": "232",
                                    "rescale_threshold": "8", "lpt": "0"})
    assert cfg == dataclasses.replace(select_config(problem), pingpong=True, persistent=True, consumer_regs=232,
                                      rescale_threshold=8.0, lpt=False)
    assert fwd.config_with(problem, {"pack_p": True, "block_n": 64}).block_n == 64
    assert fwd.config_with(problem, {}) == select_config(problem)


@pytest.mark.parametrize("overrides, match", [
    ({"pingpnog": "true"}, r"unknown .*'pingpnog'.*valid keys: block_m, block_n, .*pingpong"),
    ({"pingpong": "maybe"}, "true or false"),
    ({"block_n": "wide"}, "integer"),
    ({"block_n": True}, "integer"),
    ({"rescale_threshold": "high"}, "number"),
    ({"block_m": "192"}, "registers"),                    # 3 × 240 registers do not fit
    ({"block_n": "80"}, "power of two"),
])
def test_config_with_rejects(overrides, match):
    with pytest.raises(ValueError, match=match):
        fwd.config_with(_problem(), overrides)


def test_config_check_rejects_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        HopperFwdConfig().check(96)


def test_supported_problem_has_no_reason():
    assert fwd.unsupported_reason(_problem()) is None
    assert fwd.unsupported_reason(_problem(dtype=torch.float16, causal=True, head_dim=64, head_dim_v=64)) is None


@pytest.mark.parametrize("changes, match", [
    (dict(device_type="cpu", capability=None), "CUDA"),
    (dict(interpreter=True), "TRITON_INTERPRET"),
    (dict(capability=(8, 0)), "9.0"),
    (dict(capability=(10, 0)), "9.0"),
    (dict(capability=(12, 0)), "9.0"),
    (dict(dtype=torch.float32), "float16 or bfloat16"),
    (dict(head_dim=100, head_dim_v=100), "multiple of 8"),
    (dict(head_dim=4, head_dim_v=4), "multiple of 8"),
    (dict(head_dim=264, head_dim_v=264), "head_dim"),
    (dict(head_dim=512, head_dim_v=512), "head_dim"),
    (dict(head_dim_v=12), "head_dim_v"),
    (dict(window_size=(8, 8), causal=True), "right side must be -1 or 0"),
    (dict(head_dim_v=264), "head_dim_v"),
    (dict(heads_q=6, heads_kv=4), "multiple"),
])
def test_unsupported_reason(changes, match):
    reason = fwd.unsupported_reason(_problem(**changes))
    assert reason is not None and re.search(match, reason), reason


def test_kernel_head_dim_is_the_next_compiled_one():
    # every multiple of 8 up to 256 runs on the smallest compiled kernel at least as wide; the
    # compiled ones on themselves; anything else is refused naming what is taken
    for d in range(8, 257, 8):
        kd = config.kernel_head_dim(d)
        assert kd in config.SUPPORTED_HEAD_DIMS and kd >= d
        assert all(c < d for c in config.SUPPORTED_HEAD_DIMS if c < kd)
    assert [config.kernel_head_dim(d) for d in (8, 32, 64, 72, 96, 128, 136, 192, 256)] == \
        [64, 64, 64, 128, 128, 128, 256, 256, 256]
    for bad in (0, 4, 60, 100, 264, 512):
        with pytest.raises(ValueError, match=r"multiple of 8 in \[8, 256\].*got " + str(bad)):
            config.kernel_head_dim(bad)


def test_a_value_head_dim_of_its_own_runs_the_kernel_of_the_wider():
    # the kernel has one head dim: q/k and v both pad to the kernel of the wider of theirs
    pairs = {(192, 128): 256, (128, 64): 128, (64, 128): 128, (96, 64): 128, (32, 8): 64, (256, 256): 256}
    assert {pair: config.kernel_head_dim(*pair) for pair in pairs} == pairs
    assert config.kernel_head_dim(96, None) == config.kernel_head_dim(96, 96) == 128
    for bad in (12, 264):
        with pytest.raises(ValueError, match=r"^head_dim_v must be a multiple of 8 .*got " + str(bad)):
            config.kernel_head_dim(64, bad)
    # the configuration is the wider one's row; MLA's pair (config.SPLIT_DEFAULT_HEAD_DIMS) takes
    # q's split boxes and v's own width on it, on its own K/V tile (config.SPLIT_KV_TILE_KEYS: 128
    # keys), every other pair that row as it is
    for pair, wider in (((192, 128), 256), ((128, 64), 128), ((64, 128), 128)):
        for causal in (False, True):
            for seqlen in (1, 1000, 4097, 16384):
                problem = _problem(head_dim=pair[0], head_dim_v=pair[1], causal=causal, seqlen_q=seqlen,
                                   seqlen_k=seqlen)
                row = select_config(dataclasses.replace(problem, head_dim=wider, head_dim_v=wider))
                expected = (config._split(row, wider, config.SPLIT_KV_TILE_KEYS.get(pair, row.block_n))
                            if pair in config.SPLIT_DEFAULT_HEAD_DIMS else row)
                if pair == (192, 128):
                    assert expected.block_n == 128 != row.block_n
                assert select_config(problem) == expected, (pair, causal, seqlen)


def test_mlas_split_default_runs_beside_a_window_packing_or_a_cap(monkeypatch):
    # config.SPLIT_DEFAULT_WITH_SCORE_OPTIONS (gated beside them, paired beside a window): a
    # windowed, packed or capped 192/128 problem runs the split; switched off, the padded build of
    # its row
    mla = _problem(head_dim=192, head_dim_v=128, causal=True, seqlen_q=8192, seqlen_k=8192)
    for options in (dict(window_size=(256, 0)), dict(varlen=True), dict(softcap=30.0)):
        problem = dataclasses.replace(mla, **options)
        assert config.kernel_head_dims(192, 128, select_config(problem)) == (192, 128), options
        monkeypatch.setattr(config, "SPLIT_DEFAULT_WITH_SCORE_OPTIONS", False)
        cfg = select_config(problem)
        assert config.kernel_head_dims(192, 128, cfg) == (256, 256), options
        assert cfg == select_config(dataclasses.replace(problem, head_dim=256, head_dim_v=256))
        monkeypatch.setattr(config, "SPLIT_DEFAULT_WITH_SCORE_OPTIONS", True)
    assert config.kernel_head_dims(192, 128, select_config(mla)) == (192, 128)


@pytest.mark.parametrize("head_dim", [32, 96, 192])
def test_a_padded_head_dim_runs_its_kernels_schedule(head_dim):
    # the schedule of a padded head dim is its kernel's, at every length and mask (the tables are
    # keyed by the compiled head dims), and an override resolves as it does there
    kd = config.kernel_head_dim(head_dim)
    for causal in (False, True):
        for seqlen in (1, 1000, 2048, 4097, 8192, 16384, 32768):
            padded = _problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal, seqlen_q=seqlen, seqlen_k=seqlen)
            compiled = dataclasses.replace(padded, head_dim=kd, head_dim_v=kd)
            assert select_config(padded) == select_config(compiled)
            assert fwd.config_with(padded, {"pack_p": "false"}) == fwd.config_with(compiled, {"pack_p": "false"})


def _runs_by_name_only(problem, compiled_as):
    """Asserts that ``hopper.fwd`` takes ``problem``, that automatic dispatch runs ``portable.fwd`` for it
    naming why, and that ``impl="hopper.fwd"`` runs it on ``compiled_as``'s configuration; returns the
    reason dispatch gave."""
    from flashrung import dispatch

    assert fwd.unsupported_reason(problem) is None
    reason = fwd.auto_declined_reason(problem)
    _, d = dispatch.select(problem, "fwd")
    assert d.kernel == "portable.fwd" and dict(d.declined)["hopper.fwd"] == reason
    _, d = dispatch.select(problem, "fwd", impl="hopper.fwd")
    assert d.kernel == "hopper.fwd" and d.forced and d.config() == select_config(compiled_as)
    return reason


def _contiguous(head_dim, head_dim_v=None, seqlen=1000, heads_q=8, heads_kv=2):
    """``strides=`` of :func:`_problem`'s q, k, v laid out contiguously."""
    head_dim_v = head_dim_v or head_dim
    return dict(strides=((seqlen * heads_q * head_dim, heads_q * head_dim, head_dim, 1),
                         (seqlen * heads_kv * head_dim, heads_kv * head_dim, head_dim, 1),
                         (seqlen * heads_kv * head_dim_v, heads_kv * head_dim_v, head_dim_v, 1)))


def test_padded_head_dims_run_when_asked_for_and_fall_back_visibly_otherwise(monkeypatch):
    # a padded head dim not yet gated and timed on the H200 goes to the portable kernel under
    # automatic dispatch, which says why; asked for by name, hopper.fwd runs it; once listed, it is
    # picked unasked
    from flashrung import dispatch

    monkeypatch.setattr(fwd, "PADDED_AUTO_HEAD_DIMS", frozenset())
    padded = _problem(head_dim=96, head_dim_v=96, **_contiguous(96))
    reason = _runs_by_name_only(padded, padded)
    assert "padded to 128" in reason and "impl='hopper.fwd'" in reason
    assert fwd.auto_declined_reason(_problem()) is None
    monkeypatch.setattr(fwd, "PADDED_AUTO_HEAD_DIMS", frozenset({96}))
    assert fwd.auto_declined_reason(padded) is None
    assert "(96)" in fwd.auto_declined_reason(dataclasses.replace(padded, head_dim=80, head_dim_v=80))
    _, d = dispatch.select(padded, "fwd")
    assert d.kernel == "hopper.fwd" and not d.declined


def test_softcap_runs_when_asked_for_and_falls_back_visibly_otherwise(monkeypatch):
    # the capped kernel, built and compiled but not yet gated on the H200, runs by name only;
    # automatic dispatch sends capped problems to the portable kernel and says why, until
    # fwd.SOFTCAP_AUTO; a causal problem's window with a right side past the diagonal is refused
    from flashrung import dispatch

    monkeypatch.setattr(fwd, "SOFTCAP_AUTO", False)
    capped = _problem(softcap=30.0, **_contiguous(128))
    # (run by name on the capped default: config.CAPPED_EXP2_FMA_EVERY)
    reason = _runs_by_name_only(capped, capped)
    assert reason.startswith("softcap 30 runs on hopper.fwd only when asked for by name") and "impl=" in reason
    monkeypatch.setattr(fwd, "SOFTCAP_AUTO", True)
    assert fwd.auto_declined_reason(capped) is None
    assert dispatch.select(capped, "fwd")[1].kernel == "hopper.fwd"
    assert "right side" in fwd.unsupported_reason(dataclasses.replace(capped, causal=True, window_size=(8, 8)))


def test_a_capped_default_takes_the_exp2_split_only_where_it_was_priced():
    # config.CAPPED_EXP2_FMA_EVERY: the capped d128 non-causal default runs one exponential in four on
    # the FMA pipe (paired 1.028 on an H100, gated); d64 (0.76-0.90) and d128 causal (NULL) keep MUFU,
    # and so does every uncapped problem. A band (a non-causal window with a right side) runs the
    # causal schedule, so the causal rule. Every result builds
    for d in HEAD_DIMS:
        for causal in (False, True):
            for seqlen in (17, 1000, 2048, 8192, 16384, 32768):
                plain = _problem(head_dim=d, head_dim_v=d, causal=causal, seqlen_q=seqlen, seqlen_k=seqlen)
                capped = dataclasses.replace(plain, softcap=30.0)
                cfg = select_config(capped)
                cfg.check(d, 2)
                assert select_config(plain).exp2_fma_every == 0
                want = 4 if (d, causal) == (128, False) else 0
                assert cfg.exp2_fma_every == want, (d, causal, seqlen)
                # a capped problem keeps the online rule (config.FREEZE_ROW_MAX_MIN_SEQLEN: ungated
                # under a cap): the online step's default, with the split exp2
                online = select_config(plain, frozen_step=False)
                assert cfg == replace_following(online, d, exp2_fma_every=want)
    band = _problem(head_dim=128, head_dim_v=128, softcap=30.0, window_size=(64, 64))
    assert select_config(band).exp2_fma_every == 0


WINDOWS = ((False, (64, -1)), (True, (64, 0)), (True, (1000, -1)), (False, (8, 8)), (False, (-1, 8)), (False, (8, 0)))


def test_a_window_runs_automatically_and_falls_back_visibly_when_switched_off(monkeypatch):
    # a sliding window (gated on the H200 and paired ahead of portable.fwd there: fwd.WINDOW_AUTO)
    # runs on hopper.fwd: its left side, its right side (the causal schedule with the diagonal
    # moved: a non-causal problem with a right side runs the causal default), or both. Switched
    # off, dispatch runs portable.fwd and says why, and the name still runs it. A causal problem's
    # right side past the diagonal is refused naming what it takes
    from flashrung import dispatch

    for causal, window in WINDOWS:
        windowed = _problem(causal=causal, window_size=window, **_contiguous(128))
        band = window[1] >= 0 and not causal
        _, chosen = dispatch.select(windowed, "fwd")
        assert chosen.kernel == "hopper.fwd" and not chosen.forced, window
        assert chosen.config() == select_config(dataclasses.replace(windowed, causal=True) if band else windowed)
    monkeypatch.setattr(fwd, "WINDOW_AUTO", False)
    for causal, window in WINDOWS:
        windowed = _problem(causal=causal, window_size=window, **_contiguous(128))
        band = window[1] >= 0 and not causal
        reason = _runs_by_name_only(windowed, dataclasses.replace(windowed, causal=True) if band else windowed)
        assert reason.startswith(f"window_size {window} runs on hopper.fwd only when asked for by name while "
                                 "fwd.WINDOW_AUTO is off"), reason
    monkeypatch.setattr(fwd, "WINDOW_AUTO", True)
    problem = _problem(causal=True, window_size=(8, 8), **_contiguous(128))
    reason = fwd.unsupported_reason(problem)
    assert reason.startswith("a causal problem's window right side must be -1 or 0") and "(8, 8)" in reason
    assert dispatch.select(problem, "fwd")[1].kernel == "portable.fwd"


@pytest.mark.parametrize("window, causal, expected", [
    (None, False, (-1, 0, False)), (None, True, (-1, 0, True)),
    ((64, -1), True, (64, 0, True)), ((64, 0), True, (64, 0, True)), ((64, -1), False, (64, 0, False)),
    ((64, 9), False, (64, 9, True)), ((-1, 9), False, (3000, 9, True)), ((64, 0), False, (64, 0, True)),
    ((5000, 5000), False, (3000, 3000, True)),
])
def test_a_windows_sides_are_the_launchs(window, causal, expected):
    # what a launch runs for flash-attn's window_size: its run-time sides (an unbounded or too wide
    # side clamped to Sq + Sk, an int32 that bounds nothing) and whether the causal schedule runs it
    # (a bounded right side moves its diagonal)
    assert fwd._window_sides(window, causal, 3000) == expected


def test_packed_sequences_run_automatically_where_they_won_and_fall_back_visibly_otherwise(monkeypatch):
    # packed sequences (flash-attn's varlen), gated on the GPU, run on hopper.fwd: non-causal (paired
    # ahead of portable.fwd on the H200: fwd.PACKED_AUTO), with a window's left side or a cap beside
    # them too, causal through the run-time hand-out (ahead on an H100: fwd.PACKED_AUTO_CAUSAL), and a
    # causal pack or a band (a window's right side runs the causal schedule) beside a window
    # (fwd.PACKED_AUTO_CAUSAL_WINDOWED); each switch off sends its problems to portable.fwd saying
    # why, and they run by name
    from flashrung import dispatch

    for extra in ({}, dict(window_size=(64, -1)), dict(softcap=30.0), dict(causal=True),
                  dict(causal=True, softcap=30.0), dict(causal=True, window_size=(64, 0)), dict(window_size=(64, 8))):
        problem = _problem(varlen=True, batch=5, **extra, **_contiguous(128))
        assert fwd.unsupported_reason(problem) is None
        _, chosen = dispatch.select(problem, "fwd")
        assert chosen.kernel == "hopper.fwd" and not chosen.forced, extra
        cfg = chosen.config()
        # through the pack's table: a causal pack's lists then a pool where config.PACKED_CAUSAL_POOL_SHARE
        # lists its head dim, as a band's (its window's right side runs the causal schedule); every
        # other pack's tiles after the first round drawn
        causal_schedule = bool(extra.get("causal")) or extra.get("window_size", (-1, 0))[1] > 0
        listed = causal_schedule and 128 in config.PACKED_CAUSAL_POOL_SHARE
        assert config.packed_clashes(cfg) == [] and cfg.handout_table, extra
        assert cfg.balanced == (cfg.dynamic_pool_share > 0) == listed == (not cfg.dynamic_tiles), extra
    monkeypatch.setattr(fwd, "PACKED_AUTO_CAUSAL_WINDOWED", False)
    for extra in (dict(causal=True, window_size=(64, 0)), dict(window_size=(64, 8))):
        packed = _problem(varlen=True, batch=5, **extra, **_contiguous(128))
        band = not packed.causal
        reason = _runs_by_name_only(packed, dataclasses.replace(packed, causal=True) if band else packed)
        assert reason.startswith(f"causal packed sequences (varlen) with window_size {extra['window_size']} run "
                                 "on hopper.fwd only when asked for by name while fwd.PACKED_AUTO_CAUSAL_WINDOWED is "
                                 "off"), reason
    monkeypatch.setattr(fwd, "PACKED_AUTO_CAUSAL", False)
    reason = _runs_by_name_only(_problem(varlen=True, causal=True, **_contiguous(128)),
                                _problem(varlen=True, causal=True, **_contiguous(128)))
    assert reason.startswith("causal packed sequences (varlen) run on hopper.fwd only when asked for by name while "
                             "fwd.PACKED_AUTO_CAUSAL is off"), reason
    monkeypatch.setattr(fwd, "PACKED_AUTO", False)
    for causal in (False, True):
        packed = _problem(causal=causal, varlen=True, batch=5, **_contiguous(128))
        reason = _runs_by_name_only(packed, packed)
        assert reason.startswith("packed sequences (varlen) run on hopper.fwd only when asked for by name while "
                                 "fwd.PACKED_AUTO is off"), reason


def test_a_packed_default_leaves_the_split_tail_and_the_pairs_off():
    # config.PACKED_CLASHES (the split tail, kv_multicast and what follows from it) off at every
    # default packed sequences select, the persistent grid's lists or stride traded for the table of
    # the pack's tiles with a row — the run-time hand-out, or the pack's own lists then a run-time
    # pool where config.PACKED_CAUSAL_POOL_SHARE lists a causal row — in the row's L2 sections
    # (config.PACKED_SECTION_MIB), non-causal with the row's Q buffers (config.
    # PACKED_NONCAUSAL_Q_STAGES), the result buildable; the rest is the unpacked default's. Forced
    # on, forward refuses them before looking at a tensor's memory
    for d in HEAD_DIMS:
        for causal in (False, True):
            for seqlen in (17, 1000, 2048, 4096, 8192, 16384, 32768):
                plain = _problem(head_dim=d, head_dim_v=d, causal=causal, seqlen_q=seqlen, seqlen_k=seqlen)
                cfg = select_config(dataclasses.replace(plain, varlen=True))
                listed = causal and cfg.persistent and d in config.PACKED_CAUSAL_POOL_SHARE
                assert config.packed_clashes(cfg) == [] and cfg.balanced == listed, (d, causal, seqlen)
                cfg.check(d, 2)
                # packed sequences keep the online rule (config.FREEZE_ROW_MAX_MIN_SEQLEN: ungated
                # packed): the online step's default
                base = select_config(plain, frozen_step=False)
                expected = (replace_following(base, d, **{n: False for n in config.packed_clashes(base)})
                            if config.packed_clashes(base) else base)
                if expected.persistent and causal and d in config.PACKED_CAUSAL_POOL_SHARE:
                    expected = replace_following(expected, d, balanced=True, dynamic_tiles=False, handout_table=True,
                                                 dynamic_pool_share=config.PACKED_CAUSAL_POOL_SHARE[d],
                                                 packed_section_mib=config.PACKED_SECTION_MIB[d])
                elif expected.persistent:
                    expected = replace_following(expected, d, balanced=False, dynamic_tiles=True, handout_table=True,
                                                 packed_section_mib=config.PACKED_SECTION_MIB[d])
                q_stages = config.PACKED_NONCAUSAL_Q_STAGES.get(d, 1)
                if not causal and expected.separate_o and expected.num_q_stages < q_stages:
                    expected = replace_following(expected, d, num_q_stages=q_stages)
                assert cfg == expected, (d, causal, seqlen)
                assert cfg.num_q_stages == (2 if not causal and d in (64, 128) else base.num_q_stages), (d, seqlen)
                assert cfg.handout_table == cfg.persistent == (cfg.packed_section_mib > 0), (d, causal, seqlen)
    assert config.packed_clashes(fwd.default_config(128, False, 16384)) == ["split_tail", "kv_multicast"]


def test_packed_forward_refuses_what_it_cannot_run():
    # the arguments a direct call gets wrong, named before anything is launched (CPU tensors: the
    # checks run first)
    q = torch.zeros(1, 40, 4, 64, dtype=torch.bfloat16)
    k = v = torch.zeros(1, 30, 2, 64, dtype=torch.bfloat16)
    cu_q, cu_k = torch.tensor([0, 10, 40], dtype=torch.int32), torch.tensor([0, 25, 30], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens and max_seqlens"):
        fwd.forward(q, k, v, False, 0.125, cu_seqlens=(cu_q, cu_k))
    with pytest.raises(ValueError, match="max_seqlen_q must be at least the longest sequence"):
        fwd.forward(q, k, v, False, 0.125, cu_seqlens=(cu_q, cu_k), max_seqlens=(20, 25))
    with pytest.raises(ValueError, match="cu_seqlens_k must start at 0"):
        fwd.forward(q, k, v, False, 0.125, cu_seqlens=(cu_q, cu_k + 1), max_seqlens=(30, 25))
    problem = _problem(varlen=True, **_contiguous(64))
    with pytest.raises(ValueError, match="is one of packed sequences but cu_seqlens is None"):
        fwd.forward(q, k, v, False, 0.125, problem=problem)
    # the pack's balanced lists hold only its tiles with a row: a run-time pool over the grid's ids
    # would draw the others (through the table, it draws the pack's own)
    causal = dataclasses.replace(problem, causal=True, batch=2, seqlen_q=30, seqlen_k=25)
    pooled = replace_following(select_config(causal), 64, balanced=True, dynamic_tiles=False, handout_table=False,
                               dynamic_pool_share=0.03)
    with pytest.raises(ValueError, match="packed sequences draw their pool through the table"):
        fwd.forward(q, k, v, True, 0.125, cu_seqlens=(cu_q, cu_k), max_seqlens=(30, 25), config=pooled,
                    problem=causal)
    # the hand-out's table lists a pack's tiles with a row: whole sequences have no such table
    whole = dataclasses.replace(problem, varlen=False, causal=True)
    tabled = replace_following(select_config(causal), 64, handout_table=True)
    with pytest.raises(ValueError, match="handout_table draws a pack's tiles with a row: it needs packed sequences"):
        fwd.forward(q, k, v, True, 0.125, config=tabled, problem=whole)
    with pytest.raises(ValueError, match="handout_table .* needs dynamic_tiles=True"):
        replace_following(tabled, 64, dynamic_tiles=False, balanced=True, dynamic_pool_share=0.0).check(64)


def test_a_calls_default_configuration_is_selected_and_checked_once_per_problem(monkeypatch):
    # forward's default path (fwd._default_config) selects and checks a problem's configuration
    # once: an equal Problem built by the next call (a new object each call) gets the same
    # configuration without select_config running again; a refused problem raises on every call
    # (nothing cached), and a problem handed over with another mask than the call's is refused
    calls = []

    def counting(problem, *args, **kwargs):
        calls.append(problem)
        return select_config(problem, *args, **kwargs)

    monkeypatch.setattr(fwd, "select_config", counting)
    fwd._default_config.cache_clear()
    problem = _problem(**_contiguous(128))
    first = fwd._default_config(problem)
    assert first == select_config(problem) and len(calls) == 1
    assert fwd._default_config(dataclasses.replace(problem)) is first and len(calls) == 1
    other = fwd._default_config(dataclasses.replace(problem, causal=True))
    assert other == select_config(dataclasses.replace(problem, causal=True)) and len(calls) == 2
    refused = dataclasses.replace(problem, head_dim=100, head_dim_v=100)
    for _ in range(2):
        with pytest.raises(ValueError, match="hopper.fwd cannot run this problem"):
            fwd._default_config(refused)
    q = k = v = torch.zeros(2, 1000, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"causal=True is not the problem's \(False\)"):
        fwd.forward(q, k, v, True, 0.125, problem=problem)


def test_a_windowed_default_leaves_the_levers_that_assume_whole_ranges_off():
    # config.WINDOW_CLASHES (the split tail, the pairs, the halves, the single loop) off at every
    # default a windowed problem selects (config.WINDOW_MASKS_WHERE_CUT on where listed), what
    # follows from them re-derived and
    # the result buildable, a narrow window's tile where one is listed (config.NARROW_WINDOW_*: d64
    # causal); the unwindowed problem's default unchanged
    for d in HEAD_DIMS:
        for causal in (False, True):
            for seqlen in (17, 1000, 2048, 4096, 8192, 16384):
                plain = _problem(head_dim=d, head_dim_v=d, causal=causal, seqlen_q=seqlen, seqlen_k=seqlen)
                windowed = dataclasses.replace(plain, window_size=(256, 0 if causal else -1))
                cfg = select_config(windowed)
                assert config.window_clashes(cfg) == [], (d, causal, seqlen)
                cfg.check(d, 2)
                # a window keeps the online rule (config.WINDOW_CLASHES): the online step's default
                base = select_config(plain, frozen_step=False)
                # the staggered sweep runs with a window and stays off by default until priced; the
                # window's masks where it cuts on at the head dims they were priced at
                off = config.window_clashes(base) + (
                    ["stagger_kv"] if base.stagger_kv and not config.WINDOW_STAGGER_KV else [])
                changes = {n: False for n in off}
                if d in config.WINDOW_MASKS_WHERE_CUT:
                    changes.update(dict.fromkeys(config.WINDOW_MASK_FIELDS, True))
                expected = replace_following(base, d, **changes) if changes else base
                if causal and 256 <= config.NARROW_WINDOW_MAX_LEFT.get(d, -1):
                    expected = replace_following(expected, d, block_m=config.NARROW_WINDOW_BLOCK_M[d])
                assert cfg == expected, (d, causal, seqlen)
                if d == 64 and causal:
                    assert cfg.block_m == 128 and select_config(dataclasses.replace(
                        windowed, window_size=(4096, 0))).block_m == base.block_m, seqlen


@pytest.mark.parametrize("label, d, causal", PACKED_CENSUS, ids=[c[0] for c in PACKED_CENSUS])
def test_packed_census(census, label, d, causal):
    # packed sequences' build against the same configuration unpacked: the K/V loops keep their
    # instructions within a few (each item's lengths are read ahead of its loops) and their wgmma, the
    # buffers stay (+ 64 B at most), and a sequence's partial last box of O goes out from
    # registers (global stores the unpacked build has none of)
    packed, plain = census[f"{label}-packed"], census[f"{label}-plain_of_packed"]
    assert "error" not in packed["row"], packed["row"]["error"]
    assert packed["row"]["config"]["packed"] is True
    assert len(packed["kv_loops"]) == len(plain["kv_loops"])
    # the K/V steps' loops: each consumer's unmasked and masked loop, the most common wgmma count
    # (the loops around a whole item hold more: its peeled first step and its epilogue's)
    step_hgmma = collections.Counter(loop["hgmma"] for loop in plain["kv_loops"]).most_common(1)[0][0]
    steady = [(a, b) for a, b in zip(packed["kv_loops"], plain["kv_loops"]) if b["hgmma"] == step_hgmma]
    assert len(steady) >= 2
    for a, b in steady:
        # (d256 non-causal's masked loop: 502 -> 520, its lengths now loaded, not arguments)
        assert abs(a["length"] - b["length"]) <= max(8, 0.04 * b["length"]), (a["length"], b["length"])
        assert a["ldl"] == b["ldl"] == 0 and a["hgmma"] == b["hgmma"]
    assert 0 <= packed["row"]["smem_bytes"] - plain["row"]["smem_bytes"] <= 64
    assert packed["global_stores"] > plain["global_stores"]


@pytest.mark.parametrize("label, base, d, causal", WINDOW_CENSUS, ids=[c[0] for c in WINDOW_CENSUS])
def test_window_census(census, label, base, d, causal):
    # the window's build: one more masked K/V loop per consumer (the tiles the window cuts on the
    # left, ahead of the unmasked run), every K/V loop still on wgmma, the same shared memory
    windowed, plain = census[label], census[base]
    assert "error" not in windowed["row"], windowed["row"]["error"]
    assert all(loop["hgmma"] > 0 for loop in windowed["kv_loops"])
    assert len(windowed["kv_loops"]) > len(plain["kv_loops"])
    assert abs(windowed["row"]["smem_bytes"] - plain["row"]["smem_bytes"]) <= 64
    assert windowed["row"]["config"]["window"] is True


@pytest.mark.parametrize("label, base, switch, producer_growth", [
    # the staggered sweep under a window changes the order the producer loads an item's unmasked run
    # in and the first tile the consumers mask, nothing of their K/V steps: the producer's loop grows
    # by the wrap (37 -> 47 on the 192-row build, census)
    ("d64-causal-window-stagger", "d64-causal-window", "stagger_kv", (1, 16)),
    # stagger_from_zero picks each item's start once (a cut item's is 0): the producer's loop keeps
    # the staggered build's wrap, no more
    ("d64-causal-window-stagger-from-zero", "d64-causal-window-stagger", "stagger_from_zero", (0, 0))])
def test_a_staggered_window_rotates_in_the_producer_alone(census, label, base, switch, producer_growth):
    # every consumer loop keeps its instructions and its local memory, and the build its registers
    # and buffers
    staggered, plain = census[label], census[base]
    assert "error" not in staggered["row"], staggered["row"]["error"]
    assert staggered["row"]["config"][switch] and not plain["row"]["config"][switch]
    loops = lambda entry: [(loop["length"], loop["ldl"]) for loop in entry["kv_loops"]]     # noqa: E731
    assert loops(staggered) == loops(plain)
    assert staggered["row"]["spill_bytes"] == plain["row"]["spill_bytes"]
    assert staggered["row"]["smem_bytes"] == plain["row"]["smem_bytes"]
    assert len(staggered["producer_loops"]) == len(plain["producer_loops"])
    grown = [a["length"] - b["length"] for a, b in zip(staggered["producer_loops"], plain["producer_loops"])]
    low, high = producer_growth
    assert grown and all(low <= g <= high for g in grown), grown


def _mask_loops(entry, two_bounds):
    """The masked K/V loops of a windowed build: those that mask by the window's two bounds per row
    (two FSEL a score pair: 128 and more a trip) or by one (fewer, but more than the unmasked
    loop's few selects), each running a tile's exponentials."""
    return [loop for loop in entry["kv_loops"]
            if (loop["fsel"] >= 128) == two_bounds and loop["fsel"] > 8 and loop["mufu"] >= 32]


def _one_bound_steps(entry):
    """The one-bound masked K/V steps of a build: its one-bound masked loops with the fewest selects
    (a tile's mask alone; the item loop around the peeled first step selects more)."""
    loops = _mask_loops(entry, False)
    return [loop for loop in loops if loop["fsel"] == min(x["fsel"] for x in loops)]


@pytest.mark.parametrize("label, d, plain, consumers", [("d64-causal-window", 64, "d64-causal", 3),
                                                        ("d128-causal-window", 128, "d128-causal", 2),
                                                        ("d64-full-window", 64, None, 3)])
def test_a_window_masks_by_its_lower_bound_only_where_it_cuts(census, label, d, plain, consumers):
    # with both switches a consumer keeps one loop of two-bound masks (the tiles the window cuts),
    # where the windowed build had three (the cut tiles, the diagonal's run, the item loop around
    # the peeled first step); the diagonal's run compiles to the unwindowed causal build's masked
    # step, and the local memory the two-bound loops kept is gone (d64 causal 168 B, 23 LDL; d128
    # causal 48 B; census, sm_90a)
    cut_label, both_label = _window_mask_labels(label, d)
    cut, windowed = census[cut_label], census[both_label]
    _assert_no_local_memory(cut["row"], label)
    assert all(cut["row"]["config"][name] for name in WINDOW_MASKS_WHERE_CUT)
    assert not any(windowed["row"]["config"][name] for name in WINDOW_MASKS_WHERE_CUT)
    assert len(_mask_loops(cut, True)) == consumers
    assert len(_mask_loops(windowed, True)) == 3 * consumers
    assert cut["row"]["smem_bytes"] == windowed["row"]["smem_bytes"]
    # the unmasked step no longer (d64 causal's third consumer 446 -> 420, its local memory gone)
    unmasked = lambda entry: sorted(loop["length"] for loop in entry["kv_loops"] if loop["fsel"] <= 8)  # noqa: E731
    assert len(unmasked(cut)) == len(unmasked(windowed))
    assert all(a <= b for a, b in zip(unmasked(cut), unmasked(windowed)))
    steps = _one_bound_steps(cut)
    assert len(steps) == consumers
    if plain is not None:
        plain_steps = _one_bound_steps(census[plain])
        for a, b in zip(sorted(x["length"] for x in steps), sorted(x["length"] for x in plain_steps)):
            assert abs(a - b) <= 8, (a, b)
        for a, b in zip(unmasked(cut), unmasked(census[plain])):
            assert abs(a - b) <= 8, (a, b)
    two_bound_steps = [loop["length"] for loop in _mask_loops(windowed, True) if loop["length"] < 800]
    assert max(loop["length"] for loop in steps) < 0.85 * min(two_bound_steps)


def test_a_narrow_d64_window_runs_a_tile_without_local_memory(census):
    # why d64's narrow causal windows take the 128-row tile (config.NARROW_WINDOW_MAX_LEFT): the
    # 192-row windowed build keeps per-step values in local memory in its masked loops (168 B when
    # measured), where the window makes four or five steps of ten masked; the 128-row build keeps
    # none, and every K/V loop stays on wgmma
    narrow = census["d64-causal-narrow-window"]
    assert "error" not in narrow["row"], narrow["row"]["error"]
    assert narrow["row"]["config"]["block_m"] == config.NARROW_WINDOW_BLOCK_M[64] and narrow["row"]["config"]["window"]
    assert narrow["row"]["spill_bytes"] == 0
    assert narrow["row"]["sass"]["LDL"] == 0 and narrow["row"]["sass"]["STL"] == 0
    assert narrow["kv_loops"] and all(loop["hgmma"] > 0 and loop["ldl"] == 0 for loop in narrow["kv_loops"])


@pytest.mark.parametrize("label, base", [("d128-full-s16k-paired-softcap", "d128-full-s16k-paired"),
                                         ("d64-causal-softcap", "d64-causal")])
def test_softcap_census(census, label, base):
    # the cap costs each score of a K/V loop one MUFU.EX2, one MUFU.RCP and three FP32 instructions
    # (softmax.capped: no division's range check), nothing else: the loops keep their count, their
    # wgmma and their local memory (none), and the build its buffers
    capped, plain = census[label], census[base]
    assert "error" not in capped["row"], capped["row"]["error"]
    # the same buffers: the compiler's scratch may move by a few bytes (16 B more on d64's causal tile)
    assert 0 <= capped["row"]["smem_bytes"] - plain["row"]["smem_bytes"] <= 64
    assert capped["row"]["smem_bytes"] <= SMEM_PER_BLOCK_BYTES
    assert len(capped["kv_loops"]) == len(plain["kv_loops"]) > 0
    cfg = HopperFwdConfig(**{f.name: capped["row"]["config"][f.name] for f in dataclasses.fields(HopperFwdConfig)})
    scores_per_thread = 64 * cfg.kv_tile // 128
    softmax_loops = 0
    for c_loop, p_loop in zip(capped["kv_loops"], plain["kv_loops"]):
        assert c_loop["hgmma"] == p_loop["hgmma"] and c_loop["ldl"] == p_loop["ldl"] == 0
        # a loop with a softmax has a tile's exponentials; the others (no scores) gain nothing
        softmax = p_loop["mufu"] >= scores_per_thread
        softmax_loops += softmax
        assert c_loop["mufu"] - p_loop["mufu"] == (2 * scores_per_thread if softmax else 0), (c_loop, p_loop)
    assert softmax_loops > 0
    opcodes = {k: capped["row"]["sass"]["opcodes"].get(k, 0) - plain["row"]["sass"]["opcodes"].get(k, 0)
               for k in ("FSETP.GT.AND", "FSEL")}
    assert opcodes == {"FSETP.GT.AND": 0, "FSEL": 0}, opcodes


def test_the_capped_exp2_split_moves_a_quarter_of_the_softmax_exponentials_off_mufu(census):
    # the mechanism config.CAPPED_EXP2_FMA_EVERY prices (d128 non-causal, N = 4): every K/V loop with
    # a softmax issues a quarter of the tile's softmax exponentials (16 a thread) as FMA-pipe
    # polynomials instead of MUFU.EX2, the cap's own MUFU work untouched; no local memory in any
    # loop, the same wgmma and buffers (census: steady loop 807 -> 920 instructions, MUFU 194 -> 178)
    split, capped = census["d128-full-s16k-paired-softcap-split-exp2"], census["d128-full-s16k-paired-softcap"]
    assert "error" not in split["row"], split["row"]["error"]
    every = config.CAPPED_EXP2_FMA_EVERY[128, False]
    assert split["row"]["config"]["exp2_fma_every"] == every
    assert split["row"]["smem_bytes"] == capped["row"]["smem_bytes"]
    assert split["row"]["spill_bytes"] == capped["row"]["spill_bytes"]
    scores_per_thread = 64
    assert len(split["kv_loops"]) == len(capped["kv_loops"])
    for s_loop, c_loop in zip(split["kv_loops"], capped["kv_loops"]):
        assert s_loop["hgmma"] == c_loop["hgmma"] and s_loop["ldl"] == c_loop["ldl"] == 0
        softmax = c_loop["mufu"] >= scores_per_thread
        assert c_loop["mufu"] - s_loop["mufu"] == (scores_per_thread // every if softmax else 0), (s_loop, c_loop)


def test_softcap_factors_give_flash_attns_cap_in_raw_units():
    # softmax.capped returns softcap·tanh(scale·s/softcap) divided by the scale again, the scale fold
    # after it unchanged; in float64 here, the formula the kernel evaluates in fp32
    import math

    from flashrung.kernels.hopper.softmax import softcap_factors

    assert softcap_factors(0.0, 0.125) == (0.0, 0.0)
    for cap, scale in ((30.0, 128 ** -0.5), (0.5, 64 ** -0.5), (50.0, 1.0)):
        pre, post = softcap_factors(cap, scale)
        for s in (-1e4, -3.0, -1e-3, 0.0, 2.5, 40.0, 1e4):
            kernel = (1.0 - 2.0 / (2.0 ** min(s * pre, 1000.0) + 1.0)) * post
            assert math.isclose(kernel * scale, cap * math.tanh(scale * s / cap), rel_tol=1e-12, abs_tol=1e-12)


def test_a_value_head_dim_of_its_own_runs_when_asked_for_and_falls_back_visibly_otherwise(monkeypatch):
    # MLA's 192/128 (on d256's row, split: config.SPLIT_DEFAULT_HEAD_DIMS): by name only unless the
    # pair is listed as gated and timed on the H200; listed as a pair, not as either head dim alone
    monkeypatch.setattr(fwd, "PADDED_AUTO_HEAD_DIMS", frozenset())
    mla = _problem(head_dim=192, head_dim_v=128, **_contiguous(192, 128))
    reason = _runs_by_name_only(mla, mla)
    assert reason.startswith("head_dim 192 with head_dim_v 128 would run padded to 256") and "none yet" in reason
    monkeypatch.setattr(fwd, "PADDED_AUTO_HEAD_DIMS", frozenset({192, 128}))
    assert fwd.auto_declined_reason(mla) is not None
    monkeypatch.setattr(fwd, "PADDED_AUTO_HEAD_DIMS", frozenset({(192, 128), 96}))
    assert fwd.auto_declined_reason(mla) is None
    assert "(96, 192/128)" in fwd.auto_declined_reason(dataclasses.replace(mla, head_dim_v=64))


def test_a_value_head_dim_is_compiled_at_its_own_width():
    # config.kernel_head_dims: with own_value_dim (the default) Q/K and V/O each take the next
    # compiled head dim up from their own; the configuration stays the wider one's. A v wider than
    # q without O's own buffer, or the switch off, pads both to the wider (the build before)
    own = config.HopperFwdConfig(own_value_dim=True)
    assert config.kernel_head_dims(192, 128, own) == (256, 128)
    assert config.kernel_head_dims(128, 64, own) == (128, 64)
    assert config.kernel_head_dims(96, 40, own) == (128, 64)
    assert config.kernel_head_dims(128, None, own) == config.kernel_head_dims(96, 96, own) == (128, 128)
    assert config.kernel_head_dims(64, 128, dataclasses.replace(own, separate_o=True)) == (64, 128)
    assert config.kernel_head_dims(64, 128, own) == (128, 128)              # O would not fit in Q's buffer
    assert config.kernel_head_dims(192, 128, dataclasses.replace(own, own_value_dim=False)) == (256, 256)
    # every default row a pair runs on, the switch on: d256's for 192/128 (O staged in Q's buffer,
    # reinterpreted), d128's for 128/64 and 64/128 (O's own buffer at every length); off by default
    # but for MLA's pair, whose default splits q too (config.SPLIT_DEFAULT_HEAD_DIMS: 192/128)
    for (d, dv), widths in (((192, 128), (256, 128)), ((128, 64), (128, 64)), ((64, 128), (64, 128))):
        for causal in (False, True):
            for seqlen in (1000, 4096, 16384):
                problem = _problem(head_dim=d, head_dim_v=dv, causal=causal, seqlen_q=seqlen, seqlen_k=seqlen)
                cfg = select_config(problem)
                wider = config.kernel_head_dim(d, dv)
                default = (192, 128) if (d, dv) in config.SPLIT_DEFAULT_HEAD_DIMS else (wider, wider)
                assert config.kernel_head_dims(d, dv, cfg) == default, (d, dv, causal, seqlen)
                # the own-width build on its row's K/V tile (MLA's split takes 128 keys where 256-wide
                # Q and K rings fit only 64: config.SPLIT_KV_TILE_KEYS)
                row = select_config(dataclasses.replace(problem, head_dim=wider, head_dim_v=wider))
                cfg = dataclasses.replace(cfg, own_value_dim=True, split_head_dim=False, block_n=row.block_n)
                assert config.kernel_head_dims(d, dv, cfg) == widths, (d, dv, causal, seqlen)
                cfg.check(widths[0], 2, widths[1])
    # the shared memory it frees: V's ring and (separate_o) O's buffer at v's width
    d256 = fwd.default_config(256, False, 8192)
    saved = d256.smem_bytes(256, 2) - d256.smem_bytes(256, 2, 128)
    assert saved == d256.num_kv_stages * d256.kv_tile * 128 * 2
    with pytest.raises(ValueError, match="head_dim_v 256 wider than head_dim 128 needs separate_o"):
        dataclasses.replace(own, separate_o=False).check(128, 2, 256)
    with pytest.raises(ValueError, match="head_dim_v must be one of"):
        own.check(128, 2, 96)


def test_a_split_head_dim_reads_q_and_k_in_two_boxes():
    # split_head_dim: q's head dim 136-192 as 128 columns and the narrowest tail box of 16, 32 or
    # 64 that holds the rest (kernel_head_dims, qk_boxes), where O fits Q's first box; the boxes'
    # inline copies, the second-box ring of keys and Q in registers are refused beside it
    split = config.HopperFwdConfig(own_value_dim=True, split_head_dim=True)
    assert config.kernel_head_dims(192, 128, split) == (192, 128)
    assert config.kernel_head_dims(136, 64, split) == (144, 64)
    assert config.kernel_head_dims(152, 152, split) == (256, 256)           # O would not fit 128 columns
    assert config.kernel_head_dims(152, 152, dataclasses.replace(split, separate_o=True)) == (160, 256)
    assert config.kernel_head_dims(200, 128, split) == (256, 128)           # past 192: one box of 256
    assert config.kernel_head_dims(128, 64, split) == (128, 64)
    assert config.kernel_head_dims(192, 128, dataclasses.replace(split, own_value_dim=False)) == (256, 256)
    assert [config.qk_boxes(w) for w in (64, 144, 160, 192, 256)] == [(64, 0), (128, 16), (128, 32), (128, 64),
                                                                       (256, 0)]
    with pytest.raises(ValueError, match="Q's and K's width must be one of"):
        config.qk_boxes(176)
    d256 = dataclasses.replace(fwd.default_config(256, True, 8192), own_value_dim=True, split_head_dim=True)
    d256.check(192, 2, 128)
    assert d256.smem_bytes(192, 2, 128) == d256.smem_bytes(256, 2, 128) - (
        d256.num_q_stages * d256.block_m + d256.num_kv_stages * d256.kv_tile) * 64 * 2
    with pytest.raises(ValueError, match="head_dim must be one of"):
        dataclasses.replace(d256, split_head_dim=False).check(192, 2, 128)
    with pytest.raises(ValueError, match="head_dim_v must be at most that or separate_o on, got 256"):
        d256.check(192, 2, 256)
    with pytest.raises(ValueError, match="it excludes q_in_registers"):
        dataclasses.replace(d256, q_in_registers=True).check(192, 2, 128)
    paired = dataclasses.replace(fwd.default_config(128, False, 16384), own_value_dim=True, split_head_dim=True)
    with pytest.raises(ValueError, match="it excludes kv_multicast"):
        paired.check(192, 2, 128)


@pytest.mark.parametrize("label, base, d, causal, qv, switches", OWN_VALUE_DIM_CENSUS,
                         ids=[c[0] for c in OWN_VALUE_DIM_CENSUS])
def test_own_value_dim_census(census, label, base, d, causal, qv, switches):
    # v's own width (192/128: PV's wgmma 64x128 instead of 64x256, O's rescale over 64 registers
    # instead of 128) against the padded build of the same row: no local memory in the loops, the
    # shared memory the config counts, wgmma N only the keys' and v's widths. Split, QK's wgmma
    # run K = 128 + the tail's columns deep instead of 256: that share of the QK instructions
    own, padded = census[label], census[base]
    assert "error" not in own["row"], own["row"]["error"]
    cfg = HopperFwdConfig(**{f.name: own["row"]["config"][f.name] for f in dataclasses.fields(HopperFwdConfig)})
    q_width, v_width = config.kernel_head_dims(*qv, cfg)
    assert (q_width, v_width) != (d, d)
    assert own["row"]["spill_bytes"] == 0 and all(loop["ldl"] == 0 for loop in own["kv_loops"])
    freed = cfg.smem_bytes(d, 2) - cfg.smem_bytes(q_width, 2, v_width)
    assert abs((padded["row"]["smem_bytes"] - own["row"]["smem_bytes"]) - freed) <= 64
    widths = {int(shape.split("x")[1]) for shape in own["hgmma_shapes"]}
    assert widths == {cfg.block_n, v_width}, own["hgmma_shapes"]
    # the tensor work, instructions × N (every shape here 64 rows × 16 deep): less
    work = [sum(int(shape.split("x")[1]) * n for shape, n in e["hgmma_shapes"].items()) for e in (own, padded)]
    assert work[0] < work[1], work
    assert len(own["kv_loops"]) == len(padded["kv_loops"]) > 0
    if v_width < d:
        # O's rescale multiplies: a thread holds v_width / 2 of O's fp32 values instead of d / 2
        assert sum(loop["fmul"] for loop in own["kv_loops"]) < sum(loop["fmul"] for loop in padded["kv_loops"])
    if cfg.kv_multicast:
        assert own["multicast_copies"] > 0
    if cfg.split_head_dim:
        qk = lambda e: e["hgmma_shapes"][f"64x{cfg.block_n}x16"]      # noqa: E731 (block_n 64: QK alone)
        assert qk(own) * d == qk(padded) * q_width, (own["hgmma_shapes"], padded["hgmma_shapes"])


# local memory the 128-key split keeps outside its K/V step loops (census: 88 B non-causal with a key
# tail, two LDL/STL in each item's loop; 16-24 B where the keys fill their tiles)
MLA_128_KEYS_SPILL_BYTES = 88


@pytest.mark.parametrize("label, base, causal", MLA_128_KEYS_CENSUS, ids=[c[0] for c in MLA_128_KEYS_CENSUS])
def test_mla_split_on_128_keys_spends_fewer_instructions_a_key(census, label, base, causal):
    # MLA's split with K/V tiles of 128 keys (config.SPLIT_KV_TILE_KEYS): QK's wgmma N = 128 (each
    # Q read from shared memory serves twice the keys), the rings within the block's shared memory,
    # no local memory in the K/V step loops (each item's loop, its peeled step and epilogue, may
    # keep a little), and each loop's instructions per key below the 64-key build's (census: the
    # unmasked loop 345 per 64 keys -> 511 per 128 non-causal, 352 -> 520 causal)
    wide, narrow = census[label], census[base]
    assert "error" not in wide["row"], wide["row"]["error"]
    assert wide["row"]["config"]["block_n"] == 128 and narrow["row"]["config"]["block_n"] == 64
    assert wide["row"]["smem_bytes"] <= SMEM_PER_BLOCK_BYTES
    step_hgmma = collections.Counter(loop["hgmma"] for loop in wide["kv_loops"]).most_common(1)[0][0]
    assert all(loop["ldl"] == 0 for loop in wide["kv_loops"] if loop["hgmma"] == step_hgmma)
    assert wide["row"]["spill_bytes"] <= MLA_128_KEYS_SPILL_BYTES
    assert "64x128x16" in wide["hgmma_shapes"] and "64x64x16" not in wide["hgmma_shapes"]
    assert len(wide["kv_loops"]) == len(narrow["kv_loops"]) > 0
    for w, n in zip(wide["kv_loops"], narrow["kv_loops"]):
        assert w["length"] / 128 < 0.9 * n["length"] / 64, (w["length"], n["length"])


def test_a_padded_descriptor_boxes_the_kernels_columns():
    # TMA reads the box's columns past the tensor's own as zeros and never writes them: the
    # descriptor keeps the tensor's shape and strides and takes the kernel's box and layout, so a
    # d96 launch specializes exactly as a d128 one (tests/test_direct_launch.py)
    wide = torch.empty(2, 100, 3, 128, dtype=torch.bfloat16)
    narrow = torch.empty(2, 100, 3, 96, dtype=torch.bfloat16)
    d128, d96 = fwd._descriptor(wide, 64, 128), fwd._descriptor(narrow, 64, 128)
    assert d96.shape == [2, 100, 3, 96] and d96.strides == [100 * 3 * 96, 3 * 96, 96, 1]
    assert d96.block_shape == d128.block_shape == [1, 64, 1, 128] and d96.layout == d128.layout
    assert d96.padding == "zero"


def test_layout_reason():
    q = torch.empty(2, 100, 4, 128, dtype=torch.bfloat16)
    assert fwd.layout_reason(q, q, q) is None
    qkv = torch.empty(2, 100, 3, 4, 128, dtype=torch.bfloat16)          # packed: strides TMA can take
    assert fwd.layout_reason(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]) is None
    wide = torch.empty(2, 100, 4, 132, dtype=torch.bfloat16)[..., :128]  # row of 264 bytes: not 16-aligned
    assert "multiples" in fwd.layout_reason(q, wide, q)
    assert "stride(-1)" in fwd.layout_reason(q.transpose(2, 3).contiguous().transpose(2, 3), q, q)
    flat = torch.empty(2 * 100 * 4 * 128 + 1, dtype=torch.bfloat16)[1:].view(2, 100, 4, 128)
    assert "aligned" in fwd.layout_reason(flat, q, q)


def test_forward_rejects_bad_input():
    q = torch.randn(1, 8, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="cannot run"):
        fwd.forward(q, q, q, False, 0.125)                 # CPU tensors
    with pytest.raises(TypeError, match="dtype"):
        fwd.forward(q, q.bfloat16(), q, False, 0.125)
    # a direct call gets the public API's structural checks and messages (flashrung.inputs)
    with pytest.raises(ValueError, match=r"k's head_dim \(32\) must equal q's \(64\)"):
        fwd.forward(q, q[..., :32], q, False, 0.125)
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        fwd.forward(q[0], q, q, False, 0.125)


@pytest.mark.parametrize("head_dim, seqlen, section_mib", [
    (64, 1, 16), (64, 1024, 16), (64, 8192, 16), (128, 1024, 16), (128, 2048, 16), (128, 1 << 20, 16),
    (256, 1, 16), (256, 2048, 16), (256, 4096, 16), (256, 8192, 16), (256, 16384, 16)])
def test_causal_lpt_section_follows_the_measured_rule(head_dim, seqlen, section_mib):
    # 16 MiB LPT sections for every causal problem (preheated paired KEEPs from S1k to S32k at d64
    # and d128, S2k and S4k at d256, on the balanced lists); non-causal problems have no sections
    # (48 MiB, which their unsectioned order never uses)
    for sq, sk in ((seqlen, seqlen), (1, seqlen), (seqlen, 1)):
        causal = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=True, seqlen_q=sq, seqlen_k=sk))
        full = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=False, seqlen_q=sq, seqlen_k=sk))
        assert (causal.l2_section_mib, full.l2_section_mib) == (section_mib, config.L2_SECTION_MIB), (sq, sk)
    assert config.L2_SECTION_MIB << 20 == schedule.L2_BUDGET_BYTES


def test_l2_section_bounds_are_checked():
    base = fwd.default_config(128, True)
    for bad in (0, config.MAX_L2_SECTION_MIB + 1):
        with pytest.raises(ValueError, match="l2_section_mib"):
            dataclasses.replace(base, l2_section_mib=bad).check(128)
    with pytest.raises(ValueError, match="budget_bytes"):
        head_section(8192, 32, 32, 64, 2, 0)
    # 2 MiB of K/V per head at d64 S8k bf16: the budget decides how many heads run together
    assert [head_section(8192, 32, 32, 64, 2, mib << 20) for mib in (1, 16, 48)] == [1, 8, 24]


def test_head_section_keeps_gqa_groups_together():
    for heads_q, heads_kv in ((32, 32), (32, 4), (8, 1)):
        section = head_section(16384, heads_q, heads_kv, 128, 2)
        assert section >= heads_q // heads_kv and section % (heads_q // heads_kv) == 0


def test_census_specs_cover_every_default():
    specs = fwd.census_specs()
    seen = {(s.config["head_dim"], s.config["causal"], s.config["dtype"]) for s in specs}
    assert seen == {(d, c, t) for d in HEAD_DIMS for c in (False, True) for t in ("fp16", "bf16")}
    assert all(s.gluon and s.arches == ("sm_90a",) for s in specs)


def test_census_lengths_reach_every_default_kernel():
    # every kernel a default builds, at any length up to 64k (each 1k step and its neighbours, where
    # the rules' edges lie), is one the census lengths build: a new rule range needs its length.
    # Both steps' defaults: the online step's (a call under the work threshold) and the frozen one's
    reached = {(fwd._census_kernel(fwd.default_config(d, c, s, frozen_step=f)), d, c)
               for d in HEAD_DIMS for c in (False, True) for s in fwd._CENSUS_SEQLENS for f in (False, True)}
    for d in HEAD_DIMS:
        for c in (False, True):
            for step in range(1, 65):
                for s in (1024 * step - 1, 1024 * step, 1024 * step + 1):
                    for f in (False, True):
                        kernel = fwd._census_kernel(fwd.default_config(d, c, s, frozen_step=f))
                        assert (kernel, d, c) in reached, (d, c, s, f)


# --------------------------------------------------------------------------- gate (sm_90 GPU)

on_hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="needs a CUDA device of compute capability 9.0 (Hopper)")


def _shape_id(shape: dict) -> str:
    """Test id of a gate shape: batch, query x key length, query:kv heads."""
    return "B{batch}-{seqlen_q}x{seqlen_k}-H{heads_q}:{heads_kv}".format(**shape)


def _seeded_qkv(batch, seqlen, heads, head_dim):
    """``(q, k, v)``, bf16 on the GPU, ``[batch, seqlen, heads, head_dim]``, drawn after seeding 0:
    the same inputs for every call with the same shape."""
    torch.manual_seed(0)
    return tuple(torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))


def _gate(forward_fn=fwd.forward, **kw):
    from flashrung.gate import check_forward

    result = check_forward(forward_fn, device="cuda", **kw)
    assert result.passed, str(result)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("seqlen", [1, 17, 1000, 4097])   # single row; sub-tile; tails; one past 4096
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_square(head_dim, causal, dtype, seqlen):
    heads = 2 if seqlen > 1000 else 4
    _gate(batch=2, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=heads, heads_kv=heads, head_dim=head_dim,
          dtype=dtype, causal=causal)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("seqlen_q, seqlen_k", [
    (1000, 17),    # causal: most rows see no key at all (out 0, lse -inf)
    (17, 1000),    # causal: a short query block at the end of a long key sequence
    (333, 4097),   # key tail of one, several unmasked tiles before the diagonal
    (4097, 1000),
])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_unequal_lengths(head_dim, causal, seqlen_q, seqlen_k):
    _gate(batch=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=2, heads_kv=2, head_dim=head_dim,
          dtype=torch.bfloat16, causal=causal)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype", [
    (2, 2048, 2048, 2, 2, torch.bfloat16),   # the fa4-protocol S2k rows' kernels, whole tiles
    (2, 2048, 2048, 2, 2, torch.float16),
    (1, 1500, 1500, 4, 2, torch.bfloat16),   # d64's 192-row tile from 1025, key and row tails, GQA
    (1, 4096, 3000, 2, 2, torch.bfloat16),   # the longest length the decode runs at, Sq > Sk
    (1, 2500, 4096, 2, 1, torch.bfloat16),   # Sq < Sk: long unmasked runs before the diagonal, MQA
])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gate_defaults_between_1k_and_4k(head_dim, causal, batch, seqlen_q, seqlen_k, heads_q, heads_kv, dtype):
    # the defaults that max(Sq, Sk) in (1024, 4096] selects — the multiply-high decode with two Q
    # buffers (config.FAST_DIVIDE_MAX_SEQLEN, TWO_Q_STAGES_MAX_SEQLEN), d64's 192-row tile with and
    # without its staggered sweeps — computed against the oracle at those lengths; the envelope of
    # `flashrung check` jumps from 1000 to 4097
    _gate(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
          head_dim=head_dim, dtype=dtype, causal=causal)


# Padded head dims (config.kernel_head_dim): each runs the kernel of the next compiled head dim
# with TMA zero-filling the columns past its own. Shapes: one row, sub-tile, GQA with key tails,
# Sq < Sk with MQA, Sq > Sk, and the paired (kv_multicast) defaults with the split tail at S4096
# and the relayed pair in FA4's order at S8192 (what d128 non-causal selects there)
PADDED_HEAD_DIM_SHAPES = [
    dict(batch=2, seqlen_q=1, seqlen_k=1, heads_q=4, heads_kv=4),
    dict(batch=2, seqlen_q=17, seqlen_k=17, heads_q=4, heads_kv=2),
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2),
    dict(batch=1, seqlen_q=333, seqlen_k=4097, heads_q=2, heads_kv=1),
    dict(batch=1, seqlen_q=4097, seqlen_k=1000, heads_q=2, heads_kv=2),
    dict(batch=2, seqlen_q=4096, seqlen_k=4096, heads_q=4, heads_kv=4),
    dict(batch=1, seqlen_q=8192, seqlen_k=8192, heads_q=8, heads_kv=8),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", PADDED_HEAD_DIM_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [32, 80, 96, 192])
def test_gate_padded_head_dims(head_dim, causal, shape):
    # the gate automatic dispatch waits for (fwd.PADDED_AUTO_HEAD_DIMS): the d64, d128 and d256
    # kernels on narrower tensors, every default they select at these lengths
    _gate(head_dim=head_dim, dtype=torch.bfloat16, causal=causal, **shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", PADDED_HEAD_DIM_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim, head_dim_v, build", [
    *[(d, dv, build) for build in ("padded", "own-width") for d, dv in ((192, 128), (128, 64), (64, 128))],
    (192, 128, "split"), (160, 128, "split"), (136, 64, "split"),
    (192, 128, "split-128-keys"), (160, 128, "split-128-keys")])
def test_gate_value_head_dims(head_dim, head_dim_v, build, causal, shape):
    # v with a head dim of its own (MLA's 192/128 on the d256 kernel; narrower and wider than q/k
    # on the d128 one): each tensor's descriptor pads to the kernel's columns, out keeps v's; with
    # own_value_dim V, PV and O at v's own width (192/128: 256/128, its O staged in Q's buffer);
    # split, Q and K as 128 columns and a tail box (192/128: 192/128, 136/64: 144/64); the split on
    # K/V tiles of 128 keys where the d256 row takes 64 (its rings fit at these widths)
    _gate(_value_build(build), head_dim=head_dim, head_dim_v=head_dim_v,
          dtype=torch.bfloat16, causal=causal, **shape)


def _o_from_registers(q, k, v, causal, softmax_scale, **kw):
    """``fwd.forward`` on the problem's default with O stored from registers (``o_from_registers``);
    a default with O's own buffer gives it up first (and the second Q buffer that needs it)."""
    problem = Problem.of_packed(q, k, v, causal, kw["cu_seqlens"][0].numel() - 1, tuple(kw["max_seqlens"])) \
        if kw.get("cu_seqlens") is not None else Problem.of(q, k, v, causal)
    cfg = select_config(problem)
    if cfg.separate_o:
        cfg = dataclasses.replace(cfg, separate_o=False, num_q_stages=1, overlap_epilogue=False)
    return fwd.forward(q, k, v, causal, softmax_scale, config=dataclasses.replace(cfg, o_from_registers=True), **kw)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", PADDED_HEAD_DIM_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim, head_dim_v", [(192, 128), (256, 256), (96, 96), (64, 64)])
def test_gate_o_from_registers(head_dim, head_dim_v, causal, shape):
    # O stored from registers, masked below the sequence's end and at out's own width (d96 on the
    # d128 kernel), Q released before the epilogue: a row written twice, never, into the next
    # batch entry or from a Q the producer already overwrote fails the gate
    _gate(_o_from_registers, head_dim=head_dim, head_dim_v=head_dim_v, dtype=torch.bfloat16, causal=causal,
          **shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_gate_o_from_registers_packed(head_dim, causal):
    # a pack's sequences each stored from registers at their own rows (no partial TMA box to clip)
    _gate_first_pack(_o_from_registers, head_dim, causal)


# the value head dims' builds: every tensor at the wider kernel head dim (the default), v at its own
# width, and q and k split in two boxes as well
# (each build names both switches: MLA's default splits, config.SPLIT_DEFAULT_HEAD_DIMS)
_BUILDS = {"padded": {"own_value_dim": False, "split_head_dim": False},
           "own-width": {"own_value_dim": True, "split_head_dim": False},
           "split": {"own_value_dim": True, "split_head_dim": True},
           "split-128-keys": {"own_value_dim": True, "split_head_dim": True, "block_n": 128}}


def _forward_with(**changes):
    """``fwd.forward`` on each problem's default configuration with ``changes``."""
    def run(q, k, v, causal, softmax_scale, **kw):
        problem = Problem.of(q, k, v, causal)
        cfg = replace_following(select_config(problem), config.kernel_head_dim(problem.head_dim, problem.head_dim_v),
                                **changes)
        return fwd.forward(q, k, v, causal, softmax_scale, config=cfg, **kw)
    return run


def _value_build(build):
    """``fwd.forward`` on each problem's default configuration with ``_BUILDS[build]``'s switches,
    what follows from them re-derived: MLA's default split turned off takes its own K/V tile with it
    (config.SPLIT_KV_TILE_KEYS), as ``impl="hopper.fwd@split_head_dim=false"`` does."""
    def run(q, k, v, causal, softmax_scale, **kw):
        cfg = replace_following(select_config(Problem.of(q, k, v, causal)),
                                config.kernel_head_dim(q.shape[3], v.shape[3]), **_BUILDS[build])
        return fwd.forward(q, k, v, causal, softmax_scale, config=cfg, **kw)
    return run


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("softcap, shape", [(30.0, s) for s in PADDED_HEAD_DIM_SHAPES]
                         + [(0.5, s) for s in PADDED_HEAD_DIM_SHAPES[:3]], ids=lambda x: _shape_id(x)
                         if isinstance(x, dict) else f"cap{x:g}")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_softcap(softcap, head_dim, causal, shape):
    # the gate automatic dispatch waits for (fwd.SOFTCAP_AUTO): the capped scores on every default
    # these lengths select (paired, split tail, balanced causal grid); a cap of 30 bends only the
    # largest scores, one of 0.5 nearly every score
    _gate(head_dim=head_dim, dtype=torch.bfloat16, causal=causal, softcap=softcap, **shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", PADDED_HEAD_DIM_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("left", [0, 17, 300, 4000])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_window(head_dim, causal, left, shape):
    # the gate automatic dispatch waits for (fwd.WINDOW_AUTO): a sliding window's left side on every
    # windowed default these lengths select — a window of one key (0), one inside a K/V tile (17),
    # one across tiles (300), one past d64's narrow causal windows (4000: its 192-row tile,
    # config.NARROW_WINDOW_MAX_LEFT); Sq != Sk both ways, GQA, row and key tails
    _gate(head_dim=head_dim, dtype=torch.bfloat16, causal=causal, window_size=(left, 0 if causal else -1), **shape)


# the windows the switch gates run: one inside a K/V tile, one across tiles, one of many tiles (items
# that reach key 0 beside cut ones), one past d64's narrow causal windows (4000: its 192-row tile,
# config.NARROW_WINDOW_MAX_LEFT), non-causal with a key tail, and a band (the diagonal moved)
GATE_WINDOWS = [(17, 0), (300, 0), (1000, 0), (4000, 0), (300, -1), (300, 45)]


def _windowed_forward_with(**changes):
    """``fwd.forward`` on each windowed problem's default configuration with ``changes`` (what
    follows from them re-derived)."""
    def run(q, k, v, causal, softmax_scale, window_size, **kw):
        base = select_config(Problem.of(q, k, v, causal, window_size=window_size))
        cfg = replace_following(base, config.kernel_head_dim(q.shape[3], v.shape[3]), **changes)
        return fwd.forward(q, k, v, causal, softmax_scale, config=cfg, window_size=window_size, **kw)
    return run


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("from_zero", [False, True], ids=["every-item", "from-zero"])
@pytest.mark.parametrize("shape", PADDED_HEAD_DIM_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("window", GATE_WINDOWS, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_window_staggered(head_dim, window, shape, from_zero):
    # the staggered sweep under a window (config.WINDOW_STAGGER_KV's candidate): only the run between
    # the tiles the window cuts and the diagonal's rotates, so every cut and diagonal tile is masked
    # with its own index — a window inside a tile, across tiles, one of many tiles, non-causal and a band.
    # from_zero (stagger_from_zero): only the items whose window reaches key 0 rotate, the cut ones
    # sweep in order — both kinds in one launch at every window here but the widest
    causal = window[1] == 0
    _gate(forward_fn=_windowed_forward_with(stagger_kv=True, stagger_from_zero=from_zero), head_dim=head_dim,
          dtype=torch.bfloat16, causal=causal, window_size=window, **shape)


# a window's lower bound only on the tiles it cuts: the peeled first tile masked only where the
# loops would mask it (window_first_mask_on_need), the diagonal's run by the upper bound alone
# (window_diagonal_one_bound); each alone and both
# (each alone names the other off: d64's windowed default takes both)
WINDOW_MASK_SWITCHES = {"first-on-need": dict(window_first_mask_on_need=True, window_diagonal_one_bound=False),
                        "diagonal-one-bound": dict(window_first_mask_on_need=False, window_diagonal_one_bound=True),
                        "both": WINDOW_MASKS_WHERE_CUT}


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", PADDED_HEAD_DIM_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("window", GATE_WINDOWS, ids=str)
@pytest.mark.parametrize("head_dim, switches", [(d, name) for d in HEAD_DIMS for name in WINDOW_MASK_SWITCHES
                                                if name == "both" or d == 64])
def test_gate_window_masks_where_cut(head_dim, switches, window, shape):
    # the tiles a window cuts (the first one included) masked by both bounds, the diagonal's and the
    # key tail's by the upper one, an uncut item's first tile not at all, over GATE_WINDOWS (at 17
    # keys the diagonal's tiles are cut too: masked by both); each switch alone at d64 (its 128- and
    # 192-row windowed tiles), both on every head dim
    causal = window[1] == 0
    _gate(forward_fn=_windowed_forward_with(**WINDOW_MASK_SWITCHES[switches]), head_dim=head_dim,
          dtype=torch.bfloat16, causal=causal, window_size=window, **shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", PADDED_HEAD_DIM_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("window", [(0, 0), (17, 0), (300, 45), (-1, 100), (64, 300), (5, 4000)])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_window_right(head_dim, window, shape):
    # a window with a right side of its own on a non-causal problem: the causal schedule with the
    # diagonal moved right (fwd._window_sides) — a band of one key (0, 0), one ending on the
    # diagonal, both sides inside and across tiles, a right side alone, one past every key
    _gate(head_dim=head_dim, dtype=torch.bfloat16, causal=False, window_size=window, **shape)


# packed sequences: long and short ones, Sq != Sk within the pack, an empty query range and an
# empty key range (tests/test_gpu.py's pack); and lengths ending inside, on and one past the 64-row O
# boxes and the K/V tiles, one row and one key
PACKED_LENGTHS = [((1000, 4097, 17, 0, 300), (1000, 4097, 3000, 5, 0)),
                  ((64, 65, 1, 192, 127, 128, 63), (64, 63, 1, 192, 129, 128, 200))]


def _gate_first_pack(forward, head_dim, causal):
    """The gate of ``forward`` on the first of PACKED_LENGTHS (H8 / KV2, bf16): each sequence against
    the references run on it alone, outputs poisoned first (gate.check_varlen)."""
    from flashrung import gate

    lens_q, lens_k = PACKED_LENGTHS[0]
    case = gate.Case(len(lens_q), max(lens_q), max(lens_k), 8, 2, head_dim, torch.bfloat16, causal,
                     varlen=PACKED_LENGTHS[0])
    result = gate.check_varlen(forward, None, case, "cuda", kernel=fwd.KERNEL_NAME)
    assert result.passed, str(result)


def _packed_forward_with(config_of):
    """``fwd.forward`` on packed sequences with the configuration ``config_of(problem)`` picks."""
    def forward(q, k, v, causal, scale, cu_seqlens, max_seqlens, **kw):
        problem = Problem.of_packed(q, k, v, causal, cu_seqlens[0].numel() - 1, tuple(max_seqlens))
        return fwd.forward(q, k, v, causal, scale, cu_seqlens=cu_seqlens, max_seqlens=max_seqlens,
                           config=config_of(problem), **kw)
    return forward


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("lengths", PACKED_LENGTHS, ids=["long-short-empty", "box-edges"])
@pytest.mark.parametrize("window", [None, 100])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_packed(head_dim, causal, window, lengths):
    # the gate automatic dispatch waits for (fwd.PACKED_AUTO): every sequence against the references
    # run on it alone (gate.check_varlen: a row that reads another sequence's keys, or a partial O
    # box that writes the next sequence's first rows, fails), the outputs poisoned first (a row
    # never written fails); with and without a window's left side
    from flashrung import gate

    lens_q, lens_k = lengths
    window_size = gate.NO_WINDOW if window is None else (window, 0 if causal else -1)
    case = gate.Case(len(lens_q), max(lens_q), max(lens_k), 8, 2, head_dim, torch.bfloat16, causal, varlen=lengths,
                     window_size=window_size)
    result = gate.check_varlen(fwd.forward, None, case, "cuda", kernel=fwd.KERNEL_NAME)
    assert result.passed, str(result)


# the packed launch's grids: the balanced lists of its tiles with a row (schedule.packed_schedule),
# the stride without them, tiles handed out at run time (every id of the grid, or through a table
# of the tiles with a row), the lists then a pool drawn through the table, one CTA per tile; the
# lists and the table heaviest first across the pack, and in L2 sections (packed_section_mib) of
# 1 MiB, so that the gate's pack spans several. Every grid names dynamic_tiles, handout_table,
# dynamic_pool_share, packed_section_mib, draw_ahead_steps and handout_barrier: a pack's default
# draws through the table in sections, and the other grids beside it do not build
_UNSECTIONED = dict(packed_section_mib=0, dynamic_pool_share=0.0, draw_ahead_steps=0, handout_barrier=False)
_SECTIONED = dict(packed_section_mib=1, dynamic_pool_share=0.0, draw_ahead_steps=0, handout_barrier=False)
PACKED_GRIDS = {"lists": dict(balanced=True, persistent=True, dynamic_tiles=False, handout_table=False, **_UNSECTIONED),
                "lists-sections": dict(balanced=True, persistent=True, dynamic_tiles=False, handout_table=False,
                                       **_SECTIONED),
                "stride": dict(balanced=False, persistent=True, dynamic_tiles=False, handout_table=False,
                               **_UNSECTIONED),
                "dynamic": dict(balanced=False, persistent=True, dynamic_tiles=True, handout_table=False,
                                **_UNSECTIONED),
                "table": dict(balanced=False, persistent=True, dynamic_tiles=True, handout_table=True, **_UNSECTIONED),
                "table-sections": dict(balanced=False, persistent=True, dynamic_tiles=True, handout_table=True,
                                       **_SECTIONED),
                # a pool of a quarter of the work: the gate's pack draws tiles of several sequences
                "lists-pool-sections": dict(balanced=True, persistent=True, dynamic_tiles=False, handout_table=True,
                                            packed_section_mib=1, dynamic_pool_share=0.25, draw_ahead_steps=0,
                                            handout_barrier=False),
                # the table's draws two K/V tiles ahead of an item's last load (the pack's short
                # sequences' items are shorter than that: drawn after their first tile); its items on
                # a barrier of their own; the lists' pool drawn one ahead, on the items' barriers
                "table-sections-ahead": dict(balanced=False, persistent=True, dynamic_tiles=True, handout_table=True,
                                             packed_section_mib=1, dynamic_pool_share=0.0, draw_ahead_steps=2,
                                             handout_barrier=False),
                "table-sections-barrier": dict(balanced=False, persistent=True, dynamic_tiles=True, handout_table=True,
                                               packed_section_mib=1, dynamic_pool_share=0.0, draw_ahead_steps=0,
                                               handout_barrier=True),
                "lists-pool-ahead": dict(balanced=True, persistent=True, dynamic_tiles=False, handout_table=True,
                                         packed_section_mib=1, dynamic_pool_share=0.25, draw_ahead_steps=1,
                                         handout_barrier=True),
                "per-tile": dict(balanced=False, persistent=False, dynamic_tiles=False, handout_table=False,
                                 **_UNSECTIONED)}


def _packed_grid_config(problem, head_dim, grid):
    return replace_following(select_config(problem), config.kernel_head_dim(head_dim), **PACKED_GRIDS[grid])


@pytest.mark.parametrize("grid", sorted(PACKED_GRIDS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_packed_grids_build_on_the_default(head_dim, causal, grid):
    # each grid the packed gate runs is a configuration the kernel accepts on top of the pack's
    # default (no GPU: a grid that clashes with the default fails here, not on the device)
    lens_q, lens_k = PACKED_LENGTHS[0]
    q = torch.empty(1, sum(lens_q), 8, head_dim, device="meta", dtype=torch.bfloat16)
    k = torch.empty(1, sum(lens_k), 2, head_dim, device="meta", dtype=torch.bfloat16)
    problem = Problem.of_packed(q, k, k, causal, len(lens_q), (max(lens_q), max(lens_k)))
    cfg = _packed_grid_config(problem, head_dim, grid)
    cfg.check(config.kernel_head_dim(head_dim))
    assert {name: getattr(cfg, name) for name in PACKED_GRIDS[grid]} == PACKED_GRIDS[grid]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("grid", sorted(PACKED_GRIDS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_packed_grids(head_dim, causal, grid):
    # every packed item finds its own sequence however the grid hands items out (an item read
    # twice or never, or a CTA that skips an empty item's Q out of step with its consumers, fails)
    _gate_first_pack(_packed_forward_with(lambda problem: _packed_grid_config(problem, head_dim, grid)), head_dim,
                     causal)


def _packed_two_q_config(problem, head_dim):
    return replace_following(select_config(problem), config.kernel_head_dim(head_dim), num_q_stages=2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_packed_two_q_buffers_build_and_are_the_non_causal_default(head_dim, causal):
    # a pack's short tiles (docs/hopper.md, *Packed sequences*: a 1024-key sequence's tiles wait
    # for their Q on one buffer): two Q buffers build on the pack's default at both head dims and
    # masks, and are that default non-causal (config.PACKED_NONCAUSAL_Q_STAGES) without a window
    # (under one they lost) and at d128 causal (the unpacked row's); the gate's pack (longest 4097)
    # otherwise selects one
    lens_q, lens_k = PACKED_LENGTHS[0]
    q = torch.empty(1, sum(lens_q), 8, head_dim, device="meta", dtype=torch.bfloat16)
    k = torch.empty(1, sum(lens_k), 2, head_dim, device="meta", dtype=torch.bfloat16)
    problem = Problem.of_packed(q, k, k, causal, len(lens_q), (max(lens_q), max(lens_k)))
    cfg = _packed_two_q_config(problem, head_dim)
    cfg.check(config.kernel_head_dim(head_dim))
    assert cfg.num_q_stages == 2 and cfg.handout_table
    assert (select_config(problem).num_q_stages == 2) == (not causal or head_dim == 128)
    windowed = dataclasses.replace(problem, window_size=(1024, -1 if not causal else 0))
    assert select_config(windowed).num_q_stages == (2 if causal and head_dim == 128 else 1)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gate_packed_two_q_buffers(head_dim, causal):
    # the pack's default with two Q buffers: the next item's Q, loaded under this one, belongs to
    # another sequence (its own rows, its own lengths); an item past its sequence's rows still
    # flows through the Q ring in step
    _gate_first_pack(_packed_forward_with(lambda problem: _packed_two_q_config(problem, head_dim)), head_dim, causal)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal, options", [
    (causal, options) for causal in (False, True)
    for options in (dict(window_size=(300, 0)), dict(softcap=30.0), dict(packed=None), dict(packed=100))]
    + [(False, dict(window_size=(64, 300)))], ids=str)
def test_gate_split_with_score_options(causal, options):
    # MLA's 192/128 split (q and k as 128 + 64 columns, v at 128: what its default runs, config.
    # SPLIT_DEFAULT_HEAD_DIMS) beside a window's sides (a band needs the launch non-causal), a cap
    # and packed sequences (without and with a window), on the configuration each problem selects
    # with the split forced: what the default may take on once this passes
    from flashrung import gate

    def split(q, k, v, causal, scale, cu_seqlens=None, max_seqlens=None, **kw):
        problem = (Problem.of_packed(q, k, v, causal, cu_seqlens[0].numel() - 1, tuple(max_seqlens))
                   if cu_seqlens is not None else Problem.of(q, k, v, causal))
        problem = dataclasses.replace(problem, window_size=tuple(kw.get("window_size", gate.NO_WINDOW)),
                                      softcap=kw.get("softcap", 0.0))
        cfg = replace_following(select_config(problem), 256, **_BUILDS["split"])
        assert config.kernel_head_dims(192, 128, cfg) == (192, 128)
        packing = dict(cu_seqlens=cu_seqlens, max_seqlens=max_seqlens) if cu_seqlens is not None else {}
        return fwd.forward(q, k, v, causal, scale, config=cfg, **packing, **kw)

    if "packed" in options:
        window = options["packed"]
        window_size = gate.NO_WINDOW if window is None else (window, 0 if causal else -1)
        lens_q, lens_k = PACKED_LENGTHS[0]
        case = gate.Case(len(lens_q), max(lens_q), max(lens_k), 8, 2, 192, torch.bfloat16, causal, head_dim_v=128,
                         varlen=PACKED_LENGTHS[0], window_size=window_size)
        result = gate.check_varlen(split, None, case, "cuda", kernel=fwd.KERNEL_NAME)
        assert result.passed, str(result)
        return
    for shape in PADDED_HEAD_DIM_SHAPES[:5]:
        _gate(split, head_dim=192, head_dim_v=128, dtype=torch.bfloat16, causal=causal, **options, **shape)


@pytest.mark.gpu
@on_hopper
def test_packed_sequences_by_name_through_the_api_are_bit_identical_run_twice():
    # flashrung.attention_varlen(impl="hopper.fwd"): the kernel runs (not a fallback), twice over bit
    # for bit (a moving result is a race), and each sequence's rows are, bit for bit, the same
    # sequence run alone — a pack of one — on the packed launch's configuration (its own lengths,
    # nothing of its neighbours'; the table of its tiles and their order are the pack's own)
    import flashrung

    torch.manual_seed(0)
    lens = (700, 1, 2048, 130)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(sum(lens), 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    first = flashrung.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, impl="hopper.fwd")
    assert flashrung.last_dispatch().kernel == "hopper.fwd"
    for _ in range(3):
        assert torch.equal(first, flashrung.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True,
                                                             impl="hopper.fwd"))
    cfg = select_config(Problem.of_packed(q[None], k[None], v[None], True, len(lens), (max(lens), max(lens))))
    for start, end in zip(cu.tolist(), cu.tolist()[1:]):
        one = torch.tensor([0, end - start], dtype=torch.int32, device="cuda")
        alone = fwd.forward(*(t[None, start:end] for t in (q, k, v)), True, 128 ** -0.5, config=cfg,
                            cu_seqlens=(one, one), max_seqlens=(end - start, end - start))[0][0]
        assert torch.equal(first[start:end], alone), (start, end)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_a_windowed_output_is_bit_identical_run_twice(causal):
    # a moving result is a race: the window's masked loops and ranges, twice over, bit for bit
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3000, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    window = (700, 0 if causal else -1)
    first = fwd.forward(q, k, v, causal, 128 ** -0.5, window_size=window)
    for _ in range(3):
        again = fwd.forward(q, k, v, causal, 128 ** -0.5, window_size=window)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("seqlen, causal", [(1000, False), (1000, True), (4096, False), (8192, False)])
@pytest.mark.parametrize("head_dim, head_dim_v, build", [(32, 32, "padded"), (96, 96, "padded"), (128, 64, "padded"),
                                                          (128, 40, "own-width"), (192, 128, "own-width"),
                                                          (192, 72, "own-width"), (192, 128, "split"),
                                                          (160, 72, "split")])
def test_a_padded_head_dim_writes_only_its_own_columns(head_dim, head_dim_v, build, causal, seqlen):
    # out as a view into wider rows of a poisoned buffer: the kernel's TMA stores (and the split
    # tail's merge, from S4096 non-causal) write the output's columns and not one past them;
    # the result is the contiguous out's, bit for bit, twice over (a moving result is a race).
    # With v's own width, O's box is v's kernel width (192/72: 128 columns, staged in Q's buffer;
    # split, in Q's first box)
    torch.manual_seed(0)
    kd = config.kernel_head_dim(head_dim, head_dim_v)
    q, k = (torch.randn(2, seqlen, 4, head_dim, device="cuda", dtype=torch.float16) for _ in range(2))
    v = torch.randn(2, seqlen, 4, head_dim_v, device="cuda", dtype=torch.float16)
    forward = _value_build(build)
    want, want_lse = forward(q, k, v, causal, head_dim ** -0.5)
    for _ in range(2):
        wide = torch.full((2, seqlen, 4, kd), float("nan"), device="cuda", dtype=torch.float16)
        out, lse = forward(q, k, v, causal, head_dim ** -0.5, out=wide[..., :head_dim_v])
        assert wide[..., head_dim_v:].isnan().all(), "a column past the head dim was written"
        assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, heads_q, heads_kv, two_q", [
    (1, 2048, 2048, 1, 1, True),    # two Q buffers, Gluon's producer; 11 q-tiles: an odd launch total
    (2, 2049, 2049, 3, 3, False),   # one Q buffer, the unsynced producer; a 1-row consumer in each last tile
    (1, 2100, 2100, 4, 2, False),   # GQA: 11 q-tiles a head, pairs across heads, two of them on one K/V head
    (1, 3000, 2100, 2, 1, False),   # MQA, Sq > Sk (the longer decides), key tail
    (1, 1000, 3500, 2, 2, False),   # Sq < Sk: 6 q-tiles a head
])
def test_gate_d64_paired_default_from_2k(batch, seqlen_q, seqlen_k, heads_q, heads_kv, two_q):
    # d64 non-causal pairs its CTAs from 2k (change 50): at S2048 beside two Q buffers and the
    # multiply-high decode (with Gluon's producer, which check() requires there), from 2049 on one Q
    # buffer with the unsynced producer — odd and even launch totals, row and key tails, GQA/MQA,
    # Sq != Sk, against the oracle
    cfg = select_config(_problem(head_dim=64, head_dim_v=64, causal=False, seqlen_q=seqlen_q, seqlen_k=seqlen_k))
    assert cfg.kv_multicast and cfg.cross_head_pairs and not cfg.stagger_kv
    assert (cfg.num_q_stages == 2) is two_q and cfg.producer_unsynced is not two_q
    _gate(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv, head_dim=64,
          dtype=torch.bfloat16, causal=False)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(16700, 16700), (300, 20000)])
def test_gate_d64_paired_default_past_16k(seqlen_q, seqlen_k):
    # d64 non-causal pairs its CTAs at every length from 4k (change 47): past 16k, where the default
    # was the staggered unpaired kernel, against the oracle — an odd number of 192-row tiles (87 at
    # 16700: the last pair's second tile empty), row and key tails, and Sq < Sk (the longer decides)
    cfg = select_config(_problem(head_dim=64, head_dim_v=64, causal=False, seqlen_q=seqlen_q, seqlen_k=seqlen_k))
    assert cfg.kv_multicast and cfg.producer_unsynced and not cfg.stagger_kv
    _gate(batch=1, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=2, heads_kv=2, head_dim=64,
          dtype=torch.bfloat16, causal=False)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_gqa_8_to_1(head_dim, causal):
    _gate(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=16, heads_kv=2, head_dim=head_dim,
          dtype=torch.bfloat16, causal=causal)


def _d128_inputs(batch, heads_q, heads_kv, seqlen=1000):
    torch.manual_seed(0)
    q = torch.randn(batch, seqlen, heads_q, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, heads_kv, 128, device="cuda", dtype=torch.bfloat16)
    return q, k, torch.randn_like(k)


def _assert_reruns_identical(q, k, v, causal, cfg=None):
    # a moving result is a race
    out1, lse1 = fwd.forward(q, k, v, causal, 128 ** -0.5, cfg)
    out2, lse2 = fwd.forward(q, k, v, causal, 128 ** -0.5, cfg)
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2)


def _assert_forced_reruns_identical(head_dim, causal, seqlen, **changes):
    """Three pairs of identical runs, bit for bit, of the problem's default configuration at
    ``seqlen`` with ``changes`` forced, on seeded bf16 inputs of two batches and eight heads."""
    q, k, v = _seeded_qkv(2, seqlen, 8, head_dim)
    cfg = replace_following(fwd.default_config(head_dim, causal, seqlen), head_dim, **changes)
    for _ in range(3):
        _assert_reruns_identical(q, k, v, causal, cfg)


@pytest.mark.gpu
@on_hopper
def test_deterministic():
    _assert_reruns_identical(*_d128_inputs(2, 8, 2), True)


@pytest.mark.gpu
@on_hopper
def test_short_non_causal_d64_is_deterministic():
    # d64 non-causal up to S1024 runs the 128-row tile with two Q buffers per consumer: the
    # producer refills one Q buffer while the other is read, a reuse a race would show in
    q, k, v = _seeded_qkv(4, 1000, 8, 64)
    cfg = select_config(_problem(head_dim=64, head_dim_v=64, causal=False, seqlen_q=1000, seqlen_k=1000))
    assert (cfg.block_m, cfg.num_q_stages, cfg.fast_divide_consumers) == (128, 2, True)
    for _ in range(3):
        out1, lse1 = fwd.forward(q, k, v, False, 64 ** -0.5)
        out2, lse2 = fwd.forward(q, k, v, False, 64 ** -0.5)
        assert torch.equal(out1, out2) and torch.equal(lse1, lse2)


# Split-tail shapes (132 SMs, one CTA each): every tile a tail tile, 2 splits (B2 H3 S1000 at
# d128: 48 tiles); full rounds and a tail (B3 H12 S1000 at d128: 264 + 24 × 5); Sq ≠ Sk with
# key tails (333 × 4097: 11 splits of 33 K/V tiles); one K/V tile, so no split (4097 × 17); GQA.
SPLIT_TAIL_SHAPES = [
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=3, heads_kv=3),
    dict(batch=3, seqlen_q=1000, seqlen_k=1000, heads_q=12, heads_kv=4),
    dict(batch=2, seqlen_q=333, seqlen_k=4097, heads_q=2, heads_kv=1),
    dict(batch=2, seqlen_q=4097, seqlen_k=17, heads_q=2, heads_kv=2),
    dict(batch=1, seqlen_q=1, seqlen_k=4097, heads_q=4, heads_kv=4),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("shape", SPLIT_TAIL_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_split_tail(head_dim, shape, persistent):
    cfg = dataclasses.replace(fwd.default_config(head_dim, False), split_tail=True, persistent=persistent)
    _gate_config(cfg, head_dim, False, shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", SPLIT_TAIL_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_split_tail_merge_loads_first(head_dim, shape):
    # both merges behind the split tail: the gate for each, and the same output and LSE to rounding
    # (compiled, their sums run over differently laid out blocks: on the H200 four of these shapes
    # differed in the last bits)
    cfg = dataclasses.replace(_shape_default(head_dim, False, shape), split_tail=True, merge_loads_first=False)
    _gate_config(cfg, head_dim, False, shape)
    _gate_config(dataclasses.replace(cfg, merge_loads_first=True), head_dim, False, shape)
    torch.manual_seed(0)
    q = torch.randn(shape["batch"], shape["seqlen_q"], shape["heads_q"], head_dim, device="cuda",
                    dtype=torch.bfloat16)
    k, v = (torch.randn(shape["batch"], shape["seqlen_k"], shape["heads_kv"], head_dim, device="cuda",
                        dtype=torch.bfloat16) for _ in range(2))
    base = fwd.forward(q, k, v, False, head_dim ** -0.5, cfg)
    first = fwd.forward(q, k, v, False, head_dim ** -0.5, dataclasses.replace(cfg, merge_loads_first=True))
    torch.testing.assert_close(first[0], base[0], atol=2e-3, rtol=0)
    torch.testing.assert_close(first[1], base[1], atol=1e-5, rtol=1e-6)


@pytest.mark.gpu
@on_hopper
def test_merge_loads_first_at_the_suites_split_is_deterministic():
    # d128 non-causal B2 H16 S16384 on 132 SMs: the last 4 tiles split 33 ways, one [64, 64] load a
    # program — past SPLITS_PER_LOAD, so its sums group differently from the default merge's (close,
    # not bit-equal), and a rerun is bit-identical
    from flashrung.kernels.hopper.tail_combine import SPLITS_PER_LOAD

    q, k, v = _seeded_qkv(2, 16384, 16, 128)
    cfg = fwd.default_config(128, False, 16384)
    assert cfg.split_tail
    plan = fwd._plan(cfg, 2, 16384, 16384, 16, 16, 128, 2, False, True,
                     torch.cuda.get_device_properties(0).multi_processor_count)
    if plan.splits <= SPLITS_PER_LOAD:
        pytest.skip(f"this GPU splits the tail {plan.splits} ways, not past {SPLITS_PER_LOAD}")
    first = dataclasses.replace(cfg, merge_loads_first=True)
    _assert_reruns_identical(q, k, v, False, first)
    out, lse = fwd.forward(q, k, v, False, 128 ** -0.5, first)
    ref_out, ref_lse = fwd.forward(q, k, v, False, 128 ** -0.5, cfg)
    torch.testing.assert_close(out, ref_out, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-6)


# split_tail_rounds: the modeled count puts the split items in several rounds (96 tiles at d128 and
# d256 and 88 at d64 on 132 SMs: 384 and 264 items; d64 multicasts, 44 pairs of tiles in 132 items
# over 66 clusters), on the per-item grid and the persistent one
MULTI_ROUND_SPLIT_SHAPES = {128: dict(batch=1, seqlen_q=4096, seqlen_k=4096, heads_q=3, heads_kv=3),
                            256: dict(batch=1, seqlen_q=4096, seqlen_k=4096, heads_q=3, heads_kv=1),
                            64: dict(batch=1, seqlen_q=4096, seqlen_k=4096, heads_q=4, heads_kv=2)}


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_split_tail_over_several_rounds(head_dim, persistent):
    shape = MULTI_ROUND_SPLIT_SHAPES[head_dim]
    cfg = dataclasses.replace(_shape_default(head_dim, False, shape), split_tail=True, split_tail_rounds=True,
                              persistent=persistent, balanced=False)
    plan = fwd._plan(cfg, shape["batch"], shape["seqlen_q"], shape["seqlen_k"], shape["heads_q"], shape["heads_kv"],
                     head_dim, 2, False, True, torch.cuda.get_device_properties(0).multi_processor_count)
    # with K/V multicast (d64's default here) an item is a cluster's pair of tiles, and the rounds
    # are counted over clusters
    clusters = torch.cuda.get_device_properties(0).multi_processor_count // plan.cluster_ctas
    assert plan.num_items - plan.num_full_tiles > clusters
    _gate_config(cfg, head_dim, False, shape)


def _shape_default(head_dim, causal, shape):
    """The default configuration of a gate shape (its length picks the grid and short tiles)."""
    return fwd.default_config(head_dim, causal, max(shape["seqlen_q"], shape["seqlen_k"]))


def _gate_config(cfg, head_dim, causal, shape):
    """The gate, bf16, on ``cfg`` at one shape."""
    _gate(functools.partial(fwd.forward, config=cfg), head_dim=head_dim, dtype=torch.bfloat16, causal=causal, **shape)


def _gate_forced(head_dim, shape, causal, **changes):
    """The gate, bf16, on the problem's default configuration with ``changes`` forced."""
    cfg = replace_following(_shape_default(head_dim, causal, shape), head_dim, **changes)
    _gate_config(cfg, head_dim, causal, shape)


def _gate_forced_and_warp_rescaled(head_dim, shape, causal, **changes):
    """:func:`_gate_forced`, and at d128 again under the per-warp thresholded rescale (the long d128
    defaults' rescale), which a lever of the softmax's order must also leave exact."""
    _gate_forced(head_dim, shape, causal, **changes)
    if head_dim == 128:
        _gate_forced(128, shape, causal, rescale_threshold=8.0, rescale_by_warp=True, **changes)


# the persistent grid's split tail, forced on (the stride: the balanced lists take whole tiles)
SPLIT_GRID = dict(split_tail=True, persistent=True, balanced=False)


def _gate_forced_both_grids(head_dim, shape, **changes):
    """:func:`_gate_forced`, non-causal, on the stride grid and again with the split tail."""
    _gate_forced(head_dim, shape, False, **changes)
    _gate_forced(head_dim, shape, False, **changes, **SPLIT_GRID)


# staggered K/V sweeps start mid-row: tails and causal diagonals must stay last and masked,
# split-tail items rotate inside their own key range, GQA heads share the offsets of their tile
STAGGER_SHAPES = [
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2),
    dict(batch=1, seqlen_q=4097, seqlen_k=1000, heads_q=4, heads_kv=4),
    dict(batch=1, seqlen_q=300, seqlen_k=4097, heads_q=8, heads_kv=1),
    dict(batch=1, seqlen_q=17, seqlen_k=17, heads_q=2, heads_kv=2),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_stagger_kv(head_dim, shape, causal):
    # both wraps of the sweep: the modulo and the compare and subtract (stagger_subtract)
    for subtract in (False, True):
        _gate_forced(head_dim, shape, causal, stagger_kv=True, stagger_subtract=subtract)
        if not causal:
            _gate_forced(head_dim, shape, False, stagger_kv=True, stagger_subtract=subtract, **SPLIT_GRID)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("seqlen", [4096, 3968, 3900])
def test_balanced_partial_tiles_changes_no_output(seqlen):
    # the partial-tile estimate only re-deals the same tiles among the CTAs, and a tile's result
    # does not depend on which CTA runs it or when: the outputs must agree bit for bit, at a last
    # tile of one (S4096: 64 rows) and of two (S3968: 128 rows) consumer warpgroups' rows, and at a
    # ragged one (S3900: 60 rows, a key tail)
    q, k, v = _seeded_qkv(8, seqlen, 8, 64)
    cfg = fwd.default_config(64, True, seqlen)
    assert cfg.balanced and cfg.balanced_partial_tiles
    out, lse = fwd.forward(q, k, v, True, 0.125, cfg)
    out_whole, lse_whole = fwd.forward(q, k, v, True, 0.125, dataclasses.replace(cfg, balanced_partial_tiles=False))
    assert torch.equal(out, out_whole) and torch.equal(lse, lse_whole)
    # the two lists of this shape without a run-time pool (another test may have built this shape's
    # lists with one, under the same process)
    tables = [t for key, t in fwd._SCHEDULE_TABLES.items()
              if key.seqlen_q == seqlen and key.batch_heads == 8 * 8 and key.block_m == cfg.block_m
              and key.pool_share == 0.0]
    assert len(tables) == 2 and not torch.equal(tables[0], tables[1]), "the two estimates dealt the same lists"


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("kind", ["dynamic", "pool", "dynamic-ahead", "dynamic-barrier", "pool-barrier"])
@pytest.mark.parametrize("head_dim, batch, seqlen", [(64, 8, 4096), (64, 2, 3900), (128, 4, 4096), (128, 1, 1003)])
def test_dynamic_tiles_changes_no_output(head_dim, batch, seqlen, kind):
    # a tile's result does not depend on which CTA runs it or when: handed out at run time, every
    # tile must come out bit for bit as the balanced lists computed it, every launch (a counter
    # left off zero, or a tile drawn twice or never, would move or poison rows), and the launch
    # must leave its stream's counters at zero for the next
    q, k, v = _seeded_qkv(batch, seqlen, 8, head_dim)
    cfg = fwd.default_config(head_dim, True, seqlen)
    # the pool at a tenth of the work, so that these small grids draw from it
    # (dynamic-ahead: each next tile drawn two K/V tiles before the current one's last load)
    # (-barrier: each item on a barrier of its own, handout_barrier)
    changes = {"dynamic": DYNAMIC_TILES, "pool": {"dynamic_pool_share": 0.1},
               "dynamic-ahead": {**DYNAMIC_TILES, "draw_ahead_steps": 2},
               "dynamic-barrier": {**DYNAMIC_TILES, "handout_barrier": True},
               "pool-barrier": {"dynamic_pool_share": 0.1, "handout_barrier": True}}[kind]
    dynamic = dataclasses.replace(cfg, **changes)
    out, lse = fwd.forward(q, k, v, True, 0.125, cfg)
    for _ in range(3):
        out_dyn, lse_dyn = fwd.forward(q, k, v, True, 0.125, dynamic)
        assert torch.equal(out, out_dyn) and torch.equal(lse, lse_dyn)
    counters = fwd.handout_counters(q.device.index)
    torch.cuda.synchronize()
    assert counters.tolist() == [0, 0]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_dynamic_tiles(head_dim, shape, causal):
    # tails, Sq != Sk, GQA, one tile in all (S17), more CTAs than tiles; the pool after the lists
    # at a third of the work (one tile alone stays listed)
    _gate_forced(head_dim, shape, causal, persistent=True, split_tail=False, **DYNAMIC_TILES)
    _gate_forced(head_dim, shape, causal, persistent=True, split_tail=False, balanced=True, dynamic_pool_share=0.3,
                 overlap_epilogue=False)
    # each next tile drawn ahead, by more tiles than the short items have (drawn after their first
    # tile's loads) and the long ones' (inside their loop); each item on a barrier of its own
    # (handout_barrier), drawn ahead, and after the lists
    _gate_forced(head_dim, shape, causal, persistent=True, split_tail=False, draw_ahead_steps=8, **DYNAMIC_TILES)
    _gate_forced(head_dim, shape, causal, persistent=True, split_tail=False, draw_ahead_steps=2,
                 handout_barrier=True, **DYNAMIC_TILES)
    _gate_forced(head_dim, shape, causal, persistent=True, split_tail=False, balanced=True, dynamic_pool_share=0.3,
                 overlap_epilogue=False, handout_barrier=True)


@pytest.mark.gpu
@on_hopper
def test_dynamic_tiles_two_streams_at_once():
    # two launches that may overlap, in two streams: each stream draws from its own counters (a
    # shared pair would hand one launch's tiles to the other's CTAs, and their rows would be
    # missing or wrong)
    q, k, v = _seeded_qkv(4, 4096, 16, 128)
    q2, k2, v2 = (t.flip(0).contiguous() for t in (q, k, v))
    dynamic = dataclasses.replace(fwd.default_config(128, True, 4096), **DYNAMIC_TILES)
    want, want_lse = fwd.forward(q, k, v, True, 0.125, dynamic)
    want2, want2_lse = fwd.forward(q2, k2, v2, True, 0.125, dynamic)
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    for _ in range(3):
        with torch.cuda.stream(streams[0]):
            out, lse = fwd.forward(q, k, v, True, 0.125, dynamic)
        with torch.cuda.stream(streams[1]):
            out2, lse2 = fwd.forward(q2, k2, v2, True, 0.125, dynamic)
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
        assert torch.equal(out2, want2) and torch.equal(lse2, want2_lse)


@pytest.mark.gpu
@on_hopper
def test_dynamic_tiles_replays_in_a_cuda_graph():
    # a capture records its own zeroed counters; every replay, and the eager calls around them,
    # compute the eager result
    q, k, v = _seeded_qkv(2, 2048, 8, 128)
    dynamic = dataclasses.replace(fwd.default_config(128, True, 2048), **DYNAMIC_TILES)
    out_eager, lse_eager = fwd.forward(q, k, v, True, 0.125, dynamic)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out, lse = fwd.forward(q, k, v, True, 0.125, dynamic)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, out_eager) and torch.equal(lse, lse_eager)
        again, _ = fwd.forward(q, k, v, True, 0.125, dynamic)
        assert torch.equal(again, out_eager)


def test_a_packed_capture_refuses_the_table_naming_the_switch(monkeypatch):
    # the table of a pack's tiles is built from its lengths on the host: a capture, which replays
    # whatever lengths cu_seqlens holds then, is refused with the switch that draws on the GPU
    from flashrung import gate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    cu = (gate.cu_seqlens((300, 5), "cpu"), gate.cu_seqlens((300, 5), "cpu"))
    args = (8, 3, 16, True, 128, 128, True, 10, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="handout_table=False .*hopper.fwd@handout_table=false"):
        fwd._packed_schedule_table(cu, *args, handout_items=96)
    with pytest.raises(RuntimeError, match="balanced table .* balanced=False"):
        fwd._packed_schedule_table(cu, *args)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_a_pack_drawn_on_the_gpu_replays_in_a_cuda_graph_with_other_lengths(causal):
    # the capture README offers for packs: impl="hopper.fwd@handout_table=false" draws every tile
    # of the grid at run time and reads each sequence's lengths on the GPU, so a replay after
    # cu_seqlens changed in place (same total rows, same longest) computes the new pack
    import flashrung

    torch.manual_seed(0)
    impl = "hopper.fwd@handout_table=false"
    q, k, v = (torch.randn(1500, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 1000, 1300, 1500], dtype=torch.int32, device="cuda")
    call = lambda: flashrung.attention_varlen(q, k, v, cu, cu, 1000, 1000, causal=causal, impl=impl)  # noqa: E731
    call()                                  # read cu_seqlens (and build the tensor maps) before the capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = call()
    torch.cuda.current_stream().wait_stream(stream)
    for lengths in ((1000, 300, 200), (17, 1000, 483), (500, 500, 500)):
        cu.copy_(torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32))
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, call()), lengths


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_stagger_subtract_changes_no_output(causal):
    # the same tiles in the same order: the two wraps must agree bit for bit (the default wraps
    # by compare and subtract since change 41), at a key tail and a partial last m-tile. Non-causal
    # d64 pairs its CTAs from S2048 (change 50), unstaggered, so its staggered sweep is forced: the
    # unpaired S3073 kernel from before that change, field for field
    seqlen = 4097 if causal else 3073
    q, k, v = _seeded_qkv(1, seqlen, 8, 64)
    cfg = (fwd.default_config(64, True, seqlen) if causal else
           replace_following(fwd.default_config(64, False, seqlen), 64, kv_multicast=False, asm_arrivals=False,
                             stagger_kv=True, stagger_subtract=True))
    assert cfg.stagger_kv and cfg.stagger_subtract and not cfg.kv_multicast
    out, lse = fwd.forward(q, k, v, causal, 0.125, cfg)
    out_mod, lse_mod = fwd.forward(q, k, v, causal, 0.125, dataclasses.replace(cfg, stagger_subtract=False))
    assert torch.equal(out, out_mod) and torch.equal(lse, lse_mod)


def test_stagger_subtract_takes_the_division_out_of_the_producers_loop(census):
    # the staggered sweep's wrap: a run-time modulo is a division at every producer step (one
    # MUFU.RCP beside I2F.RP and F2I); compare and subtract has none, and the consumers' K/V loops
    # (whose first tile takes the same wrap, outside them) stay within an instruction or two
    plain, subtract = census["d64-full-stagger-modulo"], census["d64-full"]
    steady = lambda entry: [loop for loop in entry["producer_loops"] if loop["utmaldg"] == 2]
    assert steady(plain) and all(loop["rcp"] == 1 for loop in steady(plain))
    assert steady(subtract) and all(loop["rcp"] == 0 for loop in steady(subtract))
    assert max(loop["length"] for loop in steady(subtract)) < min(loop["length"] for loop in steady(plain))
    pairs = list(zip(_steady_steps(subtract), _steady_steps(plain), strict=True))
    assert all(abs(a["length"] - b["length"]) <= 2 and a["mufu"] == b["mufu"] for a, b in pairs)




# K/V multicast across clusters of two CTAs: a single row (one pair, its second CTA past the last
# row), sub-tile and odd q-tile counts (a pair's second tile empty), key tails (the peer's half
# past the end, zero-filled), Sq != Sk both ways, GQA and MQA; each on the stride grid and with the
# split tail forced (each CTA's tile gets its own partials)
MULTICAST_SHAPES = [
    dict(batch=1, seqlen_q=1, seqlen_k=1, heads_q=2, heads_kv=2),
    dict(batch=2, seqlen_q=17, seqlen_k=17, heads_q=4, heads_kv=4),
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2),
    dict(batch=1, seqlen_q=4097, seqlen_k=1000, heads_q=4, heads_kv=4),
    dict(batch=1, seqlen_q=300, seqlen_k=4097, heads_q=8, heads_kv=1),
]
_MULTICAST = dict(kv_multicast=True, asm_arrivals=True, stagger_kv=False)


# the pairing's bit-identity checks: Sq != Sk, an odd q-tile count, a key tail, GQA
BIT_CHECK_SHAPE = dict(batch=2, seqlen_q=2000, seqlen_k=3001, heads_q=4, heads_kv=2)


def _bit_check_inputs(head_dim, seed):
    """Seeded bf16 q, k, v of BIT_CHECK_SHAPE on the GPU."""
    s = BIT_CHECK_SHAPE
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(s["batch"], s["seqlen_q"], s["heads_q"], head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(s["batch"], s["seqlen_k"], s["heads_kv"], head_dim, device="cuda", dtype=torch.bfloat16,
                    generator=g)
    v = torch.randn(s["batch"], s["seqlen_k"], s["heads_kv"], head_dim, device="cuda", dtype=torch.bfloat16,
                    generator=g)
    return q, k, v


def _unpaired_base(head_dim):
    """BIT_CHECK_SHAPE's default as multicast needs it around the pairing: no stagger, inline arrivals."""
    return replace_following(_shape_default(head_dim, False, BIT_CHECK_SHAPE), head_dim, stagger_kv=False,
                             asm_arrivals=True)


# the ways of running a pair: Gluon's producer waits and Q copies or inline ones
# (producer_unsynced), the consumers' own remote releases or the producers' relay (relay_release)
# (the unsynced producer with one Q buffer and the decode by division: check() refuses it beside the
# short shapes' two Q buffers and multiply-high decode, not run clean with them on the H200)
_UNSYNCED = dict(producer_unsynced=True, num_q_stages=1, fast_divide_producer=False, fast_divide_consumers=False)
PAIRED_WAYS = {"consumers-release": {}, "unsynced": _UNSYNCED,
               "relay": dict(relay_release=True), "unsynced-relay": dict(_UNSYNCED, relay_release=True)}


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("way", PAIRED_WAYS)
@pytest.mark.parametrize("shape", MULTICAST_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_kv_multicast(head_dim, shape, way):
    # each way on the stride grid and with the split tail: a pair whose second tile is empty, key
    # tails, Sq != Sk, GQA and MQA — both CTAs must make every copy, release and relay, or one
    # waits for ever
    _gate_forced_both_grids(head_dim, shape, **_MULTICAST, **PAIRED_WAYS[way])


# pairs across heads (cross_head_pairs): odd q-tile counts a head with an even and an odd launch
# total (the last pair's second tile past the end), one q-tile a head (every pair across two
# heads), GQA where the two heads of a pair share a K/V head and where they do not
CROSS_HEAD_SHAPES = MULTICAST_SHAPES + [
    dict(batch=1, seqlen_q=500, seqlen_k=500, heads_q=3, heads_kv=3),
    dict(batch=3, seqlen_q=17, seqlen_k=1000, heads_q=1, heads_kv=1),
    dict(batch=2, seqlen_q=2000, seqlen_k=3001, heads_q=6, heads_kv=3),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", CROSS_HEAD_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_cross_head_pairs(head_dim, shape):
    # a pair across two heads loads its own K/V in each CTA while the ring's barriers still count
    # both CTAs: every tile is computed once, on the stride grid and with the split tail
    _gate_forced_both_grids(head_dim, shape, **_MULTICAST, **_UNSYNCED, cross_head_pairs=True)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_cross_head_pairs_match_the_pairs_within_a_head(head_dim):
    # the same tiles with the same K/V in the same order, only paired otherwise: every bit agrees
    # with the pairs within a head, run after run (BIT_CHECK_SHAPE: an odd q-tile count a head)
    mc = dataclasses.replace(_unpaired_base(head_dim), kv_multicast=True, producer_unsynced=True)
    _assert_same_bits_every_run(mc, dataclasses.replace(mc, cross_head_pairs=True), head_dim, seed=17)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("cross", [False, True], ids=["within-a-head", "across-heads"])
@pytest.mark.parametrize("shape", CROSS_HEAD_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gate_meet_before_pass(head_dim, shape, cross):
    # the passing warpgroup's warps meet before each turn's pass (meet_before_pass), so a launch
    # with a pair past the sequence keeps skip_empty_rows (fwd._skip_empty_rows): every CTA-tile
    # past the rows passes its K/V tiles, with either pairing, on the stride grid and the split tail
    # (test_meet_before_pass_keeps_the_skip_where_the_rule_drops_it checks the build's switch on the CPU)
    meet = replace_following(fwd.default_config(head_dim, False, 4096), head_dim, meet_before_pass=True,
                             cross_head_pairs=cross)
    assert fwd._skip_empty_rows(meet, 1, 1)
    _gate_forced_both_grids(head_dim, shape, **_MULTICAST, **_UNSYNCED, meet_before_pass=True,
                            cross_head_pairs=cross)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", [64, 128])
def test_meet_before_pass_matches_the_build_without_the_skip(head_dim):
    # skipping the empty rows changes no visible bit: the pairs past the sequence (BIT_CHECK_SHAPE
    # has an odd q-tile count a head) give what change 48's build without the skip gives, run after run
    mc = dataclasses.replace(_unpaired_base(head_dim), kv_multicast=True, producer_unsynced=True)
    _assert_same_bits_every_run(mc, dataclasses.replace(mc, meet_before_pass=True), head_dim, seed=23)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", MULTICAST_SHAPES[1:], ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_producer_warpgroup(head_dim, shape):
    # the four-warp producer alone (kv_multicast's, without the pairing), both masks
    for causal in (False, True):
        _gate_forced(head_dim, shape, causal, producer_warpgroup=True, kv_multicast=False)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_relay_release_matches_the_multicast_kernel(head_dim):
    # the same loads into the same slots in the same order, released another way: every bit agrees
    # with the consumers' own remote releases, run after run (a slot refilled before the peer's
    # consumers left it would move them)
    mc = dataclasses.replace(_unpaired_base(head_dim), kv_multicast=True, producer_unsynced=True)
    _assert_same_bits_every_run(mc, dataclasses.replace(mc, relay_release=True), head_dim, seed=13)


# d128 non-causal from 6144 to 8191 runs FA3's order with the mbarrier token, paired, with the
# producer's waits in inline PTX (change 45): the shapes above reach it only when forced, so its
# default is gated at lengths of its own — square, a key tail with GQA, Sq != Sk at the rule's end
UNSYNCED_MBARRIER_TOKEN_SHAPES = [
    dict(batch=1, seqlen_q=6144, seqlen_k=6144, heads_q=2, heads_kv=2),
    dict(batch=1, seqlen_q=300, seqlen_k=7001, heads_q=4, heads_kv=1),
    dict(batch=1, seqlen_q=8191, seqlen_k=1000, heads_q=2, heads_kv=2),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", UNSYNCED_MBARRIER_TOKEN_SHAPES, ids=_shape_id)
def test_gate_paired_default_on_the_mbarrier_token(shape):
    # the online step's default (a call's under the frozen step's work threshold, as these are): the
    # suite-sized default here is the frozen step in FA4's order (change 57)
    cfg = fwd.default_config(128, False, max(shape["seqlen_q"], shape["seqlen_k"]), frozen_step=False)
    assert cfg.kv_multicast and cfg.producer_unsynced and not cfg.named_turns and not cfg.wait_pv_early
    assert not cfg.freeze_row_max
    _gate_config(cfg, 128, False, shape)
    # and the configuration hopper.fwd selects for the problem itself (GQA, Sq != Sk) when given none
    _gate(head_dim=128, dtype=torch.bfloat16, causal=False, **shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_producer_unsynced_matches_the_multicast_kernel(head_dim):
    # the same loads into the same slots in the same order, without the producer's bar.syncs:
    # every bit agrees with Gluon's producer, run after run (a Q box landing at the wrong offset,
    # or a slot refilled early, would move them)
    mc = dataclasses.replace(_unpaired_base(head_dim), kv_multicast=True)
    _assert_same_bits_every_run(mc, dataclasses.replace(mc, producer_unsynced=True), head_dim, seed=11)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", MULTICAST_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_producer_wait_hint(head_dim, shape):
    # a producer asleep in its waits must still wake for every slot and Q buffer of both CTAs, or a
    # pair waits for ever: on the stride grid and with the split tail, with and without the relay
    for relay in (False, True):
        _gate_forced_both_grids(head_dim, shape, **_MULTICAST, **_UNSYNCED, relay_release=relay,
                                producer_wait_hint_ns=10_000_000)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_producer_wait_hint_changes_no_bit(head_dim):
    # the same loads into the same slots in the same order, only how the producer waits changed
    mc = dataclasses.replace(_unpaired_base(head_dim), kv_multicast=True, producer_unsynced=True)
    _assert_same_bits_every_run(mc, dataclasses.replace(mc, producer_wait_hint_ns=10_000_000), head_dim, seed=13)


def _assert_same_bits_every_run(ref_cfg, cfg, head_dim, seed):
    """``cfg``'s output and LSE equal ``ref_cfg``'s bit for bit, on two runs of BIT_CHECK_SHAPE's inputs."""
    q, k, v = _bit_check_inputs(head_dim, seed=seed)
    ref, lse_ref = fwd.forward(q, k, v, False, head_dim ** -0.5, ref_cfg)
    for _ in range(2):
        out, lse = fwd.forward(q, k, v, False, head_dim ** -0.5, cfg)
        assert torch.equal(out, ref) and torch.equal(lse, lse_ref)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_kv_multicast_is_deterministic_and_matches_the_unicast_kernel(head_dim):
    # the same inputs twice give the same bits (a half landing late, or a slot refilled before
    # the peer released it, would move them), and against the kernel without multicast — the same
    # arithmetic on the same tiles in the same order — every bit agrees as well
    base = _unpaired_base(head_dim)
    cfg = dataclasses.replace(base, kv_multicast=True)
    q, k, v = _bit_check_inputs(head_dim, seed=7)
    out, lse = fwd.forward(q, k, v, False, head_dim ** -0.5, cfg)
    again, lse_again = fwd.forward(q, k, v, False, head_dim ** -0.5, cfg)
    assert torch.equal(out, again) and torch.equal(lse, lse_again)
    ref, lse_ref = fwd.forward(q, k, v, False, head_dim ** -0.5, base)
    assert torch.equal(out, ref) and torch.equal(lse, lse_ref)


@pytest.mark.gpu
@on_hopper
def test_kv_multicast_refuses_causal_and_fits_the_gpu():
    # causal pairs would need different key ranges: refused, naming the switch; and the GPU holds
    # the persistent grid's clusters at once (a second wave would double the run time)
    cfg = dataclasses.replace(fwd.default_config(128, False, 16384), kv_multicast=True, split_tail=False)
    q = torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kv_multicast"):
        fwd.forward(q, q, q, True, 0.1, cfg)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert fwd.cluster_occupancy(cfg, 128, torch.bfloat16) >= sms // 2


# V(j) loaded after K(j+1): the last V of every item comes after its loop, a single-tile item
# (S=17) loads its one V there, and split-tail items and staggered sweeps lag inside their own range
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES[1:], ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_lag_v_loads(head_dim, shape, causal):
    _gate_forced(head_dim, shape, causal, lag_v_loads=True)
    if not causal and head_dim != 256:
        _gate_forced(head_dim, shape, False, lag_v_loads=True, stagger_kv=True, **SPLIT_GRID)


# K released with V, after PV(j-1): every head dim and mask, one stage and two, with the lagged V
# loads, at the shapes whose last tiles are partial
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES[1:3], ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_late_k_release(head_dim, shape, causal):
    _gate_forced(head_dim, shape, causal, late_k_release=True)
    _gate_forced(head_dim, shape, causal, late_k_release=True, num_kv_stages=1, lag_v_loads=True)


# the running sum on the tensor pipe: every head dim and mask, at partial tiles, GQA, S=17 (an
# empty consumer warpgroup, a single K/V tile) and on the split tail
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_row_sum_by_mma(head_dim, shape, causal):
    changes = dict(ROW_SUM_BY_MMA)
    if _shape_default(head_dim, causal, shape).num_q_stages == 2 and head_dim == 128:
        # d128's two Q buffers leave no room for the ones (HopperFwdConfig.check: 234,640 bytes)
        changes["num_q_stages"] = 1
    _gate_forced(head_dim, shape, causal, **changes)
    if not causal and head_dim != 256:
        _gate_forced(head_dim, shape, False, **changes, **SPLIT_GRID)


def test_row_sum_by_mma_counts_its_ones_against_the_budget():
    # each consumer's [8, block_n] tile of ones is shared memory the check must count: d128's
    # two-Q-buffer kernel (S <= 2k-4k) is 2,192 bytes short with them, d64's 192-row tile keeps room
    d128_two_q = fwd.default_config(128, True, 2048)
    assert d128_two_q.num_q_stages == 2
    with pytest.raises(ValueError, match="shared memory"):
        dataclasses.replace(d128_two_q, freeze_row_max=False, **ROW_SUM_BY_MMA).check(128)
    d64 = replace_following(fwd.default_config(64, False), 64, **ROW_SUM_BY_MMA)
    d64.check(64)
    assert d64.smem_bytes(64, 2) - fwd.default_config(64, False).smem_bytes(64, 2) == 3 * 8 * 128 * 2
    with pytest.raises(ValueError, match="row_sum_by_mma"):
        dataclasses.replace(d64, defer_row_sum=True).check(64)


# the K/V releases without Gluon's partition bar.sync — every consumer thread arriving for itself
# (thread_release), or the elected arrivals in inline PTX (asm_arrivals) — at every head dim and
# mask, at shapes with partial last tiles and empty consumer warpgroups (S=17), with K released
# late on a one-slot ring (each release then gates the very next load), and on the split tail;
# the inline arrivals also with the pingpong token's mode flipped (the turn's arrival is then the
# inline one, or absent)
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES[1:], ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("release", ["thread_release", "asm_arrivals", "asm_arrivals+asm_waits",
                                     "asm_arrivals+asm_waits+hoist_smem_base"])
def test_gate_release_without_bar_sync(release, head_dim, shape, causal):
    switches = dict.fromkeys(release.split("+"), True)
    if release == "thread_release":
        # the two releases refuse to combine, and the defaults take the inline arrivals where they
        # paid (d128 causal from S2k, d128 non-causal S4k-S8k)
        switches["asm_arrivals"] = False
    _gate_forced(head_dim, shape, causal, **switches)
    _gate_forced(head_dim, shape, causal, **switches, late_k_release=True, num_kv_stages=1)
    if "asm_arrivals" in switches:
        _gate_forced(head_dim, shape, causal, **switches, named_turns=False,
                     pingpong=not _shape_default(head_dim, causal, shape).pingpong)
    if not causal and head_dim != 256:
        _gate_forced(head_dim, shape, False, **switches, **SPLIT_GRID)


# the exponentials' token ring (exp_turns) on d64's tiles — the 192-row tile's three consumers,
# the 128-row short tiles' two — at partial tiles, idle warpgroups (S=17: the empty ones walk the
# turns in _pass_tiles), GQA, and on the split tail; the causal 192-row tile keeps its row sum
# whole for it (defer_row_sum off)
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES, ids=_shape_id)
def test_gate_exp_turns(shape, causal):
    _gate_forced(64, shape, causal, exp_turns=True, defer_row_sum=False)
    if not causal:
        _gate_forced(64, shape, False, exp_turns=True, **SPLIT_GRID)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("seqlen", [1024, 4097])
def test_exp_turns_is_deterministic(seqlen):
    # a token passed before a consumer's exponentials were done would only cost overlap, but one
    # passed twice, or never, would hang or let two rings drift: the output must not move
    _assert_forced_reruns_identical(64, False, seqlen, exp_turns=True)


# a quarter, a half or three quarters of each tile's exponentials ahead of PV's wait (early_exp_quarters)
# at every head dim in FA4's order (d128 with gate_pv_wait off), at partial tiles, idle warpgroups,
# GQA, and on the split tail
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_early_exps(head_dim, shape, causal):
    fa4 = dict(wait_pv_early=True, pingpong=True, gate_pv_wait=False)
    for quarters in ((1, 2, 3) if head_dim == 64 else (2,)):
        _gate_forced(head_dim, shape, causal, early_exp_quarters=quarters, **fa4)
    if not causal and head_dim == 64:
        _gate_forced(64, shape, False, early_exp_quarters=1, **fa4, **SPLIT_GRID)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_early_exps_are_deterministic(causal):
    _assert_forced_reruns_identical(64, causal, 4097, early_exp_quarters=1)


# one exponential in sixteen on the FMA pipe (exp2_fma_every=16) on each shape's own default, both
# masks, d64 and d128, with the split tail on d64's non-causal grid
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gate_exp2_split16(head_dim, shape, causal):
    _gate_forced(head_dim, shape, causal, exp2_fma_every=16)
    if not causal and head_dim == 64:
        _gate_forced(64, shape, False, exp2_fma_every=16, **SPLIT_GRID)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_exp2_split16_is_deterministic(causal):
    _assert_forced_reruns_identical(64, causal, 4097, exp2_fma_every=16)


# the row max frozen after an item's first tile (freeze_row_max) in FA4's order at every head
# dim, both masks, the stagger shapes (partial tiles, key tails, GQA, Sq != Sk), d64's
# split tail and d128 under the per-warp thresholded rescale: exact on the gate's inputs, whose
# later scores never leave fp32's range above the first tile's max
FREEZE_ROW_MAX = dict(freeze_row_max=True, wait_pv_early=True, pingpong=True, late_rescale=False,
                      single_kv_loop=False)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_freeze_row_max(head_dim, shape, causal):
    _gate_forced_and_warp_rescaled(head_dim, shape, causal, **FREEZE_ROW_MAX)
    if not causal and head_dim == 64:
        _gate_forced(64, shape, False, **FREEZE_ROW_MAX, **SPLIT_GRID)


# the frozen defaults whose companions changes 56-59 brought (config.FREEZE_ROW_MAX_BRINGS): FA4's
# order at d128 non-causal S2048 and S3072 (change 59: two Q buffers, then one), S4096 (FA3's
# named turns' range) and S6144, PV's wait ungated from S16384, d64 causal S2048 on the 192-row
# tile (change 60; the two K/V loops there since change 58) and S3072 (frozen since change 58); the
# non-causal lengths from S1024 (change 61): d64's short 128-row tile and its 192-row tile below
# S2048, d128 in FA4's order below S2048; d64 non-causal's turn on named barriers (change 62) on
# those two and S16384's pair, S2048's pair on mbarriers; from S512 (change 64) the short tile's
# configuration, S1024's, named at its own length; and four the list had missed, found when the
# sanitizer probe counted every default (ws_probe.default_schedules): d64 causal from S4.6k on one Q
# buffer (S8192), d128 non-causal S8192 (PV's wait still gated there), d128 causal's balanced
# lists with two Q buffers (S2048) and with each warp's rescale (S16384) —
# test_frozen_defaults_list_reaches_every_frozen_default keeps the list whole
FROZEN_DEFAULTS = [(128, False, 2048), (128, False, 3072), (128, False, 4096), (128, False, 6144), (128, False, 16384),
                   (64, True, 2048), (64, True, 3072), (64, False, 1024), (64, False, 1536), (128, False, 1024),
                   (64, False, 512), (64, False, 2048), (64, False, 16384),
                   (64, True, 8192), (128, False, 8192), (128, True, 2048), (128, True, 16384)]


def test_frozen_defaults_list_reaches_every_frozen_default():
    # the GPU gate of the frozen defaults as they run claims every one of them: a frozen default a
    # rule adds at some length must join FROZEN_DEFAULTS, or it reaches users gated only through
    # the switches it is made of
    from flashrung.evidence import ws_probe

    for dtype, lengths in ((torch.bfloat16, FROZEN_DEFAULTS), (torch.float16, FROZEN_FP16_DEFAULTS)):
        listed = {(d, c, fwd.default_config(d, c, s, dtype=dtype)) for d, c, s in lengths}
        assert all(cfg.freeze_row_max for _, _, cfg in listed), dtype
        for probed in ws_probe.default_schedules():
            cfg = ws_probe.schedule_config(probed, dtype)
            if cfg.freeze_row_max:
                assert (*probed[:2], cfg) in listed, (dtype, probed)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim, causal, seqlen", FROZEN_DEFAULTS, ids=lambda v: str(v))
def test_gate_frozen_defaults_with_what_they_bring(head_dim, causal, seqlen):
    # each default as it runs a suite-sized bf16 call, gated at the lever shapes (GQA, key tails,
    # Sq != Sk, one row), through the guard where later scores overflow its frozen reference (the
    # word trips, the recompute rewrites), and rerun bit for bit
    from flashrung.gate import check_forward_inputs

    cfg = fwd.default_config(head_dim, causal, seqlen)
    assert cfg.freeze_row_max
    for shape in LEVER_GATE_SHAPES:
        _gate_config(cfg, head_dim, causal, shape)
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    q, k, v = _rising_maxima_inputs(head_dim)
    result = check_forward_inputs(functools.partial(fwd.forward, config=cfg, _guard=word), q, k, v, causal)
    assert result.passed and word.item() == 1, str(result)
    for _ in range(2):
        _assert_reruns_identical(*_seeded_qkv(2, seqlen, 8, head_dim), causal, cfg)


def _schedule_id(schedule) -> str:
    """A test id of a ws_probe schedule: a dense default's or a feature configuration's."""
    if len(schedule) == 5:
        head_dim, causal, seqlen, key_tail, frozen = schedule
        return (f"d{head_dim}-{'causal' if causal else 'full'}-S{seqlen}{'-keytail' if key_tail else ''}-"
                f"{'frozen' if frozen else 'online'}")
    kind, head_dim, head_dim_v, causal, seqlen, packed, window, softcap, frozen = schedule
    dims = f"d{head_dim}" + (f"v{head_dim_v}" if head_dim_v != head_dim else "")
    extra = (f"-w{window[0]}_{window[1]}" if window != (-1, -1) else "") + (f"-cap{softcap:g}" if softcap else "")
    return (f"{kind}-{dims}-{'causal' if causal else 'full'}-S{seqlen}{'-packed' if packed else ''}{extra}-"
            f"{'frozen' if frozen else 'online'}")


def _probe_schedules(name):
    from flashrung.evidence import ws_probe

    return ws_probe.default_schedules() if name == "defaults" else ws_probe.feature_schedules()


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("schedule", _probe_schedules("defaults"), ids=_schedule_id)
def test_gate_every_default_configuration(schedule):
    # every distinct configuration a call can get (ws_probe.default_schedules: the one the sanitizer
    # probe forces), gated as it runs at the lever shapes (GQA, key tails, Sq != Sk, one row) — not
    # only through the switch tests of its parts
    from flashrung.evidence import ws_probe

    head_dim, causal = schedule[:2]
    cfg = ws_probe.schedule_config(schedule)
    for shape in LEVER_GATE_SHAPES:
        _gate(functools.partial(fwd.forward, config=cfg), head_dim=head_dim, dtype=torch.bfloat16, causal=causal,
              **shape)


# the packs every feature configuration with packed sequences is gated on: three sequences of the
# sanitizer probe's lengths, and one with Sq != Sk in each sequence and an empty one
FEATURE_GATE_PACKS = [((300, 129, 17), (300, 129, 17)), ((300, 129, 0, 17), (511, 129, 3, 17))]
FEATURE_GATE_SHAPES = [dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2),
                       dict(batch=1, seqlen_q=333, seqlen_k=4097, heads_q=2, heads_kv=2)]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("schedule", _probe_schedules("features"), ids=_schedule_id)
def test_gate_every_feature_configuration(schedule):
    # every configuration a packed, windowed, capped or MLA call selects (ws_probe.feature_schedules),
    # gated as it runs: packs sequence by sequence against references run on each alone, dense calls
    # at two odd shapes, each at the feature's own window and cap
    from flashrung import gate
    from flashrung.evidence import ws_probe

    _, head_dim, head_dim_v, causal, _, packed, window, softcap, _ = schedule
    cfg = ws_probe.schedule_config(schedule)
    forward = functools.partial(fwd.forward, config=cfg)
    if packed:
        for lens_q, lens_k in FEATURE_GATE_PACKS:
            case = gate.Case(len(lens_q), max(lens_q), max(lens_k), 8, 2, head_dim, torch.bfloat16, causal,
                             head_dim_v=head_dim_v, window_size=window, softcap=softcap, varlen=(lens_q, lens_k))
            result = gate.check_varlen(forward, None, case, "cuda", kernel=fwd.KERNEL_NAME)
            assert result.passed, str(result)
        return
    for shape in FEATURE_GATE_SHAPES:
        _gate(forward, head_dim=head_dim, head_dim_v=head_dim_v, dtype=torch.bfloat16, causal=causal,
              window_size=window, softcap=softcap, **shape)


# the frozen defaults as an fp16 call runs them (fp16_row_max_margin raising the online row max):
# d64's short 128-row tile (S512 and S1024), its pair with two Q buffers on mbarrier turns (S2048)
# and its 192-row tile paired across heads (S16384), d64 causal's two K/V loops on the 192-row tile
# (S2048), d128 in FA4's order (S2048) and its split tail with PV's wait ungated (S16384), d128
# causal's balanced lists (S16384); and, since the count of every default, the other eight frozen
# configurations, so that fp16 gates each as bf16 does (FROZEN_DEFAULTS' lengths, one per configuration)
FROZEN_FP16_DEFAULTS = [(64, False, 512), (64, False, 1024), (64, False, 2048), (64, False, 16384), (64, True, 2048),
                        (128, False, 2048), (128, False, 16384), (128, True, 16384),
                        (64, False, 1536), (64, True, 3072), (64, True, 8192), (128, False, 3072), (128, False, 4096),
                        (128, False, 6144), (128, False, 8192), (128, True, 2048)]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim, causal, seqlen", FROZEN_FP16_DEFAULTS, ids=lambda v: str(v))
def test_gate_frozen_defaults_in_fp16(head_dim, causal, seqlen):
    # the gate in fp16 at the lever shapes on each default, its guard clear on the gate's inputs
    # (what passes is the frozen steps' output, not the recompute's), reruns bit for bit
    cfg = fwd.default_config(head_dim, causal, seqlen, dtype=torch.float16)
    assert cfg.freeze_row_max and cfg.fp16_row_max_margin > 0
    for shape in LEVER_GATE_SHAPES:
        _gate(functools.partial(fwd.forward, config=cfg), head_dim=head_dim, dtype=torch.float16, causal=causal,
              **shape)
    q, k, v = (t.half() for t in _seeded_qkv(2, seqlen, 8, head_dim))
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    out, lse = fwd.forward(q, k, v, causal, head_dim ** -0.5, config=cfg, _guard=word)
    assert word.item() == 0 and torch.isfinite(lse).all() and torch.isfinite(out).all()
    for _ in range(2):
        _assert_reruns_identical(q, k, v, causal, cfg)


def _moderate_rise_inputs(head_dim, rise_log2, seqlen_q=1000, seqlen_k=4097, seed=0):
    """fp16 q, k, v whose rows all score near 0 on every key but two late ones (the middle and
    the third from last), which score ``rise_log2`` (log2 units) above the rest at the default
    scale: q's rows are one direction ``u`` and a little noise, those two keys ``u`` scaled."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(head_dim, generator=g)
    q = u + 0.05 * torch.randn(1, seqlen_q, 2, head_dim, generator=g)
    k = 0.1 * torch.randn(1, seqlen_k, 2, head_dim, generator=g)
    rise = rise_log2 * math.log(2.0) * head_dim ** 0.5
    for pos in (seqlen_k // 2, seqlen_k - 3):
        k[:, pos] = rise * u / u.dot(u)
    v = torch.randn(1, seqlen_k, 2, head_dim, generator=g)
    return [t.to("cuda", torch.float16) for t in (q, k, v)]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_fp16_margin_keeps_a_moderate_rise_off_the_guard(head_dim, causal):
    # property: fp16's frozen P overflows its 16-bit operand at a rise of 16 log2 units above the
    # reference; fp16_row_max_margin (8) moves that to 24. Two late keys 20 above every other score:
    # with the margin the guard stays clear and the frozen steps' own output passes the gate; with
    # no margin the same inputs trip it (the recompute keeps them exact) — the test's inputs reach
    # the range the margin buys, or it tests nothing
    from flashrung.gate import check_forward_inputs

    q, k, v = _moderate_rise_inputs(head_dim, 20.0)
    frozen = fwd.default_config(head_dim, causal, 4097, dtype=torch.float16)
    assert frozen.freeze_row_max
    for margin, trips in ((frozen.fp16_row_max_margin, 0), (0.0, 1)):
        cfg = dataclasses.replace(frozen, fp16_row_max_margin=margin)
        word = torch.zeros(1, dtype=torch.int32, device="cuda")
        result = check_forward_inputs(functools.partial(fwd.forward, config=cfg, _guard=word), q, k, v, causal)
        assert result.passed, (margin, str(result))
        assert word.item() == trips, margin


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_freeze_row_max_is_deterministic(causal):
    _assert_forced_reruns_identical(64, causal, 4097, freeze_row_max=True)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_freeze_row_max_guard_where_later_scores_overflow_the_frozen_reference(head_dim, causal, dtype):
    # rows whose later scores rise past the item's first reference by more than P's range — past
    # 2^128 at the spike keys; in fp16 past the 16-bit operand's 2^16 where the keys' scales rise
    # eight-fold — end with O or l non-finite, are flagged (NaN LSE, the guard word) and rewritten
    # by the online recompute: the gate passes on them and the word says the guard tripped. Also
    # across d64's split tail, whose flagged partials must reach the merged LSE as NaN
    from flashrung.gate import check_forward_inputs

    q, k, v = (t.to(dtype) for t in _rising_maxima_inputs(head_dim))
    grids = [{}, SPLIT_GRID] if not causal and head_dim == 64 else [{}]
    for grid in grids:
        cfg = replace_following(fwd.default_config(head_dim, causal, 4097), head_dim, **FREEZE_ROW_MAX, **grid)
        guard = torch.zeros(1, dtype=torch.int32, device="cuda")
        result = check_forward_inputs(functools.partial(fwd.forward, config=cfg, _guard=guard), q, k, v, causal)
        assert result.passed, (grid, str(result))
        assert guard.item() == 1, grid


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_streams_own_guard_word_is_left_clear_after_a_trip(head_dim):
    # property: without a caller's word each launch uses its stream's pair (fwd.guard_word), which
    # no launch zeroes on the host: a tripped launch's recompute must leave both words 0, or every
    # later call on the stream would walk every tile (or, worse, skip a trip it read as stale). A
    # trip, then Gaussians, then a trip again, each checked against the references, on two streams
    from flashrung.gate import check_forward_inputs

    rising = _rising_maxima_inputs(head_dim)
    gaussian = _seeded_qkv(1, 1000, 2, head_dim)
    cfg = replace_following(fwd.default_config(head_dim, False, 4097), head_dim, **FREEZE_ROW_MAX)
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    fwd.forward(*rising, False, head_dim ** -0.5, config=cfg, _guard=word)
    assert word.item() == 1, "the rising inputs no longer trip the guard: the test tests nothing"
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            for q, k, v in (rising, gaussian, rising):
                result = check_forward_inputs(functools.partial(fwd.forward, config=cfg), q, k, v, False)
                assert result.passed, str(result)
                assert fwd.guard_word(torch.cuda.current_device()).tolist() == [0, 0]
        torch.cuda.synchronize()


@pytest.mark.gpu
@on_hopper
def test_the_frozen_row_max_guard_word_belongs_to_it():
    # forward's _guard is the word freeze_row_max's guard sets: a config without it, or a word of
    # the wrong kind, is refused by name before anything launches
    q = torch.zeros(1, 256, 2, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="_guard is the word of freeze_row_max"):
        fwd.forward(q, q, q, False, 0.125, config=fwd.default_config(64, False, 256),
                    _guard=torch.zeros(1, dtype=torch.int32, device="cuda"))
    frozen = replace_following(fwd.default_config(64, False, 256), 64, **FREEZE_ROW_MAX)
    for word in (torch.zeros(2, dtype=torch.int32, device="cuda"), torch.zeros(1, dtype=torch.int64, device="cuda")):
        with pytest.raises(ValueError, match="_guard must be one int32 word"):
            fwd.forward(q, q, q, False, 0.125, config=frozen, _guard=word)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_freeze_row_max_guard_stays_clear_on_gaussian_inputs(causal):
    # the gate's own inputs never leave the frozen reference's range: no row is flagged, so what
    # test_gate_freeze_row_max passes is the frozen steps' output, not the recompute's
    q, k, v = _seeded_qkv(2, 4097, 8, 64)
    cfg = replace_following(fwd.default_config(64, causal, 4097), 64, **FREEZE_ROW_MAX)
    guard = torch.zeros(1, dtype=torch.int32, device="cuda")
    out, lse = fwd.forward(q, k, v, causal, 64 ** -0.5, config=cfg, _guard=guard)
    assert guard.item() == 0 and torch.isfinite(lse).all() and torch.isfinite(out).all()


# O's rescale in its own block right after PV(j-1)'s wait, ahead of the exponentials
# (rescale_before_exp), in FA4's order at every head dim and mask: with the deferred row sum at d64
# (its timed form) and under the per-warp thresholded rescale at d128 (the long d128 defaults')
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_rescale_before_exp(head_dim, shape, causal):
    fa4 = dict(rescale_before_exp=True, wait_pv_early=True, pingpong=True, late_rescale=False)
    _gate_forced_and_warp_rescaled(head_dim, shape, causal, **fa4)
    if head_dim == 64:
        _gate_forced(64, shape, causal, defer_row_sum=True, **fa4)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_rescale_before_exp_is_deterministic(causal):
    # O rescaled while PV(j-1) still accumulated into it would move the output between runs
    _assert_forced_reruns_identical(64, causal, 4097, rescale_before_exp=True, defer_row_sum=True)


# PV's wait behind its branch after the row max (gate_pv_wait), in FA4's order at every head dim
# and mask (d128 with named turns and with the mbarrier token), at the shapes with partial tiles,
# idle warpgroups and GQA above
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_pv_wait_after_the_row_max(head_dim, shape, causal):
    fa4 = dict(gate_pv_wait=True, wait_pv_early=True, pingpong=True)
    _gate_forced(head_dim, shape, causal, **fa4)
    if head_dim == 128:
        _gate_forced(head_dim, shape, causal, **fa4, named_turns=not _shape_default(128, causal, shape).named_turns)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_pv_wait_is_deterministic(head_dim):
    # the gated wait still waits: a PV read of P's registers overwritten by the next exponentials,
    # or O rescaled under a running PV, would move the output between identical runs
    _assert_forced_reruns_identical(head_dim, False, 4097, gate_pv_wait=True, wait_pv_early=True, pingpong=True)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_thread_release_is_deterministic(causal):
    cfg = dataclasses.replace(_d128_unpaired(causal), thread_release=True, asm_arrivals=False)
    _assert_reruns_identical(*_d128_inputs(2, 8, 2), causal, cfg)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("switches", ["asm_arrivals", "asm_arrivals+asm_waits", "asm_arrivals+hoist_smem_base",
                                      "asm_arrivals+asm_waits+hoist_smem_base"])
def test_asm_arrivals_is_deterministic(switches, causal, head_dim):
    # a slot released while a warp's part of the GEMM that reads it is still in flight would let
    # the producer overwrite K or V under it, and a wait that returned early would let a GEMM read
    # a slot the TMA is still filling: the output would move between identical runs
    _assert_forced_reruns_identical(head_dim, causal, 4097, **dict.fromkeys(switches.split("+"), True))


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 1), (17, 17), (1000, 777), (4097, 4097)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_four_max_chains_match_the_chain_bit_for_bit(head_dim, causal, seqlen_q, seqlen_k):
    """A maximum is exact in any order and the row sum stays a chain, so FA4's four running maxima
    give the default's outputs bit for bit (each shape's default kernel, the switch on); a score
    left out of a chain, or a chain read before it is complete, changes bits."""
    torch.manual_seed(0)
    q = torch.randn(2, seqlen_q, 6, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, seqlen_k, 2, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    base = select_config(_problem(head_dim=head_dim, head_dim_v=head_dim, causal=causal, seqlen_q=seqlen_q,
                                  seqlen_k=seqlen_k, heads_q=6, heads_kv=2))
    cfg = dataclasses.replace(base, four_max_chains=True, tree_reduce=False)
    a = fwd.forward(q, k, v, causal, head_dim ** -0.5, base)
    b = fwd.forward(q, k, v, causal, head_dim ** -0.5, cfg)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    _gate(functools.partial(fwd.forward, config=cfg), batch=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=6,
          heads_kv=2, head_dim=head_dim, dtype=torch.bfloat16, causal=causal)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_row_sum_by_mma_is_deterministic(causal):
    # each consumer writes its tile of ones, fences it for the tensor pipe and meets its warpgroup
    # before the first row-sum wgmma: a warp that read the tile early would move the sums
    q, k, v = _seeded_qkv(2, 4097, 8, 64)
    cfg = replace_following(fwd.default_config(64, causal, 4097), 64, **ROW_SUM_BY_MMA)
    out1, lse1 = fwd.forward(q, k, v, causal, 64 ** -0.5, cfg)
    for _ in range(2):
        out2, lse2 = fwd.forward(q, k, v, causal, 64 ** -0.5, cfg)
        assert torch.equal(out1, out2) and torch.equal(lse1, lse2)


# a 1 MiB LPT section puts every head (or GQA group) in its own section: the tile order changes
# for the stride and for the balanced lists, never what a tile computes
@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("balanced", [False, True])
@pytest.mark.parametrize("shape", STAGGER_SHAPES[:3], ids=_shape_id)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gate_small_lpt_section(head_dim, shape, balanced):
    _gate_forced(head_dim, shape, True, l2_section_mib=1, persistent=True, balanced=balanced, split_tail=False)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [
    (1000, 8193),    # a key tail of one behind 64 whole tiles
    (8193, 1000),    # the longer query length decides; a key tail of 104
    (333, 16385),    # the split tail's kernel with a key tail
    (8192, 8192),    # the rule's first length, whole tiles
])
def test_gate_fa4_order_noncausal_default(seqlen_q, seqlen_k, dtype):
    # change 35: d128 non-causal from max(Sq, Sk) = 8192 runs FA4's order with named turns and the
    # inline arrivals; the rule was priced on whole key tiles, so the key-tail builds are gated here.
    # Since change 46 these launches pair their CTAs and relay the pair's releases (an odd number
    # of q-tiles, Sq 8193 and 333, rounds up to a whole pair whose second tile lies past seqlen_q)
    problem = _problem(head_dim=128, head_dim_v=128, causal=False, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    cfg = select_config(problem)
    assert cfg.wait_pv_early and cfg.named_turns and cfg.asm_arrivals and cfg.pingpong
    assert cfg.kv_multicast and cfg.relay_release
    _gate(batch=1, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=2, heads_kv=2, head_dim=128, dtype=dtype,
          causal=False)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", [
    dict(batch=2, seqlen_q=1000, heads_q=3, heads_kv=3),      # 48 tiles, each split 2 ways
    dict(batch=3, seqlen_q=1000, heads_q=12, heads_kv=4),     # 264 whole tiles, then 24 split 5 ways
    dict(batch=1, seqlen_q=333, heads_q=4, heads_kv=1),       # 12 tiles split 11 ways, GQA
], ids=lambda s: "B{batch}-Sq{seqlen_q}-H{heads_q}:{heads_kv}".format(**s))
@pytest.mark.parametrize("seqlen_k", [4096, 8192, 16384])
def test_gate_default_split_tail(shape, seqlen_k):
    # the default paths that take the split tail (key lengths from 4k), at query lengths the
    # reference can afford: below 16k with the first tile unmasked (whole key tiles), from 16k
    # with it masked always (config.SPLIT_TAIL_MASK_FIRST_MIN_SEQLEN)
    cfg = select_config(_problem(seqlen_k=seqlen_k, **shape))
    assert cfg.split_tail and cfg.first_mask_on_need is (seqlen_k < 16384)
    _gate(seqlen_k=seqlen_k, head_dim=128, dtype=torch.bfloat16, causal=False, **shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 1), (17, 17), (1000, 1000), (4097, 4097), (333, 4097),
                                                (4097, 17), (1000, 191), (1000, 193)])
@pytest.mark.parametrize("causal", [False, True])
def test_gate_extra_keys(seqlen_q, seqlen_k, causal):
    # 192-key tiles: key tails inside either box (191, 193), a single row, Sq ≠ Sk both ways, GQA.
    # Causal on the kernel extra_keys was measured on: one Q buffer (change 52's second buffer keeps
    # O's staging out of Q's, which the second box's staging needs)
    cfg = dataclasses.replace(_d128_unpaired(causal), **_EXTRA_KEYS, **(_ONE_Q_DIVIDE if causal else {}))
    _gate(functools.partial(fwd.forward, config=cfg), batch=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=4,
          heads_kv=2, head_dim=128, dtype=torch.float16 if seqlen_q == 17 else torch.bfloat16, causal=causal)


@pytest.mark.gpu
@on_hopper
def test_gate_extra_keys_with_the_split_tail():
    cfg = dataclasses.replace(_d128_unpaired(False), **_EXTRA_KEYS, split_tail=True)
    _gate(functools.partial(fwd.forward, config=cfg), batch=3, seqlen_q=1000, seqlen_k=1000, heads_q=12,
          heads_kv=4, head_dim=128, dtype=torch.bfloat16, causal=False)
    _assert_reruns_identical(*_d128_inputs(3, 12, 4), False, cfg)


# the shapes a lever of the K/V step is gated on: GQA, more tiles than CTAs, Sq ≠ Sk with a key
# tail, a sub-tile problem
LEVER_GATE_SHAPES = [
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2),
    dict(batch=3, seqlen_q=4097, seqlen_k=4097, heads_q=12, heads_kv=4),
    dict(batch=2, seqlen_q=333, seqlen_k=4097, heads_q=2, heads_kv=2),
    dict(batch=1, seqlen_q=17, seqlen_k=17, heads_q=2, heads_kv=1),
]


# a 128-key K/V tile as two boxes of 64 (two QK groups), the first box's row max taken between
# their waits (staged_scores), in FA4's order
STAGED_SCORES = dict(block_n=64, extra_keys=64, staged_scores=True, wait_pv_early=True)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", LEVER_GATE_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("staged", [True, False], ids=["staged", "two-boxes"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gate_staged_scores(head_dim, causal, staged, shape):
    # the first box's scores read one wait early: a row max over them before QK's second group
    # has landed would read the accumulator too soon; the masked steps and the key tail fall back
    # to one wait for both boxes
    _gate_forced(head_dim, shape, causal, **dict(STAGED_SCORES, staged_scores=staged))


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim", [64, 128])
def test_staged_scores_reruns_are_bit_identical(head_dim):
    # a moving result is a race: the long non-causal default with two boxes, staged (its K/V pairs
    # step aside: kv_multicast copies one box a stage)
    seqlen = 16384 if head_dim == 128 else 8192
    cfg = replace_following(fwd.default_config(head_dim, False, seqlen), head_dim, **STAGED_SCORES)
    assert cfg.staged_scores and not cfg.kv_multicast
    q, k, v = _seeded_qkv(2, seqlen, 8, head_dim)
    for _ in range(3):
        _assert_reruns_identical(q, k, v, False, cfg)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", LEVER_GATE_SHAPES + [dict(batch=1, seqlen_q=8192, seqlen_k=8192, heads_q=4,
                                                             heads_kv=4)], ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
def test_gate_fa3_order_d64(causal, shape):
    # FA3's order on d64's tiles with the row reductions as trees (the census build): P(j-1) stays
    # in registers through softmax(j), and O's late rescale must meet PV(j-1)'s wait, not pass it —
    # on the 128-row tile (S1000, S17), the paired 192-row tile (non-causal) and the causal lists
    _gate_forced(64, shape, causal, **D64_FA3_ORDER_CHANGES[causal])


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_fa3_order_d64_reruns_are_bit_identical(causal):
    # a moving result is a race: three consumers, each P(j-1) in flight under the next softmax
    _assert_forced_reruns_identical(64, causal, 8192, **D64_FA3_ORDER_CHANGES[causal])


# P for PV from shared memory, in FA3's order (softmax(j) under PV(j-1)) and in FA4's (the
# default's), and on the serial schedule; one Q buffer (d128's second leaves no room for P's)
_P_IN_SMEM = dict(p_in_smem=True, num_q_stages=1)
P_IN_SMEM_ORDERS = {"fa3-order": dict(_P_IN_SMEM, wait_pv_early=False, gate_pv_wait=False),
                    "fa4-order": _P_IN_SMEM,
                    "serial": dict(_P_IN_SMEM, overlap=False, wait_pv_early=False, gate_pv_wait=False,
                                   pingpong=False, named_turns=False, rescale_threshold=0.0,
                                   rescale_by_warp=False, single_kv_loop=False)}


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", LEVER_GATE_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("order", P_IN_SMEM_ORDERS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_p_in_smem(head_dim, causal, order, shape):
    # each consumer's P buffer is rewritten every K/V step: a warp that stored P(j) before another
    # warp's PV(j-1) had read P(j-1), or a PV issued before every warp's rows landed, reads a mix
    _gate_forced(head_dim, shape, causal, **P_IN_SMEM_ORDERS[order])


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_p_in_smem_reruns_are_bit_identical(causal):
    # a moving result is a race: d64's 192-row tile in FA3's order, three consumers on their buffers
    _assert_forced_reruns_identical(64, causal, 8192, **P_IN_SMEM_ORDERS["fa3-order"])


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", [
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2),
    dict(batch=3, seqlen_q=4097, seqlen_k=4097, heads_q=12, heads_kv=4),   # more tiles than CTAs
    dict(batch=2, seqlen_q=4097, seqlen_k=1000, heads_q=2, heads_kv=2),    # rows that see no key
    dict(batch=1, seqlen_q=17, seqlen_k=333, heads_q=2, heads_kv=2),
], ids=_shape_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_balanced(head_dim, shape):
    cfg = dataclasses.replace(fwd.default_config(head_dim, True, 4096), balanced=True, persistent=True)
    _gate_config(cfg, head_dim, True, shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", [
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2),
    dict(batch=1, seqlen_q=4097, seqlen_k=4097, heads_q=2, heads_kv=2),    # key tail inside the diagonal tile
    dict(batch=2, seqlen_q=4097, seqlen_k=1000, heads_q=2, heads_kv=2),    # rows that see no key
    dict(batch=1, seqlen_q=17, seqlen_k=333, heads_q=2, heads_kv=1),
    dict(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1),
], ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_row_bound_mask_switched(head_dim, causal, shape):
    # both mask forms keep exactly the same keys: key tails, the bottom-right diagonal with
    # Sq != Sk, rows that see no key, on every head dim's default (and d64's short-causal tile at
    # these lengths) with the form the default does not take (the two conditions under a causal
    # mask, one bound per row without)
    assert _shape_default(head_dim, causal, shape).row_bound_mask == causal
    _gate_switched("row_bound_mask", head_dim, causal, shape)


# shapes whose last m-tile leaves whole consumer warpgroups past the last query row: d64's
# 192-row tile at 1000 and 1024 (two of three idle) and 4097 (one), 128-row tiles at 900 and 4097
# (one of two), every tile at 17 and 1 rows
_EMPTY_ROW_SHAPES = [
    dict(batch=2, seqlen_q=1024, seqlen_k=1024, heads_q=4, heads_kv=2),
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2),
    dict(batch=2, seqlen_q=900, seqlen_k=900, heads_q=2, heads_kv=2),
    dict(batch=2, seqlen_q=4097, seqlen_k=1000, heads_q=2, heads_kv=2),    # causal: rows that see no key
    dict(batch=1, seqlen_q=17, seqlen_k=333, heads_q=2, heads_kv=1),
    dict(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", _EMPTY_ROW_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_skip_empty_rows_switched(head_dim, causal, shape):
    # a consumer that skips its GEMMs must still take every turn and release every K/V slot in
    # order, or the ring and the token desynchronise: a hang, or another consumer reading a slot
    # being refilled (a moving error). Both settings on every head dim's default
    _gate_switched("skip_empty_rows", head_dim, causal, shape)


def _gate_switched(field, head_dim, causal, shape):
    # the gate on the head dim's default for this shape with one boolean switch flipped: the
    # default itself gates through every other test
    _gate_forced(head_dim, shape, causal, **{field: not getattr(_shape_default(head_dim, causal, shape), field)})


# shapes whose work-item decode divides by every size: GQA groups of 1, 3 and 4; LPT sections of
# one head (l2_section_mib=1 below) that leave a narrower last one; a causal row count past Sk
_FAST_DIVIDE_SHAPES = [
    dict(batch=3, seqlen_q=1000, seqlen_k=1000, heads_q=12, heads_kv=4),
    dict(batch=2, seqlen_q=900, seqlen_k=777, heads_q=6, heads_kv=2),
    dict(batch=5, seqlen_q=1024, seqlen_k=1024, heads_q=3, heads_kv=3),
    dict(batch=1, seqlen_q=4097, seqlen_k=1000, heads_q=2, heads_kv=2),
    dict(batch=1, seqlen_q=17, seqlen_k=17, heads_q=1, heads_kv=1),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", _FAST_DIVIDE_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("who", ["producer", "both"])
def test_gate_fast_divide(who, head_dim, causal, shape):
    # a wrong magic number sends a partition to another tile or K/V head: the producer loads one
    # tile while the consumers compute another, or a consumer writes O where it does not belong.
    # With one-head LPT sections every divisor of the decode is exercised, the last section's too
    _gate_forced(head_dim, shape, causal, fast_divide_producer=True, fast_divide_consumers=who == "both",
                 l2_section_mib=1)


# where a warpgroup's rows see only the first half of a masked tile: the causal diagonal of
# aligned tiles (the first consumer), a key tail of at most half a tile (1050 = 8·128 + 26), a
# diagonal moved by Sq ≠ Sk, rows past Sq (seeing every key or none), a single short tile
_UNSEEN_HALF_SHAPES = [
    dict(batch=2, seqlen_q=1024, seqlen_k=1024, heads_q=4, heads_kv=2),
    dict(batch=2, seqlen_q=1000, seqlen_k=1050, heads_q=2, heads_kv=2),
    dict(batch=1, seqlen_q=300, seqlen_k=2000, heads_q=8, heads_kv=1),
    dict(batch=1, seqlen_q=4097, seqlen_k=1000, heads_q=2, heads_kv=2),
    dict(batch=1, seqlen_q=17, seqlen_k=17, heads_q=1, heads_kv=1),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", _UNSEEN_HALF_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_skip_unseen_half(head_dim, causal, shape):
    # the skipped half's P must be exactly what the whole tile gives there (0), the row max and
    # sum those of the first half; a wrong warpgroup-uniform condition drops keys a row sees
    # (on the plain online softmax, which the half switches need: d256 and long d128 defaults carry
    # FA4's retained reference)
    _gate_forced(head_dim, shape, causal, skip_unseen_half=True, single_kv_loop=False, **_ALWAYS_RESCALE)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", _UNSEEN_HALF_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_single_kv_loop(head_dim, causal, shape):
    # one loop for the unmasked and the masked steps: a wrong branch condition masks a tile a row
    # sees whole (a key lost) or leaves the diagonal or a key tail unmasked (a key too many); the
    # shapes have aligned diagonals, a 26-key tail, Sq < Sk, rows past Sq and a single short tile
    _gate_forced(head_dim, shape, causal, single_kv_loop=True, skip_unseen_half=False, mask_second_half=False)


# where a warpgroup's rows all see the first half of a masked tile: the causal diagonal of aligned
# tiles (the second consumer), a key tail of more than half a tile (1000 = 7·128 + 104), a diagonal
# moved by Sq ≠ Sk, rows past Sq, a tail of exactly half a tile plus one (1089 = 8·128 + 65)
_SEEN_HALF_SHAPES = [_UNSEEN_HALF_SHAPES[i] for i in (0, 2, 4)] + [
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=2, heads_kv=2),
    dict(batch=1, seqlen_q=4097, seqlen_k=1089, heads_q=2, heads_kv=2),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", _SEEN_HALF_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("with_unseen", [False, True], ids=["alone", "with-skip-unseen-half"])
def test_gate_mask_second_half(head_dim, causal, shape, with_unseen):
    # the first half left unmasked must hold no key a row may not see: a condition taken at the
    # wrong row lets a row see keys past its diagonal or past seqlen_k
    _gate_forced(head_dim, shape, causal, mask_second_half=True, skip_unseen_half=with_unseen, single_kv_loop=False,
                 **_ALWAYS_RESCALE)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", SPLIT_TAIL_SHAPES[:3], ids=_shape_id)
def test_gate_fast_divide_with_the_split_tail(shape):
    # split items: the tail's item -> (tile, split) and each split's K/V range divide too
    cfg = dataclasses.replace(fwd.default_config(128, False), split_tail=True, fast_divide_producer=True,
                              fast_divide_consumers=True)
    _gate_config(cfg, 128, False, shape)


_SERIAL = dict(overlap=False, wait_pv_early=False, named_turns=False)     # serial steps, pingpong turns
_FA3_ORDER = dict(pingpong=False, wait_pv_early=False, named_turns=False)
_MBARRIER_TURNS = dict(pingpong=True, wait_pv_early=True, named_turns=False)
_GQA_900 = dict(batch=2, seqlen_q=900, seqlen_k=777, heads_q=6, heads_kv=2)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("changes, causal, shape", [
    *[(ch, causal, _GQA_900) for ch in (_SERIAL, _FA3_ORDER, _MBARRIER_TURNS, dict(extra_keys=64, separate_o=False))
      for causal in (False, True)],
    # split items of a partial tile (48 tiles on 132 SMs: each split in two), and of a single row
    (dict(split_tail=True, persistent=True, balanced=False), False,
     dict(batch=2, seqlen_q=900, seqlen_k=900, heads_q=3, heads_kv=3)),
    (dict(split_tail=True, persistent=True, balanced=False), False,
     dict(batch=1, seqlen_q=1, seqlen_k=4097, heads_q=4, heads_kv=4)),
], ids=lambda x: ",".join(f"{k}={v}" for k, v in x.items()) if isinstance(x, dict) else str(x))
def test_gate_skip_empty_rows_on_each_schedule(changes, causal, shape):
    # the idle walk mirrors each schedule's waits and turns: the serial steps take two turns per
    # tile, the overlapped one, FA3's order none; two-part tiles keep one barrier pair per tile;
    # the split tail hands an idle warpgroup split items, whose workspace rows the merge never reads
    cfg = dataclasses.replace(_switch_base(causal), skip_empty_rows=True, **changes)
    _gate_config(cfg, 128, causal, shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", _EMPTY_ROW_SHAPES, ids=_shape_id)    # 4097 × 1000 causal: tiles with no K/V tile
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("skip", [True, False], ids=["skip", "compute-empty"])
def test_gate_overlap_epilogue(head_dim, causal, shape, skip):
    # each tile's O and LSE are stored one tile late, under the next tile's first QK: every
    # persistent CTA's last tile is stored after its loop, a tile with no K/V tile (rows that see
    # no key) and an idle warpgroup's walk still store the previous one, and no O is written to a
    # buffer the previous TMA store still reads
    _gate_forced(head_dim, shape, causal, overlap_epilogue=True, skip_empty_rows=skip)


# first visited K/V tiles of every kind: unmasked (S1024: 7 of 8 causal tiles), the diagonal,
# the key tail as the only tile (17 keys) or the last (1000 keys), bottom-right causal with
# Sq != Sk (4097 x 1000: rows that see no key; 1000 x 1500: every tile's first keys visible),
# a staggered sweep's rotated start (d64 from 3072) and one row
_FIRST_TILE_SHAPES = [
    dict(batch=2, seqlen_q=1024, seqlen_k=1024, heads_q=4, heads_kv=2),
    dict(batch=2, seqlen_q=1000, seqlen_k=1000, heads_q=4, heads_kv=2),
    dict(batch=1, seqlen_q=17, seqlen_k=17, heads_q=2, heads_kv=1),
    dict(batch=2, seqlen_q=4097, seqlen_k=1000, heads_q=2, heads_kv=2),
    dict(batch=2, seqlen_q=1000, seqlen_k=1500, heads_q=2, heads_kv=2),
    dict(batch=1, seqlen_q=4097, seqlen_k=4097, heads_q=2, heads_kv=2),
    dict(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", _FIRST_TILE_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_first_mask_on_need_switched(head_dim, causal, shape):
    # a first tile left unmasked that needed the mask lets a row see a key it may not (the
    # diagonal, or zero-filled keys past Sk): every kind of first tile, every head dim's default,
    # both settings
    _gate_switched("first_mask_on_need", head_dim, causal, shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", SPLIT_TAIL_SHAPES[:3], ids=_shape_id)
def test_gate_first_mask_on_need_with_the_split_tail(shape):
    # a split item starts at its own K/V tile: the key tail may be the first tile it visits
    cfg = dataclasses.replace(fwd.default_config(128, False), split_tail=True, first_mask_on_need=True)
    _gate_config(cfg, 128, False, shape)


# Q stages wrap: many tiles per persistent CTA (B4 H16 S2048: 8+ tiles each at d128), GQA with
# key and query tails, causal rows that see no key (the producer loads their Q alone), one row,
# and a per-tile grid (one tile per CTA: the second stage is never used)
_Q_STAGE_SHAPES = [
    dict(batch=4, seqlen_q=2048, seqlen_k=2048, heads_q=16, heads_kv=16),
    dict(batch=3, seqlen_q=1000, seqlen_k=777, heads_q=12, heads_kv=4),
    dict(batch=2, seqlen_q=4097, seqlen_k=1000, heads_q=8, heads_kv=8),
    dict(batch=1, seqlen_q=17, seqlen_k=17, heads_q=1, heads_kv=1),
]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("grid", ["default", "per-tile"])
@pytest.mark.parametrize("shape", _Q_STAGE_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gate_two_q_stages(head_dim, causal, shape, grid):
    # with two Q buffers the producer loads tile t+1's Q while tile t still reads its own: a wrong
    # stage or phase lets a consumer read a Q box being overwritten (a moving error) or wait
    # forever. Every d64 and d128 default (the short-causal tiles at S <= 2048 included)
    grid_changes = dict(persistent=False, balanced=False, split_tail=False) if grid == "per-tile" else {}
    _gate_forced(head_dim, shape, causal, num_q_stages=2, **grid_changes)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", SPLIT_TAIL_SHAPES[:3], ids=_shape_id)
def test_gate_overlap_epilogue_with_the_split_tail(shape):
    # a split item's partial O and LSE go to the workspace one item late; the merge reads them
    # after the kernel
    cfg = dataclasses.replace(fwd.default_config(128, False), split_tail=True, overlap_epilogue=True)
    _gate_config(cfg, 128, False, shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("seqlen", [8192, 1024])
def test_balanced_default_replays_in_a_cuda_graph(seqlen):
    # causal d128 launches the balanced grid by default (at 1k on the short-causal schedule); its
    # tile table is built on the shape's first call, so a graph captured after one warm-up call
    # replays the eager result
    q, k, v = _d128_inputs(1, 2, 2, seqlen=seqlen)
    assert select_config(Problem.of(q, k, v, True)).balanced
    _assert_graph_replays_eager(q, k, v, True)


def _assert_graph_replays_eager(q, k, v, causal):
    """One eager call of the default, then a capture of the same call: its replay, into zeroed
    outputs, gives the eager result bit for bit."""
    out_eager, lse_eager = fwd.forward(q, k, v, causal, 128 ** -0.5)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out, lse = fwd.forward(q, k, v, causal, 128 ** -0.5)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, out_eager) and torch.equal(lse, lse_eager)


@pytest.mark.gpu
@on_hopper
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")     # the refused capture recorded nothing
def test_balanced_grid_refuses_to_build_its_table_inside_a_capture():
    # a shape never run before: its table would be a host-to-device copy, which a capture cannot
    # record; the error says what to do instead of failing inside the capture
    q, k, v = _d128_inputs(1, 2, 2, seqlen=1003)
    cfg = dataclasses.replace(fwd.default_config(128, True, 8192), balanced=True, persistent=True)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with pytest.raises(RuntimeError, match="before capturing"):
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            fwd.forward(q, k, v, True, 128 ** -0.5, cfg)
    torch.cuda.synchronize()
    _assert_reruns_identical(q, k, v, True, cfg)      # and the same shape runs once out of the capture


@pytest.mark.gpu
@on_hopper
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")     # the refused capture recorded nothing
def test_kv_multicast_default_replays_in_a_cuda_graph():
    # d128 non-causal at S4k pairs its CTAs by default: the K/V tensor maps are built on the
    # tensors' first call, a capture after it records the cluster launch reading them and replays
    # the eager result; a capture over tensors never seen refuses, saying what to do
    q, k, v = _d128_inputs(1, 4, 4, seqlen=4096)
    assert select_config(Problem.of(q, k, v, False)).kv_multicast
    _assert_graph_replays_eager(q, k, v, False)
    stream = torch.cuda.Stream()
    fresh = k.clone()
    with pytest.raises(RuntimeError, match="before capturing"):
        with torch.cuda.stream(stream), torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
            fwd.forward(q, fresh, v, False, 128 ** -0.5)
    torch.cuda.synchronize()


def test_merge_loads_first_is_every_split_tails_merge_and_a_host_side_choice():
    # the merge's form is read only by a launch that splits its tail: every default carries it, the
    # chunked merge stays reachable, and neither form changes the attention kernel's build
    for d in HEAD_DIMS:
        for causal in (False, True):
            for seqlen in (1024, 4096, 16384, 32768):
                assert fwd.default_config(d, causal, seqlen).merge_loads_first
    split = fwd.default_config(128, False, 16384)
    assert split.split_tail
    dataclasses.replace(split, merge_loads_first=False).check(128)
    dataclasses.replace(split, split_tail=False).check(128)
    assert fwd._constexprs(split, 128, False) == fwd._constexprs(dataclasses.replace(split, merge_loads_first=False),
                                                                 128, False)


def test_split_tail_rounds_is_the_split_tails_count_and_off_by_default():
    from flashrung.kernels.hopper.config import WORK_ITEM_FIXED_KV_TILES

    with pytest.raises(ValueError, match="split_tail_rounds .* needs split_tail=True"):
        dataclasses.replace(fwd.default_config(256, False), split_tail_rounds=True).check(256)
    # d256 non-causal B2 H16 S8192 on 132 SMs: the one-round rule leaves the last 68 tiles whole,
    # the modeled count splits them five ways (three rounds of split items)
    base = dataclasses.replace(fwd.default_config(256, False, 8192), split_tail=True)
    whole = fwd._plan(base, 2, 8192, 8192, 16, 16, 256, 2, False, True, 132)
    rounds = fwd._plan(dataclasses.replace(base, split_tail_rounds=True), 2, 8192, 8192, 16, 16, 256, 2, False,
                       True, 132)
    assert (whole.num_full_tiles, whole.splits) == (2048, 1) and not whole.constexprs["SPLIT_TAIL"]
    assert (rounds.num_full_tiles, rounds.splits, rounds.num_items) == (1980, 5, 1980 + 68 * 5)
    assert rounds.constexprs["SPLIT_TAIL"]
    # the measured d128 default keeps its count: one round, its last 2 pairs of q-tiles split 33
    # ways (paired since change 46; unpaired, the last 4 tiles)
    d128 = fwd.default_config(128, False, 16384)
    assert d128.split_tail and not d128.split_tail_rounds and d128.kv_multicast
    for cfg, count in ((d128, (2046, 33)), (_d128_unpaired(False), (4092, 33))):
        plan = fwd._plan(dataclasses.replace(cfg, split_tail_rounds=True), 2, 16384, 16384, 16, 16, 128, 2, False,
                         True, 132)
        assert (plan.num_full_tiles, plan.splits) == count
    assert set(WORK_ITEM_FIXED_KV_TILES) == set(HEAD_DIMS)
    for d in HEAD_DIMS:
        for causal in (False, True):
            for seqlen in (1024, 4096, 16384, 32768):
                assert not fwd.default_config(d, causal, seqlen).split_tail_rounds


@pytest.mark.gpu
@on_hopper
def test_split_tail_is_deterministic_and_refuses_causal():
    q, k, v = _d128_inputs(3, 12, 4)          # 264 whole tiles, then 24 tiles split 5 ways
    cfg = dataclasses.replace(fwd.default_config(128, False), split_tail=True)
    _assert_reruns_identical(q, k, v, False, cfg)
    with pytest.raises(ValueError, match="split_tail applies to non-causal"):
        fwd.forward(q, k, v, True, 128 ** -0.5, cfg)


def _retained_reference_config():
    # the retained reference in FA3's order, where it was first priced (d64's default is FA4's)
    return replace_following(fwd.default_config(64, False), 64, late_rescale=True, pack_p=True, rescale_threshold=8.0,
                             wait_pv_early=False, pingpong=False, meet_before_pass=False)


def _three_consumer_config():
    return dataclasses.replace(fwd.default_config(64, True), block_m=192, consumer_regs=160, block_n=64)


def test_gpu_gate_configurations_fit_the_budgets():
    # a configuration the GPU gate builds must pass the host checks first, or that test cannot run
    _retained_reference_config().check(64)
    for head_dim in HEAD_DIMS:
        for causal in (False, True):
            for shape in _UNSEEN_HALF_SHAPES[:4]:         # test_gate_rescale_by_warp's
                dataclasses.replace(_shape_default(head_dim, causal, shape), rescale_threshold=8.0,
                                    rescale_by_warp=True).check(head_dim)
    _three_consumer_config().check(64)


def _switch_base(causal):
    """The d128 S16k default, unpaired, with O rescaled at every step, the kernel each switch below
    is gated on (the half switches, the serial step and the 192-key tile need the plain online
    softmax); the default itself, with FA4's retained reference and the per-warp skip, is the first
    switch. PV's gated wait (non-causal's default from S16k, change 37) is off here: half the
    switches take FA4's order away, and two entries below put the gate back on. One Q buffer and the
    division-based decode, as the switches were built on: the causal default takes two Q buffers and
    the multiply-high decode at every length since change 52, one entry below."""
    return dataclasses.replace(_d128_unpaired(causal), gate_pv_wait=False, freeze_row_max=False, **_ALWAYS_RESCALE,
                               **_ONE_Q_DIVIDE)


def _switches():
    base = _switch_base(True)
    return [
        # FA4's order and named turns are levers of the overlapped pingpong (d128 causal has both)
        dict(overlap=not base.overlap, wait_pv_early=False, named_turns=False),
        dict(pingpong=not base.pingpong, named_turns=False),
        dict(pingpong=True, overlap=False, wait_pv_early=False, named_turns=False),
        dict(persistent=False, balanced=False),      # the per-tile grid
        dict(persistent=True, balanced=False),       # the persistent stride
        dict(lpt=not base.lpt),
        dict(num_kv_stages=1),
        dict(num_kv_stages=3, separate_o=False),     # a third K/V stage leaves no room for O's buffer
        # the carried ring slot, on two stages and on three (its wrap at a slot count that is not
        # a power of two)
        dict(carry_ring_slot=True),
        dict(carry_ring_slot=True, num_kv_stages=3, separate_o=False),
        dict(block_n=64),
        dict(block_m=64),
        dict(consumer_regs=232, producer_regs=32),
        dict(late_rescale=True),
        dict(pack_p=True),
        dict(rescale_threshold=8.0, wait_pv_early=False),
        dict(late_rescale=True, pack_p=True, rescale_threshold=8.0, pingpong=True, wait_pv_early=False),
        dict(separate_o=not base.separate_o),
        dict(tree_reduce=True),
        dict(four_max_chains=True),
        dict(defer_row_sum=True),
        dict(defer_row_sum=True, rescale_threshold=8.0, wait_pv_early=False),
        dict(pingpong=True, named_turns=True),
        dict(pingpong=True, overlap=False, wait_pv_early=False, named_turns=True),
        dict(pingpong=True, wait_pv_early=True, named_turns=True),
        dict(wait_pv_early=True, pingpong=True, q_in_registers=True),
        dict(balanced=True, persistent=True, split_tail=False),
        dict(lag_v_loads=True),
        dict(lag_v_loads=True, num_kv_stages=1),
        dict(late_k_release=True),
        dict(late_k_release=True, num_kv_stages=1, lag_v_loads=True),
        dict(row_bound_mask=not base.row_bound_mask),
        dict(row_bound_mask=not base.row_bound_mask, pingpong=False, wait_pv_early=False, named_turns=False),
        dict(skip_empty_rows=not base.skip_empty_rows),
        dict(overlap_epilogue=True),
        dict(first_mask_on_need=not base.first_mask_on_need),
        dict(num_q_stages=2),
        dict(num_q_stages=2, overlap_epilogue=True),
        # ... with the multiply-high decode (d128 causal's default at every length, change 52)
        dict(num_q_stages=2, fast_divide_producer=True, fast_divide_consumers=True),
        # a masked tile's unseen second half skipped: FA4's order (d128 causal's) and FA3's
        dict(skip_unseen_half=True),
        dict(skip_unseen_half=True, pingpong=False, wait_pv_early=False, named_turns=False),
        # a masked tile's first half left unmasked where every row sees it: alone, with the unseen
        # half skipped, and in FA3's order
        dict(mask_second_half=True),
        dict(mask_second_half=True, skip_unseen_half=True),
        dict(mask_second_half=True, pingpong=False, wait_pv_early=False, named_turns=False),
        # each warp skips O's rescale on its own vote (the S16k default of either mask): FA4's order
        # (d128 causal's) and FA3's
        dict(rescale_threshold=8.0, rescale_by_warp=True),
        dict(rescale_threshold=8.0, rescale_by_warp=True, pingpong=False, wait_pv_early=False, named_turns=False),
        # P's conversions ahead of O's rescale: on the per-warp rescale in FA3's order and FA4's
        dict(convert_before_rescale=True, rescale_threshold=8.0, rescale_by_warp=True, pingpong=False,
             wait_pv_early=False, named_turns=False),
        dict(convert_before_rescale=True, rescale_threshold=8.0, rescale_by_warp=True),
        # the elected arrivals in inline PTX: with the mbarrier token in FA3's order (d128
        # non-causal's) and FA4's with named turns (d128 causal's)
        dict(asm_arrivals=True, pingpong=True, wait_pv_early=False, named_turns=False),
        dict(asm_arrivals=True, pingpong=True, wait_pv_early=True, named_turns=True),
        # ... with the waits inline too (the mbarrier turn's wait among them)
        dict(asm_arrivals=True, asm_waits=True, pingpong=True, wait_pv_early=False, named_turns=False),
        dict(asm_arrivals=True, asm_waits=True, pingpong=True, wait_pv_early=True, named_turns=True),
        # ... with the shared window's base hoisted
        dict(asm_arrivals=True, asm_waits=True, hoist_smem_base=True, pingpong=True, wait_pv_early=False,
             named_turns=False),
        dict(asm_arrivals=True, hoist_smem_base=True, pingpong=True, wait_pv_early=True, named_turns=True),
        # PV's wait kept after the row max: FA4's order with named turns (d128 causal's) and with
        # the mbarrier token
        dict(gate_pv_wait=True),
        dict(gate_pv_wait=True, named_turns=False),
        # the unmasked and masked steps in one loop: FA4's order (d128 causal's) and FA3's
        dict(single_kv_loop=True),
        dict(single_kv_loop=True, pingpong=False, wait_pv_early=False, named_turns=False),
        # 192-key tiles (128 + 64): in FA3's order, FA4's schedule, and serial
        dict(extra_keys=64, separate_o=False),
        dict(extra_keys=64, separate_o=False, pingpong=True, wait_pv_early=True, named_turns=True),
        dict(extra_keys=64, separate_o=False, overlap=False, pingpong=False, wait_pv_early=False, named_turns=False),
        dict(extra_keys=64, separate_o=False, row_bound_mask=not base.row_bound_mask),
        # ... with the retained reference and each warp's own O rescale (the long non-causal
        # defaults' softmax): FA4's schedule and FA3's order
        dict(extra_keys=64, separate_o=False, rescale_threshold=8.0, rescale_by_warp=True, pingpong=True,
             wait_pv_early=True, named_turns=True),
        dict(extra_keys=64, separate_o=False, rescale_threshold=8.0, rescale_by_warp=True, wait_pv_early=False,
             named_turns=False),
        # the running sum on the tensor pipe: FA4's order (the default's), FA3's (its gated wait
        # ties another register value), the serial step, the per-warp rescale (l's alpha applied
        # always), the late rescale and the halves of a masked tile
        dict(ROW_SUM_BY_MMA),
        dict(ROW_SUM_BY_MMA, pingpong=False, wait_pv_early=False, named_turns=False),
        dict(ROW_SUM_BY_MMA, overlap=False, pingpong=False, wait_pv_early=False, named_turns=False),
        dict(ROW_SUM_BY_MMA, rescale_threshold=8.0, rescale_by_warp=True),
        dict(ROW_SUM_BY_MMA, late_rescale=True, pingpong=False, wait_pv_early=False, named_turns=False),
        dict(ROW_SUM_BY_MMA, skip_unseen_half=True, mask_second_half=True),
    ]


@pytest.mark.parametrize("switch", ["skip_unseen_half", "mask_second_half"])
@pytest.mark.parametrize("other", [dict(overlap=False, pingpong=False, wait_pv_early=False, named_turns=False), dict(extra_keys=64, separate_o=False),
                                   dict(rescale_threshold=8.0)], ids=["serial", "two-boxes", "threshold"])
def test_half_switches_need_one_box_of_the_overlapped_softmax(switch, other):
    # both split one wgmma accumulator of the overlapped step's plain online softmax in halves of
    # keys; anywhere else the config must refuse, naming the switch, not build a wrong kernel
    cfg = dataclasses.replace(_switch_base(True), **{switch: True}, **other)
    with pytest.raises(ValueError, match=switch):
        cfg.check(128)


def test_every_gated_switch_fits_the_budgets():
    # the GPU gate below builds each of these at d128: every one must pass the host checks
    for causal in (False, True):
        for changes in _switches():
            dataclasses.replace(_switch_base(causal), **changes).check(128)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("changes", _switches(), ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_gate_each_switch(changes, causal):
    cfg = dataclasses.replace(_switch_base(causal), **changes)
    _gate(functools.partial(fwd.forward, config=cfg), batch=2, seqlen_q=1000, seqlen_k=777, heads_q=6,
          heads_kv=2, head_dim=128, dtype=torch.bfloat16, causal=causal)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("softmax_scale", [0.5, None])
@pytest.mark.parametrize("shape", _UNSEEN_HALF_SHAPES[:4], ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_rescale_by_warp(head_dim, causal, shape, softmax_scale):
    # each warp decides its own O rescale: a warp whose rows all kept their reference must leave O
    # untouched while another warp of the same warpgroup rescales (scale 0.5 makes early maxima
    # jump by more than τ in some rows and not others); in each head dim's default order (FA3's at
    # d128 non-causal, FA4's elsewhere)
    cfg = dataclasses.replace(_shape_default(head_dim, causal, shape), rescale_threshold=8.0, rescale_by_warp=True)
    _gate(functools.partial(fwd.forward, config=cfg), head_dim=head_dim, dtype=torch.bfloat16, causal=causal,
          softmax_scale=softmax_scale, **shape)


def _rising_maxima_inputs(head_dim, seqlen_q=1000, seqlen_k=4097, seed=0):
    """q, k, v whose rows' maxima keep rising along the keys (each key's scale grows with its
    position, so references move by more than τ in late tiles too, not only the first ones), with
    four spike keys late in the sequence whose scores jump by more than 128 in log2 units over
    most rows' references."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, seqlen_q, 2, head_dim, generator=g)
    k = torch.randn(1, seqlen_k, 2, head_dim, generator=g) * torch.linspace(0.5, 4.0, seqlen_k)[None, :, None, None]
    for pos in (seqlen_k // 3, seqlen_k // 2 + 5, seqlen_k - 300, seqlen_k - 2):
        k[:, pos] *= 40.0
    v = torch.randn(1, seqlen_k, 2, head_dim, generator=g)
    return [t.to("cuda", torch.bfloat16) for t in (q, k, v)]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gate_retained_reference_where_maxima_rise_late_and_jump(head_dim, causal):
    # FA4's retained reference with each warp's own rescale, in each head dim's default order:
    # references that move in late tiles, and by more than 128 in log2 units at the spike keys
    # (an exponential against the old reference would overflow there; the default takes its
    # exponentials against the new one). Fresh Gaussians at the default scale move a reference in
    # the first tiles only
    from flashrung.gate import check_forward_inputs

    q, k, v = _rising_maxima_inputs(head_dim)
    cfg = dataclasses.replace(fwd.default_config(head_dim, causal, 4097), rescale_threshold=8.0, rescale_by_warp=True)
    result = check_forward_inputs(functools.partial(fwd.forward, config=cfg), q, k, v, causal)
    assert result.passed, str(result)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("shape", _UNSEEN_HALF_SHAPES[:4], ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
def test_gate_d256_softmax_levers(causal, shape):
    # packed P and the per-thread partial row sums on d256's retained reference (the default since
    # change 33): the partial sums take the same alpha as O in the retained frame, whether or not a
    # warp skipped O's multiplies (scale 0.5: references move in some rows and not others)
    cfg = _shape_default(256, causal, shape)
    assert cfg.rescale_by_warp and cfg.defer_row_sum and cfg.pack_p, cfg
    _gate(functools.partial(fwd.forward, config=cfg), head_dim=256, dtype=torch.bfloat16, causal=causal,
          softmax_scale=0.5, **shape)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gate_retained_reference_and_packed_p(dtype):
    # scale 0.5 at d64: log2 scores with a spread of ~6, so a row's max jumps by more than τ = 8
    # in early tiles (reference moved, O rescaled) and stays within it later (both branches run)
    cfg = _retained_reference_config()
    _gate(functools.partial(fwd.forward, config=cfg), batch=2, seqlen_q=300, seqlen_k=2000, heads_q=4,
          heads_kv=2, head_dim=64, dtype=dtype, causal=False, softmax_scale=0.5)


@pytest.mark.gpu
@on_hopper
def test_gate_three_consumer_warpgroups():
    cfg = _three_consumer_config()
    _gate(functools.partial(fwd.forward, config=cfg), batch=2, seqlen_q=1000, seqlen_k=777, heads_q=4,
          heads_kv=4, head_dim=64, dtype=torch.float16, causal=True)


def test_selfcheck_timing_only_checks_every_timed_configuration():
    from flashrung.kernels.hopper import selfcheck

    rows = selfcheck.build_rows(timing_only=True)
    timed = [r for r in rows if r["kind"] == "time"]
    checked = {(json_key(r)) for r in rows if r["kind"] == "check"}
    assert timed and all(json_key(r) in checked for r in timed)
    assert {r["kind"] for r in rows} == {"check", "time", "time_cudnn"}
    # the combinations of the issue are timed, and every timed configuration fits the budgets
    labels = {(r["d"], r["causal"], r["variant"]) for r in timed}
    # d128 S16k non-causal has the pingpong token by default (change 30): the issue's pingpong with
    # 232 registers is the single register switch there
    assert fwd.default_config(128, False).pingpong and (128, False, "consumer_regs=232") in labels
    assert (256, False, "persistent=True,consumer_regs=232") in labels
    assert (64, False, "persistent=False") in labels       # d64 and d128 are persistent by default
    assert (128, False, "persistent=False") in labels
    # d64 and d128 non-causal S16k pair their CTAs (kv_multicast; d128 since change 46, relayed),
    # which the stagger cannot run with; the pair's ways are timed as switches of their own
    for d in (64, 128):
        assert (d, False, "stagger_kv=True,kv_multicast=False") in labels and (d, False, "kv_multicast=False") in labels
    assert (128, False, "relay_release=False") in labels and (128, False, "producer_unsynced=True") in labels
    for r in timed:
        HopperFwdConfig(**r["cfg"]).check(r["d"])
    assert len(timed) == len({(json_key(r), tuple(r["shape"])) for r in timed}), "a configuration is timed twice"


def test_selfcheck_changes_that_set_the_freeze_aside_build_on_the_online_default():
    # as hopper.fwd@... does (fwd.overridden_config): at d128 non-causal S16k the frozen default
    # brings PV's wait ungated (change 56); a switch the freeze cannot join (the FMA pipe's exp2)
    # runs on the online step's default, whose wait is gated, not on the frozen one's leftovers
    from flashrung.kernels.hopper import selfcheck

    frozen, online = fwd.default_config(128, False), selfcheck._online(128, False)
    assert frozen.freeze_row_max and not frozen.gate_pv_wait and online.gate_pv_wait
    cfg = selfcheck._cfg_dict(128, False, exp2_fma_every=16)
    assert cfg == dataclasses.asdict(dataclasses.replace(online, exp2_fma_every=16))
    # a switch the freeze joins keeps the frozen default under it
    assert selfcheck._cfg_dict(128, False, consumer_regs=232)["freeze_row_max"]


def json_key(row):
    import json

    return json.dumps([row["cfg"], row["d"], row["causal"]], sort_keys=True)


def test_selfcheck_battery_fits_today_defaults():
    # every row of the full battery (not only the timed ones) must be a configuration that
    # passes the host check: a default moving under a fixed row must not crash the battery
    from flashrung.kernels.hopper import selfcheck

    rows = selfcheck.build_rows(timing_only=False)
    for r in rows:
        if r.get("cfg") is not None:       # cuDNN timing rows carry no configuration
            HopperFwdConfig(**r["cfg"]).check(r["d"])
    variants = {r["variant"] for r in rows if r["kind"] == "check"}
    assert any("wait_pv_early" in v for v in variants) and any("exp2_fma_every" in v for v in variants)
    assert any("q_in_registers" in v for v in variants) and "exp2 split fp16" in variants


def test_separate_o_buffer_is_budgeted():
    # O's own staging buffer costs block_m × D × 2 bytes more: it fits at d64 and d128 (their
    # defaults use it) and not next to d256's Q and ring
    for d in (64, 128):
        cfg = fwd.default_config(d, False)
        assert cfg.separate_o
        plain = dataclasses.replace(cfg, separate_o=False)
        assert cfg.smem_bytes(d, 2) - plain.smem_bytes(d, 2) == cfg.block_m * d * 2
    with pytest.raises(ValueError, match="shared memory"):
        dataclasses.replace(fwd.default_config(256, False), separate_o=True).check(256)


def test_fast_descriptor_equals_the_validated_one():
    # the launch fills TMA descriptors without TensorDescriptor's per-call validation (host time):
    # every field must equal what the validating constructor builds, strided views included
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    base = torch.randn(2, 40, 6, 128, dtype=torch.bfloat16)
    # the last two: a padded head dim's tensors (d96, a view of d96 inside d128 rows), boxed at 128
    for t in (base, base[:, :, ::2], base.transpose(1, 2).contiguous().transpose(1, 2), base[..., :96].contiguous(),
              base[..., :96]):
        for rows in (64, 128):
            fast = fwd._descriptor(t, rows, 128)
            ref = TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, 1, 128],
                                   fwd._smem_layout(t.dtype, rows, 128))
            assert type(fast) is TensorDescriptor
            assert fast == ref and fast.base is t


# --------------------------------------------------------------------------- step trace (trace_steps)


def test_trace_steps_needs_the_overlapped_schedule_without_the_split_tail():
    # the stamps travel in the split tail's workspace pointer and mark the overlapped step's events
    # (S8k's kernel as the whole-tile launch builds it: its default splits the tail since change 38)
    base = dataclasses.replace(fwd.default_config(128, False, 8192), split_tail=False, freeze_row_max=False)
    dataclasses.replace(base, trace_steps=64).check(128)
    for changes in (dict(split_tail=True), dict(overlap=False, pingpong=False, rescale_threshold=0.0,
                                                rescale_by_warp=False, wait_pv_early=False, named_turns=False,
                                                meet_before_pass=False),
                    dict(trace_steps=-1)):
        with pytest.raises(ValueError, match="trace_steps"):
            dataclasses.replace(base, **{"trace_steps": 64, **changes}).check(128)
    with pytest.raises(ValueError, match="trace_steps > 0"):
        fwd.traced_forward(None, None, None, False, 1.0, base)


def test_step_trace_summary_reads_each_phase_and_the_turn_handoff():
    # a synthetic trace whose phases have known lengths, with stamps near the 32-bit wrap
    import numpy as np

    from flashrung.evidence import step_trace
    from flashrung.kernels.hopper.trace import EVENTS

    from flashrung.kernels.hopper.trace import CLOCK_SHIFT

    gaps, back_edge = [6, 8, 12, 14, 18, 20, 24], 4      # cycles (even: the stamps count 2-cycle ticks)
    period = sum(gaps) + back_edge
    clock = np.full((3, 2, 10, len(EVENTS)), -1, dtype=np.int64)
    for cta in range(3):
        for wg in range(2):
            for step in range(1, 10):
                t = (1 << 32) - 500 + 2 * cta + 40 * wg + step * period     # the SM clock wraps mid-trace
                for e in range(len(EVENTS)):
                    clock[cta, wg, step, e] = t
                    t += gaps[e] if e < len(gaps) else 0
    stamps = np.where(clock < 0, -1, (clock % (1 << 32)) >> CLOCK_SHIFT).astype(np.int32)
    assert (stamps[:, :, 1:] >= 0).all()           # a stamp is never negative: -1 means "not stamped"
    stamps[0, 1, 9] = -1            # a step not stamped is left out, not read as a time
    summary = step_trace.summarize(stamps, EVENTS)
    for wg, rows in enumerate(summary["by_warpgroup"]):
        assert [rows[name]["median"] for name, *_ in step_trace.PHASES] == gaps
        assert rows["period"]["median"] == period and rows["loop"]["median"] == back_edge
    # warpgroup 1 takes the turn 40 - 26 + 14 = 28 cycles after warpgroup 0 issued; warpgroup 0 the
    # next step's after warpgroup 1 issued
    assert summary["by_warpgroup"][1]["handoff"]["median"] == 28
    assert summary["by_warpgroup"][0]["handoff"]["median"] == period - 40 - 26 + 14
    assert "turn_wait" in step_trace.table(summary)
    # in company: warpgroup 1 runs 40 cycles behind warpgroup 0 in a period of 106, and no phase
    # is longer than 24 cycles, so no phase of one meets the same phase of the other
    for rows in summary["company"]:
        assert list(rows) == [name for name, *_ in step_trace.PHASES] and all(v == 0 for v in rows.values())
    assert "in company" in step_trace.table(summary)
    with pytest.raises(ValueError, match="stamps must be"):
        step_trace.summarize(np.zeros((2, 2, 4)), EVENTS)


def test_trace_probes_write_their_raw_stamps(tmp_path):
    # --raw keeps every record the summary folds away (the -1 of an unstamped entry included), on
    # both probes; a path that is not .npy, or records that are not the kernel's int32, are refused
    # (the path before any GPU work)
    import numpy as np

    from flashrung.evidence import step_trace, tile_trace

    stamps = np.arange(2 * 3 * 4 * 7, dtype=np.int32).reshape(2, 3, 4, 7)
    stamps[1, 2, 3] = -1
    path = step_trace.write_raw(stamps, str(tmp_path / "tiles.npy"))
    assert np.array_equal(np.load(path), stamps) and np.load(path).dtype == np.int32
    with pytest.raises(ValueError, match=".npy"):
        step_trace.write_raw(stamps, str(tmp_path / "tiles.json"))
    with pytest.raises(ValueError, match="int32"):
        step_trace.write_raw(stamps.astype(np.int64), str(tmp_path / "wide.npy"))
    for probe in (step_trace, tile_trace):
        args = probe.build_parser().parse_args(["--raw", str(tmp_path / "x.txt")])
        with pytest.raises(SystemExit, match=".npy"):
            step_trace.run_probe(args, {}, (), None, None, "", None)


def test_step_trace_company_counts_the_other_warpgroups_in_the_same_phase():
    # three warpgroups whose 60-cycle "tail" phases start 30 cycles apart in a 90-cycle period:
    # every tail cycle has exactly one other warpgroup in its tail (half of it the one before,
    # half the one after); the 6-cycle phases never meet
    import numpy as np

    from flashrung.evidence import step_trace
    from flashrung.kernels.hopper.trace import CLOCK_SHIFT, EVENTS

    gaps = [2, 2, 2, 2, 2, 2, 60]
    period = sum(gaps) + 18
    clock = np.zeros((2, 3, 12, len(EVENTS)), dtype=np.int64)
    for cta in range(2):
        for wg in range(3):
            for step in range(12):
                t = (1 << 32) - 1000 + 400 * cta + 30 * wg + step * period
                for e in range(len(EVENTS)):
                    clock[cta, wg, step, e] = t
                    t += gaps[e] if e < len(gaps) else 0
    stamps = ((clock % (1 << 32)) >> CLOCK_SHIFT).astype(np.int32)
    company = step_trace.phase_company(stamps, EVENTS)
    for rows in company:
        assert rows["tail"] == pytest.approx(1.0)
        assert all(rows[name] == 0 for name, *_ in step_trace.PHASES if name != "tail")


def test_step_trace_warp_spread_reads_how_far_apart_the_warps_run():
    # four warps of each warpgroup: warp 2 reaches the step's top 40 cycles after warp 0, warp 1 20
    # after, warp 3 with warp 0; one warpgroup-wide wait ("ready") brings them together, and the
    # tail spreads them again (warp 3 last by 30). The phases are read from warp 0, as a trace
    # without trace_warps reads them
    import numpy as np

    from flashrung.evidence import step_trace
    from flashrung.kernels.hopper.trace import CLOCK_SHIFT, EVENTS, WARPS_PER_WARPGROUP

    gaps = [60, 6, 8, 12, 14, 18, 40]
    period = sum(gaps) + 10
    late_at = {"top": [0, 20, 40, 0], "end": [0, 10, 0, 30]}
    clock = np.zeros((2, 2, 8, WARPS_PER_WARPGROUP, len(EVENTS)), dtype=np.int64)
    for cta in range(2):
        for wg in range(2):
            for step in range(8):
                t = (1 << 32) - 700 + 2 * cta + 50 * wg + step * period        # the clock wraps mid-trace
                for e, name in enumerate(EVENTS):
                    for w in range(WARPS_PER_WARPGROUP):
                        clock[cta, wg, step, w, e] = t + late_at.get(name, [0] * WARPS_PER_WARPGROUP)[w]
                    t += gaps[e] if e < len(gaps) else 0
    stamps = ((clock % (1 << 32)) >> CLOCK_SHIFT).astype(np.int32)
    stamps[:, :, 0] = -1
    summary = step_trace.summarize_warps(stamps, EVENTS)
    assert [summary["by_warpgroup"][0][name]["median"] for name, *_ in step_trace.PHASES] == gaps
    for rows in summary["warps"]:
        assert rows["top"]["spread"]["median"] == 40 and rows["top"]["late_median"] == [0, 20, 40, 0]
        assert rows["top"]["last_share"] == [0, 0, 1, 0]
        assert rows["ready"]["spread"]["median"] == 0
        assert rows["end"]["late_median"] == [0, 10, 0, 30] and rows["end"]["last_share"][3] == 1
    text = step_trace.table(summary)
    assert "warps apart" in text and "40 [40, 40] behind 0/20/40/0" in text
    # a trace without trace_warps reads as before, with no spread
    assert "warps" not in step_trace.summarize_warps(stamps[:, :, :, 0], EVENTS)
    with pytest.raises(ValueError, match="stamps must be"):
        step_trace.warp_spread(stamps[:, :, :, 0], EVENTS)


def test_trace_item_needs_the_step_trace():
    # which item the stamps go to means nothing without the stamps
    base = dataclasses.replace(fwd.default_config(128, False, 8192), split_tail=False)
    dataclasses.replace(base, trace_steps=16, trace_item=8).check(128)
    for changes in (dict(trace_item=8), dict(trace_steps=16, trace_item=-1)):
        with pytest.raises(ValueError, match="trace_item"):
            dataclasses.replace(base, **changes).check(128)


def test_trace_item_moves_the_stamps_and_nothing_else(census):
    # stamping item 8 instead of item 0 changes one comparison's constant: the same loops, the
    # same clock reads, no local memory in them
    item, first = census["d128-full-whole-tiles-traced-item"], census["d128-full-whole-tiles-traced"]
    assert "error" not in item["row"], item["row"].get("error")
    assert item["row"]["config"]["trace_item"] == 8
    assert item["clock_reads"] == first["clock_reads"]
    assert [loop["length"] for loop in item["kv_loops"]] == [loop["length"] for loop in first["kv_loops"]]
    assert all(loop["ldl"] == 0 for loop in item["kv_loops"])


def test_trace_warps_needs_the_step_trace():
    base = dataclasses.replace(fwd.default_config(64, False, 16384), split_tail=False)
    dataclasses.replace(base, trace_steps=8, trace_warps=True).check(64)
    with pytest.raises(ValueError, match="trace_warps"):
        dataclasses.replace(base, trace_warps=True).check(64)


def test_trace_steps_stamps_the_clock_only_when_on(census):
    # eight %clock reads in each steady step of the traced kernel; none in the untraced one (the
    # stamps are constexpr-guarded: the default kernels' SASS is what it was without the switch)
    traced, plain = census["d128-full-whole-tiles-traced"], census["d128-full-whole-tiles"]
    assert "error" not in traced["row"], traced["row"].get("error")
    assert plain["clock_reads"] == 0
    # two consumer partitions, each an unmasked and a masked loop: 8 stamps in each of the four
    assert traced["clock_reads"] >= 8 * 4
    assert all(not census[name]["clock_reads"] for name in census if "error" not in census[name]["row"]
               and not census[name]["row"]["config"].get("trace_steps")
               and not census[name]["row"]["config"].get("trace_tiles"))


# --------------------------------------------------------------------------- tile trace (trace_tiles)


def test_trace_tiles_needs_the_workspace_pointer_to_itself():
    base = fwd.default_config(128, True, 8192)
    dataclasses.replace(base, trace_tiles=8).check(128)
    # the split tail takes the coordinate pointer: the records go to the table pointer instead
    dataclasses.replace(fwd.default_config(128, False, 16384), trace_tiles=8).check(128)
    for changes in (dict(trace_steps=16), dict(trace_tiles=-1)):
        with pytest.raises(ValueError, match="trace_tiles"):
            dataclasses.replace(base, **{"trace_tiles": 8, **changes}).check(128)
    with pytest.raises(ValueError, match="exactly one"):
        fwd.traced_forward(None, None, None, True, 1.0, base)


def test_trace_tiles_on_the_split_tail_kernel_records_outside_its_kv_loops(census):
    # the split-tail kernel traced: each partition stamps the SM clock and the global timer at an
    # item's start and end, its K/V loops keep their length and touch no local memory (ptxas keeps
    # one value on the stack from the kernel's entry: one 4-byte STL and three LDL outside them)
    traced, plain = census["d128-full-tiles-traced"], census["d128-full"]
    assert "error" not in traced["row"], traced["row"].get("error")
    assert plain["row"]["config"]["split_tail"] and traced["row"]["config"]["split_tail"]
    assert traced["row"]["spill_bytes"] <= plain["row"]["spill_bytes"] + 16
    assert all(loop["ldl"] == 0 for loop in traced["kv_loops"])
    assert plain["global_timer_reads"] == 0 and traced["global_timer_reads"] >= 2 * 2
    assert traced["clock_reads"] >= 2 * 2
    for a, b in _steady_step_pairs(census, "d128-full-tiles-traced", "d128-full"):
        assert abs(a["length"] - b["length"]) <= 2 and a["mufu"] == b["mufu"], (a, b)


def test_trace_tiles_stamps_each_item_outside_its_kv_loops(census):
    # two stamps per work item and consumer partition (its start, its end), none inside the K/V
    # loops: the loops keep their length, and nothing goes to local memory
    traced, plain = census["d128-causal-tiles-traced"], census["d128-causal"]
    assert "error" not in traced["row"], traced["row"].get("error")
    assert traced["row"]["spill_bytes"] == 0 and traced["row"]["sass"]["LDL"] == 0
    assert plain["clock_reads"] == 0 and traced["clock_reads"] >= 2 * 2
    for a, b in _steady_step_pairs(census, "d128-causal-tiles-traced", "d128-causal"):
        assert abs(a["length"] - b["length"]) <= 2 and a["mufu"] == b["mufu"], (a, b)


def test_tile_trace_summary_splits_a_tile_into_its_fixed_part_and_its_steps():
    # synthetic records: cycles = 900 + 2600 per unmasked step + 3400 per masked step, stamps
    # across the 32-bit wrap, one item per CTA missing
    import numpy as np

    from flashrung.evidence import tile_trace
    from flashrung.kernels.hopper.trace import CLOCK_SHIFT, TILE_FIELDS

    rng = np.random.default_rng(0)
    ctas, groups, items = 16, 2, 6
    rec = np.full((ctas, groups, items, len(TILE_FIELDS)), -1, dtype=np.int64)
    for cta in range(ctas):
        for g in range(groups):
            t = (1 << 32) - 20_000 + 100 * cta
            for i in range(items - (cta == 3)):
                steps = int(rng.integers(2, 40))
                masked = int(rng.integers(0, 3))
                cycles = 900 + 2600 * (steps - masked) + 3400 * masked
                rec[cta, g, i, :4] = (t % (1 << 32)) >> CLOCK_SHIFT, ((t + cycles) % (1 << 32)) >> CLOCK_SHIFT, steps, masked
                t += cycles + 50
    summary = tile_trace.summarize(rec.astype(np.int32), TILE_FIELDS)
    for row in summary["by_warpgroup"]:
        assert row["n"] == ctas * items - 1
        fit = row["fit"]
        assert abs(fit["fixed"] - 900) < 2 and abs(fit["per_step"] - 2600) < 0.1 and abs(fit["per_masked"] - 3400) < 0.5
    assert "per masked step" in tile_trace.table(summary)
    # every item the same length: the fixed part and the steps' cannot be told apart
    same = rec.copy()
    same[..., 2], same[..., 3] = 8, 0
    assert tile_trace.summarize(same.astype(np.int32), TILE_FIELDS)["by_warpgroup"][0]["fit"] is None
    # one masked step in every item (a causal problem's diagonal): its cost goes into the fixed part
    diagonal = rec.copy()
    for cta in range(ctas):
        for g in range(groups):
            t = 1000 * cta
            for i in range(items):
                steps = 2 + (7 * cta + 3 * i + g) % 30
                cycles = 900 + 2600 * (steps - 1) + 3400
                diagonal[cta, g, i, :4] = t >> CLOCK_SHIFT, (t + cycles) >> CLOCK_SHIFT, steps, 1
                t += cycles + 50
    row = tile_trace.summarize(diagonal.astype(np.int32), TILE_FIELDS)["by_warpgroup"][1]
    assert row["fit"]["masked_in_fixed"] == 1 and row["fit"]["per_masked"] is None
    assert abs(row["fit"]["fixed"] - 4300) < 2 and abs(row["fit"]["per_step"] - 2600) < 0.1
    assert len(row["items"]) == ctas * items and row["items"][0][1:] == [3, 1]
    assert "(with 1 masked)" in tile_trace.table({"by_warpgroup": [row]})
    # one item in 96 with two masked steps and faster steps (a partial last tile): left out of the fit
    diagonal[5, 1, 2, 1] = diagonal[5, 1, 2, 0] + 1000
    diagonal[5, 1, 2, 3] = 2
    row = tile_trace.summarize(diagonal.astype(np.int32), TILE_FIELDS)["by_warpgroup"][1]
    assert row["left_out"] == 1 and row["fit"]["masked_in_fixed"] == 1 and abs(row["fit"]["fixed"] - 4300) < 2
    assert "1 items left out" in tile_trace.table({"by_warpgroup": [row]})
    with pytest.raises(ValueError, match="records must be"):
        tile_trace.summarize(np.zeros((2, 2, 4)), TILE_FIELDS)
    with pytest.raises(SystemExit, match="--tiles"):
        tile_trace.main(["--tiles", "0"])
    with pytest.raises(SystemExit, match="--split-tail: the split tail is non-causal only"):
        tile_trace.main(["--split-tail", "--causal"])


def test_tile_trace_lays_a_split_tail_out_on_the_global_timer():
    # synthetic launch on 4 CTAs of one warpgroup: 8 whole tiles of 10 µs (two rounds), then tile 8
    # split into 4 items of 3 µs, one per CTA; CTA 3 starts 1 µs late and its whole tiles end at
    # 21 µs. Global-timer stamps in 32 ns units, across the timer's wrap
    import numpy as np

    from flashrung.evidence import tile_trace
    from flashrung.kernels.hopper.trace import CLOCK_SHIFT, GLOBAL_TIMER_SHIFT, TILE_FIELDS

    f = {name: i for i, name in enumerate(TILE_FIELDS)}
    wrap, unit = 1 << (32 - GLOBAL_TIMER_SHIFT), (1 << GLOBAL_TIMER_SHIFT) / 1000.0   # µs per unit
    origin = wrap - 100                              # 3.2 µs before the wrap
    rec = np.full((4, 1, 4, len(TILE_FIELDS)), -1, dtype=np.int64)

    def put(cta, it, item, t0_us, t1_us, steps):
        r = rec[cta, 0, it]
        r[f["start"]], r[f["end"]] = int(t0_us * 1700) >> CLOCK_SHIFT, int(t1_us * 1700) >> CLOCK_SHIFT
        r[f["steps"]], r[f["masked"]], r[f["item"]] = steps, 0, item
        r[f["start_ns"]] = (origin + round(t0_us / unit)) % wrap
        r[f["end_ns"]] = (origin + round(t1_us / unit)) % wrap

    for cta in range(4):
        late = 1.0 if cta == 3 else 0.0
        put(cta, 0, cta, late, late + 10, 16)
        put(cta, 1, cta + 4, late + 10, late + 20, 16)
        put(cta, 2, 8 + cta, late + 20, late + 23, 1)
    tail = {"num_full_tiles": 8, "num_items": 12}
    summary = tile_trace.summarize(rec.astype(np.int32), TILE_FIELDS, tail=tail)
    kinds = summary["by_kind"]
    assert (kinds["whole"]["n"], kinds["split"]["n"]) == (8, 4)
    assert kinds["split"]["steps_max"] == 1 and abs(kinds["split"]["cycles_median"] - 3 * 1700) < 4
    t = summary["timeline"]
    assert t["complete"] and t["items"] == 12
    assert abs(t["span_us"] - 24) < 0.1 and abs(t["first_idle_us"] - 23) < 0.1 and abs(t["tail_us"] - 1) < 0.1
    assert abs(t["idle_share"] - 3 * 1 / (4 * 24)) < 0.01
    # every CTA's items take the same cycles: the idle is the late start's, none of it the items'
    assert abs(t["cycles_idle_share"]) < 1e-3
    assert abs(t["split_window_us"][0] - 20) < 0.1 and abs(t["split_window_us"][1] - 24) < 0.1
    assert abs(t["whole_end_us"] - 21) < 0.1
    text = tile_trace.table(summary)
    assert "split items: 4" in text and "span 24.0 µs" in text and "split items run 20.0-24.0 µs" in text
    assert "(0.00% in the items' SM cycles)" in text
    # CTA 0's last item twice as long in cycles (ending 3 µs later): its load 26 of the others' 23
    put(0, 2, 8, 20, 26, 1)
    longer = tile_trace.summarize(rec.astype(np.int32), TILE_FIELDS, tail=tail)["timeline"]
    assert abs(longer["cycles_idle_share"] - (1 - (26 + 3 * 23) / 4 / 26)) < 2e-3
    put(0, 2, 8, 20, 23, 1)
    # an item left unrecorded: the timeline says it is partial
    rec[2, 0, 2] = -1
    partial = tile_trace.summarize(rec.astype(np.int32), TILE_FIELDS, tail=tail)["timeline"]
    assert partial["complete"] is False and "raise --tiles" in tile_trace.table(
        {"by_warpgroup": [], "timeline": partial})


def test_step_trace_probe_summarizes_what_it_traced(monkeypatch, capsys):
    # the step-trace probe end to end with the traced call replaced by synthetic stamps (every
    # event 100 cycles after the one before): run_probe hands its summarizer the stamps alone
    import numpy as np

    from flashrung.evidence import step_trace
    from flashrung.kernels.hopper.trace import CLOCK_SHIFT, EVENTS

    steps = 6
    t = np.arange(2 * 2 * steps * len(EVENTS), dtype=np.int64).reshape(2, 2, steps, len(EVENTS)) * 100
    stamps = (t >> CLOCK_SHIFT).astype(np.int32)
    stamps[:, :, 0] = -1

    def fake_traced_run(args, **trace):
        assert trace == {"trace_steps": steps} and not getattr(args, "split_tail", False)
        common = dict(shape={}, config={}, gpu="synthetic", outputs_bit_identical=True, median_ms={},
                      evidence="synthetic", tail=dict(num_items=1, num_full_tiles=1, splits=1))
        return dict(stamps=stamps, identical=True, ms={"traced": 1.0, "untraced": 1.0}, common=common)

    monkeypatch.setattr(step_trace, "traced_run", fake_traced_run)
    assert step_trace.main(["--steps", str(steps)]) == 0
    out = capsys.readouterr().out
    assert "step trace" in out and "back-to-back" not in out and "B2 H16 S16384" in out
    # a pack's heading names its lengths; the launch is sized by the count and the longest
    assert step_trace.main(["--steps", str(steps), "--packed", "8192,1024x2"]) == 0
    assert "packed 8192,1024,1024 H16" in capsys.readouterr().out
    # a preheated trace says so in its heading
    assert step_trace.main(["--steps", str(steps), "--preheat-ms", "2500"]) == 0
    assert "the launch after 2500 ms of back-to-back calls" in capsys.readouterr().out
    # --item asks for a later item's steps and says so; a negative one is refused before any call
    seen = {}

    def item_traced_run(args, **trace):
        seen.update(trace)
        return fake_traced_run(args, **{k: v for k, v in trace.items() if k != "trace_item"})

    monkeypatch.setattr(step_trace, "traced_run", item_traced_run)
    assert step_trace.main(["--steps", str(steps), "--item", "5"]) == 0
    assert seen["trace_item"] == 5 and "item 5" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--item"):
        step_trace.main(["--steps", str(steps), "--item", "-1"])


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_trace_probes_refuse_a_preheat_that_is_not_a_duration(value, capsys):
    # --preheat-ms is milliseconds, zero or more: anything else is refused by name, not run
    from flashrung.evidence import step_trace, tile_trace

    for parser in (step_trace.build_parser(), tile_trace.build_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args(["--preheat-ms", value])
        assert "--preheat-ms" in capsys.readouterr().err
    assert step_trace.build_parser().parse_args([]).preheat_ms == 0.0


def test_preheat_keeps_calling_until_its_time_is_up():
    # the load before a kept launch lasts the time asked (the clock settles over it), synchronizing
    # after every few calls so the host does not queue past the deadline
    import time

    from flashrung.evidence.step_trace import PREHEAT_CALLS_PER_SYNC, preheat

    calls, syncs = [], []
    start = time.perf_counter()
    n = preheat(lambda: calls.append(1), 30, sync=lambda: syncs.append(len(calls)))
    elapsed = time.perf_counter() - start
    assert elapsed >= 0.030 and n == len(calls) > 0
    every = PREHEAT_CALLS_PER_SYNC
    assert n % every == 0 and syncs == list(range(every, n + 1, every))
    assert preheat(lambda: calls.append(1), 0, sync=lambda: None) == 0


def test_tile_trace_probe_reports_the_timeline_of_what_it_traced(monkeypatch, tmp_path, capsys):
    # the probe end to end with the traced call replaced by synthetic records: the launch plan it
    # carries reaches the summary (whole and split items apart), the table and the JSON
    import json

    import numpy as np

    from flashrung.evidence import step_trace, tile_trace
    from flashrung.kernels.hopper.trace import TILE_FIELDS

    f = {name: i for i, name in enumerate(TILE_FIELDS)}
    rec = np.full((2, 1, 3, len(TILE_FIELDS)), -1, dtype=np.int32)
    for cta in range(2):
        for it, (item, steps) in enumerate([(cta, 16), (2 + cta, 16), (4 + cta, 1)]):
            t0 = 1000 * it + 10 * cta
            rec[cta, 0, it, [f["start"], f["end"], f["steps"], f["masked"], f["item"], f["start_ns"], f["end_ns"]]] = (
                t0 * 50, (t0 + 900) * 50, steps, 0, item, t0, t0 + 900)
    seen = {}

    def fake_traced_run(args, **trace):
        seen.update(trace, split_tail=args.split_tail)
        common = dict(shape={}, config={}, gpu="synthetic", outputs_bit_identical=True, median_ms={},
                      evidence="synthetic", tail=dict(num_items=6, num_full_tiles=4, splits=2))
        return dict(stamps=rec, identical=True, ms={"traced": 1.0, "untraced": 1.0}, common=common)

    monkeypatch.setattr(step_trace, "traced_run", fake_traced_run)
    path = tmp_path / "tiles.json"
    assert tile_trace.main(["--tiles", "3", "--split-tail", "--json", str(path)]) == 0
    assert seen == {"trace_tiles": 3, "split_tail": True}
    summary = json.loads(path.read_text())
    assert summary["by_kind"]["split"]["n"] == 2 and summary["by_kind"]["whole"]["n"] == 4
    assert summary["timeline"]["complete"] and summary["timeline"]["split_window_us"][0] > 0
    assert "split items: 2" in capsys.readouterr().out


def _traced_beside_plain(head_dim, causal, shape, window=None, head_dim_v=None, **trace):
    """``(q, k, v, the untraced config, the traced call's records)`` for random bf16 inputs of
    ``shape`` (batch, seqlen, heads), once the traced output is bit-identical to the untraced one;
    ``window``: a sliding window, on the windowed default; ``head_dim_v``: v's own head dim."""
    from flashrung.dispatch import NO_WINDOW, Problem

    batch, seqlen, heads = shape
    q, k, v = _seeded_qkv(batch, seqlen, heads, head_dim)
    if head_dim_v is not None:
        v = torch.randn(batch, seqlen, heads, head_dim_v, device="cuda", dtype=torch.bfloat16)
    window = NO_WINDOW if window is None else window
    base = dataclasses.replace(fwd.select_config(Problem.of(q, k, v, causal, window_size=window)), split_tail=False)
    out, lse = fwd.forward(q, k, v, causal, head_dim ** -0.5, base, window_size=window)
    t_out, t_lse, records = fwd.traced_forward(q, k, v, causal, head_dim ** -0.5, dataclasses.replace(base, **trace),
                                               window_size=window)
    assert torch.equal(out, t_out) and torch.equal(lse, t_lse)
    return q, k, v, base, records


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim, causal", [(128, True), (128, False), (64, True)])
def test_traced_tiles_change_no_output_and_record_every_item(head_dim, causal):
    *_, rec = _traced_beside_plain(head_dim, causal, (2, 2048, 8), trace_tiles=4)
    r = rec.cpu().long()
    whole = (r >= 0).all(dim=3)
    assert whole[:, :, 0].all()                       # every CTA has a first item, every consumer records it
    steps, masked = r[..., 2][whole], r[..., 3][whole]
    assert (steps >= 1).all() and (masked <= steps).all()
    assert bool((masked > 0).any()) == causal         # 2048 keys fill their tiles: only the diagonal masks
    cycles = (r[..., 1] - r[..., 0]) % (1 << 31)
    assert (cycles[whole] > 0).all() and (cycles[whole] < 100_000_000).all()


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim, causal, window", [(64, True, (1024, 0)), (128, True, (512, 0)),
                                                      (128, False, (300, 700))])
def test_traced_tiles_of_a_window_change_no_output_and_count_its_edge_steps(head_dim, causal, window):
    # a windowed launch traced (the windowed default, grid and stamps sized as forward's plan):
    # bit-identical to the untraced call, and its items stop at the window's left edge — none runs
    # every K/V tile of the 4096 keys; each counts as masked its peeled first step (a windowed launch
    # masks it always), the window's cut tiles and the diagonal's (a band's last items have none)
    *_, rec = _traced_beside_plain(head_dim, causal, (1, 4096, 8), window=window, trace_tiles=4)
    r = rec.cpu().long()
    whole = (r >= 0).all(dim=3)
    assert whole[:, :, 0].all()
    steps, masked = r[..., 2][whole], r[..., 3][whole]
    assert (steps >= 1).all() and (masked >= 1).all() and (masked <= steps).all()
    tiles = 4096 // 128
    assert steps.max() < tiles and steps.max() <= (sum(max(side, 0) for side in window) + 192) // 128 + 2


@pytest.mark.gpu
@on_hopper
def test_traced_split_tail_changes_no_output_and_records_its_split_items():
    # the split tail traced (d128 non-causal B3 H12 S1000: 264 whole tiles and 24 tail tiles split
    # 5 ways on 132 SMs): the output is the untraced kernel's bit for bit, every item is recorded
    # once per consumer, split items by their index, with their share of the K/V steps
    q, k, v = _seeded_qkv(3, 1000, 12, 128)
    cfg = dataclasses.replace(fwd.default_config(128, False, 1000), split_tail=True)
    plan = fwd._plan(cfg, 3, 1000, 1000, 12, 12, 128, 2, False, True,
                     torch.cuda.get_device_properties(0).multi_processor_count)
    assert plan.splits > 1
    out, lse = fwd.forward(q, k, v, False, 128 ** -0.5, cfg)
    t_out, t_lse, rec = fwd.traced_forward(q, k, v, False, 128 ** -0.5, dataclasses.replace(cfg, trace_tiles=8))
    assert torch.equal(out, t_out) and torch.equal(lse, t_lse)
    r = rec.cpu().long()
    done = (r >= 0).all(dim=3)
    items = r[..., 4][done]
    assert sorted(items.tolist()) == sorted(list(range(plan.num_items)) * cfg.num_consumers)
    steps = r[..., 2][done]
    split = items >= plan.num_full_tiles
    assert (steps[~split] == 8).all() and (steps[split] < 8).all() and (steps[split] >= 1).all()
    span = (r[..., 6] - r[..., 5])[done]          # global timer, 32 ns units: a positive, short item
    assert (span > 0).all() and (span < 1_000_000).all()


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim, causal", [(128, False), (64, True), (256, False)])
def test_traced_forward_changes_no_output_and_stamps_every_whole_step(head_dim, causal):
    steps = 12
    q, k, v, base, stamps = _traced_beside_plain(head_dim, causal, (1, 1000, 4), trace_steps=steps)
    with pytest.raises(ValueError, match="traced_forward"):
        fwd.forward(q, k, v, causal, head_dim ** -0.5, dataclasses.replace(base, trace_steps=steps))
    s = stamps.cpu().long()
    assert (s[:, :, 0] == -1).all()           # the peeled first step is not stamped
    whole = (s >= 0).all(dim=3)
    assert whole.any()
    # within a stamped step the events come in order and close together (no wrap misread)
    deltas = (s[..., 1:] - s[..., :-1]) % (1 << 31)
    assert (deltas[whole] < 10_000_000).all()


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_traced_pack_changes_no_output_and_records_each_sequence_s_items(causal):
    # a pack traced on its default grid (tiles drawn at run time through the table): the stamps
    # change no output, and the items recorded are the pack's tiles with a row, each with the
    # K/V steps of its own sequence (at most the longest's, 4097 keys: 33 tiles of 128)
    from flashrung.gate import cu_seqlens

    lengths = (1000, 4097, 17, 300)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, sum(lengths), 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = cu_seqlens(lengths, "cuda")
    packing = dict(cu_seqlens=(cu, cu), max_seqlens=(max(lengths), max(lengths)))
    problem = Problem.of_packed(q, k, v, causal, len(lengths), packing["max_seqlens"])
    base = select_config(problem)
    out, lse = fwd.forward(q, k, v, causal, 128 ** -0.5, base, **packing)
    t_out, t_lse, rec = fwd.traced_forward(q, k, v, causal, 128 ** -0.5, dataclasses.replace(base, trace_tiles=16),
                                           **packing)
    assert torch.equal(out, t_out) and torch.equal(lse, t_lse)
    r = rec.cpu().long()
    whole = (r >= 0).all(dim=3)
    steps = r[..., 2][whole]
    # every tile with a row: 8 + 33 + 1 + 3 q-tiles of 128 rows a head, 4 heads; each consumer
    # warpgroup of a tile records it (the last tiles' second warpgroup may have no rows: skipped)
    tiles = sum(-(-n // base.block_m) for n in lengths) * 4
    assert whole[:, 0].sum() == tiles
    assert (steps >= 1).all() and steps.max() == -(-max(lengths) // base.kv_tile)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_traced_mla_split_changes_no_output_and_counts_its_128_key_steps(causal):
    # MLA's 192/128 default (the split on 128-key tiles) traced like any row: the stamps change no
    # output, and a tile's steps are the 128-key tiles of its keys (4096 keys: 32 unmasked; a
    # causal tile of 128 rows ends on one masked step of its own diagonal)
    *_, rec = _traced_beside_plain(192, causal, (1, 4096, 4), head_dim_v=128, trace_tiles=4)
    r = rec.cpu().long()
    whole = (r >= 0).all(dim=3)
    assert whole[:, :, 0].all()
    steps, masked = r[..., 2][whole], r[..., 3][whole]
    assert steps.max() == 4096 // 128 and (steps >= 1).all()
    assert bool((masked > 0).any()) == causal
    *_, stamps = _traced_beside_plain(192, causal, (1, 1000, 4), head_dim_v=128, trace_steps=6)
    s = stamps.cpu().long()
    assert (s[:, :, 0] == -1).all() and (s >= 0).all(dim=3).any()


@pytest.mark.gpu
@on_hopper
def test_traced_item_changes_no_output_and_stamps_only_ctas_that_reach_it():
    # B4 H16 S2048 d128: 1024 tiles on 132 CTAs, 7-8 items each; item 7 exists on some CTAs only
    steps = 8
    *_, first = _traced_beside_plain(128, False, (4, 2048, 16), trace_steps=steps)
    *_, later = _traced_beside_plain(128, False, (4, 2048, 16), trace_steps=steps, trace_item=7)
    stamped = lambda s: (s.cpu().long() >= 0).all(dim=3).any(dim=(1, 2))     # per CTA
    assert stamped(first).all()
    assert stamped(later).any() and not stamped(later).all()


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim, causal", [(64, False), (128, True)])
def test_traced_warps_change_no_output_and_each_warp_stamps_its_own_events(head_dim, causal):
    from flashrung.kernels.hopper.trace import EVENTS, WARPS_PER_WARPGROUP

    steps = 12
    *_, stamps = _traced_beside_plain(head_dim, causal, (1, 1000, 4), trace_steps=steps, trace_warps=True)
    s = stamps.cpu().long()
    assert s.shape[3:] == (WARPS_PER_WARPGROUP, len(EVENTS))
    assert (s[:, :, 0] == -1).all()
    whole = (s >= 0).all(dim=4)                      # [CTAs, warpgroups, steps, warps]
    # a step is stamped by all four warps or by none
    assert (whole.all(dim=3) == whole.any(dim=3)).all() and whole.any()
    # the warps of one warpgroup reach each event within a step of each other
    apart = (s - s[:, :, :, :1]) % (1 << 31)
    apart = torch.minimum(apart, (1 << 31) - apart)
    assert (apart[whole] < 100_000).all()


def test_step_trace_probe_refuses_bad_arguments_before_touching_a_gpu():
    from flashrung.evidence import step_trace, tile_trace
    from flashrung.evidence.probe_args import set_overrides

    with pytest.raises(SystemExit, match="--steps"):
        step_trace.main(["--steps", "2"])
    # --set is read as impl="hopper.fwd@..." reads it, one parser for every probe
    with pytest.raises(SystemExit, match="--set: .*expected name@key=value"):
        step_trace.main(["--set", "pingpong"])
    with pytest.raises(SystemExit, match="--set: "):
        tile_trace.main(["--set", "pingpong=true,named_turns"])
    # a window the mask cannot take, named by its flag (a causal row's right side is the mask's)
    with pytest.raises(SystemExit, match="--window: a causal row's window right side"):
        tile_trace.main(["--causal", "--window", "1024,5"])
    with pytest.raises(SystemExit, match="--window: .*bounds no side"):
        step_trace.main(["--window=-1,-1"])
    with pytest.raises(SystemExit):
        tile_trace.main(["--window", "1024"])
    # a head dim hopper.fwd does not take, named by its flag; MLA's pair is parsed, not refused
    with pytest.raises(SystemExit, match="--headdim: head_dim must be a multiple of"):
        step_trace.main(["--headdim", "100"])
    with pytest.raises(SystemExit, match="--headdim-v: head_dim_v must be a multiple of"):
        tile_trace.main(["--headdim", "192", "--headdim-v", "320"])
    parsed = tile_trace.build_parser().parse_args(["--headdim", "192", "--headdim-v", "128"])
    assert (parsed.headdim, parsed.headdim_v) == (192, 128)
    # a pack gives the batch and the lengths: --batch or --seqlen beside it is refused by name
    with pytest.raises(SystemExit, match="--packed gives the sequences .* drop --batch, --seqlen"):
        tile_trace.main(["--packed", "1000,17", "--batch", "2", "--seqlen", "1000"])
    with pytest.raises(SystemExit):
        tile_trace.build_parser().parse_args(["--packed", "1000,0x"])
    assert set_overrides("pingpong=true, named_turns=true") == {"pingpong": "true", "named_turns": "true"}
