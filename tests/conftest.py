"""Shared fixtures, and the check that a test run leaves the checkout as it found it."""

import os
from pathlib import Path

import numpy as np
import pytest

from trnsim import dtypes

pytest_plugins = ["pytester"]


@pytest.fixture
def small_matmul():
    """Makes the optimised matmul kernel's Program for [256, 256] x [256, 512] in bf16 on trn1."""
    from trnsim.kernels.matmul import matmul_optimized
    from trnsim.nki import trace_program, typed

    def make():
        return trace_program(matmul_optimized, typed(np.ones((256, 256)), dtypes.bfloat16),
                             typed(np.ones((256, 512)), dtypes.bfloat16), chip="trn1")

    return make


# Tests write only under their temporary folders: a run that adds or changes a file in
# the checkout (a trace a `trnsim run` wrote beside the script, a rebuilt notebook) fails,
# naming the files. Caches and the virtual environment are not the checkout's files.
REPO = Path(__file__).resolve().parents[1]
_BEFORE = pytest.StashKey[dict]()
_NOT_CHECKOUT = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist"}


def _checkout_files() -> dict[str, tuple[int, int]]:
    found = {}
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in _NOT_CHECKOUT and not d.endswith(".egg-info")]
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:   # removed while we looked
                continue
            found[os.path.relpath(path, REPO)] = (st.st_size, st.st_mtime_ns)
    return found


def pytest_sessionstart(session):
    session.config.stash[_BEFORE] = _checkout_files()


def pytest_sessionfinish(session, exitstatus):
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    after = _checkout_files()
    touched = sorted(p for p in after if before.get(p) != after[p])
    if touched:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = ("tests wrote into the checkout (a test must write only under its tmp_path): "
                   + ", ".join(touched[:20]) + (f" and {len(touched) - 20} more" if len(touched) > 20 else ""))
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

