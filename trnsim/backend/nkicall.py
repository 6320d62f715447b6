"""NKI kernels called on torch tensors, and NKI kernels as PyTorch custom ops.

An ``@nki.jit`` kernel called with torch tensors (the device registers :func:`call` with
:mod:`trnsim.adapters`, which the NKI front end asks) picks its framework from its arguments, as NKI's does:

- ``neuron`` tensors in: the kernel runs on the simulated NeuronCore of the device, in
  the device's timeline. It reads its inputs from the host memory behind the tensors
  (no device-to-host copy: float32 and the integer dtypes are read in place, bf16 and
  fp8 widened to float32 on the host), its simulated time is charged as one op named
  after the kernel (launch plus the Program's time, with the Program's engine slices in
  ``trnsim.profile`` traces), and it returns ``neuron`` tensors. Inputs the kernel
  writes (destination-passing style, ``nt.mutable_tensor``) are written in place.
- CPU tensors in: the simulator computes the kernel and returns CPU tensors; nothing is
  charged to the device.
- fake or meta tensors in (``torch.compile`` tracing, a custom op's fake
  implementation): the kernel is traced on shapes only and returns tensors of its
  results' shapes and dtypes.

An NKI kernel has no CPU reference to take its values from, so in the device's ``op``
fidelity it is simulated instruction by instruction, as in ``instruction`` fidelity;
in ``timing`` fidelity it is traced on shapes and timed only (its results hold no data).

:func:`nki_op` makes a launcher function (one that allocates outputs and calls
kernels) a PyTorch custom op, built on ``torch.library.custom_op`` with the launcher
itself, run on fake tensors, as its fake implementation: ``torch.compile(backend=
"neuron")`` keeps it one graph node, which the compile backend times by the Programs of
the kernels it calls (:func:`op_cost`). :func:`wrap_nki` gives a kernel
``torch_neuronx``'s wrapper (``[grid]`` launches on torch tensors).
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
from typing import Any, Callable

import numpy as np
import torch

from trnsim import dtypes as _dt
from trnsim.backend import state, storage, timeline
from trnsim import adapters
from trnsim.backend.opcost import OpCost
from trnsim.nki.jit import named_arguments
from trnsim.errors import TrnSimError

_TO_CHIP = {torch.float32: _dt.float32, torch.bfloat16: _dt.bfloat16, torch.float16: _dt.float16,
            torch.float8_e4m3fn: _dt.float8_e4m3fn, torch.float8_e5m2: _dt.float8_e5m2, torch.int8: _dt.int8,
            torch.uint8: _dt.uint8, torch.int16: _dt.int16, torch.uint16: _dt.uint16, torch.int32: _dt.int32,
            torch.uint32: _dt.uint32}
_TO_TORCH = {d.name: t for t, d in _TO_CHIP.items()}
# dtypes numpy holds as they are: read from the tensor's memory in place
_NUMPY_NATIVE = {torch.float32, torch.float16, torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32,
                 torch.uint32}


def _where(tensors: list[torch.Tensor]) -> str:
    """``"fake"``, ``"neuron"`` or ``"cpu"``: where a call with these tensors runs."""
    from torch._subclasses.fake_tensor import FakeTensor

    kinds = {"fake" if isinstance(t, FakeTensor) or t.device.type == "meta" else t.device.type for t in tensors}
    if "fake" in kinds:
        return "fake"
    if kinds - {"neuron", "cpu"}:
        raise TrnSimError(f"an NKI kernel was called on {sorted(kinds)} tensors; call it on neuron or CPU tensors")
    if len(kinds) > 1:
        raise TrnSimError("an NKI kernel was called on both neuron and CPU tensors; move them to one device "
                          "(.to('neuron'))")
    return kinds.pop()


def _chip_dtype(t: torch.Tensor) -> Any:
    dtype = _TO_CHIP.get(t.dtype)
    if dtype is None:
        raise TrnSimError(f"an NKI kernel argument has torch dtype {t.dtype}, which the chip has no dtype for; "
                          f"cast it to one of {', '.join(str(d).removeprefix('torch.') for d in _TO_CHIP)}")
    return dtype


def _placeholder(t: torch.Tensor) -> Any:
    from trnsim.nki.jit import Typed

    shape = tuple(int(s) for s in t.shape) or (1,)
    return Typed(np.broadcast_to(np.zeros((), np.float32 if t.dtype.is_floating_point else np.int32), shape),
                 _chip_dtype(t))


def _values(t: torch.Tensor) -> Any:
    """Tensor ``t`` as the kernel reads it: a numpy view of its memory where numpy holds its
    dtype, else its values widened to float32."""
    from trnsim.nki.jit import Typed

    dtype = _chip_dtype(t)
    host = storage.host_alias(t) if t.device.type == "neuron" else t.detach()
    if host.is_conj() or host.is_neg():
        host = host.resolve_conj().resolve_neg()
    arr = host.numpy() if t.dtype in _NUMPY_NATIVE else host.float().numpy()
    return Typed(arr.reshape(arr.shape or (1,)), dtype)


def _convert(value: Any, convert: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return convert(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_convert(v, convert) for v in value)
    return value


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found = []
    for v in itertools.chain(args, kwargs.values()):
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(x, torch.Tensor):
                found.append(x)
    return found


def _chip(kernel: Any) -> Any:
    return kernel.chip if kernel.chip is not None else state.chip()


def _argument_tensors(kernel: Any, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """The torch tensors of a call by the names the kernel's inputs get when traced."""
    return {k: v for k, v in named_arguments(kernel, args, kwargs).items() if isinstance(v, torch.Tensor)}


def call(kernel: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``kernel`` on torch tensors (see the module): its results as torch tensors on
    the arguments' device, in the structure the kernel returns them."""
    if "torch._dynamo" in sys.modules:
        # called from a compiled function (the graph breaks around a bare kernel call):
        # Dynamo must not compile the tracer's and simulator's frames (numba's among them)
        return _outside_dynamo()(kernel, args, kwargs)
    return _call(kernel, args, kwargs)


@functools.cache
def _outside_dynamo() -> Callable:
    return torch.compiler.disable(_call, recursive=True)


def _call(kernel: Any, args: tuple, kwargs: dict) -> Any:
    where = _where(_tensors(args, kwargs))
    if where == "fake":
        return _fake_call(kernel, args, kwargs)
    timing = where == "neuron" and state.fidelity() == "timing"
    convert = _placeholder if timing else _values
    from trnsim.nki.launch import launch

    with timeline.simulating:
        launched = launch(kernel, tuple(_convert(a, convert) for a in args),
                          {k: _convert(v, convert) for k, v in kwargs.items()},
                          chip=_chip(kernel) if where == "neuron" else kernel.chip, numerics=not timing)
    traced, run = launched.traced, launched.run
    named = _argument_tensors(kernel, args, kwargs)
    for name, values in launched.written.items():
        dst = named[name]
        host = storage.host_alias(dst, fresh=True) if dst.device.type == "neuron" else dst.data
        host.copy_(torch.from_numpy(np.ascontiguousarray(values)).reshape(host.shape))
    if where == "neuron" and not timeline.host_only():
        ins = list(named.values())
        cost = OpCost(ps=run.total_ps, source="kernel", kernel=kernel.fn.__name__, run=run)
        timeline.charge_kernel(kernel.fn.__name__, cost, tuple(tuple(t.shape) for t in ins),
                               tuple(str(t.dtype).removeprefix("torch.") for t in ins))
    results = []
    for i, r in enumerate(traced.output_tensors):
        if r.tensor.name in named:
            results.append(named[r.tensor.name])
            continue
        results.append(_result(r, None if timing else launched.outputs[i], where))
    return _structured(traced.outputs, results)


def _charge_array_run(name: str, run: Any, args: tuple) -> None:
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    timeline.charge_kernel(name, OpCost(ps=run.total_ps, source="kernel", kernel=name, run=run),
                           tuple(a.shape for a in arrays), tuple(str(a.dtype) for a in arrays))


class array_kernels_on_timeline:
    """While active, every NKI kernel run on numpy arrays (``nki.simulate``, ``baremetal``,
    ``benchmark``, a jit kernel called on arrays) is also charged to the device's timeline
    as one op named after the kernel, as a kernel on ``neuron`` tensors is: ``trnsim run``
    uses it so that an NKI script's summary has its kernels."""

    def __enter__(self) -> None:
        self._unregister = adapters.register_run_observer(_charge_array_run)

    def __exit__(self, *exc: Any) -> None:
        self._unregister()


def _result(t: Any, values: Any, where: str) -> torch.Tensor:
    dtype = _TO_TORCH[t.dtype.name]
    if values is None:
        return torch.empty(tuple(t.shape), dtype=dtype, device="neuron")
    # a tensor of its own memory (the simulator's array is not resizable as a storage must be)
    cpu = torch.empty(tuple(t.shape), dtype=dtype).copy_(torch.from_numpy(np.ascontiguousarray(values)).reshape(
        tuple(t.shape)))
    return storage.adopt(cpu) if where == "neuron" else cpu


def _structured(outputs: Any, results: list) -> Any:
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(results)
    return results[0] if results else None


# -- shapes only: fake tensors, and what a compiled graph's kernels cost ------------------

_timing_memo: dict[tuple, tuple[list, OpCost]] = {}
_collecting = threading.local()


def _key_part(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (tuple(int(s) for s in v.shape), v.dtype)
    if isinstance(v, (list, tuple)):
        return tuple(_key_part(x) for x in v)
    return repr(v)


def _fake_call(kernel: Any, args: tuple, kwargs: dict) -> Any:
    """A kernel call on fake tensors: results of the traced shapes and dtypes; while
    :func:`op_cost` collects, the kernel's timed cost is recorded."""
    from trnsim.nki.launch import launch

    chip = _chip(kernel)
    key = (kernel.fn, kernel.grid, chip.name, tuple(_key_part(a) for a in args),
           tuple((k, _key_part(v)) for k, v in sorted(kwargs.items())))
    memo = _timing_memo.get(key)
    if memo is None:
        with timeline.simulating:
            launched = launch(kernel, tuple(_convert(a, _placeholder) for a in args),
                              {k: _convert(v, _placeholder) for k, v in kwargs.items()}, chip=chip, numerics=False)
        traced, run = launched.traced, launched.run
        named = _argument_tensors(kernel, args, kwargs)
        shapes = [(r.tensor.name if r.tensor.name in named else None, tuple(r.tensor.shape),
                   _TO_TORCH[r.tensor.dtype.name]) for r in traced.output_tensors]
        structure = traced.outputs if isinstance(traced.outputs, (tuple, list)) else None
        memo = _timing_memo[key] = ((shapes, structure, traced.outputs is None),
                                    OpCost(ps=run.total_ps, source="kernel", kernel=kernel.fn.__name__, run=run))
    (shapes, structure, none), cost = memo
    sink = getattr(_collecting, "costs", None)
    if sink is not None:
        sink.append(cost)
    device = _tensors(args, kwargs)[0].device
    named = _argument_tensors(kernel, args, kwargs)
    results = [named[name] if name is not None else torch.empty(shape, dtype=dtype, device=device)
               for name, shape, dtype in shapes]
    if none:
        return None
    if structure is not None:
        return type(structure)(results)
    return results[0]


_NKI_OPS: dict[str, Callable] = {}


def op_cost(name: str, args: tuple, kwargs: dict) -> OpCost | None:
    """The simulated cost of custom op ``name`` (``ns::name``) made by :func:`nki_op`, run
    on ``args`` (fake tensors of a graph node; an ``auto_functionalized`` node of such an
    op, which writes its arguments, too): its kernels' Programs back to back, named after
    them; None for any other op."""
    if name.startswith("auto_functionalized") and args and isinstance(args[0], torch._ops.OpOverload):
        name, args, kwargs = _unfunctionalized(args[0], kwargs)
    launcher = _NKI_OPS.get(name)
    if launcher is None:
        return None
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = next((t.fake_mode for t in _tensors(args, kwargs) if hasattr(t, "fake_mode")), None) or FakeTensorMode()

    def fake(x: torch.Tensor) -> torch.Tensor:
        return x if hasattr(x, "fake_mode") else mode.from_tensor(x)

    _collecting.costs = costs = []
    try:
        with mode:
            launcher(*(_convert(a, fake) for a in args), **{k: _convert(v, fake) for k, v in kwargs.items()})
    finally:
        _collecting.costs = None
    if not costs:
        return OpCost(ps=0, source="none")
    if len(costs) == 1:
        return costs[0]
    names = "+".join(dict.fromkeys(c.kernel for c in costs))
    return OpCost(ps=sum(c.ps for c in costs), source="kernel", kernel=names)


def _unfunctionalized(op: torch._ops.OpOverload, kwargs: dict) -> tuple[str, tuple, dict]:
    """The op an ``auto_functionalized`` node wraps (an op that writes its arguments, in a
    functional graph), with the arguments it is called with."""
    kwargs = dict(kwargs)
    bases = kwargs.pop("_all_bases", None)
    if bases is not None:   # auto_functionalized_v2: written arguments are views of bases
        from torch._higher_order_ops.auto_functionalize import read_view_information_from_args

        written = [a for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        views = read_view_information_from_args([a.name for a in written], [a.type for a in written], kwargs, bases)
        for arg_name, view in views.items():
            kwargs[arg_name] = view.regenerate_view(bases) if view is not None else None
    return op.name(), (), kwargs


def nki_op(name: str, fn: Callable | None = None, *, mutates_args: Any = (), schema: str | None = None) -> Any:
    """Make launcher ``fn`` (a function of torch tensors that allocates its outputs and
    calls NKI kernels) the PyTorch custom op ``name`` (``"ns::name"``), as
    ``torch_neuronx.nki_op``: ``@nki_op("mylib::my_op", mutates_args=())``.

    The launcher must carry type annotations, as ``torch.library.custom_op`` requires. Its
    fake implementation is the launcher run on fake tensors (each kernel traced on
    shapes), so ``torch.compile(backend="neuron")`` keeps the op as one graph node,
    timed by its kernels' Programs. The op has ``register_autograd`` (and the rest of
    ``torch.library.CustomOpDef``) to make it train."""
    if fn is None:
        return lambda f: nki_op(name, f, mutates_args=mutates_args, schema=schema)
    if not isinstance(name, str) or "::" not in name:
        raise TrnSimError(f"nki_op name {name!r} must be 'namespace::name', as in nki_op('mylib::add')")
    op = torch.library.custom_op(name, fn, mutates_args=mutates_args, schema=schema)
    op.register_fake(fn)
    _NKI_OPS[name] = fn
    return op


class WrappedKernel:
    """An NKI kernel wrapped by :func:`wrap_nki`: call it on torch tensors, launch a
    grid with ``wrapped[g](...)``."""

    def __init__(self, kernel: Any) -> None:
        from trnsim.nki.jit import jit

        self.kernel = jit(kernel)

    def __getitem__(self, grid: Any) -> WrappedKernel:
        return WrappedKernel(self.kernel[grid])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel(*args, **kwargs)


def wrap_nki(kernel: Any) -> WrappedKernel:
    """``torch_neuronx.wrap_nki(kernel)``: the kernel callable on torch tensors (positional
    or keyword), with ``[grid]`` launches; it runs as :func:`call` says. Under
    ``torch.compile`` a call is not captured (the graph breaks around it and it runs
    eagerly, on the device's timeline): to keep a kernel one graph node, call it from a
    launcher made an op by :func:`nki_op`."""
    return WrappedKernel(kernel)

