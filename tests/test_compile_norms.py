"""torch.compile(backend="neuron") of training around norms: batch norm (one kernel with
the ReLU beside it, each way), LayerNorm and RMSNorm with their backward graphs, ReLU's
backward (a comparison and a select), reductions over the batch and spatial axes,
pooling: fused or timed by kernels, and no slower than eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import trnsim
from trnsim.models.prenorm import PreNormBlock


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).to("neuron")


def _train(model: nn.Module, opt: torch.optim.Optimizer, fn, x, loss_of, steps: int):
    """(simulated device ps of ``steps`` training steps after a first one, their losses, the records)."""
    def step() -> float:
        opt.zero_grad()
        loss = loss_of(fn(x))
        loss.backward()
        opt.step()
        return loss.item()

    step()
    torch.neuron.synchronize()
    with trnsim.profile() as prof:
        losses = [step() for _ in range(steps)]
        torch.neuron.synchronize()
    return prof.device_ps, losses, prof.records


def _cnn_run(compiled: bool):
    m = _cnn()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 3, 32, 32, generator=g).to("neuron")
    y = torch.randint(0, 10, (32,), generator=g).to("neuron")
    fn = torch.compile(m, backend="neuron") if compiled else m
    return _train(m, opt, fn, x, lambda out: F.cross_entropy(out, y), steps=2)


def test_cnn_with_batch_norm_trains_no_slower_compiled():
    eager_ps, eager_losses, _ = _cnn_run(False)
    compiled_ps, compiled_losses, records = _cnn_run(True)
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-5)
    assert compiled_ps <= eager_ps
    assert (eager_ps, compiled_ps) == (2_492_739_752, 2_267_700_036)
    # batch norm runs with its ReLU each way; the reductions are fused
    names = {r.name for r in records}
    assert {"fused[_native_batch_norm_legit_functional+relu]", "fused[le+where+native_batch_norm_backward]"} <= names
    assert not names & {"aten::le.Scalar", "aten::where.self", "aten::sum.dim_IntList", "aten::scalar_tensor",
                        "aten::relu", "fused[relu]", "fused[le+where]", "aten::native_batch_norm_backward"}


_FORWARD, _BACKWARD = "fused[_native_batch_norm_legit_functional+relu]", "fused[le+where+native_batch_norm_backward]"


def test_batch_norm_and_its_relu_are_one_kernel_each_way():
    """Compiled, batch norm's forward and the ReLU after it are one kernel (the batch-norm
    kernel applying the ReLU as it writes: the cost of batch norm alone), and ReLU's
    backward (``le`` and ``where``) with batch norm's backward another; each lists its
    aten ops and the eager ops they came from."""
    _, _, eager = _cnn_run(False)
    torch._dynamo.reset()
    _, _, records = _cnn_run(True)
    kernels = [r for r in records if r.name in (_FORWARD, _BACKWARD)]
    # two layers, each way, in each of two steps
    assert [(r.name, r.cost.kernel) for r in kernels] == 2 * [
        (_FORWARD, "batchnorm_kernel[relu]"), (_FORWARD, "batchnorm_kernel[relu]"),
        (_BACKWARD, "batchnorm_backward_kernel[relu]"), (_BACKWARD, "batchnorm_backward_kernel[relu]")]
    assert kernels[0].info["ops"] == ["aten::_native_batch_norm_legit_functional", "aten::relu"]
    assert kernels[2].info["ops"] == ["aten::le.Scalar", "aten::where.self", "aten::native_batch_norm_backward"]
    assert kernels[2].info["from"] == ["aten::threshold_backward"] * 2 + ["aten::native_batch_norm_backward"]
    batch_norms = [r.cost.ps for r in eager if r.name == "aten::native_batch_norm"]
    assert [r.cost.ps for r in kernels[:2]] == batch_norms[:2] == [32_008_231, 22_522_780]


def test_batch_norm_in_eval_runs_with_its_relu():
    m = _cnn().eval()
    fn = torch.compile(m, backend="neuron")
    x = torch.randn(4, 3, 32, 32).to("neuron")
    with torch.no_grad():
        out, kernels = _kernels(fn, x)
        torch.testing.assert_close(out.cpu(), m.cpu()(x.cpu()), rtol=1e-5, atol=1e-5)
    names = [k.name for k in kernels]
    assert names.count("fused[_native_batch_norm_legit_no_training+relu]") == 2
    assert not {"fused[relu]", "aten::relu", "fused[relu+mean]"} & set(names)


def test_compiled_batch_norm_with_relu_in_instruction_fidelity():
    """In instruction fidelity the forward's fused kernel computes batch norm and ReLU
    with the chip's numerics, the backward's runs its ops as eager does: a training step
    gives the CPU's loss, gradients and running statistics."""
    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(8 * 4 * 4, 10))

    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    cpu = model()
    F.cross_entropy(cpu(x), y).backward()
    m = model().to("neuron")
    trnsim.set_fidelity("instruction")
    try:
        with trnsim.profile() as prof:
            loss = F.cross_entropy(torch.compile(m, backend="neuron")(x.to("neuron")), y.to("neuron"))
            loss.backward()
    finally:
        trnsim.set_fidelity("op")
    assert {_FORWARD, _BACKWARD} <= {r.name for r in prof.records}
    for got, want in zip(m.parameters(), cpu.parameters()):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m[1].running_var.cpu(), cpu[1].running_var)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_no_op_of_a_conv_batch_norm_group_norm_pooling_training_step_is_estimated(compiled):
    """Convolutions (stride 1 and 2) and their gradients, batch norm and group norm
    forward and backward, max pooling, average pooling (overlapping windows with
    padding) and adaptive average pooling and their gradients, in training and in
    eval: every op is timed by a kernel's Program, none by the bandwidth estimate."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GroupNorm(4, 32), nn.ReLU(),
                      nn.AvgPool2d(3, stride=1, padding=1), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                      nn.Linear(128, 10)).to("neuron")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 3, 16, 16).to("neuron"), torch.randint(0, 10, (8,)).to("neuron")
    fn = torch.compile(m, backend="neuron") if compiled else m
    _, _, records = _train(m, opt, fn, x, lambda out: F.cross_entropy(out, y), steps=1)
    m.eval()
    with torch.no_grad(), trnsim.profile() as prof:
        fn(x)
    rows = prof.summary()
    timed = {r.name: r.cost.source for r in records} | {row.name: row.source for row in rows}
    assert {n for n, source in timed.items() if source == "estimate"} == set()
    norms = {"aten::native_group_norm_backward", "aten::native_group_norm", "aten::max_pool2d_with_indices",
             "aten::max_pool2d_with_indices_backward", "aten::avg_pool2d", "aten::avg_pool2d_backward",
             "aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d_backward"}
    assert norms <= set(timed)
    assert any("batch_norm_legit_no_training" in n or n == "aten::native_batch_norm" for n in {r.name for r in rows})


@pytest.mark.parametrize("norm,times", [("layernorm", (1_147_792_988, 840_257_252)),
                                        ("rmsnorm", (1_564_932_196, 786_437_908))])
def test_transformer_block_trains_no_slower_compiled(norm, times):
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = PreNormBlock(norm=norm).to("neuron")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x = torch.randn(4, 128, 128, generator=torch.Generator().manual_seed(1)).to("neuron")
        fn = torch.compile(m, backend="neuron") if compiled else m
        runs.append(_train(m, opt, fn, x, lambda out: out.pow(2).mean(), steps=2))
    (eager_ps, eager_losses, _), (compiled_ps, compiled_losses, records) = runs
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-5)
    assert compiled_ps <= eager_ps
    assert (eager_ps, compiled_ps) == times
    # the norms' weight gradients (sums over the tokens) and the q/k/v gradients' selects are fused
    names = {r.name for r in records if r.info is not None}
    assert not names & {"aten::sum.dim_IntList", "aten::where.self", "aten::eq.Scalar", "aten::full"}


def _kernels(fn, *args):
    torch.neuron.synchronize()
    with trnsim.profile() as prof:
        out = fn(*args)
        torch.neuron.synchronize()
    return out, [r for r in prof.records if r.info is not None]


@pytest.mark.parametrize("fidelity", ["op", "instruction"])
def test_reduction_over_channels_fuses_with_its_elementwise_chain(fidelity):
    """Batch norm's backward written out: a ReLU mask, sums over the batch and spatial
    axes, per-channel arithmetic on their [C] results, broadcast back: one kernel
    laying the channels along its rows, with the CPU's values in both fidelities."""
    def bn_backward(g, y, x, mean, rstd, w):
        g = torch.where(y <= 0, 0.0, g)
        k = g.numel() / g.shape[1]
        s1 = g.sum(dim=(0, 2, 3))
        xc = x - mean[None, :, None, None]
        s2 = (g * xc).sum(dim=(0, 2, 3))
        c = (s2 / k * rstd * rstd)[None, :, None, None]
        dx = (g - xc * c - (s1 / k)[None, :, None, None]) * (rstd * w)[None, :, None, None]
        return dx, s1, s2 * rstd

    torch.manual_seed(0)
    cpu = [torch.randn(4, 8, 6, 6), torch.randn(4, 8, 6, 6), torch.randn(4, 8, 6, 6), torch.randn(8),
           torch.rand(8) + 0.5, torch.randn(8)]
    trnsim.set_fidelity(fidelity)
    try:
        out, kernels = _kernels(torch.compile(bn_backward, backend="neuron"), *[t.to("neuron") for t in cpu])
    finally:
        trnsim.set_fidelity("op")
    assert [k.name for k in kernels] == ["fused[le+where+sum+sub+mul+sum+div+mul+...8 more]"]
    for got, want in zip(out, bn_backward(*cpu)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_values_known_when_compiling_cost_nothing():
    """``full`` and ``arange``, and comparisons of them, are computed by the compiler:
    only the select and the add they feed run, as one kernel."""
    def stack_grad(a, b):
        i = torch.arange(2, device=a.device).view(2, 1, 1)
        z = torch.full((2, 64, 64), 0.0, device=a.device)
        return torch.where(i == 0, a, z) + torch.where(i == 1, b, z)

    a, b = torch.randn(64, 64).to("neuron"), torch.randn(64, 64).to("neuron")
    out, kernels = _kernels(torch.compile(stack_grad, backend="neuron"), a, b)
    assert [k.name for k in kernels] == ["fused[where+where+add]"]
    torch.testing.assert_close(out.cpu(), torch.stack([a.cpu(), b.cpu()]))


def test_a_lone_reduction_runs_as_the_faster_kernel():
    """A reduction with nothing to fuse keeps its own kernel where that is faster, and
    the kernel says why it was not fused."""
    x = torch.randn(16, 64, 8, 8).to("neuron")
    _, kernels = _kernels(torch.compile(lambda t: t.mean(dim=(2, 3)), backend="neuron"), x)
    assert [k.name for k in kernels] == ["aten::mean.dim"]
    assert kernels[0].info["not_fused"] == "aten::mean.dim alone: its own kernel is faster than a fused kernel of it"


def test_relu_backward_left_whole_joins_batch_norm_backward():
    """A graph that keeps ``threshold_backward`` whole (traced without decompositions)
    fuses it into batch norm's backward as it does its ``le`` and ``where``; a ReLU
    backward whose masked gradient is also read elsewhere stays apart."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from trnsim.backend.compile.partition import partition

    aten = torch.ops.aten

    def backward(g, x, r, w, mean, invstd, also_read):
        masked = aten.threshold_backward(g, r, 0.0)
        dx = aten.native_batch_norm_backward(masked, x, w, None, None, mean, invstd, True, 1e-5, [True, True, True])
        return (dx, masked * 2) if also_read else dx

    t = [torch.randn(4, 8, 6, 6).to("neuron") for _ in range(3)] + [torch.rand(8).to("neuron") + 0.5
                                                                    for _ in range(3)]
    ran = {}
    for also_read in (False, True):
        gm = make_fx(lambda *a, also_read=also_read: backward(*a, also_read))(*t)
        ran[also_read] = [(g.kind, g.ops) for g in partition(gm, lambda r, rows, sizes: True) if g.kind != "free"]
    assert ran[False] == [("norm", ["aten::threshold_backward", "aten::native_batch_norm_backward"])]
    assert ran[True][:2] == [("op", ["aten::threshold_backward"]), ("op", ["aten::native_batch_norm_backward"])]
