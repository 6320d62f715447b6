"""TP x FSDP on a 2 x 2 mesh of ``neuron`` ranks: ``trnsim run --nproc 4 tp_fsdp.py``.

A two-block MLP (LayerNorm, up projection, GELU, down projection, residual) is tensor
parallel over the mesh's ``tp`` dimension (each block's up projection split by columns,
its down projection by rows, so one all-reduce per block joins the halves) and FSDP2
sharded over ``dp`` (each block's parameters all-gathered before use and the gradients
reduce-scattered after backward). Each ``dp`` group trains on its half of the batch;
rank 0 prints the loss of each step.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

D, FF, BATCH, SEQ, STEPS = 256, 1024, 8, 64, 2


class Block(torch.nn.Module):
    """LayerNorm, then a GELU MLP with a residual connection."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.up = torch.nn.Linear(D, FF)
        self.down = torch.nn.Linear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    """Two blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x


def main() -> None:
    dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Net().to("neuron")
    plan = {}
    for i in range(2):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    dp = mesh["dp"].get_local_rank()
    for step in range(STEPS):
        x = torch.randn(2 * BATCH, SEQ, D, generator=g).chunk(2)[dp].to("neuron")
        y = torch.randn(2 * BATCH, SEQ, D, generator=g).chunk(2)[dp].to("neuron")
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach(), op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.5f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
