"""A data-parallel step by hand: each rank computes a gradient, all-reduces it, and
checks the average against what one process computes. Run with torchrun or
``trnsim run --nproc N``."""

import torch
import torch.distributed as dist

dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
w = torch.randn(256, 256)
xs = [torch.randn(64, 256, generator=torch.Generator().manual_seed(i)) for i in range(world)]
want = sum(x.T @ (x @ w) for x in xs) / world

wd = w.to("neuron")
x = xs[rank].to("neuron")
for _ in range(2):
    grad = x.T @ (x @ wd)
    dist.all_reduce(grad, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(grad.cpu(), want, rtol=1e-4, atol=1e-3)
dist.barrier()
if rank == 0:
    print(f"allreduce_step: {world} ranks agree")
dist.destroy_process_group()
