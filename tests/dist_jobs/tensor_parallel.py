"""Tensor parallel on ``neuron``: run with ``torchrun --nproc-per-node=2`` (or 4).

A small MLP stack is parallelized with ``ColwiseParallel``, ``RowwiseParallel`` and
``SequenceParallel`` over a 1-D mesh of every rank and trained 5 steps; the losses
match the same model trained on one process (fp32, within 1e-5). The same is checked
with activation checkpointing around each block, and ``torch.compile(backend="neuron")``
of the TP model gives the eager TP result.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

import trnsim
from _check import close

D, FF, B, S, STEPS = 16, 64, 2, 8, 5


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.up = torch.nn.Linear(D, FF)
        self.down = torch.nn.Linear(FF, D)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(D, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))
        self.norm = torch.nn.LayerNorm(D)
        self.out = torch.nn.Linear(D, D)

    def forward(self, x):
        x = self.inp(x)
        for blk in self.blocks:
            x = blk(x)
        return self.out(self.norm(x))


def plan():
    """Megatron-style TP with sequence parallel norms: activations between blocks are
    sharded on the sequence dimension."""
    p = {"inp": ColwiseParallel(output_layouts=Shard(1)),
         "norm": SequenceParallel(),
         "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
    for i in range(2):
        p[f"blocks.{i}.norm"] = SequenceParallel()
        p[f"blocks.{i}.up"] = ColwiseParallel(input_layouts=Shard(1))
        p[f"blocks.{i}.down"] = RowwiseParallel(output_layouts=Shard(1))
    return p


def data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(B, S, D, generator=g).to("neuron"), torch.randn(B, S, D, generator=g).to("neuron"))
            for _ in range(STEPS)]


def train(model, batches):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def main():
    dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    base = Net().to("neuron")
    batches = data()
    want = train(copy.deepcopy(base), batches)

    tp = parallelize_module(copy.deepcopy(base), mesh, plan())
    if tp.blocks[0].up.weight.to_local().shape != (FF // mesh.size(), D):
        raise SystemExit(f"colwise weight not sharded: {tp.blocks[0].up.weight.to_local().shape}")
    close("TP losses", train(tp, batches), want)

    ac = parallelize_module(copy.deepcopy(base), mesh, plan())
    for i, blk in enumerate(ac.blocks):
        ac.blocks[i] = checkpoint_wrapper(blk)
    close("TP + activation checkpointing losses", train(ac, batches), want)

    model = parallelize_module(copy.deepcopy(base), mesh, plan())
    x = batches[0][0]
    eager = model(x)
    compiled_model = torch.compile(model, backend="neuron")
    compiled_model(x)
    with trnsim.profile() as prof:
        compiled = compiled_model(x)
    if not torch.allclose(compiled.cpu(), eager.cpu(), rtol=1e-5, atol=1e-5):
        raise SystemExit(f"rank {dist.get_rank()}: compiled TP differs by {(compiled - eager).abs().max().item()}")
    # the graph's first all-gather waits for the kernels computing its input
    first = min((r for r in prof.records if r.name.startswith("c10d::")), key=lambda r: r.start_ps)
    if not any(r.end_ps <= first.start_ps for r in prof.records if not r.name.startswith("c10d::")):
        raise SystemExit(f"rank {dist.get_rank()}: the compiled graph's {first.name} starts before its kernels")
    # the graph holds TP's all-gathers and reduce-scatters as functional collectives
    graphs = counters["neuron"]
    if graphs["compiled_graphs"] != 1 or graphs["graphs_with_collectives"] != 1:
        raise SystemExit(f"rank {dist.get_rank()}: compile counters {dict(graphs)}; wanted one graph, with collectives")
    dist.barrier()
    print(f"rank {dist.get_rank()}: tensor_parallel ok {want}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
