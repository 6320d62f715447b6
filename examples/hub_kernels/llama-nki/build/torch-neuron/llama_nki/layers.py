"""Layers for ``kernels.kernelize``: stateless classes whose ``forward`` replaces the
``forward`` of a model's layer and reads that layer's parameters.

- ``RMSNorm`` for layers registered as ``"RMSNorm"`` (transformers' ``LlamaRMSNorm`` and
  its many copies: ``weight``, ``variance_epsilon``).
- ``SwiGLUMLP`` for Llama-style MLPs (``gate_proj``, ``up_proj``, ``down_proj`` without
  bias, SiLU): transformers does not register ``LlamaMLP``, so map it with
  ``kernels.replace_kernel_forward_from_hub(LlamaMLP, "SwiGLUMLP")`` or, from
  ``from_pretrained``, with ``SwiGLUMLPLayout`` (below).

Forward only (``has_backward = False``): ``kernelize`` keeps the original forward in
``Mode.TRAINING``.
"""

import torch
from torch import nn

from ._ops import rms_norm, swiglu_mlp


class RMSNorm(nn.Module):
    """``forward`` of Llama's RMSNorm by the ``nki_rms_norm`` kernel. The result has the
    input's dtype; Llama's has the promoted dtype of weight and input, the same when the
    model is in one dtype."""

    can_torch_compile = True
    has_backward = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)


class SwiGLUMLP(nn.Module):
    """``forward`` of Llama's MLP by the fused ``nki_swiglu_mlp`` kernel."""

    can_torch_compile = True
    has_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)


class SwiGLUMLPLayout(nn.Module):
    """A Llama MLP's parameters (``gate_proj``, ``up_proj``, ``down_proj``, as in the
    checkpoint), for transformers' ``KernelConfig`` to build in place of the model's MLP
    class; ``kernelize`` then gives it ``SwiGLUMLP.forward``."""

    def __init__(self, config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
