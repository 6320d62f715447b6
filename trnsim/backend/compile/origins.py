"""Which eager op each node of a compiled graph stands for, so a trace can match a
compiled run's kernels to an eager run's ops (:mod:`trnsim.trace.matching`).

Three things make a graph's aten ops differ from the ops an eager run records:

- AOT Autograd decomposes some ops into several, and records the op it decomposed on
  each piece as ``original_aten`` (``threshold_backward`` for ``le``, ``scalar_tensor``
  and ``where``);
- functionalization turns an in-place op into its functional form and a ``copy_`` back
  into the mutated input; eager's in-place op (``add_``, batch norm's running
  statistics) did that write itself, so the ``copy_`` stands for the op that computed
  the value;
- an op the ``neuron`` device has no kernel of its own for, but PyTorch has a composite
  kernel for, reaches an eager device as the op that kernel calls (``embedding`` as
  ``index_select``). Where that kernel cannot run on fake tensors (``convolution``,
  which eager records as ``convolution_overrideable``), the op keeps its name, and the
  matching's family rules pair the two.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from trnsim.backend.compile.patterns import FREE, op_name, substituted

_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
_calls: dict[str, str | None] = {}   # op -> the one op its composite kernel calls (None: not one)


class _Calls(TorchDispatchMode):
    """Records the aten ops called under it, with their arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch._ops.OpOverload, tuple, dict]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _fresh(x: Any, mode: FakeTensorMode) -> Any:
    """``x`` with each tensor replaced by an empty one of ``mode`` of its shape, strides,
    dtype and device (``x``'s tensors may be fake tensors of another mode)."""
    if isinstance(x, torch.Tensor):
        with mode:
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    if isinstance(x, (list, tuple)):
        return type(x)(_fresh(y, mode) for y in x)
    if isinstance(x, dict):
        return {k: _fresh(v, mode) for k, v in x.items()}
    return x


def _runs_as(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str | None:
    """The op an eager ``neuron`` device runs for ``op``, where it has no kernel of its
    own and PyTorch runs ``op``'s composite kernel instead, which calls one aten op
    (views aside; followed down while that op is such an op too); else None."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if not has(op.name(), "CompositeExplicitAutograd") or has(op.name(), "PrivateUse1"):
        return None
    with _Calls() as seen:
        op._op_dk(_COMPOSITE, *args, **kwargs)
    work = [c for c in seen.calls if c[0].namespace == "aten" and c[0] not in FREE]
    if len({c[0] for c in work}) != 1:
        return None
    return _runs_as(*work[0]) or work[0][0].name()


def _composite_call(n: fx.Node, vals: dict[fx.Node, Any]) -> str | None:
    """:func:`_runs_as` of ``n``'s op, found once per op by running its composite kernel
    on fake tensors of ``n``'s values' shapes, in a fake mode that refuses to run an op
    for real (so nothing runs on the device)."""
    name = n.target.name()
    if name not in _calls:
        mode = FakeTensorMode(allow_fallback_kernels=False)
        args, kwargs = _fresh(substituted(n.args, vals), mode), _fresh(substituted(dict(n.kwargs), vals), mode)
        try:
            with mode:
                _calls[name] = _runs_as(n.target, args, kwargs)
        except Exception:   # noqa: BLE001 - naming only: a kernel that cannot run on fake values keeps the op's name
            _calls[name] = None
    return _calls[name]


def eager_op(n: fx.Node, vals: dict[fx.Node, Any]) -> str:
    """The eager op the graph node ``n`` stands for (see the module), as
    ``aten::name.overload`` or ``aten::name``."""
    if n.target is torch.ops.aten.copy_.default and len(n.args) > 1:
        dst, src = n.args[0], n.args[1]
        if isinstance(src, fx.Node) and isinstance(dst, fx.Node) and dst.op == "placeholder" \
                and src.op != "placeholder":
            return eager_op(src, vals)
    origin = n.meta.get("original_aten")
    if isinstance(origin, torch._ops.OpOverload) and origin.name() != op_name(n):
        return origin.name()
    if isinstance(n.target, torch._ops.OpOverload):
        return _composite_call(n, vals) or op_name(n)
    return op_name(n)


def eager_ops(nodes: list[fx.Node], vals: dict[fx.Node, Any]) -> list[str]:
    """:func:`eager_op` of each of ``nodes`` with device work (views left out), in
    order: beside a kernel's ``Group.ops``."""
    return [eager_op(n, vals) for n in nodes if n.target not in FREE]
