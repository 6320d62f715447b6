"""Random numbers on ``neuron``: one device generator, separate from the CPU's.

Random ops run PyTorch's CPU kernels on the host memory, and each is handed the
device's generator through its own ``generator`` argument (:func:`device_generator`),
so the CPU default generator is never touched: draws on ``neuron`` and on the CPU
never disturb each other, in any thread, and the generator's own lock serialises
concurrent draws. ``torch.manual_seed(s)`` seeds both (PyTorch calls
:func:`manual_seed` of the device module), so a seeded program draws the same numbers
on ``neuron`` as on the CPU. ``torch.Generator(device="neuron")`` gives a
:class:`NeuronGenerator`.

A random op on a sharded DTensor (``uniform_`` in ``reset_parameters`` after
``to_empty``, ``dtensor.randn``, dropout) runs inside a :class:`sharded_draw`: each rank
draws the whole tensor from the same generator state, exactly as one process would,
and keeps the elements it holds, so the global tensor and the generator state after it
are those of the same draw on one process (and on the CPU), whatever the mesh.

As on other devices, a generator serves only its own device: a CPU generator for a
draw on ``neuron``, or a neuron one for a draw on the CPU, raises PyTorch's
``RuntimeError``. A neuron generator is a CPU generator to PyTorch's C++, so once one
exists the CPU kernels of the random ops get a check in front (:func:`_guard_cpu`).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any, Callable

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


# The default generators of the instance's other cores. This process runs nothing there,
# but as on a host with many devices their states can be read, set and seeded
# (``torch.random.fork_rng`` saves and restores every device's; checkpoints keep them).
_others: dict[int, torch._C.Generator] = {}
_all_seed: list[int] = []   # the seed manual_seed_all gave every core last


def core_generator(index: int) -> torch._C.Generator:
    """The default generator of another core (``index``) of the instance."""
    gen = _others.get(index)
    if gen is None:
        gen = _others[index] = _C_Generator()
        gen.manual_seed(_all_seed[-1] if _all_seed else default_generator.initial_seed())
    return gen


def manual_seed_all(seed: int) -> None:
    """Seed the default generator of every core: this process's and the instance's others."""
    seed = int(seed)
    manual_seed(seed)
    _all_seed[:] = [seed]
    _others.clear()


def seed_all() -> int:
    """Seed every core's default generator from one random number; return it."""
    seed = default_generator.seed()
    manual_seed_all(seed)
    return seed


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
    """The generator a draw on ``neuron`` uses: ``gen`` if it is a neuron generator; if
    ``gen`` is None, the one of the active :class:`sharded_draw` or else the device's
    default one."""
    if gen is None:
        region = sharded_region()
        gen = region.generator if region is not None else None
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
        mask = torch.empty_like(x, memory_format=torch.contiguous_format)
        mask.bernoulli_(keep, generator=device_generator(None))
        return x.mul(mask).mul_(0.0 if keep == 0 else 1.0 / keep), mask.bool()
    return x.clone(), torch.ones_like(x, dtype=torch.bool)


# -- sharded draws ------------------------------------------------------------

class sharded_draw:
    """While active (in this thread), a random op on ``neuron`` whose tensors are one rank's
    shard of a larger tensor draws the whole tensor and keeps the shard.

    ``shape`` is the whole tensor's shape and ``local_shape`` the shard's; ``locate()``
    says where the shard lies in the whole tensor: a tuple of slices (a block), or, for
    shards that are no block, a tensor of the shard's shape holding the flat index in the
    whole tensor of each of its elements. It is asked only when an op draws (never under
    timing fidelity). ``generator`` (a neuron generator, or None for the default one) is
    the one to draw from. Tensor arguments of the shard's shape are widened to the whole
    shape (the shard's values in place, zeros elsewhere: a draw's count of random numbers
    does not depend on the values), a size argument equal to the shard's shape becomes the
    whole shape, and results of the whole shape are narrowed back to the shard."""

    __slots__ = ("shape", "local_shape", "locate", "generator", "_where", "saved")

    def __init__(self, shape: tuple[int, ...], local_shape: tuple[int, ...],
                 locate: Callable[[], tuple[slice, ...] | torch.Tensor], generator: Any = None) -> None:
        self.shape = tuple(shape)
        self.local_shape = tuple(local_shape)
        self.locate = locate
        self.generator = generator
        self._where: tuple[slice, ...] | torch.Tensor | None = None

    def __enter__(self) -> "sharded_draw":
        self.saved = sharded_region()
        _tls.region = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _tls.region = self.saved

    def _located(self) -> tuple[slice, ...] | torch.Tensor:
        if self._where is None:
            self._where = self.locate()
        return self._where

    def _widen(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and tuple(x.shape) == self.local_shape:
            whole = x.new_zeros(self.shape)
            where = self._located()
            if isinstance(where, tuple):
                whole[where] = x
            else:
                whole.view(-1)[where.reshape(-1)] = x.reshape(-1)
            return whole
        if isinstance(x, (list, tuple)) and len(x) == len(self.local_shape) and \
                all(isinstance(v, int) for v in x) and tuple(x) == self.local_shape:
            return list(self.shape)
        return x

    def _narrow(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and tuple(x.shape) == self.shape:
            where = self._located()
            return x[where] if isinstance(where, tuple) else x.reshape(-1)[where]
        return x

    def run(self, run: Any, mutated: frozenset[int], args: list, kwargs: dict) -> Any:
        """``run(*args, **kwargs)`` over the whole tensor; arguments at ``mutated``
        positions get their shard of what the op wrote into the whole ones."""
        if self.local_shape == self.shape:
            return run(*args, **kwargs)   # nothing sharded: the rank holds the whole tensor
        w_args = [self._widen(a) for a in args]
        w_kwargs = {k: self._widen(v) for k, v in kwargs.items()}
        result = run(*w_args, **w_kwargs)
        for i in mutated:
            if w_args[i] is not args[i]:
                args[i].copy_(self._narrow(w_args[i]))
        if mutated and isinstance(result, torch.Tensor) and result is w_args[min(mutated)]:
            return args[min(mutated)]
        if isinstance(result, tuple):
            return tuple(self._narrow(r) for r in result)
        return self._narrow(result)


def sharded_region() -> sharded_draw | None:
    """The active :class:`sharded_draw` of this thread, or None."""
    return getattr(_tls, "region", None)


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
