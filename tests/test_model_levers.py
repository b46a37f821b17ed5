"""Prices of the FA4 softmax levers (seed 001 0x09) on the ledger."""
import pytest

from flashrung.model import levers as LV
from flashrung.model import rates as R
from flashrung.model.ledger import Tile, forward


def test_balanced_fraction_equalises_mufu_and_fma():
    t = R.B200_PAPER
    phi = LV.balanced_fraction(t)
    p = LV.price_exp_split(t, Tile(128, 128, 128), phi)
    assert p.exp_cycles == pytest.approx(p.fma_cycles)
    # R_fma/R_exp = 8, six FP32-pipe ops per emulated exp2: phi* = 8/14.
    assert phi == pytest.approx(8 / 14)
    # The softmax's own FP32 work lowers the share the FMA pipe can take.
    assert LV.balanced_fraction(t, base_fma_ops_per_score=4) == pytest.approx(4 / 14)
    assert LV.balanced_fraction(t, base_fma_ops_per_score=100) == 0.0


def test_split_only_moves_the_bound_when_exp_binds():
    tile = Tile(128, 128, 128)
    b200 = R.B200_PAPER
    none = LV.price_exp_split(b200, tile, 0.0)
    some = LV.price_exp_split(b200, tile, 0.25)
    assert none.bound_resources == ("mma", "exp") and some.bound_resources == ("mma",)
    # On a 2x-faster tensor path (exp alone binds) the split lowers the bound.
    fast = b200.with_figures(mma_flops=b200.mma_flops.scaled(2.0, "test"))
    assert LV.price_exp_split(fast, tile, 0.25).bound < LV.price_exp_split(fast, tile, 0.0).bound
    # Hopper, quoted rates: exp does not bind at d = 128, ties at d = 64.
    h200 = R.TABLES["h200"]
    assert not LV.exp_binds(h200, Tile(128, 128, 128))
    assert LV.exp_binds(h200, Tile(128, 128, 64))


def test_conditional_rescale_price():
    p = LV.price_conditional_rescale(R.TABLES["h200"], Tile(128, 128, 128), 0.5)
    assert p.rescale_cycles_always == 128 * 128 / 128
    assert p.saved_cycles == 64
    assert p.share_of_bound == 64 / 2048
    with pytest.raises(ValueError, match="skipped"):
        LV.price_conditional_rescale(R.TABLES["h200"], Tile(128, 128, 128), 1.5)


def test_coupled_unbinding_fraction_is_where_the_slowed_mufu_fits_under_the_mma():
    # with the MUFU at R_exp·(1 − k·β) beside the pipe, d64's 128 x 128 tile needs about a quarter
    # of its exponentials emulated before the MMAs bind (uncoupled it ties at 0%); d128 needs none
    table = R.TABLES["h200"]
    tile = Tile(128, 128, 64)
    phi = LV.coupled_unbinding_fraction(table, tile)
    led = forward(table, tile)
    k = table.exp_mma_coupling.value
    assert 0.24 < phi < 0.26
    assert (1 - phi) * led.exp_cycles + k * led.mma_cycles == pytest.approx(max(led.mma_cycles, led.smem_cycles))
    assert LV.coupled_unbinding_fraction(table, Tile(128, 128, 128)) == 0.0
    assert LV.coupled_unbinding_fraction(R.TABLES["b200"], tile) is None
