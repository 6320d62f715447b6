"""Fused (flash-style) attention forward for one head.

``flash_attention_fwd`` computes ``softmax(q @ k.T / sqrt(d)) @ v`` without ever holding
the [queries, keys] score matrix: each tile of 128 queries walks the keys in tiles of
128 or 512 and keeps an online softmax (FlashAttention): a running row max ``m``, a
running row sum ``l`` of ``exp(s - m)`` and an unnormalised output ``acc``, all per
query row in SBUF, rescaled by ``exp(m_old - m_new)`` whenever the max grows.

The tensor engine does all the matrix work: q and k tiles are transposed through the PE
array into the [d, 128] layout the contraction needs (d on partitions); the scores of a
query tile against a key tile are one matmul into a PSUM bank; P @ V transposes each
[128, 128] block of the probabilities back through the PE array and accumulates the
blocks' ``P^T.T @ V`` in PSUM.

Engines run their instructions in program order, so one query tile's chain (tensor,
then vector, then scalar, then tensor again) would leave each engine idle while the
others work. Two query tiles therefore go through every step together: while one
waits for the tensor engine, the other keeps the vector and scalar engines busy.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl

TILE_Q = 128          # queries per tile: one per partition
TILE_K = 128          # keys per P @ V block: the contraction runs over partitions
KEY_TILES = (128, 512)
Q_GROUP = 2           # query tiles in flight together; four overflow PSUM in fp32
# exp of this, less any real row max, is exactly 0 in fp32, and it is finite in bf16
MASKED_SCORE = -9984.0


@nki.jit
def flash_attention_fwd(q, k, v, causal=False, key_tile=None):
    """Attention ``softmax(q @ k.T / sqrt(d) [+ causal mask]) @ v`` for one head.

    Args:
        q: [seqlen, d] in HBM, queries; any chip float dtype (fp32 or bf16). d <= 128,
            seqlen a multiple of 128.
        k: [keys, d] in HBM, keys, of ``q``'s dtype; keys a multiple of 128 (by default
            keys == seqlen, as in self-attention).
        v: [keys, d] in HBM, values, of ``q``'s dtype.
        causal: mask out the keys after each query (query i sees keys 0..i, PyTorch's
            top-left aligned causal mask when keys != seqlen).
        key_tile: keys per score tile, 128 or 512 (it must divide keys); by default
            512 when it divides keys, else 128.

    Returns:
        [seqlen, d] in HBM, of ``q``'s dtype.

    Memories: k^T [d, keys] and v (as [128, d] key blocks) are loaded into SBUF once
    and kept (about 4 * keys bytes per partition in bf16, which bounds keys); each
    q tile is loaded into SBUF and transposed to q^T [d, 128] (scaled by 1/sqrt(d)).
    Scores [128, key_tile], P^T blocks and the P @ V partial [128, d] go to PSUM (fp32
    for the matmuls); the probabilities (in the input dtype, the matmul operand type),
    the running max and sum [128, 1] and the output accumulator [128, d] (fp32) live in
    SBUF. Causal masking runs on GpSimd (``affine_select``) for key tiles that cross the
    diagonal; key tiles wholly after a query group are skipped.
    """
    seqlen, d = q.shape
    keys = k.shape[0]
    if key_tile is None:
        key_tile = KEY_TILES[-1] if keys % KEY_TILES[-1] == 0 else KEY_TILES[0]
    if key_tile not in KEY_TILES or keys % key_tile:
        raise nki.KernelError(f"key_tile={key_tile} must be 128 or 512 and divide the number of keys, {keys}")
    if seqlen % TILE_Q or d > nl.tile_size.pmax:
        raise nki.KernelError(f"q is [{seqlen}, {d}]: seqlen must be a multiple of {TILE_Q} and d at most {nl.tile_size.pmax}")
    if tuple(k.shape) != (keys, d) or tuple(v.shape) != (keys, d):
        raise nki.KernelError(f"k is {list(k.shape)} and v is {list(v.shape)}: both must be [keys, {d}], "
                              "with q's head dimension and the same number of keys")
    dtype = q.dtype
    scale = 1.0 / math.sqrt(d)
    out = nl.ndarray((seqlen, d), dtype, buffer=nl.shared_hbm)

    # k^T [d, keys] and the [128, d] blocks of v stay in SBUF for every query tile
    k_t = nl.ndarray((d, keys), dtype)
    v_blocks = []
    for b in nl.affine_range(keys // TILE_K):
        block = slice(b * TILE_K, (b + 1) * TILE_K)
        k_t[:, block] = nl.transpose(nl.load(k[block, :]))
        v_blocks.append(nl.load(v[block, :]))

    group_rows = TILE_Q * Q_GROUP
    for qg in nl.affine_range((seqlen + group_rows - 1) // group_rows):
        q0s = list(range(qg * group_rows, min((qg + 1) * group_rows, seqlen), TILE_Q))
        q_t = [nl.multiply(nl.transpose(nl.load(q[q0:q0 + TILE_Q, :])), scale, dtype=dtype) for q0 in q0s]
        # the running max is kept negated: it is the bias of every exp
        neg_max = [nl.full((TILE_Q, 1), math.inf, nl.float32) for _ in q0s]
        row_sum = [nl.zeros((TILE_Q, 1), nl.float32) for _ in q0s]
        acc = [nl.zeros((TILE_Q, d), nl.float32) for _ in q0s]
        # causal: the key tiles whose first key is at most the group's last query (for the
        # group's first tile the last of them may be wholly masked: it adds exp() = 0)
        key_tiles = keys // key_tile
        if causal:
            key_tiles = min(key_tiles, (q0s[-1] + TILE_Q - 1) // key_tile + 1)
        for kj in nl.static_range(key_tiles):
            k0 = kj * key_tile
            scores = [nl.matmul(qt, k_t[:, k0:k0 + key_tile], transpose_x=True) for qt in q_t]
            if causal:
                scores = [_mask_future_keys(s, q0, k0, key_tile) for s, q0 in zip(scores, q0s)]
            new_neg_max = [nisa.tensor_scalar(data=nl.max(s, axis=1), op0=nl.multiply, operand0=-1.0,
                                              op1=nl.minimum, operand1=nm) for s, nm in zip(scores, neg_max)]
            # alpha = exp(m_old - m_new) rescales what was summed under the old max
            alpha = [nisa.activation(op=nl.exp, data=nm, scale=-1.0, bias=new)
                     for nm, new in zip(neg_max, new_neg_max)]
            tile_sum = [nl.ndarray((TILE_Q, 1), nl.float32) for _ in q0s]
            probs = [nisa.activation(op=nl.exp, data=s, bias=new, reduce_op=nl.add, reduce_res=ts, dtype=dtype)
                     for s, new, ts in zip(scores, new_neg_max, tile_sum)]
            row_sum = [nisa.tensor_scalar(data=rs, op0=nl.multiply, operand0=a, op1=nl.add, operand1=ts)
                       for rs, a, ts in zip(row_sum, alpha, tile_sum)]
            probs_t = [_transpose_blocks(p) for p in probs]
            pv = [_times(pt, v_blocks[k0 // TILE_K:(k0 + key_tile) // TILE_K]) for pt in probs_t]
            acc = [nl.add(nl.multiply(ac, a), x) for ac, a, x in zip(acc, alpha, pv)]
            neg_max = new_neg_max
        for q0, ac, rs in zip(q0s, acc, row_sum):
            nl.store(out[q0:q0 + TILE_Q, :], value=nl.multiply(ac, nl.reciprocal(rs), dtype=dtype))
    return out


def _mask_future_keys(scores, q0, k0, key_tile):
    """``scores`` [128, key_tile] of queries q0.. against keys k0.., with every key after
    its query set to MASKED_SCORE (GpSimd, into SBUF); a tile wholly on or below the
    diagonal comes back as it is."""
    if k0 + key_tile - 1 <= q0:
        return scores
    i_p = nl.arange(TILE_Q)[:, None]
    i_f = nl.arange(key_tile)[None, :]
    return nisa.affine_select(pred=(q0 + i_p - k0 - i_f >= 0), on_true_tile=scores, on_false_value=MASKED_SCORE,
                              dtype=nl.float32)


def _transpose_blocks(probs):
    """P [128 queries, keys] -> P^T in SBUF as [128 keys, keys // 128 blocks of 128 queries]:
    each block through the PE array into one PSUM tile, then one copy out (scalar engine,
    as the vector engine is the busier)."""
    queries, keys = probs.shape
    blocks = nl.ndarray((TILE_K, keys // TILE_K * queries), probs.dtype, buffer=nl.psum)
    for b in nl.affine_range(keys // TILE_K):
        nisa.nc_transpose(dst=blocks[:, b * queries:(b + 1) * queries], data=probs[:, b * TILE_K:(b + 1) * TILE_K])
    return nisa.tensor_copy(src=blocks, dtype=probs.dtype, engine=nisa.scalar_engine)


def _times(probs_t, v_blocks):
    """P @ V [128 queries, d] in PSUM: one matmul per 128-key block, accumulated."""
    queries = probs_t.shape[1] // len(v_blocks)
    pv = nl.zeros((queries, v_blocks[0].shape[1]), nl.float32, buffer=nl.psum)
    for b in nl.affine_range(len(v_blocks)):
        pv += nl.matmul(probs_t[:, b * queries:(b + 1) * queries], v_blocks[b], transpose_x=True)
    return pv
