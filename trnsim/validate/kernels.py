"""Kernel latencies AWS published, against trnsim's NKI tracing and timing.

Two tutorials publish their kernels' latencies, and trnsim runs the tutorials' own code
(``--aws-neuron-sdk PATH``) unedited; nki-samples' perf tests state what their reference
kernels measured, and trnsim runs those kernels (``--nki-samples PATH``) unedited too.

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

The fused Mamba tutorial (``nki/guides/tutorials/fused_mamba.rst`` at ``1db4d74``; code
``nki/examples/fused_mamba/mamba_nki_kernels.py``) times three versions of the selective
scan in fp32, batch 1, 16 states: ``mamba_v1`` at 256 channels and sequence 512 (172.93
us) and at 4096 channels (2.34 ms), ``mamba_v2`` (delta and u loaded once per channel
tile) at 4096 channels (1.61 ms), and a table of ``mamba_v2`` and ``mamba_v3`` (the
sequence tiled by 512) at 4096 channels from sequence 512 to 8192. The page names no
instance; trnsim takes trn1, where its sibling matmul tutorial was measured (assumption).
None of these figures was used to fit anything: all are ``check``. ``mamba_v2`` beyond
sequence 512 spills SBUF to HBM on the real compiler (the page shows the spill queues);
trnsim models no spilling, so it times those rows without the spill traffic, and refuses
the kernel where its tiles do not fit SBUF at all.

nki-samples (``test/unit/test_adaptive_avg_pool2d.py`` at ``0898a77``, the parent of
``fc5c69f`` that removed the reference kernels) tests its adaptive average pool on trn2
against a threshold written as the p99 latency the case measured times 1.05 (``65 * 1.05``
us and so on): the nine measured figures are the published values here. Its other perf
tests give round thresholds with no measurement behind them (upper bounds), which are not
figures.
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
_modules: dict[tuple[str, str, str, str], ModuleType] = {}


def public_module(sources: Sources, repo: str, commit: str, path: str) -> ModuleType:
    """Import ``path`` of ``repo`` at ``commit``, unedited, from a temporary directory."""
    key = (repo, str(sources.repos.get(repo)), commit, path)
    if key not in _modules:
        import trnsim  # noqa: F401  (the nki / neuronxcc names the public code imports)

        text = sources.read(repo, commit, path)
        name = f"_trnsim_validate_{Path(path).stem}_{commit}"
        with tempfile.TemporaryDirectory(prefix="trnsim-validate-") as folder:
            file = Path(folder) / Path(path).name
            file.write_text(text)
            spec = importlib.util.spec_from_file_location(name, file)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)   # the code objects keep no hold on the file
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


_MAMBA_CODE = "nki/examples/fused_mamba/mamba_nki_kernels.py"
_MAMBA_PAGE = f"nki/guides/tutorials/fused_mamba.rst at {_COMMIT}"
#: the scaling table of the Mamba tutorial: sequence length -> (mamba_v2 ms, mamba_v3 ms), 4096 channels
_MAMBA_TABLE = {512: (1.6, 1.6), 1024: (4.4, 3.3), 2048: (8.9, 6.6), 3072: (13.1, 10.1), 4096: (17.6, 13.3),
                5120: (23.7, 17.3), 6144: (27.5, 19.6), 7168: (41.3, 24.2), 8192: (52.2, 27.8)}


def _mamba(name: str, channels: int, seq_len: int, unit: str) -> Callable[[Sources], float]:
    def simulate(sources: Sources) -> float:
        import numpy as np

        from trnsim.nki import trace_program
        from trnsim.simulator import run_timing

        kernel = getattr(public_module(sources, _SDK, _COMMIT, _MAMBA_CODE), name)
        states = 16
        delta = np.zeros((1, channels, seq_len), np.float32)
        a = np.zeros((channels, states), np.float32)
        bc = np.zeros((1, states, seq_len), np.float32)
        ns = run_timing(trace_program(kernel, delta, delta, a, bc, bc, chip="trn1")).time_ns
        return ns / (1e3 if unit == "us" else 1e6)
    return simulate


def _mamba_figures() -> list[Figure]:
    def figure(key: str, name: str, channels: int, seq_len: int, published: float, section: str, unit: str = "ms",
               series: str | None = None, order: int = 0) -> Figure:
        return Figure(key=f"mamba-tutorial.{key}", kind="kernel",
                      what=f"fused Mamba tutorial, fp32, {channels} channels, sequence {seq_len}: {name}",
                      chip="trn1", source=f"{_MAMBA_PAGE}, {section}", published=published, unit=unit, group="check",
                      runs=f"{name} ({_SDK} {_COMMIT})", simulate=_mamba(name, channels, seq_len, unit), quick=False,
                      repo=_SDK, series=series, order=order)

    out = [figure("v1.256", "mamba_v1", 256, 512, 172.93, "Performance Check", unit="us"),
           figure("v1.4096", "mamba_v1", 4096, 512, 2.34, "Increasing input channels size",
                  series="Mamba tutorial, 4096 channels", order=0),
           figure("v2.4096", "mamba_v2", 4096, 512, 1.61, "Increasing input channels size",
                  series="Mamba tutorial, 4096 channels", order=1)]
    for seq_len, (v2, v3) in _MAMBA_TABLE.items():
        series = "Mamba tutorial, sequence 8192" if seq_len == 8192 else None
        if seq_len != 512:   # at 512 the table repeats the section's 1.61 ms
            out.append(figure(f"v2.seq{seq_len}", "mamba_v2", 4096, seq_len, v2, "Increasing input seq_len size, table",
                              series=series, order=0))
        out.append(figure(f"v3.seq{seq_len}", "mamba_v3", 4096, seq_len, v3, "Increasing input seq_len size, table",
                          series=series, order=1))
    return out


_SAMPLES = "nki-samples"
_SAMPLES_COMMIT = "0898a77"   # fc5c69f~1, the last commit with the reference kernels' perf tests
_POOL_CODE = "src/nki_samples/reference/vision.py"
_POOL_TEST = f"test/unit/test_adaptive_avg_pool2d.py at {_SAMPLES_COMMIT}, test_adaptive_avg_pool2d_perf"
#: the perf cases of nki-samples' adaptive average pool: (N, C, H, W, output size, dtype, measured p99 us)
_POOL_CASES = ((1, 64, 56, 56, 7, "float32", 65), (2, 128, 28, 28, 7, "float32", 109),
               (1, 256, 14, 14, 7, "float16", 88), (4, 64, 56, 56, (7, 7), "float32", 152),
               (2, 128, 28, 28, (14, 14), "float32", 327), (1, 512, 7, 7, 1, "float32", 14),
               (8, 64, 32, 32, (4, 4), "float16", 103), (2, 2048, 32, 32, (3, 3), "float32", 564),
               (2, 64, 256, 256, 1, "float32", 255))


def _pool(shape: tuple[int, int, int, int], output_size: int | tuple[int, int], dtype: str) -> Callable[[Sources], float]:
    def simulate(sources: Sources) -> float:
        import numpy as np

        from trnsim.nki import trace_program
        from trnsim.simulator import run_timing

        kernel = public_module(sources, _SAMPLES, _SAMPLES_COMMIT, _POOL_CODE).adaptive_avg_pool2d_kernel
        x = np.zeros(shape, np.dtype(dtype))
        return run_timing(trace_program(kernel, x, output_size, chip="trn2")).time_ns / 1e3
    return simulate


def _pool_figures() -> list[Figure]:
    """nki-samples' adaptive average pool, whose perf test states the p99 latency each case
    measured on the chip (its threshold is that figure times 1.05). NC-v3's per-descriptor
    DMA cost was fitted to these cases (docs/hardware.md), so all nine are ``fit``."""
    out = []
    for n, c, h, w, size, dtype, us in _POOL_CASES:
        out_h, out_w = (size, size) if isinstance(size, int) else size
        out.append(Figure(key=f"pool.{n}x{c}x{h}x{w}.{out_h}x{out_w}.{dtype}", kind="kernel",
                          what=f"adaptive average pool, {dtype} [{n}, {c}, {h}, {w}] to {out_h}x{out_w} (p99)",
                          chip="trn2", source=f"nki-samples {_POOL_TEST}", published=us, unit="us", group="fit",
                          runs=f"adaptive_avg_pool2d_kernel ({_SAMPLES} {_SAMPLES_COMMIT})",
                          simulate=_pool((n, c, h, w), size, dtype), quick=False, repo=_SAMPLES))
    return out


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
    return out + _mamba_figures() + _pool_figures()
