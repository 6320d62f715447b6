"""Elementwise kernels: unary activations, binary and scalar arithmetic, casts, AdamW.

Elementwise work does not care which element sits on which partition, so every
kernel here sees its tensors as flat (any shape, contiguous in HBM) and lays the
first ``128 * F`` elements out as 128 partitions of F consecutive elements (the
last ``numel % 128`` go in one extra one-partition tile). Each tile is at most
``FREE_MAX`` columns, so a kernel issues a handful of instructions per
[128, FREE_MAX] tile whatever the tensor's shape: one [1, 10**7] tensor uses all
128 partitions, as a [4096, 4096] one does.

- ``unary_kernel``: ``op(x * scale)`` on the scalar engine (any ``nl`` activation).
- ``binary_kernel``: ``op(x, y)`` on the vector engine; ``y`` has ``x``'s element
  count, or is a row [D] broadcast over the rows of ``x`` [..., D], or a column
  [N, 1] broadcast along the rows of ``x`` [N, D].
- ``scalar_kernel``: ``op(x, value)`` (or ``op(value, x)``) on the vector engine.
- ``clamp_kernel``: ``min(max(x, lo), hi)`` in one vector instruction per tile.
- ``cast_kernel``: a dtype conversion through SBUF, or an HBM-to-HBM DMA when the
  dtype stays.
- ``fused_adamw_kernel``: one AdamW step (torch's ``_fused_adamw_``) over four tensors.
- ``fill_kernel``: a new tensor of one value (``fill_``, ``zero_``, ``full``).
- ``cumsum_kernel``: running sums along the last axis (a ``tensor_tensor_scan``).
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

TILE_P = 128          # nl.tile_size.pmax
FREE_MAX = 4096       # columns per tile: 16 KiB per partition in fp32
ADAMW_FREE_MAX = 2048  # AdamW keeps about ten tiles live per step
ENGINES = (nisa.vector_engine, nisa.scalar_engine)  # both copy and convert; alternate them


def flat_views(t, free_max):
    """The HBM tensor ``t`` (any shape) as a list of 2-D views: [128, <= free_max] column
    blocks of its first ``128 * (numel // 128)`` elements laid out 128 partitions by
    ``numel // 128``, then [1, numel % 128] for the rest. Tensors of one element count
    give views of the same shapes, element for element."""
    numel = math.prod(t.shape)
    flat = t.reshape((numel,))
    cols = numel // TILE_P
    views = []
    if cols:
        main = flat[0:TILE_P * cols].reshape((TILE_P, cols))
        views += [main[:, c0:min(c0 + free_max, cols)] for c0 in range(0, cols, free_max)]
    if numel % TILE_P:
        views.append(flat[TILE_P * cols:numel].reshape((1, numel % TILE_P)))
    return views


def _new_like(x, dtype):
    return nl.ndarray(x.shape, dtype if dtype is not None else x.dtype, buffer=nl.shared_hbm)


@nki.jit
def unary_kernel(x, op="exp", scale=1.0, dtype=None):
    """``op(x * scale)`` elementwise on the scalar engine.

    Args:
        x: any shape in HBM, any chip float dtype.
        op: an activation function name or ``nl`` function: exp, log, sqrt, rsqrt,
            reciprocal, tanh, sigmoid, relu, gelu, gelu_apprx_tanh, silu, square, abs,
            softplus, sin, cos, erf, sign, identity (or copy). ``op="identity",
            scale=-1.0`` is negation.
        scale: multiplies ``x`` before ``op``.
        dtype: of the result; ``x``'s by default.

    Returns:
        ``x``'s shape in HBM.

    Memories: each [128, <= 4096] block is loaded into SBUF, goes through one scalar
    engine activation into an SBUF tile of the result dtype (computed in fp32) and is
    stored to HBM. PSUM is not used.
    """
    out = _new_like(x, dtype)
    for src, dst in zip(flat_views(x, FREE_MAX), flat_views(out, FREE_MAX)):
        tile = nl.load(src)
        y = nisa.activation(op=op, data=tile, scale=float(scale), dtype=out.dtype)
        nl.store(dst, value=y)
    return out


@nki.jit
def binary_kernel(x, y, op="add", dtype=None):
    """``op(x, y)`` elementwise on the vector engine (``tensor_tensor``).

    Args:
        x: any shape in HBM, any chip float dtype.
        y: in HBM, any chip float dtype, either with ``x``'s element count (its shape
            may differ: both are read as flat), or [D] / [1, D] broadcast over the rows
            of ``x`` [..., D], or [N, 1] with ``x`` [N, D] (one value per row).
        op: add, subtract, multiply, divide, maximum, minimum, power or a comparison
            (equal, not_equal, greater, greater_equal, less, less_equal, giving 1.0 or
            0.0), as a name or ``nl`` function.
        dtype: of the result; ``x``'s by default.

    Returns:
        ``x``'s shape in HBM.

    Memories: same-size operands: both [128, <= 4096] blocks are loaded into SBUF and
    one vector instruction writes the result tile, stored to HBM. A broadcast row is
    loaded once per column block and copied to all 128 partitions (one DMA); when rows
    are shorter than 4096, each partition holds several consecutive rows of ``x``
    and the row is repeated along the free axis to match. A column [N, 1] is loaded as
    a [128, 1] tile per row tile and applied with ``tensor_scalar``. PSUM is not used.
    """
    out = _new_like(x, dtype)
    if math.prod(y.shape) == math.prod(x.shape):
        for a, b, dst in zip(flat_views(x, FREE_MAX), flat_views(y, FREE_MAX), flat_views(out, FREE_MAX)):
            res = nisa.tensor_tensor(nl.load(a), nl.load(b), op=op, dtype=out.dtype)
            nl.store(dst, value=res)
        return out
    d = x.shape[-1] if len(x.shape) else 1
    if math.prod(y.shape) == d and (len(y.shape) == 1 or y.shape[0] == 1):
        _broadcast_rows(x, y, out, op)
        return out
    if len(x.shape) == 2 and tuple(y.shape) == (x.shape[0], 1):
        _broadcast_columns(x, y, out, op)
        return out
    raise nki.KernelError(f"binary_kernel: y {list(y.shape)} neither matches x {list(x.shape)} in size, nor is a row "
                          f"[{d}] or a column [{x.shape[0]}, 1] to broadcast; expand it first")


def _broadcast_rows(x, y, out, op):
    """``op(x, y)`` with ``y`` [D] broadcast over the rows of ``x`` [R, D]."""
    d = x.shape[-1]
    rows = math.prod(x.shape) // d
    x2, out2, y_row = x.reshape((rows, d)), out.reshape((rows, d)), y.reshape((1, d))
    per_part = rows // TILE_P
    first_row = 0
    if per_part > 1 and d < FREE_MAX:
        # short rows: each partition holds `per_part` consecutive rows, a block `group` of them
        group = min(per_part, FREE_MAX // d)
        row = nl.ndarray((1, group * d), y.dtype)
        for g in nl.affine_range(group):
            nisa.dma_copy(dst=row[:, g * d:(g + 1) * d], src=y_row)
        pattern = nl.broadcast_to(row, (TILE_P, group * d))
        xm = x2[0:TILE_P * per_part, :].reshape((TILE_P, per_part * d))
        om = out2[0:TILE_P * per_part, :].reshape((TILE_P, per_part * d))
        for r0 in nl.affine_range(0, per_part, group):
            cols = slice(r0 * d, min(r0 + group, per_part) * d)
            n = cols.stop - cols.start
            res = nisa.tensor_tensor(nl.load(xm[:, cols]), pattern[:, 0:n], op=op, dtype=out.dtype)
            nl.store(om[:, cols], value=res)
        first_row = TILE_P * per_part
    for c0 in nl.affine_range(0, d, FREE_MAX):
        cw = min(FREE_MAX, d - c0)
        parts = min(TILE_P, rows - first_row)
        if parts <= 0:
            break
        pattern = nl.broadcast_to(nl.load(y_row[:, c0:c0 + cw]), (parts, cw))
        for r0 in nl.affine_range(first_row, rows, TILE_P):
            p = min(TILE_P, rows - r0)
            res = nisa.tensor_tensor(nl.load(x2[r0:r0 + p, c0:c0 + cw]), pattern[0:p, :], op=op, dtype=out.dtype)
            nl.store(out2[r0:r0 + p, c0:c0 + cw], value=res)


def _broadcast_columns(x, y, out, op):
    """``op(x, y)`` with ``y`` [N, 1] broadcast along the rows of ``x`` [N, D]."""
    n, d = x.shape
    for r0 in nl.affine_range(0, n, TILE_P):
        p = min(TILE_P, n - r0)
        column = nl.load(y[r0:r0 + p, :])
        for c0 in nl.affine_range(0, d, FREE_MAX):
            cw = min(FREE_MAX, d - c0)
            res = nisa.tensor_scalar(nl.load(x[r0:r0 + p, c0:c0 + cw]), op0=op, operand0=column, dtype=out.dtype)
            nl.store(out[r0:r0 + p, c0:c0 + cw], value=res)


@nki.jit
def scalar_kernel(x, op="multiply", value=1.0, reverse=False, dtype=None):
    """``op(x, value)`` elementwise on the vector engine (``tensor_scalar``); with
    ``reverse``, ``op(value, x)`` (``rsub``, ``rdiv``).

    Args:
        x: any shape in HBM, any chip float dtype.
        op: an ALU operation (add, subtract, multiply, divide, maximum, minimum, power,
            or a comparison giving 1.0 or 0.0), as a name or ``nl`` function.
        value: the number.
        reverse: put ``value`` first.
        dtype: of the result; ``x``'s by default.

    Returns:
        ``x``'s shape in HBM.

    Memories: each [128, <= 4096] block is loaded into SBUF, goes through one vector
    instruction into an SBUF tile of the result dtype and is stored to HBM. PSUM is
    not used.
    """
    out = _new_like(x, dtype)
    for src, dst in zip(flat_views(x, FREE_MAX), flat_views(out, FREE_MAX)):
        res = nisa.tensor_scalar(nl.load(src), op0=op, operand0=float(value), reverse0=bool(reverse), dtype=out.dtype)
        nl.store(dst, value=res)
    return out


@nki.jit
def clamp_kernel(x, lo=None, hi=None):
    """``x`` clamped to [``lo``, ``hi``] elementwise (torch's ``clamp``, ``clamp_min``,
    ``clamp_max``, ``hardtanh``): ``min(max(x, lo), hi)``, one bound may be None.

    Args:
        x: any shape in HBM, any chip float dtype.
        lo, hi: the bounds (numbers); at least one is given.

    Returns:
        ``x``'s shape in HBM, of ``x``'s dtype.

    Memories: each [128, <= 4096] block is loaded into SBUF, goes through one vector
    ``tensor_scalar`` (maximum then minimum) and is stored to HBM. PSUM is not used.
    """
    bounds = [(nl.maximum, lo), (nl.minimum, hi)]
    ops = [(op, float(v)) for op, v in bounds if v is not None]
    if not ops:
        raise nki.KernelError("clamp_kernel needs a lower or an upper bound (lo= or hi=)")
    out = _new_like(x, None)
    second = ops[1] if len(ops) > 1 else (None, None)
    for src, dst in zip(flat_views(x, FREE_MAX), flat_views(out, FREE_MAX)):
        res = nisa.tensor_scalar(nl.load(src), op0=ops[0][0], operand0=ops[0][1], op1=second[0], operand1=second[1],
                                 dtype=out.dtype)
        nl.store(dst, value=res)
    return out


@nki.jit
def cast_kernel(x, dtype):
    """``x`` converted to ``dtype`` (round to nearest even), or copied when ``dtype`` is
    ``x``'s.

    Args:
        x: any shape in HBM, any chip dtype.
        dtype: of the result (an ``nl`` dtype or its name).

    Returns:
        ``x``'s shape in HBM, of ``dtype``.

    Memories: a conversion loads each [128, <= 4096] block into SBUF, converts it with
    one ``tensor_copy`` (alternately on the vector and scalar engines) and stores it.
    A copy without conversion is one HBM-to-HBM DMA: no engine touches it. PSUM is
    not used.
    """
    out = nl.ndarray(x.shape, dtype, buffer=nl.shared_hbm)
    if out.dtype is x.dtype:
        nisa.dma_copy(dst=out, src=x)
        return out
    for i, (src, dst) in enumerate(zip(flat_views(x, FREE_MAX), flat_views(out, FREE_MAX))):
        res = nisa.tensor_copy(nl.load(src), dtype=out.dtype, engine=ENGINES[i % 2])
        nl.store(dst, value=res)
    return out


@nki.jit
def fused_adamw_kernel(param, grad, exp_avg, exp_avg_sq, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                       weight_decay=1e-2, step=1):
    """One AdamW step, as ``torch.optim.AdamW`` (no amsgrad, no maximize) takes it:

        param *= 1 - lr * weight_decay
        exp_avg = beta1 * exp_avg + (1 - beta1) * grad
        exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
        param -= lr / (1 - beta1**step) * exp_avg / (sqrt(exp_avg_sq / (1 - beta2**step)) + eps)

    Args:
        param, grad, exp_avg, exp_avg_sq: one shape (any) in HBM, fp32 (other chip
            float dtypes work too; the arithmetic is fp32).
        lr, beta1, beta2, eps, weight_decay: numbers.
        step: the step number after this update (1 for the first), a number: the
            bias corrections are worked out on the host.

    Returns:
        (new param, new exp_avg, new exp_avg_sq) in HBM, each of its input's dtype; an
        in-place optimizer writes them over the inputs.

    Memories: the four [128, <= 2048] blocks are loaded into SBUF; twelve instructions
    split over the scalar engine (the scaled copies, the square and the square root)
    and the vector engine (the sums, the division) compute the three results into
    SBUF tiles that are stored to HBM. PSUM is not used.
    """
    shapes = {tuple(t.shape) for t in (param, grad, exp_avg, exp_avg_sq)}
    if len(shapes) != 1:
        raise nki.KernelError(f"fused_adamw_kernel: param, grad, exp_avg and exp_avg_sq must share one shape, "
                              f"got {sorted(shapes)}")
    new_p, new_m, new_v = (_new_like(t, None) for t in (param, exp_avg, exp_avg_sq))
    step_size = lr / (1.0 - beta1 ** step)
    inv_bc2 = 1.0 / (1.0 - beta2 ** step)
    views = [flat_views(t, ADAMW_FREE_MAX) for t in (param, grad, exp_avg, exp_avg_sq, new_p, new_m, new_v)]
    for p_v, g_v, m_v, v_v, p_out, m_out, v_out in zip(*views):
        p = nl.load(p_v)
        g = nl.load(g_v)
        m = nl.load(m_v)
        v = nl.load(v_v)
        f32 = nl.float32
        g_m = nisa.activation(op="identity", data=g, scale=1.0 - beta1, dtype=f32)
        g_v2 = nisa.activation(op=nl.square, data=g, scale=math.sqrt(1.0 - beta2), dtype=f32)
        m_new = nisa.tensor_tensor(nisa.tensor_scalar(m, op0=nl.multiply, operand0=beta1, dtype=f32), g_m, op=nl.add,
                                   dtype=new_m.dtype)
        v_new = nisa.tensor_tensor(nisa.tensor_scalar(v, op0=nl.multiply, operand0=beta2, dtype=f32), g_v2, op=nl.add,
                                   dtype=new_v.dtype)
        nl.store(m_out, value=m_new)
        nl.store(v_out, value=v_new)
        denom = nisa.tensor_scalar(nisa.activation(op=nl.sqrt, data=v_new, scale=inv_bc2, dtype=f32),
                                   op0=nl.add, operand0=float(eps))
        update = nisa.tensor_tensor(m_new, denom, op=nl.divide, dtype=f32)
        decayed = nisa.activation(op="identity", data=p, scale=1.0 - lr * weight_decay, dtype=f32)
        step_t = nisa.tensor_scalar(update, op0=nl.multiply, operand0=-step_size, engine=nisa.scalar_engine)
        p_new = nisa.tensor_tensor(decayed, step_t, op=nl.add, dtype=new_p.dtype)
        nl.store(p_out, value=p_new)
    return new_p, new_m, new_v


@nki.jit
def fill_kernel(shape, value=0.0, dtype="float32"):
    """A new HBM tensor of ``shape`` holding ``value`` everywhere (torch's ``fill_``,
    ``zero_`` and ``full``).

    Args:
        shape: of the result (a tuple of ints).
        value: the number written.
        dtype: of the result (an ``nl`` dtype or its name).

    Returns:
        ``shape`` in HBM, of ``dtype``.

    Memories: one [128, <= 4096] SBUF tile is set by a ``memset`` on the vector engine
    (a [1, r] tile more for a ragged tail) and stored to every block of the result.
    PSUM is not used.
    """
    out = nl.ndarray(tuple(shape), dtype, buffer=nl.shared_hbm)
    tiles = {}
    for dst in flat_views(out, FREE_MAX):
        key = tuple(dst.shape)
        if key not in tiles:
            tiles[key] = nisa.memset(key, value=float(value), dtype=out.dtype)
        nl.store(dst, value=tiles[key])
    return out


@nki.jit
def cumsum_kernel(x, dtype=None):
    """Running sums along the last axis of ``x`` (torch's ``cumsum(x, -1)``).

    Args:
        x: [..., D] in HBM, any chip float dtype; D at most 4096.
        dtype: of the result; ``x``'s by default.

    Returns:
        ``x``'s shape in HBM.

    Memories: rows go 128 to a [128, D] SBUF tile; one ``tensor_tensor_scan`` on the
    vector engine (fp32 math) adds each element to the running sum of its row, and the
    tile is stored. A zero [128, D] tile (one memset) is the scan's second operand.
    PSUM is not used.
    """
    d = x.shape[-1] if len(x.shape) else 1
    if d > FREE_MAX:
        raise nki.KernelError(f"cumsum_kernel: rows of {d} elements are longer than {FREE_MAX}; "
                              f"scan them in blocks carrying the running sum")
    rows = math.prod(x.shape) // d
    src = x.reshape((rows, d))
    out = _new_like(x, dtype)
    dst = out.reshape((rows, d))
    zeros = nisa.memset((TILE_P, d), value=0.0, dtype=nl.float32)
    for r0 in range(0, rows, TILE_P):
        p = min(TILE_P, rows - r0)
        res = nisa.tensor_tensor_scan(nl.load(src[r0:r0 + p, :]), zeros[0:p, :], initial=0.0, op0=nl.add,
                                      op1=nl.add, dtype=out.dtype)
        nl.store(dst[r0:r0 + p, :], value=res)
    return out


@nki.jit
def dropout_kernel(x, p=0.5):
    """torch's ``native_dropout(x, p, train=True)``: each element zeroed with probability
    ``p``, the others scaled by ``1 / (1 - p)``; and the mask of those kept.

    Args:
        x: any shape in HBM, any chip float dtype.
        p: the probability of zeroing, 0 <= p < 1.

    Returns:
        (the result in ``x``'s dtype, the mask as uint8 1/0), both ``x``'s shape in HBM.

    Memories: a [128, <= 4096] tile of ones is set once; per block the vector engine
    drops from it (``dropout``: the mask), and one ``scalar_tensor_tensor`` multiplies
    the loaded block by the scale and the mask; both are stored. PSUM is not used.
    """
    if not 0.0 <= float(p) < 1.0:
        raise nki.KernelError(f"dropout_kernel: p {p!r} must be in [0, 1); p = 1 zeroes everything (use zeros)")
    out = _new_like(x, None)
    mask = nl.ndarray(x.shape, nl.uint8, buffer=nl.shared_hbm)
    ones = {}
    for src, dst, kept in zip(flat_views(x, FREE_MAX), flat_views(out, FREE_MAX), flat_views(mask, FREE_MAX)):
        key = tuple(src.shape)
        if key not in ones:
            ones[key] = nisa.memset(key, value=1.0, dtype=nl.float32)
        m = nisa.dropout(ones[key], prob=float(p))
        y = nisa.scalar_tensor_tensor(data=nl.load(src), op0=nl.multiply, operand0=1.0 / (1.0 - float(p)),
                                      op1=nl.multiply, operand1=m, dtype=out.dtype)
        nl.store(dst, value=y)
        nl.store(kept, value=nl.copy(m, dtype=nl.uint8))
    return out, mask


@nki.jit
def dropout_backward_kernel(grad, mask, scale=1.0):
    """torch's ``native_dropout_backward(grad, mask, scale)``: ``grad * mask * scale``.

    Args:
        grad: any shape in HBM, any chip float dtype; mask: its shape, 1/0 (uint8 or
            float).
        scale: ``1 / (1 - p)`` of the forward.

    Returns:
        ``grad``'s shape and dtype in HBM.

    Memories: per [128, <= 4096] block both are loaded and one ``scalar_tensor_tensor``
    (vector engine) writes the result tile, stored to HBM. PSUM is not used.
    """
    out = _new_like(grad, None)
    for g, m, dst in zip(flat_views(grad, FREE_MAX), flat_views(mask, FREE_MAX), flat_views(out, FREE_MAX)):
        y = nisa.scalar_tensor_tensor(data=nl.load(m), op0=nl.multiply, operand0=float(scale), op1=nl.multiply,
                                      operand1=nl.load(g), dtype=out.dtype)
        nl.store(dst, value=y)
    return out


@nki.jit
def where_kernel(cond, x, y):
    """torch's ``where(cond, x, y)`` of three tensors of one shape: ``x`` where ``cond``
    is nonzero, ``y`` elsewhere.

    Args:
        cond: any shape in HBM, bool as uint8 (or any chip dtype, nonzero is true).
        x, y: ``cond``'s shape in HBM, one chip dtype.

    Returns:
        ``cond``'s shape in HBM, ``x``'s dtype.

    Memories: per [128, <= 4096] block all three are loaded and one
    ``tensor_copy_predicated`` (vector engine) copies ``x`` over the ``y`` tile where
    ``cond`` holds; the tile is stored. PSUM is not used.
    """
    out = _new_like(x, None)
    for c, a, b, dst in zip(flat_views(cond, FREE_MAX), flat_views(x, FREE_MAX), flat_views(y, FREE_MAX),
                            flat_views(out, FREE_MAX)):
        tile = nl.load(b)
        nisa.tensor_copy_predicated(dst=tile, src=nl.load(a), predicate=nl.load(c))
        nl.store(dst, value=tile)
    return out


@nki.jit
def uniform_kernel(shape, low=0.0, high=1.0, dtype="float32"):
    """A new HBM tensor of ``shape`` of uniform random values from ``low`` to ``high``
    (torch's ``uniform_`` and ``rand``, which never give ``high``: here the scaled 32-bit
    draws round to the result dtype, so ``high`` itself can occur, about one value in
    512 in bfloat16).

    Args:
        shape: of the result (a tuple of ints).
        low, high: the range, low < high.
        dtype: of the result (a float ``nl`` dtype or its name).

    Returns:
        ``shape`` in HBM, of ``dtype``.

    Memories: per [128, <= 4096] block the vector engine draws 32 random bits per
    element into an SBUF uint32 tile (``rng``) and one ``tensor_scalar`` scales them by
    ``(high - low) / 2**32`` and adds ``low`` into the result tile, stored to HBM.
    """
    if not float(low) < float(high):
        raise nki.KernelError(f"uniform_kernel: low {low!r} must be below high {high!r}")
    out = nl.ndarray(tuple(shape), dtype, buffer=nl.shared_hbm)
    for dst in flat_views(out, FREE_MAX):
        bits = nl.ndarray(tuple(dst.shape), nl.uint32)
        nisa.rng(bits)
        values = nisa.tensor_scalar(bits, op0=nl.multiply, operand0=(float(high) - float(low)) / 2.0 ** 32,
                                    op1=nl.add, operand1=float(low), dtype=out.dtype)
        nl.store(dst, value=values)
    return out


ROUNDINGS = {"floor": nl.floor, "ceil": nl.ceil, "trunc": nl.trunc}


@nki.jit
def rounding_kernel(x, op="floor"):
    """torch's ``floor``, ``ceil`` or ``trunc`` of ``x``, for ``|x| < 2**31`` (NKI's
    composition goes through int32: larger values, inf and NaN do not come back as
    torch gives them).

    Args:
        x: any shape in HBM, any chip float dtype.
        op: floor, ceil or trunc.

    Returns:
        ``x``'s shape and dtype in HBM.

    Memories: per [128, <= 4096] block, loaded into SBUF: ``nl.floor`` (``nl.ceil``,
    ``nl.trunc``) as NKI composes it, a round trip through int32 and a correction by
    one comparison (two more for ``trunc``), on the vector engine; stored. PSUM is not
    used.
    """
    if op not in ROUNDINGS:
        raise nki.KernelError(f"rounding_kernel: op {op!r} is not one of {sorted(ROUNDINGS)}")
    out = _new_like(x, None)
    for src, dst in zip(flat_views(x, FREE_MAX), flat_views(out, FREE_MAX)):
        nl.store(dst, value=ROUNDINGS[op](nl.load(src), dtype=out.dtype))
    return out


@nki.jit
def arange_kernel(n, start=0, step=1, dtype="int32"):
    """torch's ``arange(start, start + n * step, step)``: ``n`` values in HBM.

    Args:
        n: how many; start, step: integers.
        dtype: of the result (an ``nl`` dtype or its name).

    Returns:
        [n] in HBM, of ``dtype``.

    Memories: GpSimd writes the values into one SBUF tile per 128 x <= 4096 block with
    ``iota`` (partition-major, as the flat result lies), stored to HBM.
    """
    out = nl.ndarray((int(n),), dtype, buffer=nl.shared_hbm)
    cols = int(n) // TILE_P
    column = 0
    for dst in flat_views(out, FREE_MAX):
        p, f = dst.shape
        if p == TILE_P and cols:   # a block of columns: element (i, j) is i * cols + column + j
            first, per_partition = column, cols
            column += f
        else:                      # the last n % 128, one row
            first, per_partition = TILE_P * cols, 0
        tile = nl.ndarray((p, f), nl.int32)
        nisa.iota(tile, pattern=[[int(step), f]], offset=int(start) + first * int(step),
                  channel_multiplier=per_partition * int(step))
        nl.store(dst, value=nl.copy(tile, dtype=out.dtype))
    return out
