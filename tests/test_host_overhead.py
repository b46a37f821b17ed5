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
