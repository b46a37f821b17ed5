"""The sanitizer probes have the dispatch and barrier structure of hopper.fwd (CPU, sm_90a SASS).

The racecheck hazards on hopper.fwd sit on Triton's warp-specialization dispatch bytes; the
``hopper-shaped`` probe reproduces them only if it has the same dispatch (a CTA-wide barrier 1)
and the same partition-local named barriers, which is what these tests pin down.
"""
import json
import re
import subprocess
import sys

import pytest

_SCRIPT = r"""
import json, os, re, tempfile, torch
from flashrung.evidence.census import compile_spec, sass_text
from flashrung.evidence import ws_probe
from flashrung.kernels.hopper import fwd

def barriers(spec):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(compile_spec(spec, "sm_90a").asm["cubin"])
        sass = sass_text(path)
    ids = sorted(set(re.findall(r"BAR\.SYNC\.DEFER_BLOCKING (0x[0-9a-f]+(?:, 0x[0-9a-f]+)?)", sass)))
    return dict(ids=ids, lds_u8=len(re.findall(r"LDS\.U8", sass)), setmaxnreg=len(re.findall(r"USETMAXREG", sass)))

out = {spec.kernel: barriers(spec) for spec in ws_probe.census_specs()}
# d64 non-causal's unpaired staggered kernel, the S3072 default before change 50 field for field (its
# default pairs CTAs from 2k, with a 4-warp producer), its pingpong turn on mbarriers (the frozen
# step's passes it on named barriers since change 62)
unpaired = fwd.replace_following(fwd.default_config(64, False, 3072), 64, kv_multicast=False, asm_arrivals=False,
                                 stagger_kv=True, stagger_subtract=True, named_turns=False)
out["hopper.fwd"] = barriers(fwd.census_spec(unpaired, 64, False, torch.bfloat16))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def structure():
    from flashrung.evidence.census import interpreter_free_env

    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         env=interpreter_free_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_probe_has_the_dispatch(structure):
    # workers read their partition id from shared memory after the CTA-wide barrier 1
    for name in ("ws_probe.minimal", "ws_probe.hopper-shaped", "hopper.fwd"):
        assert "0x1" in structure[name]["ids"], name
        assert structure[name]["lds_u8"] >= 1 and structure[name]["setmaxnreg"] > 0, name


def test_hopper_shaped_probe_has_hopper_fwd_barriers(structure):
    # the same named barriers (the default partition's 0, the 4-warp workers' 2 and 3, 128
    # threads each) as hopper.fwd at d64; the minimal probe has none besides the dispatch
    assert structure["ws_probe.hopper-shaped"]["ids"] == structure["hopper.fwd"]["ids"]
    assert structure["ws_probe.minimal"]["ids"] == ["0x1"]
    assert any(re.fullmatch(r"0x[0-9a-f]+, 0x80", i) for i in structure["hopper.fwd"]["ids"])


def test_probe_cli_rejects_unknown_probe():
    from flashrung.evidence import ws_probe

    with pytest.raises(SystemExit):
        ws_probe.main(["nonsense"])


def test_schedules_probe_reaches_every_synchronisation_mechanism():
    # the sanitizer probe of the defaults' schedules claims to cover every mechanism the defaults
    # synchronise with; a default that moves off one of them must not silently leave it unchecked
    from flashrung.evidence import ws_probe
    from flashrung.kernels.hopper import fwd

    schedules = ws_probe.default_schedules()
    configs = [ws_probe.schedule_config(schedule) for schedule in schedules]
    assert len(set(zip((s[:2] for s in schedules), configs))) == len(configs), "two schedules force one configuration"
    for switch in ("named_turns", "asm_arrivals", "split_tail", "gate_pv_wait", "balanced", "stagger_kv",
                   "rescale_by_warp", "wait_pv_early", "kv_multicast", "producer_unsynced", "single_kv_loop",
                   "freeze_row_max"):
        assert any(getattr(cfg, switch) for cfg in configs), switch
        assert not all(getattr(cfg, switch) for cfg in configs), switch
    assert {cfg.num_q_stages for cfg in configs} == {1, 2}
    assert {cfg.block_m for cfg in configs} == {128, 192}
    assert {d for d, *_ in schedules} == {64, 128, 256}
    # split tail in both of d128's named orders: FA3's (4k) and FA4's with PV's gated wait (16k)
    split = [cfg for cfg in configs if cfg.split_tail]
    assert {cfg.wait_pv_early for cfg in split} == {False, True}
    # the target row's own schedule (d128 non-causal S16k, the frozen step) is probed as it runs
    target = fwd.default_config(128, False, 16384)
    assert target.freeze_row_max and target in configs


def test_every_default_a_call_can_get_is_a_probed_schedule():
    # the probe's schedules come from default_config's suite-sized problems; a call of another batch,
    # head count, GQA group, Sq != Sk or dtype must land on one of them, or its schedule would reach
    # users without having run under the sanitizers
    import random

    import torch

    from flashrung.dispatch import Problem
    from flashrung.evidence import ws_probe
    from flashrung.kernels.hopper import fwd

    probed = {(schedule[0], schedule[1], ws_probe.schedule_config(schedule)) for schedule in ws_probe.default_schedules()}
    rng = random.Random(20261208)
    checked = 0
    while checked < 3000:
        head_dim, causal = rng.choice(ws_probe.SCHEDULE_HEAD_DIMS), rng.random() < 0.5
        seqlen_q = rng.choice((rng.randint(1, 5000), rng.randint(1, 70000)))
        seqlen_k = seqlen_q if rng.random() < 0.6 else rng.choice((rng.randint(1, 5000), rng.randint(1, 70000)))
        heads_kv = rng.choice((1, 2, 4, 8, 16, 32))
        heads_q, batch = heads_kv * rng.choice((1, 2, 4, 8)), rng.randint(1, 64)
        if batch * max(seqlen_q, seqlen_k) * heads_q > 2 ** 28:
            continue
        dtype = rng.choice((torch.bfloat16, torch.float16))
        problem = Problem(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
                          head_dim=head_dim, head_dim_v=head_dim, dtype=dtype, causal=causal, device_type="cuda",
                          capability=(9, 0))
        assert (head_dim, causal, fwd.select_config(problem)) in probed, problem
        checked += 1


def test_schedule_shards_partition_the_schedules(capsys):
    from flashrung.evidence import ws_probe

    schedules = ws_probe.default_schedules()
    shards = [ws_probe.shard(schedules, f"{i}/5") for i in range(1, 6)]
    assert sorted(s for part in shards for s in part) == sorted(schedules)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    for bad in ("0/5", "6/5", "3", "a/b"):
        with pytest.raises(ValueError, match="I/N"):
            ws_probe.shard(schedules, bad)
    # listed without a GPU, one line a schedule of the shard
    assert ws_probe.main(["hopper-fwd-schedules", "--list", "--shard", "2/5"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == len(shards[1])
    with pytest.raises(SystemExit):
        ws_probe.main(["hopper-fwd", "--shard", "1/2"])


def test_schedules_probe_needs_a_gpu(monkeypatch, capsys):
    from flashrung.evidence import ws_probe

    monkeypatch.setattr(ws_probe.torch.cuda, "is_available", lambda: False)
    assert ws_probe.main(["hopper-fwd-schedules"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_every_feature_call_lands_on_a_probed_feature_schedule():
    # packed sequences, windows, softcap and MLA's head dims select configurations of their own; the
    # features probe claims them all: random such calls (batch, GQA, Sq != Sk, any width, both dtypes)
    # must each find theirs among its schedules
    import random

    import torch

    from flashrung.dispatch import Problem
    from flashrung.evidence import ws_probe
    from flashrung.kernels.hopper import fwd

    schedules = ws_probe.feature_schedules()
    assert {s[0] for s in schedules} == set(ws_probe.FEATURE_KINDS)
    probed = set()
    for schedule in schedules:
        kind, d, dv, causal, _, packed, window, softcap, _ = schedule
        probed.add((kind, d, dv, causal, packed, window != (-1, -1), softcap > 0, ws_probe.schedule_config(schedule)))
    assert len(probed) == len(schedules), "two feature schedules force one configuration"
    rng = random.Random(20261208)
    checked = 0
    while checked < 2000:
        kind, causal = rng.choice(ws_probe.FEATURE_KINDS), rng.random() < 0.5
        d, dv = ws_probe.MLA_HEAD_DIMS if kind == "mla" else (rng.choice(ws_probe.SCHEDULE_HEAD_DIMS),) * 2
        packed = kind == "packed" or (kind == "mla" and rng.random() < 0.5)
        seqlen_q = rng.choice((rng.randint(1, 5000), rng.randint(1, 70000)))
        seqlen_k = seqlen_q if packed or rng.random() < 0.6 else rng.randint(1, 70000)
        heads_kv = rng.choice((1, 2, 4, 8, 16))
        heads_q, batch = heads_kv * rng.choice((1, 2, 4, 8)), rng.randint(1, 64)
        if batch * max(seqlen_q, seqlen_k) * heads_q > 2 ** 28:
            continue
        window = (-1, -1)
        if kind == "window":
            left = rng.randint(0, 20000)
            window = (left, 0 if causal else rng.choice((-1, 0, rng.randint(0, 20000))))
        softcap = rng.uniform(5.0, 50.0) if kind == "softcap" else 0.0
        problem = Problem(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
                          head_dim=d, head_dim_v=dv, dtype=rng.choice((torch.bfloat16, torch.float16)), causal=causal,
                          device_type="cuda", capability=(9, 0), window_size=window, softcap=softcap, varlen=packed)
        key = (kind, d, dv, causal, packed, window != (-1, -1), softcap > 0, fwd.select_config(problem))
        assert key in probed, problem
        checked += 1


def test_feature_probe_calls_are_small_and_cut_where_the_feature_acts(capsys):
    from flashrung.evidence import ws_probe

    schedules = ws_probe.feature_schedules()
    for schedule in schedules:
        call = ws_probe.feature_probe_call(schedule)
        packed, window = schedule[5], call["window_size"]
        assert call["lengths"] == (ws_probe.PACKED_PROBE_LENGTHS if packed else (ws_probe.PROBE_SEQLEN,))
        # a window narrower than the probe's rows, so its masks cut inside the call
        assert window == (-1, -1) or (window[0] < ws_probe.PROBE_SEQLEN and window[1] < ws_probe.PROBE_SEQLEN)
        assert (window == (-1, -1)) == (schedule[6] == (-1, -1))
    assert ws_probe.main(["hopper-fwd-features", "--list", "--shard", "3/8"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == len(ws_probe.shard(schedules, "3/8"))
