"""``torch_neuronx.distributed``: present, so imports of it work; every name in it is
refused by name until trnsim issue 12 (the ``neuron`` torch.distributed backend)."""

from trnsim.compat.torch_neuronx.refuse import refuser

__getattr__ = refuser("torch_neuronx.distributed", 12, "torch.distributed on the neuron device",
                      "until then run one process per NeuronCore without collectives")
