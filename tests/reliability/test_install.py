"""A read-only install: trnsim copied into a folder its user cannot write, run by that user.

numba caches compiled kernels beside their source; where that folder, the user's
home and ``$NUMBA_CACHE_DIR`` are all unwritable, ``cache=True`` used to fail the
first kernel with "cannot cache function ...: no locator available". As root
(CI) the children drop to uid/gid 65534, since root writes through permissions; where
that user cannot read this interpreter's packages (a virtual environment in a private
folder), the children stay root in a mount namespace where the package and the home
folder are read-only mounts, as in a read-only container.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534

CHILD_TEST = '''
import numpy as np
import trnsim
import trnsim.nki as nki
import trnsim.nki.language as nl


@nki.jit
def softmax_rows(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x[0:128, :])
    nl.store(out[0:128, :], value=nl.softmax(t, axis=1))
    return out


def test_instruction_fidelity_from_a_read_only_install():
    assert trnsim.__file__.startswith({pkg!r}), trnsim.__file__
    x = np.random.default_rng(0).standard_normal((128, 64), dtype=np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(softmax_rows(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
'''


def _become_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _drop() -> dict[str, Any]:
    """How to start a child as uid 65534 when root (setpriv, else a setuid before exec); as
    anyone else the child runs as they do, and the read-only bits hold for them."""
    if os.geteuid() != 0:
        return {"prefix": [], "preexec_fn": None, "uid": os.getuid()}
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return {"prefix": [], "preexec_fn": _become_nobody, "uid": NOBODY}
    return {"prefix": [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"], "preexec_fn": None,
            "uid": NOBODY}


def _read_only_mounts(*folders: Path) -> dict[str, Any] | None:
    """As root: start a child in a mount namespace where ``folders`` are read-only bind
    mounts (root writes through permissions, not through a read-only mount)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        return None
    mounts = " && ".join(f"mount --bind {f} {f} && mount -o remount,ro,bind {f} {f}" for f in folders)
    return {"prefix": [unshare, "--mount", "sh", "-c", f'{mounts} && exec "$@"', "sh"], "preexec_fn": None,
            "uid": 0}


def _probe(drop: dict[str, Any], env: dict[str, str], work: Path) -> str | None:
    """Why a child started by ``drop`` cannot stand for a user of a read-only install, or None."""
    try:
        probe = subprocess.run([*drop["prefix"], sys.executable, "-c", "import os, numba; print(os.access("
                                "os.environ['PYTHONPATH'], os.W_OK), os.path.isdir(os.environ['PYTHONPATH'] + "
                                "'/trnsim'), os.access(os.environ['HOME'], os.W_OK))"],
                               capture_output=True, text=True, env=env, cwd=work, timeout=120,
                               preexec_fn=drop["preexec_fn"])
    except OSError as e:  # the interpreter itself is closed to the child
        return f"cannot start this interpreter as uid {drop['uid']}: {e}"
    if probe.returncode != 0:
        return f"the child cannot run this interpreter as uid {drop['uid']}: {probe.stderr.strip().splitlines()[-1:]}"
    writable_pkg, readable, writable_home = probe.stdout.split()
    if writable_pkg != "False" or writable_home != "False":
        return "the copied package or the home folder stays writable for the child"
    assert readable == "True", "the child cannot read the copied package"
    return None


def _writable_by_child(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    return path


@pytest.fixture(scope="module")
def install() -> Iterator[dict[str, Any]]:
    """A read-only copy of trnsim, a writable work folder, and how to run a child in it.
    It lives in the system's temporary folder: pytest's own is closed to other users."""
    base = Path(tempfile.mkdtemp(prefix="trnsim-install-"))
    os.chmod(base, 0o755)
    pkg = base / "pkg"
    shutil.copytree(ROOT / "trnsim", pkg / "trnsim", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [pkg, *pkg.rglob("*")]:
        os.chmod(path, stat.S_IMODE(path.stat().st_mode) & ~0o222)
    home = base / "home"
    home.mkdir()
    os.chmod(home, 0o555)
    work = _writable_by_child(base / "work")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(pkg), "HOME": str(home),
           "TMPDIR": str(_writable_by_child(base / "tmp")), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        reasons = []
        for drop in (_drop(), _read_only_mounts(pkg, home)):
            reason = _probe(drop, env, work) if drop is not None else "no mount namespace for a non-root user"
            if reason is None:
                break
            reasons.append(reason)
        else:
            pytest.skip("no way to run a child that cannot write the install: " + "; ".join(reasons))
        yield {"base": base, "pkg": pkg, "work": work, "env": env, "drop": drop, "tmp": Path(env["TMPDIR"])}
    finally:
        for path in [pkg, *pkg.rglob("*")]:
            os.chmod(path, stat.S_IMODE(path.stat().st_mode) | 0o200)
        shutil.rmtree(base)


def _run(install: dict[str, Any], *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*install["drop"]["prefix"], sys.executable, *args], capture_output=True, text=True,
                          env={**install["env"], **(env or {})}, cwd=install["work"], timeout=300,
                          preexec_fn=install["drop"]["preexec_fn"])


def test_demo_and_kernels_run_from_a_read_only_install(install):
    trace = install["work"] / "demo.json"
    proc = _run(install, "-m", "trnsim.cli", "demo", "--size", "128", "128", "512", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    assert "matches numpy" in proc.stdout and "no locator" not in proc.stderr and "Warning" not in proc.stderr
    assert trace.stat().st_size > 0
    cache = install["tmp"] / f"trnsim-{install['drop']['uid']}" / "numba"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert any(cache.rglob("fast.*.nbi")), "the compiled kernels were cached in the private folder"
    assert not any(install["pkg"].rglob("__pycache__")), "nothing was written into the package"

    (install["work"] / "test_child.py").write_text(CHILD_TEST.format(pkg=str(install["pkg"])))
    proc = _run(install, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_child.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


def test_no_writable_cache_folder_runs_uncached_with_one_notice(install):
    tmp = _writable_by_child(install["base"] / "tmp-shared")
    (tmp / f"trnsim-{install['drop']['uid']}").mkdir()
    os.chmod(tmp / f"trnsim-{install['drop']['uid']}", 0o777)  # open to others: never used for a cache
    code = ("import numpy as np; from trnsim.compute import fast; from trnsim.dtypes import bfloat16; "
            "x = np.array([1.0, -2.5], np.float32); print(fast.decode(fast.encode(x, bfloat16), bfloat16))")
    proc = _run(install, "-c", code, env={"TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[ 1.  -2.5]"
    assert proc.stderr.count("no writable folder for numba's cache") == 1, proc.stderr
    assert "NUMBA_CACHE_DIR" in proc.stderr and "Traceback" not in proc.stderr
