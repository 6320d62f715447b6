"""TRL ``SFTTrainer`` on a tensor-parallel x FSDP grid set at load, on ``neuron``, unchanged.

``from_pretrained(..., distributed_config=DistributedConfig(tp_size=2, fsdp_size=N/2))``
shards a tiny Llama over the grid as it loads (the model's tensor-parallel plan, then
FSDP2); ``SFTTrainer`` trains it without wrapping it again and ``save_model`` writes one
ordinary checkpoint, which plain ``from_pretrained`` loads on the CPU with the trained
model's logits. ``--lora`` trains LoRA adapters instead of every weight; PEFT 0.21 builds
them only on an FSDP grid (``--tp 1``): on a grid with ``tp`` it sizes each adapter from
its base weight's local shard, which FSDP has split as well, and the forward fails.

    trnsim run --nproc 8 examples/trl_sft_lora_tp_fsdp.py                  # tp 2 x fsdp 4
    torchrun --nproc-per-node=8 examples/trl_sft_lora_tp_fsdp.py --tp 1 --lora
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.distributed as dist
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.distributed import DistributedConfig
from trl import SFTConfig, SFTTrainer

WORDS = "the a cat dog sat ran on under mat log red blue big small and then".split()


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def save_tiny_llama(path: str, tokenizer: PreTrainedTokenizerFast) -> None:
    # the vocabulary (19 words) padded to 32 rows, as real models pad theirs: transformers 5.24 cannot
    # load a weight whose rows leave a rank of the grid an empty shard (19 rows over 8 ranks)
    config = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)


def sentences(rows: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(n),), generator=g))
            for n in torch.randint(4, 12, (rows,), generator=g)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size; FSDP takes the other ranks")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (needs --tp 1, see above)")
    args = parser.parse_args()
    if args.lora and args.tp > 1:
        raise SystemExit(f"--lora with --tp {args.tp}: PEFT 0.21 cannot build adapters on a TP x FSDP grid; "
                         "use --tp 1 (FSDP only) or drop --lora")

    dist.init_process_group("neuron")
    world, rank = dist.get_world_size(), dist.get_rank()
    tokenizer = word_tokenizer()
    base = [tempfile.mkdtemp(prefix="trl_sft_tp_fsdp_") if rank == 0 else None]
    if rank == 0:
        save_tiny_llama(base[0], tokenizer)
    dist.broadcast_object_list(base, src=0)

    grid = DistributedConfig(tp_size=args.tp, fsdp_size=world // args.tp)
    model = LlamaForCausalLM.from_pretrained(base[0], distributed_config=grid)
    # fp32 (bf16 is the default on neuron) so that the checkpoint's CPU logits can be compared tightly
    config = SFTConfig(output_dir=os.path.join(base[0], "sft"), max_steps=3, per_device_train_batch_size=2,
                       learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[], seed=0, bf16=False)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=config, processing_class=tokenizer, peft_config=lora if args.lora else None,
                         train_dataset=Dataset.from_dict({"text": sentences(64, 1)}))
    trainer.train()
    trainer.save_model(config.output_dir)

    probe = torch.arange(3, 15).reshape(1, 12)
    trainer.model.eval()
    with torch.no_grad():
        logits = trainer.model(input_ids=probe.to(trainer.args.device)).logits
    logits = (logits.full_tensor() if hasattr(logits, "full_tensor") else logits).cpu()
    if rank == 0:
        losses = [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h]
        print(f"grid tp {args.tp} x fsdp {world // args.tp} on {world} ranks ({trainer.args.device}), "
              f"{type(model).__name__} with {type(next(model.parameters())).__name__} weights, "
              f"{'LoRA' if args.lora else 'every weight'}: losses {losses}")
        if not args.lora:
            with torch.no_grad():
                on_cpu = LlamaForCausalLM.from_pretrained(config.output_dir, device_map="cpu")(probe).logits
            print(f"checkpoint {config.output_dir} on the cpu: max logit difference to the grid "
                  f"{(on_cpu - logits).abs().max().item():.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
