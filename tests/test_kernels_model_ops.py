"""Ops the common vision and language models call that used to be timed by a bandwidth
estimate: constant padding (and crops), dropout and its backward, average pooling with a
window larger than its input. Values at instruction fidelity against PyTorch, refusals
by name, and the device timing the ops by these kernels."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trnsim.nki as nki
from trnsim.kernels.elementwise import dropout_backward_kernel, dropout_kernel
from trnsim.kernels.movement import pad_kernel
from trnsim.nki import KernelError
from trnsim.testing import assert_kernel_matches
from tests.test_kernels import arrays


@pytest.mark.parametrize("shape, pads, value", [((2, 3, 5, 7), (1, 2, 3, 0), 0.0), ((4, 300), (0, 5), -1.5),
                                                ((3, 4, 5), (1, 1, 0, 0, 2, 1), 2.0), ((129, 9), (2, 2, 1, 0), 0.0),
                                                ((2, 3, 7, 7), (-1, -2, -1, -2), 0.0),   # a crop
                                                ((2, 3, 7, 7), (-1, 2, 1, 0), 1.0)])     # both
def test_pad_kernel_matches_torch(shape, pads, value):
    x, = arrays(101, torch.float32, shape)
    out = assert_kernel_matches(pad_kernel, lambda a, p, v: F.pad(torch.from_numpy(np.asarray(a, np.float64)), p,
                                                                  value=v).numpy(), x, pads, value)
    assert out.shape == tuple(F.pad(torch.empty(shape), pads).shape)


def test_pad_kernel_refuses_an_odd_count_too_many_pads_or_a_crop_to_nothing():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(KernelError, match=r"pads \[1\] must be \(before, after\) pairs"):
        nki.trace_program(pad_kernel, x, (1,))
    with pytest.raises(KernelError, match="at most one pair per axis of x"):
        nki.trace_program(pad_kernel, x, (1, 1, 1, 1, 1, 1))
    with pytest.raises(KernelError, match=r"crop x \[2, 3\] to nothing"):
        nki.trace_program(pad_kernel, x, (-2, -1))


def test_dropout_kernel_zeroes_about_p_and_scales_the_rest():
    x = np.ones((128, 512), np.float32)
    out, mask = nki.simulate_kernel(dropout_kernel, x, 0.25)
    out, mask = np.asarray(out, np.float32), np.asarray(mask)
    kept = mask.astype(bool)
    assert 0.70 < kept.mean() < 0.80
    np.testing.assert_array_equal(out[kept], np.full(kept.sum(), 1 / 0.75, np.float32))
    assert not out[~kept].any()
    grad = np.full((128, 512), 2.0, np.float32)
    back = np.asarray(nki.simulate_kernel(dropout_backward_kernel, grad, mask, 1 / 0.75), np.float32)
    np.testing.assert_allclose(back, grad * kept / 0.75, rtol=1e-6)
    with pytest.raises(KernelError, match=r"p 1.0 must be in \[0, 1\)"):
        nki.trace_program(dropout_kernel, x, 1.0)


def test_dropout_on_the_device_is_timed_by_its_kernels():
    import trnsim

    d = torch.randn(2, 4, 6, 6).to("neuron").requires_grad_()
    with trnsim.profile() as prof:
        F.dropout(d, 0.1, training=True).sum().backward()
    timed = {r.name: (r.cost.source, r.cost.kernel) for r in prof.records}
    assert timed["aten::native_dropout"] == ("kernel", "dropout_kernel")
    assert timed["aten::native_dropout_backward"] == ("kernel", "dropout_backward_kernel")


def test_constant_pad_nd_as_compiled_graphs_call_it_is_timed_by_pad_kernel():
    """Eager ``F.pad`` decomposes into a fill and a copy (both kernels); a compiled graph
    keeps ``constant_pad_nd`` whole (a negative pad crops), and pad_kernel times it."""
    from trnsim.backend import optable
    from trnsim.backend.lowering import Call

    x = torch.empty(2, 8, 14, 14, device="neuron")
    for pads, kernel in (((1, 2, 0, 1), "pad_kernel"), ((0, 0, 0, 0, 0, 0, 1, 0), "pad_kernel"),
                         ((-1, 0), "pad_kernel"), ((-14, 0), None)):   # a crop to nothing: the estimate
        args = (x, list(pads), 0.0)
        cost = optable.kernel_cost(Call("aten::constant_pad_nd", args, {}, list(args), None))
        assert (cost.kernel if cost is not None else None) == kernel


def test_an_average_pool_window_larger_than_its_input_is_timed_by_the_pool_kernel():
    """HF EfficientNet pools its last [2, 2] feature map with ``AvgPool2d(320,
    ceil_mode=True)``: one window reading the whole map, timed as a window of the map's
    size (a 320-row band does not fit SBUF), forward and backward."""
    from trnsim.backend import optable
    from trnsim.backend.lowering import Call

    x = torch.empty(2, 320, 2, 2, device="neuron")
    g = torch.empty(2, 320, 1, 1, device="neuron")
    fwd = (x, [320, 320], [320, 320], [0, 0], True, True, None)
    back = (g,) + fwd
    for name, args in (("aten::avg_pool2d", fwd), ("aten::avg_pool2d_backward", back)):
        cost = optable.kernel_cost(Call(name, args, {}, list(args), None))
        assert cost is not None and cost.source == "kernel", name
