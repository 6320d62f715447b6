"""Depthwise convolution and its gradients (groups = input channels, ConvNeXt's and
EfficientNet's convolutions): against float64 references at instruction fidelity, in
fp32 and bf16, over strides, paddings, dilations, channel multipliers, channel tiles and
images taller than one band."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trnsim.nki as nki
from trnsim.kernels.conv_depthwise import depthwise_conv2d_backward_kernel, depthwise_conv2d_kernel
from trnsim.nki import KernelError
from trnsim.testing import assert_kernel_matches
from tests.test_kernels import arrays

DTYPES = (torch.float32, torch.bfloat16)
IDS = ["fp32", "bf16"]
# (x shape, w shape, stride, padding, dilation)
CONVS = [((2, 8, 9, 11), (8, 1, 3, 3), 1, 1, 1),
         ((1, 16, 14, 14), (16, 1, 7, 7), 1, 3, 1),           # ConvNeXt's filter
         ((2, 6, 10, 9), (12, 1, 3, 2), 2, (1, 0), 1),         # channel multiplier 2, uneven stride
         ((1, 130, 6, 7), (130, 1, 5, 5), 2, 2, 1),            # two channel tiles, EfficientNet's 5x5/2
         ((1, 4, 12, 12), (4, 1, 3, 3), 1, 2, 2),              # dilation
         ((1, 3, 130, 72), (3, 1, 3, 3), (2, 1), 1, 1)]        # rows over several bands


def t64(a):
    return torch.from_numpy(np.asarray(a, np.float64))


def forward_reference(x, w, stride, padding, dilation):
    return F.conv2d(t64(x), t64(w), None, stride, padding, dilation, groups=x.shape[1]).numpy()


def backward_reference(g, x, w, stride, padding, dilation, *_):
    xt, wt = t64(x).requires_grad_(), t64(w).requires_grad_()
    b = torch.zeros(w.shape[0], dtype=torch.float64, requires_grad=True)
    F.conv2d(xt, wt, b, stride, padding, dilation, groups=x.shape[1]).backward(t64(g))
    return xt.grad.numpy(), wt.grad.numpy(), b.grad.numpy()


def out_shape(x_shape, w_shape, stride, padding, dilation):
    return tuple(F.conv2d(torch.empty(x_shape, device="meta"), torch.empty(w_shape, device="meta"), None, stride,
                          padding, dilation, groups=x_shape[1]).shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation", CONVS)
def test_depthwise_conv2d(x_shape, w_shape, stride, padding, dilation, dtype):
    x, w = arrays(91, dtype, x_shape, w_shape)
    out = assert_kernel_matches(depthwise_conv2d_kernel, forward_reference, x, w, stride, padding, dilation)
    assert out.shape == out_shape(x_shape, w_shape, stride, padding, dilation)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation", CONVS)
def test_depthwise_conv2d_backward(x_shape, w_shape, stride, padding, dilation, dtype):
    x, w = arrays(92, dtype, x_shape, w_shape)
    g, = arrays(93, dtype, out_shape(x_shape, w_shape, stride, padding, dilation))
    outs = assert_kernel_matches(depthwise_conv2d_backward_kernel, backward_reference, g, x, w, stride, padding,
                                 dilation, True, True, True)
    assert [o.shape for o in outs] == [x_shape, w_shape, (w_shape[0],)]


def test_each_gradient_alone():
    x, w = arrays(94, torch.float32, (2, 5, 8, 8), (5, 1, 3, 3))
    g, = arrays(95, torch.float32, (2, 5, 4, 4))
    dx, dw, db = backward_reference(g, x, w, 2, 1, 1)
    assert_kernel_matches(depthwise_conv2d_backward_kernel, lambda *_: dx, g, x, w, 2, 1, 1, True, False, False)
    assert_kernel_matches(depthwise_conv2d_backward_kernel, lambda *_: dw, g, x, w, 2, 1, 1, False, True, False)
    assert_kernel_matches(depthwise_conv2d_backward_kernel, lambda *_: (dw, db), g, x, w, 2, 1, 1, False, True, True)


def placeholder(*shape):
    return np.broadcast_to(np.zeros((), np.float32), shape)


def test_bad_shapes_are_refused_by_name():
    with pytest.raises(KernelError, match=r"w \[8, 2, 3, 3\] is not a depthwise filter of 8 channels"):
        nki.trace_program(depthwise_conv2d_kernel, placeholder(1, 8, 5, 5), placeholder(8, 2, 3, 3))
    with pytest.raises(KernelError, match=r"grad \[1, 8, 5, 5\] is not the output of this convolution"):
        nki.trace_program(depthwise_conv2d_backward_kernel, placeholder(1, 8, 5, 5), placeholder(1, 8, 5, 5),
                          placeholder(8, 1, 3, 3))
    with pytest.raises(KernelError, match="gives no output from a 2x2 input"):
        nki.trace_program(depthwise_conv2d_kernel, placeholder(1, 8, 2, 2), placeholder(8, 1, 3, 3))
    with pytest.raises(KernelError, match="asked for no gradient"):
        nki.trace_program(depthwise_conv2d_backward_kernel, placeholder(1, 8, 3, 3), placeholder(1, 8, 5, 5),
                          placeholder(8, 1, 3, 3), 1, 0, 1, False, False, False)


def _convs_timed(model, x):
    import trnsim

    d = x.to("neuron")
    model = model.to("neuron")
    with trnsim.profile() as prof:
        out = model(d)
        out.sum().backward()
    return out, [(r.name.split(".")[0], r.cost.source, r.cost.kernel) for r in prof.records if "convolution" in r.name]


def test_grouped_and_depthwise_convolutions_on_the_device_are_timed_by_kernels():
    """ConvNeXt's depthwise 7x7, a depthwise 3x3 with a channel multiplier of 2 and a
    grouped 1x1 (4 groups), forward and backward: each by a kernel, the values PyTorch's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 7, padding=3, groups=8),
                                torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=8),
                                torch.nn.Conv2d(16, 8, 1, groups=4))
    x = torch.randn(2, 8, 12, 12)
    expected = model(x)
    out, timed = _convs_timed(model, x)
    torch.testing.assert_close(out.detach().cpu(), expected, rtol=1e-4, atol=1e-4)
    forward = [t for t in timed if "backward" not in t[0]]
    backward = [t for t in timed if "backward" in t[0]]
    assert [k for _, _, k in forward] == ["depthwise_conv2d_kernel", "depthwise_conv2d_kernel", "conv2d_kernel"]
    assert sorted(k for _, _, k in backward) == ["conv2d_backward_kernel", "depthwise_conv2d_backward_kernel",
                                                 "depthwise_conv2d_backward_kernel"]
    assert {s for _, s, _ in timed} == {"kernel"}


def test_a_grouped_convolution_is_one_group_s_kernel_once_per_group():
    from trnsim.backend import optable
    from trnsim.backend.lowering import Call

    x, w = torch.empty(2, 16, 10, 10, device="neuron"), torch.empty(32, 4, 3, 3, device="neuron")
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 4)
    cost = optable.kernel_cost(Call("aten::convolution", args, {}, list(args), None))
    assert (cost.source, cost.kernel, cost.scale) == ("kernel", "conv2d_kernel", 4)
    assert cost.ps == 4 * cost.run.total_ps


def test_padding_written_as_one_number_in_a_list_is_both_sides():
    """torch.compile's graphs pass ``padding=[0]``: the same as (0, 0), not a refusal."""
    one = depthwise_conv2d_kernel.trace(placeholder(1, 8, 6, 6), placeholder(8, 1, 3, 3), [1], [0])
    two = depthwise_conv2d_kernel.trace(placeholder(1, 8, 6, 6), placeholder(8, 1, 3, 3), (1, 1), (0, 0))
    assert len(one.tracer.program.instructions) == len(two.tracer.program.instructions)
    assert [t.shape for t in one.output_tensors] == [(1, 8, 4, 4)]
