"""``flashrung stalls``: the ncu source-page reader, on stored H200 pages and on small synthetic ones."""
from __future__ import annotations

import json
import os

import pytest

from flashrung import cli
from flashrung.evidence import stalls

RESULTS = os.path.join(os.path.dirname(__file__), "..", "docs", "results")
OURS_D128 = os.path.join(RESULTS, "h200-ncu-hopper-d128-full-s16384-bbbfdcf-sass.csv.gz")
FA4_D128 = os.path.join(RESULTS, "h200-ncu-fa4-d128-full-s16384-bbbfdcf-sass.csv.gz")

_HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
           '"stall_wait","stall_barrier","stall_wait (Not Issued)"')


def _page(kernels):
    """A source page: {kernel name: [(address, source, samples, executed, wait, barrier), ...]}."""
    lines = []
    for name, rows in kernels.items():
        lines += [f'"Kernel Name","{name}",', _HEADER]
        lines += [f'"{a:#x}","{src}","{s}","{e}","{w}","{b}","0"' for a, src, s, e, w, b in rows]
    return "\n".join(lines) + "\n"


def _loop(first, n, count, samples=10, wait=6, barrier=0):
    return [(first + 16 * k, "FADD R1, R2, R3", samples, count, wait, barrier) for k in range(n)]


def test_stored_pages_give_the_profile_figures_the_docs_quote():
    # docs/hopper.md, *Profiles of the current kernels*: the d128 loops are 429 instructions per
    # trip in each of two consumer partitions (ours) and 450 in FA4's one shared loop; "wait" is
    # 38.7% / 30.0% of the loop samples, FA4's unnamed share 9.6%
    ours, fa4 = stalls.summary(OURS_D128), stalls.summary(FA4_D128)
    assert ours["kernel"] == "_attn_fwd_kernel"            # not the split tail's merge kernel
    assert ours["loop"]["copies"] == [429, 429] and ours["loop"]["count"] == 2080256
    assert fa4["loop"]["copies"] == [450] and fa4["loop"]["count"] == 4161536
    assert ours["loop_shares"]["wait"] == pytest.approx(0.387, abs=5e-4)
    assert fa4["loop_shares"]["wait"] == pytest.approx(0.300, abs=5e-4)
    assert fa4["loop_shares"]["unnamed"] == pytest.approx(0.096, abs=5e-4)
    for s in (ours, fa4):
        assert sum(s["shares"].values()) == pytest.approx(1.0)
        assert sum(s["loop"]["opcodes_per_trip"].values()) == pytest.approx(s["loop"]["per_trip"])


OURS_D64 = os.path.join(RESULTS, "h200-ncu-hopper-d64-full-s16384-bbbfdcf-sass.csv.gz")
FA4_D64 = os.path.join(RESULTS, "h200-ncu-fa4-d64-full-s16384-bbbfdcf-sass.csv.gz")


def test_cycles_per_trip_and_the_wait_split_the_d64_docs_quote():
    # docs/hopper.md, *Part of the exponentials ahead of PV's wait*: a warp's cycles per trip are
    # its instructions over its loop's "selected" share — 428 / 17.3% = 2479 (ours) against
    # 413 / 17.5% = 2361 (FA4), 1.050x; our fixed-latency waits sit more on the row max's FMNMX
    # (7.6% of the loop's samples against 3.8%) and less on MUFU.EX2 (11.5% against 15.3%)
    ours, fa4 = (stalls.summary(p, reasons_by_opcode=("wait",)) for p in (OURS_D64, FA4_D64))
    for s, trip, cycles in ((ours, 428, 2479), (fa4, 413, 2361)):
        loop = s["loop"]
        assert loop["per_trip"] == trip
        assert loop["cycles_per_trip"] == pytest.approx(trip / s["loop_shares"]["selected"])
        assert loop["cycles_per_trip"] == pytest.approx(cycles, abs=1)
        assert sum(loop["by_opcode"]["wait"].values()) == pytest.approx(1.0)
    assert ours["loop"]["cycles_per_trip"] / fa4["loop"]["cycles_per_trip"] == pytest.approx(1.050, abs=5e-4)
    part = lambda s, op: s["loop"]["by_opcode"]["wait"][op] * s["loop_shares"]["wait"]
    assert part(ours, "FMNMX") == pytest.approx(0.076, abs=5e-4) and part(fa4, "FMNMX") == pytest.approx(0.038, abs=5e-4)
    assert part(ours, "MUFU.EX2") == pytest.approx(0.115, abs=5e-4)
    assert part(fa4, "MUFU.EX2") == pytest.approx(0.153, abs=5e-4)


def test_by_opcode_refuses_a_reason_the_page_lacks():
    with pytest.raises(ValueError, match="--by-opcode 'stall_wait': not a stall reason"):
        stalls.summary(OURS_D64, reasons_by_opcode=("stall_wait",))
    rows = [(0x10, "MUFU.EX2 R1, R2", 10, 5, 4, 0), (0x20, "FMNMX R1, R2, R3, !PT", 10, 5, 2, 3)]
    kernel = stalls.parse_page(_page({"k": rows}))[0]
    assert stalls.by_opcode(kernel.instructions, "wait") == pytest.approx({"MUFU.EX2": 4 / 6, "FMNMX": 2 / 6})
    assert stalls.by_opcode(kernel.instructions, "unnamed") == pytest.approx({"MUFU.EX2": 6 / 11, "FMNMX": 5 / 11})
    # no "selected" column on this page: the derived cycles are not made up
    assert stalls.cycles_per_trip(stalls.hot_loop(kernel)) is None


def test_kernel_regex_picks_another_kernel_of_the_page():
    merge = stalls.summary(OURS_D128, kernel="combine")
    assert "combine" in merge["kernel"]
    with pytest.raises(ValueError, match="--kernel 'no_such_kernel' matches none"):
        stalls.summary(OURS_D128, kernel="no_such_kernel")


def test_a_skipped_path_inside_a_loop_keeps_one_copy_and_a_far_loop_is_a_second():
    # a loop body with a branch-skipped block of 8 instructions executed less often is one copy;
    # a second partition's loop beyond MAX_GAP_INSTRUCTIONS other instructions is another
    body = _loop(0x1000, 20, 1000) + _loop(0x1000 + 16 * 20, 8, 300) + _loop(0x1000 + 16 * 28, 20, 1000)
    gap = _loop(0x4000, stalls.MAX_GAP_INSTRUCTIONS + 1, 7)
    second = _loop(0x8000, 33, 1000)
    kernel = stalls.parse_page(_page({"k": body + gap + second}))[0]
    loop = stalls.hot_loop(kernel)
    assert loop.count == 1000 and loop.copies == (40, 33)
    assert loop.per_trip == pytest.approx(36.5)


def test_unnamed_samples_are_the_rest_of_each_instruction():
    rows = [(0x10, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24", 100, 50, 10, 0),
            (0x20, "@!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4+0x30160], RZ", 50, 50, 0, 50)]
    kernel = stalls.parse_page(_page({"k": rows}))[0]
    assert stalls.shares(kernel.instructions) == pytest.approx({"unnamed": 0.6, "barrier": 1 / 3, "wait": 1 / 15})
    assert [i.opcode for i in kernel.instructions] == ["HGMMA.64x128x16.F32.BF16", "SYNCS.ARRIVE.TRANS64.A1T0"]
    assert stalls._top_reasons(kernel.instructions[0]) == {"unnamed": 90, "wait": 10}


def test_bad_pages_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match="no kernel found"):
        stalls.parse_page("")
    with pytest.raises(ValueError, match="not an ncu source page"):
        stalls.parse_page('"0x10","FADD",1,1\n')
    with pytest.raises(ValueError, match=r"lacks the columns \['Instructions Executed'\]"):
        stalls.parse_page('"Kernel Name","k",\n"Address","Source","Warp Stall Sampling (All Samples)"\n')
    kernel = stalls.parse_page(_page({"k": _loop(0x10, 3, 5)}))[0]
    with pytest.raises(ValueError, match="no instruction executed exactly 6 times"):
        stalls.hot_loop(kernel, 6)


def test_cli_two_pages_side_by_side_and_json(tmp_path, capsys):
    out = tmp_path / "stalls.json"
    assert cli.main(["stalls", OURS_D128, FA4_D128, "--top", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hot-loop opcodes per trip where the pages differ (page 1 - page 2 = 429.0 - 450.0)" in text
    assert "evidence level: profile" in text
    data = json.loads(out.read_text())
    assert [len(d["top"]) for d in data] == [3, 3]


@pytest.mark.parametrize("argv, message", [
    (["a.csv", "b.csv", "c.csv"], "one or two pages"),
    (["missing-page.csv.gz"], "No such file"),
    ([OURS_D128, "--loop-count", "1", "--loop-count", "2"], "--loop-count once per page"),
])
def test_cli_refuses_bad_arguments(argv, message, capsys):
    assert cli.main(["stalls"] + argv) == 2
    assert message in capsys.readouterr().err


def test_cli_one_page(capsys):
    assert cli.main(["stalls", FA4_D128, "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert "hot loop: 450.0 instructions per trip (1 copy: 450)" in text
    assert "kernel 1" in text and "kernel 2" not in text and "pages differ" not in text


OURS_D64_S32K = os.path.join(RESULTS, "h100-ncu-flashrung-d64-full-b1-h32-s32768-51d5476-sass.csv.gz")
FA4_D64_S32K = os.path.join(RESULTS, "h100-ncu-fa4-d64-full-b1-h32-s32768-51d5476-sass.csv.gz")


def _phase_page(copies):
    """A page of one kernel whose loop copies are lists of (source, samples, selected); each
    instruction executed 100 times, the copies apart by more than MAX_GAP_INSTRUCTIONS others."""
    lines = ['"Kernel Name","k",', '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
             '"stall_selected","stall_wait"']
    address = 0
    for body in copies:
        for src, samples, selected in body:
            lines.append(f'"{address:#x}","{src}","{samples}","100","{selected}","{samples - selected}"')
            address += 16
        for _ in range(stalls.MAX_GAP_INSTRUCTIONS + 1):
            lines.append(f'"{address:#x}","NOP","0","1","0","0"')
            address += 16
    return "\n".join(lines) + "\n"


_TRIP = [("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", 30, 1), ("@!P0 BRA 0x10", 10, 1),
         ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ", 20, 1),
         ("HGMMA.64x64x16.F32.BF16 R88, R120, gdesc[UR12]", 20, 1),
         ("@!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4+0x20], RZ", 0, 1), ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 20, 1),
         ("FMNMX R1, R24, R25, !PT", 40, 1), ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 10, 1),
         ("MUFU.EX2 R2, R2", 50, 1), ("@P1 BRA 0x0", 0, 1)]


def test_loop_phases_cut_the_trip_at_the_gemm_issue_and_its_waits():
    # the trip's cycles (10 instructions / 5% selected = 200) split by each phase's share of the
    # samples: the top 40, the issue 40, the arrive 0, QK's wait to PV's 60, PV's wait to the end 60
    # (of 200 samples); two copies of the same code sum position by position
    for copies in ([_TRIP], [_TRIP, _TRIP]):
        kernel = stalls.parse_page(_phase_page(copies))[0]
        loop = stalls.hot_loop(kernel)
        assert loop.copies == (10,) * len(copies) and stalls.cycles_per_trip(loop) == pytest.approx(200.0)
        phases = stalls.loop_phases(kernel, loop)
        assert [p["label"] for p in phases] == ["loop top", "GEMM issue (2 HGMMA)", "after the issue",
                                                "from WARPGROUP.DEPBAR.LE gsb0, 0x1",
                                                "from WARPGROUP.DEPBAR.LE gsb0, 0x0"]
        assert [p["cycles"] for p in phases] == pytest.approx([40.0, 40.0, 0.0, 60.0, 60.0])
        assert [p["instructions"] for p in phases] == [2, 2, 1, 2, 3]
        assert phases[4]["opcodes"] == pytest.approx({"MUFU.EX2": 50.0, "WARPGROUP.DEPBAR.LE": 10.0})


def test_loop_phases_refuse_copies_that_cut_differently():
    # a copy with one more wait is other code: its phases cannot be summed with the first's
    other = _TRIP[:8] + [("WARPGROUP.DEPBAR.LE gsb0, 0x0", 1, 1)] + _TRIP[8:]
    kernel = stalls.parse_page(_phase_page([_TRIP, other]))[0]
    with pytest.raises(ValueError, match="cut into different phases"):
        stalls.loop_phases(kernel, stalls.hot_loop(kernel))


def test_phases_of_the_d64_s32k_pages_place_the_gap_after_qks_wait(capsys):
    # docs/hopper.md, *FA4's d64 step, read in phases*: B1 H32 S32768 non-causal (H100), a warp's
    # trip 2496 cycles (ours) against 2354 (FA4): the top and the issue level (592 / 601), the
    # softmax from QK's wait to the trip's end 1901 against 1752
    ours, fa4 = (stalls.summary(p, phases=True)["loop"] for p in (OURS_D64_S32K, FA4_D64_S32K))
    for loop, trip in ((ours, 2496), (fa4, 2354)):
        assert sum(p["cycles"] for p in loop["phases"]) == pytest.approx(loop["cycles_per_trip"])
        assert loop["cycles_per_trip"] == pytest.approx(trip, abs=0.5)
    softmax = [sum(p["cycles"] for p in loop["phases"][3:]) for loop in (ours, fa4)]
    assert softmax == pytest.approx([1901, 1752], abs=1)
    assert cli.main(["stalls", OURS_D64_S32K, FA4_D64_S32K, "--phases", "--top", "0"]) == 0
    assert "the trip in phases" in capsys.readouterr().out


def test_executed_per_unit_counts_the_whole_kernel_by_family():
    # the spins and the one-off code the hot loop leaves out count: a wait's retry (SYNCS + BRA run
    # 3 times more than the loop) and the prologue's move; predicates and modifiers fold into the family
    rows = [(0x10, "MOV R1, R2", 0, 4, 0, 0), (0x20, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", 0, 40, 0, 0),
            (0x30, "@!P0 BRA 0x20", 0, 40, 0, 0), (0x40, "MUFU.EX2 R1, R1", 0, 10, 0, 0),
            (0x50, "MUFU.RCP R1, R1", 0, 10, 0, 0)]
    kernel = stalls.parse_page(_page({"k": rows}))[0]
    assert stalls.executed_by_family(kernel.instructions) == {"SYNCS": 40, "BRA": 40, "MUFU": 20, "MOV": 4}


def test_executed_per_the_d64_s32k_pages_the_docs_quote(capsys):
    # docs/hopper.md, *One exponential in 16 (or 8) on the FMA pipe, re-priced*: per consumer-warp
    # K/V step (4 warps x 32 heads x 512 row blocks x 256 key blocks) the kernel runs 458.3 warp
    # instructions against FA4's 421.8, the per-score families equal, SYNCS 13.3 against 5.6
    steps = 4 * 32 * 512 * 256
    ours, fa4 = (stalls.summary(p, top=0, executed_per=steps) for p in (OURS_D64_S32K, FA4_D64_S32K))
    a, b = ours["executed_per_unit"], fa4["executed_per_unit"]
    assert sum(a.values()) == pytest.approx(458.3, abs=0.05) and sum(b.values()) == pytest.approx(421.8, abs=0.05)
    for family in ("FMNMX", "FFMA", "MUFU", "F2FP", "HGMMA"):
        assert a[family] == pytest.approx(b[family], abs=0.5), family
    assert a["SYNCS"] == pytest.approx(13.3, abs=0.05) and b["SYNCS"] == pytest.approx(5.6, abs=0.05)
    assert cli.main(["stalls", OURS_D64_S32K, FA4_D64_S32K, "--top", "0", "--executed-per", str(steps)]) == 0
    text = capsys.readouterr().out
    assert "executed warp instructions by opcode family" in text and "+36.5" in text


def test_executed_per_refuses_a_unit_count_that_is_not_positive(capsys):
    with pytest.raises(ValueError, match="--executed-per must be a positive number of work units, got 0"):
        stalls.summary(FA4_D128, executed_per=0)
    assert cli.main(["stalls", FA4_D128, "--executed-per", "-3"]) == 2
    assert "--executed-per must be a positive" in capsys.readouterr().err


OURS_D64_CAUSAL_S8K = os.path.join(RESULTS, "h100-ncu-flashrung-d64-causal-b4-h16-s8192-efcd5d5-sass.csv.gz")
FA4_D64_CAUSAL_S8K = os.path.join(RESULTS, "h100-ncu-fa4-d64-causal-b4-h16-s8192-efcd5d5-sass.csv.gz")


def test_parked_warps_are_found_and_left_out_of_the_active_shares():
    # Triton's three padding warps sit at one NOP each for the whole launch: 3 of the CTA's 16 warps,
    # all 'barrier'; the kernel's barrier share is mostly theirs, the loop's unaffected (docs quote it)
    ours = stalls.summary(OURS_D64_CAUSAL_S8K)
    pk = ours["parked"]
    assert pk["instructions"] == 2 and pk["executed"] == 396
    assert pk["share"] == pytest.approx(0.186, abs=5e-4)
    assert ours["shares"]["barrier"] == pytest.approx(0.244, abs=5e-4)
    assert pk["active_shares"]["barrier"] == pytest.approx(0.071, abs=5e-4)
    assert sum(pk["active_shares"].values()) == pytest.approx(1.0)
    assert ours["loop"]["cycles_per_trip"] == pytest.approx(2508, abs=1)
    fa4 = stalls.summary(FA4_D64_CAUSAL_S8K)
    assert fa4["parked"] is None
    assert fa4["loop"]["cycles_per_trip"] == pytest.approx(2352, abs=1)


def test_parked_needs_many_samples_an_execution():
    # a spin's retry (many executions, few samples each) and an unexecuted line are not parked
    page = ('"Kernel Name","k",\n"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
            '"stall_barrier","stall_wait"\n'
            '"0x0","NOP","500","100","500","0"\n'            # 5 samples an execution: parked
            '"0x10","@!P0 BRA 0x0","400","100000","0","400"\n'
            '"0x20","NOP","499","100","499","0"\n'           # just under the threshold
            '"0x30","EXIT","7","0","0","7"\n')
    (kernel,) = stalls.parse_page(page)
    assert [i.address for i in stalls.parked(kernel.instructions)] == [0]


def test_cli_marks_the_parked_samples_and_adds_the_active_column(capsys):
    assert cli.main(["stalls", OURS_D64_CAUSAL_S8K, FA4_D64_CAUSAL_S8K, "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "parked: 18.6% of the kernel's samples on 2 instructions executed 396 times in all" in text
    head = next(line for line in text.splitlines() if line.startswith("stall reason"))
    assert head.split()[2:] == ["kernel", "1", "active", "1", "loop", "1", "kernel", "2", "loop", "2"]
