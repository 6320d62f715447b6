"""``nki.isa`` (``nisa``): one call per engine instruction, with NKI's names.

Each call works in both styles NKI kernels are written in: pass the destination
tile first (``nisa.tensor_copy(dst=t, src=s)``, ``nisa.nc_matmul(acc, a, b)``), or
leave it out and take the returned tile (``t = nisa.tensor_copy(s, dtype=...)``).
``engine=`` picks the engine where the instruction can run on several.

This package is the namespace; the instructions live in modules by concept:
:mod:`~.matmul` (tensor engine), :mod:`~.activation` (scalar engine),
:mod:`~.elementwise`, :mod:`~.reduce`, :mod:`~.scans`, :mod:`~.affine` (``iota``,
``affine_select``), :mod:`~.selection`, :mod:`~.search` (top 8), :mod:`~.gather`,
:mod:`~.rand` (random numbers), :mod:`~.dma`, :mod:`~.world` (other cores and ranks),
:mod:`~.registers`, :mod:`~.constants` (enums, also ``nki.isa.constants``) and
:mod:`~.refused`; what they share is in :mod:`~._common`.
"""

from __future__ import annotations

from trnsim.nki import emit as _e
from trnsim.nki.isa import constants
from trnsim.nki.isa.activation import activate2, activation, activation_reduce, exponential
from trnsim.nki.isa.affine import affine_select, iota
from trnsim.nki.isa.constants import (dge_mode, dma_engine, engine, get_nc_sub_version, get_nc_version, gpsimd_engine,
                                      matmul_perf_mode, nc_version, oob_mode, reduce_cmd, scalar_engine, tensor_engine,
                                      unknown_engine, vector_engine)
from trnsim.nki.isa.dma import dma_compute as dma_compute, dma_copy, dma_transpose
from trnsim.nki.isa.elementwise import memset, reciprocal, scalar_tensor_tensor, tensor_copy, tensor_scalar, tensor_tensor
from trnsim.nki.isa.gather import local_gather, nc_n_gather, nc_stream_shuffle, nonzero_with_count
from trnsim.nki.isa.matmul import nc_matmul, nc_transpose
from trnsim.nki.isa.rand import dropout, rand2, rand_get_state, rand_set_state, rng, set_rng_seed
from trnsim.nki.isa.reduce import bn_aggr, bn_stats, tensor_partition_reduce, tensor_reduce, tensor_scalar_reduce
from trnsim.nki.isa.refused import DIFFERENCES as DIFFERENCES, REFUSED
from trnsim.nki.isa.registers import VirtualRegister, register_alloc, register_move
from trnsim.nki.isa.scans import sequence_bounds, tensor_scalar_cumulative, tensor_tensor_scan
from trnsim.nki.isa.search import max8, nc_find_index8, nc_match_replace8
from trnsim.nki.isa.selection import range_select, select_reduce, tensor_copy_predicated
from trnsim.nki.isa.world import core_barrier, sendrecv

# trnsim's own types, importable from here as they were when nki.isa was one module
from trnsim.isa import (ActivationFunc as ActivationFunc, AffineSelect as AffineSelect, AluOp as AluOp,
                        BN_STATS_WIDTH as BN_STATS_WIDTH, BnAggr as BnAggr, BnStats as BnStats, Engine as Engine,
                        Iota as Iota, Memory as Memory, Memset as Memset, ReduceOp as ReduceOp)
from trnsim.nki.tiles import Affine as Affine, Mask as Mask, NkiTensor as NkiTensor

__all__ = [
    "nc_matmul", "nc_transpose", "activation", "tensor_tensor", "tensor_scalar", "tensor_reduce", "tensor_copy",
    "memset", "iota", "affine_select", "dma_copy", "bn_stats", "bn_aggr",
    "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine", "unknown_engine",
    # trnsim.nki.isa.constants
    "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version", "dma_engine", "constants",
    "get_nc_version", "get_nc_sub_version",
    "tensor_tensor_scan", "tensor_scalar_cumulative", "scalar_tensor_tensor", "reciprocal", "tensor_scalar_reduce",
    "activation_reduce", "activate2",
    "exponential", "range_select", "select_reduce", "tensor_copy_predicated", "sequence_bounds", "max8",
    "nc_find_index8", "nc_match_replace8", "nc_stream_shuffle", "tensor_partition_reduce", "local_gather",
    "nc_n_gather", "nonzero_with_count", "dma_transpose", "rng", "rand2", "set_rng_seed", "rand_set_state",
    "rand_get_state", "dropout", "VirtualRegister",
    "register_alloc", "register_move", "core_barrier", "sendrecv",
]

# Refused by name: each raises KernelError naming itself and saying why (see REFUSED).
globals().update(REFUSED)
__all__ += list(REFUSED)

# ``mask=True`` / ``mask=False`` (a condition on loop counters alone) on every call
_e.take_bool_masks(globals(), [n for n in list(globals()) if not n.startswith("_")])
