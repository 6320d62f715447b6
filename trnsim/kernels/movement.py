"""Data movement without compute: concatenation (and so stack and copies).

``concat_kernel`` moves each input with one HBM-to-HBM DMA into its slice of the
output; no engine and no on-chip memory is involved, as the Neuron compiler does
for a concatenation it cannot fuse away. The DMA engines cut each copy into
descriptors along its contiguous runs, so joining along axis 0 (whole inputs are
contiguous in the output) costs little more than moving the bytes, while joining
along a later axis moves one run per outer row of each input.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl


@nki.jit
def concat_kernel(*xs, axis=0):
    """The inputs joined along ``axis`` (torch's ``cat``; ``stack`` is a ``cat`` of
    inputs with a new axis of size 1).

    Args:
        xs: one or more tensors in HBM of one chip dtype and one number of axes,
            equal in every axis but ``axis``.
        axis: the axis to join along (negative counts from the end).

    Returns:
        The joined tensor in HBM, of the inputs' dtype.

    Memories: HBM only: one DMA per input, from the input into its slice of the
    output (seen as [outer, axis * inner] rows, so the slice is one block of
    columns).
    """
    if not xs:
        raise nki.KernelError("concat_kernel needs at least one tensor")
    first = xs[0]
    ndim = len(first.shape)
    ax = axis % ndim if -ndim <= axis < ndim else None
    if ax is None:
        raise nki.KernelError(f"concat_kernel: axis {axis} is out of range for {ndim}-axis inputs")
    for i, x in enumerate(xs):
        same = len(x.shape) == ndim and all(a == b for k, (a, b) in enumerate(zip(x.shape, first.shape)) if k != ax)
        if not same or x.dtype is not first.dtype:
            raise nki.KernelError(f"concat_kernel: input {i} is {list(x.shape)} {x.dtype.name}, input 0 "
                                  f"{list(first.shape)} {first.dtype.name}; all must match but along axis {ax}")
    shape = list(first.shape)
    shape[ax] = sum(x.shape[ax] for x in xs)
    out = nl.ndarray(tuple(shape), first.dtype, buffer=nl.shared_hbm)
    outer = math.prod(shape[:ax])
    inner = math.prod(shape[ax + 1:])
    rows = out.reshape((outer, shape[ax] * inner))
    col = 0
    for x in xs:
        width = x.shape[ax] * inner
        nisa.dma_copy(dst=rows[:, col:col + width], src=x.reshape((outer, width)))
        col += width
    return out
