"""LightningDataModules over text: the local character-level corpus (``core.corpus``) and Hugging Face hub sets.

The corpus is the docstrings of a fixed list of pure-Python stdlib modules. It is English
prose with some code, big enough (a few hundred thousand characters) to pre-train and adapt
tiny language models. Its exact text depends on the Python minor version (3.11 and 3.12
docstrings differ), so compare losses only between runs on the same Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from litlab.lit_modules.core.corpus import CharTokenizer, local_text_corpus
from litlab.lit_modules.core.errors import DatasetUnavailableError
from litlab.lit_modules.core.hf import check_hub_dataset, download_instructions, load_tokenizer
from litlab.lit_modules.core.seeding import derive_seed


class _Windows(Dataset):
    """Item `start` is the window ids[start : start + block_size + 1], split into inputs and next-char labels."""

    def __init__(self, ids: torch.Tensor, block_size: int, starts: list[int] | None = None) -> None:
        self.ids = ids
        self.block_size = block_size
        self.starts = starts  # fixed windows (validation); None means the sampler yields starts

    def __len__(self) -> int:
        return len(self.starts) if self.starts is not None else len(self.ids) - self.block_size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = self.starts[index] if self.starts is not None else index
        window = self.ids[start : start + self.block_size + 1]
        return {"input_ids": window[:-1], "labels": window[1:]}


class _RandomStartSampler(Sampler[int]):
    """Random window starts, drawn from `seed + epoch` so every epoch is reproducible.

    Lightning calls `set_epoch` at each epoch start; in a hand-written loop call it yourself,
    or every epoch repeats epoch 0's windows.
    """

    def __init__(self, num_starts: int, num_samples: int, seed: int) -> None:
        self.num_starts = num_starts
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randint(self.num_starts, (self.num_samples,), generator=generator).tolist()


class LocalTextDataModule(L.LightningDataModule):
    """Next-character prediction on `local_text_corpus`, as `{"input_ids", "labels"}` batches of `[B, block_size]`.

    `split` picks the corpus cut at its midpoint (LoKRA pre-trains a base on one half and
    adapts on the other); the last `val_fraction` of the chosen part is validation. The training windows are
    drawn from the run's `"data"` stream (`derive_seed("data")`): every run of one run seed trains on the same
    windows, another run seed on others. Validation windows are fixed (evenly spaced).
    """

    def __init__(
        self,
        block_size: int = 128,
        batch_size: int = 32,
        split: Literal["all", "first_half", "second_half"] = "all",
        val_fraction: float = 0.1,
        min_chars: int = 200_000,
        train_windows_per_epoch: int = 3200,
        val_windows: int = 256,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if split not in ("all", "first_half", "second_half"):
            raise ValueError(f"split={split!r} must be one of 'all', 'first_half', 'second_half'")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be strictly between 0 and 1")
        for name, value in [
            ("block_size", block_size),
            ("batch_size", batch_size),
            ("train_windows_per_epoch", train_windows_per_epoch),
            ("val_windows", val_windows),
        ]:
            if value <= 0:
                raise ValueError(f"{name}={value} must be positive")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        self.save_hyperparameters()
        self.tokenizer = CharTokenizer()
        self.train_ids: torch.Tensor | None = None
        self.val_ids: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def setup(self, stage: str | None = None) -> None:
        if self.train_ids is not None:
            return
        hp = self.hparams
        ids = self.tokenizer.encode(local_text_corpus(hp.min_chars))
        middle = len(ids) // 2
        part = {"all": ids, "first_half": ids[:middle], "second_half": ids[middle:]}[hp.split]
        num_val = int(len(part) * hp.val_fraction)
        # A window needs block_size + 1 tokens: inputs plus the one-step-shifted labels.
        for name, length in [("validation", num_val), ("training", len(part) - num_val)]:
            if length < hp.block_size + 1:
                raise ValueError(
                    f"block_size={hp.block_size} is too large for the {name} split of {length} tokens "
                    f"(split={hp.split!r}, val_fraction={hp.val_fraction}); it needs at least block_size + 1"
                )
        self.train_ids, self.val_ids = part[: len(part) - num_val], part[len(part) - num_val :]

    def train_dataloader(self) -> DataLoader:
        self.setup()
        hp = self.hparams
        dataset = _Windows(self.train_ids, hp.block_size)
        sampler = _RandomStartSampler(len(dataset), hp.train_windows_per_epoch, derive_seed("data"))
        return DataLoader(
            dataset, batch_size=hp.batch_size, sampler=sampler, num_workers=hp.num_workers, drop_last=True
        )

    def val_dataloader(self) -> DataLoader:
        self.setup()
        hp = self.hparams
        last_start = len(self.val_ids) - hp.block_size - 1
        starts = torch.linspace(0, last_start, hp.val_windows).round().long().tolist()
        dataset = _Windows(self.val_ids, hp.block_size, starts)
        return DataLoader(dataset, batch_size=hp.batch_size, shuffle=False, num_workers=hp.num_workers)


class HubTextDataModule(L.LightningDataModule):
    """Full-scale LM pre-training text (C4, FineWeb-Edu) streamed from the Hugging Face Hub, tokenised and packed
    into ``[B, block_size]`` next-token windows; each rank reads its own shard of the stream.

    Needs the optional ``datasets`` package, the Hub (or the data in the ``datasets`` cache with HF_HUB_OFFLINE=1)
    and the tokenizer. Anything missing raises ``DatasetUnavailableError``/``ModelUnavailableError`` at
    construction, before any model or process is started, saying what to get.

    ``local_dir``: a local copy of the data set's files in its Hub layout (allenai/c4:
    ``<local_dir>/en/c4-train.*.json.gz`` and ``c4-validation.*.json.gz``, e.g. from ``hf download allenai/c4
    --repo-type dataset --include "en/c4-validation.0000*" --local-dir <local_dir>``), streamed by the same
    ``datasets`` loader from the ``subset`` folder, the split found from the file names; the Hub is not asked.
    """

    def __init__(
        self,
        dataset: str = "allenai/c4",
        subset: str | None = "en",
        tokenizer: str = "gpt2",
        block_size: int = 1024,
        batch_size: int = 32,
        text_field: str = "text",
        val_split: str = "validation",
        val_batches: int = 50,
        num_workers: int = 1,
        local_dir: str | None = None,
    ) -> None:
        super().__init__()
        if block_size <= 0 or batch_size <= 0:
            raise ValueError(f"block_size={block_size} and batch_size={batch_size} must be positive")
        self.save_hyperparameters()

        try:
            import datasets  # noqa: F401
        except ImportError as err:
            raise DatasetUnavailableError(
                f"data set {dataset!r} is streamed with the optional `datasets` package: pip install datasets"
            ) from err
        if local_dir is not None:
            folder = Path(local_dir).expanduser() / (subset or "")
            if not folder.is_dir() or not any(p.is_file() for p in folder.iterdir()):
                raise DatasetUnavailableError(
                    f"local_dir {local_dir!r}: {folder} holds no file of data set {dataset!r} (expected its Hub "
                    f"layout, e.g. for allenai/c4 en/c4-train.00000-of-01024.json.gz); to get part of it:\n"
                    f"{download_instructions(dataset, 'dataset')}"
                )
        else:
            check_hub_dataset(dataset, "stream", f"; otherwise:\n{download_instructions(dataset, 'dataset')}")
        self.tokenizer = load_tokenizer(tokenizer)  # ModelUnavailableError at once when it cannot be had

    def _stream(self, split: str):
        import datasets
        from datasets.distributed import split_dataset_by_node

        hp = self.hparams
        if hp.local_dir is not None:  # the files of the Hub's subset folder, the split from their names
            stream = datasets.load_dataset(hp.local_dir, data_dir=hp.subset, split=split, streaming=True)
        else:
            stream = datasets.load_dataset(hp.dataset, hp.subset, split=split, streaming=True)
        if self.trainer is not None and self.trainer.world_size > 1:
            stream = split_dataset_by_node(
                stream, rank=self.trainer.global_rank, world_size=self.trainer.world_size
            )
        return _PackedWindows(stream, self.tokenizer, hp.text_field, hp.block_size)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self._stream("train"), batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers
        )

    def val_dataloader(self) -> DataLoader:
        import itertools

        windows = list(
            itertools.islice(
                iter(self._stream(self.hparams.val_split)), self.hparams.val_batches * self.hparams.batch_size
            )
        )
        return DataLoader(windows, batch_size=self.hparams.batch_size)


class _PackedWindows(torch.utils.data.IterableDataset):
    """Documents joined with the EOS token and cut into ``block_size + 1`` windows."""

    def __init__(self, stream, tokenizer, text_field: str, block_size: int) -> None:
        self.stream, self.tokenizer, self.text_field, self.block_size = (
            stream,
            tokenizer,
            text_field,
            block_size,
        )

    def __iter__(self):
        buffer: list[int] = []
        eos = self.tokenizer.eos_token_id
        for record in self.stream:
            buffer += self.tokenizer(record[self.text_field])["input_ids"] + (
                [eos] if eos is not None else []
            )
            while len(buffer) > self.block_size:
                window = torch.tensor(buffer[: self.block_size + 1])
                buffer = buffer[self.block_size :]
                yield {"input_ids": window[:-1], "labels": window[1:]}
