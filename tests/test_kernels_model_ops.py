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
from trnsim.kernels.movement import pad_kernel, slice_scatter_kernel
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


@pytest.mark.parametrize("base, src, dim, start, end, step", [((2, 4, 32, 16), (2, 4, 32, 8), 3, 8, 16, 1),
                                                              ((6, 5), (2, 5), 0, 1, 5, 2)])
def test_slice_scatter_kernel_matches_torch(base, src, dim, start, end, step):
    b, s = arrays(102, torch.float32, base, src)
    expected = torch.slice_scatter(torch.from_numpy(np.asarray(b)), torch.from_numpy(np.asarray(s)), dim, start, end,
                                   step).numpy()
    assert_kernel_matches(slice_scatter_kernel, lambda *_, **__: expected, b, s, dim=dim, start=start, end=end,
                          step=step)


def test_slice_scatter_kernel_refuses_a_source_of_another_shape():
    with pytest.raises(KernelError, match=r"src \[2, 3\] is not the slice 0:4:2 of axis 0 of base \[4, 4\]"):
        nki.trace_program(slice_scatter_kernel, np.zeros((4, 4), np.float32), np.zeros((2, 3), np.float32), 0, 0, 4, 2)
    with pytest.raises(KernelError, match=r"that slice is \[2, 4\]"):
        nki.trace_program(slice_scatter_kernel, np.zeros((4, 4), np.float32), np.zeros((3, 4), np.float32), 0, 0, 4, 2)


def test_mask_and_copy_ops_of_compiled_graphs_are_timed_by_kernels():
    """What a compiled Llama's and Swin's graphs call besides matmuls and norms: mask
    arithmetic on bools, fills like another tensor, copies, slice scatters; and an op on
    empty tensors does no device work."""
    from trnsim.backend import costs

    def timed(name, *args):
        out = getattr(torch.ops.aten, name.split(".")[0]).default(*args) if "." not in name else None
        cost = costs.op_cost(f"aten::{name}", args, {}, [a for a in args if isinstance(a, torch.Tensor)], out)
        return cost.source, cost.kernel

    mask = torch.ones(2, 32, dtype=torch.bool, device="neuron")
    x = torch.randn(64, 256, device="neuron")
    assert timed("bitwise_and.Tensor", mask, mask) == ("kernel", "binary_kernel[bitwise_and]")
    assert timed("bitwise_not", mask) == ("kernel", "scalar_kernel[equal]")
    assert timed("logical_not", x) == ("kernel", "scalar_kernel[equal]")
    assert timed("isneginf", x) == ("kernel", "scalar_kernel[equal]")
    assert timed("full_like", x, 0.0) == ("kernel", "fill_kernel")
    assert timed("lift_fresh_copy", x) == ("kernel", "cast_kernel")
    base, src = torch.zeros(2, 4, 32, 16, device="neuron"), torch.ones(2, 4, 32, 8, device="neuron")
    assert timed("slice_scatter", base, src, 3, 8, 16) == ("kernel", "slice_scatter_kernel")
    empty = torch.zeros(0, device="neuron")
    assert timed("zero_", empty) == ("none", "")


def test_where_uniform_rounding_and_arange_kernels_compute_their_ops():
    from trnsim.kernels.elementwise import arange_kernel, rounding_kernel, uniform_kernel, where_kernel

    cond = (np.arange(600).reshape(3, 200) % 3 == 0).astype(np.uint8)
    x, y = arrays(103, torch.float32, (3, 200), (3, 200))
    assert_kernel_matches(where_kernel, lambda c, a, b: np.where(c != 0, a, b), cond, x, y)
    u = np.asarray(nki.simulate_kernel(uniform_kernel, (128, 300), -2.0, 3.0), np.float32)
    assert u.min() >= -2.0 and u.max() < 3.0 and abs(u.mean() - 0.5) < 0.05 and len(np.unique(u)) > 30000
    v = np.array([[-1.5, -0.2, 0.0, 0.7, 2.5, 3.0]], np.float32)
    for op in ("floor", "ceil", "trunc"):
        np.testing.assert_array_equal(np.asarray(nki.simulate_kernel(rounding_kernel, v, op)), getattr(np, op)(v) + 0.0)
    for n, start, step in ((5, 0, 1), (300, 3, 2), (128 * 4097 + 7, -5, 1)):
        np.testing.assert_array_equal(np.asarray(nki.simulate_kernel(arange_kernel, n, start, step)),
                                      np.arange(start, start + n * step, step))
    with pytest.raises(KernelError, match="low 1.0 must be below high 1.0"):
        nki.trace_program(uniform_kernel, (4, 4), 1.0, 1.0)
    with pytest.raises(KernelError, match="op 'round' is not one of"):
        nki.trace_program(rounding_kernel, v, "round")


def test_indexing_loss_and_random_ops_of_common_models_are_timed_by_kernels():
    """The rest of what ConvNeXt, ViT, Swin and a Llama call in a training step, eager or
    compiled: each by its kernel, and an indexing the kernels do not take by the estimate."""
    from trnsim.backend import costs

    def timed(name, *args):
        base, _, overload = name.partition(".")
        out = getattr(getattr(torch.ops.aten, base), overload or "default")(*args) if name in PLAIN else None
        cost = costs.op_cost(f"aten::{name}", args, {}, [a for a in args if isinstance(a, torch.Tensor)], out)
        return cost.source, cost.kernel

    PLAIN = {"where.self", "floor", "gather", "scatter.value"}
    dev = "neuron"
    cond, x = torch.ones(64, 1, dtype=torch.bool, device=dev), torch.randn(64, 256, device=dev)
    table, idx = torch.randn(169, 4, device=dev), torch.randint(0, 169, (2401,), device=dev)
    target = torch.randint(0, 256, (64, 1), device=dev)
    assert timed("where.self", torch.ones(64, 256, dtype=torch.bool, device=dev), x, x) == ("kernel", "where_kernel")
    assert timed("floor", x) == ("kernel", "rounding_kernel[floor]")
    assert timed("index.Tensor", table, [idx]) == ("kernel", "embedding_kernel")
    assert timed("index.Tensor", table, [None, torch.tensor([0, 1], device=dev)])[0] == "estimate"
    assert timed("index_put", table, [idx[:50]], torch.randn(50, 4, device=dev), True) == \
        ("kernel", "cast_kernel + embedding_backward_kernel")
    assert timed("gather", x, -1, target) == ("kernel", "embedding_kernel")
    assert timed("scatter.value", x, 1, target, 1.0) == ("kernel", "cast_kernel + embedding_backward_kernel")
    assert timed("select_backward", torch.randn(2, 64, device=dev), [2, 65, 64], 1, 0) == ("kernel", "pad_kernel")
    assert timed("slice_backward", torch.randn(2, 8, device=dev), [2, 16], 1, 8, 16, 1) == ("kernel", "pad_kernel")
    g = torch.randn(2, 8, device=dev)
    negative, positive = (costs.op_cost("aten::slice_backward", a, {}, [g], None).ps
                          for a in ((g, [2, 16], 1, -8, 2**63 - 1, 1), (g, [2, 16], 1, 8, 16, 1)))
    assert negative == positive   # -8: the last eight, as 8:16
    assert timed("as_strided_scatter", torch.zeros(64, device=dev), torch.ones(2, 32, device=dev), [2, 32], [32, 1],
                 0) == ("kernel", "slice_scatter_kernel")
    out = torch.empty(32, dtype=torch.int64, device=dev)
    assert costs.op_cost("aten::arange.start_out", (0, 32, 1), {"out": out}, [out], out).kernel == "arange_kernel"
    assert cond.any()   # (a device tensor of bools made on the way)


def test_in_place_scatters_write_their_rows_alone_and_copies_of_nothing_cost_nothing():
    """``cache[idx] = row`` (``_index_put_impl_``) writes one row, not the table; out of
    place the table is copied first. A ``to`` that returns its input, and an op that
    writes only empty tensors, do no device work. The cores share a slice scatter, as
    they share the padding it is."""
    from trnsim.backend import costs

    dev = "neuron"
    cache = torch.zeros(8192, 4096, dtype=torch.bfloat16, device=dev)
    idx, row = torch.tensor([5], device=dev), torch.ones(1, 4096, dtype=torch.bfloat16, device=dev)
    flat = [cache, idx, row]
    in_place = costs.op_cost("aten::_index_put_impl_", (cache, [idx], row, False, False), {}, flat, cache)
    copied = costs.op_cost("aten::index_put", (cache, [idx], row, False), {}, flat, None)
    # a chain of small DMAs (the index, the row, the row in the table, the write back)
    assert in_place.kernel == "embedding_backward_kernel" and in_place.ps < 15_000_000
    assert copied.ps > 10 * in_place.ps   # 64 MiB copied first
    x = torch.randn(4, 8, device=dev)
    assert costs.op_cost("aten::to.dtype", (x, torch.float32), {}, [x], x).source == "none"
    assert costs.op_cost("aten::new_ones", (x, [0]), {}, [x], torch.ones(0, device=dev)).source == "none"
    base, src = torch.zeros(4, 16, device=dev), torch.ones(4, 16, device=dev)
    assert costs.op_cost("aten::slice_scatter", (base, src, 1, -20), {}, [base, src], None).kernel == \
        "slice_scatter_kernel"   # torch clamps a start before the axis to 0
    g = torch.randn(64, 1, 768, device=dev)
    back = costs.op_cost("aten::slice_backward", (g, [64, 197, 768], 1, 0, 1, 1), {}, [g], None)
    pad = costs.op_cost("aten::constant_pad_nd", (g, [0, 0, 0, 196], 0.0), {}, [g], None)
    assert back.ps == pad.ps
