"""The architecture numbers of every model a full-scale config names, and the sizes of its data sets, for
``litlab repro <slug> --scale full --plan`` (``litlab.full_plan``).

Each model is its transformers / diffusers config class with the numbers of the model's ``config.json`` on the Hub
(the model card named as ``source``); :func:`build_on_meta` builds it on the meta device, so a parameter count is
exact and nothing is downloaded or allocated. The counts these numbers give are the published ones (tested in
tests/test_full_plan.py: Llama-2-7B 6,738,415,616; SD1.5's UNet 859,520,964; Wan2.1-T2V-1.3B 1,418,996,800).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

import torch

HF = "https://huggingface.co/"


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """One model: ``build`` names the class (``transformers.X`` / ``diffusers.X``), ``config`` the config class
    (None: the model class takes the numbers as keyword arguments, as diffusers' do) and ``arch`` its numbers."""

    build: str
    arch: dict[str, Any]
    source: str
    config: str | None = None
    build_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


_LLAMA3 = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)

MODEL_SHAPES: dict[str, ModelShape] = {
    "meta-llama/Llama-2-7b-hf": ModelShape(
        "transformers.LlamaForCausalLM",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
        HF + "meta-llama/Llama-2-7b-hf",
        "transformers.LlamaConfig",
    ),
    "meta-llama/Meta-Llama-3-8B": ModelShape(
        "transformers.LlamaForCausalLM",
        {**_LLAMA3, "max_position_embeddings": 8192},
        HF + "meta-llama/Meta-Llama-3-8B",
        "transformers.LlamaConfig",
    ),
    "meta-llama/Llama-3.1-8B-Instruct": ModelShape(
        "transformers.LlamaForCausalLM",
        {**_LLAMA3, "max_position_embeddings": 131072},
        HF + "meta-llama/Llama-3.1-8B-Instruct",
        "transformers.LlamaConfig",
    ),
    "Qwen/Qwen3-4B": ModelShape(
        "transformers.Qwen3ForCausalLM",
        dict(
            vocab_size=151936,
            hidden_size=2560,
            intermediate_size=9728,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
        ),
        HF + "Qwen/Qwen3-4B",
        "transformers.Qwen3Config",
    ),
    "Qwen/Qwen2.5-0.5B": ModelShape(
        "transformers.Qwen2ForCausalLM",
        dict(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
        ),
        HF + "Qwen/Qwen2.5-0.5B",
        "transformers.Qwen2Config",
    ),
    "allenai/OLMo-2-0425-1B": ModelShape(
        "transformers.Olmo2ForCausalLM",
        dict(
            vocab_size=100352,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
        HF + "allenai/OLMo-2-0425-1B",
        "transformers.Olmo2Config",
    ),
    "HuggingFaceTB/SmolLM3-3B": ModelShape(
        "transformers.SmolLM3ForCausalLM",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=65536,
            tie_word_embeddings=True,
        ),
        HF + "HuggingFaceTB/SmolLM3-3B",
        "transformers.SmolLM3Config",
    ),
    "Salesforce/blip2-opt-2.7b": ModelShape(
        "transformers.Blip2ForConditionalGeneration",
        dict(
            vision_config=dict(
                hidden_size=1408,
                intermediate_size=6144,
                num_hidden_layers=39,
                num_attention_heads=16,
                image_size=224,
                patch_size=14,
            ),
            qformer_config=dict(
                hidden_size=768,
                num_hidden_layers=12,
                num_attention_heads=12,
                intermediate_size=3072,
                encoder_hidden_size=1408,
                vocab_size=30522,
                cross_attention_frequency=2,
            ),
            text_config=dict(
                model_type="opt",
                hidden_size=2560,
                num_hidden_layers=32,
                num_attention_heads=32,
                ffn_dim=10240,
                vocab_size=50272,
                max_position_embeddings=2048,
                word_embed_proj_dim=2560,
            ),
            num_query_tokens=32,
        ),
        HF + "Salesforce/blip2-opt-2.7b",
        "transformers.Blip2Config",
    ),
    "google/vit-base-patch16-224-in21k": ModelShape(
        "transformers.ViTModel",
        dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            image_size=224,
            patch_size=16,
        ),
        HF + "google/vit-base-patch16-224-in21k",
        "transformers.ViTConfig",
        {"add_pooling_layer": False},  # continual.backbones loads it so
    ),
    # Stable Diffusion 1.5: the UNet, the CLIP ViT-L/14 text encoder and the VAE of its model_index.json
    "stable-diffusion-v1-5/stable-diffusion-v1-5:unet": ModelShape(
        "diffusers.UNet2DConditionModel",
        dict(sample_size=64, cross_attention_dim=768, block_out_channels=(320, 640, 1280, 1280)),
        HF + "stable-diffusion-v1-5/stable-diffusion-v1-5 (unet/config.json)",
    ),
    "stable-diffusion-v1-5/stable-diffusion-v1-5:text_encoder": ModelShape(
        "transformers.CLIPTextModel",
        dict(
            vocab_size=49408,
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            max_position_embeddings=77,
            projection_dim=768,
            hidden_act="quick_gelu",
        ),
        HF + "stable-diffusion-v1-5/stable-diffusion-v1-5 (text_encoder/config.json)",
        "transformers.CLIPTextConfig",
    ),
    "stable-diffusion-v1-5/stable-diffusion-v1-5:vae": ModelShape(
        "diffusers.AutoencoderKL",
        dict(
            block_out_channels=(128, 256, 512, 512),
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            latent_channels=4,
            layers_per_block=2,
            sample_size=512,
        ),
        HF + "stable-diffusion-v1-5/stable-diffusion-v1-5 (vae/config.json)",
    ),
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers:transformer": ModelShape(
        "diffusers.WanTransformer3DModel",
        dict(
            patch_size=(1, 2, 2),
            num_attention_heads=12,
            attention_head_dim=128,
            in_channels=16,
            out_channels=16,
            text_dim=4096,
            freq_dim=256,
            ffn_dim=8960,
            num_layers=30,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            eps=1e-6,
            rope_max_seq_len=1024,
        ),
        HF + "Wan-AI/Wan2.1-T2V-1.3B-Diffusers (transformer/config.json)",
    ),
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers:vae": ModelShape(
        "diffusers.AutoencoderKLWan",
        dict(
            base_dim=96,
            z_dim=16,
            dim_mult=[1, 2, 4, 4],
            num_res_blocks=2,
            temperal_downsample=[False, True, True],
        ),
        HF + "Wan-AI/Wan2.1-T2V-1.3B-Diffusers (vae/config.json)",
    ),
}

# Revisions and fine-tunes of the same architecture (the same numbers, another checkpoint)
ALIASES = {
    "HuggingFaceTB/SmolLM3-3B-checkpoints": "HuggingFaceTB/SmolLM3-3B",
    "meta-llama/Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
}


@dataclasses.dataclass(frozen=True)
class DatasetSize:
    """A data set's size as its source reports it; ``tokens_per_record`` is a mean where a config does not bound
    the sequence length (the source says whose count)."""

    records: int
    what: str
    source: str
    tokens_per_record: int | None = None


DATASETS: dict[str, DatasetSize] = {
    "zwhe99/commonsense_170k": DatasetSize(
        170420, "instruction examples", "LLM-Adapters (Hu et al., arXiv 2304.01933), Commonsense170K"
    ),
    "imagenet_r": DatasetSize(
        24000, "training images (InfLoRA's 80/20 split of 30,000)", "Hendrycks et al., arXiv 2006.16241"
    ),
    "cifar100": DatasetSize(50000, "training images", "Krizhevsky 2009, CIFAR-100"),
    "domainnet": DatasetSize(409832, "images", "Peng et al., arXiv 1812.01754, DomainNet"),
    "coco_karpathy": DatasetSize(
        566747, "training captions (113,287 images x ~5)", "Karpathy & Fei-Fei, arXiv 1412.2306, COCO split"
    ),
    "dsprites": DatasetSize(737280, "images per domain", "Matthey et al. 2017, dSprites; RSD (ICML 2021)"),
    "mpi3d": DatasetSize(1036800, "images per domain", "Gondal et al., arXiv 1906.03292, MPI3D"),
    "esol": DatasetSize(
        1128, "molecules (the whole set; a split trains on fewer)", "MoleculeNet, arXiv 1703.00564"
    ),
    "office31": DatasetSize(
        4110, "images (amazon 2,817, dslr 498, webcam 795)", "Saenko et al. 2010, Office-31"
    ),
    "office_home": DatasetSize(15588, "images (4 domains)", "Venkateswara et al., arXiv 1706.07522"),
    "pacs": DatasetSize(9991, "images (4 domains)", "Li et al., arXiv 1710.03077, PACS"),
}


def resolve_id(model_id: str) -> str:
    return ALIASES.get(model_id, model_id)


def known(model_id: str) -> bool:
    return resolve_id(model_id) in MODEL_SHAPES


def _attr(dotted: str) -> Any:
    module_name, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def build_on_meta(model_id: str) -> Any:  # an nn.Module of the class MODEL_SHAPES names
    """A fresh instance of ``model_id``'s class with its real numbers, on the meta device (no memory, no download);
    ``KeyError`` naming the known ids for another."""
    shape = MODEL_SHAPES.get(resolve_id(model_id))
    if shape is None:
        raise KeyError(
            f"no architecture numbers for {model_id!r} in litlab.model_shapes.MODEL_SHAPES; "
            f"add its config.json numbers there (known: {', '.join(sorted(MODEL_SHAPES))})"
        )
    cls = _attr(shape.build)
    with torch.device("meta"):
        if shape.config is None:
            return cls(**shape.arch, **shape.build_kwargs)
        return cls(_attr(shape.config)(**shape.arch), **shape.build_kwargs)


@functools.cache
def param_count(model_id: str) -> int:
    return sum(p.numel() for p in build_on_meta(model_id).parameters())
