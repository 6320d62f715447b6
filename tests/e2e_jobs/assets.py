"""Local stand-ins for the files real training programs download: a small text corpus
(made here, deterministically, from a fixed word list), a byte-level BPE tokenizer
trained on it, and the corpus as a dataset folder that ``datasets.load_dataset`` reads.

``python assets.py DIR`` writes, under DIR:

- ``tokenizer/`` (``tokenizer.json``, ``tokenizer_config.json``): what torchtitan's
  ``hf_assets_path`` and Hugging Face's ``AutoTokenizer.from_pretrained`` read;
- ``c4_test/data.json``: one JSON object per line with a ``text`` field (torchtitan's
  ``c4_test`` layout), and ``train.txt`` with the same text for ``run_clm``-style scripts;
- ``sft/data.json``: prompt/completion pairs for ``trl sft``.

``python assets.py DIR tiny_llama`` also writes ``DIR/tiny_llama/``: a tiny Llama
(``LlamaConfig``: hidden size 64, 2 layers, 4 attention heads, 2 key/value heads,
intermediate size 128, the tokenizer's vocabulary) with random weights drawn from a
fixed seed, saved with ``save_pretrained`` (safetensors) beside the tokenizer's files,
so that ``--model_name_or_path DIR/tiny_llama`` loads it offline.

Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = ("the a one two model core chip tensor engine vector scalar memory cache token layer weight "
         "gradient step loss train run fast slow small large every each before after while when "
         "reads writes moves sums adds holds sends waits finds keeps makes learns counts splits "
         "of to in on by with from for and or but so then here there now soon").split()
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"


def sentences(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 24))]
        out.append(" ".join(words).capitalize() + ".")
    return out


def documents(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed + 1)
    lines = sentences(count * 6, seed)
    return [" ".join(lines[i * 6:i * 6 + rng.randint(2, 6)]) for i in range(count)]


def tokenizer(out: Path, docs: list[str], vocab_size: int = 512) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "add_bos_token": True, "add_eos_token": False,
        "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"}))
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS,
                                                               "pad_token": PAD}))


def write(root: Path, docs: int = 400) -> Path:
    root = Path(root)
    corpus = documents(docs)
    tokenizer(root / "tokenizer", corpus)
    (root / "c4_test").mkdir(parents=True, exist_ok=True)
    (root / "c4_test" / "data.json").write_text("".join(json.dumps({"text": d}) + "\n" for d in corpus))
    (root / "train.txt").write_text("\n".join(corpus) + "\n")
    (root / "sft").mkdir(parents=True, exist_ok=True)
    pairs = [{"prompt": d.split(".")[0] + ".", "completion": " " + d.split(".", 1)[1].strip()} for d in corpus
             if d.count(".") > 1]
    (root / "sft" / "data.json").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return root


def tiny_llama(root: Path, seed: int = 0) -> Path:
    """A tiny random Llama and the tokenizer under ``root/tiny_llama`` (the tokenizer is
    the one :func:`write` made in ``root/tokenizer``)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    root = Path(root)
    out = root / "tiny_llama"
    tok = AutoTokenizer.from_pretrained(root / "tokenizer")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


if __name__ == "__main__":
    write(Path(sys.argv[1]))
    if "tiny_llama" in sys.argv[2:]:
        tiny_llama(Path(sys.argv[1]))
