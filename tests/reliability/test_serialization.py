"""Neuron tensors through pickle, copy.deepcopy, torch.save (both formats), process
queues (fork and spawn) and DLPack; timing-fidelity tensors refused by name; random
generators refused across devices."""

from __future__ import annotations

import copy
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st

import trnsim
from trnsim.backend import storage
from tests.reliability.conftest import clean_error

DEV = "neuron"
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.float8_e4m3fn]


def _save_load(obj, new: bool, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=new)
    buf.seek(0)
    return torch.load(buf, weights_only=False, **load_kwargs)


ROUND_TRIPS = {
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "deepcopy": copy.deepcopy,
    "save_zip": lambda obj: _save_load(obj, True),
    "save_legacy": lambda obj: _save_load(obj, False),
}
# which round trips keep two views of one storage on one storage: as on the CPU, all
# but plain pickle (which pickles each tensor's storage on its own)
KEEPS_SHARING = {"deepcopy", "save_zip", "save_legacy"}


def _state(dtype: torch.dtype) -> dict:
    base = torch.arange(24).to(dtype).to(DEV)
    return {"base": base, "slice": base[5:17], "t": base.view(4, 6).t(),
            "alone": torch.ones(3, dtype=dtype, device=DEV)}


@pytest.mark.parametrize("how", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trips_keep_device_dtype_values_views_and_sharing(how, dtype):
    state = _state(dtype)
    if dtype.itemsize == 1 and dtype.is_floating_point and how in ("pickle", "save_legacy"):
        # PyTorch's legacy format cannot load float8 storages, on the CPU either: the same error
        with pytest.raises(AttributeError) as on_cpu:
            ROUND_TRIPS[how]({k: v.cpu() for k, v in state.items()})
        with pytest.raises(AttributeError, match=str(on_cpu.value)):
            ROUND_TRIPS[how](state)
        return
    out = ROUND_TRIPS[how](state)
    for name, t in state.items():
        r = out[name]
        assert r.device == t.device and r.dtype == dtype and r.shape == t.shape and r.stride() == t.stride()
        assert r.storage_offset() == t.storage_offset()
        assert torch.equal(r.cpu().to(torch.float32), t.cpu().to(torch.float32)), name
    shared = out["slice"].untyped_storage().data_ptr() == out["base"].untyped_storage().data_ptr()
    assert shared == (how in KEEPS_SHARING)
    if shared:
        out["base"][6] = out["base"][0]       # written through one view, seen through another
        assert torch.equal(out["slice"][1].cpu(), out["base"][0].cpu())
    assert torch.neuron.memory_allocated() > 0


@pytest.mark.parametrize("how", sorted(ROUND_TRIPS))
def test_parameters_and_modules_round_trip_on_neuron(how):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(DEV)
    out = ROUND_TRIPS[how](model)
    assert isinstance(out.weight, torch.nn.Parameter) and out.weight.requires_grad
    assert out.weight.device.type == DEV
    assert torch.equal(out.weight.cpu(), model.weight.cpu())
    x = torch.randn(2, 4, device=DEV)
    assert torch.equal(out(x).cpu(), model(x).cpu())


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr], ids=str)
@pytest.mark.parametrize("how", sorted(ROUND_TRIPS))
def test_compressed_sparse_tensors_round_trip(how, layout):
    dense = torch.tensor([[0.0, 2.0, 0.0, 0.0], [1.0, 0.0, 3.0, 0.0]])
    blocks = (1, 2) if layout == torch.sparse_bsr else None
    s = dense.to_sparse(layout=layout, blocksize=blocks).to(DEV)
    r = ROUND_TRIPS[how](s)
    assert r.device.type == DEV and r.layout == layout and torch.equal(r.to_dense().cpu(), dense)


def test_legacy_checkpoint_loads_onto_the_cpu_with_map_location():
    t = torch.linspace(0, 1, 7, device=DEV, dtype=torch.bfloat16)
    r = _save_load({"t": t}, False, map_location="cpu")["t"]
    assert r.device.type == "cpu" and torch.equal(r, t.cpu())


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=3), offset=st.integers(0, 3),
       how=st.sampled_from(sorted(ROUND_TRIPS)))
def test_any_strided_view_round_trips(shape, offset, how):
    n = int(np.prod(shape)) if shape else 1
    base = torch.randn(n + offset, generator=torch.Generator().manual_seed(n)).to(DEV)
    t = base[offset:].view(shape)
    r = ROUND_TRIPS[how](t)
    assert r.device.type == DEV and r.shape == t.shape and torch.equal(r.cpu(), t.cpu())


# -- DLPack ------------------------------------------------------------------

@pytest.mark.parametrize("export", [
    lambda t: torch.utils.dlpack.to_dlpack(t),
    lambda t: t.__dlpack__(),
    lambda t: np.from_dlpack(t),
    lambda t: torch.from_dlpack(t),
], ids=["to_dlpack", "__dlpack__", "np.from_dlpack", "torch.from_dlpack"])
def test_dlpack_export_is_refused_naming_the_device_and_the_fix(export):
    t = torch.ones(3, device=DEV)
    clean_error(lambda: export(t), "neuron:0", "DLPack", "t.cpu()", types=BufferError)
    assert np.array_equal(np.from_dlpack(t.cpu()), np.ones(3, dtype=np.float32))   # the fix works


# -- timing fidelity: no values to carry ----------------------------------------

@pytest.fixture
def timing_tensor():
    trnsim.set_fidelity("timing")
    try:
        yield torch.ones(4, 4, device=DEV)
    finally:
        trnsim.set_fidelity("op")


@pytest.mark.parametrize("how", ["pickle", "save_zip", "save_legacy", "deepcopy_under_op", "storage_cpu",
                                 "storage_clone_under_op", "queue"])
def test_timing_tensors_refuse_to_be_carried_with_one_clear_error(timing_tensor, how, tmp_path):
    t = timing_tensor
    if how.endswith("_under_op"):
        trnsim.set_fidelity("op")
    actions = {
        "pickle": lambda: pickle.dumps(t),
        "save_zip": lambda: torch.save(t, io.BytesIO()),
        "save_legacy": lambda: torch.save({"w": t}, io.BytesIO(), _use_new_zipfile_serialization=False),
        "deepcopy_under_op": lambda: copy.deepcopy(t),
        "storage_cpu": lambda: t.untyped_storage().cpu(),
        "storage_clone_under_op": lambda: t.untyped_storage().clone(),
        "queue": lambda: ForkingPickler.dumps(t),
    }
    clean_error(actions[how], "TRNSIM_FIDELITY=timing", "no values", "fidelity 'op'", types=RuntimeError)


def test_timing_tensors_deep_copy_without_values_under_timing(timing_tensor):
    c = copy.deepcopy(timing_tensor)
    assert c.device.type == DEV and c.shape == (4, 4)
    assert storage.block_of(c).host is None       # still no values: a copy of nothing
    clean_error(lambda: c.cpu(), "TRNSIM_FIDELITY=timing", types=RuntimeError)


# -- generators belong to one device ---------------------------------------------

def test_generators_are_refused_on_the_other_device_as_pytorch_does():
    g = torch.Generator(device=DEV).manual_seed(1)
    clean_error(lambda: torch.rand(3, generator=g), "Expected a 'cpu' device type for generator but found 'neuron'",
                types=RuntimeError)
    clean_error(lambda: torch.empty(3).normal_(generator=g), "found 'neuron'", types=RuntimeError)
    clean_error(lambda: torch.randperm(5, generator=g), "found 'neuron'", types=RuntimeError)
    cpu = torch.Generator().manual_seed(1)
    clean_error(lambda: torch.rand(3, device=DEV, generator=cpu),
                "Expected a 'neuron' device type for generator but found 'cpu'", types=RuntimeError)
    x = torch.ones(8, device=DEV)
    clean_error(lambda: x.bernoulli_(0.5, generator=cpu), "found 'cpu'", types=RuntimeError)
    clean_error(lambda: torch.multinomial(x, 2, generator=cpu), "found 'cpu'", types=RuntimeError)
    # each on its own device still draws, and the same seed gives the same numbers
    assert torch.equal(torch.rand(3, device=DEV, generator=g.manual_seed(5)).cpu(),
                       torch.rand(3, generator=cpu.manual_seed(5)))


def test_neuron_generators_pickle_with_their_state():
    g = torch.Generator(device=DEV).manual_seed(9)
    torch.rand(2, device=DEV, generator=g)
    h = pickle.loads(pickle.dumps(g))
    assert h.device.type == DEV
    assert torch.equal(torch.rand(4, device=DEV, generator=h).cpu(), torch.rand(4, device=DEV, generator=g).cpu())


# -- process queues ------------------------------------------------------------

def _child(q_in, q_out) -> None:
    """Receive neuron tensors, report what arrived, write into the first (shared) one."""
    import torch

    got = q_in.get(timeout=60)
    report = [(str(t.device), str(t.dtype), t.cpu().float().tolist()) for t in got]
    got[0][0] = 42
    q_out.put(report)
    q_out.put(torch.full((2,), 7.0, device="neuron"))
    q_in.get(timeout=60)      # keep the tensor alive until the parent has read it


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_process_queues_deliver_neuron_tensors_as_neuron_and_share_them(method):
    ctx = mp.get_context(method)
    q_in, q_out = ctx.Queue(), ctx.Queue()
    base = torch.arange(6, dtype=torch.float32, device=DEV)
    sent = [base, base[2:5], torch.tensor([1.5, -2.0], dtype=torch.bfloat16, device=DEV)]
    p = ctx.Process(target=_child, args=(q_in, q_out), daemon=True)
    p.start()
    try:
        q_in.put(sent)
        report = q_out.get(timeout=120)
        back = q_out.get(timeout=60)
        assert report == [("neuron:0", "torch.float32", [0, 1, 2, 3, 4, 5]),
                          ("neuron:0", "torch.float32", [2, 3, 4]),
                          ("neuron:0", "torch.bfloat16", [1.5, -2.0])]
        assert base[0].item() == 42          # the child wrote into the shared memory
        assert back.device.type == DEV and back.cpu().tolist() == [7.0, 7.0]
        q_in.put(None)
        p.join(timeout=60)
        assert p.exitcode == 0
    finally:
        _reap(p, q_in, q_out)
    assert not p.is_alive()


def _fill_child(q_in, q_out) -> None:
    got = q_in.get(timeout=60)
    got.fill_(7.0)
    q_out.put("written")


def test_memory_nothing_wrote_sent_to_a_process_keeps_what_the_process_writes():
    """The NaN fill of unwritten memory goes in before the memory is shared; done later,
    it would land on what the other process wrote."""
    ctx = mp.get_context("fork")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    sent = torch.empty(4, device=DEV)
    p = ctx.Process(target=_fill_child, args=(q_in, q_out), daemon=True)
    p.start()
    try:
        q_in.put(sent)
        assert q_out.get(timeout=120) == "written"
        p.join(timeout=60)
        assert p.exitcode == 0
        assert sent.cpu().tolist() == [7.0] * 4
    finally:
        _reap(p, q_in, q_out)
    assert not p.is_alive()


def _reap(p, *queues) -> None:
    """Leave no process behind: kill ``p`` if it still runs, and close the queues."""
    if p.is_alive():
        p.kill()
        p.join(timeout=10)
    for q in queues:
        q.close()
