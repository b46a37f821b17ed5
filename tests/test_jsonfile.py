"""Stored results may be gzip-compressed JSON: every reader and writer of the CLI takes either."""
import gzip
import json
import pathlib

import pytest

from flashrung import jsonfile
from flashrung.bench import calibration, report

RESULTS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "results"


@pytest.mark.parametrize("name", ["doc.json", "doc.json.gz"])
def test_a_document_reads_back_as_written_plain_or_compressed(tmp_path, name):
    doc = {"rows": [{"label": "B2 H16 S16384", "ms": [1.25, 1.5]}], "gpu": "NVIDIA H200"}
    path = jsonfile.write(doc, tmp_path / "sub" / name)
    assert jsonfile.read(path) == doc
    raw = path.read_bytes()
    # the name decides the format: gzip's magic bytes exactly when the name ends in .gz
    assert raw.startswith(b"\x1f\x8b") == name.endswith(".gz")


def test_a_compressed_rewrite_is_byte_identical(tmp_path):
    # no timestamp in the gzip header, so an unchanged result makes no change to commit
    doc = {"a": list(range(100))}
    first = jsonfile.write(doc, tmp_path / "a.json.gz").read_bytes()
    second = jsonfile.write(doc, tmp_path / "a.json.gz").read_bytes()
    assert first == second and json.loads(gzip.decompress(first)) == doc


def test_the_bench_writer_and_the_calibration_take_compressed_paths(tmp_path):
    path = report.write_json({"rows": [], "when": pathlib.Path("x")}, tmp_path / "bench.json.gz")
    assert jsonfile.read(path) == {"rows": [], "when": "x"}
    cal = tmp_path / "calibration.json.gz"
    calibration.store("GPU X", {"t_noise": 0.002}, cal)
    calibration.store("GPU Y", {"t_noise": 0.003}, cal)
    assert calibration.lookup("GPU X", cal) == {"t_noise": 0.002} and calibration.load(cal)["GPU Y"]["t_noise"] == 0.003
    assert cal.read_bytes().startswith(b"\x1f\x8b")     # a .gz calibration stays compressed
    assert not list(tmp_path.glob("*tmp*"))


def test_stored_results_are_compressed_and_readable():
    # the JSON results are kept compressed (the calibration, an input of every compare, stays plain);
    # a stored JSON left uncompressed, or one that no longer parses, fails here
    plain = sorted(p.name for p in RESULTS.glob("*.json"))
    assert plain == ["h200-calibration.json"]
    stored = sorted(RESULTS.glob("*.json.gz"))
    assert len(stored) > 1000
    assert isinstance(jsonfile.read(RESULTS / "fa4-fwd-a7fb388.json.gz"), dict)


@pytest.mark.parametrize("name", ["fa4-fwd.json", "fa4-fwd.json.gz"])
def test_a_plot_beside_a_result_drops_json_and_gz(name):
    # `--json x.json.gz` without --plot draws x.png, not x.json.png
    assert jsonfile.sibling(pathlib.Path("out") / name, ".png") == pathlib.Path("out") / "fa4-fwd.png"


def test_a_result_reads_by_its_content_and_garbage_is_named(tmp_path):
    # a compressed result renamed without its .gz still reads; a file that is no JSON names itself
    doc = {"rows": [1, 2]}
    renamed = tmp_path / "renamed.json"
    renamed.write_bytes(jsonfile.write(doc, tmp_path / "r.json.gz").read_bytes())
    assert jsonfile.read(renamed) == doc
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b"not json"))
    with pytest.raises(ValueError, match="bad.json.gz: expected a JSON document"):
        jsonfile.read(bad)
