"""Edge cases of the ``neuron`` fallback that PyTorch's OpInfo database found: lazily
conjugated and negated tensors, Python numbers for Tensor arguments, mixed-device index
ops, fused CPU kernels, and layouts the device does not hold."""

import pytest
import torch

import trnsim  # registers neuron
from trnsim.backend import storage

DEV = "neuron"


def _pair(*shape, dtype=torch.complex64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, dtype=dtype, generator=g)
    return x, x.to(DEV)


def _same(n: torch.Tensor, c: torch.Tensor) -> None:
    assert n.device.type == DEV
    torch.testing.assert_close(n.cpu().resolve_conj().resolve_neg(), c.resolve_conj().resolve_neg())


# -- conjugate and negative bits ---------------------------------------------

def test_a_conjugate_view_copies_clones_and_computes():
    x, xn = _pair(4)
    _same(xn.conj().clone(), x.conj())
    _same(xn.conj() * 2, x.conj() * 2)
    _same(xn.conj().imag * 1, x.conj().imag * 1)
    torch.testing.assert_close(xn.conj().cpu(), x.conj())


def test_ops_that_read_the_conjugate_bit_themselves_get_it():
    (a, an), (b, bn) = _pair(3, 3, seed=1), _pair(3, 3, seed=2)
    _same(torch.mm(an.mH, bn), torch.mm(a.mH, b))
    _same(torch.dot(an[0].conj(), bn[0]), torch.dot(a[0].conj(), b[0]))


def test_writes_through_conjugate_and_negative_views_land_in_device_memory():
    x, xn = _pair(4)
    xn.conj().mul_(2)
    x.conj().mul_(2)
    xn.conj().imag.add_(1)
    x.conj().imag.add_(1)
    _same(xn, x)


def test_fft_results_that_are_conjugate_views():
    x, xn = _pair(6, dtype=torch.float32)
    _same(torch.fft.ihfft(xn), torch.fft.ihfft(x))
    c, cn = _pair(5)
    _same(torch.fft.ifft(cn), torch.fft.ifft(c))
    _same(torch.fft.hfft(cn), torch.fft.hfft(c))


# -- autograd's zero tensors ---------------------------------------------------

def test_efficient_zero_tensors_are_real_zeros_on_the_device():
    z = torch._efficientzerotensor([2, 3], dtype=torch.float16, device=DEV)
    assert (z.device.type, z.dtype, z.shape) == (DEV, torch.float16, (2, 3))
    assert torch.equal(z.cpu(), torch.zeros(2, 3, dtype=torch.float16))


def test_sgn_backward_of_a_real_tensor():
    x = torch.randn(5).to(DEV).requires_grad_()
    (g,) = torch.autograd.grad(torch.sgn(x), x, torch.ones(5, device=DEV))
    assert g.device.type == DEV and torch.equal(g.cpu(), torch.zeros(5))


# -- Python numbers for Tensor arguments ----------------------------------------

def test_take_along_dim_whose_kernel_passes_a_wrapped_number():
    g = torch.Generator().manual_seed(0)
    x, i = torch.randn(3, 4, generator=g), torch.randint(0, 4, (3, 2), generator=g)
    got = torch.take_along_dim(x.to(DEV), i.to(DEV), 1)
    assert got.device.type == DEV and torch.equal(got.cpu(), torch.take_along_dim(x, i, 1))


def test_take_along_dim_in_timing_fidelity():
    from trnsim.backend import state

    before = state.fidelity()
    trnsim.set_fidelity("timing")
    try:
        x = torch.empty(3, 4, device=DEV)
        i = torch.empty(3, 2, dtype=torch.long, device=DEV)
        assert torch.take_along_dim(x, i, 1).shape == (3, 2)
    finally:
        trnsim.set_fidelity(before)


def test_wrapped_numbers_keep_their_dtype_unless_that_would_change_promotion():
    from trnsim.backend.edge_ops import wrap_numbers

    add = torch.ops.aten.add.Tensor
    (_, w), _ = wrap_numbers(add, (torch.ones(2, dtype=torch.bfloat16), 0.1), {})
    assert w.dtype == torch.float64 and w.item() == 0.1   # not rounded to bf16
    (_, w), _ = wrap_numbers(add, (torch.tensor(1, dtype=torch.int32), 2.5), {})
    assert w.dtype == torch.float32                       # as a wrapped float would promote
    (_, w), _ = wrap_numbers(add, (torch.tensor(1, dtype=torch.int32), 2), {})
    assert w.dtype == torch.int32
    assert wrap_numbers(add, (torch.ones(2), torch.ones(2)), {"alpha": 2}) is None


# -- CPU index tensors beside neuron tensors -------------------------------------

def test_index_out_takes_a_cpu_index_as_on_cuda():
    x = torch.arange(12.0).reshape(3, 4)
    idx = torch.tensor([2, 0])
    out = torch.empty(2, 4, device=DEV)
    torch.ops.aten.index.Tensor_out(x.to(DEV), [idx], out=out)
    assert torch.equal(out.cpu(), x[idx])


def test_index_put_backward_with_a_cpu_index():
    x = torch.zeros(4, 3, device=DEV, requires_grad=True)
    v = torch.ones(2, 3, device=DEV, requires_grad=True)
    idx = torch.tensor([3, 1])
    y = x.index_put((idx,), v)
    gx, gv = torch.autograd.grad(y, (x, v), torch.arange(12.0).reshape(4, 3).to(DEV))
    assert torch.equal(gv.cpu(), torch.arange(12.0).reshape(4, 3)[idx])
    assert torch.equal(gx.cpu()[idx], torch.zeros(2, 3))


# -- fused CPU kernels ----------------------------------------------------------

_BF16_CASES = {
    "layer_norm": (((16, 64), (64,), (64,)), lambda x, w, b: torch.nn.functional.layer_norm(x, (64,), w, b)),
    "group_norm": (((4, 8, 32), (8,), (8,)), lambda x, w, b: torch.nn.functional.group_norm(x, 2, w, b)),
    "addr": (((32, 32), (32,), (32,)), lambda m, u, v: torch.addr(m, u, v, beta=0.5, alpha=3.0)),
}


@pytest.mark.parametrize("name", sorted(_BF16_CASES))
def test_bf16_norms_and_addr_round_as_the_cpu_kernel_does(name):
    shapes, fn = _BF16_CASES[name]
    g = torch.Generator().manual_seed(3)
    args = [(torch.randn(*s, generator=g) * 4 + 3).to(torch.bfloat16) for s in shapes]
    got = fn(*(a.to(DEV) for a in args))
    assert got.device.type == DEV and torch.equal(got.cpu(), fn(*args))


# -- sparse layouts ---------------------------------------------------------------

def _sparse_input():
    g = torch.Generator().manual_seed(5)
    d = torch.rand(4, 5, generator=g)
    d[d < 0.5] = 0
    return d, torch.randn(5, 3, generator=g)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_compressed_tensors_live_on_the_device_and_compute_as_on_the_cpu():
    d, b = _sparse_input()
    s = d.to(DEV).to_sparse_csr()
    assert (s.device.type, s.layout) == (DEV, torch.sparse_csr)
    assert s.values().device.type == DEV
    assert torch.equal(s.crow_indices().cpu(), d.to_sparse_csr().crow_indices())
    _same(s @ b.to(DEV), d.to_sparse_csr() @ b)
    _same(torch.sparse.mm(s, b.to(DEV), "sum"), torch.sparse.mm(d.to_sparse_csr(), b, "sum"))
    assert torch.equal(d.to(DEV).to_sparse_bsr((2, 1)).to_dense().cpu(), d)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_mm_amax_backward_on_compressed_tensors():
    d, b = _sparse_input()
    grads = []
    for dev in ("cpu", DEV):
        a = d.to(dev).to_sparse_csr().requires_grad_()
        w = b.to(dev).requires_grad_()
        y = torch.sparse.mm(a, w, "amax")
        grads.append(torch.autograd.grad(y, (a, w), torch.ones(4, 3, device=dev)))
    (ca, cw), (na, nw) = grads
    assert na.layout == torch.sparse_csr and nw.device.type == DEV
    assert torch.equal(na.to_dense().cpu(), ca.to_dense()) and torch.equal(nw.cpu(), cw)


def test_to_sparse_coo_raises_a_clear_error_not_a_cpu_tensor():
    with pytest.raises(NotImplementedError, match="sparse COO tensors are not supported on neuron"):
        torch.ones(2, 2, device=DEV).to_sparse()


# -- copies to the CPU -----------------------------------------------------------

def test_non_blocking_copy_to_the_cpu_needs_no_pinned_allocator():
    x = torch.arange(6.0).to(DEV)
    y = x.to("cpu", non_blocking=True)
    assert y.device.type == "cpu" and torch.equal(y, torch.arange(6.0))


def test_copy_to_the_cpu_in_timing_fidelity_says_there_are_no_values():
    from trnsim.backend import state

    before = state.fidelity()
    trnsim.set_fidelity("timing")
    try:
        x = torch.empty(4, device=DEV)
        assert x.to(torch.bfloat16).dtype == torch.bfloat16
        for non_blocking in (False, True):
            with pytest.raises(RuntimeError, match="no values"):
                x.to("cpu", non_blocking=non_blocking)
    finally:
        trnsim.set_fidelity(before)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_ops_leave_cached_dense_aliases_as_they_were():
    d, b = _sparse_input()
    w = b.to(DEV).requires_grad_()
    with torch.inference_mode():
        w * 2                  # caches an alias of w made in inference mode
    s = d.to(DEV).to_sparse_csr()
    _same(s @ w, d.to_sparse_csr() @ b)
    assert not storage.host_alias(w).requires_grad


# -- recurrent layers: fused cells that only CUDA has kernels for ------------------

@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("make", [lambda b: torch.nn.LSTM(8, 16, num_layers=2, batch_first=True, bias=b),
                                  lambda b: torch.nn.GRU(8, 16, num_layers=2, batch_first=True, bias=b),
                                  lambda b: torch.nn.LSTMCell(8, 16, bias=b), lambda b: torch.nn.GRUCell(8, 16, bias=b)],
                         ids=["LSTM", "GRU", "LSTMCell", "GRUCell"])
def test_recurrent_layers_and_their_gradients_match_the_cpu(make, bias):
    torch.manual_seed(0)
    cpu = make(bias)
    dev = make(bias)
    dev.load_state_dict(cpu.state_dict())
    dev.to(DEV)
    x = torch.randn(3, 5, 8) if isinstance(cpu, torch.nn.RNNBase) else torch.randn(3, 8)
    xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    outs = []
    for model, inp in ((cpu, xc), (dev, xd)):
        y = model(inp)
        y = y[0] if isinstance(y, tuple) else y
        (y.square().sum() + y.sum()).backward()
        outs.append(y)
    torch.testing.assert_close(outs[1].cpu(), outs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_recurrent_layers_in_timing_fidelity():
    from trnsim.backend import state

    before = state.fidelity()
    trnsim.set_fidelity("timing")
    try:
        for layer in (torch.nn.LSTM(8, 16), torch.nn.GRU(8, 16)):
            y = layer.to(DEV)(torch.empty(5, 3, 8, device=DEV))[0]
            y.sum().backward()
            assert y.shape == (5, 3, 16) and layer.weight_hh_l0.grad.shape == layer.weight_hh_l0.shape
    finally:
        trnsim.set_fidelity(before)
