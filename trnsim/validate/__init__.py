"""trnsim checked against published Trainium measurements.

Each :class:`Figure` is one number AWS published for real hardware (a kernel's latency, a
DMA transfer's time, a collective's latency) with its source, and how trnsim reproduces
it: the public code itself where the figure comes from public code (a fetched
repository passed by path, nothing copied into this one), trnsim's own equivalent where
it does not. :func:`run` simulates them and :func:`report` prints, per figure, published
against simulated and the error, then the median and worst error per kind, separately for
the figures a chip-file parameter was fitted to (``group="fit"``) and those never used for
fitting (``group="check"``), and for each published optimisation step whether trnsim keeps
its direction and by how much its speed-up differs.

``trnsim validate`` (:mod:`trnsim.validate.cli`) and ``benchmarks/validate.py`` run it;
docs/validation.md holds the last full run. The figures live in
:mod:`trnsim.validate.collectives`, :mod:`trnsim.validate.kernels`,
:mod:`trnsim.validate.dma` and :mod:`trnsim.validate.models`.
"""

from __future__ import annotations

from trnsim.validate.figures import GROUPS, KINDS, Figure, Result, Sources, Step, report, run, steps, summary


def all_figures() -> list[Figure]:
    """Every figure trnsim is checked against: collectives, DMA, kernels, then whole models."""
    from trnsim.validate import collectives, dma, kernels, models

    figures = [*collectives.figures(), *dma.figures(), *kernels.figures(), *models.figures()]
    if len({f.key for f in figures}) != len(figures):
        raise AssertionError("validation figure keys repeat")
    return figures


__all__ = ["GROUPS", "KINDS", "Figure", "Result", "Sources", "Step", "all_figures", "report", "run", "steps",
           "summary"]
