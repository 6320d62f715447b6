"""Depthwise 2-D convolution and its gradients on the vector engine.

A depthwise convolution (``groups`` equal to the input channels: ConvNeXt's 7x7, the
3x3 and 5x5 of MobileNet and EfficientNet) has one input channel per filter, so there
is no contraction for the tensor engine to do: every output value is a weighted sum of
``kh * kw`` input values of its own channel. Channels sit on partitions (128 per tile)
and each filter tap is one instruction over a band of output rows: the input window
shifted by the tap, times the tap's weight (a per-partition scalar), added to the
running fp32 sum (``scalar_tensor_tensor``); the first tap starts the sum
(``tensor_scalar``). A channel multiplier ``m`` (``C_out = m * C_in``) runs the taps
once per output channel of each input channel.

The gradients take the same layout. The input's gradient gathers, for each band of
input rows, every tap's contribution from the output rows that reach it (no overlap
between bands, so each band is complete when stored); the weights' gradient is, per
tap, the product of the output gradient and the shifted input summed over the band
(``tensor_tensor`` then ``tensor_reduce``), added up over bands and images; the bias's
gradient sums the output gradient.
"""

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.kernels.preconditions import int_pair

TILE_P = 128                 # nl.tile_size.pmax: channels per tile
BAND_BYTES = 32 * 1024       # per partition: the input rows of one band of output rows


class _Shape:
    """A depthwise convolution's sizes, checked: input [B, C, H, W], weights
    [C * m, 1, kh, kw], stride, padding and dilation as pairs."""

    def __init__(self, name, x_shape, w_shape, stride, padding, dilation):
        if len(x_shape) != 4 or len(w_shape) != 4:
            raise nki.KernelError(f"{name}: x {list(x_shape)} and w {list(w_shape)} must be [B, C, H, W] and "
                                  "[C * m, 1, kh, kw]")
        self.batch, self.c, self.h, self.w = x_shape
        c_out, one, self.kh, self.kw = w_shape
        if one != 1 or c_out % self.c:
            raise nki.KernelError(f"{name}: w {list(w_shape)} is not a depthwise filter of {self.c} channels "
                                  f"([C * m, 1, kh, kw] with C = {self.c})")
        self.m = c_out // self.c
        (self.sh, self.sw), (self.ph, self.pw) = int_pair(stride, "stride", name), int_pair(padding, "padding", name)
        self.dh, self.dw = int_pair(dilation, "dilation", name)
        self.h_out = (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1
        self.w_out = (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1
        if min(self.h_out, self.w_out, self.sh, self.sw, self.dh, self.dw) < 1 or min(self.ph, self.pw) < 0:
            raise nki.KernelError(f"{name}: a {self.kh}x{self.kw} filter with stride {(self.sh, self.sw)}, padding "
                                  f"{(self.ph, self.pw)} and dilation {(self.dh, self.dw)} gives no output from a "
                                  f"{self.h}x{self.w} input")
        self.taps = self.kh * self.kw
        self.pitch = self.w + 2 * self.pw
        self.tiles = [(c0, min(TILE_P, self.c - c0)) for c0 in range(0, self.c, TILE_P)]

    @property
    def out_shape(self):
        return (self.batch, self.c * self.m, self.h_out, self.w_out)

    def band_rows(self, itemsize):
        """Output rows per band: as many as keep the band's padded input rows and its
        fp32 sum within ``BAND_BYTES`` a partition."""
        per_row = self.sh * self.pitch * itemsize + self.w_out * 4
        return max(1, min(self.h_out, BAND_BYTES // per_row))

    def input_rows(self, o0, o1):
        """The padded-input rows [first, last) that output rows [o0, o1) read."""
        return o0 * self.sh, (o1 - 1) * self.sh + self.dh * (self.kh - 1) + 1


def _tap_weights(w, shape, c0, ct, j):
    """The fp32 weights of output channels ``(c0..c0+ct) * m + j``: [ct, taps]."""
    rows = w.reshape((shape.c, shape.m * shape.taps))
    raw = nl.load(rows[c0:c0 + ct, j * shape.taps:(j + 1) * shape.taps])
    return nl.copy(raw, dtype=nl.float32)


def _padded_band(image, shape, c0, ct, first, last, dtype):
    """Padded-input rows [first, last) of channels c0..c0+ct as a [ct, rows, pitch] SBUF
    tile, zeros where the padding is."""
    rows = last - first
    tile = nl.ndarray((ct, rows, shape.pitch), dtype)
    lo, hi = max(first, shape.ph), min(last, shape.ph + shape.h)
    if lo > first or hi < last or shape.pw:
        nisa.memset(tile, value=0.0)
    if hi > lo:
        nisa.dma_copy(dst=tile[:, lo - first:hi - first, shape.pw:shape.pw + shape.w],
                      src=image[c0:c0 + ct, lo - shape.ph:hi - shape.ph, :])
    return tile


def _window(band, shape, r, s, first, o0, o1):
    """The input values tap (r, s) meets for output rows [o0, o1), in ``band`` (padded
    rows from ``first``): [ct, o1 - o0, w_out] with the stride's steps."""
    y = o0 * shape.sh + r * shape.dh - first
    x = s * shape.dw
    return band[:, y:y + (o1 - o0 - 1) * shape.sh + 1:shape.sh, x:x + (shape.w_out - 1) * shape.sw + 1:shape.sw]


@nki.jit
def depthwise_conv2d_kernel(x, w, stride=1, padding=0, dilation=1):
    """torch's ``conv2d(x, w, stride=stride, padding=padding, dilation=dilation,
    groups=C)`` (no bias).

    Args:
        x: [B, C, H, W] (NCHW) in HBM, any chip float dtype.
        w: [C * m, 1, kh, kw] in HBM (torch's layout of a depthwise filter, channel
            multiplier m).
        stride, padding, dilation: an int or a pair each.

    Returns:
        [B, C * m, H_out, W_out] in HBM, ``x``'s dtype; sums accumulate in fp32.

    Memories: per image and 128-channel tile, bands of output rows whose zero-padded
    input rows (at most 32 KiB a partition) are loaded into SBUF; each output channel
    of the band is ``kh * kw`` vector instructions into an fp32 SBUF sum, converted
    and stored with one DMA.
    """
    shape = _Shape("depthwise_conv2d_kernel", x.shape, w.shape, stride, padding, dilation)
    out = nl.ndarray(shape.out_shape, x.dtype, buffer=nl.shared_hbm)
    per_channel = out.reshape((shape.batch, shape.c, shape.m, shape.h_out, shape.w_out))
    band = shape.band_rows(x.dtype.itemsize)
    weights = [[_tap_weights(w, shape, c0, ct, j) for j in range(shape.m)] for c0, ct in shape.tiles]
    for b in nl.affine_range(shape.batch):
        for o0 in nl.affine_range(0, shape.h_out, band):
            o1 = min(shape.h_out, o0 + band)
            first, last = shape.input_rows(o0, o1)
            for t, (c0, ct) in enumerate(shape.tiles):
                rows = _padded_band(x[b], shape, c0, ct, first, last, x.dtype)
                for j in range(shape.m):
                    wt = weights[t][j]
                    acc = nl.ndarray((ct, o1 - o0, shape.w_out), nl.float32)
                    for r in range(shape.kh):
                        for s in range(shape.kw):
                            tap = r * shape.kw + s
                            window = _window(rows, shape, r, s, first, o0, o1)
                            if tap == 0:
                                nisa.tensor_scalar(dst=acc, data=window, op0=nl.multiply, operand0=wt[:, 0:1])
                            else:
                                nisa.scalar_tensor_tensor(dst=acc, data=window, op0=nl.multiply,
                                                          operand0=wt[:, tap:tap + 1], op1=nl.add, operand1=acc)
                    result = nl.copy(acc, dtype=x.dtype)
                    nl.store(per_channel[b, c0:c0 + ct, j, o0:o1, :], value=result)
    return out


def _reached(o, count, pad, step, size):
    """For tap offset ``o`` (s * dilation) the output indices i in [0, count) whose input
    index ``i * step - pad + o`` falls in [0, size), as (first i, last i + 1, first input
    index)."""
    lo = max(0, -(-(pad - o) // step))
    hi = min(count, (size - 1 + pad - o) // step + 1)
    return lo, max(lo, hi), lo * step - pad + o


@nki.jit
def depthwise_conv2d_backward_kernel(grad, x, w, stride=1, padding=0, dilation=1, need_input=True,
                                     need_weight=True, need_bias=False):
    """torch's ``convolution_backward`` of a depthwise ``conv2d(x, w, stride, padding,
    dilation, groups=C)``: the gradients of the input, the weights and the bias (as
    asked), in that order, one array alone or a tuple.

    Args:
        grad: [B, C * m, H_out, W_out] in HBM, the output's gradient.
        x: [B, C, H, W] in HBM; w: [C * m, 1, kh, kw] in HBM.

    Returns:
        dx [B, C, H, W] in ``x``'s dtype, dw [C * m, 1, kh, kw] in ``w``'s, db [C * m]
        in ``grad``'s; sums in fp32.

    Memories: the input's gradient in bands of input rows (an fp32 SBUF sum per band,
    the output-gradient rows that reach it loaded once per output channel); the
    weights' and bias's gradients in bands of output rows with the padded input rows,
    summed into an fp32 [C tile, taps] SBUF tile over bands and images.
    """
    name = "depthwise_conv2d_backward_kernel"
    shape = _Shape(name, x.shape, w.shape, stride, padding, dilation)
    if tuple(grad.shape) != shape.out_shape:
        raise nki.KernelError(f"{name}: grad {list(grad.shape)} is not the output of this convolution "
                              f"({list(shape.out_shape)})")
    if not (need_input or need_weight or need_bias):
        raise nki.KernelError(f"{name}: asked for no gradient (need_input, need_weight and need_bias all False)")
    g_channels = grad.reshape((shape.batch, shape.c, shape.m, shape.h_out, shape.w_out))
    results = []
    if need_input:
        results.append(_input_grad(g_channels, w, shape, x.dtype))
    if need_weight or need_bias:
        dw, db = _weight_grad(g_channels, x, w, shape, need_weight, need_bias, grad.dtype)
        results += [r for r in (dw, db) if r is not None]
    return tuple(results) if len(results) > 1 else results[0]


def _input_grad(g_channels, w, shape, dtype):
    dx = nl.ndarray((shape.batch, shape.c, shape.h, shape.w), dtype, buffer=nl.shared_hbm)
    # input rows per band: the gradient rows they need and their fp32 sum within the budget
    per_row = shape.w * 4 + shape.w_out * g_channels.dtype.itemsize
    band = max(1, min(shape.h, BAND_BYTES // per_row))
    weights = [[_tap_weights(w, shape, c0, ct, j) for j in range(shape.m)] for c0, ct in shape.tiles]
    for b in nl.affine_range(shape.batch):
        for y0 in nl.affine_range(0, shape.h, band):
            y1 = min(shape.h, y0 + band)
            # output rows i with i * sh - ph + r * dh in [y0, y1) for some tap row r
            i0 = max(0, -(-(y0 + shape.ph - shape.dh * (shape.kh - 1)) // shape.sh))
            i1 = min(shape.h_out, (y1 - 1 + shape.ph) // shape.sh + 1)
            for t, (c0, ct) in enumerate(shape.tiles):
                acc = nl.ndarray((ct, y1 - y0, shape.w), nl.float32)
                nisa.memset(acc, value=0.0)
                for j in range(shape.m):
                    if i1 <= i0:
                        continue
                    g = nl.load(g_channels[b, c0:c0 + ct, j, i0:i1, :])
                    wt = weights[t][j]
                    for r in range(shape.kh):
                        # the output rows whose tap row r lands in the band, and where the first lands
                        lo = max(i0, -(-(y0 + shape.ph - r * shape.dh) // shape.sh))
                        hi = min(i1, (y1 - 1 + shape.ph - r * shape.dh) // shape.sh + 1)
                        if hi <= lo:
                            continue
                        y = lo * shape.sh - shape.ph + r * shape.dh - y0
                        for s in range(shape.kw):
                            jlo, jhi, xx = _reached(s * shape.dw, shape.w_out, shape.pw, shape.sw, shape.w)
                            if jhi <= jlo:
                                continue
                            tap = r * shape.kw + s
                            dst = acc[:, y:y + (hi - lo - 1) * shape.sh + 1:shape.sh,
                                      xx:xx + (jhi - jlo - 1) * shape.sw + 1:shape.sw]
                            nisa.scalar_tensor_tensor(dst=dst, data=g[:, lo - i0:hi - i0, jlo:jhi], op0=nl.multiply,
                                                      operand0=wt[:, tap:tap + 1], op1=nl.add, operand1=dst)
                result = nl.copy(acc, dtype=dtype)
                nl.store(dx[b, c0:c0 + ct, y0:y1, :], value=result)
    return dx


def _weight_grad(g_channels, x, w, shape, need_weight, need_bias, dtype):
    dw = nl.ndarray(w.shape, w.dtype, buffer=nl.shared_hbm) if need_weight else None
    db = nl.ndarray((shape.c * shape.m,), dtype, buffer=nl.shared_hbm) if need_bias else None
    band = shape.band_rows(x.dtype.itemsize)
    for c0, ct in shape.tiles:
        sums = [nl.ndarray((ct, shape.taps + 1), nl.float32) for _ in range(shape.m)]
        for j in range(shape.m):
            nisa.memset(sums[j], value=0.0)
        for b in nl.sequential_range(shape.batch):
            for o0 in nl.sequential_range(0, shape.h_out, band):
                o1 = min(shape.h_out, o0 + band)
                first, last = shape.input_rows(o0, o1)
                rows = _padded_band(x[b], shape, c0, ct, first, last, x.dtype) if need_weight else None
                for j in range(shape.m):
                    g = nl.load(g_channels[b, c0:c0 + ct, j, o0:o1, :])
                    columns = []
                    if need_weight:
                        for r in range(shape.kh):
                            for s in range(shape.kw):
                                product = nisa.tensor_tensor(g, _window(rows, shape, r, s, first, o0, o1),
                                                             op=nl.multiply, dtype=nl.float32)
                                columns.append(nisa.tensor_reduce(data=product, op=nl.add, axis=(1, 2), dtype=nl.float32,
                                                                  keepdims=True))
                    if need_bias:
                        columns.append(nisa.tensor_reduce(data=g, op=nl.add, axis=(1, 2), dtype=nl.float32, keepdims=True))
                    for k, column in enumerate(columns):
                        at = k if need_weight else shape.taps
                        sums[j][:, at:at + 1] = nl.add(sums[j][:, at:at + 1], column)
        per_channel_w = dw.reshape((shape.c, shape.m * shape.taps)) if need_weight else None
        per_channel_b = db.reshape((shape.c, shape.m)) if need_bias else None
        for j in range(shape.m):
            if need_weight:
                nl.store(per_channel_w[c0:c0 + ct, j * shape.taps:(j + 1) * shape.taps],
                         value=nl.copy(sums[j][:, 0:shape.taps], dtype=w.dtype))
            if need_bias:
                nl.store(per_channel_b[c0:c0 + ct, j:j + 1], value=nl.copy(sums[j][:, shape.taps:shape.taps + 1],
                                                                          dtype=dtype))
    return dw, db
