"""The kernel library, written in trnsim.nki: each kernel is readable and copyable.

- :mod:`trnsim.kernels.matmul`: tiled matmul, basic and fully optimised
- :mod:`trnsim.kernels.softmax`: row softmax, with a masked last tile of rows
- :mod:`trnsim.kernels.norms`: RMSNorm and LayerNorm over the last axis
- :mod:`trnsim.kernels.attention`: fused (flash-style) attention forward for one head, optionally causal
"""
