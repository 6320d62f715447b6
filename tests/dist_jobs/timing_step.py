"""A tensor-parallel MLP step in ``timing`` fidelity (no values: nothing is read back),
for scale: run it on many ranks with ``trnsim run --nproc N --fidelity timing``."""

import torch
import torch.distributed as dist

dist.init_process_group("neuron")
world = dist.get_world_size()
hidden, seq = 1024, 256
x = torch.empty(seq, hidden, device="neuron", dtype=torch.bfloat16)
w1 = torch.empty(hidden, 4 * hidden // world, device="neuron", dtype=torch.bfloat16)
w2 = torch.empty(4 * hidden // world, hidden, device="neuron", dtype=torch.bfloat16)
for _ in range(2):
    h = torch.nn.functional.gelu(x @ w1)
    y = h @ w2
    dist.all_reduce(y)
    shard = torch.empty(seq // world, hidden, device="neuron", dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(shard, y)
    full = torch.empty(seq, hidden, device="neuron", dtype=torch.bfloat16)
    dist.all_gather_into_tensor(full, shard)
dist.barrier()
dist.destroy_process_group()
