"""Oracles for the tile ledgers: seed 001 0x08 (forward) and 0x0A (backward), reproduced exactly."""
import dataclasses

import pytest

from flashrung.model import ledger as L
from flashrung.model import rates as R

B200 = R.B200_PAPER


@pytest.mark.parametrize("shape, mma, smem, exp, largest", [
    # seed 001 0x08, Table 1 rows: MMA and exp tie at d = 128.
    ((128, 128, 128), 1024, 768, 1024, ("mma", "exp")),
    ((256, 128, 128), 2048, 1536, 2048, ("mma", "exp")),
    # The ragged teaching tile: SMEM-bound only once instruction ceilings are counted.
    ((192, 96, 160), 1440, 2048, 1152, ("smem",)),
])
def test_forward_oracle_b200(shape, mma, smem, exp, largest):
    led = L.forward(B200, L.Tile(*shape))
    assert (led.mma_cycles, led.smem_cycles, led.exp_cycles) == (mma, smem, exp)
    assert led.bound == max(mma, smem, exp)
    assert led.bound_resources == largest
    assert led.serial == mma + smem + exp


def test_ragged_tile_instruction_grids():
    # QK grid ceil(192/128) x ceil(96/128) = 2 x 1; PV grid ceil(192/128) x ceil(160/128) = 2 x 2.
    led = L.forward(B200, L.Tile(192, 96, 160))
    assert led.qk_instructions == 2
    assert led.pv_instructions == 4
    assert led.qk_smem_bytes == 2 * 2 * (128 * 160 + 128 * 160)
    assert led.pv_smem_bytes == 2 * 4 * (128 * 96)


def test_ragged_tile_without_ceilings_names_the_wrong_resource():
    # The compact 3bMNd/(128 R_SMEM) formula (divisible tiles only) would call this tile MMA-bound.
    m, n, d = 192, 96, 160
    compact_smem = 3 * 2 * m * n * d / (128 * B200.smem_bytes.value)
    led = L.forward(B200, L.Tile(m, n, d))
    assert compact_smem < led.mma_cycles < led.smem_cycles


def test_divisible_tiles_match_the_compact_formula():
    for m, n, d in [(128, 128, 128), (256, 256, 128), (128, 384, 256)]:
        led = L.forward(B200, L.Tile(m, n, d))
        assert led.smem_cycles == 3 * 2 * m * n * d / (128 * 128)
        assert led.smem_cycles / led.mma_cycles == L.smem_to_mma_ratio(B200) == 0.75


def test_no_overlap_subtotal_and_crossover():
    led = L.forward(B200, L.Tile(128, 128, 128))
    assert led.serial == 2816
    assert L.crossover_headdim(B200) == 128
    # At d* exponentials tie the MMAs for any M, N; below it they dominate, above it MMA does.
    assert L.forward(B200, L.Tile(256, 384, 128)).bound_resources == ("mma", "exp")
    # ... unless instruction ceilings make SMEM the largest term (M = 64 pads to 128 rows).
    assert L.forward(B200, L.Tile(64, 192, 128)).bound_resources == ("smem",)
    assert L.forward(B200, L.Tile(128, 128, 64)).bound_resources == ("exp",)
    assert L.forward(B200, L.Tile(128, 128, 256)).bound_resources == ("mma",)


def test_sensitivity_table_b200():
    rows = L.sensitivity(B200, L.Tile(128, 128, 128))
    got = [(r.mutation, r.ledger.mma_cycles, r.ledger.smem_cycles, r.ledger.exp_cycles,
            r.ledger.bound_resources) for r in rows]
    assert got == [
        ("as quoted", 1024, 768, 1024, ("mma", "exp")),
        ("double only exponential throughput", 1024, 768, 512, ("mma",)),
        ("double only tensor throughput", 512, 768, 1024, ("exp",)),
        ("halve only SMEM bandwidth", 1024, 1536, 1024, ("smem",)),
    ]
    # Mutated tables say they are derived, and from what.
    mutated = L.mutate(B200, {"exp": 2.0}, "double only exponential throughput")
    assert mutated.exp.provenance == R.DERIVED and mutated.exp.value == 32
    assert B200.exp.value == 16


def test_backward_oracle_b200_one_cta():
    led = L.backward(B200, L.Tile(128, 128, 128))
    assert led.mma_cycles == 2560
    assert led.smem_mma_cycles == 2048
    assert led.smem_ds_cycles == 256
    assert led.smem_dq_cycles == 1024
    assert led.smem_cycles == 3328
    assert led.exp_cycles == 1024
    assert led.bound == 3328 and led.bound_resources == ("smem",)
    # Shared memory exceeds the MMA budget by 30% (seed 001 0x0A).
    assert (led.smem_cycles - led.mma_cycles) / led.mma_cycles == pytest.approx(0.30)


def test_hopper_quoted_ledger():
    h200 = R.TABLES["h200"]
    assert L.crossover_headdim(h200) == 64
    led = L.forward(h200, L.Tile(128, 128, 128))
    # wgmma m64: each of the two warpgroups reads its Q rows and the whole K tile, then V.
    assert led.qk_smem_bytes == 2 * 2 * (64 * 128 + 128 * 128)
    assert led.pv_smem_bytes == 2 * 2 * (128 * 128)
    assert (led.mma_cycles, led.smem_cycles, led.exp_cycles) == (2048, 1280, 1024)
    assert led.bound_resources == ("mma",)
    assert L.forward(h200, L.Tile(128, 128, 64)).bound_resources == ("mma", "exp")
    # FA3 measured about half of matmul time in exponentials at d = 128 on H100 (seed 001 0x04).
    assert led.exp_cycles / led.mma_cycles == 0.5


def test_rtx5090_is_tensor_bound_far_above_its_crossover():
    t = R.TABLES["rtx5090"]
    assert L.crossover_headdim(t) == 8
    led = L.forward(t, L.Tile(64, 64, 128))
    assert led.bound_resources == ("mma",)
    assert led.exp_cycles / led.mma_cycles == 8 / 128


def test_head_dim_v_enters_flops_and_pv_reads():
    t = R.TABLES["h200"]
    a = L.forward(t, L.Tile(128, 128, 128, 64))
    assert a.flops == 2 * 128 * 128 * (128 + 64)
    assert a.pv_smem_bytes == 2 * 2 * (128 * 64)


@pytest.mark.parametrize("bad", [dict(m=0, n=128, d=128), dict(m=128, n=-1, d=64), dict(m=128, n=128, d=1.5)])
def test_tile_rejects_bad_dims(bad):
    with pytest.raises(ValueError, match="positive integer"):
        L.Tile(**bad)


def test_tile_parse():
    assert L.Tile.parse("192x96", 160) == L.Tile(192, 96, 160, 160)
    with pytest.raises(ValueError, match="128x128"):
        L.Tile.parse("128", 128)


def test_backward_refuses_unequal_value_dim():
    with pytest.raises(ValueError, match="d_v == d"):
        L.backward(B200, L.Tile(128, 128, 128, 64))


def test_ledger_is_frozen():
    led = L.forward(B200, L.Tile(128, 128, 128))
    with pytest.raises(dataclasses.FrozenInstanceError):
        led.mma_cycles = 0


@pytest.mark.parametrize("d", [32, 64, 80, 96, 128, 256])
def test_coupled_bound_is_the_self_consistent_time(d):
    # beside a pipe busy T_MMA/T of the time the exponentials run at R_exp·(1 − k·T_MMA/T): where
    # they bind, the coupled bound T finishes exactly the tile's M·N of them; where the MMAs bind,
    # the exponentials at β = 1 fit inside T_MMA
    table = R.TABLES["h200"]
    k, r_exp = table.exp_mma_coupling.value, table.exp.value
    led = L.forward(table, L.Tile(128, 128, d))
    c = led.to_json()["coupled"]
    assert c["k"] == k and c["exp_cycles"] == pytest.approx(led.exp_cycles + k * led.mma_cycles)
    t = c["bound"]
    if c["bound_resources"] == ["exp"]:
        assert r_exp * (1 - k * led.mma_cycles / t) * t == pytest.approx(led.exps)
    else:
        assert led.exps / (r_exp * (1 - k * led.mma_cycles / t)) <= t * (1 + 1e-9)
    assert t >= led.bound


def test_coupled_crossover_moves_d_star_and_ties_there():
    table = R.TABLES["h200"]
    d_star = L.coupled_crossover_headdim(table)
    assert d_star == pytest.approx(L.crossover_headdim(table) / (1 - table.exp_mma_coupling.value))
    assert 85 < d_star < 86                       # 64 at the uncoupled rate
    # at 128 x 128: d64 binds on the exponentials by ~25%, d128 stays on the MMAs
    d64 = L.forward(table, L.Tile(128, 128, 64)).to_json()["coupled"]
    assert d64["bound_resources"] == ["exp"] and d64["bound"] == pytest.approx(1.25 * 1024, rel=0.01)
    assert L.forward(table, L.Tile(128, 128, 128)).to_json()["coupled"]["bound_resources"] == ["mma"]
    # the tie: at d* the coupled exponential time equals the MMA time (a non-integer d, so by formula)
    tile = L.Tile(128, 128, 96)
    led = L.forward(table, tile)
    scale = d_star / 96
    assert led.exp_cycles + table.exp_mma_coupling.value * led.mma_cycles * scale == pytest.approx(
        led.mma_cycles * scale)


def test_tables_without_a_coupling_report_none():
    for name in ("b200", "h100", "rtx5090"):
        table = R.TABLES[name]
        assert L.forward(table, L.Tile(128, 128, 128)).to_json()["coupled"] is None
        assert L.backward(table, L.Tile(128, 128, 128)).to_json()["coupled"] is None
        assert L.coupled_crossover_headdim(table) is None
