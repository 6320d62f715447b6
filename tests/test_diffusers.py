"""Hugging Face diffusers on the ``neuron`` device: the tiny FLUX and UNet pipelines of
examples/diffusers_pipeline.py, text encoders on the CPU, denoiser and VAE on the device,
eager and compiled with backend "neuron", and the FLUX transformer tensor parallel on 2
ranks (tests/dist_jobs/diffusers_tp.py). Each gives the CPU pipeline's image."""

import importlib.util
import pathlib

import pytest
import torch
from torch._dynamo.utils import counters

import trnsim
from tests.test_distributed_parallel import check_job

for _name in ("diffusers", "transformers"):
    pytest.importorskip(_name, reason=f"{_name} is not installed: install trnsim's test extra (pip install -e .[test])")

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "diffusers_pipeline.py"
STEPS = 2
TOL = 1e-5   # fp32 on both sides; the device runs PyTorch's CPU kernels in "op" fidelity


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("diffusers_pipeline", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def on_device(example, kind: str, compiled: bool):
    """The pipeline's image with its denoiser and VAE on ``neuron``, and the profile of the call."""
    pipe = example.tiny_flux_pipeline() if kind == "flux" else example.tiny_sd_pipeline()
    name = "transformer" if kind == "flux" else "unet"
    getattr(pipe, name).to("neuron")
    pipe.vae.to("neuron")
    if compiled:
        setattr(pipe, name, torch.compile(getattr(pipe, name), backend="neuron"))
    with trnsim.profile() as prof:
        image = example.generate(pipe, STEPS)
    assert pipe.text_encoder.device.type == "cpu" and pipe.vae.device.type == "neuron"
    return image, prof


@pytest.mark.parametrize("kind", ["flux", "sd"])
def test_pipeline_on_neuron_gives_the_cpus_image_eager_and_compiled(example, kind):
    cpu = example.generate(example.tiny_flux_pipeline() if kind == "flux" else example.tiny_sd_pipeline(), STEPS)
    assert cpu.shape == (32, 32, 3) and cpu.std() > 0.01   # a real image, not a constant

    eager, eager_prof = on_device(example, kind, compiled=False)
    assert abs(eager - cpu).max() <= TOL
    ops = {r.name for r in eager_prof.records}
    # the denoiser's attention, the VAE's convolutions and group norms ran on the device
    assert {"aten::_scaled_dot_product_fused_attention_overrideable", "aten::convolution_overrideable",
            "aten::native_group_norm"} <= ops

    torch._dynamo.reset()
    counters.clear()
    compiled, compiled_prof = on_device(example, kind, compiled=True)
    assert abs(compiled - cpu).max() <= TOL
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1          # one graph, reused by every step
    assert any(r.name.startswith("fused[") for r in compiled_prof.records)
    assert compiled_prof.device_ps < eager_prof.device_ps   # fusion keeps intermediates in SBUF


def test_a_bfloat16_flux_pipeline_gives_the_cpus_bfloat16_image(example):
    def bf16():
        pipe = example.tiny_flux_pipeline()
        pipe.to(torch.bfloat16)   # every model; the text encoders stay on the CPU
        return pipe

    cpu = example.generate(bf16(), STEPS)
    pipe = bf16()
    pipe.transformer.to("neuron")
    pipe.vae.to("neuron")
    assert pipe.transformer.dtype == torch.bfloat16
    assert abs(example.generate(pipe, STEPS) - cpu).max() == 0   # op fidelity: the CPU's bf16 kernels


def test_example_main_reports_the_image(example, capsys):
    result = example.main("flux", steps=1)
    out = capsys.readouterr().out
    assert "FluxPipeline: transformer on neuron:0 (eager), VAE on neuron:0, text encoder on cpu" in out
    assert f"sha256 {example.checksum(result['reference'])}" in out
    assert result["gap"] <= TOL


def test_flux_transformer_tensor_parallel_on_2_ranks():
    out = check_job("diffusers_tp.py", 2)
    assert "collectives" in out
