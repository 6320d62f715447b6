"""The kernel library, written in trnsim.nki: each kernel is readable and copyable.

- :mod:`trnsim.kernels.matmul`: tiled matmul, basic and fully optimised
- :mod:`trnsim.kernels.gemm`: matmul of any sizes, batched
- :mod:`trnsim.kernels.softmax`: row softmax, with a masked last tile of rows
- :mod:`trnsim.kernels.reduce`: sum, max, min, mean and log-softmax over the last axis, rows of any length
- :mod:`trnsim.kernels.norms`: RMSNorm and LayerNorm over the last axis; GroupNorm; BatchNorm (training and eval,
  optionally with ReLU)
- :mod:`trnsim.kernels.backward`: gradients of activations, softmax, log-softmax, LayerNorm, BatchNorm (optionally
  through ReLU) and GroupNorm
- :mod:`trnsim.kernels.attention`: fused (flash-style) attention forward for one head, optionally causal
- :mod:`trnsim.kernels.elementwise`: unary, binary and scalar arithmetic, casts, the AdamW step
- :mod:`trnsim.kernels.conv`: 2-D convolution as an implicit GEMM
- :mod:`trnsim.kernels.conv_backward`: its input and weight gradients (a grouped convolution: one group's, once
  per group)
- :mod:`trnsim.kernels.conv_depthwise`: depthwise convolution (one input channel per group) and its gradients
- :mod:`trnsim.kernels.pool`: 2-D max pooling (with indices) and average pooling, forward and backward
- :mod:`trnsim.kernels.gather`: embedding lookup (row gather) and its gradient (scatter-add)
- :mod:`trnsim.kernels.loss`: negative log-likelihood loss, forward and backward
- :mod:`trnsim.kernels.movement`: concatenation by DMA
"""
