"""The gate itself: it passes the correct kernels, catches every injected defect where the
defect can show, poisons outputs, and draws fresh inputs."""
import argparse

import pytest
import torch

from flashrung import gate, gate_mutations, reference
from flashrung.kernels.portable import bwd, fwd
from conftest import DEVICE

SMALL = [c for c in gate.envelope("small") if c.head_dim <= 64]


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.label())
def test_portable_forward_passes_the_gate(case):
    result = gate.check_forward_case(fwd.forward, case, DEVICE, kernel="portable.fwd")
    assert result.passed, str(result)


@pytest.mark.parametrize("case", [c for c in SMALL if c.head_dim == 32], ids=lambda c: c.label())
def test_portable_backward_passes_the_gate(case):
    result = gate.check_backward(fwd.forward, bwd.backward, case, DEVICE, kernel="portable.bwd")
    assert result.passed, str(result)


# One configuration per mutation where it must show, plus the widest one (several tiles, GQA).
BATTERY = [gate.Case(1, 70, 70, 2, 1, 32, torch.float16, True),
           gate.Case(1, 130, 130, 8, 1, 64, torch.bfloat16, True),
           gate.Case(2, 97, 97, 2, 2, 32, torch.float16, False)]


@pytest.mark.parametrize("mutation", gate_mutations.MUTATIONS, ids=lambda m: m.name)
def test_every_injected_defect_fails_the_gate(mutation):
    cases = gate_mutations.mutation_cases(BATTERY, mutation, DEVICE)
    assert cases, f"no battery case can show {mutation.name}"
    for case in cases:
        result = gate.check_forward_case(gate_mutations.mutant_forward(mutation.defect), case, DEVICE)
        assert not result.passed, f"{mutation.name} slipped through: {result}"


def test_mutation_battery_has_at_least_six_distinct_defects():
    assert len({m.defect for m in gate_mutations.MUTATIONS}) >= 6


def test_an_unwritten_output_is_caught_because_outputs_are_poisoned():
    # a kernel that writes nothing: with zeroed outputs it could pass where the truth is ~0;
    # with NaN poison it fails on every row
    def lazy(q, k, v, causal, scale, out=None, lse=None):
        return out, lse
    result = gate.check_forward(lazy, batch=1, seqlen_q=8, seqlen_k=8, heads_q=1, heads_kv=1,
                                head_dim=32, dtype=torch.float16, causal=False, device=DEVICE)
    assert not result.passed and result.ratio == float("inf")


def test_each_check_draws_fresh_inputs():
    seen = []

    def spy(q, k, v, causal, scale, out=None, lse=None):
        seen.append(q.clone())
        return fwd.forward(q, k, v, causal, scale, out=out, lse=lse)
    for _ in range(2):
        gate.check_forward(spy, batch=1, seqlen_q=4, seqlen_k=4, heads_q=1, heads_kv=1, head_dim=32,
                           dtype=torch.float16, causal=False, device=DEVICE)
    assert not torch.equal(seen[0], seen[1])
    assert seen[0].abs().sum() > 0


def test_rule_is_twice_the_same_dtype_floor_plus_atol():
    c = gate.check_tensor("x", torch.tensor([1.0 + 3e-4]), torch.tensor([1.0]), torch.tensor([1.0 + 1e-4]))
    assert c.bound == pytest.approx(2 * 1e-4 + 1e-4, rel=1e-3) and not c.passed
    c = gate.check_tensor("x", torch.tensor([1.0 + 2.5e-4]), torch.tensor([1.0]), torch.tensor([1.0 + 1e-4]))
    assert c.passed


def test_matching_minus_infinities_count_as_equal_and_nan_as_infinite():
    assert gate.max_abs_diff(torch.tensor([float("-inf"), 1.0]), torch.tensor([float("-inf"), 1.0])) == 0
    assert gate.max_abs_diff(torch.tensor([float("nan")]), torch.tensor([0.0])) == float("inf")
    assert gate.max_abs_diff(torch.tensor([0.0]), torch.tensor([float("-inf")])) == float("inf")


def test_sharded_check_results_merge_counts_and_keep_the_worst():
    from flashrung.check import _merge
    a = [{"kernel": "k", "direction": "fwd", "cases": 2, "passed": 2, "unsupported": 1,
          "worst": {"ratio": 0.3, "case": "a"}, "failures": []}]
    b = [{"kernel": "k", "direction": "fwd", "cases": 3, "passed": 2, "unsupported": 0,
          "worst": {"ratio": 1.5, "case": "b"}, "failures": [{"ratio": 1.5, "case": "b"}]}]
    (m,) = _merge([a, b])
    assert (m["cases"], m["passed"], m["unsupported"]) == (5, 4, 1)
    assert m["worst"]["case"] == "b" and len(m["failures"]) == 1


def test_check_describes_the_inputs_the_gate_passes():
    # `flashrung check` asks each kernel whether it supports a case before gating it; the problem
    # it asks about must carry the strides of the contiguous inputs the gate creates (expanded
    # placeholders have zero strides, which a TMA kernel rightly declines: it would then skip the
    # whole envelope and pass vacuously)
    import dataclasses

    from flashrung.check import gate_problem
    from flashrung.kernels.hopper import fwd as hopper

    for case in gate.envelope("device"):
        problem = gate_problem(case, "cpu")
        assert problem.strides[0] == torch.empty(case.batch, case.seqlen_q, case.heads_q, case.head_dim,
                                                 device="meta").stride()
        assert problem.strides[1] == torch.empty(case.batch, case.seqlen_k, case.heads_kv, case.head_dim,
                                                 device="meta").stride()
        on_hopper = dataclasses.replace(problem, device_type="cuda", capability=(9, 0), interpreter=False)
        if case.head_dim in (64, 128, 256):
            assert hopper.unsupported_reason(on_hopper) is None, case.label()
    # and it carries what the case asks beyond the envelope: v's own head dim, a window, a cap —
    # a kernel without them must decline the case rather than be called with what it cannot take
    case = dataclasses.replace(gate.envelope("device")[2], head_dim_v=64, window_size=(32, 0), softcap=20.0)
    problem = gate_problem(case, "cpu")
    assert (problem.head_dim_v, problem.window_size, problem.softcap) == (64, (32, 0), 20.0)
    assert problem.strides[2] == torch.empty(case.batch, case.seqlen_k, case.heads_kv, 64, device="meta").stride()


def test_check_reports_why_a_kernel_declined_cases(capsys):
    # a kernel that declines cases passes only what it ran: the check must say what it left out
    from flashrung.check import check_command

    args = argparse.Namespace(device="cpu", size="small", shard=None, jobs=1, kernel=["hopper.fwd"],
                              direction=["fwd"], json=None)
    assert check_command(args) == 1          # nothing could run on the CPU
    out = capsys.readouterr().out
    assert "hopper.fwd fwd declined" in out and "CUDA" in out


def test_check_gates_the_head_dims_it_is_given(capsys):
    # --head-dim replaces the envelope's head dims (a padded head dim of hopper.fwd: 96); on the
    # CPU the portable kernel runs them under the interpreter, and a value flashrung does not take
    # is refused naming the argument
    from flashrung import cli
    from flashrung.check import run_check

    summaries = run_check("cpu", "small", ["portable.fwd"], ("fwd",), progress=lambda jobs, desc: jobs,
                          head_dims=(40,))
    (s,) = summaries
    assert s.kernel == "portable.fwd" and s.cases == len(gate.envelope("small", head_dims=(40,)))
    assert s.passed == s.cases and s.worst.case.head_dim == 40
    with pytest.raises(SystemExit):
        cli.main(["check", "--head-dim", "100"])
    assert "--head-dim: expected a multiple of 8 up to 256, got 100" in capsys.readouterr().err


def test_check_gates_packed_sequences(monkeypatch):
    # --packed: every envelope case as a pack (its own lengths beside shorter, one-row and empty
    # sequences), gated by the packed gate in both directions; the problem a kernel is asked about
    # is the pack's (hopper.fwd takes it, on the tensors' packed strides); the shards get the flag
    import dataclasses

    from flashrung import check
    from flashrung.kernels.hopper import fwd as hopper

    case = check.packed_case(gate.envelope("small", head_dims=(32,))[3])
    assert case.varlen == ((33, 11, 1, 0, 5), (95, 31, 7, 3, 0)) and case.batch == 5
    problem = check.gate_problem(case, "cpu")
    assert problem.varlen and (problem.batch, problem.seqlen_q, problem.seqlen_k) == (5, 33, 95)
    assert problem.strides[0] == torch.empty(1, 50, case.heads_q, 32, device="meta").stride()
    on_hopper = dataclasses.replace(problem, device_type="cuda", capability=(9, 0), interpreter=False)
    assert hopper.unsupported_reason(on_hopper) is None
    # four of the envelope's cases, both directions (the interpreter runs each pack's kernels)
    envelope = gate.envelope
    monkeypatch.setattr(gate, "envelope", lambda size, head_dims=None: envelope(size, head_dims=head_dims)[:4])
    summaries = check.run_check("cpu", "small", ["portable"], ("fwd", "bwd"), progress=lambda jobs, desc: jobs,
                                head_dims=(32,), packed=True)
    cases = 4
    assert {s.direction for s in summaries} == {"fwd", "bwd"}
    for s in summaries:
        assert s.cases == s.passed == cases and s.worst.case.varlen, s
    commands = []
    monkeypatch.setattr("subprocess.Popen", lambda cmd, **kw: commands.append(cmd) or (_ for _ in ()).throw(OSError))
    args = argparse.Namespace(device="cpu", size="small", kernel=None, direction=["fwd"], packed=True)
    with pytest.raises(OSError):
        check._run_sharded(args, 2)
    assert "--packed" in commands[0]


def test_check_at_scale_gates_the_builds_a_large_call_runs(monkeypatch):
    # --at-scale: hopper.fwd's rules that read a call's work (the frozen row max and what it brings,
    # config.FREEZE_ROW_MAX_MIN_FLOP) pick other builds for a large call than for the gate's, so
    # each case runs, at its own size, on the configuration a call of its shape runs at scale; the
    # shards get the flag
    import dataclasses
    import types

    from flashrung import check
    from flashrung.kernels.hopper import config as hopper_config
    from flashrung.kernels.hopper import fwd as hopper

    cases = [c for c in gate.envelope("device", head_dims=(64, 128)) if max(c.seqlen_q, c.seqlen_k) >= 2048]
    frozen_at_scale = 0
    for case in cases:
        problem = check.gate_problem(case, "cpu")
        scaled = hopper.config_at_scale(problem)
        # both dtypes freeze at scale (fp16 since change 63, its build raising the online row max)
        frozen_at_scale += 1
        assert scaled.freeze_row_max, case
        # only the work moved: the configuration of the same shape with batch entries to spare
        big = dataclasses.replace(problem, batch=4096)
        assert scaled == hopper.select_config(big), case
    # the gate-sized calls of these shapes mostly run the online step: the flag reaches the rest
    plain = sum(hopper.select_config(check.gate_problem(c, "cpu")).freeze_row_max for c in cases)
    assert frozen_at_scale == 32 and plain < frozen_at_scale
    assert hopper_config.call_flop(check.gate_problem(cases[0], "cpu")) < hopper_config.FREEZE_ROW_MAX_MIN_FLOP
    # the check hands hopper.fwd that configuration for each case (the kernel itself needs a GPU:
    # its refusal and the gate are stood in for, the wiring is what is tested)
    seen = []
    monkeypatch.setattr(hopper, "unsupported_reason", lambda problem: None)
    monkeypatch.setattr(gate, "check_forward_case", lambda forward, case, device, kernel: seen.append(
        (case, forward)) or types.SimpleNamespace(passed=True, ratio=0.0, case=case))
    monkeypatch.setattr(gate, "envelope", lambda size, head_dims=None: cases)
    (summary,) = check.run_check("cpu", "device", ["hopper.fwd"], ("fwd",), progress=lambda jobs, desc: jobs,
                                 at_scale=True)
    assert summary.cases == summary.passed == len(cases) == len(seen)
    for case, forward in seen:
        assert forward.keywords["config"] == hopper.config_at_scale(check.gate_problem(case, "cpu")), case
    seen.clear()
    check.run_check("cpu", "device", ["hopper.fwd"], ("fwd",), progress=lambda jobs, desc: jobs)
    assert all(forward is hopper.forward for _, forward in seen) and len(seen) == len(cases)
    commands = []
    monkeypatch.setattr("subprocess.Popen", lambda cmd, **kw: commands.append(cmd) or (_ for _ in ()).throw(OSError))
    args = argparse.Namespace(device="cpu", size="device", kernel=["hopper.fwd"], direction=["fwd"], at_scale=True)
    with pytest.raises(OSError):
        check._run_sharded(args, 2)
    assert "--at-scale" in commands[0]


def test_check_declines_the_backward_where_no_forward_is_dispatched():
    # d16 runs only on a kernel named by impl= (hopper.fwd, padded): dispatch picks no forward, so
    # the backward gate has nothing to feed it. Both directions asked: the forward's kernels decline
    # the cases, the backward is counted as declined with dispatch's reason — the check runs on
    # (it raised UnsupportedError before any case ran)
    from flashrung.check import run_check

    summaries = run_check("cpu", "small", ["portable"], ("fwd", "bwd"), progress=lambda jobs, desc: jobs,
                          head_dims=(16,))
    by_direction = {s.direction: s for s in summaries}
    assert set(by_direction) == {"fwd", "bwd"}
    cases = len(gate.envelope("small", head_dims=(16,)))
    for s in summaries:
        assert s.cases == 0 and s.unsupported == cases, s
    (reason,) = by_direction["bwd"].declined
    assert reason.startswith("no forward feeds it: ") and "head_dim 16" in reason


def test_check_gates_a_value_head_dim_of_its_own(capsys):
    # --head-dim D/DV: v (and out, dout, dv) DV wide, q and k D wide; the shards get it back as
    # given; either half out of range is refused naming the argument
    from flashrung import check, cli

    parser = argparse.ArgumentParser()
    check.register(parser.add_subparsers())
    parsed = parser.parse_args(["check", "--head-dim", "64/32", "--head-dim", "48"])
    assert parsed.head_dim == [(64, 32), 48]
    assert [check._head_dim_text(d) for d in parsed.head_dim] == ["64/32", "48"]
    # the forward only: the kernels' own tests gate both directions at these head dims
    (s,) = check.run_check("cpu", "small", ["portable.fwd"], ("fwd",), progress=lambda jobs, desc: jobs,
                           head_dims=((64, 32),))
    cases = gate.envelope("small", head_dims=((64, 32),))
    assert {c.value_head_dim for c in cases} == {32} and "d64/32" in cases[0].label()
    assert s.cases == s.passed == len(cases), s
    assert (s.worst.case.head_dim, s.worst.case.value_head_dim) == (64, 32)
    for bad, words in (("64/100", "got 100"), ("64/32/16", "two as D/DV"), ("a/b", "two as D/DV")):
        with pytest.raises(SystemExit):
            cli.main(["check", "--head-dim", bad])
        assert words in capsys.readouterr().err


def test_check_gates_every_case_under_a_sliding_window_or_a_cap(capsys):
    # --window LEFT,RIGHT: the envelope's cases, causal and not, each under the window; the shards
    # get it back as given; a right side a causal case cannot have is refused naming the argument
    from flashrung import check, cli

    parser = argparse.ArgumentParser()
    check.register(parser.add_subparsers())
    assert parser.parse_args(["check", "--window", "8,0"]).window == (8, 0)
    assert parser.parse_args(["check", "--window=-1,0"]).window == (-1, 0)
    (s,) = check.run_check("cpu", "small", ["portable.fwd"], ("fwd",), progress=lambda jobs, desc: jobs,
                           head_dims=(32,), window_size=(5, -1))
    assert s.cases == s.passed == len(gate.envelope("small", head_dims=(32,))), s
    assert s.worst.case.window_size == (5, -1) and "window(5, -1)" in s.worst.case.label()
    for bad, words in (("8,2", "RIGHT -1 or 0"), ("-1,-1", "not both -1"), ("8", "LEFT,RIGHT")):
        with pytest.raises(SystemExit):
            cli.main(["check", "--window=" + bad])
        assert words in capsys.readouterr().err
    # --softcap C: the same cases with their scores capped, carried to the shards the same way
    assert parser.parse_args(["check", "--softcap", "30"]).softcap == 30.0
    (s,) = check.run_check("cpu", "small", ["portable.fwd"], ("fwd",), progress=lambda jobs, desc: jobs,
                           head_dims=(32,), softcap=2.0)
    assert s.cases == s.passed > 0 and s.worst.case.softcap == 2.0
    for bad in ("0", "-3", "inf", "x"):
        with pytest.raises(SystemExit):
            cli.main(["check", "--softcap", bad])
        assert "--softcap" in capsys.readouterr().err


def test_given_inputs_are_judged_by_the_same_rule():
    # check_forward_inputs: the gate's rule on inputs a test builds (here a spike key, which fresh
    # Gaussians never draw); a kernel that loses the spike fails it, the portable kernel passes
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 40, 2, 32, generator=g).to(DEVICE, torch.float16) for _ in range(3))
    k[:, 37] *= 20.0

    def drops_last_keys(q, k, v, causal, scale, out=None, lse=None):
        return fwd.forward(q, k[:, :36].contiguous(), v[:, :36].contiguous(), causal, scale, out=out, lse=lse)
    result = gate.check_forward_inputs(fwd.forward, q, k, v, False)
    assert result.passed and result.case.seqlen_k == 40, str(result)
    assert not gate.check_forward_inputs(drops_last_keys, q, k, v, False).passed


@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (False, (5, 3), 0.0), (True, (7, 0), 20.0)])
def test_references_on_some_query_rows_are_those_rows_of_the_whole(causal, window, softcap):
    # the bench reads every implementation's output at a sample of query rows (runner.output_agreement):
    # the references' masks must align those rows bottom-right exactly as the whole problem's, Sq ≠ Sk
    # and GQA included, and a row that sees no key stays zero
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 19, 4, 16, generator=g).to(torch.float16)
    k, v = (torch.randn(2, 23, 2, 16, generator=g).to(torch.float16) for _ in range(2))
    rows = torch.tensor([0, 1, 9, 17, 18])
    options = dict(causal=causal, softmax_scale=0.3, window_size=window, softcap=softcap)
    for ref, tol in ((reference.oracle, 1e-12), (reference.lowp, 1e-3)):
        # (a product over fewer rows may round its last bit otherwise; a misaligned mask moves
        # whole probabilities)
        whole_out, whole_lse = ref(q, k, v, **options)
        out, lse = ref(q, k, v, query_rows=rows, **options)
        torch.testing.assert_close(out, whole_out[:, rows], rtol=tol, atol=tol)
        torch.testing.assert_close(lse, whole_lse[:, :, rows], rtol=tol, atol=tol)
