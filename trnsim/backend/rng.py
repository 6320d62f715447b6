"""Random numbers on ``neuron``: one device generator, separate from the CPU's.

Random ops run PyTorch's CPU kernels on the host memory, and each is handed the
device's generator through its own ``generator`` argument (:func:`device_generator`),
so the CPU default generator is never touched: draws on ``neuron`` and on the CPU
never disturb each other, in any thread, and the generator's own lock serialises
concurrent draws. ``torch.manual_seed(s)`` seeds both (PyTorch calls
:func:`manual_seed` of the device module), so a seeded program draws the same numbers
on ``neuron`` as on the CPU. ``torch.Generator(device="neuron")`` gives a
:class:`NeuronGenerator`.

As on other devices, a generator serves only its own device: a CPU generator for a
draw on ``neuron``, or a neuron one for a draw on the CPU, raises PyTorch's
``RuntimeError``. A neuron generator is a CPU generator to PyTorch's C++, so once one
exists the CPU kernels of the random ops get a check in front (:func:`_guard_cpu`).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any

import torch

from trnsim.backend import state

_C_Generator = torch._C.Generator


# The C++ generators of live neuron generators. A generator argument comes back from the
# dispatcher as a new ``torch._C.Generator`` over the same C++ generator, so this, not the
# Python class, says whether a generator is a neuron one.
_neuron_impls: dict[int, weakref.ref] = {}


def is_neuron(gen: Any) -> bool:
    """True if ``gen`` (any Python object over a C++ generator) is a neuron generator."""
    return gen is not None and gen._cdata in _neuron_impls


class NeuronGenerator(_C_Generator):
    """A generator for the ``neuron`` device (a CPU Philox/MT state used by the host kernels)."""

    def __new__(cls, device=None):
        g = _C_Generator.__new__(cls, "cpu")
        key = g._cdata
        _neuron_impls[key] = weakref.ref(g, lambda _r: _neuron_impls.pop(key, None))
        return g

    @property
    def device(self) -> torch.device:
        return torch.device("neuron", 0)

    def __reduce__(self):
        return (_restore, (self.get_state(),))


def _restore(state: torch.Tensor) -> NeuronGenerator:
    g = user_generator()
    g.set_state(state)
    return g


def user_generator() -> NeuronGenerator:
    """A new neuron generator for the user (the CPU kernels learn to refuse it first)."""
    if _guard_lib is None:
        with _guard_lock:    # two threads making their first generators: guard once
            if _guard_lib is None:
                _guard_cpu()
    return NeuronGenerator()


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


def mismatch(expected: str, found: str) -> RuntimeError:
    """PyTorch's error for a generator of another device (``check_generator``)."""
    return RuntimeError(f"Expected a '{expected}' device type for generator but found '{found}'")


def device_generator(gen: Any) -> torch.Generator:
    """The generator a draw on ``neuron`` uses: ``gen`` if it is a neuron generator, the
    device's default one if ``gen`` is None."""
    if gen is None:
        return default_generator
    if is_neuron(gen):
        return gen
    raise mismatch("neuron", gen.device.type)


_tls = threading.local()


class device_draw:
    """While active (in this thread), CPU kernels may draw from neuron generators: the
    host kernel of a neuron op is running."""

    __slots__ = ("saved",)

    def __enter__(self) -> None:
        self.saved = getattr(_tls, "active", False)
        _tls.active = True

    def __exit__(self, *exc: Any) -> None:
        _tls.active = self.saved


def native_dropout(x: torch.Tensor, p: float, train: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten::native_dropout`` as PyTorch's CPU kernel computes it, drawing the mask from
    the device generator (the op has no ``generator`` argument to hand it)."""
    if x.numel() == 0:
        return x, torch.empty_like(x)
    if train is None or train:
        keep = 1.0 - p
        mask = torch.empty_like(x, memory_format=torch.contiguous_format).bernoulli_(keep, generator=default_generator)
        return x.mul(mask).mul_(0.0 if keep == 0 else 1.0 / keep), mask.bool()
    return x.clone(), torch.ones_like(x, dtype=torch.bool)


# -- CPU kernels refuse neuron generators -------------------------------------

_guard_lib: torch.library.Library | None = None
_guard_lock = threading.Lock()


def _guard_cpu() -> None:
    """Put a check of the generator in front of the CPU kernel of every random op that
    takes one (on the first user-made neuron generator, so programs that make none pay
    nothing)."""
    global _guard_lib
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # each registration warns that it overrides the CPU kernel
        for qual in torch._C._dispatch_get_all_op_names():
            if not qual.startswith("aten::") or not torch._C._dispatch_has_kernel_for_dispatch_key(qual, "CPU"):
                continue
            base, _, over = qual.removeprefix("aten::").partition(".")
            op = getattr(getattr(torch.ops.aten, base), over or "default")
            if torch.Tag.nondeterministic_seeded not in op.tags:
                continue
            slot = generator_slot(op)
            if slot is not None:
                lib.impl(qual.removeprefix("aten::"), _checked(torch.library.get_kernel(op, "CPU"), slot), "CPU",
                         with_keyset=True)
    _guard_lib = lib


def generator_slot(op: torch._ops.OpOverload) -> tuple[int, str] | None:
    """Position and name of ``op``'s ``generator`` argument, or None."""
    for i, a in enumerate(op._schema.arguments):
        if a.name == "generator":
            return i, a.name
    return None


def _checked(kernel: Any, slot: tuple[int, str]):
    pos, name = slot

    def cpu_kernel(keyset, *args, **kwargs):
        gen = args[pos] if pos < len(args) else kwargs.get(name)
        if is_neuron(gen) and not getattr(_tls, "active", False):
            raise mismatch("cpu", "neuron")
        return kernel.call_boxed(keyset, *args, **kwargs)

    return cpu_kernel


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
            return user_generator()
        return _C_Generator(device)


def install() -> None:
    """Make ``torch.Generator(device="neuron")`` work."""
    if torch.Generator is _C_Generator:
        Generator.__module__ = "torch"
        Generator.__qualname__ = "Generator"
        torch.Generator = Generator
