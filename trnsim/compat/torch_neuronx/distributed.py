"""``torch_neuronx.distributed``: present, so imports of it work. trnsim provides
torch.distributed itself with backend ``"neuron"`` (registered with the device, no
import needed); the names of AWS's own module are not reproduced, and each is refused
by name."""

from trnsim.compat.torch_neuronx.refuse import refuser

__getattr__ = refuser("torch_neuronx.distributed", None, "torch.distributed on the neuron device",
                      "use torch.distributed directly: dist.init_process_group(backend=\"neuron\") under torchrun "
                      "(docs/distributed.md)")
