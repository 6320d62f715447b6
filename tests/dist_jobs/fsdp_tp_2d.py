"""2-D parallelism on ``neuron``: run with ``torchrun --nproc-per-node=4``.

A named (dp=2, tp=2) mesh: the MLP stack of ``tensor_parallel.py`` is tensor parallel
(with sequence parallel norms) over ``tp`` and FSDP2-sharded over ``dp``; each ``dp``
group trains on its half of a global batch. 5 steps give the losses of one process
training on the whole batch (fp32, within 1e-5).
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from tensor_parallel import B, D, S, STEPS, Net, plan
from _check import close


def train(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches:
        loss = F.mse_loss(model(x.to("neuron")), y.to("neuron"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def main():
    dist.init_process_group("neuron")
    if dist.get_world_size() != 4:
        raise SystemExit(f"fsdp_tp_2d.py needs 4 ranks (a 2 x 2 mesh), got {dist.get_world_size()}")
    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    base = Net().to("neuron")
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2 * B, S, D, generator=g), torch.randn(2 * B, S, D, generator=g)) for _ in range(STEPS)]
    want = [x.item() for x in train(copy.deepcopy(base), batches)]

    model = parallelize_module(copy.deepcopy(base), mesh["tp"], plan())
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    losses = train(model, [(x.chunk(2)[dp], y.chunk(2)[dp]) for x, y in batches])
    for loss in losses:
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
    got = [x.item() for x in losses]
    close("2-D losses", got, want)
    dist.barrier()
    print(f"rank {dist.get_rank()}: fsdp_tp_2d ok {want}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
