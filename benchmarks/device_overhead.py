"""Host cost of running PyTorch on the simulated ``neuron`` device, against the CPU.

Three measurements, each the best of several repeats, measured in one run:

1. small ops: ``x = x + 1`` on a 16-element tensor, N times; the extra host time per op
   on ``neuron`` over the CPU (target: at most 25 microseconds);
2. a large matmul (2048 x 2048 fp32): host time on ``neuron`` over the CPU's (target:
   ratio at most 1.3); its simulated time is memoized after the first call, which is
   reported separately;
3. a tiny Llama forward pass (RMSNorm, rotary embeddings, grouped-query attention
   through scaled_dot_product_attention, SwiGLU MLP; 4 layers, width 256, 64 tokens):
   host time on ``neuron`` over the CPU's, after a first call that pays the simulations.

Run: ``python benchmarks/device_overhead.py``
"""

from __future__ import annotations

import time

import torch

import trnsim  # registers neuron even with autoload off
from trnsim.models.tinyllama import TinyLlama


def best(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def small_ops(n: int = 2000, rounds: int = 9) -> tuple[float, float]:
    """Seconds per ``y = y + 1`` on the CPU and on neuron: the best of ``rounds`` rounds,
    the two devices alternating so both see the same machine load."""
    xs = {dev: torch.ones(16, device=dev) for dev in ("cpu", "neuron")}

    def run(dev):
        y = xs[dev]
        for _ in range(n):
            y = y + 1

    best_of = {"cpu": float("inf"), "neuron": float("inf")}
    for dev in best_of:
        run(dev)
    for _ in range(rounds):
        for dev in best_of:
            t0 = time.perf_counter()
            run(dev)
            best_of[dev] = min(best_of[dev], time.perf_counter() - t0)
    return best_of["cpu"] / n, best_of["neuron"] / n


def large_matmul(dev: str) -> float:
    a = torch.randn(2048, 2048).to(dev)

    def run():
        (a @ a).sum().item()
    run()
    return best(run)


def llama_forward(dev: str) -> float:
    torch.manual_seed(0)
    model = TinyLlama().to(dev).eval()
    ids = torch.randint(0, 1000, (1, 64)).to(dev)

    def run():
        with torch.no_grad():
            model(ids).sum().item()
    run()
    return best(run, 3)


def main() -> None:
    print(f"chip {torch.neuron.chip().name}, torch {torch.__version__}")
    cpu, dev = small_ops()
    print(f"small op (x + 1, 16 elements): cpu {cpu * 1e6:.1f} us, neuron {dev * 1e6:.1f} us; "
          f"overhead {(dev - cpu) * 1e6:.1f} us per op (target <= 25), ratio {dev / cpu:.1f}")
    t0 = time.perf_counter()
    a = torch.randn(2048, 2048, device="neuron")
    torch.neuron.synchronize()
    before = torch.neuron.clock().device
    (a @ a).sum().item()
    first = time.perf_counter() - t0
    sim_ms = (torch.neuron.clock().device - before) / 1e9
    cpu, dev = large_matmul("cpu"), large_matmul("neuron")
    print(f"matmul 2048^3 fp32: cpu {cpu * 1e3:.2f} ms, neuron {dev * 1e3:.2f} ms; ratio {dev / cpu:.2f} "
          f"(target <= 1.3); first call with simulation {first:.2f} s; simulated {sim_ms:.3f} ms")
    cpu, dev = llama_forward("cpu"), llama_forward("neuron")
    model = TinyLlama().to("neuron").eval()
    ids = torch.zeros(1, 64, dtype=torch.long, device="neuron")
    with trnsim.profile() as prof, torch.no_grad():
        model(ids)
    print(f"tiny Llama forward (4 layers, d=256, 64 tokens): cpu {cpu * 1e3:.2f} ms, neuron {dev * 1e3:.2f} ms; "
          f"ratio {dev / cpu:.2f}; {len(prof.records)} device ops, simulated {prof.device_ps / 1e9:.3f} ms")


if __name__ == "__main__":
    main()
