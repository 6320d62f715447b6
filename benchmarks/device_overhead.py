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
import torch.nn.functional as F

import trnsim  # noqa: F401  (registers neuron even with autoload off)


def best(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def small_ops(dev: str, n: int = 2000) -> float:
    x = torch.ones(16, device=dev)

    def run():
        y = x
        for _ in range(n):
            y = y + 1
    run()
    return best(run) / n


def large_matmul(dev: str) -> float:
    a = torch.randn(2048, 2048).to(dev)

    def run():
        (a @ a).sum().item()
    run()
    return best(run)


class RMSNorm(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotary(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, ff: int) -> None:
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = torch.nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.gate = torch.nn.Linear(d, ff, bias=False)
        self.up = torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        rep = self.h // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(torch.nn.Module):
    def __init__(self, vocab=1000, d=256, layers=4, heads=8, kv_heads=2, ff=688, seq=64) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads, kv_heads, ff) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos())
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin())

    def forward(self, ids):
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        return self.head(self.norm(x))


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
    cpu, dev = small_ops("cpu"), small_ops("neuron")
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
