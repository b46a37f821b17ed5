"""``flashrung defaults``: the ranges of max(Sq, Sk) over which hopper.fwd's default is one
configuration (CPU only: the selection is host-side Python)."""
from __future__ import annotations

import bisect
import dataclasses
import json
import pathlib

import pytest

import flashrung
from flashrung import cli, dispatch
from flashrung.kernels.hopper import config as C
from flashrung.kernels.hopper import defaults as D

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "hopper.md"
# every length a test in this file evaluates one by one: past the longest threshold below 2^30
# (16384) with room, and past every row of the fa4-protocol suite (32768)
DENSE_LIMIT = 70_000
COMBOS = [(d, causal) for d in C.SUPPORTED_HEAD_DIMS for causal in (False, True)]


@pytest.mark.parametrize("head_dim,causal", COMBOS)
def test_ranges_hold_at_every_length(head_dim, causal):
    """Protects: the table misses no change point — every length up to 70,000 selects the
    configuration of the range that holds it (a rule written outside the ``*_SEQLEN`` tables
    would show here)."""
    ranges = D.default_ranges(head_dim, causal)
    starts = [r.seqlen_min for r in ranges]
    for seqlen in range(1, DENSE_LIMIT + 1):
        r = ranges[bisect.bisect_right(starts, seqlen) - 1]
        assert r.seqlen_min <= seqlen <= r.seqlen_max
        assert D.selected(head_dim, causal, seqlen) == r.config, (head_dim, causal, seqlen)


@pytest.mark.parametrize("head_dim,causal", COMBOS)
def test_ranges_cover_every_length_once(head_dim, causal):
    """Protects: the ranges start at 1, meet without gaps or overlaps, run to the open end, and
    neighbours differ (merged otherwise), so one row answers each length."""
    ranges = D.default_ranges(head_dim, causal)
    assert ranges[0].seqlen_min == 1 and ranges[-1].seqlen_max == D.MAX_SEQLEN
    for a, b in zip(ranges, ranges[1:]):
        assert b.seqlen_min == a.seqlen_max + 1
        assert a.config != b.config


def test_the_suite_rows_read_their_changes():
    """Protects: the table names the changes a reader looks for, where the config puts them — d128
    causal keeps two Q buffers and the multiply-high decode at every length (change 52), d64
    non-causal pairs from 2048 (change 50), d128 non-causal relays from 8192 (change 46)."""
    d128c = D.default_ranges(128, True)
    assert all(r.config.num_q_stages == 2 and r.config.fast_divide_consumers for r in d128c)
    assert "fast_divide_producer" in D.switches(d128c[-1].config)
    d64 = {r.seqlen_min: r for r in D.default_ranges(64, False)}
    assert d64[2048].seqlen_max == 2048 and d64[2048].config.kv_multicast
    assert "K/V multicast pairs across heads" in D.grid_text(d64[2048].config)
    relayed = [r for r in D.default_ranges(128, False) if r.config.relay_release]
    assert relayed[0].seqlen_min == C.FA4_ORDER_NONCAUSAL_MIN_SEQLEN[128]


def test_switches_list_only_what_differs_from_the_dataclass():
    """Protects: a configuration with no switch moved lists none, and a field turned off that is
    on by default is written with its value (not dropped)."""
    assert D.switches(C.HopperFwdConfig()) == []
    cfg = C.HopperFwdConfig(pack_p=True, first_mask_on_need=False, rescale_threshold=8.0, block_m=192)
    assert D.switches(cfg) == ["pack_p", "rescale_threshold=8", "first_mask_on_need=false"]


def test_lengths_are_written_as_the_config_writes_them():
    """Protects: open ends and the 2^30 rule read as lengths, not as 19-digit sentinels."""
    assert D.length_text(1, 1024) == "1–1024"
    assert D.length_text(2048, 2048) == "2048"
    assert D.length_text(2049, 1 << 30) == "2049–2^30"
    assert D.length_text((1 << 30) + 1, D.MAX_SEQLEN) == "≥ 2^30 + 1"
    assert "4611686018427387" not in D.markdown(D.all_ranges())


def test_docs_carry_the_generated_table():
    """Protects: docs/hopper.md's table of the defaults is the code's — a default changed without
    the table fails here (regenerate with `flashrung defaults --markdown`)."""
    carried = D.markdown(D.all_ranges()) in DOCS.read_text()
    assert carried, "docs/hopper.md's defaults table differs from `flashrung defaults --markdown`"


def test_cli_table_json_and_one_problem(capsys):
    """Protects: each output form answers from the same selection."""
    assert cli.main(["defaults", "--headdim", "128", "--causal", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["seqlen_min"] for r in rows] == [r.seqlen_min for r in D.default_ranges(128, True)]
    assert rows[-1]["seqlen_max"] is None and rows[-1]["config"]["num_q_stages"] == 2
    assert cli.main(["defaults", "--headdim", "64", "--no-causal"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("d64 non-causal\n") and "d64 causal" not in out
    assert cli.main(["defaults", "--headdim", "64", "--seqlen", "8192", "--no-causal"]) == 0
    out = capsys.readouterr().out
    assert "max(Sq, Sk) = 8192" in out and "192×128, 3 consumers × 160 regs" in out
    assert "producer_unsynced" in out


def test_cli_refuses_what_it_cannot_answer(capsys):
    """Protects: bad input names the argument and what was expected."""
    assert cli.main(["defaults", "--seqlen", "4096"]) == 2
    assert "--seqlen needs --headdim" in capsys.readouterr().err
    assert cli.main(["defaults", "--headdim", "128", "--seqlen", "0"]) == 2
    assert "seqlen must be between 1" in capsys.readouterr().err
    assert cli.main(["defaults", "--headdim", "100"]) == 2
    assert "--headdim: head_dim must be a multiple of 8 in [8, 256]" in capsys.readouterr().err
    with pytest.raises(ValueError, match="multiple of 8"):
        D.problem(84, False, 1024)


def test_a_value_head_dim_prints_its_row_and_the_widths_it_compiles(capsys):
    """Protects: `flashrung defaults --headdim D --headdim-v DV` names the row a pair runs (the
    wider's), says whether dispatch picks it, and prints each tensor's compiled widths — MLA's 192/128
    split by default (config.SPLIT_DEFAULT_HEAD_DIMS), other pairs padded, each as the switches
    make them (config.kernel_head_dims)."""
    assert cli.main(["defaults", "--headdim", "192", "--headdim-v", "128", "--seqlen", "8192", "--causal"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("d192/128 runs the d256 row") and "automatic dispatch picks it" in out
    assert "  widths    Q/K 192 (128 + 64 columns), V/O 128 (config.kernel_head_dims)" in out
    assert cli.main(["defaults", "--headdim", "192", "--headdim-v", "128", "--seqlen", "8192", "--causal",
                     "--set", "own_value_dim=false,split_head_dim=false"]) == 0
    assert "  widths    Q/K 256, V/O 256" in capsys.readouterr().out
    assert cli.main(["defaults", "--headdim", "128", "--headdim-v", "64", "--seqlen", "8192", "--causal"]) == 0
    assert "  widths    Q/K 128, V/O 128" in capsys.readouterr().out
    assert cli.main(["defaults", "--headdim", "96", "--headdim-v", "64", "--seqlen", "100", "--no-causal"]) == 0
    assert "automatic dispatch runs portable.fwd instead" in capsys.readouterr().out
    assert cli.main(["defaults", "--headdim", "192", "--headdim-v", "128", "--seqlen", "8192", "--json",
                     "--set", "split_head_dim=false"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {tuple(r["kernel_widths"]) for r in rows} == {(256, 128)} and rows[0]["head_dim_v"] == 128
    assert cli.main(["defaults", "--headdim-v", "128"]) == 2
    assert "--headdim-v needs --headdim" in capsys.readouterr().err
    assert cli.main(["defaults", "--headdim", "192", "--headdim-v", "100"]) == 2
    assert "--headdim-v: head_dim_v must be a multiple of 8" in capsys.readouterr().err
    assert cli.main(["defaults", "--headdim", "192", "--headdim-v", "128", "--seqlen", "8192", "--no-causal",
                     "--set", "own_value_dim=true,split_head_dim=true,q_in_registers=true"]) == 2
    assert "it excludes q_in_registers" in capsys.readouterr().err


def test_a_padded_head_dim_names_its_kernel_and_prints_that_schedule(capsys):
    """Protects: a head dim hopper.fwd pads says which kernel runs it and how dispatch treats it,
    and shows that kernel's schedule, the one select_config gives it."""
    assert cli.main(["defaults", "--headdim", "96", "--seqlen", "16384", "--no-causal"]) == 0
    padded = capsys.readouterr().out
    assert padded.startswith("d96 runs the d128 kernel, its columns 96–127 zero-filled by TMA")
    assert "; automatic dispatch picks it." in padded            # listed: fwd.PADDED_AUTO_HEAD_DIMS
    assert cli.main(["defaults", "--headdim", "128", "--seqlen", "16384", "--no-causal"]) == 0
    assert padded.split("\n", 1)[1] == capsys.readouterr().out
    assert cli.main(["defaults", "--headdim", "88", "--seqlen", "16384", "--no-causal"]) == 0
    assert "automatic dispatch runs portable.fwd instead; impl='hopper.fwd' runs it" in capsys.readouterr().out
    assert D.selected(96, True, 4096) == D.selected(128, True, 4096)
    assert cli.main(["defaults", "--headdim", "32", "--seqlen", "100", "--causal", "--json"]) == 0
    row, = json.loads(capsys.readouterr().out)
    assert (row["head_dim"], row["kernel_head_dim"]) == (32, 64)
    assert cli.main(["defaults", "--headdim", "192", "--causal", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all((r["head_dim"], r["kernel_head_dim"]) == (192, 256) for r in rows)


def test_key_tail_note_says_what_the_selection_does():
    """Protects: the one rule the table leaves to its note — d256 non-causal takes the inline
    arrivals only with keys in whole tiles, d256 causal never — is what select_config does."""
    whole = D.problem(256, False, 4096)
    tail = dataclasses.replace(whole, seqlen_k=4095)
    assert C.select_config(whole).asm_arrivals and not C.select_config(tail).asm_arrivals
    assert not any(r.config.asm_arrivals for r in D.default_ranges(256, True))
    assert "d256 non-causal keeps Gluon's arrivals" in D.KEY_TAIL_NOTE


def test_set_shows_what_an_override_builds_and_what_it_carries(capsys):
    """Protects: `--set` answers as the dispatch resolves `impl="hopper.fwd@..."` — the named field
    changed, the fields derived from it carried along and listed, a refused combination refused."""
    cfg, derived = D.with_overrides(64, False, 8192, "kv_multicast=false")
    assert not cfg.kv_multicast and not cfg.producer_unsynced and not cfg.cross_head_pairs
    assert "producer_unsynced: true → false" in derived and "meet_before_pass: true → false" in derived
    assert all(not line.startswith("kv_multicast:") for line in derived)
    assert D.with_overrides(128, True, 8192, "pack_p=true") == (D.selected(128, True, 8192), [])
    cfg, derived = D.with_overrides(128, False, 2048, "kv_multicast=true")       # what the pairing brings
    assert cfg.kv_multicast and "asm_arrivals: false → true" in derived
    with pytest.raises(ValueError, match="producer_unsynced runs only with one Q buffer"):
        D.with_overrides(64, False, 8192, "producer_unsynced=true,num_q_stages=2")
    assert cli.main(["defaults", "--headdim", "64", "--seqlen", "8192", "--no-causal", "--set",
                     "kv_multicast=false"]) == 0
    out = capsys.readouterr().out
    assert "hopper.fwd@kv_multicast=false" in out and "derived   " in out and "K/V multicast" not in out
    assert cli.main(["defaults", "--headdim", "64", "--seqlen", "8192", "--set", "bogus=1"]) == 2
    assert "unknown hopper.fwd config key 'bogus'" in capsys.readouterr().err
    assert cli.main(["defaults", "--set", "pack_p=true"]) == 2
    assert "--set needs --headdim and --seqlen" in capsys.readouterr().err


def test_last_dispatch_says_the_schedule_the_table_names():
    """Protects: `flashrung.last_dispatch().config()` is the configuration the call's kernel
    resolves — the table's for a default call, the override's for a forced variant — and None for
    a kernel without one; the record holds no work of its own (compared and printed as before)."""
    problem = D.problem(128, True, 8192)
    _, chosen = dispatch.select(problem, "fwd")
    assert chosen.kernel == "hopper.fwd" and flashrung.last_dispatch() is chosen
    assert chosen.config() == D.selected(128, True, 8192)
    assert str(chosen) == "hopper.fwd" and chosen == dispatch.Dispatch("hopper.fwd", "fwd")
    _, forced = dispatch.select(problem, "fwd", "hopper.fwd@pack_p=false")
    assert forced.config() == dataclasses.replace(D.selected(128, True, 8192), pack_p=False)
    _, portable = dispatch.select(problem, "fwd", "portable.fwd")
    assert portable.config() is None
    assert dispatch.Dispatch("hopper.fwd", "fwd").config() is None     # no problem recorded


def test_a_packs_configuration_names_its_table_and_sections(capsys):
    # --packed: the configuration a pack whose longest sequence is --seqlen runs — the run-time
    # hand-out through the table of its tiles with a row, in the row's L2 sections
    # (config.PACKED_SECTION_MIB), never the launch's LPT sections (they only number the tiles there);
    # with the pack's own lists and a pool (by name: config.PACKED_CAUSAL_POOL_SHARE), those
    assert cli.main(["defaults", "--headdim", "128", "--seqlen", "8192", "--causal", "--packed"]) == 0
    out = capsys.readouterr().out
    assert "d128 causal, packed sequences, the longest 8192" in out
    assert (f"tiles handed out at run time through the table of the tiles with a row, in "
            f"{C.PACKED_SECTION_MIB[128]} MiB L2 sections of each sequence's K/V, each heaviest first") in out
    assert "LPT" not in out and "handout_table" not in out
    assert cli.main(["defaults", "--headdim", "128", "--seqlen", "8192", "--causal", "--packed", "--set",
                     "balanced=true,dynamic_tiles=false,dynamic_pool_share=0.03"]) == 0
    grid = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("grid"))
    assert ("lists of the tiles with a row, then the last 3% of the work handed out at run time through the "
            f"table, in {C.PACKED_SECTION_MIB[128]} MiB L2 sections of each sequence's K/V, each heaviest first") in grid
    assert "dynamic_pool_share" not in grid
    assert cli.main(["defaults", "--headdim", "128", "--seqlen", "8192", "--causal", "--packed", "--set",
                     "packed_section_mib=0"]) == 0
    assert "heaviest first across the pack" in capsys.readouterr().out
    assert cli.main(["defaults", "--headdim", "64", "--seqlen", "8192", "--packed", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["config"]["packed_section_mib"] for r in rows] == [C.PACKED_SECTION_MIB[64]] * 2
    assert all(r["packed"] for r in rows)
    assert cli.main(["defaults", "--packed"]) == 2
    assert "--packed needs --headdim and --seqlen" in capsys.readouterr().err
