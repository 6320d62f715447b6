"""Supervised fine-tuning with LoRA using TRL's ``SFTTrainer`` on ``neuron``, unchanged.

TRL's standard configuration on ``neuron`` (bf16, and padding to a multiple of 128 to
avoid recompiles) with a tiny Llama and a word-level tokenizer built offline. The
padded batch gives the CPU's loss (and the unpadded batch's), and the saved adapter, loaded on the CPU, gives the
trained model's logits on the device.

    python examples/trl_sft.py [output_dir]
"""

import dataclasses
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

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


def sentences(rows: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(n),), generator=g))
            for n in torch.randint(4, 12, (rows,), generator=g)]


def main(output_dir: str) -> dict:
    tokenizer = word_tokenizer()
    args = SFTConfig(output_dir=output_dir, max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
                     logging_steps=1, save_strategy="no", report_to=[], seed=0)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=tiny_llama(tokenizer), args=args, processing_class=tokenizer, peft_config=lora,
                         train_dataset=Dataset.from_dict({"text": sentences(16, 1)}))
    rows = [trainer.train_dataset[i] for i in range(4)]
    batch = trainer.data_collator(rows)
    unpadded = dataclasses.replace(trainer.data_collator, pad_to_multiple_of=None)(rows)
    result = trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False).eval()

    with torch.no_grad():
        loss_device = model(**{k: v.to("neuron") for k, v in batch.items()}).loss.item()
        loss_unpadded = model(**{k: v.to("neuron") for k, v in unpadded.items()}).loss.item()
        logits_device = model(batch["input_ids"].to("neuron")).logits.cpu()
        model.to("cpu")
        loss_cpu = model(**batch).loss.item()
    adapter_dir = os.path.join(output_dir, "adapter")
    model.save_pretrained(adapter_dir)
    with torch.no_grad():
        logits_cpu = PeftModel.from_pretrained(tiny_llama(tokenizer), adapter_dir)(batch["input_ids"]).logits
    gap = (logits_device - logits_cpu).abs().max().item()
    print(f"device {args.device}, bf16 {args.bf16}, pad_to_multiple_of {args.pad_to_multiple_of}: "
          f"{result.global_step} steps, loss {result.training_loss:.4f}")
    print(f"padded batch {tuple(batch['input_ids'].shape)}: loss on neuron {loss_device:.6f}, on cpu {loss_cpu:.6f}; "
          f"unpadded {tuple(unpadded['input_ids'].shape)} on neuron {loss_unpadded:.6f}")
    print(f"adapter {adapter_dir} on a cpu base model: max logit difference to neuron {gap:.2e}")
    return {"device": str(args.device), "bf16": args.bf16, "steps": result.global_step,
            "padded_shape": tuple(batch["input_ids"].shape), "loss_device": loss_device, "loss_cpu": loss_cpu,
            "loss_unpadded": loss_unpadded, "logit_gap": gap}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="trl_sft_"))
