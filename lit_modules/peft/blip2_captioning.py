"""BLIP-2 captioning, the pieces a method on it shares (Li et al., "BLIP-2: Bootstrapping Language-Image
Pre-training with Frozen Image Encoders and Large Language Models", arXiv 2301.12597, §4.2 image captioning):
the batch layout of ``Blip2ForConditionalGeneration`` (``CaptionEncoder``), BLIP's caption pre-processing, the
language model's per-modality mean hidden states (``modality_means``), decoding (``decode_captions``), the caption
metrics' words and CIDEr-D, and the writers of a tiny BLIP-2 and a few COCO Karpathy records for stand-in runs
(issue 32: the same classes and on-disk formats as the full scale, small sizes, offline, deterministic).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.core.io import atomic_write_text
from litlab.lit_modules.core.standin_files import write_images, write_model_folder


@config_part
class Decoding:
    """Caption decoding for the metric (BLIP-2's captioning evaluation: beam search)."""

    max_new_tokens: int = 30
    min_new_tokens: int = 8
    num_beams: int = 5


DECODING = Decoding()


def pre_caption(caption: str, max_words: int = 50) -> str:
    """BLIP's caption pre-processing (Li et al., arXiv 2201.12086): lower case, ``.!"()*#:;~`` dropped, spaces
    collapsed, at most ``max_words`` words."""
    caption = re.sub(r"\s{2,}", " ", re.sub(r"([.!\"()*#:;~])", " ", caption.lower())).strip()
    return " ".join(caption.split(" ")[:max_words])


def metric_words(text: str) -> str:
    """Lower-cased words without punctuation: what BLEU and CIDEr-D compare."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def cider_d(candidates: list[str], references: list[list[str]], n: int = 4, sigma: float = 6.0) -> float:
    """CIDEr-D (Vedantam, Zitnick, Parikh, "CIDEr: Consensus-based Image Description Evaluation", arXiv 1411.5726,
    §4 and the CIDEr-D variant of the COCO caption evaluation code) of ``candidates[i]`` against ``references[i]``,
    ×10, averaged over images; the words are split on spaces (pass ``metric_words`` of each caption).

    Per n-gram order k = 1..n: TF-IDF vectors g_k (term count × (log |images| − log max(1, df)), df = the number
    of images whose references hold the n-gram), the candidate's clipped by each reference's (min), cosine with
    each reference, times the length penalty exp(−(ℓ_c − ℓ_r)² / 2σ²); the mean over k and over references.
    As in the evaluation code, the length ℓ counts bigrams (its ``n == 1`` on a 0-based order), kept so that the
    numbers compare with the paper's."""
    if len(candidates) != len(references) or not candidates:
        raise ValueError(
            f"need one reference list per candidate, got {len(candidates)} and {len(references)}"
        )

    def grams(text: str) -> Counter:
        words = text.split()
        return Counter(tuple(words[i : i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1))

    refs = [[grams(r) for r in rs] for rs in references]
    df: Counter = Counter(g for rs in refs for g in set().union(*rs))
    log_images = math.log(len(candidates))

    def vector(counts: Counter) -> tuple[list[dict], list[float], int]:
        vec: list[dict] = [{} for _ in range(n)]
        for g, tf in counts.items():
            vec[len(g) - 1][g] = tf * (log_images - math.log(max(1.0, df[g])))
        norms = [math.sqrt(sum(v * v for v in order.values())) for order in vec]
        return vec, norms, sum(tf for g, tf in counts.items() if len(g) == 2)

    scores = []
    for cand, rs in zip(candidates, refs):
        vec_c, norm_c, len_c = vector(grams(cand))
        total = 0.0
        for r in rs:
            vec_r, norm_r, len_r = vector(r)
            penalty = math.exp(-((len_c - len_r) ** 2) / (2 * sigma**2))
            for k in range(n):
                dot = sum(min(v, vec_r[k].get(g, 0.0)) * vec_r[k].get(g, 0.0) for g, v in vec_c[k].items())
                if norm_c[k] and norm_r[k]:
                    total += dot / (norm_c[k] * norm_r[k]) * penalty
        scores.append(10.0 * total / n / max(len(rs), 1))
    return sum(scores) / len(scores)


class CaptionEncoder:
    """BLIP-2's batch layout, handed to the DataModule (it runs in the loader's workers, so it pickles):
    ``[<image> × num_query_tokens][BOS] prompt caption "\\n" [pad …]``; ``labels`` are the caption's ids (-100 on the
    image tokens, BOS, the prompt and the padding)."""

    def __init__(
        self, processor: Any, num_query_tokens: int, image_token_id: int, prompt: str, max_text_tokens: int
    ):
        self.tokenizer, self.image_processor = processor.tokenizer, processor.image_processor
        self.n_query, self.image_token_id, self.max_text = num_query_tokens, image_token_id, max_text_tokens
        self.prompt = prompt
        self.prompt_ids: list[int] = self.tokenizer(prompt).input_ids  # BOS + the prompt's tokens
        if max_text_tokens <= len(self.prompt_ids):
            raise ValueError(
                f"max_text_tokens={max_text_tokens} leaves no room for a caption after the prompt {prompt!r} "
                f"({len(self.prompt_ids)} tokens with BOS)"
            )

    def __call__(self, images: list[Any], captions: list[str]) -> dict[str, Tensor]:
        texts = [f"{self.prompt} {pre_caption(c)}\n".lstrip() for c in captions]
        ids = [self.tokenizer(t).input_ids[: self.max_text] for t in texts]
        width, pad = self.n_query + max(map(len, ids)), self.tokenizer.pad_token_id
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        labels = torch.full((len(ids), width), -100, dtype=torch.long)
        mask = torch.zeros(len(ids), width, dtype=torch.long)
        for row, seq in enumerate(ids):
            end = self.n_query + len(seq)
            input_ids[row, : self.n_query] = self.image_token_id
            input_ids[row, self.n_query : end] = torch.tensor(seq)
            mask[row, :end] = 1
            start = self.n_query + len(self.prompt_ids)  # the loss reads the caption only
            labels[row, start:end] = input_ids[row, start:end]
        pixels = self.image_processor(images, return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixels, "input_ids": input_ids, "attention_mask": mask, "labels": labels}

    def generation_prefix(self, batch_size: int) -> Tensor:
        """``[<image> × num_query_tokens][BOS] prompt`` for every image of a batch: where decoding starts."""
        row = [self.image_token_id] * self.n_query + self.prompt_ids
        return torch.tensor([row] * batch_size, dtype=torch.long)


@torch.no_grad()
def modality_means(
    model: Any, batches: Iterable[dict[str, Tensor]], image_token_id: int, n_layers: int, device: torch.device
) -> list[Tensor]:
    """Per language-model block l < ``n_layers``, ``[n, 2, d]``: each pair's mean hidden state at the input of block
    l (``output_hidden_states``) over its image-token positions, then over its text positions (the prompt and the
    caption, not the padding); the model in eval mode, float32 on the CPU."""
    was_training = model.training
    model.eval()
    pooled: list[list[Tensor]] = [[] for _ in range(n_layers)]
    for batch in batches:
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        out = model(
            pixel_values=batch["pixel_values"].to(device, model.dtype),
            input_ids=ids,
            attention_mask=mask,
            output_hidden_states=True,
        )
        visual = (ids == image_token_id).float()
        text = mask.float() * (1 - visual)
        for layer, h in enumerate(out.language_model_outputs.hidden_states[:n_layers]):
            z_v = (h.float() * visual[..., None]).sum(1) / visual.sum(1, keepdim=True)
            z_t = (h.float() * text[..., None]).sum(1) / text.sum(1, keepdim=True)
            pooled[layer].append(torch.stack([z_v, z_t], 1).cpu())
    model.train(was_training)
    return [torch.cat(p) for p in pooled]


@torch.no_grad()
def decode_captions(
    model: Any, encoder: CaptionEncoder, pixel_values: Tensor, decoding: Decoding
) -> list[str]:
    """The captions a ``Blip2ForConditionalGeneration`` writes after the prompt for a batch of images."""
    prefix = encoder.generation_prefix(len(pixel_values)).to(pixel_values.device)
    out = model.generate(
        pixel_values=pixel_values.to(model.dtype),
        input_ids=prefix,
        attention_mask=torch.ones_like(prefix),
        max_new_tokens=decoding.max_new_tokens,
        min_new_tokens=decoding.min_new_tokens,
        num_beams=decoding.num_beams,
        do_sample=False,
    )
    new = out[:, prefix.shape[1] :] if torch.equal(out[:, : prefix.shape[1]], prefix) else out
    return [c.strip() for c in encoder.tokenizer.batch_decode(new, skip_special_tokens=True)]


def corpus_cider(pairs: list[tuple[str, list[str]]]) -> float | None:
    """CIDEr-D of ``(caption, references)`` pairs gathered from every rank (its document frequencies are
    corpus-level); None without a pair."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, pairs)
        pairs = [p for part in gathered for p in part]
    return cider_d([c for c, _ in pairs], [r for _, r in pairs]) if pairs else None


# ---- stand-in writers: a tiny BLIP-2 of the full config's classes, a few COCO Karpathy records -----------------
CAPTION_WORDS = {
    "who": ("a man", "a woman", "a dog", "two cats", "a child", "a bird"),
    "does": ("sitting on", "standing next to", "running across", "lying on", "looking at"),
    "what": ("a wooden bench", "the green grass", "a red car", "a snowy field", "a kitchen table"),
}
STAND_IN_SPLITS = ["train"] * 6 + ["restval"] * 2 + ["val"] * 3 + ["test"] * 3


def write_coco_karpathy(root: Path, gen: torch.Generator) -> list[str]:
    """A COCO folder in the Karpathy layout (``datamodules/coco_caption.py``): ``dataset_coco.json`` naming 14
    images (6 train, 2 restval with 2 captions each; 3 val, 3 test with 3) and their 40-px JPEGs
    (``core.standin_files.write_images``) under ``train2014/`` and ``val2014/``, named as COCO names them; every
    file written atomically. Returns every caption written."""

    def pick(options: tuple[str, ...]) -> str:
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    records, sentences, paths = [], [], []
    for i, split in enumerate(STAND_IN_SPLITS):
        folder = "train2014" if split in ("train", "restval") else "val2014"
        filename = f"COCO_{folder}_{100 + i:012d}.jpg"
        caps = [
            f"{pick(CAPTION_WORDS['who']).capitalize()} {pick(CAPTION_WORDS['does'])} {pick(CAPTION_WORDS['what'])}."
            for _ in range(2 if split in ("train", "restval") else 3)
        ]
        sentences += caps
        paths.append(root / folder / filename)
        sents = [{"raw": c, "imgid": i, "sentid": 10 * i + k} for k, c in enumerate(caps)]
        records.append(
            {
                "filepath": folder,
                "filename": filename,
                "imgid": i,
                "split": split,
                "cocoid": 100 + i,
                "sentences": sents,
            }
        )
    write_images(paths, list(range(len(paths))), 40, gen)
    atomic_write_text(root / "dataset_coco.json", json.dumps({"dataset": "coco", "images": records}))
    return sentences


def write_tiny_blip2(folder: Path, texts: list[str], seed: int = 0) -> Path:
    """A ``Blip2ForConditionalGeneration`` folder with its ``Blip2Processor``, of the classes BLIP-2 OPT ships
    with and small sizes: a 1-block ViT (32 px, 16 px patches), a 1-block Q-Former, 4 query tokens, a 2-block
    ``OPTForCausalLM`` of width 32; ``BlipImageProcessor`` at 32 px and a ``GPT2Tokenizer`` (OPT's) whose byte-level
    BPE is trained here on ``texts`` (nothing downloaded). Weights from ``seed``; the global generator is left as
    it was. Written atomically; a folder already there is kept (``core.standin_files.write_model_folder``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        GPT2Tokenizer,
        OPTConfig,
    )
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "</s>", "<unk>"],  # OPT's: pad 1st, </s> both BOS and EOS
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    trained = json.loads(bpe.to_str())["model"]
    tokenizer = GPT2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(m) for m in trained["merges"]],
        bos_token="</s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        add_bos_token=True,
    )
    processor = Blip2Processor(
        BlipImageProcessorPil(size={"height": 32, "width": 32}), tokenizer, num_query_tokens=4
    )
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    text = OPTConfig(
        vocab_size=len(processor.tokenizer),
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        word_embed_proj_dim=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
    )
    config = Blip2Config(
        vision_config={**small, "image_size": 32, "patch_size": 16},
        qformer_config={**small, "encoder_hidden_size": 32},
        text_config=text.to_dict(),
        num_query_tokens=4,
        image_token_index=processor.tokenizer.convert_tokens_to_ids("<image>"),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Blip2ForConditionalGeneration(config)

    def save(tmp: Path) -> None:
        processor.save_pretrained(tmp)
        model.save_pretrained(tmp)

    return write_model_folder(folder, save)
