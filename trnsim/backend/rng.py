"""Random numbers on ``neuron``: one device generator, separate from the CPU's.

Random ops run PyTorch's CPU kernels on the host memory, so while one runs the CPU
default generator is swapped for the device's. ``torch.manual_seed(s)`` seeds both
(PyTorch calls :func:`manual_seed` of the device module), so a seeded program draws
the same numbers on ``neuron`` as on the CPU.
``torch.Generator(device="neuron")`` gives a :class:`NeuronGenerator`.
"""

from __future__ import annotations

import torch

from trnsim.backend import state

_C_Generator = torch._C.Generator


class NeuronGenerator(_C_Generator):
    """A generator for the ``neuron`` device (a CPU Philox/MT state used by the host kernels)."""

    def __new__(cls, device=None):
        return _C_Generator.__new__(cls, "cpu")

    @property
    def device(self) -> torch.device:
        return torch.device("neuron", 0)

    def __reduce__(self):
        return (_restore, (self.get_state(),))


def _restore(state: torch.Tensor) -> NeuronGenerator:
    g = NeuronGenerator()
    g.set_state(state)
    return g


default_generator = NeuronGenerator()
default_generator.manual_seed(_C_Generator().initial_seed())


def manual_seed(seed: int) -> None:
    """Seed the device's default generator."""
    default_generator.manual_seed(int(seed))


def seed() -> int:
    """Seed the device's default generator from a random number; return it."""
    return default_generator.seed()


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    default_generator.set_state(new_state)


class swapped_default:
    """While active, the CPU default generator draws from the device generator."""

    __slots__ = ("saved",)

    def __enter__(self) -> None:
        cpu = torch.default_generator
        self.saved = cpu.get_state()
        cpu.set_state(default_generator.get_state())

    def __exit__(self, *exc) -> None:
        cpu = torch.default_generator
        default_generator.set_state(cpu.get_state())
        cpu.set_state(self.saved)


class _GeneratorMeta(type(_C_Generator)):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _C_Generator)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _C_Generator)


class Generator(_C_Generator, metaclass=_GeneratorMeta):
    """``torch.Generator`` that also accepts ``device="neuron"``; every other device
    gets PyTorch's own generator."""

    def __new__(cls, device="cpu"):
        d = torch.device(device) if not isinstance(device, torch.device) else device
        if d.type == "neuron":
            state.check_device_index(d.index)
            return NeuronGenerator()
        return _C_Generator(device)


def install() -> None:
    """Make ``torch.Generator(device="neuron")`` work."""
    if torch.Generator is _C_Generator:
        Generator.__module__ = "torch"
        Generator.__qualname__ = "Generator"
        torch.Generator = Generator
