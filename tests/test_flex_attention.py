"""FlexAttention on ``neuron``: ``flex_attention`` and ``create_block_mask``, eager and
compiled, give the CPU's values; the op is one kernel on the timeline, timed by the
block-sparse flash kernels over the blocks its mask keeps."""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

import trnsim
import trnsim.nki as nki
from trnsim.backend import flextiming
from trnsim.kernels.flex_attention import block_sparse_attention_bwd, block_sparse_attention_fwd
from trnsim.testing import assert_kernel_matches

B, H, S, D = 2, 2, 384, 32
DOCS = torch.tensor([0] * 100 + [1] * 150 + [2] * 134)


def causal(b, h, q, kv):
    return q >= kv


def sliding(b, h, q, kv):
    return (q >= kv) & (q - kv < 100)


def documents(docs):
    def mask(b, h, q, kv):
        return (docs[q] == docs[kv]) & (q >= kv)
    return mask


MASKS = {"causal": lambda dev: causal, "sliding window": lambda dev: sliding,
         "documents": lambda dev: documents(DOCS.to(dev))}


@pytest.fixture(autouse=True)
def quiet_and_fresh():
    torch._dynamo.reset()
    with warnings.catch_warnings():   # flex_attention's advice to compile it, meant for GPUs
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield
    torch._dynamo.reset()


def _inputs(seq=S):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, seq, D, generator=g) for _ in range(3)]


def _reference(tensors, mask_mod):
    """SDPA on the CPU with the mask made dense: the output and the gradients of q, k, v."""
    q, k, v = [t.clone().requires_grad_() for t in tensors]
    dense = create_mask(mask_mod, 1, 1, S, S, device="cpu")
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    (out * torch.linspace(-1, 1, D)).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


def _on_neuron(tensors, mask_mod, attend=flex_attention, make_mask=create_block_mask):
    """flex_attention forward and backward on neuron, profiled: the output and the
    gradients of q, k, v (on the CPU) and the profile's FlexAttention records."""
    seq = tensors[0].shape[-2]
    block_mask = make_mask(mask_mod, 1, 1, seq, seq, device="neuron")
    q, k, v = [t.to("neuron").requires_grad_() for t in tensors]
    with trnsim.profile() as prof:
        out = attend(q, k, v, block_mask=block_mask)
        (out * torch.linspace(-1, 1, D, device="neuron")).sum().backward()
    records = [r for r in prof.records if r.name.startswith("flex_attention")]
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)], records


def _assert_close(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask", MASKS)
def test_eager_flex_attention_matches_the_cpu_forward_and_backward(mask):
    tensors = _inputs()
    got, records = _on_neuron(tensors, MASKS[mask]("neuron"))
    _assert_close(got, _reference(tensors, MASKS[mask]("cpu")))
    assert [(r.name, r.cost.kernel) for r in records] == [
        ("flex_attention", "block_sparse_attention_fwd"), ("flex_attention_backward", "block_sparse_attention_bwd")]
    assert all(r.end_ps > r.start_ps for r in records)


def test_the_forward_matches_flex_attention_on_the_cpu():
    q, k, v = _inputs()
    want = flex_attention(q, k, v, block_mask=create_block_mask(sliding, 1, 1, S, S, device="cpu"))
    got = flex_attention(*[t.to("neuron") for t in (q, k, v)],
                         block_mask=create_block_mask(sliding, 1, 1, S, S, device="neuron"))
    torch.testing.assert_close(got.cpu(), want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mask", MASKS)
def test_compiled_flex_attention_matches_eager_in_values_and_time(mask):
    tensors = _inputs()
    mask_mod = MASKS[mask]("neuron")
    eager, eager_records = _on_neuron(tensors, mask_mod)
    compiled = torch.compile(flex_attention, backend="neuron")
    _on_neuron(tensors, mask_mod, compiled)   # compiles
    got, records = _on_neuron(tensors, mask_mod, compiled)
    _assert_close(got, eager)
    # the compiled kernels are timed by the block mask of the call, as eager is
    assert [(r.name, r.cost.ps) for r in records] == [(r.name, r.cost.ps) for r in eager_records]


def test_the_default_backend_compiles_flex_attention_and_create_block_mask_for_neuron():
    """torchtitan compiles both with no backend and flex_attention with
    mode="max-autotune-no-cudagraphs": on neuron they compile with the neuron backend."""
    tensors = _inputs()
    before = len(torch.neuron.get_dynamo_metrics())
    attend = torch.compile(flex_attention, mode="max-autotune-no-cudagraphs")
    with pytest.warns(trnsim.errors.CompileModeWarning, match="max-autotune-no-cudagraphs"):
        got, records = _on_neuron(tensors, sliding, attend, torch.compile(create_block_mask))
    _assert_close(got, _reference(tensors, sliding))
    assert [r.name for r in records] == ["flex_attention", "flex_attention_backward"]
    assert len(torch.neuron.get_dynamo_metrics()) > before
    made = torch.compile(create_block_mask)(sliding, 1, 1, S, S, device="neuron")
    cpu = create_block_mask(sliding, 1, 1, S, S, device="cpu")
    for a, b in zip(made.as_tuple()[2:6], cpu.as_tuple()[2:6]):
        assert torch.equal(a.cpu(), b)


def _times(mask_mod):
    _, records = _on_neuron(_inputs(1024), mask_mod)
    return [r.cost.ps for r in records]


def test_time_follows_the_blocks_the_mask_keeps():
    """Over 1,024 tokens: every block; the causal mask's 36 of 64; the window's 15."""
    dense, causal_ps, window = _times(lambda b, h, q, kv: q >= 0), _times(causal), _times(sliding)
    for i in range(2):   # forward, backward
        assert window[i] < causal_ps[i] < dense[i]


def test_tile_blocks_folds_mask_blocks_into_128_tiles():
    # 64-row mask blocks of a causal mask over 256 x 256: 2 = full, 1 = partial, 0 = skipped
    states = torch.tensor([[1, 0, 0, 0], [2, 1, 0, 0], [2, 2, 1, 0], [2, 2, 2, 1]]).numpy()
    assert flextiming.tile_blocks(states, 64, 64, 256, 256) == (((0, True),), ((0, False), (1, True)))


# -- the kernels ----------------------------------------------------------------

def _blocks(mask: np.ndarray) -> tuple:
    """The kernels' blocks of a dense [queries, keys] mask."""
    tiles = []
    for i in range(mask.shape[0] // 128):
        row = mask[i * 128:(i + 1) * 128]
        tiles.append(tuple((j, not bool(row[:, j * 128:(j + 1) * 128].all()))
                           for j in range(mask.shape[1] // 128) if row[:, j * 128:(j + 1) * 128].any()))
    return tuple(tiles)


def _scores(q, k, mask, scale):
    return np.where(mask.astype(bool), scale * q @ k.T, -np.inf)


def sparse_forward_reference(q, k, v, mask, blocks):
    s = _scores(q, k, mask, 1 / math.sqrt(q.shape[1]))
    peak = s.max(axis=1, keepdims=True)
    seen = np.isfinite(peak)
    total = np.where(seen, np.exp(s - np.where(seen, peak, 0)).sum(axis=1, keepdims=True), 0)
    lse = np.where(seen, np.log(np.where(seen, total, 1)) + np.where(seen, peak, 0), -np.inf)
    out = np.where(seen, np.exp(s - np.where(seen, lse, 0)), 0) @ v
    return out, lse


def sparse_backward_reference(q, k, v, o, d_o, lse, mask, blocks):
    scale = 1 / math.sqrt(q.shape[1])
    seen = np.isfinite(lse)   # a query that attends to no key has no gradient
    p = np.where(seen, np.exp(_scores(q, k, mask, scale) - np.where(seen, lse, 0)), 0)
    d_scores = p * (d_o @ v.T - np.sum(d_o * o, axis=1, keepdims=True))
    return scale * d_scores @ k, scale * d_scores.T @ q, p.T @ d_o


def _kernel_masks():
    i = np.arange(512)
    causal_mask = i[:, None] >= i[None, :]
    docs = i // 200
    nothing_for_the_second_tile = causal_mask.copy()
    nothing_for_the_second_tile[128:256] = False
    return {"causal": causal_mask, "sliding window": causal_mask & (i[:, None] - i[None, :] < 200),
            "documents": causal_mask & (docs[:, None] == docs[None, :]),
            "a tile with no block": nothing_for_the_second_tile}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mask", _kernel_masks())
def test_block_sparse_kernels_match_numpy(mask, dtype):
    dense = _kernel_masks()[mask].astype(np.uint8)
    rng = np.random.default_rng(1)
    q, k, v, d_o = (torch.from_numpy(rng.standard_normal((512, 64)).astype(np.float32)).to(dtype) for _ in range(4))
    blocks = _blocks(dense)
    out, lse = assert_kernel_matches(block_sparse_attention_fwd, sparse_forward_reference, q, k, v, dense, blocks,
                                     dtype=dtype)
    o = torch.from_numpy(np.asarray(out, np.float32)).to(dtype)
    assert_kernel_matches(block_sparse_attention_bwd, sparse_backward_reference, q, k, v, o, d_o,
                          np.asarray(lse, np.float32), dense, blocks, dtype=dtype)


def test_block_sparse_forward_skips_the_blocks_the_mask_drops():
    q = np.zeros((512, 64), np.float32)
    every = np.ones((512, 512), np.uint8)
    i = np.arange(512)
    causal_mask = (i[:, None] >= i[None, :]).astype(np.uint8)
    dense = nki.benchmark(block_sparse_attention_fwd, numerics=False)(q, q, q, every, _blocks(every))
    causal_run = nki.benchmark(block_sparse_attention_fwd, numerics=False)(q, q, q, causal_mask, _blocks(causal_mask))
    # query tiles go in pairs over the union of their blocks: 2 x 2 and 2 x 4 of the 16 tile-blocks
    assert causal_run.flops == dense.flops * 12 // 16
    assert causal_run.latency_ns < dense.latency_ns


def test_the_block_pattern_memo_is_bounded():
    """Block patterns follow the data, so a long run meets ever new ones: the memo of
    their kernel costs keeps the latest MEMO_SIZE, not every one."""
    from trnsim.backend import flextiming

    flextiming._simulated.cache_clear()
    dense = ((0, False),)
    for i in range(flextiming.MEMO_SIZE + 3):
        flextiming._simulated(False, (dense,), 128, 128, 8 + i % 2, torch.float32, f"chip{i}")
    info = flextiming._simulated.cache_info()
    assert info.currsize == flextiming.MEMO_SIZE and info.maxsize == flextiming.MEMO_SIZE
