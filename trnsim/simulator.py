"""Running a Program: the scheduler (:mod:`trnsim.hw.core`) for its times, the machine
(:mod:`trnsim.compute`) for its values, and a trace (:mod:`trnsim.trace`) when asked.

This is the top of the simulator's core: everything that runs a Program (``trnsim.simulate``,
NKI kernels, the torch device's ops) comes through :func:`run_timing` or :func:`simulate`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

from trnsim.errors import ProgramError
from trnsim.hw.core import TimedRun, schedule
from trnsim.program import Program

if TYPE_CHECKING:
    from trnsim.trace import Summary

FIDELITIES = ("timing", "instruction")


class RunResult(TimedRun):
    """What a simulated run produced: per-instruction times and causes, outputs, and the
    Program."""

    def summary(self) -> Summary:
        """Simulated time, engine busy percentages, HBM traffic and FLOP/s (a :class:`trnsim.trace.Summary`)."""
        from trnsim.trace.analysis import summarize

        return summarize(self)


def run_timing(program: Program) -> RunResult:
    """Time ``program`` on its chip without computing any data."""
    timed = schedule(program)
    return RunResult(**{f.name: getattr(timed, f.name) for f in dataclasses.fields(timed)})


def simulate(program: Program, inputs: Mapping[str, Any] | None = None, *, fidelity: str = "timing",
             trace: Any = None, backend: str = "numba") -> RunResult:
    """Run ``program`` on one simulated NeuronCore of its chip.

    ``fidelity="timing"`` times the program and computes no data;
    ``"instruction"`` also executes every instruction on simulated SBUF, PSUM and
    HBM (``inputs`` maps input tensor names to numpy arrays) and fills
    ``result.outputs`` with the output tensors; output elements nothing wrote read
    as NaN (0 for integer dtypes) and raise an UnwrittenOutputWarning. ``trace`` is
    a path: the Chrome trace-event JSON of the run is written there.
    """
    if not isinstance(program, Program):
        raise ProgramError(f"simulate takes a Program, not {type(program).__name__} {program!r:.60}; build one with "
                           "trnsim.Program or trace a kernel with trnsim.nki.trace_program")
    if fidelity not in FIDELITIES:
        raise ProgramError(f"fidelity {fidelity!r} is not one of: {', '.join(FIDELITIES)}")
    if inputs is not None and not isinstance(inputs, Mapping):
        raise ProgramError(f"inputs must map input tensor names to arrays, not {type(inputs).__name__}")
    if inputs and fidelity == "timing":
        raise ProgramError("inputs were given but fidelity='timing' computes no data; pass fidelity='instruction'")
    result = run_timing(program)
    if fidelity == "instruction":
        from trnsim.compute import Machine

        machine = Machine(program, backend=backend)
        given = dict(inputs or {})
        for t in program.inputs:
            if t.name not in given:
                raise ProgramError(f"input tensor {t.name!r} of program {program.name!r} has no data; "
                                   f"pass inputs={{{t.name!r}: array}}")
            machine.bind(t, given.pop(t.name))
        if given:
            raise ProgramError(f"inputs {sorted(given)} name no input tensor of program {program.name!r}; "
                               f"its inputs: {[t.name for t in program.inputs]}")
        machine.run()
        result.fidelity = "instruction"
        result.outputs = {t.name: machine.result(t) for t in program.outputs}
        machine.warn_unwritten()
    if trace is not None:
        from trnsim.trace import write_trace

        write_trace(result, trace)
    return result
