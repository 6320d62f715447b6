"""The common vision and language models' training steps on ``neuron``: every op timed
by a kernel (none by a bandwidth estimate), eager and compiled, and the compiled step
faster than eager in simulated time (benchmarks/model_ops.py prints the figures)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from model_ops import train_step


@pytest.fixture(autouse=True)
def _trn2():
    before = torch.neuron.chip()
    torch.neuron.set_chip("trn2")
    yield
    torch.neuron.set_chip(before)


@pytest.mark.parametrize("name", ["convnext", "efficientnet", "swin", "llama", "transformer_layer"])
def test_a_training_step_is_timed_by_kernels_and_compiles_faster(name):
    eager, eager_estimated = train_step(name, compiled=False)
    compiled, compiled_estimated = train_step(name, compiled=True)
    assert not eager_estimated and not compiled_estimated, (eager_estimated, compiled_estimated)
    assert compiled < eager
