"""Running kernels: ``nki.jit``, launch grids, ``nki.simulate`` and ``nki.benchmark``.

A call traces the kernel into a Program (arguments become HBM input tensors
named after the kernel's parameters, the HBM tensors it returns become outputs),
simulates it on the chosen chip and gives back numpy arrays. A launch grid
``kernel[2, 3](...)`` traces every instance into one Program, in order.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from trnsim import dtypes as _dt
from trnsim.errors import ProgramError, TrnSimError
from trnsim.isa import Memory
from trnsim.nki.tensor import NkiTensor, _Placement
from trnsim.nki.tracer import KernelError, Tracer

_TORCH_DTYPES = {"torch.float32": _dt.float32, "torch.bfloat16": _dt.bfloat16, "torch.float16": _dt.float16,
                 "torch.float8_e4m3fn": _dt.float8_e4m3, "torch.float8_e5m2": _dt.float8_e5m2, "torch.int8": _dt.int8,
                 "torch.uint8": _dt.uint8, "torch.int16": _dt.int16, "torch.int32": _dt.int32}


@dataclass(frozen=True)
class Typed:
    """A numpy array passed to a kernel as a tensor of a chip dtype numpy lacks
    (``nki.typed(x, nl.bfloat16)``): its values are rounded to that dtype in HBM."""

    array: np.ndarray
    dtype: _dt.DType


def typed(array: Any, dtype: Any) -> Typed:
    """``array`` as a kernel argument of chip dtype ``dtype`` (bfloat16, float8_e4m3, ...).

    Floats are rounded to a float ``dtype`` as HBM stores them. For an integer ``dtype``
    every value must already be one of its values: a fraction, NaN, infinity or a value
    out of range raises :class:`KernelError` (the chip would saturate or round it)."""
    arr, dt = np.asarray(array), _dt.as_dtype(dtype)
    try:
        _dt.check_values(arr, dt, "nki.typed")
    except ProgramError as e:
        raise KernelError(str(e)) from None
    return Typed(arr, dt)


def _is_tensor_arg(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, Typed)) or hasattr(value, "detach")


def _as_array(value: Any, name: str) -> tuple[np.ndarray, _dt.DType]:
    """A kernel argument as a numpy array and the chip dtype it stands for."""
    if isinstance(value, Typed):
        return value.array, value.dtype
    if hasattr(value, "detach") and hasattr(value, "dtype"):  # a torch tensor
        dtype = _TORCH_DTYPES.get(str(value.dtype))
        if dtype is None:
            raise KernelError(f"argument {name!r}: torch dtype {value.dtype} has no chip dtype")
        t = value.detach()
        if str(t.device) != "cpu":
            t = t.cpu()
        return t.float().numpy() if dtype.is_float else t.numpy(), dtype
    arr = np.asarray(value)
    if arr.dtype == np.float64:
        return arr.astype(np.float32), _dt.float32
    try:
        return arr, _dt.as_dtype(arr.dtype)
    except TrnSimError:
        raise KernelError(f"argument {name!r}: numpy dtype {arr.dtype} has no chip dtype; use float32, float16, int8, int32 ...") from None


@dataclass
class Traced:
    """A kernel traced into a Program, with what the arguments and results map to."""

    tracer: Tracer
    inputs: dict[str, np.ndarray]
    outputs: list[Any]          # the kernel's return structure, HBM tensors in it
    output_tensors: list[NkiTensor]


# Every instance of a launch grid is traced in turn into one Program; past this many the
# trace would take hours and exhaust host memory rather than fail.
MAX_GRID_INSTANCES = 65536


class Kernel:
    """A kernel function made runnable by :func:`jit`."""

    def __init__(self, fn: Callable, grid: tuple[int, ...] = (), chip: Any = None) -> None:
        self.fn = fn
        self.grid = grid
        self.chip = chip
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Kernel:
        grid = grid if isinstance(grid, tuple) else (grid,)
        if not grid or not all(isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g > 0 for g in grid):
            raise KernelError(f"launch grid {grid!r} must be positive integers, as in kernel[4] or kernel[2, 3]")
        grid = tuple(int(g) for g in grid)
        if math.prod(grid) > MAX_GRID_INSTANCES:
            raise KernelError(f"launch grid {grid!r} has {math.prod(grid):,} instances, more than the "
                              f"{MAX_GRID_INSTANCES:,} the simulator traces one by one; launch fewer instances "
                              "and loop inside the kernel (nl.affine_range)")
        return Kernel(self.fn, grid, self.chip)

    def trace(self, *args: Any, chip: Any = None, **kwargs: Any) -> Traced:
        """Trace the kernel for these arguments (numpy arrays or torch tensors)."""
        tracer = Tracer(chip if chip is not None else self.chip, self.fn.__name__)
        sig = inspect.signature(self.fn)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        inputs: dict[str, np.ndarray] = {}

        def hbm_input(name: str, value: Any) -> Any:
            if not _is_tensor_arg(value):
                return value
            arr, dtype = _as_array(value, name)
            t = tracer.program.hbm(arr.shape if arr.ndim else (1,), dtype, name, kind="input")
            tracer.hazards.register(t)
            inputs[name] = arr.reshape(t.shape)
            return NkiTensor(_Placement(tracer, t), t.view())

        with tracer:
            call_args: list[Any] = []
            call_kwargs: dict[str, Any] = {}
            for name, value in bound.arguments.items():
                kind = sig.parameters[name].kind
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    call_args += [hbm_input(f"{name}_{i}", v) for i, v in enumerate(value)]
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    call_kwargs.update({k: hbm_input(k, v) for k, v in value.items()})
                elif kind is inspect.Parameter.KEYWORD_ONLY:
                    call_kwargs[name] = hbm_input(name, value)
                else:
                    call_args.append(hbm_input(name, value))
            result = None
            for ids in itertools.product(*(range(g) for g in self.grid)) if self.grid else [()]:
                tracer.grid = self.grid
                tracer.start_instance(ids)
                result = self.fn(*call_args, **call_kwargs)
            outs = _hbm_results(result, tracer, self.fn)
        tracer.live = False
        return Traced(tracer, inputs, result, outs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(map(_is_torch, itertools.chain(args, kwargs.values()))):
            from trnsim.backend import nkicall   # torch only when torch tensors come in

            return nkicall.call(self, args, kwargs)
        return simulate(self)(*args, **kwargs)


def _is_torch(value: Any) -> bool:
    """Whether ``value`` is a torch tensor, or a list or tuple holding one (found without
    importing torch)."""
    if isinstance(value, (list, tuple)):
        return any(map(_is_torch, value))
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _hbm_results(result: Any, tracer: Tracer, fn: Callable) -> list[NkiTensor]:
    items = result if isinstance(result, (tuple, list)) else ([] if result is None else [result])
    outs = []
    for r in items:
        if not isinstance(r, NkiTensor) or r.buffer is not Memory.HBM:
            where = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"
            raise tracer.fail(f"kernel {fn.__name__} returns {r!r}; a kernel returns HBM tensors "
                              "(nl.ndarray(..., buffer=nl.shared_hbm)) it stored into", where)
        if r.tensor not in tracer.program.outputs:
            tracer.program.outputs.append(r.tensor)
        outs.append(r)
    return outs


def jit(fn: Callable | None = None, *, chip: Any = None, **_options: Any) -> Any:
    """Make ``fn`` a kernel: call it with numpy arrays (or torch tensors) to run it on the
    simulated NeuronCore at instruction fidelity; ``kernel[g0, g1]`` launches a grid."""
    if fn is None:
        return lambda f: Kernel(f, chip=chip)
    return fn if isinstance(fn, Kernel) else Kernel(fn, chip=chip)


def _chip(chip: Any, kernel: Kernel) -> Any:
    """The chip a run asks for, else the kernel's; None leaves ``$TRNSIM_CHIP`` (or the
    default) to :func:`trnsim.hw.spec.load_chip`, the one reader of the variable."""
    return chip if chip is not None else kernel.chip


def _results(traced: Traced, run: Any) -> Any:
    values = [run.outputs[t.tensor.name] for t in traced.output_tensors]
    if isinstance(traced.outputs, (tuple, list)):
        return type(traced.outputs)(values)
    return values[0] if values else None


def simulate(kernel: Callable, *, chip: Any = None, trace: str | os.PathLike | None = None) -> Callable:
    """``nki.simulate(kernel)(*arrays)``: the kernel's outputs as numpy arrays, computed
    instruction by instruction with the chip's numerics."""
    kernel = jit(kernel)

    def run(*args: Any, **kwargs: Any) -> Any:
        from trnsim.hw.core import simulate as sim

        traced = kernel.trace(*args, chip=_chip(chip, kernel), **kwargs)
        result = sim(traced.tracer.program, traced.inputs, fidelity="instruction", trace=trace)
        return _results(traced, result)

    return run


@dataclass
class BenchmarkResult:
    """What :func:`benchmark` measured: outputs and the simulated run's figures."""

    outputs: Any
    latency_ns: float
    busy_pct: dict[str, float]
    hbm_bytes: int
    flops: int
    achieved_flops: float
    peak_flops: float
    instructions: int
    trace: Any
    run: Any

    @property
    def pct_of_peak(self) -> float:
        return 100.0 * self.achieved_flops / self.peak_flops if self.peak_flops else 0.0

    @property
    def latency_us(self) -> float:
        return self.latency_ns / 1000

    def summary(self) -> Any:
        return self.run.summary()

    def save_trace(self, path: str | os.PathLike) -> Any:
        from trnsim.trace import save

        return save(self.trace, path)


def benchmark(kernel: Callable | None = None, *, chip: Any = None, numerics: bool = True,
              trace: str | os.PathLike | None = None, **_options: Any) -> Callable:
    """``nki.benchmark(kernel)(*arrays)``: run the kernel and return a :class:`BenchmarkResult`
    (simulated latency, engine busy percentages, HBM bytes, FLOP/s against peak, trace).
    ``numerics=False`` times the kernel without computing (outputs are None), for kernels
    too large to compute on the host. NKI's ``warmup``/``iters`` are accepted and ignored:
    a simulated run is deterministic."""
    if kernel is None:
        return lambda k: benchmark(k, chip=chip, numerics=numerics, trace=trace)
    kernel = jit(kernel)

    def run(*args: Any, **kwargs: Any) -> BenchmarkResult:
        from trnsim.hw.core import simulate as sim
        from trnsim.trace import trace_from_run

        traced = kernel.trace(*args, chip=_chip(chip, kernel), **kwargs)
        result = sim(traced.tracer.program, traced.inputs if numerics else None,
                     fidelity="instruction" if numerics else "timing", trace=trace)
        tr = trace_from_run(result)
        s = result.summary()
        return BenchmarkResult(outputs=_results(traced, result) if numerics else None, latency_ns=result.time_ns,
                               busy_pct=s.busy_pct, hbm_bytes=s.hbm_bytes, flops=s.flops, achieved_flops=s.achieved_flops,
                               peak_flops=s.peak_flops, instructions=len(traced.tracer.program), trace=tr, run=result)

    return run


def trace_program(kernel: Callable, *args: Any, chip: Any = None, **kwargs: Any) -> Any:
    """The Program a kernel traces into for these arguments (for reading or timing it)."""
    kernel = jit(kernel)
    return kernel.trace(*args, chip=_chip(chip, kernel), **kwargs).tracer.program


