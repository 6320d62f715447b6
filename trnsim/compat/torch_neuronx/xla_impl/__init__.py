"""``torch_neuronx.xla_impl``: the part of TorchNeuron's XLA implementation that NKI code
imports, :mod:`.ops` (``nki_jit``)."""
