"""The kernel library, written in trnsim.nki: each kernel is readable and copyable.

- :mod:`trnsim.kernels.matmul`: tiled matmul, basic and fully optimised
"""
