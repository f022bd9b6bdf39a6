"""Stand-ins of the diffusion family's full configs (``litlab.standin``): a tiny random checkpoint of the classes
the full config loads, in the diffusers folder layout, and a few records in the data set's folder layout.

* SCNS (``configs/scns/full.yaml``): Stable Diffusion 1.5's layout (UNet2DConditionModel, CLIPTextModel,
  CLIPTokenizer, AutoencoderKL, DDPMScheduler, model_index.json) and a CIFC-layout concept folder
  (``images/<concept>/<i>.png`` + ``caption/<concept>/<i>.txt``).
* LiteVSR (``configs/litevsr/full.yaml``): Wan2.1-T2V's layout (WanTransformer3DModel, AutoencoderKLWan,
  UMT5EncoderModel, a word-level tokenizer, FlowMatchEulerDiscreteScheduler) and a REDS-layout folder
  (``<clip>/<frame:08d>.png``).

Tokenizers are built here from a vocabulary written here; nothing is downloaded. Weights are drawn from a generator
seeded here (``seeded_init``), so two calls write the same files and the caller's generator is left as it was.
"""

from __future__ import annotations

import functools
import json
import string
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

SEQ = 16  # the tiny CLIP tokenizer's model_max_length = its text encoder's positions (SD: 77)
TEXT_LEN = 8  # max_sequence_length of the tiny umT5 text encoder (Wan: 512 tokens of umT5-xxl)
SEED = 0

Writer = TypeVar("Writer", bound=Callable[..., Path])


def seeded_init(write: Writer) -> Writer:
    """Run a checkpoint writer with the global torch generator (which module constructors draw from) seeded with
    ``SEED`` and restored afterwards."""

    @functools.wraps(write)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            return write(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def write_model_index(folder: Path, pipeline: str, **parts: list[str]) -> None:
    """``<folder>/model_index.json`` as a diffusers pipeline's ``save_pretrained`` writes it: the pipeline class,
    then each part's folder name with its library and class (what ``from_pretrained`` reads)."""
    (folder / "model_index.json").write_text(json.dumps({"_class_name": pipeline, **parts}))


@seeded_init
def write_tiny_sd(folder: Path) -> Path:
    """A diffusers-layout Stable Diffusion checkpoint of about 250K parameters: UNet2DConditionModel with
    cross-attention (blocks 16, 32; 200,644), CLIPTextModel of width 16 (4,048), a CLIPTokenizer from a vocabulary
    and merges written here (``SEQ`` positions), AutoencoderKL (×2 down, 4 latent channels as SD's; 43,711),
    DDPMScheduler with SD's betas."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from litlab.lit_modules.diffusion.ddpm import diffusers_classes

    AutoencoderKL, DDPMScheduler, UNet2DConditionModel = diffusers_classes(
        "AutoencoderKL", "DDPMScheduler", "UNet2DConditionModel"
    )
    chars = list(string.ascii_lowercase) + list("<>_,.!-0123456789")
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({f"{c}</w>": len(chars) + i for i, c in enumerate(chars)})
    merges = ["d o", "do g</w>", "t o", "to y</w>", "p h", "ph o", "pho t", "phot o</w>"]
    for m in merges:
        vocab["".join(m.split())] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    raw = folder / "raw_tokenizer"
    raw.mkdir(parents=True)
    (raw / "vocab.json").write_text(json.dumps(vocab))
    (raw / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tok = CLIPTokenizer(str(raw / "vocab.json"), str(raw / "merges.txt"), model_max_length=SEQ)
    tok.save_pretrained(folder / "tokenizer")
    eos = vocab["<|endoftext|>"]
    CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(vocab),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=SEQ,
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=eos,
            pad_token_id=eos,
        )
    ).save_pretrained(folder / "text_encoder")
    UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=8,
        norm_num_groups=8,
    ).save_pretrained(folder / "unet")
    AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=8,
        layers_per_block=1,
        sample_size=32,
    ).save_pretrained(folder / "vae")
    DDPMScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear"
    ).save_pretrained(folder / "scheduler")
    write_model_index(
        folder,
        "StableDiffusionPipeline",
        unet=["diffusers", "UNet2DConditionModel"],
        text_encoder=["transformers", "CLIPTextModel"],
        tokenizer=["transformers", "CLIPTokenizer"],
        vae=["diffusers", "AutoencoderKL"],
        scheduler=["diffusers", "DDPMScheduler"],
    )
    return folder


def write_concepts(root: Path, captions: dict[str, list[str | None]], size: int = 40) -> Path:
    """``images/<concept>/<i>.png`` (size × size, a coloured square on a grey field) and, where given,
    ``caption/<concept>/<i>.txt``."""
    from PIL import Image, ImageDraw

    for c, (name, caps) in enumerate(captions.items()):
        (root / "images" / name).mkdir(parents=True)
        (root / "caption" / name).mkdir(parents=True, exist_ok=True)
        for i, cap in enumerate(caps):
            img = Image.new("RGB", (size + 8 * i, size), (90 + 10 * i, 90, 90))
            ImageDraw.Draw(img).rectangle([8 + 2 * i, 8, 26 + 2 * i, 26], fill=(200, 40 + 100 * c, 40))
            img.save(root / "images" / name / f"{i}.png")
            if cap is not None:
                (root / "caption" / name / f"{i}.txt").write_text(cap)
    return root


@seeded_init
def write_tiny_wan(folder: Path) -> Path:
    """A diffusers-layout Wan checkpoint of about 190K parameters: 16 latent channels and ×4 temporal compression
    as Wan's VAE, ×4 spatial (Wan: ×8), patch (1, 2, 2), 2 blocks, text width 16."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    from litlab.lit_modules.diffusion.ddpm import diffusers_classes

    AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel = diffusers_classes(
        "AutoencoderKLWan", "FlowMatchEulerDiscreteScheduler", "WanTransformer3DModel"
    )
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3, "video": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=TEXT_LEN,
    ).save_pretrained(folder / "tokenizer")
    UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(vocab),
            d_model=16,
            d_kv=8,
            d_ff=32,
            num_layers=1,
            num_heads=2,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    ).save_pretrained(folder / "text_encoder")
    WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=16,
        out_channels=16,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=32,
    ).save_pretrained(folder / "transformer")
    AutoencoderKLWan(
        base_dim=8,
        z_dim=16,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[True, True],
        scale_factor_temporal=4,
        scale_factor_spatial=4,
    ).save_pretrained(folder / "vae")
    FlowMatchEulerDiscreteScheduler(shift=3.0).save_pretrained(folder / "scheduler")
    write_model_index(
        folder,
        "WanPipeline",
        transformer=["diffusers", "WanTransformer3DModel"],
        vae=["diffusers", "AutoencoderKLWan"],
        text_encoder=["transformers", "UMT5EncoderModel"],
        tokenizer=["transformers", "PreTrainedTokenizerFast"],
        scheduler=["diffusers", "FlowMatchEulerDiscreteScheduler"],
    )
    return folder


def write_reds(
    root: Path,
    clips: tuple[str, ...] = ("000", "001", "002"),
    frames: int = 6,
    size: tuple[int, int] = (40, 48),
) -> Path:
    """``<root>/<clip>/<frame:08d>.png``: a coloured square moving one pixel a frame over a gradient."""
    import numpy as np
    from PIL import Image

    h, w = size
    for c, name in enumerate(clips):
        (root / name).mkdir(parents=True)
        for i in range(frames):
            img = np.zeros((h, w, 3), dtype=np.uint8)
            img[..., 0] = np.linspace(30, 200, w, dtype=np.uint8)[None]
            img[..., 1] = np.linspace(60, 160, h, dtype=np.uint8)[:, None]
            img[..., 2] = 80 + 40 * c
            img[8 + i : 20 + i, 10 + 2 * c : 22 + 2 * c] = (230, 40 + 60 * c, 30)
            Image.fromarray(img).save(root / name / f"{i:08d}.png")
    return root


def stand_in_scns(workdir: Path) -> list[str]:
    """The tiny SD checkpoint and the config's first two concepts (dog: captioned; duck_toy: no captions, so trained
    on its prompt), three 40-px images each (one held out, as the config's ``heldout_images``); two concepts of
    two steps at 32 px, a 4-probe selection over the top 64 candidates, DDIM grids of 3 steps."""
    sd = write_tiny_sd(workdir / "stable-diffusion")
    root = write_concepts(
        workdir / "cifc", {"dog": ["a dog on the grass", "a photo of a dog", None], "duck_toy": [None] * 3}
    )
    return [
        "--trainer.accelerator=cpu",
        "--trainer.precision=32",
        "--trainer.max_epochs=2",  # one epoch per concept
        f"--model.init_args.pretrained_path={sd}",
        "--model.init_args.select.num_probes=4",
        "--model.init_args.select.fisher_samples=4",
        "--model.init_args.select.top_p=64",
        "--model.init_args.eval_batch=2",
        "--model.init_args.sampling.steps=3",
        f"--data.init_args.data_root={root}",
        "--data.init_args.num_concepts=2",
        "--data.init_args.image_size=32",
        "--data.init_args.steps_per_task=2",
        "--data.init_args.eval_timesteps=[100,500]",
    ]


def stand_in_litevsr(workdir: Path) -> list[str]:
    """The tiny Wan checkpoint and a REDS folder of three 6-frame 40×48 clips: 000 (of REDS4, the config's
    validation clips) and 001, 002 for training; 5-frame 32×32 crops (latents 2 × 8 × 8), 2 steps, an adapter of
    width 16 with hints after both blocks, validation at K = 1, 2 on one clip."""
    return litevsr_args(write_tiny_wan(workdir / "wan"), write_reds(workdir / "REDS"))


def litevsr_args(wan: Path, root: Path) -> list[str]:
    """LiteVSR's stand-in overrides for the Wan checkpoint ``wan`` and the REDS folder ``root`` (also the full-scale
    test's, ``tests/test_litevsr_full.py``)."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.precision=32",
        f"--model.init_args.pretrained_path={wan}",
        "--model.init_args.adapter.width=16",
        "--model.init_args.adapter.heads=2",
        "--model.init_args.adapter.ffn_ratio=2.0",
        "--model.init_args.adapter.n_struct=1",
        "--model.init_args.adapter.n_refine=1",
        "--model.init_args.adapter.n_fuse=1",
        "--model.init_args.adapter.inject_layers=[0,1]",
        "--model.init_args.adapter.freq_dim=16",
        "--model.init_args.adapter.rope_max_seq_len=32",
        "--model.init_args.val_steps=[1,2]",
        f"--data.init_args.root={root}",
        "--data.init_args.frames=5",
        "--data.init_args.crop=[32,32]",
        "--data.init_args.steps=2",
        "--data.init_args.num_workers=0",
        "--data.init_args.val_max_clips=1",
    ]
