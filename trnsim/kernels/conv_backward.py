"""The two gradients of a 2-D convolution, on the tensor engine like the forward
(:mod:`trnsim.kernels.conv`): what ``convolution_backward`` runs.

- ``conv2d_input_grad_kernel``: the input's gradient, a transposed convolution of
  the output's gradient. Output channels (the forward's) sit on partitions as the
  contraction and the weights are used as they lie in torch's layout, each tap a
  [C_out, C_in] stationary. With a stride the input gradient is made one phase at a
  time (the rows ``a, a + sh, ..`` and columns ``b, b + sw, ..``): each phase is a
  stride-1 correlation of the gradient with the taps that reach it, so no
  multiply is spent on the zeros a strided transposed convolution would insert.
- ``conv2d_weight_grad_kernel``: the weights' gradient (and the bias's), a
  correlation of the input with the output's gradient over every image and output
  position. The positions are the contraction, so both operands are turned onto
  partitions through the PE array 128 positions at a time: the gradient once, the
  input once per tap (its window shifted by the tap, read at the forward's pitch as
  in ``conv2d_kernel``); the sums accumulate in PSUM over all images.
"""

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.kernels.conv import BAND_BYTES, ENGINES, PSUM_BANK_BYTES, PSUM_FMAX, TILE_P, _Geometry, _load_phases, _pair

ACC_BANKS = 6   # PSUM banks the weight gradient's sums may hold; the other two stage the transposes


def _check(name, x_shape, g_shape, w_shape, stride, padding):
    """The geometry both kernels share, checked: ((sh, sw), (ph, pw), (h_out, w_out))."""
    (sh, sw), (ph, pw) = _pair(stride, "stride"), _pair(padding, "padding")
    c_out, c_in, kh, kw = w_shape
    h, wd = x_shape[-2:]
    h_out, w_out = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    if sh < 1 or sw < 1 or ph < 0 or pw < 0 or h_out < 1 or w_out < 1:
        raise nki.KernelError(f"{name}: a {kh}x{kw} filter with stride {(sh, sw)} and padding {(ph, pw)} gives no "
                              f"output from a {h}x{wd} input")
    if tuple(g_shape[-3:]) != (c_out, h_out, w_out) or x_shape[-3] != c_in or len(g_shape) != len(x_shape):
        raise nki.KernelError(f"{name}: grad {list(g_shape)} is not the output of a convolution of "
                              f"{list(x_shape)} by {list(w_shape)} with stride {(sh, sw)} and padding {(ph, pw)}")
    return (sh, sw), (ph, pw), (h_out, w_out)


class _Phases:
    """Where the phases of an input gradient read the output gradient.

    Phase (a, b) holds input rows ``a + sh * i`` and columns ``b + sw * j``. Tap (r, s)
    reaches it when ``(a + ph - r) % sh == 0`` (and likewise for columns), reading
    gradient row ``i + (a + ph - r) // sh``. All phases read one zero-padded copy of
    the gradient's rows, kept in SBUF at a fixed ``pitch``, so a tap's window over
    several rows is one contiguous run (as in the forward)."""

    def __init__(self, h, wd, kh, kw, sh, sw, ph, pw, h_out, w_out, c_out, itemsize):
        self.h, self.wd, self.sh, self.sw, self.h_out, self.w_out = h, wd, sh, sw, h_out, w_out
        rows = {a: [(r, (a + ph - r) // sh) for r in range(kh) if (a + ph - r) % sh == 0] for a in range(sh)}
        cols = {b: [(s, (b + pw - s) // sw) for s in range(kw) if (b + pw - s) % sw == 0] for b in range(sw)}
        self.phases = [(a, b, [(r * kw + s, dr, ds) for r, dr in rows[a] for s, ds in cols[b]])
                       for a in range(min(sh, h)) for b in range(min(sw, wd))]
        shifts_r = [dr for taps in rows.values() for _, dr in taps] or [0]
        shifts_c = [ds for taps in cols.values() for _, ds in taps] or [0]
        self.lo_r, self.lo_c = min(shifts_r), min(shifts_c)
        self.extra_rows = max(shifts_r) - self.lo_r
        self.rows_out = -(-h // sh)           # phase rows of phase 0, the most
        self.cols_out = -(-wd // sw)
        self.pitch = self.cols_out + max(shifts_c) - self.lo_c
        self.rows_per_piece = max(1, PSUM_FMAX // self.pitch) if self.pitch <= PSUM_FMAX else 1
        per_row = -(-c_out // TILE_P) * itemsize * self.pitch
        fit = max(1, BAND_BYTES // per_row - self.extra_rows)
        self.band_rows = min(self.rows_out, max(self.rows_per_piece, fit // self.rows_per_piece * self.rows_per_piece))
        self.zeros = any(not taps for _, _, taps in self.phases)

    def size(self, a, b):
        """(phase rows, phase columns) of phase (a, b)."""
        return -(-(self.h - a) // self.sh), -(-(self.wd - b) // self.sw)

    def pieces(self, i0, i1, cols):
        """(first phase row, rows, first column, columns) of each matmul over phase rows [i0, i1)."""
        if self.pitch <= PSUM_FMAX:
            return [(i, min(self.rows_per_piece, i1 - i), 0, cols) for i in range(i0, i1, self.rows_per_piece)]
        return [(i, 1, j, min(PSUM_FMAX, cols - j)) for i in range(i0, i1) for j in range(0, cols, PSUM_FMAX)]


def _load_gradient(image, geo, i0, i1):
    """The output gradient's rows that phase rows [i0, i1) read, for one channel tile:
    a [channels, rows * pitch] SBUF tile, zeros where they fall outside the gradient.
    Rows are loaded as they lie and moved into place by GpSimd when the pitch differs
    from the row (a DMA of rows narrower than the pitch is one descriptor per row)."""
    ct = image.shape[0]
    rows = i1 - i0 + geo.extra_rows
    tile = nl.ndarray((ct, rows, geo.pitch), image.dtype)
    first = i0 + geo.lo_r
    y0, y1 = max(0, first), min(geo.h_out, first + rows)
    x0, x1 = max(0, geo.lo_c), min(geo.w_out, geo.lo_c + geo.pitch)
    if (y0, y1, x0, x1) != (first, first + rows, geo.lo_c, geo.lo_c + geo.pitch):
        nisa.memset(tile, value=0.0, engine=nisa.gpsimd_engine)
    if y1 > y0 and x1 > x0:
        dst = tile[:, y0 - first:y1 - first, x0 - geo.lo_c:x1 - geo.lo_c]
        if (x0, x1) == (0, geo.w_out) and geo.pitch == geo.w_out:
            nisa.dma_copy(dst=dst, src=image[:, y0:y1, :])
        else:
            source = nl.load(image[:, y0:y1, :])
            nisa.tensor_copy(dst=dst, src=source[:, :, x0:x1], engine=nisa.gpsimd_engine)
    return tile.reshape((ct, rows * geo.pitch))


def _weights_by_tap(w, co_tiles):
    """``w`` [C_out, C_in, kh, kw] as one SBUF tile [C_out tile, taps, C_in] per output
    channel tile: loaded as it lies (output channels on partitions, the contraction of
    the input gradient) and reordered by one copy per tap."""
    c_out, c_in, kh, kw = w.shape
    taps = kh * kw
    rows = w.reshape((c_out, c_in * taps))
    out = []
    for i, (co0, cm) in enumerate(co_tiles):
        block = nl.load(rows[co0:co0 + cm, :])
        by_tap = nl.ndarray((cm, taps, c_in), w.dtype)
        for t in range(taps):
            nisa.tensor_copy(dst=by_tap[:, t, :], src=block[:, t::taps], engine=ENGINES[(i + t) % 2])
        out.append(by_tap)
    return out


@nki.jit
def conv2d_input_grad_kernel(grad, w, x_shape, stride=1, padding=0, dtype=None):
    """The gradient of ``conv2d(x, w, stride, padding)`` (torch's, dilation 1, one
    group) with respect to ``x``: ``dx[ci, y, x] = sum over co, r, s of
    grad[co, oy, ox] * w[co, ci, r, s]`` where ``y = oy * sh + r - ph``.

    Args:
        grad: [C_out, H_out, W_out] or [B, C_out, H_out, W_out] (NCHW) in HBM, any chip
            float dtype: the gradient of the convolution's output.
        w: [C_out, C_in, kh, kw] in HBM (torch's layout), any chip float dtype.
        x_shape: the shape of ``x`` ([C_in, H, W] or [B, C_in, H, W]): with a stride,
            several input sizes give one output size.
        stride, padding: the forward's (an int or a pair).
        dtype: of the result; ``grad``'s by default. Sums accumulate in fp32.

    Returns:
        ``x_shape`` in HBM.

    Memories: ``w`` is loaded into SBUF as it lies, output channels on partitions,
    and reordered into [C_out tile, taps, C_in] tiles (one vector or scalar copy per
    tap). Per image, bands of input rows: the output gradient's rows they need are
    loaded (per 128-channel tile, zero-padded at a fixed pitch, at most 48 KiB per
    partition; rows narrower than the pitch moved into place by GpSimd). For each
    input channel tile and phase, matmuls of up to 512 positions accumulate over the
    output channel tiles and the phase's taps in a PSUM bank; the valid positions are
    copied into the phase's rows and columns of a [C_in tile, band rows, W] SBUF tile
    (alternately on the vector and scalar engines), stored with one DMA per band.
    Phases no tap reaches (a stride larger than the filter) are zeros.
    """
    return _input_grad(grad, w, x_shape, stride, padding, dtype)


def _input_grad(grad, w, x_shape, stride, padding, dtype):
    x_shape = tuple(int(s) for s in x_shape)
    (sh, sw), (ph, pw), (h_out, w_out) = _check("conv2d_input_grad_kernel", x_shape, grad.shape, w.shape, stride,
                                                padding)
    c_out, c_in, kh, kw = w.shape
    h, wd = x_shape[-2:]
    batched = len(x_shape) == 4
    out = nl.ndarray(x_shape, dtype if dtype is not None else grad.dtype, buffer=nl.shared_hbm)
    geo = _Phases(h, wd, kh, kw, sh, sw, ph, pw, h_out, w_out, c_out, grad.dtype.itemsize)
    co_tiles = [(c0, min(TILE_P, c_out - c0)) for c0 in range(0, c_out, TILE_P)]
    ci_tiles = [(c0, min(TILE_P, c_in - c0)) for c0 in range(0, c_in, TILE_P)]
    w_taps = _weights_by_tap(w, co_tiles)
    evacuations = 0
    for n in nl.affine_range(x_shape[0] if batched else 1):
        g_img, result = (grad[n], out[n]) if batched else (grad, out)
        for i0 in nl.affine_range(0, geo.rows_out, geo.band_rows):
            i1 = min(geo.rows_out, i0 + geo.band_rows)
            sources = [_load_gradient(g_img[c0:c0 + cm], geo, i0, i1) for c0, cm in co_tiles]
            y0, y1 = i0 * sh, min(h, i1 * sh)
            for ci0, cn in ci_tiles:
                band = nl.ndarray((cn, (i1 - i0) * sh, wd), out.dtype)
                if geo.zeros:
                    nisa.memset(band, value=0.0, engine=nisa.gpsimd_engine)
                for a, b, taps in geo.phases:
                    rows_a, cols_b = geo.size(a, b)
                    if not taps or i0 >= rows_a:
                        continue
                    for r0, rows, col0, cols in geo.pieces(i0, min(i1, rows_a), cols_b):
                        pitch = geo.pitch if rows > 1 else cols
                        acc_tile = nl.ndarray((cn, rows * pitch), nl.float32, buffer=nl.psum)
                        length = (rows - 1) * pitch + cols
                        acc = acc_tile[:, 0:length]
                        for t, src in enumerate(sources):
                            for tap, dr, ds in taps:
                                start = (r0 - i0 + dr - geo.lo_r) * geo.pitch + col0 + ds - geo.lo_c
                                acc += nl.matmul(w_taps[t][:, tap, ci0:ci0 + cn], src[:, start:start + length],
                                                 transpose_x=True)
                        valid = acc_tile.reshape((cn, rows, pitch))[:, :, 0:cols]
                        first_row = (r0 - i0) * sh + a
                        first_col = b + col0 * sw
                        dst = band[:, first_row:first_row + (rows - 1) * sh + 1:sh,
                                   first_col:first_col + (cols - 1) * sw + 1:sw]
                        nisa.tensor_copy(dst=dst, src=valid, engine=ENGINES[evacuations % 2])
                        evacuations += 1
                nl.store(result[ci0:ci0 + cn, y0:y1, :], value=band[:, 0:y1 - y0, :])
    return out


@nki.jit
def conv2d_weight_grad_kernel(x, grad, kernel_size, stride=1, padding=0, need_bias=False, dtype=None):
    """The gradient of ``conv2d(x, w, stride, padding)`` (torch's, dilation 1, one
    group) with respect to ``w`` (and the bias): ``dw[co, ci, r, s] = sum over images
    and output positions of grad[co, oy, ox] * x[ci, oy * sh + r - ph, ox * sw + s - pw]``,
    ``db[co] = sum of grad[co]``.

    Args:
        x: [C_in, H, W] or [B, C_in, H, W] (NCHW) in HBM, any chip float dtype.
        grad: [C_out, H_out, W_out] or [B, C_out, H_out, W_out] in HBM, any chip float
            dtype: the gradient of the convolution's output.
        kernel_size: (kh, kw).
        stride, padding: the forward's (an int or a pair).
        need_bias: also return the bias's gradient.
        dtype: of the results; ``x``'s by default. Sums accumulate in fp32.

    Returns:
        dw [C_out, C_in, kh, kw] in HBM; with ``need_bias`` the tuple (dw, db [C_out]).

    Memories: per image, bands of output rows as in ``conv2d_kernel``: the zero-padded
    input phases (SBUF, at most 48 KiB per partition) and the output gradient's rows,
    moved by GpSimd to the input's pitch with zeros past each row (so the extra
    positions add nothing). For every 128 positions the PE array transposes the
    gradient ([positions, C_out]) and, per tap, the input window ([positions, C_in]),
    staged in PSUM and copied to SBUF; then per output channel tile one matmul (the
    gradient stationary, up to 512 columns of taps x C_in moving) accumulates into
    PSUM across all images when the sums fit in six banks, else into fp32 SBUF sums
    (vector adds). The bias's sums come from vector reductions of the gradient rows.
    At the end the sums are reordered to torch's layout and stored.
    """
    return _weight_grad(x, grad, kernel_size, stride, padding, need_bias, dtype)


def _weight_grad(x, grad, kernel_size, stride, padding, need_bias, dtype):
    kh, kw = _pair(kernel_size, "kernel_size")
    batched = len(x.shape) == 4
    c_in, h, wd = x.shape[-3:]
    c_out = grad.shape[-3]
    (sh, sw), (ph, pw), (h_out, w_out) = _check("conv2d_weight_grad_kernel", x.shape, grad.shape,
                                                (c_out, c_in, kh, kw), stride, padding)
    out_dtype = dtype if dtype is not None else x.dtype
    taps = kh * kw
    cols = taps * c_in
    dw = nl.ndarray((c_out, c_in, kh, kw), out_dtype, buffer=nl.shared_hbm)
    db = nl.ndarray((c_out,), out_dtype, buffer=nl.shared_hbm) if need_bias else None
    geo = _Geometry(h, wd, kh, kw, sh, sw, ph, pw, h_out, w_out, c_in, x.dtype.itemsize)
    ci_tiles = [(c0, min(TILE_P, c_in - c0)) for c0 in range(0, c_in, TILE_P)]
    co_tiles = [(c0, min(TILE_P, c_out - c0)) for c0 in range(0, c_out, TILE_P)]
    chunks = [(j0, min(PSUM_FMAX, cols - j0)) for j0 in range(0, cols, PSUM_FMAX)]
    resident = len(co_tiles) * len(chunks) <= ACC_BANKS
    if resident:
        sums = [[nl.zeros((cm, n), nl.float32, buffer=nl.psum) for _, n in chunks] for _, cm in co_tiles]
    else:
        sums = [nl.zeros((cm, cols), nl.float32) for _, cm in co_tiles]
    bias_sums = [nl.zeros((cm, 1), nl.float32) for _, cm in co_tiles] if need_bias else None
    per_bank = max(1, PSUM_BANK_BYTES // (max(c_in, c_out) * x.dtype.itemsize))
    for n in nl.affine_range(grad.shape[0] if batched else 1):
        image, g_img = (x[n], grad[n]) if batched else (x, grad)
        for o0 in nl.affine_range(0, h_out, geo.band_rows):
            o1 = min(h_out, o0 + geo.band_rows)
            rows = o1 - o0
            phases = [_load_phases(image[c0:c0 + ct], geo, o0, o1) for c0, ct in ci_tiles]
            g_rows = []
            for t, (co0, cm) in enumerate(co_tiles):
                loaded = nl.load(g_img[co0:co0 + cm, o0:o1, :])
                if bias_sums is not None:
                    part = nisa.tensor_reduce(op=nl.add, data=loaded.reshape((cm, rows * w_out)), axis=1,
                                              dtype=nl.float32)
                    nisa.tensor_tensor(dst=bias_sums[t], data1=bias_sums[t], data2=part, op=nl.add)
                if geo.pitch == w_out:
                    g_rows.append(loaded.reshape((cm, rows * w_out)))
                    continue
                placed = nl.ndarray((cm, rows, geo.pitch), grad.dtype)
                nisa.memset(placed[:, :, w_out:geo.pitch], value=0.0, engine=nisa.gpsimd_engine)
                nisa.tensor_copy(dst=placed[:, :, 0:w_out], src=loaded, engine=nisa.gpsimd_engine)
                g_rows.append(placed.reshape((cm, rows * geo.pitch)))
            positions = (rows - 1) * geo.pitch + w_out
            for q0 in range(0, positions, TILE_P):
                qn = min(TILE_P, positions - q0)
                g_t = _transposed(qn, [(co0, cm, g_rows[t][:, q0:q0 + qn]) for t, (co0, cm) in enumerate(co_tiles)],
                                  c_out, grad.dtype, per_bank)
                windows = []
                for r in range(kh):
                    for s in range(kw):
                        start = (r // sh) * geo.pitch + s // sw
                        for (c0, ct), tile_phases in zip(ci_tiles, phases):
                            flat = tile_phases[(r % sh, s % sw)]
                            windows.append(((r * kw + s) * c_in + c0, ct, flat[:, start + q0:start + q0 + qn]))
                x_t = _transposed(qn, windows, cols, x.dtype, per_bank)
                for t, (co0, cm) in enumerate(co_tiles):
                    for j, (j0, jn) in enumerate(chunks):
                        if resident:
                            sums[t][j] += nl.matmul(g_t[:, co0:co0 + cm], x_t[:, j0:j0 + jn], transpose_x=True)
                        else:
                            part = nisa.nc_matmul(g_t[:, co0:co0 + cm], x_t[:, j0:j0 + jn])
                            nisa.tensor_tensor(dst=sums[t][:, j0:j0 + jn], data1=sums[t][:, j0:j0 + jn], data2=part,
                                               op=nl.add)
    for t, (co0, cm) in enumerate(co_tiles):
        by_tap = nl.ndarray((cm, taps, c_in), nl.float32)
        flat = by_tap.reshape((cm, cols))
        for j, (j0, jn) in enumerate(chunks):
            nisa.tensor_copy(dst=flat[:, j0:j0 + jn], src=sums[t][j] if resident else sums[t][:, j0:j0 + jn],
                             engine=ENGINES[j % 2])
        res = nl.ndarray((cm, c_in, taps), out_dtype)
        for tap in range(taps):
            nisa.tensor_copy(dst=res[:, :, tap], src=by_tap[:, tap, :], engine=ENGINES[tap % 2])
        nl.store(dw.reshape((c_out, c_in, taps))[co0:co0 + cm], value=res)
        if bias_sums is not None:
            nl.store(db.reshape((c_out, 1))[co0:co0 + cm, :], value=nisa.tensor_copy(bias_sums[t], dtype=out_dtype))
    return (dw, db) if need_bias else dw


@nki.jit
def conv2d_backward_kernel(grad, x, w, stride=1, padding=0, need_input=True, need_weight=True, need_bias=False):
    """torch's ``convolution_backward`` of ``conv2d(x, w, stride, padding)`` (dilation 1,
    one group) as one kernel: the gradients asked for, computed as
    :func:`conv2d_input_grad_kernel` and :func:`conv2d_weight_grad_kernel` do, one after
    the other in one Program (so the engines overlap the end of one with the start of
    the other).

    Args:
        grad: [B, C_out, H_out, W_out] (or [C_out, H_out, W_out]) in HBM, any chip float dtype.
        x: [B, C_in, H, W] (or [C_in, H, W]) in HBM, the forward's input.
        w: [C_out, C_in, kh, kw] in HBM, the forward's weights.
        stride, padding: the forward's.
        need_input, need_weight, need_bias: which gradients (torch's ``output_mask``).

    Returns:
        The asked-for gradients in the order dx (``x``'s shape and dtype), dw (``w``'s
        shape and dtype), db ([C_out], ``w``'s dtype), a tuple when more than one.
        The bias's gradient is made with the weights' (asked alone, the weights' is
        computed and dropped: a frozen weight with a trained bias is rare).
    """
    if not (need_input or need_weight or need_bias):
        raise nki.KernelError("conv2d_backward_kernel: no gradient asked for; set need_input, need_weight or "
                              "need_bias")
    results = []
    if need_input:
        results.append(_input_grad(grad, w, x.shape, stride, padding, x.dtype))
    if need_weight or need_bias:
        dw_db = _weight_grad(x, grad, w.shape[2:], stride, padding, need_bias, w.dtype)
        dw, db = dw_db if need_bias else (dw_db, None)
        results += [dw] if need_weight else []
        results += [db] if need_bias else []
    return tuple(results) if len(results) > 1 else results[0]


def _transposed(qn, pieces, width, dtype, per_bank):
    """[qn, width] SBUF tile whose columns ``c0 .. c0 + cn`` are the transpose of each
    piece (c0, cn, [cn, qn] SBUF view): transposes through the PE array into PSUM, as
    many per bank as fit, each bank copied out once."""
    out = nl.ndarray((qn, width), dtype)
    for k0 in range(0, len(pieces), per_bank):
        group = pieces[k0:k0 + per_bank]
        lo, hi = group[0][0], group[-1][0] + group[-1][1]
        staged = nl.ndarray((qn, hi - lo), dtype, buffer=nl.psum)
        for c0, cn, view in group:
            nisa.nc_transpose(dst=staged[:, c0 - lo:c0 - lo + cn], data=view)
        nisa.tensor_copy(dst=out[:, lo:hi], src=staged, engine=ENGINES[(k0 // per_bank) % 2])
    return out
