"""Reading compute-sanitizer's logs: a clean run is told from one with a race that is not Triton's
warp-specialization dispatch, a wrong output, an error, or a run cut short (CPU; the stored logs
of three commits are the inputs)."""
from pathlib import Path

import pytest

from flashrung.evidence import sanitizer_report as sr

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
# each stored log with its commit's dispatch lines (the kernel's def, the warp_specialize calls and
# the `if NUM_CONSUMERS` lines that pick them), as dispatch_lines_of read them from `git show`
STORED = {
    "h100-sanitizers-schedules-2ec74a4.txt": ("fwd.py:2055,fwd.py:2248,fwd.py:2249,fwd.py:2253,fwd.py:2254,"
                                              "fwd.py:2259,fwd.py:2260", 12),
    "h200-sanitizers-schedules-e47490b.txt": ("fwd.py:1562,fwd.py:1709,fwd.py:1710,fwd.py:1714,fwd.py:1715,"
                                              "fwd.py:1720,fwd.py:1721", 10),
    "h200-sanitizers-schedules-16b0ae2.txt": ("fwd.py:1223,fwd.py:1331,fwd.py:1332,fwd.py:1336,fwd.py:1337,"
                                              "fwd.py:1342,fwd.py:1343", 9),
}


def _read(name):
    return (RESULTS / name).read_text()


@pytest.mark.parametrize("name", sorted(STORED))
def test_stored_logs_read_clean_with_every_race_the_dispatch(name):
    lines, schedules = STORED[name]
    result = sr.report([(name, _read(name))], sr.parse_dispatch_lines(lines))
    assert result["clean"], sr.format_report(result)
    assert len(result["runs"]) == 3
    assert all(row["outputs_ok"] == schedules and row["outputs_wrong"] == 0 for row in result["runs"])
    races = [row for row in result["runs"] if row["tool"] == "racecheck"]
    assert len(races) == 1 and races[0]["races_dispatch"] == schedules and races[0]["races_other"] == 0


def _mutated(old, new, count=1):
    text = _read("h100-sanitizers-schedules-2ec74a4.txt")
    assert old in text
    return text.replace(old, new, count)


@pytest.mark.parametrize("old, new, problem", [
    # a write charged to a line of the kernel's body: a real hazard, not the dispatch's
    ("in fwd.py:2248 [4 hazards]", "in fwd.py:2301 [4 hazards]", "not the dispatch's"),
    ("max |err| 5.53e-03 ok", "max |err| 5.53e-01 WRONG", "output wrong"),
    ("========= ERROR SUMMARY: 0 errors", "========= ERROR SUMMARY: 1 error", "summary counts 1"),
    ("(12 errors, 0 warnings)", "(13 errors, 0 warnings)", "summary counts 13"),
    ("(12 errors, 0 warnings)", "(12 errors, 2 warnings)", "warning"),
])
def test_a_log_with_anything_but_the_dispatch_is_not_clean(old, new, problem):
    lines = sr.parse_dispatch_lines(STORED["h100-sanitizers-schedules-2ec74a4.txt"][0])
    result = sr.report([("log", _mutated(old, new))], lines)
    assert not result["clean"]
    assert any(problem in p for row in result["runs"] for p in row["problems"]), sr.format_report(result)


def test_a_run_cut_short_or_an_empty_log_is_not_clean():
    lines = sr.parse_dispatch_lines(STORED["h100-sanitizers-schedules-2ec74a4.txt"][0])
    text = _read("h100-sanitizers-schedules-2ec74a4.txt")
    cut = text[:text.rindex("========= ERROR SUMMARY")]
    result = sr.report([("log", cut)], lines)
    assert not result["clean"] and "no summary" in " ".join(result["runs"][-1]["problems"])
    assert not sr.report([("empty", "")], lines)["clean"]


def test_dispatch_lines_are_read_from_the_installed_kernel():
    from flashrung.kernels.hopper import fwd

    source = Path(fwd.__file__).read_text().splitlines()
    lines = sr.installed_dispatch_lines()
    texts = [source[n - 1].strip() for _, n in sorted(lines)]
    assert texts[0].startswith("def _attn_fwd_kernel(")
    calls = [t for t in texts if t.startswith("gl.warp_specialize(")]
    assert calls and len(texts) == 1 + 2 * len(calls)
    assert all(t.startswith(("if ", "elif ", "else")) for t in texts[1:] if t not in calls)


def test_cli_exit_codes(tmp_path, capsys):
    name = "h100-sanitizers-schedules-2ec74a4.txt"
    log = tmp_path / "racecheck-shard1.txt"
    log.write_text(_read(name))
    lines = STORED[name][0]
    assert sr.main([str(log), "--dispatch-lines", lines, "--json", str(tmp_path / "r.json")]) == 0
    assert "all clean" in capsys.readouterr().out and (tmp_path / "r.json").exists()
    # another commit's source puts the dispatch elsewhere: 2ec74a4's races then read as other races
    source = tmp_path / "fwd.py"
    source.write_text("def _attn_fwd_kernel(x):\n    if N == 1:\n        gl.warp_specialize([])\n")
    assert sr.main([str(log), "--dispatch-source", str(source)]) == 1
    assert "NOT CLEAN" in capsys.readouterr().out
    assert sr.main([str(tmp_path / "missing.txt"), "--dispatch-lines", lines]) == 2
    with pytest.raises(SystemExit):
        sr.main([str(log), "--dispatch-lines", "2055"])
