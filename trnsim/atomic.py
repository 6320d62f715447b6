"""The one way trnsim writes a file: whole or not at all.

:func:`write_atomic` writes into a temporary file beside the target, flushes it to
disk and renames it over the target (``os.replace``), so a reader, a crash or a
Ctrl-C sees either the old file or the complete new one, never a truncated one. On
any exception (KeyboardInterrupt included) the temporary file is removed. A process
killed outright (SIGKILL, power loss) may leave one ``.NAME.*.tmp`` file beside the
target; later writes do not read it, and it is safe to delete.

:func:`check_writable` makes the same checks up front, so a command can refuse a bad
output path before it starts a long run.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Callable

from trnsim.errors import FileWriteError, PathTypeError

TEMP_SUFFIX = ".tmp"


def as_path(value: object, what: str = "file") -> Path:
    """``value`` as a :class:`Path`, if it is a ``str`` or ``os.PathLike`` naming a file.

    Every function of trnsim that reads or writes a file takes its path through here:
    ``open(1)`` would read or write (and then close) file descriptor 1, stdout, and
    ``Path("")`` is the current folder. Raises :class:`PathTypeError` for anything else."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value or "\0" in value:
        raise PathTypeError(f"the {what} path {value!r:.200} is not a path; give a file name as a str or "
                            "pathlib.Path, such as 'trace.json'")
    return Path(value)


def _fix(err: OSError) -> str:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space or choose another disk"
    return "choose a folder you can write to"


def _is_stream(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a device, pipe or socket (``/dev/null``, ``/dev/stdout``):
    written straight into, since renaming over it would replace the device itself."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _target(path: str | os.PathLike) -> Path:
    """The file to replace: ``path`` itself, or what it links to (the link stays a link)."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _prepare(path: str | os.PathLike) -> Path:
    """The path to write, its folders made; refuses a folder in the way by name, and a
    name the file system refuses (too long) with :class:`FileWriteError`."""
    path = as_path(path, "output")
    try:
        return _prepare_checked(path)
    except OSError as e:
        if isinstance(e, FileWriteError):
            raise
        raise FileWriteError(f"cannot write {str(path)[:200]}: {e.strerror or e}; {_fix(e)}") from None


def _prepare_checked(path: Path) -> Path:
    """:func:`_prepare` once ``path`` is known to be a path."""
    if _is_stream(path):
        return Path(path)
    path = _target(path)
    if path.is_dir():
        raise FileWriteError(f"cannot write {path}: it is a folder; give a file name, such as {path / 'trace.json'}")
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                raise FileWriteError(f"cannot write {path}: {folder} is a file, not a folder; choose another path")
            break
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FileWriteError(f"cannot create the folder {path.parent} for {path}: {e.strerror}; {_fix(e)}") from None
    return path


def check_writable(path: str | os.PathLike) -> Path:
    """Make the folders of ``path`` and check that a file can be written there.

    Raises :class:`FileWriteError` naming the path and the fix when ``path`` is a
    folder, a folder on its way is a file, a folder cannot be made, or the folder
    refuses new files (read-only, ``/proc``). Returns the path to write."""
    path = _prepare(path)
    if _is_stream(path):
        return path
    tmp = _temp_name(path)
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        os.unlink(tmp)
    except OSError as e:
        raise FileWriteError(f"cannot write {path}: {e.strerror}; {_fix(e)}") from None
    return path


def _temp_name(path: Path) -> Path:
    """A fresh name beside ``path``, hidden, marked with this process and a random tag."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}{TEMP_SUFFIX}")


def write_atomic(path: str | os.PathLike, write: Callable[[IO], None], *, binary: bool = False) -> Path:
    """Write a file in one step: ``write(f)`` fills a temporary file beside ``path``
    (text in UTF-8, or bytes if ``binary``), which then replaces ``path``.

    Missing folders are made; a device or pipe (``/dev/null``) is written straight
    into. Errors of the file system raise :class:`FileWriteError` naming the path and
    the fix (an OSError from ``write`` too); any other exception from ``write``
    propagates unchanged.
    Either way ``path`` keeps its old content and no temporary file is left."""
    path = _prepare(path)
    if _is_stream(path):
        try:
            with _open(path, binary) as f:
                write(f)
        except OSError as e:
            raise FileWriteError(f"cannot write {path}: {e.strerror or e}; {_fix(e)}") from None
        return path
    # The name is chosen before the file exists, so an interrupt at any point leaves
    # nothing that the cleanup below does not know of.
    tmp: Path | None = _temp_name(path)
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        with _open(fd, binary) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise FileWriteError(f"cannot write {path}: {e.strerror or e}; {_fix(e)}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    _sync_folder(path.parent)
    return path


def _open(file: str | os.PathLike | int, binary: bool) -> IO:
    return open(file, "wb" if binary else "w", encoding=None if binary else "utf-8")


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: some file systems refuse)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
