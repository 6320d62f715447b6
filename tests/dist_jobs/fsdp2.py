"""FSDP2 on ``neuron``: run with ``torchrun --nproc-per-node=2`` (or 4).

A tiny Llama (:mod:`trnsim.models.tinyllama`, random weights) is sharded with ``fully_shard``
per decoder block and at the root, and trained 5 steps with AdamW on a global batch
split across ranks:

- fp32, resharding after forward: the losses of one process training on the whole
  batch (within 1e-5), and a peak of simulated HBM per rank below the one-process peak
  by roughly the number of ranks;
- fp32 without resharding after forward, with activation checkpointing in each
  block: the same losses;
- ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: bf16 compute,
  fp32 master weights, losses close to fp32's.
"""

import copy

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trnsim.models.tinyllama import TinyLlama, causal_lm_loss
from _check import close

VOCAB, SEQ, GLOBAL_B, STEPS = 512, 16, 4, 5


def batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (GLOBAL_B, SEQ), generator=g) for _ in range(STEPS)]


def train(model, data):
    """Losses of 5 AdamW steps, and the peak HBM above what was allocated before."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    losses = []
    for ids in data:
        ids = ids.to("neuron")
        loss = causal_lm_loss(model(ids), ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    peak = torch.neuron.max_memory_allocated() - base
    del opt
    return losses, peak


def sharded(base, mesh, rank, world, data, reshard=True, ac=False, mp=None, seen=None):
    """Train a copy of ``base`` sharded over ``mesh``; ``seen`` collects the dtype of the
    first block's parameters while it runs forward."""
    model = copy.deepcopy(base)
    for i, blk in enumerate(model.blocks):
        if ac:
            blk = model.blocks[i] = checkpoint_wrapper(blk)
        fully_shard(blk, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp or MixedPrecisionPolicy())
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp or MixedPrecisionPolicy())
    if seen is not None:
        model.blocks[0].register_forward_pre_hook(lambda m, args: seen.add(m.q.weight.dtype))
    losses, peak = train(model, [ids.chunk(world)[rank] for ids in data])
    for loss in losses:
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    return [x.item() for x in losses], peak, model


def check_memory(model, peak, one_peak, world):
    """Parameters, gradients and AdamW's two moments are sharded ``world`` ways; on top,
    FSDP2 holds a few units' unsharded parameters and gradients at a time (the root's
    through forward and backward, a block's and the prefetched next block's, a block's
    gradients before their reduce-scatter). Activations are small at these sizes."""
    def unsharded_bytes(module):
        return sum(p.numel() * p.element_size() for p in module.parameters(recurse=False)) + sum(
            unsharded_bytes(m) for m in module.children() if m not in model.blocks)

    root = unsharded_bytes(model)
    block = max(sum(p.numel() * p.element_size() for p in b.parameters()) for b in model.blocks)
    limit = one_peak / world + root + 3 * block
    if peak > limit:
        raise SystemExit(f"rank {dist.get_rank()}: FSDP2 peak HBM {peak} bytes is above the sharded state "
                         f"{one_peak / world:.0f} + root {root} + 3 blocks {3 * block} = {limit:.0f}")
    if one_peak - peak < 0.5 * (one_peak - one_peak / world):
        raise SystemExit(f"rank {dist.get_rank()}: FSDP2 peak HBM {peak} bytes saves less than half of the "
                         f"{world}-way sharding's saving on one process's {one_peak}")


def main():
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("neuron", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    base = TinyLlama(vocab=VOCAB, d=128, layers=4, heads=4, kv_heads=2, ff=384, seq=SEQ)
    data = batches()

    ref = copy.deepcopy(base).to("neuron")
    want, one_peak = train(ref, data)
    want = [x.item() for x in want]
    del ref

    got, peak, model = sharded(base.to("neuron"), mesh, rank, world, data)
    close("FSDP2 fp32 losses", got, want, 1e-5)
    check_memory(model, peak, one_peak, world)
    del model
    got, _, model = sharded(base, mesh, rank, world, data, reshard=False, ac=True)
    close("FSDP2 without reshard_after_forward, with activation checkpointing", got, want, 1e-5)
    del model
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    seen = set()
    got, _, model = sharded(base, mesh, rank, world, data, mp=mp, seen=seen)
    if seen != {torch.bfloat16} or model.blocks[0].q.weight.dtype != torch.float32:
        raise SystemExit(f"rank {rank}: forward ran with {seen} parameters, master weights are "
                         f"{model.blocks[0].q.weight.dtype}; wanted bfloat16 and float32")
    # bf16 compute: within bf16's rounding of the fp32 losses (about 6.3, steps of 0.03)
    close("FSDP2 bf16 params / fp32 reduce", got, want, 5e-2)
    dist.barrier()
    print(f"rank {rank}: fsdp2 ok {want} peak {peak} one process {one_peak}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
