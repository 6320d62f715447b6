"""Train a small MLP classifier with a plain PyTorch loop on the ``neuron`` device.

The loop a user writes for a GPU, with ``"cuda"`` replaced by ``"neuron"``: a model,
AdamW, cross-entropy, backward, step. ``--compile`` runs the model through
``torch.compile(backend="neuron")``. Run it under the simulator to see where the time goes:

    trnsim run examples/train_mlp.py                                   # eager
    trnsim run --trace traces/mlp_compiled.json examples/train_mlp.py --compile
    trnsim diff traces/train_mlp.json traces/mlp_compiled.json          # what compiling saved
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--compile", action="store_true", help='torch.compile(backend="neuron") the model')
    args = parser.parse_args()

    torch.manual_seed(0)
    device = "neuron"
    model = nn.Sequential(nn.Linear(256, args.hidden), nn.GELU(), nn.Linear(args.hidden, args.hidden), nn.GELU(),
                          nn.Linear(args.hidden, 10)).to(device)
    step_model = torch.compile(model, backend="neuron") if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 256, generator=g).to(device)
    y = torch.randint(0, 10, (args.batch,), generator=g).to(device)
    for step in range(args.steps):
        opt.zero_grad()
        loss = F.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
