"""``scaled_dot_product_attention`` on ``neuron`` as one fused op.

PyTorch's SDPA is CompositeImplicitAutograd: it picks a backend with a C++ dispatch
stub, ``_fused_sdp_choice_stub``, which a pure-Python device cannot fill, so on its
own it always takes the math path (matmul, softmax, matmul, each timed as an op).
trnsim therefore registers SDPA itself for ``neuron`` (at ``AutogradPrivateUse1``, and
at ``PrivateUse1`` for inference mode) and does what PyTorch does for a device that
fills the stub:

- ``aten::_fused_sdp_choice`` on ``neuron`` (:func:`choice`) answers
  ``SDPBackend.OVERRIDEABLE`` where the fused kernel applies, ``SDPBackend.MATH``
  otherwise;
- overrideable: ``aten::_scaled_dot_product_fused_attention_overrideable``, whose
  derivative PyTorch already defines as
  ``_scaled_dot_product_fused_attention_overrideable_backward``; both are registered
  here and run through the fallback's ``_compute`` on host aliases with PyTorch's CPU
  flash-attention kernels, so results are bit for bit the CPU's SDPA. Each is one op
  on the timeline, timed by the flash-attention kernels (:mod:`trnsim.backend.opkernels`);
- math: SDPA's own decomposition, exactly as without this module.

The fused path takes what the CPU's flash kernel takes (so the CPU picks the same
kernel and the numbers agree): 4-D dense q, k, v of one chip float dtype (fp32, bf16,
fp16), equal batch, equal heads or, with ``enable_gqa``, query heads a multiple of the
key and value heads (the overrideable op has no ``enable_gqa``: the CPU kernels read
the grouping from the shapes), equal head dims, non-empty sequences, last dimension contiguous, no dropout, and a
mask (bool or of q's dtype) of 2 or 4 dimensions broadcastable to the scores, not
requiring grad.

``torch.nn.attention.sdpa_kernel`` chooses as on the chip, whose one fused attention
kernel is a flash kernel: a list with any fused backend (``OVERRIDEABLE``, the device's
own, or ``FLASH_ATTENTION``, ``EFFICIENT_ATTENTION``, ``CUDNN_ATTENTION``, which scripts
written for GPUs name, as torchtitan's ``[CUDNN_ATTENTION, FLASH_ATTENTION, MATH]``)
allows the fused op; ``MATH`` alone turns it off (:func:`fused_backend_enabled`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.attention import SDPBackend

from trnsim.backend import dispatch

_aten = torch.ops.aten
_FWD = _aten._scaled_dot_product_fused_attention_overrideable.default
_BWD = _aten._scaled_dot_product_fused_attention_overrideable_backward.default
_SDPA = _aten.scaled_dot_product_attention.default
OVERRIDEABLE = int(SDPBackend.OVERRIDEABLE)
MATH = int(SDPBackend.MATH)
_CHIP_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def register(lib: torch.library.Library) -> None:
    """Register SDPA, the backend choice and the fused forward and backward for ``neuron``
    on ``lib``, a ``torch.library.Library("aten", "IMPL")``."""
    lib.impl("_fused_sdp_choice", choice, "PrivateUse1")
    lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
    lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "PrivateUse1")
    lib.impl("_scaled_dot_product_fused_attention_overrideable", _forward, "PrivateUse1")
    lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", _backward, "PrivateUse1")


def fused_backend_enabled() -> bool:
    """Whether ``sdpa_kernel`` (or the ``torch.backends.cuda.enable_*_sdp`` switches) leave
    a fused backend on: any of overrideable, flash, memory-efficient and cuDNN."""
    c = torch._C
    return (c._get_overrideable_sdp_enabled() or c._get_flash_sdp_enabled() or c._get_mem_efficient_sdp_enabled()
            or c._get_cudnn_sdp_enabled())


def fusable(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
            dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False) -> bool:
    """Whether SDPA with these arguments runs as the one fused op (see the module)."""
    qkv = (query, key, value)
    if not fused_backend_enabled() or dropout_p > 0.0:
        return False
    if any(t.dim() != 4 or t.is_nested or t.layout != torch.strided or t.stride(-1) != 1 for t in qkv):
        return False
    if query.dtype not in _CHIP_FLOATS or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    b, h, sq, d = query.shape
    if any(t.shape[0] != b or t.shape[3] != d for t in (key, value)):
        return False
    kv_heads = key.shape[1]
    if value.shape[1] != kv_heads or (kv_heads != h and not (enable_gqa and h % kv_heads == 0)):
        return False
    sk = key.shape[2]
    if value.shape[2] != sk or sq == 0 or sk == 0:
        return False
    if attn_mask is None:
        return True
    if is_causal or attn_mask.requires_grad or attn_mask.dtype not in (torch.bool, query.dtype):
        return False
    want = (sq, sk) if attn_mask.dim() == 2 else (b, h, sq, sk) if attn_mask.dim() == 4 else None
    return want is not None and all(m in (n, 1) for m, n in zip(attn_mask.shape, want))


def choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
           enable_gqa=False) -> int:
    """``aten::_fused_sdp_choice`` on ``neuron``: OVERRIDEABLE where :func:`fusable`, else MATH."""
    return OVERRIDEABLE if fusable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) else MATH


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                                 scale=None, enable_gqa=False):
    """SDPA on ``neuron``: the fused overrideable op where the choice says so, else
    PyTorch's own decomposition (which takes the math path on this device)."""
    if fusable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        return _FWD(query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale)[0]
    return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool mask as the additive mask SDPA makes of it (0 where True, -inf where False)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask.logical_not(), float("-inf"))


def _host_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                  scale=None) -> tuple:
    out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=_float_mask(attn_bias, query.dtype), scale=scale)
    # laid out as the meta kernel lays them out: the output as the query, the log-sum-exp dense
    out, lse = _laid_out_as(out, _matching_layout(query, out.shape)), lse.contiguous()
    # no varlen sequences and no debug mask: undefined tensors, as in the meta kernel; no dropout, so the RNG
    # seed and offset are zeros, but tensors as the meta kernel's are (a compiled graph saves them for backward)
    seed, offset = torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)
    return out, lse, None, None, query.shape[2], key.shape[2], seed, offset, None


def _host_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
                   max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None) -> tuple:
    gq, gk, gv = _aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
        attn_mask=_float_mask(attn_bias, query.dtype), scale=scale)
    # each gradient laid out as its input, as the op's meta kernel says (empty_like): a
    # compiled graph traced with that layout views the gradients accordingly
    return (_laid_out_as(gq, torch.empty_like(query)), _laid_out_as(gk, torch.empty_like(key)),
            _laid_out_as(gv, torch.empty_like(value)), None)


def _matching_layout(query: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """An empty tensor of ``shape`` with ``query``'s dimension order, as the meta kernel of
    the fused attention allocates its output (``alloc_with_matching_layout``)."""
    if tuple(query.shape) == tuple(shape):
        return torch.empty_like(query)
    order = sorted(range(query.dim()), key=lambda d: query.stride(d), reverse=True)
    dense = torch.empty([shape[d] for d in order], dtype=query.dtype, device=query.device)
    return dense.permute([order.index(d) for d in range(query.dim())])


def _laid_out_as(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` in ``like``'s strides (``value`` itself when they already match)."""
    if value.stride() == like.stride():
        return value
    return like.copy_(value)


def _forward(*args: Any, **kwargs: Any):
    if kwargs.get("return_debug_mask") or (len(args) > 6 and args[6]):
        raise NotImplementedError("_scaled_dot_product_fused_attention_overrideable on neuron: return_debug_mask=True "
                                  "is not supported; call it with return_debug_mask=False")
    return dispatch._compute(_FWD, dispatch._info(_FWD), args, kwargs, host_op=_host_forward)


def _backward(*args: Any, **kwargs: Any):
    return dispatch._compute(_BWD, dispatch._info(_BWD), args, kwargs, host_op=_host_backward)
