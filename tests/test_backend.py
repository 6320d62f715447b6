"""The ``neuron`` PyTorch device: registration, torch.neuron, HBM storage, op semantics,
timeline, fidelities, what training scripts touch, and profiling."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import trnsim
from trnsim.backend import state, timeline

DEV = "neuron"


def _py(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


# -- registration -------------------------------------------------------------

def test_autoload_registers_the_device_on_import_torch():
    r = _py("import sys, torch; print(torch.ones(2, device='neuron') + 1); "
            "print(torch.accelerator.current_accelerator()); print('trnsim' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["tensor([2., 2.], device='neuron:0')", "neuron", "True"]


def test_autoload_can_be_turned_off_and_import_trnsim_registers():
    r = _py("import torch; print(torch._C._get_privateuse1_backend_name()); import trnsim; "
            "print(torch._C._get_privateuse1_backend_name(), torch.zeros(1, device='neuron').device)",
            TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["privateuseone", "neuron neuron:0"]


def test_autoload_does_not_load_the_simulator():
    r = _py("import sys, torch; "
            "print(sorted(m for m in ('simpy', 'numba', 'trnsim.isa', 'trnsim.hw.spec', 'torch._dynamo', "
            "'torch._inductor', 'torch.nn.attention.flex_attention') if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    # moving data needs no kernel; filling one (torch.ones) is timed by a kernel and loads the simulator
    r = _py("import sys, torch; torch.empty(1, device='neuron'); torch.ones(1).to('neuron').cpu(); "
            "print(sorted(m for m in ('simpy', 'numba', 'matplotlib', 'trnsim.hw.core') if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_import_torch_leaves_the_cpu_kernels_to_pytorch():
    """Pinned host memory for neuron puts a Python kernel in front of the CPU's ``empty``;
    a process that never uses the device keeps PyTorch's own (CPU ops at full speed), and
    the first device op installs it."""
    code = ("import torch; d = lambda: [l for l in torch._C._dispatch_dump('aten::empty.memory_format')"
            ".splitlines() if l.startswith('CPU:')]; print('hostshims' in str(d())); "
            "torch.ones(1, device='neuron'); print('hostshims' in str(d())); "
            "print(torch.empty(2, pin_memory=True).is_pinned())")
    r = _py(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "True"]


# -- torch.neuron ---------------------------------------------------------------

def test_device_module_mirrors_torch_cuda():
    n = torch.neuron
    # the logical NeuronCores of one trn2.48xlarge (16 chips, 4 logical cores each)
    assert n.is_available() and n.device_count() == 64 and n.current_device() == 0
    n.set_device(0)
    with n.device(0):
        pass
    with pytest.raises(RuntimeError, match="neuron:1 is another NeuronCore"):
        n.set_device(1)
    with pytest.raises(RuntimeError, match="invalid neuron device index 64"):
        n.set_device(64)
    assert n.is_bf16_supported() and torch.bfloat16 in n.get_amp_supported_dtype()
    assert n.chip().name == "trn2"
    free, total = n.mem_get_info()
    assert total == 24 * 2**30 and free == total - n.memory_allocated()
    s = n.Stream(priority=-1)
    assert s.priority == -1
    with n.stream(s):
        assert n.current_stream() is s
    assert n.current_stream() is n.default_stream()


def test_accelerator_current_stream_is_the_device_stream_and_takes_its_events():
    # FSDP2's finalize_backward waits on an all-gather event through torch.accelerator
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        assert torch.accelerator.current_stream() is s
    event = torch.neuron.current_stream().record_event()
    torch.accelerator.current_stream().wait_event(event)
    assert torch.accelerator.current_stream(0) is torch.neuron.default_stream()


def test_device_name_and_properties_name_the_chip_and_its_memory():
    n = torch.neuron
    assert n.get_device_name() == n.get_device_name(torch.device("neuron:0")) == "neuron:0"
    props = n.get_device_properties(0)
    assert (props.name, props.total_memory) == ("trn2", 24 * 2**30)
    # every core of the instance is the same: any of them can be asked about
    assert n.get_device_properties(63) == props and n.get_device_name(5) == "neuron:5"
    with pytest.raises(RuntimeError, match="invalid neuron device index 64"):
        n.get_device_properties(64)


def test_memory_statistics_are_exact_and_freeing_returns_bytes():
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    x = torch.empty(1000, 256, device=DEV)
    assert torch.neuron.memory_allocated() == base + 1000 * 256 * 4
    v = x[10:20].t()
    y = x.view(-1)
    del x
    assert torch.neuron.memory_allocated() == base + 1000 * 256 * 4   # views keep the storage
    del v, y
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.max_memory_allocated() == base + 1000 * 256 * 4
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.current"] == base


def test_exceeding_hbm_raises_oom_and_the_process_stays_usable():
    cap = torch.neuron.mem_get_info()[1]
    with pytest.raises(torch.OutOfMemoryError, match=r"tried to allocate 32\.00 GiB .* of the 24\.00 GiB HBM"):
        torch.empty(cap // 4 + 2**30 * 2, device=DEV)
    big = torch.empty(2**30 // 4, device=DEV)       # 1 GiB fits afterwards
    assert big.numel() == 2**28
    assert torch.neuron.memory_stats()["num_ooms"] >= 1


def test_rng_matches_cpu_after_torch_manual_seed_and_generators():
    torch.manual_seed(7)
    a = torch.randn(5, device=DEV)
    torch.manual_seed(7)
    b = torch.randn(5)
    assert torch.equal(a.cpu(), b)
    g = torch.Generator(device=DEV)
    assert g.device == torch.device("neuron", 0) and isinstance(g, torch.Generator)
    g.manual_seed(3)
    c = torch.rand(4, device=DEV, generator=g)
    assert torch.equal(c.cpu(), torch.rand(4, generator=torch.Generator().manual_seed(3)))
    state_ = torch.neuron.get_rng_state()
    d1 = F.dropout(torch.ones(64, device=DEV), 0.5)
    torch.neuron.set_rng_state(state_)
    d2 = F.dropout(torch.ones(64, device=DEV), 0.5)
    assert torch.equal(d1.cpu(), d2.cpu())


# -- op semantics -------------------------------------------------------------

def test_views_inplace_out_promotion_and_edge_cases():
    x = torch.arange(12.0).reshape(3, 4).to(DEV)
    v = x[1:, ::2]
    v.mul_(-1)
    assert x.cpu()[1].tolist() == [-4.0, 5.0, -6.0, 7.0]
    assert v.is_contiguous() is False and v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    out = torch.empty(0, device=DEV)
    torch.add(x, 1, out=out)                        # out= resized by the kernel
    assert out.shape == (3, 4) and torch.equal(out.cpu(), x.cpu() + 1)
    i = torch.tensor([1, 2], device=DEV)
    assert (i + 0.5).dtype == torch.float32 and (i * 2).dtype == torch.int64
    assert torch.tensor(3.0, device=DEV).item() == 3.0
    e = torch.empty(0, 5, device=DEV)
    assert e.sum(0).cpu().tolist() == [0.0] * 5
    assert (x.t() @ x).cpu().allclose(x.cpu().t() @ x.cpu())
    assert (x + torch.tensor(2.0)).device.type == "neuron"   # a CPU scalar may mix in
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.ones(3, 4)


def test_conv_sdpa_embedding_and_norms_match_cpu():
    torch.manual_seed(0)
    xs = [torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3), torch.randn(2, 2, 16, 8), torch.randn(10, 6),
          torch.randn(4, 6)]
    def run(dev):
        x, w, q, table, h = [t.to(dev).requires_grad_() for t in xs]
        outs = [F.conv2d(x, w, stride=2, padding=1), F.scaled_dot_product_attention(q, q, q, is_causal=True),
                F.embedding(torch.tensor([[1, 3], [9, 0]], device=dev), table), F.layer_norm(h, (6,)),
                F.group_norm(x, 3), h.log_softmax(-1)]
        sum(o.float().sum() for o in outs).backward()
        return outs + [x.grad, w.grad, q.grad, table.grad, h.grad]
    for a, b in zip(run(DEV), run("cpu")):
        torch.testing.assert_close(a.cpu(), b)


LAZY_MODULES = {
    "LazyLinear": (lambda **kw: torch.nn.LazyLinear(5, **kw), (3, 4)),
    "LazyConv1d": (lambda **kw: torch.nn.LazyConv1d(4, 3, **kw), (2, 3, 10)),
    "LazyConv2d": (lambda **kw: torch.nn.LazyConv2d(4, 3, padding=1, **kw), (2, 3, 8, 8)),
    "LazyConv3d": (lambda **kw: torch.nn.LazyConv3d(4, 3, **kw), (2, 3, 5, 5, 5)),
    "LazyConvTranspose1d": (lambda **kw: torch.nn.LazyConvTranspose1d(4, 3, **kw), (2, 3, 10)),
    "LazyConvTranspose2d": (lambda **kw: torch.nn.LazyConvTranspose2d(4, 3, stride=2, **kw), (2, 3, 6, 6)),
    "LazyConvTranspose3d": (lambda **kw: torch.nn.LazyConvTranspose3d(4, 3, **kw), (2, 3, 4, 4, 4)),
    "LazyBatchNorm1d": (lambda **kw: torch.nn.LazyBatchNorm1d(**kw), (4, 3)),
    "LazyBatchNorm2d": (lambda **kw: torch.nn.LazyBatchNorm2d(**kw), (4, 3, 5, 5)),
    "LazyBatchNorm3d": (lambda **kw: torch.nn.LazyBatchNorm3d(**kw), (4, 3, 3, 3, 3)),
    "LazyInstanceNorm1d": (lambda **kw: torch.nn.LazyInstanceNorm1d(affine=True, **kw), (4, 3, 6)),
    "LazyInstanceNorm2d": (lambda **kw: torch.nn.LazyInstanceNorm2d(affine=True, **kw), (4, 3, 5, 5)),
    "LazyInstanceNorm3d": (lambda **kw: torch.nn.LazyInstanceNorm3d(affine=True, track_running_stats=True, **kw),
                           (4, 3, 3, 3, 3)),
}


@pytest.mark.parametrize("name", sorted(LAZY_MODULES))
@pytest.mark.parametrize("made_on", ["cpu", DEV])
def test_lazy_modules_infer_their_shapes_and_train_as_on_the_cpu(name, made_on):
    """module.to("neuron") turned a LazyModule's uninitialized parameters into empty ordinary
    ones ("Can't access the shape of an uninitialized parameter")."""
    make, shape = LAZY_MODULES[name]
    torch.manual_seed(0)
    x = torch.randn(shape)
    cpu = make()
    cpu(x)   # initializes it
    dev = make().to(DEV) if made_on == "cpu" else make(device=DEV)
    assert all(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in dev.parameters())
    dev(x.to(DEV))
    assert all(p.device.type == DEV and type(p) is torch.nn.Parameter for p in dev.parameters())
    dev.load_state_dict(cpu.state_dict())
    xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    yc, yd = cpu(xc), dev(xd)
    torch.testing.assert_close(yd.cpu(), yc, rtol=1e-5, atol=1e-5)
    yc.square().sum().backward()
    yd.square().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
    for (n, pc), pd in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(pd.grad.cpu(), pc.grad, rtol=1e-4, atol=1e-5, msg=n)
    for (n, bc), bd in zip(cpu.named_buffers(), dev.buffers()):
        torch.testing.assert_close(bd.cpu(), bc, rtol=1e-5, atol=1e-6, msg=n)


def test_module_to_moves_parameters_in_place_as_between_cpu_and_cuda():
    """Parameter objects survive .to() (as with CUDA), so weight tying and an optimizer made
    before the move keep holding the module's parameters."""
    lin = torch.nn.Linear(3, 3)
    weight = lin.weight
    lin.to(DEV)
    assert lin.weight is weight and weight.device.type == DEV
    lin.to("cpu")
    assert lin.weight is weight and weight.device.type == "cpu"


def test_save_load_roundtrip_and_cpu_only_checkpoints(tmp_path):
    m = torch.nn.Linear(4, 3).to(DEV)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": m.state_dict(), "x": torch.arange(3.0, device=DEV)}, path)
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["x"].device.type == "cpu" and on_cpu["x"].tolist() == [0.0, 1.0, 2.0]
    back = torch.load(path)
    assert back["x"].device.type == "neuron"
    m2 = torch.nn.Linear(4, 3).to(DEV)
    m2.load_state_dict(torch.load(path, map_location=DEV)["model"])
    assert torch.equal(m2.weight.cpu(), m.weight.cpu())
    r = _py(f"import torch; d = torch.load({str(path)!r}, map_location='cpu'); print(d['x'].tolist())",
            TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0.0, 1.0, 2.0]"


def test_pin_memory_and_dataloader_pinning():
    t = torch.randn(8)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned() and torch.equal(p, t)
    ds = torch.utils.data.TensorDataset(torch.arange(10.0))
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True)))
    assert batch[0].is_pinned()
    assert batch[0].to(DEV, non_blocking=True).cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_factories_with_pin_memory_make_pinned_host_tensors():
    """``pin_memory=True`` at creation (and PyTorch's C++, such as DDP's map of used
    parameters) asked the device's C++ hooks for an allocator: NotImplementedError."""
    made = {
        "empty": torch.empty(3, pin_memory=True),
        "zeros": torch.zeros(2, 3, pin_memory=True),
        "randn": torch.randn(4, pin_memory=True),
        "tensor": torch.tensor([1.0, 2.0], pin_memory=True),
        "empty_strided": torch.empty_strided((2, 3), (1, 2), pin_memory=True),
    }
    for name, t in made.items():
        assert t.device.type == "cpu" and t.is_pinned(), name
    assert made["zeros"].tolist() == [[0.0] * 3] * 2 and made["tensor"].tolist() == [1.0, 2.0]
    assert made["empty_strided"].stride() == (1, 2)
    assert not torch.empty(3).is_pinned() and not torch.zeros(2, pin_memory=False).is_pinned()
    assert made["randn"].to(DEV, non_blocking=True).cpu().equal(made["randn"])


def test_autocast_runs_matmuls_in_bf16_and_softmax_in_fp32():
    m = torch.nn.Linear(8, 8).to(DEV)
    x = torch.randn(2, 8, device=DEV)
    with torch.autocast(DEV):
        y = m(x)
        z = y.softmax(-1)
    assert y.dtype == torch.bfloat16 and z.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = torch.nn.functional.linear(x.cpu(), m.weight.cpu(), m.bias.cpu())
    torch.testing.assert_close(y.cpu(), ref)


# -- timeline -------------------------------------------------------------------

def test_simulated_times_are_deterministic_memoized_and_event_timed():
    code = ("import torch; a = torch.ones(512, 512, device='neuron'); e0 = torch.neuron.Event(enable_timing=True);"
            "e1 = torch.neuron.Event(enable_timing=True); e0.record(); b = a @ a; c = (b + 1).relu(); e1.record();"
            "torch.neuron.synchronize(); print(e0.elapsed_time(e1), torch.neuron.clock().device)")
    runs = {_py(code).stdout for _ in range(2)}
    assert len(runs) == 1 and float(runs.pop().split()[0]) > 0
    a = torch.ones(300, 200, device=DEV)
    a @ a.t()
    n = len(timeline._memo)
    for _ in range(3):
        a @ a.t()
    assert len(timeline._memo) == n


def test_op_launch_cost_bounds_tiny_ops():
    torch.neuron.synchronize()
    x = torch.ones(4, device=DEV)
    t0 = torch.neuron.clock().host
    for _ in range(10):
        x = x + 1
    launch = torch.neuron.chip().runtime.op_launch_ps
    assert torch.neuron.clock().host - t0 == 10 * launch


def test_coverage_lists_kernels_and_estimates():
    cov = trnsim.backend.coverage()
    assert "aten::mm" in cov["kernel"] and "aten::native_layer_norm" in cov["kernel"]
    assert "aten::cummax" in cov["estimate"] and "aten::empty_strided" in cov["none"]
    real = set(torch._C._dispatch_get_all_op_names())
    assert set(cov["kernel"]) <= real and set(cov["none"]) <= real


def test_cli_coverage(capsys):
    from trnsim.cli import main

    assert main(["coverage"]) == 0
    out = capsys.readouterr().out
    assert "kernel" in out and "aten::mm" in out


# -- fidelity -------------------------------------------------------------------

def test_timing_fidelity_keeps_no_data_but_times_a_large_model():
    r = _py("import torch\n"
            "with torch.device('meta'):\n"
            "    m = torch.nn.Linear(16384, 16384)\n"
            "m = m.to_empty(device='neuron')\n"
            "y = m(torch.randn(8192, 16384, device='neuron'))\n"
            "torch.neuron.synchronize(); print(y.shape, torch.neuron.memory_allocated() // 2**20)\n"
            "try:\n    y.sum().item()\nexcept RuntimeError as e:\n    print('no values:', 'fidelity' in str(e))\n",
            TRNSIM_FIDELITY="timing")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["torch.Size([8192, 16384]) 2048", "no values: True"]


def _ix(*v):
    return torch.tensor(v, device=DEV)


# Writes and fills a training script makes, each on a (4, 4) float32 tensor ``t``.
TIMING_WRITES = {
    "fill_": lambda t: t.fill_(1.0), "fill_ 0-d tensor": lambda t: t.fill_(torch.tensor(1.0)),
    "zero_": lambda t: t.zero_(), "copy_": lambda t: t.copy_(torch.ones(4, 4)),
    "normal_": lambda t: t.normal_(), "uniform_": lambda t: t.uniform_(), "bernoulli_": lambda t: t.bernoulli_(0.5),
    "exponential_": lambda t: t.exponential_(), "random_": lambda t: t.random_(0, 5),
    "index_put_": lambda t: t.index_put_((_ix(0, 1),), torch.ones(4, device=DEV)),
    "masked_fill_": lambda t: t.masked_fill_(t > 0, 2.0), "index_fill_": lambda t: t.index_fill_(0, _ix(0), 3.0),
    "scatter_": lambda t: t.scatter_(0, torch.zeros(1, 4, dtype=torch.long, device=DEV), 1.0),
    "setitem": lambda t: t.__setitem__(slice(0, 2), 5.0), "clamp_": lambda t: t.clamp_(0, 1),
    "index_copy_": lambda t: t.index_copy_(0, _ix(0), torch.ones(1, 4, device=DEV)),
    "untyped_storage().fill_": lambda t: t.untyped_storage().fill_(0),
    "init.trunc_normal_": torch.nn.init.trunc_normal_, "init.kaiming_uniform_": torch.nn.init.kaiming_uniform_,
    "init.orthogonal_": torch.nn.init.orthogonal_, "init.eye_": torch.nn.init.eye_,
    "init.xavier_normal_": torch.nn.init.xavier_normal_, "init.constant_": lambda t: torch.nn.init.constant_(t, 0.3),
}


@pytest.mark.parametrize("name", sorted(TIMING_WRITES))
def test_timing_fidelity_runs_in_place_writes_and_fills(name):
    """``fill_`` on a storage raised "Attempted to call fill_() on an invalid python storage",
    trunc_normal_ read values to redraw; a write needs no values, so each runs and is timed."""
    trnsim.set_fidelity("timing")
    try:
        t = torch.empty(4, 4, device=DEV)
        before = state.clock.ops
        TIMING_WRITES[name](t)
        assert state.clock.ops > before
        assert t.shape == (4, 4) and t.dtype == torch.float32 and storage_has_no_values(t)
    finally:
        trnsim.set_fidelity("op")


def storage_has_no_values(t: torch.Tensor) -> bool:
    from trnsim.backend import storage

    return storage.block_of(t).host is None


def test_a_storage_fill_fills_as_on_the_cpu():
    t = torch.full((2,), 1.0, device=DEV)
    t.untyped_storage().fill_(0)
    assert t.cpu().tolist() == [0.0, 0.0]


def test_bad_fidelity_is_named():
    with pytest.raises(ValueError, match=r"set_fidelity\('fast'\) is not a fidelity; pass one of: op, instruction, timing"):
        trnsim.set_fidelity("fast")


# -- training --------------------------------------------------------------------

def _train(make, data, dev, steps=20):
    torch.manual_seed(0)
    model = make().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (t.to(dev) for t in data)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


class _Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32)
        self.block = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(32, 50)

    def forward(self, x):
        return self.head(self.block(self.emb(x)).mean(1))


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_models_train_to_the_cpu_losses(name):
    g = torch.Generator().manual_seed(1)
    if name == "mlp":
        make = lambda: torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.GELU(), torch.nn.Linear(64, 5))  # noqa: E731
        data = (torch.randn(32, 20, generator=g), torch.randint(0, 5, (32,), generator=g))
    elif name == "cnn":
        make = lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),  # noqa: E731
                                           torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                           torch.nn.Linear(8 * 4 * 4, 5))
        data = (torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g))
    else:
        make = _Transformer
        data = (torch.randint(0, 50, (4, 12), generator=g), torch.randint(0, 50, (4,), generator=g))
    dev_losses = _train(make, data, DEV)
    cpu_losses = _train(make, data, "cpu")
    for a, b in zip(dev_losses, cpu_losses):
        assert abs(a - b) <= 1e-5 * abs(b)
    assert dev_losses[-1] < dev_losses[0]


# -- profiling ---------------------------------------------------------------------

def test_profile_records_ops_above_engine_slices(tmp_path):
    m = torch.nn.Linear(128, 256).to(DEV)
    x = torch.randn(128, 128, device=DEV)
    path = tmp_path / "eager.json"
    with trnsim.profile(path) as prof:
        m(x).relu().sum().item()
    rows = prof.summary()
    assert rows[0].name == "aten::addmm" and rows[0].source == "kernel"
    assert abs(sum(r.pct for r in rows) - 100) < 1e-6
    assert "aten::addmm " in str(rows)
    data = json.loads(path.read_text())
    names = {e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "thread_name"}
    assert {"PyTorch ops", "TensorE (matmul)", "Host (sync points)"} <= names
    ops = [e for e in data["traceEvents"] if e.get("cat") == "ops"]
    assert ops and all("shapes" in e["args"] for e in ops)
    assert torch.neuron.current_trace() is None
    assert state.clock.syncs > 0


def test_eager_trace_reports_as_a_profile(tmp_path):
    from trnsim.trace import load, summarize

    a = torch.ones(256, 256, device="neuron")
    with trnsim.profile(tmp_path / "e.json") as prof:
        (a @ a).relu()
    s = summarize(load(tmp_path / "e.json"))
    assert s.program == "eager PyTorch (2 ops)"
    assert s.instructions == sum(len(r.cost.run.program.instructions) for r in prof.records)
    assert s.flops == 2 * 256 ** 3 and s.peak_flops > 0 and s.hbm_peak_gbps > 0


def test_an_mlp_backward_is_timed_by_kernels_and_its_gradients_match_the_cpu():
    torch.manual_seed(63)
    cpu = torch.nn.Sequential(torch.nn.Linear(64, 200), torch.nn.GELU(), torch.nn.LayerNorm(200),
                              torch.nn.Linear(200, 30))
    dev = copy.deepcopy(cpu).to(DEV)
    x, w = torch.randn(130, 64), torch.randn(130, 30)
    (torch.softmax(cpu(x), -1) * w).sum().backward()
    loss = (torch.softmax(dev(x.to(DEV)), -1) * w.to(DEV)).sum()
    with trnsim.profile() as prof:
        loss.backward()
    rows = {r.name: r for r in prof.summary()}
    for name, kernel in [("aten::gelu_backward", "activation_backward_kernel[gelu]"),
                         ("aten::native_layer_norm_backward", "layernorm_backward_kernel"),
                         ("aten::_softmax_backward_data", "softmax_backward_kernel")]:
        assert (rows[name].source, rows[name].kernel) == ("kernel", kernel)
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad)
    assert {"aten::threshold_backward", "aten::_log_softmax_backward_data", "aten::sigmoid_backward",
            "aten::tanh_backward", "aten::silu_backward"} <= set(trnsim.backend.coverage()["kernel"])


def test_cross_entropy_and_an_embedding_backward_are_timed_by_kernels_and_match_the_cpu():
    torch.manual_seed(64)
    cpu = torch.nn.Embedding(300, 24, padding_idx=0)
    dev = copy.deepcopy(cpu).to(DEV)
    tokens, head = torch.randint(0, 300, (3, 50)), torch.randn(24, 40)
    target = torch.randint(0, 40, (150,))
    target[::7] = -100

    def step(emb, device):
        logits = emb(tokens.to(device)).reshape(150, 24) @ head.to(device)
        loss = torch.nn.functional.cross_entropy(logits, target.to(device), ignore_index=-100)
        loss.backward()
        return loss

    cpu_loss = step(cpu, "cpu")
    with trnsim.profile() as prof:
        dev_loss = step(dev, DEV)
    rows = {r.name: r for r in prof.summary()}
    for name, kernel in [("aten::nll_loss_forward", "nll_loss_kernel"),
                         ("aten::nll_loss_backward", "nll_loss_backward_kernel"),
                         ("aten::embedding_dense_backward", "embedding_backward_kernel")]:
        assert (rows[name].source, rows[name].kernel) == ("kernel", kernel)
    torch.testing.assert_close(dev_loss.cpu(), cpu_loss)
    torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad)
    kernel_ops = set(trnsim.backend.coverage()["kernel"])
    assert {"aten::nll_loss_forward", "aten::nll_loss_backward", "aten::embedding_dense_backward"} <= kernel_ops
    assert "aten::nll_loss_forward.output" in kernel_ops


def test_the_same_training_step_writes_the_same_trace_bytes_in_every_process(tmp_path):
    code = ("import torch, trnsim; from trnsim.demo import run_llama_demo; import sys; "
            "run_llama_demo(steps=1, trace=sys.argv[1], batch=1, seq=32)")
    paths = [tmp_path / f"t{i}.json" for i in range(2)]
    for p in paths:
        subprocess.run([sys.executable, "-c", code, str(p)], check=True, timeout=300)
    first, second = (p.read_bytes() for p in paths)
    assert len(first) > 10_000 and first == second


def test_profile_flops_are_the_ops_whatever_share_each_core_took(tmp_path):
    from trnsim.trace import load, summarize

    for b, m, k, n in ((3, 64, 64, 64), (1, 1, 256, 1), (2, 256, 128, 512)):
        x = torch.ones(b, m, k, device="neuron")
        y = torch.ones(b, k, n, device="neuron")
        with trnsim.profile(tmp_path / "f.json"):
            torch.bmm(x, y)
        assert summarize(load(tmp_path / "f.json")).flops == 2 * b * m * k * n, (b, m, k, n)


def test_foreach_ops_are_one_device_op_each_and_match_the_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    dev = copy.deepcopy(cpu).to("neuron")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, dev)]
    x = torch.randn(16, 64)
    for m, opt, inp in ((cpu, opts[0], x), (dev, opts[1], x.to("neuron"))):
        m(inp).square().mean().backward()
        if m is dev:
            with trnsim.profile() as prof:
                opt.step()
        else:
            opt.step()
    for a, b in zip(dev.parameters(), cpu.parameters()):
        assert torch.equal(a.cpu(), b)
    rows = {r.name: r for r in prof.summary()}
    assert rows["aten::_foreach_sqrt"].calls == 1 and rows["aten::_foreach_sqrt"].kernel == "sqrt x4"
    assert rows["aten::_foreach_mul_.Scalar"].source == "kernel"
    assert not any(n in rows for n in ("aten::mul.out", "aten::sqrt", "aten::addcmul_"))


def test_torch_accelerator_generic_calls_answer_for_neuron():
    """Device-generic code (accelerate, transformers) calls torch.accelerator, which asks
    the device's C++ allocator and guard: neuron answers as torch.neuron does."""
    torch.accelerator.synchronize()
    torch.accelerator.memory.empty_cache()
    before = torch.accelerator.memory_allocated()
    x = torch.ones(1000, device="neuron")
    assert torch.accelerator.memory_allocated() == before + 4000 == torch.neuron.memory_allocated()
    assert torch.accelerator.max_memory_allocated() >= before + 4000
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_stats()["allocated_bytes.all.current"]
    free, total = torch.accelerator.get_memory_info()
    assert (free, total) == torch.neuron.mem_get_info()
    del x
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated() == before
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["allocation.all.allocated"] == 0
    with pytest.raises(Exception, match="neuron"):
        torch.accelerator.memory_allocated(3)
