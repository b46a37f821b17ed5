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
    # the sanitizer probe of the long rows' schedules claims to cover every mechanism the defaults
    # synchronise with; a default that moves off one of them must not silently leave it unchecked
    from flashrung.evidence import ws_probe
    from flashrung.kernels.hopper import fwd

    configs = [fwd.default_config(d, causal, seqlen, frozen_step=frozen)
               for d, causal, seqlen, frozen in ws_probe.SCHEDULES]
    assert len(set(configs)) == len(configs), "two schedules force the same configuration"
    for switch in ("named_turns", "asm_arrivals", "split_tail", "gate_pv_wait", "balanced", "stagger_kv",
                   "rescale_by_warp", "wait_pv_early", "kv_multicast", "freeze_row_max"):
        assert any(getattr(cfg, switch) for cfg in configs), switch
    assert {cfg.num_q_stages for cfg in configs} == {1, 2}
    assert {cfg.block_m for cfg in configs} == {128, 192}
    assert {d for d, _, _, _ in ws_probe.SCHEDULES} == {64, 128, 256}
    # split tail in both of d128's named orders: FA3's (4k) and FA4's with PV's gated wait (16k)
    split = [cfg for cfg in configs if cfg.split_tail]
    assert {cfg.wait_pv_early for cfg in split} == {False, True}


def test_schedules_probe_needs_a_gpu(monkeypatch, capsys):
    from flashrung.evidence import ws_probe

    monkeypatch.setattr(ws_probe.torch.cuda, "is_available", lambda: False)
    assert ws_probe.main(["hopper-fwd-schedules"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
