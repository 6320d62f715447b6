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
"""

from trnsim.nki import isa, language
from trnsim.nki.jit import (Benchmark, BenchmarkResult, Kernel, NcLatency, Profile, Simulated, baremetal, benchmark, jit,
                            profile, simulate, simulate_kernel, trace_program, typed)
from trnsim.nki.tiles import NkiTensor
from trnsim.nki.tracer import KernelError

tensor = NkiTensor   # the legacy namespace's name for the class of kernel tensors

__all__ = ["Benchmark", "BenchmarkResult", "Kernel", "KernelError", "NcLatency", "NkiTensor", "Profile", "Simulated",
           "baremetal", "benchmark", "isa", "jit", "language", "nki_op", "profile", "simulate", "simulate_kernel",
           "tensor", "trace_program", "typed", "wrap_nki"]


def __getattr__(name: str):
    # the PyTorch integration imports torch: only when asked for
    if name in ("nki_op", "wrap_nki"):
        from trnsim.backend import nkicall

        return getattr(nkicall, name)
    raise AttributeError(f"module 'trnsim.nki' has no attribute {name!r}")
