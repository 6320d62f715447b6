"""The one check of a trace file read back: every way it can be damaged, refused by name.

:func:`read_checked` reads a file and returns its JSON object only if it is a
well-formed trnsim trace: UTF-8 JSON, an object with
``otherData`` (``format``, ``process``, ``tracks``) and a ``traceEvents`` list whose
events carry the keys and types that :func:`trnsim.trace.export.save` writes, with
finite, non-negative times. A trnsim trace holds only ``"M"`` metadata, ``"X"``
slices and ``"C"`` counters, so an event with any other ``ph`` is refused rather than
dropped. Anything else raises :class:`TraceFileError` naming the file, the event
index and the key.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from trnsim.atomic import as_path
from trnsim.errors import TraceFileError

FORMAT = "trnsim-trace/1"
JOB_FORMAT = "trnsim-job/1"   # a merged multi-rank trace (trnsim.trace.job)
PHASES = ("M", "X", "C")
# Times are microseconds; 1e15 us is 31 years of simulated time, so anything larger is
# damage (and would overflow to inf once turned into nanoseconds and summed).
MAX_US = 1e15
# Run metadata that the summary reads as numbers.
_NUMERIC_META = ("instructions", "flops", "peak_flops", "hbm_bw_gbps", "total_ns", "device_peak_flops")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_time(path: Any, where: str, key: str, value: Any, limit: float = MAX_US) -> None:
    if not _is_number(value):
        raise TraceFileError(f"{path}: {where} has {key}={value!r}, which is not a number; "
                             "the file is damaged, write it again with trnsim")
    if not math.isfinite(value) or not 0 <= value <= limit:
        raise TraceFileError(f"{path}: {where} has {key}={value!r}; it must be finite, not negative and at most "
                             f"{limit:g}: write the trace again with trnsim")


def _load_json(path: str | os.PathLike) -> Any:
    path = as_path(path, "trace")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceFileError(f"cannot read trace {path}: {e.strerror or e}; check the path") from None
    if not raw.strip():
        raise TraceFileError(f"{path} is empty, not a trnsim trace; write the trace again")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFileError(f"{path} is not a trnsim trace: byte {e.start} is not UTF-8 text "
                             "(a binary or damaged file)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFileError(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                             "it may be truncated: write the trace again") from None
    except RecursionError:
        raise TraceFileError(f"{path} is not a trnsim trace: its JSON is nested too deeply to read") from None


def _check_tracks(path: Any, where: str, info: dict) -> list[str]:
    tracks = info.get("tracks")
    if not isinstance(tracks, list) or not all(isinstance(t, str) for t in tracks):
        raise TraceFileError(f"{path} is a damaged trnsim trace: {where}.tracks is not a list of track names")
    if not isinstance(info.get("process"), str):
        raise TraceFileError(f"{path} is a damaged trnsim trace: {where}.process is missing or not a string")
    return tracks


def _check_meta(path: Any, data: dict) -> dict:
    other = data.get("otherData")
    found = other.get("format") if isinstance(other, dict) else None
    if found == JOB_FORMAT:
        ranks = other.get("ranks")
        if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
            raise TraceFileError(f"{path} is a damaged job trace: otherData.ranks is not a list of ranks")
        for i, info in enumerate(ranks):
            _check_tracks(path, f"otherData.ranks[{i}]", info)
    elif found != FORMAT:
        raise TraceFileError(f"{path} is not a trnsim trace (otherData.format is {found!r}, expected {FORMAT!r} "
                             f"or {JOB_FORMAT!r})")
    else:
        _check_tracks(path, "otherData", other)
    for key in _NUMERIC_META:
        if key in other:
            _check_time(path, "otherData", key, other[key], limit=math.inf)
    if not isinstance(other.get("partial", ""), str):
        raise TraceFileError(f"{path} is a damaged trnsim trace: otherData.partial (why the run did not finish) "
                             "is not a string")
    if not isinstance(data.get("traceEvents"), list):
        raise TraceFileError(f"{path} is a damaged trnsim trace: traceEvents is missing or not a list")
    return other


def _require(path: Any, i: int, e: dict, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in e:
        raise TraceFileError(f"{path}: event {i} lacks the key {key!r}; the file is damaged, write it again")
    value = e[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TraceFileError(f"{path}: event {i} has {key}={value!r}, which is not {what}; the file is damaged")
    return value


def _check_event(path: Any, i: int, e: Any, n_tracks: int | list[int]) -> None:
    if not isinstance(e, dict):
        raise TraceFileError(f"{path}: event {i} is a {type(e).__name__}, not an object; the file is damaged")
    ph = _require(path, i, e, "ph", str, "a string")
    if ph not in PHASES:
        raise TraceFileError(f"{path}: event {i} has ph={ph!r}; a trnsim trace holds only 'M', 'X' and 'C' events")
    if ph == "M":
        return
    _require(path, i, e, "name", str, "a string")
    _check_time(path, f"event {i}", "ts", _require(path, i, e, "ts", (int, float), "a number"))
    args = _require(path, i, e, "args", dict, "an object")
    if isinstance(n_tracks, list):   # a job trace: the process is the rank
        pid = _require(path, i, e, "pid", int, "an integer")
        if not 1 <= pid <= len(n_tracks):
            raise TraceFileError(f"{path}: event {i} has pid={pid}, which names no rank "
                                 f"(otherData.ranks has {len(n_tracks)}); the file is damaged")
        n_tracks = n_tracks[pid - 1]
    if ph == "X":
        tid = _require(path, i, e, "tid", int, "an integer")
        if not 1 <= tid <= n_tracks:
            raise TraceFileError(f"{path}: event {i} has tid={tid}, which names no track "
                                 f"(otherData.tracks has {n_tracks}); the file is damaged")
        _check_time(path, f"event {i}", "dur", _require(path, i, e, "dur", (int, float), "a number"))
        if "hbm_bytes" in args:
            _check_time(path, f"event {i}", "args.hbm_bytes", args["hbm_bytes"])
    else:
        value = args.get("value")
        if not _is_number(value) or not math.isfinite(value):
            raise TraceFileError(f"{path}: event {i} has args.value={value!r}; a counter value must be a finite "
                                 "number")


def read_checked(path: str | os.PathLike) -> dict:
    """The JSON object of the trnsim trace at ``path``, checked from end to end."""
    data = _load_json(path)
    if not isinstance(data, dict):
        raise TraceFileError(f"{path} is not a trnsim trace: its JSON is a {type(data).__name__}, not an object")
    other = _check_meta(path, data)
    n_tracks = [len(r["tracks"]) for r in other["ranks"]] if other["format"] == JOB_FORMAT else len(other["tracks"])
    for i, e in enumerate(data["traceEvents"]):
        _check_event(path, i, e, n_tracks)
    return data
