"""Hub kernels (the ``kernels`` library) on ``neuron``: the example repository
``examples/hub_kernels/llama-nki`` (noarch ``torch-neuron`` build, NKI kernels) loaded
locally, ``kernelize`` on a tiny Llama, transformers' ``use_kernels=True`` with a
``KernelConfig`` keyed ``"neuron"``, the kernels in ``trnsim.profile`` and under
``torch.compile``."""

import importlib.util
import logging
import pathlib

import pytest
import torch

pytest.importorskip("kernels", reason="the hub-kernel tests need the `kernels` library (pip install 'kernels>=0.18.2')")

import kernels
from kernels import Mode, get_local_kernel

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load_example():
    spec = importlib.util.spec_from_file_location("example_hub_kernel", EXAMPLES / "hub_kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _load_example()


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """Offline, quiet, and no class of transformers left registered or patched afterwards."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    logging.getLogger("kernels").setLevel(logging.ERROR)
    yield
    for attr in ("kernel_layer_name", "kernel_condition"):
        if attr in LlamaMLP.__dict__:
            delattr(LlamaMLP, attr)
    from transformers import monkey_patching

    if "LlamaMLP" in monkey_patching.get_patch_mapping():
        monkey_patching.unregister_patch_mapping(["LlamaMLP"])


def _ids() -> torch.Tensor:
    return torch.arange(16).reshape(1, 16).to("neuron")


def test_kernels_selects_the_neuron_build():
    from kernels.backends import _backend

    assert _backend().variant_str == "neuron"   # torch.neuron exists
    module = get_local_kernel(example.KERNEL_REPO)
    assert pathlib.Path(module.__file__).parent.parent.name == "torch-neuron"
    assert {"RMSNorm", "SwiGLUMLP", "SwiGLUMLPLayout"} <= set(vars(module.layers))
    import sys

    import nki
    from trnsim.nki.jit import Kernel

    assert nki is sys.modules["trnsim.nki"]   # the kernel's `import nki` is trnsim's NKI
    assert isinstance(module.nki_rms_norm, Kernel) and isinstance(module.nki_swiglu_mlp, Kernel)


def test_ops_match_torch_on_neuron():
    module = get_local_kernel(example.KERNEL_REPO)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 100, 192, generator=g)
    w = torch.randn(192, generator=g)
    wg, wu = torch.randn(320, 192, generator=g) * 0.1, torch.randn(320, 192, generator=g) * 0.1
    wd = torch.randn(192, 320, generator=g) * 0.1
    ref_norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    ref_mlp = (torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)) @ wd.T
    dev = [t.to("neuron") for t in (x, w, wg, wu, wd)]
    norm = module.rms_norm(dev[0], dev[1], 1e-6)
    mlp = module.swiglu_mlp(dev[0], *dev[2:])
    assert norm.device.type == "neuron" and norm.shape == x.shape
    torch.testing.assert_close(norm.cpu(), ref_norm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mlp.cpu(), ref_mlp, rtol=1e-4, atol=1e-4)
    half = [t.bfloat16() for t in dev]
    norm_bf16, mlp_bf16 = module.rms_norm(half[0], half[1], 1e-6), module.swiglu_mlp(half[0], *half[2:])
    assert norm_bf16.dtype == mlp_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(norm_bf16.cpu().float(), ref_norm, rtol=2e-2, atol=2e-2)
    xr, wgr, wur, wdr = (t.bfloat16().float() for t in (x, wg, wu, wd))   # the inputs as the kernel reads them
    ref_mlp_bf16 = (torch.nn.functional.silu(xr @ wgr.T) * (xr @ wur.T)) @ wdr.T
    torch.testing.assert_close(mlp_bf16.cpu().float(), ref_mlp_bf16, rtol=2e-2, atol=2e-2)


def test_kernelize_replaces_rmsnorm_and_mlp_with_equal_outputs():
    plain = example.tiny_llama().to("neuron")
    model = example.kernelize_llama(example.tiny_llama().to("neuron"))
    layer = model.model.layers[0]
    assert model.model.norm.forward.__qualname__ == "RMSNorm.forward"
    assert layer.input_layernorm.forward.__qualname__ == "RMSNorm.forward"
    assert layer.mlp.forward.__qualname__ == "SwiGLUMLP.forward"
    with torch.no_grad():
        torch.testing.assert_close(model(_ids()).logits.cpu(), plain(_ids()).logits.cpu(), rtol=1e-5, atol=1e-5)


def test_profile_names_the_kernels_and_their_saving():
    plain = example.tiny_llama().to("neuron")
    model = example.kernelize_llama(example.tiny_llama().to("neuron"))
    rows = {r["layer"]: r for r in example.layer_costs(plain, model, _ids())}
    norm, mlp = rows["RMSNorm"], rows["MLP"]
    assert norm["kernel"] == ["nki_rms_norm"] and mlp["kernel"] == ["nki_swiglu_mlp"]
    # fp32: the .to(float32) and .to(input_dtype) casts are no-ops
    assert norm["ops"] == ["aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::add.Tensor", "aten::rsqrt",
                           "aten::mul.Tensor", "aten::mul.Tensor"]
    assert mlp["ops"] == ["aten::mm", "aten::silu", "aten::mm", "aten::mul.Tensor", "aten::mm"]
    assert (norm["ops_ps"], norm["kernel_ps"]) == (19_295_221, 4_587_086)
    assert (mlp["ops_ps"], mlp["kernel_ps"]) == (20_293_205, 5_943_962)
    prof = example.profile_call(lambda: model(_ids()))
    summary = {r.name: r for r in prof.summary()}
    assert summary["nki_rms_norm"].calls == 5 and summary["nki_swiglu_mlp"].calls == 2
    assert summary["nki_swiglu_mlp"].source == "kernel" and summary["nki_swiglu_mlp"].kernel == "nki_swiglu_mlp"
    assert "aten::rsqrt" not in summary and "aten::silu" not in summary


def test_training_mode_keeps_the_original_forward():
    # the layers are forward only (has_backward = False): kernelize falls back in training
    model = example.kernelize_llama(example.tiny_llama().to("neuron"), mode=Mode.TRAINING)
    assert model.model.norm.forward.__qualname__ == "LlamaRMSNorm.forward"
    assert model.model.layers[0].mlp.forward.__qualname__ == "LlamaMLP.forward"


def test_compiled_with_kernels_is_one_graph_with_the_kernels_in_it():
    torch._dynamo.reset()
    plain = example.tiny_llama().to("neuron")
    model = example.kernelize_llama(example.tiny_llama().to("neuron"), mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(_ids()).logits.cpu(), plain(_ids()).logits.cpu(), rtol=1e-5, atol=1e-5)
    prof = example.profile_call(lambda: compiled(_ids()))
    names = [r.name for r in prof.records]
    assert names.count("nki_rms_norm") == 5 and names.count("nki_swiglu_mlp") == 2
    torch._dynamo.reset()


def _transformers_takes_kernels() -> bool:
    from transformers.utils.import_utils import is_kernels_available

    return is_kernels_available()


@pytest.mark.skipif(not _transformers_takes_kernels(),
                    reason=f"this transformers does not accept kernels {kernels.__version__} (transformers 5.24 needs "
                           "kernels>=0.18.2,<0.19) and turns use_kernels off")
def test_from_pretrained_use_kernels_with_a_neuron_kernel_config(tmp_path):
    example.tiny_llama().save_pretrained(tmp_path)
    plain = example.tiny_llama().to("neuron")
    model = example.from_pretrained_with_kernels(str(tmp_path))
    assert model.device.type == "neuron"
    assert model.model.norm.forward.__qualname__ == "RMSNorm.forward"
    assert type(model.model.layers[0].mlp).__name__ == "SwiGLUMLPLayout"
    assert model.model.layers[0].mlp.forward.__qualname__ == "SwiGLUMLP.forward"
    with torch.no_grad():
        torch.testing.assert_close(model(_ids()).logits.cpu(), plain(_ids()).logits.cpu(), rtol=1e-5, atol=1e-5)
