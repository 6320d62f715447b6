"""torchtitan, as its users run it: ``torchrun ... -m torchtitan.train --module llama3
--config llama3_debugmodel`` (the stock debug model, FlexAttention with document
masking, selective activation checkpointing, AdamW with warmup), on ``neuron`` and, for
reference, on the CPU with gloo (tests/e2e_jobs/titan_cpu.py), in a folder holding the
stock config's local assets (``./tests/assets/tokenizer``, the ``c4_test`` dataset: made by
tests/e2e_jobs/assets.py). Only the run's length and sizes are given on the command line.

- One rank, no other flags: the losses equal the CPU's.
- FSDP over 2 ranks and tensor parallel over 2 ranks, both starting from one seed
  checkpoint that the CPU wrote (torchtitan's way to compare parallelisms): the losses
  equal the CPU's run of the same layout. These take ``--parallelism.spmd-backend
  partial_dtensor``: torchtitan 0.3's default ``spmd_types`` backend relies on
  ``fully_shard`` turning SPMD annotations into DTensor parameters, which PyTorch 2.13's
  ``fully_shard`` does not do (it refuses plain parameters with ``dp_mesh_dims``, on any
  device).
- Tensor parallel with no checkpoint: on ``neuron``, DTensor's offset-based random
  generator initialises each shard as the whole weight would be, so the run repeats the
  one-rank run (to the rounding of sharded matmuls). The CPU has no such generator, so it
  is not the reference there.

Slow (minutes): run by .ci/run with ``-m slow``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from trnsim.testing.procs import run_session, with_repo_on_path

pytest.importorskip("torchtitan", reason="torchtitan is not installed: install trnsim's test extra")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "e2e_jobs"
TIMEOUT_S = 420
STEPS = 3
STOCK = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", str(STEPS),
         "--training.seq-len", "256", "--training.local-batch-size", "2", "--debug.seed", "0"]
PARTIAL = ["--parallelism.spmd-backend", "partial_dtensor"]
FSDP = ["--parallelism.data-parallel-shard-degree", "2", *PARTIAL]
TP = ["--parallelism.tensor-parallel-degree", "2", *PARTIAL]
RTOL = 1e-5
PRINTED = 5e-6   # torchtitan prints losses to 5 decimals
_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([0-9.]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def titan(where: Path, device: str, nproc: int, name: str, *flags: str, steps: int = STEPS) -> dict[int, float]:
    """Run torchtitan's training in ``where`` on ``device`` (``neuron`` or ``cpu``) with
    ``nproc`` ranks; its loss at each of ``steps`` steps, as it logs them."""
    entry = ["-m", "torchtitan.train"] if device == "neuron" else [str(JOBS / "titan_cpu.py")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *entry,
           *STOCK, "--dump-folder", str(where / name), *flags]
    env = with_repo_on_path(REPO, TRNSIM_PROGRESS="0")
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    r = run_session(cmd, timeout=TIMEOUT_S, env=env, cwd=where)
    log = _ANSI.sub("", r.stdout + r.stderr)
    losses: dict[int, float] = {}
    for step, loss in _STEP.findall(log):
        losses.setdefault(int(step), float(loss))
    assert r.returncode == 0 and sorted(losses) == list(range(1, steps + 1)), (
        f"torchtitan {name} on {device}: exit {r.returncode}, steps logged {sorted(losses)}\n{log[-6000:]}")
    return losses


def same(what: str, got: dict[int, float], want: dict[int, float], rtol: float = RTOL) -> None:
    bad = {s: (got[s], want[s]) for s in want if abs(got[s] - want[s]) > rtol * abs(want[s]) + PRINTED}
    assert not bad, f"{what}: losses (neuron, reference) differ at steps {bad}"
    assert want[STEPS] < want[1], f"{what}: the reference did not train ({want})"


@pytest.fixture(scope="module")
def where(tmp_path_factory) -> Path:
    """A folder with the stock config's assets and a seed checkpoint the CPU wrote."""
    root = tmp_path_factory.mktemp("titan")
    sys.path.insert(0, str(JOBS))
    try:
        import assets
    finally:
        sys.path.remove(str(JOBS))
    assets.write(root / "tests" / "assets")
    titan(root, "cpu", 1, "seed", "--checkpoint.enable", "--checkpoint.create-seed-checkpoint", steps=0)
    return root


@pytest.fixture(scope="module")
def cpu_one_rank(where) -> dict[int, float]:
    return titan(where, "cpu", 1, "c1")


def from_seed(where: Path) -> list[str]:
    return ["--checkpoint.enable", "--checkpoint.load-only",
            "--checkpoint.initial-load-path", os.fspath(where / "seed" / "checkpoint" / "step-0")]


def test_stock_debug_model_on_one_rank_trains_as_on_the_cpu(where, cpu_one_rank):
    same("1 rank", titan(where, "neuron", 1, "n1"), cpu_one_rank)


@pytest.mark.parametrize("layout", ["fsdp", "tp"])
def test_fsdp_and_tensor_parallel_from_a_seed_checkpoint_train_as_on_the_cpu(where, layout):
    flags = [*(FSDP if layout == "fsdp" else TP), *from_seed(where)]
    same(f"{layout} 2 ranks", titan(where, "neuron", 2, f"n_{layout}", *flags),
         titan(where, "cpu", 2, f"c_{layout}", *flags))


def test_tensor_parallel_initialises_each_shard_as_the_whole_weight(where, cpu_one_rank):
    # the sums of sharded matmuls round differently from the whole ones: 5e-5, not 1e-5
    same("tp 2 ranks against 1 rank", titan(where, "neuron", 2, "n_tp_init", *TP), cpu_one_rank, rtol=5e-5)
