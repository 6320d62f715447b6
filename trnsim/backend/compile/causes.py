"""Why Dynamo compiles: which code it is compiling and, for a recompile, the guard that failed.

Everything this package reads of Dynamo's internals is here, so that a change in a
new PyTorch release is mended in one place. Inside a backend call (PyTorch 2.13):

- the compile id (``"frame/compile"``, e.g. ``"0/2"``) is
  ``torch._guards.CompileContext.current_compile_id()``; its ``frame_compile_id`` is
  0 for a code object's first compile since ``torch._dynamo.reset()`` and counts up;
- the code object being compiled is the root instruction translator's ``f_code``
  (``torch._dynamo.symbolic_convert.InstructionTranslator.current_tx()``);
- the failed guards are in ``torch._dynamo.utils.guard_failures[code]``: before a
  recompile Dynamo checks every cached entry of the code again, newest first, and
  appends one reason per entry (``"0/1: tensor 'x' size mismatch at index 1.
  expected 8, actual 9"``); the first reason of that batch is the one Dynamo itself
  reports (``TORCH_LOGS=recompiles``).

Each read falls back to "unknown" (None) rather than failing the compile when an
internal has moved; the tests in ``tests/test_compile_metrics.py`` fail if that happens.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    """The code Dynamo is compiling now: the code object (None if unknown) and Dynamo's
    compile id, ``frame_id/frame_compile_id`` (None outside a Dynamo compile)."""

    code: types.CodeType | None
    compile_id: str | None
    frame_compile_id: int | None


def current_frame() -> Frame:
    """The code object and compile id of the Dynamo compile in progress in this thread."""
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    code = None
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
    except (ImportError, AttributeError):
        pass  # not inside a Dynamo trace, or the internal moved: the code is unknown
    if cid is None:
        return Frame(code, None, None)
    return Frame(code, str(cid), cid.frame_compile_id)


def new_failures(code: types.CodeType, seen: int) -> tuple[list[str], int]:
    """Guard-failure reasons Dynamo recorded for ``code`` after the first ``seen``, and
    how many it holds now (``torch._dynamo.reset()`` empties the record: start over)."""
    try:
        from torch._dynamo.utils import guard_failures
    except ImportError:  # the internal moved: no cause is known
        return [], 0
    reasons = list(guard_failures.get(code, ()))
    if len(reasons) < seen:
        seen = 0
    return reasons[seen:], len(reasons)


_CID = re.compile(r"^!?\d+(?:/\d+)+: ")


def _compile_number(reason: str) -> int:
    m = re.match(r"^!?(?:\d+/)*(\d+): ", reason)
    return int(m.group(1)) if m else -1


def latest_reason(failures: list[str]) -> str | None:
    """The reason Dynamo gives for its latest recompile, from the failures recorded since
    the previous one: the first of the last batch. A batch lists the cached entries
    newest first, so their compile numbers fall; where they rise again a batch starts."""
    if not failures:
        return None
    start = len(failures) - 1
    while start > 0 and _compile_number(failures[start - 1]) > _compile_number(failures[start]):
        start -= 1
    return failures[start]


@dataclass(frozen=True)
class GuardFailure:
    """One failed guard, read from Dynamo's reason text.

    ``kind`` is ``"shape"``, ``"rank"``, ``"stride"``, ``"dtype"``, ``"device"``,
    ``"requires_grad"``, ``"dispatch keys"`` (a tensor input), ``"value"`` (a Python
    value such as an int or bool the graph was specialised on), ``"length"`` (of a list or
    tuple), ``"type"`` or ``"other"``.
    ``input`` is the input's name as Dynamo writes its source (``x``, ``self.training``),
    None where the reason names none; ``dim`` the dimension of a shape or stride change.
    """

    text: str
    kind: str
    input: str | None = None
    dim: int | None = None
    expected: str | None = None
    actual: str | None = None

    def describe(self, change: str | None = None) -> str:
        """The change in words: ``input 'x' changed shape at dimension 1 (8 -> 9)``;
        ``change`` replaces the ``8 -> 9``."""
        name = f"input '{self.input}'"
        if change is None:
            change = f"{self.expected} -> {self.actual}" if self.actual is not None else ""
        change = f" ({change})" if change else ""
        if self.kind in ("shape", "stride"):
            return f"{name} changed {self.kind} at dimension {self.dim}{change}"
        if self.kind in ("rank", "dtype", "device", "requires_grad", "dispatch keys"):
            return f"{name} changed {self.kind}{change}"
        if self.kind == "value":
            return f"Python value '{self.input}' changed (the graph was compiled for {self.input} == {self.expected})"
        if self.kind == "type":
            return f"{name} changed type"
        if self.kind == "length":
            return f"{name} changed length (the graph was compiled for {self.expected} items)"
        return f"guard failed: {self.text}"


_TENSOR = re.compile(r"^tensor '(?P<name>.+?)' (?P<what>.+?) mismatch(?: at index (?P<dim>\d+))?\.?\s*(?P<rest>.*)$")
_EXPECTED = re.compile(r"[Ee]xpected (?:device index to be |requires_grad=)?(?P<exp>[^,]+?)(?:, actual (?P<act>.+))?$")
_TENSOR_KINDS = {"size": "shape", "rank": "rank", "stride": "stride", "dtype": "dtype",
                 "requires_grad": "requires_grad", "dispatch key set": "dispatch keys", "Tensor device index": "device"}
_VALUE = re.compile(r"^(?P<name>[A-Za-z_][\w.\[\]'\"]*) (?:==|is) (?P<exp>.+)$")
_TYPE = re.compile(r"^___check_type_id\((?P<name>[^,]+),")
_LEN = re.compile(r"^len\((?P<name>[^)]+)\) == (?P<exp>\d+)$")


def clean(reason: str) -> str:
    """Dynamo's reason without its compile-id prefix, source comment and user stack."""
    line = _CID.sub("", reason.strip().splitlines()[0] if reason.strip() else "")
    return line.split("  #", 1)[0].strip()


def parse(reason: str) -> GuardFailure:
    """Read a guard-failure reason (as Dynamo writes it) into a :class:`GuardFailure`."""
    text = clean(reason)
    m = _TENSOR.match(text)
    if m:
        kind = _TENSOR_KINDS.get(m.group("what"), "other")
        e = _EXPECTED.search(m.group("rest"))
        exp, act = (e.group("exp"), e.group("act")) if e else (None, None)
        dim = int(m.group("dim")) if m.group("dim") is not None else None
        return GuardFailure(text, kind, m.group("name"), dim, exp, act)
    for pattern, kind in ((_TYPE, "type"), (_LEN, "length"), (_VALUE, "value")):
        m = pattern.match(text)
        if m:
            return GuardFailure(text, kind, m.group("name").strip(), expected=m.groupdict().get("exp"))
    return GuardFailure(text, "other")


def describe_all(failures: list[GuardFailure]) -> list[str]:
    """Several failures in words, one line per input and kind of change, in order of first
    appearance; successive values chain (``input 'x' changed shape at dimension 1
    (8 -> 9 -> 10)``)."""
    groups: dict[tuple, list[GuardFailure]] = {}
    for f in failures:
        key = (f.kind, f.input, f.dim) if f.input is not None else (f.kind, f.text, None)
        groups.setdefault(key, []).append(f)
    lines = []
    for fs in groups.values():
        if len(fs) == 1 or any(f.actual is None for f in fs):
            lines.append(fs[0].describe() + (f", {len(fs)} times" if len(fs) > 1 else ""))
            continue
        chain = [fs[0].expected]
        for f in fs:
            chain += [f.actual] if f.expected == chain[-1] else ["...", f.expected, f.actual]
        lines.append(fs[0].describe(" -> ".join(str(v) for v in chain).replace(" -> ... -> ", ", ")))
    return lines
