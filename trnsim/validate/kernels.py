"""Kernel latencies AWS published, against trnsim's NKI tracing and timing.

The NKI matrix multiplication tutorial (aws-neuron-sdk ``nki/tutorials/
matrix_multiplication.rst`` at ``1db4d74``, its last version with the table; since then
the page has no figures) times four kernels on one NeuronCore-v2 of a trn1.32xlarge,
[4096, 8192] @ [8192, 8192] in bf16: 51.80, 42.96, 22.07 and 6.97 ms, each an
optimisation of the one before. trnsim runs the tutorial's own kernels
(``nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py`` at the same
commit: pass ``--aws-neuron-sdk PATH``) and, without the repository, its own two
equivalents (:mod:`trnsim.kernels.matmul`).

``[dma] descriptor_overhead_ns`` of trn1 was chosen with the basic kernel's figure and the
tensor engine's start-up with the optimised one's, so those two figures are ``fit``; the
two middle steps were never used.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from trnsim.validate.figures import Figure, Sources

_SDK = "aws-neuron-sdk"
_COMMIT = "1db4d74"
_CODE = "nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py"
_PAGE = f"nki/tutorials/matrix_multiplication.rst at {_COMMIT}, Performance table"
_M, _K, _N = 4096, 8192, 8192
_modules: dict[tuple[str, str, str], ModuleType] = {}


def public_module(sources: Sources, repo: str, commit: str, path: str) -> ModuleType:
    """Import ``path`` of ``repo`` at ``commit``, unedited, from a temporary directory."""
    key = (repo, commit, path)
    if key not in _modules:
        import trnsim  # noqa: F401  (the nki / neuronxcc names the public code imports)

        text = sources.read(repo, commit, path)
        folder = Path(tempfile.mkdtemp(prefix="trnsim-validate-"))
        file = folder / Path(path).name
        file.write_text(text)
        name = f"_trnsim_validate_{Path(path).stem}_{commit}"
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _modules[key] = module
    return _modules[key]


def _matmul_latency_ms(kernel: Any) -> float:
    import numpy as np

    from trnsim import dtypes
    from trnsim.nki import trace_program, typed
    from trnsim.simulator import run_timing

    lhs_t = typed(np.zeros((_K, _M), np.float32), dtypes.bfloat16)
    rhs = typed(np.zeros((_K, _N), np.float32), dtypes.bfloat16)
    return run_timing(trace_program(kernel, lhs_t, rhs, chip="trn1")).time_ns / 1e6


def _public(name: str) -> Callable[[Sources], float]:
    return lambda sources: _matmul_latency_ms(getattr(public_module(sources, _SDK, _COMMIT, _CODE), name))


def _own(name: str) -> Callable[[Sources], float]:
    def simulate(_: Sources) -> float:
        from trnsim.kernels import matmul

        return _matmul_latency_ms(getattr(matmul, name))
    return simulate


def figures() -> list[Figure]:
    what = "matmul tutorial, [4096, 8192] @ [8192, 8192] bf16"
    steps = [("nki_matmul_tiled_", "original tiled", 51.80, "fit"),
             ("nki_matmul_hoist_load_", "optimization 1", 42.96, "check"),
             ("nki_matmul_block_free_dimension_", "optimization 2", 22.07, "check"),
             ("nki_matmul_fully_optimized_", "optimization 3", 6.97, "fit")]
    out = [Figure(key=f"matmul-tutorial.{name}", kind="kernel", what=f"{what}: {label}", chip="trn1",
                  source=_PAGE, published=ms, unit="ms", group=group, runs=f"{name} ({_SDK} {_COMMIT})",
                  simulate=_public(name), quick=False, repo=_SDK, series="NKI matmul tutorial", order=i)
           for i, (name, label, ms, group) in enumerate(steps)]
    out += [Figure(key=f"matmul-tutorial.own.{name}", kind="kernel", what=f"{what}: {label}", chip="trn1",
                   source=_PAGE, published=ms, unit="ms", group="fit", runs=f"trnsim.kernels.matmul.{name}",
                   simulate=_own(name))
            for name, label, ms in (("matmul_basic", "original tiled", 51.80),
                                    ("matmul_optimized", "optimization 3", 6.97))]
    return out
