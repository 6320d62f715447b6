"""DMA transfer times AWS published, against trnsim's DMA model.

The NKI DMA overview (aws-neuron-sdk ``nki/get-started/about/nki-dma-overview.rst``,
"Example 1") loads a bf16 [4, 4096] tensor from HBM into 4 SBUF partitions on one
NeuronCore-v3 and reads the profile: the one DMA engine that serves those partitions
"takes 1416 ns to load 32 KiB". trnsim runs the same load and reports the transfer's
time on its engines (the instruction's time less its fixed issue latency, which the
profile's transfer bar does not show).
"""

from __future__ import annotations

from trnsim.validate.figures import Figure, Sources


def _load_ns(chip: str, shape: tuple[int, int]):
    def simulate(_: Sources) -> float:
        import numpy as np

        from trnsim import dtypes
        from trnsim.nki import jit, language as nl, trace_program, typed
        from trnsim.simulator import run_timing

        @jit
        def load(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, value=nl.load(a))
            return out

        program = trace_program(load, typed(np.zeros(shape, np.float32), dtypes.bfloat16), chip=chip)
        run = run_timing(program)
        first = min(run.dma_plans)
        return (run.ends[first] - run.starts[first] - run.dma_plans[first].fixed_ps) / 1000
    return simulate


def figures() -> list[Figure]:
    return [Figure(key="dma-overview.example1", kind="dma", what="HBM to SBUF load, bf16 [4, 4096] (32 KiB, one engine)",
                   chip="trn2", source="nki-dma-overview.rst, Example 1", published=1416.0, unit="ns", group="check",
                   runs="nl.load of a [4, 4096] bf16 tensor", simulate=_load_ns("trn2", (4, 4096)))]
