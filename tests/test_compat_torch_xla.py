"""``torch_xla`` without PyTorch/XLA: the NKI tutorials' ``xm.xla_device()`` is the
``neuron`` device, and libraries that take TPU paths on finding torch_xla do not find it."""

import importlib
import io

import numpy as np
import pytest
import torch

from tests.test_nki_compat import run_python
from trnsim import cli


def test_xla_model_is_the_neuron_device():
    import torch_xla
    import torch_xla.core.xla_model as xm
    from torch_xla.core import xla_model

    assert xm is xla_model is importlib.import_module("trnsim.compat.torch_xla.core.xla_model")
    assert torch_xla is importlib.import_module("trnsim.compat.torch_xla")
    assert xm.xla_device() == torch_xla.device() == torch.device("neuron", 0)
    assert xm.xla_device(3) == torch.device("neuron", 3) and xm.xla_device_hw(xm.xla_device()) == "NEURON"
    assert torch_xla.device_count() == len(torch_xla.devices()) == torch.neuron.device_count()
    x = torch.arange(6.0).to(xm.xla_device()) * 2
    xm.mark_step()
    torch_xla.sync()
    assert x.device.type == "neuron" and x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_replica_functions_without_a_process_group():
    import torch_xla.core.xla_model as xm

    assert (xm.get_ordinal(), xm.get_local_ordinal(), xm.xrt_world_size()) == (0, 0, 1)
    assert xm.is_master_ordinal() and xm.is_master_ordinal(local=False)
    assert xm.rendezvous("t", b"me") == [b"me"]
    assert xm.mesh_reduce("acc", 3.0, np.mean) == 3.0
    out = io.StringIO()
    xm.master_print("epoch", 1, fd=out)
    assert out.getvalue() == "epoch 1\n"


def test_optimizer_step_steps():
    import torch_xla.core.xla_model as xm

    w = torch.nn.Parameter(torch.ones(3, device=xm.xla_device()))
    (w * torch.tensor([1.0, 2.0, 3.0], device=xm.xla_device())).sum().backward()
    xm.optimizer_step(torch.optim.SGD([w], lr=0.5), barrier=True)
    assert w.detach().cpu().tolist() == [0.5, 0.0, -0.5]


def test_rng_state_is_an_int_seed():
    import torch_xla.core.xla_model as xm

    xm.set_rng_state(1234)
    assert xm.get_rng_state() == 1234
    a = torch.rand(4, device=xm.xla_device()).cpu()
    xm.set_rng_state(1234)
    assert torch.equal(a, torch.rand(4, device=xm.xla_device()).cpu())


def test_tutorial_style_kernel_on_xla_tensors():
    """As the tutorials' ``*_torch.py`` scripts do: tensors moved to ``xm.xla_device()``,
    an ``@nki.jit`` kernel called on them, results compared on the device."""
    import nki
    import nki.isa as nisa
    import nki.language as nl
    import torch_xla.core.xla_model as xm

    @nki.jit
    def add_kernel(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ta = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        tb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a)
        nisa.dma_copy(dst=tb, src=b)
        nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
        nisa.dma_copy(dst=out, src=ta)
        return out

    device = xm.xla_device()
    a = torch.rand((128, 64), dtype=torch.bfloat16).to(device=device)
    b = torch.rand((128, 64), dtype=torch.bfloat16).to(device=device)
    out = add_kernel(a, b)
    xm.mark_step()
    assert out.device.type == "neuron" and torch.allclose(out, a + b, atol=1e-4, rtol=1e-2)


def test_uint32_tensors_reach_a_kernel_as_uint32():
    """The MX tutorial hands packed data to its kernels as torch.uint32 tensors."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def copy_kernel(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=out, src=t)
        return out

    bits = torch.tensor([[0, 1, 0xFFFFFFFF, 0x80000000]], dtype=torch.uint32)
    out = copy_kernel(bits.to("neuron"))
    assert out.dtype == torch.uint32 and torch.equal(out.cpu(), bits)


def test_hugging_face_does_not_see_it(tmp_path):
    """transformers, accelerate and peft take their TPU code paths when they find
    torch_xla; the alias is hidden from them, in either import order, while a script's
    own ``import torch_xla`` still gets it."""
    r = run_python("import transformers, torch\n"
                   "from transformers.utils import import_utils\n"
                   "assert not import_utils.is_torch_xla_available()\n"
                   "assert not import_utils.is_torch_neuroncore_available()\n"
                   "import accelerate.utils.imports as ai\n"
                   "assert not ai.is_torch_xla_available()\n"
                   "from peft.import_utils import is_torch_tpu_available\n"
                   "assert not is_torch_tpu_available()\n"
                   "import torch_xla.core.xla_model as xm\n"
                   "print(xm.xla_device())", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "neuron:0"


def test_a_script_that_imports_it_first_still_trains_with_hugging_face(tmp_path):
    """Once a script's ``import torch_xla`` put the alias in sys.modules, transformers and
    accelerate imported after it stay off their XLA paths (USE_TORCH_XLA=0)."""
    r = run_python("import os, torch\n"
                   "import transformers\n"
                   "import torch_xla.core.xla_model as xm\n"
                   "from transformers import TrainingArguments\n"
                   "from transformers.utils import import_utils\n"
                   "assert not import_utils.is_torch_xla_available()\n"
                   "import accelerate.utils.imports as ai\n"
                   "assert not ai.is_torch_xla_available()\n"
                   "print(os.environ['USE_TORCH_XLA'], xm.xla_device())", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0 neuron:0"


def test_doctor_lists_it(capsys):
    assert cli.main(["doctor"]) == 0
    assert "torch_xla      aliased to trnsim.compat.torch_xla" in capsys.readouterr().out


@pytest.mark.parametrize("fn", ["xla_device", "mark_step", "get_ordinal", "xrt_world_size", "optimizer_step"])
def test_documented(fn):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "nki_compat.md").read_text()
    assert f"`{fn}" in doc
