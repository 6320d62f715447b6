"""The fallback's hot path: cached host aliases, ops registered directly, metadata changes."""

from __future__ import annotations

import gc

import pytest
import torch

import trnsim
from trnsim.backend import storage


def test_inplace_metadata_ops_do_not_corrupt_cached_aliases():
    x = torch.arange(6.0, device="neuron").reshape(2, 3)
    (x + 0).sum()              # caches an alias of x's view
    x.t_()                     # in-place metadata change on x
    assert x.shape == (3, 2)
    torch.testing.assert_close(x.cpu(), torch.arange(6.0).reshape(2, 3).t())
    torch.testing.assert_close((x * 2).cpu(), torch.arange(6.0).reshape(2, 3).t() * 2)
    y = torch.arange(6.0, device="neuron").reshape(2, 3)
    torch.testing.assert_close((y + 1).cpu(), torch.arange(6.0).reshape(2, 3) + 1)


def test_out_resize_then_read_back():
    a = torch.ones(4, device="neuron")
    out = torch.empty(0, device="neuron")
    (out + 0)                  # caches an alias of the empty out
    torch.add(a, a, out=out)
    assert out.shape == (4,)
    torch.testing.assert_close((out + 0).cpu(), torch.full((4,), 2.0))


def test_writes_through_one_view_are_seen_through_another():
    x = torch.zeros(4, 4, device="neuron")
    row = x[1]
    (row + 0), (x + 0)         # both aliases cached
    row.add_(5)
    torch.testing.assert_close(x.sum().cpu(), torch.tensor(20.0))
    x.fill_(1)
    torch.testing.assert_close(row.cpu(), torch.ones(4))


def test_alias_cache_is_bounded():
    x = torch.zeros(64, device="neuron")
    for i in range(40):
        x[i:i + 2].sum()
    assert len(storage.block_of(x).aliases) <= storage._MAX_ALIASES


def test_structured_ops_are_one_device_op():
    x = torch.ones(8, device="neuron")
    with trnsim.profile() as prof:
        x + 1
        torch.exp(x)
        x.mul_(2)
    names = [r.name for r in prof.records if not isinstance(r, tuple)]
    assert names == ["aten::add.Tensor", "aten::exp", "aten::mul_.Tensor"]


def test_untyped_storage_on_neuron_is_accounted():
    before = torch.neuron.memory_allocated()
    s = torch.UntypedStorage(64, device="neuron")
    assert s.device.type == "neuron" and s.nbytes() == 64
    assert torch.neuron.memory_allocated() == before + 64
    c = torch.ones(4).untyped_storage().to(device="neuron").clone()
    back = torch.tensor([], device="neuron").set_(c).view(torch.float32)
    torch.testing.assert_close(back.cpu(), torch.ones(4))
    assert torch.UntypedStorage(8).device.type == "cpu"


def test_storage_resize_frees_and_brings_back_memory_like_fsdp2():
    gc.collect()
    p = torch.arange(1024.0, device="neuron")
    view = p[10:20]
    st = p.untyped_storage()
    base = torch.neuron.memory_allocated()
    st.resize_(0)
    assert st.nbytes() == 0 and torch.neuron.memory_allocated() == base - 4096
    st.resize_(4096)
    assert torch.neuron.memory_allocated() == base
    p.copy_(torch.arange(1024.0).to("neuron") * 2)
    torch.testing.assert_close(view.cpu(), torch.arange(10.0, 20.0) * 2)


def test_storage_resize_keeps_leading_bytes_and_refuses_what_does_not_fit():
    x = torch.arange(8.0, device="neuron")
    st = x.untyped_storage()
    st.resize_(16)
    torch.testing.assert_close(torch.tensor([], device="neuron").set_(st).view(torch.float32).cpu(),
                               torch.arange(4.0))
    before = torch.neuron.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError):
        st.resize_(torch.neuron.mem_get_info()[1] + 1)
    assert st.nbytes() == 16 and torch.neuron.memory_allocated() == before
    with pytest.raises(RuntimeError, match="at least 0 bytes, but got -1"):
        st.resize_(-1)
    assert torch.ones(4).untyped_storage().resize_(8).nbytes() == 8


def test_inplace_view_ops_take_no_device_time():
    x = torch.ones(256, 256, device="neuron")
    torch.neuron.synchronize()
    start = torch.neuron.elapsed_ms()
    x.t_()
    x.unsqueeze_(0).squeeze_(0)
    x.as_strided_((128, 512), (512, 1))
    torch.neuron.synchronize()
    assert torch.neuron.elapsed_ms() == start
    assert x.shape == (128, 512)
    torch.testing.assert_close((x + 0).cpu(), torch.ones(128, 512))


def test_a_tensor_both_read_and_written_is_one_tensor_to_the_cpu_kernel():
    x = torch.arange(4.0, device="neuron").reshape(1, 4)
    (x + 0)                    # caches an alias of x
    try:
        torch.add(x, torch.ones(3, 4, device="neuron"), out=x)
    except RuntimeError as e:  # as on the CPU: out= is an input, so it cannot grow
        assert "doesn't match the broadcast shape" in str(e)
    else:
        raise AssertionError("add(x, y, out=x) that would grow x should raise, as on the CPU")
    torch.testing.assert_close(x.cpu(), torch.arange(4.0).reshape(1, 4))
    y = torch.arange(4.0, device="neuron")
    torch.mul(y, y, out=y)
    torch.testing.assert_close(y.cpu(), torch.arange(4.0) ** 2)


def test_out_resize_with_a_live_view_counts_memory_once():
    def run(device):
        x = torch.zeros(2, device=device)
        v = x[:]
        src = torch.arange(1000.0).to(device)
        torch.add(src, 1, out=x)
        v.add_(1)
        return x, v, src

    gc.collect()
    base = torch.neuron.memory_allocated()
    x, v, src = run("neuron")
    assert torch.neuron.memory_allocated() - base == 8000   # src and the regrown x, once each
    want_x, want_v, _ = run("cpu")
    torch.testing.assert_close(x.cpu(), want_x)
    torch.testing.assert_close(v.cpu(), want_v)
    del x, v, src
    assert torch.neuron.memory_allocated() == base


def test_lazy_clone_is_a_copy_on_neuron():
    x = torch.arange(4.0, device="neuron")
    y = torch.ops.aten._lazy_clone(x)
    x.add_(1)
    assert y.device.type == "neuron"
    torch.testing.assert_close(y.cpu(), torch.arange(4.0))


def test_storage_resize_after_an_out_regrow_moves_every_view_as_on_the_cpu():
    def run(device):
        x = torch.zeros(2, device=device)
        v = x[:]
        src = torch.arange(1000.0).to(device)
        torch.add(src, 1, out=x)          # regrows x's storage in place, under the view v
        st = x.untyped_storage()
        st.resize_(0)
        st.resize_(4000)
        x.copy_(src)
        v.add_(1)
        return x, v, src, st is v.untyped_storage()

    gc.collect()
    base = torch.neuron.memory_allocated()
    x, v, src, shared = run("neuron")
    want_x, want_v, _, want_shared = run("cpu")
    assert shared and want_shared
    torch.testing.assert_close(x.cpu(), want_x)
    torch.testing.assert_close(v.cpu(), want_v)
    assert torch.neuron.memory_allocated() - base == 8000   # src and x: the old memory is gone
    del x, v, src
    assert torch.neuron.memory_allocated() == base


def test_a_freed_storage_grows_back_with_tensor_resize_and_keeps_its_data():
    p = torch.arange(8.0, device="neuron")
    p.untyped_storage().resize_(0)
    p.resize_(8)
    p.copy_(torch.arange(8.0) * 2)
    torch.testing.assert_close(p.cpu(), torch.arange(8.0) * 2)
