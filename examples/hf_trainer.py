"""Fine-tune a tiny Llama with the standard Hugging Face ``Trainer`` on the ``neuron`` device.

Nothing here names the device: with trnsim installed, Trainer finds ``neuron:0`` as it
finds a real TorchNeuron install, and runs bf16 mixed precision, gradient accumulation,
clipping, the default fused AdamW, pinned DataLoader memory, evaluation and a checkpoint.
The checkpoint is then loaded on the CPU and on the device, which give the same logits.

    python examples/hf_trainer.py [output_dir]
"""

import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def token_dataset(rows: int, length: int, seed: int) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (rows, length), generator=g).tolist()
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


def main(output_dir: str) -> dict:
    args = TrainingArguments(
        output_dir=output_dir, max_steps=3, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        max_grad_norm=1.0, learning_rate=1e-3, bf16=True, dataloader_pin_memory=True, eval_strategy="steps",
        eval_steps=3, save_steps=3, logging_steps=1, report_to=[], seed=0)
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=token_dataset(24, 16, 1),
                      eval_dataset=token_dataset(8, 16, 2))
    result = trainer.train()
    metrics = trainer.evaluate()
    print(f"device {args.device}, optimizer {args.optim}, bf16 {args.bf16}, "
          f"{result.global_step} steps, train loss {result.training_loss:.4f}, eval loss {metrics['eval_loss']:.4f}")

    checkpoint = os.path.join(output_dir, f"checkpoint-{result.global_step}")
    probe = torch.arange(16).reshape(1, 16)
    with torch.no_grad():
        on_device = LlamaForCausalLM.from_pretrained(checkpoint, device_map="neuron")(probe.to("neuron")).logits.cpu()
        on_cpu = LlamaForCausalLM.from_pretrained(checkpoint, device_map="cpu")(probe).logits
    gap = (on_device - on_cpu).abs().max().item()
    print(f"checkpoint {checkpoint} loaded on neuron and on cpu: max logit difference {gap:.2e}")
    return {"device": str(args.device), "steps": result.global_step, "eval_loss": metrics["eval_loss"],
            "checkpoint": checkpoint, "logit_gap": gap}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="hf_trainer_"))
