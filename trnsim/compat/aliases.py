"""``import nki``, ``import neuronxcc.nki``, ``import torch_neuronx`` (and the other names of
:data:`TOP_LEVEL`) without AWS's packages.

A :data:`sys.meta_path` finder answers for these names only when nothing else on
the path does: asked for a top-level name (``nki``, ``neuronxcc``, ``torch_neuronx``)
it first asks every other finder, and if one finds a real package it steps aside,
so a real installation always wins and is never shadowed or written to. Asked for
a submodule (``nki.language``) it answers only when the parent is its own alias.
An aliased name's module object *is* trnsim's module (``nki.language is
trnsim.nki.language``), so isinstance checks and module state are shared.

A name of :data:`HIDDEN_FROM` is not answered to the libraries listed there, which
would take another device's code path on finding it.

The finder is installed by ``import trnsim`` (which PyTorch's backend autoload
does on ``import torch``); installing it imports nothing. ``TRNSIM_NO_ALIASES=1``
leaves it out.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Sequence

# each top-level name and the trnsim module it stands for
TOP_LEVEL = {
    "nki": "trnsim.nki",
    "neuronxcc": "trnsim.compat.neuronxcc",
    "torch_neuronx": "trnsim.compat.torch_neuronx",
    "torch_xla": "trnsim.compat.torch_xla",
    "neuron_dtypes": "trnsim.compat.neuron_dtypes",
    "nki_cpu_simulator": "trnsim.compat.nki_cpu_simulator",
}
# top-level names that libraries look for to pick a code path of their own (transformers
# and accelerate take their TPU paths on finding torch_xla), and the libraries that must
# not find trnsim's stand-in: for them the neuron device is the one to use
HIDDEN_FROM = {
    "torch_xla": frozenset({"accelerate", "diffusers", "lightning", "optimum", "peft", "pytorch_lightning",
                            "torch", "transformers", "trl"}),
}
# aliased names below a top-level alias whose target is not the alias's target plus the rest
SPECIAL = {
    "neuronxcc.nki": "trnsim.nki",
    "neuronxcc.nki_standalone": "trnsim.compat.nki_standalone",
    # AWS's simulator's own copies of these are trnsim's modules themselves
    "nki_cpu_simulator.nki.isa": "trnsim.nki.isa",
    "nki_cpu_simulator.nki.compiler": "trnsim.nki.compiler",
    "nki_cpu_simulator.nki.typing": "trnsim.nki.typing",
}
ENV_OFF = "TRNSIM_NO_ALIASES"


def target_of(fullname: str) -> str | None:
    """The trnsim module that ``fullname`` stands for (None if it is not an aliased name)."""
    if fullname in TOP_LEVEL:
        return TOP_LEVEL[fullname]
    for prefix in sorted(SPECIAL, key=len, reverse=True):
        if fullname == prefix or fullname.startswith(prefix + "."):
            return SPECIAL[prefix] + fullname[len(prefix):]
    top, _, rest = fullname.partition(".")
    if top in TOP_LEVEL and rest:
        return f"{TOP_LEVEL[top]}.{rest}"
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads an aliased name as the trnsim module it stands for, unchanged."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: Any = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set __spec__ to the alias's; the module stays trnsim's own
        module.__spec__ = self._spec


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the aliased names when no real package of that name is on the path."""

    trnsim_alias = True

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        dest = target_of(fullname)
        if dest is None:
            return None
        if fullname == DOCS or fullname.startswith(DOCS + "."):
            owner = sys.modules.get("neuronxcc.nki")
            return _docs_example_spec(fullname) if owner is not None and _stands_for(owner, "trnsim.nki") else None
        if "." in fullname:
            parent_name = fullname.rpartition(".")[0]
            parent = sys.modules.get(parent_name)
            if parent is None or not _stands_for(parent, target_of(parent_name) or ""):
                return None   # the parent is a real package: its own submodules only
        elif real_spec(fullname) is not None or _hidden_from_caller(fullname):
            return None
        dest_spec = importlib.util.find_spec(dest)
        if dest_spec is None:
            return None
        is_package = dest_spec.submodule_search_locations is not None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(dest), is_package=is_package)


# The Neuron compiler's package carries the NKI guide's example kernels as
# ``neuronxcc.nki.docs.examples.<tutorial>.<module>``; AWS's tutorials import them so
# (nki-samples' layernorm_torch.py imports its neighbour layernorm_nki_kernel.py that
# way). trnsim ships none of AWS's code: such a name loads the user's own copy, the
# module ``<module>`` as ``import <module>`` would find it (the script's folder first).
DOCS = "neuronxcc.nki.docs"


class _PackageLoader(importlib.abc.Loader):
    """An empty package (``neuronxcc.nki.docs``, ``...docs.examples.<tutorial>``)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []


def _docs_example_spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
    parts = fullname[len(DOCS):].strip(".").split(".")
    if len(parts) < 3 or parts[0] != "examples":
        return importlib.machinery.ModuleSpec(fullname, _PackageLoader(), is_package=True)
    found = importlib.machinery.PathFinder.find_spec(parts[-1], sys.path)
    if found is None or found.origin is None:
        return None
    return importlib.util.spec_from_file_location(fullname, found.origin,
                                                  submodule_search_locations=found.submodule_search_locations)


def _stands_for(module: ModuleType, target: str) -> bool:
    """Whether ``module`` is trnsim's module ``target``, or a module of trnsim's that stands
    for it under another name (``__trnsim_alias_of__``: the simulator's ``nki``, which the NKI
    library's tests put in ``sys.modules["nki"]``)."""
    return module is sys.modules.get(target) or getattr(module, "__trnsim_alias_of__", None) == target


def _hidden_from_caller(name: str) -> bool:
    """Whether the code asking for top-level ``name`` (by an import or by
    ``importlib.util.find_spec``) is a library of :data:`HIDDEN_FROM` ``[name]``."""
    hidden = HIDDEN_FROM.get(name)
    if not hidden:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != __name__ and module != "importlib" and not module.startswith("importlib."):
            return module.partition(".")[0] in hidden
        frame = frame.f_back   # type: ignore[assignment]
    return False


def real_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """The spec another finder gives top-level ``name`` (a real installation), or None."""
    for finder in sys.meta_path:
        if getattr(finder, "trnsim_alias", False) or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(name, None)
        if spec is not None:
            return spec
    return None


def enabled() -> bool:
    """Whether ``TRNSIM_NO_ALIASES`` leaves the aliases on: unset, empty, ``0``, ``false``,
    ``no`` or ``off``; any other value (``1``) turns them off."""
    return os.environ.get(ENV_OFF, "").strip().lower() in ("", "0", "false", "no", "off")


def install() -> bool:
    """Put the finder first on :data:`sys.meta_path` (once); returns whether it is there.
    Does nothing when ``TRNSIM_NO_ALIASES=1``."""
    if not enabled():
        return False
    if not installed():
        sys.meta_path.insert(0, AliasFinder())
    return True


def installed() -> bool:
    """Whether the finder is on :data:`sys.meta_path`."""
    return any(getattr(f, "trnsim_alias", False) for f in sys.meta_path)


@dataclass(frozen=True)
class AliasStatus:
    """What a top-level name resolves to: ``"trnsim"`` (aliased), ``"real"`` (an
    installed package wins; ``origin`` is where it is) or ``"off"`` (aliases disabled,
    no real package)."""

    name: str
    target: str
    resolves_to: str
    origin: str | None


def status() -> list[AliasStatus]:
    """Each top-level name, and whether trnsim or a real package answers it (imports nothing)."""
    rows = []
    for name, dest in TOP_LEVEL.items():
        loaded = sys.modules.get(name)
        if loaded is not None and loaded is not sys.modules.get(dest):
            rows.append(AliasStatus(name, dest, "real", getattr(loaded, "__file__", None)))
            continue
        spec = real_spec(name) if loaded is None else None
        if spec is not None:
            rows.append(AliasStatus(name, dest, "real", spec.origin))
        elif loaded is not None or installed():
            rows.append(AliasStatus(name, dest, "trnsim", None))
        else:
            rows.append(AliasStatus(name, dest, "off", None))
    return rows
