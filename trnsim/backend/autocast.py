"""``torch.autocast("neuron", dtype=torch.bfloat16)``: mixed precision on the device.

PyTorch keeps autocast op lists in C++ for its own devices only, so trnsim registers
kernels for the ``AutocastPrivateUse1`` key: matmul-like ops run in the autocast
dtype (bf16 by default, as the Neuron compiler's auto-cast does), ops that need
range run in fp32, as CUDA's lists do; every other op passes through.

The autocast dtype is per thread in PyTorch, and a new thread starts with PyTorch's
default for a PrivateUse1 device (float16); :func:`get_autocast_dtype` gives each
thread trnsim's default, bfloat16, until that thread sets another.
"""

from __future__ import annotations

import torch

_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

LOWER = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "addr", "dot", "vdot",
         "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution",
         "_convolution", "prelu", "chain_matmul", "linalg_multi_dot", "scaled_dot_product_attention", "conv_tbc",
         "_scaled_dot_product_flash_attention_for_cpu")
FP32 = ("softmax", "log_softmax", "layer_norm", "group_norm", "native_layer_norm", "native_group_norm", "rms_norm",
        "exp", "log", "log1p", "log2", "log10", "pow", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "expm1",
        "reciprocal", "rsqrt", "sum", "prod", "cumsum", "cumprod", "norm", "frobenius_norm", "nuclear_norm",
        "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "nll_loss", "nll_loss2d", "cross_entropy_loss",
        "kl_div", "binary_cross_entropy_with_logits", "soft_margin_loss", "multi_margin_loss", "poisson_nll_loss",
        "cosine_embedding_loss", "hinge_embedding_loss", "margin_ranking_loss", "triplet_margin_loss",
        "multilabel_margin_loss", "logsumexp", "dist", "pdist", "cdist", "renorm", "cosine_similarity")


def _cast(x, dtype: torch.dtype):
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == "neuron" and x.dtype != dtype \
            and x.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _kernel(op, to_fp32: bool):
    def kernel(*args, **kwargs):
        dtype = torch.float32 if to_fp32 else get_autocast_dtype("neuron")
        args = tuple(_cast(a, dtype) for a in args)
        kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_KS):
            return op(*args, **kwargs)
    return kernel


_libs: list = []
_get_dtype = torch.get_autocast_dtype
_set_dtype = torch.set_autocast_dtype
_DTYPE_SET = "trnsim.autocast_dtype_set"   # in PyTorch's thread-local state, which autograd threads inherit


def get_autocast_dtype(device_type: str) -> torch.dtype:
    """``torch.get_autocast_dtype``: for ``neuron``, bfloat16 in a thread that has set none."""
    if device_type == "neuron" and not torch._C._is_key_in_tls(_DTYPE_SET):
        set_autocast_dtype("neuron", torch.bfloat16)
    return _get_dtype(device_type)


def set_autocast_dtype(device_type: str, dtype: torch.dtype) -> None:
    """``torch.set_autocast_dtype``, remembering that this thread chose a ``neuron`` dtype."""
    if device_type == "neuron" and not torch._C._is_key_in_tls(_DTYPE_SET):
        torch._C._stash_obj_in_tls(_DTYPE_SET, True)
    _set_dtype(device_type, dtype)


def install() -> None:
    fall = torch.library.Library("_", "IMPL")
    fall.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    for names, to_fp32 in ((LOWER, False), (FP32, True)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                qual = op._schema.name + (f".{overload}" if overload != "default" else "")
                if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                    continue   # out= and in-place variants keep their dtypes
                lib.impl(qual.removeprefix("aten::"), _kernel(op, to_fp32), "AutocastPrivateUse1")
    _libs.extend([fall, lib])
    torch.get_autocast_dtype = get_autocast_dtype
    torch.set_autocast_dtype = set_autocast_dtype
