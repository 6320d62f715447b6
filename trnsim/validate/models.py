"""End-to-end model latencies AWS published, against trnsim running the same model.

AWS's trn1 inference benchmark table (aws-neuron-sdk
``about-neuron/benchmarks/trn1/latency_data_encoder.csv``, the data behind the "Trn1
inference performance" page) times Hugging Face encoders on one NeuronCore-v2 of a
trn1.2xlarge: ``AutoModel``, batch 1, sequence 128, fp32 weights with the compiler's
matmul auto-cast to bf16, P50 latency of a call. trnsim builds each model with
transformers from its published config's shapes (random weights, nothing downloaded),
compiles it with ``torch.compile(backend="neuron")`` under ``torch.autocast("neuron",
dtype=torch.bfloat16)`` on trn1 and times one call's device work (its second: the
first compiles). AWS's benchmark traces the model (``torch_neuronx.trace``), whose weights
are constants of the compiled program, so the compiler's auto-cast stores the matmuls'
weights in bf16 once; trnsim's compiled graph takes the weights as inputs and would cast
them on every call, so the figure stores the ``nn.Linear`` weights in bf16 first
(assumption: what the traced program holds). The published P50 also holds the host's
call and the runtime's launch, which trnsim's figure does not (assumption: small against
a millisecond). No parameter was fitted to these figures: all are ``check``.
"""

from __future__ import annotations

from collections.abc import Callable

from trnsim.validate.figures import Figure, Sources

_TABLE = "about-neuron/benchmarks/trn1/latency_data_encoder.csv"
#: model -> (transformers config class, config overrides, published P50 ms, Neuron release of the row)
_MODELS: dict[str, tuple[str, dict[str, int], float, str]] = {
    "bert-base-uncased": ("BertConfig", {}, 0.94294548, "2.26.0"),
    "bert-large-uncased": ("BertConfig", {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                                          "intermediate_size": 4096}, 2.66885757, "2.27.0"),
    "distilbert-base-uncased": ("DistilBertConfig", {}, 0.54264069, "2.27.0"),
    "roberta-base": ("RobertaConfig", {"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1},
                     0.95796585, "2.27.0"),
}


def _latency_ms(config_class: str, overrides: dict[str, int]) -> Callable[[Sources], float]:
    def simulate(_: Sources) -> float:
        import torch
        import transformers

        from trnsim import profile
        from trnsim.backend import state

        before = state.chip()
        state.set_chip("trn1")
        try:
            torch.manual_seed(0)
            config = getattr(transformers, config_class)(**overrides)
            model = transformers.AutoModel.from_config(config).eval()
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):   # the traced program's auto-cast weights
                    m.to(torch.bfloat16)
            model = model.to("neuron")
            ids = torch.randint(0, config.vocab_size, (1, 128)).to("neuron")
            mask = torch.ones(1, 128, dtype=torch.long).to("neuron")
            compiled = torch.compile(model, backend="neuron")
            with torch.no_grad(), torch.autocast("neuron", dtype=torch.bfloat16):
                compiled(input_ids=ids, attention_mask=mask)
                with profile() as prof:
                    compiled(input_ids=ids, attention_mask=mask)
            return prof.device_ps / 1e9
        finally:
            state.set_chip(before)
            torch._dynamo.reset()
    return simulate


def figures() -> list[Figure]:
    return [Figure(key=f"trn1-inference.{name}", kind="e2e",
                   what=f"{name} inference, batch 1, sequence 128, bf16 matmuls (AutoModel)", chip="trn1",
                   source=f"{_TABLE}, {name} row (Neuron {release}), P50", published=ms, unit="ms", group="check",
                   runs=f"transformers {cls} ({name} shapes), torch.compile(backend='neuron'), autocast bf16",
                   simulate=_latency_ms(cls, overrides), quick=False)
            for name, (cls, overrides, ms, release) in _MODELS.items()]
