"""On a GPU: every automatic kernel, forward and backward, through the gate over the device
envelope (S in {1, 17, 1000, 4097, 16384}, Sq != Sk, GQA 8:1, d in {64, 128, 256}, causal and
not, fp16 and bf16), and the public API end to end."""
import pytest
import torch

import flashrung
from conftest import ORACLE_EXCLUSIVE_SCORE_BYTES
from flashrung import dispatch, gate

pytestmark = pytest.mark.gpu

CASES = gate.envelope("device")


def _problem(case):
    q, k, v = (torch.empty(0, device="cuda", dtype=case.dtype),) * 3
    return dispatch.Problem(case.batch, case.seqlen_q, case.seqlen_k, case.heads_q, case.heads_kv,
                            case.head_dim, case.head_dim, case.dtype, case.causal, "cuda",
                            torch.cuda.get_device_capability())


@pytest.mark.parametrize("backend", [b for b in dispatch.FORWARD_BACKENDS if b.auto], ids=lambda b: b.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label())
def test_forward_gate_on_device(backend, case):
    module = backend.load()
    reason = module.unsupported_reason(_problem(case))
    if reason is not None:
        pytest.skip(f"{backend.name}: {reason}")
    result = gate.check_forward_case(module.forward, case, "cuda", kernel=backend.name)
    assert result.passed, str(result)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label())
def test_backward_gate_on_device(case, request):
    if case.batch * case.heads_q * case.seqlen_q * case.seqlen_k * 4 > ORACLE_EXCLUSIVE_SCORE_BYTES:
        request.getfixturevalue("gpu_memory_turn")
    problem = _problem(case)
    fwd_module, _ = dispatch.select(problem, "fwd")
    bwd_module, d = dispatch.select(problem, "bwd")
    result = gate.check_backward(fwd_module.forward, bwd_module.backward, case, "cuda", kernel=d.kernel)
    assert result.passed, str(result)


# Beyond the envelope, at device sizes: v with its own head dim (MLA's), sliding windows with both
# edges masked over long key loops, a score cap — each through the kernels dispatch picks for it
SCORE_CASES = [
    gate.Case(1, 4097, 4097, 8, 1, 192, torch.bfloat16, True, head_dim_v=128),
    gate.Case(2, 1000, 1000, 4, 2, 64, torch.float16, False, head_dim_v=128),
    gate.Case(1, 4097, 4097, 8, 1, 128, torch.bfloat16, True, window_size=(256, 0)),
    gate.Case(1, 1000, 4097, 4, 4, 64, torch.float16, False, window_size=(1000, 700)),
    gate.Case(1, 4097, 4097, 8, 2, 128, torch.bfloat16, True, softcap=30.0),
    gate.Case(2, 1000, 1000, 4, 4, 256, torch.bfloat16, False, window_size=(128, -1), softcap=5.0),
]


@pytest.mark.parametrize("case", SCORE_CASES, ids=lambda c: c.label())
def test_value_head_dims_windows_and_caps_on_device(case):
    problem = dispatch.Problem(case.batch, case.seqlen_q, case.seqlen_k, case.heads_q, case.heads_kv, case.head_dim,
                               case.value_head_dim, case.dtype, case.causal, "cuda", torch.cuda.get_device_capability(),
                               window_size=case.window_size, softcap=case.softcap)
    fwd_module, fwd_dispatch = dispatch.select(problem, "fwd")
    bwd_module, bwd_dispatch = dispatch.select(problem, "bwd")
    result = gate.check_forward_case(fwd_module.forward, case, "cuda", kernel=fwd_dispatch.kernel)
    assert result.passed, str(result)
    result = gate.check_backward(fwd_module.forward, bwd_module.backward, case, "cuda", kernel=bwd_dispatch.kernel)
    assert result.passed, str(result)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim, dtype", [(128, torch.bfloat16), (64, torch.float16)])
def test_packed_sequences_on_device(head_dim, dtype, causal):
    # packed sequences at device sizes through the kernels dispatch picks for them: long and short
    # sequences, Sq ≠ Sk within the pack, an empty query range and an empty key range
    varlen = ((1000, 4097, 17, 0, 300), (1000, 4097, 3000, 5, 0))
    case = gate.Case(len(varlen[0]), 4097, 4097, 8, 2, head_dim, dtype, causal, varlen=varlen)
    problem = dispatch.Problem(case.batch, case.seqlen_q, case.seqlen_k, case.heads_q, case.heads_kv, head_dim,
                               head_dim, dtype, causal, "cuda", torch.cuda.get_device_capability(), varlen=True)
    fwd_module, fwd_dispatch = dispatch.select(problem, "fwd")
    bwd_module, _ = dispatch.select(problem, "bwd")
    result = gate.check_varlen(fwd_module.forward, bwd_module.backward, case, "cuda", kernel=fwd_dispatch.kernel)
    assert result.passed, str(result)


def test_api_on_device_dispatches_and_differentiates():
    q, k, v = gate.random_inputs(gate.Case(2, 1000, 1000, 8, 1, 128, torch.bfloat16, True), "cuda")
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    out = flashrung.attention(*leaves, causal=True)
    out.float().square().sum().backward()
    assert flashrung.last_dispatch().kernel in dispatch.names("fwd")
    assert all(torch.isfinite(t.grad).all() for t in leaves)


def test_api_same_input_twice_is_bit_identical():
    q, k, v = gate.random_inputs(gate.Case(2, 4097, 4097, 16, 2, 128, torch.bfloat16, True), "cuda")
    a = flashrung.attention(q, k, v, causal=True)
    b = flashrung.attention(q, k, v, causal=True)
    assert torch.equal(a, b), f"{flashrung.last_dispatch()} is not deterministic: a race?"



@pytest.mark.parametrize("impl", ["portable.fwd", None], ids=["portable", "auto"])
def test_tensors_past_two_to_the_31_elements_on_device(impl, gpu_memory_turn):
    # q, out, dout and dq of 2**31 + 2**18 elements each (4 GiB in bf16): the last rows' offsets need
    # 64 bits. The last 4096 query rows repeat the first 4096 (both tile-aligned, non-causal, one K/V),
    # so they must come out the same: bit for bit where each row is computed alone (the portable
    # kernels, dq), within two bf16 ulps on dispatch's kernel, whose split tail may sum the last
    # tiles' rows in another order. A wrapped offset reads other rows and misses by far more.
    rows, tail, heads = 2**20 + 256, 4096, 16
    q = torch.randn(1, rows, heads, 128, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(1, 256, 2, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    do = torch.randn_like(q)
    q[:, -tail:], do[:, -tail:] = q[:, :tail], do[:, :tail]
    leaf = q.requires_grad_(True)
    out, lse = flashrung.attention(leaf, k, v, impl=impl, return_lse=True)
    kernel = flashrung.last_dispatch().kernel
    out.backward(do)
    for name, tensor, rows_dim in (("out", out, 1), ("lse", lse, 2), ("dq", leaf.grad, 1)):
        last, first = tensor.narrow(rows_dim, rows - tail, tail), tensor.narrow(rows_dim, 0, tail)
        if kernel.startswith("portable"):
            assert torch.equal(last, first), f"{kernel}: the last rows' {name} differ from the first rows'"
        else:   # dq too: its delta = rowsum(dout ∘ out) carries out's rounding
            tolerance = 1e-5 if name == "lse" else 2**-7
            torch.testing.assert_close(last, first, rtol=tolerance, atol=tolerance, msg=f"{kernel}: {name}")
