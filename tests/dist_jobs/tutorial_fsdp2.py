"""PyTorch's FSDP2 tutorial (FSDP_tutorial.rst, pytorch/examples distributed/FSDP2) with
``cuda`` replaced by ``neuron``: run with
``torchrun --nproc-per-node=2 tutorial_fsdp2.py neuron|cpu OUT [CHECKPOINT]``.

On ``neuron``, as the tutorial: ``init_process_group(backend=..., device_id=device)``, a
Transformer made on the meta device, ``fully_shard`` on each block and the root (the
default mesh), ``to_empty(device=device)`` and ``reset_parameters()`` (DTensor's random
ops: the whole parameters must equal the CPU's for the same seed), Adam, a DCP checkpoint
(``torch.distributed.checkpoint`` with ``get_state_dict``) half-way, and a restart from it
in a new model and optimizer that must repeat the steps after it. Then the same model
built on the CPU and sharded onto ``neuron`` by ``fully_shard`` (parameter data swapped
across devices) must train the same.

On the CPU (the reference, gloo): the model is made on the CPU (DTensor's random ops
have no RNG tracker there), sharded on a CPU mesh, trained the same steps; with
CHECKPOINT (a checkpoint the ``neuron`` run saved) it also restarts from it on the CPU.
Each rank writes its losses and how far its weights moved to ``OUT/rank<R>.json``.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from trnsim.testing.training import TrainingRun, movement, snapshot

DEV, OUT = sys.argv[1], sys.argv[2]
RESUME = sys.argv[3] if len(sys.argv) > 3 else None
VOCAB, SEQ, BATCH, DIM, HEADS, LAYERS, STEPS, SAVE_AT = 64, 8, 4, 16, 2, 2, 4, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.ffn_norm = nn.LayerNorm(DIM)
        self.w1 = nn.Linear(DIM, 4 * DIM)
        self.w2 = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).view(b, s, 3, HEADS, DIM // HEADS).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        h = x + self.wo(a.transpose(1, 2).reshape(b, s, DIM))
        return h + self.w2(F.gelu(self.w1(self.ffn_norm(h))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.pos_embeddings = nn.Embedding(SEQ, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()

    def reset_parameters(self):
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()


def batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(STEPS)]


def shard(model, mesh):
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(model, optim, data, device):
    losses = []
    for x in data:
        loss = model(x.to(device)).sum()
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    return losses


def cpu_model():
    """The model made on the CPU, its parameters drawn by ``reset_parameters`` from seed 0."""
    model = Transformer()
    torch.manual_seed(0)
    model.reset_parameters()
    return model


def restart(mesh, device, checkpoint, data):
    """A new model and optimizer loaded from ``checkpoint``, trained on ``data``."""
    torch.manual_seed(5)   # other initial weights: only the checkpoint may set them
    if DEV == "neuron":
        with torch.device("meta"):
            model = shard(Transformer(), mesh)
        model.to_empty(device=device)
        model.reset_parameters()
    else:
        model = shard(Transformer(), mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    model_sd, optim_sd = get_state_dict(model, optim)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=checkpoint)
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return train(model, optim, data, device)


def main():
    rank = int(os.environ["LOCAL_RANK"])
    if DEV == "neuron":
        device = torch.device(f"{torch.accelerator.current_accelerator()}:{rank}")
        torch.accelerator.set_device_index(rank)
        dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
        mesh = None   # fully_shard's default: the accelerator's, as in the tutorial
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    data = batches()
    out = {}
    if DEV == "neuron":
        torch.manual_seed(0)
        with torch.device("meta"):
            model = shard(Transformer(), mesh)
        model.to_empty(device=device)
        torch.manual_seed(0)
        model.reset_parameters()
        want = dict(cpu_model().named_parameters())
        for name, p in model.named_parameters():
            if not torch.equal(p.full_tensor().cpu(), want[name].detach()):
                raise SystemExit(f"rank {rank}: {name} after meta init, to_empty and reset_parameters differs from "
                                 "the CPU's for the same seed")
    else:
        model = shard(cpu_model(), mesh)
    before = snapshot(model)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = train(model, optim, data[:SAVE_AT], device)
    checkpoint = os.path.join(OUT, "checkpoint")
    model_sd, optim_sd = get_state_dict(model, optim)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=checkpoint)
    losses += train(model, optim, data[SAVE_AT:], device)
    out["losses"] = losses
    out["moved"] = movement(TrainingRun(losses, before, snapshot(model)))
    out["restart"] = restart(mesh, device, checkpoint, data[SAVE_AT:])
    if DEV == "neuron":
        model = shard(cpu_model(), mesh)   # made on the CPU, sharded onto neuron
        if {p.device.type for p in model.parameters()} != {"neuron"}:
            raise SystemExit(f"rank {rank}: fully_shard left parameters of a CPU-made model off the device")
        out["cpu_made"] = train(model, torch.optim.Adam(model.parameters(), lr=1e-2), data, device)
    if RESUME:
        out["resumed"] = restart(mesh, device, RESUME, data[SAVE_AT:])
    with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    print(f"rank {rank}: tutorial_fsdp2 ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
