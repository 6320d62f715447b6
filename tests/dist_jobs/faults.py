"""Fault cases for the neuron process group, chosen by argv[1]:

- ``kill``: rank 2 dies (SIGKILL) after the first collective; the others must fail
  within a minute with an error naming rank 2.
- ``mismatch``: rank 0 all-reduces while the others broadcast; every rank must report
  the mismatch with both calls instead of hanging.
"""

import os
import signal
import sys

import torch
import torch.distributed as dist

case = sys.argv[1]
dist.init_process_group("neuron")
rank = dist.get_rank()
x = torch.ones(8, device="neuron")
dist.all_reduce(x)
if case == "kill":
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(x)
    dist.all_reduce(x)
elif case == "mismatch":
    if rank == 0:
        dist.all_reduce(x)
    else:
        dist.broadcast(x, src=0)
print(f"rank {rank}: no error", flush=True)
