"""The lone-warpgroup probe: one configuration for every arm, its arms' rows, its arithmetic, its refusals."""
import pytest
import torch

from flashrung.evidence import lone_warpgroup


def _args(*argv):
    return lone_warpgroup.build_parser().parse_args(list(argv))


@pytest.mark.parametrize("headdim, rows", [(64, {1: 64, 2: 128, 3: 192}), (128, {1: 64, 2: 128}),
                                           (256, {1: 64, 2: 128})])
def test_each_arm_fills_one_more_warpgroup_of_one_tile(headdim, rows):
    # property: arm w launches one query tile a head with exactly its first w warpgroups holding
    # rows, so the arms differ by the attending warpgroups and nothing else
    cfg = lone_warpgroup.arm_config(_args("--headdim", str(headdim)))
    assert lone_warpgroup.arm_rows(cfg) == rows
    assert max(rows.values()) == cfg.block_m


def test_every_arm_runs_one_unpaired_configuration_with_the_skip():
    # property: unpaired (a pair's empty second tile would build without the skip), no split tail,
    # the skip of empty rows on: the lone arm passes its empty warpgroups' tiles; --set applies
    cfg = lone_warpgroup.arm_config(_args("--headdim", "128", "--seqlen-k", "16384", "--set", "rescale_by_warp=false"))
    assert not cfg.kv_multicast and not cfg.split_tail and cfg.skip_empty_rows
    assert not cfg.relay_release and not cfg.producer_unsynced and not cfg.rescale_by_warp


def test_derived_ratios_read_against_the_full_arm():
    d = lone_warpgroup.derive({1: 0.70, 2: 1.00}, 2)
    assert d[1]["over_full"] == pytest.approx(0.70) and d[1]["in_proportion"] == pytest.approx(0.5)
    assert d[2]["over_full"] == pytest.approx(1.0) and d[2]["in_proportion"] == pytest.approx(1.0)


@pytest.mark.parametrize("argv, message", [(("--blocks", "0"), "--blocks must be at least 1"),
                                           (("--seqlen-k", "0"), "--seqlen-k must be at least 1"),
                                           (("--set", "split_tail=true"), "--set must not name split_tail"),
                                           (("--set", "block_m=64,kv_multicast=true"),
                                            "--set must not name block_m, kv_multicast"),
                                           (("--set", "pingpong"), "--set: impl .*expected name@key=value")])
def test_bad_arguments_are_refused_by_name(argv, message):
    with pytest.raises(SystemExit, match=message):
        lone_warpgroup.check_args(_args(*argv))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without a GPU")
def test_without_a_gpu_it_says_so():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        lone_warpgroup.main(["--blocks", "2"])


@pytest.mark.gpu
def test_on_a_gpu_it_checks_then_times_every_arm(tmp_path, capsys):
    import json

    path = tmp_path / "lone.json"
    assert lone_warpgroup.main(["--headdim", "64", "--seqlen-k", "2048", "--blocks", "2", "--calls", "2",
                                "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert set(r["ms_per_call"]) == {"1", "2", "3"} and r["derived"]["3"]["over_full"] == pytest.approx(1.0)
    assert "warpgroups" in capsys.readouterr().out
