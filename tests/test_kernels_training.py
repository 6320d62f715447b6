"""The kernels of a CNN's training step besides the forward convolution: batch norm
forward (training and eval, with ReLU) and backward, group norm's backward, and the two
gradients of a convolution. Each against a float64 reference in fp32 and bf16 at
instruction fidelity, laid out as the hardware would (every partition busy, any number
of values per channel), with exact simulated times."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trnsim.nki as nki
from trnsim.kernels.backward import batchnorm_backward_kernel, groupnorm_backward_kernel
from trnsim.kernels.conv import conv2d_kernel
from trnsim.kernels.conv_backward import conv2d_backward_kernel, conv2d_input_grad_kernel, conv2d_weight_grad_kernel
from trnsim.kernels.norms import BatchNormLayout, batchnorm_kernel
from trnsim.nki import KernelError
from trnsim.testing import assert_kernel_matches
from tests.test_kernels import arrays

DTYPES = (torch.float32, torch.bfloat16)
IDS = ["fp32", "bf16"]
# [N, C, *spatial]: a channel over 4 partitions; over 32 (3 channels); 130 channels in
# two tiles; [N, C]; long rows streamed in blocks that do not stay in SBUF
BN_SHAPES = [(4, 32, 8, 8), (2, 3, 5, 64), (3, 130, 6), (6, 20), (1, 16, 160, 160)]


def placeholder(*shape):
    return np.broadcast_to(np.zeros((), np.float32), shape)


def t64(a):
    return None if a is None else torch.from_numpy(np.asarray(a, np.float64))


def batchnorm_reference(x, gamma, beta, running_mean, running_var, training, momentum, eps, relu):
    rm, rv = t64(running_mean), t64(running_var)
    y, mean, invstd = torch.ops.aten.native_batch_norm(t64(x), t64(gamma), t64(beta), rm, rv, training, momentum,
                                                       eps)
    y = torch.relu(y) if relu else y
    if not training:
        return y.numpy()
    return tuple(t.numpy() for t in (y, mean, invstd, rm, rv) if t is not None)


def batchnorm_backward_reference(g, x, gamma, mean, invstd, training, eps, relu_out):
    if relu_out is not None:   # a keyword argument: handed over as given, not as float64
        g = g * (torch.as_tensor(relu_out).double().numpy() > 0)
    stats = (None, None, t64(mean), t64(invstd)) if training else (t64(mean), t64(invstd), None, None)
    return tuple(r.numpy() for r in torch.ops.aten.native_batch_norm_backward(
        t64(g), t64(x), t64(gamma), *stats, training, eps, [True, True, True]))


def groupnorm_backward_reference(g, x, mean, rstd, gamma, groups):
    n, c = x.shape[:2]
    return tuple(r.numpy() for r in torch.ops.aten.native_group_norm_backward(
        t64(g), t64(x), t64(mean), t64(rstd), t64(gamma), n, c, int(np.prod(x.shape[2:])), groups,
        [True, True, True]))


def conv_backward_reference(g, x, w, stride, padding, *_):
    xt, wt = t64(x).requires_grad_(), t64(w).requires_grad_()
    b = torch.zeros(w.shape[0], dtype=torch.float64, requires_grad=True)
    F.conv2d(xt, wt, b, stride, padding).backward(t64(g))
    return xt.grad.numpy(), wt.grad.numpy(), b.grad.numpy()


def conv_output(x_shape, w_shape, stride, padding):
    return F.conv2d(torch.empty(x_shape, device="meta"), torch.empty(w_shape, device="meta"), None, stride,
                    padding).shape


# -- batch norm -------------------------------------------------------------------

@pytest.mark.parametrize("shape, split, tiles", [((32, 32, 32, 32), 4, 1), ((32, 64, 16, 16), 2, 1),
                                                 ((2, 3, 5, 7), 35, 1), ((8, 200, 7, 7), 1, 2), ((8, 20), 1, 1)])
def test_batch_norm_spreads_each_channel_over_the_partitions(shape, split, tiles):
    """Fewer than 64 channels: each channel takes as many partitions as divide its
    positions, so (up to the divisors) all 128 are busy."""
    lay = BatchNormLayout(shape)
    assert (lay.split, len(lay.tiles)) == (split, tiles)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("training, relu", [(True, False), (True, True), (False, False)],
                         ids=["train", "train_relu", "eval"])
def test_batch_norm(shape, training, relu, dtype):
    c = shape[1]
    x, gamma, beta, mean = arrays(70, dtype, shape, (c,), (c,), (c,), scale=2.0, shift=0.5)
    var = np.abs(arrays(71, torch.float32, (c,))[0]) + 0.5
    out = assert_kernel_matches(batchnorm_kernel, batchnorm_reference, x, gamma, beta, mean, var, training, 0.1,
                                1e-5, relu)
    assert len(out) == 5 if training else out.shape == shape


def test_batch_norm_without_scale_shift_or_running_statistics():
    x, = arrays(72, torch.float32, (4, 8, 6, 6))
    ref = lambda x, *_: batchnorm_reference(x, None, None, None, None, True, 0.1, 1e-5, False)   # noqa: E731
    assert len(assert_kernel_matches(batchnorm_kernel, ref, x)) == 3


def test_batch_norm_in_eval_needs_the_running_statistics():
    with pytest.raises(KernelError, match="pass running_mean and running_var"):
        nki.trace_program(batchnorm_kernel, placeholder(2, 4, 3, 3), training=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("training, relu", [(True, False), (True, True), (False, False)],
                         ids=["train", "through_relu", "eval"])
def test_batch_norm_backward(shape, training, relu, dtype):
    c = shape[1]
    g, x, relu_out, gamma = arrays(73, dtype, shape, shape, shape, (c,), scale=2.0, shift=0.5)
    xf = torch.as_tensor(x).double()
    if training:
        _, mean, invstd = torch.ops.aten.native_batch_norm(xf, None, None, None, None, True, 0.1, 1e-5)
        mean, invstd = mean.float().numpy(), invstd.float().numpy()
    else:
        mean, invstd = arrays(74, torch.float32, (c,))[0], np.abs(arrays(75, torch.float32, (c,))[0]) + 0.5
    outs = assert_kernel_matches(batchnorm_backward_kernel, batchnorm_backward_reference, g, x, gamma, mean, invstd,
                                 training, 1e-5, relu_out=relu_out if relu else None)
    assert [o.shape for o in outs] == [shape, (c,), (c,)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape, groups", [((2, 6, 5, 7), 3), ((2, 130, 70), 13), ((1, 4, 80, 80), 1),
                                           ((2, 256, 9, 9), 32), ((3, 8, 5), 4)])
def test_group_norm_backward(shape, groups, dtype):
    c = shape[1]
    g, x, gamma = arrays(76, dtype, shape, shape, (c,), scale=2.0, shift=0.5)
    _, mean, rstd = torch.ops.aten.native_group_norm(torch.as_tensor(x).double(), None, None, shape[0], c,
                                                     int(np.prod(shape[2:])), groups, 1e-5)
    outs = assert_kernel_matches(groupnorm_backward_kernel, groupnorm_backward_reference, g, x,
                                 mean.float().numpy(), rstd.float().numpy(), gamma, groups)
    assert [o.shape for o in outs] == [shape, (c,), (c,)]


def test_norm_backwards_compute_what_the_mask_asks():
    args = (placeholder(2, 8, 4, 4), placeholder(2, 8, 4, 4))
    bn = batchnorm_backward_kernel.trace(*args, placeholder(8), placeholder(8), placeholder(8), need_weight=False)
    gn = groupnorm_backward_kernel.trace(*args, placeholder(2, 2), placeholder(2, 2), None, 2, need_input=False)
    assert (len(bn.output_tensors), len(gn.output_tensors)) == (2, 1)


# -- convolution backward ---------------------------------------------------------------

CONVS = [((2, 3, 9, 11), (5, 3, 3, 3), 1, 1), ((2, 4, 10, 9), (6, 4, 3, 2), 2, (1, 0)),
         ((1, 130, 6, 7), (140, 130, 3, 3), 1, 0), ((1, 3, 20, 20), (8, 3, 7, 7), 2, 3),
         ((1, 4, 5, 600), (3, 4, 1, 3), (1, 3), (0, 1)), ((2, 2, 8, 8), (4, 2, 1, 1), 2, 0),
         ((1, 64, 8, 8), (256, 64, 3, 3), 1, 1)]   # 256 x 576 weight sums: more than PSUM holds


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("x_shape, w_shape, stride, padding", CONVS)
def test_conv2d_backward(x_shape, w_shape, stride, padding, dtype):
    x, w = arrays(77, dtype, x_shape, w_shape)
    g, = arrays(78, dtype, tuple(conv_output(x_shape, w_shape, stride, padding)))
    outs = assert_kernel_matches(conv2d_backward_kernel, conv_backward_reference, g, x, w, stride, padding, True,
                                 True, True)
    assert [o.shape for o in outs] == [x_shape, w_shape, (w_shape[0],)]


def test_conv2d_gradients_alone():
    """One image without a batch axis, each gradient from its own kernel."""
    x, w = arrays(79, torch.float32, (3, 9, 11), (5, 3, 3, 3))
    g, = arrays(80, torch.float32, (5, 5, 6))
    dx, dw, db = conv_backward_reference(g[None], x[None], w, 2, 1)
    assert_kernel_matches(conv2d_input_grad_kernel, lambda *_: dx[0], g, w, x.shape, 2, 1)
    assert_kernel_matches(conv2d_weight_grad_kernel, lambda *_: (dw, db), x, g, (3, 3), 2, 1, True)


def test_conv2d_backward_refuses_a_gradient_of_another_shape():
    with pytest.raises(KernelError, match=r"grad \[2, 5, 9, 11\] is not the output of a convolution"):
        nki.trace_program(conv2d_backward_kernel, placeholder(2, 5, 9, 11), placeholder(2, 3, 9, 11),
                          placeholder(5, 3, 3, 3), 2, 1)


def test_conv2d_backward_costs_about_twice_the_forward():
    """Both gradients are a convolution's work each: the backward of a conv whose
    input needs a gradient takes about twice the forward (the first layer's, whose
    input is the data, only the weight gradient: about as long as the forward)."""
    def latency(kernel, *args, **kwargs):
        return nki.benchmark(kernel)(*args, **kwargs).latency_ns

    for x_shape, w_shape, both in (((16, 64, 16, 16), (64, 64, 3, 3), True), ((16, 3, 32, 32), (32, 3, 3, 3), False)):
        g = placeholder(*conv_output(x_shape, w_shape, 1, 1))
        x, w = placeholder(*x_shape), placeholder(*w_shape)
        forward = latency(conv2d_kernel, x, w, 1, 1)
        backward = latency(conv2d_backward_kernel, g, x, w, 1, 1, need_input=both, need_bias=True)
        assert (1.5 < backward / forward < 3.0) if both else (0.7 < backward / forward < 1.5)


# -- simulated times ----------------------------------------------------------------

TIMES = {
    "batchnorm_train": (batchnorm_kernel, lambda: (placeholder(16, 64, 16, 16), placeholder(64), placeholder(64),
                                                   placeholder(64), placeholder(64)), {}, 22522.78),
    "batchnorm_relu_eval": (batchnorm_kernel, lambda: (placeholder(16, 64, 16, 16), placeholder(64), placeholder(64),
                                                       placeholder(64), placeholder(64)),
                            {"training": False, "relu": True}, 16676.233),
    "batchnorm_backward": (batchnorm_backward_kernel,
                           lambda: (placeholder(16, 64, 16, 16), placeholder(16, 64, 16, 16), placeholder(64),
                                    placeholder(64), placeholder(64)), {}, 36776.759),
    "groupnorm_backward": (groupnorm_backward_kernel,
                           lambda: (placeholder(2, 320, 32, 32), placeholder(2, 320, 32, 32), placeholder(2, 32),
                                    placeholder(2, 32), placeholder(320), 32), {}, 60389.732),
    "conv2d_backward": (conv2d_backward_kernel,
                        lambda: (placeholder(16, 64, 16, 16), placeholder(16, 32, 16, 16), placeholder(64, 32, 3, 3),
                                 1, 1), {"need_bias": True}, 189897.179),
    "conv2d_backward_stride2": (conv2d_backward_kernel,
                                lambda: (placeholder(4, 64, 8, 8), placeholder(4, 64, 16, 16),
                                         placeholder(64, 64, 3, 3), 2, 1), {}, 28006.767),
}


@pytest.mark.parametrize("name", TIMES)
def test_simulated_time(name):
    kernel, make_args, kwargs, ns = TIMES[name]
    assert nki.benchmark(kernel)(*make_args(), **kwargs).latency_ns == ns


def test_batch_norm_streams_any_number_of_positions():
    """[2, 8, 1024, 1024]: 64 Ki values per partition, streamed in blocks (SBUF never overflows)."""
    program = nki.trace_program(batchnorm_kernel, placeholder(2, 8, 1024, 1024))
    assert len(program) > 64
