"""The public API: validation names the bad argument, dispatch says what ran, autograd and
torch.compile work, flash-attn's call shape works."""
import math
import subprocess
import sys

import pytest
import torch

import flashrung
from flashrung import gate, reference
from conftest import DEVICE


def qkv(B=1, Sq=17, Sk=17, Hq=2, Hkv=2, D=32, dtype=torch.float16, device=DEVICE):
    return gate.random_inputs(gate.Case(B, Sq, Sk, Hq, Hkv, D, dtype, False), device)


@pytest.mark.parametrize("mutate, exc, words", [
    (lambda q, k, v: (q[0], k, v), ValueError, "q must have 4 dimensions"),
    (lambda q, k, v: (q, k.float(), v), TypeError, "share a dtype"),
    (lambda q, k, v: (q.to(torch.float64), k.to(torch.float64), v.to(torch.float64)), TypeError, "float16, bfloat16 or float32"),
    (lambda q, k, v: (q, k[..., :16], v), ValueError, "k's head_dim (16) must equal q's (32)"),
    (lambda q, k, v: (q, k, v[..., :12]), ValueError, "head_dim_v 12 is not supported"),
    (lambda q, k, v: (q[..., :12], k[..., :12], v[..., :12]), ValueError, "head_dim 12"),
    (lambda q, k, v: (torch.cat([q, q], -1).repeat(1, 1, 1, 5)[..., :320],) * 3, ValueError, "head_dim 320"),
    (lambda q, k, v: (q.repeat(1, 1, 3, 1)[:, :, :3], k, v), ValueError, "multiple of heads_kv"),
    (lambda q, k, v: (q.transpose(1, 3).contiguous().transpose(1, 3), k, v), ValueError, "stride(-1) == 1"),
    (lambda q, k, v: (q[:, :0], k, v), ValueError, "q is empty"),
    (lambda q, k, v: (q, k[:1, :0], v[:1, :0]), ValueError, "k is empty"),
    (lambda q, k, v: (q, k[:, :5], v), ValueError, "k and v must agree"),
    (lambda q, k, v: (q.numpy(), k, v), TypeError, "q must be a torch.Tensor"),
])
def test_bad_input_is_a_clear_error_naming_the_argument(mutate, exc, words):
    q, k, v = qkv(device="cpu")
    with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
        flashrung.attention(*mutate(q, k, v))


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_softmax_scale_is_rejected(scale):
    q, k, v = qkv(device="cpu")
    with pytest.raises(ValueError, match="softmax_scale"):
        flashrung.attention(q, k, v, softmax_scale=scale)


def test_causal_must_be_a_bool():
    q, k, v = qkv(device="cpu")
    with pytest.raises(TypeError, match="causal"):
        flashrung.attention(q, k, v, causal="yes")


def test_unknown_impl_names_the_value_first_and_lists_the_choices():
    # the value leads: a caller that shortens the message (the bench's reason column) keeps it
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^impl 'no-such-kernel' names no fwd kernel: .*portable\.fwd"):
        flashrung.attention(q, k, v, impl="no-such-kernel")


def test_cpu_without_interpreter_says_how_to_fix_it():
    code = ("import torch, flashrung\n"
            "q = torch.randn(1, 4, 1, 32, dtype=torch.float16)\n"
            "try:\n    flashrung.attention(q, q, q)\n"
            "except ValueError as e:\n    print('ERR', e)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout
    assert "ERR" in out and "TRITON_INTERPRET=1" in out


def test_dispatch_reports_the_kernel_and_who_declined():
    q, k, v = qkv()
    flashrung.attention(q, k, v)
    d = flashrung.last_dispatch()
    if DEVICE == "cpu":
        assert d.kernel == "portable.fwd"
        assert any(name == "hopper.fwd" for name, _ in d.declined)   # the fallback is visible
    assert d.kernel in str(d)


def test_forward_matches_oracle_with_lse_and_gqa_bottom_right_causal():
    # Sq < Sk with GQA 4:1: the bottom-right causal offset and the head mapping at once
    q, k, v = gate.random_inputs(gate.Case(2, 19, 41, 4, 1, 32, torch.float16, True), DEVICE)
    out, lse = flashrung.attention(q, k, v, causal=True, return_lse=True)
    ref_out, ref_lse = reference.oracle(q, k, v, True)
    low_out, low_lse = reference.lowp(q, k, v, True)
    assert gate.check_tensor("out", out, ref_out, low_out).passed
    assert gate.check_tensor("lse", lse, ref_lse, low_lse).passed
    assert lse.shape == (2, 4, 19) and lse.dtype == torch.float32


def test_non_contiguous_inputs_use_their_strides():
    # q taken from a (B, H, S, D) tensor: a strided view, inner stride still 1
    base = torch.randn(1, 3, 23, 32, dtype=torch.float16).to(DEVICE)
    q = base.transpose(1, 2)
    k = torch.randn(1, 23, 6, 32, dtype=torch.float16).to(DEVICE)[:, :, ::2]   # every other head
    v = torch.randn(1, 23, 3, 64, dtype=torch.float16).to(DEVICE)[..., :32]    # a column slice
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    out = flashrung.attention(q, k, v)
    expect = flashrung.attention(q.contiguous(), k.contiguous(), v.contiguous())
    assert torch.equal(out, expect)


def test_a_value_head_dim_of_its_own_runs_forward_and_backward():
    # MLA's shape: q/k 192 wide, v 128; out has v's width, the default scale is q's 1/sqrt(192)
    case = gate.Case(1, 21, 37, 4, 2, 192, torch.float16, True, head_dim_v=128)
    q, k, v = (t.requires_grad_(True) for t in gate.random_inputs(case, DEVICE))
    out, lse = flashrung.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == (1, 21, 4, 128)
    ref_out, ref_lse = reference.oracle(q, k, v, True, 1 / math.sqrt(192))
    low_out, low_lse = reference.lowp(q, k, v, True, 1 / math.sqrt(192))
    assert gate.check_tensor("out", out, ref_out, low_out).passed
    assert gate.check_tensor("lse", lse, ref_lse, low_lse).passed
    do = torch.randn_like(out)
    out.backward(do)
    ref = reference.oracle_grads(q, k, v, do, True, 1 / math.sqrt(192))
    low = reference.oracle_grads(q, k, v, do, True, 1 / math.sqrt(192), low_precision=True)
    for name, t, r, l in zip(("dq", "dk", "dv"), (q, k, v), ref, low):
        assert t.grad.shape == t.shape
        assert gate.check_tensor(name, t.grad, r, l).passed, name


@pytest.mark.parametrize("window_size, causal", [((5, 3), False), ((9, -1), True), ((-1, 4), False), ((0, 0), False)])
def test_a_sliding_window_runs_forward_and_backward_against_the_oracle(window_size, causal):
    # flash-attn's window_size, bottom-right aligned with Sq < Sk and GQA: out, lse and the
    # gradients (through autograd and the op) against the oracle's, by the gate's rule
    case = gate.Case(1, 23, 40, 4, 2, 32, torch.float16, causal, window_size=window_size)
    q, k, v = (t.requires_grad_(True) for t in gate.random_inputs(case, DEVICE))
    out, lse = flashrung.attention(q, k, v, causal=causal, window_size=window_size, return_lse=True)
    ref_out, ref_lse = reference.oracle(q, k, v, causal, None, window_size)
    low_out, low_lse = reference.lowp(q, k, v, causal, None, window_size)
    assert gate.check_tensor("out", out, ref_out, low_out).passed
    assert gate.check_tensor("lse", lse, ref_lse, low_lse).passed
    do = torch.randn_like(out)
    out.backward(do)
    ref = reference.oracle_grads(q, k, v, do, causal, None, window_size=window_size)
    low = reference.oracle_grads(q, k, v, do, causal, None, low_precision=True, window_size=window_size)
    for name, t, r, l in zip(("dq", "dk", "dv"), (q, k, v), ref, low):
        assert gate.check_tensor(name, t.grad, r, l).passed, name
    assert flashrung.last_dispatch("bwd").kernel == "portable.bwd"


def test_a_window_of_the_causal_mask_is_the_causal_mask_and_bad_windows_say_what_to_fix():
    q, k, v = qkv(Sq=9, Sk=20)
    causal = flashrung.attention(q, k, v, causal=True)
    assert torch.equal(flashrung.attention(q, k, v, window_size=(-1, 0)), causal)
    assert torch.equal(flashrung.attention(q, k, v, causal=True, window_size=(-1, 0)), causal)
    # a window wider than every distance masks nothing
    assert torch.equal(flashrung.attention(q, k, v, window_size=(100, 100)), flashrung.attention(q, k, v))
    for window, exc, words in [((4, 2, 1), TypeError, "pair"), (5, TypeError, "pair"), ((-2, 0), ValueError, "left"),
                               ((0, 1.5), ValueError, "right"), ((True, 0), ValueError, "left")]:
        with pytest.raises(exc, match=words):
            flashrung.attention(q, k, v, window_size=window)
    with pytest.raises(ValueError, match="right must be -1 or 0 with causal=True"):
        flashrung.attention(q, k, v, causal=True, window_size=(4, 2))


@pytest.mark.parametrize("softcap, causal, window_size", [(2.0, True, (-1, -1)), (30.0, False, (6, 3))])
def test_a_softcap_runs_forward_and_backward_against_the_oracle(softcap, causal, window_size):
    # the scaled scores capped by softcap·tanh(scores/softcap) before the mask: out, lse and the
    # gradients (through the cap's 1 − tanh²) against the oracle's, with a window beside it
    case = gate.Case(1, 21, 37, 4, 2, 32, torch.float16, causal, window_size=window_size, softcap=softcap)
    q, k, v = (t.requires_grad_(True) for t in gate.random_inputs(case, DEVICE))
    q.data.mul_(3)          # scores well past the cap, where it bends them
    out, lse = flashrung.attention(q, k, v, causal=causal, window_size=window_size, softcap=softcap,
                                   return_lse=True)
    args = (causal, None, window_size, softcap)
    ref_out, ref_lse = reference.oracle(q, k, v, *args)
    low_out, low_lse = reference.lowp(q, k, v, *args)
    assert gate.check_tensor("out", out, ref_out, low_out).passed
    assert gate.check_tensor("lse", lse, ref_lse, low_lse).passed
    uncapped = reference.oracle(q, k, v, causal, None, window_size)[0]
    assert gate.max_abs_diff(uncapped, ref_out) > 10 * gate.max_abs_diff(out, ref_out)   # the cap matters here
    do = torch.randn_like(out)
    out.backward(do)
    ref = reference.oracle_grads(q, k, v, do, causal, None, window_size=window_size, softcap=softcap)
    low = reference.oracle_grads(q, k, v, do, causal, None, low_precision=True, window_size=window_size,
                                 softcap=softcap)
    for name, t, r, l in zip(("dq", "dk", "dv"), (q, k, v), ref, low):
        assert gate.check_tensor(name, t.grad, r, l).passed, name


@pytest.mark.parametrize("softcap", [-1.0, float("inf"), float("nan"), True, "30"])
def test_a_bad_softcap_is_refused_naming_it(softcap):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="softcap must be 0"):
        flashrung.attention(q, k, v, softcap=softcap)


def _packed(lengths_q=(5, 0, 40, 17, 1), lengths_k=(7, 3, 33, 17, 0), heads=(4, 2), dtype=torch.float16):
    torch.manual_seed(0)
    cu_q, cu_k = gate.cu_seqlens(lengths_q, DEVICE), gate.cu_seqlens(lengths_k, DEVICE)
    q = torch.randn(sum(lengths_q), heads[0], 32, dtype=dtype, device=DEVICE)
    k, v = (torch.randn(sum(lengths_k), heads[1], 32, dtype=dtype, device=DEVICE) for _ in range(2))
    return q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k)


def test_packed_sequences_are_each_sequence_alone_forward_and_backward():
    # flash-attn's varlen: every sequence's rows, lse and gradients are those of the sequence run
    # alone, bit for bit (the same tiles from the sequence's own first row); an empty key range
    # gives 0 and -inf; an empty query range has nothing to give
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = flashrung.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, causal=True, return_lse=True)
    assert out.shape == (63, 4, 32) and lse.shape == (4, 63) and flashrung.last_dispatch().kernel == "portable.fwd"
    do = torch.randn_like(out)
    out.backward(do)
    for a, b, c, d in zip(cu_q.tolist(), cu_q.tolist()[1:], cu_k.tolist(), cu_k.tolist()[1:]):
        if a == b:
            continue
        if c == d:
            assert torch.all(out[a:b] == 0) and torch.all(torch.isneginf(lse[:, a:b]))
            continue
        alone = [t.detach()[None, rows].requires_grad_(True) for t, rows in ((q, slice(a, b)), (k, slice(c, d)),
                                                                             (v, slice(c, d)))]
        # the same kernel: automatic dispatch may send the sequence alone to hopper.fwd (d32 on the H200)
        o, l = flashrung.attention(*alone, causal=True, return_lse=True, impl="portable.fwd")
        o.backward(do[None, a:b])
        assert torch.equal(o[0], out[a:b]) and torch.equal(l[0], lse[:, a:b])
        assert torch.equal(alone[0].grad[0], leaves[0].grad[a:b])
    assert flashrung.last_dispatch("bwd").kernel == "portable.bwd"
    fn = flashrung.flash_attn_varlen_func
    assert torch.equal(fn(q, k, v, cu_q, cu_k, max_q, max_k, causal=True), out.detach())


def test_packed_sequences_trace_under_torch_compile():
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    f = lambda q, k, v: flashrung.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)  # noqa: E731
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, k, v), f(q, k, v))


def test_bad_packed_sequences_say_what_to_fix():
    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    call = flashrung.attention_varlen
    with pytest.raises(ValueError, match=r"q must have 3 dimensions \(total_q, heads_q, head_dim\)"):
        call(q[None], k, v, cu_q, cu_k, max_q, max_k)
    with pytest.raises(ValueError, match="cu_seqlens_q must be a 1-D torch.int32"):
        call(q, k, v, cu_q.long(), cu_k, max_q, max_k)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must start at 0, never decrease and end at the packed rows "
                                         r"\(60\)"):
        call(q, k, v, cu_q, cu_k.flip(0), max_q, max_k)
    with pytest.raises(ValueError, match="end at the packed rows"):
        call(q, k[:-1], v[:-1], cu_q, cu_k, max_q, max_k)
    with pytest.raises(ValueError, match=r"max_seqlen_q must be at least the longest sequence \(40\), got 39"):
        call(q, k, v, cu_q, cu_k, 39, max_k)
    with pytest.raises(ValueError, match="as many sequences"):
        call(q, k, v, cu_q, gate.cu_seqlens((20, 20, 20), DEVICE), max_q, max_k)
    with pytest.raises(ValueError, match="dropout_p"):
        flashrung.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.1)


def test_cu_seqlens_are_read_once_per_tensor_and_version(monkeypatch):
    # a pack reused unchanged is not copied to the host again (no wait for the GPU per call); a
    # change made in place, on the tensor or through a view, is read again and checked again
    from flashrung import inputs

    q, k, v, cu_q, cu_k, max_q, max_k = _packed()
    copies = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: copies.append(t.data_ptr()) or real(t))
    call = flashrung.attention_varlen
    first = call(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    assert sorted(copies) == sorted([cu_q.data_ptr(), cu_k.data_ptr()])
    assert torch.equal(call(q, k, v, cu_q, cu_k, max_q, max_k, causal=True), first) and len(copies) == 2
    cu_k[1:].sub_(1)                          # one key fewer in every sequence: ends short of the rows
    with pytest.raises(ValueError, match="cu_seqlens_k must start at 0, never decrease and end at the packed rows"):
        call(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    cu_k[1:].add_(1)
    cu_k[2:3].add_(40)                        # through a view: past sequence 2's end
    with pytest.raises(ValueError, match="never decrease"):
        call(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    cu_k[2:3].sub_(40)
    assert torch.equal(call(q, k, v, cu_q, cu_k, max_q, max_k, causal=True), first)
    assert inputs.host_offsets("cu_seqlens_k", cu_k) == tuple(real(cu_k))
    with torch.inference_mode():              # no version to follow: read every call
        cu_i = cu_q.clone()
        n = len(copies)
        inputs.host_offsets("cu_seqlens_q", cu_i), inputs.host_offsets("cu_seqlens_q", cu_i)
        assert len(copies) == n + 2


def test_a_dropped_cu_seqlens_leaves_the_host_cache():
    from flashrung import inputs

    cu = gate.cu_seqlens((3, 4), DEVICE)
    key = id(cu)
    assert inputs.host_offsets("cu_seqlens_q", cu) == (0, 3, 7) and key in inputs._HOST_OFFSETS
    del cu
    assert key not in inputs._HOST_OFFSETS


def test_fully_masked_rows_are_zero_with_minus_inf_lse():
    # causal with Sq > Sk: the first Sq - Sk queries see no key at all
    q, k, v = gate.random_inputs(gate.Case(1, 9, 4, 1, 1, 32, torch.float16, True), DEVICE)
    out, lse = flashrung.attention(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[:, :5] == 0) and torch.all(torch.isneginf(lse[..., :5]))
    assert torch.all(torch.isfinite(out[:, 5:])) and torch.all(torch.isfinite(lse[..., 5:]))


def test_a_backward_run_on_another_thread_is_the_last_backward_dispatch():
    # autograd runs a CUDA backward on a device thread of its own: the caller must still read which
    # kernel ran it (the bench records it per row); here the backward runs on a thread of the test's
    import threading

    # a shape no other test uses, so an earlier test's record cannot pass for this one
    q, k, v = (t.requires_grad_(True) for t in gate.random_inputs(gate.Case(1, 23, 29, 6, 3, 40, torch.float16,
                                                                             True), DEVICE))
    out = flashrung.attention(q, k, v, causal=True)
    worker = threading.Thread(target=lambda: out.float().sum().backward())
    worker.start()
    worker.join()
    assert q.grad is not None
    d = flashrung.last_dispatch("bwd")
    assert d is not None and d.kernel == "portable.bwd"
    assert (d.problem.seqlen_q, d.problem.seqlen_k, d.problem.heads_q, d.problem.head_dim) == (23, 29, 6, 40)


def test_autograd_gradients_pass_the_gate_including_lse_gradient():
    torch.manual_seed(1)
    q, k, v = gate.random_inputs(gate.Case(1, 21, 33, 4, 2, 32, torch.float32, True), DEVICE)
    w = torch.randn(1, 4, 21, device=DEVICE)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = flashrung.attention(*leaves, causal=True, return_lse=True)
    (out.square().sum() + (lse * w).sum()).backward()
    exact = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    o, l = reference._attention(*exact, True, None, torch.float64)
    (o.square().sum() + (l * w.double()).sum()).backward()
    for got, ref in zip(leaves, exact):
        assert gate.max_abs_diff(got.grad, ref.grad) < 1e-4
    assert flashrung.last_dispatch("bwd").kernel == "portable.bwd"


def test_torch_compile_traces_without_graph_breaks():
    q, k, v = qkv(D=32)

    def f(q, k, v):
        return flashrung.attention(q, k, v, causal=True) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, k, v), f(q, k, v))


def test_flash_attn_func_alias_and_unsupported_features():
    q, k, v = qkv()
    out = flashrung.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, flashrung.attention(q, k, v, causal=True))
    out2, lse, probs = flashrung.flash_attn_func(q, k, v, return_attn_probs=True)
    assert probs is None and lse.shape == (1, 2, 17)
    for kwargs, word in [({"dropout_p": 0.1}, "dropout_p"), ({"alibi_slopes": torch.ones(2)}, "alibi")]:
        with pytest.raises(ValueError, match=word):
            flashrung.flash_attn_func(q, k, v, **kwargs)
    # flash-attn's sliding window reaches the kernel, a list as well as a tuple
    assert torch.equal(flashrung.flash_attn_func(q, k, v, causal=True, window_size=[8, 0]),
                       flashrung.attention(q, k, v, causal=True, window_size=(8, 0)))
    assert torch.equal(flashrung.flash_attn_func(q, k, v, softcap=30.0), flashrung.attention(q, k, v, softcap=30.0))


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = qkv(D=64)
    assert torch.equal(flashrung.attention(q, k, v), flashrung.attention(q, k, v, softmax_scale=1 / math.sqrt(64)))


def test_impl_overrides_parse_and_are_refused_by_kernels_without_a_config():
    from flashrung import dispatch
    assert dispatch.parse_impl("hopper.fwd@pingpong=true, block_n=64") == (
        "hopper.fwd", {"pingpong": "true", "block_n": "64"})
    with pytest.raises(ValueError, match="key=value"):
        dispatch.parse_impl("hopper.fwd@pingpong")
    q, k, v = qkv()
    with pytest.raises(ValueError, match="no configuration overrides"):
        flashrung.attention(q, k, v, impl="portable.fwd@block_m=64")


def _backend(config_with, forward):
    """A kernel module for dispatch.Variant: these ``config_with`` and ``forward``, every problem runnable."""
    return type("Backend", (), {"config_with": staticmethod(config_with), "forward": staticmethod(forward),
                                "unsupported_reason": staticmethod(lambda problem: None)})


def test_a_variant_resolves_its_overrides_once_per_problem():
    # a variant (impl="name@key=value") must not carry a longer host path than the kernel it is
    # compared with: its overrides are parsed and checked once per problem, not on every call
    from flashrung import dispatch
    calls, forwards = [], []

    def config_with(problem, overrides):
        calls.append((problem, dict(overrides)))
        return ("config", tuple(sorted(overrides.items())))

    def forward(q, k, v, causal, scale, out=None, lse=None, config=None):
        forwards.append(config)
        return q

    variant = dispatch.Variant(_backend(config_with, forward), (("num_q_stages", "2"),))
    q, k, v = qkv()
    for _ in range(3):
        # dispatch asks whether the variant can run, then runs it: both on every call
        assert variant.unsupported_reason(dispatch.Problem.of(q, k, v, False)) is None
        variant.forward(q, k, v, False, 0.125)
    variant.forward(q, k, v, True, 0.125)       # another problem: resolved again
    assert len(calls) == 2 and calls[0][1] == {"num_q_stages": "2"}
    assert forwards == [("config", (("num_q_stages", "2"),))] * 4


def test_a_variant_passes_the_problems_score_options_and_packing_through():
    # impl="name@key=value" on a windowed, capped or packed problem: the variant's module gets the
    # window, the cap and the packing (a forward that did not take them raised TypeError), and
    # resolves its overrides on the problem they make (a packed one's sequences and longest lengths)
    from flashrung import dispatch
    problems, forwards = [], []

    def config_with(problem, overrides):
        problems.append(problem)
        return "config"

    def forward(q, k, v, causal, scale, out=None, lse=None, config=None, **options):
        forwards.append(options)
        return q

    variant = dispatch.Variant(_backend(config_with, forward), (("num_q_stages", "2"),))
    q, k, v = qkv()
    variant.forward(q, k, v, True, 0.125, window_size=(8, 0), softcap=30.0)
    assert forwards[-1] == {"window_size": (8, 0), "softcap": 30.0}
    assert problems[-1].window_size == (8, 0) and problems[-1].softcap == 30.0
    cu = torch.tensor([0, 3, q.shape[1]], dtype=torch.int32)
    variant.forward(q[:1], k[:1], v[:1], False, 0.125, cu_seqlens=(cu, cu), max_seqlens=(q.shape[1] - 3, 3))
    assert set(forwards[-1]) == {"cu_seqlens", "max_seqlens"}
    assert problems[-1].varlen and problems[-1].batch == 2 and problems[-1].seqlen_q == q.shape[1] - 3


def test_a_variant_with_a_bad_override_raises_on_every_call():
    from flashrung import dispatch

    def config_with(problem, overrides):
        raise ValueError(f"unknown field {sorted(overrides)}")

    module = type("Backend", (), {"config_with": staticmethod(config_with),
                                   "unsupported_reason": staticmethod(lambda problem: None)})
    variant = dispatch.Variant(module, (("no_such_field", "1"),))
    q, k, v = qkv()
    for _ in range(2):
        with pytest.raises(ValueError, match="no_such_field"):
            variant.unsupported_reason(dispatch.Problem.of(q, k, v, False))


def test_hopper_declines_layouts_tma_cannot_address_instead_of_copying():
    # a packed qkv view with a head dim of 72 elements (144 bytes: not a 16-byte multiple stride)
    # must fall back visibly to the portable kernel, not be copied behind the user's back
    import dataclasses
    from flashrung import dispatch
    from flashrung.kernels.hopper import fwd as hopper
    good = dispatch.Problem(1, 128, 128, 2, 2, 64, 64, torch.bfloat16, False, "cuda", (9, 0),
                            strides=((128 * 128, 128, 64, 1),) * 3, ptr_alignment=256)
    assert hopper.unsupported_reason(good) is None
    odd_stride = dataclasses.replace(good, strides=((128 * 3 * 68, 3 * 68, 68, 1),) * 3)
    assert "multiples of 8 elements" in hopper.unsupported_reason(odd_stride)
    misaligned = dataclasses.replace(good, ptr_alignment=2)
    assert "16-byte aligned" in hopper.unsupported_reason(misaligned)


def test_automatic_dispatch_runs_short_causal_d64_on_hopper_with_its_short_tile():
    # short causal d64 once went to portable.fwd (measured faster than the 192-row tile); the
    # 128-row short-causal tile beat it, so hopper.fwd keeps the problem and picks that tile
    import dataclasses
    from flashrung import dispatch
    from flashrung.kernels.hopper.config import select_config
    short = dispatch.Problem(2, 1024, 1024, 4, 4, 64, 64, torch.bfloat16, True, "cuda", (9, 0),
                             strides=((1024 * 4 * 64, 4 * 64, 64, 1),) * 3, ptr_alignment=256)
    module, d = dispatch.select(short, "fwd")
    assert d.kernel == "hopper.fwd" and not d.declined
    assert select_config(short).block_m == 128
    long = dataclasses.replace(short, seqlen_q=8192, seqlen_k=8192, strides=((8192 * 4 * 64, 4 * 64, 64, 1),) * 3)
    assert select_config(long).block_m == 192
    # non-causal d64 takes the 128-row tile only up to S1024 (config.SHORT_NONCAUSAL_MAX_SEQLEN)
    assert select_config(dataclasses.replace(short, causal=False)).block_m == 128
    mid = dataclasses.replace(short, seqlen_q=2048, seqlen_k=2048, causal=False,
                              strides=((2048 * 4 * 64, 4 * 64, 64, 1),) * 3)
    assert select_config(mid).block_m == 192


def _op_refuses(monkeypatch):
    """Make the custom op raise, so a test sees which path a call takes."""
    from flashrung import api

    def refuse(*args, **kwargs):
        raise AssertionError("went through the custom op")
    monkeypatch.setattr(api, "_attention_fwd", refuse)


def test_inference_calls_skip_the_op_and_return_what_it_returns():
    # a call nothing will differentiate, trace or intercept runs the same dispatch and kernel
    # without the op's host cost: same output, same lse, bit for bit
    from flashrung import api

    q, k, v = gate.random_inputs(gate.Case(1, 17, 1000, 4, 2, 32, torch.float16, True), DEVICE)
    direct = flashrung.attention(q, k, v, causal=True, return_lse=True)
    through = api._attention_fwd(q, k, v, True, 32 ** -0.5, "")
    assert torch.equal(direct[0], through[0]) and torch.equal(direct[1], through[1])
    with torch.no_grad():
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        assert torch.equal(flashrung.attention(*leaves, causal=True), direct[0])


def test_calls_autograd_compile_or_a_mode_must_see_take_the_op(monkeypatch):
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = qkv()
    _op_refuses(monkeypatch)
    flashrung.attention(q, k, v)                      # inference: direct
    with pytest.raises(AssertionError, match="custom op"):
        flashrung.attention(q.clone().requires_grad_(True), k, v)
    with pytest.raises(AssertionError, match="custom op"), FlopCounterMode(display=False):
        flashrung.attention(q, k, v)
    with pytest.raises(AssertionError, match="custom op"):
        torch.func.vmap(lambda x: flashrung.attention(x, k, v))(q.unsqueeze(0))
    monkeypatch.setattr(torch.jit, "is_tracing", lambda: True)
    with pytest.raises(AssertionError, match="custom op"):
        flashrung.attention(q, k, v)


def test_a_torch_without_the_private_queries_takes_the_op(monkeypatch):
    # the fast path asks torch whether a dispatch mode or functorch transform is active through
    # private functions; without them every call goes through the op (never the wrong way round)
    from flashrung import api

    monkeypatch.delattr(torch._C, "_len_torch_dispatch_stack")
    query = api._private_query("_len_torch_dispatch_stack")
    assert query() is True
    q, k, v = qkv()
    monkeypatch.setattr(api, "_len_dispatch_stack", query)
    _op_refuses(monkeypatch)
    with pytest.raises(AssertionError, match="custom op"):
        flashrung.attention(q, k, v)
