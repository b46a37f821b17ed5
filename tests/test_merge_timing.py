"""The merge-alone timing tool: the split it times is the launch plan's, its refusals name the argument."""
import pytest
import torch

from flashrung.evidence import merge_timing


def _args(*argv):
    return merge_timing.build_parser().parse_args(list(argv))


@pytest.mark.parametrize("batch, seqlen, tiles, splits", [(2, 16384, 4, 33), (16, 2048, 4, 16), (8, 4096, 4, 32)])
def test_the_split_timed_is_the_kernels_launch_plan(batch, seqlen, tiles, splits):
    # property: the merge is timed on the tail hopper.fwd's split tail would leave on 132 SMs (the
    # suite's d128 rows: 4096 tiles, 4 in the last round, split as far as 132 SMs and K/V tiles allow)
    plan, cfg = merge_timing.split_of(_args("--batch", str(batch), "--seqlen", str(seqlen)), 132)
    assert (plan.num_tiles - plan.num_full_tiles, plan.splits) == (tiles, splits)
    assert cfg.split_tail and cfg.merge_loads_first


def test_workspace_has_the_plans_shape_distinct_coordinates_and_empty_rows():
    args = _args("--batch", "16", "--seqlen", "2048")
    plan, cfg = merge_timing.split_of(args, 132)
    part_o, part_lse, coords, tiles, splits = merge_timing.workspace_of(plan, cfg, args, "cpu",
                                                                        torch.Generator().manual_seed(0))
    assert part_o.shape == (tiles * splits, cfg.block_m, 128) and part_lse.shape == (tiles * splits, cfg.block_m)
    assert len({tuple(c) for c in coords.tolist()}) == tiles
    assert (coords[:, 0] < 16).all() and (coords[:, 1] < 16).all() and (coords[:, 2] < 2048 // cfg.block_m).all()
    assert part_lse[:, ::merge_timing.EMPTY_ROW_EVERY].isinf().all() and part_lse[:, 1].isfinite().all()


@pytest.mark.parametrize("argv, message", [(("--alternations", "3"), "--alternations must be an even number"),
                                           (("--calls", "0"), "--calls must be at least 1"),
                                           (("--seqlen", "0"), "--seqlen must be at least 1")])
def test_bad_arguments_are_refused_by_name(argv, message):
    with pytest.raises(SystemExit, match=message):
        merge_timing.check_args(_args(*argv))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without a GPU")
def test_without_a_gpu_it_says_so():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        merge_timing.main(["--seqlen", "2048", "--batch", "16"])


@pytest.mark.gpu
def test_on_a_gpu_both_merges_agree_and_are_timed(tmp_path):
    # the suite's S2k split (16 splits): both merges write the same rows and agree to rounding,
    # rows past Sq untouched, and both arms get a time per merge
    import json

    path = tmp_path / "merge.json"
    assert merge_timing.main(["--batch", "16", "--seqlen", "2048", "--alternations", "4", "--calls", "5",
                              "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["check"]["same_rows_written"] and result["check"]["close"]
    assert set(result["us_per_merge"]) == {"chunked", "loads_first"}
    assert all(us > 0 for us in result["us_per_merge"].values())


@pytest.mark.parametrize("batch, seqlen", [(16, 2048), (2, 16384)])
def test_both_merges_of_the_plans_tail_agree(batch, seqlen, device):
    # property: on the tail the kernel's plan leaves (16 and 33 splits), both merges write the same
    # rows, none past Sq, and agree to rounding — the check the timed run reports beside its times.
    # Under the interpreter (source order) they agree bit for bit up to one chunked load; compiled,
    # the sums run over differently laid out blocks (on the H200 they differed in the last bits)
    args = _args("--batch", str(batch), "--seqlen", str(seqlen))
    plan, cfg = merge_timing.split_of(args, 132)
    part_o, part_lse, coords, tiles, splits = merge_timing.workspace_of(plan, cfg, args, device,
                                                                        torch.Generator().manual_seed(0))
    _, check = merge_timing.merged_both_ways(part_o, part_lse, coords, splits, args, device)
    assert check["same_rows_written"] and check["close"]
    if splits <= 32 and torch.device(device).type == "cpu":
        assert check["bit_identical"]
