"""The direct launch (flashrung.kernels.direct_launch): what it keys on, and that it runs the kernel
Triton would have run.

CPU: the hopper.fwd launch key determines everything Triton specializes the kernel on (checked
against Triton's own specializer over launches that differ in exactly those properties), and the
launcher binds trailing parameters as ``JITFunction.run`` does. GPU (sm_90): the direct path and
``JITFunction.run`` give bit-identical outputs, and a launch hook sends calls the ordinary way.
"""
import dataclasses
import itertools
import types

import pytest
import torch
import triton
import triton.language as tl

from flashrung.kernels import direct_launch
from flashrung.kernels.hopper import fwd


@triton.jit
def _axpy(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr, ADD: tl.constexpr = True):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if ADD:
        tl.store(y_ptr + offs, alpha * x + tl.load(y_ptr + offs, mask=offs < n), mask=offs < n)
    else:
        tl.store(y_ptr + offs, alpha * x, mask=offs < n)


def test_trailing_parameters_bind_keywords_then_defaults_in_signature_order():
    launcher = direct_launch.DirectLaunch(_axpy)
    assert launcher._trailing(4, {"BLOCK": 128}, 4) == (128, True)
    assert launcher._trailing(4, {"ADD": False, "BLOCK": 64}, 4) == (64, False)
    with pytest.raises(TypeError, match="BLOCK"):
        launcher._trailing(4, {}, 4)
    with pytest.raises(TypeError, match="unknown keyword"):
        launcher._trailing(4, {"BLOCK": 64, "BLOK": 1}, 4)


def test_an_interpreted_function_always_takes_the_ordinary_path():
    # under TRITON_INTERPRET=1 (the CPU suite) triton.jit returns an InterpretedFunction: nothing
    # compiled to call directly, so every launch goes through it
    launcher = direct_launch.DirectLaunch(_axpy)
    assert launcher._compiled == isinstance(_axpy, triton.runtime.jit.JITFunction)


def test_a_cluster_launch_needs_whole_clusters_and_a_compiled_kernel():
    # kv_multicast launches clusters of two CTAs: a grid that does not split into them is refused
    # before anything runs, and so is a cluster launch of an interpreted function (the interpreter
    # runs one program at a time, with no cluster to share shared memory with)
    launcher = direct_launch.DirectLaunch(_axpy)
    x = torch.zeros(16)
    with pytest.raises(ValueError, match="clusters of 2"):
        launcher(3, "key", (x, x, 16, 1.0), {"BLOCK": 16}, 4, cluster_ctas=2)
    if not launcher._compiled:
        with pytest.raises(RuntimeError, match="no cluster launch"):
            launcher(2, "key", (x, x, 16, 1.0), {"BLOCK": 16}, 4, cluster_ctas=2)


class _FakeJit:
    """A compiled function as DirectLaunch's cluster path uses it: ``warmup`` returns a kernel whose
    launcher records what it is handed (the CPU suite has no GPU to launch on)."""

    def __init__(self):
        self.__name__ = "fake_kernel"
        self.pre_run_hooks = []
        self.launched, self.metadata_asked = [], []
        run = lambda *a: self.launched.append(a)                                     # noqa: E731
        asked = lambda grid, stream, *bound: self.metadata_asked.append((grid, stream, bound)) or "meta"  # noqa: E731
        self.kernel = types.SimpleNamespace(run=run, function=0xF00, packed_metadata=(12, 1, 1024),
                                            launch_metadata=asked)
        self.warmups = []

    def warmup(self, *args, grid, **kwargs):
        self.warmups.append((args, grid, kwargs))
        for hook in self.pre_run_hooks:
            hook(*args, **kwargs)
        return self.kernel


def _cluster_launcher(monkeypatch):
    fake = _FakeJit()
    launcher = direct_launch.DirectLaunch(_axpy)
    launcher.fn, launcher._compiled = fake, True
    monkeypatch.setattr(direct_launch, "driver", types.SimpleNamespace(active=types.SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: 7)))
    return launcher, fake


def test_a_hooked_cluster_launch_goes_through_tritons_launcher(monkeypatch):
    # JITFunction.run cannot start clusters: under a launch hook (a profiler) a cluster launch
    # takes Triton's binding (warmup, the pre-run hooks with it) and the kernel's own launcher,
    # handed the launch metadata and both hooks, the cluster size in the packed metadata and the
    # grid in clusters — where the direct way would hand the C launcher no hook at all
    from triton import knobs

    launcher, fake = _cluster_launcher(monkeypatch)
    x = torch.zeros(16)
    args, constexprs = (x, x, 16, 1.0), {"BLOCK": 16}
    hook = lambda metadata: None                                                   # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launcher(8, "key", args, constexprs, 4, cluster_ctas=2)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert launcher.ordinary_calls == 1 and launcher.direct_calls == 0 and not launcher._kernels
    assert fake.warmups == [(args, (8,), {"BLOCK": 16, "num_warps": 4})]
    (grid, stream, bound), = fake.metadata_asked
    assert grid == (8,) and stream == 7 and bound == (*args, 16, True)
    (call,) = fake.launched
    assert call[:9] == (4, 1, 1, 7, 0xF00, (12, 2, 1024), "meta", knobs.runtime.launch_enter_hook,
                        knobs.runtime.launch_exit_hook)
    assert call[9:] == (*args, 16, True)
    # a pre-run hook on the function counts as well, and the function's hooks run
    seen = []
    fake.pre_run_hooks.append(lambda *a, **kw: seen.append(kw["BLOCK"]))
    launcher(8, "key", args, constexprs, 4, cluster_ctas=2)
    assert seen == [16] and launcher.ordinary_calls == 2 and len(fake.launched) == 2
    # refused as the direct way refuses: a grid of part clusters
    with pytest.raises(ValueError, match="clusters of 2"):
        launcher.through_triton(7, args, constexprs, 4, 2)


def test_without_the_direct_launch_a_paired_launch_goes_through_triton(monkeypatch):
    # FLASHRUNG_DIRECT_LAUNCH=0 keeps every launch off the direct path: a paired (kv_multicast)
    # launch, which JITFunction.run cannot start, through DirectLaunch.through_triton; with the
    # direct launch on, the same launch goes the direct way with its key
    calls = []

    class Recorder:
        def __call__(self, grid, key, args, constexprs, num_warps, cluster_ctas=1):
            calls.append(("direct", grid, cluster_ctas))

        def through_triton(self, grid, args, constexprs, num_warps, cluster_ctas):
            calls.append(("triton", grid, cluster_ctas))

    monkeypatch.setattr(fwd, "_DIRECT", Recorder())
    monkeypatch.setattr(fwd, "kv_tensor_maps", lambda *a: torch.zeros(384, dtype=torch.uint8))
    monkeypatch.setattr(fwd, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fwd, "combine_tail", lambda *a, **kw: None)
    monkeypatch.setattr(fwd, "_launch_barrier_offsets", lambda build, dtype, args, constexprs, grid: constexprs)
    cfg = fwd.default_config(128, False, 4096, frozen_step=False)      # the online step: one launch
    assert cfg.kv_multicast
    q = torch.zeros(8, 4096, 2, 128, dtype=torch.bfloat16)
    lse = torch.zeros(8, 2, 4096)
    for direct in (False, True):
        monkeypatch.setattr(fwd, "DIRECT_LAUNCH", direct)
        fwd._launch(q, q, q, torch.zeros_like(q), lse, False, 0.125, cfg)
    assert [c[0] for c in calls] == ["triton", "direct"] and all(c[2] == 2 and c[1] % 2 == 0 for c in calls)


def test_hooks_are_seen_only_when_set():
    from triton import knobs

    assert not direct_launch._hook_set(None)
    assert not direct_launch._hook_set(knobs.HookChain())
    chain = knobs.HookChain()
    chain.add(lambda metadata: None)
    assert direct_launch._hook_set(chain)
    assert direct_launch._hook_set(lambda metadata: None)


def test_the_environment_can_turn_the_direct_launch_off():
    assert direct_launch.enabled_by_environment({}) is True
    assert direct_launch.enabled_by_environment({"FLASHRUNG_DIRECT_LAUNCH": "1"}) is True
    assert direct_launch.enabled_by_environment({"FLASHRUNG_DIRECT_LAUNCH": " 0 "}) is False
    with pytest.raises(ValueError, match="FLASHRUNG_DIRECT_LAUNCH must be 0 or 1, got 'no'"):
        direct_launch.enabled_by_environment({"FLASHRUNG_DIRECT_LAUNCH": "no"})


def _fake_compiled_kernel(launch, n_descriptors):
    """A compiled kernel as RawLaunch sees it: a launcher of Triton's CudaLauncher class shape."""
    CudaLauncher = type("CudaLauncher", (), {})      # noqa: N806 (the class name RawLaunch checks)
    run = CudaLauncher()
    run.global_scratch_size = run.profile_scratch_size = 0
    run.global_scratch_align = run.profile_scratch_align = 1
    run.launch_cooperative_grid, run.launch_pdl, run.num_ctas = False, True, 1
    run.launch = launch
    return types.SimpleNamespace(run=run, function=0xF00, packed_metadata=("packed",))


def test_the_raw_launch_hands_the_c_launcher_what_cudalauncher_would(monkeypatch):
    # RawLaunch skips CudaLauncher.__call__ and Triton's descriptor wrapper; the C function must
    # receive exactly the arguments those two would have built: base arguments, every descriptor
    # expanded in place, the rest and the constexpr positions in order
    nvidia_driver = pytest.importorskip("triton.backends.nvidia.driver")
    expanded = lambda arg, meta: [("map", arg, meta), ("shape", arg), ("strides", arg)]   # noqa: E731
    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", expanded)
    signature = {0: "tensordesc<bf16[1, 64, 1, 128]>", 1: "tensordesc<bf16[1, 128, 1, 128]>", 2: "*fp32",
                 3: "i32", 4: "tensordesc<bf16[1, 64, 1, 128]>", 5: "fp32", 6: "constexpr", 7: "constexpr"}
    metas = [{"box": 64}, {"box": 128}, {"box": 64}]
    received = []
    wrapped = nvidia_driver.wrap_handle_tensordesc(lambda *a: received.append(a), signature, metas)
    kernel = _fake_compiled_kernel(wrapped, 3)
    args, trailing = ("q", "k", "lse", 17, "o", 0.125), (128, True)
    # the ordinary way: CudaLauncher.__call__ as DirectLaunch calls kernel.run
    nvidia_driver.CudaLauncher.__call__(kernel.run, 96, 1, 1, 7, kernel.function, kernel.packed_metadata,
                                        None, None, None, *args, *trailing)
    raw = direct_launch.RawLaunch.of(kernel, len(args))
    assert raw is not None and [p for p, _ in raw.descriptors] == [0, 1, 4]
    raw(96, 7, kernel.function, kernel.packed_metadata, args, trailing)
    assert len(received) == 2 and received[0] == received[1]
    assert received[1][13:16] == (("map", "q", {"box": 64}), ("shape", "q"), ("strides", "q"))


def test_the_raw_launch_declines_what_it_was_not_written_for():
    nvidia_driver = pytest.importorskip("triton.backends.nvidia.driver")
    signature = {0: "tensordesc<bf16[1, 64, 1, 128]>", 1: "i32"}
    wrapped = nvidia_driver.wrap_handle_tensordesc(lambda *a: None, signature, [{"box": 64}])
    assert direct_launch.RawLaunch.of(_fake_compiled_kernel(wrapped, 1), 2) is not None
    # scratch memory to allocate per launch: CudaLauncher's job
    kernel = _fake_compiled_kernel(wrapped, 1)
    kernel.run.global_scratch_size = 256
    assert direct_launch.RawLaunch.of(kernel, 2) is None
    # a launcher of another class, or a wrapper that is not the driver's
    assert direct_launch.RawLaunch.of(types.SimpleNamespace(run=lambda *a: None), 2) is None
    assert direct_launch.RawLaunch.of(_fake_compiled_kernel(lambda *a: None, 0), 2) is None
    # a descriptor among the trailing (constexpr) positions
    assert direct_launch.RawLaunch.of(_fake_compiled_kernel(wrapped, 1), 0) is None


# --------------------------------------------------------------------------- the hopper.fwd key (CPU)


def _specialization(args, constexprs):
    """What Triton compiles a launch for: its specializer's verdict on every runtime argument
    (type, alignment, value 1) and the constexprs."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    return (tuple(native_specialize_impl(BaseBackend, a, False, True, True) for a in args),
            tuple(sorted(constexprs.items())))


def _recorded_launches(monkeypatch):
    """Run hopper.fwd's _launch on CPU tensors over shapes, configurations and buffers that move
    every property Triton specializes on, recording (key, specialization) of each launch."""
    records = []

    def record(grid, key, args, constexprs, num_warps, cluster_ctas=1):
        records.append((key, _specialization(args, constexprs)))

    monkeypatch.setattr(fwd, "_DIRECT", record)
    # kv_multicast's K/V tensor maps (encoded by the CUDA driver; Q's third with producer_unsynced):
    # a stand-in of their size and type
    monkeypatch.setattr(fwd, "kv_tensor_maps",
                        lambda k, v, rows, *q: torch.zeros(128 * (3 if q else 2), dtype=torch.uint8))
    monkeypatch.setattr(fwd, "DIRECT_LAUNCH", True)
    monkeypatch.setattr(fwd, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fwd, "combine_tail", lambda *a, **kw: None)
    monkeypatch.setattr(fwd, "_schedule_table", lambda *a, **kw: torch.zeros(64, dtype=torch.int32))
    # the frozen row max's word pair of the current stream (a CUDA stream query): a stand-in
    monkeypatch.setattr(fwd, "guard_word", lambda index: torch.zeros(fwd.GUARD_WORDS, dtype=torch.int32))

    def offsets(build, dtype, args, constexprs, grid):
        # an asm_arrivals build's barrier offsets come from its compile, once per (build, dtype):
        # stand-ins that differ by build and dtype, so the key must tell them apart as well
        return dict(constexprs, **{name: 8 * (hash((build, dtype, name)) % 4096)
                                   for name, value in constexprs.items() if name.endswith("_AT") and value != -1})

    monkeypatch.setattr(fwd, "_launch_barrier_offsets", offsets)
    shapes = [  # (batch, seqlen_q, seqlen_k, heads_q, heads_kv): ones, multiples of 16, odd sizes
        (1, 1, 1, 1, 1), (1, 16, 16, 16, 16), (2, 17, 1000, 4, 2), (1, 128, 128, 1, 1),
        (3, 4097, 333, 6, 3), (2, 1024, 1024, 16, 16), (1, 16384, 16384, 2, 1), (1, 32768, 32768, 1, 1),
        # one query length, the other integers moving: batch, heads, the GQA group, the key length
        (1, 1000, 1000, 1, 1), (2, 1000, 1000, 16, 16), (3, 1000, 1000, 3, 1), (2, 1000, 16, 16, 1),
        (4, 1000, 1001, 32, 2),
    ]
    # 96 and 32: padded head dims, run by the d128 and d64 kernels (config.kernel_head_dim) with
    # descriptors over narrower tensors; 192/128, a v (and out) of its own head dim, by the d256
    # kernel: the same keys as those kernels' must mean the same kernel
    for dims, causal, dtype in itertools.product((64, 128, 256, 96, 32, (192, 128)), (False, True),
                                                 (torch.float16, torch.bfloat16)):
        head_dim, head_dim_v = dims if isinstance(dims, tuple) else (dims, dims)
        for batch, seqlen_q, seqlen_k, heads_q, heads_kv in shapes:
            cfg = fwd.default_config(head_dim, causal, max(seqlen_q, seqlen_k))
            q = torch.zeros(batch, seqlen_q, heads_q, head_dim, dtype=dtype)
            k = torch.zeros(batch, seqlen_k, heads_kv, head_dim, dtype=dtype)
            v = torch.zeros(batch, seqlen_k, heads_kv, head_dim_v, dtype=dtype)
            out = torch.zeros(batch, seqlen_q, heads_q, head_dim_v, dtype=dtype)
            for lse_offset in (0, 1, 4):           # lse 16-byte aligned or not (a caller's lse=)
                lse = torch.zeros(batch * heads_q * seqlen_q + lse_offset)[lse_offset:]
                lse = lse.view(batch, heads_q, seqlen_q)
                for scale in (0.125, -0.125):
                    fwd._launch(q, k, v, out, lse, causal, scale, cfg)
            if head_dim == 128 and not causal:      # a configuration beside the default
                fwd._launch(q, k, v, out, lse, causal, 0.125,
                            dataclasses.replace(cfg, num_q_stages=1 if cfg.num_q_stages == 2 else 2))
    return records


def test_the_launch_key_determines_what_triton_specializes_on(monkeypatch):
    # The direct launch reuses the kernel Triton compiled for the first launch of a key: equal
    # keys must mean equal specializations (argument types, 16-byte alignment, integers equal to 1
    # or divisible by 16, descriptor boxes and layouts, constexprs), or a launch would run a kernel
    # built for other arguments
    records = _recorded_launches(monkeypatch)
    by_key = {}
    for key, spec in records:
        by_key.setdefault(key, set()).add(spec)
    assert len(records) > 400
    mixed = {key: specs for key, specs in by_key.items() if len(specs) > 1}
    assert not mixed, f"{len(mixed)} keys cover more than one specialization"
    # the property the test relies on actually varies: alignment, value-1 integers, constexprs
    specs = {spec for _, spec in records}
    # a padded head dim's launches reuse its kernel's keys (a d96 launch is keyed as a d128 one)
    assert {key[0][1] for key, _ in records} == {64, 128, 256}
    assert any("D" != s[1] and s[0] == "*fp32" for spec in specs for s in spec[0])
    assert any(s == ("constexpr", 1) for spec in specs for s in spec[0])
    assert len({spec[1] for spec in specs}) > 12


def test_the_launch_key_sees_every_pointer(monkeypatch):
    # a key of the integers and the build alone would miss the buffers' alignment: the same shape
    # with a misaligned lse is another key
    records = _recorded_launches(monkeypatch)
    assert len({key for key, _ in records}) > len({(key[0], key[1], key[2]) for key, _ in records})


def test_the_recomputes_key_determines_what_triton_specializes_on(monkeypatch):
    # portable.fwd.recompute_flagged (behind hopper.fwd's frozen row max) keys its direct launch on
    # specialization_key: equal keys must mean equal specializations over shapes, strides (a
    # transposed q), alignments (an offset lse) and both guard kinds, and the key must move with them
    from flashrung.kernels.portable import fwd as portable

    records = []

    def record(grid, key, args, constexprs, num_warps, cluster_ctas=1, num_stages=None):
        records.append((key, (_specialization(args, constexprs), num_warps, num_stages)))

    monkeypatch.setattr(portable, "_RECOMPUTE", record)
    monkeypatch.setattr(portable, "DIRECT_LAUNCH", True)
    for (batch, seqlen_q, seqlen_k, heads_q, heads_kv), head_dim, causal, dtype in itertools.product(
            [(1, 1, 1, 1, 1), (2, 17, 1000, 4, 2), (1, 16, 16, 16, 16), (3, 4097, 333, 6, 3), (1, 128, 32, 2, 1)],
            (64, 128), (False, True), (torch.float16, torch.bfloat16)):
        k = torch.zeros(batch, seqlen_k, heads_kv, head_dim, dtype=dtype)
        for transposed, lse_offset, reset in itertools.product((False, True), (0, 1), (False, True)):
            q = (torch.zeros(batch, heads_q, seqlen_q, head_dim, dtype=dtype).transpose(1, 2) if transposed
                 else torch.zeros(batch, seqlen_q, heads_q, head_dim, dtype=dtype))
            lse = torch.zeros(batch * heads_q * seqlen_q + lse_offset)[lse_offset:].view(batch, heads_q, seqlen_q)
            guard = torch.zeros(2 if reset else 1, dtype=torch.int32)
            portable.recompute_flagged(guard, q, k, k, torch.zeros_like(q), lse, causal, 0.125, reset=reset)
    by_key = {}
    for key, spec in records:
        by_key.setdefault(key, set()).add(spec)
    assert not {key: specs for key, specs in by_key.items() if len(specs) > 1}, "a key covers two specializations"
    # the properties the test relies on actually vary: alignment, value-1 integers, constexprs
    specs = {spec for _, spec in records}
    assert len(records) == 320 and len(specs) > 50
    assert any(s[1] == "D" for spec in specs for s in spec[0][0]) and any(s[1] != "D" for spec in specs for s in spec[0][0])
    assert any(s == ("constexpr", 1) for spec in specs for s in spec[0][0])


# --------------------------------------------------------------------------- GPU (sm_90)

on_hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="needs a CUDA device of compute capability 9.0 (Hopper)")


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim, causal, shape", [
    (128, False, (2, 1000, 1000, 4, 2)),    # key tail, GQA
    (128, False, (1, 16384, 16384, 2, 2)),  # the split tail (split items and the merge)
    (128, True, (2, 2048, 2048, 4, 4)),     # the balanced lists, two Q buffers off
    (64, True, (4, 1024, 1024, 4, 4)),      # d64's short-causal tile, two Q buffers
    (64, False, (1, 17, 4097, 1, 1)),       # one row of a tile, a long key sweep
    (256, True, (1, 333, 777, 2, 1)),       # Sq < Sk causal
])
def test_the_direct_path_computes_what_the_ordinary_path_does(monkeypatch, head_dim, causal, shape):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv = shape
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    monkeypatch.setattr(fwd, "DIRECT_LAUNCH", False)
    ref_out, ref_lse = fwd.forward(q, k, v, causal, head_dim ** -0.5)
    monkeypatch.setattr(fwd, "DIRECT_LAUNCH", True)
    before = fwd._DIRECT.direct_calls
    outs = []
    for _ in range(3):       # the first call of a new key goes the ordinary way, the rest direct
        # poisoned outputs: a launch that wrote nothing cannot pass
        out = torch.full_like(q, float("nan"))
        lse = torch.full((batch, heads_q, seqlen_q), float("nan"), device="cuda")
        outs.append(fwd.forward(q, k, v, causal, head_dim ** -0.5, out=out, lse=lse))
    torch.cuda.synchronize()
    assert fwd._DIRECT.direct_calls - before >= 2
    # on Triton 3.6 the direct path reaches the C launcher itself (RawLaunch), not CudaLauncher
    assert any(raw is not None for _, _, raw in fwd._DIRECT._kernels.values())
    for out, lse in outs:
        assert torch.equal(out, ref_out)
        assert torch.equal(lse, ref_lse)


@pytest.mark.gpu
@on_hopper
def test_a_launch_hook_sees_every_launch(monkeypatch):
    from triton import knobs

    q = torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.bfloat16)
    fwd.forward(q, q, q, False, 0.125)        # the key is known: the next call would go direct
    seen = []
    hook = lambda metadata: seen.append(metadata.get()["name"])   # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        ordinary = fwd._DIRECT.ordinary_calls
        fwd.forward(q, q, q, False, 0.125)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert fwd._DIRECT.ordinary_calls == ordinary + 1
    assert any("attn_fwd" in name for name in seen)


@pytest.mark.gpu
@on_hopper
def test_a_paired_launch_through_triton_computes_what_the_direct_one_does(monkeypatch):
    # d128 non-causal S4k pairs its CTAs by default: the cluster launch under a launch hook and with
    # the direct launch off (DirectLaunch.through_triton) gives the bit-identical output of the
    # direct one, and the hook sees it
    from triton import knobs

    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(1, 4096, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    assert fwd.default_config(128, False, 4096).kv_multicast
    ref_out, ref_lse = fwd.forward(q, k, v, False, 0.125)
    seen = []
    hook = lambda metadata: seen.append(metadata.get()["name"])   # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        ordinary = fwd._DIRECT.ordinary_calls
        out = torch.full_like(q, float("nan"))
        fwd.forward(q, k, v, False, 0.125, out=out)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert fwd._DIRECT.ordinary_calls == ordinary + 1 and any("attn_fwd" in name for name in seen)
    assert torch.equal(out, ref_out)
    monkeypatch.setattr(fwd, "DIRECT_LAUNCH", False)
    out = torch.full_like(q, float("nan"))
    lse = torch.full_like(ref_lse, float("nan"))
    fwd.forward(q, k, v, False, 0.125, out=out, lse=lse)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


@pytest.mark.gpu
@on_hopper
def test_the_direct_path_launches_on_the_current_stream():
    # the launch must follow torch's current stream: on a side stream, a poison written after a
    # long sleep and before the call must be overwritten by it (a launch on another stream would
    # run first and leave the poison in place)
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(2, 2048, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    ref_out, ref_lse = fwd.forward(q, q, q, True, 0.125)      # the key is known: the next call is direct
    torch.cuda.synchronize()
    direct = fwd._DIRECT.direct_calls
    out, lse = torch.empty_like(q), torch.empty_like(ref_lse)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)       # about 0.1 s of GPU clock cycles
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        fwd.forward(q, q, q, True, 0.125, out=out, lse=lse)
    torch.cuda.synchronize()
    assert fwd._DIRECT.direct_calls == direct + 1
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
