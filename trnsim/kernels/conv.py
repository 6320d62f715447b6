"""2-D convolution as an implicit GEMM on the tensor engine.

``conv2d_kernel`` computes torch's ``conv2d`` (no dilation, one group) without an
im2col buffer. Input channels sit on partitions (the contraction), output
channels are the stationary's free axis, and output positions stream as the
moving operand. For each filter tap (r, s) one matmul adds ``w[:, :, r, s]`` times
the input shifted by (r, s); all taps and input-channel tiles accumulate in one
PSUM bank.

The shift needs no copy: the zero-padded input is kept in SBUF row after row at
a fixed pitch, so the window of a tap over several output rows is one
contiguous run of it, starting r rows and s columns in. The run also covers the
pitch's few extra columns between rows; their results are dropped when PSUM is
copied out. A stride of (sh, sw) is handled the same way after splitting the
padded input into sh * sw phases (every sh-th row and sw-th column, from each
offset), which turns every tap into a stride-1 window of one phase.

Weights in torch's [C_out, C_in, kh, kw] layout are turned into [C_in, C_out] per
tap once, through the PE array.
"""

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.kernels.preconditions import int_pair

TILE_P = 128          # nl.tile_size.pmax: channels per tile
PSUM_FMAX = 512       # nl.tile_size.psum_fmax: output positions per matmul
BAND_BYTES = 48 * 1024  # per partition: the input rows of one band of output rows (two fit in SBUF)
PSUM_BANK_BYTES = 2048
ENGINES = (nisa.vector_engine, nisa.scalar_engine)


def _pair(v, what):
    return int_pair(v, what, "conv2d_kernel")


@nki.jit
def conv2d_kernel(x, w, stride=1, padding=0, dtype=None):
    """``conv2d(x, w, stride, padding)`` (torch's, no bias, dilation 1, groups 1).

    Args:
        x: [C_in, H, W] or [B, C_in, H, W] (NCHW) in HBM, any chip float dtype.
        w: [C_out, C_in, kh, kw] in HBM (torch's layout), any chip float dtype.
        stride: an int or (sh, sw).
        padding: an int or (ph, pw) zeros on each side.
        dtype: of the result; ``x``'s by default. Sums accumulate in fp32.

    Returns:
        [C_out, H_out, W_out] or [B, C_out, H_out, W_out] in HBM (in memory the same
        as [C_out, H_out * W_out] per image), ``H_out = (H + 2 ph - kh) // sh + 1``.

    Memories: ``w`` is loaded into SBUF once as [<= 128 C_out, C_in tile x taps] rows
    and transposed through the PE array (PSUM) into [C_in tile, taps, C_out] SBUF
    tiles. The output rows are made in bands whose zero-padded input rows (per
    128-channel tile and phase, at most 48 KiB per partition) are loaded into SBUF
    (with a stride or column padding, loaded as they lie and copied into place by
    GpSimd). Each
    matmul writes up to 512 output positions (whole output rows at the input's
    pitch, or pieces of one row when rows are longer) into a PSUM bank, accumulating
    over C_in tiles and taps; the valid positions are copied into a [<= 128, band
    rows, W_out] SBUF tile (alternately on the vector and scalar engines), stored
    to HBM with one DMA per band and output-channel tile.
    """
    batched = len(x.shape) == 4
    c_in, h, wd = x.shape[-3:]
    c_out, w_cin, kh, kw = w.shape
    if w_cin != c_in:
        raise nki.KernelError(f"conv2d_kernel: w {list(w.shape)} takes {w_cin} input channels, x {list(x.shape)} has {c_in}")
    (sh, sw), (ph, pw) = _pair(stride, "stride"), _pair(padding, "padding")
    h_out, w_out = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    if h_out < 1 or w_out < 1 or sh < 1 or sw < 1 or ph < 0 or pw < 0:
        raise nki.KernelError(f"conv2d_kernel: a {kh}x{kw} filter with stride {(sh, sw)} and padding {(ph, pw)} "
                              f"gives no output from a {h}x{wd} input")
    out_dtype = dtype if dtype is not None else x.dtype
    batch = x.shape[0] if batched else 1
    out = nl.ndarray(((batch,) if batched else ()) + (c_out, h_out, w_out), out_dtype, buffer=nl.shared_hbm)
    geo = _Geometry(h, wd, kh, kw, sh, sw, ph, pw, h_out, w_out, c_in, x.dtype.itemsize)
    ci_tiles = [(c0, min(TILE_P, c_in - c0)) for c0 in range(0, c_in, TILE_P)]
    co_tiles = [(c0, min(TILE_P, c_out - c0)) for c0 in range(0, c_out, TILE_P)]
    w_t = _transposed_weights(w, ci_tiles, co_tiles)
    evacuations = 0
    for b in nl.affine_range(batch):
        image, result = (x[b], out[b]) if batched else (x, out)
        for o0 in nl.affine_range(0, h_out, geo.band_rows):
            o1 = min(h_out, o0 + geo.band_rows)
            phases = [_load_phases(image[c0:c0 + ct], geo, o0, o1) for c0, ct in ci_tiles]
            for co0, cm in co_tiles:
                band = nl.ndarray((cm, o1 - o0, w_out), out_dtype)
                for r0, rows, col0, cols in geo.pieces(o0, o1):
                    pitch = geo.pitch if rows > 1 else cols
                    acc_tile = nl.ndarray((cm, rows * pitch), nl.float32, buffer=nl.psum)
                    length = (rows - 1) * pitch + cols
                    acc = acc_tile[:, 0:length]
                    for t, tile_phases in enumerate(phases):
                        for r in range(kh):
                            for s in range(kw):
                                flat = tile_phases[(r % sh, s % sw)]
                                start = (r0 - o0 + r // sh) * geo.pitch + col0 + s // sw
                                acc += nl.matmul(w_t[t][:, r * kw + s, co0:co0 + cm], flat[:, start:start + length],
                                                 transpose_x=True)
                    valid = acc_tile.reshape((cm, rows, pitch))[:, :, 0:cols]
                    nisa.tensor_copy(dst=band[:, r0 - o0:r0 - o0 + rows, col0:col0 + cols], src=valid,
                                     engine=ENGINES[evacuations % 2])
                    evacuations += 1
                nl.store(result[co0:co0 + cm, o0:o1, :], value=band)
    return out


class _Geometry:
    """Where the phases, bands and matmul pieces of one convolution lie."""

    def __init__(self, h, wd, kh, kw, sh, sw, ph, pw, h_out, w_out, c_in, itemsize):
        self.h, self.wd, self.kh, self.kw, self.sh, self.sw, self.ph, self.pw = h, wd, kh, kw, sh, sw, ph, pw
        self.h_out, self.w_out = h_out, w_out
        # every phase row is `pitch` elements: the padded width split sw ways
        self.pitch = -(-(wd + 2 * pw) // sw)
        self.extra_rows = (kh - 1) // sh
        self.phases = sorted({(r % sh, s % sw) for r in range(kh) for s in range(kw)})
        # input rows go straight into place when they are the phase rows as they are
        self.direct = (sh, sw, pw) == (1, 1, 0)
        # whole output rows per matmul while they fit in a bank, else pieces of one row
        self.rows_per_piece = max(1, PSUM_FMAX // self.pitch) if self.pitch <= PSUM_FMAX else 1
        tiles = -(-c_in // TILE_P)
        per_row = tiles * itemsize * (len(self.phases) * self.pitch + (0 if self.direct else sh * wd))
        fit = max(1, BAND_BYTES // per_row - self.extra_rows)
        self.band_rows = min(h_out, max(self.rows_per_piece, fit // self.rows_per_piece * self.rows_per_piece))

    def pieces(self, o0, o1):
        """(first output row, rows, first column, columns) of each matmul in band [o0, o1)."""
        if self.pitch <= PSUM_FMAX:
            return [(r, min(self.rows_per_piece, o1 - r), 0, self.w_out) for r in range(o0, o1, self.rows_per_piece)]
        return [(r, 1, c, min(PSUM_FMAX, self.w_out - c)) for r in range(o0, o1) for c in range(0, self.w_out, PSUM_FMAX)]

    def phase_rows(self, o0, o1):
        return o1 - o0 + self.extra_rows

    def valid(self, first, offset, count, stride, pad, size):
        """Of ``count`` phase positions ``first``.. at ``offset`` with ``stride``, the
        [lo, hi) whose padded-input index ``offset + stride * i - pad`` falls inside
        0..size-1, with that index for ``lo``."""
        lo = max(0, -(-(pad - offset) // stride) - first)
        hi = min(count, (size - 1 + pad - offset) // stride - first + 1)
        return lo, max(lo, hi), offset + stride * (first + lo) - pad


def _load_phases(image, geo, o0, o1):
    """The phases of the padded input rows band [o0, o1) needs, for one channel tile:
    {(a, b): [channels, rows * pitch] SBUF tile} (zeros where the padding is).

    Without a stride or column padding, the input rows are loaded straight into
    place (one run per partition). Otherwise they are loaded as they lie and GpSimd
    (idle otherwise, so it never waits behind the PSUM copies) zeroes each phase and
    copies its rows and columns in: loading rows narrower than the pitch directly
    would cut the DMA into descriptors of one row each."""
    ct = image.shape[0]
    rows = geo.phase_rows(o0, o1)
    phases = {}
    if not geo.direct:
        first = o0 * geo.sh - geo.ph
        x0, x1 = max(0, first), min(geo.h, first + rows * geo.sh)
        source = nl.load(image[:, x0:x1, :])
    for a, b in geo.phases:
        tile = nl.ndarray((ct, rows, geo.pitch), image.dtype)
        r_lo, r_hi, x_row = geo.valid(o0, a, rows, geo.sh, geo.ph, geo.h)
        c_lo, c_hi, x_col = geo.valid(0, b, geo.pitch, geo.sw, geo.pw, geo.wd)
        if (r_lo, r_hi, c_lo, c_hi) != (0, rows, 0, geo.pitch):
            nisa.memset(tile, value=0.0, engine=nisa.gpsimd_engine)
        if r_hi > r_lo and c_hi > c_lo:
            dst = tile[:, r_lo:r_hi, c_lo:c_hi]
            if geo.direct:
                nisa.dma_copy(dst=dst, src=image[:, x_row:x_row + r_hi - r_lo, :])
            else:
                y0 = x_row - x0
                src = source[:, y0:y0 + (r_hi - r_lo - 1) * geo.sh + 1:geo.sh,
                             x_col:x_col + (c_hi - c_lo - 1) * geo.sw + 1:geo.sw]
                nisa.tensor_copy(dst=dst, src=src, engine=nisa.gpsimd_engine)
        phases[(a, b)] = tile.reshape((ct, rows * geo.pitch))
    return phases


def _transposed_weights(w, ci_tiles, co_tiles):
    """``w`` [C_out, C_in, kh, kw] as one SBUF tile [C_in tile, taps, C_out] per input
    channel tile: rows of ``w`` loaded as they lie, each [C_out tile, C_in tile] tap
    transposed through the PE array into PSUM (as many taps per bank as fit) and
    copied out."""
    c_out, c_in, kh, kw = w.shape
    taps = kh * kw
    rows = w.reshape((c_out, c_in * taps))
    out = []
    for ci0, ct in ci_tiles:
        w_t = nl.ndarray((ct, taps, c_out), w.dtype)
        for co0, cm in co_tiles:
            block = nl.load(rows[co0:co0 + cm, ci0 * taps:(ci0 + ct) * taps])
            per_bank = max(1, PSUM_BANK_BYTES // (cm * w.dtype.itemsize))
            for t0 in range(0, taps, per_bank):
                t1 = min(taps, t0 + per_bank)
                staged = nl.ndarray((ct, (t1 - t0) * cm), w.dtype, buffer=nl.psum)
                for t in range(t0, t1):
                    nisa.nc_transpose(dst=staged[:, (t - t0) * cm:(t - t0 + 1) * cm], data=block[:, t::taps])
                nisa.tensor_copy(dst=w_t[:, t0:t1, co0:co0 + cm], src=staged)
        out.append(w_t)
    return out
