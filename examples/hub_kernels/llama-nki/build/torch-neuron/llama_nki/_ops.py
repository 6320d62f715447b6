"""The kernels as PyTorch custom ops (``torch_neuronx.nki_op``): one graph node each
under ``torch.compile``, called on ``neuron`` tensors in eager mode."""

import torch
import torch_neuronx

from .rmsnorm import nki_rms_norm
from .swiglu import nki_swiglu_mlp

# one namespace per build, as kernel-builder gives each build its own
NAMESPACE = "_llama_nki_neuron_v1"


@torch_neuronx.nki_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm over the last axis of ``x`` (any leading shape), by ``nki_rms_norm``."""
    out = nki_rms_norm(x.reshape(-1, x.shape[-1]), weight.reshape(1, -1), eps)
    return out.reshape(x.shape)


@torch_neuronx.nki_op(f"{NAMESPACE}::swiglu_mlp", mutates_args=())
def swiglu_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Llama's MLP on the last axis of ``x`` (any leading shape), by ``nki_swiglu_mlp``;
    weights in ``nn.Linear``'s [out, in] layout."""
    out = nki_swiglu_mlp(x.reshape(-1, x.shape[-1]), w_gate, w_up, w_down)
    return out.reshape(*x.shape[:-1], w_down.shape[0])
