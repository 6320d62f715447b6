"""Row normalisations: RMSNorm and LayerNorm over the last axis.

Both take ``x`` [N, D] 128 rows (one per partition) at a time, masking the last tile
of rows when N is not a multiple of 128. The per-feature weights [D] are loaded once
as a [1, D] row and broadcast to all 128 partitions, then reused by every row tile.

- ``rmsnorm_kernel``: ``x / sqrt(mean(x^2) + eps) * weight``; the sum of squares comes
  from one scalar-engine activation with a fused row sum.
- ``layernorm_kernel``: ``(x - mean) / sqrt(var + eps) * gamma + beta``; mean and
  (population) variance come from ``nisa.bn_stats`` on chunks of at most 512 columns,
  combined by ``nisa.bn_aggr``.
- ``groupnorm_kernel``: torch's ``group_norm`` over [N, C, H, W], channels on
  partitions; the statistics of channels that share a group are brought together
  (and back) by two small matmuls with a channel-to-group membership matrix.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

TILE_P = 128          # nl.tile_size.pmax
BN_STATS_FMAX = 512   # the most columns one bn_stats instruction takes
BN_STATS_DIM = 6      # values per partition of one bn_stats result
GN_FREE_MAX = 4096    # group norm: columns per block, 16 KiB per partition in fp32
GN_KEEP_BYTES = 64 * 1024  # per partition: an image up to this size stays in SBUF between the passes


def _broadcast_row(v):
    """Load the HBM vector ``v`` [D] once as [1, D] and copy it to all 128 partitions."""
    row = nl.load(v.reshape((1, v.shape[0])))
    return nl.broadcast_to(row, (TILE_P, v.shape[0]))


@nki.jit
def rmsnorm_kernel(x, weight, eps=1e-6):
    """RMSNorm along the last axis of ``x``.

    Args:
        x: [N, D] in HBM, any chip float dtype; rows on partitions.
        weight: [D] in HBM, any chip float dtype.
        eps: added to the mean square before the square root.

    Returns:
        [N, D] in HBM, of ``x``'s dtype.

    Memories: ``weight`` is loaded once into SBUF and broadcast to a [128, D] SBUF tile;
    each [128, D] row tile of ``x`` is loaded into SBUF, squared and summed on the scalar
    engine (fp32), scaled by ``1 / sqrt(mean + eps)`` and by the weights on the vector
    engine, and stored back to HBM. PSUM is not used.
    """
    N, D = x.shape
    out = nl.ndarray((N, D), x.dtype, buffer=nl.shared_hbm)
    w = _broadcast_row(weight)
    i_p = nl.arange(TILE_P)[:, None]
    i_f = nl.arange(D)[None, :]
    for t in nl.affine_range((N + TILE_P - 1) // TILE_P):
        rows = t * TILE_P + i_p
        x_tile = nl.load(x[rows, i_f], mask=(rows < N))
        sum_sq = nl.ndarray((TILE_P, 1), nl.float32)
        nisa.activation(op=nl.square, data=x_tile, reduce_op=nl.add, reduce_res=sum_sq, dtype=nl.float32)
        mean_eps = nisa.tensor_scalar(data=sum_sq, op0=nl.multiply, operand0=1.0 / D, op1=nl.add, operand1=float(eps))
        rstd = nl.rsqrt(mean_eps)
        normed = nl.multiply(x_tile, rstd, dtype=nl.float32)
        y = nl.multiply(normed, w, dtype=x.dtype)
        nl.store(out[rows, i_f], value=y, mask=(rows < N))
    return out


@nki.jit
def layernorm_kernel(x, gamma, beta, eps=1e-5):
    """LayerNorm along the last axis of ``x`` (population variance, as torch's).

    Args:
        x: [N, D] in HBM, any chip float dtype; rows on partitions.
        gamma: [D] in HBM, the scale, any chip float dtype.
        beta: [D] in HBM, the shift, any chip float dtype.
        eps: added to the variance before the square root.

    Returns:
        [N, D] in HBM, of ``x``'s dtype.

    Memories: ``gamma`` and ``beta`` are loaded once into SBUF and broadcast to
    [128, D] SBUF tiles; each [128, D] row tile of ``x`` is loaded into SBUF, its
    statistics gathered by ``bn_stats``/``bn_aggr`` into fp32 SBUF tiles, and
    ``(x - mean) * rstd`` (one vector instruction), ``* gamma`` and ``+ beta`` computed
    on the vector engine before the store back to HBM. PSUM is not used.
    """
    N, D = x.shape
    out = nl.ndarray((N, D), x.dtype, buffer=nl.shared_hbm)
    g = _broadcast_row(gamma)
    b = _broadcast_row(beta)
    chunks = (D + BN_STATS_FMAX - 1) // BN_STATS_FMAX
    i_p = nl.arange(TILE_P)[:, None]
    i_f = nl.arange(D)[None, :]
    for t in nl.affine_range((N + TILE_P - 1) // TILE_P):
        rows = t * TILE_P + i_p
        x_tile = nl.load(x[rows, i_f], mask=(rows < N))
        stats = nl.ndarray((TILE_P, BN_STATS_DIM * chunks), nl.float32)
        for c in nl.affine_range(chunks):
            cols = slice(c * BN_STATS_FMAX, min((c + 1) * BN_STATS_FMAX, D))
            nisa.bn_stats(dst=stats[:, c * BN_STATS_DIM:(c + 1) * BN_STATS_DIM], data=x_tile[:, cols])
        mean_var = nisa.bn_aggr(data=stats)
        var_eps = nl.add(mean_var[:, 1:2], float(eps))
        rstd = nl.rsqrt(var_eps)
        normed = nisa.tensor_scalar(data=x_tile, op0=nl.subtract, operand0=mean_var[:, 0:1], op1=nl.multiply,
                                    operand1=rstd, dtype=nl.float32)
        scaled = nl.multiply(normed, g, dtype=nl.float32)
        y = nl.add(scaled, b, dtype=x.dtype)
        nl.store(out[rows, i_f], value=y, mask=(rows < N))
    return out


def _membership(c0, channels, per_group, groups, value, transposed):
    """Which group each of the channels c0.. belongs to: [channels, groups] holding
    ``value`` where channel c0 + c is in group g and 0 elsewhere, or [groups, channels]
    when ``transposed`` (a memset and two GpSimd affine selects)."""
    shape = (groups, channels) if transposed else (channels, groups)
    i_p = nl.arange(shape[0])[:, None]
    i_f = nl.arange(shape[1])[None, :]
    channel, group = (c0 + i_f, i_p) if transposed else (c0 + i_p, i_f)
    fill = nl.full(shape, value, nl.float32)
    above = nisa.affine_select(pred=(channel - group * per_group >= 0), on_true_tile=fill, on_false_value=0.0)
    return nisa.affine_select(pred=(group * per_group + (per_group - 1) - channel >= 0), on_true_tile=above,
                              on_false_value=0.0)


@nki.jit
def groupnorm_kernel(x, gamma, beta, groups, eps=1e-5):
    """Group normalisation as torch's ``group_norm``: the C channels form ``groups``
    groups of C / groups consecutive channels; each (image, group) is normalised over
    its channels and positions (population variance), then each channel is scaled by
    ``gamma`` and shifted by ``beta``.

    Args:
        x: [N, C, *spatial] in HBM (NCHW, [N, C, L] or [N, C]), any chip float dtype;
            any sizes.
        gamma: [C] in HBM, any chip float dtype, or None (no scale).
        beta: [C] in HBM, any chip float dtype, or None (no shift).
        groups: divides C; at most 128.
        eps: added to the variance before the square root.

    Returns:
        ``x``'s shape and dtype in HBM.

    Memories: each image is read as [C, H*W], channels on partitions (128 at a time,
    the last tile as many as are left), in blocks of at most 4096 positions. Per
    block the vector engine sums the values and the scalar engine their squares
    (fp32 SBUF). The per-channel means of x and x^2 [C, 2] go through the PE array
    twice: against a [C, groups] membership matrix (entries 1 / channels per group,
    accumulated in PSUM over channel tiles) to give each group's, and against its
    transpose to hand them back to every channel. The per-channel scale and shift
    ([P, 1] fp32 tiles) are applied to every block, alternately on the scalar and
    vector engines, and stored. An image of at most 64 KiB per partition stays in
    SBUF between the passes; a larger one is loaded again.
    """
    n_img, channels = x.shape[0], x.shape[1]
    if channels % groups or not 1 <= groups <= TILE_P:
        raise nki.KernelError(f"groupnorm_kernel: groups={groups} must divide C={channels} and be at most {TILE_P}")
    per_group = channels // groups
    hw = math.prod(x.shape[2:])
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    x3, out3 = x.reshape((n_img, channels, hw)), out.reshape((n_img, channels, hw))
    tiles = [(c0, min(TILE_P, channels - c0)) for c0 in range(0, channels, TILE_P)]
    to_group = [_membership(c0, ct, per_group, groups, 1.0 / per_group, False) for c0, ct in tiles]
    from_group = [_membership(c0, ct, per_group, groups, 1.0, True) for c0, ct in tiles]
    scales = [nl.load(gamma.reshape((channels, 1))[c0:c0 + ct, :]) if gamma is not None else None for c0, ct in tiles]
    shifts = [nl.load(beta.reshape((channels, 1))[c0:c0 + ct, :]) if beta is not None else None for c0, ct in tiles]
    starts = list(range(0, hw, GN_FREE_MAX))
    keep = len(tiles) * hw * x.dtype.itemsize <= GN_KEEP_BYTES
    for n in nl.affine_range(n_img):
        group_moments = nl.zeros((groups, 2), nl.float32, buffer=nl.psum)
        kept = []
        for t, (c0, ct) in enumerate(tiles):
            partials = nl.ndarray((ct, 2, len(starts)), nl.float32)
            blocks = []
            for i, s0 in enumerate(starts):
                block = nl.load(x3[n, c0:c0 + ct, s0:min(s0 + GN_FREE_MAX, hw)])
                nisa.tensor_reduce(dst=partials[:, 0, i:i + 1], op=nl.add, data=block, axis=1)
                nisa.activation(op=nl.square, data=block, reduce_op=nl.add, reduce_res=partials[:, 1, i:i + 1],
                                dtype=nl.float32)
                blocks.append(block if keep else None)
            kept.append(blocks)
            moments = nisa.tensor_scalar(nisa.tensor_reduce(op=nl.add, data=partials, axis=2, dtype=nl.float32),
                                         op0=nl.multiply, operand0=1.0 / hw)
            group_moments += nl.matmul(to_group[t], moments, transpose_x=True)
        group_moments = nl.copy(group_moments, dtype=nl.float32)
        for t, (c0, ct) in enumerate(tiles):
            moments = nisa.nc_matmul(from_group[t], group_moments)
            mean = moments[:, 0:1]
            var = nisa.tensor_tensor(moments[:, 1:2], nisa.tensor_tensor(mean, mean, op=nl.multiply), op=nl.subtract)
            rstd = nl.rsqrt(nisa.tensor_scalar(var, op0=nl.maximum, operand0=0.0, op1=nl.add, operand1=float(eps)))
            scale = rstd if scales[t] is None else nisa.tensor_tensor(rstd, scales[t], op=nl.multiply, dtype=nl.float32)
            neg_shift = nisa.tensor_tensor(mean, scale, op=nl.multiply, dtype=nl.float32)
            shift = (nl.multiply(neg_shift, -1.0) if shifts[t] is None else
                     nisa.tensor_tensor(shifts[t], neg_shift, op=nl.subtract, dtype=nl.float32))
            for i, s0 in enumerate(starts):
                cols = slice(s0, min(s0 + GN_FREE_MAX, hw))
                block = kept[t][i] if keep else nl.load(x3[n, c0:c0 + ct, cols])
                if i % 2:
                    y = nisa.tensor_scalar(block, op0=nl.multiply, operand0=scale, op1=nl.add, operand1=shift,
                                           dtype=x.dtype)
                else:
                    y = nisa.activation(op="identity", data=block, scale=scale, bias=shift, dtype=x.dtype)
                nl.store(out3[n, c0:c0 + ct, cols], value=y)
    return out


BN_FREE_MAX = 4096   # batch norm: values per partition per block, 16 KiB in fp32


class BatchNormLayout:
    """Where batch norm puts the values of [N, C, *spatial] (NCHW, contiguous) on the
    partitions, for the forward and backward kernels alike.

    With at most 64 channels, each channel takes ``split`` partitions (the largest
    divisor of H * W with ``C * split <= 128``): partition ``p`` holds columns
    ``(p % split) * cols ..`` of channel ``p // split`` of every image, so the whole
    tensor is read with all of the partitions busy. With more channels, tiles of 128
    channels take one partition each (``split`` 1). Either way partition ``p`` of a
    tile starts ``p * cols`` elements after the tile's first channel, so one DMA access
    pattern ([partition, image, column]) reads a block of several images.

    ``tiles`` are (first channel, channels); ``blocks`` (first image, end image, first
    column, end column), at most :data:`BN_FREE_MAX` values per partition each.
    """

    def __init__(self, shape):
        if len(shape) < 2:
            raise nki.KernelError(f"batch norm takes [N, C, *spatial], got {list(shape)}; add the batch axis")
        self.images, self.channels = shape[0], shape[1]
        self.spatial = math.prod(shape[2:])
        self.split = 1
        if 2 * self.channels <= TILE_P:
            self.split = max(d for d in range(1, TILE_P // self.channels + 1) if self.spatial % d == 0)
        self.cols = self.spatial // self.split
        if self.split > 1:
            self.tiles = [(0, self.channels)]
        else:
            self.tiles = [(c0, min(TILE_P, self.channels - c0)) for c0 in range(0, self.channels, TILE_P)]
        if self.cols >= BN_FREE_MAX:
            self.blocks = [(i, i + 1, l0, min(l0 + BN_FREE_MAX, self.cols))
                           for i in range(self.images) for l0 in range(0, self.cols, BN_FREE_MAX)]
        else:
            per = BN_FREE_MAX // self.cols
            self.blocks = [(i, min(self.images, i + per), 0, self.cols) for i in range(0, self.images, per)]
        self._to_channel = {}
        self._from_channel = None

    @property
    def count(self):
        """Values per channel: N * H * W."""
        return self.images * self.spatial

    def partitions(self, tile):
        return tile[1] * self.split

    def view(self, t, tile, block):
        """The HBM view of ``t`` (shaped like the input) that ``block`` of ``tile`` reads
        or writes: [partitions, images, columns]."""
        (c0, cn), (n0, n1, l0, l1) = tile, block
        plane = self.channels * self.spatial
        return t.ap([[self.cols, cn * self.split], [plane, n1 - n0], [1, l1 - l0]],
                    offset=n0 * plane + c0 * self.spatial + l0)

    def vector(self, v, tile):
        """The [C] HBM vector ``v``'s entries for ``tile``: [channels, 1]."""
        c0, cn = tile
        return v.reshape((self.channels, 1))[c0:c0 + cn, :]

    def per_channel(self, moments, tile, scale):
        """[partitions, m] fp32 per-partition sums -> [channels, m]: each channel's sum
        over its partitions (a matmul against a membership matrix, in PSUM) times ``scale``."""
        if self.split == 1:
            return nisa.tensor_scalar(moments, op0=nl.multiply, operand0=float(scale), dtype=nl.float32)
        if scale not in self._to_channel:
            self._to_channel[scale] = _membership(0, self.partitions(tile), self.split, tile[1], float(scale), False)
        return nl.copy(nl.matmul(self._to_channel[scale], moments, transpose_x=True), dtype=nl.float32)

    def to_partitions(self, values, tile):
        """[channels, m] fp32 -> [partitions, m]: each partition gets its channel's row
        (a matmul against the transposed membership matrix)."""
        if self.split == 1:
            return values
        if self._from_channel is None:
            self._from_channel = _membership(0, self.partitions(tile), self.split, tile[1], 1.0, True)
        return nl.copy(nisa.nc_matmul(self._from_channel, values), dtype=nl.float32)

    def keeps(self, itemsize, tensors=1):
        """Whether ``tensors`` inputs of every tile stay in SBUF between two passes."""
        return tensors * len(self.tiles) * self.images * self.cols * itemsize <= GN_KEEP_BYTES


def _column_pair(first, second):
    """Two [P, 1] fp32 tiles side by side in one [P, 2] tile."""
    pair = nl.ndarray((first.shape[0], 2), nl.float32)
    nisa.tensor_copy(dst=pair[:, 0:1], src=first)
    nisa.tensor_copy(dst=pair[:, 1:2], src=second)
    return pair


@nki.jit
def batchnorm_kernel(x, gamma=None, beta=None, running_mean=None, running_var=None, training=True, momentum=0.1,
                     eps=1e-5, relu=False):
    """Batch normalisation as torch's ``batch_norm``, optionally with ReLU after it:
    ``y = (x - mean) * invstd * gamma + beta`` per channel, where in training mean and
    (population) variance are the channel's over the batch and spatial axes, and in
    eval the running statistics.

    Args:
        x: [N, C, *spatial] in HBM (NCHW, [N, C, L] or [N, C]), any chip float dtype;
            any sizes.
        gamma, beta: [C] in HBM, any chip float dtype, or None (no scale, no shift).
        running_mean, running_var: [C] in HBM, any chip float dtype; needed in eval;
            in training optional, and updated when given (torch's rule: the unbiased
            variance, weight ``momentum`` on the batch's statistics).
        training: batch statistics (True) or running ones (False).
        momentum, eps: as torch's.
        relu: apply ReLU to the result in the same instruction.

    Returns:
        Training: ``(y, save_mean, save_invstd)``, plus the updated running mean and
        variance ([C], their dtype) when they were given; the statistics [C] fp32.
        Eval: ``y``. ``y`` has ``x``'s shape and dtype, in HBM.

    Memories: ``x`` is read in blocks of at most 4096 values per partition laid out by
    :class:`BatchNormLayout` (channels on partitions, a channel over several partitions
    when C <= 64), one DMA per block of several images. In training, per block the
    vector engine sums the values and the scalar engine their squares (fp32 SBUF
    partials); the per-partition sums go through the PE array against a membership
    matrix to give each channel's mean and mean square ([C, 2] fp32 via PSUM), from
    which the vector engine makes the statistics and the per-channel scale and shift;
    a second matmul hands those back to every partition of the channel. The blocks
    (kept in SBUF when the input takes at most 64 KiB per partition, else loaded
    again) are scaled and shifted, alternately on the scalar and vector engines (all
    on the scalar engine with ReLU), and stored.
    """
    lay = BatchNormLayout(x.shape)
    f32 = nl.float32
    if not training and (running_mean is None or running_var is None):
        raise nki.KernelError("batchnorm_kernel: eval (training=False) normalises with the running statistics; "
                              "pass running_mean and running_var")
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    c = lay.channels
    update = training and running_mean is not None and running_var is not None
    if training:
        save_mean = nl.ndarray((c,), f32, buffer=nl.shared_hbm)
        save_invstd = nl.ndarray((c,), f32, buffer=nl.shared_hbm)
    if update:
        new_mean = nl.ndarray((c,), running_mean.dtype, buffer=nl.shared_hbm)
        new_var = nl.ndarray((c,), running_var.dtype, buffer=nl.shared_hbm)
    keep = training and lay.keeps(x.dtype.itemsize)
    for tile in lay.tiles:
        p = lay.partitions(tile)
        kept = []
        if training:
            partials = nl.ndarray((p, 2, len(lay.blocks)), f32)
            for i, block in enumerate(lay.blocks):
                data = nl.load(lay.view(x, tile, block))
                flat = data.reshape((p, data.shape[1] * data.shape[2]))
                nisa.tensor_reduce(dst=partials[:, 0, i:i + 1], op=nl.add, data=flat, axis=1)
                nisa.activation(op=nl.square, data=flat, reduce_op=nl.add, reduce_res=partials[:, 1, i:i + 1],
                                dtype=f32)
                kept.append(data if keep else None)
            moments = nisa.tensor_reduce(op=nl.add, data=partials, axis=2, dtype=f32)
            stats = lay.per_channel(moments, tile, 1.0 / lay.count)
            mean = stats[:, 0:1]
            var = nisa.tensor_scalar(nisa.tensor_tensor(stats[:, 1:2], nisa.tensor_tensor(mean, mean, op=nl.multiply),
                                                        op=nl.subtract), op0=nl.maximum, operand0=0.0)
            invstd = nl.rsqrt(nisa.tensor_scalar(var, op0=nl.add, operand0=float(eps)))
            nl.store(lay.vector(save_mean, tile), value=mean)
            nl.store(lay.vector(save_invstd, tile), value=invstd)
            if update:
                unbiased = lay.count / max(lay.count - 1, 1)
                for old, batch, new, factor in ((running_mean, mean, new_mean, 1.0),
                                                (running_var, var, new_var, unbiased)):
                    kept_part = nisa.tensor_scalar(nl.load(lay.vector(old, tile)), op0=nl.multiply,
                                                   operand0=1.0 - momentum, dtype=f32)
                    moved = nisa.scalar_tensor_tensor(data=batch, op0=nl.multiply, operand0=momentum * factor,
                                                      op1=nl.add, operand1=kept_part, dtype=new.dtype)
                    nl.store(lay.vector(new, tile), value=moved)
        else:
            mean = nl.load(lay.vector(running_mean, tile), dtype=f32)
            invstd = nl.rsqrt(nisa.tensor_scalar(nl.load(lay.vector(running_var, tile)), op0=nl.add,
                                                 operand0=float(eps), dtype=f32))
        scale = invstd if gamma is None else \
            nisa.tensor_tensor(invstd, nl.load(lay.vector(gamma, tile)), op=nl.multiply, dtype=f32)
        neg_shift = nisa.tensor_tensor(mean, scale, op=nl.multiply, dtype=f32)
        shift = (nl.multiply(neg_shift, -1.0) if beta is None else
                 nisa.tensor_tensor(nl.load(lay.vector(beta, tile)), neg_shift, op=nl.subtract, dtype=f32))
        coeffs = lay.to_partitions(_column_pair(scale, shift), tile)
        for i, block in enumerate(lay.blocks):
            data = kept[i] if keep else nl.load(lay.view(x, tile, block))
            if i % 2 and not relu:
                y = nisa.tensor_scalar(data, op0=nl.multiply, operand0=coeffs[:, 0:1], op1=nl.add,
                                       operand1=coeffs[:, 1:2], dtype=x.dtype)
            else:
                y = nisa.activation(op=nl.relu if relu else "identity", data=data, scale=coeffs[:, 0:1],
                                    bias=coeffs[:, 1:2], dtype=x.dtype)
            nl.store(lay.view(out, tile, block), value=y)
    if not training:
        return out
    return (out, save_mean, save_invstd, new_mean, new_var) if update else (out, save_mean, save_invstd)
