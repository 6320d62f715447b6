"""The ``neuron`` PyTorch device: registration, ``torch.neuron``, storage and dispatch.

:func:`register` runs once, from ``import trnsim`` or from PyTorch's backend autoload
(``import torch`` with trnsim installed; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it
off). It only registers: the simulator is loaded by the first op that needs a time.
"""

from __future__ import annotations

from typing import Any

_registered = False


def register() -> None:
    """Register the ``neuron`` device with PyTorch (idempotent)."""
    global _registered
    import torch  # first: a first import of torch autoloads trnsim and registers

    if _registered:
        return

    # the same steps as torch.utils.backend_registration._setup_privateuseone_for_python_backend,
    # with the rename first so that modules below can name torch.device("neuron")
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    torch.utils.generate_methods_for_privateuse1_backend()
    from trnsim.backend import autocast, device, dispatch, hostshims, mathbits, reductions, rng, sdpa, sparse, streams

    class _Hooks(torch._C._acc.PrivateUse1Hooks):
        def is_available(self) -> bool:
            return True

        def has_primary_context(self, dev_id) -> bool:
            return True

        def is_built(self) -> bool:
            return True

    class _Guard(torch._C._acc.DeviceGuard):
        def type_(self):
            return torch._C._autograd.DeviceType.PrivateUse1

    torch._register_device_module("neuron", device)
    global _hooks, _guard
    _hooks, _guard = _Hooks(), _Guard()
    torch._C._acc.register_python_privateuseone_hook(_hooks)
    torch._C._acc.register_python_privateuseone_device_guard(_guard)
    global _lib
    _lib = torch.library.Library("_", "IMPL")
    _lib.fallback(dispatch.fallback, "PrivateUse1")
    global _aten_lib
    _aten_lib = torch.library.Library("aten", "IMPL")
    dispatch.register_overrides(_aten_lib)
    sdpa.register(_aten_lib)
    sparse.install(_lib, _aten_lib, sparse.DenseFallback(dispatch._info, dispatch.sync_mutated_args, dispatch.kernel_for,
                                                         dispatch.overload))
    mathbits.install(_aten_lib)
    rng.install()
    reductions.install()
    hostshims.install()
    autocast.install()
    streams.install()
    from trnsim.backend import distributed, flex, safeload
    from trnsim.backend.compile import inductor

    _register_nki()
    distributed.register()
    inductor.install()
    flex.install()
    safeload.install()
    _registered = True
    from trnsim.backend import follow

    follow.start_if_followed()   # a process started below `trnsim run` records its own ops


def _is_torch_argument(value: Any) -> bool:
    """Whether an NKI kernel's argument is a torch tensor, or a list or tuple holding one."""
    if isinstance(value, (list, tuple)):
        return any(map(_is_torch_argument, value))
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _nkicall() -> Any:
    from trnsim.backend import nkicall   # with the NKI front end: only when a kernel meets torch

    return nkicall


def _register_nki() -> None:
    """``@nki.jit`` kernels called with torch tensors run through :mod:`trnsim.backend.nkicall`,
    and ``trnsim.nki`` offers its ``nki_op`` and ``wrap_nki``; nothing loads until used."""
    from trnsim import adapters

    adapters.register_array_adapter("torch", _is_torch_argument,
                                    lambda kernel, args, kwargs: _nkicall().call(kernel, args, kwargs))
    adapters.register_entry_point("nki_op", lambda: _nkicall().nki_op)
    adapters.register_entry_point("wrap_nki", lambda: _nkicall().wrap_nki)


def coverage() -> dict[str, list[str]]:
    """Which aten ops are timed by a kernel, which by a bandwidth estimate; see
    :func:`trnsim.backend.costs.coverage`."""
    from trnsim.backend.costs import coverage as _coverage

    return _coverage()


def _autoload() -> None:
    """Entry point of group ``torch.backends``: called by ``import torch``."""
    register()
