"""Why each instruction of a simulated run started when it did.

An instruction starts at the latest of: the end of each dependency (plus the
semaphore latency when the dependency ran on another engine or queue), the count its
semaphore wait needs, and the end of the previous instruction on its own track (the
tensor engine adds its stationary-load rules). :func:`wait_causes` finds, from a
:class:`trnsim.hw.core.RunResult`, which of these set each start: that is what
:func:`trnsim.trace.trace_from_run` records as an instruction's ``wait`` argument and
what :func:`trnsim.trace.critical_path` walks.

Kinds of cause: ``"dma"`` (a dependency on a DMA transfer), ``"engine"`` (a
dependency on another engine's instruction, or another track of the same engine),
``"semaphore"`` (a semaphore wait reached its count: ``on`` is the signal that reached
it), ``"busy"`` (the track was busy with its own previous instruction ``on``) and
``"launch"`` (nothing to wait for: the run's start). When two causes end at the same
moment the dependency named first wins over a semaphore, and both over ``busy``.
"""

from __future__ import annotations

from typing import Any

from trnsim.hw.static import LOAD, MULTIPLY, SIGNAL, WAIT

Picos = int
CAUSES = ("dma", "engine", "semaphore", "busy", "launch")


def _kind(tracks: list[str], track: str, on: int) -> str:
    if tracks[on].startswith("dma."):
        return "dma"
    return "busy" if tracks[on] == track else "engine"


def wait_causes(result: Any) -> list[dict[str, Any]]:
    """For each instruction of ``result`` (a RunResult), what its start waited on:
    ``{"kind": ..., "on": index or None, "sem": name or None, "idle_ns": ...}`` where
    ``idle_ns`` is how long its track sat idle before it (since its previous
    instruction on the track ended, or since the run's start)."""
    program = result.program
    static = program.timing
    chip = program.chip
    sem_ps = round(chip.sync.semaphore_wait_ns * 1000)
    sem_to_dma_ps = round(chip.dma.semaphore_to_start_ns * 1000)
    tracks, groups, kinds = result.tracks, static.groups, static.kinds
    starts, ends = result.starts, result.ends
    signals: dict[str, list[int]] = {}   # each semaphore's signals, in the order they ended
    for i, kind in enumerate(kinds):
        if kind == SIGNAL:
            signals.setdefault(program.instructions[i].sem, []).append(i)
    for sem in signals:
        signals[sem].sort(key=lambda s: (ends[s], s))
    previous: dict[str, int] = {}      # the latest instruction on each track
    last_multiply = last_load = last_hold = -1   # tensor engine state, in program order
    causes = []
    for i, inst in enumerate(program.instructions):
        track, group, kind = tracks[i], groups[i], kinds[i]
        start = starts[i]
        latency = sem_to_dma_ps if group.startswith("dma.") else sem_ps
        candidates: list[tuple[Picos, str, int, str | None]] = []
        for d in static.deps[i]:
            candidates.append((ends[d] + (latency if groups[d] != group else 0), _kind(tracks, track, d), d, None))
        if kind == WAIT:
            done = signals.get(inst.sem, [])
            if len(done) >= inst.count:
                s = done[inst.count - 1]
                candidates.append((ends[s] + sem_ps, "semaphore", s, inst.sem))
        if group == "tensor":
            if kind == LOAD:
                if last_multiply >= 0:
                    candidates.append((starts[last_multiply], "engine", last_multiply, None))
                if last_hold >= 0:
                    candidates.append((ends[last_hold], "engine", last_hold, None))
            elif last_load >= 0:
                candidates.append((ends[last_load], "engine", last_load, None))
        prev = previous.get(track, -1)
        if prev >= 0:
            candidates.append((ends[prev], "busy", prev, None))
        matching = [c for c in candidates if c[0] == start]
        if matching:
            _, how, on, sem = matching[0]
        elif candidates and start > 0:
            _, how, on, sem = max(candidates, key=lambda c: c[0])
        else:
            how, on, sem = "launch", None, None
        idle = start - (ends[prev] if prev >= 0 else 0)
        causes.append({"kind": how, "on": on, "sem": sem, "idle_ns": idle / 1000})
        previous[track] = i
        if group == "tensor":
            if kind == LOAD:
                last_load = i
            elif kind == MULTIPLY:
                last_multiply = i
            else:
                last_hold = i
    return causes
