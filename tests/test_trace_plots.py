"""The plots of trnsim.trace on real traces: an NKI matmul kernel's, a trnsim.profile of a
small torch model, the same saved and loaded, and a real 2-rank job's (``trnsim run
--nproc 2``, merged by the launcher into a JobTrace)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.collections import PathCollection

import trnsim
import trnsim.trace as T
from trnsim.cli import main
from trnsim import dtypes
from trnsim.errors import TrnSimError
from trnsim.trace.events import track_label
from trnsim.trace.matching import family

matplotlib.use("Agg")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def kernel() -> T.Trace:
    from trnsim.kernels.matmul import matmul_optimized
    from trnsim.nki import trace_program, typed

    program = trace_program(matmul_optimized, typed(np.ones((256, 256)), dtypes.bfloat16),
                            typed(np.ones((256, 512)), dtypes.bfloat16), chip="trn1")
    return T.trace_from_run(trnsim.simulate(program))


def _mlp_profile(rows: int) -> T.Trace:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256))
    model = model.to("neuron").to(torch.bfloat16)
    x = torch.randn(rows, 256, device="neuron", dtype=torch.bfloat16)
    with trnsim.profile() as prof:
        model(x).float().sum().item()
    return prof.trace()


@pytest.fixture(scope="module")
def eager() -> T.Trace:
    return _mlp_profile(256)


@pytest.fixture(scope="module")
def saved(eager: T.Trace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return T.save(eager, tmp_path_factory.mktemp("plots") / "mlp.json")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("job") / "job.json"
    r = subprocess.run([sys.executable, "-m", "trnsim.cli", "run", "--nproc", "2", "--trace", str(path),
                        str(REPO / "tests" / "dist_jobs" / "allreduce_step.py")], capture_output=True, text=True,
                       timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-3000:]
    return path


def _rows(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def _legend(fig_or_ax) -> list[str]:
    legend = fig_or_ax.legends[0] if hasattr(fig_or_ax, "legends") and fig_or_ax.legends else fig_or_ax.get_legend()
    return [t.get_text() for t in legend.get_texts()]


def _ops(trace: T.Trace) -> list:
    return sorted((s for s in trace.slices if s.track == "ops"), key=lambda s: s.start_ns)


# -- timeline ---------------------------------------------------------------------------

def test_timeline_of_a_kernel_has_a_row_per_engine_and_queue(kernel: T.Trace, tmp_path: Path) -> None:
    fig = T.plot_timeline(kernel, tmp_path / "k.png")
    assert _rows(fig) == [track_label(t) for t in kernel.tracks()]
    assert _rows(fig)[:3] == ["TensorE (matmul)", "TensorE (load stationary)", "VectorE"]
    assert _rows(fig)[-1].startswith("DMA queue ")
    assert _legend(fig)[:2] == ["multiply_moving", "load_stationary"] and "dma_copy" in _legend(fig)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "simulated time (us)"
    assert ax.get_xlim() == (0.0, kernel.total_ns / 1000)
    assert "matmul_optimized on trn1" in ax.get_title()
    assert (tmp_path / "k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one bar collection per row and colour, not one patch per instruction
    assert len(ax.collections) == len({(s.track, s.name) for s in kernel.slices})
    zoom = T.plot_timeline(kernel, start_ns=1000, end_ns=2500).axes[0]
    assert zoom.get_xlim() == (1000.0, 2500.0) and zoom.get_xlabel() == "simulated time (ns)"


def test_timeline_of_a_profile_has_its_ops_on_top_and_zooms_to_an_op(eager: T.Trace) -> None:
    fig = T.plot_timeline(eager)
    engines = [track_label(t) for t in eager.tracks() if t not in ("ops", "host")]
    assert _rows(fig) == ["PyTorch ops", *engines]
    assert _legend(fig)[0] == "PyTorch op"
    written = {t.get_text() for t in fig.axes[0].texts}
    assert {"addmm", "gelu"} <= written
    gelu = next(s for s in _ops(eager) if s.name == "gelu")
    for op in ("aten::gelu", "gelu", 1):
        ax = T.plot_timeline(eager, op=op).axes[0]
        assert ax.get_xlim() == pytest.approx((gelu.start_ns / 1000, gelu.end_ns / 1000))
        assert ax.get_xlabel() == "simulated time (us)"
        assert "gelu" in ax.get_title()
    total = next(s for s in _ops(eager) if s.name == "sum.dim_IntList")
    assert T.plot_timeline(eager, op="aten::sum").axes[0].get_xlim() == pytest.approx((total.start_ns / 1000,
                                                                                        total.end_ns / 1000))


def test_timeline_of_many_slices_draws_a_collection_per_row_and_kind() -> None:
    trace = T.Trace(meta={"program": "many", "chip": "trn2"})
    trace.slices = [T.Slice(f"dma.q{k % 16}", ("dma_copy", "memset")[k % 2], 10.0 * k, 8.0) for k in range(100_000)]
    ax = T.plot_timeline(trace).axes[0]
    assert len(ax.collections) == 16 and len(ax.get_yticklabels()) == 16
    assert ax.get_xlabel() == "simulated time (us)" and ax.get_xlim() == (0.0, 999_998.0 / 1000)


def test_timeline_of_a_saved_trace_matches_the_trace(eager: T.Trace, saved: Path) -> None:
    assert _rows(T.plot_timeline(saved)) == _rows(T.plot_timeline(eager))


def test_timeline_of_a_job_groups_each_ranks_rows(job: Path, tmp_path: Path) -> None:
    trace = T.load(job)
    fig = T.plot_timeline(trace, tmp_path / "job.png")
    per_rank = [track_label(t) for t in trace.ranks[0].tracks() if t != "host"]
    assert per_rank[:2] == ["PyTorch ops", "Collectives (NeuronLink)"]
    assert _rows(fig) == per_rank + [track_label(t) for t in trace.ranks[1].tracks() if t != "host"]
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["rank 0", "rank 1"]
    assert _legend(fig)[:2] == ["PyTorch op", "collective"]
    assert "2 ranks" in fig.axes[0].get_title()
    only = T.plot_timeline(trace, ranks=[1])
    assert _rows(only) == per_rank and [t.get_text() for t in only.axes[1].get_yticklabels()] == ["rank 1"]
    assert main(["report", str(job), "--plot", str(tmp_path / "report.png")]) == 0
    assert (tmp_path / "report.png").stat().st_size > 0


@pytest.mark.parametrize("kwargs, fragments", [
    ({"op": "aten::nope"}, ["'aten::nope'", "gelu", "addmm"]),
    ({"op": 99}, ["op=99", "0 to 4"]),
    ({"start_ns": 5e9}, ["start_ns=5000000000.0", "start_ns below"]),
    ({"op": "gelu", "start_ns": 0}, ["op='gelu'", "one or the other"]),
    ({"ranks": [0]}, ["ranks=[0]", "leave ranks out"]),
    ({"width": 0}, ["width=0", "inches"]),
])
def test_timeline_refuses_what_it_cannot_zoom_to(eager: T.Trace, kwargs: dict, fragments: list[str]) -> None:
    with pytest.raises(TrnSimError) as err:
        T.plot_timeline(eager, **kwargs)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_an_op_zoom_of_a_kernel_trace_says_to_give_a_window(kernel: T.Trace) -> None:
    with pytest.raises(TrnSimError, match="no PyTorch ops.*start_ns and end_ns"):
        T.plot_timeline(kernel, op="aten::mm")


# -- utilisation and busy ----------------------------------------------------------------

def test_utilisation_draws_each_engine_and_the_dma_queues(kernel: T.Trace) -> None:
    fig = T.plot_utilisation(kernel, bucket_ns=1000)
    ax = fig.axes[0]
    queues = [t for t in kernel.tracks() if t.startswith("dma.q")]
    engines = [track_label(t) for t in kernel.tracks() if not t.startswith("dma.q")]
    assert _legend(ax) == [*engines, f"DMA queues (mean of {len(queues)})"]
    assert ax.get_ylabel() == "busy (%)" and ax.get_xlabel() == "simulated time (us)"
    table = T.utilisation(kernel, 1000)
    assert list(ax.patches[0].get_data().values) == pytest.approx([100 * r["tensor"] for r in table])
    assert fig.get_suptitle().endswith("buckets of 1,000 ns")


def test_utilisation_and_busy_of_a_job_have_each_rank(job: Path) -> None:
    trace = T.load(job)
    fig = T.plot_utilisation(trace)
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["rank 0", "rank 1"]
    busy = T.plot_busy(trace)
    labels = _rows(busy)
    assert labels[0] == "rank 0: TensorE (matmul)" and any(label.startswith("rank 1: ") for label in labels)
    assert busy.axes[0].get_xlabel() == "busy (% of simulated time)"


# -- roofline ----------------------------------------------------------------------------

def test_roofline_places_each_op_at_its_intensity(eager: T.Trace) -> None:
    fig = T.plot_roofline(eager)
    ax = fig.axes[0]
    addmm = T.ops(eager).where(op="addmm")[0]
    points = np.concatenate([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])
    assert points.shape == (1, 2)
    assert list(points[0]) == pytest.approx([addmm["intensity"], addmm["flops_per_s"] / 1e12])
    assert ax.get_xlabel() == "arithmetic intensity (FLOPs per HBM byte)" and ax.get_ylabel() == "achieved (TFLOP/s)"
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    roof = T.roofline(eager)
    assert _legend(ax)[:2] == [f"HBM {roof.hbm_bytes_per_s / 1e9:,.0f} GB/s",
                               f"TensorE fp8 {roof.peak_flops['fp8'] / 1e12:,.1f} TFLOP/s"]
    assert f"{addmm['bound']} bound" in _legend(ax)
    assert f"addmm ({100 * addmm['share']:.0f}%)" in [t.get_text() for t in ax.texts]
    assert f"ridge {roof.ridge('bf16'):,.0f} FLOP/B (bf16)" in [t.get_text() for t in ax.texts]
    assert "3 ops with no matmul FLOPs not shown" in ax.get_title()


def test_roofline_of_a_kernel_by_kernel_and_by_instruction(kernel: T.Trace) -> None:
    ax = T.plot_roofline(kernel).axes[0]   # a Program's trace has no ops: its kernel
    assert "kernels" in ax.get_title() and "matmul_optimized (100%)" in [t.get_text() for t in ax.texts]
    ax = T.plot_roofline(kernel, by="instructions", dtype="fp32").axes[0]
    assert any(t.get_text().startswith("TensorE (matmul) multiply_moving") for t in ax.texts)
    assert any("no HBM bytes" in label for label in _legend(ax))
    assert any(t.get_text().endswith("(fp32)") for t in ax.texts)
    with pytest.raises(TrnSimError, match="by='op'.*'ops', 'kernels', 'instructions'"):
        T.plot_roofline(kernel, by="op")
    with pytest.raises(TrnSimError, match="dtype='int4'.*bf16"):
        T.plot_roofline(kernel, dtype="int4")
    assert any(t.get_text().endswith("(bf16)") for t in T.plot_roofline(kernel, dtype=torch.bfloat16).axes[0].texts)


# -- memory ------------------------------------------------------------------------------

def test_profiles_carry_the_memory_counters(eager: T.Trace) -> None:
    names = {c.name: c for c in eager.counters}
    assert set(names) == {"HBM traffic", "SBUF occupancy", "PSUM occupancy"}
    hbm = names["HBM traffic"].points   # bytes/s steps: they add up to the ops' HBM bytes
    moved = sum(v * (b[0] - a[0]) * 1e-9 for a, b in zip(hbm, hbm[1:]) for v in [a[1]])
    assert moved == pytest.approx(sum(s.args["hbm_bytes"] for s in _ops(eager)), rel=1e-6)
    assert max(v for _, v in names["SBUF occupancy"].points) > 0 and names["PSUM occupancy"].points[-1][1] == 0


def test_memory_of_a_kernel_and_a_profile(kernel: T.Trace, saved: Path) -> None:
    for trace in (kernel, saved):
        fig = T.plot_memory(trace)
        hbm, chip = fig.axes
        assert hbm.get_ylabel() == "HBM traffic (GB/s)" and chip.get_ylabel() == "occupancy (% of capacity)"
        assert chip.get_xlabel() == "simulated time (us)"
        assert _legend(hbm)[1] == "HBM traffic" and _legend(hbm)[0].startswith("HBM bandwidth ")
        assert [label.split(":")[0] for label in _legend(chip)] == ["SBUF", "PSUM"]
    loaded = T.load(saved)
    loaded.counters = []     # a trace written before profiles had counters
    hbm, chip = T.plot_memory(loaded).axes
    assert "HBM traffic" in _legend(hbm)
    assert [t.get_text() for t in chip.texts] == ["no SBUF or PSUM occupancy counters in this trace"]


def test_memory_of_a_job_has_a_line_per_rank(job: Path) -> None:
    hbm, chip = T.plot_memory(T.load(job)).axes
    assert _legend(hbm)[1:] == ["rank 0: HBM traffic", "rank 1: HBM traffic"]


# -- comparison --------------------------------------------------------------------------

def test_comparison_of_two_profiles_op_by_op(eager: T.Trace, kernel: T.Trace, tmp_path: Path) -> None:
    small = _mlp_profile(64)
    fig = T.plot_comparison(eager, small, tmp_path / "cmp.svg", labels=("256 rows", "64 rows"), top=3)
    ax = fig.axes[0]
    by_time = T.ops(eager)
    assert _rows(fig) == [family(op) for op in by_time["op"][:3]] == ["addmm", "sum", "to_copy"]   # rows by family
    assert _legend(ax) == ["256 rows", "64 rows"]
    total_a, total_b = sum(by_time["time_ns"]), sum(T.ops(small)["time_ns"])
    assert ax.get_title().startswith(f"256 rows: {total_a / 1000:,.2f} us vs 64 rows: {total_b / 1000:,.2f} us")
    assert [p.get_width() for p in ax.patches[:3]] == pytest.approx([t / 1000 for t in by_time["time_ns"][:3]])
    assert ax.get_xlabel() == "simulated time (us) per op"
    svg = (tmp_path / "cmp.svg").read_bytes()
    T.plot_comparison(eager, small, tmp_path / "again.svg", labels=("256 rows", "64 rows"), top=3)
    assert (tmp_path / "again.svg").read_bytes() == svg     # deterministic
    mixed = T.plot_comparison(kernel, eager).axes[0]   # a Program against a profile: engines and opcodes
    assert "TensorE (matmul): multiply_moving" in [t.get_text() for t in mixed.get_yticklabels()]
    with pytest.raises(TrnSimError, match="top=0"):
        T.plot_comparison(eager, small, top=0)
