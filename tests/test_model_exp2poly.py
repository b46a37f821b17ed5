"""FA4's degree-3 software exp2 (seed 001 0x09): its error on the seed's grid, to the digit."""
import pytest
import torch

from flashrung.model import exp2poly as E


def test_error_on_the_seed_grid():
    r = E.error_report()          # 65,536 points i/65536 on [0, 1)
    assert r.points == 65536
    # Seed 001 0x09's deterministic CPU oracle values, reproduced to its printed digits.
    assert r.fp32_max_rel == pytest.approx(8.7683755e-5, rel=1e-7)
    assert r.fp32_mean_rel == pytest.approx(5.4271432e-5, rel=1e-7)
    assert r.bf16_max_rel == pytest.approx(3.8975323e-3, rel=1e-7)
    assert r.bf16_mean_rel == pytest.approx(1.4095395e-3, rel=1e-7)
    assert r.bf16_exact_match == pytest.approx(0.990051, abs=5e-7)
    assert r.bf16_within_one_code == 1.0
    # Against torch.exp2 in FP32 the polynomial is within 9e-5 too.
    assert r.vs_torch_exp2_max_rel < 9e-5


def test_range_reduction_over_softmax_arguments():
    # Softmax arguments are <= 0 (plus a small offset); check a wide span against torch.exp2.
    x = torch.linspace(-126.0, 20.0, 200_001)
    approx = E.exp2_degree3(x)
    ref = torch.exp2(x.double())
    rel = ((approx.double() - ref) / ref).abs().max().item()
    assert rel < 9e-5
    # Exact powers of two come out exactly (f = 0 -> p(0) = 1).
    ints = torch.arange(-126, 21, dtype=torch.float32)
    assert torch.equal(E.exp2_degree3(ints), torch.exp2(ints))


def test_clamp_and_floor_edge_cases():
    out = E.exp2_degree3(torch.tensor([-1e30, -127.0, -0.5, -1e-8, 0.999999]))
    assert out[0] == out[1] == 0.0            # clamped: every x <= -127 shares one value
    assert out[2] == pytest.approx(2 ** -0.5, rel=1e-4)
    assert out[3] == pytest.approx(1.0, rel=1e-4)   # floor(-1e-8) = -1, f close to 1
    assert out[4] == pytest.approx(2.0, rel=1e-4)
    with pytest.raises(ValueError, match="x < 128"):
        E.exp2_degree3(torch.tensor([200.0]))
    with pytest.raises(TypeError):
        E.exp2_degree3(torch.tensor([1, 2]))


def test_degree3_costs_three_fmas():
    assert sum(1 for op, _ in E.EMULATION_OPS if op == "FFMA") == 3
    assert E.FMA_PIPE_OPS == 6


@pytest.mark.parametrize("freq, res, start, emulated", [
    # seed 001 0x09's pinned specialisations, on a 128-element row.
    (10, 4, 1, 24), (16, 4, 1, 16), (16, 4, 0, 24), (32, 4, 1, 8), (14, 6, 0, 36), (0, 4, 0, 0),
])
def test_emulation_fragment_predicate(freq, res, start, emulated):
    assert E.emulated_per_row(128, freq, res, start) == emulated


def test_emulation_predicate_validation():
    with pytest.raises(ValueError, match="multiple of fragment"):
        E.emulated_per_row(100, 10, 4, 1)
