"""LoRA fine-tuning of a tiny Llama with PEFT and the standard ``Trainer`` on ``neuron``.

The adapter trains on the device with bf16 mixed precision; saved, then loaded onto a
fresh CPU copy of the base model, it gives the logits of the
trained model on the device.

    python examples/hf_peft_lora.py [output_dir]
"""

import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def main(output_dir: str) -> dict:
    ids = torch.randint(0, 128, (16, 16), generator=torch.Generator().manual_seed(1)).tolist()
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(tiny_llama(), lora)
    args = TrainingArguments(output_dir=output_dir, max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
                             bf16=True, logging_steps=1, save_strategy="no", report_to=[], seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": ids, "labels": ids}))
    result = trainer.train()
    adapter_dir = os.path.join(output_dir, "adapter")
    trainer.model.save_pretrained(adapter_dir)

    probe = torch.arange(16).reshape(1, 16)
    with torch.no_grad():
        trained = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False).eval()
        on_device = trained(probe.to("neuron"))
        on_cpu = PeftModel.from_pretrained(tiny_llama(), adapter_dir)(probe)
    gap = (on_device.logits.cpu() - on_cpu.logits).abs().max().item()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"device {args.device}: LoRA r={lora.r} on q_proj/v_proj, {trainable} trainable parameters, "
          f"{result.global_step} steps, loss {result.training_loss:.4f}")
    print(f"adapter {adapter_dir} on a cpu base model: max logit difference to neuron {gap:.2e}")
    return {"device": str(args.device), "steps": result.global_step, "adapter": adapter_dir, "logit_gap": gap}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="hf_peft_lora_"))
