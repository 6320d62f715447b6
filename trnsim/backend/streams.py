"""Streams and events on the simulated timeline.

The device runs ops one after another whichever stream issued them (trnsim models
one in-order queue per core), so streams order nothing beyond that; events read the
simulated clock, and :meth:`Event.elapsed_time` is in simulated milliseconds.

``torch.accelerator.current_stream()`` would return PyTorch's C++ stream, which a
Python-registered device cannot back with events (FSDP2 calls its ``wait_event`` with
an event of ``torch.neuron``'s streams); :func:`install` makes it return the stream
``torch.neuron.current_stream()`` gives, as a real device's C++ stream would be.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from trnsim.backend import state, timeline


_index = state.device_index


def _check(value: Any, cls: type, what: str) -> None:
    """Refuse ``value`` unless it is a ``cls`` (a torch.neuron Stream or Event). A generic
    ``torch.Stream`` of the ``neuron`` device passes as a Stream (DDP makes its copy
    streams so); on one in-order queue it orders what a neuron Stream would."""
    if cls is Stream and isinstance(value, torch.Stream) and value.device.type == "neuron":
        return
    if not isinstance(value, cls):
        raise TypeError(f"{what} takes a torch.neuron.{cls.__name__}, not {type(value).__name__} {value!r:.40}")


_PRIVATEUSE1 = int(torch._C._autograd.DeviceType.PrivateUse1)
_ids = iter(range(1 << 62))


class Stream(torch.Stream):
    """A ``neuron`` stream (``torch.cuda.Stream`` shape); ``priority`` is kept, not modelled.
    It is a ``torch.Stream`` (of device ``neuron:0``, this process's core), so PyTorch's
    generic calls (``Tensor.record_stream``, DDP's copy streams) take it."""

    def __new__(cls, device: Any = None, priority: int = 0) -> Stream:
        _index(device)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"Stream priority must be an int (0, or negative for higher), not {priority!r}")
        return super().__new__(cls, stream_id=next(_ids), device_index=0, device_type=_PRIVATEUSE1)

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.priority = priority

    def __enter__(self) -> Stream:
        _current().append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _current().pop()

    def synchronize(self) -> None:
        timeline.sync("stream.synchronize")

    def query(self) -> bool:
        """True when the device has caught up with the host (it always has after a sync)."""
        return state.clock.device <= state.clock.host

    def wait_event(self, event: Event) -> None:
        """Ops issued later start after ``event`` (already true on one in-order queue)."""
        _check(event, Event, "wait_event")

    def wait_stream(self, other: Stream) -> None:
        """Ops issued later start after ``other``'s (already true on one in-order queue)."""
        _check(other, Stream, "wait_stream")

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device=neuron:0 priority={self.priority}>"


_default = Stream()
_tls = threading.local()


def _current() -> list[Stream]:
    """This thread's stack of current streams (the current stream is per thread, as CUDA's is)."""
    stack = getattr(_tls, "streams", None)
    if stack is None:
        stack = _tls.streams = [_default]
    return stack


def default_stream(device: Any = None) -> Stream:
    _index(device)
    return _default


def current_stream(device: Any = None) -> Stream:
    """The current stream of this thread (the default stream until :class:`stream` sets one)."""
    _index(device)
    return _current()[-1]


_accelerator_current_stream = torch.accelerator.current_stream


def _accelerator_stream(device: Any = None, /) -> Any:
    """``torch.accelerator.current_stream`` that answers for ``neuron`` with its own stream."""
    acc = torch.accelerator.current_accelerator()
    if acc is not None and acc.type == "neuron":
        return current_stream(device)
    return _accelerator_current_stream(device)


def install() -> None:
    """Route ``torch.accelerator.current_stream`` to :func:`current_stream` on ``neuron``."""
    torch.accelerator.current_stream = _accelerator_stream


class stream:
    """Context manager that makes ``s`` the current stream of this thread."""

    def __init__(self, s: Stream | None) -> None:
        if s is not None:
            _check(s, Stream, "torch.neuron.stream")
        self.s = s

    def __enter__(self) -> Stream | None:
        if self.s is not None:
            _current().append(self.s)
        return self.s

    def __exit__(self, *exc: Any) -> None:
        if self.s is not None:
            _current().pop()


class Event:
    """A point on the device timeline; ``elapsed_time`` gives simulated milliseconds."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.time_ps: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        """Mark the time the device reaches this point of the issued work."""
        if stream is not None:
            _check(stream, Stream, "Event.record")
        self.time_ps = max(state.clock.device, state.clock.host)

    def query(self) -> bool:
        """True when the work before the record is done (an event never recorded has
        none to wait for, as with torch.cuda.Event)."""
        return self.time_ps is None or self.time_ps <= state.clock.host

    def synchronize(self) -> None:
        timeline.sync("event.synchronize")

    def wait(self, stream: Stream | None = None) -> None:
        """Later work waits for this event (already true on one in-order queue)."""

    def elapsed_time(self, end: Event) -> float:
        """Simulated milliseconds from this event to ``end``."""
        _check(end, Event, "elapsed_time")
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True to use elapsed_time")
        if self.time_ps is None or end.time_ps is None:
            raise RuntimeError("Both events must be recorded before calling elapsed_time")
        return (end.time_ps - self.time_ps) / 1e9
