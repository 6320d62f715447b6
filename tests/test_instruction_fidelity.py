"""Instruction fidelity on the neuron device: ops with a kernel take their results from
running it instruction by instruction (chip numerics), in the op fidelity's time; ops
without one keep PyTorch's CPU numerics."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trnsim
import trnsim.nki as nki
from trnsim.backend import instruction, state
from trnsim.backend.lowering import Call
from trnsim.kernels.gemm import matmul_general
from trnsim.kernels.softmax import softmax_kernel


@pytest.fixture
def runs(monkeypatch):
    """Instruction fidelity for one test (op again after it); yields the list of kernel
    runs made, each the RunResult of one op."""
    made = []
    execute = instruction.execute

    def counted(launch):
        result, run = execute(launch)
        made.append(run)
        return result, run

    monkeypatch.setattr(instruction, "execute", counted)
    trnsim.set_fidelity("instruction")
    yield made
    trnsim.set_fidelity("op")


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


X, Y, W = _randn(70, 200, seed=1), _randn(70, 200, seed=2), _randn(200, 150, seed=3)
B3, C3 = _randn(3, 40, 50, seed=4), _randn(3, 50, 60, seed=5)
IMG, FILT = _randn(2, 8, 9, 9, seed=6), _randn(6, 8, 3, 3, seed=7)

# name -> f(*tensors), its tensors; every op here has a kernel that takes it
FP32_OPS = {
    "mm": (lambda x, w: x @ w, (X, W)),
    "addmm": (lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0), (W[0], X, W)),
    "linear": (lambda x, w, b: F.linear(x, w.T, b), (X, W, W[1])),
    "bmm": (lambda a, b: torch.bmm(a, b), (B3, C3)),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b), (C3[:, :40, :], B3, C3)),
    "mv": (lambda x, v: x @ v, (X, W[:, 0])),
    "exp": (torch.exp, (X,)),
    "neg": (torch.neg, (X,)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (X,)),
    "silu": (F.silu, (X,)),
    "add": (torch.add, (X, Y)),
    "sub_row": (lambda x, y: x - y[0], (X, Y)),
    "mul_column": (lambda x, y: x * y[:, :1], (X, Y)),
    "max_column_first": (lambda x, y: torch.maximum(y[:, :1], x), (X, Y)),
    "div_scalar": (lambda x: x / 3.0, (X,)),
    "rsub_scalar": (lambda x: 1.0 - x, (X,)),
    "pow": (lambda x: x ** 1.5, (X.abs(),)),
    "gt": (lambda x, y: x > y, (X, Y)),
    "sum": (lambda x: x.sum(0), (X,)),
    "mean_keepdim": (lambda x: x.mean(1, keepdim=True), (X,)),
    "amax": (lambda x: x.amax(), (X,)),
    "softmax": (lambda x: x.softmax(0), (X,)),
    "log_softmax": (lambda x: F.log_softmax(x, -1), (X,)),
    "index_select": (lambda x, i: x.index_select(1, i), (X, torch.tensor([5, 0, 199, 5]))),
    "embedding": (lambda w, i: F.embedding(i, w), (W, torch.tensor([[1, 2], [199, 0]]))),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=2), (IMG, FILT, FILT[:, 0, 0, 0])),
    "cat": (lambda x, y: torch.cat([x, y], 1), (X, Y)),
}


@pytest.mark.parametrize("name", FP32_OPS)
def test_fp32_ops_run_their_kernel_and_match_the_cpu(runs, name):
    f, ts = FP32_OPS[name]
    got = f(*(t.to("neuron") for t in ts))
    assert runs and all(r is not None for r in runs), "the op's kernel ran"
    want = f(*ts)
    assert got.device.type == "neuron" and got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=2e-5, atol=2e-5)


def _chip_matmul_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The chip's bf16 matmul for K <= 1024 (one chunk): exact products of the bf16
    inputs accumulated in fp32 in K order, rounded to bf16 at the end."""
    a64, b64 = a.double().numpy(), b.double().numpy()
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc = (acc.astype(np.float64) + a64[:, k, None] * b64[None, k, :]).astype(np.float32)
    return torch.from_numpy(acc).to(torch.bfloat16)


def test_bf16_matmul_has_the_chips_rounding(runs):
    a, b = _randn(64, 1000, seed=8, dtype=torch.bfloat16), _randn(1000, 96, seed=9, dtype=torch.bfloat16)
    got = (a.to("neuron") @ b.to("neuron")).cpu()
    chip = _chip_matmul_bf16(a, b)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, chip)
    # fp32 accumulation shows: the exactly rounded product differs somewhere
    exact = torch.from_numpy(a.double().numpy() @ b.double().numpy()).float().to(torch.bfloat16)
    assert not torch.equal(got, exact)


def test_results_are_those_of_nki_simulate(runs):
    a, b = _randn(100, 300, seed=10, dtype=torch.bfloat16), _randn(300, 70, seed=11, dtype=torch.bfloat16)
    got = (a.to("neuron") @ b.to("neuron")).cpu()
    direct = nki.simulate(matmul_general, chip=state.chip())(nki.typed(a.float().numpy().T, "bfloat16"),
                                                             nki.typed(b.float().numpy(), "bfloat16"),
                                                             dtype="bfloat16")
    assert torch.equal(got, torch.from_numpy(direct).to(torch.bfloat16))
    x = _randn(130, 64, seed=12)
    got = x.to("neuron").softmax(-1).cpu()
    assert torch.equal(got, torch.from_numpy(nki.simulate(softmax_kernel, chip=state.chip())(x.numpy())))


def test_in_place_and_out_variants_write_their_destination(runs):
    x, y = X.to("neuron"), Y.to("neuron")
    same = x.clone()
    assert same.mul_(y) is same
    torch.testing.assert_close(same.cpu(), X * Y)
    out = torch.empty(70, 200, device="neuron")
    assert torch.exp(x, out=out) is out
    torch.testing.assert_close(out.cpu(), X.exp())
    mm_out = torch.empty(70, 150, device="neuron")
    torch.mm(x, W.to("neuron"), out=mm_out)
    torch.testing.assert_close(mm_out.cpu(), X @ W, rtol=2e-5, atol=2e-5)
    bias = W[0].expand(70, 150).contiguous().to("neuron")
    bias.addmm_(x, W.to("neuron"))
    torch.testing.assert_close(bias.cpu(), W[0] + X @ W, rtol=2e-5, atol=2e-5)
    view = x.clone()[:, :100]   # a strided destination
    view.add_(1.0)
    torch.testing.assert_close(view.cpu(), X[:, :100] + 1)
    assert len(runs) >= 5 and all(r is not None for r in runs)


@pytest.mark.parametrize("name,f,ts", [
    ("int64 add", lambda a, b: a + b, (torch.arange(12), torch.arange(12))),
    ("float64 mm", lambda a, b: a @ b, (X.double(), W.double())),
    ("add with alpha", lambda a, b: torch.add(a, b, alpha=2), (X, Y)),
    ("mixed dtypes", lambda a, b: a + b, (X, Y.to(torch.bfloat16))),
    ("cumsum (no kernel)", lambda a: a.cumsum(0), (X,)),
    ("var (no kernel)", lambda a: a.var(1), (X,)),
])
def test_ops_the_kernels_do_not_take_keep_cpu_numerics(runs, name, f, ts):
    got = f(*(t.to("neuron") for t in ts))
    assert not runs
    assert torch.equal(got.cpu(), f(*ts))


# ops that are one device op each (baddbmm is not: PyTorch copies its input first),
# so the device time is one launch and one Program
TIMED = ["mm", "addmm", "linear", "bmm", "mv", "neg", "gelu_tanh", "silu", "rsub_scalar", "max_column_first", "amax", "exp",
         "add", "sub_row", "mul_column", "div_scalar", "pow", "gt", "sum", "mean_keepdim", "softmax", "log_softmax", "conv2d",
         "cat"]


def _device_ps(f, ts) -> int:
    """Device time of ``f`` on fresh neuron copies of ``ts`` (after they are made)."""
    args = [t.to("neuron") for t in ts]
    torch.neuron.synchronize()
    start = state.clock.device
    f(*args)
    torch.neuron.synchronize()
    return state.clock.device - start


@pytest.fixture
def lnc1():
    """trn1, whose logical core is one physical core: the Program op fidelity times is the
    whole op (on trn2 it is each physical core's share, while the data run is whole)."""
    before = torch.neuron.chip()
    torch.neuron.set_chip("trn1")
    yield
    torch.neuron.set_chip(before)


@pytest.mark.parametrize("name", TIMED)
def test_time_is_the_op_fidelitys_and_its_program_the_one_run(lnc1, runs, name):
    f, ts = FP32_OPS[name]
    instr = _device_ps(f, ts)
    programs = [r.total_ps for r in runs]
    trnsim.set_fidelity("op")
    op = _device_ps(f, ts)
    assert instr == op
    launches = len(programs) * state.chip().runtime.op_launch_ps
    assert sum(programs) + launches == op, "the instruction runs are the Programs op fidelity times"


def _plan_and_run(name, args, kwargs=None):
    launch = instruction.plan(Call(name, args, kwargs or {}, list(args), None))
    assert launch is not None
    result, _ = instruction.execute(launch)
    return result


def test_norm_kernels_match_the_cpu():
    """PyTorch decomposes the norms for the device before the fallback sees them; their
    adapters are exercised directly."""
    x, g, b = _randn(130, 96, seed=13), _randn(96, seed=14), _randn(96, seed=15)
    got = _plan_and_run("aten::native_layer_norm", (x, [96], g, b, 1e-5))
    for mine, cpu in zip(got, torch.ops.aten.native_layer_norm(x, [96], g, b, 1e-5)):
        torch.testing.assert_close(mine, cpu, rtol=1e-5, atol=1e-5)
    got = _plan_and_run("aten::_fused_rms_norm", (x, [96], g, 1e-6))
    for mine, cpu in zip(got, torch.ops.aten._fused_rms_norm(x, [96], g, 1e-6)):
        torch.testing.assert_close(mine, cpu, rtol=1e-5, atol=1e-5)
    img = _randn(2, 12, 5, 5, seed=16)
    args = (img, g[:12], None, 2, 12, 25, 4, 1e-5)
    for mine, cpu in zip(_plan_and_run("aten::native_group_norm", args), torch.ops.aten.native_group_norm(*args)):
        torch.testing.assert_close(mine, cpu, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_batch_norm_runs_its_kernel_in_training_and_eval(dtype):
    """``nn.BatchNorm2d`` on the device: the output is ``batchnorm_kernel``'s (the chip's
    rounding, within a unit in the last place of the CPU's), the running statistics the
    CPU's update of the device's memory."""
    import copy

    torch.manual_seed(0)
    cpu = torch.nn.BatchNorm2d(20).to(dtype)
    with torch.no_grad():
        cpu.weight.normal_()
        cpu.bias.normal_()
    dev = copy.deepcopy(cpu).to("neuron")
    x = (torch.randn(4, 20, 6, 6) * 2 + 0.5).to(dtype)
    trnsim.set_fidelity("instruction")
    try:
        train = dev(x.to("neuron")).cpu()
        dev.eval()
        evaluated = dev(x.to("neuron")).cpu()
    finally:
        trnsim.set_fidelity("op")
    want_train = cpu(x)
    cpu.eval()
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1.6e-2}
    torch.testing.assert_close(train, want_train, **tol)
    torch.testing.assert_close(evaluated, cpu(x), **tol)
    torch.testing.assert_close(dev.running_var.cpu(), cpu.running_var)
    launch = instruction.plan(Call("aten::native_batch_norm", (x, cpu.weight, cpu.bias, None, None, True, 0.1, 1e-5),
                                   {}, [], None))
    assert launch.kernel.__name__ == "batchnorm_kernel"


def test_bf16_cast_rounds_to_nearest_even():
    x = _randn(300, seed=17)
    got = _plan_and_run("aten::_to_copy", (x,), {"dtype": torch.bfloat16})
    assert got.dtype == torch.bfloat16 and torch.equal(got, x.to(torch.bfloat16))


def test_every_instruction_op_is_timed_by_a_kernel():
    from trnsim.backend.optable import KERNEL_OPS

    assert set(instruction.INSTRUCTION_OPS) <= set(KERNEL_OPS)


def test_one_lowering_table_gives_both_timing_and_values():
    """Each op a kernel runs is listed once, in backend/optable.py, with its timing
    lowering and (where instruction fidelity computes it) its value lowering: the timing
    and value tables are views of that one table, so an op computed by a kernel is also
    timed by it and an overload cannot be listed in one and forgotten in the other."""
    import trnsim  # noqa: F401
    from trnsim.backend import optable

    assert optable.KERNEL_OPS == {name: lw.time for name, lw in optable.LOWERINGS.items()}
    assert optable.INSTRUCTION_OPS == {name: lw.values for name, lw in optable.LOWERINGS.items() if lw.values}
    assert instruction.INSTRUCTION_OPS is optable.INSTRUCTION_OPS
    names = [n for names, _ in optable._entries() for n in names]
    assert len(names) == len(set(names)) == len(optable.LOWERINGS)
