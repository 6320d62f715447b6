"""diffusers' tensor parallelism on ``neuron``: run with ``torchrun --nproc-per-node=2``.

The tiny FLUX pipeline of examples/diffusers_pipeline.py, its transformer sharded by
diffusers' own ``enable_parallelism(config=ParallelConfig(tensor_parallel_config=
TensorParallelConfig(tp_degree=world)))`` (the model's ``_tp_plan``: colwise q/k/v and
feed-forward up projections, rowwise output projections), text encoders on the CPU,
VAE on the device. Every rank's image equals the CPU pipeline's within 1e-5, eager and
with the transformer compiled by ``torch.compile(backend="neuron")``; the transformer's
all-reduces run on the device's collectives.
"""

import importlib.util
import pathlib

import torch
import torch.distributed as dist
from diffusers import ParallelConfig, TensorParallelConfig
from torch.distributed.tensor import DTensor

import trnsim

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "diffusers_pipeline.py"
STEPS, TOL = 2, 1e-5


def load_example():
    spec = importlib.util.spec_from_file_location("diffusers_pipeline", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(rank: int, name: str, image, reference) -> float:
    gap = float(abs(image - reference).max())
    if image.shape != reference.shape or gap > TOL:
        raise SystemExit(f"rank {rank}: {name} image {image.shape} differs from the CPU's by {gap:.3e}")
    return gap


def main():
    ex = load_example()
    reference = ex.generate(ex.tiny_flux_pipeline(), STEPS)
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()

    pipe = ex.tiny_flux_pipeline()
    pipe.transformer.enable_parallelism(
        config=ParallelConfig(tensor_parallel_config=TensorParallelConfig(tp_degree=world)))
    pipe.transformer.to("neuron")
    pipe.vae.to("neuron")
    to_q = pipe.transformer.transformer_blocks[0].attn.to_q.weight
    if not isinstance(to_q, DTensor) or to_q.to_local().shape != (32 // world, 32) or to_q.device.type != "neuron":
        raise SystemExit(f"rank {rank}: to_q is not sharded on neuron: {type(to_q).__name__} {tuple(to_q.shape)}")

    with trnsim.profile() as prof:
        eager = check(rank, "tensor-parallel", ex.generate(pipe, STEPS), reference)
    reduces = [r for r in prof.records if r.name.startswith("c10d::")]
    if not reduces:
        raise SystemExit(f"rank {rank}: the tensor-parallel transformer ran no collectives")

    pipe.transformer = torch.compile(pipe.transformer, backend="neuron")
    compiled = check(rank, "compiled tensor-parallel", ex.generate(pipe, STEPS), reference)
    dist.barrier()
    print(f"rank {rank}: diffusers_tp ok: max difference to the CPU eager {eager:.2e}, compiled {compiled:.2e}; "
          f"{len(reduces)} collectives, {prof.device_ps / 1e6:.1f} us simulated", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
