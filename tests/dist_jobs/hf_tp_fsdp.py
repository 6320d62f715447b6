"""Hugging Face training on a TP x FSDP grid set at load: run under ``torchrun`` (or one process).

    python hf_tp_fsdp.py prepare DIR                      # a tiny Llama and a tokenizer, saved to DIR/base
    torchrun --nproc-per-node=4 hf_tp_fsdp.py sft DIR --tp 2 --fsdp 2
    python hf_tp_fsdp.py sft DIR --batch 4                # one process, the same global batch
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python hf_tp_fsdp.py cpu DIR/sft-tp2-fsdp2-b2

``sft`` (TRL's ``SFTTrainer``) or ``trainer`` (``Trainer``) loads DIR/base with
``from_pretrained(..., distributed_config=DistributedConfig(tp_size, fsdp_size))`` when
given ``--tp``/``--fsdp``, trains 3 steps in fp32, saves the model with ``save_model``
and writes ``result.json`` beside it: the logged losses, each step's simulated time and
the trained model's logits on a probe batch. ``cpu`` loads a saved model with plain ``from_pretrained`` on the CPU and
writes its logits on the same probe to ``cpu.json``.
"""

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

WORDS = "the a cat dog sat ran on under mat log red blue big small and then".split()
PROBE = [[3 + (7 * i) % len(WORDS) for i in range(12)]]


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def prepare(root: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer()
    # the vocabulary (19 words) padded to 32 rows, as real models pad theirs: transformers 5.24 cannot
    # load a weight whose rows leave a rank of the grid an empty shard (19 rows over 8 ranks)
    config = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(os.path.join(root, "base"))
    tok.save_pretrained(os.path.join(root, "base"))


def dataset(kind: str):
    from datasets import Dataset

    g = torch.Generator().manual_seed(1)
    if kind == "trainer":
        ids = torch.randint(3, 3 + len(WORDS), (32, 16), generator=g).tolist()
        return Dataset.from_dict({"input_ids": ids, "labels": ids})
    lengths = torch.randint(4, 12, (32,), generator=g)
    return Dataset.from_dict({"text": [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(n),), generator=g))
                                       for n in lengths]})


def step_clock():
    """A callback that times each optimizer step on the device's (simulated) clock: its
    length in milliseconds and its span on the rank's trace in nanoseconds."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ms: list[float] = []
            self.spans_ns: list[tuple[int, int]] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = torch.neuron.Event(enable_timing=True)
            self.start.record()

        def on_step_end(self, args, state, control, **kwargs):
            end = torch.neuron.Event(enable_timing=True)
            end.record()
            end.synchronize()
            self.ms.append(self.start.elapsed_time(end))
            self.spans_ns.append((self.start.time_ps // 1000, end.time_ps // 1000))

    return StepClock()


def train(kind: str, root: str, tp: int, fsdp: int, batch: int) -> None:
    from transformers import LlamaForCausalLM, Trainer, TrainingArguments

    grid = tp * fsdp > 1
    kwargs = {}
    if grid:
        from transformers.distributed import DistributedConfig

        kwargs["distributed_config"] = DistributedConfig(tp_size=tp, fsdp_size=fsdp)
    model = LlamaForCausalLM.from_pretrained(os.path.join(root, "base"), **kwargs)
    out = os.path.join(root, f"{kind}-tp{tp}-fsdp{fsdp}-b{batch}")
    common = dict(output_dir=out, max_steps=3, per_device_train_batch_size=batch, learning_rate=1e-2,
                  logging_steps=1, save_strategy="no", report_to=[], seed=0, bf16=False)
    if kind == "trainer":
        trainer = Trainer(model=model, args=TrainingArguments(**common), train_dataset=dataset(kind))
    else:
        from trl import SFTConfig, SFTTrainer

        trainer = SFTTrainer(model=model, args=SFTConfig(**common), processing_class=tokenizer(),
                             train_dataset=dataset(kind))
    clock = step_clock()
    trainer.add_callback(clock)
    trainer.train()
    trainer.save_model(out)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor(PROBE, device=model.device)).logits
    logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
    if trainer.args.process_index == 0:
        result = {"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                  "step_ms": clock.ms, "step_spans_ns": clock.spans_ns, "device": str(trainer.args.device),
                  "world_size": trainer.args.world_size,
                  "model": type(model).__name__,
                  "param": type(next(model.parameters())).__name__, "logits": logits.cpu().tolist()}
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)
    if grid:
        import torch.distributed as dist

        dist.barrier()
        print(f"rank {dist.get_rank()}: hf_tp_fsdp ok", flush=True)


def cpu(saved: str) -> None:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(saved).eval()
    with torch.no_grad():
        logits = model(torch.tensor(PROBE)).logits
    with open(os.path.join(saved, "cpu.json"), "w") as f:
        json.dump({"device": str(model.device), "logits": logits.tolist()}, f)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("prepare", "sft", "trainer", "cpu"))
    p.add_argument("dir")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--fsdp", type=int, default=1)
    p.add_argument("--batch", type=int, default=2, help="per-device batch")
    a = p.parse_args()
    if a.mode == "prepare":
        prepare(a.dir)
    elif a.mode == "cpu":
        cpu(a.dir)
    else:
        train(a.mode, a.dir, a.tp, a.fsdp, a.batch)


if __name__ == "__main__":
    main()
