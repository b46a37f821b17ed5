"""The ladder (seed 000 in Gluon): each rung's lever is visible in its SASS, the v3 -> v4
exponential closed form holds per head dim, the sm_120 shared-memory card fits, and on a GPU
every rung passes the gate.

The census compiles in one interpreter-free subprocess per module (Gluon cannot compile under
TRITON_INTERPRET=1, which the CPU suite sets), two compiles at a time.
"""
import dataclasses
import functools
import math
import types

import pytest
import torch

from flashrung import dispatch
from flashrung.kernels import ladder
from flashrung.kernels.ladder import common, evidence, v3, v5, v7, v9, v10, v14, v15, v16, v17, v18, v19, v20, v21, v22, v23
from conftest import Subprocesses, early_start

SM90 = "sm_90a"
D128_FULL = {"head_dim": 128, "causal": False}
D128_CAUSAL = {"head_dim": 128, "causal": True}
SM120_SMEM_LIMIT = 99 * 1024   # the seed's card: opt-in dynamic shared memory per block

# (key, selector): every configuration the CPU tests below look at, compiled once.
SELECTORS = {
    "v0": ("v0", SM90, D128_FULL),
    "v1": ("v1", SM90, D128_FULL),
    "v2": ("v2", SM90, D128_FULL),
    "v3": ("v3", SM90, {**D128_FULL, "kv_stages": 1}),
    "v3_d64": ("v3", SM90, {"head_dim": 64, "causal": False, "kv_stages": 1}),
    "v4": ("v4", SM90, D128_FULL),
    "v4_d64": ("v4", SM90, {"head_dim": 64, "causal": False}),
    "v4_causal": ("v4", SM90, D128_CAUSAL),
    "v5_causal": ("v5", SM90, {**D128_CAUSAL, "persistent": False}),
    "v5_causal_persistent": ("v5", SM90, {**D128_CAUSAL, "persistent": True}),
    "v5_persistent": ("v5", SM90, {**D128_FULL, "persistent": True}),
    "v5_d64_causal_persistent": ("v5", SM90, {"head_dim": 64, "causal": True, "persistent": True}),
    "v8": ("v8", SM90, D128_FULL),
    "v8_causal": ("v8", SM90, D128_CAUSAL),
    "v9_causal": ("v9", SM90, D128_CAUSAL),
    "v10_causal": ("v10", SM90, D128_CAUSAL),
    "v11_causal": ("v11", SM90, D128_CAUSAL),
    "v12_causal": ("v12", SM90, D128_CAUSAL),
    "v13_causal": ("v13", SM90, D128_CAUSAL),
    "v13": ("v13", SM90, D128_FULL),
    "v14_causal": ("v14", SM90, {**D128_CAUSAL, "qk_ahead": True, "kv_copy": "one_stride"}),
    "v14": ("v14", SM90, {**D128_FULL, "qk_ahead": True, "kv_copy": "one_stride"}),
    "v14_causal_off": ("v14", SM90, {**D128_CAUSAL, "qk_ahead": False, "kv_copy": "one_stride"}),
    "v14_off": ("v14", SM90, {**D128_FULL, "qk_ahead": False, "kv_copy": "one_stride"}),
    "v14_causal_apart": ("v14", SM90, {**D128_CAUSAL, "qk_ahead": True, "kv_copy": "rows"}),
    "v15_causal": ("v15", SM90, {**D128_CAUSAL, "kv_copy": "one_stride"}),
    "v15": ("v15", SM90, {**D128_FULL, "kv_copy": "one_stride"}),
    "v15_d64_causal": ("v15", SM90, {"head_dim": 64, "causal": True}),
    "v14_d64_causal": ("v14", SM90, {"head_dim": 64, "causal": True, "qk_ahead": True}),
    "v16_causal_mma": ("v16", SM90, {**D128_CAUSAL, "kv_copy": "one_stride", "row_sum": "mma"}),
    "v16_causal_deferred": ("v16", SM90, {**D128_CAUSAL, "kv_copy": "one_stride", "row_sum": "deferred"}),
    "v16_full_mma": ("v16", SM90, {**D128_FULL, "kv_copy": "one_stride", "row_sum": "mma"}),
    "v16_full_deferred": ("v16", SM90, {**D128_FULL, "kv_copy": "one_stride", "row_sum": "deferred"}),
    "v16_d64_causal_mma": ("v16", SM90, {**{"head_dim": 64, "causal": True}, "kv_copy": "tile", "row_sum": "mma"}),
    "v16_d64_causal_deferred": ("v16", SM90, {**{"head_dim": 64, "causal": True}, "kv_copy": "tile", "row_sum": "deferred"}),
    "v15_d64": ("v15", SM90, {"head_dim": 64, "causal": False}),
    "v17_causal": ("v17", SM90, {**D128_CAUSAL, "kv_copy": "one_stride"}),
    "v17": ("v17", SM90, {**D128_FULL, "kv_copy": "one_stride"}),
    "v18_causal": ("v18", SM90, {**D128_CAUSAL, "kv_copy": "one_stride"}),
    "v18": ("v18", SM90, {**D128_FULL, "kv_copy": "one_stride"}),
    "v18_causal_apart": ("v18", SM90, {**D128_CAUSAL, "kv_copy": "rows"}),
    "v18_d64_causal": ("v18", SM90, {"head_dim": 64, "causal": True}),
    "v19_causal": ("v19", SM90, {**D128_CAUSAL, "kv_copy": "one_stride", "num_warps": 4}),
    "v19": ("v19", SM90, {**D128_FULL, "kv_copy": "one_stride", "num_warps": 4}),
    "v19_wide_causal": ("v19", SM90, {**D128_CAUSAL, "kv_copy": "one_stride", "num_warps": 8}),
    "v19_wide_d64_causal": ("v19", SM90, {"head_dim": 64, "causal": True, "num_warps": 8}),
    "v20_causal": ("v20", SM90, {**D128_CAUSAL, "kv_copy": "one_stride"}),
    "v20": ("v20", SM90, {**D128_FULL, "kv_copy": "one_stride"}),
    "v20_causal_apart": ("v20", SM90, {**D128_CAUSAL, "kv_copy": "rows"}),
    "v20_d64_causal": ("v20", SM90, {"head_dim": 64, "causal": True}),
    "v21_causal": ("v21", SM90, {**D128_CAUSAL, "kv_copy": "one_stride"}),
    "v21": ("v21", SM90, {**D128_FULL, "kv_copy": "one_stride"}),
    "v21_d64_causal": ("v21", SM90, {"head_dim": 64, "causal": True}),
    "v22_causal": ("v22", SM90, {**D128_CAUSAL, "kv_copy": "one_stride"}),
    "v22": ("v22", SM90, {**D128_FULL, "kv_copy": "one_stride"}),
    "v22_causal_apart": ("v22", SM90, {**D128_CAUSAL, "kv_copy": "rows"}),
    "v22_d64_causal": ("v22", SM90, {"head_dim": 64, "causal": True}),
    "v23_causal": ("v23", SM90, {**D128_CAUSAL, "kv_copy": "one_stride"}),
    "v23": ("v23", SM90, {**D128_FULL, "kv_copy": "one_stride"}),
    "v23_d64_causal": ("v23", SM90, {"head_dim": 64, "causal": True}),
    "v19_d64_causal": ("v19", SM90, {"head_dim": 64, "causal": True, "num_warps": 4}),
    "v1_sm80": ("v1", "sm_80", D128_FULL),
    "v3_sm80": ("v3", "sm_80", {**D128_FULL, "kv_stages": 1}),
    **{f"v7_{name}": ("v7", SM90, {**D128_CAUSAL, "variant": name})
       for name in ("all_keeps", *v7.SWITCH_OFF, "max_registers_168")},
    # sm_120: the largest configuration of every rung (head_dim 128), and v3's double buffer.
    **{f"{r.name}_sm120": (r.name, "sm_120", {"ladder.v3": {**D128_FULL, "kv_stages": 1},
                                              "ladder.v7": {**D128_FULL, "variant": "all_keeps"},
                                              "ladder.v14": {**D128_FULL, "qk_ahead": True, "kv_copy": "one_stride"},
                                              "ladder.v15": {**D128_FULL, "kv_copy": "one_stride"},
                                              "ladder.v16": {**D128_FULL, "kv_copy": "one_stride", "row_sum": "mma"},
                                              "ladder.v17": {**D128_FULL, "kv_copy": "one_stride"},
                                              "ladder.v18": {**D128_FULL, "kv_copy": "one_stride"},
                                              "ladder.v19": {**D128_FULL, "kv_copy": "one_stride", "num_warps": 4},
                                              "ladder.v20": {**D128_FULL, "kv_copy": "one_stride"},
                                              "ladder.v21": {**D128_FULL, "kv_copy": "one_stride"},
                                              "ladder.v22": {**D128_FULL, "kv_copy": "one_stride"},
                                              "ladder.v23": {**D128_FULL, "kv_copy": "one_stride"},
                                              "ladder.v5": {**D128_FULL, "persistent": False},
                                              }.get(r.name, D128_FULL))
       for r in ladder.RUNGS},
    "v3_kv2_sm120": ("v3", "sm_120", {**D128_FULL, "kv_stages": 2}),
}
BF16 = {"v7_bf16": ("v7", SM90, {**D128_CAUSAL, "variant": "all_keeps"})}
# the top rungs as a launch at config B (B1 H16 S32768 d128 bf16 causal) specializes them: the
# binary the ladder times there
LAUNCHED_B = {f"{r}_at_b": (r, SM90, {**D128_CAUSAL, "kv_copy": "one_stride"}) for r in ("v20", "v22", "v23")}


def _selectors() -> list[dict]:
    selectors = [{"rung": r, "arch": a, "match": m} for r, a, m in SELECTORS.values()]
    selectors += [{"rung": r, "arch": a, "match": m, "dtype": "bf16"} for r, a, m in BF16.values()]
    selectors += [{"rung": r, "arch": a, "match": m, "dtype": "bf16", "launch": "B"} for r, a, m in LAUNCHED_B.values()]
    return selectors


def _start_rows() -> Subprocesses:
    # every rung's census in one fresh interpreter-free process of two jobs, started when
    # collection ends (conftest.EARLY_STARTS)
    from flashrung.evidence.census import interpreter_free_env
    return Subprocesses([evidence.rows_command(_selectors(), jobs=2)], interpreter_free_env())


EARLY_STARTS = {"rows": _start_rows}


@pytest.fixture(scope="module")
def rows():
    import json

    (out,) = early_start(__name__, "rows", _start_rows).result(timeout=900)
    got = json.loads(out)
    keys = list(SELECTORS) + list(BF16) + list(LAUNCHED_B)
    out = dict(zip(keys, got))
    for key, row in out.items():
        assert not row.get("error"), (key, row.get("error"))
    return out


# ------------------------------------------------------------------------------------------
# Registration and host-side validation (no compile)
# ------------------------------------------------------------------------------------------

def test_every_rung_is_a_dispatch_backend_and_in_the_census_registry():
    from flashrung.kernels.registry import CENSUS_MODULES

    assert "flashrung.kernels.ladder" in CENSUS_MODULES
    extra = {b.name: b for b in dispatch.EXTRA_FORWARD_BACKENDS}
    for r in ladder.RUNGS:
        assert extra[r.name].module == r.module and not extra[r.name].auto, r
        mod = r.load()
        assert mod.NAME == r.name and mod.PARENT == r.parent
    # every parent is an earlier rung: the seed's chain v0 -> v7, and v8 branching from v4
    for i, r in enumerate(ladder.RUNGS[1:], 1):
        assert r.parent in [p.name for p in ladder.RUNGS[:i]], r
    assert [r.parent for r in ladder.RUNGS[1:7]] == [r.name for r in ladder.RUNGS[:6]]


def _problem(**kw):
    base = dict(batch=1, seqlen_q=17, seqlen_k=17, heads_q=4, heads_kv=2, head_dim=128, head_dim_v=128,
                dtype=torch.float16, causal=True, device_type="cuda", capability=(9, 0), interpreter=False)
    base.update(kw)
    return dispatch.Problem(**base)


@pytest.mark.parametrize("rung", ladder.RUNGS, ids=lambda r: r.name)
def test_unsupported_reason_names_each_limit(rung):
    mod = rung.load()
    assert mod.unsupported_reason(_problem()) is None
    assert mod.unsupported_reason(_problem(dtype=torch.bfloat16, head_dim=64, head_dim_v=64)) is None
    assert "CUDA" in mod.unsupported_reason(_problem(device_type="cpu", capability=None))
    assert "INTERPRET" in mod.unsupported_reason(_problem(interpreter=True))
    assert "sm_80" in mod.unsupported_reason(_problem(capability=(7, 5)))
    assert "float16" in mod.unsupported_reason(_problem(dtype=torch.float32))
    assert "head_dim" in mod.unsupported_reason(_problem(head_dim=96, head_dim_v=96))
    assert "head_dim_v" in mod.unsupported_reason(_problem(head_dim_v=64))
    assert "sliding window" in mod.unsupported_reason(_problem(window_size=(8, 0)))
    assert "softcap" in mod.unsupported_reason(_problem(softcap=30.0))
    assert "packed sequences" in mod.unsupported_reason(_problem(varlen=True))
    assert "heads_kv" in mod.unsupported_reason(_problem(heads_q=3, heads_kv=2))


def test_forward_rejects_bad_input_naming_the_argument():
    q = torch.randn(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        v7.forward(q, q, q, False, 0.125)
    with pytest.raises(TypeError, match="k has dtype torch.float32; expected float16 or bfloat16"):
        v7.forward(q, q.float(), q, False, 0.125)
    with pytest.raises(ValueError, match="v must have 4 dimensions"):
        v7.forward(q, q, q[0], False, 0.125)


def test_configs_refuse_impossible_combinations():
    with pytest.raises(ValueError, match="block_m"):
        common.TileConfig(block_m=128, num_warps=4)
    with pytest.raises(ValueError, match="causal_split"):
        v7.KeepsConfig(mask_specialize=False, causal_split=True)
    with pytest.raises(ValueError, match="kv_stages"):
        v3.PipelineConfig(kv_stages=3)
    assert v7.SWITCH_OFF["no_mask_specialize"].mask_mode == v7.MASK_EVERY_BLOCK.value
    assert v7.SWITCH_OFF["no_causal_split"].mask_mode == v7.MASK_BRANCH.value
    assert v7.CONFIG.mask_mode == v7.MASK_SPLIT.value


def test_host_scale_folds_log2e_once():
    assert common.host_scale(0.125, exp2=False) == 0.125
    assert common.host_scale(0.125, exp2=True) == pytest.approx(0.125 / math.log(2))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_swizzle_model_predicts_the_seed_conflict_factor(head_dim):
    """v2's lever at model level: row-major rows are a multiple of the 128-byte bank period, so
    one ldmatrix phase's 8 rows hit the same banks (8 wavefronts, 32 per x4); the XOR swizzle
    the kernels declare spreads them (1, 4 per x4). ncu measures it on the GPU."""
    rm = evidence.layout_fields(common.row_major_layout.fn())
    sw = evidence.layout_fields(common.xor_swizzled_layout.fn())
    assert evidence.ldmatrix_wavefronts(head_dim, *rm) == 8
    assert evidence.ldmatrix_wavefronts(head_dim, *sw) == 1


# ------------------------------------------------------------------------------------------
# Census: each lever visible in SASS (sm_90a unless the test says otherwise)
# ------------------------------------------------------------------------------------------

def test_v0_runs_on_cuda_cores_only(rows):
    s = rows["v0"]["sass"]
    assert s["HMMA"] == 0 and s["HGMMA"] == 0 and s["LDSM"] == 0
    # The two FMA matmuls: 64*64*D/128 (QK^T) + 64*D*64/128 (PV) FFMA per thread per block.
    assert s["FFMA"] >= 64 * 128


def test_v1_moves_both_matmuls_to_mma_sync_fed_by_ldmatrix(rows):
    for key in ("v1", "v1_sm80"):
        s = rows[key]["sass"]
        # m16n8k16 per warp: QK^T (64/8)*(D/16) + PV (D/8)*(64/16) = D per loop body.
        assert s["HMMA"] == 128 and s["HGMMA"] == 0, key
        assert s["LDSM"] > 0, key
    assert rows["v1"]["smem_bytes"] == 3 * 64 * 128 * 2           # Q, K, V tiles; no P buffer
    assert rows["v0"]["smem_bytes"] == rows["v1"]["smem_bytes"] + 64 * 64 * 2


def test_v2_swizzle_changes_no_instruction_family(rows):
    """Bank conflicts are an address property: the static mix of v1 and v2 is the same, the
    difference has to be measured (ncu ldsm wavefronts per instruction)."""
    a, b = rows["v1"], rows["v2"]
    for fam in ("HMMA", "LDSM", "LDG", "STS", "MUFU.EX2", "BAR"):
        assert a["sass"][fam] == b["sass"][fam], fam
    assert a["smem_bytes"] == b["smem_bytes"]


def test_v3_stages_with_cp_async_where_v2_loads_through_registers(rows):
    v2s, v3s = rows["v2"]["sass"], rows["v3"]["sass"]
    assert v2s["LDGSTS"] == 0 and v3s["LDGSTS"] > 0
    # v2: one 2-byte LDG per element of Q, K, V (64*128/128 threads per tile); v3: none.
    assert v2s["LDG"] == 3 * 64 and v3s["LDG"] == 0
    # v3: 16-byte copies, 8x fewer: 64*128*2/16/128 = 8 per tile.
    assert v3s["LDGSTS"] == 3 * 8
    assert rows["v3_sm80"]["sass"]["LDGSTS"] == 3 * 8
    # The staged values no longer live in registers: v2 spills at d=128, v3 does not.
    assert rows["v2"]["spill_bytes"] > 0 and rows["v3"]["spill_bytes"] == 0


@pytest.mark.parametrize("head_dim", [64, 128])
def test_v4_exp2_closed_form(rows, head_dim):
    """Per loop body each thread makes E = 64*64/128 + 2 = 34 exponential calls. libdevice expf
    (v3) is one MUFU.EX2 plus range reduction: FFMA.FTZ.RM and FADD.FTZ.SAT once per call, three
    FFMA.FTZ, an FADD, a shift, an FMUL. ex2.approx.ftz (v4) is the MUFU.EX2 alone. So MUFU.EX2
    stays E, the FTZ range-reduction families drop by exactly E, E and 3E, and the FP32 pipe
    loses about 7E instructions — independently of head_dim."""
    v3_row = rows["v3" if head_dim == 128 else "v3_d64"]
    v4_row = rows["v4" if head_dim == 128 else "v4_d64"]
    e = evidence.exp_calls_per_body(64, 64, 4)
    assert e == 34
    cf = evidence.exp_closed_form(v3_row, v4_row)
    assert cf["MUFU.EX2"] == (e, e)
    assert cf["FFMA.FTZ.RM"] == e and cf["FADD.FTZ.SAT"] == e and cf["FFMA.FTZ"] == 3 * e
    assert evidence.opcode_count(v4_row, "FFMA.FTZ.RM", "FADD.FTZ.SAT") == 0
    assert 6 * e <= cf["fp32_pipe"] <= 7 * e, cf
    assert v3_row["sass"]["HMMA"] == v4_row["sass"]["HMMA"] == head_dim


def test_v4_closed_form_is_head_dim_independent(rows):
    big = evidence.exp_closed_form(rows["v3"], rows["v4"])
    small = evidence.exp_closed_form(rows["v3_d64"], rows["v4_d64"])
    assert big["fp32_pipe"] == small["fp32_pipe"]


def test_v5_reorders_programs_without_touching_the_loop(rows):
    a, b = rows["v4_causal"]["sass"], rows["v5_causal"]["sass"]
    for fam in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "FFMA", "FMUL", "BAR"):
        assert a[fam] == b[fam], fam


def test_v5_persistent_arm_walks_items_around_the_same_block(rows):
    # the arm wraps v5's tile in a loop over work items: the block's MMAs, fragment loads, copies
    # and exponentials are v5's; one CTA barrier more (the shared tiles' write-after-read between
    # items); the item loop's live values cost registers (d64) and move a few address ops into
    # the block loop, with no local memory inside it
    for plain, arm in (("v5_causal", "v5_causal_persistent"),):
        a, b = rows[plain]["loops"][0], rows[arm]["loops"][0]
        for fam in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "FFMA", "FMUL", "BAR"):
            assert a[fam] == b[fam], fam
        assert rows[arm]["sass"]["BAR"] == rows[plain]["sass"]["BAR"] + 1
    for arm in ("v5_causal_persistent", "v5_persistent", "v5_d64_causal_persistent"):
        loop = rows[arm]["loops"][0]
        assert loop["LDL"] == loop["STL"] == 0, arm
        assert rows[arm]["spill_bytes"] <= 64, arm
    # what sizes the persistent grid: d128 at 255 registers holds two 4-warp CTAs per SM
    r = rows["v5_causal_persistent"]
    assert common.resident_ctas_per_sm(r["regs"], 4, r["smem_bytes"], (9, 0), 228 * 1024) == 2


def test_resident_ctas_per_sm_takes_the_tightest_limit():
    h200 = dict(capability=(9, 0), smem_per_sm_bytes=228 * 1024)
    assert common.resident_ctas_per_sm(255, 4, 48 * 1024, **h200) == 2         # registers (8,192 a warp)
    assert common.resident_ctas_per_sm(168, 4, 32 * 1024, **h200) == 3         # v11's cap: 5,376 a warp
    assert common.resident_ctas_per_sm(32, 4, 112 * 1024, **h200) == 2         # shared memory + 1 KiB each
    assert common.resident_ctas_per_sm(32, 4, 0, **h200) == 16                 # 2,048 threads
    assert common.resident_ctas_per_sm(32, 4, 0, capability=(12, 0), smem_per_sm_bytes=100 * 1024) == 12
    assert common.resident_ctas_per_sm(16, 1, 0, **h200) == 32                 # the CTA limit
    with pytest.raises(ValueError, match="does not fit one SM"):
        common.resident_ctas_per_sm(255, 4, 228 * 1024, **h200)


def test_v5_config_overrides():
    assert v5.config_with(None, {"persistent": "true"}) == v5.PERSISTENT
    assert v5.config_with(None, {}) == v5.CONFIG and not v5.CONFIG.persistent
    with pytest.raises(ValueError, match="override persistent='sometimes': expected true or false"):
        v5.config_with(None, {"persistent": "sometimes"})
    with pytest.raises(ValueError, match="unknown ladder.v5 config key 'block_n'"):
        v5.config_with(None, {"block_n": "32"})


def test_v3_and_v7_arms_are_reachable_as_overrides():
    # every arm the walkthrough prices is an ``impl="ladder.vN@key=value"`` of flashrung compare
    assert v3.config_with(None, {"kv_stages": "2"}) == v3.DOUBLE_BUFFER
    assert v3.config_with(None, {}).kv_stages == 1
    with pytest.raises(ValueError, match="kv_stages must be 1 .* or 2 .*, got 3"):
        v3.config_with(None, {"kv_stages": "3"})
    for name, cfg in v7.SWITCH_OFF.items():
        changed = {f.name: str(getattr(cfg, f.name)).lower() for f in dataclasses.fields(cfg)
                   if getattr(cfg, f.name) != getattr(v7.CONFIG, f.name)}
        assert v7.config_with(None, changed) == cfg, name
    assert v7.config_with(None, {"max_registers": "168"}) == v7.THREE_CTAS_PER_SM
    with pytest.raises(ValueError, match="causal_split=True needs mask_specialize=True"):
        v7.config_with(None, {"mask_specialize": "false"})
    with pytest.raises(ValueError, match="max_registers must be None or in"):
        v7.config_with(None, {"max_registers": "300"})
    with pytest.raises(ValueError, match="expected an integer or none"):
        v7.config_with(None, {"max_registers": "many"})


def test_v9_reorders_programs_without_touching_the_loop(rows):
    # v9 changes only the tile decode before the loop (HeaviestFirst inside L2-sized sections):
    # every family the loop is made of matches v5's, and the decode's own integer work is the rest
    a, b = rows["v5_causal"]["sass"], rows["v9_causal"]["sass"]
    for fam in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "FFMA", "FMUL", "BAR"):
        assert a[fam] == b[fam], fam
    assert rows["v9_causal"]["spill_bytes"] == rows["v5_causal"]["spill_bytes"] == 0


def test_v10_staggers_the_sweep_without_touching_the_block_body(rows):
    # v10 changes only which key block each trip visits (a wrap of the block index): the block's
    # MMA, fragment loads, copies, exponentials and barriers are v9's, still with no spill
    a, b = rows["v9_causal"]["sass"], rows["v10_causal"]["sass"]
    for fam in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "FFMA", "FMUL", "BAR"):
        assert a[fam] == b[fam], fam
    assert rows["v10_causal"]["spill_bytes"] == 0
    assert rows["v10_causal"]["regs"] <= rows["v9_causal"]["regs"] + 8


# v11's price for three CTAs per SM (census, d128 causal): 248 B of spill, 28 LDL in the block loop
V11_SPILL_BYTES = 256


def test_v11_fits_three_ctas_per_sm_with_v4s_instructions(rows):
    # the register cap is the whole lever: the block's MMA, fragment loads, copies and
    # exponentials are v4's; 168 registers x 128 threads x 3 CTAs fit the 64 Ki register file
    # (v4's 255 fit two), and what no longer fits in registers goes to local memory, bounded
    a, b = rows["v4_causal"], rows["v11_causal"]
    for fam in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2"):
        assert a["sass"][fam] == b["sass"][fam], fam
    assert b["regs"] <= 168 and 3 * 128 * b["regs"] <= 64 * 1024 < 3 * 128 * a["regs"]
    assert 0 < b["spill_bytes"] <= V11_SPILL_BYTES and a["spill_bytes"] == 0


def test_v12_adds_the_ring_and_nothing_else(rows):
    # the lever is the second K/V slot: the block's MMA, fragment loads and exponentials are v4's;
    # the prefetch adds its copies (LDGSTS), the ring adds 2 x 64 x 128 x 2 B = 32 KiB of shared
    # memory (K and V one slot each) and no spill
    a, b = rows["v4_causal"], rows["v12_causal"]
    for fam in ("HMMA", "LDSM", "MUFU.EX2"):
        assert a["sass"][fam] == b["sass"][fam], fam
    assert b["sass"]["LDGSTS"] > a["sass"]["LDGSTS"]
    assert b["smem_bytes"] - a["smem_bytes"] == 2 * 64 * 128 * 2
    assert b["spill_bytes"] == 0 and b["regs"] <= 255


def test_v13_is_v8s_tile_on_v12s_ring(rows):
    # the lever is v8's tile: the block's MMA, fragment loads and exponentials are v8's (0.375
    # fragment loads per MMA against v12's 0.56); the ring's prefetch adds copies over v8 as it
    # did over v4 (LDGSTS), 2 x 32 x 128 x 2 B = 16 KiB of second slots; causal (config B) fits
    # 255 registers with no spill, non-causal spills what v8 spills
    v13, v13_full, v8, v8_full, v12 = (rows[k] for k in ("v13_causal", "v13", "v8_causal", "v8", "v12_causal"))
    for fam in ("HMMA", "LDSM", "MUFU.EX2"):
        assert v13["sass"][fam] == v8["sass"][fam], fam
    assert v13["sass"]["LDSM"] * v12["sass"]["HMMA"] < v12["sass"]["LDSM"] * v13["sass"]["HMMA"]
    assert v13["sass"]["LDGSTS"] > v8["sass"]["LDGSTS"]
    assert v13["smem_bytes"] - v8["smem_bytes"] == 2 * 32 * 128 * 2
    assert v13["spill_bytes"] == 0 and v13["regs"] <= 255
    assert v13_full["spill_bytes"] == v8_full["spill_bytes"]


def test_v14_adds_a_second_score_tile_and_nothing_else(rows):
    # the lever is where S(j+1) is computed: with it switched off (v12's order on the same
    # three-slot ring and copies) the kernel issues the same MMA, fragment loads and
    # exponentials; QK one block ahead keeps a second 16 x 64 fp32 score tile live (more
    # registers), and at d128 both fit 255 registers with no spill — K and V sharing each row's
    # copy offset (``common.issue_kv_async_one_stride``) is what makes room for it (a 64-bit
    # offset per row for each of K and V, v12's copies, spilled 120 B)
    for on, off in (("v14_causal", "v14_causal_off"), ("v14", "v14_off")):   # K and V with one stride
        a, b = rows[on], rows[off]
        for fam in ("HMMA", "LDSM", "MUFU.EX2", "LDGSTS"):
            assert a["sass"][fam] == b["sass"][fam], (on, fam)
        assert a["regs"] > b["regs"], on
        assert a["spill_bytes"] == 0 == b["spill_bytes"] and a["regs"] <= 255, on
        assert a["smem_bytes"] == v14.CONFIG.smem_bytes(128) == (64 + 2 * 3 * 64) * 128 * 2
    # the third slot's prologue copy over v12's ring: one more K/V block (8 + 8 LDGSTS per thread)
    assert rows["v14_causal"]["sass"]["LDGSTS"] - rows["v12_causal"]["sass"]["LDGSTS"] == 16
    # K and V laid out apart keep two offsets per row: formed per row at each copy, still no spill
    apart = rows["v14_causal_apart"]
    assert apart["spill_bytes"] == 0 and apart["sass"]["HMMA"] == rows["v14_causal"]["sass"]["HMMA"]


def test_v14_loop_meets_two_barriers_per_trip_as_its_ring_needs(rows):
    # one after the wait (every warp's copies of block j+1 visible), one at the end (every warp done
    # with slot j before the next trip's copy overwrites it) — as with the lever off. The peeled
    # first QK reads the K ring before the loop; unfenced, Triton's shared-memory barrier analysis
    # put a bar.sync before every trip's copy (a third per trip), so v14 fences it once before the loop
    for on, off in (("v14_causal", "v14_causal_off"), ("v14", "v14_off"), ("v14_causal_apart", "v14_causal_off")):
        (loop_on,), (loop_off,) = rows[on]["loops"], rows[off]["loops"]
        assert loop_on["BAR"] == loop_off["BAR"] == 2, on
        assert loop_on["HMMA"] == loop_off["HMMA"] == 128, on


def test_v15_runs_interior_blocks_without_the_mask(rows):
    # two copies of v14's trip: first the unmasked one (interior blocks: the key-length and
    # diagonal compares and selects gone, FSEL 66 causal / 34 non-causal -> 2), then the masked
    # one; each the same MMA, fragment loads, exponentials and two barriers as v14's one loop, no
    # spill. The unmasked trip is where a long tile spends its time: shorter than v14's trip
    for on, parent in (("v15_causal", "v14_causal"), ("v15", "v14"), ("v15_d64_causal", "v14_d64_causal")):
        (trip,) = rows[parent]["loops"]
        unmasked, masked = rows[on]["loops"]
        for loop in (unmasked, masked):
            for fam in ("HMMA", "LDSM", "MUFU.EX2", "LDGSTS", "BAR"):
                assert loop[fam] == trip[fam], (on, fam)
        assert unmasked["FSEL"] < masked["FSEL"] == trip["FSEL"], on
        assert unmasked["length"] < trip["length"], (on, unmasked["length"], trip["length"])
        assert rows[on]["spill_bytes"] == 0 and rows[on]["regs"] <= 255, on
    # census, sm_90a, d128 causal: the interior trip is a fifth shorter than v14's
    assert rows["v15_causal"]["loops"][0]["length"] <= 0.85 * rows["v14_causal"]["loops"][0]["length"]


def test_v16_takes_the_row_sum_out_of_the_trip(rows):
    # v15's trip adds each row's 16 exponentials per thread (FADD) and exchanges the quad's
    # partials (SHFL); on the tensor core (mma) the adds become one n8 HMMA per k-step of PV
    # (4 at BLOCK_N = 64) and the exchange leaves the loop; deferred, the exchange leaves the loop.
    # Same exponentials and fragment loads; the unmasked trip (loops[0]) shorter than v15's
    pairs = (("causal", "v15_causal"), ("full", "v15"), ("d64_causal", "v15_d64_causal"))
    for tag, parent in pairs:
        trip = rows[parent]["loops"][0]
        mma, deferred = rows[f"v16_{tag}_mma"]["loops"][0], rows[f"v16_{tag}_deferred"]["loops"][0]
        for loop in (mma, deferred):
            for fam in ("LDSM", "MUFU.EX2", "LDGSTS", "BAR"):
                assert loop[fam] == trip[fam], (tag, fam)
        assert mma["HMMA"] == trip["HMMA"] + 64 // 16 and deferred["HMMA"] == trip["HMMA"], tag
        assert mma["SHFL"] == deferred["SHFL"] == trip["SHFL"] - 4, tag
        assert mma["FADD"] < 4 < trip["FADD"], tag
        assert deferred["length"] < trip["length"], tag
    # the tensor-core form is the shorter trip where it fits (d64, d128 non-causal) and spills at
    # d128 causal (the copies' row offsets, reloaded every trip); it lost on the H200 wherever it
    # was priced, so auto is the deferred form, which never spills
    for tag in ("full", "d64_causal"):
        assert rows[f"v16_{tag}_mma"]["spill_bytes"] == 0, tag
        assert rows[f"v16_{tag}_mma"]["loops"][0]["length"] < rows[f"v16_{tag}_deferred"]["loops"][0]["length"]
    assert rows["v16_causal_mma"]["spill_bytes"] > 0
    for tag, _ in pairs:
        assert rows[f"v16_{tag}_deferred"]["spill_bytes"] == 0, tag
    assert {v16.row_sum_form(d, c) for d in (64, 128) for c in (False, True)} == {v16.SUM_DEFERRED}
    assert v16.row_sum_form(128, True, "mma") == v16.SUM_MMA


def _before_first(sequence: str, family: str, stop: str) -> int:
    ops = sequence.split()
    return ops[:ops.index(stop)].count(family)


def test_v17_starts_each_trip_on_a_known_max(rows):
    # v16's unmasked trip opens with the row max of its block (32 FMNMX and the quad's shuffles
    # before the first exponential); v17 formed that max in the previous trip, after the last QK
    # HMMA, so the trip's exponentials start at once (only the running-max update, one FMNMX per
    # row, before them). The same instructions otherwise, no spill
    for on, parent in (("v17_causal", "v16_causal_deferred"), ("v17", "v16_full_deferred")):
        new, old = rows[on]["loops"][0], rows[parent]["loops"][0]
        for fam in ("HMMA", "LDSM", "MUFU.EX2", "FMNMX", "SHFL", "LDGSTS", "BAR"):
            assert new[fam] == old[fam], (on, fam)
        assert _before_first(old["sequence"], "FMNMX", "MUFU") >= 32, parent
        assert _before_first(new["sequence"], "FMNMX", "MUFU") <= 4, on
        assert rows[on]["spill_bytes"] == 0, on


def test_v18_copies_whole_blocks_without_a_predicate(rows):
    # v16's unmasked trip predicates each of its 16 (d64: 8) copied rows on the rows left before
    # hi (ISETP per row, the select of the copy's source size); v18's first loop copies whole
    # blocks with none: no ISETP at all in it, the same MMA, fragment loads, exponentials, copies
    # and barriers, and a shorter trip; its second loop is v16's masked trip. No spill
    pairs = (("v18_causal", "v16_causal_deferred"), ("v18", "v16_full_deferred"),
             ("v18_d64_causal", "v16_d64_causal_deferred"), ("v18_causal_apart", None))
    for on, parent in pairs:
        whole, masked = rows[on]["loops"]
        assert whole["ISETP"] == 0 and masked["ISETP"] > 0, on
        assert rows[on]["spill_bytes"] == 0, on
        if parent is None:
            continue
        unmasked, parent_masked = rows[parent]["loops"]
        for fam in ("HMMA", "LDSM", "MUFU.EX2", "FMNMX", "SHFL", "LDGSTS", "BAR"):
            assert whole[fam] == unmasked[fam] and masked[fam] == parent_masked[fam], (on, fam)
        assert unmasked["ISETP"] > 0, parent
        assert whole["length"] < unmasked["length"], (on, whole["length"], unmasked["length"])
    # census, sm_90a, d128 causal: 560 -> 538 instructions a trip (the select in
    # v18.whole_copy_trips keeps LLVM from hoisting the copies' offsets: 636 with a min)
    assert rows["v18_causal"]["loops"][0]["length"] <= rows["v16_causal_deferred"]["loops"][0]["length"] - 16


def test_v19_changes_which_tile_a_program_takes_and_nothing_else(rows):
    # the trips are v16's to the instruction: the same loops, in the same order; non-causal the
    # lever is off and the kernel is v16's; causal only the tile decode before the loops grows
    for v19_key, v16_key in (("v19_causal", "v16_causal_deferred"), ("v19", "v16_full_deferred")):
        a, b = rows[v16_key]["loops"], rows[v19_key]["loops"]
        assert [l["sequence"] for l in a] == [l["sequence"] for l in b], v19_key
        assert rows[v19_key]["regs"] == rows[v16_key]["regs"] and rows[v19_key]["spill_bytes"] == 0
    assert rows["v19"]["sass"]["total"] == rows["v16_full_deferred"]["sass"]["total"]
    assert 0 < rows["v19_causal"]["sass"]["total"] - rows["v16_causal_deferred"]["sass"]["total"] <= 12


def test_v19_wide_arm_halves_each_warps_copies_and_nothing_else(rows):
    # one 128-row CTA of 8 warps: each warp's MMAs, fragment loads and exponentials per trip are
    # the 4-warp CTA's (16 rows a warp either way); the block's copies are shared by twice the
    # threads, so each issues half of them; the ring and Q's tile need 128 KiB at d128 (one CTA an SM)
    for key in ("v19_wide_causal", "v19_wide_d64_causal"):
        assert rows[key]["regs"] <= 255 and rows[key]["spill_bytes"] == 0, key
    a, b = rows["v19_causal"]["loops"][0], rows["v19_wide_causal"]["loops"][0]
    for fam in ("HMMA", "LDSM", "MUFU.EX2", "BAR"):
        assert a[fam] == b[fam], fam
    assert b["LDGSTS"] * 2 == a["LDGSTS"]
    assert rows["v19_wide_causal"]["smem_bytes"] == v19.WIDE.smem_bytes(128) == 128 * 1024
    assert common.resident_ctas_per_sm(rows["v19_wide_causal"]["regs"], 8, rows["v19_wide_causal"]["smem_bytes"],
                                       (9, 0), 228 * 1024) == 1


def test_v20_trip_meets_one_barrier_and_keeps_v19s_work(rows):
    # the lever: each trip's copies leave Gluon's cp.async for inline PTX issued after the trip's
    # one barrier, so the shared-memory analysis adds no second one; the trip's tensor, shared-load,
    # copy and exponential work is v19's, no register spills
    pairs = (("v20_causal", "v19_causal"), ("v20", "v19"), ("v20_d64_causal", "v19_d64_causal"))
    for new, old in pairs:
        a, b = rows[old]["loops"], rows[new]["loops"]
        assert len(a) == len(b) == 2, new   # the unmasked and the masked trips
        for la, lb in zip(a, b):
            assert la["BAR"] == 2 and lb["BAR"] == 1, new
            for family in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "SHFL", "LDL", "STL"):
                assert la[family] == lb[family], (new, family)
            # the copies' addresses are formed by hand: a few integer instructions, not a new loop body
            assert lb["total"] - la["total"] <= 48, (new, la["total"], lb["total"])
        assert rows[new]["spill_bytes"] == 0 and rows[new]["regs"] <= 255, new
        assert rows[new]["smem_bytes"] == rows[old]["smem_bytes"], new
    # K and V laid out apart (an offset a chunk for each) is the one form that keeps a little in
    # local memory (48 B at sm_90a: 4 LDL a trip); the benchmarks' K and V share one row stride
    assert [l["BAR"] for l in rows["v20_causal_apart"]["loops"]] == [1, 1]
    assert rows["v20_causal_apart"]["spill_bytes"] <= 64


def test_v21_row_max_is_a_tree_of_the_same_instructions(rows):
    # the lever: the trip's row max folds a thread's 16 scores of a row as a tree, so its longest
    # dependent FMNMX chain (across the quad's two shuffles, the running max included) falls from
    # 17 to 6 — 64-key blocks at either head dim — with the same FMNMX, SHFL and everything else as
    # v20's trip
    for new, old, depth in (("v21_causal", "v20_causal", 6), ("v21", "v20", 6), ("v21_d64_causal", "v20_d64_causal", 6)):
        a, b = rows[old]["loops"], rows[new]["loops"]
        assert len(a) == len(b) == 2, new
        for la, lb in zip(a, b):
            assert lb["FMNMX_chain"] == depth < la["FMNMX_chain"], (new, la["FMNMX_chain"], lb["FMNMX_chain"])
            for family in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "SHFL", "FMNMX", "BAR", "LDL", "STL"):
                assert la[family] == lb[family], (new, family)
            assert abs(lb["total"] - la["total"]) <= 16, (new, la["total"], lb["total"])
        assert rows[new]["spill_bytes"] == 0 and rows[new]["regs"] <= 255, new


def test_key_loops_leave_out_a_spin_retry_that_spans_the_exit(rows):
    # v22's copy wait: ptxas parks the spin's retry after EXIT and branches back into the trip, a
    # span census.innermost_loops reports as a loop; the key loops (and the CLI's "loop instr")
    # are the two trips alone, and no other rung's are touched
    from flashrung.kernels.ladder.cli import loop_lengths

    spans = rows["v22_causal"]["loops"]
    assert len(spans) > 2 and all(loop["EXIT"] for loop in spans[2:])
    assert len(evidence.key_loops(rows["v22_causal"])) == 2
    assert loop_lengths(rows["v22_causal"]).count("/") == 1
    for key in ("v20_causal", "v19_causal", "v15_causal", "v7_all_keeps"):
        assert evidence.key_loops(rows[key]) == rows[key]["loops"], key
    assert evidence.key_loops({"loops": None}) == [] and loop_lengths({}) == "-"


def test_v22_trip_meets_no_barrier_and_keeps_v20s_work(rows):
    # the lever: no bar.sync in either trip — one mbarrier wait (its try_wait, and the spin's
    # branch) and one arrival of the trip's copies instead — with v20's tensor, shared-load, copy,
    # exponential, shuffle and max work, no register spills, and the copy barriers' 24 bytes beside
    # v20's shared memory (still two CTAs per SM)
    pairs = (("v22_causal", "v20_causal"), ("v22", "v20"), ("v22_d64_causal", "v20_d64_causal"))
    for new, old in pairs:
        a, b = evidence.key_loops(rows[old]), evidence.key_loops(rows[new])
        assert len(a) == len(b) == 2, new
        for la, lb in zip(a, b):
            assert la["BAR"] == 1 and lb["BAR"] == 0, new
            assert lb["SYNCS"] == 1 and lb["sequence"].split().count("ARRIVES") == 1, new
            for family in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "SHFL", "FMNMX", "LDL", "STL"):
                assert la[family] == lb[family], (new, family)
            # the wait's and the arrival's addresses and V(j+1)'s own row predicates (K's are
            # two blocks further): a few instructions, not a new trip
            assert lb["total"] - la["total"] <= 16, (new, la["total"], lb["total"])
        assert rows[new]["spill_bytes"] == 0 and rows[new]["regs"] <= 255, new
        assert rows[new]["smem_bytes"] == rows[old]["smem_bytes"] + 3 * 8 == v22.CONFIG.smem_bytes(
            rows[new]["config"]["head_dim"]), new
        assert common.resident_ctas_per_sm(rows[new]["regs"], 4, rows[new]["smem_bytes"], (9, 0), 228 * 1024) == 2, new
    # K and V laid out apart: v20 keeps 48 B in local memory there, v22 none
    assert [l["BAR"] for l in evidence.key_loops(rows["v22_causal_apart"])] == [0, 0]
    assert rows["v22_causal_apart"]["spill_bytes"] <= rows["v20_causal_apart"]["spill_bytes"]


def test_the_timed_binary_at_config_b_keeps_each_levers_census(rows):
    # the census compiles the rungs unspecialized; a launch at config B specializes strides,
    # lengths and heads (all divisible by 16), group = 1 and aligned pointers. That binary keeps
    # each lever as the census reads it — v22's trips without the barrier, v23's tree-shaped max,
    # v20's work in both — and its trips stay within 4% of the census's
    for r in ("v20", "v22", "v23"):
        launched, census = rows[f"{r}_at_b"], rows[f"{r}_causal"]
        assert launched["config"]["launch"] == "B" and launched["spill_bytes"] == 0
        a, b = evidence.key_loops(census), evidence.key_loops(launched)
        assert len(a) == len(b) == 2, r
        for la, lb in zip(a, b):
            for family in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "SHFL", "FMNMX", "BAR", "SYNCS", "LDL", "STL"):
                assert la[family] == lb[family], (r, family)
            assert abs(lb["total"] - la["total"]) <= 0.04 * la["total"], (r, la["total"], lb["total"])
    for v in ("v22", "v23"):
        assert [l["BAR"] for l in evidence.key_loops(rows[f"{v}_at_b"])] == [0, 0]
    assert [l["BAR"] for l in evidence.key_loops(rows["v20_at_b"])] == [1, 1]
    assert all(lb["FMNMX_chain"] < la["FMNMX_chain"] for la, lb in zip(evidence.key_loops(rows["v22_at_b"]),
                                                                        evidence.key_loops(rows["v23_at_b"])))


def test_v23_row_max_is_a_tree_of_v22s_instructions(rows):
    # v21's lever on v22's trip: the FMNMX chain 17 -> 6, the same work, still no barrier
    for new, old in (("v23_causal", "v22_causal"), ("v23", "v22"), ("v23_d64_causal", "v22_d64_causal")):
        a, b = evidence.key_loops(rows[old]), evidence.key_loops(rows[new])
        assert len(a) == len(b) == 2, new
        for la, lb in zip(a, b):
            # 6 deep, 7 on d64's masked trip (its mask's select joins the first level)
            assert lb["FMNMX_chain"] <= 7 < la["FMNMX_chain"], (new, la["FMNMX_chain"], lb["FMNMX_chain"])
            for family in ("HMMA", "LDSM", "LDGSTS", "MUFU.EX2", "SHFL", "FMNMX", "BAR", "SYNCS", "LDL", "STL"):
                assert la[family] == lb[family], (new, family)
            assert abs(lb["total"] - la["total"]) <= 16, (new, la["total"], lb["total"])
        assert rows[new]["spill_bytes"] == 0 and rows[new]["regs"] <= 255, new


def test_v22_refuses_devices_without_try_wait():
    base = dict(dtype=torch.bfloat16, head_dim=64, head_dim_v=64, heads_q=2, heads_kv=1, batch=1)
    ampere = _problem(capability=(8, 0), **base)
    hopper = _problem(capability=(9, 0), **base)
    for rung in (v22, v23):
        assert "sm_90 or newer (mbarrier.try_wait)" in rung.unsupported_reason(ampere)
        assert rung.unsupported_reason(hopper) is None
    assert all("sm_80" not in spec.arches for spec in v22.census_specs() + v23.census_specs())


def test_v22_takes_v20s_tile_and_no_overrides():
    h200 = types.SimpleNamespace(capability=(9, 0), head_dim=128)
    assert v22.config_with(h200, {}) == v22.CONFIG
    assert {k: getattr(v22.CONFIG, k) for k in dataclasses.asdict(v20.CONFIG)} == dataclasses.asdict(v20.CONFIG)
    assert v22.CONFIG.constexprs() == v20.CONFIG.constexprs()
    for rung in (v22, v23):
        with pytest.raises(ValueError, match=f"unknown {rung.NAME} config key 'kv_stages'"):
            rung.config_with(h200, {"kv_stages": "4"})


def _replay_copy_ring(trips, rng, k_ahead, v_ahead, warps=4, stages=3):
    """One random interleaving of v22's ring protocol across ``warps`` warps: each warp's reads of
    K and V slots, its copies (landing at random later times), its arrivals on the three copy
    barriers and its waits, a wait judged by the hardware's parity rule. Returns the hazards seen:
    a read of a slot that does not hold its block landed, a copy issued into a slot a warp has yet
    to read, a wait passed on a lapped phase, an arrival landing in another phase, a deadlock."""
    # the start: Q, block 0 and K(1) landed (waited and fenced); K(2) is copy issue 0
    content = {(t, s): None for t in "KV" for s in range(stages)}
    content[("K", 0)], content[("V", 0)], content[("K", 1)] = (0, warps), (0, warps), (1, warps)
    reads = {}                               # (tensor, block) -> the warps that have read it
    phase, arrived = [0] * stages, [0] * stages
    inflight, at_fence, hazards = [], set(), []

    def program():
        yield ("issue", 0, [("K", 2)])
        yield ("read", "K", 0)               # S(0), then first_scores' fence
        yield ("fence",)
        for j in range(trips):
            yield ("read", "K", j + 1)       # QK(j+1), then softmax(j)
            yield ("wait", j)
            yield ("issue", j + 1, [("K", j + k_ahead), ("V", j + v_ahead)])
            yield ("read", "V", j)           # PV(j)
        yield ("wait", trips)
        yield ("read", "V", trips)           # the last PV

    def land():
        n, copies = inflight.pop(rng.randrange(len(inflight)))
        slot = n % stages
        if phase[slot] != n // stages:
            hazards.append(f"an arrival of copy issue {n} landed in phase {phase[slot]} of barrier {slot}")
        for tensor, block in copies:
            held, landed = content[(tensor, block % stages)]
            if held == block:
                content[(tensor, block % stages)] = (block, landed + 1)
        arrived[slot] += 1
        if arrived[slot] == warps:
            arrived[slot], phase[slot] = 0, phase[slot] + 1

    def passes(n):
        slot, use = n % stages, n // stages
        parity_passes = phase[slot] % 2 != use % 2     # try_wait.parity on the barrier's phase
        if parity_passes and phase[slot] < use:
            hazards.append(f"wait {n} passed on a lapped phase of barrier {slot}")
        return parity_passes

    def step(w, op):
        if op[0] == "read":
            _, tensor, block = op
            if content[(tensor, block % stages)] != (block, warps):
                hazards.append(f"warp {w} read {tensor}({block}): the slot holds {content[(tensor, block % stages)]}")
            reads.setdefault((tensor, block), set()).add(w)
        elif op[0] == "issue":
            _, n, copies = op
            for tensor, block in copies:
                old = content[(tensor, block % stages)]
                if old is not None and old[0] != block:
                    if len(reads.get((tensor, old[0]), ())) < warps:
                        hazards.append(f"warp {w} refilled {tensor}({old[0]})'s slot with {tensor}({block}) "
                                       f"before every warp read it")
                    content[(tensor, block % stages)] = (block, 0)
                elif old is None:
                    content[(tensor, block % stages)] = (block, 0)
            inflight.append((n, copies))
        elif op[0] == "wait":
            return passes(op[1])
        elif op[0] == "fence":
            at_fence.add(w)
            return len(at_fence) == warps
        return True

    progs = [program() for _ in range(warps)]
    pending = [next(p) for p in progs]
    while any(op is not None for op in pending) and not hazards:
        if inflight and rng.random() < 0.5:
            land()
            continue
        order = [w for w in range(warps) if pending[w] is not None]
        rng.shuffle(order)
        moved = next((w for w in order if step(w, pending[w])), None)
        if moved is not None:
            pending[moved] = next(progs[moved], None)
        elif inflight:
            land()
        else:
            hazards.append("deadlock")
    return hazards


def test_v22_copy_protocol_is_safe_under_any_warp_order():
    """The ring's schedule as the kernel runs it (v22.K_REFILL_AHEAD, V_REFILL_AHEAD, three slots,
    three barriers numbered by copy issue), replayed over random interleavings of four warps and
    random copy latencies: no read of an unlanded or wrong block, no refill of a slot a warp has yet
    to read, no wait passed on a lapped phase, no deadlock. One block further ahead for K or for V
    must be caught: that is the replay's own check."""
    import random

    k_ahead, v_ahead = v22.K_REFILL_AHEAD.value, v22.V_REFILL_AHEAD.value
    rng = random.Random(0)
    for trial in range(300):
        hazards = _replay_copy_ring(rng.randrange(1, 9), rng, k_ahead, v_ahead)
        assert not hazards, (trial, hazards[:3])
    for bad in ((k_ahead + 1, v_ahead), (k_ahead, v_ahead + 1)):
        rng = random.Random(1)
        assert any(_replay_copy_ring(8, rng, *bad) for _ in range(300)), bad


def test_dependent_chain_follows_registers_not_issue_order():
    from flashrung.evidence.census import dependent_chain

    chain = ["FMNMX R1, R2, R3, !PT", "FADD R9, R9, R9", "FMNMX R1, R1, R4, !PT", "FMNMX R1, R1, R5, !PT"]
    tree = ["FMNMX R1, R2, R3, !PT", "FMNMX R6, R4, R5, !PT", "FMNMX R1, R1, R6, !PT"]
    # a register written by another family ends the chain through it
    cut = ["FMNMX R1, R2, R3, !PT", "FADD R1, R1, R2", "FMNMX R1, R1, R4, !PT"]
    predicated = ["@P0 FMNMX R1, R2, R3, !PT", "@!P1 FMNMX R7, R1, R3, !PT"]
    assert [dependent_chain(x, "FMNMX") for x in (chain, tree, cut, predicated)] == [3, 2, 1, 2]
    # a store's first operand is its address: it writes no register
    assert dependent_chain(["FMNMX R1, R2, R3, !PT", "STS [R1], R4", "FMNMX R5, R1, R1, !PT"], "FMNMX") == 2


def test_v20_ring_offsets_compile_twice_and_refuse_a_moved_ring(monkeypatch):
    # the inline copies name the rings by byte offset: the second compile must allocate them where
    # the first did, or building fails naming the ring, never a kernel that writes elsewhere
    from flashrung.kernels.hopper import pipeline

    layouts = iter([dict(q_smem=49152, k_smem=0, v_smem=24576), dict(q_smem=49152, k_smem=0, v_smem=24576),
                    dict(q_smem=0, k_smem=8192, v_smem=32768), dict(q_smem=0, k_smem=8192, v_smem=40960)])
    monkeypatch.setattr(pipeline, "allocation_offsets", lambda ttgir: next(layouts))
    seen = []

    class _Compiled:
        asm = {"ttgir": ""}

    def compile_with(constexprs, ttgir_only=False):
        seen.append((constexprs["K_RING_AT"], constexprs["V_RING_AT"]))
        return "" if ttgir_only else _Compiled()

    asked = dict(HEAD_DIM=64, K_RING_AT=0, V_RING_AT=0)
    assert v20.ring_offsets(compile_with, asked) == dict(HEAD_DIM=64, K_RING_AT=0, V_RING_AT=24576)
    with pytest.raises(RuntimeError, match="ladder.v20: .*v_smem"):
        v20.ring_offsets(compile_with, asked)
    assert seen == [(0, 0), (0, 24576), (0, 0), (8192, 32768)]


_RING_OFFSETS_PROBE = """
import dataclasses, json, sys
from flashrung.evidence import census
from flashrung.kernels.hopper.pipeline import allocation_offsets
from flashrung.kernels.ladder import rung

mod = rung(sys.argv[1]).load()
out = []
for spec in mod.census_specs():
    named = {}

    def resolve(compile_with, constexprs):
        named.update(mod.ring_offsets(compile_with, constexprs))
        return named

    compiled = census.compile_spec(dataclasses.replace(spec, resolve=resolve), "sm_90a")
    arrays = allocation_offsets(compiled.asm["ttgir"])
    out.append(dict(config=spec.config, named={k: named[k] for k in mod.RING_OFFSETS},
                    arrays={k: arrays[a] for k, a in mod.RING_OFFSETS.items()}))
print(json.dumps(out))
"""


@pytest.mark.parametrize("module", [v20, v22], ids=lambda m: m.NAME)
def test_inline_ring_offsets_are_the_allocation_pass_offsets(module):
    # compiled for sm_90a (in a process without the interpreter): the offsets every build's inline
    # PTX names (v20's copies; v22's copies and copy barriers) are the final compile's arrays, K's
    # and V's rings a ring apart, the barriers outside both
    import json
    import subprocess
    import sys

    from flashrung.evidence.census import interpreter_free_env

    done = subprocess.run([sys.executable, "-c", _RING_OFFSETS_PROBE, module.NAME], capture_output=True, text=True,
                          env=interpreter_free_env(), timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    builds = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(builds) == len(module.census_specs())
    for b in builds:
        assert b["named"] == b["arrays"], b
        ring_bytes = v14.CONFIG.kv_stages * v14.CONFIG.block_n * b["config"]["head_dim"] * 2
        k_at, v_at = b["arrays"]["K_RING_AT"], b["arrays"]["V_RING_AT"]
        assert abs(v_at - k_at) >= ring_bytes, b
        bars_at = b["arrays"].get("COPY_BARS_AT")
        if bars_at is not None:
            assert all(not (at <= bars_at < at + ring_bytes) for at in (k_at, v_at)), b


def test_v19_config_overrides():
    h200 = types.SimpleNamespace(capability=(9, 0), head_dim=128)
    assert v19.config_with(h200, {"num_warps": "8"}) == v19.WIDE
    assert v19.WIDE.block_m == 128 and v19.WIDE.block_n == v19.CONFIG.block_n
    assert v19.config_with(h200, {}) == v19.CONFIG
    with pytest.raises(ValueError, match="ladder.v19@num_warps=6: expected one of 4, 8"):
        v19.config_with(h200, {"num_warps": "6"})
    with pytest.raises(ValueError, match="unknown ladder.v19 config key 'block_m'"):
        v19.config_with(h200, {"block_m": "128"})
    with pytest.raises(ValueError, match=r"ladder.v19@num_warps=8: needs 128 KiB of shared memory"):
        v19.config_with(types.SimpleNamespace(capability=(12, 0), head_dim=128), {"num_warps": "8"})


def test_v16_config_overrides():
    assert v16.config_with(None, {"row_sum": "mma"}).row_sum == "mma"
    with pytest.raises(ValueError, match="row_sum must be one of auto, mma, deferred, got 'rows'"):
        v16.config_with(None, {"row_sum": "rows"})
    with pytest.raises(ValueError, match="unknown ladder.v16 config key 'qk_ahead'"):
        v16.config_with(None, {"qk_ahead": "false"})


def test_v15_refuses_the_lever_off_config():
    with pytest.raises(ValueError, match="qk_ahead must be True"):
        v15.forward(None, None, None, False, 1.0, config=v14.OFF)


def test_v8_two_slabs_load_fewer_fragments_per_mma(rows):
    """Two m16 slabs per warp (128x32, 4 warps): per loop body each thread makes
    128*32/128 + 2*2 = 36 exponential calls (its scores and the alpha of its 4 rows); the tile
    issues 128 HMMA (QK^T (32/8)*(128/16)*2 slabs + PV (128/8)*(32/16)*2) against 48 LDSM (Q 16, K 16,
    V 16 per warp, all in the loop) where v4 issues 72 per 128 HMMA: 0.375 against
    0.56 fragment loads per MMA. Causal (config B) fits 255 registers with no spill; non-causal
    spills 160 B (ptxas; recorded in docs/ladder.md)."""
    v8_causal, v8_full, v4 = rows["v8_causal"], rows["v8"], rows["v4_causal"]
    for row in (v8_causal, v8_full):
        assert row["sass"]["MUFU.EX2"] == evidence.exp_calls_per_body(128, 32, 4) == 36
        assert row["sass"]["HMMA"] == v4["sass"]["HMMA"] == 128
    assert v8_causal["sass"]["LDSM"] == 48 and v4["sass"]["LDSM"] == 72
    assert v8_causal["spill_bytes"] == 0
    assert v8_full["spill_bytes"] <= 160
    assert v8_causal["smem_bytes"] == (128 + 2 * 32) * 128 * 2       # Q 128 rows, K and V 32


def test_v7_switches_registers_and_spills(rows):
    body = evidence.exp_calls_per_body(64, 32, 4)              # 18 per copy of the block body
    all_keeps = rows["v7_all_keeps"]
    assert all_keeps["sass"]["MUFU.EX2"] == 2 * body            # interior and masked copies
    assert all_keeps["sass"]["HMMA"] == 2 * 128 // 2            # two bodies of D/2 at BLOCK_N=32
    assert evidence.opcode_count(all_keeps, "VOTE") == 2        # one warp vote per body copy
    assert all_keeps["smem_bytes"] == (64 + 2 * 32) * 128 * 2
    assert evidence.opcode_count(rows["v7_no_rescale_skip"], "VOTE") == 0
    assert rows["v7_no_mask_specialize"]["sass"]["MUFU.EX2"] == body   # one body left
    assert rows["v7_no_causal_split"]["sass"]["MUFU.EX2"] == 2 * body  # two bodies, one loop
    assert rows["v7_tile_64x64"]["sass"]["MUFU.EX2"] == 2 * evidence.exp_calls_per_body(64, 64, 4)
    for name in ("all_keeps", *v7.SWITCH_OFF):
        row = rows[f"v7_{name}"]
        assert row["regs"] <= 255 and row["spill_bytes"] == 0 and evidence.spill_instructions(row) == 0, name
    capped = rows["v7_max_registers_168"]
    assert capped["regs"] <= 168   # 3 CTAs of 128 threads fit 65,536 registers...
    assert capped["spill_bytes"] > 0 and evidence.spill_instructions(capped) > 0   # ...for spills


def test_every_rung_fits_the_sm120_shared_memory_card(rows):
    for r in ladder.RUNGS:
        row = rows[f"{r.name}_sm120"]
        if r.name in ("ladder.v14", "ladder.v15", "ladder.v16", "ladder.v17", "ladder.v18", "ladder.v19",
                      "ladder.v20", "ladder.v21", "ladder.v22",
                      "ladder.v23"):   # the three-slot ring: over the card at d128, refused there
            assert row["smem_bytes"] == r.load().CONFIG.smem_bytes(128) >= 112 * 1024 > SM120_SMEM_LIMIT
            continue
        assert 0 < row["smem_bytes"] <= SM120_SMEM_LIMIT, r.name
    assert rows["v3_kv2_sm120"]["smem_bytes"] == (64 + 2 * 2 * 64) * 128 * 2 <= SM120_SMEM_LIMIT
    assert rows["ladder.v1_sm120"]["sass"]["HMMA"] > 0
    assert rows["ladder.v0_sm120"]["sass"]["HMMA"] == 0


def test_v14_is_refused_where_its_ring_does_not_fit():
    from flashrung.dispatch import Problem

    def problem(d, cap):
        return Problem(batch=1, seqlen_q=128, seqlen_k=128, heads_q=2, heads_kv=2, head_dim=d, head_dim_v=d,
                       dtype=torch.bfloat16, causal=True, device_type="cuda", capability=cap)

    assert common.shared_memory_reason(problem(128, (9, 0)), v14.CONFIG.smem_bytes(128)) is None
    assert v14.unsupported_reason(problem(128, (9, 0))) is None
    assert v14.config_with(problem(128, (9, 0)), {"qk_ahead": "false"}) == v14.OFF
    with pytest.raises(ValueError, match="unknown ladder.v14 config key 'block_n'"):
        v14.config_with(problem(128, (9, 0)), {"block_n": "32"})
    with pytest.raises(ValueError, match="kv_stages=6: needs 208 KiB"):
        v14.config_with(problem(128, (12, 0)), {"kv_stages": "6"})
    assert v14.unsupported_reason(problem(64, (12, 0))) is None          # 56 KiB fits 99 KiB
    reason = v14.unsupported_reason(problem(128, (12, 0)))
    assert "112 KiB of shared memory" in reason and "allows 99 KiB" in reason


def test_bf16_compiles_to_the_same_tensor_core_path(rows):
    a, b = rows["v7_all_keeps"]["sass"], rows["v7_bf16"]["sass"]
    assert b["HMMA"] == a["HMMA"] and b["MUFU.EX2"] == a["MUFU.EX2"]
    assert any(op.startswith("HMMA") and "BF16" in op for op in b["opcodes"])


# ------------------------------------------------------------------------------------------
# GPU: every rung through the gate (skipped without a GPU)
# ------------------------------------------------------------------------------------------

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal) and why each is here.
GATE_SHAPES = [
    (1, 17, 17, 2, 2, 64, torch.float16, False),      # odd length: masked query and key tails
    (1, 17, 17, 2, 2, 128, torch.bfloat16, True),     # causal inside one tile, bf16
    (2, 1000, 1000, 4, 4, 128, torch.float16, True),  # many blocks, causal diagonal mid-block
    (1, 1000, 1000, 8, 2, 64, torch.bfloat16, False),  # GQA 4:1, tail block
    (1, 300, 77, 4, 1, 128, torch.float16, True),     # Sq > Sk bottom-right: fully masked rows
    (1, 77, 300, 4, 2, 64, torch.float16, True),      # Sq < Sk bottom-right
]


def _shape_id(s):
    return f"B{s[0]}-Sq{s[1]}-Sk{s[2]}-H{s[3]}/{s[4]}-d{s[5]}-{str(s[6])[6:]}{'-causal' if s[7] else ''}"


def _assert_gate(fwd, shape, kernel):
    """``fwd`` passes the gate at ``shape`` (a GATE_SHAPES tuple) on the GPU."""
    from flashrung.gate import check_forward

    b, sq, sk, hq, hkv, d, dtype, causal = shape
    res = check_forward(fwd, batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=d,
                        dtype=dtype, causal=causal, device="cuda", kernel=kernel)
    assert res.passed, str(res)


def _gate_cases():
    """Every rung at every gate shape; the measured arms at the two shapes that stress them
    (many causal blocks, fully masked rows)."""
    cases = [(r.name, r.load().forward, shape) for r in ladder.RUNGS for shape in GATE_SHAPES]
    arms = [("ladder.v3[kv_stages=2]", v3.forward_double_buffer)]
    arms += [(f"ladder.v7[{name}]", functools.partial(v7.forward, config=cfg))
             for name, cfg in (*v7.SWITCH_OFF.items(), ("max_registers_168", v7.THREE_CTAS_PER_SM))]
    arms += [("ladder.v14[qk_ahead=false]", functools.partial(v14.forward, config=v14.OFF))]
    arms += [("ladder.v5@persistent=true", functools.partial(v5.forward, config=v5.PERSISTENT))]
    cases += [(name, fwd, shape) for name, fwd in arms for shape in GATE_SHAPES[2:5:2]]
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("name,fwd,shape", _gate_cases(), ids=[f"{n}-{_shape_id(s)}" for n, _, s in _gate_cases()])
def test_rung_passes_the_gate(name, fwd, shape):
    _assert_gate(fwd, shape, name)


# v9's order at key lengths where the batch*heads split into several L2 sections (48 MiB of K/V):
# 16 MiB per head at Sk = 32768 d128 (3 heads per section, 8 heads), and GQA 4:1 at Sk = 65536
# (one 32 MiB K/V head, so 4 q-heads per section); short query sides keep the oracle cheap
V9_SECTION_SHAPES = [
    (1, 300, 32768, 8, 8, 128, torch.bfloat16, True),
    (1, 129, 65536, 8, 2, 128, torch.float16, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V9_SECTION_SHAPES, ids=_shape_id)
def test_v10_passes_the_gate_across_l2_sections(shape):
    # the staggered sweep starts long causal tiles mid-row: blocks right of a row's diagonal may
    # come first, so rows see only masked keys before their first live one
    _assert_gate(v10.forward, shape, "ladder.v10")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V9_SECTION_SHAPES, ids=_shape_id)
def test_v9_passes_the_gate_across_l2_sections(shape):
    from flashrung.kernels.hopper.schedule import head_section

    b, sq, sk, hq, hkv, d = shape[:6]
    assert head_section(sk, hq, hkv, d, 2) < b * hq            # more than one section
    _assert_gate(v9.forward, shape, "ladder.v9")


# v14 peels the last key block out of its loop and computes the first block's scores before it:
# the trip counts where that peel and the three-slot ring meet their edges
V14_EDGE_SHAPES = [
    (1, 1, 1, 2, 2, 128, torch.bfloat16, False),      # one key: the loop never runs
    (1, 64, 64, 2, 2, 64, torch.float16, False),      # exactly one block, no tail
    (1, 65, 129, 2, 1, 128, torch.bfloat16, False),   # three blocks, the last one key long
    (1, 192, 192, 2, 2, 64, torch.bfloat16, True),    # three causal blocks: every slot used once
    (2, 1, 4097, 4, 2, 128, torch.float16, False),    # one query row over 65 blocks: the ring wraps
    (1, 4097, 4097, 2, 2, 128, torch.bfloat16, True), # long causal, tails on both sides
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V14_EDGE_SHAPES, ids=_shape_id)
def test_v14_passes_the_gate_at_the_edges_of_its_peeled_loop(shape):
    _assert_gate(v14.forward, shape, "ladder.v14")


# v15 splits v14's trips where the mask begins: tiles with no interior block (the split at 0),
# tiles whose last trip is the first masked one, Sq > Sk and Sq < Sk (the diagonal moves), and the
# key tail inside an otherwise interior non-causal sweep
V15_SPLIT_SHAPES = V14_EDGE_SHAPES + [
    (1, 64, 1000, 2, 2, 128, torch.bfloat16, True),     # Sq < Sk: every tile mostly interior
    (1, 1000, 64, 2, 2, 128, torch.bfloat16, True),     # Sq > Sk: rows that see no key
    (2, 300, 4097, 4, 1, 64, torch.float16, False),     # one key past the last full block
    (1, 129, 129, 2, 2, 128, torch.bfloat16, True),     # diagonal inside the second block
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V15_SPLIT_SHAPES, ids=_shape_id)
def test_v15_passes_the_gate_at_its_loop_split(shape):
    _assert_gate(v15.forward, shape, "ladder.v15")


# both row-sum forms at v15's split shapes (the default picks one per head dim and mask); a row
# that sees no key must keep l = 0 in either form (out 0, LSE -inf)
@pytest.mark.gpu
@pytest.mark.parametrize("row_sum", ["mma", "deferred"])
@pytest.mark.parametrize("shape", V15_SPLIT_SHAPES, ids=_shape_id)
def test_v16_passes_the_gate_in_both_row_sum_forms(shape, row_sum):
    fwd = functools.partial(v16.forward, config=v16.config_with(None, {"row_sum": row_sum}))
    _assert_gate(fwd, shape, f"ladder.v16@row_sum={row_sum}")


def _with_v_apart(forward):
    """``forward`` called with V as the first half of a tensor twice as wide: a view with twice K's
    row stride, so K and V no longer share one."""
    def apart(q, k, v, causal, softmax_scale):
        v_view = torch.cat([v, torch.zeros_like(v)], dim=-1)[..., : v.shape[-1]]
        assert v_view.stride(1) != k.stride(1)
        return forward(q, k, v_view, causal, softmax_scale)
    return apart


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_v14_passes_the_gate_with_k_and_v_laid_out_apart(causal):
    # K and V with different row strides take the per-row copy form (`v14.COPY_ROWS`)
    _assert_gate(_with_v_apart(v14.forward), (2, 300, 1000, 4, 2, 128, torch.bfloat16, causal), "ladder.v14")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V15_SPLIT_SHAPES, ids=_shape_id)
def test_v17_passes_the_gate_at_its_loop_split(shape):
    _assert_gate(v17.forward, shape, "ladder.v17")


# v18's loop bound where the copies stop being whole: tiles whose prefetches never are (fewer than
# three blocks), whose last interior trip already copies past hi (non-causal with a key tail, Sq
# < Sk), and tiles where the bound and v15's split coincide
V18_COPY_SHAPES = V15_SPLIT_SHAPES + [
    (1, 64, 191, 2, 2, 128, torch.bfloat16, False),     # 2 blocks + 63 keys: the third copy partial
    (1, 64, 192, 2, 2, 64, torch.float16, False),       # exactly three blocks: one whole copy
    (1, 200, 1000, 2, 1, 128, torch.bfloat16, True),    # Sq < Sk causal: long interior, partial tail
    (2, 3000, 3000, 4, 4, 128, torch.bfloat16, False),  # 47 blocks, the last 56 keys long
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V18_COPY_SHAPES, ids=_shape_id)
def test_v18_passes_the_gate_where_its_copies_stop_being_whole(shape):
    _assert_gate(v18.forward, shape, "ladder.v18")


# the persistent arm with more work items than programs (264 on an H200 at d128): every program
# walks several items, causal ones of unequal cost, and items with no key (Sq > Sk)
V5_PERSISTENT_SHAPES = [
    (2, 4097, 4097, 8, 2, 128, torch.bfloat16, True),   # 65 x 16 = 1,040 items, LPT order
    (3, 1000, 1000, 16, 16, 64, torch.float16, False),  # 16 x 48 = 768 items, the seed's order
    (1, 4000, 300, 32, 8, 128, torch.float16, True),    # 63 x 32 = 2,016 items, most with no key
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V5_PERSISTENT_SHAPES, ids=_shape_id)
def test_v5_persistent_arm_passes_the_gate_with_many_items_per_program(shape):
    b, sq, _, hq = shape[:4]
    assert common.cdiv(sq, 64) * b * hq > 2 * torch.cuda.get_device_properties(0).multi_processor_count
    _assert_gate(functools.partial(v5.forward, config=v5.PERSISTENT), shape, "ladder.v5@persistent=true")


@pytest.mark.gpu
def test_v5_persistent_arm_matches_the_plain_grid_bit_for_bit():
    """Each work item is the plain grid's tile with the same instructions per block, so any bit
    that differs is an item that read another item's shared tiles (the barrier between items)."""
    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(2, 3000, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    for causal in (False, True):
        a = v5.forward(q, k, v, causal, 0.088)
        b = v5.forward(q, k, v, causal, 0.088, config=v5.PERSISTENT)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# v19 reverses the last batch*head row's tiles: several rows (GQA, batch > 1), one row (the whole
# grid reversed), Sq != Sk, and tails
V19_ORDER_SHAPES = [
    (2, 1000, 1000, 4, 2, 128, torch.bfloat16, True),   # 8 rows, the last one reversed
    (1, 4097, 4097, 1, 1, 64, torch.float16, True),     # one row: every tile heaviest first
    (3, 300, 1000, 2, 1, 128, torch.float16, True),     # Sq < Sk
    (1, 1000, 300, 3, 3, 64, torch.bfloat16, True),     # Sq > Sk: rows that see no key
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V19_ORDER_SHAPES, ids=_shape_id)
def test_v19_passes_the_gate_in_its_order(shape):
    _assert_gate(v19.forward, shape, "ladder.v19")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V19_ORDER_SHAPES, ids=_shape_id)
def test_v19_wide_arm_passes_the_gate(shape):
    _assert_gate(functools.partial(v19.forward, config=v19.WIDE), shape, "ladder.v19@num_warps=8")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V15_SPLIT_SHAPES + V19_ORDER_SHAPES, ids=_shape_id)
def test_v20_passes_the_gate_at_its_loop_split_and_order(shape):
    # the hand-swizzled copies at every edge of v14's peeled loop and v15's split (one key, one
    # block, the ring wrapping, Sq != Sk, tails) and in v19's order
    _assert_gate(v20.forward, shape, "ladder.v20")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_v20_passes_the_gate_with_k_and_v_laid_out_apart(causal):
    # K and V of different row strides: each forms its own copy offsets
    _assert_gate(_with_v_apart(v20.forward), (2, 300, 1000, 4, 2, 128, torch.bfloat16, causal), "ladder.v20")


def _assert_bit_equal(parent, rung, head_dim, seed):
    """``rung`` and ``parent`` give the same out and LSE, bit for bit, at B2 S3000 H4, both masks."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(2, 3000, 4, head_dim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    for causal in (False, True):
        a = parent(q, k, v, causal, 0.088)
        b = rung(q, k, v, causal, 0.088)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), causal


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_v20_matches_v19_bit_for_bit(head_dim):
    """v20 moves the copies and a barrier, not the arithmetic: the same HMMA and exponentials in
    the same order, so every bit matches v19. A chunk copied to the wrong swizzled place, or a slot
    overwritten while read, changes bits."""
    _assert_bit_equal(v19.forward, v20.forward, head_dim, seed=4)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V15_SPLIT_SHAPES + V19_ORDER_SHAPES, ids=_shape_id)
def test_v21_passes_the_gate_at_its_loop_split_and_order(shape):
    _assert_gate(v21.forward, shape, "ladder.v21")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_v21_matches_v20_bit_for_bit(head_dim):
    """A maximum is exact in any order, so the tree's row max is the chain's, bit for bit, and so is
    everything computed from it: a bit that differs is a score left out of (or counted twice in)
    the tree."""
    _assert_bit_equal(v20.forward, v21.forward, head_dim, seed=5)


@pytest.mark.gpu
def test_v19_matches_v16_bit_for_bit():
    """Each tile is v16's tile with v16's instructions; only which program computes it changes, so
    a bit that differs is a tile computed twice or not at all."""
    _assert_bit_equal(v16.forward, v19.forward, 128, seed=3)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V15_SPLIT_SHAPES + V19_ORDER_SHAPES, ids=_shape_id)
def test_v22_passes_the_gate_at_its_loop_split_and_order(shape):
    # the copy barriers' phases at every edge of the trip count: no trip (one block), one, the ring
    # wrapping, v15's split, v19's order, Sq != Sk, tails
    _assert_gate(v22.forward, shape, "ladder.v22")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_v22_passes_the_gate_with_k_and_v_laid_out_apart(causal):
    _assert_gate(_with_v_apart(v22.forward), (2, 300, 1000, 4, 2, 128, torch.bfloat16, causal), "ladder.v22")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_v22_matches_v20_bit_for_bit(head_dim):
    """v22 replaces the trip's barrier with an mbarrier wait and moves the copies to the middle of
    the trip; the arithmetic is v20's, so every bit matches. A slot read before its copy landed, or
    refilled while a slower warp still reads it, changes bits."""
    _assert_bit_equal(v20.forward, v22.forward, head_dim, seed=6)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", V15_SPLIT_SHAPES + V19_ORDER_SHAPES, ids=_shape_id)
def test_v23_passes_the_gate_at_its_loop_split_and_order(shape):
    _assert_gate(v23.forward, shape, "ladder.v23")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_v23_matches_v22_bit_for_bit(head_dim):
    """v21's tree on v22's trip: the same maximum, so the same bits."""
    _assert_bit_equal(v22.forward, v23.forward, head_dim, seed=7)


# every rung on the three-slot ring, and v19's 8-warp arm (eight warps share each slot)
THREE_SLOT_FORWARDS = [(m.NAME, m.forward) for m in (v14, v15, v16, v17, v18, v19, v20, v21, v22, v23)]
THREE_SLOT_FORWARDS += [("ladder.v19@num_warps=8", functools.partial(v19.forward, config=v19.WIDE))]


@pytest.mark.gpu
@pytest.mark.parametrize("name,forward", THREE_SLOT_FORWARDS, ids=[n for n, _ in THREE_SLOT_FORWARDS])
def test_three_slot_ring_rungs_are_deterministic(name, forward):
    """The ring's slots are reused every three blocks: a slot read before its copy landed (by the
    slowest warp that reads it), or overwritten while read, shows as a result that moves between
    identical calls."""
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 3000, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    for causal in (False, True):
        a = forward(q, k, v, causal, 0.088)
        for _ in range(3):
            b = forward(q, k, v, causal, 0.088)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), name


@pytest.mark.gpu
def test_rescale_skip_is_bitwise_identical():
    """Keep 2 skips only exact identities, so switching it changes no bit of out or lse."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 1000, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    off = dataclasses.replace(v7.CONFIG, rescale_skip=False)
    for causal in (False, True):
        a = v7.forward(q, k, v, causal, 0.088)
        b = v7.forward(q, k, v, causal, 0.088, off)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.gpu
def test_rungs_run_through_the_public_api():
    import flashrung

    q = torch.randn(1, 130, 2, 64, device="cuda", dtype=torch.float16)
    ref = flashrung.attention(q, q, q, causal=True, impl="ladder.v0")
    for r in ladder.RUNGS[1:]:
        out = flashrung.attention(q, q, q, causal=True, impl=r.name)
        assert flashrung.last_dispatch("fwd").kernel == r.name
        assert (out.float() - ref.float()).abs().max().item() < 2e-2, r.name
