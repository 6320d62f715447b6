"""torch.compile(backend="neuron") against eager: simulated time, where it goes, compile cost.

Models (random weights, fp32, on trn2):

- ``trnsim.models.tinyllama.TinyLlama``, 4 layers, width 256, 8 heads (2 key/value heads);
- a transformers ``LlamaForCausalLM`` of the same shape, with a static KV cache.

For each, in one run: the simulated time of a forward pass from an idle device, eager
and compiled, at two sizes (prefill of 1 x 128 and 4 x 512 tokens) and, for the
transformers model, one decode step (one token against a static cache holding the
prefill). The saving is split into its two sources:

- launches: eager launches each op (``runtime.op_launch_us`` of host time each; the
  device waits for the host when ops are short), a compiled graph launches once;
- kernels: the device time of eager's ops against the compiled graph's kernels, where
  fusion keeps intermediates in SBUF (the HBM bytes both move are reported).

Training, one step (forward, backward, optimizer) after a first one, eager against
the model compiled: a small CNN with batch norm (two Conv2d + BatchNorm2d + ReLU, max
and average pooling, a linear head; 32 images of 3 x 32 x 32, SGD with momentum) and a
pre-norm transformer block (LayerNorm, attention, GELU MLP; 4 x 128 tokens of width
128, AdamW).

Also: the fused kernels per graph and the host seconds to compile (Dynamo, AOT
Autograd, partitioning and the kernel simulations; target under 10 s for the 4-layer
decoder at 1 x 128), also as a multiple of one warm eager call's host time.

Run: ``python benchmarks/compile.py`` (about a minute)
"""

from __future__ import annotations

import time

import torch

import trnsim
from trnsim.backend import state
from trnsim.models.prenorm import PreNormBlock
from trnsim.models.tinyllama import TinyLlama

LAYERS, WIDTH, HEADS, KV_HEADS, FF, VOCAB = 4, 256, 8, 2, 688, 1000


def _profile(fn) -> trnsim.profile:
    torch.neuron.synchronize()
    with trnsim.profile() as prof:
        fn()
        torch.neuron.synchronize()
    return prof


def _kernel_ps(prof) -> int:
    """Device time in kernels, each as long as it takes alone."""
    return sum(r.cost.ps for r in prof.records)


def _overlap_ps(prof) -> int:
    """Kernel time hidden under other kernels (a compiled graph's kernels overlap): each
    kernel's time alone less what it adds to its graph."""
    return sum(r.info["overlap_ps"] for r in prof.records if r.info is not None and "overlap_ps" in r.info)


def _graph_bytes(prof) -> tuple[int, int, int]:
    """(fused kernels, HBM bytes the compiled kernels move, bytes their ops would move eagerly)."""
    fused = hbm = eager = 0
    for r in prof.records:
        if r.info is not None:
            fused += r.name.startswith("fused[")
            hbm += r.info["hbm_bytes"]
            eager += r.info["eager_bytes"]
    return fused, hbm, eager


def compare(label: str, eager_fn, compiled_fn) -> dict:
    """One row: eager and compiled simulated time of the same call, and where the
    difference comes from. ``compiled_fn`` is called once first (it compiles)."""
    t0 = time.perf_counter()
    compiled_fn()
    torch.neuron.synchronize()
    compile_s = time.perf_counter() - t0
    eager_fn()
    torch.neuron.synchronize()
    t0 = time.perf_counter()
    eager_fn()
    torch.neuron.synchronize()
    eager_host_s = time.perf_counter() - t0
    pe, pc = _profile(eager_fn), _profile(compiled_fn)
    fused, hbm, eager_bytes = _graph_bytes(pc)
    row = {"label": label, "eager_us": pe.device_ps / 1e6, "compiled_us": pc.device_ps / 1e6,
           "ratio": pc.device_ps / pe.device_ps, "eager_ops": len(pe.records),
           "launch_wait_us": (pe.device_ps - _kernel_ps(pe)) / 1e6,
           "eager_kernels_us": _kernel_ps(pe) / 1e6, "compiled_kernels_us": _kernel_ps(pc) / 1e6,
           "overlap_us": _overlap_ps(pc) / 1e6,
           "kernels": len(pc.records), "fused": fused, "hbm_mib": hbm / 2**20,
           "hbm_saved_mib": (eager_bytes - hbm) / 2**20, "compile_s": compile_s,
           "compile_x": compile_s / eager_host_s}
    return row


def tinyllama_rows() -> list[dict]:
    rows = []
    for batch, seq in ((1, 128), (4, 512)):
        torch.manual_seed(0)
        m = TinyLlama(vocab=VOCAB, d=WIDTH, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS, ff=FF, seq=seq)
        m = m.to("neuron").eval()
        x = torch.randint(0, VOCAB, (batch, seq), device="neuron")
        torch._dynamo.reset()
        c = torch.compile(m, backend="neuron")
        with torch.no_grad():
            rows.append(compare(f"TinyLlama prefill {batch}x{seq}", lambda m=m, x=x: m(x), lambda c=c, x=x: c(x)))
    return rows


def hf_rows() -> list[dict]:
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    rows = []
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FF, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=1024)
    for batch, seq in ((1, 128), (4, 512)):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).to("neuron").eval()
        ids = torch.randint(0, VOCAB, (batch, seq), device="neuron")
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="neuron")
        with torch.no_grad():
            rows.append(compare(f"HF Llama prefill {batch}x{seq}", lambda model=model, ids=ids: model(ids),
                                lambda compiled=compiled, ids=ids: compiled(ids)))
            caches = {k: StaticCache(config=cfg, max_cache_len=seq + 8) for k in ("eager", "compiled")}
            position = torch.tensor([seq], device="neuron")
            token = ids[:, -1:]
            for k in caches:   # the prefill fills each cache
                model(ids, past_key_values=caches[k], cache_position=torch.arange(seq, device="neuron"))

            def step(fn, cache, token=token, position=position):
                return lambda: fn(token, past_key_values=cache, cache_position=position)

            rows.append(compare(f"HF Llama decode {batch}x1 (cache {seq})", step(model, caches["eager"]),
                                step(compiled, caches["compiled"])))
    return rows


def training_rows() -> list[dict]:
    import torch.nn as nn
    import torch.nn.functional as F

    def cnn():
        return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    g = torch.Generator().manual_seed(1)
    images, labels = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
    tokens = torch.randn(4, 128, 128, generator=g)
    cases = [("CNN + BatchNorm train step", cnn, lambda: torch.optim.SGD, {"lr": 0.1, "momentum": 0.9},
              images, lambda out: F.cross_entropy(out, labels.to("neuron"))),
             ("LayerNorm block train step", PreNormBlock, lambda: torch.optim.AdamW, {"lr": 1e-3},
              tokens, lambda out: out.pow(2).mean())]
    rows = []
    for label, make, opt_class, opt_args, x, loss_of in cases:
        torch._dynamo.reset()
        steps = []
        for compiled in (False, True):
            torch.manual_seed(0)
            model = make().to("neuron")
            opt = opt_class()(model.parameters(), **opt_args)
            fn = torch.compile(model, backend="neuron") if compiled else model
            xd = x.to("neuron")

            def step(fn=fn, opt=opt, xd=xd, loss_of=loss_of):
                opt.zero_grad()
                loss_of(fn(xd)).backward()
                opt.step()
            steps.append(step)
        rows.append(compare(label, *steps))
    return rows


def main() -> None:
    print(f"chip {state.chip().name}; one launch costs {state.chip().runtime.op_launch_us:g} us of host time")
    rows = tinyllama_rows() + hf_rows() + training_rows()
    head = (f"{'call':34} {'eager us':>10} {'compiled':>10} {'ratio':>6} {'ops':>5} {'launch wait':>11} "
            f"{'eager kern':>10} {'fused kern':>10} {'overlap':>8} {'kernels':>7} {'fused':>5} {'HBM MiB':>8} {'saved':>7} "
            f"{'compile s':>9} {'x eager':>7}")
    print(head)
    for r in rows:
        print(f"{r['label']:34} {r['eager_us']:10.1f} {r['compiled_us']:10.1f} {r['ratio']:6.2f} {r['eager_ops']:5d} "
              f"{r['launch_wait_us']:11.1f} {r['eager_kernels_us']:10.1f} {r['compiled_kernels_us']:10.1f} "
              f"{r['overlap_us']:8.1f} {r['kernels']:7d} {r['fused']:5d} {r['hbm_mib']:8.2f} {r['hbm_saved_mib']:7.2f} "
              f"{r['compile_s']:9.2f} {r['compile_x']:7.0f}")
    print("launch wait: eager device time spent waiting for the host to launch ops; eager kern / fused kern: "
          "device time in kernels, each alone; overlap: compiled kernel time hidden under other kernels; "
          "saved: HBM bytes fusion kept in SBUF; compile s: host seconds of the first "
          "compiled call, x eager: over one warm eager call's host time")


if __name__ == "__main__":
    main()
