"""torchtitan's own entry point (``python -m torchtitan.train``) on the CPU with gloo, the
reference for the runs on ``neuron``: torchtitan takes CUDA when it finds no
accelerator, so this points its device at the CPU before it loads, with the few device
functions its memory monitor calls (``torch.cpu`` lacks them). Its ``torch.compile``
calls take the ``aot_eager`` backend, so FlexAttention runs in its dense form (Inductor
has no FlexAttention backward on the CPU; the dense form is what trnsim computes the
``neuron`` run's values with), and FlexAttention's argument check that refuses a
backward on the CPU is lifted: the dense form has one. ``torch.distributed.set_timeout``,
which torchtitan 0.3 takes from PyTorch 2.14, is given as trnsim gives it on 2.13. FSDP
reduces gradients with a plain sum and a division after it (``PREMUL_SUM``, which it
otherwise asks for, is a reduction gloo lacks; torchtitan's divide factor is 1, so both
give the same numbers).
Run it as torchtitan runs (``torchrun ... titan_cpu.py --module llama3 ...``) with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, so that no ``neuron`` device is there."""

import runpy
import types

import torch
import torch.distributed.fsdp._fully_shard._fsdp_collectives as fsdp_collectives
import torch.nn.attention.flex_attention as flex
from torch.distributed.distributed_c10d import _set_pg_timeout

compile_ = torch.compile
torch.compile = lambda fn=None, **kw: compile_(fn, backend="aot_eager", dynamic=kw.get("dynamic"),
                                              fullgraph=kw.get("fullgraph", False))
import torchtitan.tools.utils as utils  # noqa: E402  (after torch.compile is set: it compiles at import)

cpu = types.SimpleNamespace(**{n: getattr(torch.cpu, n) for n in dir(torch.cpu) if not n.startswith("__")})
cpu.current_device = lambda: 0
cpu.get_device_name = lambda device=None: "cpu"
cpu.get_device_properties = lambda device=None: types.SimpleNamespace(name="cpu", total_memory=1 << 40)
cpu.memory_stats = lambda device=None: {}
cpu.reset_peak_memory_stats = cpu.empty_cache = lambda device=None: None
utils.device_type, utils.device_module = "cpu", cpu
flex.__dict__["_validate_device"] = lambda *args: None
# PyTorch 2.14's call, which torchtitan 0.3 makes after its first step (trnsim gives it on 2.13)
torch.distributed.set_timeout = lambda timeout, group=None: _set_pg_timeout(timeout, group)
_divide_factors = fsdp_collectives._get_gradient_divide_factors
fsdp_collectives._get_gradient_divide_factors = (
    lambda rs_group, ar_group, dtype, device_type="", factor=None, force_sum=False:
    _divide_factors(rs_group, ar_group, dtype, device_type, factor, True))
runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
