"""Peers on the CPU: the real preparation path, its unsupported reasons, and a timed row.

On a machine without a GPU the SDPA backends that need CUDA decline, FA4 is not importable, and
flashrung runs its portable kernel under the interpreter: every one of those must come back as a
row entry with a reason, never as a gap."""
import time

import pytest
import torch

from flashrung import reference
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


def test_forward_outputs_are_checked_against_the_oracle():
    # non-causal MHA shape that the CPU flash backend can run: both outputs are read against the
    # oracle at sampled query rows, each within the gate's bound
    r = row("fwd", causal=False, seqlen_k=32, heads_kv=4)
    inputs = peers.make_inputs(r, device="cpu", seed=0)
    result = runner.time_row(r, ["flash", "flashrung:portable"], inputs, PROTOCOL,
                             timing.ClockTimer(time.perf_counter), numerators.FA_HALF)
    res = result["results"]
    if res["flash"]["status"] != "ok":
        pytest.skip(f"this torch build has no CPU flash SDPA: {res['flash']['reason']}")
    for impl in ("flash", "flashrung:portable"):
        agreement = res[impl]["agreement"]
        assert "oracle" in agreement["vs"] and 0 < agreement["bound"] and agreement["ratio"] <= 1, (impl, agreement)
    assert result["best_peer"] == "flash" and "flash" in result["comparisons"]["flashrung:portable"]


def _stand_in_peers(monkeypatch, forwards):
    # peers whose forward is given here, prepared on the bench's real path (its first call, its
    # output kept for the check); every other implementation as the bench prepares it
    real = peers.prepare

    def prepare(impl, r, inputs, options=peers.PeerOptions()):
        if impl in forwards:
            return peers._wrap(r, inputs, forwards[impl], note="stand-in")
        return real(impl, r, inputs, options)
    monkeypatch.setattr(peers, "prepare", prepare)


def test_a_peer_computing_another_window_is_not_timed_nor_best(monkeypatch):
    # a peer that reads the row's window another way (FA4's CuTe interface took flash-attn's
    # (1024, -1) as a band ending one key before the diagonal: fa4_window) does less work than the
    # row counts: it must not be timed as if it did the row's, nor become the best peer. Here it
    # sees 4 keys back where the row asks for 8; one computing the row's window in its own dtype
    # passes the same check
    r = row("fwd", causal=False, seqlen_q=48, seqlen_k=48, heads_kv=4, window=(8, -1))
    inputs = peers.make_inputs(r, device="cpu", seed=0)

    def forward(window):
        return lambda q, k, v: reference.lowp(q, k, v, softmax_scale=inputs.scale, window_size=window)[0].to(q.dtype)
    _stand_in_peers(monkeypatch, {"flash": forward((4, -1)), "efficient": forward((8, -1))})
    result = runner.time_row(r, ["flash", "efficient", "flashrung:portable"], inputs, PROTOCOL,
                             timing.ClockTimer(time.perf_counter), numerators.FA_HALF)
    res = result["results"]
    wrong = res["flash"]
    assert wrong["status"] == peers.WRONG_OUTPUT and "tflops" not in wrong
    assert wrong["agreement"]["ratio"] > runner.WRONG_OUTPUT_RATIO and "another function" in wrong["reason"]
    assert res["efficient"]["status"] == "ok" and res["efficient"]["agreement"]["ratio"] <= 1
    assert res["flashrung:portable"]["status"] == "ok" and res["flashrung:portable"]["agreement"]["ratio"] <= 1
    assert result["best_peer"] == "efficient" and set(result["comparisons"]["flashrung:portable"]) == {"efficient"}


def test_the_check_reads_a_packed_rows_first_and_longest_sequence(monkeypatch):
    # a pack's output is read per sequence against the oracle run on that sequence alone: a peer
    # that lets one sequence's queries see another's keys is caught
    r = suites.packed_rows(lengths=(0, 24, 40, 16), heads=2, kv_heads=2, headdim=32, causal=True, mode="fwd",
                           dtype="float16")[0]
    inputs = peers.make_inputs(r, device="cpu", seed=0)
    slices = runner._agreement_slices(r, inputs)
    assert [label for label, *_ in slices] == ["sequence 1", "sequence 2"]

    def across(q, k, v):     # the whole pack as one causal sequence
        return reference.lowp(q, k, v, causal=True, softmax_scale=inputs.scale)[0].to(q.dtype)
    agreement = runner.output_agreement(r, inputs, {"across": across(inputs.q, inputs.k, inputs.v)})
    assert agreement["across"]["ratio"] > runner.WRONG_OUTPUT_RATIO
    assert "sequence 1 (24 query rows), sequence 2 (40 query rows)" in agreement["across"]["vs"]


def test_fa4_is_handed_its_own_window_convention():
    assert peers.fa4_window((1024, -1)) == (1024, None)
    assert peers.fa4_window((-1, 0)) == (None, 0)
    assert peers.fa4_window((-1, -1)) == (None, None)
    assert peers.fa4_window((256, 64)) == (256, 64)


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
