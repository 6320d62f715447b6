"""trnsim.nki: NKI-style kernels on the simulated NeuronCore, with timing.

Write a kernel as for NKI, with only the imports changed::

    import trnsim.nki as nki
    import trnsim.nki.language as nl
    import trnsim.nki.isa as nisa

    @nki.jit
    def add_kernel(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(b)))
        return out

    add_kernel(x, y)                           # numpy in, numpy out, chip numerics
    nki.benchmark(add_kernel)(x, y).latency_ns  # simulated latency, busy %, trace

With trnsim installed, ``import nki`` and ``from neuronxcc import nki`` give this module
when AWS's packages are not installed (see :mod:`trnsim.compat.aliases`), and the legacy
entry points (``simulate_kernel``, ``baremetal``, ``benchmark(warmup=, iters=)``,
``profile``) are here too.

Kernels trace into Programs of :mod:`trnsim.isa`; dependencies come from the memory
each instruction touches, so independent iterations overlap across engines.

The modules form layers; each imports only from the layers below it (no import cycles):

1. ``tracer``, ``hazards``, ``refused``, ``compiler``, ``typing``, ``operators``: the
   tracer that records a kernel's Program, and names with no kernel state;
2. ``views``, ``tiles``: kernel tensors, index expressions and tile limits (their
   operators call ``nki.language`` through ``operators``, where the language installs
   itself);
3. ``emit``: making tiles, emitting instructions, masks, matmul results;
4. ``memory``, ``compute``, ``reductions``, ``loops``: the functions of ``nki.language``;
5. ``isa`` (a package by concept, ``isa._common`` and ``isa.constants`` at its bottom):
   ``nki.isa``;
6. ``composed``, ``kernel_random``: language functions built on the instructions;
7. ``language``: the ``nki.language`` namespace; ``collectives``: ``nki.collectives``;
8. ``jit``, ``apitable``, and this package: kernels and their runs.

Frameworks plug in through :mod:`trnsim.adapters`, below all of these: PyTorch's
integration (``trnsim.backend``) registers there; nothing here imports it.
"""

from typing import Any

from trnsim import adapters
from trnsim.dtypes import DType
from trnsim.nki import isa, language
from trnsim.nki.jit import (Benchmark, BenchmarkResult, Kernel, NcLatency, Profile, Simulated, baremetal, benchmark, jit,
                            profile, simulate, simulate_kernel, trace, trace_program, typed)
from trnsim.nki.tiles import NkiTensor
from trnsim.nki.tracer import KernelError

tensor = NkiTensor   # the legacy namespace's name for the class of kernel tensors
dtype = DType        # the class of NKI's data types (nl.bfloat16, ...): kernels annotate with nki.dtype

__all__ = ["Benchmark", "BenchmarkResult", "Kernel", "KernelError", "NcLatency", "NkiTensor", "Profile", "Simulated",
           "baremetal", "benchmark", "isa", "jit", "language", "nki_op", "profile", "simulate", "simulate_kernel",
           "dtype", "tensor", "trace", "trace_program", "typed", "wrap_nki"]


_FRAMEWORK_NAMES = ("nki_op", "wrap_nki")


def __getattr__(name: str) -> Any:
    # nki_op and wrap_nki belong to the PyTorch integration, which registers them when the
    # neuron device registers (import trnsim, or import torch with trnsim installed)
    if name not in _FRAMEWORK_NAMES:
        raise AttributeError(f"module 'trnsim.nki' has no attribute {name!r}")
    fn = adapters.entry_point(name)
    if fn is None:
        import torch  # noqa: F401 - with trnsim installed, importing torch registers the neuron device

        fn = adapters.entry_point(name)
    if fn is None:
        raise AttributeError(f"trnsim.nki.{name} comes with trnsim's PyTorch integration, which is not loaded: "
                             "import trnsim.backend first (import torch loads it unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)")
    return fn
