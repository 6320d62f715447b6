"""Training loops on ``neuron`` checked against the same loop on the CPU.

A training loop can run on ``neuron``, print losses and still train nothing: an optimizer
built before ``model.to(device)`` (the order ``accelerator.prepare`` and most scripts
use) steps tensors the module no longer holds if the move replaced the ``Parameter``
objects. The losses of the first step look right; only the weights tell. So the check is
on both:

    from trnsim.testing.training import TrainingRun, assert_trains_as_on_cpu, snapshot

    def loop(device):
        torch.manual_seed(0)
        model = MyModel()
        opt = torch.optim.AdamW(model.parameters())
        before = snapshot(model)
        model.to(device)
        losses = [...]                        # the loop, as the script writes it
        return TrainingRun(losses, before, snapshot(model))

    assert_trains_as_on_cpu(loop)

It fails when a parameter the CPU's loop changed did not change on ``neuron`` (naming
it), when the losses differ, or when the weights moved by a different amount.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

__all__ = ["TrainingRun", "assert_trains_as_on_cpu", "movement", "snapshot"]


@dataclasses.dataclass
class TrainingRun:
    """What one run of a training loop gives to compare: its ``losses`` (floats, one a
    step) and its parameters ``before`` and ``after`` training (names to CPU tensors, as
    :func:`snapshot` makes them)."""

    losses: list[float]
    before: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of ``module``'s parameters by name; a DTensor (FSDP2, tensor parallel)
    gives its whole tensor, so every rank holds the same snapshot."""
    out = {}
    for name, p in module.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[name] = t.to("cpu", copy=True)
    return out


def movement(run: TrainingRun) -> dict[str, float]:
    """How far each parameter moved in ``run``: the sum of ``|after - before|``, in float64."""
    missing = sorted(set(run.before) ^ set(run.after))
    if missing:
        raise AssertionError(f"parameters {missing} are in only one of the snapshots before and after training; "
                             "take both with snapshot() of the same module")
    return {n: (run.after[n].double() - run.before[n].double()).abs().sum().item() for n in run.before}


def assert_trains_as_on_cpu(loop: Callable[[str], TrainingRun], device: str = "neuron", rtol: float = 1e-5,
                            atol: float = 1e-6) -> tuple[TrainingRun, TrainingRun]:
    """Run ``loop("cpu")`` and ``loop(device)`` and fail unless they trained alike: every
    parameter the CPU's run changed also changed on ``device``, the losses agree within
    ``rtol`` (relative) or ``atol``, and so does each parameter's :func:`movement`.
    Returns both runs (CPU first)."""
    cpu, dev = loop("cpu"), loop(device)
    if not cpu.losses:
        raise AssertionError("the loop returned no losses: it ran no training step")
    cpu_moved, dev_moved = movement(cpu), movement(dev)
    if not any(cpu_moved.values()):
        raise AssertionError("no parameter changed on the CPU either: the loop trains nothing to compare")
    if set(dev_moved) != set(cpu_moved):
        raise AssertionError(f"the loop trained other parameters on {device} than on the CPU: only on {device} "
                             f"{sorted(set(dev_moved) - set(cpu_moved))[:3]}, only on the CPU "
                             f"{sorted(set(cpu_moved) - set(dev_moved))[:3]}")
    # written so that NaN fails every comparison: a run gone NaN is not a run that trains
    frozen = [n for n, m in cpu_moved.items() if m > 0 and not dev_moved[n] > 0]
    if frozen:
        raise AssertionError(
            f"{len(frozen)} of {len(cpu_moved)} parameters did not change on {device} while the CPU's did "
            f"(e.g. {frozen[:3]}; sum |w - w0| on {device} {sum(dev_moved.values()):.6g}, on the CPU "
            f"{sum(cpu_moved.values()):.6g}): the optimizer is not stepping the module's parameters")
    if len(dev.losses) != len(cpu.losses):
        raise AssertionError(f"{len(dev.losses)} losses on {device}, {len(cpu.losses)} on the CPU")
    for step, (a, b) in enumerate(zip(dev.losses, cpu.losses)):
        if not abs(a - b) <= atol + rtol * abs(b):
            raise AssertionError(f"loss of step {step}: {a!r} on {device}, {b!r} on the CPU (rtol {rtol}); "
                                 f"all: {dev.losses} vs {cpu.losses}")
    for n, b in cpu_moved.items():
        a = dev_moved[n]
        if not abs(a - b) <= atol + rtol * b:
            raise AssertionError(f"parameter {n} moved by {a!r} on {device}, {b!r} on the CPU (rtol {rtol})")
    return cpu, dev
