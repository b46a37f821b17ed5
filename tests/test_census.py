"""The census compiles real kernels for three architectures with no GPU, and the instructions
that define each architecture's path show up in the SASS."""
import json
import subprocess
import sys

import pytest

from flashrung.evidence import census


def run_census(arch, kernel):
    env = census.interpreter_free_env()
    out = subprocess.run([sys.executable, "-m", "flashrung.cli", "census", "--arch", arch,
                          "--kernel", kernel, "--json"], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def sm90_rows():
    return run_census("sm_90a", "portable.fwd")


# the compile machinery's shortcuts, each against the long way round, in a fresh process with an
# empty Triton cache (so that the compile, and its ptxas log, happen there): hopper.fwd's 192-key
# tile in FA4's order (its build spills 16 B, so the spill counts are not all zero) and its d128
# causal default (inline arrivals: a TTGIR-only first build)
_SHORTCUTS_SCRIPT = r"""
import dataclasses, json, torch
from flashrung.evidence import census
from flashrung.kernels.hopper import fwd

cfg = fwd.replace_following(fwd.default_config(128, False, 16384, key_tail=True), 128, kv_multicast=False)
cfg = dataclasses.replace(cfg, extra_keys=64, separate_o=False, pingpong=True, wait_pv_early=True, named_turns=True,
                          skip_empty_rows=False, asm_arrivals=False, rescale_threshold=0, rescale_by_warp=False)
spec = fwd.census_spec(cfg, 128, False, torch.bfloat16, key_tail=True)
compiled, log = census.compile_with_ptxas_log(spec, "sm_90a")
out = dict(log=log is not None, from_log=census.ptxas_spills(compiled.asm["ptx"], log),
           rerun=census.ptxas_spills(compiled.asm["ptx"]))
cfg = fwd.default_config(128, True, 16384, key_tail=True)
assert cfg.asm_arrivals
spec = fwd.census_spec(cfg, 128, True, torch.bfloat16, key_tail=True)
compile_with = census.spec_compiler(spec, "sm_90a")
filled = spec.resolve(compile_with, dict(spec.constexprs))
ttgir = compile_with(filled, ttgir_only=True)
out.update(ttgir_equal=ttgir == compile_with(filled).asm["ttgir"], ttgir_chars=len(ttgir))
# kept in Triton's cache beside the compiles (one for the placeholders' build, one for the filled)
import glob, os
kept = glob.glob(os.path.join(os.environ["TRITON_CACHE_DIR"], "*", "*.ttgir-only"))
out.update(kept=len(kept), read_back_equal=compile_with(filled, ttgir_only=True) == ttgir)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def shortcuts(tmp_path_factory):
    env = dict(census.interpreter_free_env(), TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton-cache")))
    out = subprocess.run([sys.executable, "-c", _SHORTCUTS_SCRIPT], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_spills_read_from_the_compiles_own_ptxas_log_are_a_second_ptxas_runs(shortcuts):
    # property: the census reads spills from the ptxas -v output Triton's own compile printed,
    # not from assembling the PTX again, and the two agree on a build that spills
    assert shortcuts["log"]
    assert shortcuts["from_log"] == shortcuts["rerun"] and shortcuts["from_log"][1] > 0, shortcuts


def test_a_ttgir_only_build_is_the_compiled_builds_ttgir(shortcuts):
    # property: resolve_shared_offsets' first build stops at TTGIR (pipeline.ttgir_of); that text is
    # the one the whole compile lowers from, character for character, so the allocation pass
    # reads the same offsets from it
    assert shortcuts["ttgir_equal"] and shortcuts["ttgir_chars"] > 10_000, shortcuts


def test_a_ttgir_only_build_is_kept_in_tritons_cache_and_read_back(shortcuts):
    # property: a later process finds the TTGIR-only build where it finds the compiled kernels
    # (Triton's cache, under the key a compile of the same source and options is filed under)
    # and reads back the same text, instead of running Triton's front end again
    assert shortcuts["kept"] == 2 and shortcuts["read_back_equal"], shortcuts


def test_census_json_schema(sm90_rows):
    assert len(sm90_rows) == 6   # d in {64, 128, 256} x causal
    for row in sm90_rows:
        assert row["kernel"] == "portable.fwd" and row["arch"] == "sm_90a"
        assert {"head_dim", "causal"} <= set(row["config"])
        for key in ("regs", "smem_bytes", "spill_bytes"):
            assert isinstance(row[key], int)
        for fam in ("HGMMA", "HMMA", "MUFU.EX2", "LDGSTS", "UTMALDG", "USETMAXREG", "total"):
            assert isinstance(row["sass"][fam], int)


def test_portable_forward_uses_wgmma_on_hopper_without_spills(sm90_rows):
    for row in sm90_rows:
        assert row["sass"]["HGMMA"] > 0 and row["sass"]["HMMA"] == 0, row
        assert row["sass"]["MUFU.EX2"] > 0, row          # exp2 softmax
        # d256 spills a little with every tile shape tried (see common.forward_config); guard
        # that it stays small, and that d <= 128 does not spill at all
        assert row["spill_bytes"] <= (256 if row["config"]["head_dim"] > 128 else 0), row
        assert row["smem_bytes"] <= census.ARCHES["sm_90a"][1]


def test_portable_census_is_the_binary_a_contiguous_launch_runs(sm90_rows):
    # property: the census compiles the portable forward as a launch on contiguous tensors whose
    # lengths and heads are multiples of 16 specializes it — the strides known multiples of 16, so
    # its K/V loads are cp.async copies (LDGSTS), which an unspecialized build has none of
    from flashrung.kernels.portable.common import CENSUS_LAUNCH_LABEL

    for row in sm90_rows:
        assert row["config"]["launch"] == CENSUS_LAUNCH_LABEL, row["config"]
        assert row["sass"]["LDGSTS"] > 0, row


def test_the_frozen_row_maxs_recompute_compiles_for_hopper():
    # property: portable.recompute_flagged's kernel (hopper.fwd's guard sends flagged rows to it)
    # builds for sm_90a as a launch compiles it — the CPU tests only interpret it, and the
    # interpreter accepts what a compile refuses (a module global inside the kernel) — on wgmma,
    # within shared memory; its grid-stride loop around the tile and the word's reset after it cost
    # d64 non-causal 136 B of spills (104 B before the reset; a rare path: it runs only when a launch
    # flagged a row), d128 none
    rows = run_census("sm_90a", "portable.recompute_flagged")
    assert len(rows) == 4
    for row in rows:
        assert row.get("error") is None, row.get("error")
        assert row["sass"]["HGMMA"] > 0 and row["sass"]["MUFU.EX2"] > 0, row
        assert row["spill_bytes"] <= (160 if row["config"]["head_dim"] == 64 else 0), row
        assert row["smem_bytes"] <= census.ARCHES["sm_90a"][1]


def test_portable_forward_uses_mma_sync_on_ampere_and_fits_sm120():
    rows = run_census("sm_80", "portable.fwd")
    assert all(r["sass"]["HMMA"] > 0 and r["sass"]["HGMMA"] == 0 for r in rows)
    rows = run_census("sm_120", "portable.fwd")
    assert all(r["smem_bytes"] <= census.ARCHES["sm_120"][1] for r in rows), rows


def test_count_sass_counts_families_and_predicated_instructions():
    listing = """
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0020*/              @P0  MUFU.EX2 R3, R3 ;
        /*0030*/                   MUFU.RCP R4, R4 ;
        /*0040*/              @!P1 BRA 0x100 ;
    """
    counts = census.count_sass(listing)
    assert counts["HGMMA"] == 1 and counts["MUFU.EX2"] == 1 and counts["MUFU"] == 2
    assert counts["BRA"] == 1 and counts["total"] == 4


def test_packed_exp2_saves_no_mufu_issue_on_hopper():
    # Why half-precision exponentials are not a softmax lever on sm_90a: ptxas splits the packed
    # f16x2 / bf16x2 ex2 into one MUFU.EX2 per half, as many MUFU issues as the f32 form
    # (flashrung.evidence.packed_exp2; docs/hopper.md, the softmax-side levers)
    out = subprocess.run([sys.executable, "-m", "flashrung.evidence.packed_exp2", "--arch", "sm_90a"],
                         capture_output=True, text=True, env=census.interpreter_free_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result) == {"f16x2", "bf16x2", "f32"}
    for form, row in result.items():
        assert row["mufu_ex2"] == row["elements_per_thread"], (form, row)
    assert result["f16x2"]["sass"] == {"MUFU.EX2.F16": result["f16x2"]["elements_per_thread"]}
    assert result["bf16x2"]["sass"] == {"MUFU.EX2.BF16": result["bf16x2"]["elements_per_thread"]}


_EXP2_RATE_SCRIPT = r"""
import json, os, tempfile
from flashrung.evidence import census, packed_exp2 as P
out = {}
for form, (asm, constraint, pack, dtype) in P.RATE_FORMS.items():
    spec = census.CensusSpec(kernel=f"probe.exp2_rate.{form}", config={"form": form}, fn=P._exp2_rate,
                             signature={"x_ptr": {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16"}[dtype]},
                             constexprs={"ROUNDS": P.RATE_ROUNDS, "E": P.RATE_ELEMENTS_PER_THREAD, "ASM": asm,
                                         "CONSTRAINT": constraint, "PACK": pack,
                                         "N": P.RATE_ELEMENTS_PER_THREAD * P.THREADS}, num_warps=P.THREADS // 32)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        open(path, "wb").write(census.compile_spec(spec, "sm_90a").asm["cubin"])
        loops = census.innermost_loops(census.sass_text(path), min_length=4)
    out[form] = [{k: loop.get(k, 0) for k in ("MUFU", "MUFU.EX2", "LDG", "STG", "total")} for loop in loops]
print(json.dumps(out))
"""


def test_exp2_rate_kernel_times_the_exponentials_alone():
    # packed_exp2 --time's throughput kernel: one loop a form whose work is MUFU.EX2 (one per
    # element of each unrolled round, 16-bit halves included) with no memory traffic in it, so its
    # elements a nanosecond are the MUFU pipe's rate in that form
    from flashrung.evidence import packed_exp2

    out = subprocess.run([sys.executable, "-c", _EXP2_RATE_SCRIPT], capture_output=True, text=True,
                         env=census.interpreter_free_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for form, loops in json.loads(out.stdout.strip().splitlines()[-1]).items():
        assert len(loops) == 1, (form, loops)
        loop = loops[0]
        assert loop["MUFU"] == loop["MUFU.EX2"] > 0 and loop["MUFU"] % packed_exp2.RATE_ELEMENTS_PER_THREAD == 0
        assert loop["LDG"] == loop["STG"] == 0, (form, loop)


def test_cluster_probe_compiles_the_pieces_of_a_kv_multicast():
    # The path to K/V multicast across a two-CTA cluster that Gluon 3.6's API does not offer, kept
    # compiling: the pair-copy probe's inline PTX reaches the SASS as the instructions it names —
    # the multicast TMA copy, the cluster barriers (after the barriers' init and before exit) and
    # the remote release — and the window it addresses from global_smem is the kernel's one
    # allocation, at offset 0 (flashrung.evidence.cluster_probe; docs/hopper.md, Open items)
    from flashrung.evidence import cluster_probe

    out = subprocess.run([sys.executable, "-m", "flashrung.evidence.cluster_probe", "--arch", "sm_90a"],
                         capture_output=True, text=True, env=census.interpreter_free_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["pieces"] == {"multicast_copy": 1, "cluster_barrier_arrive": 2, "cluster_barrier_wait": 2,
                                "remote_arrive": 1}
    assert result["allocations"] == {"window": 0}
    assert result["shared_bytes"] == 2 * cluster_probe.TILE_WORDS * cluster_probe.WORD_BYTES
    assert result["spill_bytes"] == 0


@pytest.mark.gpu
def test_cluster_pair_copy_gives_each_cta_both_halves():
    # Run on an sm_90 GPU in clusters of two: each CTA copies half of its cluster's tile into both
    # CTAs; every CTA must end with the whole tile, its own half and its peer's, and no CTA may
    # hang on a release its peer never sent
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (a cluster launch with TMA multicast)")
    from flashrung.evidence import cluster_probe

    result = cluster_probe.run(clusters=66)
    assert result == {"ctas": 132, "halves_wrong": 0, "ctas_missing_peer_half": 0}


def test_wgmma_neighbor_probe_builds_each_variant_it_times():
    # flashrung.evidence.wgmma_neighbor (docs/hopper.md): the stream partition issues its operation
    # and nothing of the other kind; a GEMM partition issues wgmma, from registers where the
    # variant says so (PV's form), or mma.sync (the ladder's), and an idle one neither; no variant
    # spills
    out = subprocess.run([sys.executable, "-m", "flashrung.evidence.wgmma_neighbor", "--census"],
                         capture_output=True, text=True, env=census.interpreter_free_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result) == 11
    for label, row in result.items():
        assert row["spill_bytes"] == 0, label
        op_count, other = (row["MUFU.EX2"], row["FFMA"]) if label.startswith("ex2") else (row["FFMA"], row["MUFU.EX2"])
        assert op_count > 0 and other == 0, (label, row)
        assert (row["HGMMA"] == 0) == label.endswith(("idle", "mma.sync")), (label, row)
        assert (row["HMMA"] > 0) == label.endswith("mma.sync"), (label, row)
        assert (row["hgmma_register_a"] == row["HGMMA"] > 0) == label.endswith("A in registers"), (label, row)


def test_innermost_loops_skip_outer_loops_and_short_ones():
    # an outer loop (0x10-0x70) around two inner ones (0x20-0x30, 0x40-0x60): the inner ones are
    # counted, the outer one is not, and min_length drops the shorter; a predicated backward
    # branch still closes a loop
    listing = """
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   FADD R1, R1, R1 ;
        /*0030*/              @P0  BRA 0x20 ;
        /*0040*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0060*/              @!P1 BRA 0x40 ;
        /*0070*/                   BRA 0x10 ;
        /*0080*/                   EXIT ;
    """
    loops = census.innermost_loops(listing, min_length=1)
    assert [loop["length"] for loop in loops] == [2, 3]
    assert loops[1]["HMMA"] == 1 and loops[1]["BAR"] == 1 and loops[1]["BRA"] == 1 and loops[0]["FADD"] == 1
    assert [loop["length"] for loop in census.innermost_loops(listing, min_length=3)] == [3]
    assert loops[1]["sequence"] == "HMMA BAR BRA"
    assert census.innermost_loops("/*0010*/ EXIT ;") == []


def test_a_key_loop_with_an_mbarrier_spin_inside_is_still_innermost():
    # a warp-specialized consumer's K/V loop waits on an mbarrier: a two-instruction spin loop
    # inside it. Loops shorter than min_length do not make the key loop outer
    listing = """
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R3 ;
        /*0030*/              @!P0 BRA 0x20 ;
        /*0040*/                   MUFU.EX2 R5, R5 ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0060*/              @P1  BRA 0x10 ;
    """
    (loop,) = census.innermost_loops(listing, min_length=4)
    assert loop["length"] == 6 and loop["HGMMA"] == 1 and loop["MUFU.EX2"] == 1
    assert [x["length"] for x in census.innermost_loops(listing, min_length=1)] == [2]


def test_as_launched_specializes_as_a_launch_does():
    # property: the census of a launch is compiled on what Triton specializes that launch on — an
    # integer equal to 1 a constexpr, one divisible by 16 and every pointer "divisible by 16" —
    # and nothing it does not: an integer left out of the values, or declared do_not_specialize
    import types

    from flashrung.evidence.census import CensusSpec, as_launched

    fn = types.SimpleNamespace(arg_names=["x_ptr", "n", "stride", "group", "odd", "free", "scale"],
                               do_not_specialize=["free"])
    spec = CensusSpec(kernel="k", config={"d": 1}, fn=fn,
                      signature={"x_ptr": "*fp16", "n": "i32", "stride": "i32", "group": "i32", "odd": "i32",
                                 "free": "i32", "scale": "fp32"}, constexprs={"BLOCK": 64})
    out = as_launched(spec, {"n": 4096, "stride": 128, "group": 1, "odd": 17, "free": 32}, "B")
    assert out.signature["group"] == "constexpr" and out.constexprs == {"BLOCK": 64, "group": 1}
    assert set(out.aligned) == {"x_ptr", "n", "stride"}
    assert out.signature["odd"] == "i32" and out.config == {"d": 1, "launch": "B"}
    assert spec.aligned == () and spec.signature["group"] == "i32"      # the spec itself untouched
    with pytest.raises(ValueError, match="values names integer arguments"):
        as_launched(spec, {"scale": 16}, "B")


def test_turn_to_first_hgmma_counts_from_the_last_barrier_before_the_first_product():
    """Protects the census's reading of a pingpong loop's issue: the distance runs from the last
    wait ahead of the first HGMMA (a named barrier's BAR.SYNC or an mbarrier try-wait: the turn,
    not an earlier wait) to that HGMMA, and a loop with no product or no wait ahead of it has none."""
    from flashrung.evidence.census import turn_to_first_hgmma

    loop = ["BAR.SYNC.DEFER_BLOCKING 0x2, 0x80", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9], R24",
            "BAR.SYNC.DEFER_BLOCKING 0x9, 0x100", "UIADD3.64 UR46, UR42, 0x2, URZ", "WARPGROUP.ARRIVE",
            "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR36], RZ, !UPT", "BAR.SYNC.DEFER_BLOCKING 0x8, 0x100",
            "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR40], R24"]
    assert turn_to_first_hgmma(loop) == 3
    assert turn_to_first_hgmma(loop[3:]) is None                    # no wait ahead of the product
    assert turn_to_first_hgmma(loop[:5]) is None                    # no product
    token = loop[:2] + ["UIMAD UR18, UR26, 0x3ff8, UR45", "WARPGROUP.ARRIVE", loop[5]]
    assert turn_to_first_hgmma(token) == 3                          # the mbarrier token's wait


def test_a_gluon_compile_under_the_interpreter_names_its_cause():
    # a process that imported Triton under TRITON_INTERPRET=1 (this one, on a CPU: conftest) cannot
    # build Gluon kernels; the failure used to surface deep in code generation, and only when the
    # cache was cold
    import torch

    from flashrung.kernels.hopper import fwd
    if not census.needs_reexec():
        pytest.skip("this process compiles for real (TRITON_INTERPRET is not set)")
    spec = fwd.census_spec(fwd.default_config(64, False), 64, False, torch.bfloat16)
    assert spec.gluon
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1.*interpreter_free_env"):
        census.compile_spec(spec, "sm_90a")
