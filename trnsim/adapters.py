"""Where frameworks plug into the NKI front end (:mod:`trnsim.nki`), which imports none of them.

A framework's integration registers here when it loads: trnsim's PyTorch device does
when it registers (``import trnsim``, or ``import torch`` with trnsim installed). This
module imports nothing of trnsim, so registering loads neither the NKI front end nor
the simulator; what is registered loads them when first called.

- an *array adapter*: a predicate that recognises the framework's arrays among a
  kernel call's arguments, and the function that runs such a call (``@nki.jit``
  kernels called with torch tensors go to the device's path);
- *entry points*: functions that ``trnsim.nki`` offers by name but that belong to the
  framework (``nki.nki_op``, ``nki.wrap_nki``);
- *run observers*: functions called after each run of a kernel on numpy arrays
  (``trnsim run`` charges such runs to the device's timeline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable


@dataclass(frozen=True)
class ArrayAdapter:
    """A framework's arrays as kernel arguments: ``accepts(value)`` says whether an
    argument is one; ``call(kernel, args, kwargs)`` runs the kernel on such a call."""

    name: str
    accepts: Callable[[Any], bool]
    call: Callable[[Any, tuple, dict], Any]


RunObserver = Callable[[str, Any, tuple], None]

_array_adapters: dict[str, ArrayAdapter] = {}
_entry_points: dict[str, Callable[..., Any]] = {}
_run_observers: list[RunObserver] = []


def register_array_adapter(name: str, accepts: Callable[[Any], bool], call: Callable[[Any, tuple, dict], Any]) -> None:
    """Send kernel calls with an argument that ``accepts`` to ``call(kernel, args, kwargs)``;
    registering ``name`` again replaces its adapter."""
    _array_adapters[name] = ArrayAdapter(name, accepts, call)


def array_adapter_for(values: Iterable[Any]) -> ArrayAdapter | None:
    """The adapter that accepts one of ``values`` (a call's arguments), or None (numpy)."""
    values = list(values)
    for adapter in _array_adapters.values():
        if any(map(adapter.accepts, values)):
            return adapter
    return None


def register_entry_point(name: str, load: Callable[[], Callable[..., Any]]) -> None:
    """Offer the function that ``load()`` returns as ``trnsim.nki.<name>`` (loaded when
    first asked for)."""
    _entry_points[name] = load


def entry_point(name: str) -> Callable[..., Any] | None:
    """The function registered as ``name``, or None."""
    load = _entry_points.get(name)
    return None if load is None else load()


def register_run_observer(observer: RunObserver) -> Callable[[], None]:
    """Call ``observer(kernel_name, run, args)`` after each run of a kernel on numpy arrays
    (``nki.simulate``, ``baremetal``, ``benchmark``, a jit kernel called on arrays);
    returns the function that unregisters it."""
    _run_observers.append(observer)
    return lambda: _run_observers.remove(observer)


def notify_run(kernel_name: str, run: Any, args: tuple) -> None:
    """Tell every run observer about a run."""
    for observer in list(_run_observers):
        observer(kernel_name, run, args)
