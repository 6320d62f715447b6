"""Where numba keeps trnsim's compiled kernels, so that read-only installs work.

numba caches a kernel beside its source (``__pycache__``), else in
``$NUMBA_CACHE_DIR``, else in the user's cache folder (``~/.cache/numba``);
where none of them is writable (a system-wide install run by a user whose home
is not writable, a read-only container) ``cache=True`` fails with "no locator
available". :func:`njit` then puts trnsim's kernels in a private folder of the
temporary directory, and where even that cannot be made safely it compiles
them uncached, with a one-time warning. The user's own numba functions and
settings are left as they are.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar, cast

import numba
from numba.core import config

_fallback: Path | None = None
_warned = False

F = TypeVar("F", bound=Callable[..., Any])


def njit(**options: Any) -> Callable[[F], F]:
    """``numba.njit(cache=True, **options)`` with a cache folder that works on read-only installs.

    The compiled function is typed as ``fn``: numba's dispatcher takes the same arguments,
    and the annotations of ``fn`` say what they are (numba itself does not read them)."""

    def decorate(fn: F) -> F:
        return cast(F, _decorate(fn, options))

    return decorate


def _decorate(fn: Callable[..., Any], options: dict[str, Any]) -> Any:
    try:
        return numba.njit(cache=True, **options)(fn)
    except RuntimeError:  # numba found no writable cache folder for this source file
        pass
    folder = _private_folder()
    if folder is not None:
        with _cache_dir(folder):
            return numba.njit(cache=True, **options)(fn)
    _warn_once(fn)
    return numba.njit(cache=False, **options)(fn)


@contextlib.contextmanager
def _cache_dir(folder: Path) -> Iterator[None]:
    """numba reads ``config.CACHE_DIR`` when a function is decorated; set it for trnsim's only."""
    saved = config.CACHE_DIR  # type: ignore[attr-defined]  # numba makes its settings at import, from the environment
    config.CACHE_DIR = str(folder)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        config.CACHE_DIR = saved  # type: ignore[attr-defined]


def _private_folder() -> Path | None:
    """``<tmp>/trnsim-<uid>/numba``, made by and for this user only; None if that cannot be had.

    The folder must be ours and closed to others: numba loads what it finds there,
    so a folder another user could write would let them run code as us."""
    global _fallback
    if _fallback is not None or not hasattr(os, "getuid"):  # no uids to check ownership by on Windows
        return _fallback
    top = Path(tempfile.gettempdir()) / f"trnsim-{os.getuid()}"
    try:
        for folder in (top, top / "numba"):
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
            st = folder.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                return None
        tempfile.TemporaryFile(dir=top / "numba").close()
    except OSError:
        return None
    _fallback = top / "numba"
    return _fallback


def _warn_once(fn: Callable[..., Any]) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"trnsim: no writable folder for numba's cache of compiled kernels (beside "
                      f"{fn.__code__.co_filename}, in ~/.cache or in {tempfile.gettempdir()}); kernels compile "
                      "again in every process. Set NUMBA_CACHE_DIR to a writable folder to keep them.",
                      RuntimeWarning, stacklevel=4)
