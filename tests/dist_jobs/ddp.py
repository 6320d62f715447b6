"""DistributedDataParallel on ``neuron``: run with ``torchrun --nproc-per-node=2`` (or 4).

Each rank trains a small MLP on its slice of a global batch; DDP averages the gradients,
so 5 steps give the losses of one process training on the whole batch (fp32, 1e-5),
and every rank ends with the same weights.
"""

import copy
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from _check import close

D, H, GLOBAL_B, STEPS = 16, 32, 8, 5


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(GLOBAL_B, D, generator=g), torch.randn(GLOBAL_B, 1, generator=g)) for _ in range(STEPS)]


def step(model, opt, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def main():
    # written as for any accelerator: one device per local rank
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.neuron.set_device(local_rank)
    device = torch.device("neuron", local_rank)
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.Tanh(), torch.nn.Linear(H, H), torch.nn.Tanh(),
                               torch.nn.Linear(H, 1)).to(device)
    data = batches()

    ref = copy.deepcopy(base)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    want = [step(ref, ref_opt, x.to(device), y.to(device)).item() for x, y in data]

    # the bucket size splits the gradients into several buckets; no device_ids: the
    # module's one device is the process's one device (PyTorch numbers it neuron:0)
    ddp = DDP(copy.deepcopy(base), bucket_cap_mb=0.001)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    got = []
    for x, y in data:
        local = step(ddp, opt, x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)).detach()
        dist.all_reduce(local, op=dist.ReduceOp.AVG)
        got.append(local.item())
    close("DDP losses", got, want)
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        if not torch.allclose(p.detach().cpu(), q.detach().cpu(), rtol=0, atol=1e-5):
            raise SystemExit(f"rank {rank}: parameter {name} differs from one process")
    dist.barrier()
    print(f"rank {rank}: ddp ok {want}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
