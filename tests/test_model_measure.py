"""The rate microbenchmarks: they compile for sm_90a to the instruction they time, and their
per-SM arithmetic is right; on an sm_90 GPU they measure plausible rates."""
import json
import subprocess
import sys

import pytest

from flashrung.evidence import census
from flashrung.model import measure as M

# The instruction family each microbenchmark must be made of, with its SASS spelling.
EXPECTED = {
    "wgmma_bf16": "HGMMA.64x256x16.F32.BF16",
    "mufu_ex2": "MUFU.EX2",
    "ffma_fp32": "FFMA",
    "smem_read": "LDS.128",
}

_SNIPPET = """
import json, os, tempfile
from flashrung.evidence import census
from flashrung.model.measure import census_specs
out = {}
for spec in census_specs():
    row = census.census_one(spec, "sm_90a").to_json()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(census.compile_spec(spec, "sm_90a").asm["cubin"])
        row["sass_text"] = census.sass_text(path)
    out[spec.kernel.rsplit(".", 1)[1]] = row
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def rows():
    # Compiling needs a process without TRITON_INTERPRET; run the census in one when needed.
    env = census.interpreter_free_env() if census.needs_reexec() else None
    out = subprocess.run([sys.executable, "-c", _SNIPPET], env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def test_all_compile_without_spills(rows):
    assert set(rows) == set(EXPECTED)
    for name, row in rows.items():
        assert "error" not in row, (name, row.get("error"))
        assert row["spill_bytes"] == 0, name


def test_each_kernel_is_made_of_the_instruction_it_times(rows):
    for name, row in rows.items():
        assert EXPECTED[name] in row["sass_text"], name
    assert rows["wgmma_bf16"]["sass"]["HGMMA"] == M.WGMMA_TILE[2] // 16     # one per k-step
    assert rows["mufu_ex2"]["sass"]["MUFU.EX2"] == M.ILP * M.EX2_UNROLL     # negation folded in
    assert rows["mufu_ex2"]["sass"]["FADD"] == 0
    assert rows["ffma_fp32"]["sass"]["FFMA"] == M.ILP * M.FMA_UNROLL
    assert rows["smem_read"]["sass"]["opcodes"].get("LDS.128", 0) > 0


def test_resources_fit_the_launch_shape(rows):
    regs_per_sm, smem_per_sm = 65536, 228 * 1024
    for b in M.BENCHMARKS:
        row = rows[b.name]
        threads = b.num_warps * 32
        assert row["regs"] * threads * b.ctas_per_sm <= regs_per_sm, b.name
        assert row["smem_bytes"] * b.ctas_per_sm <= smem_per_sm, b.name


def test_microbenchmarks_stay_out_of_the_kernel_registry():
    from flashrung.kernels import registry
    assert "flashrung.model.measure" not in registry.CENSUS_MODULES


def test_per_sm_rates_use_each_sms_own_counter():
    # Two SMs, two CTAs each; SM 7's counter is offset by 10^9 (counters are per SM).
    stamps = [
        [3, 100, 1100, 0, 500],
        [3, 150, 1050, 10, 480],
        [7, 10**9, 10**9 + 2000, 0, 1000],
        [7, 10**9 + 100, 10**9 + 1900, 20, 990],
    ]
    rates, clocks, wall_ms = M.per_sm_rates(stamps, work_per_cta=1000)
    assert sorted(rates) == [1.0, 2.0]           # 2000 work over 1000 and 2000 cycles
    assert sorted(clocks) == [2.0, 2.0]          # cycles per ns
    assert wall_ms == 1000 / 1e6
    with pytest.raises(RuntimeError, match="no elapsed cycles"):
        M.per_sm_rates([[0, 5, 5, 0, 1]], 1)


@pytest.mark.gpu
def test_measure_on_hopper(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    from flashrung.model import rates as R
    res = M.measure(repeats=2, progress=False)
    t = R.RateTable.from_json(res["table"])
    # Sustained rates within reach of the datasheet ones (and never above them).
    assert 0.7 * 4096 < t.mma_flops.value <= 4096 * 1.01
    assert 0.7 * 16 < t.exp.value <= 16 * 1.01
    assert 0.7 * 128 < t.fma.value <= 128 * 1.01
    assert 0.5 * 128 < t.smem_bytes.value <= 128 * 1.01
    assert all(f.provenance == R.MEASURED for f in t.figures().values())
    assert res["manifest"]["sm_count"] == t.sm_count.value


def test_measure_assembles_a_measured_table(monkeypatch):
    """The host side of ``measure()`` with the launches simulated: every SM runs at the quoted
    rate times 0.9 at 1.9 GHz, so the stored table must say exactly that."""
    import torch
    from flashrung.model import rates as R

    sms, clock = 4, 1.9
    quoted = R.TABLES["h200"]

    class Props:
        name = "NVIDIA H200"
        multi_processor_count = sms

    def fake_launch(bench, sm_count, iters, device):
        rate = 0.9 * getattr(quoted, bench.field).value
        cycles = round(bench.work_per_cta_iter * iters * bench.ctas_per_sm / rate)
        return [[cta % sm_count, 0, cycles, 0, round(cycles / clock)]
                for cta in range(sm_count * bench.ctas_per_sm)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: Props())
    monkeypatch.setattr(M, "_launch", fake_launch)
    res = M.measure(device="cpu", repeats=2, progress=False)
    t = R.RateTable.from_json(res["table"])
    for field in ("mma_flops", "exp", "fma", "smem_bytes"):
        fig = getattr(t, field)
        assert fig.provenance == R.MEASURED
        assert fig.value == pytest.approx(0.9 * getattr(quoted, field).value, rel=1e-6)
    assert t.sm_count.value == sms
    assert t.clock_ghz.value == pytest.approx(clock, rel=1e-3)
    assert res["manifest"]["gpu"] == "NVIDIA H200"
    assert set(res["benchmarks"]) == {b.name for b in M.BENCHMARKS}
    json.dumps(res)


def test_measure_refuses_without_a_gpu(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        M.measure(progress=False)
