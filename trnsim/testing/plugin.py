"""pytest plugin: run a user's kernel suite on the simulated chip.

- ``--trnsim-chip NAME|PATH`` sets the chip for the whole run (else ``$TRNSIM_CHIP``, else trn2).
- ``@pytest.mark.nki(chip="trn1")`` sets it for one test.
- ``--trnsim-trace-dir DIR`` makes ``nki_benchmark`` write each run's trace there.
- the ``nki_benchmark`` fixture is :func:`trnsim.nki.benchmark` with that chip:
  ``result = nki_benchmark(kernel, x, y)``.
"""

from __future__ import annotations

import os
import re
from typing import Any, TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from trnsim.hw.spec import ChipLike


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("trnsim")
    group.addoption("--trnsim-chip", default=None, help="chip for NKI kernel tests (trn1, trn2, trn3 or a TOML path)")
    group.addoption("--trnsim-trace-dir", default=None, help="write the trace of every nki_benchmark run here")


def pytest_configure(config: Any) -> None:
    """Register the marker; refuse a bad ``--trnsim-chip`` or ``--trnsim-trace-dir`` once,
    as a usage error, rather than in every test."""
    from trnsim.errors import TrnSimError

    config.addinivalue_line("markers", "nki(chip=None): run this test's kernels on the given simulated chip")
    from trnsim.atomic import check_writable

    checks = {"--trnsim-chip": _checked_chip,
              "--trnsim-trace-dir": lambda d: check_writable(os.path.join(d, "trnsim-trace-dir-check.json"))}
    for option, check in checks.items():
        value = config.getoption(option)
        try:
            if value:
                check(value)
        except TrnSimError as e:
            raise pytest.UsageError(f"{option}: {e}") from None


def _checked_chip(chip: ChipLike) -> str:
    """``chip`` (a shipped chip's name, a TOML path or a ChipSpec) as ``$TRNSIM_CHIP``
    holds it, loaded once to check it (:class:`trnsim.errors.ChipSpecError` if bad)."""
    from trnsim.hw.spec import ChipSpec, load_chip

    if isinstance(chip, ChipSpec):
        return chip.source
    load_chip(chip)
    return os.fspath(chip)


@pytest.fixture(autouse=True)
def _trnsim_chip(request: Any, monkeypatch: Any) -> None:
    from trnsim.errors import TrnSimError

    marker = request.node.get_closest_marker("nki")
    chip = None
    if marker is not None:
        if len(marker.args) > 1 or set(marker.kwargs) - {"chip"} or (marker.args and "chip" in marker.kwargs):
            pytest.fail(f"@pytest.mark.nki{marker.args!r} {marker.kwargs!r}: the marker takes one chip, as in "
                        "@pytest.mark.nki(chip='trn1') or @pytest.mark.nki('trn1')", pytrace=False)
        chip = marker.args[0] if marker.args else marker.kwargs.get("chip")
    chip = chip or request.config.getoption("--trnsim-chip")
    error = None
    try:
        if chip:
            monkeypatch.setenv("TRNSIM_CHIP", _checked_chip(chip))
    except TrnSimError as e:
        error = f"@pytest.mark.nki: {e}"
    if error:
        pytest.fail(error, pytrace=False)


@pytest.fixture
def nki_benchmark(request: Any) -> Any:
    """Benchmark a kernel on the chip this test runs on; returns its BenchmarkResult."""
    from trnsim.nki import benchmark

    trace_dir = request.config.getoption("--trnsim-trace-dir")
    runs = 0

    def run(kernel: Any, *args: Any, numerics: bool = True, **kwargs: Any) -> Any:
        nonlocal runs
        trace = None
        if trace_dir:
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)
            trace = os.path.join(trace_dir, f"{name}_{runs}.json")
        runs += 1
        return benchmark(kernel, numerics=numerics, trace=trace)(*args, **kwargs)

    return run
