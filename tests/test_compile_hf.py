"""Hugging Face static-cache generation on ``neuron`` under ``torch.compile``.

``generate(..., cache_implementation="static")`` on a ``neuron`` model compiles the
model's forward with ``CompileConfig(backend="neuron", dynamic=False, mode="default")``
(transformers' ``_default_compile_config``). In transformers 5.24 the plain prefill runs
eagerly (``_prefill`` calls ``self(...)``) and only the decode steps run the compiled
forward; with ``prefill_chunk_size`` the prefill chunks run it too. The tokens must be
the CPU's (eager, same weights), and the compilations must be one graph per shape: one
for decode, reused by every following token, plus one for a one-chunk prefill.

Compilations are counted with Dynamo's own counter (graphs handed to the backend), so
the counts hold for any backend named "neuron".
"""

import copy

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT = 8


@pytest.fixture
def graphs_compiled():
    """A function returning the graphs compiled since the test began, as
    ``torch.neuron.get_dynamo_metrics()`` lists them, checking that they come from as many
    graphs as Dynamo handed the backend (Dynamo's caches start empty: transformers' forwards share code
    objects across models, and so share Dynamo's per-code recompile limit)."""
    torch._dynamo.reset()
    counters.clear()
    torch.neuron.reset_dynamo_metrics()

    def graphs() -> list:
        compiled = torch.neuron.get_dynamo_metrics()   # a training compilation has a forward and a backward graph
        assert len({g.compile_id for g in compiled}) == counters["stats"]["unique_graphs"]
        return compiled

    yield graphs
    torch._dynamo.reset()


def _tiny_llama(dtype: torch.dtype) -> LlamaForCausalLM:
    """A seeded random Llama: hidden 64, 2 layers, 4 query and 2 key/value heads, vocab
    256, no end-of-sequence token (so every generation has its full length)."""
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
                         bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(dtype)


def _generate(model: LlamaForCausalLM, prompt: torch.Tensor, new_tokens: int, **kwargs):
    out = model.generate(prompt.to(model.device), max_new_tokens=new_tokens, do_sample=False,
                         cache_implementation="static", return_dict_in_generate=True, output_logits=True,
                         **kwargs)
    return out.sequences.cpu(), torch.stack(out.logits).cpu()


def _pair(dtype: torch.dtype) -> tuple[LlamaForCausalLM, LlamaForCausalLM, torch.Tensor]:
    cpu = _tiny_llama(dtype)
    prompt = torch.randint(1, 256, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    return cpu, copy.deepcopy(cpu).to("neuron"), prompt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_static_cache_generate_matches_cpu_with_one_decode_graph(graphs_compiled, dtype):
    cpu, neuron, prompt = _pair(dtype)
    want_tokens, want_logits = _generate(cpu, prompt, 16)
    tokens, logits = _generate(neuron, prompt, 16)
    assert tokens.shape == (1, PROMPT + 16)
    assert torch.equal(tokens, want_tokens)
    # the compiled decode graph is not the eager op sequence (PyTorch's decompositions): fp32 logits differ in
    # the last bits, as the same graph does on the CPU
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    # prefill is eager; the first decode step compiles and the 14 after it reuse the graph
    graphs = graphs_compiled()
    assert len(graphs) == 1 and not graphs[0].recompile
    again, _ = _generate(neuron, prompt, 16)
    assert torch.equal(again, want_tokens)
    assert len(graphs_compiled()) == 1


def test_chunked_prefill_compiles_one_prefill_and_one_decode_graph(graphs_compiled):
    cpu, neuron, prompt = _pair(torch.float32)
    want_tokens, _ = _generate(cpu, prompt, 4, prefill_chunk_size=PROMPT)
    tokens, _ = _generate(neuron, prompt, 4, prefill_chunk_size=PROMPT)
    assert torch.equal(tokens, want_tokens)
    prefill, decode = graphs_compiled()
    assert not prefill.recompile
    # the decode step calls the forward with other keyword arguments: Dynamo compiles it once more
    assert decode.recompile and "kwargs" in decode.reason


def _hf_llama(layers: int = 2, vocab: int = 512) -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=layers, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=1024)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_compiled_llama_gives_eager_logits(graphs_compiled, dtype, tol):
    model = _hf_llama().to("neuron", dtype).eval()
    ids = torch.randint(0, 512, (1, 128), device="neuron")
    with torch.no_grad():
        eager = model(ids).logits.float().cpu()
        compiled = torch.compile(model, backend="neuron")(ids).logits.float().cpu()
    assert (compiled - eager).abs().max().item() <= tol * max(eager.abs().max().item(), 1.0)


def test_compiled_llama_training_step_gives_eager_gradients(graphs_compiled):
    model = _hf_llama().to("neuron")
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 512, (2, 64), device="neuron")
    model(ids, labels=ids).loss.backward()
    loss = torch.compile(twin, backend="neuron")(ids, labels=ids).loss
    loss.backward()
    kinds = sorted(g.kind for g in graphs_compiled())
    assert "forward" in kinds and "backward" in kinds
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=1e-4, atol=1e-6, msg=name)


def test_compiled_llama_forward_time_against_eager(graphs_compiled):
    import trnsim

    def device_ps(fn) -> int:
        torch.neuron.synchronize()
        with trnsim.profile() as prof:
            fn()
            torch.neuron.synchronize()
        return prof.device_ps

    model = _hf_llama(layers=4, vocab=1000).to("neuron").eval()
    compiled = torch.compile(model, backend="neuron")
    for batch, seq, at_most in ((1, 128, 0.5), (4, 512, 1.0)):
        ids = torch.randint(0, 1000, (batch, seq), device="neuron")
        with torch.no_grad():
            compiled(ids)
            eager_ps = device_ps(lambda ids=ids: model(ids))
            compiled_ps = device_ps(lambda ids=ids: compiled(ids))
        assert compiled_ps < at_most * eager_ps, (batch, seq, compiled_ps, eager_ps)
