"""Block-sparse flash attention, forward and backward, for one head: FlexAttention's kernels.

FlexAttention describes its mask by blocks (a ``BlockMask``): for each block of queries,
the key blocks it attends to, each either *full* (every key kept) or *partial* (the
mask cuts it). These kernels are :mod:`trnsim.kernels.attention`'s flash kernels run
over those blocks only, at the kernels' 128-row tile: a block nobody attends to is
never loaded, multiplied or exponentiated, so a causal mask costs about half the dense
work and a sliding window or a document mask less still. The forward takes runs of up
to four consecutive key blocks as one score tile, as the dense kernel's 512-key tiles;
full blocks run as in the dense kernel, and a tile with a partial block also reads its
tile of the mask (uint8, from HBM) and selects the kept scores on the vector engine,
where the GPU kernel evaluates ``mask_mod`` in registers.

The blocks are given as :data:`Blocks`, one tuple per 128-query tile of ``(key block,
partial)`` pairs in ascending order. Two query tiles go through every step together,
as in the dense kernels; a key block one of them does not attend to is read for both
and the other's scores are all masked (its mask tile is all zeros).

A query row that attends to no key in the blocks it visits (possible only in a partial
block) averages the visited values here, where FlexAttention gives 0; rows of a query
tile with no block at all give 0 and a logsumexp of -inf, as FlexAttention does.
``score_mod`` is not applied.
"""

import math

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.kernels.attention import (KEY_TILES, MASKED_SCORE, Q_GROUP, TILE_K, TILE_Q, check_keys_and_values,
                                      gradients, online_softmax_step, probs_and_d_scores, query_blocks)
from trnsim.kernels.preconditions import require

#: Per 128-query tile, the 128-key blocks it attends to: ``(block, partial)`` pairs, ascending.
Blocks = tuple[tuple[tuple[int, bool], ...], ...]


def _check(name: str, q, k, v, mask, blocks: Blocks) -> tuple[int, int, int]:
    seqlen, d = q.shape
    keys = k.shape[0]
    require(seqlen % TILE_Q == 0 and keys % TILE_K == 0 and d <= nl.tile_size.pmax, name,
            f"needs seqlen and keys multiples of {TILE_Q} and d at most {nl.tile_size.pmax}, got q [{seqlen}, {d}] "
            f"and k {list(k.shape)}; pad the sequences (masked) and split the head")
    check_keys_and_values(k, v, keys, d)
    require(tuple(mask.shape) == (seqlen, keys), name,
            f"needs a mask [{seqlen}, {keys}] (queries, keys), got {list(mask.shape)}")
    require(len(blocks) == seqlen // TILE_Q and all(0 <= b < keys // TILE_K for tile in blocks for b, _ in tile),
            name, f"needs one tuple of (key block, partial) pairs per {TILE_Q}-query tile ({seqlen // TILE_Q}), "
                  f"each block below {keys // TILE_K}; got {len(blocks)} tiles")
    return seqlen, keys, d


def _masked_scores(scores, mask, q0: int, k0: int):
    """``scores`` [128, keys] (fp32) of queries q0.. against keys k0.., with the keys
    ``mask`` drops set to MASKED_SCORE (SBUF)."""
    keep = nl.load(mask[q0:q0 + TILE_Q, k0:k0 + scores.shape[1]])
    return nl.where(keep, scores, MASKED_SCORE, dtype=nl.float32)


def _spans(key_blocks: list[int]) -> list[list[int]]:
    """Runs of consecutive key blocks, each at most a 512-key score tile (one PSUM bank
    of fp32), as the dense kernel's key tiles."""
    most = KEY_TILES[-1] // TILE_K
    spans: list[list[int]] = []
    for b in key_blocks:
        if spans and b == spans[-1][-1] + 1 and len(spans[-1]) < most:
            spans[-1].append(b)
        else:
            spans.append([b])
    return spans


@nki.jit
def block_sparse_attention_fwd(q, k, v, mask, blocks, scale=None):
    """FlexAttention's forward for one head: ``softmax(scale * q @ k.T, masked) @ v`` over
    the blocks in ``blocks``.

    Args:
        q: [seqlen, d] in HBM, queries; fp32 or bf16. d <= 128, seqlen a multiple of 128.
        k: [keys, d] in HBM, keys, of ``q``'s dtype; keys a multiple of 128.
        v: [keys, d] in HBM, values, of ``q``'s dtype.
        mask: [seqlen, keys] in HBM, uint8: 1 where a query attends to a key; only the
            tiles of partial blocks are read.
        blocks: :data:`Blocks`, the key blocks each query tile attends to.
        scale: the score scale; by default ``1 / sqrt(d)``.

    Returns:
        (out [seqlen, d] of ``q``'s dtype, lse [seqlen, 1] fp32: each query's natural-log
        sum of exp of its scaled kept scores, -inf for a query tile with no block), in HBM.

    Memories: as ``flash_attention_fwd`` with 128-key tiles: k^T and v blocks in SBUF
    for the whole kernel, scores and P @ V partials in PSUM, the online softmax's max,
    sum and accumulator in SBUF (fp32); a partial block's mask tile [128, 128] (uint8)
    is loaded into SBUF.
    """
    seqlen, keys, d = _check("block_sparse_attention_fwd", q, k, v, mask, blocks)
    dtype = q.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    out = nl.ndarray((seqlen, d), dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((seqlen, 1), nl.float32, buffer=nl.shared_hbm)

    k_t = nl.ndarray((d, keys), dtype)
    v_blocks = []
    for b in nl.affine_range(keys // TILE_K):
        block = slice(b * TILE_K, (b + 1) * TILE_K)
        k_t[:, block] = nl.transpose(nl.load(k[block, :]))
        v_blocks.append(nl.load(v[block, :]))

    for t in nl.static_range(seqlen // TILE_Q):
        if not blocks[t]:
            nl.store(out[t * TILE_Q:(t + 1) * TILE_Q, :], value=nl.zeros((TILE_Q, d), dtype))
            nl.store(lse[t * TILE_Q:(t + 1) * TILE_Q, :], value=nl.full((TILE_Q, 1), -math.inf, nl.float32))
    active = [t for t in range(seqlen // TILE_Q) if blocks[t]]
    for g in nl.static_range(0, len(active), Q_GROUP):
        group = active[g:g + Q_GROUP]
        visited = [dict(blocks[t]) for t in group]
        spans = _spans(sorted(set().union(*visited)))
        q_t = [nl.multiply(nl.transpose(nl.load(q[t * TILE_Q:(t + 1) * TILE_Q, :])), scale, dtype=dtype)
               for t in group]
        neg_max = [nl.full((TILE_Q, 1), math.inf, nl.float32) for _ in group]
        row_sum = [nl.zeros((TILE_Q, 1), nl.float32) for _ in group]
        acc = [nl.zeros((TILE_Q, d), nl.float32) for _ in group]
        for si in nl.static_range(len(spans)):
            span = spans[si]
            k0, width = span[0] * TILE_K, len(span) * TILE_K
            scores = [nl.matmul(qt, k_t[:, k0:k0 + width], transpose_x=True) for qt in q_t]
            # a span with a partial block, or one the tile does not attend to (its mask is zeros), is masked
            scores = [_masked_scores(s, mask, t * TILE_Q, k0) if any(seen.get(b, True) for b in span) else s
                      for s, t, seen in zip(scores, group, visited)]
            neg_max, row_sum, acc = online_softmax_step(scores, neg_max, row_sum, acc,
                                                        v_blocks[span[0]:span[-1] + 1], dtype)
        for t, ac, rs, nm in zip(group, acc, row_sum, neg_max):
            rows = slice(t * TILE_Q, (t + 1) * TILE_Q)
            nl.store(out[rows, :], value=nl.multiply(ac, nl.reciprocal(rs), dtype=dtype))
            # lse = log(sum) + max, the max being kept negated
            nl.store(lse[rows, :], value=nl.subtract(nisa.activation(op=nl.log, data=rs), nm, dtype=nl.float32))
    return out, lse


def key_block_visits(blocks: Blocks, key_blocks: int) -> list[list[tuple[int, bool]]]:
    """``blocks`` by key block: for each, the (query tile, partial) pairs that attend to it."""
    visits: list[list[tuple[int, bool]]] = [[] for _ in range(key_blocks)]
    for tile, pairs in enumerate(blocks):
        for kb, partial in pairs:
            visits[kb].append((tile, partial))
    return visits


@nki.jit
def block_sparse_attention_bwd(q, k, v, o, d_o, lse, mask, blocks, scale=None):
    """The gradients of :func:`block_sparse_attention_fwd` for one head (FlashAttention-2's
    backward over the kept blocks): dq, dk and dv from the output gradient ``d_o``.

    Args:
        q, k, v, o, d_o: as ``flash_attention_bwd`` ([seqlen, d] and [keys, d] in HBM,
            fp32 or bf16; seqlen and keys multiples of 128, d <= 128).
        lse: [seqlen] or [seqlen, 1] in HBM, fp32, the forward's logsumexp.
        mask: [seqlen, keys] in HBM, uint8, as in the forward.
        blocks: :data:`Blocks`, as in the forward.
        scale: the score scale; by default ``1 / sqrt(d)``.

    Returns:
        (dq [seqlen, d], dk [keys, d], dv [keys, d]) in HBM, of ``q``'s dtype; zero for
        queries and keys no block attends to.

    Memories: as ``flash_attention_bwd``; each key block runs over the query tiles that
    attend to it, and a partial block's mask tile [128, 128] (uint8) is loaded into
    SBUF to zero the probabilities of the keys it drops.
    """
    seqlen, keys, d = _check("block_sparse_attention_bwd", q, k, v, mask, blocks)
    require(tuple(o.shape) == (seqlen, d) and tuple(d_o.shape) == (seqlen, d), "block_sparse_attention_bwd",
            f"needs o and d_o of q's shape [{seqlen}, {d}], got {list(o.shape)} and {list(d_o.shape)}")
    require(tuple(lse.shape) in ((seqlen,), (seqlen, 1)), "block_sparse_attention_bwd",
            f"needs lse [{seqlen}] or [{seqlen}, 1], one per query, got {list(lse.shape)}")
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

    def zero_dropped(probs, q0, k0):
        keep = nl.load(mask[q0:q0 + TILE_Q, k0:k0 + TILE_K])
        return nl.where(keep, probs, 0.0, dtype=probs.dtype)

    for kj, visits in enumerate(key_block_visits(blocks, keys // TILE_K)):
        k0 = kj * TILE_K
        if not visits:
            nl.store(dv[k0:k0 + TILE_K, :], value=nl.zeros((TILE_K, d), dtype))
            nl.store(dk[k0:k0 + TILE_K, :], value=nl.zeros((TILE_K, d), dtype))
            continue
        k_rows = nl.load(k[k0:k0 + TILE_K, :])
        k_cols = nl.copy(nl.transpose(k_rows), dtype=dtype)
        v_cols = nl.copy(nl.transpose(nl.load(v[k0:k0 + TILE_K, :])), dtype=dtype)
        dk_acc = nl.zeros((TILE_K, d), nl.float32, buffer=nl.psum)
        dv_acc = nl.zeros((TILE_K, d), nl.float32, buffer=nl.psum)
        # full blocks and partial ones go in groups of their own: only partial ones read the mask
        pending = None
        for partial in (False, True):
            tiles = [t for t, p in visits if p == partial]
            for g in nl.static_range(0, len(tiles), Q_GROUP):
                group = tiles[g:g + Q_GROUP]
                ready = probs_and_d_scores(group, k0, k_cols, v_cols, q_cols, do_cols, neg_lse, neg_delta, scale,
                                           zero_dropped if partial else None, dtype)
                if pending is not None:
                    dk_acc, dv_acc = gradients(*pending, k_rows, q_rows, do_rows, dq_acc, dk_acc, dv_acc)
                pending = ready
        dk_acc, dv_acc = gradients(*pending, k_rows, q_rows, do_rows, dq_acc, dk_acc, dv_acc)
        nl.store(dv[k0:k0 + TILE_K, :], value=nl.copy(dv_acc, dtype=dtype))
        nl.store(dk[k0:k0 + TILE_K, :], value=nl.multiply(dk_acc, scale, dtype=dtype))
    for qi, acc in enumerate(dq_acc):
        rows = slice(qi * TILE_Q, (qi + 1) * TILE_Q)
        nl.store(dq[rows, :], value=nl.zeros((TILE_Q, d), dtype) if acc is None
                 else nl.multiply(acc, scale, dtype=dtype))
    return dq, dk, dv
