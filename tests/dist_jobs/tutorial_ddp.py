"""PyTorch's DDP tutorial (ddp_tutorial.rst, its torchrun form) with ``cuda`` replaced by
``neuron``: run with ``torchrun --nproc-per-node=2 tutorial_ddp.py neuron|cpu OUT``.

On ``neuron``, as the tutorial: ``init_process_group("neuron")``, ``device_id = rank %
torch.neuron.device_count()`` (rank 1 is ``neuron:1``), the model moved with
``.to(device_id)`` and wrapped in ``DDP(model, device_ids=[device_id])``; on the CPU
(the reference) it uses gloo and no device ids, as the tutorial's CPU form does. The model
has a branch its forward never uses, so ``find_unused_parameters=True`` is needed (DDP's
C++ then makes a pinned host buffer); the data comes through
``DataLoader(pin_memory=True)`` with a ``DistributedSampler``. It trains, saves a
checkpoint on rank 0 and loads it on every rank with ``map_location`` (the tutorial's
``demo_checkpoint``), trains on, and writes its losses and how far its weights moved
to ``OUT/rank<R>.json``.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trnsim.testing.training import TrainingRun, movement, snapshot

DEV, OUT = sys.argv[1], sys.argv[2]


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)
        self.unused = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def epoch(ddp_model, loader, optimizer, loss_fn, device):
    losses = []
    for x, labels in loader:
        assert x.is_pinned() == (DEV == "neuron"), "DataLoader(pin_memory=True) gave an unpinned batch"
        optimizer.zero_grad()
        outputs = ddp_model(x.to(device, non_blocking=True))
        loss = loss_fn(outputs, labels.to(device, non_blocking=True))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    if DEV == "neuron":
        dist.init_process_group("neuron")
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    device_id = rank % torch.neuron.device_count() if DEV == "neuron" else "cpu"
    torch.manual_seed(0)
    model = ToyModel().to(device_id)
    before = snapshot(model)
    ddp_model = DDP(model, device_ids=[device_id] if DEV == "neuron" else None, find_unused_parameters=True)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32, 10, generator=g), torch.randn(32, 5, generator=g))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False),
                        pin_memory=DEV == "neuron")
    losses = epoch(ddp_model, loader, optimizer, loss_fn, device_id)

    path = os.path.join(OUT, "model.checkpoint")
    if rank == 0:
        torch.save(ddp_model.state_dict(), path)
    dist.barrier()
    map_location = {"neuron:0": f"neuron:{device_id}"} if DEV == "neuron" else "cpu"
    ddp_model.load_state_dict(torch.load(path, map_location=map_location, weights_only=True))
    losses += epoch(ddp_model, loader, optimizer, loss_fn, device_id)

    run = TrainingRun(losses, before, snapshot(ddp_model.module))
    moved = movement(run)
    with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "moved": moved}, f)
    print(f"rank {rank}: tutorial_ddp ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
