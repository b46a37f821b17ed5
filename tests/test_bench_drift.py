"""flashrung.bench.drift: each implementation's rates run by run, read back from stored runs."""
from flashrung.bench import drift, report


def _doc(rates: dict[str, dict[str, float | None]]) -> dict:
    """A stored run: ``{row label: {impl: TFLOP/s or None (unsupported)}}``."""
    rows = []
    for label, cells in rates.items():
        rows.append({"label": label, "results": {
            impl: ({"status": "ok", "tflops": t} if t is not None else {"status": "unsupported", "reason": "x"})
            for impl, t in cells.items()}})
    return {"rows": rows}


def test_an_implementation_that_moved_alone_reads_apart_from_the_others():
    # the peer rebuilt between runs 1 and 2 runs 10% faster on every row; ours did not move: the
    # peer's run-2 cells read above 1 by the same factor on every row, ours read 1 in both runs
    one = _doc({"r1": {"peer": 100.0, "ours": 200.0}, "r2": {"peer": 300.0, "ours": 400.0}})
    two = _doc({"r1": {"peer": 110.0, "ours": 200.0}, "r2": {"peer": 330.0, "ours": 400.0}})
    three = _doc({"r1": {"peer": 100.0, "ours": 200.0}, "r2": {"peer": 300.0, "ours": 400.0}})
    moved = drift.rates_by_run([one, two, three])
    assert list(moved) == ["peer", "ours"]
    peer = moved["peer"]["runs"]
    assert peer[1]["median"] == peer[1]["least"] == peer[1]["most"] == 1.1
    assert peer[0]["median"] == peer[2]["median"] == 1.0
    assert all(r["median"] == 1.0 for r in moved["ours"]["runs"])
    table = report.drift_table([one, two, three])
    assert "1.100 [1.100,1.100]" in table and table.splitlines()[3].startswith("peer")


def test_rows_an_implementation_missed_in_any_run_are_left_out_of_every_run():
    # r2 unsupported for the peer in run 2: only r1 counts for the peer, in both runs; an
    # implementation absent from one run is not listed
    one = _doc({"r1": {"peer": 100.0, "ours": 1.0, "gone": 5.0}, "r2": {"peer": 100.0, "ours": 1.0, "gone": 5.0}})
    two = _doc({"r1": {"peer": 120.0, "ours": 1.0}, "r2": {"peer": None, "ours": 1.0}})
    moved = drift.rates_by_run([one, two])
    assert moved["peer"]["rows"] == 1 and moved["ours"]["rows"] == 2 and "gone" not in moved
    assert [round(r["median"], 6) for r in moved["peer"]["runs"]] == [round(100 / 110, 6), round(120 / 110, 6)]


def test_one_run_has_no_drift():
    assert drift.rates_by_run([_doc({"r1": {"ours": 1.0}})]) == {}
    assert report.drift_table([_doc({"r1": {"ours": 1.0}})]) is None
