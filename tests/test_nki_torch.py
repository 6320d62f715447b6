"""NKI kernels called on torch tensors, and as custom ops (trnsim.backend.nkicall)."""

import numpy as np
import pytest
import torch

import trnsim
import trnsim.nki as nki
import trnsim.nki.language as nl
from trnsim.backend import state


@nki.jit
def add_kernel(a, b):
    """a + b: a, b [P<=128, F] in HBM, any chip float dtype; returns a new HBM tensor."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


@nki.jit
def scale_into(x, out, factor=2.0):
    """out = x * factor (destination passing): x, out [P<=128, F] in HBM."""
    nl.store(out, nl.multiply(nl.load(x), factor))


@nki.jit
def add_rows(a, b):
    """a + b over a launch grid: instance i adds rows [128 i, 128 i + 128) of [128 g, F]."""
    i = nl.program_id(0)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    rows = nl.ds(i * 128, 128)
    nl.store(out[rows, :], nl.add(nl.load(a[rows, :]), nl.load(b[rows, :])))
    return out


@pytest.fixture
def fidelity(request):
    trnsim.set_fidelity(getattr(request, "param", "op"))
    yield request.param if hasattr(request, "param") else "op"
    trnsim.set_fidelity("op")


def _inputs(dtype=torch.float32, shape=(128, 256)):
    g = torch.Generator().manual_seed(0)
    return torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)


def _kernel_ps(kernel, *arrays, **kwargs) -> int:
    """The kernel's own simulated latency (nki.benchmark on numpy arrays), in ps."""
    return nki.benchmark(kernel)(*arrays, **kwargs).run.total_ps


def test_value_returning_kernel_on_neuron_tensors_gives_neuron_tensors_with_torch_values():
    a, b = _inputs()
    out = add_kernel(a.to("neuron"), b.to("neuron"))
    assert isinstance(out, torch.Tensor) and out.device.type == "neuron" and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), a + b, rtol=0, atol=0)


def test_destination_passing_kernel_writes_the_neuron_tensor_in_place():
    a, _ = _inputs()
    x = a.to("neuron")
    out = torch.empty_like(x)
    assert scale_into(x, out, factor=3.0) is None
    torch.testing.assert_close(out.cpu(), a * 3.0, rtol=0, atol=0)


def test_the_device_clock_advances_by_the_launch_and_the_kernels_simulated_time():
    a, b = _inputs()
    x, y = a.to("neuron"), b.to("neuron")
    torch.neuron.synchronize()
    before, ops = state.clock.device, state.clock.ops
    add_kernel(x, y)
    torch.neuron.synchronize()
    assert state.clock.ops == ops + 1
    expected = state.chip().runtime.op_launch_ps + _kernel_ps(add_kernel, a.numpy(), b.numpy())
    assert state.clock.device - before == expected


def test_the_profile_shows_the_kernel_by_name_with_its_engine_slices():
    a, b = _inputs()
    x, y = a.to("neuron"), b.to("neuron")
    with trnsim.profile() as prof:
        add_kernel(x, y)
    (rec,) = prof.records
    assert rec.name == "add_kernel" and rec.cost.source == "kernel" and rec.cost.kernel == "add_kernel"
    assert rec.end_ps - rec.start_ps == _kernel_ps(add_kernel, a.numpy(), b.numpy())
    assert rec.shapes == ((128, 256), (128, 256))
    slices = prof.trace().slices
    assert [s.name for s in slices if s.track == "ops"] == ["add_kernel"]
    engine = [s for s in slices if s.track not in ("ops", "host")]
    assert engine and all(0 <= s.start_ns and s.start_ns + s.dur_ns <= (rec.end_ps - rec.start_ps) / 1000 + 1e-6
                          for s in engine)
    assert "add_kernel" in str(prof.summary())


def test_cpu_tensors_in_give_cpu_tensors_out_and_charge_nothing():
    a, b = _inputs()
    ops = state.clock.ops
    out = add_kernel(a, b)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    dst = torch.zeros_like(a)
    scale_into(a, dst)
    torch.testing.assert_close(dst, a * 2, rtol=0, atol=0)
    assert state.clock.ops == ops


def test_bf16_tensors():
    a, b = _inputs(torch.bfloat16)
    out = add_kernel(a.to("neuron"), b.to("neuron"))
    assert out.dtype == torch.bfloat16 and out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), a + b, rtol=0, atol=0)


@pytest.mark.parametrize("fidelity", ["timing"], indirect=True)
def test_timing_fidelity_times_the_kernel_on_shapes(fidelity):
    a, b = _inputs()
    x, y = torch.empty(128, 256, device="neuron"), torch.empty(128, 256, device="neuron")
    torch.neuron.synchronize()
    before = state.clock.device
    out = add_kernel(x, y)
    torch.neuron.synchronize()
    assert out.shape == (128, 256) and out.device.type == "neuron"
    assert state.clock.device - before == state.chip().runtime.op_launch_ps + _kernel_ps(add_kernel, a.numpy(),
                                                                                          b.numpy())


def test_mixed_devices_and_unsupported_dtypes_are_refused():
    a, b = _inputs()
    with pytest.raises(trnsim.TrnSimError, match="both neuron and CPU"):
        add_kernel(a.to("neuron"), b)
    with pytest.raises(trnsim.TrnSimError, match="torch.int64"):
        add_kernel(a.long(), b.long())


def test_wrap_nki_launches_a_grid_on_neuron_tensors():
    a, b = _inputs(shape=(256, 64))
    wrapped = nki.wrap_nki(add_rows)
    out = wrapped[2](a.to("neuron"), b=b.to("neuron"))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), a + b, rtol=0, atol=0)


# -- nki_op: a custom op, one node under torch.compile, trained with register_autograd --

@nki.nki_op("trnsim_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    scale_into(x, out)
    return out


def _double_backward(ctx, grad):
    return double(grad)


double.register_autograd(_double_backward)


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        return double(self.lin(x)).relu()


def test_nki_op_is_a_custom_op_with_the_kernels_values():
    a, _ = _inputs()
    out = double(a.to("neuron"))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), a * 2, rtol=0, atol=0)
    assert isinstance(torch.ops.trnsim_test.double.default, torch._ops.OpOverload)


def test_nki_op_in_a_compiled_model_is_one_node_timed_by_its_kernel():
    torch.manual_seed(0)
    model = _Model().to("neuron")
    reference = _Model()
    reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    x = torch.randn(128, 64)
    compiled = torch.compile(model, backend="neuron")
    xn = x.to("neuron")
    with trnsim.profile() as prof:
        out = compiled(xn)
    torch.testing.assert_close(out.cpu(), reference(x), rtol=1e-5, atol=1e-5)
    mine = [r for r in prof.records if r.info and "trnsim_test::double" in r.info["ops"]]
    assert len(mine) == 1 and mine[0].info["ops"] == ["trnsim_test::double"]
    assert mine[0].name == "scale_into" and mine[0].cost.kernel == "scale_into"
    assert mine[0].end_ps - mine[0].start_ps == _kernel_ps(scale_into, np.zeros((128, 64), np.float32),
                                                           np.zeros((128, 64), np.float32))
    assert all(r.info is not None for r in prof.records)   # no eager op: no graph break around the op
    assert len({r.info["graph"] for r in prof.records}) == 1
    slices = prof.trace().slices
    assert any(s.track == "ops" and s.name == "scale_into" for s in slices)


@pytest.mark.parametrize("compile_model", [False, True])
def test_register_autograd_trains(compile_model):
    torch.manual_seed(0)
    model = _Model().to("neuron")
    reference = _Model()
    reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    x = torch.randn(128, 64)
    run = torch.compile(model, backend="neuron") if compile_model else model
    run(x.to("neuron")).square().sum().backward()
    reference(x).square().sum().backward()
    torch.testing.assert_close(model.lin.weight.grad.cpu(), reference.lin.weight.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(model.lin.bias.grad.cpu(), reference.lin.bias.grad, rtol=1e-5, atol=1e-4)


def test_a_bare_kernel_call_in_a_compiled_function_runs_on_the_timeline_between_graphs():
    a, b = _inputs(shape=(128, 64))
    x, y = a.to("neuron"), b.to("neuron")

    def f(p, q):
        return add_kernel(p.sin(), q) * 2

    with trnsim.profile() as prof:
        out = torch.compile(f, backend="neuron")(x, y)
    torch.testing.assert_close(out.cpu(), (a.sin() + b) * 2, rtol=1e-6, atol=1e-6)
    assert [r.name for r in prof.records if r.info is None] == ["add_kernel"]


@nki.nki_op("trnsim_test::scale_", mutates_args=("out",))
def scale_(x: torch.Tensor, out: torch.Tensor) -> None:
    scale_into(x, out)


def test_an_nki_op_that_writes_its_argument_is_one_node_timed_by_its_kernel_when_compiled():
    a, _ = _inputs(shape=(128, 64))
    x = a.to("neuron")

    def f(p):
        out = torch.empty_like(p)
        scale_(p.sin(), out)
        return out + 1

    with trnsim.profile() as prof:
        out = torch.compile(f, backend="neuron")(x)
    torch.testing.assert_close(out.cpu(), a.sin() * 2 + 1, rtol=1e-6, atol=1e-6)
    (mine,) = [r for r in prof.records if r.name == "scale_into"]
    assert mine.cost.source == "kernel" and mine.info is not None
    assert mine.end_ps - mine.start_ps == _kernel_ps(scale_into, np.zeros((128, 64), np.float32),
                                                     np.zeros((128, 64), np.float32))


# -- torch_neuronx.xla_impl.ops.nki_jit: the legacy PyTorch entry point ------------------

def add_rows_into(a_input, b_input, c_output):
    """c_output = a_input + b_input, destination passing, undecorated as legacy kernels are:
    instance i of a grid of g adds rows [64 i, 64 i + 64) of [64 g, F] HBM tensors."""
    import neuronxcc.nki.language as legacy_nl

    rows = legacy_nl.ds(legacy_nl.program_id(0) * 64, 64)
    legacy_nl.store(c_output[rows, :], value=legacy_nl.add(legacy_nl.load(a_input[rows, :]),
                                                            legacy_nl.load(b_input[rows, :])))


def test_nki_jit_runs_a_destination_passing_kernel_on_neuron_tensors():
    import torch_neuronx
    from torch_neuronx.xla_impl.ops import nki_jit

    assert torch_neuronx.nki_jit is nki_jit
    a, b = _inputs(shape=(128, 64))
    x, y = a.to("neuron"), b.to("neuron")
    c = torch.zeros((128, 64), device="neuron")
    call = nki_jit()(add_rows_into)
    torch.neuron.synchronize()
    before, ops = state.clock.device, state.clock.ops
    assert call[2](x, y, c) is None
    torch.neuron.synchronize()
    after, ops_after = state.clock.device, state.clock.ops
    torch.testing.assert_close(c.cpu(), a + b, rtol=0, atol=0)
    assert ops_after == ops + 1
    own = _kernel_ps(nki.jit(add_rows_into)[2], a.numpy(), b.numpy(), np.zeros((128, 64), np.float32))
    assert after - before == state.chip().runtime.op_launch_ps + own


def test_nki_jit_as_a_decorator_on_cpu_tensors():
    from torch_neuronx.xla_impl.ops import nki_jit

    decorated = nki_jit(add_rows_into)
    a, b = _inputs(shape=(64, 32))
    c = torch.zeros((64, 32))
    ops = state.clock.ops
    decorated(a, b, c)
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)
    assert state.clock.ops == ops
    out = nki_jit(add_kernel)(a, b)   # a value-returning @nki.jit kernel returns its outputs
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)


# -- the front end reaches torch only through what the device registers ---------------

def test_the_nki_front_end_imports_no_torch_integration():
    import ast
    from pathlib import Path

    root = Path(nki.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("trnsim.backend") for n in names), f"{path} imports {names}"


def test_the_device_registers_its_adapter_and_entry_points():
    from trnsim import adapters
    from trnsim.backend import nkicall

    assert adapters.array_adapter_for([np.ones(2), [torch.ones(2)]]).name == "torch"
    assert adapters.array_adapter_for([np.ones(2), 3.0]) is None
    assert nki.nki_op is nkicall.nki_op and nki.wrap_nki is nkicall.wrap_nki


def test_nki_op_without_the_torch_integration_names_the_import(monkeypatch):
    from trnsim import adapters

    monkeypatch.setattr(adapters, "_entry_points", {})
    with pytest.raises(AttributeError, match=r"trnsim\.nki\.nki_op comes with trnsim's PyTorch integration.*"
                                             r"import trnsim\.backend"):
        _ = nki.nki_op
