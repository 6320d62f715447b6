"""torch.compile(backend="neuron"): values, gradients, time, traces, options."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import trnsim
from trnsim.backend import state
from trnsim.backend.compile.partition import partition
from trnsim.errors import CompileError, CompileModeWarning
from trnsim.models.tinyllama import TinyLlama, causal_lm_loss


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(dtype=torch.float32, layers=2, seq=128, vocab=512):
    torch.manual_seed(0)
    return TinyLlama(vocab=vocab, layers=layers, seq=seq).to("neuron", dtype)


def _device_ps(fn) -> int:
    """Simulated device time of ``fn()`` from an idle device (what a profile around it
    records: the ops' times and the device's waits for the host to launch them)."""
    torch.neuron.synchronize()
    with trnsim.profile() as prof:
        fn()
        torch.neuron.synchronize()
    return prof.device_ps


def test_backend_name_needs_no_import():
    code = ("import torch\n"
            "f = torch.compile(lambda x: torch.nn.functional.silu(x) * 2, backend='neuron')\n"
            "x = torch.ones(4, 8, device='neuron')\n"
            "print(torch.allclose(f(x).cpu(), torch.nn.functional.silu(torch.ones(4, 8)) * 2))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    assert "neuron" in torch._dynamo.list_backends()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_inference_matches_eager(dtype, tol):
    m = _model(dtype)
    x = torch.randint(0, 512, (1, 128), device="neuron")
    with torch.no_grad():
        eager = m(x).float().cpu()
        compiled = torch.compile(m, backend="neuron")(x).float().cpu()
    scale = eager.abs().max().item()
    assert (compiled - eager).abs().max().item() <= tol * max(scale, 1.0)


def test_training_step_matches_eager_gradients():
    m = _model()
    c_model = copy.deepcopy(m)
    compiled = torch.compile(c_model, backend="neuron")
    x = torch.randint(0, 512, (2, 64), device="neuron")
    causal_lm_loss(m(x), x).backward()
    loss = causal_lm_loss(compiled(x), x)
    loss.backward()
    for (name, p), q in zip(m.named_parameters(), c_model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=1e-5, atol=1e-6, msg=name)


def test_compiled_forward_is_at_most_half_of_eager_at_1x128():
    m = _model(layers=4, vocab=1000)
    x = torch.randint(0, 1000, (1, 128), device="neuron")
    compiled = torch.compile(m, backend="neuron")
    with torch.no_grad():
        compiled(x)
        eager_ps = _device_ps(lambda: m(x))
        compiled_ps = _device_ps(lambda: compiled(x))
    assert compiled_ps <= 0.5 * eager_ps, (compiled_ps, eager_ps)


def test_a_call_is_one_launch_then_its_kernels_in_turn():
    m = _model(layers=1)
    x = torch.randint(0, 512, (1, 128), device="neuron")
    compiled = torch.compile(m, backend="neuron")
    with torch.no_grad():
        compiled(x)
        torch.neuron.synchronize()
        with trnsim.profile() as prof:
            compiled(x)
    kernels = [r for r in prof.records if r.info is not None]
    assert kernels and len(kernels) == kernels[0].info["kernels"]
    # each ends its after_ps after the one ahead, and starts its lead_ps before its end

    for a, b in zip(kernels, kernels[1:]):

        assert b.end_ps == a.end_ps + b.info["after_ps"] >= a.end_ps

        assert b.start_ps == max(b.end_ps - b.info["lead_ps"], kernels[0].start_ps)
    clock = state.clock
    before_ops = clock.ops
    with torch.no_grad():
        compiled(x)
    assert clock.ops == before_ops + 1   # one launch for the whole graph
    assert prof.device_ps == kernels[-1].end_ps - kernels[0].start_ps
    assert prof.device_ps < sum(r.cost.ps for r in kernels)   # some overlap


def test_trace_names_fused_kernels_their_ops_and_source_lines(tmp_path):
    def block(x, w, b):
        return F.silu(x @ w + b) * 2.0 + x   # the fused matmul's epilogue

    compiled = torch.compile(block, backend="neuron")
    x = torch.randn(128, 256, device="neuron")
    w = torch.randn(256, 256, device="neuron")
    b = torch.randn(256, device="neuron")
    compiled(x, w, b)
    path = tmp_path / "t.json"
    with trnsim.profile(path) as prof:
        compiled(x, w, b)
    summary = str(prof.summary())
    assert "fused[mm+add+sigmoid+mul+mul+add]" in summary and "fused_matmul_kernel" in summary
    events = json.loads(path.read_text())["traceEvents"]
    fused = [e for e in events if e.get("name", "").startswith("fused[")]
    assert fused
    args = fused[0]["args"]
    assert args["ops"][:3] == ["aten::mm", "aten::add.Tensor", "aten::sigmoid"]
    assert any("test_compile.py" in s and "F.silu(x @ w + b)" in s for s in args["source"])
    assert args["hbm_bytes"] < args["eager_bytes"]
    graphs = [e for e in events if e.get("ph") == "X" and e.get("name", "").startswith("graph")]
    assert len(graphs) == 1


def test_values_are_eager_values_in_op_fidelity():
    def fn(x, y):
        return torch.softmax(x * y + 1.0, dim=-1).to(torch.bfloat16)

    x, y = torch.randn(64, 300, device="neuron"), torch.randn(300, device="neuron")
    eager = fn(x, y)
    got = torch.compile(fn, backend="neuron")(x, y)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), eager.cpu())


def test_input_mutation_and_output_alias_behave_as_eager():
    def update(cache, pos, new):
        cache.index_copy_(1, pos, new)
        return cache[:, :4], cache.sum()

    cache_e = torch.zeros(2, 8, 16, device="neuron")
    cache_c = cache_e.clone()
    pos = torch.tensor([1, 3], device="neuron")
    new = torch.randn(2, 2, 16, device="neuron")
    view_e, total_e = update(cache_e, pos, new)
    view_c, total_c = torch.compile(update, backend="neuron")(cache_c, pos, new)
    assert torch.equal(cache_c.cpu(), cache_e.cpu())
    assert torch.equal(view_c.cpu(), view_e.cpu()) and torch.allclose(total_c.cpu(), total_e.cpu())
    assert view_c.untyped_storage().data_ptr() == cache_c.untyped_storage().data_ptr()   # still a view


def test_graph_breaks_and_fullgraph_both_work():
    def with_break(x):
        y = torch.relu(x) + 1
        torch._dynamo.graph_break()
        return y * 3

    x = torch.randn(8, 32, device="neuron")
    assert torch.allclose(torch.compile(with_break, backend="neuron")(x).cpu(), (torch.relu(x.cpu()) + 1) * 3)
    f = torch.compile(lambda x: torch.tanh(x) * x, backend="neuron", fullgraph=True)
    assert torch.allclose(f(x).cpu(), torch.tanh(x.cpu()) * x.cpu())


def test_dynamic_true_is_refused_with_the_fix():
    f = torch.compile(lambda x: x * 2, backend="neuron", dynamic=True)
    with pytest.raises(Exception) as info:
        f(torch.ones(4, device="neuron"))
    err = info.value
    inner = getattr(err, "inner_exception", err)
    assert isinstance(inner, CompileError)
    assert "dynamic=True" in str(err) and "static" in str(err)


@pytest.mark.parametrize("kwargs", [{"mode": "max-autotune"}, {"mode": "reduce-overhead"},
                                    {"options": {"triton.cudagraphs": True}}])
def test_other_modes_and_options_warn_and_compile_as_default(kwargs):
    f = torch.compile(lambda x: x * 2 + 1, backend="neuron", **kwargs)
    with pytest.warns(CompileModeWarning, match="neuron backend"):
        y = f(torch.ones(4, device="neuron"))
    assert torch.equal(y.cpu(), torch.full((4,), 3.0))


def test_default_mode_does_not_warn():
    f = torch.compile(lambda x: x * 2, backend="neuron", mode="default")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileModeWarning)
        f(torch.ones(4, device="neuron"))


def test_instruction_fidelity_computes_fusions_with_chip_numerics():
    def fn(x, w):
        return torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * x * w

    x = torch.randn(200, 96, dtype=torch.bfloat16)
    w = torch.randn(96, dtype=torch.bfloat16)
    cpu = fn(x.float(), w.float())
    trnsim.set_fidelity("instruction")
    try:
        got = torch.compile(fn, backend="neuron")(x.to("neuron"), w.to("neuron")).cpu()
    finally:
        trnsim.set_fidelity("op")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), cpu, rtol=2e-2, atol=2e-2)


def test_partition_states_why_a_node_is_not_fused():
    def fn(x, idx):
        return (x.exp() + 1).sum(0) + idx.float().sum()   # a sum over rows, an int input

    gm_holder = {}

    def capture(gm, inputs):
        from torch._dynamo.backends.common import aot_autograd

        def fw(g, ins):
            gm_holder["g"] = g
            return g
        return aot_autograd(fw_compiler=fw)(gm, inputs)

    torch.compile(fn, backend=capture)(torch.randn(8, 16, device="neuron"),
                                       torch.arange(4, device="neuron"))
    groups = partition(gm_holder["g"], lambda r, rows, sizes: True)
    reasons = {g.ops[0]: g.reason for g in groups if g.kind == "op"}
    assert "aten::sum.dim_IntList" not in reasons   # the sum over rows fuses with the exp and add before it
    assert any("int64" in r for r in reasons.values()), reasons


def _aten_graph(fn, *args):
    """The AOT inference graph of ``fn`` on ``args``."""
    from torch._dynamo.backends.common import aot_autograd

    holder = {}

    def fw(g, ins):
        holder["g"] = g
        return g

    torch.compile(fn, backend=aot_autograd(fw_compiler=fw))(*args)
    return holder["g"]


def test_a_fusion_that_would_outgrow_the_sbuf_is_split():
    gm = _aten_graph(lambda x: ((x.exp() * 2.0) + 1.0).tanh() - x, torch.randn(4, 32, device="neuron"))
    whole = [g for g in partition(gm, lambda r, rows, sizes: True) if g.kind == "rows"]
    split = [g for g in partition(gm, lambda r, rows, sizes: len(r.steps) <= 2) if g.kind == "rows"]
    assert len(whole) == 1 and len(split) == 3
    assert [len(g.steps) for g in split] == [2, 2, 1]


def test_functional_collectives_in_a_graph_are_left_to_the_process_group():
    from trnsim.backend.compile.runtime import lower_graph

    c10d = torch.ops._c10d_functional
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.exp.default, (x,))
    gathered = g.call_function(c10d.all_gather_into_tensor.default, (y, 2, "0"))
    waited = g.call_function(c10d.wait_tensor.default, (gathered,))
    z = g.call_function(torch.ops.aten.mul.Tensor, (waited, 2.0))
    g.output(z)
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    small, big = torch.ones(4, 8, device="neuron"), torch.ones(8, 8, device="neuron")
    vals = {x: small, y: small, gathered: big, waited: big, z: big}
    groups = partition(gm, lambda r, rows, sizes: True, vals)
    kinds = {n.target: grp.kind for grp in groups for n in grp.nodes}
    assert kinds[c10d.all_gather_into_tensor.default] == kinds[c10d.wait_tensor.default] == "free"
    assert kinds[torch.ops.aten.exp.default] == kinds[torch.ops.aten.mul.Tensor] == "rows"
    names = [r[0] for r in lower_graph(gm, "g", vals).records]
    assert names and not any("c10d" in name for name in names)


def test_softmax_fuses_whole_or_runs_alone_when_its_rows_do_not_fit():
    gm = _aten_graph(lambda x: torch.softmax(x, -1) * 2.0, torch.randn(4, 32, device="neuron"))
    fused = [g for g in partition(gm, lambda r, rows, sizes: True) if g.kind != "free"]
    assert [g.kind for g in fused] == ["rows"] and [s.op for s in fused[0].steps] == [
        "max", "subtract", "exp", "sum", "divide", "multiply"]
    alone = [g for g in partition(gm, lambda r, rows, sizes: not any(s.op == "max" for s in r.steps))
             if g.kind != "free"]
    assert alone[0].kind == "op" and "SBUF" in alone[0].reason
    assert alone[1].kind == "rows"


def test_a_loop_whose_shape_changes_reports_each_recompilation_and_its_cause():
    torch.neuron.reset_dynamo_metrics()

    def step(x):
        return torch.relu(x) * 2

    compiled = torch.compile(step, backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(8, 14):
            compiled(torch.ones(4, n, device="neuron"))
    graphs = torch.neuron.get_dynamo_metrics()
    assert len(graphs) == 6
    assert [g.recompile for g in graphs] == [False] + [True] * 5
    assert [g.reason for g in graphs[1:]] == [f"input 'x' changed shape at dimension 1 ({n} -> {n + 1})"
                                             for n in range(8, 13)]
    assert all(g.simulated_compile_s >= 2.0 for g in graphs)
    from trnsim.errors import RecompileWarning

    recompile_warnings = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(recompile_warnings) == 1
    assert "'x'" in str(recompile_warnings[0].message) and "static" in str(recompile_warnings[0].message)


def test_a_static_loop_compiles_once_and_the_profile_lists_it():
    torch.neuron.reset_dynamo_metrics()
    compiled = torch.compile(lambda x: torch.sigmoid(x) + x, backend="neuron")
    x = torch.randn(16, 64, device="neuron")
    with trnsim.profile() as prof:
        for _ in range(5):
            compiled(x)
    graphs = torch.neuron.get_dynamo_metrics()
    assert len(graphs) == 1 and not graphs[0].recompile
    text = str(prof.summary())
    assert "fused[sigmoid+add]" in text and "compil" in text


def test_layer_norm_fuses_whole_and_trains_as_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 96), torch.nn.LayerNorm(96), torch.nn.GELU()).to("neuron")
    twin = copy.deepcopy(model)
    x = torch.randn(50, 96, device="neuron")
    model(x).square().sum().backward()
    with trnsim.profile() as prof:
        torch.compile(twin, backend="neuron")(x).square().sum().backward()
    names = [r.name for r in prof.records if r.info is not None]
    assert any(n.startswith("fused[native_layer_norm") or "native_layer_norm" in n for n in names), names
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=1e-5, atol=1e-5)


@pytest.fixture(params=["op", "instruction"])
def fidelity(request):
    trnsim.set_fidelity(request.param)
    yield request.param
    trnsim.set_fidelity("op")


def test_a_write_to_an_input_stays_after_the_fusion_that_reads_it(fidelity):
    def read_then_update(x, new):
        out = torch.exp(x) + 1
        x.copy_(new)
        return out

    x = torch.zeros(4, 8, device="neuron")
    out = torch.compile(read_then_update, backend="neuron")(x, torch.full((4, 8), 5.0, device="neuron"))
    assert torch.equal(out.cpu(), torch.full((4, 8), 2.0))
    assert torch.equal(x.cpu(), torch.full((4, 8), 5.0))


def test_tensor_constants_in_a_graph(fidelity):
    def scale(x):
        return x * torch.tensor(2.5, device=x.device) + torch.tensor([1.0, 2.0], device=x.device).sum()

    x = torch.ones(4, 8, device="neuron")
    assert torch.allclose(torch.compile(scale, backend="neuron")(x).cpu(), torch.full((4, 8), 5.5))


def test_cpu_work_in_a_compiled_graph_stays_on_the_cpu_and_costs_no_device_time(fidelity):
    def f(x):
        return torch.relu(x) * 2 + 1

    compiled = torch.compile(f, backend="neuron")
    x = torch.randn(4, 8)
    compiled(x)
    torch.neuron.synchronize()
    before = state.clock.device
    with trnsim.profile() as prof:
        y = compiled(x)
    assert y.device.type == "cpu" and torch.allclose(y, f(x))
    assert prof.records == [] and state.clock.device == before

    def mixed(x):
        table = torch.arange(8.0) * 0.5 + 1   # made on the CPU inside a graph that runs on neuron
        return x * 2, table

    out, table = torch.compile(mixed, backend="neuron")(torch.ones(4, 8, device="neuron"))
    assert out.device.type == "neuron" and table.device.type == "cpu"
    assert torch.equal(table, torch.arange(8.0) * 0.5 + 1)


def test_a_graph_break_compiles_only_the_users_code():
    torch.neuron.reset_dynamo_metrics()

    def f(x):
        y = x * 2
        if y.sum() > 0:   # data-dependent: a graph break, then the rest of f compiles on its own
            return y + 1
        return y - 1

    out = torch.compile(f, backend="neuron")(torch.ones(4, device="neuron"))
    assert torch.equal(out.cpu(), torch.full((4,), 3.0))
    files = {g.code.split("(")[-1].split(":")[0] for g in torch.neuron.get_dynamo_metrics()}
    assert files == {"test_compile.py"}, files


def test_a_graph_of_views_costs_no_launch():
    f = torch.compile(lambda x: x.view(-1)[:3], backend="neuron")
    x = torch.arange(12.0, device="neuron")
    f(x)
    torch.neuron.synchronize()
    before = (state.clock.device, state.clock.ops)
    out = f(x)
    assert (state.clock.device, state.clock.ops) == before
    assert torch.equal(out.cpu(), torch.arange(3.0))


def test_linear_gelu_is_one_matmul_with_its_epilogue():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(approximate="tanh")).to("neuron")
    x = torch.randn(32, 64, device="neuron")
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        compiled(x)
        with trnsim.profile() as prof:
            y = compiled(x)
        assert torch.allclose(y.cpu(), model(x).cpu(), atol=1e-6)
    names = [r.name for r in prof.records]
    assert names == ["fused[addmm+gelu]"], names


def test_the_default_backend_compiles_neuron_graphs_with_the_neuron_backend():
    """torch.compile(model) with no backend (Inductor) on neuron tensors compiles with the
    neuron backend, as TorchNeuron does; it ended in 'InductorError: KeyError: neuron'."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(approximate="tanh")).to("neuron")
    x = torch.randn(32, 64, device="neuron")
    before = len(torch.neuron.get_dynamo_metrics())
    compiled = torch.compile(model)
    with torch.no_grad():
        compiled(x)
        with trnsim.profile() as prof:
            y = compiled(x)
        assert torch.allclose(y.cpu(), model(x).cpu(), atol=1e-6)
    assert [r.name for r in prof.records] == ["fused[addmm+gelu]"]
    assert len(torch.neuron.get_dynamo_metrics()) == before + 1


def test_the_default_backend_takes_graphs_that_make_neuron_tensors_and_warns_of_its_mode():
    f = torch.compile(lambda n: torch.ones(n, device="neuron") * 2, mode="max-autotune-no-cudagraphs")
    with pytest.warns(CompileModeWarning, match="max-autotune-no-cudagraphs"):
        y = f(3)
    assert y.device.type == "neuron" and torch.equal(y.cpu(), torch.full((3,), 2.0))


def test_the_default_backend_leaves_cpu_graphs_to_inductor(monkeypatch):
    from trnsim.backend.compile import inductor

    seen = []

    def inductor_call(self, gm, inputs, **kwargs):   # stands in for Inductor, which needs a C++ compiler
        seen.append(gm)
        return gm.forward

    monkeypatch.setitem(inductor._originals, "__call__", inductor_call)
    before = len(torch.neuron.get_dynamo_metrics())
    y = torch.compile(lambda x: x * 2 + 1)(torch.ones(4))
    assert len(seen) == 1 and torch.equal(y, torch.full((4,), 3.0))
    assert len(torch.neuron.get_dynamo_metrics()) == before


def test_an_identical_computation_runs_once_as_the_compiler_runs_it():
    """Autocast casts an input once per op that reads it; the compiled graph casts it once."""
    def three_casts(x):
        return x.to(torch.bfloat16) * 2, x.to(torch.bfloat16) + 1, x.to(torch.bfloat16).neg()

    compiled = torch.compile(three_casts, backend="neuron")
    x = torch.randn(128, 256, device="neuron")
    compiled(x)
    with trnsim.profile() as prof:
        outs = compiled(x)
    for got, want in zip(outs, three_casts(x.cpu())):
        assert torch.equal(got.cpu(), want)
    ops = [op for r in prof.records if r.info is not None for op in r.info["ops"]]
    assert ops.count("aten::_to_copy") == 1, ops


def test_two_random_draws_stay_two_draws():
    """Merging identical computations never merges random numbers: two draws of noise
    shaped like one tensor are two tensors, as in eager."""
    def two_draws(x):
        return torch.randn_like(x) + torch.randn_like(x), torch.rand_like(x) - torch.rand_like(x)

    compiled = torch.compile(two_draws, backend="neuron")
    x = torch.zeros(64, 128, device="neuron")
    normal, uniform = compiled(x)
    assert normal.cpu().var().item() == pytest.approx(2.0, rel=0.15)   # one draw twice would give 4
    assert uniform.cpu().abs().max().item() > 0   # one draw minus itself would be 0


def test_attention_without_dropout_does_not_keep_a_graph_from_casting_once():
    """Attention ops may draw random numbers (dropout); without dropout they do not, and
    the graph around them still makes each identical computation once."""
    def block(q, x):
        a = F.scaled_dot_product_attention(q, q, q)
        return a + x.to(torch.bfloat16).float(), x.to(torch.bfloat16) * 2

    compiled = torch.compile(block, backend="neuron")
    q, x = torch.randn(1, 2, 128, 64, device="neuron"), torch.randn(1, 2, 128, 64, device="neuron")
    compiled(q, x)
    with trnsim.profile() as prof:
        compiled(q, x)
    ops = [op for r in prof.records if r.info is not None for op in r.info["ops"]]
    assert ops.count("aten::_to_copy") == 2, ops   # x cast once, then cast back once
