"""Common vision and language models on ``neuron``: which ops a training step times by a
bandwidth estimate rather than a kernel, and compiled against eager in simulated time.

Models (transformers, built from small configs with random weights; nothing downloaded):
ResNet (bottleneck), ConvNeXt, EfficientNet, ViT, Swin, a Llama; and PyTorch's own
``nn.TransformerEncoderLayer`` (dropout on). Each trains one step (forward, loss,
backward, SGD) after a first step, eager and with ``torch.compile(backend="neuron")``, on
trn2; images [2, 3, 64, 64], tokens [2, 32].

Prints per model: the simulated step time eager and compiled, compiled over eager, the
ops timed by an estimate (eager and compiled, with their counts), and the host seconds.
Everything printed is simulated (deterministic) but the host time.

Run: ``python benchmarks/model_ops.py`` (about a minute); ``--model NAME`` for one.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
import torch.nn as nn

import trnsim

IMAGES = (2, 3, 64, 64)
TOKENS = (2, 32)
CLASSES = 10


def build(name: str) -> nn.Module:
    import transformers as T

    if name == "resnet":
        return T.ResNetForImageClassification(T.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="bottleneck",
            num_labels=CLASSES))
    if name == "convnext":
        return T.ConvNextForImageClassification(T.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                                 num_labels=CLASSES))
    if name == "efficientnet":
        return T.EfficientNetForImageClassification(T.EfficientNetConfig(
            image_size=IMAGES[-1], width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, num_labels=CLASSES))
    if name == "vit":
        return T.ViTForImageClassification(T.ViTConfig(
            image_size=IMAGES[-1], patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, num_labels=CLASSES))
    if name == "swin":
        return T.SwinForImageClassification(T.SwinConfig(
            image_size=IMAGES[-1], patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
            num_labels=CLASSES))
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    if name == "transformer_layer":
        return nn.Sequential(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True),
                             nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True))
    raise SystemExit(f"unknown model {name!r}; one of {', '.join(MODELS)}")


MODELS = ("resnet", "convnext", "efficientnet", "vit", "swin", "llama", "transformer_layer")


def _step(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    if name == "llama":
        loss = model(input_ids=x, labels=x).loss
    elif name == "transformer_layer":
        loss = model(x).square().mean()
    else:
        loss = nn.functional.cross_entropy(model(pixel_values=x).logits, y)
    loss.backward()
    opt.step()


def train_step(name: str, compiled: bool) -> tuple[float, collections.Counter]:
    """(simulated microseconds of the second training step, estimated ops by name)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = build(name).to("neuron").train()
    if name == "llama":
        x = torch.randint(0, 256, TOKENS)
    elif name == "transformer_layer":
        x = torch.randn(*TOKENS, 64)
    else:
        x = torch.randn(*IMAGES)
    x, y = x.to("neuron"), torch.randint(0, CLASSES, (TOKENS[0],)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = torch.compile(model, backend="neuron") if compiled else model
    _step(name, run, x, y, opt)
    torch.neuron.synchronize()
    with trnsim.profile() as prof:
        _step(name, run, x, y, opt)
        torch.neuron.synchronize()
    estimated = collections.Counter(r.name for r in prof.records if r.cost.source == "estimate")
    return prof.device_ps / 1e6, estimated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=MODELS, help="only this model (repeatable)")
    args = parser.parse_args()
    torch.neuron.set_chip("trn2")
    print(f"{'model':18} {'eager us':>10} {'compiled us':>12} {'ratio':>6}  ops timed by an estimate "
          "(eager | compiled)  host s")
    for name in args.model or MODELS:
        start = time.perf_counter()
        eager, eager_est = train_step(name, False)
        compiled, compiled_est = train_step(name, True)

        def listed(c: collections.Counter) -> str:
            return ", ".join(f"{k.removeprefix('aten::')} x{n}" for k, n in sorted(c.items())) or "none"

        print(f"{name:18} {eager:10.1f} {compiled:12.1f} {compiled / eager:6.2f}  {listed(eager_est)} | "
              f"{listed(compiled_est)}  {time.perf_counter() - start:.0f}", flush=True)


if __name__ == "__main__":
    main()
