"""``torch_neuronx.xla_impl.ops``: ``nki_jit``, the older way to call an NKI kernel from
PyTorch (before ``nki.jit`` picked the framework from its arguments)."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["nki_jit"]


def nki_jit(func: Callable | None = None, **options: Any) -> Any:
    """``nki_jit()(kernel)`` or ``@nki_jit``: ``kernel`` made callable on torch tensors.

    Legacy kernels use destination passing: the caller allocates the output tensors and
    passes them as arguments (``kernel[grid](q, k, v, out)``), and the kernel writes
    them in place; a kernel that returns its outputs (``nl.shared_hbm`` tensors) returns
    them as torch tensors instead. ``kernel[g0, g1]`` launches a grid. On ``neuron``
    tensors the kernel runs on the device's simulated core, in its timeline; on CPU
    tensors the simulator computes it (see :mod:`trnsim.backend.nkicall`). ``func`` may
    be a plain function or an ``@nki.jit`` kernel. ``options`` (compiler flags, the
    legacy ``mode``, ``platform_target``) are accepted and change nothing.
    """
    from trnsim.backend import nkicall

    if func is None:
        return lambda f: nkicall.wrap_nki(f)
    return nkicall.wrap_nki(func)
