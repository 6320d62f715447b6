"""A tiny Llama eager, compiled, and compiled with the hub kernels: simulated time.

The hub kernels are the example repository ``examples/hub_kernels/llama-nki`` (NKI
RMSNorm and fused SwiGLU MLP), put in the model by ``kernels.kernelize(model,
device="neuron", mode=Mode.INFERENCE | Mode.TORCH_COMPILE)`` as
``examples/hub_kernel.py`` does. For each model, in one run: the simulated time of one
forward pass from an idle device, eager, eager with the kernels, compiled with
``backend="neuron"``, and compiled with the kernels inside the graph (each kernel one
graph node), and the ratios. Simulated times are deterministic.

Models (transformers ``LlamaForCausalLM``, random weights, fp32, trn2):

- the example's Llama: 2 layers, width 64, MLP 128, 4 heads, 1 x 16 tokens;
- the compile benchmark's Llama: 4 layers, width 256, MLP 688, 8 heads (2 key/value
  heads), vocabulary 1000, 1 x 128 tokens.

Run: ``python benchmarks/hf_hub_kernels.py`` (about a minute)
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from kernels import Mode
from transformers import LlamaConfig, LlamaForCausalLM

from trnsim.backend import state

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "hub_kernel.py"
SHAPES = {
    "example Llama 1x16": (dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64), (1, 16)),
    "4-layer Llama 1x128": (dict(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                 num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024), (1, 128)),
}


def _example():
    spec = importlib.util.spec_from_file_location("example_hub_kernel", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(config: dict) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**config)).to("neuron").eval()


def measure(example, config: dict, shape: tuple[int, int]) -> dict:
    """Simulated device time (us) of one forward pass in each of the four ways, and the
    largest logit difference of the kernelized runs to eager."""
    ids = torch.randint(0, config["vocab_size"], shape, generator=torch.Generator().manual_seed(1)).to("neuron")
    plain = _model(config)
    kernelized = example.kernelize_llama(_model(config), mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    times, logits = {}, {}
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(plain, backend="neuron")
        compiled(ids)
        compiled_k = torch.compile(kernelized, backend="neuron")
        compiled_k(ids)
        for name, fn in (("eager", plain), ("eager + hub kernels", kernelized), ("compiled", compiled),
                         ("compiled + hub kernels", compiled_k)):
            logits[name] = fn(ids).logits.cpu()
            times[name] = example.profile_call(lambda fn=fn: fn(ids)).device_ps / 1e6
    gap = max((logits[k] - logits["eager"]).abs().max().item() for k in logits)
    return {"times": times, "gap": gap}


def main() -> None:
    logging.getLogger("kernels").setLevel(logging.ERROR)
    example = _example()
    print(f"chip {state.chip().name}; simulated device time of one forward pass, from an idle device")
    head = f"{'model':22} {'eager us':>10} {'eager+hk':>10} {'compiled':>10} {'comp+hk':>10} " \
           f"{'comp/eager':>10} {'comp+hk/eager':>13} {'comp+hk/comp':>12} {'max diff':>9}"
    print(head)
    for label, (config, shape) in SHAPES.items():
        r = measure(example, config, shape)
        t = r["times"]
        e, ek, c, ck = t["eager"], t["eager + hub kernels"], t["compiled"], t["compiled + hub kernels"]
        print(f"{label:22} {e:10.1f} {ek:10.1f} {c:10.1f} {ck:10.1f} {c / e:10.3f} {ck / e:13.3f} {ck / c:12.3f} "
              f"{r['gap']:9.1e}")
    print("eager+hk / comp+hk: with the hub kernels (kernels.kernelize, Mode.INFERENCE | Mode.TORCH_COMPILE); "
          "max diff: largest logit difference of any run to eager")


if __name__ == "__main__":
    main()
