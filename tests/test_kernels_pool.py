"""The pooling kernels: max pooling with its indices, average pooling, and their
backward ops, against torch's float64 CPU results in fp32 and bf16 at instruction
fidelity (overlapping windows, padding, ceil_mode, more planes than partitions, rows
taken in several bands), with exact simulated times."""

import numpy as np
import pytest
import torch

import trnsim.nki as nki
from trnsim.kernels.pool import (PoolGeometry, avgpool2d_backward_kernel, avgpool2d_kernel, maxpool2d_backward_kernel,
                                 maxpool2d_kernel)
from trnsim.nki import KernelError
from trnsim.testing import assert_kernel_matches

aten = torch.ops.aten
DTYPES = (torch.float32, torch.bfloat16)
IDS = ["fp32", "bf16"]
# (x shape, kernel, stride, padding, ceil_mode): the CNN's 2x2; overlapping 3x3 with padding
# (ResNet's stem); ceil_mode past the input on 130 planes (two tiles); uneven kernel and
# stride; a window wider than the rows; 100x100 planes in two bands
GEOMETRIES = [((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), False), ((2, 3, 9, 7), (3, 3), (2, 2), (1, 1), False),
              ((1, 130, 5, 6), (3, 3), (2, 2), (1, 1), True), ((2, 2, 7, 7), (2, 3), (1, 2), (1, 1), True),
              ((2, 8, 2, 2), (3, 3), (1, 1), (1, 1), False), ((1, 2, 100, 100), (3, 3), (1, 1), (1, 1), False)]
GEO_IDS = ["2x2", "3x3s2p1", "ceil_two_tiles", "uneven", "wider_than_rows", "two_bands"]


def _input(shape, dtype, seed=90):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x if dtype is torch.float32 else torch.from_numpy(x).to(dtype)


def _t(a):
    return torch.as_tensor(np.asarray(a, np.float64))


def _max_reference(x, kernel, stride, padding, ceil_mode):
    out, idx = aten.max_pool2d_with_indices(_t(x), list(kernel), list(stride), list(padding), [1, 1], ceil_mode)
    return out.numpy(), idx.numpy()


def _forward_grad(shape, dtype, kernel, stride, padding, ceil_mode):
    """A gradient of the pooling's output shape, and the input (fp32 numpy or bf16)."""
    x = _input(shape, dtype)
    out = aten.avg_pool2d(torch.as_tensor(x).float(), list(kernel), list(stride), list(padding), ceil_mode)
    return x, _input(tuple(out.shape), dtype, seed=91)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape, kernel, stride, padding, ceil_mode", GEOMETRIES, ids=GEO_IDS)
def test_max_pool(shape, kernel, stride, padding, ceil_mode, dtype):
    out, idx = assert_kernel_matches(maxpool2d_kernel, _max_reference, _input(shape, dtype), kernel, stride, padding,
                                     ceil_mode)
    assert idx.dtype == np.int32


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape, kernel, stride, padding, ceil_mode", GEOMETRIES, ids=GEO_IDS)
def test_max_pool_backward(shape, kernel, stride, padding, ceil_mode, dtype):
    x, g = _forward_grad(shape, dtype, kernel, stride, padding, ceil_mode)
    _, idx = aten.max_pool2d_with_indices(torch.as_tensor(x).float(), list(kernel), list(stride), list(padding),
                                          [1, 1], ceil_mode)

    def reference(g, indices, x, *_):
        return aten.max_pool2d_with_indices_backward(_t(g), _t(x), list(kernel), list(stride), list(padding), [1, 1],
                                                     ceil_mode, torch.as_tensor(indices).long()).numpy()

    assert_kernel_matches(maxpool2d_backward_kernel, reference, g, idx.numpy().astype(np.int32), x, kernel, stride,
                          padding, ceil_mode)


@pytest.mark.parametrize("count_include_pad, divisor_override", [(True, None), (False, None), (True, 5)],
                         ids=["with_pad", "without_pad", "override"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape, kernel, stride, padding, ceil_mode", GEOMETRIES, ids=GEO_IDS)
def test_avg_pool_and_its_backward(shape, kernel, stride, padding, ceil_mode, dtype, count_include_pad,
                                   divisor_override):
    x, g = _forward_grad(shape, dtype, kernel, stride, padding, ceil_mode)
    options = (ceil_mode, count_include_pad, divisor_override)

    def forward(x, *_):
        return aten.avg_pool2d(_t(x), list(kernel), list(stride), list(padding), *options).numpy()

    def backward(g, x, *_):
        return aten.avg_pool2d_backward(_t(g), _t(x), list(kernel), list(stride), list(padding), *options).numpy()

    assert_kernel_matches(avgpool2d_kernel, forward, x, kernel, stride, padding, *options)
    assert_kernel_matches(avgpool2d_backward_kernel, backward, g, x, kernel, stride, padding, *options)


def test_the_first_of_equal_maxima_is_the_index():
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 1, 1] = x[0, 0, 1, 0] = 2.0   # the window's second row holds two equal maxima
    _, idx = nki.simulate(maxpool2d_kernel)(x, 2)
    # windows of zeros only: their first position, as torch gives
    want = aten.max_pool2d_with_indices(torch.from_numpy(x), [2, 2])[1][0, 0].tolist()
    assert idx[0, 0].tolist() == [[4, 2], [8, 10]] == want


def test_rows_go_in_bands_that_fit_the_sbuf():
    geo = PoolGeometry((1, 2, 100, 100), (3, 3), (1, 1), (1, 1), False, 4, "maxpool2d_kernel")
    assert (geo.pitch, geo.band_rows, geo.bands) == (102, 78, [(0, 78), (78, 100)])


@pytest.mark.parametrize("kernel, stride, padding, match", [
    ((0, 2), None, 0, "must be positive"), (2, 2, 2, "at most half the kernel"), ((2, 2, 2), 2, 0, "pair of ints")])
def test_a_window_torch_refuses_is_refused(kernel, stride, padding, match):
    with pytest.raises(KernelError, match=match):
        nki.trace_program(maxpool2d_kernel, np.zeros((1, 1, 8, 8), np.float32), kernel, stride, padding)


def test_a_gradient_of_another_shape_is_refused():
    with pytest.raises(KernelError, match=r"grad \[1, 1, 3, 3\] must be the output's \[N, C, 4, 4\]"):
        nki.trace_program(avgpool2d_backward_kernel, np.zeros((1, 1, 3, 3), np.float32),
                          np.zeros((1, 1, 8, 8), np.float32), 2)


def _ph(*shape, dtype=np.float32):
    return np.broadcast_to(np.zeros((), dtype), shape)


# one physical core's share of the CNN's pooling (trn2, LNC=2: half the 32 images)
TIMES = {
    "maxpool": (maxpool2d_kernel, lambda: (_ph(16, 32, 32, 32), 2), 23581.536),
    "maxpool_backward": (maxpool2d_backward_kernel,
                         lambda: (_ph(16, 32, 16, 16), _ph(16, 32, 16, 16, dtype=np.int32), _ph(16, 32, 32, 32), 2),
                         16886.376),
    "avgpool": (avgpool2d_kernel, lambda: (_ph(16, 32, 32, 32), 2), 12266.625),
    "avgpool_backward": (avgpool2d_backward_kernel, lambda: (_ph(16, 32, 16, 16), _ph(16, 32, 32, 32), 2), 11767.457),
}


@pytest.mark.parametrize("name", TIMES)
def test_simulated_time(name):
    kernel, make_args, ns = TIMES[name]
    assert nki.benchmark(kernel)(*make_args()).latency_ns == ns
