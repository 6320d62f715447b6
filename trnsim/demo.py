"""The demos of ``trnsim demo``.

``matmul`` (the default): the optimised bf16 matmul kernel, simulated at instruction
fidelity. ``out[M, N] = lhsT.T @ rhs`` with ``lhsT`` [K, M] and ``rhs`` [K, N] in bf16 in
HBM (the layout of the NKI matmul tutorial), traced from
:func:`trnsim.kernels.matmul.matmul_optimized`, simulated instruction by instruction on
the chosen chip and checked against numpy.

``llama``: a few AdamW training steps of a small Llama-style model
(:mod:`trnsim.models.tinyllama`) on the ``neuron`` device, with the same steps on the CPU for
comparison; the last step is profiled.

``compile``: the same model's forward pass, eager and through
``torch.compile(backend="neuron")``: the logits are compared, both are profiled, and the
compiled one's trace is written (fused kernels above their engines).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from trnsim import dtypes
from trnsim.atomic import check_writable
from trnsim.errors import ProgramError, TrnSimError


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
    from trnsim.simulator import simulate
    from trnsim.kernels.matmul import matmul_optimized
    from trnsim.nki import trace_program, typed

    check_matmul_sizes(m, k, n, chip)
    check_writable(trace)
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


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def check_matmul_sizes(m: int, k: int, n: int, chip: object = None) -> None:
    """Refuse matmul demo sizes the kernel cannot tile, the chip's HBM cannot hold
    (bf16 inputs and the fp32 result) or this host cannot hold (the float32 inputs,
    their float64 reference and the results)."""
    from trnsim.hw.spec import load_chip
    from trnsim.kernels.matmul import TILE_K, TILE_M, TILE_N

    for name, size, tile in (("M", m, TILE_M), ("K", k, TILE_K), ("N", n, TILE_N)):
        if size <= 0 or size % tile:
            raise ProgramError(f"demo size {name}={size} must be a positive multiple of {tile}")
    spec = load_chip(chip)
    hbm = 2 * (k * m + k * n) + 4 * m * n
    if hbm > spec.hbm.capacity_bytes:
        raise ProgramError(f"demo sizes M={m} K={k} N={n} need {hbm / 2**30:,.1f} GiB of HBM for the bf16 inputs and "
                           f"the fp32 result; {spec.name} has {spec.hbm.capacity_gib:g} GiB: choose smaller sizes")
    host, have = 24 * (k * m + k * n) + 16 * m * n, _host_memory_bytes()
    if have is not None and host > have:
        raise ProgramError(f"demo sizes M={m} K={k} N={n} need about {host / 2**30:,.1f} GiB of host memory; "
                           f"this machine has {have / 2**30:,.1f} GiB: choose smaller sizes")


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
    """Train :class:`trnsim.models.tinyllama.TinyLlama` for ``steps`` AdamW steps on ``neuron``
    and on the CPU from the same weights and tokens; profile the last neuron step."""
    import contextlib
    import copy

    import torch

    import trnsim
    from trnsim.backend import state
    from trnsim.models.tinyllama import TinyLlama, causal_lm_loss

    if steps < 1:
        raise TrnSimError(f"llama demo steps={steps} must be at least 1; pass --steps 1 or more")
    check_writable(trace)
    state.env_fidelity()
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


@dataclass
class CompileDemoResult:
    """Eager and compiled profiles of one forward pass, and how far their logits differ."""

    eager: Any
    compiled: Any
    max_abs_diff: float
    compile_s: float
    graphs: list
    tokens: int
    trace_path: str


def run_compile_demo(chip: object = None, trace: str = "traces/compile.json", seed: int = 0, batch: int = 1,
                     seq: int = 128) -> CompileDemoResult:
    """Run :class:`trnsim.models.tinyllama.TinyLlama`'s forward pass on ``neuron`` eagerly and
    compiled with ``backend="neuron"``; profile both from an idle device and write the
    compiled one's trace."""
    import time

    import torch

    import trnsim
    from trnsim.backend import state
    from trnsim.models.tinyllama import TinyLlama

    check_writable(trace)
    state.env_fidelity()
    if chip is not None:
        torch.neuron.set_chip(chip)
    torch.manual_seed(seed)
    model = TinyLlama(seq=seq).to("neuron").eval()
    ids = torch.randint(0, 1000, (batch, seq), generator=torch.Generator().manual_seed(seed)).to("neuron")
    torch.neuron.reset_dynamo_metrics()
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(ids)
        compile_s = time.perf_counter() - t0
        profiles = []
        for fn, path in ((model, None), (compiled, trace)):
            torch.neuron.synchronize()
            with trnsim.profile(path) as prof:
                logits = fn(ids).cpu()
            profiles.append((prof, logits))
    (eager, eager_logits), (comp, comp_logits) = profiles
    diff = (eager_logits - comp_logits).abs().max().item()
    return CompileDemoResult(eager, comp, diff, compile_s, torch.neuron.get_dynamo_metrics(), batch * seq, trace)
