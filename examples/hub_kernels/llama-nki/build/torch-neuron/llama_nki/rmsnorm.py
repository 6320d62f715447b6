"""RMSNorm as one NKI kernel: rows on the partitions, statistics in fp32 on chip."""

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def nki_rms_norm(x, weight, eps):
    """``x * rsqrt(mean(x**2, -1) + eps) * weight``, row by row (Llama's RMSNorm).

    x: [N, H] in HBM, float32 or bfloat16; weight: [1, H] in HBM; eps: a float; H at
    most 512 (one PSUM bank of fp32 for the broadcast weight). Returns [N, H] in HBM of
    x's dtype. Each tile of 128 rows is read once into SBUF (converted to fp32 by the
    DMA), squared and summed on the scalar engine, scaled on the vector engine and
    written back once. The weight row is broadcast to the 128 partitions by a K=1
    matmul on the tensor engine (into PSUM), once per call.
    """
    n, h = x.shape
    pmax = nl.tile_size.pmax
    if h > nl.tile_size.psum_fmax:
        raise ValueError(f"nki_rms_norm: hidden size {h} exceeds {nl.tile_size.psum_fmax}; split the row")
    out = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.shared_hbm)

    w_row = nl.ndarray((1, h), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_row, src=weight)
    ones = nl.ndarray((1, pmax), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    w_psum = nl.ndarray((pmax, h), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(w_psum, ones, w_row)
    w = nl.ndarray((pmax, h), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=w, src=w_psum)

    for t in nl.affine_range((n + pmax - 1) // pmax):
        lo = t * pmax
        rows = min(pmax, n - lo)
        xt = nl.ndarray((rows, h), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[lo:lo + rows, :])
        squares = nl.ndarray((rows, h), dtype=nl.float32, buffer=nl.sbuf)
        mean_sq = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        # (x / sqrt(h))**2 summed over the row is the mean of the squares
        nisa.activation(dst=squares, op=nl.square, data=xt, scale=float(h) ** -0.5, reduce_op=nl.add,
                        reduce_res=mean_sq)
        rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=mean_sq, op0=nl.add, operand0=float(eps))
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        normed = nl.ndarray((rows, h), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=normed, data=xt, op0=nl.multiply, operand0=rstd)
        scaled = nl.ndarray((rows, h), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=scaled, data1=normed, data2=w[0:rows, :], op=nl.multiply)
        nisa.dma_copy(dst=out[lo:lo + rows, :], src=scaled)
    return out
