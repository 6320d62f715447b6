"""2-D pooling, forward and backward: max pooling (with the indices of the maxima) and
average pooling, as torch's ``max_pool2d_with_indices``, ``avg_pool2d`` and their
backward ops.

Every kernel lays the N * C image planes of an NCHW tensor on the partitions, 128 planes
to a tile, and takes each plane's rows in bands: a band of output rows and the input
rows its windows cover (zero-padded in SBUF, or -inf-padded for max pooling). One
pooling window position per element of the band's [partitions, rows, columns] tile, a
filter tap (r, s) is one strided view of the padded input rows, so each tap costs one
or a few vector-engine instructions over the whole band, whatever the window count.

- ``maxpool2d_kernel``: per tap, the running maximum, and where the tap's value is the
  new maximum, the tap's offset ``r * W + s``; the index of the maximum is that offset
  plus the window's first position (a GpSimd iota).
- ``maxpool2d_backward_kernel``: per tap, the gradients whose index is that tap's,
  added into (or, for windows that do not overlap, written to) the tap's view of a
  zeroed input band.
- ``avgpool2d_kernel`` and ``avgpool2d_backward_kernel``: the taps' sum, over the
  window's divisor (torch's: the window size, the positions inside the padded input, or
  the real positions only, or ``divisor_override``), and the gradient over the divisor
  added into every tap's view.

Bands of a backward overlap by ``kernel - stride`` rows when windows overlap: the rows a
band has not finished are carried (copied) to the top of the next band's tile.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.kernels.preconditions import int_pair

TILE_P = 128                # nl.tile_size.pmax: image planes per tile
BAND_BYTES = 32 * 1024      # per partition: the padded input rows of one band
INDEX_MAX = 1 << 24         # positions per plane whose indices fp32 holds exactly


def _out_size(size, k, s, p, ceil_mode):
    """torch's pooling output size: a last window that starts inside the padded input counts with ``ceil_mode``."""
    n = (size + 2 * p - k + ((s - 1) if ceil_mode else 0)) // s + 1
    if ceil_mode and (n - 1) * s >= size + p:
        n -= 1
    return n


class PoolGeometry:
    """Where the windows of one 2-D pooling lie: the planes, bands of output rows and the
    padded input rows each band covers.

    ``kernel``, ``stride``, ``padding`` are (rows, columns) pairs (``stride`` None: the
    kernel's). ``pitch`` is the padded row width in SBUF: the input's columns, the
    padding on both sides and what a ``ceil_mode`` window reaches past it. ``band_rows``
    output rows go to a band (their padded input rows at most :data:`BAND_BYTES` per
    partition); ``bands`` lists (first output row, end output row)."""

    def __init__(self, shape, kernel, stride, padding, ceil_mode, itemsize, name):
        if len(shape) != 4:
            raise nki.KernelError(f"{name} takes [N, C, H, W] (NCHW); got {list(shape)}")
        self.name = name
        n, c, self.h, self.w = shape
        self.planes = n * c
        (self.kh, self.kw) = int_pair(kernel, "kernel_size", name)
        (self.sh, self.sw) = int_pair(stride if stride not in (None, (), []) else kernel, "stride", name)
        (self.ph, self.pw) = int_pair(padding, "padding", name)
        if min(self.kh, self.kw, self.sh, self.sw) < 1 or self.ph < 0 or self.pw < 0 \
                or 2 * self.ph > self.kh or 2 * self.pw > self.kw:
            raise nki.KernelError(f"{name}: kernel {(self.kh, self.kw)}, stride {(self.sh, self.sw)}, padding "
                                  f"{(self.ph, self.pw)}: kernel and stride must be positive and padding at most "
                                  "half the kernel (torch's rule)")
        self.oh = _out_size(self.h, self.kh, self.sh, self.ph, ceil_mode)
        self.ow = _out_size(self.w, self.kw, self.sw, self.pw, ceil_mode)
        if self.oh < 1 or self.ow < 1:
            raise nki.KernelError(f"{name}: a {self.kh}x{self.kw} window gives no output from a {self.h}x{self.w} "
                                  f"input with padding {(self.ph, self.pw)}")
        self.pitch = max(self.w + 2 * self.pw, (self.ow - 1) * self.sw + self.kw)
        self.overlap_rows = max(0, self.kh - self.sh)
        self.overlaps = self.kh > self.sh or self.kw > self.sw
        fit = (BAND_BYTES // (self.pitch * max(itemsize, 4)) - self.kh) // self.sh + 1
        self.band_rows = max(1, min(self.oh, fit))
        self.bands = [(o0, min(self.oh, o0 + self.band_rows)) for o0 in range(0, self.oh, self.band_rows)]
        self.tiles = [(p0, min(TILE_P, self.planes - p0)) for p0 in range(0, self.planes, TILE_P)]

    def input_rows(self, o0, o1):
        """The padded input rows [first, end) that output rows [o0, o1) read."""
        return o0 * self.sh, (o1 - 1) * self.sh + self.kh

    def tap(self, tile, r, s, rows):
        """The [partitions, rows, ow] view of a band ``tile`` (padded rows, ``pitch``
        columns) that tap (r, s) reads for ``rows`` output rows."""
        return tile[:, r:r + (rows - 1) * self.sh + 1:self.sh, s:s + (self.ow - 1) * self.sw + 1:self.sw]

    def load(self, planes, tile, first, end, fill):
        """Copy the input rows of padded rows [first, end) of ``planes`` ([P, H, W] in HBM)
        into ``tile``, ``fill`` around them where the band reaches the padding."""
        lo, hi = max(first, self.ph), min(end, self.ph + self.h)
        if (lo, hi) != (first, end) or self.pitch != self.w:
            nisa.memset(tile, value=fill, engine=nisa.gpsimd_engine)
        if hi > lo:
            nisa.dma_copy(dst=tile[:, lo - first:hi - first, self.pw:self.pw + self.w],
                          src=planes[:, lo - self.ph:hi - self.ph, :])

    def window_starts(self, p, o0, rows):
        """[p, rows, ow] fp32: the flat input index ``(i * sh - ph) * W + j * sw - pw`` of each
        window's first position (GpSimd)."""
        starts = nl.ndarray((p, rows, self.ow), nl.float32)
        nisa.iota(starts, pattern=[[self.sh * self.w, rows], [self.sw, self.ow]],
                  offset=(o0 * self.sh - self.ph) * self.w - self.pw)
        return starts


def _plane_views(t, planes):
    n, c, h, w = t.shape
    return t.reshape((planes, h, w))


@nki.jit
def maxpool2d_kernel(x, kernel_size, stride=None, padding=0, ceil_mode=False, indices=True):
    """torch's ``max_pool2d_with_indices(x, kernel_size, stride, padding, dilation=1,
    ceil_mode)``.

    Args:
        x: [N, C, H, W] in HBM (NCHW), any chip float dtype.
        kernel_size, stride, padding: ints or (rows, columns) pairs; ``stride`` None: the
            kernel's. Padding counts as -inf (never the maximum).
        ceil_mode: a last window that starts inside the padded input counts.
        indices: also return the maxima's indices.

    Returns:
        ``out`` [N, C, OH, OW] of ``x``'s dtype, and with ``indices`` the index of each
        maximum in its plane (``h * W + w``, the first position where several are equal)
        [N, C, OH, OW] int32, in HBM. A NaN input gives NaN, and a window of -inf only
        -inf; their indices are not torch's.

    Memories: each band's padded input rows of 128 planes ([128, rows, pitch], at most
    32 KiB per partition) are loaded into SBUF with one DMA (-inf around them written by
    GpSimd where the band reaches the padding). Per filter tap the vector engine keeps
    the running maximum and, with ``indices``, marks where the tap is not above it and
    selects the tap's offset elsewhere (fp32 [128, rows, OW] SBUF tiles); the window
    starts come from a GpSimd iota and are added once per band. Results are stored
    with one DMA each per band. PSUM is not used.
    """
    geo = PoolGeometry(x.shape, kernel_size, stride, padding, ceil_mode, x.dtype.itemsize, "maxpool2d_kernel")
    if indices and geo.h * geo.w > INDEX_MAX:
        raise nki.KernelError(f"maxpool2d_kernel: indices need H * W <= {INDEX_MAX}; got {geo.h}x{geo.w}; pass "
                              "indices=False")
    n, c = x.shape[:2]
    out = nl.ndarray((n, c, geo.oh, geo.ow), x.dtype, buffer=nl.shared_hbm)
    where = nl.ndarray((n, c, geo.oh, geo.ow), nl.int32, buffer=nl.shared_hbm) if indices else None
    src, dst = _plane_views(x, geo.planes), _plane_views(out, geo.planes)
    idx_dst = _plane_views(where, geo.planes) if indices else None
    for p0, p in geo.tiles:
        for o0, o1 in geo.bands:
            rows = o1 - o0
            first, end = geo.input_rows(o0, o1)
            band = nl.ndarray((p, end - first, geo.pitch), x.dtype)
            geo.load(src[p0:p0 + p], band, first, end, -math.inf)
            taps = [(r, s) for r in range(geo.kh) for s in range(geo.kw)]
            best = nisa.tensor_copy(geo.tap(band, 0, 0, rows), dtype=x.dtype)
            for r, s in taps[1:]:
                nisa.tensor_tensor(best, best, geo.tap(band, r, s, rows), op=nl.maximum)
            nl.store(dst[p0:p0 + p, o0:o1, :], value=best)
            if indices:
                # the first tap holding the maximum: taps from the last to the first, each
                # taking over where it holds the maximum (GpSimd compares, the vector engine selects)
                r, s = taps[-1]
                offset = nisa.memset((p, rows, geo.ow), float(r * geo.w + s), nl.float32, engine=nisa.gpsimd_engine)
                for r, s in reversed(taps[:-1]):
                    other = nisa.tensor_tensor(geo.tap(band, r, s, rows), best, op=nl.not_equal, dtype=nl.uint8,
                                               engine=nisa.gpsimd_engine)
                    offset = nl.where(other, offset, float(r * geo.w + s), dtype=nl.float32)
                found = nisa.tensor_tensor(geo.window_starts(p, o0, rows), offset, op=nl.add, dtype=nl.int32)
                nl.store(idx_dst[p0:p0 + p, o0:o1, :], value=found)
    return (out, where) if indices else out


def _backward_bands(geo, p, fill_band):
    """Run ``fill_band(tile, o0, o1)`` for each band of output rows and yield (tile, the
    padded rows [first, end) it finished): the band's padded input rows as a zeroed fp32
    tile, the unfinished rows of the band before copied to its top."""
    carry = None
    for k, (o0, o1) in enumerate(geo.bands):
        first, reach = geo.input_rows(o0, o1)
        last = k == len(geo.bands) - 1
        end = max(reach, geo.ph + geo.h) if last else o1 * geo.sh
        band = nl.ndarray((p, max(end, reach) - first, geo.pitch), nl.float32)
        nisa.memset(band, value=0.0, engine=nisa.gpsimd_engine)
        if carry is not None:
            nisa.tensor_copy(dst=band[:, 0:carry.shape[1], :], src=carry)
        fill_band(band, o0, o1)
        carry = None if last or reach <= end else band[:, end - first:reach - first, :]
        yield band, first, end


def _store_rows(geo, grad_in, band, first, end):
    """Store the input rows of padded rows [first, end) of ``band`` into ``grad_in`` [P, H, W]."""
    lo, hi = max(first, geo.ph), min(end, geo.ph + geo.h)
    if hi > lo:
        nl.store(grad_in[:, lo - geo.ph:hi - geo.ph, :],
                 value=band[:, lo - first:hi - first, geo.pw:geo.pw + geo.w])


@nki.jit
def maxpool2d_backward_kernel(grad, indices, x, kernel_size, stride=None, padding=0, ceil_mode=False):
    """torch's ``max_pool2d_with_indices_backward``: each output gradient added to the
    input position its window's maximum came from.

    Args:
        grad: [N, C, OH, OW] in HBM, any chip float dtype: the output's gradient.
        indices: [N, C, OH, OW] int32 in HBM: the forward's indices.
        x: the forward's input [N, C, H, W] (only its shape and dtype are read).
        kernel_size, stride, padding, ceil_mode: as the forward's.

    Returns:
        The input's gradient [N, C, H, W] of ``x``'s dtype, in HBM.

    Memories: per band of 128 planes the gradients and indices ([128, rows, OW]) are
    loaded into SBUF; the vector engine takes away the window starts (a GpSimd iota)
    once, then per filter tap keeps the gradients whose index is the tap's (one
    instruction) and adds them into the tap's view of a zeroed fp32 band of padded
    input rows (written there directly when windows do not overlap). A tap's offset
    ``r * W + s`` names one input position: where a tap past the row's end has the
    offset of a position of the next row, it lies in the band's padding, which is not
    stored. Rows a band
    shares with the next are copied over to it; finished rows are stored with one DMA
    per band. PSUM is not used.
    """
    geo = PoolGeometry(x.shape, kernel_size, stride, padding, ceil_mode, 4, "maxpool2d_backward_kernel")
    if tuple(grad.shape) != (x.shape[0], x.shape[1], geo.oh, geo.ow) or tuple(indices.shape) != tuple(grad.shape):
        raise nki.KernelError(f"maxpool2d_backward_kernel: grad {list(grad.shape)} and indices "
                              f"{list(indices.shape)} must be the output's [N, C, {geo.oh}, {geo.ow}]")
    if geo.h * geo.w > INDEX_MAX:
        raise nki.KernelError(f"maxpool2d_backward_kernel: indices need H * W <= {INDEX_MAX}; got {geo.h}x{geo.w}")
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    g_src, i_src, g_dst = (_plane_views(t, geo.planes) for t in (grad, indices, out))
    for p0, p in geo.tiles:
        def fill(band, o0, o1, p0=p0, p=p):
            rows = o1 - o0
            g = nl.load(g_src[p0:p0 + p, o0:o1, :])
            offset = nisa.tensor_tensor(nl.load(i_src[p0:p0 + p, o0:o1, :]), geo.window_starts(p, o0, rows),
                                        op=nl.subtract, dtype=nl.float32)
            for r in range(geo.kh):
                for s in range(geo.kw):
                    view = geo.tap(band, r, s, rows)
                    if geo.overlaps:
                        mine = nisa.scalar_tensor_tensor(data=offset, op0=nl.equal, operand0=float(r * geo.w + s),
                                                         op1=nl.multiply, operand1=g, dtype=nl.float32)
                        nisa.tensor_tensor(view, view, mine, op=nl.add)
                    else:
                        nisa.scalar_tensor_tensor(dst=view, data=offset, op0=nl.equal, operand0=float(r * geo.w + s),
                                                  op1=nl.multiply, operand1=g)

        for band, first, end in _backward_bands(geo, p, fill):
            _store_rows(geo, g_dst[p0:p0 + p], band, first, end)
    return out


def _divisor(geo, count_include_pad, divisor_override):
    """The divisor of every window as a number, or None where it differs between windows."""
    if divisor_override:
        return float(divisor_override)
    beyond = (geo.oh - 1) * geo.sh + geo.kh > geo.h + 2 * geo.ph or (geo.ow - 1) * geo.sw + geo.kw > geo.w + 2 * geo.pw
    if not beyond and (count_include_pad or geo.ph == geo.pw == 0):
        return float(geo.kh * geo.kw)
    return None


def _counts(geo, p, o0, o1, count_include_pad):
    """[p, rows, OW] fp32: how many positions each window divides by (torch's rule: those
    inside the padded input, or the real ones only), summed over the taps of a band of
    ones (vector engine)."""
    first, end = geo.input_rows(o0, o1)
    ones = nl.ndarray((p, end - first, geo.pitch), nl.float32)
    nisa.memset(ones, value=0.0, engine=nisa.gpsimd_engine)
    pad_h, pad_w = (geo.ph, geo.pw) if count_include_pad else (0, 0)
    lo, hi = max(first, geo.ph - pad_h), min(end, geo.ph + geo.h + pad_h)
    if hi > lo:
        nisa.memset(ones[:, lo - first:hi - first, geo.pw - pad_w:geo.pw + geo.w + pad_w], value=1.0,
                    engine=nisa.gpsimd_engine)
    return _tap_sum(geo, ones, o1 - o0)


def _tap_sum(geo, band, rows):
    """[P, rows, OW] fp32: the sum over the filter taps of ``band``'s views (vector engine)."""
    total = nisa.tensor_copy(geo.tap(band, 0, 0, rows), dtype=nl.float32)
    for r in range(geo.kh):
        for s in range(geo.kw):
            if r or s:
                nisa.tensor_tensor(total, total, geo.tap(band, r, s, rows), op=nl.add)
    return total


@nki.jit
def avgpool2d_kernel(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                     divisor_override=None):
    """torch's ``avg_pool2d``: the mean of each window.

    Args:
        x: [N, C, H, W] in HBM (NCHW), any chip float dtype.
        kernel_size, stride, padding, ceil_mode: as torch's (padding counts as zeros).
        count_include_pad: the divisor counts the padding (torch's default), else only
            the input's positions; a ``ceil_mode`` window's positions past the padded
            input never count.
        divisor_override: every window's divisor, or None.

    Returns:
        [N, C, OH, OW] of ``x``'s dtype, in HBM.

    Memories: each band's zero-padded input rows of 128 planes are loaded into SBUF
    (one DMA, GpSimd zeroing around them where the band reaches the padding); the
    vector engine sums the filter taps in fp32 ([128, rows, OW]) and scales the sum by
    one over the divisor as it writes ``x``'s dtype. Where windows differ in their
    divisor, the vector engine sums the taps of a band of ones the same way and divides
    by that. Stored with one DMA per band. PSUM is not used.
    """
    geo = PoolGeometry(x.shape, kernel_size, stride, padding, ceil_mode, x.dtype.itemsize, "avgpool2d_kernel")
    divisor = _divisor(geo, count_include_pad, divisor_override)
    n, c = x.shape[:2]
    out = nl.ndarray((n, c, geo.oh, geo.ow), x.dtype, buffer=nl.shared_hbm)
    src, dst = _plane_views(x, geo.planes), _plane_views(out, geo.planes)
    for p0, p in geo.tiles:
        for o0, o1 in geo.bands:
            first, end = geo.input_rows(o0, o1)
            band = nl.ndarray((p, end - first, geo.pitch), x.dtype)
            geo.load(src[p0:p0 + p], band, first, end, 0.0)
            total = _tap_sum(geo, band, o1 - o0)
            if divisor is not None:
                mean = nisa.tensor_scalar(total, op0=nl.multiply, operand0=1.0 / divisor, dtype=x.dtype)
            else:
                mean = nisa.tensor_tensor(total, _counts(geo, p, o0, o1, count_include_pad), op=nl.divide,
                                          dtype=x.dtype)
            nl.store(dst[p0:p0 + p, o0:o1, :], value=mean)
    return out


@nki.jit
def avgpool2d_backward_kernel(grad, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                              divisor_override=None):
    """torch's ``avg_pool2d_backward``: each output gradient over its window's divisor,
    added to every position of the window.

    Args:
        grad: [N, C, OH, OW] in HBM, any chip float dtype: the output's gradient.
        x: the forward's input [N, C, H, W] (only its shape and dtype are read).
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override:
            as the forward's.

    Returns:
        The input's gradient [N, C, H, W] of ``x``'s dtype, in HBM.

    Memories: per band of 128 planes the gradients ([128, rows, OW]) are loaded into
    SBUF and scaled by one over the divisor (divided by the windows' counts where they
    differ) on the vector engine, which then adds them into every tap's view of a
    zeroed fp32 band of padded input rows (written there directly when windows do not
    overlap). Rows a band shares with the next are copied over to it; finished rows are
    stored with one DMA per band. PSUM is not used.
    """
    geo = PoolGeometry(x.shape, kernel_size, stride, padding, ceil_mode, 4, "avgpool2d_backward_kernel")
    if tuple(grad.shape) != (x.shape[0], x.shape[1], geo.oh, geo.ow):
        raise nki.KernelError(f"avgpool2d_backward_kernel: grad {list(grad.shape)} must be the output's "
                              f"[N, C, {geo.oh}, {geo.ow}]")
    divisor = _divisor(geo, count_include_pad, divisor_override)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    g_src, g_dst = _plane_views(grad, geo.planes), _plane_views(out, geo.planes)
    for p0, p in geo.tiles:
        def fill(band, o0, o1, p0=p0, p=p):
            g = nl.load(g_src[p0:p0 + p, o0:o1, :])
            if divisor is not None:
                share = nisa.tensor_scalar(g, op0=nl.multiply, operand0=1.0 / divisor, dtype=nl.float32)
            else:
                share = nisa.tensor_tensor(g, _counts(geo, p, o0, o1, count_include_pad), op=nl.divide,
                                           dtype=nl.float32)
            for r in range(geo.kh):
                for s in range(geo.kw):
                    view = geo.tap(band, r, s, o1 - o0)
                    if geo.overlaps:
                        nisa.tensor_tensor(view, view, share, op=nl.add)
                    else:
                        nisa.tensor_copy(dst=view, src=share)

        for band, first, end in _backward_bands(geo, p, fill):
            _store_rows(geo, g_dst[p0:p0 + p], band, first, end)
    return out
