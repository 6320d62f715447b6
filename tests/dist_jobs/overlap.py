"""Clocks meeting and overlap: rank 1 computes more before an all-reduce (so rank 0
waits for it); then an async all-reduce runs while both compute, until they wait."""

import torch
import torch.distributed as dist

dist.init_process_group("neuron")
rank = dist.get_rank()
a = torch.randn(512, 512, device="neuron")
for _ in range(1 + 4 * rank):          # rank 1 is the slow one
    a = a @ a / 512
x = torch.ones(1 << 20, device="neuron")
dist.all_reduce(x)
work = dist.all_reduce(torch.ones(1 << 22, device="neuron"), async_op=True)
b = a @ a                               # overlaps the all-reduce
work.wait()
c = b + 1                               # waits for it
torch.neuron.synchronize()
dist.destroy_process_group()
