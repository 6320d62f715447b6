"""Launching a kernel: trace it for a call, simulate the Program, and hand back what it
computed. Every caller runs kernels through here: NKI kernels on numpy arrays
(:mod:`trnsim.nki.jit`) and on torch tensors (:mod:`trnsim.backend.nkicall`), eager
ops' kernels timed (:func:`trnsim.backend.lowering.run_kernel`) or computed at
instruction fidelity (:mod:`trnsim.backend.instruction`), and compiled graphs' fused
kernels (:mod:`trnsim.backend.compile`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from trnsim.errors import ProgramError
from trnsim.isa import row_major_dims
from trnsim.nki.tracer import KernelError
from trnsim.simulator import RunResult, simulate

if TYPE_CHECKING:
    from trnsim.hw.spec import ChipLike
    from trnsim.nki.jit import Traced
    from trnsim.program import Program


@dataclass
class Launched:
    """One launch of a kernel: its trace, the simulated run, and (when the run computed
    values) the values of the kernel's results, in the order of ``traced.output_tensors``,
    and of the arguments it wrote in place (destination passing), by tensor name."""

    traced: Traced
    run: RunResult
    outputs: list[np.ndarray] | None = None
    written: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def program(self) -> Program:
        return self.traced.tracer.program


def written_inputs(program: Program) -> list[Any]:
    """The input tensors some instruction of ``program`` writes (destination passing)."""
    inputs = {id(t): t for t in program.inputs}
    written: dict[int, Any] = {}
    for inst in program:
        for v in inst.writes():
            if id(v.tensor) in inputs:
                written[id(v.tensor)] = v.tensor
    return list(written.values())


#: the largest Program whose values ``numerics=None`` (a benchmark's default) computes:
#: beyond it, computing every instruction's values on the host takes minutes, and a
#: benchmark's point is its time
AUTO_NUMERICS_MAX_INSTRUCTIONS = 20_000


def run_traced(traced: Traced, *, numerics: bool | None, trace: str | os.PathLike | None = None) -> Launched:
    """Simulate a traced kernel: its timing only, or (``numerics``) instruction by
    instruction on the traced inputs' values, with the results and the arguments it
    wrote; ``numerics=None`` computes values for Programs of at most
    :data:`AUTO_NUMERICS_MAX_INSTRUCTIONS` instructions. ``trace`` is a path to write the
    run's trace to."""
    program = traced.tracer.program
    if numerics is None:
        numerics = len(program.instructions) <= AUTO_NUMERICS_MAX_INSTRUCTIONS
    if not numerics:
        return Launched(traced, simulate(program, None, fidelity="timing", trace=trace))
    written = written_inputs(program)
    program.outputs.extend(t for t in written if t not in program.outputs)
    try:
        run = simulate(program, traced.inputs, fidelity="instruction", trace=trace)
    except KernelError:
        raise
    except ProgramError as e:   # found only when values are known (a gather index): still the kernel's fault
        raise KernelError(program.source_names(str(e))) from e
    return Launched(traced, run, [result_value(run, t) for t in traced.output_tensors],
                    {t.name: run.outputs[t.name] for t in written})


def result_value(run: RunResult, result: Any) -> np.ndarray:
    """The value of a tensor a kernel returned, through the view it returned: the whole
    HBM tensor as allocated, or a reshape of it (``out.reshape((n, c, h, w))`` before
    ``return``, as nki-samples' interpolation kernels do)."""
    full = run.outputs[result.tensor.name]
    view = result.view
    if view.offset == 0 and view.dims == row_major_dims(tuple(full.shape)):
        return full
    flat = np.ascontiguousarray(full).reshape(-1)
    strides = tuple(stride * flat.itemsize for stride, _ in view.dims)
    return np.lib.stride_tricks.as_strided(flat[view.offset:], shape=view.shape, strides=strides).copy()


def launch(kernel: Any, args: tuple, kwargs: dict, *, chip: ChipLike, numerics: bool | None,
           trace: str | os.PathLike | None = None) -> Launched:
    """Trace ``kernel`` (a :class:`trnsim.nki.jit.Kernel`) on ``args`` and ``kwargs`` for
    ``chip`` and run it (see :func:`run_traced`)."""
    return run_traced(kernel.trace(*args, chip=chip, **kwargs), numerics=numerics, trace=trace)
