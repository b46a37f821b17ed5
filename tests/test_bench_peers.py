"""Peers on the CPU: the real preparation path, its unsupported reasons, and a timed row.

On a machine without a GPU the SDPA backends that need CUDA decline, FA4 is not importable, and
flashrung runs its portable kernel under the interpreter: every one of those must come back as a
row entry with a reason, never as a gap."""
import time

import pytest
import torch

from flashrung.bench import numerators, peers, runner, suites, timing

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour of the peers")

IMPLS = ["cudnn", "flash", "efficient", "fa4", "flashrung:portable"]
PROTOCOL = timing.BenchProtocol(warmup_calls=2, warmup_ms=0.0, rounds=2, block_ms=0.0, block_reps_min=1,
                                block_reps_max=1)


def row(mode, **kw):
    base = dict(batch=1, seqlen_q=32, seqlen_k=48, heads_q=4, heads_kv=2, headdim=32, dtype="float16", causal=True)
    return suites.Row(**{**base, **kw}, mode=mode)


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_every_impl_reports_ok_or_a_reason(mode):
    r = row(mode)
    inputs = peers.make_inputs(r, device="cpu", seed=0)
    result = runner.time_row(r, IMPLS, inputs, PROTOCOL, timing.ClockTimer(time.perf_counter), numerators.FA_HALF)
    res = result["results"]
    assert set(res) == set(IMPLS)
    assert res["cudnn"]["status"] == "unsupported" and "cudnn" in res["cudnn"]["reason"].lower()
    assert res["fa4"]["status"] == "unsupported" and "flash_attn.cute" in res["fa4"]["reason"]
    ours = res["flashrung:portable"]
    assert ours["status"] == "ok", ours
    assert ours["dispatch"]["fwd"]["kernel"] == "portable.fwd"
    if mode == "bwd":
        assert "bwd" in ours["dispatch"]
    assert ours["distribution"]["n"] == 2 and ours["tflops"] > 0


def test_forward_outputs_are_cross_checked_against_a_reference_peer():
    # non-causal MHA fp32-free shape that the CPU flash backend can run: both outputs exist, so the
    # row records how far flashrung's output is from the peer's
    r = row("fwd", causal=False, seqlen_k=32, heads_kv=4)
    inputs = peers.make_inputs(r, device="cpu", seed=0)
    result = runner.time_row(r, ["flash", "flashrung:portable"], inputs, PROTOCOL,
                             timing.ClockTimer(time.perf_counter), numerators.FA_HALF)
    res = result["results"]
    if res["flash"]["status"] != "ok":
        pytest.skip(f"this torch build has no CPU flash SDPA: {res['flash']['reason']}")
    assert res["flashrung:portable"]["max_abs_diff"]["vs"] == "flash"
    assert res["flashrung:portable"]["max_abs_diff"]["value"] < 1e-2
    assert result["best_peer"] == "flash" and "flash" in result["comparisons"]["flashrung:portable"]


def test_gqa_sdpa_says_how_it_was_given_gqa():
    r = row("fwd", causal=False, seqlen_k=32)
    inputs = peers.make_inputs(r, device="cpu", seed=0)
    try:
        p = peers.prepare("flash", r, inputs)
    except peers.Unsupported as exc:
        assert "enable_gqa" in exc.reason and "repeat_interleave" in exc.reason   # both attempts named
    else:
        assert "GQA via" in p.note


def test_unknown_kernel_name_is_an_error_with_the_dispatcher_reason():
    r = row("fwd")
    inputs = peers.make_inputs(r, device="cpu", seed=0)
    with pytest.raises(peers.Unsupported) as exc:
        peers.prepare("flashrung:nonexistent", r, inputs)
    assert "nonexistent" in exc.value.reason


def test_impl_names_are_validated():
    assert peers.validate_impl("flashrung:ladder.v3") == "flashrung:ladder.v3"
    assert peers.kernel_name("flashrung:ladder.v3") == "ladder.v3" and peers.kernel_name("flashrung") is None
    with pytest.raises(ValueError, match="flashrung:portable"):
        peers.validate_impl("triton")
