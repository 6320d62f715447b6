"""Compare what a run prints with what a committed notebook or doc shows.

Simulated times are deterministic, but some printed figures are not a property of
trnsim: the last digits of a floating-point error against numpy or a CPU loss depend
on the host's BLAS and vector units (one machine prints ``relative 7.2e-07`` where
another prints ``8.3e-07``); a host time and a temporary folder's name are the run's
alone. :func:`differences` compares the text exactly and every
number within a tolerance far below any figure trnsim reports (a simulated time, a
share, a count) and far above that rounding noise.
"""

from __future__ import annotations

import math
import re
import tempfile

# a number as trnsim prints it: sign, thousands separators, decimals, exponent
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")
#: two numbers match when they differ by at most ABS_TOL: a simulated time printed in us
#: to three decimals (1 ns) that moves by its last digit is found; an error against
#: numpy below 1e-4, or a loss's sixth decimal, is noise
ABS_TOL = 1e-4
# figures of the host's own time, which no two runs share: "1 graph, 5.1 s on this host",
# "trnsim host 1.48 s"; they are compared as text around a placeholder
# a temporary folder a run made: /tmp/trl_sft_01y5zr84/adapter
TEMP_PATH = re.compile(rf"(?:/tmp|{re.escape(tempfile.gettempdir())})/[\w.-]+")
HOST_TIME = re.compile(r"[\d.,]+(?= s on this host)|(?<=trnsim host )[\d.,]+(?= s)")


def _split(text: str) -> tuple[list[str], list[str]]:
    """The text between numbers (runs of blanks made one space, so a wider number does
    not shift a column into a mismatch) and the numbers."""
    text = TEMP_PATH.sub("<tmp>", HOST_TIME.sub("<host>", text))
    words = [re.sub(r"[ \t]+", " ", w) for w in NUMBER.split(text)]
    return words, NUMBER.findall(text)


def _value(number: str) -> float:
    return float(number.replace(",", ""))


def close(a: str, b: str) -> bool:
    """Whether two printed numbers are the same figure (see :data:`ABS_TOL`)."""
    x, y = _value(a), _value(b)
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return abs(x - y) <= ABS_TOL


def differences(expected: str, actual: str) -> list[str]:
    """The lines in which ``actual`` differs from ``expected``, one message each (empty
    when they match): different text, a line more or less, or a number out of
    tolerance."""
    old, new = expected.rstrip("\n").splitlines(), actual.rstrip("\n").splitlines()
    found = []
    for i, (a, b) in enumerate(zip(old, new), 1):
        (wa, na), (wb, nb) = _split(a), _split(b)
        if wa != wb or len(na) != len(nb):
            found.append(f"line {i}: expected {a!r}, got {b!r}")
        elif bad := [(x, y) for x, y in zip(na, nb) if not close(x, y)]:
            found.append(f"line {i}: {', '.join(f'{x} became {y}' for x, y in bad)} in {b!r}")
    if len(old) != len(new):
        longer, label = (old, "expected") if len(old) > len(new) else (new, "got")
        found.append(f"{label} {abs(len(old) - len(new))} more line(s), from {longer[min(len(old), len(new))]!r}")
    return found
