"""Aten ops timed by kernels from trnsim.kernels (filled in below)."""

KERNEL_OPS: dict = {}


def kernel_cost(name, flat, out):
    return None
