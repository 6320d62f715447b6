"""Simulated latency of the kernel library on each chip, against each kernel's roofline.

For every kernel in trnsim/kernels/ at one realistic bf16 size, prints the simulated
latency per chip and its ratio to the roofline bound of that chip: the larger of
the HBM time (bytes in and out at the core's share of HBM bandwidth) and the tensor
engine time (matmul FLOPs at peak). A ratio of 1.0 would be a perfect kernel.

    python benchmarks/nki_kernels.py
"""

from __future__ import annotations

import numpy as np

from trnsim import dtypes, load_chip
from trnsim.kernels.attention import flash_attention_bwd, flash_attention_fwd
from trnsim.kernels.matmul import matmul_optimized
from trnsim.kernels.norms import layernorm_kernel, rmsnorm_kernel
from trnsim.kernels.softmax import softmax_kernel
from trnsim.nki import benchmark, typed


def bf16(*shape: int) -> object:
    return typed(np.zeros(shape, np.float32), dtypes.bfloat16)


CASES = [
    ("softmax [4096, 2048]", softmax_kernel, lambda: (bf16(4096, 2048),), {}),
    ("rmsnorm [4096, 2048]", rmsnorm_kernel, lambda: (bf16(4096, 2048), bf16(2048)), {}),
    ("layernorm [4096, 2048]", layernorm_kernel, lambda: (bf16(4096, 2048), bf16(2048), bf16(2048)), {}),
    ("attention 1024x128", flash_attention_fwd, lambda: (bf16(1024, 128), bf16(1024, 128), bf16(1024, 128)), {}),
    ("attention 1024x128 causal", flash_attention_fwd, lambda: (bf16(1024, 128),) * 3, {"causal": True}),
    ("attention bwd 1024x128", flash_attention_bwd,
     lambda: (bf16(1024, 128),) * 5 + (np.zeros(1024, np.float32),), {}),
    ("attention bwd 1024x128 causal", flash_attention_bwd,
     lambda: (bf16(1024, 128),) * 5 + (np.zeros(1024, np.float32),), {"causal": True}),
    ("matmul 2048x2048x2048", matmul_optimized, lambda: (bf16(2048, 2048), bf16(2048, 2048)), {}),
]


def roofline_ns(chip, hbm_bytes: int, flops: int) -> float:
    """The larger of HBM time and tensor-engine time for the kernel's traffic and work."""
    return max(hbm_bytes / chip.hbm_bw_per_core_gbps, flops / chip.tensor_engine.peak_flops() * 1e9)


def main() -> None:
    chips = ["trn1", "trn2", "trn3"]
    print(f"{'kernel':<30}" + "".join(f"{c + ' us':>12}{'x roof':>8}" for c in chips))
    for name, kernel, args, kwargs in CASES:
        row = f"{name:<30}"
        for chip_name in chips:
            r = benchmark(kernel, chip=chip_name, numerics=False)(*args(), **kwargs)
            roof = roofline_ns(load_chip(chip_name), r.hbm_bytes, r.flops)
            row += f"{r.latency_us:>12.1f}{r.latency_ns / roof:>8.2f}"
        print(row)


if __name__ == "__main__":
    main()
