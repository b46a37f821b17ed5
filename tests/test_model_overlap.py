"""Overlap bounds: seed 001 0x03 (producer/consumer), 0x04 (pingpong), 0x05 (two-stage wgmma)."""
import pytest

from flashrung.model import overlap as O


def test_producer_consumer_oracle():
    b = O.producer_consumer(300, 500, 5)
    assert b.serial == 4000
    assert b.overlapped == 300 + 500 + 4 * 500 == 2800
    assert b.speedup == pytest.approx(1.43, abs=0.005)        # not the asymptotic 1.6x
    assert O.asymptotic_speedup(300, 500) == 1.6


def test_producer_consumer_degenerate_cases():
    assert O.producer_consumer(300, 500, 1).speedup == 1.0     # J = 1: nothing to overlap
    one_stage = O.producer_consumer(300, 500, 5, stages=1)     # one slot: serial
    assert one_stage.overlapped == one_stage.serial == 4000
    # Speedup grows toward the asymptote with J.
    s = [O.producer_consumer(300, 500, j).speedup for j in (2, 5, 50, 5000)]
    assert s == sorted(s) and s[-1] < 1.6


def test_two_stage_wgmma_oracle():
    b = O.two_stage_wgmma(1, 1, 1, 5)
    assert (b.serial, b.overlapped) == (15, 11)
    assert b.speedup == pytest.approx(15 / 11)
    # Softmax slower than PV: the steady pair is QK + softmax.
    assert O.two_stage_wgmma(1, 2, 1, 3).overlapped == 1 + 2 + 2 * (1 + 2) + 1


def test_pingpong_oracle():
    # E/M = 1/2 (FA3's FP16 sketch): two items 1.2x, long stream 1.5x.
    assert O.pingpong(2, 1, 2).speedup == pytest.approx(1.2)
    assert O.asymptotic_speedup(2, 1) == 1.5
    assert O.pingpong(2, 1, 10_000).speedup == pytest.approx(1.5, abs=1e-3)


@pytest.mark.parametrize("call", [
    lambda: O.producer_consumer(-1, 1, 2),
    lambda: O.producer_consumer(1, 1, 0),
    lambda: O.two_stage_wgmma(1, 1, 1, 2.5),
    lambda: O.pingpong(1, 1, 0),
])
def test_bad_arguments(call):
    with pytest.raises(ValueError):
        call()
