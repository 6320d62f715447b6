"""Write the notebooks of this folder from their cells below and execute them in place.

    python notebooks/build.py                 # every notebook
    python notebooks/build.py 03_nki_matmul   # the notebooks whose names start so

The committed notebooks are this script's output: the cells' sources are here, the
outputs are those of a real run (simulated times are deterministic, so a rerun gives
the same numbers). Each notebook writes its traces under ``notebooks/out/`` (ignored by
git). Needs nbformat, nbclient and ipykernel (the ``test`` extra).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
CELL_TIMEOUT_S = 600


def setup(*modules: str) -> str:
    """The first code cell: inline figures, ``modules`` imported, the traces' folder made."""
    imports = "".join(f"import {m}\n" for m in modules)
    return f"""%matplotlib inline
from pathlib import Path

{imports}from trnsim import trace as tt

Path("out").mkdir(exist_ok=True)"""


QUICKSTART = [
    ("md", """\
# Quickstart: an eager model, its trace, its plots

trnsim adds a PyTorch device, `neuron`, whose ops run on a simulated NeuronCore (trn2 by
default). Every op computes its real values and gets a simulated time on the chip's
engines (TensorE, VectorE, ScalarE, GpSimd) and DMA queues. `trnsim.profile` records
those times as a trace; `trnsim.trace` reads it back as tables and plots."""),
    ("code", setup("torch", "trnsim")),
    ("md", """\
## Run and record

A two-layer MLP in bf16, 1024 wide, on a batch of 1024 rows. Inside `trnsim.profile`
each op is recorded with its simulated start and end and the engine and DMA slices of
its kernel; the trace is written to `out/quickstart.json` (it opens in
[Perfetto](https://ui.perfetto.dev) too)."""),
    ("code", """\
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                            torch.nn.Linear(1024, 1024)).to("neuron").to(torch.bfloat16)
x = torch.randn(1024, 1024, dtype=torch.bfloat16).to("neuron")
with torch.no_grad(), trnsim.profile("out/quickstart.json") as prof:
    y = model(x)
    torch.neuron.synchronize()
print(prof.summary())"""),
    ("md", """\
The two `addmm` are the linear layers (matmul and bias in one kernel, 31.4 us each),
`gelu` the activation (12.7 us): 75.5 us of simulated device time. Load the trace and
ask for its ops with their roofline figures: FLOPs, bytes moved from HBM, arithmetic
intensity, and whether each is compute or memory bound on this chip. The matmuls do
256 FLOPs per HBM byte, past trn2's bf16 ridge point of 217: compute bound, at 68 of
the 157 TFLOP/s peak. GELU moves bytes and does no matmul FLOPs: memory bound."""),
    ("code", """\
t = tt.load("out/quickstart.json")
print(tt.roofline(t))
print()
print(tt.ops(t))"""),
    ("md", """\
## The timeline

One row per engine and DMA queue, as the Neuron profiler draws it, under a row of
PyTorch ops. Each matmul first loads its operands' tiles on the DMA queues, then
TensorE multiplies while VectorE and ScalarE copy the finished PSUM tiles to SBUF and
queues 12-15 store them; GELU is one activation on ScalarE between a load and a store."""),
    ("code", "tt.plot_timeline(t)"),
    ("md", """\
Zoomed to the first `addmm`: the tiles' loads on the queues, TensorE's loads and
multiplies, the PSUM copies to SBUF."""),
    ("code", "tt.plot_timeline(t, op=\"addmm\")"),
    ("md", """\
## Engines' busy share over time

In buckets of 1.5 us: the DMA queues at 75% while a matmul's tiles load, then
TensorE at 100% for about 10 us; ScalarE at 100% during GELU."""),
    ("code", "tt.plot_utilisation(t)"),
    ("md", """\
## The roofline

Each op at its arithmetic intensity (FLOPs per HBM byte) and achieved FLOP/s, under
the bf16 TensorE ceiling and the HBM bandwidth slope. The matmuls sit right of the
ridge point (compute bound); GELU does no matmul FLOPs, so the plot counts it in its
title instead of placing it."""),
    ("code", "tt.plot_roofline(t)"),
    ("md", """\
## Memory: HBM traffic and on-chip occupancy over time

HBM traffic stays well under the 725 GB/s the core can draw: the matmuls are compute
bound. SBUF holds at most 6.5 of its 56 MiB, PSUM half of its 4 MiB while the
multiplies' tiles accumulate."""),
    ("code", "tt.plot_memory(t)"),
]

LLAMA = [
    ("md", """\
# A tiny Llama, eager against compiled

`trnsim.models.tinyllama.TinyLlama` (RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU MLP; random weights) runs its forward pass on `neuron` twice: eagerly, one
kernel launch per PyTorch op, and under `torch.compile(backend="neuron")`, where the
graph's ops are fused into fewer kernels launched as one graph."""),
    ("code", setup("torch", "trnsim")),
    ("code", """\
from trnsim.models.tinyllama import TinyLlama

torch.manual_seed(0)
model = TinyLlama(vocab=1000, d=256, layers=2, seq=128).to("neuron").eval()
ids = torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(0)).to("neuron")
compiled = torch.compile(model, backend="neuron")
with torch.no_grad():
    compiled(ids)   # compile once, outside the profiles
    profiles = {}
    for name, fn in (("eager", model), ("compiled", compiled)):
        torch.neuron.synchronize()
        with trnsim.profile(f"out/llama_{name}.json") as prof:
            logits = fn(ids).cpu()
        profiles[name] = (prof, logits)

(eager, eager_logits), (comp, comp_logits) = profiles["eager"], profiles["compiled"]
print(f"max logit difference, eager against compiled: {(eager_logits - comp_logits).abs().max().item():.1e}")
for name, (prof, _) in profiles.items():
    in_ops = tt.busy_ns([s for s in prof.trace().slices if s.track == "ops"]) * 1000   # overlaps counted once
    print(f"{name:8} {len(prof.records):3d} device ops, {prof.device_ps / 1e6:6.1f} us simulated: "
          f"{in_ops / 1e6:6.1f} us in ops, {(prof.device_ps - in_ops) / 1e6:6.1f} us between them")
print(f"speed-up: {eager.device_ps / comp.device_ps:.2f}x")"""),
    ("md", """\
The logits agree. Each forward's simulated time is its ops' kernels plus the idle
time between them, while the device waits for the host to launch the next op.
Compiled, the graph runs 40 ops instead of 81: its elementwise chains are fused into
the matmul or row kernels they follow (`fused[mm+add+pow]`, `fused[mean+add+rsqrt+mul+mul]`:
RMSNorm in one kernel); the graph is one program on the chip, so each kernel starts
as soon as its data allow (the next one's weights load while this one computes, and it
reads the result of the one before from SBUF), and the kernels run in 210 us where the
eager ops took 383; and the graph is one launch, so almost none of its time is spent
between ops: 3.70x in all. A compiled kernel's time below is what it adds to its graph
(it overlaps the kernels around it). Where the time went:"""),
    ("code", "print(eager.summary())"),
    ("code", "print(comp.summary())"),
    ("md", """\
Side by side, by what the ops compute (as `trnsim diff` matches them): a row holds
eager's ops and the compiled kernels that compute them, and a fused kernel ties the
ops it fused into one row, so the layers' matmuls, RMSNorms and elementwise ops share
the row `mm + mul + add + pow + 3 more`; the whole graph is a `graph:` row. Attention
and the rotary embeddings' concatenations run the same kernels in both."""),
    ("code", """\
te, tc = tt.load("out/llama_eager.json"), tt.load("out/llama_compiled.json")
tt.plot_comparison(te, tc, labels=("eager", "compiled"))"""),
    ("md", """\
The compiled graph's kernels with their roofline figures: at this size (128 tokens,
width 256) even the matmuls are memory bound."""),
    ("code", "print(tt.kernels(tc))"),
    ("md", """\
## Timelines

Eager: each op's kernel on the engines and DMA queues, with gaps between the ops
where the device waits for the host to launch the next."""),
    ("code", "tt.plot_timeline(te)"),
    ("md", "Compiled: the graph's kernels back to back under one `graph0 inference` slice, in 40% of the eager time."),
    ("code", "tt.plot_timeline(tc)"),
]

MATMUL_KERNELS = """\
import numpy as np

import trnsim.nki as nki
import trnsim.nki.language as nl
from trnsim.kernels.matmul import matmul_basic, matmul_optimized


@nki.jit
def matmul_hoisted(lhsT, rhs):
    \"\"\"Step 2: an M tile's K stationary tiles are loaded once, not once per N tile.\"\"\"
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        lhsT_tiles = [nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128]) for k in range(K // 128)]
        for n in nl.affine_range(N // 512):
            res_psum = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                rhs_tile = nl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                res_psum += nl.matmul(lhsT_tiles[k], rhs_tile, transpose_x=True)
            nl.store(result[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], value=nl.copy(res_psum, dtype=result.dtype))
    return result


@nki.jit
def matmul_blocked(lhsT, rhs, block_m=512, block_n=1024):
    \"\"\"Step 3: blocks of [K, 512] of lhsT and [K, 1024] of rhs are loaded whole, in rows
    of 1-2 KiB, and every tile of the output block is computed from them.\"\"\"
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm)
    for m2 in nl.affine_range(M // block_m):
        lhsT_tiles = [nl.load(lhsT[k * 128:(k + 1) * 128, m2 * block_m:(m2 + 1) * block_m]) for k in range(K // 128)]
        for n2 in nl.affine_range(N // block_n):
            rhs_tiles = [nl.load(rhs[k * 128:(k + 1) * 128, n2 * block_n:(n2 + 1) * block_n]) for k in range(K // 128)]
            for m in range(block_m // 128):
                for n in range(block_n // 512):
                    res_psum = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
                    for k in range(K // 128):
                        res_psum += nl.matmul(lhsT_tiles[k][:, m * 128:(m + 1) * 128],
                                              rhs_tiles[k][:, n * 512:(n + 1) * 512], transpose_x=True)
                    rows = slice(m2 * block_m + m * 128, m2 * block_m + (m + 1) * 128)
                    cols = slice(n2 * block_n + n * 512, n2 * block_n + (n + 1) * 512)
                    nl.store(result[rows, cols], value=nl.copy(res_psum, dtype=result.dtype))
    return result"""

NKI_MATMUL = [
    ("md", """\
# Optimising an NKI matmul kernel, step by step

`result[M, N] = lhsT.T @ rhs` in bf16 with fp32 accumulation, M = N = 1024 and
K = 2048, on one simulated trn2 NeuronCore. Each step is an NKI kernel
(`trnsim.nki`, the same language as AWS's `nki`); `nki.benchmark` traces it into
engine instructions, times them and reports the latency, the share of TensorE's bf16
peak and the trace, whose timeline shows what bounds the step. The steps follow the
NKI matmul tutorial: `matmul_basic` and `matmul_optimized` are
`trnsim/kernels/matmul.py`, the two between are written here."""),
    ("code", setup("torch")),
    ("code", MATMUL_KERNELS),
    ("code", """\
K, M, N = 2048, 1024, 1024
rng = np.random.default_rng(0)
a = rng.standard_normal((K, M)).astype(np.float32)
b = rng.standard_normal((K, N)).astype(np.float32)
lhsT, rhs = nki.typed(a, nl.bfloat16), nki.typed(b, nl.bfloat16)
steps = {}


def step(name, kernel, **options):
    \"\"\"Time ``kernel`` (shapes only: the values are checked at the end) and print its figures.\"\"\"
    r = nki.benchmark(kernel, chip="trn2", numerics=False)(lhsT, rhs, **options)
    steps[name] = r
    print(f"{name}: {r.latency_us:8.2f} us, {r.pct_of_peak:5.1f}% of TensorE's peak, {r.instructions} instructions, "
          f"TensorE busy {r.busy_pct['tensor']:.1f}%")
    return r"""),
    ("md", """\
## Step 1: one output tile at a time

For each [128, 512] output tile, every K step loads a [128, 128] stationary tile of
lhsT and a [128, 512] moving tile of rhs, and TensorE accumulates their product in
PSUM. The stationary tiles' rows are 256 bytes, the moving tiles' 1 KiB: small DMA
transfers, and the same tiles are loaded again for every output tile: 44 MiB of HBM
traffic for 8 MiB of inputs and a 4 MiB result. The DMA queues are busy from start to end; TensorE, busy 27% of
the time, mostly waits for them."""),
    ("code", "tt.plot_timeline(step(\"1 basic\", matmul_basic).trace)"),
    ("md", """\
## Step 2: hoist the stationary loads

The K stationary tiles of an M tile do not depend on N: load them once per M tile.
That saves 4 of the 44 MiB; the moving tiles are still loaded once per output tile,
so the kernel stays DMA bound: 1.2x."""),
    ("code", "tt.plot_timeline(step(\"2 hoisted\", matmul_hoisted).trace)"),
    ("md", """\
## Step 3: block the free dimensions

Load [K, 512] of lhsT and [K, 1024] of rhs as whole blocks (rows of 1 and 2 KiB), and
compute all eight [128, 512] output tiles of the block from them. Each input byte is
now read once (lhsT) or twice (rhs), 16 MiB of traffic in all, and the longer rows move at a
better share of the HBM bandwidth: 2.7x faster than step 1, TensorE busy 72% of the
time."""),
    ("code", "tt.plot_timeline(step(\"3 blocked\", matmul_blocked).trace)"),
    ("md", """\
## Step 4: block K too, and keep the output in SBUF

`matmul_optimized` also splits K into blocks: the loads of the next K block overlap
the matmuls of this one, and each block's PSUM partial sums are added into an output
block kept in SBUF (on VectorE) and stored once. With its default block sizes
(16 x 2 x 8 tiles, capped by the shape: the whole [1024, 1024] output is one block)
K runs in two blocks of 1024, and every input byte is read once: 12 MiB of traffic."""),
    ("code", "tt.plot_timeline(step(\"4 K blocks\", matmul_optimized).trace)"),
    ("md", """\
## Step 5: tune the block sizes

Smaller K blocks (4 tiles, 512 deep) start the matmuls sooner after the first loads
and overlap more of the loading with compute. The loads are done a little after a
third of the run; from there TensorE multiplies without a gap to the end, with
VectorE adding each block's partial sums: the kernel is now compute bound, at 75% of
TensorE's peak."""),
    ("code", "final = step(\"5 tuned\", matmul_optimized, tiles_in_block_k=4)\ntt.plot_timeline(final.trace)"),
    ("md", "## All the steps"),
    ("code", """\
first = steps["1 basic"].latency_ns
print(f"{'step':12} {'latency us':>10} {'speed-up':>8} {'% of peak':>9} {'HBM MiB':>8}")
for name, r in steps.items():
    print(f"{name:12} {r.latency_us:10.2f} {first / r.latency_ns:7.2f}x {r.pct_of_peak:8.1f}% "
          f"{r.hbm_bytes / 2**20:8.2f}")"""),
    ("md", """\
Busy time per engine and opcode, the first step against the last: the same TensorE
matmul time in both, a tenth of the time on each DMA queue, and VectorE's additions of
the partial sums into the SBUF output block, which steps 4 and 5 add."""),
    ("code", "tt.plot_comparison(steps[\"1 basic\"].trace, final.trace, labels=(\"1 basic\", \"5 tuned\"), top=14)"),
    ("md", """\
## The values

The steps above were timed on shapes only. Run the tuned kernel with its numerics
(every instruction computed, bf16 inputs, fp32 PSUM) and compare it with numpy on the
same bf16-rounded inputs."""),
    ("code", """\
def bf16(x):   # the values HBM holds
    return torch.from_numpy(x).bfloat16().float().numpy()


out = nki.simulate(matmul_optimized, chip="trn2")(lhsT, rhs, tiles_in_block_k=4)
expected = bf16(a).T.astype(np.float64) @ bf16(b).astype(np.float64)
print(f"max abs error {np.abs(out - expected).max():.2e} (largest value {np.abs(expected).max():.1f})")"""),
]

HUB_KERNEL = [
    ("md", """\
# A hub kernel's speed-up

Hugging Face's `kernels` library replaces layers' forwards with kernels from a kernel
repository. On trnsim it takes the Neuron path, as on a Trainium instance: the
repository `examples/hub_kernels/llama-nki` holds NKI kernels for Llama's RMSNorm and
its SwiGLU MLP, and `kernelize(model, device="neuron")` puts them into a transformers
`LlamaForCausalLM` (a tiny one, random weights from a config: nothing is downloaded).
Each kernel runs on the simulated NeuronCore as one op in place of the layer's
several."""),
    ("code", setup("torch", "trnsim")),
    ("code", """\
import logging
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", message="IProgress not found")   # tqdm's note: no notebook widgets here
# imported after that filter: tqdm gives its note as they import it
from kernels import LocalLayerRepository, Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaMLP  # noqa: E402

logging.getLogger("kernels").setLevel(logging.ERROR)   # notes on the layers the repository does not map
REPO = Path(trnsim.__file__).resolve().parents[1] / "examples" / "hub_kernels" / "llama-nki"


def tiny_llama():
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to("neuron")


plain, fast = tiny_llama(), tiny_llama()
replace_kernel_forward_from_hub(LlamaMLP, "SwiGLUMLP")   # transformers registers LlamaRMSNorm, not LlamaMLP
mapping = {"RMSNorm": {"neuron": LocalLayerRepository(REPO, layer_name="RMSNorm")},
           "SwiGLUMLP": {"neuron": LocalLayerRepository(REPO, layer_name="SwiGLUMLP")}}
with use_kernel_mapping(mapping):
    kernelize(fast, device="neuron", mode=Mode.INFERENCE)
print("RMSNorm runs", fast.model.norm.forward.__qualname__, "| MLP runs", fast.model.layers[0].mlp.forward.__qualname__)"""),
    ("md", "Profile one forward pass of 128 tokens through each model, from an idle device:"),
    ("code", """\
ids = torch.arange(128).reshape(1, 128).to("neuron")
profiles, logits = {}, {}
for name, m in (("plain", plain), ("kernels", fast)):
    torch.neuron.synchronize()
    with torch.no_grad(), trnsim.profile(f"out/hub_{name}.json") as prof:
        logits[name] = m(ids).logits.cpu()
    profiles[name] = prof

print(f"max logit difference: {(logits['plain'] - logits['kernels']).abs().max().item():.1e}")
for name, prof in profiles.items():
    in_ops = tt.busy_ns([s for s in prof.trace().slices if s.track == "ops"]) * 1000   # overlaps counted once
    print(f"{name:8} {len(prof.records):3d} device ops, {prof.device_ps / 1e6:6.1f} us simulated: "
          f"{in_ops / 1e6:6.1f} us in ops, {(prof.device_ps - in_ops) / 1e6:6.1f} us between them")
print(f"speed-up: {profiles['plain'].device_ps / profiles['kernels'].device_ps:.2f}x")"""),
    ("md", """\
The logits agree. Each RMSNorm was six ops (power, mean, add, rsqrt and two
multiplies), each MLP five (three matmuls, SiLU and a multiply); each is now one
kernel, 33 ops fewer in all. The kernels do the layers' work in 107 us less than
their ops did (383 us of ops against 276), and the 33 launches saved take away
about 223 us of idle time between ops: 1.58x in all. The ops of each run:"""),
    ("code", "print(profiles[\"plain\"].summary())"),
    ("code", "print(profiles[\"kernels\"].summary())"),
    ("code", """\
tp, tk = tt.load("out/hub_plain.json"), tt.load("out/hub_kernels.json")
tt.plot_comparison(tp, tk, labels=("plain", "hub kernels"))"""),
    ("md", """\
The whole forward pass with the hub kernels, then zoomed to the first
`nki_swiglu_mlp`: the weights and the input transposed on TensorE (each copied from
PSUM to SBUF on VectorE) so the contracted axis lies on the partitions, then the
projections' matmuls, with SiLU on ScalarE and the gate-up product on VectorE."""),
    ("code", "tt.plot_timeline(tk)"),
    ("code", "tt.plot_timeline(tk, op=\"nki_swiglu_mlp\")"),
]

DISTRIBUTED = [
    ("md", """\
# TP x FSDP on four ranks, and each rank's timeline

`tp_fsdp.py` (beside this notebook) trains a two-block MLP for two steps on a 2 x 2
device mesh of `neuron` ranks: tensor parallel over the mesh's `tp` dimension
(`parallelize_module`: each block's up projection split by columns, its down
projection by rows) and FSDP2 over `dp` (`fully_shard`: parameters all-gathered
before each block runs, gradients reduce-scattered after backward). `trnsim run
--nproc 4` launches it with torchrun on four simulated NeuronCores of one trn2 chip;
the collectives move real data and are timed on the simulated NeuronLink fabric, and
every rank's trace is merged onto one clock."""),
    ("code", setup()),
    ("code", "print(Path(\"tp_fsdp.py\").read_text())"),
    ("md", """\
Run it on four ranks, writing the merged trace to `out/job.json` (`OMP_NUM_THREADS=1`
is torchrun's own default for each rank, set here so that torchrun does not print a
notice about it):"""),
    ("code", "!TRNSIM_PROGRESS=0 OMP_NUM_THREADS=1 trnsim run --nproc 4 --trace out/job.json tp_fsdp.py"),
    ("md", """\
Rank 0 prints the loss of each step; then `trnsim run` prints the job's summary
(`TRNSIM_PROGRESS=0` keeps its progress line out of the notebook). Its last table is
per rank: the device's busy time, the time in collectives, the part of that no op
overlapped (`exposed`) and the time collectives waited for a slower rank. Each rank's
device is busy for 2,259 of the job's 2,958 simulated us (its collectives included);
the rest it waits for the host to issue the next op, as eager PyTorch issues one op at
a time. Its 30 collectives take 1,025 us, all exposed: the ops after a collective need
its result, and each pays the runtime's fixed cost (55 us for one that reduces, 8 us
for one that only moves data, fitted to nccom-test's published tables). The
merged trace loads as a `JobTrace`, one `Trace` per rank:"""),
    ("code", """\
job = tt.load("out/job.json")
print(f"{job.world_size} ranks, {job.total_ns / 1000:,.1f} us of simulated time")
calls = {}
for s in job.collectives(0):
    calls.setdefault(s.name, []).append(s.dur_ns)
for name, durs in sorted(calls.items()):
    print(f"rank 0 {name:28} {len(durs):3d} calls {sum(durs) / 1000:8.1f} us")"""),
    ("md", """\
## The per-rank timeline

Each rank's rows (PyTorch ops, collectives on NeuronLink, engines, DMA queues)
stacked and labelled on the right, with the collectives shaded across them. The
first collectives (scatters and broadcasts) are `parallelize_module` distributing
the parameters over each `tp` pair; then the two training steps, each ending in the AdamW update's long `_foreach`
ops."""),
    ("code", "tt.plot_timeline(job)"),
    ("md", """\
The second training step only, on ranks 0 and 1 (the `tp` pair of `dp` group 0): it
starts where the first step's AdamW update (`_foreach_addcdiv_`) ends. Forward: an
all-gather of each block's parameter shards, its ops, an all-reduce joining the
row-parallel halves; backward the same in reverse, each block's gradients
reduce-scattered; then the optimizer's `_foreach` ops on the local shards."""),
    ("code", """\
ops0 = [s for s in job.ranks[0].slices if s.track == "ops"]
step1_end = min(s.end_ns for s in ops0 if s.name.startswith("_foreach_addcdiv_"))
tt.plot_timeline(job, start_ns=step1_end, end_ns=job.total_ns, ranks=[0, 1])"""),
    ("md", """\
The analysis tables take a `JobTrace` too, with a leading `rank` column. Rank 0's ops
by time, and where its TensorE's idle time went:"""),
    ("code", """\
print(tt.ops(job).where(rank=0).sort("time_ns").head(8))
print()
print(tt.waits(job).where(rank=0, track="tensor"))"""),
    ("md", """\
Each rank's engines' busy share over the whole job, in 55 us buckets. At this size
every kernel is short, and TensorE spends most of the job idle between ops
(`between_ops` above), while the host issues the next one: no engine is more than
20% busy in any bucket."""),
    ("code", "tt.plot_utilisation(job)"),
]

NOTEBOOKS = {
    "01_quickstart": QUICKSTART,
    "02_llama_eager_vs_compiled": LLAMA,
    "03_nki_matmul_step_by_step": NKI_MATMUL,
    "04_hub_kernel_speedup": HUB_KERNEL,
    "05_distributed_tp_fsdp": DISTRIBUTED,
}


def notebook(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook of ``cells`` (("md" or "code", source) pairs) for the python3 kernel."""
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells])
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"   # stable ids, so a rebuild changes only what changed
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def execute(nb: nbformat.NotebookNode) -> None:
    """Run ``nb`` in this folder with a fresh kernel, keeping no host timings in it."""
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(HERE)}}).execute()


def join_streams(nb: nbformat.NotebookNode) -> None:
    """Join each cell's consecutive outputs to one stream into one output: how a stream
    is cut into messages depends on host timing, and a rebuild should change nothing."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        joined: list = []
        for out in cell.outputs:
            last = joined[-1] if joined else None
            if (out.output_type == "stream" and last is not None and last.output_type == "stream"
                    and last.name == out.name):
                last.text += out.text
            else:
                joined.append(out)
        cell.outputs = joined


def main(prefixes: list[str]) -> None:
    for name, cells in NOTEBOOKS.items():
        if prefixes and not any(name.startswith(p) for p in prefixes):
            continue
        nb = notebook(cells)
        start = time.perf_counter()
        execute(nb)
        join_streams(nb)
        path = HERE / f"{name}.ipynb"
        nbformat.write(nb, path)
        print(f"{path.name}: executed in {time.perf_counter() - start:.0f} s, {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main(sys.argv[1:])
