"""Preference tuning with TRL's ``DPOTrainer`` on ``neuron``, unchanged.

TRL's standard DPO configuration (sigmoid loss, a frozen reference copy of the model,
bf16, padding to a multiple of 128 on ``neuron``) on a tiny Llama with a word-level
tokenizer built offline and a preference dataset from ``Dataset.from_dict``.

    python examples/trl_dpo.py [output_dir]
"""

import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import DPOConfig, DPOTrainer

WORDS = "the a cat dog sat ran on under mat log red blue big small and then".split()


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def tiny_llama(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def preferences(rows: int, seed: int) -> Dataset:
    g = torch.Generator().manual_seed(seed)

    def phrase(n: int) -> str:
        return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=g))

    return Dataset.from_dict({"prompt": [phrase(4) for _ in range(rows)],
                              "chosen": [phrase(3) for _ in range(rows)],
                              "rejected": [phrase(3) for _ in range(rows)]})


def main(output_dir: str) -> dict:
    tokenizer = word_tokenizer()
    args = DPOConfig(output_dir=output_dir, max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3,
                     logging_steps=1, save_strategy="no", report_to=[], seed=0)
    base = os.path.join(output_dir, "base")   # TRL loads the policy and its reference copy from a path
    tiny_llama(tokenizer).save_pretrained(base)
    trainer = DPOTrainer(model=base, args=args, processing_class=tokenizer,
                         train_dataset=preferences(12, 1))
    result = trainer.train()
    ref_device = next(trainer.ref_model.parameters()).device
    rewards = [log["rewards/margins"] for log in trainer.state.log_history if "rewards/margins" in log]
    print(f"device {args.device} (reference model on {ref_device}), bf16 {args.bf16}, loss {args.loss_type}, pad_to_multiple_of "
          f"{args.pad_to_multiple_of}: {result.global_step} steps, loss {result.training_loss:.4f}, "
          f"reward margins {[round(r, 4) for r in rewards]}")
    return {"device": str(args.device), "bf16": args.bf16, "ref_device": str(ref_device), "steps": result.global_step,
            "loss": result.training_loss, "margins": rewards}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="trl_dpo_"))
