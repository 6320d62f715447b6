"""Hugging Face's training programs, run as their users run them, on ``neuron`` against
the same runs on the CPU with gloo:

- a ``run_clm.py``-style ``Trainer`` script (tests/e2e_jobs/hf_clm_trainer.py) under
  ``torchrun --standalone --nproc-per-node 2`` and under ``accelerate launch --multi_gpu
  --num_processes 2``;
- the accelerate loop of ``run_clm_no_trainer.py`` (tests/e2e_jobs/hf_no_trainer.py: the
  AdamW optimizer is built before ``accelerator.prepare`` moves the model) under torchrun
  with 2 processes and under ``accelerate launch --num_processes 1``;
- TRL's CLI, ``trl sft``, with DDP and with FSDP2 (``fsdp_version: 2``) on 2 processes.

All on a tiny random Llama and local data (tests/e2e_jobs/assets.py; nothing is
downloaded), in float32 (``--bf16 false`` for TRL, whose ``SFTConfig`` asks for bf16).
The scripts name no device: on ``neuron`` it comes from trnsim, as accelerate and
``TrainingArguments`` find the accelerator. The CPU reference runs the same command with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (no ``neuron`` device) and ``ACCELERATE_USE_CPU=true``
(what ``accelerate launch --cpu`` sets: 2 processes on the CPU with gloo, not 2
independent runs); ``accelerate launch --num_processes 1`` takes ``--cpu`` there instead,
as it sets that variable itself.

Each test compares the losses of every step with the CPU's at a relative 1e-5 (the
scripts print them in full; TRL's are read from the ``trainer_state.json`` of the
checkpoint it saves at the last step, as its log prints 4 digits) and checks that the
CPU's run trained (its last loss below its first; weights moved, by the same amount on
``neuron``).

On the CPU accelerate does not take FSDP (it gives FSDP only to accelerator devices, so
the CPU run with the same FSDP2 config is DDP). FSDP's update is mathematically DDP's, so
that DDP run is the reference for the FSDP2 run on ``neuron``.

A gloo process can hang or abort at exit after its work is done (pytorch/pytorch#56297;
``terminate called without an active exception`` when a rank exits with gloo's threads
still joinable): a CPU reference still running 20 s after printing its results is killed,
and one that aborted in teardown after printing them is accepted, both with a warning.
The ``neuron`` runs get no such grace: they must exit 0.

Slow (3 to 4 minutes on a 2-core machine; about 3 CPU-minutes): run by .ci/run with
``-m slow``.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

from trnsim.testing.procs import kill_session, run_session, with_repo_on_path

pytest.importorskip("trl", reason="trl is not installed: install trnsim's test extra")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "e2e_jobs"
BIN = Path(sys.executable).parent   # the console scripts of this environment: torchrun, accelerate, trl
TIMEOUT_S = 300
EXIT_GRACE_S = 20
STEPS = 4
RTOL = 1e-5
COMMON = ["--per_device_train_batch_size", "2", "--learning_rate", "1e-3", "--seed", "0"]
TRAINER = [*COMMON, "--max_steps", str(STEPS), "--logging_steps", "1", "--save_strategy", "no",
           "--report_to", "none", "--dataloader_num_workers", "0", "--disable_tqdm", "true"]
_TEARDOWN_ABORT = "terminate called without an active exception"
_STEP = re.compile(r"^step (\d+) loss ([0-9.e+-]+)$", re.M)
_MOVED = re.compile(r"^weights moved ([0-9.e+-]+)$", re.M)

DDP = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
mixed_precision: 'no'
num_machines: 1
num_processes: 2
machine_rank: 0
rdzv_backend: static
same_network: true
use_cpu: false
"""
FSDP2 = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_version: 2
mixed_precision: 'no'
num_machines: 1
num_processes: 2
machine_rank: 0
rdzv_backend: static
same_network: true
use_cpu: false
"""


@pytest.fixture(scope="module")
def where(tmp_path_factory) -> Path:
    """A folder with the corpus, the SFT data, the tiny Llama and accelerate's configs."""
    root = tmp_path_factory.mktemp("hf")
    sys.path.insert(0, str(JOBS))
    try:
        import assets
    finally:
        sys.path.remove(str(JOBS))
    assets.write(root)
    assets.tiny_llama(root)
    (root / "ddp.yaml").write_text(DDP)
    (root / "fsdp2.yaml").write_text(FSDP2)
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(where: Path, device: str) -> dict[str, str]:
    env = with_repo_on_path(REPO, TRNSIM_PROGRESS="0", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                            HF_HOME=str(where / "hf_home"), TOKENIZERS_PARALLELISM="false")
    if device == "cpu":
        env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", ACCELERATE_USE_CPU="true")
    return env


def _on_cpu(cmd: list[str], env: dict[str, str], cwd: Path, done: str) -> subprocess.CompletedProcess:
    """Run the CPU reference; once ``done`` is in its output, it has EXIT_GRACE_S seconds to
    exit before it is killed (gloo's hang at exit), which counts as a clean exit, as does an
    abort in gloo's teardown after ``done`` (see the module docstring)."""
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:
        proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr, text=True, env=env, cwd=cwd, start_new_session=True)
        deadline, finished = time.monotonic() + TIMEOUT_S, None
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if finished is None:
                    fout.seek(0)
                    if done in fout.read():
                        finished = time.monotonic()
                        deadline = min(deadline, finished + EXIT_GRACE_S)
                time.sleep(0.2)
            code = proc.poll()
            if code is None:
                kill_session(proc)
                proc.wait()
                if finished is None:
                    fout.seek(0), ferr.seek(0)
                    pytest.fail(f"{' '.join(cmd)} ran past {TIMEOUT_S} s\n{fout.read()[-3000:]}\n{ferr.read()[-3000:]}")
                what = " ".join(Path(c).name if c.startswith("/") else c for c in cmd[:6])
                warnings.warn(f"the CPU reference ({what} ...) had not exited {EXIT_GRACE_S} s after "
                              "its results (gloo's hang at exit, pytorch/pytorch#56297): killed", stacklevel=2)
                code = 0
        finally:
            kill_session(proc)
        fout.seek(0), ferr.seek(0)
        out, err = fout.read(), ferr.read()
    if code != 0 and done in out and _TEARDOWN_ABORT in out + err:
        what = " ".join(Path(c).name if c.startswith("/") else c for c in cmd[:6])
        warnings.warn(f"the CPU reference ({what} ...) aborted in gloo's teardown after its results "
                      f"(exit {code}, pytorch/pytorch#56297): counted as done", stacklevel=2)
        code = 0
    return subprocess.CompletedProcess(cmd, code, out, err)


def launch(where: Path, device: str, cmd: list[str], done: str) -> str:
    """Run ``cmd`` in ``where`` on ``device`` (``neuron`` or ``cpu``); its output, after
    checking that it succeeded."""
    env = _env(where, device)
    if device == "cpu":
        r = _on_cpu(cmd, env, where, done)
    else:
        r = run_session(cmd, timeout=TIMEOUT_S, env=env, cwd=where)
    log = r.stdout + r.stderr
    assert r.returncode == 0 and done in r.stdout, f"{' '.join(cmd)} on {device}: exit {r.returncode}\n{log[-6000:]}"
    return log


def losses(log: str) -> dict[int, float]:
    got: dict[int, float] = {}
    for step, loss in _STEP.findall(log):
        got.setdefault(int(step), float(loss))
    assert sorted(got) == list(range(1, STEPS + 1)), f"steps logged {sorted(got)}\n{log[-4000:]}"
    return got


def same(what: str, got: dict[int, float], want: dict[int, float]) -> None:
    bad = {s: (got[s], want[s]) for s in want if abs(got[s] - want[s]) > RTOL * abs(want[s])}
    assert not bad, f"{what}: losses (neuron, CPU) differ at steps {bad}"
    assert want[STEPS] < want[1], f"{what}: the CPU's run did not train ({want})"


def moved_alike(what: str, got: float, want: float) -> None:
    assert want > 0, f"{what}: no weight moved on the CPU"
    assert abs(got - want) <= RTOL * want, f"{what}: weights moved {got} on neuron, {want} on the CPU"


def clm(where: Path, device: str, launcher: list[str], name: str) -> dict[int, float]:
    cmd = [*launcher, str(JOBS / "hf_clm_trainer.py"), "--model_name_or_path", str(where / "tiny_llama"),
           "--train_file", str(where / "train.txt"), "--block_size", "64", *TRAINER,
           "--output_dir", str(where / f"{name}_{device}")]
    return losses(launch(where, device, cmd, "train perplexity"))


def no_trainer(where: Path, device: str, launcher: list[str]) -> tuple[dict[int, float], float]:
    cmd = [*launcher, str(JOBS / "hf_no_trainer.py"), "--model_name_or_path", str(where / "tiny_llama"),
           "--train_file", str(where / "train.txt"), "--block_size", "64", *COMMON,
           "--max_train_steps", str(STEPS)]
    log = launch(where, device, cmd, "weights moved")
    return losses(log), float(_MOVED.search(log).group(1))


def trl_sft(where: Path, device: str, config: str, name: str, *extra: str) -> tuple[dict[int, float], float]:
    out = where / f"{name}_{device}"
    cmd = [str(BIN / "trl"), "sft", "--accelerate_config", str(where / config),
           "--main_process_port", str(_free_port()),
           "--model_name_or_path", str(where / "tiny_llama"), "--dataset_name", str(where / "sft"),
           "--max_length", "128", "--bf16", "false", *TRAINER, "--save_strategy", "steps", "--save_steps", str(STEPS),
           *extra, "--output_dir", str(out)]
    launch(where, device, cmd, "Model saved to")
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    from safetensors.torch import load_file

    before, after = load_file(where / "tiny_llama" / "model.safetensors"), load_file(out / "model.safetensors")
    moved = sum((after[k] - before[k]).abs().sum().item() for k in before)
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}, moved


_ABORTS = "import os, sys; print({!r}, flush=True); sys.stderr.write({!r}); sys.stderr.flush(); os.abort()"


def test_cpu_reference_aborting_in_teardown_after_its_results_counts_as_done(tmp_path):
    cmd = [sys.executable, "-c", _ABORTS.format("train perplexity 1.0", _TEARDOWN_ABORT + "\n")]
    with pytest.warns(UserWarning, match="aborted in gloo's teardown"):
        r = _on_cpu(cmd, dict(os.environ), tmp_path, "train perplexity")
    assert r.returncode == 0 and "train perplexity 1.0" in r.stdout


@pytest.mark.parametrize("printed, stderr", [("step 1 loss 6.0", _TEARDOWN_ABORT),
                                             ("train perplexity 1.0", "Segmentation fault")])
def test_cpu_reference_aborting_before_its_results_or_otherwise_fails(tmp_path, printed, stderr):
    cmd = [sys.executable, "-c", _ABORTS.format(printed, stderr + "\n")]
    assert _on_cpu(cmd, dict(os.environ), tmp_path, "train perplexity").returncode != 0


def test_run_clm_trainer_under_torchrun_trains_as_on_the_cpu(where):
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
    same("run_clm Trainer, torchrun 2 processes", clm(where, "neuron", torchrun, "clm_torchrun"),
         clm(where, "cpu", torchrun, "clm_torchrun"))


def test_run_clm_trainer_under_accelerate_launch_trains_as_on_the_cpu(where):
    port = str(_free_port())
    launcher = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", port]
    same("run_clm Trainer, accelerate launch 2 processes", clm(where, "neuron", launcher, "clm_accelerate"),
         clm(where, "cpu", launcher, "clm_accelerate"))


def test_no_trainer_loop_under_torchrun_trains_as_on_the_cpu(where):
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
    (got, got_moved), (want, want_moved) = no_trainer(where, "neuron", torchrun), no_trainer(where, "cpu", torchrun)
    same("no-trainer loop, torchrun 2 processes", got, want)
    moved_alike("no-trainer loop, torchrun 2 processes", got_moved, want_moved)


def test_no_trainer_loop_under_accelerate_launch_on_one_process_trains_as_on_the_cpu(where):
    """One process, no --multi_gpu: the optimizer holds the parameters from before
    ``accelerator.prepare`` moved the model, and must update the moved ones."""
    launcher = [str(BIN / "accelerate"), "launch", "--num_processes", "1"]
    got, got_moved = no_trainer(where, "neuron", launcher)
    want, want_moved = no_trainer(where, "cpu", [*launcher[:2], "--cpu", *launcher[2:]])
    same("no-trainer loop, accelerate launch 1 process", got, want)
    moved_alike("no-trainer loop, accelerate launch 1 process", got_moved, want_moved)


def test_trl_sft_with_ddp_trains_as_on_the_cpu(where):
    # TRL loads the model with device_map="auto" except where accelerate's distributed
    # type is MULTI_GPU or DEEPSPEED (sft_trainer.py), so on any other accelerator
    # (MULTI_NEURON here, MULTI_XPU, MULTI_NPU, ...) each rank would dispatch the model
    # over the host's devices and accelerate then refuses to train it in a distributed
    # mode; its users pass device_map None, as TRL does for CUDA.
    no_device_map = ["--model_init_kwargs", '{"device_map": null}']
    (got, got_moved), (want, want_moved) = (trl_sft(where, "neuron", "ddp.yaml", "sft_ddp", *no_device_map),
                                            trl_sft(where, "cpu", "ddp.yaml", "sft_ddp", *no_device_map))
    same("trl sft, DDP 2 processes", got, want)
    moved_alike("trl sft, DDP 2 processes", got_moved, want_moved)


def test_trl_sft_with_fsdp2_trains_as_ddp_on_the_cpu(where):
    """FSDP2 on neuron; on the CPU accelerate makes the same config DDP (module docstring)."""
    (got, got_moved), (want, want_moved) = (trl_sft(where, "neuron", "fsdp2.yaml", "sft_fsdp2"),
                                            trl_sft(where, "cpu", "fsdp2.yaml", "sft_fsdp2"))
    same("trl sft, FSDP2 2 processes (CPU: DDP)", got, want)
    moved_alike("trl sft, FSDP2 2 processes (CPU: DDP)", got_moved, want_moved)
