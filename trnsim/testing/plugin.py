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
from typing import Any

import pytest


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("trnsim")
    group.addoption("--trnsim-chip", default=None, help="chip for NKI kernel tests (trn1, trn2, trn3 or a TOML path)")
    group.addoption("--trnsim-trace-dir", default=None, help="write the trace of every nki_benchmark run here")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "nki(chip=None): run this test's kernels on the given simulated chip")


@pytest.fixture(autouse=True)
def _trnsim_chip(request: Any, monkeypatch: Any) -> None:
    marker = request.node.get_closest_marker("nki")
    chip = marker.kwargs.get("chip") if marker is not None else None
    chip = chip or request.config.getoption("--trnsim-chip")
    if chip:
        monkeypatch.setenv("TRNSIM_CHIP", str(chip))


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
