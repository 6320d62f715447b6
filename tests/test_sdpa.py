"""``scaled_dot_product_attention`` on ``neuron``: one fused op, forward and backward,
timed by the flash-attention kernel, with the CPU's SDPA results; cases the fused op
does not take go through PyTorch's math decomposition and still match."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import trnsim
from trnsim.backend import timeline

DEV = "neuron"
FWD = "aten::_scaled_dot_product_fused_attention_overrideable"
BWD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"


def _inputs(seed, q_shape, k_shape, v_shape=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype) for s in (q_shape, k_shape, v_shape or k_shape)]


def _run(dev, tensors, mask=None, **kwargs):
    """SDPA forward and backward on ``dev``; the output and the grads of q, k, v (and of
    the mask where it requires grad), on the CPU."""
    q, k, v = [t.to(dev).requires_grad_() for t in tensors]
    m = None
    if mask is not None:
        m = mask.detach().to(dev).requires_grad_(mask.requires_grad)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs)
    (out.float() * torch.linspace(-1, 1, out.shape[-1], device=dev)).sum().backward()
    got = [out, q.grad, k.grad, v.grad] + ([m.grad] if m is not None and m.requires_grad else [])
    return [t.cpu() for t in got]


def _profiled(tensors, mask=None, **kwargs):
    with trnsim.profile() as prof:
        got = _run(DEV, tensors, mask, **kwargs)
    return got, [r for r in prof.records if "attention" in r.name or "bmm" in r.name or "softmax" in r.name]


CASES = {
    "plain": (((2, 3, 40, 16), (2, 3, 40, 16)), None, {}),
    "causal": (((2, 3, 40, 16), (2, 3, 40, 16)), None, {"is_causal": True}),
    "scale": (((1, 2, 33, 8), (1, 2, 33, 8)), None, {"scale": 0.3}),
    "more keys": (((2, 2, 12, 16), (2, 2, 50, 16)), None, {}),
    "fewer keys, causal": (((1, 2, 50, 16), (1, 2, 12, 16)), None, {"is_causal": True}),
    "float mask": (((2, 3, 20, 16), (2, 3, 30, 16)), torch.randn(2, 1, 20, 30), {}),
    "bool mask": (((2, 3, 20, 16), (2, 3, 30, 16)), torch.rand(20, 30) > 0.3, {}),
    "gqa": (((2, 6, 20, 16), (2, 2, 30, 16)), None, {"enable_gqa": True, "is_causal": True}),
}


@pytest.mark.parametrize("case", CASES)
def test_fused_sdpa_matches_cpu_forward_and_backward(case):
    shapes, mask, kwargs = CASES[case]
    tensors = _inputs(0, *shapes)
    got, ops = _profiled(tensors, mask, **kwargs)
    assert [r.name for r in ops] == [FWD, BWD]
    for a, b in zip(got, _run("cpu", tensors, mask, **kwargs)):
        torch.testing.assert_close(a, b)


def test_bf16_matches_cpu():
    tensors = _inputs(1, (2, 4, 64, 32), (2, 4, 64, 32), dtype=torch.bfloat16)
    got, ops = _profiled(tensors, is_causal=True)
    assert [r.name for r in ops] == [FWD, BWD]
    for a, b in zip(got, _run("cpu", tensors, is_causal=True)):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_profile_shows_one_kernel_timed_op_each_way():
    tensors = _inputs(2, (2, 4, 256, 64), (2, 4, 384, 64))
    _, ops = _profiled(tensors, is_causal=True)
    fwd, bwd = ops
    lnc = torch.neuron.chip().logical_core_size
    assert (fwd.name, fwd.cost.source, fwd.cost.kernel) == (FWD, "kernel", "flash_attention_fwd")
    assert fwd.cost.scale == 8 // lnc            # one Program per (batch, head), shared by the physical cores
    assert (bwd.name, bwd.cost.source, bwd.cost.kernel) == (BWD, "kernel", "flash_attention_bwd")
    assert bwd.cost.scale == 8 // lnc
    assert bwd.end_ps - bwd.start_ps > fwd.end_ps - fwd.start_ps
    assert fwd.shapes[:3] == ((2, 4, 256, 64), (2, 4, 384, 64), (2, 4, 384, 64))


def test_a_mask_costs_its_bytes_on_top_of_the_kernel():
    tensors = _inputs(3, (1, 2, 128, 64), (1, 2, 128, 64))
    _, (plain, _) = _profiled(tensors)
    _, (masked, _) = _profiled(tensors, torch.zeros(1, 2, 128, 128))
    assert masked.cost.kernel == "flash_attention_fwd + mask"
    assert masked.end_ps - masked.start_ps > plain.end_ps - plain.start_ps


def test_simulated_time_is_deterministic():
    tensors = _inputs(4, (1, 2, 256, 64), (1, 2, 256, 64))
    times = []
    for _ in range(2):
        timeline.reset_caches()
        _, ops = _profiled(tensors, is_causal=True)
        times.append([r.end_ps - r.start_ps for r in ops])
    assert times[0] == times[1] and all(t > 0 for t in times[0])


UNFUSED = {
    "3-d": (((3, 16, 8), (3, 16, 8)), None, {}),
    "value head dim": (((1, 2, 16, 8), (1, 2, 16, 8), (1, 2, 16, 12)), None, {}),
    "mask with grad": (((1, 2, 16, 8), (1, 2, 16, 8)), torch.randn(16, 16).requires_grad_(), {}),
}


@pytest.mark.parametrize("case", UNFUSED)
def test_unsupported_cases_take_the_math_path_and_match_cpu(case):
    shapes, mask, kwargs = UNFUSED[case]
    tensors = _inputs(5, *shapes)
    got, ops = _profiled(tensors, mask, **kwargs)
    names = {r.name for r in ops}
    assert FWD not in names and BWD not in names and any("bmm" in n for n in names)
    for a, b in zip(got, _run("cpu", tensors, mask, **kwargs)):
        torch.testing.assert_close(a, b)


def test_dropout_takes_the_math_path_and_draws_as_the_cpu():
    tensors = _inputs(6, (1, 2, 16, 8), (1, 2, 16, 8))
    torch.manual_seed(7)
    got, ops = _profiled(tensors, dropout_p=0.3)
    assert FWD not in {r.name for r in ops}
    torch.manual_seed(7)
    for a, b in zip(got, _run("cpu", tensors, dropout_p=0.3)):
        torch.testing.assert_close(a, b)


def test_sdpa_kernel_with_math_alone_turns_the_fused_op_off():
    tensors = _inputs(7, (1, 2, 16, 8), (1, 2, 16, 8))
    with sdpa_kernel([SDPBackend.MATH]):
        _, ops = _profiled(tensors)
    assert FWD not in {r.name for r in ops}
    with sdpa_kernel([SDPBackend.OVERRIDEABLE]):
        _, ops = _profiled(tensors)
    assert [r.name for r in ops] == [FWD, BWD]


@pytest.mark.parametrize("backends", [
    [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH], [SDPBackend.FLASH_ATTENTION],
    [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], [SDPBackend.CUDNN_ATTENTION]],
    ids=["torchtitan's list", "flash", "efficient, math", "cudnn"])
def test_sdpa_kernel_with_any_fused_backend_runs_the_flash_kernels(backends):
    """torchtitan's sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH]) ran attention as
    math on neuron, op by op (bmm, _softmax); the chip runs its flash kernel."""
    tensors = _inputs(7, (1, 2, 16, 8), (1, 2, 16, 8))
    with sdpa_kernel(backends):
        got, ops = _profiled(tensors, is_causal=True)
    assert [(r.name, r.cost.kernel) for r in ops] == [(FWD, "flash_attention_fwd"), (BWD, "flash_attention_bwd")]
    for a, b in zip(got, _run("cpu", tensors, is_causal=True)):
        torch.testing.assert_close(a, b)


def test_inference_mode_takes_the_fused_op():
    q, k, v = [t.to(DEV) for t in _inputs(8, (1, 2, 16, 8), (1, 2, 16, 8))]
    with torch.inference_mode(), trnsim.profile() as prof:
        out = F.scaled_dot_product_attention(q, k, v)
    assert [r.name for r in prof.records] == [FWD]
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu()))


def _choice_cases():
    b, h, s, d = 2, 3, 16, 8
    qkv = _inputs(9, (b, h, s, d), (b, h, 24, d))
    q, k, v = qkv
    yield "plain", qkv, {}
    yield "dropout", qkv, {"dropout_p": 0.1}
    yield "gqa", [q, k[:, :1], v[:, :1]], {"enable_gqa": True}
    yield "gqa without enable_gqa", [q, k[:, :1], v[:, :1]], {}
    yield "gqa, heads not a multiple", [q, k[:, :2], v[:, :2]], {"enable_gqa": True}
    yield "gqa, key and value heads differ", [q, k[:, :1], v], {"enable_gqa": True}
    yield "3-d", [t[0] for t in qkv], {}
    yield "batch", [q, k[:1], v[:1]], {}
    yield "value head dim", [q, k, v[..., :4]], {}
    yield "strided head dim", [q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v], {}
    yield "empty keys", [q, k[:, :, :0], v[:, :, :0]], {}
    for shape in [(s, 24), (1, 24), (s, 1), (b, 1, s, 24), (1, 1, 1, 24), (h, s, 24), (b, h, s, 24), (s + 1, 24)]:
        yield f"mask {shape}", qkv, {"attn_mask": torch.zeros(shape)}
    yield "bool mask", qkv, {"attn_mask": torch.ones(s, 24, dtype=torch.bool)}
    yield "expanded mask", qkv, {"attn_mask": torch.zeros(s, 1).expand(s, 24)}
    yield "mask with grad", qkv, {"attn_mask": torch.zeros(s, 24, requires_grad=True)}
    yield "bf16", [t.bfloat16() for t in qkv], {}


@pytest.mark.parametrize("name, qkv, kwargs", list(_choice_cases()), ids=[c[0] for c in _choice_cases()])
def test_the_fused_op_takes_what_the_cpu_flash_kernel_takes(name, qkv, kwargs):
    cpu = torch._fused_sdp_choice(*qkv, **kwargs) == int(SDPBackend.FLASH_ATTENTION)
    on_neuron = torch._fused_sdp_choice(*[t.to(DEV) for t in qkv],
                                        **{n: a.to(DEV) if isinstance(a, torch.Tensor) else a
                                           for n, a in kwargs.items()})
    assert on_neuron == int(SDPBackend.OVERRIDEABLE if cpu else SDPBackend.MATH)


def test_coverage_lists_the_fused_ops_as_kernel_timed():
    assert {FWD, BWD} <= set(trnsim.backend.coverage()["kernel"])


@pytest.mark.parametrize("layout", ["contiguous", "heads_last", "sequence_first"])
def test_fused_op_outputs_are_laid_out_as_its_meta_kernel_says(layout):
    """A compiled graph is traced on the meta kernels' layouts and views the results
    accordingly, so the device's results must have those strides (the meta kernel: output
    laid out as the query, gradients as their inputs)."""
    b, h, s, d = 2, 4, 16, 8
    make = {"contiguous": lambda: torch.randn(b, h, s, d),
            "heads_last": lambda: torch.randn(b, s, h, d).transpose(1, 2),
            "sequence_first": lambda: torch.randn(s, b, h, d).permute(1, 2, 0, 3)}[layout]
    torch.manual_seed(0)
    q, k, v = (make().to(DEV) for _ in range(3))
    fwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    bwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default
    got = fwd(q, k, v)
    meta = fwd(*(t.to("meta") for t in (q, k, v)))
    assert got[0].stride() == meta[0].stride() and got[1].stride() == meta[1].stride()
    grad = torch.randn_like(got[0])
    args = (grad, q, k, v, None, [True, True, True, False], got[0], got[1], None, None, s, s, 0.0, False,
            got[6], got[7])
    grads = bwd(*args)
    meta_grads = bwd(*(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args))
    assert [g.stride() for g in grads[:3]] == [g.stride() for g in meta_grads[:3]]


def test_compiled_transformer_encoder_layer_trains_as_on_cpu():
    """nn.TransformerEncoderLayer hands the fused op permuted views; its compiled
    backward views the gradients in the meta kernel's layout."""
    def step(dev, compiled):
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).to(dev)
        run = torch.compile(layer, backend="neuron") if compiled else layer
        x = torch.randn(2, 8, 32).to(dev)
        loss = (run(x) * torch.linspace(-1, 1, 32, device=dev)).sum()
        loss.backward()
        return loss.detach().cpu(), [p.grad.cpu() for p in layer.parameters()]

    want_loss, want = step("cpu", False)
    got_loss, got = step(DEV, True)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_attention_heads_overlap_as_the_second_head_in_one_program_shows():
    """An attention op over many heads costs one head, then for each further head what a
    second head adds when traced in the same Program (the chip overlaps one head's loads
    and latencies with the next one's work), not the number of heads times one head."""
    import trnsim.backend.opkernels as ok
    from trnsim.backend.lowering import placeholder, run_kernel
    from trnsim.kernels.attention import flash_attention_fwd

    args = [placeholder((128, 64), torch.bfloat16) for _ in range(3)]
    one = run_kernel(flash_attention_fwd, "flash_attention_fwd", *args)
    two = run_kernel(ok._two_heads(flash_attention_fwd), "flash_attention_fwd", *args)
    twelve = ok.per_head(flash_attention_fwd, "flash_attention_fwd", 12, *args)
    assert one.ps < two.ps < 2 * one.ps                       # the second head overlaps the first
    assert twelve.ps == one.ps + 11 * (two.ps - one.ps)
    assert twelve.flops() == 12 * one.flops() > 0             # bytes and FLOPs: one head's, twelve times
    assert twelve.hbm_moved() == 12 * one.hbm_moved()
    assert ok.per_head(flash_attention_fwd, "flash_attention_fwd", 1, *args).ps == one.ps


@pytest.mark.parametrize("side_by_side", [True, False])
def test_heads_that_a_projection_laid_side_by_side_run_as_one_kernel(side_by_side):
    """q, k and v viewed per head from a projection's [B, S, H * D] rows (as a model's
    attention makes them) run through ``flash_attention_heads`` per batch entry, which
    loads each row once; heads each in their own rows ([B, H, S, D] contiguous) run one
    ``flash_attention_fwd`` per head. Both give the CPU's result."""
    g = torch.Generator().manual_seed(7)
    rows = [torch.randn(2, 128, 4 * 32, generator=g) for _ in range(3)]
    per_head = [r.view(2, 128, 4, 32).transpose(1, 2) for r in rows]   # strides [S*H*D, D, H*D, 1]
    if not side_by_side:
        per_head = [t.contiguous() for t in per_head]
    with trnsim.profile() as prof:
        out = F.scaled_dot_product_attention(*[t.to(DEV) for t in per_head])
        torch.neuron.synchronize()
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(*per_head), rtol=1e-5, atol=1e-5)
    (rec,) = [r for r in prof.records if r.name == FWD]
    lnc = torch.neuron.chip().logical_core_size
    if side_by_side:
        assert rec.cost.kernel == "flash_attention_heads"
        pairs = 8 // lnc   # a physical core's (batch, head) pairs, a batch entry's heads at most per call
        heads = min(4, pairs)
        kernel, args, kwargs = rec.cost.call
        assert kwargs["heads"] == heads and args[0].shape == (128, 32 * heads)
        assert rec.cost.scale == pairs // heads
    else:
        assert rec.cost.kernel == "flash_attention_fwd" and rec.cost.scale == 8 // lnc


def test_heads_side_by_side_are_timed_in_calls_that_divide_a_cores_share():
    """3 batch entries of 4 heads on trn2 are 6 (batch, head) pairs per physical core:
    two calls of 3 heads, not two of 4 (which would time 8)."""
    before = torch.neuron.chip()
    try:
        torch.neuron.set_chip("trn2")
        g = torch.Generator().manual_seed(8)
        q, k, v = [torch.randn(3, 128, 4 * 32, generator=g).view(3, 128, 4, 32).transpose(1, 2).to(DEV)
                   for _ in range(3)]
        with trnsim.profile() as prof:
            F.scaled_dot_product_attention(q, k, v)
            torch.neuron.synchronize()
        (rec,) = [r for r in prof.records if r.name == FWD]
        _, args, kwargs = rec.cost.call
        assert (kwargs["heads"], rec.cost.scale, args[0].shape) == (3, 2, (128, 96))
    finally:
        torch.neuron.set_chip(before)
