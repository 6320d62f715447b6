"""The main job: the optimised bf16 matmul kernel, simulated at instruction fidelity.

``out[M, N] = lhsT.T @ rhs`` with ``lhsT`` [K, M] and ``rhs`` [K, N] in bf16 in HBM
(the layout of the NKI matmul tutorial), traced from
:func:`trnsim.kernels.matmul.matmul_optimized`, simulated instruction by
instruction on the chosen chip and checked against numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trnsim import dtypes
from trnsim.errors import ProgramError


@dataclass
class DemoResult:
    """The run, its check against numpy, and where its trace went."""

    run: Any
    max_abs_error: float
    reference_scale: float
    trace_path: str


def run_demo(m: int = 1024, k: int = 1024, n: int = 1024, chip: object = None, trace: str = "traces/demo.json",
             seed: int = 0) -> DemoResult:
    """Trace, simulate (instruction fidelity) and check the bf16 matmul; write its trace."""
    from trnsim.compute import decode, encode
    from trnsim.hw.core import simulate
    from trnsim.kernels.matmul import TILE_K, TILE_M, TILE_N, matmul_optimized
    from trnsim.nki import trace_program, typed

    for name, size, tile in (("M", m, TILE_M), ("K", k, TILE_K), ("N", n, TILE_N)):
        if size <= 0 or size % tile:
            raise ProgramError(f"demo size {name}={size} must be a positive multiple of {tile}")
    rng = np.random.default_rng(seed)
    lhs_t = rng.standard_normal((k, m), dtype=np.float32)
    rhs = rng.standard_normal((k, n), dtype=np.float32)
    prog = trace_program(matmul_optimized, typed(lhs_t, dtypes.bfloat16), typed(rhs, dtypes.bfloat16), chip=chip)
    run = simulate(prog, {"lhsT": lhs_t, "rhs": rhs}, fidelity="instruction", trace=trace)
    # The reference multiplies the same bf16-rounded inputs in float64.
    a = decode(encode(lhs_t.astype(np.float64), dtypes.bfloat16), dtypes.bfloat16)
    b = decode(encode(rhs.astype(np.float64), dtypes.bfloat16), dtypes.bfloat16)
    expected = a.T @ b
    err = float(np.max(np.abs(run.outputs[prog.outputs[0].name] - expected)))
    return DemoResult(run, err, float(np.max(np.abs(expected))), trace)
