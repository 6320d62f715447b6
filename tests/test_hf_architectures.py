"""Hugging Face text-generation architectures on ``neuron`` give the CPU's results.

By default a representative subset of :mod:`trnsim.models.hf_coverage`'s sweep runs
(a dense Llama, a mixture of experts on transformers' grouped-matmul expert path, a
state-space Mamba, sliding-window Mistral, the Jamba hybrid), plus the two device ops
mixture-of-experts layers needed: integer ``histc`` and ``_grouped_mm``. The sweep over
every architecture is ``-m slow``.
"""

import os

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the Hugging Face tests need transformers (the hf extra)")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import trnsim
import trnsim.nki as nki
from trnsim.kernels.grouped import grouped_matmul
from trnsim.models import hf_coverage


@pytest.mark.parametrize("arch, steps", [
    ("llama", ("forward", "greedy", "sample")),
    ("mixtral", ("forward", "greedy", "static")),
    ("mamba", ("forward", "greedy")),
    ("mistral", ("forward", "greedy")),
    ("jamba", ("forward", "greedy")),
    ("zamba2", ("forward", "greedy")),
])
def test_architecture_matches_cpu(arch, steps):
    result = hf_coverage.check(arch, steps)
    assert (result.status, result.reason) == ("pass", "")
    assert result.steps == {s: "ok" for s in steps}


def test_sliding_window_is_exercised():
    """The tiny Mistral's window is shorter than the prompt, so the mask cuts keys."""
    config = hf_coverage.tiny_config("mistral")
    assert config.sliding_window < hf_coverage.PROMPT


@pytest.mark.parametrize("arch, config_class", [
    ("qwen3_5", "Qwen3_5TextConfig"), ("llama4", "Llama4TextConfig"), ("musicgen", "MusicgenDecoderConfig"),
])
def test_text_only_causal_lm_of_a_composite_gets_its_text_config(arch, config_class):
    assert type(hf_coverage.tiny_config(arch)).__name__ == config_class


@pytest.mark.parametrize("arch, key, layers", [
    ("zamba2", "layers_block_type", 2), ("zamba", "layers_block_type", 3), ("lfm2_moe", "layer_types", 2),
    ("gpt_neo", "attention_layers", 2), ("llama4", "layer_types", 2), ("qwen3_5", "layer_types", 2),
])
def test_layer_patterns_match_the_layer_count(arch, key, layers):
    config = hf_coverage.tiny_config(arch)
    assert len(getattr(config, key)) == config.num_hidden_layers == layers


def test_architecture_sizes_merge_into_sub_configs():
    """A dict entry of ``_ARCH`` updates the shrunk sub-config instead of replacing it."""
    attn = hf_coverage.tiny_config("dbrx").attn_config
    assert (attn.clip_qkv, attn.rope_theta, attn.kv_n_heads) == (8.0, 10000.0, 1)
    assert hf_coverage.tiny_config("blt").encoder_config.hidden_size_global == 64


def test_a_drafter_is_skipped_with_its_reason():
    result = hf_coverage.check("gemma4_assistant", ("forward",))
    assert result.status == "skip"
    assert "drafter" in result.reason and "shared key/value states" in result.reason


def test_check_reports_the_op_of_a_failure(monkeypatch):
    """A device failure names its exception, the aten op and the trnsim function."""
    from trnsim.backend import edge_ops

    def broken(self, *args, **kwargs):   # in place of integer_histc, whatever histc's arguments
        raise NotImplementedError(f'"histogram_cpu" not implemented for {self.dtype}')

    monkeypatch.setattr(edge_ops, "integer_histc", broken)
    result = hf_coverage.check("mixtral", ("forward",))
    assert result.status == "fail"
    assert result.steps == {"forward": "NotImplementedError"}
    assert result.op == "aten::histc"
    assert result.where.startswith("trnsim.backend.")


@pytest.mark.parametrize("folder", ["/home/u/trnsim", "/srv/trnsim-main/src", "/opt/x"])
def test_origin_names_modules_whatever_folder_holds_the_checkout(folder):
    """The failing function is named by its module, not by its file's path: a test file
    in a checkout folder called ``trnsim`` (the default clone folder) is not
    ``trnsim.tests...``, and trnsim's own frames keep their module names."""
    from trnsim.backend import edge_ops

    code = compile("def broken(x):\n    return x.histc()\n", f"{folder}/tests/test_fake.py", "exec")
    scope = {"__name__": "tests.test_fake"}
    exec(code, scope)

    def inner():
        scope["broken"](None)

    try:
        inner()
    except AttributeError as e:
        assert hf_coverage._origin(e) == ("", "")
    try:
        edge_ops.integer_histc(None)
    except Exception as e:  # noqa: BLE001 - whatever it raises, its origin is edge_ops
        assert hf_coverage._origin(e)[1].startswith("trnsim.backend.edge_ops.")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
@pytest.mark.parametrize("bins, lo, hi", [(4, 0, 3), (4, 0, 0), (3, 1, 2), (5, 0.5, 3.5), (2, 5, 5)])
def test_integer_histc_counts_as_float_histc(dtype, bins, lo, hi):
    x = torch.tensor([0, 1, 1, 3, 7, 2, 5], dtype=dtype)
    got = torch.histc(x.to("neuron"), bins, lo, hi)
    assert got.dtype == dtype
    assert got.cpu().tolist() == torch.histc(x.float(), bins, lo, hi).to(dtype).tolist()


def test_integer_histc_out_and_errors():
    x = torch.tensor([0, 2, 2], dtype=torch.int32, device="neuron")
    out = torch.empty(0, dtype=torch.int32, device="neuron")
    torch.histc(x, 3, 0, 2, out=out)
    assert out.cpu().tolist() == [1, 0, 2]
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x, 0, 0, 2)


def test_grouped_mm_matches_cpu_and_is_one_kernel():
    torch.manual_seed(0)
    x = torch.randn(10, 16)
    w = torch.randn(3, 16, 8)
    offs = torch.tensor([3, 3, 9], dtype=torch.int32)
    want = torch._grouped_mm(x, w, offs=offs)
    with trnsim.profile() as prof:
        got = torch._grouped_mm(x.to("neuron"), w.to("neuron"), offs=offs.to("neuron"))
    assert torch.equal(got.cpu()[:9], want[:9])
    rows = {r.name: r for r in prof.summary()}
    assert "aten::mm.out" not in rows
    assert (rows["aten::_grouped_mm"].calls, rows["aten::_grouped_mm"].kernel) == (1, "grouped_matmul")


def test_grouped_matmul_kernel_matches_reference():
    rng = np.random.default_rng(0)
    k, m, n, rows = 48, 18, 24, (5, 0, 9, 4)
    lhsT = rng.standard_normal((k, m), dtype=np.float32)
    rhs = rng.standard_normal((len(rows), k, n), dtype=np.float32)
    got = nki.simulate(grouped_matmul)(lhsT, rhs, rows=rows)
    want = np.concatenate([lhsT[:, s:s + r].T @ rhs[g] for g, (s, r) in enumerate(zip(np.cumsum((0,) + rows), rows))])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_matmul_time_grows_with_the_groups_that_have_rows():
    """An expert with no tokens costs nothing: its weight is never loaded."""
    from trnsim.simulator import simulate

    def ps(rows):
        traced = grouped_matmul.trace(np.zeros((256, 16), np.float32), np.zeros((4, 256, 512), np.float32),
                                      rows=rows, chip="trn2")
        return simulate(traced.tracer.program, None, fidelity="timing").total_ps

    assert ps((16, 0, 0, 0)) < ps((8, 8, 0, 0)) < ps((4, 4, 4, 4))


def test_grouped_matmul_refuses_bad_rows():
    with pytest.raises(nki.KernelError, match="rows"):
        nki.simulate(grouped_matmul)(np.zeros((8, 4), np.float32), np.zeros((2, 8, 4), np.float32), rows=(3, 3))


@pytest.mark.slow
def test_every_architecture_matches_cpu():
    """The whole sweep (about 9 minutes on 2 cores): every architecture buildable from a
    tiny config passes."""
    results = hf_coverage.sweep(jobs=2)
    failed = [hf_coverage.row(r) for r in results if r.status not in ("pass", "skip")]
    assert failed == []
