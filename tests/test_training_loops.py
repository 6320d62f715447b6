"""Training loops of the shapes real scripts use, on ``neuron`` against the CPU
(:func:`trnsim.testing.training.assert_trains_as_on_cpu`): the losses agree and every
parameter the CPU's loop changed also changed on ``neuron``, by the same amount. An
optimizer built before the model moves (plain PyTorch, ``accelerator.prepare`` as
transformers' ``run_clm_no_trainer.py`` does it) trained nothing on ``neuron`` while
``Module.to`` replaced the ``Parameter`` objects."""

from __future__ import annotations

import pytest
import torch

from trnsim.testing.training import TrainingRun, assert_trains_as_on_cpu, movement, snapshot

VOCAB, SEQ, BATCH, STEPS = 128, 16, 4, 3


def tiny_llama(tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                      tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg)


def token_batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(STEPS)]


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def mlp_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, device) -> list[float]:
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, 8, generator=g).to(device), torch.randn(BATCH, 1, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def move(model: torch.nn.Module, device: str, how: str) -> None:
    """Move ``model`` to ``device`` as scripts do: ``.to("neuron")``, ``.to(torch.device(...))``,
    or the device's own method (``.neuron()`` as ``.cuda()``; ``.cpu()`` for the CPU)."""
    if how == "to(str)":
        model.to(device)
    elif how == "to(torch.device)":
        model.to(torch.device(device))
    else:
        getattr(model, device)()


@pytest.mark.parametrize("how", ["to(str)", "to(torch.device)", "device method"])
def test_optimizer_built_before_the_move(how):
    def loop(device):
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        before = snapshot(model)
        move(model, device, how)
        return TrainingRun(mlp_steps(model, opt, device), before, snapshot(model))

    assert_trains_as_on_cpu(loop)


def test_optimizer_built_after_the_move():
    def loop(device):
        torch.manual_seed(0)
        model = mlp().to(device)
        before = snapshot(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-1, momentum=0.9)
        return TrainingRun(mlp_steps(model, opt, device), before, snapshot(model))

    assert_trains_as_on_cpu(loop)


def test_load_state_dict_after_the_optimizer_keeps_its_parameters():
    """Weights loaded into a moved model (from a CPU checkpoint) go into the Parameters the
    optimizer holds."""
    torch.manual_seed(0)
    state = mlp().state_dict()

    def loop(device):
        torch.manual_seed(1)
        model = mlp().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        held = list(model.parameters())
        model.load_state_dict(state)
        assert all(p is q for p, q in zip(model.parameters(), held))
        before = snapshot(model)
        return TrainingRun(mlp_steps(model, opt, device), before, snapshot(model))

    assert_trains_as_on_cpu(loop)


def test_tied_weights_stay_one_parameter_and_train():
    def loop(device):
        torch.manual_seed(0)
        model = tiny_llama(tie=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        before = snapshot(model)
        model.to(device)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        losses = []
        for ids in token_batches():
            ids = ids.to(device)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return TrainingRun(losses, before, snapshot(model))

    assert_trains_as_on_cpu(loop)


def test_accelerate_no_trainer_loop_trains_as_on_the_cpu():
    """The loop of transformers' run_clm_no_trainer.py: model and optimizer made on the CPU,
    then ``accelerator.prepare`` (which moves the model), ``accelerator.backward``."""
    pytest.importorskip("accelerate", reason="accelerate is not installed: install trnsim's test extra")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from transformers import get_scheduler

    def loop(device):
        AcceleratorState._reset_state(True)
        accelerator = Accelerator(cpu=device == "cpu")
        assert accelerator.device.type == device
        torch.manual_seed(0)
        model = tiny_llama()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        scheduler = get_scheduler("linear", optimizer=opt, num_warmup_steps=0, num_training_steps=STEPS)
        loader = torch.utils.data.DataLoader(torch.cat(token_batches()), batch_size=BATCH)
        before = snapshot(model)
        model, opt, loader, scheduler = accelerator.prepare(model, opt, loader, scheduler)
        model.train()
        losses = []
        for ids in loader:
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
            opt.step()
            scheduler.step()
            opt.zero_grad()
            losses.append(loss.item())
        return TrainingRun(losses, before, snapshot(accelerator.unwrap_model(model)))

    try:
        assert_trains_as_on_cpu(loop)
    finally:
        AcceleratorState._reset_state(True)


def test_trainer_trains_as_on_the_cpu(tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is not installed: install trnsim's test extra")
    from accelerate.state import AcceleratorState
    from transformers import Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            self.rows = torch.cat(token_batches())

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return {"input_ids": self.rows[i], "labels": self.rows[i]}

    def loop(device):
        AcceleratorState._reset_state(True)
        torch.manual_seed(0)
        model = tiny_llama()
        before = snapshot(model)
        args = TrainingArguments(output_dir=str(tmp_path / device), use_cpu=device == "cpu", max_steps=STEPS,
                                 per_device_train_batch_size=BATCH, learning_rate=1e-3, logging_steps=1,
                                 save_strategy="no", report_to=[], seed=0, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens())
        trainer.train()
        assert trainer.model.device.type == device
        losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
        return TrainingRun(losses, before, snapshot(trainer.model))

    try:
        cpu, dev = assert_trains_as_on_cpu(loop)
    finally:
        AcceleratorState._reset_state(True)
    assert len(dev.losses) == STEPS and sum(movement(dev).values()) > 0


def test_the_check_fails_a_loop_whose_optimizer_steps_other_tensors():
    """The class of failure the check is for: on neuron the optimizer holds tensors the
    module does not use, so the losses of the first step agree and nothing trains."""
    def loop(device):
        torch.manual_seed(0)
        model = mlp().to(device)
        before = snapshot(model)
        held = list(model.parameters())
        if device != "cpu":
            held = [p.detach().clone().requires_grad_() for p in held]
        return TrainingRun(mlp_steps(model, torch.optim.SGD(held, lr=1e-1), device), before, snapshot(model))

    with pytest.raises(AssertionError, match=r"4 of 4 parameters did not change on neuron while the CPU's did"):
        assert_trains_as_on_cpu(loop)


def test_the_check_fails_on_losses_that_differ():
    def loop(device):
        torch.manual_seed(0)
        model = mlp().to(device)
        before = snapshot(model)
        losses = mlp_steps(model, torch.optim.SGD(model.parameters(), lr=1e-1 if device == "cpu" else 2e-1), device)
        return TrainingRun(losses, before, snapshot(model))

    with pytest.raises(AssertionError, match=r"loss of step 1: .* on neuron, .* on the CPU"):
        assert_trains_as_on_cpu(loop)


def test_the_check_fails_a_loop_gone_nan():
    """NaN compares false with everything: a loop whose losses and weights went NaN on
    neuron must fail the check, not pass every comparison."""
    def loop(device):
        torch.manual_seed(0)
        model = mlp().to(device)
        before = snapshot(model)
        losses = mlp_steps(model, torch.optim.SGD(model.parameters(), lr=1e-1), device)
        if device != "cpu":
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float("nan"))
            losses = [float("nan")] * len(losses)
        return TrainingRun(losses, before, snapshot(model))

    with pytest.raises(AssertionError, match=r"did not change on neuron|loss of step 0"):
        assert_trains_as_on_cpu(loop)
