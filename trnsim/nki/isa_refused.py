"""Registers of ``nki.isa``, and the instructions trnsim refuses by name with the reason."""

from __future__ import annotations

from typing import Any, Callable

from trnsim.nki import emit as _e
from trnsim.nki.isa_more import _fail
from trnsim.nki.tracer import KernelError, _current


class VirtualRegister:
    """An engine register holding an integer known when the kernel is traced."""

    def __init__(self, value: int = 0) -> None:
        self.value = int(value)

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


def register_alloc(x: int | None = None) -> VirtualRegister:
    """A register holding ``x`` (0 when None)."""
    return VirtualRegister(0 if x is None else int(x))


def register_move(dst: VirtualRegister, src: Any) -> None:
    """Set register ``dst`` to ``src`` (a register or an integer)."""
    if not isinstance(dst, VirtualRegister):
        raise _fail(f"register_move: dst {dst!r} is not a register from nisa.register_alloc")
    dst.value = int(src)


def refused(name: str, why: str) -> Callable[..., Any]:
    """A stand-in for ``nisa.<name>`` that raises KernelError saying ``why``."""
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        message = f"nisa.{name} is not supported by trnsim: {why}"
        raise _e.tracer().fail(message) if _current else KernelError(message)

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Refused: {why}"
    return refuse


REFUSED = {
    "sendrecv": "it is a collective transfer between NeuronCores, and trnsim simulates one NeuronCore; there is no "
                "peer rank to send to or receive from",
    "core_barrier": "it synchronises several NeuronCores, and trnsim simulates one NeuronCore",
    "quantize_mx": "MX quantization needs the microscaling fp8/fp4 dtypes and per-block scales, which trnsim does not model",
    "nc_matmul_mx": "MX matmul needs the microscaling fp8/fp4 dtypes and per-block scales, which trnsim does not model",
    "register_load": "it reads a tensor value into a register at run time (data-dependent control), and trnsim traces "
                     "a kernel before it runs",
    "register_store": "it writes a run-time register value to memory, and trnsim's registers hold trace-time integers",
    "rand_get_state": "the hardware's XORWOW generator state is not modelled (trnsim draws from a seeded numpy generator)",
    "tensor_copy_dynamic_src": "it addresses memory through run-time register values, and trnsim traces a kernel before "
                               "it runs; index with nl.arange expressions or use nisa.nc_n_gather",
    "tensor_copy_dynamic_dst": "it addresses memory through run-time register values, and trnsim traces a kernel before "
                               "it runs; index with nl.arange expressions",
    "dma_compute": "DMA-side reductions are not modelled; load the tiles and reduce with nisa.tensor_tensor",
    "topk": "its 16-partition snake input layout is not modelled; take the top 8 with nisa.max8 and "
            "nisa.nc_match_replace8 rounds",
    "builtin_custom_op": "custom GpSimd code cannot run in trnsim",
}
