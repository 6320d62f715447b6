"""``torch_neuronx.profiling``: present, so imports of it work; every name in it is
refused by name until trnsim issue 14 (profiling tools); ``trnsim.profile`` records
the device's ops and writes a trace today."""

from trnsim.compat.torch_neuronx.refuse import refuser

__getattr__ = refuser("torch_neuronx.profiling", 14, "TorchNeuron's profiling API",
                      "use trnsim.profile(path) to record the neuron device's ops into a trace")
