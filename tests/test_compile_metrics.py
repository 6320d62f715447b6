"""Compilations, recompilations and their causes (trnsim.backend.compile.metrics).

The Dynamo backend here is a stand-in that only records, as the real one does first:
it calls on_compile, then finish per graph, and runs the graph as traced.
"""

import threading
import warnings

import pytest
import torch
import torch._dynamo
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import trnsim
from trnsim.backend import state
from trnsim.backend.compile import causes, metrics
from trnsim.errors import ChipSpecError, RecompileWarning, TrnSimError
from trnsim.hw.spec import CompilerSpec, load_chip


def _nodes(gm) -> int:
    return sum(n.op == "call_function" for n in gm.graph.nodes)


def standin(gm, example_inputs):
    event = metrics.on_compile(gm, example_inputs)
    metrics.finish(event, _nodes(gm))
    return gm.forward


def training_standin(gm, example_inputs):
    """Forward and backward graphs through AOT Autograd, as a training backend compiles them."""
    event = metrics.on_compile(gm, example_inputs)

    def compiler(kind):
        def compile_graph(g, _inputs):
            metrics.finish(event, _nodes(g), kind)
            return make_boxed_func(g.forward)
        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))(gm, example_inputs)


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    metrics.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()
    metrics.reset_dynamo_metrics()


def scale(x, n: int, flag: bool):
    y = x * 2
    if flag:
        y = y + n
    return y.sum()


def compiled(fn=scale):
    return torch.compile(fn, backend=standin, dynamic=False)


def test_first_compile_has_no_cause():
    compiled()(torch.ones(4, 8), 1, True)
    (event,) = metrics.compilations()
    assert (event.index, event.count, event.recompile, event.reason) == (0, 1, False, None)
    assert (event.name, event.line) == ("scale", scale.__code__.co_firstlineno)
    assert event.code == f"scale (test_compile_metrics.py:{scale.__code__.co_firstlineno})"
    assert event.compile_id == "0/0"


def test_shape_change_every_step_reports_recompilations_and_cause():
    """The acceptance loop: a neuron input whose length changes every step."""
    f = compiled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        for n in range(8, 11):
            f(torch.ones(2, n, device="neuron"), 1, True)
    events = metrics.compilations()
    assert [(e.count, e.recompile) for e in events] == [(1, False), (2, True), (3, True)]
    reasons = [e.reason for e in events[1:]]
    assert [(r.kind, r.input, r.dim, r.expected, r.actual) for r in reasons] == [
        ("shape", "x", 1, "8", "9"), ("shape", "x", 1, "9", "10")]
    assert reasons[0].describe() == "input 'x' changed shape at dimension 1 (8 -> 9)"
    graphs = torch.neuron.get_dynamo_metrics()
    assert [g.recompile for g in graphs] == [False, True, True]
    assert graphs[2].reason == "input 'x' changed shape at dimension 1 (9 -> 10)"
    s = metrics.summary()
    assert (s.compilations, s.recompilations, s.graphs) == (3, 2, 3)
    assert "input 'x' changed shape at dimension 1 (8 -> 9 -> 10)" in str(s)


def test_dtype_change_is_the_cause():
    f = compiled()
    f(torch.ones(4), 1, True)
    f(torch.ones(4, dtype=torch.float64), 1, True)
    r = metrics.compilations()[1].reason
    assert (r.kind, r.input, r.expected, r.actual) == ("dtype", "x", "Float", "Double")
    assert r.describe() == "input 'x' changed dtype (Float -> Double)"


@pytest.mark.parametrize("args, name, expected", [((2, True), "n", "1"), ((1, False), "flag", "True")])
def test_python_value_change_is_the_cause(args, name, expected):
    f = compiled()
    f(torch.ones(4), 1, True)
    f(torch.ones(4), *args)
    r = metrics.compilations()[1].reason
    assert (r.kind, r.input, r.expected) == ("value", name, expected)
    assert r.describe() == f"Python value '{name}' changed (the graph was compiled for {name} == {expected})"


def test_cached_graph_does_not_count():
    f = compiled()
    for _ in range(3):
        f(torch.ones(4), 1, True)
    f(torch.ones(5), 1, True)
    f(torch.ones(4), 1, True)  # both graphs cached now
    assert [e.recompile for e in metrics.compilations()] == [False, True]


def test_metrics_fields_counters_and_reset():
    from torch._dynamo.utils import counters

    f = compiled()
    f(torch.ones(4), 1, True)
    f(torch.ones(6), 1, True)
    g0, g1 = metrics.get_dynamo_metrics()
    assert (g0.graph_name, g1.graph_name) == ("scale_0_inference_0", "scale_1_inference_1")
    assert (g0.model_name, g0.kind, g0.graph_node_count, g0.timestamp) == ("scale", "inference", 2, "0")
    assert g0.graph_id != g1.graph_id and g0.graph_id.endswith("_inference")
    assert (g0.compile_id, g1.compile_id) == ("0/0", "0/1")
    ps = state.chip().compiler.graph_ps(2)
    assert (g0.simulated_compile_ps, g0.torch_neuronx_compile_us) == (ps, ps // 1_000_000)
    assert g0.torch_neuronx_lower_us == 0 and g0.torch_neuronx_fx_passes_us >= 0
    assert dict(counters["neuron"]) == {"compilations": 2, "recompilations": 1, "compiled_graphs": 2}
    torch.neuron.reset_dynamo_metrics()
    assert torch.neuron.get_dynamo_metrics() == [] and metrics.compilations() == []
    assert not counters["neuron"]
    assert str(metrics.summary()).startswith("torch.compile: 0 compilations (0 recompilations), 0 graphs")


def test_warning_once_at_the_threshold_names_the_input():
    f = compiled()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 2 + metrics.RECOMPILE_WARN_AT):
            f(torch.ones(3, n), 1, True)
            assert len([w for w in caught if w.category is RecompileWarning]) == (n > metrics.RECOMPILE_WARN_AT)
        for n in range(20, 23):
            f(torch.ones(3, n), 1, True)
    (w,) = [w for w in caught if w.category is RecompileWarning]
    text = str(w.message)
    assert "has compiled 4 times (3 recompilations)" in text
    assert "input 'x' changed shape at dimension 1 (3 -> 4)" in text
    assert "multiple of 128" in text and 'cache_implementation="static"' in text
    assert (w.filename, w.lineno) == (__file__, scale.__code__.co_firstlineno)


def test_warning_names_every_changing_input_and_its_remedy():
    f = compiled()
    with pytest.warns(RecompileWarning) as caught:
        f(torch.ones(3), 1, True)
        f(torch.ones(4), 1, True)
        f(torch.ones(4), 2, True)
        f(torch.ones(4, dtype=torch.float16), 2, True)
    text = str(caught[0].message)
    assert "inputs that changed: 'x', 'n'" in text
    assert "keep shapes static" in text and "Python values are baked into the graph" in text
    assert "give the input one dtype" in text


def test_forward_and_backward_are_graphs_of_one_compilation():
    w = torch.ones(4, requires_grad=True)

    def loss(x):
        return (x * w).sin().sum()

    f = torch.compile(loss, backend=training_standin, dynamic=False)
    f(torch.ones(4)).backward()
    f(torch.ones(4, 1)).backward()
    events = metrics.compilations()
    assert [[g.kind for g in e.graphs] for e in events] == [["forward", "backward"]] * 2
    assert events[1].reason.kind == "rank"
    s = metrics.summary()
    assert (s.compilations, s.recompilations, s.graphs) == (2, 1, 4)
    assert s.simulated_compile_s == pytest.approx(sum(g.simulated_compile_s for g in metrics.get_dynamo_metrics()))


def test_graph_break_compiles_each_piece():
    def piece(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    f = compiled(piece)
    f(torch.ones(3))
    f(torch.ones(5))
    events = metrics.compilations()
    assert [(e.name == "piece", e.recompile) for e in events] == [(True, False), (False, False), (True, True),
                                                                  (False, True)]
    assert [e.reason.input for e in events if e.recompile] == ["x", "y"]


def test_compiles_in_threads_are_all_counted():
    f = compiled()
    threads = [threading.Thread(target=f, args=(torch.ones(2), k, True)) for k in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    events = metrics.compilations()
    assert [(e.index, e.count) for e in events] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert [e.reason.input for e in events[1:]] == ["n"] * 3
    assert len(metrics.get_dynamo_metrics()) == 4


def test_simulated_compile_time_is_the_chip_figure():
    spec = CompilerSpec(graph_base_s=2.0, per_node_ms=12, graph_max_s=60.0)
    assert [spec.graph_ps(n) for n in (0, 3, 323, 10_000)] == [2_000_000_000_000, 2_036_000_000_000,
                                                               5_876_000_000_000, 60_000_000_000_000]
    for chip in ("trn1", "trn2", "trn3"):
        c = load_chip(chip).compiler
        assert 2e12 <= c.graph_ps(10) <= c.graph_ps(10**6) == 60e12
    compiled()(torch.ones(4), 1, True)
    event = metrics.compilations()[0]
    assert metrics.finish(event, 500, "inference") == state.chip().compiler.graph_ps(500)
    assert metrics.finish(event, 500, "inference") == metrics.finish(event, 500, "inference")


def test_compiler_figures_are_checked(tmp_path):
    with pytest.raises(ChipSpecError, match="graph_max_s.*at least graph_base_s"):
        CompilerSpec(graph_base_s=10.0, per_node_ms=1, graph_max_s=5.0)
    path = tmp_path / "slow.toml"
    path.write_text('extends = "trn2"\n[compiler]\nper_node_ms = -1\n')
    with pytest.raises(ChipSpecError, match="compiler.per_node_ms"):
        load_chip(path)
    path.write_text('extends = "trn2"\n[compiler]\ngraph_base_s = 30\n')
    assert load_chip(path).compiler.graph_ps(0) == 30_000_000_000_000


def test_finish_rejects_bad_arguments():
    compiled()(torch.ones(4), 1, True)
    event = metrics.compilations()[0]
    with pytest.raises(TrnSimError, match="'training' is not one of inference, forward, backward"):
        metrics.finish(event, 3, "training")
    with pytest.raises(TrnSimError, match="node count -1"):
        metrics.finish(event, -1)


def test_same_compile_id_is_one_compilation(monkeypatch):
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    monkeypatch.setattr(causes, "current_frame", lambda: causes.Frame(scale.__code__, "7/2", 2))
    a = metrics.on_compile(gm, [torch.ones(2)])
    b = metrics.on_compile(gm, [torch.ones(2)])
    assert (a.count, b.count, a.recompile, b.recompile) == (1, 1, True, True)
    assert metrics.summary().compilations == 1


def test_unknown_frame_falls_back_to_the_graph_stack():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    for node in gm.graph.nodes:
        node.meta["stack_trace"] = '  File "/src/model.py", line 42, in forward\n    return x + 1\n'
    event = metrics.on_compile(gm, [torch.ones(2)])  # outside Dynamo: no compile id, no code
    assert (event.name, event.file, event.line, event.compile_id) == ("forward", "/src/model.py", 42, None)
    assert (metrics.on_compile(gm, [torch.ones(2)]).recompile, event.recompile) == (True, False)


@pytest.mark.parametrize("reason, parsed", [
    ("0/3: tensor 'x' size mismatch at index 1. expected 8, actual 9", ("shape", "x", 1, "8", "9")),
    ("tensor 'x' rank mismatch. expected 2, actual 3", ("rank", "x", None, "2", "3")),
    ("tensor 'x' stride mismatch at index 0. expected 9, actual 1", ("stride", "x", 0, "9", "1")),
    ("tensor 'self.w' dtype mismatch. expected Float, actual BFloat16", ("dtype", "self.w", None, "Float", "BFloat16")),
    ("tensor 'x' requires_grad mismatch. expected requires_grad=0", ("requires_grad", "x", None, "0", None)),
    ("tensor 'x' Tensor device index mismatch. Expected device index to be 0, actual 1",
     ("device", "x", None, "0", "1")),
    ("1/0: n == 1                          # y = y + n  # t.py:19 in f\nUser stack trace:\n  File ...",
     ("value", "n", None, "1", None)),
    ("self.training == True", ("value", "self.training", None, "True", None)),
    ("len(xs) == 3", ("length", "xs", None, "3", None)),
    ("___check_type_id(x, 94234)", ("type", "x", None, None, None)),
    ("!0/1/2: ___check_global_state()", ("other", None, None, None, None)),
])
def test_guard_failure_reasons_are_read(reason, parsed):
    g = causes.parse(reason)
    assert (g.kind, g.input, g.dim, g.expected, g.actual) == parsed
    assert "#" not in g.text and "\n" not in g.text and not g.text.startswith(("0/", "1/", "!"))


def test_latest_reason_is_the_first_of_the_last_batch():
    assert causes.latest_reason([]) is None
    assert causes.latest_reason(["0/0: a"]) == "0/0: a"
    assert causes.latest_reason(["0/0: a", "0/1: b", "0/0: c"]) == "0/1: b"
    assert causes.latest_reason(["0/1: b", "0/0: c", "0/2: d", "0/1: e", "0/0: f"]) == "0/2: d"


def test_profile_shows_compilations_apart_from_device_time(tmp_path):
    from trnsim.trace.export import load

    f = compiled()
    with trnsim.profile(tmp_path / "c.json") as prof:
        f(torch.ones(2, 8, device="neuron"), 1, True)
        f(torch.ones(2, 9, device="neuron"), 1, True)
    assert [e.recompile for e in prof.compilations] == [False, True]
    text = str(prof.summary())
    assert "torch.compile: 2 compilations (1 recompilations), 2 graphs" in text
    assert "not device time" in text and "input 'x' changed shape at dimension 1 (8 -> 9)" in text
    trace = load(tmp_path / "c.json")
    marks = [s for s in trace.slices if s.track == "compile"]
    assert [(s.name, s.dur_ns, s.args["recompile"]) for s in marks] == [
        ("compile scale_0_inference_0", 0.0, False), ("compile scale_1_inference_1", 0.0, True)]
    assert marks[1].args["reason"] == "input 'x' changed shape at dimension 1 (8 -> 9)"
    simulated = sum(g.simulated_compile_s for g in metrics.get_dynamo_metrics())
    assert trace.meta["simulated_compile_s"] == pytest.approx(simulated)
    assert trace.total_ns == max(s.end_ns for s in trace.slices if s.track == "ops") < 1e9
    with trnsim.profile() as quiet:
        f(torch.ones(2, 9, device="neuron"), 1, True)
    assert quiet.compilations == [] and "torch.compile" not in str(quiet.summary())


def test_repeated_causes_are_told_once_per_input():
    fs = [causes.parse(f"tensor 'x' size mismatch at index 1. expected {a}, actual {b}")
          for a, b in [(100, 117), (117, 130), (8, 9)]]
    fs += [causes.parse("n == 1"), causes.parse("n == 2"), causes.parse("___check_global_state()")]
    assert causes.describe_all(fs) == [
        "input 'x' changed shape at dimension 1 (100 -> 117 -> 130, 8 -> 9)",
        "Python value 'n' changed (the graph was compiled for n == 1), 2 times",
        "guard failed: ___check_global_state()"]
