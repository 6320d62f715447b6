"""``torch_xla.core``: holds :mod:`.xla_model`, the device API of PyTorch/XLA."""
