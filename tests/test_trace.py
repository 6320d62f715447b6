"""Traces: Chrome trace-event export, loading back, counters and the summary."""

import json

import pytest

from trnsim import Program, TrnSimError, dtypes, simulate
from trnsim.isa import AluOp, Engine, TensorScalar
from trnsim.trace import busy_ns, load, summarize, to_chrome, trace_from_run
from trnsim.trace.events import Slice


def overlap_program():
    p = Program("trn1", name="overlap")
    h = p.hbm([2, 128, 2048], dtypes.float32, "h", kind="input")
    s = [p.sbuf([128, 2048], dtypes.float32, f"s{i}") for i in range(2)]
    d0 = p.dma(s[0], h[0], queue=0)
    p.dma(s[1], h[1], queue=3)
    p.add(TensorScalar(s[0], s[0], AluOp.MULTIPLY, 3.0, engine=Engine.VECTOR, deps=(d0,)))
    return p


def test_chrome_json_has_a_track_per_engine_and_queue(tmp_path):
    path = tmp_path / "t.json"
    run = simulate(overlap_program(), trace=path)
    data = json.loads(path.read_text())
    names = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"VectorE", "DMA queue 0", "DMA queue 3"}
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == 3
    vec = next(e for e in slices if e["cat"] == "vector")
    assert vec["args"]["deps"] == [0] and vec["args"]["opcode"] == "tensor_scalar"
    assert vec["ts"] == run.starts[2] / 1e6 and vec["dur"] == (run.ends[2] - run.starts[2]) / 1e6
    dma = next(e for e in slices if e["cat"] == "dma.q0")
    assert dma["args"]["bytes"] == 128 * 2048 * 4 and dma["args"]["descriptors"] == 128
    counters = {e["name"] for e in data["traceEvents"] if e["ph"] == "C"}
    assert counters == {"HBM traffic (bytes/s)", "SBUF occupancy (bytes)"}


def test_counters_follow_the_schedule():
    run = simulate(overlap_program())
    trace = trace_from_run(run)
    hbm = trace.counter("HBM traffic")
    # both transfers move 1 MiB each; the integral of the rate is the bytes moved
    moved = sum(rate * (t1 - t0) * 1e-9 for (t0, rate), (t1, _) in zip(hbm.points, hbm.points[1:]))
    assert moved == pytest.approx(2 * 2**20, rel=1e-6)
    assert hbm.points[-1][1] == 0
    sbuf = trace.counter("SBUF occupancy")
    assert max(v for _, v in sbuf.points) == 2 * 128 * 2048 * 4
    assert sbuf.points[-1][1] == 0


def test_load_round_trip_and_summary(tmp_path, small_matmul):
    path = tmp_path / "m.json"
    run = simulate(small_matmul(), trace=path)
    back = load(path)
    original = trace_from_run(run)
    assert len(back.slices) == len(original.slices)
    assert back.tracks() == original.tracks()
    assert back.meta["total_ns"] == run.time_ns
    s1, s2 = summarize(back), run.summary()
    assert s1.total_ns == s2.total_ns and s1.flops == s2.flops == 2 * 256 * 256 * 512
    assert s1.hbm_bytes == s2.hbm_bytes == 256 * 256 * 2 + 256 * 512 * 2 + 256 * 512 * 4
    for track, pct in s2.busy_pct.items():
        assert s1.busy_pct[track] == pytest.approx(pct, abs=1e-6)
    assert s2.achieved_flops == s2.flops / (run.time_ns * 1e-9)
    assert s2.peak_flops == run.chip.tensor_engine.peak_flops()
    text = str(s2)
    assert "TensorE (matmul)" in text and "TFLOP/s" in text and "GB/s" in text


def test_busy_counts_overlaps_once():
    slices = [Slice("t", "a", 0, 10), Slice("t", "b", 5, 10), Slice("t", "c", 30, 5), Slice("t", "d", 31, 1)]
    assert busy_ns(slices) == 20


def test_load_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(TrnSimError, match="not a trnsim trace"):
        load(bad)
    with pytest.raises(TrnSimError, match="cannot read trace"):
        load(tmp_path / "missing.json")


def test_fp32_matmul_peak_is_the_fp32_peak():
    p = Program("trn1")
    p.matmul(p.psum([128, 512], dtypes.float32, "a"), p.sbuf([128, 128], dtypes.float32, "s"),
             p.sbuf([128, 512], dtypes.float32, "m"))
    assert to_chrome(trace_from_run(simulate(p)))["otherData"]["peak_flops"] == p.chip.tensor_engine.peak_flops(fp32=True)


def test_timeline_and_busy_plots(tmp_path, small_matmul):
    from trnsim.trace import plot_busy, plot_timeline

    trace = trace_from_run(simulate(small_matmul()))
    ax = plot_timeline(trace, tmp_path / "t.png").axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["TensorE (matmul)", "TensorE (load stationary)"]
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ax = plot_busy(trace, tmp_path / "b.png").axes[0]
    assert len(ax.patches) == len(trace.tracks())
    assert (tmp_path / "b.png").stat().st_size > 0


def test_fp8_matmul_peak_counts_the_fast_fp8_path_only_in_double_row_mode():
    from trnsim.isa import Engine, LoadStationary, MultiplyMoving

    p = Program("trn2")
    p.matmul(p.psum([128, 512], dtypes.float32, "a"), p.sbuf([128, 128], dtypes.float8_e4m3, "s"),
             p.sbuf([128, 512], dtypes.float8_e4m3, "m"))
    s = simulate(p).summary()
    assert s.peak_flops == p.chip.tensor_engine.peak_flops() and s.pct_of_peak <= 100
    d = Program("trn2")
    d.add(LoadStationary(d.sbuf([128, 2, 128], dtypes.float8_e4m3, "s").view(), True, engine=Engine.TENSOR))
    d.add(MultiplyMoving(d.psum([128, 512], dtypes.float32, "a").view(), d.sbuf([128, 2, 512], dtypes.float8_e5m2, "m").view(),
                         False, True, engine=Engine.TENSOR, deps=(0,)))
    s = simulate(d).summary()
    assert d.flops() == 2 * 256 * 128 * 512
    assert s.peak_flops == 2 * d.chip.tensor_engine.peak_flops() and s.pct_of_peak <= 100


def _rank_trace(origin_ps, slices):
    from trnsim.trace import Trace

    return Trace(process="r", slices=[Slice(track, name, start, dur, {}) for track, name, start, dur in slices],
                 meta={"origin_ps": origin_ps})


def test_merge_puts_ranks_on_the_shared_clock_and_reads_back(tmp_path):
    from trnsim.trace import JobTrace, merge, save_job

    a = _rank_trace(10_000, [("ops", "mm", 0.0, 5.0), ("collectives", "all_reduce", 20.0, 4.0)])
    b = _rank_trace(14_000, [("ops", "mm", 0.0, 5.0), ("collectives", "all_reduce", 16.0, 4.0)])
    job = merge([a, b])
    # rank 1's trace starts 4,000 ps later on the shared clock: its slices move by 4 ns,
    # and the all-reduce the ranks meet at starts at the same time on both
    assert [s.start_ns for s in job.collectives(0)] == [20.0]
    assert [s.start_ns for s in job.collectives(1)] == [20.0]
    assert [s.start_ns for s in job.ranks[1].slices if s.track == "ops"] == [4.0]
    path = save_job(job, tmp_path / "job.json")
    back = load(path)
    assert isinstance(back, JobTrace) and back.world_size == 2
    assert [(s.track, s.name, s.start_ns, s.dur_ns) for s in back.ranks[1].slices] == \
        [(s.track, s.name, s.start_ns, s.dur_ns) for s in job.ranks[1].slices]
    data = json.loads(path.read_text())
    assert {e["pid"] for e in data["traceEvents"]} == {1, 2}


def test_a_damaged_job_trace_is_refused_by_name(tmp_path):
    from trnsim.trace import merge, save_job

    path = save_job(merge([_rank_trace(0, [("ops", "mm", 0.0, 1.0)])]), tmp_path / "job.json")
    with pytest.raises(TrnSimError, match="already a merged job trace"):
        merge([path])
    data = json.loads(path.read_text())
    next(e for e in data["traceEvents"] if e["ph"] == "X")["pid"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(TrnSimError, match="pid=7, which names no rank"):
        load(path)


def test_the_sample_trace_is_what_the_demo_writes_now(tmp_path):
    """traces/sample.json (the trace a reader opens first) stays true: the demo writes it
    again byte for byte, wherever trnsim is installed, and it loads as documented."""
    import pathlib
    import subprocess
    import sys

    sample = pathlib.Path(__file__).resolve().parent.parent / "traces" / "sample.json"
    fresh = tmp_path / "demo.json"
    cli = pathlib.Path(sys.executable).with_name("trnsim")
    r = subprocess.run([str(cli), "demo", "--trace", str(fresh)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert fresh.read_bytes() == sample.read_bytes(), "regenerate it: trnsim demo --trace traces/sample.json"
    trace = load(sample)
    assert (trace.meta["program"], trace.meta["chip"], trace.meta["instructions"]) == ("matmul_optimized", "trn2", 304)
    assert trace.meta["chip_source"] == "trnsim/hw/chips/trn2.toml"
    assert trace.total_ns == 47291.263
    assert {(c.name, c.unit) for c in trace.counters} == {("HBM traffic", "bytes/s"), ("SBUF occupancy", "bytes"),
                                                          ("PSUM occupancy", "bytes")}
