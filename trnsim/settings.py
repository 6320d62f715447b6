"""The ``TRNSIM_*`` environment variables, and the one check of their values.

Each variable has one reader here; a bad value becomes one error that names the variable,
the value and the values it takes (with a "did you mean" for a near miss). Names trnsim
defines (chips, fidelities, instances) are taken in any case: ``Trn2`` is ``trn2``.
:func:`check` runs before the first op on the ``neuron`` device and before every
``trnsim`` command, so a mistyped variable stops a script at its first device op with one
line, not deep inside. Reading the variables imports no simulator (``import torch``
autoloads the device and must stay cheap); checking ``TRNSIM_CHIP`` reads its chip file.
The hardware layer never imports this module: :func:`trnsim.hw.spec.load_chip` reads
``TRNSIM_CHIP`` itself when it is given no chip.
"""

from __future__ import annotations

import difflib
import os
from typing import Callable, Sequence

from trnsim.errors import ChipSpecError, ConfigError, TrnSimWarning, warn

FIDELITIES = ("op", "instruction", "timing")
SWITCH_VALUES = ("0", "1", "false", "true", "no", "yes", "off", "on")
PROGRESS_VALUES = ("0", "1")

# Every variable trnsim reads, with the values it takes.
VARIABLES = {
    "TRNSIM_CHIP": "a shipped chip's name or a path to a chip TOML file",
    "TRNSIM_FIDELITY": " or ".join(FIDELITIES),
    "TRNSIM_INSTANCE": "an instance name that `trnsim chips` lists",
    "TRNSIM_DIST_TIMEOUT": "a positive number of seconds",
    "TRNSIM_NO_ALIASES": "1 to turn the nki/torch_neuronx import names off, 0 to leave them on",
    "TRNSIM_PROGRESS": "0 to hide the progress line of trnsim run, 1 to show it",
    "TRNSIM_JOB_TRACE_DIR": "set by trnsim run --nproc for its ranks",
    "TRNSIM_FOLLOW_DIR": "set by trnsim run for the Python processes its script starts",
    "TRNSIM_FOLLOW_ROOT": "set by trnsim run for the Python processes its script starts",
    "TRNSIM_REGENERATE": "1 to rewrite the golden traces of the test suite",
}


class SettingWarning(TrnSimWarning):
    """An environment variable named ``TRNSIM_...`` that trnsim does not read (a typo of one
    it does, most likely); it has no effect."""


def did_you_mean(value: str, choices: Sequence[str]) -> str:
    """``"did you mean 'x'? "`` for the choice closest to ``value``, or ``""``."""
    close = difflib.get_close_matches(value.lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
    if not close:
        return ""
    match = next(c for c in choices if c.lower() == close[0])
    return f"did you mean {match!r}? "


def choice(value: str, choices: Sequence[str], what: str, label: str, fix: str) -> str:
    """``value`` as spelt in ``choices`` (any case); else a :class:`ConfigError` that
    reads ``LABEL is not WHAT; did you mean ...? FIX, one of: CHOICES``."""
    for c in choices:
        if value.strip().lower() == c.lower():
            return c
    raise ConfigError(f"{label} is not {what}; {did_you_mean(value.strip(), choices)}{fix} "
                      f"one of: {', '.join(choices)}")


def fidelity(value: str, label: str, fix: str = "use") -> str:
    """The fidelity ``value`` names (``"Instruction"`` is ``"instruction"``); ``label`` says
    where it came from (``TRNSIM_FIDELITY='x'``, ``set_fidelity('x')``)."""
    return choice(value, FIDELITIES, "a fidelity", label, fix)


def env_fidelity() -> str:
    """The fidelity ``$TRNSIM_FIDELITY`` asks for (``op`` when unset or empty)."""
    value = os.environ.get("TRNSIM_FIDELITY", "").strip()
    return fidelity(value, f"TRNSIM_FIDELITY={value!r}", "unset it or set it to") if value else "op"


def env_chip_name() -> str | None:
    """``$TRNSIM_CHIP`` (None when unset or empty)."""
    return os.environ.get("TRNSIM_CHIP", "").strip() or None


def env_instance() -> str | None:
    """The instance ``$TRNSIM_INSTANCE`` names (None when unset or empty), checked."""
    value = os.environ.get("TRNSIM_INSTANCE", "").strip()
    return instance(value, f"TRNSIM_INSTANCE={value!r}", "unset it or set it to") if value else None


def instance(value: str, label: str, fix: str = "use") -> str:
    """The shipped instance ``value`` names, in any case."""
    from trnsim.hw.fabric import instances

    return choice(value, list(instances()), "an instance of a shipped chip", label, fix)


def dist_timeout_s(default: float) -> float:
    """``$TRNSIM_DIST_TIMEOUT`` in seconds (``default`` when unset or empty)."""
    raw = os.environ.get("TRNSIM_DIST_TIMEOUT", "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(f"TRNSIM_DIST_TIMEOUT={raw!r} is not a number of seconds; set it to e.g. 120 "
                          "or unset it") from None
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(f"TRNSIM_DIST_TIMEOUT={raw!r} must be a positive number of seconds; set it to e.g. 120 "
                          "or unset it")
    return seconds


def visible_cores(total: int) -> int:
    """How many of a server's ``total`` logical NeuronCores this process sees:
    ``$NEURON_RT_VISIBLE_CORES`` (an index ``3``, a range ``0-3``, or a comma list of
    them, as the Neuron runtime takes it), else ``$NEURON_RT_NUM_CORES`` (a count; 0 means
    all), else all ``total``."""
    raw = os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip()
    if raw:
        label = f"NEURON_RT_VISIBLE_CORES={raw[:80]!r}"
        cores: set[int] = set()
        for part in raw.split(","):
            ends = part.strip().split("-")
            if len(ends) > 2 or not all(e.strip().isdigit() for e in ends):
                raise ConfigError(f"{label} is not a core index, a range or a comma list of them; set it to "
                                  f"e.g. 0, 0-3 or 0,2 (cores 0 to {total - 1} of this server) or unset it")
            low, high = int(ends[0]), int(ends[-1])
            if low > high or high >= total:
                raise ConfigError(f"{label} names cores outside 0-{total - 1}, the logical NeuronCores of one "
                                  "server of this instance; name cores in that range or unset it")
            cores.update(range(low, high + 1))
        return len(cores)
    raw = os.environ.get("NEURON_RT_NUM_CORES", "").strip()
    if raw:
        if not raw.isdigit() or int(raw) > total:
            raise ConfigError(f"NEURON_RT_NUM_CORES={raw[:80]!r} is not a count of NeuronCores from 0 (all) to "
                              f"{total}, the logical cores of one server of this instance; set one or unset it")
        return int(raw) or total
    return total


def _check_switch(name: str, allowed: Sequence[str]) -> None:
    value = os.environ.get(name, "").strip()
    if value:
        choice(value, allowed, "a value it takes", f"{name}={value!r}", "unset it or set it to")


def _check_chip() -> None:
    chip = env_chip_name()
    if chip is not None:
        from trnsim.hw.spec import load_chip_from

        load_chip_from(chip, f"TRNSIM_CHIP={chip[:200]!r}", "; or unset TRNSIM_CHIP")


# each variable's check, in the order :func:`check` runs them
_CHECKS: tuple[tuple[str, Callable[[], object]], ...] = (
    ("TRNSIM_FIDELITY", env_fidelity),
    ("TRNSIM_CHIP", _check_chip),
    ("TRNSIM_INSTANCE", env_instance),
    ("TRNSIM_DIST_TIMEOUT", lambda: dist_timeout_s(1.0)),
    ("TRNSIM_NO_ALIASES", lambda: _check_switch("TRNSIM_NO_ALIASES", SWITCH_VALUES)),
    ("TRNSIM_PROGRESS", lambda: _check_switch("TRNSIM_PROGRESS", PROGRESS_VALUES)),
)


def check() -> None:
    """Check every ``TRNSIM_*`` variable that is set: raise the error of the first bad one
    (a :class:`ConfigError`, or a :class:`ChipSpecError` for ``TRNSIM_CHIP``), and warn of
    a ``TRNSIM_...`` name trnsim does not read."""
    for _, check_one in _CHECKS:
        check_one()
    for message in unknown_names():
        warn(message, SettingWarning)


def unknown_names() -> list[str]:
    """For each ``TRNSIM_...`` variable set that trnsim does not read, why it has no effect."""
    return [f"{name} is not a variable trnsim reads, so it has no effect; "
            f"{did_you_mean(name, list(VARIABLES))}trnsim reads {', '.join(VARIABLES)}"
            for name in sorted(os.environ) if name.startswith("TRNSIM_") and name not in VARIABLES]


def problems() -> dict[str, Exception]:
    """Every bad ``TRNSIM_*`` variable with its error, by name (empty when all are good):
    what ``trnsim doctor`` reports, where :func:`check` stops at the first."""
    found: dict[str, Exception] = {}
    for name, check_one in _CHECKS:
        try:
            check_one()
        except (ConfigError, ChipSpecError) as e:
            found[name] = e
    return found


def problem() -> Exception | None:
    """The error :func:`check` raises, without its traceback (None when all is well), so
    the first device op can raise it in one frame."""
    try:
        check()
    except (ConfigError, ChipSpecError) as e:
        e.__suppress_context__ = True
        return e.with_traceback(None)
    return None
