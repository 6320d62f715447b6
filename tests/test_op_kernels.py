"""The op kernels the PyTorch backend times aten ops with: each against a float64 numpy
reference in fp32 and bf16 on ragged shapes, traced from zero-memory placeholder
arrays (as the backend traces them) in instruction counts that follow the work, and
with a simulated latency that is positive and the same on every run."""

import math

import numpy as np
import pytest
import torch

import trnsim.nki as nki
from trnsim.kernels.backward import activation_backward_kernel, layernorm_backward_kernel, softmax_backward_kernel
from trnsim.kernels.conv import conv2d_kernel
from trnsim.kernels.elementwise import (
    binary_kernel,
    cast_kernel,
    clamp_kernel,
    cumsum_kernel,
    fill_kernel,
    fused_adamw_kernel,
    scalar_kernel,
    unary_kernel,
)
from trnsim.kernels.gather import embedding_backward_kernel, embedding_kernel
from trnsim.kernels.gemm import matmul_general, matmul_rows
from trnsim.kernels.loss import nll_loss_backward_kernel, nll_loss_kernel
from trnsim.kernels.movement import concat_kernel, upsample_nearest2d_kernel
from trnsim.kernels.norms import groupnorm_kernel
from trnsim.kernels.reduce import log_softmax_kernel, reduce_kernel
from trnsim.nki import KernelError
from trnsim.nki.hazards import Region, RowIndexedRegionList
from trnsim.testing import assert_kernel_matches

DTYPES = (torch.float32, torch.bfloat16)
IDS = ["fp32", "bf16"]
RAGGED = [(130, 700), (1, 1), (257, 3000)]


def arrays(seed, dtype, *shapes, scale=1.0, shift=0.0, positive=False):
    """Seeded normal arrays as kernel arguments: numpy fp32, or torch bf16 tensors."""
    rng = np.random.default_rng(seed)
    out = []
    for shape in shapes:
        a = rng.standard_normal(shape) * scale + shift
        a = (np.abs(a) + 0.5 if positive else a).astype(np.float32)
        out.append(a if dtype is torch.float32 else torch.from_numpy(a).to(dtype))
    return out


def placeholder(*shape, dtype=np.float32):
    """A zero-memory array of ``shape``: what the backend traces kernels with."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def assert_dtype(out, dtype):
    """``out`` holds values of ``dtype`` (numpy has no bf16, so bf16 comes back as fp32 values)."""
    if dtype is torch.bfloat16:
        np.testing.assert_array_equal(torch.from_numpy(out).to(torch.bfloat16).float().numpy(), out)


# -- float64 references ------------------------------------------------------

def _erf(z):
    return np.vectorize(math.erf)(z)


UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda z: 1 / np.sqrt(z), "reciprocal": lambda z: 1 / z,
    "tanh": np.tanh, "sigmoid": lambda z: 1 / (1 + np.exp(-z)), "relu": lambda z: np.maximum(z, 0),
    "gelu": lambda z: 0.5 * z * (1 + _erf(z / math.sqrt(2))), "silu": lambda z: z / (1 + np.exp(-z)),
    "square": np.square, "abs": np.abs, "identity": lambda z: z,
}
POSITIVE_ONLY = {"log", "sqrt", "rsqrt", "reciprocal"}
BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
          "maximum": np.maximum, "minimum": np.minimum}
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}


def unary_reference(op, scale):
    return lambda x, *_: UNARY[op](x * scale)


def adamw_reference(p, g, m, v, lr, beta1, beta2, eps, wd, step):
    p = p * (1 - lr * wd)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    denom = np.sqrt(v / (1 - beta2 ** step)) + eps
    return p - lr / (1 - beta1 ** step) * m / denom, m, v


def log_softmax_reference(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def groupnorm_reference(x, gamma, beta, groups, eps):
    def t(a):
        return None if a is None else torch.from_numpy(a)

    return torch.nn.functional.group_norm(t(x), groups, t(gamma), t(beta), eps).numpy()


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def _gelu_tanh_dx(z):
    k, a = math.sqrt(2 / math.pi), 0.044715
    t = np.tanh(k * (z + a * z ** 3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * a * z * z)


# op -> (f' from the saved tensor, the saved tensor from the forward's input)
ACTIVATION_BACKWARD = {
    "threshold": (lambda s: (s > 0.25) * 1.0, lambda z: z),
    "gelu": (lambda z: 0.5 * (1 + _erf(z / math.sqrt(2))) + z * np.exp(-z * z / 2) / math.sqrt(2 * math.pi),
             lambda z: z),
    "gelu_tanh": (_gelu_tanh_dx, lambda z: z),
    "silu": (lambda z: _sigmoid(z) * (1 + z * (1 - _sigmoid(z))), lambda z: z),
    "sigmoid": (lambda y: y * (1 - y), _sigmoid),
    "tanh": (lambda y: 1 - y * y, np.tanh),
}


def softmax_backward_reference(g, y, log):
    if log:
        return g - np.exp(y) * g.sum(axis=-1, keepdims=True)
    return y * (g - (g * y).sum(axis=-1, keepdims=True))


def layernorm_backward_reference(g, x, mean, rstd, gamma, *_):
    xhat = (x - mean.reshape(-1, 1)) * rstd.reshape(-1, 1)
    gh = g * gamma
    dx = rstd.reshape(-1, 1) * (gh - gh.mean(-1, keepdims=True) - xhat * (gh * xhat).mean(-1, keepdims=True))
    return dx, (g * xhat).sum(0), g.sum(0)


def _nll_rows(target, weight, ignore_index):
    """Each row's target (ignored rows pointing at class 0) and weight (0 where ignored)."""
    t = target.astype(np.int64)
    keep = t != ignore_index
    t = np.where(keep, t, 0)
    return t, (weight[t] if weight is not None else 1.0) * keep


def nll_loss_reference(log_probs, target, weight, reduction, ignore_index, _):
    t, w = _nll_rows(target, weight, ignore_index)
    loss = -w * log_probs[np.arange(len(t)), t]
    if reduction == "none":
        return loss, np.zeros((1, 1))
    total = loss.sum() / (w.sum() if reduction == "mean" else 1.0)
    return np.full((1, 1), total), np.full((1, 1), w.sum())


def nll_loss_backward_reference(grad, log_probs, target, weight, reduction, ignore_index, total_weight, _):
    t, w = _nll_rows(target, weight, ignore_index)
    out = np.zeros_like(log_probs)
    value = -w * grad.reshape(-1) / (total_weight.reshape(()) if reduction == "mean" else 1.0)
    kept = target != ignore_index
    out[np.arange(len(t))[kept], t[kept]] = np.broadcast_to(value, t.shape)[kept]
    return out


def embedding_backward_reference(grad, indices, num_weights, padding_idx, _):
    out = np.zeros((num_weights, grad.shape[-1]))
    idx = indices.astype(np.int64).ravel()
    np.add.at(out, idx[idx != padding_idx], grad.reshape(len(idx), -1)[idx != padding_idx])
    return out


def matmul_reference(lhsT, rhs):
    return np.swapaxes(lhsT, -1, -2) @ rhs


def conv_reference(x, w, stride, padding):
    xt = torch.from_numpy(x)
    out = torch.nn.functional.conv2d(xt if x.ndim == 4 else xt[None], torch.from_numpy(w), stride=stride, padding=padding)
    return (out if x.ndim == 4 else out[0]).numpy()


# -- elementwise ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", UNARY)
def test_unary(op, dtype):
    (x,) = arrays(20, dtype, (130, 700), positive=op in POSITIVE_ONLY)
    assert_dtype(assert_kernel_matches(unary_kernel, unary_reference(op, 1.0), x, op), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", RAGGED + [(3, 5, 7)])
def test_unary_shapes_and_scale(shape, dtype):
    (x,) = arrays(21, dtype, shape)
    assert_dtype(assert_kernel_matches(unary_kernel, unary_reference("tanh", -0.5), x, "tanh", -0.5), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", BINARY)
def test_binary(op, dtype):
    x, y = arrays(22, dtype, (130, 700), (130, 700), positive=op == "divide")
    assert_dtype(assert_kernel_matches(binary_kernel, lambda a, b, _: BINARY[op](a, b), x, y, op), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("x_shape, y_shape", [
    ((1, 1), (1, 1)), ((257, 3000), (257, 3000)), ((70, 10), (700,)),  # same size, flat
    ((130, 700), (700,)), ((1000, 30), (30,)), ((300, 5000), (1, 5000)), ((2, 130, 9), (9,)),  # rows
    ((130, 700), (130, 1)), ((5, 1), (5, 1))])  # columns
def test_binary_broadcasts(x_shape, y_shape, dtype):
    x, y = arrays(23, dtype, x_shape, y_shape)
    def expected(a, b, _):
        return a - (b.reshape(a.shape) if b.size == a.size else b)

    assert_dtype(assert_kernel_matches(binary_kernel, expected, x, y, "subtract"), dtype)


def test_binary_refuses_shapes_it_cannot_broadcast():
    x, y = arrays(24, torch.float32, (130, 700), (7, 1))
    with pytest.raises(KernelError, match=r"y \[7, 1\] neither matches x \[130, 700\]"):
        nki.trace_program(binary_kernel, x, y)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("op, value, reverse, expected", [
    ("add", 1.5, False, lambda x: x + 1.5), ("multiply", -3.0, False, lambda x: x * -3.0),
    ("subtract", 2.0, True, lambda x: 2.0 - x), ("divide", 4.0, True, lambda x: 4.0 / x),
    ("maximum", 0.25, False, lambda x: np.maximum(x, 0.25))])
@pytest.mark.parametrize("shape", [(130, 700), (1, 1)])
def test_scalar(shape, op, value, reverse, expected, dtype):
    (x,) = arrays(25, dtype, shape, positive=op == "divide")
    out = assert_kernel_matches(scalar_kernel, lambda a, *_: expected(a), x, op, value, reverse)
    assert_dtype(out, dtype)


@pytest.mark.parametrize("src, dst", [(torch.float32, "bfloat16"), (torch.bfloat16, "float32"),
                                      (torch.float32, "float32"), (torch.bfloat16, "bfloat16")])
@pytest.mark.parametrize("shape", RAGGED)
def test_cast_rounds_to_nearest_even(shape, src, dst):
    (x,) = arrays(26, src, shape, scale=100.0)
    expected = torch.as_tensor(x).to(getattr(torch, dst)).float().numpy()
    # torch tensors in give torch tensors out (bf16 ones numpy cannot hold)
    np.testing.assert_array_equal(torch.as_tensor(cast_kernel(x, dst)).float().numpy(), expected)


def test_a_copy_is_one_dma():
    program = nki.trace_program(cast_kernel, placeholder(4096, 4096), "float32")
    assert [i.opcode for i in program] == ["dma_copy"]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(130, 700), (1, 1), (3, 5, 7)])
def test_fused_adamw(shape, dtype):
    p, g, m = arrays(27, dtype, shape, shape, shape)
    (v,) = arrays(28, dtype, shape, positive=True)
    outs = assert_kernel_matches(fused_adamw_kernel, adamw_reference, p, g, m, v, 1e-2, 0.9, 0.999, 1e-8, 0.1, 3)
    for out in outs:
        assert_dtype(out, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", RAGGED + [(3, 5, 7)])
def test_fill(shape, dtype):
    out = np.asarray(torch.as_tensor(fill_kernel(shape, -2.5, dtype)).float())
    np.testing.assert_array_equal(out, np.full(shape, -2.5, np.float32))
    assert [i.opcode for i in nki.trace_program(fill_kernel, (256, 4096), 0.0, "float32")].count("memset") == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(130, 70), (1, 1), (3, 5, 7), (300, 17)])
def test_cumsum(shape, dtype):
    (x,) = arrays(36, dtype, shape)
    out = assert_kernel_matches(cumsum_kernel, lambda a: np.cumsum(a, axis=-1), x)
    assert_dtype(out, dtype)


def test_cumsum_refuses_rows_longer_than_a_tile():
    with pytest.raises(KernelError, match="longer than 4096"):
        nki.trace_program(cumsum_kernel, placeholder(2, 5000))


@pytest.mark.parametrize("call, kernel", [
    (lambda x: x.clamp(-0.5, 0.5), "clamp_kernel"), (lambda x: x.clamp_min(0.1), "clamp_kernel"),
    (lambda x: torch.isnan(x), "binary_kernel[not_equal]"), (lambda x: x.cumsum(-1), "cumsum_kernel"),
    (lambda x: x.zero_(), "fill_kernel"), (lambda x: torch.full((9, 9), 3.0, device="neuron"), "fill_kernel"),
    (lambda x: torch._foreach_norm([x, x[:3]]), "reduce_kernel[sum] x2"),
    (lambda x: torch.linalg.vector_norm(x, 2, dim=1), "reduce_kernel[sum]")])
def test_trainer_ops_are_timed_by_kernels(call, kernel):
    import trnsim

    x = torch.randn(64, 300).to("neuron")
    with trnsim.profile() as prof:
        call(x)
    (row,) = [r for r in prof.summary() if r.source != "none"]
    assert (row.source, row.kernel) == ("kernel", kernel)


def test_cumsum_along_another_axis_is_estimated():
    import trnsim

    x = torch.randn(64, 300).to("neuron")
    with trnsim.profile() as prof:
        y = x.cumsum(0)
    assert [r.source for r in prof.summary()] == ["estimate"]
    torch.testing.assert_close(y.cpu(), x.cpu().cumsum(0))


# -- reductions and norms --------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("shape", RAGGED + [(1000, 7), (300, 5000), (3, 20000), (2, 9000), (2, 3, 50)])
def test_reduce(shape, op, dtype):
    (x,) = arrays(29, dtype, shape, shift=0.5)
    out = assert_kernel_matches(reduce_kernel, lambda a, _: REDUCE[op](a, axis=-1, keepdims=True), x, op)
    assert out.shape == shape[:-1] + (1,)
    assert_dtype(out, dtype)


def test_reduce_spreads_a_few_long_rows_over_the_partitions():
    program = nki.trace_program(reduce_kernel, placeholder(1, 10**7), "sum")
    assert max(i.writes()[0].partitions for i in program if i.opcode == "tensor_reduce") == 128
    assert len(program) < 50


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", RAGGED + [(3, 9000), (2, 17000), (2, 3, 40)])
def test_log_softmax(shape, dtype):
    (x,) = arrays(30, dtype, shape, scale=3.0)
    assert_dtype(assert_kernel_matches(log_softmax_kernel, log_softmax_reference, x), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape, groups, affine", [
    ((2, 6, 5, 7), 3, True), ((2, 130, 70), 13, True), ((1, 4, 80, 80), 1, True), ((1, 2, 130, 130), 2, False),
    ((3, 8), 4, True)])
def test_groupnorm(shape, groups, affine, dtype):
    x, gamma, beta = arrays(31, dtype, shape, shape[1:2], shape[1:2], scale=2.0, shift=0.5)
    args = (x, gamma, beta) if affine else (x, None, None)
    assert_dtype(assert_kernel_matches(groupnorm_kernel, groupnorm_reference, *args, groups, 1e-5), dtype)


# -- backward of activations, softmax and norms -------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", ACTIVATION_BACKWARD)
@pytest.mark.parametrize("shape", [(130, 700), (3, 5, 7)])
def test_activation_backward(shape, op, dtype):
    derivative, forward = ACTIVATION_BACKWARD[op]
    g, x = arrays(54, torch.float32, shape, shape, scale=2.0)
    saved = forward(x.astype(np.float64)).astype(np.float32)
    g, saved = (a if dtype is torch.float32 else torch.from_numpy(a).to(dtype) for a in (g, saved))
    out = assert_kernel_matches(activation_backward_kernel, lambda a, s, *_: a * derivative(s), g, saved, op, 0.25)
    assert_dtype(out, dtype)


def test_activation_backward_refuses_unknown_ops():
    g, x = arrays(55, torch.float32, (4, 4), (4, 4))
    with pytest.raises(KernelError, match="op 'elu' is not one of threshold, gelu"):
        nki.trace_program(activation_backward_kernel, g, x, "elu")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(130, 700), (1, 1), (3, 9000), (2, 3, 40)])
def test_softmax_backward(shape, log, dtype):
    g, x = arrays(56, torch.float32, shape, shape, scale=2.0)
    y = torch.from_numpy(x).double()
    y = (torch.log_softmax(y, -1) if log else torch.softmax(y, -1)).float()
    g, y = (torch.from_numpy(g).to(dtype), y.to(dtype)) if dtype is not torch.float32 else (g, y.numpy())
    assert_dtype(assert_kernel_matches(softmax_backward_kernel, softmax_backward_reference, g, y, log), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(130, 700), (257, 3000), (1, 5)])  # 3000: sums leave PSUM for SBUF
def test_layernorm_backward(shape, dtype):
    n, d = shape
    g, x, gamma = arrays(57, dtype, shape, shape, (d,), scale=2.0, shift=0.5)
    xf = torch.as_tensor(x).double()
    mean = xf.mean(-1)
    rstd = 1 / torch.sqrt(xf.var(-1, unbiased=False) + 1e-5)
    outs = assert_kernel_matches(layernorm_backward_kernel, layernorm_backward_reference, g, x, mean.float().numpy(),
                                 rstd.float().numpy(), gamma)
    for out in outs:
        assert_dtype(out, dtype)


@pytest.mark.parametrize("need_input, need_weight, need_bias, with_gamma, outputs", [
    (True, False, False, True, 1), (False, True, True, True, 2), (True, True, True, False, 2)])
def test_layernorm_backward_computes_what_the_mask_asks(need_input, need_weight, need_bias, with_gamma, outputs):
    args = (placeholder(130, 64), placeholder(130, 64), placeholder(130), placeholder(130),
            placeholder(64) if with_gamma else None)
    traced = layernorm_backward_kernel.trace(*args, need_input=need_input, need_weight=need_weight,
                                             need_bias=need_bias)
    assert len(traced.output_tensors) == outputs
    # the weight and bias gradients are column sums on the PE array (a broadcast of gamma
    # streams one partition through it too)
    sums = [i for i in traced.tracer.program if i.opcode == "multiply_moving" and i.src.partitions > 1]
    assert bool(sums) == (need_weight or need_bias)


# -- matmul, gather, conv, movement ------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("lhs_shape, rhs_shape", [
    ((1, 1), (1, 1)), ((3, 5), (3, 7)), ((130, 257), (130, 700)), ((1100, 130), (1100, 1500)),
    ((3, 70, 40), (70, 90)), ((2, 130, 20), (2, 130, 600)),
    ((300, 3), (300, 2500))])  # lhsT kept in SBUF while two wide N blocks stream past
def test_matmul_general(lhs_shape, rhs_shape, dtype):
    lhsT, rhs = arrays(32, dtype, lhs_shape, rhs_shape)
    assert_dtype(assert_kernel_matches(matmul_general, matmul_reference, lhsT, rhs), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("lhs_shape, rhs_shape", [
    ((1, 1), (1, 1)), ((5, 3), (3, 7)), ((257, 130), (130, 700)), ((130, 1100), (1100, 1500)),
    ((3, 40, 70), (70, 90)), ((2, 20, 130), (2, 130, 600)), ((1, 768), (768, 2500)),
    ((3, 300), (300, 2500))])  # the transposed panel kept in SBUF while two wide N blocks stream past
def test_matmul_rows_transposes_on_chip_to_the_same_bits_as_matmul_general(lhs_shape, rhs_shape, dtype):
    lhs, rhs = arrays(35, dtype, lhs_shape, rhs_shape)
    out = nki.simulate(matmul_rows)(lhs, rhs)
    lhsT = lhs.transpose(-1, -2).contiguous() if isinstance(lhs, torch.Tensor) else np.swapaxes(lhs, -1, -2).copy()
    np.testing.assert_array_equal(np.asarray(out), np.asarray(nki.simulate(matmul_general)(lhsT, rhs)))
    ref = lhs.float().numpy() @ (rhs.float().numpy() if isinstance(rhs, torch.Tensor) else rhs) \
        if isinstance(lhs, torch.Tensor) else lhs @ rhs
    np.testing.assert_allclose(np.asarray(out, dtype=np.float32), ref, rtol=2e-2 if dtype is not torch.float32 else 1e-4,
                               atol=0.5 if dtype is not torch.float32 else 1e-3)
    # every stationary tile goes through the PE array's transpose; none is loaded transposed
    assert any(i.opcode == "transpose" for i in nki.trace_program(matmul_rows, lhs, rhs))


@pytest.mark.parametrize("kernel, lhs_shape, message", [
    (matmul_rows, (2, 2, 20, 130), r"matmul_rows: lhs is \[2, 2, 20, 130\]; give \[M, K\] or \[batch, M, K\]"),
    (matmul_general, (2, 2, 130, 20), r"matmul_general: lhsT is \[2, 2, 130, 20\]; give \[K, M\] or \[batch, K, M\]")])
def test_a_matmul_names_itself_and_its_layout_for_an_operand_of_another_rank(kernel, lhs_shape, message):
    lhs, rhs = arrays(37, torch.float32, lhs_shape, (130, 20))
    with pytest.raises(KernelError, match=message):
        nki.trace_program(kernel, lhs, rhs)


def test_matmul_rows_refuses_mismatched_contractions_naming_its_layout():
    lhs, rhs = arrays(36, torch.float32, (20, 130), (129, 20))
    with pytest.raises(KernelError, match=r"matmul_rows: lhs \[20, 130\] contracts over K=130, rhs \[129, 20\] over "
                                          r"K=129; lhs is \[M, K\], rhs \[K, N\]"):
        nki.trace_program(matmul_rows, lhs, rhs)


def test_matmul_general_refuses_mismatched_contractions():
    lhsT, rhs = arrays(33, torch.float32, (130, 20), (129, 20))
    with pytest.raises(KernelError, match="contracts over K=130, rhs \\[129, 20\\] over K=129"):
        nki.trace_program(matmul_general, lhsT, rhs)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("index_shape", [(300,), (4, 25), (1,)])
def test_embedding(index_shape, dtype):
    (table,) = arrays(34, dtype, (1000, 70))
    indices = np.random.default_rng(35).integers(0, 1000, index_shape).astype(np.int32)
    out = nki.simulate(embedding_kernel)(table, indices, indices.ravel().tolist())
    np.testing.assert_array_equal(out, torch.as_tensor(table).float().numpy()[indices])


def test_embedding_without_index_values_is_one_dma_per_128_rows():
    program = nki.trace_program(embedding_kernel, placeholder(32000, 4096), placeholder(65536, dtype=np.int32))
    gathers = [i for i in program if i.opcode == "dma_copy" and not i.dst.tensor.on_chip]
    assert len(gathers) == 512
    assert {i.src.contiguous_run() for i in gathers} == {4096}  # one descriptor per row, as a gather


def test_embedding_checks_its_index_values():
    (table,) = arrays(36, torch.float32, (10, 4))
    with pytest.raises(KernelError, match="index 10 is outside the table's rows 0..9"):
        nki.trace_program(embedding_kernel, table, np.zeros(2, np.int32), [3, 10])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("index_shape, num_weights, d, padding_idx", [
    ((300,), 50, 70, -1), ((4, 25), 1000, 5000, 3), ((1,), 2, 1, -1), ((260,), 7, 9, 2)])  # many repeats
def test_embedding_backward(index_shape, num_weights, d, padding_idx, dtype):
    (grad,) = arrays(63, dtype, index_shape + (d,))
    indices = np.random.default_rng(64).integers(0, num_weights, index_shape).astype(np.int32)
    if padding_idx >= 0:
        indices.ravel()[:5] = padding_idx
    out = assert_kernel_matches(embedding_backward_kernel, embedding_backward_reference, grad, indices, num_weights,
                                padding_idx, indices.ravel().tolist())
    assert out.shape == (num_weights, d)
    assert_dtype(out, dtype)


def test_embedding_backward_checks_its_index_values():
    (grad,) = arrays(65, torch.float32, (2, 4))
    with pytest.raises(KernelError, match="index 10 is outside the table's rows 0..9"):
        nki.trace_program(embedding_backward_kernel, grad, np.zeros(2, np.int32), 10, -1, [3, 10])


def nll_arguments(seed, dtype, n, c, weighted):
    """Log-probabilities [n, c], targets (every seventh row ignored) and class weights."""
    (x,) = arrays(seed, torch.float32, (n, c), scale=2.0)
    log_probs = torch.log_softmax(torch.from_numpy(x).double(), -1).float()
    log_probs = log_probs.numpy() if dtype is torch.float32 else log_probs.to(dtype)
    target = np.random.default_rng(seed + 1).integers(0, c, n).astype(np.int32)
    target[::7] = -100
    weight = arrays(seed + 2, dtype, (c,), positive=True)[0] if weighted else None
    return log_probs, target, weight


def _nll_cases(test):
    """The dtypes, reductions, weights and shapes both nll_loss tests run."""
    for mark in (pytest.mark.parametrize("n, c", [(130, 37), (2, 1), (300, 5000)]),
                 pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"]),
                 pytest.mark.parametrize("reduction", ["mean", "sum", "none"]),
                 pytest.mark.parametrize("dtype", DTYPES, ids=IDS)):
        test = mark(test)
    return test


@_nll_cases
def test_nll_loss(n, c, weighted, reduction, dtype):
    log_probs, target, weight = nll_arguments(66, dtype, n, c, weighted)
    outs = assert_kernel_matches(nll_loss_kernel, nll_loss_reference, log_probs, target, weight, reduction, -100,
                                 target.tolist())
    for out in outs:
        assert_dtype(out, dtype)


@_nll_cases
def test_nll_loss_backward(n, c, weighted, reduction, dtype):
    log_probs, target, weight = nll_arguments(69, dtype, n, c, weighted)
    (grad,) = arrays(72, dtype, (n,) if reduction == "none" else (1,))
    _, w = _nll_rows(target, None if weight is None else torch.as_tensor(weight).double().numpy(), -100)
    total_weight = np.float32(np.sum(w))
    out = assert_kernel_matches(nll_loss_backward_kernel, nll_loss_backward_reference, grad, log_probs, target, weight,
                                reduction, -100, np.asarray(total_weight), target.tolist())
    assert_dtype(out, dtype)


def test_nll_loss_checks_its_arguments():
    log_probs, target, _ = nll_arguments(73, torch.float32, 4, 3, False)
    with pytest.raises(KernelError, match=r"target 3 is outside the classes 0..2 \(and is not ignore_index -100\)"):
        nki.trace_program(nll_loss_kernel, log_probs, target, None, "mean", -100, [0, 1, 2, 3])
    with pytest.raises(KernelError, match="reduction 'avg' is not one of none, mean, sum"):
        nki.trace_program(nll_loss_kernel, log_probs, target, None, "avg")
    with pytest.raises(KernelError, match="reduction 'mean' divides by total_weight"):
        nki.trace_program(nll_loss_backward_kernel, np.ones((), np.float32), log_probs, target)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("x_shape, w_shape, stride, padding", [
    ((3, 9, 11), (5, 3, 3, 3), 1, 1), ((2, 4, 10, 9), (6, 4, 3, 2), 2, (1, 0)), ((130, 6, 7), (140, 130, 3, 3), 1, 0),
    ((3, 20, 20), (8, 3, 7, 7), 2, 3), ((1, 1, 1), (1, 1, 1, 1), 1, 0), ((4, 5, 600), (3, 4, 1, 3), (1, 3), (0, 1)),
    ((2, 8, 8), (4, 2, 1, 1), 2, 0)])
def test_conv2d(x_shape, w_shape, stride, padding, dtype):
    x, w = arrays(37, dtype, x_shape, w_shape)
    assert_dtype(assert_kernel_matches(conv2d_kernel, conv_reference, x, w, stride, padding), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shapes, axis", [
    ([(130, 700), (1, 700), (257, 700)], 0), ([(3, 5, 7), (3, 2, 7)], 1), ([(4, 3), (4, 1)], -1), ([(1, 1)], 0)])
def test_concat(shapes, axis, dtype):
    xs = arrays(38, dtype, *shapes)
    out = nki.simulate(concat_kernel)(*xs, axis=axis)
    np.testing.assert_array_equal(out, np.concatenate([torch.as_tensor(x).float().numpy() for x in xs], axis))


def test_concat_refuses_mismatched_inputs():
    a, b = arrays(39, torch.float32, (3, 4), (3, 5))
    with pytest.raises(KernelError, match=r"input 1 is \[3, 5\] float32, input 0 \[3, 4\] float32"):
        nki.trace_program(concat_kernel, a, b, axis=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape, scales", [((1, 3, 5, 7), (2, 2)), ((2, 70, 3, 4), (3, 2)), ((1, 1, 2, 5000), (1, 2))])
def test_upsample_nearest2d(shape, scales, dtype):
    (x,) = arrays(64, dtype, shape)
    out = nki.simulate(upsample_nearest2d_kernel)(x, *scales)
    want = torch.nn.functional.interpolate(torch.as_tensor(x).float(), scale_factor=scales, mode="nearest")
    np.testing.assert_array_equal(out, want.numpy())


def test_upsample_nearest2d_refuses_fractional_scales():
    with pytest.raises(KernelError, match=r"scales \(1.5, 2\) must be whole numbers"):
        nki.trace_program(upsample_nearest2d_kernel, placeholder(1, 2, 4, 4), 1.5, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("lo, hi", [(-0.5, 0.3), (None, 0.3), (0.1, None)])
def test_clamp(lo, hi, dtype):
    (x,) = arrays(65, dtype, (257, 300))
    out = nki.simulate(clamp_kernel)(x, lo=lo, hi=hi)
    want = torch.as_tensor(x).float().clamp(lo, hi).to(dtype).float()   # a bound rounds to the dtype too
    np.testing.assert_array_equal(out, want.numpy())


def test_clamp_needs_a_bound():
    with pytest.raises(KernelError, match="a lower or an upper bound"):
        nki.trace_program(clamp_kernel, placeholder(4, 4))


# -- HBM hazards: the gathers' one-row DMAs and row tiles trace in linear time ------

def test_row_indexed_region_lists_find_what_a_full_scan_finds():
    rng = np.random.default_rng(53)
    regions, kept = RowIndexedRegionList(), []

    def box():
        p0, b0 = int(rng.integers(0, 300)), int(rng.integers(0, 300))
        return Region(p0, p0 + int(rng.choice([1, 3, 128])), b0, b0 + int(rng.choice([4, 40, 400])))

    for i in range(600):
        r = box()
        if i % 5 == 4:
            regions.drop_covered(r)
            kept = [(k, v) for k, v in kept if not r.covers(k)]
        else:
            regions.add(r, i)
            kept.append((r, i))
        q = box()
        assert sorted(v for _, v in regions.overlapping(q)) == sorted(v for k, v in kept if k.overlaps(q))
    assert sorted(v for _, v in regions) == sorted(v for _, v in kept)


def test_gathered_rows_wait_for_no_other_row():
    table, indices = placeholder(50, 8), placeholder(3000, dtype=np.int32)
    program = nki.trace_program(embedding_kernel, table, indices, [i % 50 for i in range(3000)])
    gathers = [i for i in program if i.opcode == "dma_copy" and not i.dst.tensor.on_chip]
    assert len(gathers) == 3000 and all(not i.deps for i in gathers)


# -- tracing from placeholders and timing ---------------------------------------

def _bf16(*shape):
    return nki.typed(placeholder(*shape), "bfloat16")


# kernel, placeholder arguments, instructions: a few per [128, <= 4096] block (elementwise,
# reductions), per 128 x 512 matmul tile, per gathered block of rows, per filter tap
TRACES = {
    "unary": (unary_kernel, lambda: (placeholder(4096, 4096), "gelu"), 32 * 3),
    "unary_ragged": (unary_kernel, lambda: (placeholder(257, 3000), "exp"), (2 + 1) * 3),
    "binary": (binary_kernel, lambda: (placeholder(4096, 4096), placeholder(4096, 4096), "add"), 32 * 4),
    "binary_row": (binary_kernel, lambda: (placeholder(257, 3000), placeholder(3000), "multiply"),
                   2 + 6 * 2 + 2 * 3 + 1 + 3),  # the row and the ones of its broadcast, which takes 6 pieces
                                                # through the PE array (stationary, multiply) into 6 PSUM banks;
                                                # two folded blocks, the last row
    "scalar": (scalar_kernel, lambda: (placeholder(257, 3000), "multiply", 2.0), 3 * 3),
    "cast": (cast_kernel, lambda: (placeholder(4096, 4096), "bfloat16"), 32 * 3),
    "adamw": (fused_adamw_kernel, lambda: tuple(placeholder(4096, 4096) for _ in range(4)), 64 * 19),
    "reduce": (reduce_kernel, lambda: (placeholder(257, 3000), "mean"), 2 * 4 + 4),
    "log_softmax": (log_softmax_kernel, lambda: (placeholder(4096, 32000),),
                    32 * (8 * 3 + 5 + 8 * 3)),  # per row tile: 8 blocks of statistics (load, negated max, exp
                                                # and sum), their sum, 8 results
    "groupnorm": (groupnorm_kernel, lambda: (placeholder(8, 320, 64, 64), placeholder(320), placeholder(320), 32),
                  3 * 6 + 6 + 8 * (3 * 7 + 1 + 3 * 11)),  # 3 channel tiles; per image: statistics, group, results
    "matmul": (matmul_general, lambda: (placeholder(1000, 1000), placeholder(1000, 1000)),
               2 * 8 + 8 * (2 * 16 + 2 + 2 + 1)),  # 2 K chunks of 4 tiles, 8 x 2 output tiles
    "bmm": (matmul_general, lambda: (_bf16(48, 64, 128), _bf16(48, 64, 128)), 48 * 6),
    "embedding": (embedding_kernel, lambda: (_bf16(32000, 4096), placeholder(2048, dtype=np.int32)), 1 + 16),
    "embedding_backward": (embedding_backward_kernel,
                           lambda: (_bf16(4096, 4096), placeholder(4096, dtype=np.int32), 32000),
                           1 + 250 + 1 + 32 * 4),  # memset, indices, per block: grad, gather, add, scatter
    "nll_loss": (nll_loss_kernel, lambda: (placeholder(4096, 32000), placeholder(4096, dtype=np.int32)),
                 1 + 32 * 7 + 7),  # ones; per block: gather, targets, 3 vector, matmul pair; the mean
    "nll_loss_backward": (nll_loss_backward_kernel,
                          lambda: (placeholder(1), placeholder(4096, 32000), placeholder(4096, dtype=np.int32), None,
                                   "mean", -100, placeholder(1)),
                          1 + 250 + 7 + 32 * 4),  # memset; the scale (broadcast through the PE array); per
                                                 # block: targets, 2 vector, scatter
    "conv2d": (conv2d_kernel, lambda: (_bf16(64, 56, 56), _bf16(64, 64, 3, 3), 1, 1),
               11 + 3 + 7 * (9 * 2 + 1) + 1),  # weights, padded input, 7 pieces of 8 rows x 9 taps, store
    "concat": (concat_kernel, lambda: (placeholder(130, 700), placeholder(257, 700)), 2),
    "upsample": (upsample_nearest2d_kernel, lambda: (placeholder(1, 16, 16, 16), 2, 2),
                 2 * (1 + 2 + 2)),  # 2 tiles of 128 rows: load, 2 column copies, 2 row stores
    "clamp": (clamp_kernel, lambda: (placeholder(257, 300), 0.0, 1.0), 3 * 2),  # 2 blocks and a 1-partition rest
}


@pytest.mark.parametrize("name", TRACES)
def test_traces_from_placeholders_in_instructions_that_follow_the_work(name):
    kernel, make_args, instructions = TRACES[name]
    program = nki.trace_program(kernel, *make_args())
    assert len(program) == instructions


BENCHMARKS = {
    "unary": (unary_kernel, lambda: arrays(40, torch.bfloat16, (200, 700)) + ["silu"]),
    "binary": (binary_kernel, lambda: arrays(41, torch.bfloat16, (200, 700), (700,))),
    "scalar": (scalar_kernel, lambda: arrays(42, torch.bfloat16, (200, 700)) + ["add", 1.0]),
    "cast": (cast_kernel, lambda: arrays(43, torch.float32, (200, 700)) + ["bfloat16"]),
    "adamw": (fused_adamw_kernel, lambda: arrays(44, torch.float32, *[(200, 700)] * 3)
              + arrays(45, torch.float32, (200, 700), positive=True)),
    "reduce": (reduce_kernel, lambda: arrays(46, torch.bfloat16, (200, 700)) + ["max"]),
    "log_softmax": (log_softmax_kernel, lambda: arrays(47, torch.bfloat16, (200, 700))),
    "groupnorm": (groupnorm_kernel, lambda: arrays(48, torch.bfloat16, (2, 64, 9, 9), (64,), (64,)) + [8]),
    "matmul": (matmul_general, lambda: arrays(49, torch.bfloat16, (300, 200), (300, 700))),
    "embedding": (embedding_kernel, lambda: arrays(50, torch.bfloat16, (500, 64))
                  + [np.arange(200, dtype=np.int32) * 2, list(range(0, 400, 2))]),
    "embedding_backward": (embedding_backward_kernel,
                           lambda: arrays(63, torch.bfloat16, (200, 64)) + [np.arange(200, dtype=np.int32) % 70, 500,
                                                                           -1, [i % 70 for i in range(200)]]),
    "nll_loss": (nll_loss_kernel, lambda: list(nll_arguments(74, torch.bfloat16, 200, 700, True))
                 + ["mean", -100, nll_arguments(74, torch.bfloat16, 200, 700, True)[1].tolist()]),
    "conv2d": (conv2d_kernel, lambda: arrays(51, torch.bfloat16, (16, 12, 12), (32, 16, 3, 3)) + [1, 1]),
    "concat": (concat_kernel, lambda: arrays(52, torch.bfloat16, (130, 70), (20, 70))),
    "gelu_backward": (activation_backward_kernel, lambda: arrays(58, torch.bfloat16, (200, 700), (200, 700)) + ["gelu"]),
    "softmax_backward": (softmax_backward_kernel, lambda: arrays(59, torch.bfloat16, (200, 700), (200, 700))),
    "layernorm_backward": (layernorm_backward_kernel,
                           lambda: arrays(60, torch.bfloat16, (200, 700), (200, 700)) + arrays(61, torch.float32, (200,), (200,))
                           + arrays(62, torch.bfloat16, (700,))),
}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_latency_is_positive_and_deterministic(name):
    kernel, make_args = BENCHMARKS[name]
    first, second = (nki.benchmark(kernel)(*make_args()) for _ in range(2))
    assert first.latency_ns > 0
    assert first.latency_ns == second.latency_ns
    assert first.busy_pct == second.busy_pct


def test_a_logical_core_splits_the_work_among_its_physical_cores():
    """trn2's logical core is two physical cores: a matmul with rows for both takes the
    time of one core's half; trn1's logical core is one core, which takes the whole."""
    import torch

    import trnsim  # noqa: F401
    from trnsim.backend import optable
    from trnsim.backend.lowering import Call, placeholder, run_kernel
    from trnsim.kernels.gemm import matmul_rows

    def program_ps(rows):
        lhs = placeholder((rows, 1024), torch.float32)   # the activation in rows, as torch made it
        rhs = placeholder((1024, 1024), torch.float32)
        return run_kernel(matmul_rows, "matmul_rows", lhs, rhs, dtype="float32").ps

    before = torch.neuron.chip()
    try:
        for chip, rows in (("trn1", 512), ("trn2", 256)):
            torch.neuron.set_chip(chip)
            a = torch.empty(512, 1024, device="neuron")
            b = torch.empty(1024, 1024, device="neuron")
            call = Call("aten::mm", (a, b), {}, [a, b], None)
            cost = optable.kernel_cost(call)
            assert cost.ps == program_ps(rows)
            # the share is the call's own: the rows split in two on trn2, none on trn1
            assert call.shares.factors == ([2.0] if chip == "trn2" else [])
            assert cost.cores == (2.0 if chip == "trn2" else 1.0)
            if chip == "trn2":
                assert cost.ps < program_ps(512)
    finally:
        torch.neuron.set_chip(before)


def test_a_physical_cores_share_of_an_elementwise_op_is_never_slower_than_the_whole(tmp_path):
    """The cores of trn2's logical core split an elementwise op's 128-partition columns:
    splitting the first axis instead would give [129, 7] (7 columns and a row of 7) a
    share [65, 7] (3 columns and a row of 71), slower than one core doing it all."""
    import torch

    import trnsim  # noqa: F401
    from trnsim.backend import optable
    from trnsim.backend.lowering import Call

    lnc1 = tmp_path / "trn2_lnc1.toml"
    lnc1.write_text('extends = "trn2"\n\n[chip]\nname = "trn2-lnc1"\nlogical_core_size = 1\n')

    def times(chip):
        torch.neuron.set_chip(chip)
        out = []
        for shape in ((129, 7), (128, 3), (128, 129), (3, 100), (2, 64), (300, 700)):
            x, y = torch.empty(shape, device="neuron"), torch.empty(shape, device="neuron")
            for name, args in (("aten::exp", (x,)), ("aten::add.Tensor", (x, y)), ("aten::mul.Tensor", (x, 2.0))):
                out.append(optable.kernel_cost(Call(name, args, {}, list(args), None)).ps)
        return out

    before = torch.neuron.chip()
    try:
        one_core, two_cores = times(str(lnc1)), times("trn2")
    finally:
        torch.neuron.set_chip(before)
    assert all(t2 <= t1 for t1, t2 in zip(one_core, two_cores))
    assert two_cores[-3] < one_core[-3] / 1.5   # [300, 700] exp: the share is about half


def test_the_device_times_nearest_upsampling_and_clamp_by_their_kernels():
    import trnsim

    x = torch.randn(2, 8, 16, 16, generator=torch.Generator().manual_seed(66))
    d = x.to("neuron")
    with trnsim.profile() as prof:
        up = torch.nn.functional.interpolate(d, scale_factor=2.0, mode="nearest")
        clamped = up.clamp(-0.5, 0.5)
        low = torch.clamp_min(d, 0.0)
        uneven = torch.nn.functional.interpolate(d, size=(24, 24), mode="nearest")
    torch.testing.assert_close(up.cpu(), torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest"),
                               rtol=0, atol=0)
    torch.testing.assert_close(clamped.cpu(), up.cpu().clamp(-0.5, 0.5), rtol=0, atol=0)
    torch.testing.assert_close(low.cpu(), x.clamp_min(0.0), rtol=0, atol=0)
    torch.testing.assert_close(uneven.cpu(), torch.nn.functional.interpolate(x, size=(24, 24), mode="nearest"),
                               rtol=0, atol=0)
    timed = [(r.name, r.cost.source, r.cost.kernel) for r in prof.records]
    assert timed == [("aten::upsample_nearest2d", "kernel", "upsample_nearest2d_kernel"),
                     ("aten::clamp", "kernel", "clamp_kernel"), ("aten::clamp_min", "kernel", "clamp_kernel"),
                     ("aten::upsample_nearest2d", "estimate", "")]   # a 1.5x scale picks rows unevenly


def test_a_kernel_bug_is_raised_not_timed_as_an_estimate(monkeypatch):
    """A kernel refuses a shape it does not take with a TrnSimError, and the estimate
    times that op; any other exception in a kernel or its lowering is a bug, and it
    reaches the caller instead of becoming a bandwidth estimate."""
    import torch

    import trnsim  # noqa: F401
    from trnsim.backend import optable
    from trnsim.backend.lowering import Call
    from trnsim.errors import ProgramError

    x = torch.empty(4, 4, device="neuron")
    call = lambda: Call("aten::exp", (x,), {}, [x], None)  # noqa: E731

    def refuses(call):
        raise ProgramError("no tile fits")

    def broken(call):
        return call.args[7]

    monkeypatch.setitem(optable.KERNEL_OPS, "aten::exp", refuses)
    assert optable.kernel_cost(call()) is None
    monkeypatch.setitem(optable.KERNEL_OPS, "aten::exp", broken)
    with pytest.raises(IndexError):
        optable.kernel_cost(call())


@pytest.mark.parametrize("transposed", [False, True])
def test_an_eager_matmul_reads_its_left_operand_as_it_lies_in_memory(transposed):
    """A row-major left operand (an activation) is transposed on chip by ``matmul_rows``;
    a transposed view (``x.t()`` of a row-major x, as a weight gradient's) is already
    [K, M] in memory and goes to ``matmul_general`` as ``lhsT``."""
    import torch

    import trnsim  # noqa: F401
    from trnsim.backend import optable
    from trnsim.backend.lowering import Call

    a = torch.empty(300, 200, device="neuron").t() if transposed else torch.empty(200, 300, device="neuron")
    b = torch.empty(300, 400, device="neuron")
    cost = optable.kernel_cost(Call("aten::mm", (a, b), {}, [a, b], None))
    assert cost.kernel == ("matmul_general" if transposed else "matmul_rows")


@nki.jit
def _tiled_product(lhs, rhs, rows=True, tiled=True):
    import trnsim.nki.language as nl
    from trnsim.kernels.gemm import matmul_blocks

    out = nl.ndarray((lhs.shape[0] if rows else lhs.shape[1], rhs.shape[1]), nl.float32, buffer=nl.shared_hbm)
    matmul_blocks(lhs, rhs, lambda b: out, rows=rows, tiled=tiled)
    return out


@pytest.mark.parametrize("m, k, n, rows", [(128, 256, 640, True), (200, 384, 1100, False), (64, 128, 2100, True)])
def test_a_tiled_rhs_gives_the_product_of_the_weight_it_lays_out(m, k, n, rows):
    """A weight laid out as the kernel loads it (a compiled graph's parameters): one DMA
    per chunk of K tiles, the same product."""
    from trnsim.kernels.gemm import tile_rhs

    rng = np.random.default_rng(7)
    lhs = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    first = lhs if rows else lhs.T.copy()
    out = nki.simulate(_tiled_product)(first, tile_rhs(w, m), rows=rows)
    np.testing.assert_allclose(np.asarray(out), lhs @ w, rtol=1e-4, atol=1e-3)
    plain = nki.simulate(_tiled_product)(first, w, rows=rows, tiled=False)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))
    # the weight's chunks arrive with each partition's bytes in one descriptor
    loads = [i for i in nki.trace_program(_tiled_product, first, tile_rhs(w, m), rows=rows)
             if i.opcode == "dma_copy" and i.src.tensor.name.startswith("rhs")]
    assert loads and all(i.src.contiguous_run() >= min(k, 128 * 8) // 128 * min(n, 512) for i in loads)
    with pytest.raises(KernelError, match=r"tile_rhs: K=100 is not a multiple of 128"):
        tile_rhs(w[:100], m)
