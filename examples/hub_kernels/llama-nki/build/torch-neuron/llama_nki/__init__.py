"""llama-nki: Llama's RMSNorm and SwiGLU MLP as NKI kernels, a Hub kernel for Neuron.

``nki_rms_norm`` and ``nki_swiglu_mlp`` are the NKI kernels (``import nki``); ``rms_norm``
and ``swiglu_mlp`` call them on torch tensors as custom ops; ``layers`` holds the layers
``kernels.kernelize`` puts in a model.
"""

from . import layers
from ._ops import rms_norm, swiglu_mlp
from .rmsnorm import nki_rms_norm
from .swiglu import nki_swiglu_mlp

__all__ = ["layers", "nki_rms_norm", "nki_swiglu_mlp", "rms_norm", "swiglu_mlp"]
