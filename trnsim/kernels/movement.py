"""Data movement: concatenation (and so stack and copies), nearest-neighbour upsampling,
constant padding.

``concat_kernel`` moves each input with one HBM-to-HBM DMA into its slice of the
output; no engine and no on-chip memory is involved, as the Neuron compiler does
for a concatenation it cannot fuse away. The DMA engines cut each copy into
descriptors along its contiguous runs, so joining along axis 0 (whole inputs are
contiguous in the output) costs little more than moving the bytes, while joining
along a later axis moves one run per outer row of each input.

``upsample_nearest2d_kernel`` repeats each pixel through SBUF: a block of image rows
is loaded once, widened by engine copies into every ``scale_w``-th column, and the
wide rows are stored ``scale_h`` times, each store one contiguous run per row.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

TILE_P = 128          # nl.tile_size.pmax
FREE_MAX = 4096       # output columns per SBUF tile: 16 KiB per partition in fp32
ENGINES = (nisa.vector_engine, nisa.scalar_engine)  # both copy; alternate them


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


@nki.jit
def upsample_nearest2d_kernel(x, scale_h=2, scale_w=2):
    """Nearest-neighbour upsampling by whole factors (torch's ``upsample_nearest2d`` and
    ``F.interpolate(mode="nearest")`` with integer scales): ``out[n, c, i, j] =
    x[n, c, i // scale_h, j // scale_w]``.

    Args:
        x: [N, C, H, W] in HBM, any chip dtype.
        scale_h, scale_w: positive whole factors.

    Returns:
        [N, C, H * scale_h, W * scale_w] in HBM, of ``x``'s dtype.

    Memories: the N*C*H image rows go 128 to a tile onto the SBUF partitions (columns in
    blocks of at most 4096 output columns); each block is loaded once, copied into every
    ``scale_w``-th column of a wide SBUF tile by ``scale_w`` copies (alternately on the
    vector and scalar engines) and stored ``scale_h`` times. PSUM is not used.
    """
    if len(x.shape) != 4:
        raise nki.KernelError(f"upsample_nearest2d_kernel takes [N, C, H, W]; got {list(x.shape)}")
    sh, sw = int(scale_h), int(scale_w)
    if sh < 1 or sw < 1 or sh != scale_h or sw != scale_w:
        raise nki.KernelError(f"upsample_nearest2d_kernel: scales ({scale_h}, {scale_w}) must be whole numbers >= 1")
    n, c, h, w = x.shape
    rows = n * c * h
    out = nl.ndarray((n, c, h * sh, w * sw), x.dtype, buffer=nl.shared_hbm)
    src = x.reshape((rows, w))
    dst = out.reshape((rows, sh * w * sw))   # input row r becomes output rows r*sh .. r*sh+sh-1, back to back
    block = max(1, FREE_MAX // sw)           # input columns per tile
    for r0 in nl.affine_range(0, rows, TILE_P):
        p = min(TILE_P, rows - r0)
        for c0 in nl.affine_range(0, w, block):
            cw = min(block, w - c0)
            narrow = nl.load(src[r0:r0 + p, c0:c0 + cw])
            wide = nl.ndarray((p, cw * sw), x.dtype, buffer=nl.sbuf)
            for j in range(sw):
                nisa.tensor_copy(dst=wide[:, j::sw], src=narrow, engine=ENGINES[j % 2])
            for i in range(sh):
                start = i * w * sw + c0 * sw
                nl.store(dst[r0:r0 + p, start:start + cw * sw], value=wide)
    return out


@nki.jit
def pad_kernel(x, pads, value=0.0):
    """torch's ``constant_pad_nd(x, pads, value)``: ``x`` inside a border of ``value``; a
    negative pad crops that side instead (as a compiled graph's backward of a padding
    writes it).

    Args:
        x: any shape in HBM, any chip dtype.
        pads: torch's order, (before, after) for the last axis first, then the axis
            before it, and so on.
        value: the border's value.

    Returns:
        The padded tensor in HBM, of ``x``'s dtype.

    Memories: where any pad is positive, the result is first set to ``value`` from one
    memset SBUF tile (a store per [128, <= 4096] block of it seen as rows over the
    padded axes); then what is kept of ``x`` moves with one HBM-to-HBM DMA into its
    place (one descriptor per contiguous run), after the stores it overwrites. The fill
    writes ``x``'s place too: the one DMA is cheaper than cutting the border into a
    store per row piece.
    """
    pads = tuple(int(p) for p in pads)
    n = len(x.shape)
    if len(pads) % 2 or len(pads) // 2 > n:
        raise nki.KernelError(f"pad_kernel: pads {list(pads)} must be (before, after) pairs, at most one pair per "
                              f"axis of x {list(x.shape)}")
    before = [0] * n
    after = [0] * n
    for i in range(len(pads) // 2):
        before[n - 1 - i], after[n - 1 - i] = pads[2 * i], pads[2 * i + 1]
    shape = tuple(s + b + a for s, b, a in zip(x.shape, before, after))
    if any(d < 1 for d in shape):
        raise nki.KernelError(f"pad_kernel: pads {list(pads)} crop x {list(x.shape)} to nothing ({list(shape)})")
    out = nl.ndarray(shape, x.dtype, buffer=nl.shared_hbm)
    first = next((i for i in range(n) if before[i] > 0 or after[i] > 0), n)
    if first < n:   # the fill: the result as [outer, inner] rows, inner from the first padded axis on
        outer, inner = math.prod(shape[:first]), math.prod(shape[first:])
        rows = out.reshape((outer, inner))
        fill = nisa.memset((min(TILE_P, outer), min(FREE_MAX, inner)), value=float(value), dtype=x.dtype)
        for r0 in range(0, outer, TILE_P):
            r1 = min(outer, r0 + TILE_P)
            for c0 in range(0, inner, FREE_MAX):
                c1 = min(inner, c0 + FREE_MAX)
                nl.store(rows[r0:r1, c0:c1], value=fill[0:r1 - r0, 0:c1 - c0])
    src = tuple(slice(max(0, -b), s - max(0, -a)) for s, b, a in zip(x.shape, before, after))
    dst = tuple(slice(max(0, b), max(0, b) + (s - max(0, -b) - max(0, -a))) for s, b, a in zip(x.shape, before, after))
    if all(sl.stop > sl.start for sl in src):
        nisa.dma_copy(dst=out[dst], src=x[src])
    return out


@nki.jit
def slice_scatter_kernel(base, src, dim=0, start=0, end=None, step=1):
    """torch's ``slice_scatter(base, src, dim, start, end, step)``: a copy of ``base``
    whose slice ``start:end:step`` along ``dim`` is ``src``.

    Args:
        base: any shape in HBM, any chip dtype; src: the slice's shape, ``base``'s dtype.
        dim, start, end, step: the slice (``end`` None: to the end; start and end
            within the axis, step >= 1).

    Returns:
        ``base``'s shape in HBM.

    Memories: HBM only: one DMA copies ``base`` (one descriptor per contiguous run),
    then one writes ``src`` into the slice, after it.
    """
    size = base.shape[dim]
    end = size if end is None else end
    count = len(range(start, end, step))
    want = tuple(count if i == dim else s for i, s in enumerate(base.shape))
    if step < 1 or not 0 <= start <= size or not 0 <= end <= size or tuple(src.shape) != want:
        raise nki.KernelError(f"slice_scatter_kernel: src {list(src.shape)} is not the slice {start}:{end}:{step} of "
                              f"axis {dim} of base {list(base.shape)} (that slice is {list(want)})")
    out = nl.ndarray(base.shape, base.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=base)
    if count:
        index = tuple(slice(start, start + (count - 1) * step + 1, step) if i == dim else slice(0, s)
                      for i, s in enumerate(base.shape))
        nisa.dma_copy(dst=out[index], src=src)
    return out
