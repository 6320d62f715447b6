"""Generate an image with Hugging Face diffusers on the ``neuron`` device.

A tiny FLUX pipeline (CLIP and T5 text encoders, a FLUX transformer, a VAE, the
flow-matching Euler scheduler) is built from small configs with random weights, so
nothing is downloaded. As on a real Trainium host with a big model, the text encoders
stay on the CPU and the denoiser and the VAE go to ``neuron``: the pipeline runs the
prompt through the CPU encoders and the denoising loop on the device. The same seed on
the CPU gives the same image.

``--pipeline sd`` runs a Stable Diffusion-style UNet pipeline instead.

    python examples/diffusers_pipeline.py [--pipeline flux|sd] [--compile] [--steps N]
    trnsim run examples/diffusers_pipeline.py
    trnsim run --nproc 2 examples/diffusers_pipeline.py   # the transformer tensor parallel

Under torchrun (or ``trnsim run --nproc N``), diffusers' own tensor parallelism
(``enable_parallelism`` with a ``TensorParallelConfig``) shards the FLUX transformer over
the ranks; every rank computes the same image.
"""

import argparse
import hashlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.distributed as dist
from diffusers import (AutoencoderKL, DDIMScheduler, FlowMatchEulerDiscreteScheduler, FluxPipeline,
                       FluxTransformer2DModel, StableDiffusionPipeline, UNet2DConditionModel)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5Tokenizer

LETTERS = "abcdefghijklmnopqrstuvwxyz"
PROMPT = "a red cat on a mat"
TOKENS = 32   # the text encoders' sequence length


def clip_tokenizer() -> CLIPTokenizer:
    """A letter-level CLIP BPE tokenizer (no merges): 54 tokens, built in memory."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in LETTERS:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=TOKENS)


def t5_tokenizer() -> T5Tokenizer:
    """A letter-level T5 unigram tokenizer: 56 tokens, built in memory."""
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [(c, -3.0) for c in LETTERS] + [("\u2581" + c, -3.0) for c in LETTERS]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=TOKENS)


def clip_text_encoder() -> CLIPTextModel:
    return CLIPTextModel(CLIPTextConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=TOKENS, projection_dim=32,
                                        bos_token_id=0, eos_token_id=1, pad_token_id=1))


def tiny_vae(**flux_latents) -> AutoencoderKL:
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
                         up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[8, 16], layers_per_block=1,
                         latent_channels=4, norm_num_groups=4, sample_size=32, **flux_latents)


def evaluation(pipe):
    """The pipeline with its models in eval mode, as ``from_pretrained`` leaves them (T5's
    dropout would otherwise make every call different)."""
    for model in pipe.components.values():
        if isinstance(model, torch.nn.Module):
            model.eval()
    return pipe


def tiny_flux_pipeline(seed: int = 0) -> FluxPipeline:
    """A FLUX.1-style pipeline with random weights: one double-stream and one single-stream
    block of 2 heads x 16, 16 latent channels packed from a 4-channel VAE."""
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                         pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
    t5 = T5EncoderModel(T5Config(vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                 relative_attention_num_buckets=8))
    vae = tiny_vae(use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
    return evaluation(FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                                   text_encoder=clip_text_encoder(), tokenizer=clip_tokenizer(), text_encoder_2=t5,
                                   tokenizer_2=t5_tokenizer(), transformer=transformer))


def tiny_sd_pipeline(seed: int = 0) -> StableDiffusionPipeline:
    """A Stable Diffusion-style pipeline with random weights: a two-level UNet with
    cross-attention, the CLIP text encoder, a VAE and the DDIM scheduler."""
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=16, in_channels=4,
                                out_channels=4, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=4, attention_head_dim=4)
    scheduler = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    return evaluation(StableDiffusionPipeline(vae=tiny_vae(), text_encoder=clip_text_encoder(),
                                              tokenizer=clip_tokenizer(), unet=unet, scheduler=scheduler,
                                              safety_checker=None, feature_extractor=None,
                                              requires_safety_checker=False))


def generate(pipe, steps: int = 4, size: int = 32, seed: int = 0):
    """The pipeline's image for PROMPT as a float array (height, width, 3) in [0, 1].

    FluxPipeline runs each model where it is placed (text encoders on the CPU, the
    transformer on the device); StableDiffusionPipeline runs everything on one device, so
    its prompt is encoded on the CPU first and handed over as embeddings."""
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(seed)   # a CPU generator: the same noise on every device
    kwargs = dict(height=size, width=size, num_inference_steps=steps, generator=generator, output_type="np")
    if isinstance(pipe, StableDiffusionPipeline):
        positive, negative = pipe.encode_prompt(PROMPT, device="cpu", num_images_per_prompt=1,
                                                do_classifier_free_guidance=True)
        return pipe(prompt_embeds=positive, negative_prompt_embeds=negative, guidance_scale=5.0, **kwargs).images[0]
    return pipe(PROMPT, guidance_scale=3.5, max_sequence_length=TOKENS, **kwargs).images[0]


def checksum(image) -> str:
    return hashlib.sha256((image * 255).round().astype("uint8").tobytes()).hexdigest()[:12]


def main(pipeline: str = "flux", compile_denoiser: bool = False, steps: int = 4) -> dict:
    build = {"flux": tiny_flux_pipeline, "sd": tiny_sd_pipeline}[pipeline]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and pipeline != "flux":
        raise SystemExit(f"{world} ranks: diffusers has a tensor-parallel plan for the FLUX transformer, not the UNet; "
                         "run --pipeline sd on one process")
    reference = generate(build(), steps)   # the same pipeline, all on the CPU
    pipe = build()
    name = "transformer" if pipeline == "flux" else "unet"
    denoiser = getattr(pipe, name)
    if world > 1:
        from diffusers import ParallelConfig, TensorParallelConfig

        dist.init_process_group(backend="neuron")
        # shards the planned Linears from the CPU weights straight onto the device; .to() moves the rest
        denoiser.enable_parallelism(config=ParallelConfig(tensor_parallel_config=TensorParallelConfig(tp_degree=world)))
    denoiser.to("neuron")
    pipe.vae.to("neuron")
    if compile_denoiser:
        setattr(pipe, name, torch.compile(denoiser, backend="neuron"))

    image = generate(pipe, steps)
    gap = float(abs(image - reference).max())
    if not dist.is_initialized() or dist.get_rank() == 0:
        mode = "compiled" if compile_denoiser else "eager"
        parallel = f", tensor parallel over {world} ranks" if world > 1 else ""
        print(f"{type(pipe).__name__}: {name} on {denoiser.device} ({mode}{parallel}), VAE on {pipe.vae.device}, "
              f"text encoder on {pipe.text_encoder.device}, {steps} steps")
        print(f"image {image.shape}, sha256 {checksum(image)}, mean {image.mean():.4f}; "
              f"max difference to the CPU's image {gap:.2e}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return {"image": image, "reference": reference, "gap": gap}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", choices=["flux", "sd"], default="flux")
    parser.add_argument("--compile", action="store_true", help="torch.compile the denoiser with backend 'neuron'")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    main(args.pipeline, args.compile, args.steps)
