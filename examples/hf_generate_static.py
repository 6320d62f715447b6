"""Generate with a static KV cache on the ``neuron`` device, as on a real Trainium.

A tiny Llama (random weights from a small config: nothing is downloaded) generates
greedily and by sampling with ``cache_implementation="static"``. transformers compiles
the decode step with the ``neuron`` backend on its own; the prompt runs eagerly. Greedy
tokens equal the CPU's, sampled tokens follow the device's generator, and the device
keeps one compiled decode graph however many tokens are generated.

    python examples/hf_generate_static.py
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def main(new_tokens: int = 8) -> dict:
    model = tiny_llama()
    prompt = torch.arange(1, 9).reshape(1, 8)
    greedy = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, cache_implementation="static")
    sampled = GenerationConfig(max_new_tokens=new_tokens, do_sample=True, top_k=20, temperature=0.8,
                               cache_implementation="static")

    on_cpu = model.generate(prompt, generation_config=greedy)
    model.to("neuron")
    torch.neuron.reset_dynamo_metrics()
    on_device = model.generate(prompt.to("neuron"), generation_config=greedy)
    torch.manual_seed(1)
    sample = model.generate(prompt.to("neuron"), generation_config=sampled)
    graphs = len(torch.neuron.get_dynamo_metrics())

    print(f"greedy  on neuron: {on_device[0, 8:].tolist()}")
    print(f"greedy  on cpu:    {on_cpu[0, 8:].tolist()}")
    print(f"sampled on neuron: {sample[0, 8:].tolist()}")
    print(f"compiled graphs: {graphs} (the decode step, reused for every token)")
    return {"greedy": on_device.cpu().tolist(), "cpu": on_cpu.tolist(), "sampled": sample.cpu().tolist(),
            "graphs": graphs}


if __name__ == "__main__":
    main()
