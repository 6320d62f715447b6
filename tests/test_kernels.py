"""The kernel gallery: every kernel against a float64 numpy reference, in fp32 and bf16,
and its simulated latency, which must be positive and the same on every run."""

import math

import numpy as np
import pytest
import torch

import trnsim.nki as nki
import trnsim.nki.language as nl
from trnsim.kernels.attention import flash_attention_bwd, flash_attention_fwd, flash_attention_heads
from trnsim.kernels.matmul import matmul_basic, matmul_optimized
from trnsim.kernels.norms import layernorm_kernel, rmsnorm_kernel
from trnsim.kernels.softmax import softmax_kernel
from trnsim.nki import KernelError
from trnsim.testing import assert_kernel_matches

DTYPES = (torch.float32, torch.bfloat16)


def arrays(seed, dtype, *shapes, scale=1.0, shift=0.0):
    """Seeded normal arrays as kernel arguments: numpy fp32, or torch bf16 tensors."""
    rng = np.random.default_rng(seed)
    out = []
    for shape in shapes:
        a = (rng.standard_normal(shape) * scale + shift).astype(np.float32)
        out.append(a if dtype is torch.float32 else torch.from_numpy(a).to(dtype))
    return out


def assert_dtype(out, dtype):
    """``out`` holds values of ``dtype`` (numpy has no bf16, so bf16 comes back as fp32 values)."""
    if dtype is torch.bfloat16:
        np.testing.assert_array_equal(torch.from_numpy(out).to(torch.bfloat16).float().numpy(), out)


# -- float64 references ------------------------------------------------------

def matmul_reference(lhsT, rhs):
    return lhsT.T @ rhs


def softmax_reference(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def rmsnorm_reference(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps) * weight


def layernorm_reference(x, gamma, beta, eps):
    mean = x.mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + eps) * gamma + beta


def attention_reference(q, k, v, causal, key_tile):
    """``key_tile`` only shapes the kernel's loop; the result does not depend on it. The
    causal mask is PyTorch's: top-left aligned when there are more or fewer keys than queries."""
    s = q @ k.T / math.sqrt(q.shape[1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
    return softmax_reference(s) @ v


def attention_backward_reference(q, k, v, o, d_o, lse, scale, causal):
    """dq, dk, dv of attention from the probabilities rebuilt out of ``lse`` (``o`` and
    ``lse`` come from :func:`attention_forward_for_backward`)."""
    s = scale * q @ k.T
    if causal:
        s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
    p = np.exp(s - lse.reshape(-1, 1))
    d_scores = p * (d_o @ v.T - np.sum(d_o * o, axis=1, keepdims=True))
    return scale * d_scores @ k, scale * d_scores.T @ q, p.T @ d_o


def attention_forward_for_backward(q, k, v, causal, scale, dtype):
    """The forward's output (in ``dtype``) and logsumexp (fp32, [Sq]), made in float64."""
    q, k, v = (np.asarray(torch.as_tensor(x).double()) for x in (q, k, v))
    s = scale * q @ k.T
    if causal:
        s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
    peak = s.max(axis=1, keepdims=True)
    lse = peak + np.log(np.exp(s - peak).sum(axis=1, keepdims=True))
    o = (np.exp(s - lse) @ v).astype(np.float32)
    return (o if dtype is torch.float32 else torch.from_numpy(o).to(dtype)), lse[:, 0].astype(np.float32)


# -- numerics ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", [matmul_basic, matmul_optimized])
@pytest.mark.parametrize("k, m, n", [(256, 256, 1024), (128, 128, 512)])
def test_matmul(kernel, k, m, n, dtype):
    lhsT, rhs = arrays(0, dtype, (k, m), (k, n))
    out = assert_kernel_matches(kernel, matmul_reference, lhsT, rhs)
    assert out.dtype == np.float32


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("n, d", [(256, 512), (200, 300), (128, 2048)])
def test_softmax(n, d, dtype):
    (x,) = arrays(1, dtype, (n, d), scale=3.0)
    assert_dtype(assert_kernel_matches(softmax_kernel, softmax_reference, x), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("n, d", [(256, 512), (200, 700), (128, 1100)])
def test_rmsnorm(n, d, dtype):
    x, weight = arrays(2, dtype, (n, d), (d,), shift=0.5)
    assert_dtype(assert_kernel_matches(rmsnorm_kernel, rmsnorm_reference, x, weight, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("n, d", [(256, 512), (200, 700), (128, 1100)])
def test_layernorm(n, d, dtype):
    x, gamma, beta = arrays(3, dtype, (n, d), (d,), (d,), scale=2.0, shift=0.5)
    assert_dtype(assert_kernel_matches(layernorm_kernel, layernorm_reference, x, gamma, beta, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("seqlen, d, causal, key_tile", [
    (256, 64, False, None), (384, 64, True, 128), (512, 128, True, None), (512, 128, False, 128)])
def test_flash_attention(seqlen, d, causal, key_tile, dtype):
    q, k, v = arrays(4, dtype, (seqlen, d), (seqlen, d), (seqlen, d))
    out = assert_kernel_matches(flash_attention_fwd, attention_reference, q, k, v, causal, key_tile)
    assert_dtype(out, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("queries, keys, heads, d, causal", [
    (128, 128, 12, 64, False), (256, 256, 3, 32, True), (128, 512, 2, 128, False), (384, 128, 5, 16, True)])
def test_attention_over_heads_side_by_side_gives_each_heads_bits(queries, keys, heads, d, causal, dtype):
    """flash_attention_heads on rows of all heads computes, in each head's columns, what
    flash_attention_fwd computes for that head alone, bit for bit."""
    q, k, v = arrays(8, dtype, (queries, heads * d), (keys, heads * d), (keys, heads * d))
    out = np.asarray(nki.simulate(flash_attention_heads)(q, k, v, heads, causal))
    for h in range(heads):
        cols = slice(h * d, (h + 1) * d)
        one = nki.simulate(flash_attention_fwd)(*(t[:, cols].contiguous() if isinstance(t, torch.Tensor)
                                                   else np.ascontiguousarray(t[:, cols]) for t in (q, k, v)), causal)
        np.testing.assert_array_equal(out[:, cols], np.asarray(one))
        ref = attention_reference(*(np.asarray(t.float() if isinstance(t, torch.Tensor) else t)[:, cols]
                                    for t in (q, k, v)), causal, None)
        np.testing.assert_allclose(out[:, cols], ref, rtol=5e-2 if dtype is torch.bfloat16 else 1e-4,
                                   atol=5e-2 if dtype is torch.bfloat16 else 1e-5)


def test_attention_over_heads_refuses_rows_that_do_not_fit_and_odd_widths():
    def placeholder(*shape):
        return np.broadcast_to(np.zeros((), np.float32), shape)

    q = placeholder(2048, 4096)
    with pytest.raises(KernelError, match=r"1048576 bytes per partition for q \[2048, 4096\].*run flash_attention_fwd "
                                          r"per head"):
        nki.trace_program(flash_attention_heads, q, q, q, 32)
    q = placeholder(128, 100)
    with pytest.raises(KernelError, match=r"heads \* d, got q \[128, 100\] for 3 heads"):
        nki.trace_program(flash_attention_heads, q, q, q, 3)


@pytest.mark.parametrize("queries, keys, causal", [(128, 640, True), (384, 128, True), (256, 512, False)])
def test_flash_attention_with_more_or_fewer_keys_than_queries(queries, keys, causal):
    q, k, v = arrays(7, torch.float32, (queries, 64), (keys, 64), (keys, 64))
    assert_kernel_matches(flash_attention_fwd, attention_reference, q, k, v, causal, None)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("queries, keys, d, causal", [
    (256, 256, 64, False), (384, 384, 128, True), (256, 512, 64, True), (384, 128, 32, True), (128, 384, 64, False)])
def test_flash_attention_backward(queries, keys, d, causal, dtype):
    q, k, v, d_o = arrays(8, dtype, (queries, d), (keys, d), (keys, d), (queries, d))
    scale = 1.0 / math.sqrt(d)
    o, lse = attention_forward_for_backward(q, k, v, causal, scale, dtype)
    grads = assert_kernel_matches(flash_attention_bwd, attention_backward_reference, q, k, v, o, d_o, lse, scale,
                                  causal)
    for g in grads:
        assert_dtype(g, dtype)


def test_flash_attention_backward_takes_lse_as_a_column_and_any_scale():
    q, k, v, d_o = arrays(9, torch.float32, (256, 64), (384, 64), (384, 64), (256, 64))
    o, lse = attention_forward_for_backward(q, k, v, True, 0.3, torch.float32)
    assert_kernel_matches(flash_attention_bwd, attention_backward_reference, q, k, v, o, d_o, lse.reshape(-1, 1), 0.3,
                          True)


def test_flash_attention_backward_refuses_a_sequence_off_the_tile():
    q, k, v, d_o = arrays(6, torch.float32, (200, 64), (256, 64), (256, 64), (200, 64))
    with pytest.raises(KernelError, match=r"q is \[200, 64\] and k is \[256, 64\]: seqlen and keys must be multiples of 128"):
        nki.trace_program(flash_attention_bwd, q, k, v, q, d_o, np.zeros(200, np.float32))


def test_flash_attention_never_holds_the_score_matrix():
    seqlen, d = 1024, 128
    q, k, v = arrays(5, torch.bfloat16, (seqlen, d), (seqlen, d), (seqlen, d))
    program = nki.trace_program(flash_attention_fwd, q, k, v, causal=True)
    largest = max(t.size for t in program.tensors if t.on_chip)
    assert largest == d * seqlen  # k^T; a [seqlen, seqlen] score matrix would be 8 times that


def test_flash_attention_refuses_a_key_tile_that_does_not_divide_seqlen():
    q, k, v = arrays(6, torch.float32, (384, 64), (384, 64), (384, 64))
    with pytest.raises(KernelError, match="got key_tile = 512 for 384 keys"):
        nki.trace_program(flash_attention_fwd, q, k, v, key_tile=512)


def test_an_index_past_the_end_needs_a_mask():
    @nki.jit
    def unmasked(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(x.shape[1])[None, :]
        for t in nl.affine_range(2):
            nl.store(out[t * 128 + i_p, i_f], value=nl.load(x[t * 128 + i_p, i_f]))
        return out

    (x,) = arrays(7, torch.float32, (200, 16))
    with pytest.raises(KernelError, match=r"nl.load: the index into x\[200, 16\] runs 56 elements past its end on axis 0"):
        nki.trace_program(unmasked, x)


# -- timing ------------------------------------------------------------------

BENCHMARKS = {
    "matmul_basic": (matmul_basic, lambda: arrays(10, torch.bfloat16, (256, 256), (256, 1024))),
    "matmul_optimized": (matmul_optimized, lambda: arrays(10, torch.bfloat16, (256, 256), (256, 1024))),
    "softmax": (softmax_kernel, lambda: arrays(11, torch.bfloat16, (200, 512))),
    "rmsnorm": (rmsnorm_kernel, lambda: arrays(12, torch.bfloat16, (200, 512), (512,))),
    "layernorm": (layernorm_kernel, lambda: arrays(13, torch.bfloat16, (200, 512), (512,), (512,))),
    "flash_attention": (flash_attention_fwd, lambda: arrays(14, torch.bfloat16, (256, 64), (256, 64), (256, 64)) + [True]),
    "flash_attention_bwd": (flash_attention_bwd, lambda: arrays(14, torch.bfloat16, *[(256, 64)] * 5)
                            + [np.zeros(256, np.float32), None, True]),
}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_latency_is_positive_and_deterministic(name):
    kernel, make_args = BENCHMARKS[name]
    first, second = (nki.benchmark(kernel)(*make_args()) for _ in range(2))
    assert first.latency_ns > 0
    assert first.latency_ns == second.latency_ns
    assert first.busy_pct == second.busy_pct


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attention_backward_takes_longer_than_the_forward(causal):
    seqlen, d = 512, 128
    q, k, v, o, d_o = arrays(15, torch.bfloat16, *[(seqlen, d)] * 5)
    fwd = nki.benchmark(flash_attention_fwd, numerics=False)(q, k, v, causal)
    bwd = [nki.benchmark(flash_attention_bwd, numerics=False)(q, k, v, o, d_o, np.zeros(seqlen, np.float32),
                                                              causal=causal) for _ in range(2)]
    assert bwd[0].latency_ns == bwd[1].latency_ns
    # five matmuls to the forward's two; causal, the forward's 512-key tiles also multiply masked blocks
    assert causal or bwd[0].flops == 5 * fwd.flops // 2
    assert bwd[0].latency_ns > 1.2 * fwd.latency_ns
