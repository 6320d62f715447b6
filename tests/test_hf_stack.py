"""Hugging Face's stack on the ``neuron`` device with no flags: detection, bf16, device_map,
torch_compile, and the Trainer, PEFT and TRL examples under examples/ at tiny sizes."""

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import torch

for _name in ("transformers", "accelerate", "peft", "trl", "datasets"):
    pytest.importorskip(_name, reason=f"{_name} is not installed: install trnsim's test extra (pip install -e .[test])")

from safetensors.torch import load_file  # noqa: E402 - safetensors comes with transformers, checked for above

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
DEVICE_FLAGS = ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION")


@pytest.fixture(autouse=True)
def _no_flags(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for flag in DEVICE_FLAGS:
        monkeypatch.delenv(flag, raising=False)


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_transformers_and_accelerate_find_neuron():
    from accelerate import Accelerator
    from accelerate.utils import get_torch_accelerator_backend, is_neuron_available
    from transformers import TrainingArguments
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_neuron_available

    assert importlib.util.find_spec("torch_neuronx") is not None
    assert is_torch_neuron_available() and is_neuron_available() and is_torch_bf16_gpu_available()
    assert get_torch_accelerator_backend() == ("neuron", torch.neuron)
    args = TrainingArguments(output_dir="unused", bf16=True, torch_compile=True, report_to=[])
    assert args.device == torch.device("neuron:0")
    assert (args.torch_compile_backend, args.optim.value) == ("neuron", "adamw_torch_fused")
    accelerator = Accelerator(mixed_precision="bf16")
    assert (accelerator.device.type, accelerator.mixed_precision) == ("neuron", "bf16")
    with accelerator.autocast():
        x = torch.ones(4, 4, device="neuron")
        assert (x @ x).dtype == torch.bfloat16


def test_a_script_that_never_names_trnsim_gets_neuron():
    # PyTorch's backend autoload imports trnsim, which puts torch_neuronx where transformers looks
    script = ("from transformers import TrainingArguments; import sys; "
              "args = TrainingArguments(output_dir='unused', bf16=True, report_to=[]); "
              "print(args.device, args.bf16, 'trnsim' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in DEVICE_FLAGS}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["neuron:0", "True", "True"]


def test_every_torch_neuron_function_hf_calls_exists():
    props = torch.neuron.get_device_properties(0)
    assert props.name == torch.neuron.chip().name and props.total_memory > 0
    assert torch.neuron.get_device_name(0) == "neuron:0"
    free, total = torch.neuron.mem_get_info(0)
    assert total == props.total_memory and 0 < free <= total
    states = torch.neuron.get_rng_state_all()
    torch.neuron.manual_seed_all(3)
    first = torch.rand(4, device="neuron").cpu()
    torch.neuron.set_rng_state_all(states)
    torch.neuron.manual_seed_all(3)
    assert torch.equal(torch.rand(4, device="neuron").cpu(), first)
    for name in ("empty_cache", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
                 "memory_reserved", "synchronize", "is_bf16_supported", "get_amp_supported_dtype",
                 "device_count", "current_device", "set_device", "is_initialized", "_is_in_bad_fork"):
        assert callable(getattr(torch.neuron, name)), name


def test_accelerate_and_trl_environment_reports_show_the_chip(capsys):
    from accelerate.commands.env import env_command
    from trl.scripts.env import print_env

    env_command(argparse.Namespace(config_file=None))
    print_env()
    out = capsys.readouterr().out
    assert "PyTorch accelerator: NEURON" in out and "NEURON type: neuron:0" in out
    assert f"accelerator(s): {torch.neuron.chip().name}" in out


def test_device_map_auto_plans_for_the_device_hbm(tmp_path):
    from accelerate.utils import get_max_memory
    from transformers import AutoModelForCausalLM

    trainer_example = load_example("hf_trainer")
    trainer_example.tiny_llama().save_pretrained(tmp_path)
    planned = get_max_memory()[0]   # the device's free HBM, less the probe tensor accelerate places on it
    free, total = torch.neuron.mem_get_info(0)
    assert free - 64 <= planned <= free and total == torch.neuron.get_device_properties(0).total_memory
    probe = torch.arange(16).reshape(1, 16)
    with torch.no_grad():
        on_cpu = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="cpu")(probe).logits
        whole = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto")
        assert {p.device.type for p in whole.parameters()} == {"neuron"}
        assert torch.equal(whole(probe.to("neuron")).logits.cpu(), on_cpu)
        # an HBM budget smaller than the model: the planner puts what fits on the device, the rest on the CPU
        split = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto",
                                                     max_memory={0: 250_000, "cpu": 10**9})
        # (offloaded weights wait in CPU memory behind accelerate's hooks, their parameters on "meta")
        assert {p.device.type for p in split.parameters()} == {"neuron", "meta"}
        assert torch.allclose(split(probe).logits.cpu(), on_cpu, atol=1e-6)


def test_static_cache_generation_auto_compiles_with_the_neuron_backend():
    model = load_example("hf_trainer").tiny_llama().eval()
    prompt = torch.arange(8).reshape(1, 8)
    on_cpu = model.generate(prompt, max_new_tokens=6, do_sample=False, cache_implementation="static")
    torch.neuron.reset_dynamo_metrics()
    on_device = model.to("neuron").generate(prompt.to("neuron"), max_new_tokens=6, do_sample=False,
                                            cache_implementation="static")
    assert on_device.cpu().tolist() == on_cpu.tolist()
    assert len(torch.neuron.get_dynamo_metrics()) == 1   # the decode step, compiled once


def test_trainer_example_trains_evaluates_and_saves_a_cpu_loadable_checkpoint(tmp_path):
    import trnsim

    with trnsim.profile() as prof:
        result = load_example("hf_trainer").main(str(tmp_path))
    assert (result["device"], result["steps"]) == ("neuron:0", 3)
    timed_by = {row.name: row.kernel for row in prof.summary()}
    # the default optimizer is one fused kernel per step on the device, attention the flash kernels
    assert timed_by["aten::_fused_adamw_"].startswith("fused_adamw_kernel")
    assert timed_by["aten::_scaled_dot_product_fused_attention_overrideable_backward"] == "flash_attention_bwd"
    assert result["eval_loss"] == pytest.approx(4.86, abs=0.05)
    weights = load_file(os.path.join(result["checkpoint"], "model.safetensors"), device="cpu")
    assert {t.device.type for t in weights.values()} == {"cpu"}
    assert result["logit_gap"] == 0.0


def test_trainer_torch_compile_uses_the_neuron_backend(tmp_path):
    from transformers import Trainer, TrainingArguments

    example = load_example("hf_trainer")
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, bf16=True,
                             torch_compile=True, save_strategy="no", report_to=[], seed=0)
    torch.neuron.reset_dynamo_metrics()
    trainer = Trainer(model=example.tiny_llama(), args=args, train_dataset=example.token_dataset(8, 16, 1))
    loss = trainer.train().training_loss
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule"
    assert len(torch.neuron.get_dynamo_metrics()) >= 1
    assert loss == pytest.approx(4.84, abs=0.05)


def test_peft_lora_adapter_loaded_on_cpu_reproduces_the_device(tmp_path):
    result = load_example("hf_peft_lora").main(str(tmp_path))
    assert (result["device"], result["steps"]) == ("neuron:0", 3)
    assert os.path.isfile(os.path.join(result["adapter"], "adapter_model.safetensors"))
    assert result["logit_gap"] == 0.0


def test_trl_sft_with_lora_pads_to_128_and_matches_the_cpu(tmp_path):
    result = load_example("trl_sft").main(str(tmp_path))
    assert (result["device"], result["bf16"], result["steps"]) == ("neuron:0", True, 3)
    assert result["padded_shape"] == (4, 128)
    assert result["loss_device"] == pytest.approx(result["loss_cpu"], abs=1e-6)
    assert result["loss_device"] == pytest.approx(result["loss_unpadded"], abs=1e-5)
    assert result["logit_gap"] == 0.0


def test_trl_dpo_trains_with_a_reference_model_on_the_device(tmp_path):
    result = load_example("trl_dpo").main(str(tmp_path))
    assert (result["device"], result["ref_device"], result["steps"]) == ("neuron:0", "neuron:0", 3)
    assert result["margins"][0] == 0.0 and len(result["margins"]) == 3
    assert result["loss"] == pytest.approx(0.6967, abs=1e-3)


@pytest.mark.parametrize("device", ["neuron", "neuron:0", torch.device("neuron")])
def test_safetensors_loads_onto_neuron_as_peft_asks_it_to(device, tmp_path):
    """PEFT loads an adapter with ``load_file(path, device=<current accelerator>)``;
    safetensors' reader does not know ``neuron``, so trnsim reads on the host and moves
    each tensor, bit for bit; other devices are safetensors' own."""
    from safetensors.torch import save_file

    saved = {"w": torch.randn(3, 5), "b": torch.randn(5).to(torch.bfloat16)}
    path = tmp_path / "adapter.safetensors"
    save_file(saved, str(path))
    loaded = load_file(str(path), device=device)
    for name, t in saved.items():
        assert loaded[name].device.type == "neuron" and loaded[name].dtype == t.dtype
        assert torch.equal(loaded[name].cpu(), t)
    assert load_file(str(path))["w"].device.type == "cpu"
