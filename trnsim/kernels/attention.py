"""Fused (flash-style) attention for one head: forward and backward.

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

``flash_attention_bwd`` is FlashAttention-2's backward: it rebuilds the probabilities
from the forward's logsumexp one [128 queries, 128 keys] block at a time, with the key
blocks outermost (dk and dv accumulate in PSUM; dq in SBUF). Its loop is software
pipelined: one query group's scores and dS are made on the scalar and vector engines
while the tensor engine runs the previous group's five gradient matmuls.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.kernels.preconditions import require, require_multiple

TILE_Q = 128          # queries per tile: one per partition
TILE_K = 128          # keys per P @ V block: the contraction runs over partitions
KEY_TILES = (128, 512)
Q_GROUP = 2           # query tiles in flight together; four overflow PSUM in fp32
HEADS_ROW_BYTES = 64 * 1024   # per partition: the row tiles flash_attention_heads keeps (a third of trn1's SBUF)
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
    require_multiple("flash_attention_fwd", "the number of keys", keys, TILE_K,
                     "pad k and v with keys whose scores are masked out")
    require(key_tile in KEY_TILES and keys % key_tile == 0, "flash_attention_fwd",
            f"needs key_tile 128 or 512 dividing the number of keys, got key_tile = {key_tile} for {keys} keys; "
            "leave key_tile unset to pick one")
    require_multiple("flash_attention_fwd", "seqlen", seqlen, TILE_Q,
                     "pad q [seqlen, d] with rows and drop their outputs")
    require(d <= nl.tile_size.pmax, "flash_attention_fwd",
            f"needs a head dimension d of at most {nl.tile_size.pmax}, got q [{seqlen}, {d}]; split the head")
    check_keys_and_values(k, v, keys, d)
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
            neg_max, row_sum, acc = online_softmax_step(scores, neg_max, row_sum, acc,
                                                        v_blocks[k0 // TILE_K:(k0 + key_tile) // TILE_K], dtype)
        for q0, ac, rs in zip(q0s, acc, row_sum):
            nl.store(out[q0:q0 + TILE_Q, :], value=nl.multiply(ac, nl.reciprocal(rs), dtype=dtype))
    return out


def heads_row_bytes(seqlen: int, keys: int, width: int, itemsize: int) -> int:
    """SBUF bytes per partition that :func:`flash_attention_heads` keeps in row tiles."""
    return (seqlen // TILE_Q * 2 + 2 * keys // TILE_K) * width * itemsize


@nki.jit
def flash_attention_heads(q, k, v, heads, causal=False):
    """:func:`flash_attention_fwd` for ``heads`` heads whose rows lie side by side, as a
    model's projection makes them: the [seqlen, heads * d] rows of q (and of k and v)
    are loaded once for every head (``heads * d`` elements per row and DMA descriptor,
    where one head's slice is ``d``), each head works on its columns in SBUF, and the
    output rows are stored once.

    Args:
        q: [seqlen, heads * d] in HBM, fp32 or bf16; head h's queries are columns
            h * d .. (h + 1) * d. d <= 128, seqlen a multiple of 128.
        k: [keys, heads * d] in HBM, of ``q``'s dtype; keys a multiple of 128.
        v: [keys, heads * d] in HBM, of ``q``'s dtype.
        heads: the number of heads.
        causal: mask out the keys after each query (top-left aligned, as in the one-head kernel).

    Returns:
        [seqlen, heads * d] in HBM, of ``q``'s dtype, each head's output in its columns.

    Memories: the row tiles of q, k, v and the output, [128, heads * d] each, stay in
    SBUF (``2 * seqlen / 128 + 2 * keys / 128`` of them, at most 64 KiB per partition); per
    head, k^T [d, keys] is transposed from them through the PE array; the rest is the
    one-head kernel's, two (head, query tile) items in flight at a time.
    """
    seqlen, width = q.shape
    keys = k.shape[0]
    require(heads >= 1 and width % heads == 0, "flash_attention_heads",
            f"needs the row width to be heads * d, got q [{seqlen}, {width}] for {heads} heads")
    d = width // heads
    key_tile = KEY_TILES[-1] if keys % KEY_TILES[-1] == 0 else KEY_TILES[0]
    require_multiple("flash_attention_heads", "the number of keys", keys, TILE_K,
                     "pad k and v with keys whose scores are masked out")
    require_multiple("flash_attention_heads", "seqlen", seqlen, TILE_Q, "pad q with rows and drop their outputs")
    require(d <= nl.tile_size.pmax, "flash_attention_heads",
            f"needs a head dimension d of at most {nl.tile_size.pmax}, got {width} columns for {heads} heads")
    check_keys_and_values(k, v, keys, width)
    row_bytes = heads_row_bytes(seqlen, keys, width, q.dtype.itemsize)
    require(row_bytes <= HEADS_ROW_BYTES, "flash_attention_heads",
            f"keeps every row tile in SBUF: {row_bytes} bytes per partition for q [{seqlen}, {width}] and "
            f"{keys} keys, over its {HEADS_ROW_BYTES}; run flash_attention_fwd per head")
    dtype = q.dtype
    scale = 1.0 / math.sqrt(d)
    out = nl.ndarray((seqlen, width), dtype, buffer=nl.shared_hbm)
    q_rows = [nl.load(q[t * TILE_Q:(t + 1) * TILE_Q, :]) for t in range(seqlen // TILE_Q)]
    k_rows = [nl.load(k[b * TILE_K:(b + 1) * TILE_K, :]) for b in range(keys // TILE_K)]
    v_rows = [nl.load(v[b * TILE_K:(b + 1) * TILE_K, :]) for b in range(keys // TILE_K)]
    out_rows = [nl.ndarray((TILE_Q, width), dtype) for _ in q_rows]
    items = [(h, t) for h in range(heads) for t in range(len(q_rows))]
    k_ts: dict[int, object] = {}
    for g in range(0, len(items), Q_GROUP):
        group = items[g:g + Q_GROUP]
        for h in sorted({h for h, _ in group} - set(k_ts)):
            k_t = nl.ndarray((d, keys), dtype)
            for b, rows in enumerate(k_rows):
                k_t[:, b * TILE_K:(b + 1) * TILE_K] = nl.transpose(rows[:, h * d:(h + 1) * d])
            k_ts = {h: k_t} if len(k_ts) >= Q_GROUP else {**k_ts, h: k_t}
        q0s = [t * TILE_Q for _, t in group]
        cols = [slice(h * d, (h + 1) * d) for h, _ in group]
        q_t = [nl.multiply(nl.transpose(q_rows[t][:, c]), scale, dtype=dtype) for (_, t), c in zip(group, cols)]
        neg_max = [nl.full((TILE_Q, 1), math.inf, nl.float32) for _ in group]
        row_sum = [nl.zeros((TILE_Q, 1), nl.float32) for _ in group]
        acc = [nl.zeros((TILE_Q, d), nl.float32) for _ in group]
        key_tiles = keys // key_tile
        if causal:
            key_tiles = min(key_tiles, (max(q0s) + TILE_Q - 1) // key_tile + 1)
        for kj in nl.static_range(key_tiles):
            k0 = kj * key_tile
            scores = [nl.matmul(qt, k_ts[h][:, k0:k0 + key_tile], transpose_x=True) for qt, (h, _) in zip(q_t, group)]
            if causal:
                scores = [_mask_future_keys(s, q0, k0, key_tile) for s, q0 in zip(scores, q0s)]
            blocks = range(k0 // TILE_K, (k0 + key_tile) // TILE_K)
            v_blocks = [[v_rows[b][:, c] for b in blocks] for c in cols]
            neg_max, row_sum, acc = online_softmax_step(scores, neg_max, row_sum, acc, v_blocks, dtype)
        for (_, t), c, ac, rs in zip(group, cols, acc, row_sum):
            out_rows[t][:, c] = nl.multiply(ac, nl.reciprocal(rs), dtype=dtype)
    for t, rows in enumerate(out_rows):
        nl.store(out[t * TILE_Q:(t + 1) * TILE_Q, :], value=rows)
    return out


def online_softmax_step(scores, neg_max, row_sum, acc, v_blocks, dtype):
    """One key tile of the online softmax for each query tile in flight: ``scores``
    [128, key_tile] (PSUM or SBUF, fp32), the running negated row max and row sum [128, 1]
    and the unnormalised output ``acc`` [128, d] (SBUF, fp32), and the tile's value
    blocks ``v_blocks`` ([128, d] each, SBUF; a list of them per query tile when the
    tiles in flight are of different heads). Returns the new (neg_max, row_sum, acc)."""
    per_tile = v_blocks if v_blocks and isinstance(v_blocks[0], list) else [v_blocks] * len(scores)
    new_neg_max = [nisa.tensor_scalar(data=nl.max(s, axis=1), op0=nl.multiply, operand0=-1.0,
                                      op1=nl.minimum, operand1=nm) for s, nm in zip(scores, neg_max)]
    # alpha = exp(m_old - m_new) rescales what was summed under the old max
    alpha = [nisa.activation(op=nl.exp, data=nm, scale=-1.0, bias=new) for nm, new in zip(neg_max, new_neg_max)]
    tile_sum = [nl.ndarray((TILE_Q, 1), nl.float32) for _ in scores]
    probs = [nisa.activation(op=nl.exp, data=s, bias=new, reduce_op=nl.add, reduce_res=ts, dtype=dtype)
             for s, new, ts in zip(scores, new_neg_max, tile_sum)]
    row_sum = [nisa.tensor_scalar(data=rs, op0=nl.multiply, operand0=a, op1=nl.add, operand1=ts)
               for rs, a, ts in zip(row_sum, alpha, tile_sum)]
    probs_t = [_transpose_blocks(p) for p in probs]
    pv = [_times(pt, vb) for pt, vb in zip(probs_t, per_tile)]
    acc = [nl.add(nl.multiply(ac, a), x) for ac, a, x in zip(acc, alpha, pv)]
    return new_neg_max, row_sum, acc


def check_keys_and_values(k, v, keys: int, d: int) -> None:
    if tuple(k.shape) != (keys, d) or tuple(v.shape) != (keys, d):
        raise nki.KernelError(f"k is {list(k.shape)} and v is {list(v.shape)}: both must be [keys, {d}], "
                              "with q's head dimension and the same number of keys")


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


@nki.jit
def flash_attention_bwd(q, k, v, o, d_o, lse, scale=None, causal=False):
    """The gradients of ``o = softmax(scale * q @ k.T [+ causal mask]) @ v`` for one head
    (FlashAttention-2's backward): dq, dk and dv from the output gradient ``d_o``.

    Args:
        q: [seqlen, d] in HBM, queries; fp32 or bf16. d <= 128, seqlen a multiple of 128.
        k: [keys, d] in HBM, keys, of ``q``'s dtype; keys a multiple of 128.
        v: [keys, d] in HBM, values, of ``q``'s dtype.
        o: [seqlen, d] in HBM, the forward's output, of ``q``'s dtype.
        d_o: [seqlen, d] in HBM, the gradient of the loss with respect to ``o``.
        lse: [seqlen] or [seqlen, 1] in HBM, fp32: each query's natural-log sum of
            exp of its scaled (and masked) scores, ``log(sum_j exp(scale * q_i . k_j))``,
            as PyTorch's flash attention returns it. ``flash_attention_fwd`` does not
            output it; the caller computes it.
        scale: the score scale; by default ``1 / sqrt(d)``, as in the forward.
        causal: the forward's mask (query i sees keys 0..i, top-left aligned).

    Returns:
        (dq [seqlen, d], dk [keys, d], dv [keys, d]) in HBM, of ``q``'s dtype.

    Algorithm: ``D_i = rowsum(dO_i * O_i)`` once per 128-query block; then for each
    128-key block j, over the query blocks i that see any of its keys, recompute
    ``P = exp(scale * q_i k_j^T - lse_i)`` and accumulate ``dv_j += P^T dO_i``,
    ``dS = P * (dO_i v_j^T - D_i)``, ``dk_j += dS^T q_i`` and ``dq_i += dS k_j``
    (``scale`` is applied to dk and dq once, at the end).

    Memories: every query block's q, q^T, dO, dO^T (input dtype), ``-lse`` and ``D``
    ([128, 1] fp32) and dq accumulator ([128, d] fp32) stay in SBUF for the whole
    kernel (about 12 * seqlen bytes per partition in bf16, which bounds seqlen); one key
    block's k, k^T and v^T are loaded per j (transposes through the PE array). Scores
    and dP [128, 128], dk and dv accumulators [128, d], dS^T and the dq partial go to
    PSUM (fp32 from the matmuls); P and dS (input dtype, the matmul operand type) live in
    SBUF. Causal: diagonal blocks zero P above the diagonal on GpSimd
    (``affine_select``); blocks wholly above it are skipped. As in the forward, two
    query blocks go through every step together, and each pair's P and dS (scalar and
    vector engines; ``dP - D`` is an activation bias) are made while the tensor engine
    runs the previous pair's dv, dk, dS^T and dq matmuls.
    """
    seqlen, d = q.shape
    keys = k.shape[0]
    if seqlen % TILE_Q or keys % TILE_K or d > nl.tile_size.pmax:
        raise nki.KernelError(f"q is [{seqlen}, {d}] and k is {list(k.shape)}: seqlen and keys must be multiples of "
                              f"{TILE_Q} and d at most {nl.tile_size.pmax}")
    check_keys_and_values(k, v, keys, d)
    if tuple(o.shape) != (seqlen, d) or tuple(d_o.shape) != (seqlen, d):
        raise nki.KernelError(f"o is {list(o.shape)} and d_o is {list(d_o.shape)}: both must be q's shape, "
                              f"[{seqlen}, {d}]")
    if tuple(lse.shape) not in ((seqlen,), (seqlen, 1)):
        raise nki.KernelError(f"lse is {list(lse.shape)}: it must be [{seqlen}] or [{seqlen}, 1], one per query")
    if len(lse.shape) == 1:
        lse = lse.reshape((seqlen, 1))
    dtype = q.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    dq = nl.ndarray((seqlen, d), dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((keys, d), dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((keys, d), dtype, buffer=nl.shared_hbm)
    q_rows, q_cols, do_rows, do_cols, neg_lse, neg_delta = query_blocks(q, o, d_o, lse, seqlen, dtype)
    dq_acc = [None] * (seqlen // TILE_Q)

    for kj in nl.affine_range(keys // TILE_K):
        k0 = kj * TILE_K
        k_rows = nl.load(k[k0:k0 + TILE_K, :])
        k_cols = nl.copy(nl.transpose(k_rows), dtype=dtype)
        v_cols = nl.copy(nl.transpose(nl.load(v[k0:k0 + TILE_K, :])), dtype=dtype)
        dk_acc = nl.zeros((TILE_K, d), nl.float32, buffer=nl.psum)
        dv_acc = nl.zeros((TILE_K, d), nl.float32, buffer=nl.psum)
        # causal: only the query blocks from the diagonal on see any of these keys
        first = min(k0, seqlen) // TILE_Q if causal else 0
        blocks = list(range(first, seqlen // TILE_Q))
        # software-pipelined: one group's scores and dS are made while the tensor
        # engine runs the previous group's gradient matmuls
        pending = None
        for g in nl.static_range(0, len(blocks) + Q_GROUP, Q_GROUP):
            group = blocks[g:g + Q_GROUP]
            ready = probs_and_d_scores(group, k0, k_cols, v_cols, q_cols, do_cols, neg_lse, neg_delta, scale,
                                       _zero_future_keys if causal else None, dtype) if group else None
            if pending is not None:
                dk_acc, dv_acc = gradients(*pending, k_rows, q_rows, do_rows, dq_acc, dk_acc, dv_acc)
            pending = ready
        nl.store(dv[k0:k0 + TILE_K, :], value=nl.copy(dv_acc, dtype=dtype))
        nl.store(dk[k0:k0 + TILE_K, :], value=nl.multiply(dk_acc, scale, dtype=dtype))
    for qi, acc in enumerate(dq_acc):   # every query sees key 0, so every block has a partial
        nl.store(dq[qi * TILE_Q:(qi + 1) * TILE_Q, :], value=nl.multiply(acc, scale, dtype=dtype))
    return dq, dk, dv


def query_blocks(q, o, d_o, lse, seqlen: int, dtype) -> tuple[list, list, list, list, list, list]:
    """What the backward keeps in SBUF per block of TILE_Q queries, across every key
    block: q and d_o as rows [TILE_Q, d] and as columns [d, TILE_Q] (transposed on the PE
    array), -lse, and -delta = -rowsum(d_o * o) in fp32 [TILE_Q, 1]."""
    q_rows, q_cols, do_rows, do_cols, neg_lse, neg_delta = [], [], [], [], [], []
    for qi in nl.affine_range(seqlen // TILE_Q):
        rows = slice(qi * TILE_Q, (qi + 1) * TILE_Q)
        q_rows.append(nl.load(q[rows, :]))
        q_cols.append(nl.copy(nl.transpose(q_rows[-1]), dtype=dtype))
        do_rows.append(nl.load(d_o[rows, :]))
        do_cols.append(nl.copy(nl.transpose(do_rows[-1]), dtype=dtype))
        neg_lse.append(nl.multiply(nl.load(lse[rows, :]), -1.0, dtype=nl.float32))
        do_times_o = nl.multiply(do_rows[-1], nl.load(o[rows, :]), dtype=nl.float32)
        neg_delta.append(nisa.tensor_reduce(op=nl.add, data=do_times_o, axis=1, negate=True, keepdims=True,
                                            dtype=nl.float32))
    return q_rows, q_cols, do_rows, do_cols, neg_lse, neg_delta


def probs_and_d_scores(group, k0, k_cols, v_cols, q_cols, do_cols, neg_lse, neg_delta, scale, mask_block, dtype):
    """P = exp(scale * q_i k_j^T - lse_i) and dS = P * (dO_i v_j^T - D_i), [128, 128] each
    in SBUF (``dtype``), for each query block i of ``group`` against the key block at k0;
    ``mask_block(P, q0, k0)``, where given, zeroes the probabilities of masked keys."""
    scores = [nl.matmul(q_cols[i], k_cols, transpose_x=True) for i in group]
    d_probs = [nl.matmul(do_cols[i], v_cols, transpose_x=True) for i in group]
    probs = [nisa.activation(op=nl.exp, data=s, scale=scale, bias=neg_lse[i], dtype=dtype)
             for s, i in zip(scores, group)]
    if mask_block is not None:
        probs = [mask_block(p, i * TILE_Q, k0) for p, i in zip(probs, group)]
    # dP - D on the scalar engine (a bias), so the vector engine's product is all in SBUF
    shifted = [nisa.activation(op=nl.copy, data=dp, bias=neg_delta[i], dtype=dtype)
               for dp, i in zip(d_probs, group)]
    d_scores = [nisa.tensor_tensor(data1=sh, data2=p, op=nl.multiply, dtype=dtype) for sh, p in zip(shifted, probs)]
    return group, probs, d_scores


def gradients(group, probs, d_scores, k_rows, q_rows, do_rows, dq_acc, dk_acc, dv_acc):
    """dv_j += P^T dO_i and dk_j += dS^T q_i (PSUM), and dq_i += dS k_j (SBUF fp32) for
    each query block i of ``group``; dS^T goes through the PE array."""
    for p, i in zip(probs, group):
        dv_acc += nl.matmul(p, do_rows[i], transpose_x=True)
    for ds, i in zip(d_scores, group):
        dk_acc += nl.matmul(ds, q_rows[i], transpose_x=True)
    d_scores_t = [nisa.tensor_copy(src=nisa.nc_transpose(data=ds), dtype=ds.dtype, engine=nisa.scalar_engine)
                  for ds in d_scores]
    for dst, i in zip(d_scores_t, group):
        part = nl.matmul(dst, k_rows, transpose_x=True)
        dq_acc[i] = (nisa.tensor_copy(src=part, dtype=nl.float32) if dq_acc[i] is None
                     else nl.add(dq_acc[i], part, dtype=nl.float32))
    return dk_acc, dv_acc


def _zero_future_keys(probs, q0, k0):
    """``probs`` [128, 128] of queries q0.. against keys k0.., with every key after its
    query set to 0 (GpSimd); a block wholly on or below the diagonal comes back as it is."""
    if k0 + TILE_K - 1 <= q0:
        return probs
    i_p = nl.arange(TILE_Q)[:, None]
    i_f = nl.arange(TILE_K)[None, :]
    return nisa.affine_select(pred=(q0 + i_p - k0 - i_f >= 0), on_true_tile=probs, on_false_value=0.0,
                              dtype=probs.dtype)
