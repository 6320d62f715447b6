"""Llama's SwiGLU MLP as one NKI kernel: gate and up matmuls, SiLU, product and down
matmul without the intermediate activations leaving the chip."""

import nki
import nki.isa as nisa
import nki.language as nl


def _chunks(size, step):
    return [(lo, min(step, size - lo)) for lo in range(0, size, step)]


def _transpose_into(dst, src):
    """SBUF ``src`` [P, F] (both at most 128) into SBUF ``dst`` [F, P], through the PE
    array and PSUM."""
    p, f = src.shape
    flipped = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=flipped, data=src)
    nisa.tensor_copy(dst=dst, src=flipped)


@nki.jit
def nki_swiglu_mlp(x, w_gate, w_up, w_down):
    """``(silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T`` (Llama's MLP, no bias).

    x: [N, H] in HBM; w_gate, w_up: [I, H] and w_down: [H, I] in HBM, in
    ``nn.Linear``'s [out, in] layout; float32 or bfloat16, all of one dtype; H at most
    512 (the output row is one PSUM bank of fp32). Returns [N, H] in HBM of x's dtype.

    The weights are read once per call, row-contiguous, and transposed on the tensor
    engine (through PSUM) so that the contracted axis lies on the partitions. For each
    tile of 128 rows, x is read and transposed likewise ([H, rows]); the gate and up
    projections are computed transposed ([I, rows], 128 rows of I at a time,
    accumulated over H in PSUM), SiLU runs on the scalar engine straight from PSUM, the
    product on the vector engine, and the down projection accumulates over I in PSUM.
    Only x, the weights and the result cross HBM.
    """
    n, h = x.shape
    inter = w_gate.shape[0]
    pmax = nl.tile_size.pmax
    if h > nl.tile_size.psum_fmax:
        raise ValueError(f"nki_swiglu_mlp: hidden size {h} exceeds {nl.tile_size.psum_fmax}; split the output")
    if tuple(w_up.shape) != (inter, h) or tuple(w_down.shape) != (h, inter):
        raise ValueError(f"nki_swiglu_mlp: weights {list(w_gate.shape)}, {list(w_up.shape)}, {list(w_down.shape)} "
                         f"do not fit x {list(x.shape)}: want [I, {h}], [I, {h}], [{h}, I]")
    out = nl.ndarray((n, h), dtype=x.dtype, buffer=nl.shared_hbm)
    h_chunks = _chunks(h, pmax)
    i_chunks = _chunks(inter, pmax)

    gate_t = [nl.ndarray((size, inter), dtype=w_gate.dtype, buffer=nl.sbuf) for _, size in h_chunks]
    up_t = [nl.ndarray((size, inter), dtype=w_up.dtype, buffer=nl.sbuf) for _, size in h_chunks]
    for lo_i, size_i in i_chunks:
        for w, w_t in ((w_gate, gate_t), (w_up, up_t)):
            rows_w = nl.ndarray((size_i, h), dtype=w.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=rows_w, src=w[lo_i:lo_i + size_i, :])
            for k, (lo, size) in enumerate(h_chunks):
                _transpose_into(w_t[k][:, lo_i:lo_i + size_i], rows_w[:, lo:lo + size])
    down_t = [nl.ndarray((size, h), dtype=w_down.dtype, buffer=nl.sbuf) for _, size in i_chunks]
    for lo, size in h_chunks:
        rows_w = nl.ndarray((size, inter), dtype=w_down.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows_w, src=w_down[lo:lo + size, :])
        for k, (lo_i, size_i) in enumerate(i_chunks):
            _transpose_into(down_t[k][:, lo:lo + size], rows_w[:, lo_i:lo_i + size_i])

    for t in nl.affine_range((n + pmax - 1) // pmax):
        lo_n = t * pmax
        rows = min(pmax, n - lo_n)
        x_rows = nl.ndarray((rows, h), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_rows, src=x[lo_n:lo_n + rows, :])
        x_t = []
        for lo, size in h_chunks:
            xc = nl.ndarray((size, rows), dtype=x.dtype, buffer=nl.sbuf)
            _transpose_into(xc, x_rows[:, lo:lo + size])
            x_t.append(xc)
        acts = []
        for lo_i, size_i in i_chunks:
            gate = nl.ndarray((size_i, rows), dtype=nl.float32, buffer=nl.psum)
            up = nl.ndarray((size_i, rows), dtype=nl.float32, buffer=nl.psum)
            for k in range(len(h_chunks)):
                nisa.nc_matmul(gate, gate_t[k][:, lo_i:lo_i + size_i], x_t[k])
                nisa.nc_matmul(up, up_t[k][:, lo_i:lo_i + size_i], x_t[k])
            silu = nl.ndarray((size_i, rows), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=silu, op=nl.silu, data=gate)
            act = nl.ndarray((size_i, rows), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=act, data1=silu, data2=up, op=nl.multiply)
            acts.append(act)
        acc = nl.ndarray((rows, h), dtype=nl.float32, buffer=nl.psum)
        for k in range(len(i_chunks)):
            nisa.nc_matmul(acc, acts[k], down_t[k])
        result = nl.ndarray((rows, h), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=result, src=acc)
        nisa.dma_copy(dst=out[lo_n:lo_n + rows, :], src=result)
    return out
