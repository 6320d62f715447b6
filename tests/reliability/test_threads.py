"""The ``neuron`` device under threads: random number streams per device and thread,
concurrent training, and the state PyTorch keeps per thread (profiles, current
stream, autocast) kept per thread."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

import pytest
import torch

import trnsim

DEV = "neuron"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _switch_often():
    """Threads take turns every 10 us instead of every 5 ms, so races show."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(saved)


def _together(*fns: Callable[[], object], timeout: float = 120) -> list:
    """Run each function in its own thread, started together; return their results (re-raising errors)."""
    start = threading.Barrier(len(fns))
    results: list = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int, fn: Callable[[], object]) -> None:
        try:
            start.wait()
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


# -- random numbers ----------------------------------------------------------------

def test_neuron_draws_in_one_thread_leave_the_cpu_sequence_of_another_alone():
    torch.manual_seed(11)
    cpu_ref = [torch.rand(8) for _ in range(300)]
    torch.manual_seed(11)
    neuron_ref = [torch.rand(8, device=DEV).cpu() for _ in range(300)]

    torch.manual_seed(11)
    cpu, neuron = _together(lambda: [torch.rand(8) for _ in range(300)],
                            lambda: [torch.rand(8, device=DEV).cpu() for _ in range(300)])
    assert all(torch.equal(a, b) for a, b in zip(cpu, cpu_ref))
    assert all(torch.equal(a, b) for a, b in zip(neuron, neuron_ref))


def test_two_threads_drawing_on_neuron_share_one_stream_without_duplicates():
    torch.manual_seed(5)
    ref = {tuple(torch.rand(4, device=DEV).cpu().tolist()) for _ in range(400)}
    torch.manual_seed(5)

    def draw() -> list:
        return [tuple(torch.rand(4, device=DEV).cpu().tolist()) for _ in range(200)]

    a, b = _together(draw, draw)
    assert len(set(a) | set(b)) == 400          # no draw repeated in the other thread
    assert set(a) | set(b) == ref               # and together exactly the single-threaded stream


def test_random_ops_pass_the_device_generator_and_keep_cpu_parity():
    """Every random op family on neuron matches the CPU after the same seed, and leaves
    the CPU default generator where it was."""
    x = torch.rand(64)
    draws = [lambda d: torch.randn(16, device=d), lambda d: torch.randperm(20, device=d),
             lambda d: torch.multinomial(x.to(d), 8), lambda d: torch.empty(16, device=d).normal_(2.0, 3.0),
             lambda d: torch.bernoulli(x.to(d)), lambda d: torch.empty(16, device=d).random_(0, 100),
             lambda d: torch.empty(16, device=d).uniform_(-1, 1), lambda d: torch.empty(16, device=d).exponential_(),
             lambda d: torch.nn.functional.dropout(torch.ones(32, device=d), 0.3),
             lambda d: torch.randint(0, 9, (16,), device=d)]
    for draw in draws:
        torch.manual_seed(3)
        on_cpu = draw("cpu")
        torch.manual_seed(3)
        cpu_state = torch.get_rng_state()
        on_neuron = draw(DEV)
        assert torch.equal(on_neuron.cpu(), on_cpu)
        assert torch.equal(torch.get_rng_state(), cpu_state)      # the CPU generator untouched
    state = torch.neuron.get_rng_state()
    with torch.random.fork_rng(device_type=DEV):
        torch.rand(5, device=DEV)
    assert torch.equal(torch.neuron.get_rng_state(), state)


# -- training in two threads -------------------------------------------------------

def _train(seed: int, steps: int = 6) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                torch.nn.Linear(32, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(8, 16, generator=g).to(DEV)
    y = torch.randint(0, 4, (8,), generator=g).to(DEV)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_two_models_trained_in_two_threads_match_their_single_threaded_losses():
    clock = torch.neuron.clock()
    ops0 = clock.ops
    alone = [_train(1), _train(2)]
    ops_alone = clock.ops - ops0
    for _ in range(3):
        ops0 = clock.ops
        assert _together(lambda: _train(1), lambda: _train(2)) == alone      # bit-identical
        assert clock.ops - ops0 == ops_alone       # every op of both threads on the timeline once


# -- state kept per thread -----------------------------------------------------------

def test_a_profile_records_its_own_thread_and_its_backward_not_other_threads():
    x = torch.randn(64, device=DEV, requires_grad=True)
    y = torch.randn(64, device=DEV)
    started, done = threading.Event(), threading.Event()
    seen_elsewhere: list = []

    def other() -> None:
        started.wait(30)
        seen_elsewhere.append(torch.neuron.current_trace())
        for _ in range(50):
            torch.cos(y)
        done.set()

    t = threading.Thread(target=other, daemon=True)
    t.start()
    with trnsim.profile() as prof:
        started.set()
        torch.exp(x).sum().backward()       # the backward runs on the autograd engine's thread
        done.wait(30)
    t.join(30)
    names = {r.name for r in prof.records}
    assert "aten::exp" in names and "aten::mul.Tensor" in names     # exp's backward: grad * exp(x)
    assert "aten::cos" not in names
    assert seen_elsewhere == [None]
    assert torch.neuron.current_trace() is None


def test_current_stream_is_per_thread():
    s = torch.neuron.Stream()
    inside, checked = threading.Event(), threading.Event()
    seen: list = []

    def other() -> None:
        inside.wait(30)
        seen.append(torch.neuron.current_stream())
        checked.set()

    t = threading.Thread(target=other, daemon=True)
    t.start()
    with torch.neuron.stream(s):
        inside.set()
        checked.wait(30)
        assert torch.neuron.current_stream() is s
    t.join(30)
    assert seen == [torch.neuron.default_stream()]


def test_autocast_is_per_thread_and_bf16_in_every_thread():
    a = torch.ones(8, 8, device=DEV)

    def in_autocast() -> tuple:
        with torch.autocast(DEV):
            return torch.get_autocast_dtype(DEV), (a @ a).dtype

    def outside() -> torch.dtype:
        return (a @ a).dtype

    (dtype, inner), outer = _together(in_autocast, outside)
    assert dtype == torch.bfloat16 and inner == torch.bfloat16 and outer == torch.float32

    def chooses_fp16() -> torch.dtype:
        with torch.autocast(DEV, dtype=torch.float16):
            return (a @ a).dtype

    assert _together(chooses_fp16) == [torch.float16]
    assert torch.get_autocast_dtype(DEV) == torch.bfloat16


def test_first_ops_and_generators_from_many_threads_at_once():
    """A fresh process whose first neuron ops and first neuron generators come from eight
    threads at once: every thread gets its numbers, nothing is registered twice."""
    code = (
        "import sys, threading, torch, trnsim\n"
        "sys.setswitchinterval(1e-5)\n"
        "b = threading.Barrier(8); out = []\n"
        "def run(i):\n"
        "    b.wait()\n"
        "    g = torch.Generator(device='neuron').manual_seed(i)\n"
        "    x = torch.rand(4, device='neuron', generator=g)\n"
        "    out.append(((x + 1) * 2).sum().item())\n"
        "ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]\n"
        "[t.start() for t in ts]; [t.join(60) for t in ts]\n"
        "ref = sorted(((torch.rand(4, generator=torch.Generator().manual_seed(i)) + 1) * 2).sum().item()"
        " for i in range(8))\n"
        "assert sorted(out) == ref, (out, ref)\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert "Traceback" not in r.stderr
