"""Compiled models inside FSDP2 and DDP on ``neuron``: run with ``torchrun --nproc-per-node=2``.

Each decoder block of a tiny Llama is compiled (``torch.compile(backend="neuron")``)
inside ``fully_shard``, as torchtitan does; a whole model is compiled around
``DistributedDataParallel`` (Dynamo's DDP optimizer splits it at gradient buckets).
Both train 3 steps with the losses of one process (fp32, within 1e-5).
"""

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from trnsim.models.tinyllama import TinyLlama, causal_lm_loss
from _check import close

VOCAB, SEQ, GLOBAL_B, STEPS = 512, 16, 4, 3


def train(model, data):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for ids in data:
        ids = ids.to("neuron")
        loss = causal_lm_loss(model(ids), ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def data_parallel_losses(model, data, rank, world):
    losses = train(model, [ids.chunk(world)[rank] for ids in data])
    for loss in losses:
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    return [x.item() for x in losses]


def main():
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("neuron", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    base = TinyLlama(vocab=VOCAB, d=128, layers=2, heads=4, kv_heads=2, ff=384, seq=SEQ).to("neuron")
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, VOCAB, (GLOBAL_B, SEQ), generator=g) for _ in range(STEPS)]
    want = [x.item() for x in train(copy.deepcopy(base), data)]

    fsdp = copy.deepcopy(base)
    for i, blk in enumerate(fsdp.blocks):
        fully_shard(blk, mesh=mesh)
        fsdp.blocks[i] = torch.compile(blk, backend="neuron")
    fully_shard(fsdp, mesh=mesh)
    close("compiled blocks in FSDP2", data_parallel_losses(fsdp, data, rank, world), want)

    ddp = torch.compile(DDP(copy.deepcopy(base)), backend="neuron")
    close("compiled DDP", data_parallel_losses(ddp, data, rank, world), want)
    dist.barrier()
    print(f"rank {rank}: compiled_parallel ok {want}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
