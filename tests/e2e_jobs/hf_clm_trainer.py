"""Fine-tune a causal language model on a text file with the Hugging Face ``Trainer``:
the shape of transformers' ``examples/pytorch/language-modeling/run_clm.py`` (its
arguments, dataset loading, tokenization, grouping into blocks, training, metrics), cut
to what a local run needs. It names no device: ``TrainingArguments`` takes the
accelerator accelerate finds, and the launcher (``torchrun``, ``accelerate launch``)
gives the processes.

    torchrun --nproc-per-node 2 hf_clm_trainer.py --model_name_or_path DIR/tiny_llama \\
        --train_file DIR/train.txt --block_size 64 --output_dir out --max_steps 4 ...

At the end the main process prints each logged step's loss, ``step N loss X``, at full
precision (the Trainer's own log prints 4 significant digits).
"""

import logging
import math
import sys
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

import datasets
import transformers
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune from."""

    model_name_or_path: Optional[str] = field(default=None, metadata={"help": "The model checkpoint to start from."})
    config_name: Optional[str] = field(default=None, metadata={"help": "Config name or path, if not the model's."})
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "Tokenizer name or path, if not the model's."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast (tokenizers) tokenizer."})
    dtype: Optional[str] = field(default=None, metadata={"help": "Load the model in this dtype ('auto', 'float32', ...)."})


@dataclass
class DataTrainingArguments:
    """What data to train on."""

    train_file: Optional[str] = field(default=None, metadata={"help": "The training data, a text file."})
    max_train_samples: Optional[int] = field(default=None, metadata={"help": "Truncate the training set to this many."})
    block_size: Optional[int] = field(default=None, metadata={"help": "Tokens per training sequence after grouping."})
    preprocessing_num_workers: Optional[int] = field(default=None, metadata={"help": "Processes for preprocessing."})
    keep_linebreaks: bool = field(default=True, metadata={"help": "Keep line breaks in text files."})

    def __post_init__(self):
        if self.train_file is None:
            raise ValueError("Need a training file (--train_file).")
        if self.train_file.rsplit(".", 1)[-1] not in ("txt", "json", "csv"):
            raise ValueError("--train_file should be a txt, json or csv file.")


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.warning(f"Process rank: {training_args.local_process_index}, device: {training_args.device}, "
                   f"n_gpu: {training_args.n_gpu}, distributed training: {training_args.parallel_mode.value == 'distributed'}")

    set_seed(training_args.seed)

    extension = data_args.train_file.rsplit(".", 1)[-1]
    dataset_args = {}
    if extension == "txt":
        extension = "text"
        dataset_args["keep_linebreaks"] = data_args.keep_linebreaks
    raw_datasets = load_dataset(extension, data_files={"train": data_args.train_file}, **dataset_args)

    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path,
                                              use_fast=model_args.use_fast_tokenizer)
    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(__import__("torch"), model_args.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, config=config, dtype=dtype)

    embedding_size = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embedding_size:
        model.resize_token_embeddings(len(tokenizer))

    column_names = list(raw_datasets["train"].features)
    text_column_name = "text" if "text" in column_names else column_names[0]

    def tokenize_function(examples):
        return tokenizer(examples[text_column_name])

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized_datasets = raw_datasets.map(tokenize_function, batched=True,
                                              num_proc=data_args.preprocessing_num_workers,
                                              remove_columns=column_names, desc="Running tokenizer on dataset")

    if data_args.block_size is None:
        block_size = min(tokenizer.model_max_length, 1024)
    else:
        block_size = min(data_args.block_size, tokenizer.model_max_length)

    def group_texts(examples):
        # Concatenate all texts, then split them into chunks of block_size (dropping the remainder).
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[list(examples.keys())[0]])
        total_length = (total_length // block_size) * block_size
        result = {k: [t[i: i + block_size] for i in range(0, total_length, block_size)]
                  for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    with training_args.main_process_first(desc="grouping texts together"):
        lm_datasets = tokenized_datasets.map(group_texts, batched=True,
                                             num_proc=data_args.preprocessing_num_workers,
                                             desc=f"Grouping texts in chunks of {block_size}")

    train_dataset = lm_datasets["train"]
    if data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))

    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset,
                      processing_class=tokenizer, data_collator=default_data_collator)

    train_result = trainer.train()
    metrics = train_result.metrics
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    if training_args.save_strategy != "no":
        trainer.save_model()
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if trainer.is_world_process_zero():
        for entry in trainer.state.log_history:
            if "loss" in entry:
                print(f"step {entry['step']} loss {entry['loss']!r}", flush=True)
        print(f"train perplexity {math.exp(metrics['train_loss'])!r}", flush=True)


if __name__ == "__main__":
    main()
