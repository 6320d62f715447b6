"""Trace analysis: the critical path and waits, roofline tables, utilisation over time, ranks."""

import csv

import pytest

from trnsim import Program, TrnSimError, dtypes, simulate
from trnsim.isa import (Activation, ActivationFunc, AluOp, Engine, Memset, SemaphoreSignal, SemaphoreWait,
                        TensorScalar)
from trnsim.trace import (JobTrace, Slice, Table, Trace, busy_ns, critical_path, instructions, kernels, load, merge,
                          ops, roofline, save, save_job, trace_from_run, utilisation, waits)
from trnsim.trace.critical import engine_slices


def known_path_program():
    """x [128, 512] and w [128, 128] load on queues 0 and 1; a matmul waits for both, a relu
    on the scalar engine reads its PSUM, queue 2 stores the result. The vector engine scales
    an unrelated tile at the start. w's load has 256-byte rows, so it ends after x's
    (2002.353 ns against 1481.882 ns): the path runs through w."""
    p = Program("trn1", name="known_path")
    x = p.hbm([128, 512], dtypes.bfloat16, "x", kind="input")
    w = p.hbm([128, 128], dtypes.bfloat16, "w", kind="input")
    out = p.hbm([128, 512], dtypes.float32, "out", kind="output")
    xs = p.sbuf([128, 512], dtypes.bfloat16, "xs")
    ws = p.sbuf([128, 128], dtypes.bfloat16, "ws")
    acc = p.psum([128, 512], dtypes.float32, "acc")
    ys = p.sbuf([128, 512], dtypes.float32, "ys")
    side = p.sbuf([128, 64], dtypes.float32, "side")
    lx = p.dma(xs, x, queue=0)                                          # 0
    lw = p.dma(ws, w, queue=1)                                          # 1
    mm = p.matmul(acc[:, :], ws[:, :], xs[:, :], deps=(lx, lw))        # 2 load, 3 multiply
    act = p.add(Activation(ys[:, :], acc[:, :], ActivationFunc.RELU, engine=Engine.SCALAR, deps=(mm,)))  # 4
    p.add(TensorScalar(side[:, :], side[:, :], AluOp.MULTIPLY, 2.0, engine=Engine.VECTOR))  # 5
    p.dma(out, ys, queue=2, deps=(act,))                                # 6
    return p


# trn1's latencies: an engine waiting on another engine, and a DMA queue on an engine
SEM_NS, SEM_TO_DMA_NS = 190.0, 1300.0


def test_the_critical_path_of_a_small_program_is_the_one_worked_out_by_hand(tmp_path):
    run = simulate(known_path_program())
    assert (run.chip.sync.semaphore_wait_ns, run.chip.dma.semaphore_to_start_ns) == (SEM_NS, SEM_TO_DMA_NS)
    path = critical_path(run)
    assert path["index"] == [1, 2, 3, 4, 6]
    assert path["track"] == ["dma.q1", "tensor.load", "tensor", "scalar", "dma.q2"]
    assert path["waited_on"] == ["launch", "dma", "engine", "engine", "engine"]
    assert path["on"] == [None, 1, 2, 3, 4]
    end = dict(zip(path["index"], path["end_ns"]))
    start = dict(zip(path["index"], path["start_ns"]))
    # by hand: each step starts when what it waited on ended, plus the semaphore latency
    # between engines (none between the stationary load and its multiply: one engine)
    assert start[1] == 0.0 and end[1] == 2002.353
    assert start[2] == end[1] + SEM_NS == 2192.353
    assert start[3] == end[2] == 2203.782
    assert start[4] == pytest.approx(end[3] + SEM_NS) and start[4] == 2599.496
    assert start[6] == pytest.approx(end[4] + SEM_TO_DMA_NS) and start[6] == 4308.067
    assert end[6] == run.time_ns == 6271.832
    latencies = SEM_NS + SEM_NS + SEM_TO_DMA_NS
    assert sum(path["dur_ns"]) + latencies == pytest.approx(run.time_ns)
    # the x load ended earlier (1481.882 ns) and the vector op at 110.714 ns: off the path
    assert run.ends[0] / 1000 == 1481.882 and run.ends[5] / 1000 == 110.714
    assert path["idle_ns"] == [0.0, 2192.353, 2203.782, 2599.496, 4308.067]
    save(trace_from_run(run), tmp_path / "k.json")
    assert_same_path(critical_path(tmp_path / "k.json"), path)


def assert_same_path(got, want):
    """Equal paths; times to the picosecond (a saved trace keeps microseconds to 6 places)."""
    assert got.columns == want.columns and len(got) == len(want)
    for a, b in zip(got, want):
        for column in want.columns:
            assert a[column] == (pytest.approx(b[column], abs=1e-3) if column.endswith("_ns") else b[column])


def test_a_semaphore_wait_on_the_path_names_its_semaphore_and_signal():
    p = Program("trn1", name="sem")
    a = p.sbuf([128, 512], dtypes.float32, "a")
    b = p.sbuf([128, 512], dtypes.float32, "b")
    p.add(Memset(a, 0.0, engine=Engine.VECTOR))                         # 0
    p.add(SemaphoreSignal(sem="ready", engine=Engine.VECTOR))           # 1
    p.add(SemaphoreWait(sem="ready", count=1, engine=Engine.GPSIMD))    # 2
    p.add(Memset(b, 1.0, engine=Engine.GPSIMD))                         # 3
    run = simulate(p)
    path = critical_path(run)
    assert path["index"] == [0, 1, 2, 3]
    assert path["waited_on"] == ["launch", "busy", "semaphore", "busy"]
    assert path["on"] == [None, 0, 1, 2] and path["sem"] == [None, None, "ready", None]
    assert path[1]["end_ns"] == 510.714 and path[2]["start_ns"] == pytest.approx(path[1]["end_ns"] + SEM_NS) == 700.714
    table = waits(run)
    gpsimd = {r["waited_on"]: r for r in table.where(track="gpsimd")}
    assert gpsimd["semaphore"]["count"] == 1 and gpsimd["semaphore"]["wait_ns"] == path[2]["start_ns"]


def test_waits_account_for_every_idle_nanosecond_of_each_track():
    import trnsim.trace

    run = simulate(known_path_program())
    trace = trace_from_run(run)
    table = trnsim.trace.waits(trace)   # still the function once tracing has imported its helpers
    scalar = {r["waited_on"]: r["wait_ns"] for r in table.where(track="scalar")}
    assert scalar == {"engine": 2599.496, "finished": pytest.approx(6271.832 - 3008.067)}
    for track in {s.track for s in engine_slices(trace)}:
        slices = [s for s in trace.slices if s.track == track]
        waited = sum(table.where(track=track)["wait_ns"])
        assert waited + busy_ns(slices) == pytest.approx(run.time_ns)


def test_an_old_trace_without_wait_causes_is_refused():
    trace = trace_from_run(simulate(known_path_program()))
    for s in trace.slices:
        del s.args["wait"]
    with pytest.raises(TrnSimError, match="no instruction slices with a 'wait' argument"):
        critical_path(trace)


def test_utilisation_over_time_sums_to_busy_time():
    trace = trace_from_run(simulate(known_path_program()))
    table = utilisation(trace, bucket_ns=1000)
    assert table["start_ns"][:3] == [0.0, 1000.0, 2000.0] and table["end_ns"][-1] == 6271.832
    assert len(table) == 7 and table[0]["dma.q1"] == 1.0
    for track in {s.track for s in engine_slices(trace)}:
        covered = sum(r[track] * (r["end_ns"] - r["start_ns"]) for r in table)
        assert covered == pytest.approx(busy_ns([s for s in trace.slices if s.track == track]))
    assert len(utilisation(trace)) == 20
    with pytest.raises(TrnSimError, match="bucket_ns -1"):
        utilisation(trace, bucket_ns=-1)


def test_nki_kernel_tables_put_matmuls_on_the_compute_side_and_dmas_on_the_memory_side(small_matmul):
    trace = trace_from_run(simulate(small_matmul()))
    roof = roofline(trace)
    assert roof.chip == "trn1" and roof.hbm_bytes_per_s == 410e9
    assert roof.ridge("bfloat16") == pytest.approx(2 * 128 * 128 * 2.8e9 / 410e9)
    table = instructions(trace)
    by = {(r["track"], r["opcode"]): r for r in table}
    mm = by[("tensor", "multiply_moving")]
    assert mm["bound"] == "compute" and mm["flops"] == 2 * 256 * 256 * 512 and mm["dtype"] == "bfloat16"
    assert all(r["bound"] == "memory" for r in table if r["opcode"] == "dma_copy")
    assert sum(table["calls"]) == len(trace.slices)
    assert sum(table["time_ns"]) == pytest.approx(sum(s.dur_ns for s in trace.slices))
    (program,) = kernels(trace)
    assert program["kind"] == "program" and program["flops"] == trace.meta["flops"]
    assert program["bytes"] == sum(s.args.get("hbm_bytes", 0) for s in trace.slices)
    assert program["intensity"] == pytest.approx(program["flops"] / program["bytes"])
    each = instructions(trace, each=True)
    assert len(each) == len(trace.slices) and each["index"][0] == 0


def test_profile_tables_classify_a_large_matmul_and_an_elementwise_add(tmp_path):
    torch = pytest.importorskip("torch")
    import trnsim

    torch.manual_seed(5)
    a = torch.randn(1024, 1024, device="neuron", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="neuron", dtype=torch.bfloat16)
    with trnsim.profile() as prof:
        (a @ b + a).sum()
    trace = prof.trace()
    table = ops(trace)
    mm, add = table.where(op="mm")[0], table.where(op="add.Tensor")[0]
    assert (mm["bound"], add["bound"]) == ("compute", "memory")
    assert mm["flops"] == 2 * 1024 ** 3 and mm["dtype"] == "bfloat16"
    assert mm["intensity"] > roofline(trace).ridge("bfloat16") > 0
    assert add["flops"] == 0 and add["bytes"] >= 3 * 1024 * 1024 * 2
    assert sum(table["share"]) == pytest.approx(1.0)
    ks = kernels(trace)
    assert set(ks["kind"]) == {"kernel"} and ks.where(bound="compute")["kernel"] == [mm_kernel(trace)]
    path = critical_path(trace)
    assert_same_path(critical_path(save(trace, tmp_path / "p.json")), path)
    assert [r["op"] for r in path if r["track"] == "ops"] == ["mm", "add.Tensor", "sum.dim_IntList"]
    assert path[0]["waited_on"] == "launch" and path.where(track="ops")["waited_on"][1:] == ["busy", "busy"]
    for track in {s.track for s in engine_slices(trace)}:
        covered = sum(r[track] * (r["end_ns"] - r["start_ns"]) for r in utilisation(trace))
        assert covered == pytest.approx(busy_ns([s for s in trace.slices if s.track == track]))
    by_rank = ops(merge([trace, trace]))
    assert by_rank.columns[:2] == ["rank", "op"] and by_rank.where(rank=1)["bound"] == table["bound"]


def mm_kernel(trace):
    return next(s.args["kernel"] for s in trace.slices if s.track == "ops" and s.name == "mm")


def test_a_merged_job_trace_gets_a_rank_column(tmp_path):
    one = trace_from_run(simulate(known_path_program()))
    job = merge([one, one])
    path = critical_path(job)
    assert path.columns[0] == "rank" and path["rank"] == [0] * 5 + [1] * 5
    assert path.where(rank=1)["index"] == [1, 2, 3, 4, 6]
    table = instructions(job)
    assert sorted(set(table["rank"])) == [0, 1] and len(table) == 2 * len(instructions(one))
    assert set(waits(job)["rank"]) == {0, 1}
    back = load(save_job(job, tmp_path / "job.json"))
    assert isinstance(back, JobTrace)
    assert_same_path(critical_path(back), path)
    assert utilisation(back, bucket_ns=1000)["rank"] == [0] * 7 + [1] * 7


def test_a_table_sorts_filters_and_writes_csv(tmp_path):
    table = Table(["name", "ns"], [{"name": "a", "ns": 2.0}, {"name": "b", "ns": 5.5}, {"name": "c", "ns": 1}])
    assert table.sort("ns")["name"] == ["b", "a", "c"]
    assert table.sort("ns", descending=False).head(1)["name"] == ["c"]
    assert table.where(lambda r: r["ns"] > 1)["name"] == ["a", "b"] and table.where(name="c")[0]["ns"] == 1
    assert str(table).splitlines() == ["name     ns", "a     2.000", "b     5.500", "c     1.000"]   # one format a column
    path = table.to_csv(tmp_path / "t.csv")
    assert list(csv.reader(path.open())) == [["name", "ns"], ["a", "2.0"], ["b", "5.5"], ["c", "1"]]
    with pytest.raises(KeyError, match="no column 'x'"):
        table["x"]
    with pytest.raises(TrnSimError, match="lacks columns"):
        Table(["a", "b"], [{"a": 1}])
    pandas = pytest.importorskip("pandas")
    assert isinstance(table.to_pandas(), pandas.DataFrame) and list(table.to_pandas()["ns"]) == [2.0, 5.5, 1]


def test_a_compiled_graph_is_a_kernels_row_and_a_collective_is_a_step_of_the_op_path():
    # a profile's trace as torch.compile and a collective write it: two fused kernels of
    # graph0, then an all-reduce issued 500 ns after the graph ended
    meta = {"chip": "trn2", "eager": True, "hbm_bw_gbps": 725.0}
    fused = {"timed_by": "kernel", "kernel": "fused_matmul_kernel", "graph": "graph0", "dtypes": ["bfloat16"]}
    trace = Trace(meta=meta, slices=[
        Slice("graphs", "graph0", 0.0, 3000.0, {"kernels": 2}),
        Slice("ops", "fused[addmm+gelu]", 0.0, 2000.0, {**fused, "index": 0, "flops": 4e9, "hbm_bytes": 1e7}),
        Slice("ops", "fused[addmm]", 2000.0, 1000.0, {**fused, "index": 1, "flops": 2e9, "hbm_bytes": 2e6}),
        Slice("collectives", "all_reduce", 3500.0, 500.0, {"bytes": 1024}),
    ])
    rows = {r["kind"]: r for r in kernels(trace)}
    assert set(rows) == {"fused", "graph"}
    graph = rows["graph"]
    assert (graph["kernel"], graph["calls"], graph["time_ns"], graph["flops"], graph["bytes"]) == \
        ("graph0", 1, 3000.0, 6e9, 1.2e7)
    assert graph["intensity"] == 500.0 and graph["bound"] == "compute" and graph["share"] == 0.75
    assert rows["fused"]["calls"] == 2 and rows["fused"]["flops_per_s"] == pytest.approx(6e9 / 3e-6)
    path = critical_path(trace)
    assert path["name"] == ["fused[addmm+gelu]", "fused[addmm]", "all_reduce"]
    assert path["waited_on"] == ["launch", "busy", "host"] and path["on"] == [None, "fused[addmm+gelu]", None]
    assert path["idle_ns"] == [0.0, 0.0, 500.0]
