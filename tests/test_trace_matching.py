"""Eager against compiled: ops matched by what they compute, in ``trnsim diff``,
``plot_comparison``, ``plot_timeline(op=...)`` and the report; tables in one format a column."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trnsim
import trnsim.trace as T
from trnsim.cli import main
from trnsim.errors import TrnSimError
from trnsim.trace.comparison import OpDiff
from trnsim.trace.matching import computes, family, match, members

matplotlib.use("Agg")


class Block(nn.Module):
    """A pre-norm transformer block: layer norms, causal attention, a GELU MLP."""

    def __init__(self, d: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).split(d, -1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 8 * 8, 10))


def _profile(name: str, compiled: bool, out: Path) -> Path:
    """One SGD step of the model ``name`` on neuron, eager or compiled, profiled to a trace file."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = (_cnn() if name == "cnn" else Block()).to("neuron")
    x = torch.randn(4, 3, 8, 8) if name == "cnn" else torch.randn(2, 8, 32)
    x = x.to("neuron")
    run = torch.compile(model, backend="neuron") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = out / f"{name}_{'compiled' if compiled else 'eager'}.json"
    with trnsim.profile(path):
        run(x).square().mean().backward()
        opt.step()
    torch._dynamo.reset()
    return path


_PROFILED: dict[str, tuple[Path, Path]] = {}


def _pair(name: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(eager trace, compiled trace) of the model ``name``, profiled once for the module."""
    if name not in _PROFILED:
        out = tmp_path_factory.mktemp(name)
        _PROFILED[name] = (_profile(name, False, out), _profile(name, True, out))
    return _PROFILED[name]


@pytest.fixture(scope="module", params=["cnn", "block"])
def runs(request, tmp_path_factory) -> tuple[Path, Path]:
    """A CNN with batch norm, and a transformer block, each profiled eager and compiled."""
    return _pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> tuple[Path, Path]:
    return _pair("cnn", tmp_path_factory)


def _ops(path: Path) -> list[T.Slice]:
    return [s for s in T.load(path).slices if s.track == "ops"]


def test_an_op_family_drops_namespace_overload_underscores_and_twin_suffixes():
    assert family("aten::convolution_overrideable") == family("convolution") == "convolution"
    assert family("convolution_backward_overrideable") == family("aten::convolution_backward") \
        == "convolution_backward"
    assert family("native_batch_norm") == family("_native_batch_norm_legit_functional") \
        == family("aten::_native_batch_norm_legit_no_training.default") == "batch_norm"
    assert family("aten::add_.Tensor") == family("add.Tensor") == "add"
    assert family("sum.dim_IntList") == "sum" and family("_softmax") == "softmax"


def test_a_compiled_kernel_records_the_eager_op_each_of_its_ops_came_from(cnn):
    kernels = [s for s in _ops(cnn[1]) if "graph" in s.args]
    assert kernels and all(len(s.args["from"]) == len(s.args["ops"]) for s in kernels)
    # eager neuron records convolution as convolution_overrideable: one family
    assert {computes(s) for s in kernels if s.name.startswith("convolution")} == \
        {("convolution",), ("convolution_backward",)}
    # relu's backward is decomposed: its le and where come from threshold_backward
    le = [s for s in kernels if "aten::le.Scalar" in s.args["ops"]]
    assert le and all("threshold_backward" in computes(s) and "le" in members(s) for s in le)
    # batch norm's running statistics are written back by copy_: that is batch norm's work
    copies = [s for s in kernels if s.args["ops"] == ["aten::copy_"]]
    assert copies and {computes(s)[0] for s in copies} <= {"batch_norm", "add"}


def _diff_rows(out: str) -> list[tuple[str, int, int, float]]:
    """(name, calls a, calls b, saved us) of each op row a printed ``trnsim diff`` lists."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("op ")) + 1
    rows = []
    for line in lines[start:]:
        if line.startswith("all ops"):
            break
        name, calls_a, calls_b, _, _, saved, _ = line.rsplit(maxsplit=6)
        rows.append((name.strip(), int(calls_a), int(calls_b), float(saved)))
    return rows


def test_diff_of_eager_and_compiled_has_no_rows_that_cancel(runs, capsys):
    eager, compiled = runs
    assert main(["diff", str(eager), str(compiled), "--top", "100"]) == 0
    rows = _diff_rows(capsys.readouterr().out)
    moved = [(name, saved) for name, _, _, saved in rows if abs(saved) > 0.001]
    cancelling = [(x, y) for i, x in enumerate(moved) for y in moved[i + 1:] if abs(x[1] + y[1]) <= 0.001]
    assert not cancelling
    # every row that compiled runs is work eager ran too: each kernel matched to its eager ops' families
    assert all(calls_a > 0 for _, calls_a, calls_b, _ in rows if calls_b > 0), rows
    assert not any(name.startswith("fused[") for name, *_ in rows)
    cmp = T.compare(eager, compiled)
    eager_ops, compiled_ops = _ops(eager), _ops(compiled)
    for r in cmp.rows:   # each row holds all of eager's ops of its families and all kernels computing them
        assert r.calls_a == sum(family(s.name) in r.families for s in eager_ops)
        assert r.calls_b == sum(computes(s)[0] in r.families for s in compiled_ops)
    assert sum(r.a_ns for r in cmp.rows) == pytest.approx(cmp.a.op_ns)
    assert sum(r.b_ns for r in cmp.rows) == pytest.approx(cmp.b.op_ns)


def test_an_op_eager_runs_as_another_shares_its_row_and_lowering_runs_nothing_on_the_device(tmp_path):
    # eager neuron runs embedding's composite kernel, so it records index_select; the graph keeps embedding
    torch._dynamo.reset()
    emb = nn.Embedding(50, 16).to("neuron")
    idx = torch.tensor([[1, 4, 9, 16]]).to("neuron")
    compiled = torch.compile(emb, backend="neuron")
    with torch.no_grad(), trnsim.profile(tmp_path / "eager.json"):
        emb(idx)
    with torch.no_grad(), trnsim.profile(tmp_path / "compiled.json"):
        compiled(idx)   # compiled and lowered inside the profile
    torch._dynamo.reset()
    kernels = _ops(tmp_path / "compiled.json")
    assert [(s.name, s.args["from"]) for s in kernels] == [("embedding", ["aten::index_select"])]
    ((name, calls_a, calls_b, saved),) = [(r.name, r.calls_a, r.calls_b, r.saved_ns)
                                         for r in T.compare(tmp_path / "eager.json", tmp_path / "compiled.json").rows]
    assert (name, calls_a, calls_b, saved) == ("index_select", 1, 1, 0.0)


def test_the_cnn_rows_pair_eager_convolution_and_batch_norm_with_their_compiled_forms(cnn):
    cmp = T.compare(*cnn)

    def row(f: str) -> OpDiff:
        return next(r for r in cmp.rows if f in r.families)

    for f, eager_names in (("convolution", {"convolution_overrideable"}),
                           ("convolution_backward", {"convolution_backward_overrideable"}),
                           ("batch_norm", {"native_batch_norm", "relu"}),
                           ("batch_norm_backward", {"native_batch_norm_backward", "threshold_backward"})):
        r = row(f)
        assert set(r.names_a) == eager_names and r.calls_a == len(eager_names) and r.calls_b >= 1, r
    assert row("convolution").names_b == ("convolution",) and row("convolution").saved_ns == 0
    # batch norm and its ReLU are one kernel each way, in the row of the eager ops it computes
    assert row("relu") == row("batch_norm") and row("threshold_backward") == row("batch_norm_backward")
    assert "fused[_native_batch_norm_legit_functional+relu]" in row("batch_norm").names_b
    assert "fused[le+where+native_batch_norm_backward]" in row("batch_norm_backward").names_b


def test_plot_comparison_shows_a_fused_kernel_in_the_row_of_its_eager_op(cnn):
    eager, compiled = cnn
    fig = T.plot_comparison(eager, compiled, labels=("eager", "compiled"), top=40)
    ax = fig.axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert "mm" in rows and not any(r.startswith("fused[") for r in rows)
    assert any(s.name == "fused[mm]" for s in _ops(compiled))   # the linear layer's backward matmuls
    k = rows.index("mm")

    def bar(y: float) -> float:
        return next(p.get_width() for p in ax.patches if abs(p.get_y() + p.get_height() / 2 - y) < 1e-6)

    mm_eager = sum(s.own_ns for s in _ops(eager) if s.name == "mm") / 1000
    mm_compiled = sum(s.own_ns for s in _ops(compiled) if s.name == "fused[mm]") / 1000   # what each kernel adds to its graph
    assert mm_compiled > 0 and bar(k - 0.2) == pytest.approx(mm_eager) and bar(k + 0.2) == pytest.approx(mm_compiled)


def test_the_report_of_a_compiled_run_says_what_ran(cnn):
    trace = T.load(cnn[1])
    ops = [s for s in trace.slices if s.track == "ops"]
    kernels = {(s.args["graph"], s.args["index"]): s.name for s in ops if "graph" in s.args}
    fused = sum(name.startswith("fused[") for name in kernels.values())
    eager = sum("graph" not in s.args for s in ops)
    program = (f"compiled PyTorch: 2 graphs ({len(kernels)} kernels, {fused} fused) run 2 times, "
               f"and {eager} eager ops")
    assert trace.meta["program"] == program
    assert str(T.report(trace)).splitlines()[0] == f"program        {program} on trn2 (fidelity op)"
    assert T.load(cnn[0]).meta["program"] == f"eager PyTorch ({len(_ops(cnn[0]))} ops)"


def test_timeline_op_takes_an_aten_name_whatever_the_run_recorded(cnn):
    eager, compiled = T.load(cnn[0]), T.load(cnn[1])
    conv = next(s for s in _ops(cnn[0]) if s.name == "convolution_overrideable")
    ax = T.plot_timeline(eager, op="aten::convolution").axes[0]
    assert ax.get_xlim() == pytest.approx((conv.start_ns / 1000, conv.end_ns / 1000))
    assert "op convolution_overrideable" in ax.get_title()
    assert "op convolution " in T.plot_timeline(compiled, op="aten::convolution_overrideable").axes[0].get_title()
    # a decomposed op finds the first compiled kernel computing it
    first = next(s for s in _ops(cnn[1]) if "threshold_backward" in computes(s))
    assert f"op {first.name} " in T.plot_timeline(compiled, op="threshold_backward").axes[0].get_title()
    with pytest.raises(TrnSimError, match=r"op='aten::convlution'.*closest names: convolution"):
        T.plot_timeline(eager, op="aten::convlution")


def _slice(name: str, start: float, dur: float, **args) -> T.Slice:
    return T.Slice("ops", name, start, dur, args)


def _kernel(name: str, start: float, dur: float, ops: list[str], origins: list[str], reason: str = "") -> T.Slice:
    args = {"graph": "graph0 backward", "ops": ops, "from": origins}
    return _slice(name, start, dur, **args, **({"not_fused": reason} if reason else {}))


def test_a_slower_compiled_run_names_its_costliest_unfused_ops():
    bn = "aten::native_batch_norm_backward"
    eager = T.Trace(meta={"program": "eager"}, slices=[_slice("native_batch_norm_backward", 0, 1000),
                                                        _slice("mm", 1000, 500)])
    compiled = T.Trace(meta={"program": "compiled"}, slices=[
        _kernel("sum.dim_IntList", 0, 800, ["aten::sum.dim_IntList"], [bn], "reduces an inner axis"),
        _kernel("sum.dim_IntList", 800, 800, ["aten::sum.dim_IntList"], [bn], "reduces an inner axis"),
        _kernel("fused[sub+mul]", 1600, 500, ["aten::sub.Tensor", "aten::mul.Tensor"], [bn, bn]),
        _kernel("fused[mm]", 2100, 400, ["aten::mm"], ["aten::mm"])])
    cmp = T.compare(eager, compiled)
    assert [(r.name, r.calls_a, r.calls_b, r.saved_ns) for r in cmp.rows] == \
        [("batch_norm_backward", 1, 3, -1100.0), ("mm", 1, 1, 100.0)]
    assert str(cmp).splitlines()[-1] == (
        "b is slower than a: 1.67x its simulated time (1.000 us more); the costliest unfused ops of its compiled "
        "graphs where it spends more: sum (batch_norm_backward) 1.600 us in 2 calls")
    assert str(T.compare(eager, eager)).splitlines()[-1].startswith("simulated time")   # nothing slower
    # against a trace in which nothing ran (a run that failed before its first op)
    assert "its simulated time, where the other run has none" in str(T.compare(T.Trace(meta={}, slices=[]), compiled))
    lines = str(T.report(compiled)).splitlines()
    assert "unfused        64.0% of op time in ops without matmuls that the compiled graphs did not fuse; "\
        "costliest: sum (batch_norm_backward) 1.600 us in 2 calls" in lines


def test_match_keeps_each_family_in_one_row():
    a = [_slice("addmm", 0, 10), _slice("gelu", 10, 5), _slice("addmm", 15, 10)]
    b = [_kernel("fused[addmm+gelu]", 0, 8, ["aten::addmm", "aten::gelu"], ["aten::addmm", "aten::gelu"]),
         _kernel("fused[addmm]", 8, 6, ["aten::addmm"], ["aten::addmm"])]
    (row,) = match(a, b)
    assert row.name == "addmm + gelu" and row.families == ("addmm", "gelu")
    assert [len(ss) for ss in row.slices] == [3, 2]


# -- tables: one number format a column, units in the header ---------------------------

_NUMBER = re.compile(r"-?\d{1,3}(,\d{3})*(\.(\d+))?")


def _columns(text: str) -> list[tuple[str, list[str]]]:
    """A printed table's columns (header, cells), split at the runs of two or more
    spaces that every line has in the same place."""
    lines = text.splitlines()
    width = max(map(len, lines))
    lines = [line.ljust(width) for line in lines]
    blank = [all(line[k] == " " for line in lines) for k in range(width)]
    spans, k = [], 0
    while k < width:
        if blank[k]:
            k += 1
            continue
        end = k
        while end < width and not (blank[end] and end + 1 < width and blank[end + 1]):
            end += 1
        spans.append((k, end))
        k = end
    return [(lines[0][a:b].strip(), [line[a:b].strip() for line in lines[1:]]) for a, b in spans]


def _assert_one_format_a_column(text: str) -> None:
    for header, cells in _columns(text):
        filled = [c for c in cells if c]
        if not filled or not all(_NUMBER.fullmatch(c) or c in ("inf", "nan") for c in filled):
            continue   # a text column
        decimals = {len(m.group(3) or "") for m in map(_NUMBER.fullmatch, filled) if m}
        assert len(decimals) == 1, f"column {header!r} mixes formats: {filled}"
        assert not header.endswith("_ns") and header not in ("flops", "bytes", "share", "flops_per_s"), \
            f"column {header!r} has no unit"


def test_every_table_prints_each_column_in_one_format_with_its_unit(cnn):
    trace = T.load(cnn[0])
    tables = [T.ops(trace), T.kernels(trace), T.instructions(trace), T.critical_path(trace).head(40),
              T.waits(trace), T.utilisation(trace, bucket_ns=50_000)]
    for table in tables:
        _assert_one_format_a_column(str(table))
    header = str(T.ops(trace)).splitlines()[0].split()
    assert {"us", "%", "FLOP/B"} <= set(header) and any(h.endswith("FLOP") for h in header)
    assert "e+" not in "".join(str(t) for t in tables)
    flops = T.Table(["op", "flops"], [{"op": "mm", "flops": 1463500800}, {"op": "add", "flops": 0}])
    assert str(flops).splitlines() == ["op   flops GFLOP", "mm         1.464", "add        0.000"]
    times = T.Table(["op", "time_ns"], [{"op": "a", "time_ns": 5.497e9}, {"op": "b", "time_ns": 652_811.975}])
    assert str(times).splitlines() == ["op        time us", "a   5,497,000.000", "b         652.812"]
