"""Which Hugging Face text-generation architectures run on ``neuron`` with the CPU's results.

Each architecture of the installed transformers' causal-LM auto mapping is built from a
tiny config (its config class's defaults with the sizes shrunk: :func:`tiny_config`),
given seeded random weights, and run on the CPU and, as a copy, on ``neuron``:

- ``forward``: the logits of one prompt;
- ``greedy`` and ``sample``: a short generation with the dynamic cache, greedy and
  sampled from one seed;
- ``static``: greedy generation with the static cache, which on ``neuron`` compiles the
  decode step with backend "neuron" (transformers' auto-compile), where the model has one.

fp32 results must agree within :data:`RTOL`/:data:`ATOL`, tokens exactly. Each
architecture runs in a forked child process with a time limit, so a slow or crashing
model cannot stall the sweep; a failure is reported with its exception type, message and
the aten op and trnsim function it happened in (:class:`Result`).
"""

from __future__ import annotations

import copy
import dataclasses
import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

RTOL = 1e-4
ATOL = 1e-4
PROMPT = 8
NEW_TOKENS = 4
STEPS = ("forward", "greedy", "sample", "static")

# Sizes every architecture's config gets where its config has the key.
_SHRINK: dict[str, Any] = {
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "n_embed": 64, "embed_dim": 64, "dim": 64,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2,
    "encoder_layers": 2, "num_decoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "decoder_attention_heads": 4,
    "encoder_attention_heads": 4, "num_key_value_heads": 2, "num_kv_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "ffn_dim": 128, "decoder_ffn_dim": 128, "encoder_ffn_dim": 128,
    "n_inner": 128, "ffn_hidden_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "vocab_size": 256, "max_position_embeddings": 128, "n_positions": 128, "max_seq_len": 128,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_topk": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "sliding_window": 6, "attention_window_size": 6,
    "full_attention_interval": 2, "attn_layer_period": 2, "attn_layer_offset": 1,
    "expert_layer_period": 2, "expert_layer_offset": 1, "first_k_dense_replace": 1,
    "state_size": 8, "ssm_state_size": 8, "mamba_d_state": 8, "time_step_rank": 8,
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1,
    "num_expert_group": 1, "num_experts_per_token": 2, "layer_group_size": 2, "linear_num_heads": 4,
    "linear_head_dim": 16, "qk_head_dim": 16, "rotary_dim": 8, "num_kv_shared_layers": 0, "mamba_d_ssm": 128,
}

# Per-architecture sizes where the generic ones do not fit the model's shape rules; a dict
# value for a sub-config key is merged into that shrunk sub-config.
_ARCH: dict[str, dict[str, Any]] = {
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1, "expand": 2},
    "deepseek_v2": {"num_experts_per_tok": 2},
    "bamba": {"attn_layer_indices": [1]},
    # the local encoder and decoder project from the global transformer's width; the hash embeddings are 500k rows
    "blt": {"encoder_config": {"hidden_size_global": 64}, "decoder_config": {"hidden_size_global": 64},
            "encoder_hash_byte_group_vocab": 256},
    # rope per layer type; the default has none for "full_attention"
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # the attention reads rope_theta and clamps with clip_qkv, neither set by default
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # sizes whose defaults are None (derived from a checkpoint)
    "dots1": {"n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2},
    "hunyuan_v1_dense": {"head_dim": 16},
    "hunyuan_v1_moe": {"head_dim": 16},
    "ministral": {"head_dim": 16},
    "nemotron": {"num_key_value_heads": 2},
    # one sparsity value per layer
    "gemma3n": {"text_config": {"activation_sparsity_pattern": [0.95, 0.0]}},
    # (pattern, repeats) expanded to one attention type per layer
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # no default layer pattern; one dense layer, then experts
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # one codebook, so a (1, n) prompt is one sequence; generate starts from decoder_start_token_id
    "musicgen": {"num_codebooks": 1, "decoder_start_token_id": 255},
    "musicgen_melody": {"num_codebooks": 1, "decoder_start_token_id": 255},
    # the default pattern leaves two layers without attention, so the cache cannot be sized
    **{a: {"layer_types": ["linear_attention", "full_attention"]}
       for a in ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next", "granitemoehybrid",
                 "kimi_linear")},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # the same, with Qwen4-Exp's indexed (sparse) attention: its indexer keeps 4 of the 8 prompt keys
    **{a: {"layer_types": ["linear_attention", "indexed_attention"], "indexer_n_heads": 2, "indexer_kv_heads": 1,
           "indexer_head_dim": 16, "indexer_budget": 4, "indexer_compress_ratio": 2}
       for a in ("qwen4_exp", "qwen4_exp_text")},
    # a decoder; the axial position factors multiply to the positions and sum to the width
    "reformer": {"is_decoder": True, "attn_layers": ["local", "lsh"], "axial_pos_shape": [8, 16],
                 "axial_pos_embds_dim": [32, 32], "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4,
                 "num_buckets": 4},
    # the language adapter to use for unlabelled input
    "xmod": {"default_language": "en_XX"},
    # the layer pattern; Zamba ties its hybrid layers' shared transformer, so it needs two of them
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},
    "zamba2": {"layers_block_type": ["linear_attention", "hybrid"]},
    # ZAYA supports one expert per token only
    "zaya": {"num_experts_per_tok": 1},
}

# Architectures whose causal-LM class cannot run alone from token ids, and why.
_CANNOT: dict[str, str] = {
    arch: "a speculative-decoding drafter: its forward takes the target Gemma 4 model's input embeddings and "
          "shared key/value states, not token ids, so it cannot run without that model"
    for arch in ("gemma4_assistant", "gemma4_unified_assistant")
}

_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id",
              "cls_token_id", "mask_token_id", "unk_token_id")


@dataclass
class Result:
    """One architecture's outcome. ``status`` is ``"pass"``, ``"fail"`` (``neuron`` raised or
    differs from the CPU), ``"skip"`` (it cannot be built or run from a tiny config on the
    CPU: ``reason`` says why) or ``"timeout"``. ``steps`` maps each step of :data:`STEPS`
    to ``"ok"``, ``"n/a"`` (the CPU cannot run it: ``notes`` says why) or the exception
    type; ``op`` is the aten op, ``where`` the trnsim function, of the first failure."""

    arch: str
    status: str
    steps: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    op: str = ""
    where: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def architectures() -> list[str]:
    """Model types of the installed transformers' causal-LM auto mapping, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(arch: str):
    """The config of ``arch`` with its defaults shrunk to a tiny model (:data:`_SHRINK`,
    sub-configs too, then :data:`_ARCH`), token ids inside the vocabulary and the eager
    attention. Where the causal-LM class is the text-only model of a composite config
    (Qwen3.5's, Llama 4's, MusicGen's decoder), it is that class's sub-config."""
    from transformers import AutoConfig

    base = AutoConfig.for_model(arch)
    cls, defaults = type(base), base.to_dict()
    want = _causal_lm_class(arch).config_class
    for key, sub in getattr(cls, "sub_configs", {}).items():
        if sub is want and isinstance(defaults.get(key), dict):
            cls, defaults = sub, defaults[key]   # a text-only causal LM of a composite: its text config
    return _shrunk(cls, defaults, arch)


def _causal_lm_class(arch: str):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[arch])


def _shrunk(cls, defaults: dict, arch: str):
    config = cls(**_sizes(cls, defaults, arch))
    for k, v in defaults.items():
        got = getattr(config, k, None)
        if k.endswith("layer_types") and isinstance(got, list) and len(got) > _layers(config) > 0:
            setattr(config, k, got[:_layers(config)])
        elif k.endswith("layer_types") and got is None and isinstance(v, list):
            setattr(config, k, v[:_layers(config)])
    config._attn_implementation = "eager"
    return config


def _sizes(cls, defaults: dict, arch: str, top: bool = True) -> dict:
    """The keyword arguments that shrink ``cls``'s ``defaults``: sizes, token ids, sub-configs;
    ``arch``'s :data:`_ARCH` entries apply to the ``top`` config (a dict value to its sub-config)."""
    sizes = {k: v for k, v in _SHRINK.items() if k in defaults and _same_kind(defaults[k], v)}
    layers = sizes.get("num_hidden_layers", 2)
    sizes.update({k: [v] * layers for k, v in _SHRINK.items()
                  if isinstance(defaults.get(k), list) and all(_same_kind(x, v) for x in defaults[k])})
    vocab = sizes.get("vocab_size", defaults.get("vocab_size")) or 256
    ids = [k for k in defaults if k.endswith(("token_id", "token_index")) and k not in _TOKEN_IDS]
    for i, k in enumerate((*_TOKEN_IDS, *ids)):
        v = defaults.get(k)
        if isinstance(v, int) and v >= vocab:
            sizes[k] = vocab - 1 - i
        elif isinstance(v, list):
            sizes[k] = [t if t < vocab else vocab - 1 - i for t in v]
    for key, sub in getattr(cls, "sub_configs", {}).items():
        d = defaults.get(key)
        if isinstance(d, dict) and not hasattr(sub, "model_type") and d.get("model_type"):
            from transformers import AutoConfig

            sub = type(AutoConfig.for_model(d["model_type"]))   # an AutoConfig slot: the dict names the class
        if isinstance(d, dict) and hasattr(sub, "model_type"):
            sizes[key] = {**d, **_sizes(sub, d, arch, top=False)}
    if "kv_lora_rank" in defaults and "num_key_value_heads" in sizes:
        sizes["num_key_value_heads"] = sizes["num_attention_heads"]   # latent attention: a key per query head
    if "qk_rope_head_dim" in defaults and "head_dim" in sizes:
        sizes["head_dim"] = sizes["qk_rope_head_dim"]   # the rotary part of the query-key head
    for k, v in defaults.items():
        if isinstance(v, list) and k.endswith("layer_types"):
            sizes[k] = None   # derived again from the layer count, or cut to it after
        elif isinstance(v, dict) and k == "per_layer_config":
            sizes[k] = None   # overrides of layers past the first two
        elif isinstance(v, list) and k.endswith("layer_indices"):
            sizes[k] = [1]    # a hybrid's attention layers: the second of two
    for k, v in (_ARCH.get(arch, {}) if top else {}).items():
        sizes[k] = {**sizes[k], **v} if isinstance(v, dict) and isinstance(sizes.get(k), dict) else v
    return sizes


def _same_kind(default: Any, value: Any) -> bool:
    return isinstance(default, int) and not isinstance(default, bool) and isinstance(value, int)


def _layers(config) -> int:
    for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"):
        v = getattr(config, k, None)
        if isinstance(v, int):
            return v
    return 0


def _build(arch: str):
    import torch

    config = tiny_config(arch)
    cls = _causal_lm_class(arch)
    torch.manual_seed(0)
    model = cls._from_config(config, attn_implementation="eager") if hasattr(cls, "_from_config") else cls(config)
    return model.float().eval()


def _vocab(model) -> int:
    emb = model.get_input_embeddings()
    n = getattr(emb, "num_embeddings", None) or getattr(model.config, "vocab_size", 256)
    return int(n)


class _Unbuildable(Exception):
    """The architecture cannot run from a tiny config and token ids alone (:data:`_CANNOT`)."""


class _Differs(Exception):
    """``neuron`` gave a result other than the CPU's."""


def _compare(step: str, cpu: Any, dev: Any) -> None:
    import torch

    dev = dev.cpu()
    if cpu.shape != dev.shape:
        raise _Differs(f"{step}: shape {tuple(dev.shape)} on neuron, {tuple(cpu.shape)} on cpu")
    if cpu.dtype.is_floating_point:
        if not torch.allclose(cpu, dev, rtol=RTOL, atol=ATOL, equal_nan=True):
            diff = (cpu - dev).abs().nan_to_num(float("inf")).max().item()
            raise _Differs(f"{step}: max |difference| {diff:.3g}")
    elif not torch.equal(cpu, dev):
        raise _Differs(f"{step}: tokens {dev.tolist()} on neuron, {cpu.tolist()} on cpu")


def _logits(model, ids):
    import torch

    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
    return out.logits if hasattr(out, "logits") else out[0]


def _generate(model, ids, **kwargs):
    import torch

    torch.manual_seed(1)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, **kwargs)


_STEP_ARGS = {"greedy": {"do_sample": False}, "sample": {"do_sample": True, "top_k": 0},
              "static": {"do_sample": False, "cache_implementation": "static"}}

# Generation arguments an architecture's own ``generate`` needs that its default
# generation config leaves unset.
_GENERATE_ARGS: dict[str, dict[str, Any]] = {"musicgen": {"num_return_sequences": 1}}


def _step(model, ids, arch: str, step: str):
    if step == "forward":
        return _logits(model, ids)
    return _generate(model, ids, **_STEP_ARGS[step], **_GENERATE_ARGS.get(arch, {}))


def check(arch: str, steps: tuple[str, ...] = STEPS) -> Result:
    """Build ``arch`` tiny and run ``steps`` on the CPU and on ``neuron``; never raises."""
    import torch

    t0 = time.perf_counter()
    res = Result(arch, "pass")
    try:
        if arch in _CANNOT:
            raise _Unbuildable(_CANNOT[arch])
        cpu = _build(arch)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(3, min(_vocab(cpu), 256), (1, PROMPT), generator=gen)
        want = {}
        for step in steps:
            try:
                want[step] = _step(cpu, ids, arch, step)
            except Exception as e:  # the CPU cannot run this step: the model has no such path
                if step == "forward":
                    raise
                res.steps[step] = "n/a"
                res.notes.append(f"{step} n/a on cpu: {type(e).__name__}: {_first_line(e)}")
    except Exception as e:  # noqa: BLE001 - not buildable or runnable on the CPU at tiny sizes
        return dataclasses.replace(res, status="skip", reason=f"{type(e).__name__}: {_first_line(e)}",
                                   seconds=time.perf_counter() - t0)
    try:
        dev = copy.deepcopy(cpu).to("neuron")
        ids_dev = ids.to("neuron")
    except Exception as e:  # noqa: BLE001 - reported as the architecture's failure
        _fail(res, "to", e)
        res.seconds = time.perf_counter() - t0
        return res
    for step in want:
        try:
            got = _step(dev, ids_dev, arch, step)
            _compare(step, want[step], got)
            res.steps[step] = "ok"
        except Exception as e:  # noqa: BLE001 - reported per step
            _fail(res, step, e)
    res.seconds = time.perf_counter() - t0
    return res


def _fail(res: Result, step: str, e: BaseException) -> None:
    res.steps[step] = type(e).__name__
    if res.status == "fail":
        return
    res.status = "fail"
    res.reason = f"{step}: {type(e).__name__}: {_first_line(e)}"
    res.op, res.where = _origin(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""


def _origin(e: BaseException) -> tuple[str, str]:
    """The aten op the dispatch fallback was running and the innermost trnsim function
    where ``e`` was raised, from its traceback."""
    op, where = "", ""
    for frame, _ in traceback.walk_tb(e.__traceback__):
        # The module's own name, not its file's path: a checkout or install folder
        # may itself be called "trnsim" (the default clone folder is).
        module = frame.f_globals.get("__name__", "")
        if module.startswith("trnsim.") and module != __name__:
            where = f"{module}.{frame.f_code.co_name}"
            info = frame.f_locals.get("info")
            name = getattr(info, "name", None)
            if isinstance(name, str):
                op = name
    return op, where


def _child(arch: str, steps: tuple[str, ...], conn) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch

        torch.set_num_threads(1)
        result = check(arch, steps)
    except BaseException as e:  # noqa: BLE001 - the parent must hear of anything
        result = Result(arch, "fail", reason=f"{type(e).__name__}: {_first_line(e)}")
    conn.send(result)
    conn.close()


def _warm() -> None:
    """Run a tiny Llama on ``neuron`` once in this process, so the forked children
    inherit the imports and the simulator's compiled hot loops instead of each paying
    for them (a minute on 2 cores). One intra-op thread: a child forked after an
    OpenMP pool started could hang."""
    import torch

    torch.set_num_threads(1)
    model = _build("llama").to("neuron")
    ids = torch.randint(3, 200, (1, PROMPT)).to("neuron")
    _logits(model, ids)
    _generate(model, ids, do_sample=False)


def sweep(archs: list[str] | None = None, steps: tuple[str, ...] = STEPS, timeout_s: float = 120.0,
          jobs: int = 1, on_result=None) -> list[Result]:
    """:func:`check` each of ``archs`` (default: :func:`architectures`) in a forked child
    with ``timeout_s`` seconds, ``jobs`` at a time; ``on_result`` is called with each
    :class:`Result` as it arrives. Results come back in ``archs``' order."""
    _warm()
    archs = list(archs if archs is not None else architectures())
    ctx = multiprocessing.get_context("fork")
    pending = list(archs)
    running: dict[str, tuple[Any, Any, float]] = {}
    results: dict[str, Result] = {}
    while pending or running:
        while pending and len(running) < max(1, jobs):
            arch = pending.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(arch, steps, child), daemon=True)
            proc.start()
            child.close()
            running[arch] = (proc, parent, time.perf_counter())
        for arch, (proc, conn, start) in list(running.items()):
            res = None
            if conn.poll(0.05):
                try:
                    res = conn.recv()
                except EOFError:
                    res = Result(arch, "fail", reason=f"the child died (exit code {proc.exitcode})")
            elif not proc.is_alive() and not conn.poll(0):
                res = Result(arch, "fail", reason=f"the child died (exit code {proc.exitcode})")
            elif time.perf_counter() - start > timeout_s:
                proc.kill()
                res = Result(arch, "timeout", reason=f"over {timeout_s:.0f} s")
            if res is None:
                continue
            res.seconds = res.seconds or time.perf_counter() - start
            proc.join(5)
            conn.close()
            del running[arch]
            results[arch] = res
            if on_result is not None:
                on_result(res)
    return [results[a] for a in archs]


def pass_rate(results: list[Result]) -> tuple[int, int]:
    """(passed, tried): architectures that passed, over those buildable (not skipped)."""
    tried = [r for r in results if r.status != "skip"]
    return sum(r.status == "pass" for r in tried), len(tried)


def row(r: Result) -> str:
    """One line of the table: architecture, status, each step, seconds, cause."""
    steps = " ".join(f"{s}={r.steps.get(s, '-')}" for s in STEPS)
    cause = r.reason + (f" [op {r.op}]" if r.op else "") + (f" [in {r.where}]" if r.where else "")
    cause = "; ".join(x for x in (cause, *r.notes) if x)
    return f"{r.arch:28} {r.status:7} {steps:60} {r.seconds:6.1f}s  {cause}"
