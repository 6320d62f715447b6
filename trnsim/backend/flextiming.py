"""Simulated time of FlexAttention on ``neuron``: the block-sparse flash kernels over the
blocks its ``BlockMask`` keeps.

A ``BlockMask`` lists, for each block of queries of each (batch, head) it covers, the
key blocks that are partial (``kv_num_blocks``, ``kv_indices``) and full
(``full_kv_num_blocks``, ``full_kv_indices``). :func:`tile_blocks` turns one (batch,
head)'s lists into the kernels' 128 x 128 tiles (:data:`trnsim.kernels.flex_attention.Blocks`):
a tile is visited where any mask block it overlaps is, and full where every one is.
Each distinct pattern is traced and simulated once (memoized); the (batch, head) pairs
are split between the physical cores of a logical NeuronCore as in SDPA, and the op
takes as long as the busier core.

Sequences are timed padded to the 128-row tile. Where the block mask's values are not
at hand (``timing`` fidelity, or a graph being compiled, whose mask is only a shape),
every block is taken as full: the dense kernel's work. Head dimensions over 128, or
values of another head dimension, take the bandwidth estimate.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from trnsim.backend import state
from trnsim.backend.opcost import OpCost

TILE = 128


def _values(t: torch.Tensor | None) -> np.ndarray | None:
    """The host values of a block mask tensor, or None where there are none (a fake
    tensor being compiled, or ``timing`` fidelity)."""
    if t is None or t.device.type == "meta" or hasattr(t, "fake_mode"):
        return None
    if t.device.type == "neuron":
        from trnsim.backend import storage

        try:
            t = storage.host_alias(t)
        except RuntimeError:   # timing fidelity: shapes only
            return None
    return t.detach().numpy()


def _states(block_mask: tuple) -> np.ndarray | None:
    """[B, H, query blocks, key blocks] of 0 (skipped), 1 (partial) or 2 (full), from the
    flattened ``BlockMask.as_tuple()``; None where its values are not at hand."""
    num, idx, full_num, full_idx = (_values(t) for t in block_mask[2:6])
    if num is None or idx is None or (block_mask[4] is not None and (full_num is None or full_idx is None)):
        return None
    q_len, kv_len, q_block, kv_block = block_mask[0], block_mask[1], block_mask[-3], block_mask[-2]
    shape = (*num.shape, -(-int(q_len) // int(q_block)), -(-int(kv_len) // int(kv_block)))
    states = np.zeros(shape, np.uint8)
    for lists, mark in (((num, idx), 1), ((full_num, full_idx), 2)):
        count, index = lists
        if count is None:
            continue
        width = index.shape[-1]
        kept = np.arange(width) < count[..., None]   # [B, H, Qb, width]
        b, h, qb, slot = np.nonzero(kept)
        states[b, h, qb, index[b, h, qb, slot]] = mark
    return states


def tile_blocks(states: np.ndarray, q_block: int, kv_block: int, q_len: int, kv_len: int) -> tuple:
    """One (batch, head)'s mask block states [query blocks, key blocks] as the kernels'
    :data:`~trnsim.kernels.flex_attention.Blocks`: per 128-query tile, the 128-key tiles
    it visits, partial unless every mask block under the tile is full."""
    tiles = []
    for i in range(-(-q_len // TILE)):
        rows = states[i * TILE // q_block:((i + 1) * TILE - 1) // q_block + 1]
        pairs = []
        for j in range(-(-kv_len // TILE)):
            under = rows[:, j * TILE // kv_block:((j + 1) * TILE - 1) // kv_block + 1]
            if under.any():
                pairs.append((j, not bool((under == 2).all())))
        tiles.append(tuple(pairs))
    return tuple(tiles)


def _dense(q_len: int, kv_len: int) -> tuple:
    return tuple(tuple((j, False) for j in range(-(-kv_len // TILE))) for _ in range(-(-q_len // TILE)))


def _simulate(backward: bool, blocks: tuple, sq: int, sk: int, d: int, dtype: torch.dtype) -> OpCost:
    return _simulated(backward, blocks, sq, sk, d, dtype, state.chip().name)


# block patterns follow the data (each batch's documents), so the memo keeps the latest
# MEMO_SIZE: a long run with ever new patterns does not grow without bound
MEMO_SIZE = 256


@functools.lru_cache(maxsize=MEMO_SIZE)
def _simulated(backward: bool, blocks: tuple, sq: int, sk: int, d: int, dtype: torch.dtype, chip: str) -> OpCost:
    """The kernel's cost for one block pattern on the device's chip (named ``chip``, the
    memo's key)."""
    from trnsim.backend.lowering import placeholder, run_kernel
    from trnsim.kernels.flex_attention import block_sparse_attention_bwd, block_sparse_attention_fwd

    q, kv, mask = placeholder((sq, d), dtype), placeholder((sk, d), dtype), placeholder((sq, sk), torch.bool)
    if backward:
        return run_kernel(block_sparse_attention_bwd, "block_sparse_attention_bwd", q, kv, kv, q, q,
                          placeholder((sq,), torch.float32), mask, blocks)
    return run_kernel(block_sparse_attention_fwd, "block_sparse_attention_fwd", q, kv, kv, mask, blocks)


def attention_cost(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask: tuple,
                   backward: bool = False) -> OpCost | None:
    """The simulated cost of FlexAttention's forward (or ``backward``) over q [B, H, Sq, D],
    k and v [B, Hkv, Sk, D] with the flattened ``block_mask``; None where the kernels do
    not apply (the estimate times it)."""
    if query.dim() != 4 or key.shape[-1] != query.shape[-1] or value.shape[-1] != query.shape[-1]:
        return None
    b, h, q_len, d = (int(s) for s in query.shape)
    kv_len = int(key.shape[-2])
    if d > TILE or q_len == 0 or kv_len == 0:
        return None
    sq, sk = -(-q_len // TILE) * TILE, -(-kv_len // TILE) * TILE
    states = _states(block_mask)
    patterns: list[tuple] = []
    if states is None:
        patterns = [_dense(q_len, kv_len)] * (b * h)
    else:
        q_block, kv_block = int(block_mask[-3]), int(block_mask[-2])
        made: dict[tuple[int, int], tuple] = {}
        for bi in range(b):
            for hi in range(h):
                at = (bi if states.shape[0] > 1 else 0, hi if states.shape[1] > 1 else 0)
                if at not in made:
                    made[at] = tile_blocks(states[at], q_block, kv_block, q_len, kv_len)
                patterns.append(made[at])
    costs = [_simulate(backward, p, sq, sk, d, query.dtype) for p in patterns]
    # the physical cores of the logical core each take a run of (batch, head) pairs
    lnc = state.chip().logical_core_size
    share = math.ceil(len(costs) / lnc)
    ps = max(sum(c.ps for c in costs[i:i + share]) for i in range(0, len(costs), share))
    hbm = sum(c.hbm_moved() or 0 for c in costs)
    name = costs[0].kernel
    if len(set(patterns)) == 1:
        return OpCost(ps=ps, source="kernel", kernel=name, run=costs[0].run, scale=share, cores=len(costs) / share)
    return OpCost(ps=ps, source="kernel", kernel=name, hbm_bytes=hbm)


def forward_cost(call: Any) -> OpCost | None:
    """The ``flex_attention`` higher-order op, as :mod:`trnsim.backend.opkernels` calls it."""
    return attention_cost(call.arg(0, "query"), call.arg(1, "key"), call.arg(2, "value"), call.arg(4, "block_mask"))


def backward_cost(call: Any) -> OpCost | None:
    """The ``flex_attention_backward`` higher-order op, as :mod:`trnsim.backend.opkernels` calls it."""
    return attention_cost(call.arg(0, "query"), call.arg(1, "key"), call.arg(2, "value"), call.arg(9, "block_mask"),
                          backward=True)
