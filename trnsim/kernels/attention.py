"""Fused (flash-style) attention forward for one head.

``flash_attention_fwd`` computes ``softmax(q @ k.T / sqrt(d)) @ v`` without ever holding
the [seqlen, seqlen] score matrix: for each tile of 128 queries it walks the keys in
tiles of 128 or 512 and keeps an online softmax (FlashAttention): a running row max
``m``, a running row sum ``l`` of ``exp(s - m)`` and an unnormalised output ``acc``, all
per query row in SBUF, rescaled by ``exp(m_old - m_new)`` whenever the max grows.

The tensor engine does all the matrix work: q and k tiles are transposed through the PE
array into the [d, 128] layout the contraction needs (d on partitions); the scores of a
query tile against a key tile are one matmul into a PSUM bank; P @ V transposes each
[128, 128] block of the probabilities back through the PE array and accumulates
``P^T.T @ V`` blocks in PSUM.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

TILE_Q = 128          # queries per tile: one per partition
TILE_K = 128          # keys per P @ V block: the contraction runs over partitions
KEY_TILES = (128, 512)
# exp of this, less any real row max, is exactly 0 in fp32, and it is finite in bf16
MASKED_SCORE = -9984.0


@nki.jit
def flash_attention_fwd(q, k, v, causal=False, key_tile=None):
    """Attention ``softmax(q @ k.T / sqrt(d) [+ causal mask]) @ v`` for one head.

    Args:
        q: [seqlen, d] in HBM, queries; any chip float dtype (fp32 or bf16). d <= 128,
            seqlen a multiple of 128.
        k: [seqlen, d] in HBM, keys, of ``q``'s dtype.
        v: [seqlen, d] in HBM, values, of ``q``'s dtype.
        causal: mask out keys after each query (query i sees keys 0..i).
        key_tile: keys per score tile, 128 or 512 (it must divide seqlen); by default
            512 when it divides seqlen, else 128.

    Returns:
        [seqlen, d] in HBM, of ``q``'s dtype.

    Memories: k^T [d, seqlen] and v (as [128, d] key blocks) are loaded and kept in SBUF
    once (they take about 4 * seqlen bytes per partition in bf16); each q tile is loaded
    into SBUF and transposed to q^T [d, 128] (scaled by 1/sqrt(d)). Scores [128, key_tile]
    and the P @ V partial [128, d] accumulate in fp32 PSUM; the probabilities (in the
    input dtype, the matmul operand type), the running max and sum [128, 1] and the
    output accumulator [128, d] (fp32) live in SBUF. Causal masking runs on GpSimd
    (``affine_select``) for key tiles that cross the diagonal; tiles wholly above it are
    skipped.
    """
    seqlen, d = q.shape
    if key_tile is None:
        key_tile = KEY_TILES[-1] if seqlen % KEY_TILES[-1] == 0 else KEY_TILES[0]
    if key_tile not in KEY_TILES or seqlen % key_tile:
        raise nki.KernelError(f"key_tile={key_tile} must be 128 or 512 and divide seqlen={seqlen}")
    if seqlen % TILE_Q or d > nl.tile_size.pmax:
        raise nki.KernelError(f"q is [{seqlen}, {d}]: seqlen must be a multiple of {TILE_Q} and d at most {nl.tile_size.pmax}")
    dtype = q.dtype
    scale = 1.0 / math.sqrt(d)
    out = nl.ndarray((seqlen, d), dtype, buffer=nl.shared_hbm)

    # k^T [d, seqlen] and the [128, d] blocks of v stay in SBUF for every query tile
    k_t = nl.ndarray((d, seqlen), dtype)
    v_blocks = []
    for b in nl.affine_range(seqlen // TILE_K):
        keys = slice(b * TILE_K, (b + 1) * TILE_K)
        k_t[:, keys] = nl.transpose(nl.load(k[keys, :]))
        v_blocks.append(nl.load(v[keys, :]))

    i_p = nl.arange(TILE_Q)[:, None]
    i_f = nl.arange(key_tile)[None, :]
    for qi in nl.affine_range(seqlen // TILE_Q):
        q0 = qi * TILE_Q
        q_t = nl.multiply(nl.transpose(nl.load(q[q0:q0 + TILE_Q, :])), scale, dtype=dtype)
        # the running max is kept negated: it is the bias of every exp
        neg_max = nl.full((TILE_Q, 1), math.inf, nl.float32)
        row_sum = nl.zeros((TILE_Q, 1), nl.float32)
        acc = nl.zeros((TILE_Q, d), nl.float32)
        # causal: key tile kj is needed while its first key is at most the last query
        key_tiles = (q0 + TILE_Q - 1) // key_tile + 1 if causal else seqlen // key_tile
        for kj in nl.static_range(key_tiles):
            k0 = kj * key_tile
            scores = nl.matmul(q_t, k_t[:, k0:k0 + key_tile], transpose_x=True)
            if causal and k0 + key_tile - 1 > q0:
                scores = nisa.affine_select(pred=(q0 + i_p - k0 - i_f >= 0), on_true_tile=scores,
                                            on_false_value=MASKED_SCORE, dtype=nl.float32)
            tile_max = nl.max(scores, axis=1)
            new_neg_max = nisa.tensor_scalar(data=tile_max, op0=nl.multiply, operand0=-1.0, op1=nl.minimum, operand1=neg_max)
            # alpha = exp(m_old - m_new) rescales what was summed under the old max
            alpha = nisa.activation(op=nl.exp, data=neg_max, scale=-1.0, bias=new_neg_max)
            tile_sum = nl.ndarray((TILE_Q, 1), nl.float32)
            probs = nisa.activation(op=nl.exp, data=scores, bias=new_neg_max, reduce_op=nl.add, reduce_res=tile_sum,
                                    dtype=dtype)
            row_sum = nisa.tensor_scalar(data=row_sum, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=tile_sum)
            # P^T, one [128 keys, 128 queries] block per 128 keys, side by side in one PSUM tile
            probs_t_psum = nl.ndarray((TILE_K, key_tile), dtype, buffer=nl.psum)
            for b in nl.affine_range(key_tile // TILE_K):
                nisa.nc_transpose(dst=probs_t_psum[:, b * TILE_K:(b + 1) * TILE_K], data=probs[:, b * TILE_K:(b + 1) * TILE_K])
            probs_t = nisa.tensor_copy(src=probs_t_psum, dtype=dtype, engine=nisa.scalar_engine)
            pv = nl.zeros((TILE_Q, d), nl.float32, buffer=nl.psum)
            for b in nl.affine_range(key_tile // TILE_K):
                pv += nl.matmul(probs_t[:, b * TILE_K:(b + 1) * TILE_K], v_blocks[k0 // TILE_K + b], transpose_x=True)
            acc = nl.add(nl.multiply(acc, alpha), pv)
            neg_max = new_neg_max
        y = nl.multiply(acc, nl.reciprocal(row_sum), dtype=dtype)
        nl.store(out[q0:q0 + TILE_Q, :], value=y)
    return out
