"""The placement probe: its tensors lie exactly where it says, its workspace is the kernel's, its
refusals name the argument."""
import argparse

import pytest
import torch

from flashrung.evidence import placement
from flashrung.kernels.hopper import tail_combine


def _args(*argv):
    return placement.build_parser().parse_args(list(argv))


@pytest.mark.parametrize("offset", [0, 16, 512, 4096, (1 << 20) + 512])
def test_a_carved_tensor_starts_at_its_offset_from_a_2mib_boundary(offset):
    # property: the offset a pair reports is the tensor's real placement, whatever address the pool got
    t = placement.carve(3 * 5 * 2, offset, "cpu", torch.bfloat16, (3, 5))
    assert t.shape == (3, 5) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % placement.POOL_ALIGN_BYTES == offset


def test_a_carved_tensor_refuses_an_offset_tma_cannot_take():
    with pytest.raises(ValueError, match="multiple of 16"):
        placement.carve(64, 8, "cpu", torch.float32, (16,))


def test_the_placed_workspace_is_the_kernels_layout_at_its_offset():
    # property: the arm's workspace has exactly the views tail_combine.workspace gives the kernel
    # (the same shapes and dtypes), only placed: first byte at the offset, kept between calls
    ws = placement.PlacedWorkspace(4096)
    part_o, part_lse, coords = ws(12, 4, 128, 64, "cpu")
    ref = tail_combine.workspace(12, 4, 128, 64, "cpu")
    assert [(t.shape, t.dtype) for t in (part_o, part_lse, coords)] == [(t.shape, t.dtype) for t in ref]
    assert part_o.data_ptr() % placement.POOL_ALIGN_BYTES == 4096
    assert part_lse.data_ptr() == part_o.data_ptr() + part_o.numel() * 4
    assert ws(12, 4, 128, 64, "cpu")[0].data_ptr() == part_o.data_ptr()


def test_carve_workspace_refuses_a_buffer_of_the_wrong_size():
    words = tail_combine.workspace_words(2, 1, 64, 64)
    with pytest.raises(ValueError, match=f"buf must be a contiguous 1-D fp32 tensor of {words} words"):
        tail_combine.carve_workspace(torch.empty(words + 1), 2, 1, 64, 64)


@pytest.mark.parametrize("move, groups", [("out", {"out"}), ("inputs", {"inputs"}), ("workspace", {"workspace"}),
                                          ("all", {"out", "inputs", "workspace"})])
def test_each_move_names_the_tensors_it_moves(move, groups):
    assert placement.moved(move) == groups


def test_the_default_offsets_parse_and_bad_ones_are_refused_by_name():
    assert placement.offsets_arg("512,4096") == (512, 4096)
    for bad, message in (("8", "multiple of 16"), ("0", "positive"), (str(2 << 20), "below"),
                         ("a,b", "integers"), ("512,512", "repeats")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            placement.offsets_arg(bad)


@pytest.mark.parametrize("argv, message", [(("--alternations", "3"), "--alternations must be an even number"),
                                           (("--reps", "0"), "--reps must be at least 1"),
                                           (("--block-preheat-ms", "-1"), "--block-preheat-ms must be >= 0")])
def test_bad_arguments_are_refused_by_name(argv, message):
    with pytest.raises(SystemExit, match=message):
        placement.check_args(_args(*argv))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without a GPU")
def test_without_a_gpu_it_says_so():
    with pytest.raises(SystemExit, match="needs an sm_90 GPU"):
        placement.main(["--seqlen", "256", "--offsets", "512", "--alternations", "2"])


@pytest.mark.gpu
def test_on_a_gpu_every_placement_gives_the_same_bits_and_a_time(tmp_path):
    # a split-tail launch (B2 H16 S2048: the tail splits), every group moved: each arm's O and LSE
    # bit-identical to offset 0's, each pair timed
    import json

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("hopper.fwd needs sm_90")
    path = tmp_path / "placement.json"
    assert placement.main(["--batch", "16", "--seqlen", "2048", "--offsets", "512,1049088", "--move", "all", "out",
                           "--alternations", "2", "--reps", "1", "--block-preheat-ms", "0",
                           "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert [(r["move"], r["offset"]) for r in result["pairs"]] == [("all", 512), ("all", 1049088), ("out", 512),
                                                                   ("out", 1049088)]
    assert all(r["identical"] and r["ms_base"] > 0 and r["ms_moved"] > 0 for r in result["pairs"])
