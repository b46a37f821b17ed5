"""The split-tail cost probe: its arms differ by the split tail alone, its arithmetic, its refusals."""
import dataclasses

import pytest
import torch

from flashrung.evidence import split_tail_cost


def _args(*argv):
    return split_tail_cost.build_parser().parse_args(list(argv))


def test_the_arms_differ_by_the_split_tail_alone():
    # property: whole and split are the problem's own configuration with only split_tail changed,
    # so the probe prices the split tail and nothing else (--set applies to both)
    cfgs = split_tail_cost.arm_configs(_args("--batch", "16", "--seqlen", "2048", "--set", "merge_loads_first=false"))
    whole, split = cfgs["whole"], cfgs["split"]
    assert not whole.split_tail and split.split_tail and cfgs["split_kernel"] is split
    assert dataclasses.replace(whole, split_tail=True) == split
    assert not split.merge_loads_first


def test_derived_times_take_the_call_apart():
    ms = {"graph": {"whole": 0.900, "split": 0.905, "split_kernel": 0.890}}
    d = split_tail_cost.derive(ms)["graph"]
    assert d["merge_us"] == pytest.approx(15.0) and d["round_saved_us"] == pytest.approx(10.0)
    assert d["net_us"] == pytest.approx(-5.0) and d["whole_over_split"] == pytest.approx(0.900 / 0.905)


def test_the_merge_is_skipped_only_inside_the_context():
    from flashrung.kernels.hopper import fwd

    real = fwd.combine_tail
    with split_tail_cost.merge_skipped():
        assert fwd.combine_tail is not real and fwd.combine_tail(1, 2, loads_first=True) is None
    assert fwd.combine_tail is real


@pytest.mark.parametrize("argv, message", [(("--blocks", "0"), "--blocks must be at least 1"),
                                           (("--calls", "0"), "--calls must be at least 1"),
                                           (("--set", "split_tail=true"), "--set must not name split_tail"),
                                           (("--set", " split_tail = true"), "--set must not name split_tail"),
                                           (("--set", "pingpong"), "--set: impl .*expected name@key=value")])
def test_bad_arguments_are_refused_by_name(argv, message):
    with pytest.raises(SystemExit, match=message):
        split_tail_cost.check_args(_args(*argv))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without a GPU")
def test_without_a_gpu_it_says_so():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        split_tail_cost.main(["--seqlen", "2048", "--batch", "16"])


@pytest.mark.gpu
def test_on_a_gpu_it_times_every_arm_both_ways(tmp_path, capsys):
    import json

    path = tmp_path / "cost.json"
    assert split_tail_cost.main(["--batch", "16", "--seqlen", "2048", "--blocks", "2", "--calls", "3",
                                 "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    for way in ("launched", "graph"):
        assert set(r["ms_per_call"][way]) == set(split_tail_cost.ARMS)
        assert all(t > 0 for t in r["ms_per_call"][way].values())
    assert r["tail"]["splits"] > 1
