"""The demos of ``trnsim demo``.

``matmul`` (the default): the optimised bf16 matmul kernel, simulated at instruction
fidelity. ``out[M, N] = lhsT.T @ rhs`` with ``lhsT`` [K, M] and ``rhs`` [K, N] in bf16 in
HBM (the layout of the NKI matmul tutorial), traced from
:func:`trnsim.kernels.matmul.matmul_optimized`, simulated instruction by instruction on
the chosen chip and checked against numpy.

``llama``: a few AdamW training steps of a small Llama-style model
(:mod:`trnsim.tinyllama`) on the ``neuron`` device, with the same steps on the CPU for
comparison; the last step is profiled.
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


@dataclass
class LlamaDemoResult:
    """Losses on both devices, the profile of the last neuron step, and the model's size."""

    neuron_losses: list[float]
    cpu_losses: list[float]
    profile: Any
    params: int
    tokens: int
    trace_path: str

    @property
    def max_rel_diff(self) -> float:
        return max(abs(a - b) / abs(b) for a, b in zip(self.neuron_losses, self.cpu_losses))

    @property
    def step_us(self) -> float:
        return self.profile.device_ps / 1e6


def run_llama_demo(steps: int = 3, chip: object = None, trace: str = "traces/llama.json", seed: int = 0,
                   batch: int = 4, seq: int = 64) -> LlamaDemoResult:
    """Train :class:`trnsim.tinyllama.TinyLlama` for ``steps`` AdamW steps on ``neuron``
    and on the CPU from the same weights and tokens; profile the last neuron step."""
    import contextlib
    import copy

    import torch

    import trnsim
    from trnsim.tinyllama import TinyLlama, causal_lm_loss

    if steps < 1:
        raise ValueError(f"llama demo steps={steps} must be at least 1")
    if chip is not None:
        torch.neuron.set_chip(chip)
    torch.manual_seed(seed)
    cpu_model = TinyLlama(seq=seq)
    dev_model = copy.deepcopy(cpu_model).to("neuron")
    ids = torch.randint(0, 1000, (batch, seq), generator=torch.Generator().manual_seed(seed))

    def train(model: torch.nn.Module, tokens: torch.Tensor, record: bool):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses, prof = [], None
        for step in range(steps):
            last = record and step == steps - 1
            with (trnsim.profile(trace) if last else contextlib.nullcontext()) as p:
                loss = causal_lm_loss(model(tokens), tokens)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            prof = p if last else prof
        return losses, prof

    cpu_losses, _ = train(cpu_model, ids, False)
    dev_losses, prof = train(dev_model, ids.to("neuron"), True)
    params = sum(p.numel() for p in cpu_model.parameters())
    return LlamaDemoResult(dev_losses, cpu_losses, prof, params, batch * seq, trace)
