"""The units the simulator counts in, as type aliases: simulated time is integer
picoseconds (:data:`Picos`, exact and the same on every machine), reported in
nanoseconds (:data:`Nanos`); engine work in clock cycles (:data:`Cycles`); memory in
bytes (:data:`Bytes`)."""

from __future__ import annotations

Picos = int
Nanos = float
Cycles = float
Bytes = int
