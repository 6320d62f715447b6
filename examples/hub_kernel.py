"""Hub kernels on ``neuron``: a tiny Llama with NKI RMSNorm and SwiGLU MLP layers from
the ``kernels`` library, loaded from a local kernel repository.

The repository (``examples/hub_kernels/llama-nki``) is laid out as the Hub's noarch
Neuron build, ``build/torch-neuron/``: NKI kernels that ``import nki`` and a ``layers``
module. ``kernels`` picks that build because ``torch.neuron`` exists, and

- ``kernels.kernelize(model, device="neuron", mode=Mode.INFERENCE)`` with a mapping of
  ``LocalLayerRepository`` entries replaces the forward of every ``LlamaRMSNorm``
  (registered by transformers as ``"RMSNorm"``) and every ``LlamaMLP`` (registered here
  as ``"SwiGLUMLP"``; transformers does not register it);
- ``from_pretrained(..., use_kernels=True, kernel_config=KernelConfig(...))`` with the
  device key ``"neuron"`` does the same, the repository named by a Hub id that
  ``LOCAL_KERNELS`` points at the local directory.

Prints the largest logit difference to the unreplaced model, and what each replaced
layer cost in simulated device time before and after.

    python examples/hub_kernel.py
    trnsim run examples/hub_kernel.py
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import trnsim
from kernels import LocalLayerRepository, Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping
from transformers import KernelConfig, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaMLP

KERNEL_REPO = Path(__file__).resolve().parent / "hub_kernels" / "llama-nki"
HUB_ID = "trnsim/llama-nki"   # the id LOCAL_KERNELS maps to KERNEL_REPO for transformers' KernelConfig


def tiny_llama() -> LlamaForCausalLM:
    """A 2-layer Llama (width 64, MLP 128) with seeded random weights, fp32, on the CPU."""
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def mapping() -> dict:
    """The kernel mapping for ``kernels.use_kernel_mapping``: both layers from the local repository."""
    return {"RMSNorm": {"neuron": LocalLayerRepository(KERNEL_REPO, layer_name="RMSNorm")},
            "SwiGLUMLP": {"neuron": LocalLayerRepository(KERNEL_REPO, layer_name="SwiGLUMLP")}}


def kernelize_llama(model: torch.nn.Module, mode: Mode = Mode.INFERENCE) -> torch.nn.Module:
    """Give ``model``'s RMSNorms and MLPs the hub kernel's forward (``kernels.kernelize``)."""
    replace_kernel_forward_from_hub(LlamaMLP, "SwiGLUMLP")
    with use_kernel_mapping(mapping()):
        return kernelize(model, device="neuron", mode=mode)


@contextlib.contextmanager
def local_hub_id() -> Iterator[None]:
    """``LOCAL_KERNELS`` maps :data:`HUB_ID` to the local repository while active."""
    before = os.environ.get("LOCAL_KERNELS")
    os.environ["LOCAL_KERNELS"] = f"{HUB_ID}={KERNEL_REPO}"
    try:
        yield
    finally:
        if before is None:
            del os.environ["LOCAL_KERNELS"]
        else:
            os.environ["LOCAL_KERNELS"] = before


def from_pretrained_with_kernels(path: str) -> LlamaForCausalLM:
    """``from_pretrained(path, device_map="neuron", use_kernels=True, kernel_config=...)``:
    ``"RMSNorm"`` layers get the kernel's ``RMSNorm``; ``LlamaMLP`` is built as the
    kernel's ``SwiGLUMLPLayout`` (same parameters) and given ``SwiGLUMLP``'s forward."""
    config = KernelConfig({"RMSNorm": {"neuron": f"{HUB_ID}:RMSNorm"},
                           "LlamaMLP": {"neuron": f"{HUB_ID}:SwiGLUMLP"}})
    with local_hub_id():
        return LlamaForCausalLM.from_pretrained(path, device_map="neuron", use_kernels=True, kernel_config=config)


def profile_call(fn) -> trnsim.profile:
    """The profile of ``fn()`` run from an idle device."""
    torch.neuron.synchronize()
    with torch.no_grad(), trnsim.profile() as prof:
        fn()
        torch.neuron.synchronize()
    return prof


def kernel_ps(prof: trnsim.profile) -> int:
    """Simulated device time spent in the profile's ops (launch waits excluded), in ps."""
    return sum(r.end_ps - r.start_ps for r in prof.records)


def layer_costs(plain: LlamaForCausalLM, kernelized: LlamaForCausalLM, ids: torch.Tensor) -> list[dict]:
    """For the first RMSNorm and MLP: the ops each runs and their simulated time, in the
    plain model and in the kernelized one, on that layer's input for ``ids``."""
    with torch.no_grad():
        hidden = plain.model.embed_tokens(ids)
    rows = []
    for name, get in (("RMSNorm", lambda m: m.model.layers[0].input_layernorm),
                      ("MLP", lambda m: m.model.layers[0].mlp)):
        before = profile_call(lambda get=get: get(plain)(hidden))
        after = profile_call(lambda get=get: get(kernelized)(hidden))
        rows.append({"layer": name, "ops": [r.name for r in before.records], "ops_ps": kernel_ps(before),
                     "ops_device_ps": before.device_ps, "kernel": [r.name for r in after.records],
                     "kernel_ps": kernel_ps(after), "kernel_device_ps": after.device_ps})
    return rows


def main() -> dict:
    logging.getLogger("kernels").setLevel(logging.ERROR)   # "no mapping for rotary_pos_emb/SiLU" notes
    ids = torch.arange(16).reshape(1, 16).to("neuron")
    plain = tiny_llama().to("neuron")
    kernelized = kernelize_llama(tiny_llama().to("neuron"))
    with torch.no_grad():
        reference = plain(ids).logits.cpu()
        gap = (kernelized(ids).logits.cpu() - reference).abs().max().item()
    print(f"kernelize(device='neuron'): LlamaRMSNorm runs {kernelized.model.norm.forward.__qualname__}, LlamaMLP "
          f"runs {kernelized.model.layers[0].mlp.forward.__qualname__}; max logit difference {gap:.2e}")
    rows = layer_costs(plain, kernelized, ids)
    for r in rows:
        print(f"{r['layer']:8} {len(r['ops']):2d} ops {r['ops_ps'] / 1e6:7.3f} us in kernels "
              f"({r['ops_device_ps'] / 1e6:7.3f} us with launches) -> {'+'.join(r['kernel'])} "
              f"{r['kernel_ps'] / 1e6:7.3f} us ({r['kernel_device_ps'] / 1e6:7.3f} us)")
    prof = profile_call(lambda: kernelized(ids))
    print(prof.summary())

    with tempfile.TemporaryDirectory() as path:
        tiny_llama().save_pretrained(path)
        loaded = from_pretrained_with_kernels(path)
        with torch.no_grad():
            hf_gap = (loaded(ids).logits.cpu() - reference).abs().max().item()
    print(f"from_pretrained(use_kernels=True, KernelConfig device 'neuron'): MLP class "
          f"{type(loaded.model.layers[0].mlp).__name__}, forward {loaded.model.layers[0].mlp.forward.__qualname__}; "
          f"max logit difference {hf_gap:.2e}")
    return {"gap": gap, "hf_gap": hf_gap, "layers": rows, "summary": prof.summary()}


if __name__ == "__main__":
    main()
