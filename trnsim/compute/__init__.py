"""Numerics: what every instruction computes, bit for bit.

Two interchangeable backends implement the numeric kernels (conversions,
activation, ALU, reduction, matmul): :mod:`trnsim.compute.reference` in plain
numpy, the definition, and :mod:`trnsim.compute.fast` compiled with numba for
the hot loops. :class:`Machine` runs a Program on simulated SBUF, PSUM and HBM
with either. ``encode`` and ``decode`` here are the reference's; they need no
compilation.
"""

from trnsim.compute.numerics import BACKENDS, Backend, get_backend
from trnsim.compute.machine import Machine
from trnsim.compute.reference import decode, encode

__all__ = ["BACKENDS", "Backend", "Machine", "decode", "encode", "get_backend"]
