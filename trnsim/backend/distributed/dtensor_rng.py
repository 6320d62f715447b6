"""DTensor's random ops on ``neuron``: the RNG tracker of a ``neuron`` device mesh.

DTensor runs a random op on a sharded tensor (``reset_parameters`` after meta-device
init and ``to_empty``, ``torch.distributed.tensor.randn``, dropout in tensor parallel)
inside its RNG tracker, ``OffsetBasedRNGTracker``, which moves a Philox generator's
offset so that each shard draws its own part of one stream. The ``neuron`` generator is
the CPU's Mersenne Twister (so that a seeded program draws the same numbers on
``neuron`` as on the CPU), which has no offset; trnsim's tracker for a ``neuron`` mesh,
:class:`NeuronRNGTracker`, has each rank draw the whole tensor from the same state and
keep its shard instead (:class:`trnsim.backend.rng.sharded_draw`). The whole tensor,
and every rank's generator state after the op, are then exactly those of the same draw
in one process: a model initialised on the meta device and sharded by FSDP2 or tensor
parallel gets the values ``torch.manual_seed(s); Model()`` gives on the CPU. The draw
is timed as the op on the shard.

DTensor makes its tracker by calling ``OffsetBasedRNGTracker(mesh)``; :func:`install`
(at the first ``neuron`` process group) puts a subclass of it in its place that makes a
:class:`NeuronRNGTracker` for a ``neuron`` mesh and PyTorch's own for any other.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.distributed.tensor import _random
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import Shard, _StridedShard

from trnsim.backend import rng


def shard_location(spec: Any) -> tuple[slice, ...] | torch.Tensor:
    """Where this rank's shard of the DTensor ``spec`` describes lies in the whole tensor,
    as :class:`trnsim.backend.rng.sharded_draw` takes it: a block (a tuple of slices), or,
    with a strided shard (FSDP2 over tensor parallel), the flat index in the whole tensor
    of each element of the shard, found by splitting an index tensor as
    ``distribute_tensor`` splits a tensor."""
    shape = spec.tensor_meta.shape
    if not any(isinstance(p, _StridedShard) for p in spec.placements):
        local, offset = compute_local_shape_and_global_offset(shape, spec.mesh, spec.placements)
        return tuple(slice(o, o + n) for o, n in zip(offset, local))
    index = torch.arange(shape.numel()).view(shape)
    for mesh_dim, placement in enumerate(spec.placements):
        if isinstance(placement, (Shard, _StridedShard)):
            index = placement._shard_tensor(index, spec.mesh, mesh_dim, src_data_rank=None)
    return index


_TorchTracker = _random.OffsetBasedRNGTracker


class OffsetBasedRNGTracker(_TorchTracker):
    """PyTorch's ``OffsetBasedRNGTracker``, except that made for a ``neuron`` mesh it is a
    :class:`NeuronRNGTracker`."""

    def __new__(cls, device_mesh=None, *args, **kwargs):
        if cls is OffsetBasedRNGTracker and getattr(device_mesh, "device_type", None) == "neuron":
            cls = NeuronRNGTracker
        return super().__new__(cls)


class NeuronRNGTracker(OffsetBasedRNGTracker):
    """DTensor's RNG tracker on a ``neuron`` mesh: a random op draws the whole tensor on
    every rank from the same generator state and keeps the rank's shard (see the module
    docstring); the ranks' states stay equal, as PyTorch's tracker keeps them."""

    @contextlib.contextmanager
    def _distribute_region(self, spec, generator: torch.Generator | None = None):
        if not self.distribute_region_enabled:
            yield
            return
        shape = tuple(spec.tensor_meta.shape)
        local, _ = compute_local_shape_and_global_offset(shape, spec.mesh, spec.placements)
        with rng.sharded_draw(shape, tuple(local), lambda: shard_location(spec), generator):
            yield


def install() -> None:
    """Make DTensor use :class:`NeuronRNGTracker` on ``neuron`` meshes (idempotent)."""
    _random.OffsetBasedRNGTracker = OffsetBasedRNGTracker
