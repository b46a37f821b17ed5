"""The host-overhead probe: bad arguments are named, a machine without a GPU is told why, and on
a GPU every flashrung row is a finite time."""
import math

import pytest
import torch

from flashrung.evidence import host_overhead


def test_bad_counts_are_rejected_by_name(capsys):
    with pytest.raises(SystemExit):
        host_overhead.main(["--calls", "0"])
    assert "--calls must be >= 1" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gets")
def test_without_a_gpu_it_says_why(capsys):
    assert host_overhead.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_rows_time_every_layer_of_flashrungs_path():
    rows = dict(host_overhead.rows(1, 128, 1, 64, calls=5))
    mine = {name: us for name, us in rows.items() if "flashrung" in name or "forward" in name}
    # the public call and the kernel's forward per mask, and on Hopper the same forward through
    # JITFunction.run (what the direct launch saves)
    assert len(mine) in (4, 6) and all(math.isfinite(us) and us > 0 for us in mine.values())


@pytest.mark.gpu
def test_frozen_rows_price_the_frozen_step_in_parts():
    # below the work threshold the default is the online step; --frozen adds the frozen step given,
    # forced through the public call, and its recompute alone, for every mask at d64 and d128
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the frozen row max is hopper.fwd's (sm_90)")
    for head_dim in (64, 128):
        rows = dict(host_overhead.rows(1, 128, 1, head_dim, calls=5, frozen=True))
        for mask in ("causal", "full"):
            parts = [name for name in rows if name.endswith(f"({mask})") and
                     ("frozen step given" in name or "freeze_row_max=true" in name or "recompute_flagged" in name)]
            assert len(parts) == 3 and all(math.isfinite(rows[n]) and rows[n] > 0 for n in parts), rows
