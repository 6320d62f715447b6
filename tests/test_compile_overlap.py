"""Kernels of a compiled graph overlap where one ends and the next begins (one Program
per pair of neighbours, their dependencies the tiles'); eager ops never do."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

import trnsim
from trnsim.backend import state
from trnsim.backend.compile import overlap
from trnsim.backend.lowering import placeholder, run_kernel
from trnsim.models.prenorm import PreNormBlock
from trnsim.trace import critical_path
from trnsim.trace.export import load


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _profiled(fn, x, path=None):
    with torch.no_grad():
        fn(x)
        torch.neuron.synchronize()
        with trnsim.profile(path) as prof:
            fn(x)
            torch.neuron.synchronize()
    return prof


def _two_blocks():
    torch.manual_seed(0)
    blocks = nn.Sequential(PreNormBlock(256, causal=False), PreNormBlock(256, causal=False))
    return blocks.to("neuron"), torch.randn(2, 128, 256).to("neuron")


def test_a_compiled_transformer_overlaps_its_kernels_and_eager_does_not(tmp_path):
    model, x = _two_blocks()
    eager = _profiled(model, x)
    path = tmp_path / "compiled.json"
    compiled = _profiled(torch.compile(model, backend="neuron"), x, path)
    for a, b in zip(eager.records, eager.records[1:]):   # eager: one op at a time
        assert b.start_ps >= a.end_ps
    kernels = [r for r in compiled.records if r.info is not None]
    overlaps = [r.info["overlap_ps"] for r in kernels]
    assert sum(o > 0 for o in overlaps) >= 2   # kernels hide time under the ones around them
    for a, b in zip(kernels, kernels[1:]):   # each ends its after_ps after the one ahead (kernels keep their order)

        assert b.end_ps == a.end_ps + b.info["after_ps"] >= a.end_ps

        assert b.start_ps == max(b.end_ps - b.info["lead_ps"], kernels[0].start_ps)   # its first instruction
    assert compiled.device_ps == kernels[-1].end_ps - kernels[0].start_ps
    assert compiled.device_ps == 84_949_294   # simulated time is deterministic
    assert compiled.device_ps < 0.8 * eager.device_ps
    # the trace: a kernel's engines start before the kernel ahead of it has finished
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert "PyTorch ops (2)" in names.values()
    ahead, after = max(zip(kernels, kernels[1:]), key=lambda pair: pair[1].info["overlap_ps"])
    engine = [e for e in events if e.get("ph") == "X" and e["cat"] not in ("ops", "graphs", "host", "compile")]
    lo, hi = after.start_ps / 1e6, ahead.end_ps / 1e6
    t0 = min(r.start_ps for r in compiled.records) / 1e6
    assert any(lo - t0 <= e["ts"] < hi - t0 for e in engine)
    # every slice of a thread nests or follows the one before: what Perfetto needs
    by_tid: dict[int, list] = {}
    for e in events:
        if e.get("ph") == "X":
            by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + 1e-6:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6
            stack.append(end)
    assert len(loaded_counters(path)) == 2
    for c in loaded_counters(path):   # overlapping kernels' tiles add up, and all are freed at the end
        assert min(v for _, v in c.points) >= 0 and c.points[-1][1] == 0, c.name
    loaded = load(path)   # the lanes read back as one track
    assert sum(s.track == "ops" for s in loaded.slices) == len(compiled.records)
    # the critical path takes each kernel's own instructions, though kernels overlap
    path = critical_path(loaded)
    spans = {}
    for s in loaded.slices:
        if s.track == "ops":
            spans.setdefault(s.name, []).append((s.start_ns, s.end_ns))
    steps = [(op, start, end) for op, track, start, end in zip(path["op"], path["track"], path["start_ns"],
                                                                 path["end_ns"]) if track not in ("ops", "collectives")]
    assert steps
    for op, start, end in steps:
        assert any(a - 1e-3 <= start and end <= b + 1e-3 for a, b in spans[op]), (op, start, end)
    assert path["op"] == critical_path(compiled.trace())["op"]


def loaded_counters(path):
    return [c for c in load(path).counters if c.name in ("SBUF occupancy", "PSUM occupancy")]


def _gemm(shape_a, shape_b, dtype=torch.bfloat16):
    from trnsim.kernels.gemm import matmul_general

    return run_kernel(matmul_general, "matmul_general", placeholder(shape_a, dtype), placeholder(shape_b, dtype))


def test_a_kernel_that_reads_the_one_before_overlaps_less_than_one_that_does_not():
    a = _gemm((256, 128), (256, 512))           # [128, 512] out
    b = _gemm((512, 128), (512, 256))           # reads a [512, 128]: a's result reshaped
    linked = overlap.places([a, b], [[], [0]], [False, False])
    apart = overlap.places([a, b], [[], []], [False, False])
    assert linked[0].after_ps >= a.ps and apart[0].after_ps >= a.ps   # the first is not sped up
    # b ends earlier than it would alone after a, and later where it waits for a's result
    assert apart[1].after_ps < linked[1].after_ps < b.ps
    assert linked[1].lead_ps > linked[1].after_ps   # it starts before a ends
    assert overlap.places([a, b], [[], [0]], [False, False]) == linked   # worked out once


def test_no_overlap_across_a_collective_or_without_a_shared_shape_or_a_program():
    a = _gemm((256, 128), (256, 512))
    b = _gemm((512, 128), (512, 256))
    alone = [overlap.Place.alone(a), overlap.Place.alone(b)]
    assert overlap.places([a, b], [[], [0]], [False, True]) == alone
    assert overlap.places([a, b], [[], [0]], [False, False], alone=[False, True]) == alone
    other = _gemm((384, 128), (384, 128), torch.float32)   # no input of a's dtype: kept apart
    assert overlap.places([a, other], [[], [0]], [False, False]) == [alone[0], overlap.Place.alone(other)]
    assert overlap.places([a, other], [[], []], [False, False])[1].after_ps < other.ps
    estimate = trnsim.backend.opcost.estimate(1 << 20)
    assert overlap.places([a, estimate], [[], []], [False, False]) == [alone[0], overlap.Place.alone(estimate)]


def test_a_segment_is_cut_before_a_kernel_that_finds_no_result_it_reads():
    """Three kernels: the third reads the second's result in a shape it has not (kept
    apart from it), and the first two are one segment."""
    a = _gemm((256, 128), (256, 512))
    b = _gemm((512, 128), (512, 256))
    c = _gemm((384, 128), (384, 128), torch.float32)
    placed = overlap.places([a, b, c], [[], [0], [1]], [False] * 3)
    assert placed[:2] == overlap.places([a, b], [[], [0]], [False, False])
    assert placed[2] == overlap.Place.alone(c)


def test_a_kernel_reads_the_result_of_a_kernel_further_ahead():
    """A segment links a kernel to any earlier kernel's result, not only its neighbour's:
    the third kernel's load of the first one's result waits for the first one's data."""
    a = _gemm((256, 128), (256, 512))   # [128, 512]
    mid = _gemm((384, 128), (384, 128), torch.float32)   # unrelated
    b = _gemm((512, 128), (512, 256))   # reads a's result
    placed = overlap.places([a, mid, b], [[], [], [0]], [False] * 3)
    run = placed[2].run
    assert run is not None and placed[0].run is run and placed[1].run is run   # one Program
    program = run.program
    made = {id(i.dst.tensor) for i in program.instructions[:placed[0].last] if i.opcode == "dma_copy"
            and not i.dst.tensor.on_chip}
    fed = [i for i in program.instructions[placed[2].first:placed[2].last] if i.opcode == "dma_copy"
           and id(i.src.tensor) in made]
    assert fed and all(any(d < placed[0].last for d in i.deps) for i in fed)


def test_default_chip_is_trn2():
    assert state.chip().name == "trn2"


def test_a_compiled_linear_takes_the_faster_layout_of_its_activation():
    """The activation a Linear reads is row-major; the compiled kernel either transposes
    it on chip (``fused_matmul_rows_kernel``) or reads it as the producer could have
    written it, transposed (``fused_matmul_kernel``): whichever the chip runs faster."""
    from trnsim.kernels.fused_matmul import fused_matmul_kernel, fused_matmul_rows_kernel

    torch.manual_seed(0)
    lin = nn.Linear(768, 768).to(torch.bfloat16).to("neuron")
    prof = _profiled(torch.compile(lambda x: lin(x), backend="neuron"), torch.randn(128, 768).to(torch.bfloat16).to("neuron"))
    (rec,) = [r for r in prof.records if r.name.startswith("fused[addmm")]
    kernel, args, kwargs = rec.cost.call
    assert kwargs["rhs_tiled"]   # the weight is a parameter: stored as the kernel loads it
    if kernel is fused_matmul_rows_kernel:
        rows = args[0].array.shape[0]   # each physical core's share of the 128 rows
        other = run_kernel(fused_matmul_kernel, "fused_matmul_kernel", placeholder((768, rows), torch.bfloat16),
                           *args[1:], **kwargs)
    else:
        assert kernel is fused_matmul_kernel
        rows = args[0].array.shape[1]
        other = run_kernel(fused_matmul_rows_kernel, "fused_matmul_rows_kernel",
                           placeholder((rows, 768), torch.bfloat16), *args[1:], **kwargs)
    assert rec.cost.ps <= other.ps   # the faster of the two layouts


def test_only_a_models_parameters_are_stored_as_the_kernel_loads_them():
    """A weight the user passes in (not a parameter) lies in memory as the user made it:
    the compiled matmul reads it in rows; a Linear's weight is laid out by the compiler."""
    torch.manual_seed(0)
    x = torch.randn(128, 256).to("neuron")
    w = torch.randn(256, 256).to("neuron")
    prof = _profiled(torch.compile(lambda a: torch.relu(a @ w), backend="neuron"), x)
    (rec,) = [r for r in prof.records if r.name.startswith("fused[")]
    assert rec.cost.call[2]["rhs_tiled"] is False
    lin = nn.Linear(256, 256).to("neuron")
    prof = _profiled(torch.compile(lambda a: torch.relu(lin(a)), backend="neuron"), x)
    (rec,) = [r for r in prof.records if r.name.startswith("fused[")]
    assert rec.cost.call[2]["rhs_tiled"] is True


def test_a_result_is_handed_on_in_sbuf_to_a_later_kernel_only():
    """In a segment, a kernel's load of an earlier kernel's result waits for the data in
    SBUF (what the store waited for), not for the store; a kernel's own store and
    reload (a scratch round trip, a spill) still wait for the store."""
    for later in (True, False):
        program, reload = _handed_on(lambda mid: mid[0:64, :], own=not later, with_program=True)
        store = next(i for i in program if i.opcode == "dma_copy" and i.dst.tensor is reload.src.tensor)
        if later:
            assert store.index not in reload.deps and set(store.deps) <= set(reload.deps)
        else:
            assert store.index in reload.deps


def _handed_on(reload_view, store_dtype=None, between=None, own=False, with_program=False):
    """A kernel stores ``exp(x)`` ([128, 64] fp32, in ``store_dtype``) and a later kernel
    of the same segment loads ``reload_view(mid)`` of it back, results kept where they
    are. ``between(mid, tile)``, if given, runs after the store, before the second kernel;
    ``own``: the store and the load are both the second kernel's."""
    import numpy as np

    from trnsim import nki
    import trnsim.nki.language as nl
    from trnsim.nki.forwarding import Forwarding
    from trnsim.nki.tracer import current

    @nki.jit
    def two_kernels(x):
        tracer = current()
        tracer.forwarding = Forwarding(tracer.program)
        dtype = store_dtype or x.dtype
        mid = nl.ndarray(x.shape, dtype, buffer=nl.shared_hbm)
        out = nl.ndarray((64, 64), dtype, buffer=nl.shared_hbm)
        if own:
            tracer.hand_on = len(tracer.program.instructions)
        tile = nl.exp(nl.load(x))
        nl.store(mid, value=tile)
        if between is not None:
            between(mid, tile)
        if not own:
            tracer.hand_on = len(tracer.program.instructions)   # the second kernel starts
        nl.store(out, value=nl.load(reload_view(mid)))
        return out

    program = nki.trace_program(two_kernels, np.ones((128, 64), np.float32))
    load = [i for i in program if i.opcode == "dma_copy" and i.src.tensor.name == program.instructions[2].dst.tensor.name][-1]
    return (program, load) if with_program else load


def test_a_result_read_in_the_partitions_it_was_stored_from_stays_in_sbuf():
    """A later kernel's load of a result whose every element lands in the partition it
    was stored from is forwarded (the compiler keeps the result in SBUF); one that moves
    elements to other partitions, or reads a result converted on its way out, moves them."""
    import trnsim.nki.language as nl

    assert _handed_on(lambda mid: mid[0:64, :]).forwarded   # partitions 0..63 into 0..63
    assert not _handed_on(lambda mid: mid[64:128, :]).forwarded   # partitions 64..127 into 0..63
    assert not _handed_on(lambda mid: mid.reshape((64, 128))[:, 0:64]).forwarded   # another row length
    assert not _handed_on(lambda mid: mid[0:64, :], store_dtype=nl.bfloat16).forwarded   # converted


def test_a_result_no_longer_in_sbuf_or_the_kernels_own_moves():
    """Forwarded only while the data is where the store read it: not once the stored tile
    has been written again, not once HBM holds something else there, and never for a
    kernel's own store and reload (a scratch round trip)."""
    import trnsim.nki.language as nl

    def overwrite_tile(mid, tile):
        tile[...] = nl.exp(tile)

    def overwrite_hbm(mid, tile):
        import trnsim.nki.isa as nisa

        nisa.dma_copy(dst=mid[0:64, :], src=mid[64:128, :])   # HBM to HBM: never in SBUF

    assert not _handed_on(lambda mid: mid[0:64, :], between=overwrite_tile).forwarded
    assert not _handed_on(lambda mid: mid[0:64, :], between=overwrite_hbm).forwarded
    assert not _handed_on(lambda mid: mid[0:64, :], own=True).forwarded
    untouched = _handed_on(lambda mid: mid[0:64, :], between=lambda mid, tile: nl.store(mid[64:128, :], value=tile[64:128, :]))
    assert untouched.forwarded   # a write of other rows leaves these in SBUF

    def copied_in_place(mid, tile):   # rows 0..63 rewritten from a tile of partitions 0..63, still in SBUF
        nl.store(mid[0:64, :], value=nl.load(mid[64:128, :]))

    assert _handed_on(lambda mid: mid[0:64, :], between=copied_in_place).forwarded


def test_a_forwarded_transfer_takes_no_time_and_moves_nothing():
    from trnsim.hw.dma import FORWARDED, DmaSystem, plan_dma

    load = _handed_on(lambda mid: mid[0:64, :])
    assert plan_dma(state.chip(), load) is FORWARDED and FORWARDED.hbm_bytes == 0
    pool = DmaSystem()
    assert pool.transfer(5_000, FORWARDED) == 5_000 and (pool.pool_free, pool.hbm_free) == (0, 0)
    moved = _handed_on(lambda mid: mid[64:128, :])
    assert plan_dma(state.chip(), moved).hbm_bytes == 64 * 64 * 4   # read from HBM


def test_a_forwarded_load_starts_when_its_data_is_in_sbuf():
    """No semaphore-to-DMA latency and no transfer: it starts and ends when what the
    store waited for has ended."""
    from trnsim.simulator import run_timing

    program, load = _handed_on(lambda mid: mid[0:64, :], with_program=True)
    run = run_timing(program)
    i = load.index
    assert load.forwarded and run.starts[i] == run.ends[i] == max(run.ends[d] for d in load.deps)
    program, moved = _handed_on(lambda mid: mid[64:128, :], with_program=True)
    run = run_timing(program)
    j = moved.index
    assert run.ends[j] - run.starts[j] > 0 and run.starts[j] > max(run.ends[d] for d in moved.deps)


def _rows(shape_a, shape_b, dtype=torch.bfloat16):
    from trnsim.kernels.gemm import matmul_rows

    return run_kernel(matmul_rows, "matmul_rows", placeholder(shape_a, dtype), placeholder(shape_b, dtype))


@pytest.mark.parametrize("escapes", [False, True])
def test_a_result_only_later_kernels_read_from_sbuf_is_never_stored(escapes):
    """``a``'s [128, 512] result feeds ``b``, which reads it in rows (forwarded). Read by
    no one after the segment, it is never written to HBM (its stores move nothing); read
    after it (a graph output), it is stored."""
    a = _gemm((256, 128), (256, 512))
    b = _rows((128, 512), (512, 256))
    placed = overlap.places([a, b], [[], [0]], [False, False], read_until=[2 if escapes else 1, 2])
    program = placed[0].run.program
    mine = program.instructions[placed[0].first:placed[0].last]
    stores = [i for i in mine if i.opcode == "dma_copy" and not i.dst.tensor.on_chip]
    loads = [i for i in program.instructions[placed[1].first:placed[1].last]
             if i.opcode == "dma_copy" and i.src.tensor is stores[0].dst.tensor]
    assert stores and loads and all(i.forwarded for i in loads)
    assert all(i.forwarded is not escapes for i in stores)
    run = placed[0].run
    assert all(run.dma_plans[i.index].hbm_bytes == (0 if not escapes else i.dst.nbytes) for i in stores)


def test_a_result_read_back_through_hbm_is_stored():
    """``b`` reads ``a``'s result reshaped (elements into other partitions): the load moves
    them through HBM, so ``a`` stores them even though no one after the segment reads them."""
    a = _gemm((256, 128), (256, 512))
    b = _gemm((512, 128), (512, 256))
    placed = overlap.places([a, b], [[], [0]], [False, False], read_until=[1, 2])
    program = placed[0].run.program
    stores = [i for i in program.instructions[placed[0].first:placed[0].last]
              if i.opcode == "dma_copy" and not i.dst.tensor.on_chip]
    assert stores and not any(i.forwarded for i in stores)


def test_last_readers_follow_views_and_stop_at_the_graph_output():
    import torch.fx as fx

    aten = torch.ops.aten
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.relu.default, (x,))
    v = g.call_function(aten.view.default, (a, [4, 4]))
    c = g.call_function(aten.exp.default, (v,))
    d = g.call_function(aten.sin.default, (a,))
    e = g.call_function(aten.cos.default, (d,))
    g.output((c, e))

    class Group:
        def __init__(self, *nodes):
            self.nodes = list(nodes)

    groups = [Group(a), Group(c), Group(d), Group(e)]
    free = {v: Group(v)}
    # a is read by c (through the view) and d; c and e are outputs; d is read by e
    assert overlap.last_readers(groups, free) == [2, 4, 3, 4]
    g.erase_node(g.output_node())
    g.output((c,))
    # e's value is read by no one: it writes for its effect, read after the graph
    assert overlap.last_readers(groups, free) == [2, 4, 3, 4]
    g.call_function(aten.copy_.default, (x, e))   # e now feeds a copy into the input
    assert overlap.last_readers(groups + [Group(list(g.nodes)[-1])], free)[-1] == 5
