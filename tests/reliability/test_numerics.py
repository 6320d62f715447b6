"""Instruction fidelity against PyTorch's CPU on special values, and the two numeric
backends against each other, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import trnsim
from trnsim.backend.lowering import BINARY, UNARY
from trnsim.compute import fast, reference
from trnsim.isa import ActivationFunc, AluOp

INF, NAN = float("inf"), float("nan")
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 100.0, -100.0, INF, -INF, NAN, 1e-40, -1e-40, 3e38, -3e38]
RTOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def _expected(name: str, point: tuple, cpu: float) -> float:
    """The CPU's value, except where its float32 formula overflows and the chip's (evaluated
    in float64, rounded once) does not: PyTorch's gelu gives NaN for +inf and inf for
    x > ~1.7e38, where gelu(x) = x; and a gelu that rounds to zero has x's sign (x * Phi(x)
    is negative for x < 0), which PyTorch's CPU kernel gives or not depending on the
    instruction set and on where the element sits (vectorized body or scalar tail)."""
    if name == "gelu" and point[0] > 1e38:
        return point[0]
    if name == "gelu" and cpu == 0.0:
        return float(np.copysign(0.0, point[0]))
    return cpu


@pytest.fixture
def instruction_fidelity():
    trnsim.set_fidelity("instruction")
    yield
    trnsim.set_fidelity("op")


def _assert_same_specials(name: str, x: list[tuple], cpu: torch.Tensor, chip: torch.Tensor) -> None:
    """NaN where the CPU has NaN, infinities and signed zeros as the CPU's, finite values
    within the dtype's rounding (the chip evaluates in float64 and rounds once)."""
    assert cpu.dtype == chip.dtype and cpu.shape == chip.shape, (name, cpu.dtype, chip.dtype)
    if cpu.dtype == torch.bool:
        bad = (cpu != chip).nonzero().flatten().tolist()
        assert not bad, [(name, x[i], cpu[i].item(), chip[i].item()) for i in bad]
        return
    c, d = cpu.double(), chip.double()
    for i, point in enumerate(x):
        want = _expected(name, point, c[i].item())
        got = d[i].item()
        if np.isnan(want) or np.isnan(got) or np.isinf(want) or np.isinf(got) or want == 0.0:
            ok = (np.isnan(want) and np.isnan(got)) or (want == got and np.copysign(1, want) == np.copysign(1, got)) \
                or (want == 0.0 and abs(got) < 1e-37 and np.copysign(1, want) == np.copysign(1, got))
        else:
            ok = abs(got - want) <= RTOL[cpu.dtype] * abs(want) + 1e-37
        assert ok, f"{name}{point}: CPU {want!r}, instruction fidelity {got!r}"


UNARY_FNS = {u: getattr(torch, u, None) or getattr(F, u) for u in UNARY if u != "softplus"}
UNARY_FNS["softplus"] = F.softplus


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(UNARY_FNS))
def test_unary_special_values_match_the_cpu(instruction_fidelity: None, name: str, dtype: torch.dtype) -> None:
    x = torch.tensor(SPECIAL, dtype=dtype)
    fn = UNARY_FNS[name]
    _assert_same_specials(name, [(v,) for v in x.tolist()], fn(x), fn(x.to("neuron")).cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_special_values_match_the_cpu(instruction_fidelity: None, name: str, dtype: torch.dtype) -> None:
    pairs = [(p, q) for p in SPECIAL for q in SPECIAL]
    a = torch.tensor([p for p, _ in pairs], dtype=dtype)
    b = torch.tensor([q for _, q in pairs], dtype=dtype)
    fn = getattr(torch, name)
    pairs = list(zip(a.tolist(), b.tolist()))
    _assert_same_specials(name, pairs, fn(a, b), fn(a.to("neuron"), b.to("neuron")).cpu())
    if name not in ("maximum", "minimum"):   # these take tensors only
        for s in (0.0, -0.0, INF, NAN, -1.0):
            _assert_same_specials(name, [(p, s) for p in a[::len(SPECIAL)].tolist()], fn(a[::len(SPECIAL)], s),
                                  fn(a[::len(SPECIAL)].to("neuron"), s).cpu())


def test_negative_zero_keeps_its_sign_through_a_zero_bias(instruction_fidelity: None) -> None:
    x = torch.tensor([-0.0, 0.0])
    assert torch.rsqrt(x.to("neuron")).cpu().tolist() == [-INF, INF]
    assert torch.reciprocal(x.to("neuron")).cpu().tolist() == [-INF, INF]
    assert torch.signbit(torch.neg(x.to("neuron")).cpu()).tolist() == [False, True]
    assert torch.signbit(torch.sign(torch.tensor([NAN, -0.0]).to("neuron")).cpu()).tolist() == [False, False]


@pytest.mark.parametrize("func", list(ActivationFunc))
@pytest.mark.parametrize("bias", [0.0, -0.0, 0.5])
def test_activation_backends_agree_bit_for_bit_on_special_values(func: ActivationFunc, bias: float) -> None:
    x = np.array([SPECIAL, SPECIAL[::-1]])
    scale, b = np.array([1.0, -1.0]), np.array([bias, bias])
    want = reference.activation(x, func, scale, b)
    got = fast.activation(x, func, scale, b)
    assert np.array_equal(want.view(np.int64), got.view(np.int64)) or \
        np.array_equal(np.isnan(want), np.isnan(got)) and np.array_equal(want[~np.isnan(want)].view(np.int64),
                                                                          got[~np.isnan(got)].view(np.int64))


_ONES = torch.ones
# Every scalar-engine function beside the PyTorch CPU function it is the chip's version of.
CPU_ACTIVATIONS = {
    ActivationFunc.IDENTITY: lambda z: z, ActivationFunc.EXP: torch.exp, ActivationFunc.LOG: torch.log,
    ActivationFunc.SQRT: torch.sqrt, ActivationFunc.RSQRT: torch.rsqrt, ActivationFunc.RECIPROCAL: torch.reciprocal,
    ActivationFunc.TANH: torch.tanh, ActivationFunc.SIGMOID: torch.sigmoid, ActivationFunc.RELU: torch.relu,
    ActivationFunc.GELU: F.gelu, ActivationFunc.GELU_TANH: lambda z: F.gelu(z, approximate="tanh"),
    ActivationFunc.SILU: F.silu, ActivationFunc.SQUARE: torch.square, ActivationFunc.ABS: torch.abs,
    ActivationFunc.SOFTPLUS: F.softplus, ActivationFunc.SIN: torch.sin, ActivationFunc.COS: torch.cos,
    ActivationFunc.ERF: torch.erf, ActivationFunc.SIGN: torch.sign,
    ActivationFunc.GELU_DX: lambda z: torch.ops.aten.gelu_backward(_ONES(z.shape, dtype=z.dtype), z),
    ActivationFunc.SILU_DX: lambda z: torch.ops.aten.silu_backward(_ONES(z.shape, dtype=z.dtype), z),
    ActivationFunc.GELU_APPRX_SIGMOID: lambda z: z * torch.sigmoid(1.702 * z),
}
EDGES = [NAN, INF, -INF, 0.0, -0.0]


def test_every_activation_has_a_cpu_counterpart() -> None:
    assert set(CPU_ACTIVATIONS) == set(ActivationFunc)


@pytest.mark.parametrize("backend", [reference, fast], ids=["numpy", "numba"])
@pytest.mark.parametrize("func", list(ActivationFunc))
@pytest.mark.parametrize("scale", [1.0, -1.0])
def test_each_activation_of_each_backend_gives_the_cpus_nan_infinities_and_signed_zeros(backend, func, scale) -> None:
    """NaN, +-inf and +-0 (and -x of them: ``neg`` is identity with scale -1) through every
    function of both backends, against PyTorch's float64 CPU kernel: NaN where it has NaN,
    the same infinities, zeros of the same sign. float64, because PyTorch's float32 gelu
    gives NaN for +inf in its vectorized body and +inf for a one-element or strided tensor;
    trnsim gives +inf, as float64 and that scalar path do."""
    x = np.array([EDGES])
    got = backend.activation(x, func, np.array([scale]), np.zeros(1))[0]
    want = CPU_ACTIVATIONS[func](torch.tensor(EDGES, dtype=torch.float64) * scale).numpy()
    for point, w, g in zip(EDGES, want, got):
        same = (np.isnan(w) and np.isnan(g)) or (w == g and np.signbit(w) == np.signbit(g))
        assert same, f"{func.value}({scale} * {point}): CPU {w!r}, {backend.__name__} {g!r}"


def test_gelu_of_inf_is_what_pytorchs_scalar_cpu_path_gives(instruction_fidelity: None) -> None:
    one = torch.tensor([INF])
    assert F.gelu(one).item() == INF == F.gelu(one.to("neuron")).cpu().item()
    assert torch.isnan(F.gelu(one.to("neuron"))).sum().item() == 0
    assert torch.isnan(F.gelu(torch.tensor([NAN, NAN]).to("neuron"))).all()


@pytest.mark.parametrize("op", list(AluOp))
def test_alu_backends_agree_bit_for_bit_on_special_values(op: AluOp) -> None:
    a = np.array([[p for p in SPECIAL for _ in SPECIAL]])
    b = np.array([[q for _ in SPECIAL for q in SPECIAL]])
    want, got = reference.alu(a, b, op), fast.alu(a, b, op)
    assert np.array_equal(np.isnan(want), np.isnan(got))
    assert np.array_equal(want[~np.isnan(want)].view(np.int64), got[~np.isnan(got)].view(np.int64))


# -- out= and in-place destinations that share memory ---------------------------

def _overlap_cases() -> dict:
    def out_shifted(a):
        torch.add(a[:-1], 1, out=a[1:])

    def inplace_shifted(a):
        a[1:].add_(a[:-1])

    def out_overlaps_second_input(a):
        torch.mul(a[:4].clone(), a[2:6], out=a[:4])

    def out_expanded(a):
        torch.add(a[:4], 1, out=a[6:7].expand(4))

    def unary_out_shifted(a):
        torch.exp(a[2:], out=a[:-2])

    def inplace_strided_input(a):   # PyTorch cannot prove this one and computes it
        a[:4].mul_(a[::2])

    return {f.__name__: f for f in (out_shifted, inplace_shifted, out_overlaps_second_input, out_expanded,
                                    unary_out_shifted, inplace_strided_input)}


def _outcome(fn, a: torch.Tensor) -> tuple:
    try:
        fn(a)
    except Exception as e:   # noqa: BLE001 - the exception is what is compared
        return type(e), str(e)
    return None, a.cpu().tolist()


@pytest.mark.parametrize("fidelity", ["op", "instruction"])
@pytest.mark.parametrize("case", sorted(_overlap_cases()))
def test_overlapping_destinations_are_refused_as_on_the_cpu(fidelity: str, case: str) -> None:
    fn = _overlap_cases()[case]
    a = torch.arange(1.0, 9.0)
    want = _outcome(fn, a.clone())
    trnsim.set_fidelity(fidelity)
    try:
        for _ in range(2):   # the second time through, reads come from cached aliases
            assert _outcome(fn, a.to("neuron")) == want
            b = a.to("neuron") + 0   # memory a kernel made (adopted), not copied in
            assert _outcome(fn, b) == want
    finally:
        trnsim.set_fidelity("op")


def test_the_same_view_read_and_written_still_runs_the_kernel(instruction_fidelity: None, monkeypatch) -> None:
    from trnsim.backend import instruction

    launches = []
    execute = instruction.execute
    monkeypatch.setattr(instruction, "execute", lambda launch: launches.append(launch) or execute(launch))
    a = torch.arange(1.0, 9.0)
    d = a.to("neuron")
    d.add_(d)
    torch.mul(d[:4], 2, out=d[4:])   # disjoint halves of one storage
    assert len(launches) == 2
    a.add_(a)
    torch.mul(a[:4], 2, out=a[4:])
    assert d.cpu().tolist() == a.tolist()


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["add", "mul", "exp", "sub_", "maximum"]), st.integers(0, 7), st.integers(0, 7),
       st.integers(1, 8), st.booleans())
def test_any_slices_of_one_storage_behave_as_on_the_cpu(op: str, src: int, dst: int, n: int, as_out: bool) -> None:
    """An op reading one slice of a storage and writing another (out= or in place):
    instruction fidelity refuses or computes exactly as the CPU."""
    n = min(n, 8 - src, 8 - dst)

    def call(a: torch.Tensor) -> None:
        x, y = a[src:src + n], a[dst:dst + n]
        if op == "exp":
            torch.exp(x, out=y) if as_out else y.copy_(torch.exp(x))
        elif op == "sub_":
            y.sub_(x)
        elif as_out:
            getattr(torch, op)(y.clone(), x, out=y) if op == "maximum" else getattr(torch, op)(x, 2.0, out=y)
        else:
            getattr(torch, op)(x, y, out=y)

    a = torch.arange(1.0, 9.0)
    trnsim.set_fidelity("instruction")
    try:
        got = _outcome(call, a.to("neuron"))
    finally:
        trnsim.set_fidelity("op")
    assert got == _outcome(call, a.clone())


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_a_sum_of_negative_zeros_is_positive_zero_as_on_the_cpu(instruction_fidelity: None, name: str) -> None:
    x = torch.full((3, 5), -0.0)
    cpu, chip = getattr(x, name)(1), getattr(x.to("neuron"), name)(1).cpu()
    assert torch.equal(torch.signbit(chip), torch.signbit(cpu)) and not torch.signbit(cpu).any()


@pytest.mark.parametrize("backend", [reference, fast])
def test_reduce_add_starts_from_positive_zero(backend: object) -> None:
    got = backend.reduce(np.array([[-0.0, -0.0], [-0.0, 1.0]]), "add")
    assert not np.signbit(got[0]) and got[1] == 1.0


@pytest.mark.parametrize("d", [3, 5000])
def test_log_softmax_keeps_the_log_of_the_sum_next_to_a_large_max(instruction_fidelity: None, d: int) -> None:
    x = torch.zeros(2, d)
    x[:, :2] = 1e8           # log_softmax of the two maxima is -log(2) (d = 3) or about it
    cpu, chip = torch.log_softmax(x, 1), torch.log_softmax(x.to("neuron"), 1).cpu()
    torch.testing.assert_close(chip, cpu)
