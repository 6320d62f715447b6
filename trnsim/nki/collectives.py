"""``nki.collectives``: communication between NeuronCores inside a kernel.

trnsim simulates one NeuronCore per kernel, so every collective is refused with a
KernelError that names it; run collectives from PyTorch (``torch.distributed``)
instead.
"""

from __future__ import annotations

from trnsim.nki.refused import Refused

_WHY = "a trnsim kernel runs on one simulated NeuronCore; there are no other ranks to communicate with"

all_reduce = Refused("nki.collectives.all_reduce", _WHY)
all_gather = Refused("nki.collectives.all_gather", _WHY)
all_gather_v = Refused("nki.collectives.all_gather_v", _WHY)
reduce_scatter = Refused("nki.collectives.reduce_scatter", _WHY)
all_to_all = Refused("nki.collectives.all_to_all", _WHY)
all_to_all_v = Refused("nki.collectives.all_to_all_v", _WHY)
collective_permute = Refused("nki.collectives.collective_permute", _WHY)
collective_permute_implicit = Refused("nki.collectives.collective_permute_implicit", _WHY)
collective_permute_implicit_reduce = Refused("nki.collectives.collective_permute_implicit_reduce", _WHY)
collective_permute_implicit_current_processing_rank_id = Refused(
    "nki.collectives.collective_permute_implicit_current_processing_rank_id", _WHY)
rank_id = Refused("nki.collectives.rank_id", _WHY)
ReplicaGroup = Refused("nki.collectives.ReplicaGroup", _WHY)
