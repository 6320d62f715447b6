"""Backward kernels of activations, softmax and LayerNorm: what a training step's
backward pass runs on the vector and scalar engines.

- ``activation_backward_kernel``: the gradient through an elementwise activation,
  ``grad * f'(saved)``, laid out flat like the forward ``unary_kernel``: ReLU
  (``threshold_backward``), GELU (erf and tanh forms), SiLU from the input, sigmoid
  and tanh from the output. GELU (erf) and SiLU use the scalar engine's derivative
  functions (NKI's ``nl.gelu_dx``, ``nl.silu_dx``); the others are a few vector and
  scalar instructions.
- ``softmax_backward_kernel``: ``y * (g - sum(g * y))`` (softmax) or
  ``g - exp(y) * sum(g)`` (log-softmax, ``y`` its output) along the last axis, rows on
  partitions, any row length (blocks as in ``log_softmax_kernel``).
- ``layernorm_backward_kernel``: torch's ``native_layer_norm_backward`` from the saved
  mean and reciprocal standard deviation: the input gradient row by row, and the
  gamma and beta gradients as column sums over all rows, reduced across partitions on
  the PE array (a matmul against a ones vector accumulating in PSUM).
- ``batchnorm_backward_kernel``: torch's ``native_batch_norm_backward`` over
  [N, C, *spatial] in the forward's layout (:class:`trnsim.kernels.norms.BatchNormLayout`),
  optionally through the ReLU that followed the forward.
- ``groupnorm_backward_kernel``: torch's ``native_group_norm_backward``, channels on
  partitions as in ``groupnorm_kernel``.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.kernels.elementwise import flat_views
from trnsim.kernels.norms import GN_FREE_MAX, GN_KEEP_BYTES, BatchNormLayout, _membership
from trnsim.kernels.reduce import FREE_MAX, KEEP_BYTES

TILE_P = 128            # nl.tile_size.pmax
BWD_FREE_MAX = 1024     # columns per activation-backward block: several blocks overlap load and compute
MATMUL_N = 512          # moving free size of one matmul: one PSUM bank of fp32
PSUM_BANKS = 8          # [1, 512] fp32 accumulators PSUM holds per partition
GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715

ACTIVATIONS = ("threshold", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")


def _gelu_tanh_dx(x):
    """d/dx of ``0.5 x (1 + tanh(k (x + a x^3)))``:
    ``0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2)``, t the tanh (fp32 tiles)."""
    f32 = nl.float32
    sq = nisa.activation(op=nl.square, data=x, dtype=f32)
    inner = nisa.tensor_scalar(sq, op0=nl.multiply, operand0=GELU_TANH_CUBIC, op1=nl.add, operand1=1.0, dtype=f32)
    t = nisa.activation(op=nl.tanh, data=nisa.tensor_tensor(x, inner, op=nl.multiply, dtype=f32),
                        scale=GELU_TANH_SCALE, dtype=f32)
    sech2 = nisa.tensor_scalar(nisa.activation(op=nl.square, data=t, dtype=f32), op0=nl.multiply, operand0=-0.5,
                               op1=nl.add, operand1=0.5, dtype=f32)
    slope = nisa.tensor_scalar(sq, op0=nl.multiply, operand0=3.0 * GELU_TANH_CUBIC * GELU_TANH_SCALE, op1=nl.add,
                               operand1=GELU_TANH_SCALE, dtype=f32)
    right = nisa.tensor_tensor(nisa.tensor_tensor(x, sech2, op=nl.multiply, dtype=f32), slope, op=nl.multiply,
                               dtype=f32)
    left = nisa.tensor_scalar(t, op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=0.5, dtype=f32,
                              engine=nisa.scalar_engine)
    return nisa.tensor_tensor(left, right, op=nl.add, dtype=f32)


def _derivative(op, s, threshold):
    """f'(saved) for one block, an fp32 SBUF tile."""
    f32 = nl.float32
    if op == "threshold":
        return nisa.tensor_scalar(s, op0=nl.greater, operand0=float(threshold), dtype=f32)
    if op == "gelu":
        return nisa.activation(op=nl.gelu_dx, data=s, dtype=f32)
    if op == "silu":
        return nisa.activation(op=nl.silu_dx, data=s, dtype=f32)
    if op == "gelu_tanh":
        return _gelu_tanh_dx(s)
    sq = nisa.activation(op=nl.square, data=s, dtype=f32)
    if op == "sigmoid":   # y (1 - y) = y - y^2
        return nisa.tensor_tensor(s, sq, op=nl.subtract, dtype=f32)
    return nisa.tensor_scalar(sq, op0=nl.subtract, operand0=1.0, reverse0=True, dtype=f32)   # tanh: 1 - y^2


@nki.jit
def activation_backward_kernel(grad, saved, op="gelu", threshold=0.0, dtype=None):
    """``grad * f'(...)`` elementwise for the activation ``op``:

    - ``threshold``: ``grad`` where ``saved > threshold``, else 0 (ReLU's backward,
      torch's ``threshold_backward``; ``saved`` is the input or the output);
    - ``gelu`` / ``gelu_tanh``: ``saved`` is the input; the erf form or the tanh
      approximation (torch's ``gelu_backward``, ``approximate="none"``/``"tanh"``);
    - ``silu``: ``saved`` is the input;
    - ``sigmoid``: ``saved`` is the output y, ``f' = y (1 - y)``;
    - ``tanh``: ``saved`` is the output y, ``f' = 1 - y^2``.

    Args:
        grad: any shape in HBM, any chip float dtype.
        saved: ``grad``'s element count in HBM, any chip float dtype.
        op: one of ``ACTIVATIONS``.
        threshold: for ``threshold`` only.
        dtype: of the result; ``grad``'s by default.

    Returns:
        ``grad``'s shape in HBM.

    Memories: both tensors are read flat as [128, <= 1024] blocks into SBUF. Per
    block the derivative is computed into fp32 SBUF tiles: one scalar-engine
    activation for GELU (``gelu_dx``) and SiLU (``silu_dx``), one vector comparison
    for ReLU, a square (scalar) and a vector instruction for sigmoid and tanh, eleven
    instructions over both engines for the tanh-form GELU. One vector multiply by
    ``grad`` writes the result tile, stored to HBM. PSUM is not used. A NaN in
    ``saved`` gives 0 for ``threshold`` (torch passes ``grad``).
    """
    if op not in ACTIVATIONS:
        raise nki.KernelError(f"activation_backward_kernel: op {op!r} is not one of {', '.join(ACTIVATIONS)}")
    if math.prod(grad.shape) != math.prod(saved.shape):
        raise nki.KernelError(f"activation_backward_kernel: grad {list(grad.shape)} and saved {list(saved.shape)} "
                              "differ in size; pass tensors of one shape")
    out = nl.ndarray(grad.shape, dtype if dtype is not None else grad.dtype, buffer=nl.shared_hbm)
    views = zip(flat_views(grad, BWD_FREE_MAX), flat_views(saved, BWD_FREE_MAX), flat_views(out, BWD_FREE_MAX))
    for g_v, s_v, dst in views:
        g = nl.load(g_v)
        d = _derivative(op, nl.load(s_v), threshold)
        nl.store(dst, value=nisa.tensor_tensor(g, d, op=nl.multiply, dtype=out.dtype))
    return out


@nki.jit
def softmax_backward_kernel(grad, y, log=False):
    """The gradient of softmax (``log=False``) or log-softmax (``log=True``) along the
    last axis, from the forward's output ``y``:

    - softmax: ``y * (grad - sum(grad * y))`` (torch's ``_softmax_backward_data``);
    - log-softmax: ``grad - exp(y) * sum(grad)`` (``_log_softmax_backward_data``).

    Args:
        grad: [..., D] in HBM (often [N, D]), any chip float dtype; rows on
            partitions, 128 at a time (the last tile as many as are left).
        y: ``grad``'s shape in HBM, any chip float dtype.
        log: which of the two.

    Returns:
        ``grad``'s shape and dtype in HBM.

    Memories: each row tile is loaded into SBUF in [<= 128, <= 4096] blocks (kept
    there when the row tile takes at most 64 KiB per partition per tensor, else
    loaded again). First pass, per block: for softmax ``grad * y`` (vector) summed by
    a scalar-engine identity activation; for log-softmax a vector row sum of ``grad``;
    the block sums [P, blocks] are reduced into fp32 [P, 1]. Second pass, per block:
    softmax ``grad - sum`` (scalar engine, the sum as bias) times ``y`` (vector);
    log-softmax ``exp(y)`` (scalar), times the sum and subtracted from ``grad``
    (vector). PSUM is not used.
    """
    if tuple(grad.shape) != tuple(y.shape):
        raise nki.KernelError(f"softmax_backward_kernel: grad {list(grad.shape)} and y {list(y.shape)} differ; "
                              "pass the forward's output")
    d = grad.shape[-1]
    rows = math.prod(grad.shape) // d
    g2, y2 = grad.reshape((rows, d)), y.reshape((rows, d))
    out = nl.ndarray(grad.shape, grad.dtype, buffer=nl.shared_hbm)
    out2 = out.reshape((rows, d))
    starts = list(range(0, d, FREE_MAX))
    keep = d * max(grad.dtype.itemsize, y.dtype.itemsize) <= KEEP_BYTES
    f32 = nl.float32
    for r0 in nl.affine_range(0, rows, TILE_P):
        p = min(TILE_P, rows - r0)
        sums = nl.ndarray((p, len(starts)), f32)
        kept = []
        for i, c0 in enumerate(starts):
            cols = slice(c0, min(c0 + FREE_MAX, d))
            g = nl.load(g2[r0:r0 + p, cols])
            yb = None if log else nl.load(y2[r0:r0 + p, cols])
            if log:
                nisa.tensor_reduce(dst=sums[:, i:i + 1], op=nl.add, data=g, axis=1)
            else:
                nisa.activation(op="identity", data=nisa.tensor_tensor(g, yb, op=nl.multiply, dtype=f32),
                                reduce_op=nl.add, reduce_res=sums[:, i:i + 1], dtype=f32)
            if keep:
                kept.append((g, yb))
        total = sums if len(starts) == 1 else nisa.tensor_reduce(op=nl.add, data=sums, axis=1, dtype=f32)
        neg_total = None if log else nisa.tensor_scalar(total, op0=nl.multiply, operand0=-1.0, dtype=f32)
        for i, c0 in enumerate(starts):
            cols = slice(c0, min(c0 + FREE_MAX, d))
            g, yb = kept[i] if keep else (nl.load(g2[r0:r0 + p, cols]), None)
            if yb is None:
                yb = nl.load(y2[r0:r0 + p, cols])
            if log:
                e = nisa.activation(op=nl.exp, data=yb, dtype=f32)
                scaled = nisa.tensor_scalar(e, op0=nl.multiply, operand0=total, dtype=f32)
                res = nisa.tensor_tensor(g, scaled, op=nl.subtract, dtype=out.dtype)
            else:
                centred = nisa.activation(op="identity", data=g, bias=neg_total, dtype=f32)
                res = nisa.tensor_tensor(centred, yb, op=nl.multiply, dtype=out.dtype)
            nl.store(out2[r0:r0 + p, cols], value=res)
    return out


class _ColumnSums:
    """Sums over all rows of [P, D] fp32 row tiles, one [1, D] result: each row tile is
    reduced across its partitions by matmuls against a ones column (the PE array adds
    over the contraction axis), 512 columns per matmul. The sums accumulate in PSUM over
    every row tile when the accumulators fit in PSUM's banks (``resident``); otherwise
    each row tile's sums are added into an fp32 SBUF row by the vector engine."""

    def __init__(self, d, resident):
        self.chunks = [(c0, min(MATMUL_N, d - c0)) for c0 in range(0, d, MATMUL_N)]
        self.resident = resident
        if resident:
            self.parts = [nl.zeros((1, n), nl.float32, buffer=nl.psum) for _, n in self.chunks]
        else:
            self.total = nl.zeros((1, d), nl.float32)

    def add(self, ones, tile):
        for i, (c0, n) in enumerate(self.chunks):
            if self.resident:
                self.parts[i] += nl.matmul(ones, tile[:, c0:c0 + n], transpose_x=True)
            else:
                part = nisa.nc_matmul(ones, tile[:, c0:c0 + n])
                nisa.tensor_tensor(dst=self.total[:, c0:c0 + n], data1=self.total[:, c0:c0 + n], data2=part,
                                   op=nl.add)

    def store(self, dst):
        row = dst.reshape((1, dst.shape[0]))
        if not self.resident:
            nl.store(row, value=nisa.tensor_copy(self.total, dtype=dst.dtype))
            return
        res = nl.ndarray((1, row.shape[1]), dst.dtype)
        for i, (c0, n) in enumerate(self.chunks):
            nisa.tensor_copy(dst=res[:, c0:c0 + n], src=self.parts[i])
        nl.store(row, value=res)


@nki.jit
def layernorm_backward_kernel(grad, x, mean, rstd, gamma=None, need_input=True, need_weight=True, need_bias=True):
    """torch's ``native_layer_norm_backward`` over the last axis, from the forward's
    saved statistics. With ``xhat = (x - mean) * rstd`` and ``gh = grad * gamma``:

        dx     = rstd * (gh - mean(gh) - xhat * mean(gh * xhat))   (means along the row)
        dgamma = sum over rows of grad * xhat
        dbeta  = sum over rows of grad

    Args:
        grad: [N, D] in HBM, any chip float dtype; rows on partitions, 128 at a time
            (the last tile as many as are left), D along the free axis of one tile
            (up to about 6000 in fp32: seven rows of fp32 tiles share SBUF).
        x: [N, D] in HBM, the forward's input, any chip float dtype.
        mean, rstd: [N] or [N, 1] in HBM, the forward's saved statistics (fp32 as
            torch saves them, or any chip float dtype).
        gamma: [D] in HBM, or None (no scale: ``gh = grad``, and no dgamma).
        need_input, need_weight, need_bias: which gradients to compute (torch's
            ``output_mask``).

    Returns:
        The asked-for gradients in the order dx, dgamma, dbeta (one HBM tensor each;
        a tuple when more than one): dx [N, D] of ``x``'s dtype, dgamma and dbeta [D]
        of ``gamma``'s dtype (``grad``'s without gamma).

    Memories: ``gamma`` is loaded once and broadcast to a [128, D] SBUF tile; each row
    tile of ``grad`` and ``x`` is loaded into SBUF with its [P, 1] statistics. The
    work is split between the engines as the chip's kernels split it: the scalar
    engine forms ``xhat`` (an identity activation with ``rstd`` as scale and
    ``-mean * rstd`` as bias), the row sums of ``gh`` and ``gh * xhat`` (identity
    activations with a fused sum, fp32), the shift ``-mean(gh) - xhat * mean(gh * xhat)``
    and the final scale by ``rstd``; the vector engine forms ``gh``, ``gh * xhat`` and
    ``gh + shift``. dx is stored to HBM. dgamma and dbeta are partition-axis sums: the vector engine
    forms ``grad * xhat`` (fp32), and the PE array multiplies a ones column [P, 1]
    (stationary) by each 512-column chunk (moving), accumulating [1, 512] fp32 in
    PSUM over all row tiles when the accumulators fit in its 8 banks per partition
    (D up to 2048 with both gradients, 4096 with one); beyond that each row tile's
    chunk goes through a fresh PSUM tile and is added into an fp32 SBUF row. At the
    end the sums are copied out of PSUM into the gradient's dtype and stored.
    """
    n, d = x.shape
    if tuple(grad.shape) != (n, d):
        raise nki.KernelError(f"layernorm_backward_kernel: grad {list(grad.shape)} differs from x {[n, d]}")
    need_weight = need_weight and gamma is not None
    f32 = nl.float32
    mean2, rstd2 = mean.reshape((n, 1)), rstd.reshape((n, 1))
    dx = nl.ndarray((n, d), x.dtype, buffer=nl.shared_hbm) if need_input else None
    col_dtype = gamma.dtype if gamma is not None else grad.dtype
    dgamma = nl.ndarray((d,), col_dtype, buffer=nl.shared_hbm) if need_weight else None
    dbeta = nl.ndarray((d,), col_dtype, buffer=nl.shared_hbm) if need_bias else None
    sums = [s for s in (dgamma, dbeta) if s is not None]
    resident = len(sums) * len(range(0, d, MATMUL_N)) <= PSUM_BANKS
    dgamma_sum = _ColumnSums(d, resident) if need_weight else None
    dbeta_sum = _ColumnSums(d, resident) if need_bias else None
    ones = nl.full((TILE_P, 1), 1.0, f32) if sums else None
    g_row = None
    if gamma is not None and need_input:
        g_row = nl.broadcast_to(nl.load(gamma.reshape((1, d))), (TILE_P, d))
    for r0 in nl.affine_range(0, n, TILE_P):
        p = min(TILE_P, n - r0)
        g = nl.load(grad[r0:r0 + p, :])
        xt = nl.load(x[r0:r0 + p, :])
        m = nl.load(mean2[r0:r0 + p, :])
        r = nl.load(rstd2[r0:r0 + p, :])
        neg_mean_rstd = nisa.tensor_tensor(m, r, op=nl.multiply, dtype=f32)
        xhat = nisa.activation(op="identity", data=xt, scale=r,
                               bias=nisa.tensor_scalar(neg_mean_rstd, op0=nl.multiply, operand0=-1.0), dtype=f32)
        if need_bias:
            dbeta_sum.add(ones[0:p, :], nisa.tensor_copy(g, dtype=f32) if g.dtype is not f32 else g)
        if need_weight:
            dgamma_sum.add(ones[0:p, :], nisa.tensor_tensor(g, xhat, op=nl.multiply, dtype=f32))
        if not need_input:
            continue
        gh = nisa.tensor_tensor(g, g_row[0:p, :], op=nl.multiply, dtype=f32) if g_row is not None else g
        del g, xt   # a long row takes a lot of SBUF: the tiles below are written in place
        row_sums = nl.ndarray((p, 2), f32)
        prod = nisa.activation(op="identity", data=gh, reduce_op=nl.add, reduce_res=row_sums[:, 0:1], dtype=f32)
        nisa.tensor_tensor(dst=prod, data1=gh, data2=xhat, op=nl.multiply)
        nisa.activation(dst=prod, op="identity", data=prod, reduce_op=nl.add, reduce_res=row_sums[:, 1:2])
        del prod
        neg_means = nisa.tensor_scalar(row_sums, op0=nl.multiply, operand0=-1.0 / d, dtype=f32)
        nisa.activation(dst=xhat, op="identity", data=xhat, scale=neg_means[:, 1:2], bias=neg_means[:, 0:1])
        centred = nisa.tensor_tensor(gh, xhat, op=nl.add, dtype=f32)
        nl.store(dx[r0:r0 + p, :], value=nisa.activation(op="identity", data=centred, scale=r, dtype=dx.dtype))
    if dgamma_sum is not None:
        dgamma_sum.store(dgamma)
    if dbeta_sum is not None:
        dbeta_sum.store(dbeta)
    results = tuple(t for t in (dx, dgamma, dbeta) if t is not None)
    return results if len(results) > 1 else results[0]


def _gradients(grad, x, gamma, need_input, need_weight, need_bias, channels):
    """The HBM results a norm backward asks for: (dx, dgamma, dbeta), None where not asked."""
    dx = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm) if need_input else None
    col_dtype = gamma.dtype if gamma is not None else grad.dtype
    dgamma = nl.ndarray((channels,), col_dtype, buffer=nl.shared_hbm) if need_weight and gamma is not None else None
    dbeta = nl.ndarray((channels,), col_dtype, buffer=nl.shared_hbm) if need_bias else None
    return dx, dgamma, dbeta


def _asked(dx, dgamma, dbeta):
    results = tuple(t for t in (dx, dgamma, dbeta) if t is not None)
    return results if len(results) > 1 else results[0]


@nki.jit
def batchnorm_backward_kernel(grad, x, gamma, mean, invstd, training=True, eps=1e-5, need_input=True,
                              need_weight=True, need_bias=True, relu_out=None):
    """torch's ``native_batch_norm_backward`` per channel over the batch and spatial
    axes. With ``xhat = (x - mean) * invstd``, M = N * H * W values per channel, and
    ``g`` the gradient (masked to where ``relu_out > 0`` when given: ReLU's backward
    in the same pass):

        dbeta  = sum(g),   dgamma = sum(g * xhat)
        dx     = gamma * invstd * (g - dbeta / M - xhat * dgamma / M)   (training)
        dx     = gamma * invstd * g                                     (eval)

    Args:
        grad: [N, C, *spatial] in HBM (NCHW), any chip float dtype; any sizes.
        x: the forward's input, ``grad``'s shape, any chip float dtype.
        gamma: [C] in HBM, or None (no scale: no dgamma).
        mean, invstd: [C] in HBM: in training the forward's saved mean and inverse
            standard deviation (fp32); in eval the running mean and the running
            *variance* (the kernel takes ``1 / sqrt(var + eps)``).
        training, eps: as the forward's.
        need_input, need_weight, need_bias: which gradients (torch's ``output_mask``).
        relu_out: the forward's ReLU output (``grad``'s shape), or None.

    Returns:
        The asked-for gradients in the order dx, dgamma, dbeta (a tuple when more than
        one): dx of ``x``'s shape and dtype, dgamma and dbeta [C] of ``gamma``'s dtype
        (``grad``'s without gamma), in HBM.

    Memories: ``grad``, ``x`` (and ``relu_out``) are read block by block in the
    forward's layout (SBUF, at most 4096 values per partition). First pass: the
    vector engine masks ``grad`` by the ReLU output (one instruction), sums it and
    forms ``g * x`` (fp32), which the scalar engine sums; the per-partition sums
    [P, 2] go through the PE array against a membership matrix (PSUM) to give each
    channel's. The vector engine turns them into dgamma, dbeta (stored) and three
    per-channel coefficients of ``dx = a * g + (b * x + c)``, handed back to every
    partition by a second matmul. Second pass: ``b * x + c`` on the scalar engine,
    ``a * g +`` it on the vector engine, stored. The blocks stay in SBUF between the
    passes when they take at most 64 KiB per partition, else they are loaded again.
    Eval needs no sums for dx: one pass of ``a * g``.
    """
    if tuple(grad.shape) != tuple(x.shape) or (relu_out is not None and tuple(relu_out.shape) != tuple(x.shape)):
        raise nki.KernelError(f"batchnorm_backward_kernel: grad {list(grad.shape)}, x {list(x.shape)}"
                              f"{'' if relu_out is None else f' and relu_out {list(relu_out.shape)}'} differ")
    lay = BatchNormLayout(x.shape)
    f32 = nl.float32
    dx, dgamma, dbeta = _gradients(grad, x, gamma, need_input, need_weight, need_bias, lay.channels)
    sums = dgamma is not None or dbeta is not None or (training and need_input)
    inputs = 2 if relu_out is None else 3
    keep = sums and need_input and lay.keeps(max(grad.dtype.itemsize, x.dtype.itemsize), inputs)

    def masked(block, tile):
        g = nl.load(lay.view(grad, tile, block))
        if relu_out is None:
            return g
        return nisa.scalar_tensor_tensor(data=nl.load(lay.view(relu_out, tile, block)), op0=nl.greater,
                                         operand0=0.0, op1=nl.multiply, operand1=g, dtype=f32)

    for tile in lay.tiles:
        p = lay.partitions(tile)
        m = nl.load(lay.vector(mean, tile), dtype=f32)
        istd = nl.load(lay.vector(invstd, tile), dtype=f32)
        if not training:
            istd = nl.rsqrt(nisa.tensor_scalar(istd, op0=nl.add, operand0=float(eps)))
        a = istd if gamma is None else \
            nisa.tensor_tensor(istd, nl.load(lay.vector(gamma, tile)), op=nl.multiply, dtype=f32)
        kept = []
        if sums:
            partials = nl.ndarray((p, 2, len(lay.blocks)), f32)
            for i, block in enumerate(lay.blocks):
                g = masked(block, tile)
                xb = nl.load(lay.view(x, tile, block))
                size = g.shape[1] * g.shape[2]
                nisa.tensor_reduce(dst=partials[:, 0, i:i + 1], op=nl.add, data=g.reshape((p, size)), axis=1)
                prod = nisa.tensor_tensor(g, xb, op=nl.multiply, dtype=f32)
                nisa.activation(dst=prod, op="identity", data=prod, reduce_op=nl.add,
                                reduce_res=partials[:, 1, i:i + 1])
                kept.append((g, xb) if keep else None)
            moments = nisa.tensor_reduce(op=nl.add, data=partials, axis=2, dtype=f32)
            chan = lay.per_channel(moments, tile, 1.0)   # [channels, 2]: sum(g), sum(g * x)
            sum_g = chan[:, 0:1]
            centred = nisa.tensor_tensor(chan[:, 1:2], nisa.tensor_tensor(m, sum_g, op=nl.multiply), op=nl.subtract)
            d_gamma = nisa.tensor_tensor(centred, istd, op=nl.multiply, dtype=f32)
            if dgamma is not None:
                nl.store(lay.vector(dgamma, tile), value=nisa.tensor_copy(d_gamma, dtype=dgamma.dtype))
            if dbeta is not None:
                nl.store(lay.vector(dbeta, tile), value=nisa.tensor_copy(sum_g, dtype=dbeta.dtype))
        if not need_input:
            continue
        if training:
            # dx = a * g + (b * x + c): b = -a * invstd * dgamma / M, c = -a * dbeta / M - b * mean
            b = nisa.tensor_scalar(nisa.tensor_tensor(a, nisa.tensor_tensor(istd, d_gamma, op=nl.multiply),
                                                      op=nl.multiply), op0=nl.multiply, operand0=-1.0 / lay.count)
            a_dbeta = nisa.tensor_scalar(nisa.tensor_tensor(a, sum_g, op=nl.multiply), op0=nl.multiply,
                                         operand0=-1.0 / lay.count)
            c = nisa.tensor_tensor(a_dbeta, nisa.tensor_tensor(b, m, op=nl.multiply), op=nl.subtract)
            coeffs = nl.ndarray((tile[1], 3), f32)
            for j, v in enumerate((a, b, c)):
                nisa.tensor_copy(dst=coeffs[:, j:j + 1], src=v)
        else:
            coeffs = a
        coeffs = lay.to_partitions(coeffs, tile)
        for i, block in enumerate(lay.blocks):
            g, xb = kept[i] if keep else (masked(block, tile), None)
            if training:
                xb = xb if xb is not None else nl.load(lay.view(x, tile, block))
                lin = nisa.activation(op="identity", data=xb, scale=coeffs[:, 1:2], bias=coeffs[:, 2:3], dtype=f32)
                res = nisa.scalar_tensor_tensor(data=g, op0=nl.multiply, operand0=coeffs[:, 0:1], op1=nl.add,
                                                operand1=lin, dtype=dx.dtype)
            else:
                res = nisa.tensor_scalar(g, op0=nl.multiply, operand0=coeffs[:, 0:1], dtype=dx.dtype)
            nl.store(lay.view(dx, tile, block), value=res)
    return _asked(dx, dgamma, dbeta)


@nki.jit
def groupnorm_backward_kernel(grad, x, mean, rstd, gamma, groups, need_input=True, need_weight=True,
                              need_bias=True):
    """torch's ``native_group_norm_backward``: the gradients of ``group_norm`` from the
    forward's saved per-(image, group) mean and reciprocal standard deviation. With
    ``xhat = (x - mean) * rstd``, D = C / groups * H * W values per group, and per
    (image, group) ``ds = sum(g * gamma * x)``, ``db = sum(g * gamma)``:

        dx     = rstd * gamma * g + b * x + c,
                 b = (db * mean - ds) * rstd^3 / D,  c = -b * mean - db * rstd / D
        dgamma = sum over images and positions of g * xhat,   dbeta = sum of g

    Args:
        grad: [N, C, *spatial] in HBM (NCHW, [N, C, L] or [N, C]), any chip float
            dtype; any sizes.
        x: the forward's input, ``grad``'s shape, any chip float dtype.
        mean, rstd: [N, groups] in HBM, the forward's saved statistics (fp32).
        gamma: [C] in HBM, or None (no scale: no dgamma).
        groups: divides C; at most 128.
        need_input, need_weight, need_bias: which gradients (torch's ``output_mask``).

    Returns:
        The asked-for gradients in the order dx, dgamma, dbeta (a tuple when more than
        one): dx of ``x``'s shape and dtype, dgamma and dbeta [C] of ``gamma``'s dtype
        (``grad``'s without gamma), in HBM.

    Memories: ``mean`` and ``rstd`` are loaded once, transposed by the DMA into a
    [groups, N, 2] SBUF tile. Each image is read as [C, H*W] as in ``groupnorm_kernel``
    (channels on partitions, blocks of at most 4096 positions). First pass, per block:
    the vector engine sums ``g`` and forms ``g * x`` (fp32), which the scalar engine
    sums. Per channel tile, a matmul against the transposed membership matrix hands
    each channel its group's mean and rstd (PSUM), the vector engine adds the image's
    share of dgamma and dbeta into fp32 SBUF accumulators, and a matmul against the
    membership matrix sums ``gamma``-weighted channel sums into each group's ds and db
    (accumulating over channel tiles in PSUM). The vector engine makes each group's
    b and c, handed back to the channels by one more matmul. Second pass: ``b * x +
    c`` on the scalar engine, ``rstd * gamma * g +`` it on the vector engine, stored.
    An image of at most 64 KiB per partition per tensor stays in SBUF between the
    passes. dgamma and dbeta are stored at the end.
    """
    if tuple(grad.shape) != tuple(x.shape):
        raise nki.KernelError(f"groupnorm_backward_kernel: grad {list(grad.shape)} and x {list(x.shape)} differ")
    n_img, channels = x.shape[0], x.shape[1]
    if channels % groups or not 1 <= groups <= TILE_P:
        raise nki.KernelError(f"groupnorm_backward_kernel: groups={groups} must divide C={channels} and be at "
                              f"most {TILE_P}")
    f32 = nl.float32
    per_group = channels // groups
    hw = math.prod(x.shape[2:])
    dx, dgamma, dbeta = _gradients(grad, x, gamma, need_input, need_weight, need_bias, channels)
    g3, x3 = grad.reshape((n_img, channels, hw)), x.reshape((n_img, channels, hw))
    dx3 = dx.reshape((n_img, channels, hw)) if dx is not None else None
    tiles = [(c0, min(TILE_P, channels - c0)) for c0 in range(0, channels, TILE_P)]
    to_group = [_membership(c0, ct, per_group, groups, 1.0, False) for c0, ct in tiles]
    from_group = [_membership(c0, ct, per_group, groups, 1.0, True) for c0, ct in tiles]
    gammas = [nl.load(gamma.reshape((channels, 1))[c0:c0 + ct, :], dtype=f32) if gamma is not None else None
              for c0, ct in tiles]
    stats = nl.ndarray((groups, n_img, 2), f32)
    for j, saved in enumerate((mean, rstd)):
        nisa.dma_copy(dst=stats[:, :, j], src=saved.ap([[1, groups], [groups, n_img]]))
    columns = [nl.zeros((ct, 2), f32) for _, ct in tiles] if (dgamma is not None or dbeta is not None) else None
    starts = list(range(0, hw, GN_FREE_MAX))
    keep = need_input and 2 * len(tiles) * hw * max(grad.dtype.itemsize, x.dtype.itemsize) <= GN_KEEP_BYTES
    for n in nl.affine_range(n_img):
        group_sums = nl.zeros((groups, 2), f32, buffer=nl.psum) if need_input else None
        kept, scales = [], []
        for t, (c0, ct) in enumerate(tiles):
            partials = nl.ndarray((ct, 2, len(starts)), f32)
            blocks = []
            for i, s0 in enumerate(starts):
                cols = slice(s0, min(s0 + GN_FREE_MAX, hw))
                g = nl.load(g3[n, c0:c0 + ct, cols])
                xb = nl.load(x3[n, c0:c0 + ct, cols])
                nisa.tensor_reduce(dst=partials[:, 0, i:i + 1], op=nl.add, data=g, axis=1)
                prod = nisa.tensor_tensor(g, xb, op=nl.multiply, dtype=f32)
                nisa.activation(dst=prod, op="identity", data=prod, reduce_op=nl.add,
                                reduce_res=partials[:, 1, i:i + 1])
                blocks.append((g, xb) if keep else None)
            kept.append(blocks)
            sums = nisa.tensor_reduce(op=nl.add, data=partials, axis=2, dtype=f32)   # [ct, 2]: sum(g), sum(g * x)
            chan_stats = nl.copy(nisa.nc_matmul(from_group[t], stats[:, n, :]), dtype=f32)   # mean, rstd
            if columns is not None:
                # dgamma += (sum(g x) - mean * sum(g)) * rstd, dbeta += sum(g)
                centred = nisa.tensor_tensor(sums[:, 1:2], nisa.tensor_tensor(chan_stats[:, 0:1], sums[:, 0:1],
                                                                              op=nl.multiply), op=nl.subtract)
                nisa.scalar_tensor_tensor(dst=columns[t][:, 0:1], data=centred, op0=nl.multiply,
                                          operand0=chan_stats[:, 1:2], op1=nl.add, operand1=columns[t][:, 0:1])
                nisa.tensor_tensor(dst=columns[t][:, 1:2], data1=columns[t][:, 1:2], data2=sums[:, 0:1], op=nl.add)
            if not need_input:
                continue
            weighted = sums if gammas[t] is None else \
                nisa.tensor_scalar(sums, op0=nl.multiply, operand0=gammas[t], dtype=f32)
            group_sums += nl.matmul(to_group[t], weighted, transpose_x=True)
            scales.append(chan_stats[:, 1:2] if gammas[t] is None else
                          nisa.tensor_tensor(chan_stats[:, 1:2], gammas[t], op=nl.multiply, dtype=f32))
        if not need_input:
            continue
        sums_g = nl.copy(group_sums, dtype=f32)   # [groups, 2]: db, ds
        g_mean, g_rstd = stats[:, n, 0:1], stats[:, n, 1:2]
        inv_d = 1.0 / (per_group * hw)
        rstd3 = nisa.tensor_tensor(nisa.tensor_tensor(g_rstd, g_rstd, op=nl.multiply), g_rstd, op=nl.multiply)
        diff = nisa.tensor_tensor(nisa.tensor_tensor(sums_g[:, 0:1], g_mean, op=nl.multiply), sums_g[:, 1:2],
                                  op=nl.subtract)
        b = nisa.scalar_tensor_tensor(data=diff, op0=nl.multiply, operand0=inv_d, op1=nl.multiply, operand1=rstd3)
        db_rstd = nisa.scalar_tensor_tensor(data=sums_g[:, 0:1], op0=nl.multiply, operand0=-inv_d, op1=nl.multiply,
                                            operand1=g_rstd)
        c = nisa.tensor_tensor(db_rstd, nisa.tensor_tensor(b, g_mean, op=nl.multiply), op=nl.subtract)
        pair = nl.ndarray((groups, 2), f32)
        nisa.tensor_copy(dst=pair[:, 0:1], src=b)
        nisa.tensor_copy(dst=pair[:, 1:2], src=c)
        for t, (c0, ct) in enumerate(tiles):
            coeffs = nl.copy(nisa.nc_matmul(from_group[t], pair), dtype=f32)
            for i, s0 in enumerate(starts):
                cols = slice(s0, min(s0 + GN_FREE_MAX, hw))
                g, xb = kept[t][i] if keep else (nl.load(g3[n, c0:c0 + ct, cols]), nl.load(x3[n, c0:c0 + ct, cols]))
                lin = nisa.activation(op="identity", data=xb, scale=coeffs[:, 0:1], bias=coeffs[:, 1:2], dtype=f32)
                res = nisa.scalar_tensor_tensor(data=g, op0=nl.multiply, operand0=scales[t], op1=nl.add,
                                                operand1=lin, dtype=dx.dtype)
                nl.store(dx3[n, c0:c0 + ct, cols], value=res)
    for t, (c0, ct) in enumerate(tiles):
        for j, out in enumerate((dgamma, dbeta)):
            if out is not None:
                nl.store(out.reshape((channels, 1))[c0:c0 + ct, :],
                         value=nisa.tensor_copy(columns[t][:, j:j + 1], dtype=out.dtype))
    return _asked(dx, dgamma, dbeta)
