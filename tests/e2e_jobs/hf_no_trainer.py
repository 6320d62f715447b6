"""Fine-tune a causal language model on a text file with accelerate and a plain training
loop: the shape of transformers' ``examples/pytorch/language-modeling/
run_clm_no_trainer.py`` (``Accelerator()``, the model and its AdamW optimizer built
before ``accelerator.prepare`` moves the model, a DataLoader, ``get_scheduler``, a loop
with ``accelerator.backward``), cut to what a local run needs. It names no device:
``Accelerator()`` takes the accelerator it finds, and the launcher gives the processes.

    accelerate launch hf_no_trainer.py --model_name_or_path DIR/tiny_llama \\
        --train_file DIR/train.txt --block_size 64 --max_train_steps 4

The main process prints ``step N loss X`` after each step (the loss averaged over the
processes) and at the end ``weights moved X``: the sum over all parameters of
``|w - w0|``, ``w0`` the weights before training.
"""

import argparse
import logging
import math
from itertools import chain

import datasets
import torch
import transformers
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, default_data_collator, get_scheduler

logger = get_logger(__name__)


def parse_args():
    parser = argparse.ArgumentParser(description="Fine-tune a causal language model on a text file")
    parser.add_argument("--train_file", type=str, required=True, help="A txt, csv or json file with the training data.")
    parser.add_argument("--model_name_or_path", type=str, required=True, help="The model to start from.")
    parser.add_argument("--per_device_train_batch_size", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--weight_decay", type=float, default=0.0)
    parser.add_argument("--num_train_epochs", type=int, default=1)
    parser.add_argument("--max_train_steps", type=int, default=None, help="Overrides num_train_epochs if set.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--lr_scheduler_type", type=str, default="linear")
    parser.add_argument("--num_warmup_steps", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--block_size", type=int, default=None)
    parser.add_argument("--preprocessing_num_workers", type=int, default=None)
    args = parser.parse_args()
    if args.train_file.rsplit(".", 1)[-1] not in ("txt", "csv", "json"):
        raise ValueError("--train_file should be a txt, csv or json file.")
    return args


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", level=logging.INFO)
    logger.info(accelerator.state, main_process_only=False)
    if accelerator.is_local_main_process:
        datasets.utils.logging.set_verbosity_warning()
        transformers.utils.logging.set_verbosity_info()
    else:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()

    if args.seed is not None:
        set_seed(args.seed)

    extension = args.train_file.rsplit(".", 1)[-1]
    dataset_args = {}
    if extension == "txt":
        extension = "text"
        dataset_args["keep_linebreaks"] = True
    raw_datasets = load_dataset(extension, data_files={"train": args.train_file}, **dataset_args)

    config = AutoConfig.from_pretrained(args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, config=config)
    embedding_size = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embedding_size:
        model.resize_token_embeddings(len(tokenizer))

    column_names = raw_datasets["train"].column_names
    text_column_name = "text" if "text" in column_names else column_names[0]

    def tokenize_function(examples):
        return tokenizer(examples[text_column_name])

    with accelerator.main_process_first():
        tokenized_datasets = raw_datasets.map(tokenize_function, batched=True, num_proc=args.preprocessing_num_workers,
                                              remove_columns=column_names, desc="Running tokenizer on dataset")

    block_size = min(args.block_size or 1024, tokenizer.model_max_length)

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = (len(concatenated[list(examples.keys())[0]]) // block_size) * block_size
        result = {k: [t[i: i + block_size] for i in range(0, total_length, block_size)]
                  for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    with accelerator.main_process_first():
        lm_datasets = tokenized_datasets.map(group_texts, batched=True, num_proc=args.preprocessing_num_workers,
                                             desc=f"Grouping texts in chunks of {block_size}")
    train_dataset = lm_datasets["train"]

    train_dataloader = DataLoader(train_dataset, shuffle=True, collate_fn=default_data_collator,
                                  batch_size=args.per_device_train_batch_size)

    # Optimizer: no weight decay for biases and norms. Built before accelerator.prepare moves the model.
    no_decay = ["bias", "layer_norm.weight", "norm.weight"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                                 num_training_steps=args.max_train_steps * accelerator.num_processes)

    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)

    total_batch_size = args.per_device_train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {len(train_dataset)}")
    logger.info(f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch_size}")
    logger.info(f"  Total optimization steps = {args.max_train_steps}")

    completed_steps = 0
    for _epoch in range(args.num_train_epochs):
        model.train()
        for batch in train_dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                mean_loss = accelerator.reduce(loss.detach(), reduction="mean").item()
                accelerator.print(f"step {completed_steps} loss {mean_loss!r}")
            if completed_steps >= args.max_train_steps:
                break
        if completed_steps >= args.max_train_steps:
            break

    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    moved = sum((p.detach().cpu() - initial[n].cpu()).abs().sum().item() for n, p in unwrapped.named_parameters())
    accelerator.print(f"weights moved {moved!r}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
