"""Running kernels: every NKI entry point of both API generations.

Current (``nki``): ``nki.jit``, ``kernel[g](...)`` launches, ``nki.simulate(kernel)``.
Legacy (``neuronxcc.nki``): ``nki.simulate_kernel(kernel, *args)``, ``nki.baremetal``,
``nki.benchmark(warmup=, iters=)`` (``benchmark_result.nc_latency``), ``nki.profile``,
``nki.jit(mode=...)``. See docs/nki_compat.md.

A call traces the kernel into a Program (arguments become HBM input tensors
named after the kernel's parameters, the HBM tensors it returns become outputs),
simulates it on the chosen chip and gives back numpy arrays. A launch grid
``kernel[2, 3](...)`` traces every instance into one Program, in order. The chip:
``chip=``, else the kernel's, else ``$NEURON_PLATFORM_TARGET_OVERRIDE``, else
``$TRNSIM_CHIP``, else trn2.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TYPE_CHECKING

import numpy as np

from trnsim import dtypes as _dt
from trnsim.errors import ProgramError, TrnSimError
from trnsim.isa import Memory
from trnsim import adapters
from trnsim.nki import emit as _emit
from trnsim.nki import memory as _memory
from trnsim.nki.loops import SpmdDim, nc
from trnsim.nki.tiles import NkiTensor, _Placement
from trnsim.nki import tracer as tracer_module
from trnsim.nki.tracer import KernelError, Tracer

if TYPE_CHECKING:
    from trnsim.hw.spec import ChipLike

_TORCH_DTYPES = {"torch.float32": _dt.float32, "torch.bfloat16": _dt.bfloat16, "torch.float16": _dt.float16,
                 "torch.float8_e4m3fn": _dt.float8_e4m3fn, "torch.float8_e5m2": _dt.float8_e5m2, "torch.int8": _dt.int8,
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
    # a numpy scalar (np.float32(0.5)) is a number, passed as is, as NKI passes every
    # argument that is not an array; a 0-d array is a tensor of one element
    return isinstance(value, (np.ndarray, Typed)) or hasattr(value, "detach")


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
        dtype = _dt.as_dtype(arr.dtype)
    except TrnSimError:
        dtype = None
    if dtype is None:
        raise KernelError(f"argument {name!r}: numpy dtype {arr.dtype} has no chip dtype; use float32, float16, int8, "
                          "int32 ...")
    if _dt.is_extension(arr.dtype):   # an ml_dtypes array (bfloat16, float8): its values, or its bits if packed
        return (arr.view(dtype.dtype) if dtype in _dt.PACKED else arr.astype(np.float32)), dtype
    return arr, dtype


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

    # a kernel named test_* is not a pytest test, though it wraps a function (AWS's tests
    # define kernels so: pytest would collect one and ask for its arguments as fixtures)
    __test__ = False

    def __init__(self, fn: Callable, grid: tuple[int, ...] = (), chip: ChipLike = None, mode: str = "auto",
                 spread: tuple[SpmdDim | None, ...] = ()) -> None:
        self.fn = fn
        self.grid = grid
        self.chip = chip
        self.mode = mode
        self.spread = spread   # per grid axis: the nl.nc / nl.spmd_dim that places its instances on cores
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Kernel:
        grid = grid if isinstance(grid, tuple) else (grid,)
        if not grid or not all(isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g >= 0 for g in grid):
            raise KernelError(f"launch grid {grid!r} must be non-negative integers, as in kernel[4] or kernel[2, 3]")
        spread = tuple(g if isinstance(g, SpmdDim) and g.nc_at is not None
                       else SpmdDim((int(g),), 0) if isinstance(g, nc) else None for g in grid)
        if sum(s is not None for s in spread) > 1:
            raise KernelError(f"launch grid {grid!r} spreads more than one axis over the cores (nl.nc); one axis "
                              "picks the physical core, as in kernel[nl.nc(2) * 2, 4]")
        # a dimension of 0 launches one instance on it, as the real compiler does: AWS's
        # contributed pipelined attention calls flash_fwd[0](...) and reads its output
        grid = tuple(max(int(g), 1) for g in grid)
        if math.prod(grid) > MAX_GRID_INSTANCES:
            raise KernelError(f"launch grid {grid!r} has {math.prod(grid):,} instances, more than the "
                              f"{MAX_GRID_INSTANCES:,} the simulator traces one by one; launch fewer instances "
                              "and loop inside the kernel (nl.affine_range)")
        return Kernel(self.fn, grid, self.chip, self.mode, spread)

    def instances_by_core(self, chip: Any) -> list[list[tuple[int, ...]]]:
        """The launch-grid instances each physical core runs, in the order it runs them.

        On a chip whose logical NeuronCore is one physical core (trn1) every instance runs
        on that core, one after another. On Trainium2 and 3 (two physical cores per logical
        core) a launch of two or more instances uses both cores at once: an axis marked with
        ``nl.nc`` places each instance where its ``nl.nc`` digit says (:class:`SpmdDim`);
        an unmarked grid, which AWS leaves to the compiler, is cut into contiguous halves
        of its instances in row-major order (assumption: the order of
        ``nl.spmd_dim(nl.nc(2), n)``). ``kernel[2]`` is one instance per core."""
        every = list(itertools.product(*(range(g) for g in self.grid))) if self.grid else [()]
        lnc = chip.logical_core_size
        if lnc < 2 or len(every) < 2:
            return [every]
        marked = [(axis, s) for axis, s in enumerate(self.spread) if s is not None]
        by_core: list[list[tuple[int, ...]]] = [[] for _ in range(lnc)]
        for n, ids in enumerate(every):
            if marked:
                axis, s = marked[0]
                core = s.core_of(ids[axis]) % lnc
            else:
                core = n * lnc // len(every)
            by_core[core].append(ids)
        return [ids for ids in by_core if ids]

    def cores(self, chip: Any) -> int:
        """How many physical cores a launch on ``chip`` runs on (:meth:`instances_by_core`)."""
        return len(self.instances_by_core(chip))

    def trace(self, *args: Any, chip: ChipLike = None, **kwargs: Any) -> Traced:
        """Trace the kernel for these arguments (numpy arrays or torch tensors).

        Tiles first live as long as the kernel names them; if they do not all fit in
        SBUF/PSUM so, the kernel is traced again with each tile freed at its last use
        (the Neuron compiler's lifetimes); if SBUF is still too small, a third trace
        spills, as the compiler does: tiles go out to HBM and come back before their
        next use, which the second trace learned (:meth:`Tracer.make_room`). Only what
        does not fit then (a PSUM overflow, or one instruction's operands larger than
        SBUF) is refused."""
        chip = chip if chip is not None else self.chip
        made: list[list[tuple[Any, Any]]] = []
        try:
            return self._fitted(chip, args, kwargs, None, made)
        except Exception as failed:
            roomier = [r if r is not None else c for c, r in made[0]] if made else []
            if roomier == [c for c, _ in made[0]]:
                raise
            # a choice that keeps a result in PSUM (a broadcast) can leave later tiles no
            # room, and PSUM is never spilled: every such choice made the roomier way
            try:
                return self._fitted(chip, args, kwargs, roomier, [])
            except Exception:  # noqa: BLE001 (whatever the second try raises, the first error is the news)
                raise failed from None

    def _fitted(self, chip: ChipLike, args: tuple, kwargs: dict[str, Any], replay: list[Any] | None,
                made: list[list[tuple[Any, Any]]]) -> Traced:
        """:meth:`trace` with the first trace making ``replay``'s choices (:meth:`Tracer.decide`)
        where given; the first trace's choices go into ``made``."""
        first = Tracer(chip, self.fn.__name__, decisions=replay)
        made.append(first.decisions)
        try:
            traced = self._trace(first, args, kwargs)
        except Exception:
            if first.overflowed() is None:
                raise
            # a later error may come from the overflow itself: what does not fit is the news
            return self._fit(chip, first.last_use, [c for c, _ in first.decisions], args, kwargs)
        if first.overflowed() is None:
            return traced
        return self._fit(chip, first.last_use, [c for c, _ in first.decisions], args, kwargs)

    def _fit(self, chip: ChipLike, lifetimes: dict[int, int], decisions: list[Any], args: tuple,
             kwargs: dict[str, Any]) -> Traced:
        """Trace with tiles freed at their last use, learning where each is used; if SBUF
        still overflows, trace once more spilling to HBM."""
        second = Tracer(chip, self.fn.__name__, lifetimes, record_uses=True, decisions=decisions)
        traced = None
        try:
            traced = self._trace(second, args, kwargs)
        except Exception:
            if second.overflowed() is None:
                raise
        if second.overflowed() is None:
            assert traced is not None
            return traced
        third = Tracer(chip, self.fn.__name__, lifetimes, uses=second.uses, decisions=[c for c, _ in second.decisions])
        if second.psum_overflowed():
            third.spills = False   # PSUM is not spilled: its overflow is refused as it stands
        return self._trace(third, args, kwargs)

    def _trace(self, tracer: Tracer, args: tuple, kwargs: dict[str, Any]) -> Traced:
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
            placed = self.instances_by_core(tracer.chip)
            if len(placed) > 1:
                from trnsim.nki.cores import CoreTeam

                team = CoreTeam([tracer] + [tracer.for_core(c) for c in range(1, len(placed))], self.grid, placed)
                result = team.run(self.fn, call_args, call_kwargs)[0]
                tracer.program.use_core(0)
            else:
                for ids in itertools.product(*(range(g) for g in self.grid)) if self.grid else [()]:
                    tracer.grid = self.grid
                    tracer.start_instance(ids)
                    result = self.fn(*call_args, **call_kwargs)
                    tracer.flush_matmul()
            outs = _hbm_results(result, tracer, self.fn, self.mode == "simulation")
        tracer.live = False
        inputs.update(tracer.constants)
        return Traced(tracer, inputs, result, outs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if tracer_module.tracing():
            # called from inside another kernel (AWS's NKI library composes kernels so):
            # its instructions join the caller's Program, on the caller's tensors
            if self.grid:
                raise KernelError(f"kernel {self.fn.__name__}[{', '.join(map(str, self.grid))}] is launched on a grid "
                                  "from inside another kernel; call it without a grid there (its instructions join "
                                  "the calling kernel's), or launch it on its own")
            return self.fn(*args, **kwargs)
        # arrays of a framework (torch tensors) go to its integration; numpy runs here
        adapter = adapters.array_adapter_for(itertools.chain(args, kwargs.values()))
        if adapter is not None:
            return adapter.call(self, args, kwargs)
        return simulate(self)(*args, **kwargs)


def _hbm_results(result: Any, tracer: Tracer, fn: Callable, simulation: bool) -> list[NkiTensor]:
    items = result if isinstance(result, (tuple, list)) else ([] if result is None else [result])
    outs = []
    for r in items:
        if simulation and isinstance(r, NkiTensor) and r.buffer is not Memory.HBM:
            # NKI's CPU simulator (jit(mode="simulation")) gives a returned on-chip tile's
            # values; here one DMA at the end copies the tile to an output
            out = _emit.new_tensor(r.shape, r.dtype, Memory.HBM, name=f"{r.name}_out")
            _memory.store(out, r)
            r = out
        if not isinstance(r, NkiTensor) or r.buffer is not Memory.HBM:
            where = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"
            raise tracer.fail(f"kernel {fn.__name__} returns {r!r}; a kernel returns HBM tensors "
                              "(nl.ndarray(..., buffer=nl.shared_hbm)) it stored into (only under jit(mode=\"simulation\"), "
                              "as NKI's CPU simulator, may it return an SBUF or PSUM tile)", where)
        if r.tensor not in tracer.program.outputs:
            tracer.program.outputs.append(r.tensor)
        outs.append(r)
    return outs


# NKI's jit(mode=...) values: the framework is picked from the arguments whatever the mode
# (numpy in, numpy out), so each runs the kernel on the simulated core; "benchmark" also
# measures, as nki.benchmark does; "trace" (AWS's NKI library marks kernels that other
# kernels and frameworks call with it) runs as "auto" does
MODES = ("auto", "baremetal", "benchmark", "simulation", "torchxla", "jax", "trace")


def jit(fn: Callable | None = None, mode: str = "auto", *, chip: ChipLike = None, **_options: Any) -> Any:
    """Make ``fn`` a kernel: call it with numpy arrays (or torch tensors) to run it on the
    simulated NeuronCore at instruction fidelity; ``kernel[g0, g1]`` launches a grid.

    ``mode`` is legacy NKI's (one of :data:`MODES`); ``"benchmark"`` gives what
    :func:`benchmark` gives. Other NKI options (compiler flags, ``platform_target``) are
    accepted and change nothing."""
    if mode not in MODES:
        raise KernelError(f"nki.jit mode {mode!r} is not one of {', '.join(map(repr, MODES))}")
    if fn is None:
        return lambda f: jit(f, mode, chip=chip)
    if mode == "benchmark":
        return benchmark(fn, chip=chip)
    if isinstance(fn, (Benchmark, Profile, Simulated)):   # nki.simulate(bench_func): the kernel it wraps
        return fn.kernel
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, chip=chip, mode=mode)


# NEURON_PLATFORM_TARGET_OVERRIDE's values (NKI's names for the generations) and the chips they pick
PLATFORM_TARGETS = {"trn1": "trn1", "inf2": "trn1", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2",
                    "trn3": "trn3", "gen4": "trn3"}
PLATFORM_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"


def platform_target() -> str | None:
    """The chip ``$NEURON_PLATFORM_TARGET_OVERRIDE`` picks (None when unset)."""
    value = os.environ.get(PLATFORM_ENV, "").strip()
    if not value:
        return None
    chip = PLATFORM_TARGETS.get(value.lower())
    if chip is None:
        raise KernelError(f"{PLATFORM_ENV}={value!r} is not an NKI platform target; use trn1 (or inf2, gen2), "
                          "trn2 (gen3) or trn3 (gen4)")
    return chip


def _chip(chip: ChipLike, kernel: Kernel) -> Any:
    """The chip a run asks for, else the kernel's, else ``$NEURON_PLATFORM_TARGET_OVERRIDE``'s;
    None leaves ``$TRNSIM_CHIP`` (or the default) to :func:`trnsim.hw.spec.load_chip`, the
    one reader of that variable."""
    if chip is not None:
        return chip
    return kernel.chip if kernel.chip is not None else platform_target()


def _results(traced: Traced, run: Any) -> Any:
    from trnsim.nki.launch import result_value

    values = [result_value(run, t) for t in traced.output_tensors]
    if isinstance(traced.outputs, (tuple, list)):
        return type(traced.outputs)(values)
    return values[0] if values else None


class Simulated:
    """A kernel wrapped by :func:`simulate` (and :func:`baremetal`): each call runs it on
    numpy arrays and returns its outputs as numpy arrays; ``wrapped[grid]`` launches a
    grid, as ``kernel[grid]`` does."""

    def __init__(self, kernel: Kernel, chip: ChipLike, trace: str | os.PathLike | None) -> None:
        self.kernel, self.chip, self.trace = kernel, chip, trace
        functools.update_wrapper(self, kernel.fn)

    def __getitem__(self, grid: Any) -> Simulated:
        return Simulated(self.kernel[grid], self.chip, self.trace)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        traced, result = _run(self.kernel, self.chip, True, self.trace, args, kwargs)
        return _results(traced, result)


def _run(kernel: Kernel, chip: ChipLike, numerics: bool | None, trace: str | os.PathLike | None,
         args: tuple, kwargs: dict) -> tuple[Traced, Any]:
    """Trace ``kernel`` for a call and simulate it (at instruction fidelity when ``numerics``,
    writing the numpy arrays the kernel writes in place: destination passing)."""
    traced, result = _simulate_call(kernel, chip, numerics, trace, args, kwargs)
    adapters.notify_run(kernel.fn.__name__, result, args)
    return traced, result


def _simulate_call(kernel: Kernel, chip: ChipLike, numerics: bool | None, trace: str | os.PathLike | None,
                   args: tuple, kwargs: dict) -> tuple[Traced, Any]:
    from trnsim.nki.launch import launch

    launched = launch(kernel, args, kwargs, chip=_chip(chip, kernel), numerics=numerics, trace=trace)
    arrays = named_arguments(kernel, args, kwargs)
    for name, values in launched.written.items():
        dst = arrays.get(name)
        if isinstance(dst, np.ndarray) and dst.flags.writeable:
            dst[...] = np.asarray(values).reshape(dst.shape).astype(dst.dtype, copy=False)
    return launched.traced, launched.run


def simulate(kernel: Callable, *, chip: ChipLike = None, trace: str | os.PathLike | None = None) -> Simulated:
    """``nki.simulate(kernel)(*arrays)``: the kernel's outputs as numpy arrays, computed
    instruction by instruction with the chip's numerics; ``nki.simulate(kernel)[grid]``
    launches a grid."""
    return Simulated(jit(kernel), chip, trace)


def named_arguments(kernel: Kernel, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A call's arguments by the names :meth:`Kernel.trace` gives its HBM inputs
    (``args_0`` for the items of ``*args``, the key for ``**kwargs``)."""
    sig = inspect.signature(kernel.fn)
    named: dict[str, Any] = {}
    for name, value in sig.bind(*args, **kwargs).arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            named.update((f"{name}_{i}", v) for i, v in enumerate(value))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


def simulate_kernel(kernel: Callable, *args: Any, **kwargs: Any) -> Any:
    """Legacy ``nki.simulate_kernel(kernel, *args, **kwargs)``: run the kernel on these numpy
    arrays and return its outputs as numpy arrays (as :func:`simulate`)."""
    return simulate(kernel)(*args, **kwargs)


def baremetal(kernel: Callable | None = None, *, save_neff_name: str | None = None,
              save_trace_name: str | os.PathLike | None = None, additional_compile_opt: str | None = None,
              artifacts_dir: str | None = None, chip: ChipLike = None) -> Any:
    """Legacy ``nki.baremetal``: ``baremetal(kernel)``, ``@baremetal`` or
    ``@baremetal(save_trace_name=...)``; the kernel called on numpy arrays returns numpy
    arrays, as :func:`simulate`. ``save_trace_name`` writes the run's trace there (Chrome
    trace-event JSON, whatever the suffix); there is no NEFF, so ``save_neff_name``,
    ``artifacts_dir`` and ``additional_compile_opt`` change nothing."""
    if kernel is None:
        return lambda k: baremetal(k, save_trace_name=save_trace_name, chip=chip)
    return simulate(kernel, chip=chip, trace=save_trace_name)


@dataclass(frozen=True)
class NcLatency:
    """NeuronCore latency statistics as ``neuron-bench`` reports them for ``nki.benchmark``.
    A simulated run is deterministic, so every iteration takes the same simulated time and
    every percentile is that time."""

    latency_us: float
    warmup: int = 10
    iters: int = 100

    def get_latency_percentile(self, percentile: float) -> float:
        """The ``percentile``-th percentile latency in microseconds (0 to 100): the simulated latency."""
        if isinstance(percentile, bool) or not isinstance(percentile, (int, float, np.integer, np.floating)) \
                or not 0 <= percentile <= 100:
            raise KernelError(f"latency percentile {percentile!r} must be a number from 0 to 100, "
                              "as in get_latency_percentile(50)")
        return self.latency_us


class BenchmarkResult:
    """What :func:`benchmark` measured: outputs and the simulated run's figures. The
    latency is the run's; the trace and what is read off it (engine busy percentages,
    HBM bytes, FLOP/s) are made on first use, once: a kernel timed for its latency
    alone (legacy NKI's ``nc_latency``) does not pay for a trace of every instruction."""

    def __init__(self, outputs: Any, run: Any, instructions: int, warmup: int = 10, iters: int = 100) -> None:
        self.outputs = outputs
        self.run = run
        self.instructions = instructions
        self.warmup = warmup
        self.iters = iters

    @property
    def latency_ns(self) -> float:
        return self.run.time_ns

    @functools.cached_property
    def trace(self) -> Any:
        from trnsim.trace import trace_from_run

        return trace_from_run(self.run)

    @functools.cached_property
    def _figures(self) -> Any:
        from trnsim.trace.analysis import summarize

        return summarize(self.trace)

    @property
    def busy_pct(self) -> dict[str, float]:
        return self._figures.busy_pct

    @property
    def hbm_bytes(self) -> int:
        return self._figures.hbm_bytes

    @property
    def flops(self) -> int:
        return self._figures.flops

    @property
    def achieved_flops(self) -> float:
        return self._figures.achieved_flops

    @property
    def peak_flops(self) -> float:
        return self._figures.peak_flops

    @property
    def pct_of_peak(self) -> float:
        return 100.0 * self.achieved_flops / self.peak_flops if self.peak_flops else 0.0

    @property
    def latency_us(self) -> float:
        return self.latency_ns / 1000

    @property
    def nc_latency(self) -> NcLatency:
        """Legacy NKI's latency statistics (microseconds), as ``nki.benchmark`` gives them."""
        return NcLatency(self.latency_us, self.warmup, self.iters)

    def summary(self) -> Any:
        return self.run.summary()

    def save_trace(self, path: str | os.PathLike) -> Any:
        from trnsim.trace import save

        return save(self.trace, path)


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise KernelError(f"nki.benchmark {name}={value!r} must be an integer of at least {least}")
    return int(value)


class Benchmark:
    """A kernel wrapped by :func:`benchmark`: each call runs it and returns a
    :class:`BenchmarkResult`, also kept as ``.benchmark_result`` (legacy NKI reads
    ``.benchmark_result.nc_latency.get_latency_percentile(p)`` after a call)."""

    def __init__(self, kernel: Kernel, chip: ChipLike, numerics: bool | None, trace: str | os.PathLike | None,
                 warmup: int, iters: int) -> None:
        self.kernel, self.chip, self.numerics, self.trace = kernel, chip, numerics, trace
        self.warmup, self.iters = warmup, iters
        functools.update_wrapper(self, kernel.fn)

    def __getitem__(self, grid: Any) -> Benchmark:
        return Benchmark(self.kernel[grid], self.chip, self.numerics, self.trace, self.warmup, self.iters)

    def __getattr__(self, name: str) -> Any:
        if name == "benchmark_result":
            raise AttributeError(f"{self.kernel.fn.__name__} has no benchmark_result before it is called; "
                                 "call the benchmarked kernel first")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> BenchmarkResult:
        traced, result = _run(self.kernel, self.chip, self.numerics, self.trace, args, kwargs)
        self.benchmark_result = BenchmarkResult(
            _results(traced, result) if getattr(result, "fidelity", "") == "instruction" else None,
            result, len(traced.tracer.program), self.warmup, self.iters)
        return self.benchmark_result


def benchmark(kernel: Callable | None = None, *, warmup: int = 10, iters: int = 100, chip: ChipLike = None,
              numerics: bool | None = None, trace: str | os.PathLike | None = None,
              save_neff_name: str | None = None, save_trace_name: str | os.PathLike | None = None,
              additional_compile_opt: str | None = None) -> Any:
    """``nki.benchmark(kernel)(*arrays)`` or legacy ``nki.benchmark(warmup=5, iters=10)(kernel)``:
    a :class:`Benchmark`, whose calls return a :class:`BenchmarkResult` (simulated latency,
    engine busy percentages, HBM bytes, FLOP/s against peak, trace, and legacy
    ``nc_latency``). ``numerics=False`` times the kernel without computing (outputs are
    None), for kernels too large to compute on the host; ``numerics=True`` always
    computes; the default computes for Programs of at most
    :data:`trnsim.nki.launch.AUTO_NUMERICS_MAX_INSTRUCTIONS` instructions and times larger
    ones only (as a benchmark on the chip is run for its time). ``warmup`` and ``iters`` are
    checked and kept: a simulated run is deterministic, so one run gives every
    iteration's time. ``save_trace_name`` is ``trace``; there is no NEFF to save."""
    warmup, iters = _count("warmup", warmup, 0), _count("iters", iters, 1)
    trace = trace if trace is not None else save_trace_name
    if kernel is None:
        return lambda k: benchmark(k, warmup=warmup, iters=iters, chip=chip, numerics=numerics, trace=trace)
    return Benchmark(jit(kernel), chip, numerics, trace, warmup, iters)


class Profile:
    """A kernel wrapped by :func:`profile`. Each call executes the kernel ``num_execs``
    times (at least ``profile_nth``) and captures every ``profile_nth``-th execution, as
    the device's profiler does: execution ``n`` writes its trace to ``<trace stem>.<ext>``
    (``n`` = 1) or ``<trace stem>_exec_<n>.<ext>``, and its report to
    ``json_reports/<same stem>.json``; the traced Program goes to ``save_neff_name``.
    A simulated run is deterministic, so the kernel is simulated once and every captured
    execution's files hold that run. Every call returns the outputs as numpy arrays;
    ``profiled[grid]`` launches a grid."""

    def __init__(self, kernel: Kernel, directory: Path, trace_name: str, neff_name: str, overwrite: bool, nth: int,
                 execs: int, chip: ChipLike) -> None:
        self.kernel, self.directory, self.overwrite, self.chip = kernel, directory, overwrite, chip
        self.trace_name, self.neff_name, self.nth, self.execs = trace_name, neff_name, nth, execs
        functools.update_wrapper(self, kernel.fn)

    def __getitem__(self, grid: Any) -> Profile:
        return Profile(self.kernel[grid], self.directory, self.trace_name, self.neff_name, self.overwrite, self.nth,
                       self.execs, self.chip)

    def captured(self) -> list[int]:
        """The executions of one call whose profile is captured (1-based)."""
        return list(range(self.nth, max(self.execs, self.nth) + 1, self.nth))

    def paths(self, execution: int) -> tuple[Path, Path]:
        """Where execution ``execution``'s trace and JSON report go."""
        name = Path(self.trace_name)
        stem = name.stem if execution == 1 else f"{name.stem}_exec_{execution}"
        return self.directory / f"{stem}{name.suffix}", self.directory / "json_reports" / f"{stem}.json"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        files = [self.directory / self.neff_name] + [p for n in self.captured() for p in self.paths(n)]
        if not self.overwrite:
            for path in files:
                if path.exists():
                    raise KernelError(f"nki.profile would overwrite {path}; pass overwrite=True or choose "
                                      "another working_directory")
        from trnsim.atomic import write_atomic

        captured = self.captured()
        first_trace = self.paths(captured[0])[0]
        first_trace.parent.mkdir(parents=True, exist_ok=True)
        bench = Benchmark(self.kernel, self.chip, True, first_trace, 10, 100)(*args, **kwargs)
        program = bench.run.program
        (self.directory / "json_reports").mkdir(parents=True, exist_ok=True)
        listing = program.listing(f"{self.kernel.fn.__name__} on {program.chip.name}: the traced Program (trnsim has no NEFF)")
        write_atomic(self.directory / self.neff_name, lambda f: f.write(listing))
        trace_bytes = first_trace.read_bytes()
        for execution in captured:
            trace_path, report_path = self.paths(execution)
            if trace_path != first_trace:
                write_atomic(trace_path, lambda f: f.write(trace_bytes), binary=True)
            report = {"kernel": self.kernel.fn.__name__, "chip": program.chip.name, "execution": execution,
                      "latency_us": bench.latency_us, "instructions": bench.instructions, "hbm_bytes": bench.hbm_bytes,
                      "flops": bench.flops, "busy_pct": bench.busy_pct, "trace": str(trace_path)}
            write_atomic(report_path, lambda f, r=report: json.dump(r, f, indent=1))
        return bench.outputs


def profile(func: Callable | None = None, *, working_directory: str | os.PathLike | None = None,
            save_neff_name: str = "file.neff", save_trace_name: str = "profile.ntff",
            additional_compile_opt: str | None = None, overwrite: bool = False, profile_nth: int = 1,
            num_execs: int = 1, chip: ChipLike = None) -> Any:
    """Legacy ``@nki.profile(working_directory=..., save_trace_name=..., num_execs=...,
    profile_nth=...)``: each call of the kernel executes it ``num_execs`` times and
    captures every ``profile_nth``-th execution into ``working_directory`` (created if
    missing): the trace under the name asked for (Chrome trace-event JSON, which Perfetto
    opens whatever the suffix; not NTFF), a JSON report per captured execution in
    ``json_reports/`` (latency, instructions, HBM bytes, FLOPs, engine busy percentages),
    and the traced Program's listing as ``save_neff_name`` (there is no NEFF). Existing
    files are not replaced unless ``overwrite=True``. Unlike the device, the outputs are
    computed and returned."""
    if working_directory is None:
        raise KernelError("nki.profile needs working_directory=, the folder its trace and reports go to")
    nth, execs = _count("profile_nth", profile_nth, 1), _count("num_execs", num_execs, 1)
    for what, name in (("save_trace_name", save_trace_name), ("save_neff_name", save_neff_name)):
        if not isinstance(name, (str, os.PathLike)) or not str(name) or Path(name).name != str(name):
            raise KernelError(f"nki.profile: {what}={name!r} must be a file name inside working_directory, "
                              "not a path")
    directory = Path(working_directory)

    def wrap(f: Callable) -> Profile:
        return Profile(jit(f), directory, str(save_trace_name), str(save_neff_name), overwrite, nth, execs, chip)

    return wrap if func is None else wrap(func)


def trace(func: Callable | None = None, **options: Any) -> Any:
    """Legacy ``@nki.trace``: marks a kernel for ``nki.simulate_kernel`` (or a call); the
    same as :func:`jit`."""
    return jit(func, **options)


def trace_program(kernel: Callable, *args: Any, chip: ChipLike = None, **kwargs: Any) -> Any:
    """The Program a kernel traces into for these arguments (for reading or timing it)."""
    kernel = jit(kernel)
    return kernel.trace(*args, chip=_chip(chip, kernel), **kwargs).tracer.program


