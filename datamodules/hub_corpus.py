"""Hugging Face data sets as next-token windows, for the analysis cards at full scale: continued pre-training on a
domain corpus (Diffract: open-web-math, starcoderdata's python, tulu-3 rendered as text, fineweb-edu) and a narrow
fine-tune with a broad evaluation (lock-in: GSM8K with answer-only labels, fineweb-edu windows).

A source (``CorpusSource``) is read through Hugging Face ``datasets`` (the ``full`` extra), streamed record by record,
from, in this order: ``<data_root>/<dataset id>`` (a local copy in the Hub's own layout: ``hf download <id>
--repo-type dataset --local-dir <data_root>/<id>``), a local folder or file named by ``dataset``, or the Hub. Offline
(``HF_HUB_OFFLINE=1``, or a Hub that does not answer) a source that is not on disk stops the run when the DataModule
is built, naming the data set and the command that gets it; so does a missing ``datasets`` package.

Records become windows of ``block_size`` tokens in the tokenizer of the model (``tokenizer``: a Hugging Face id or
folder), ``{"input_ids", "labels"}`` with labels the next tokens:
* ``render="text"`` (a column ``field``) and ``"messages"`` (a chat column ``field``, rendered in the Tulu template
  ``<|user|>\\n...\\n<|assistant|>\\n...``): documents joined by the EOS token and packed;
* ``render="question_answer"`` (columns ``field`` and ``answer_field``): one window per record, ``Question: ...
  Answer: ...`` with labels on the answer tokens only (-100 on the question and the right padding).

Evaluation windows are fixed: the first ``eval_records`` records of ``eval_split`` (default: of ``split``, and then
training skips them), packed and cut into ``val_windows`` evenly spaced windows (``domain_corpus.fixed_windows``), or
the first ``val_windows`` question-answer records. Training reads the rest of the stream once (one epoch), shuffled
in a buffer of ``shuffle_buffer`` records from the run's ``data.windows`` stream; each rank reads its own shard. A
relaunch from a checkpoint skips the windows its steps consumed (the stream is deterministic for a given seed and
world size), so it continues where it stopped (litlab's ``ExactResume`` restores the generators; it leaves the
position of an iterable data set to the data set).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from litlab.datamodules.domain_corpus import fixed_windows
from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.errors import DatasetUnavailableError
from litlab.lit_modules.core.hf import download_instructions, hub_unreachable_reason, load_tokenizer
from litlab.lit_modules.core.seeding import derive_seed

Render = Literal["text", "messages", "question_answer"]
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".gz": "json", ".parquet": "parquet", ".csv": "csv"}


@config_part
class CorpusSource:
    """One data set: ``dataset`` (a Hub id or a local folder/file), its config ``name`` (fineweb-edu
    ``sample-10BT``, gsm8k ``main``), ``data_dir`` (starcoderdata ``python``), the ``split`` read for training and
    ``eval_split`` for the fixed evaluation windows (None: the first ``eval_records`` records of ``split``, held out
    from training); how a record becomes text (``render``, the columns ``field`` and ``answer_field``)."""

    dataset: str = "HuggingFaceFW/fineweb-edu"
    name: str | None = None
    data_dir: str | None = None
    split: str = "train"
    eval_split: str | None = None
    render: Render = "text"
    field: str = "text"
    answer_field: str = "answer"

    def __post_init__(self) -> None:
        if self.render not in ("text", "messages", "question_answer"):
            raise ValueError(f"render must be text, messages or question_answer, got {self.render!r}")
        if not self.dataset.strip():
            raise ValueError("a CorpusSource needs a dataset (a Hugging Face id or a local folder)")


# Diffract's CPT corpora by domain (the spec's reconstruction of the paper's setting): a source left unset is the
# one of its domain
DOMAIN_SOURCES = {
    "math": CorpusSource(dataset="open-web-math/open-web-math"),
    "code": CorpusSource(dataset="bigcode/starcoderdata", data_dir="python", field="content"),
    "instruction": CorpusSource(dataset="allenai/tulu-3-sft-mixture", render="messages", field="messages"),
    "text": CorpusSource(dataset="HuggingFaceFW/fineweb-edu", name="sample-10BT"),
}


def get_command(source: CorpusSource) -> str:
    """How to get ``source`` onto this machine."""
    include = f" --include '{source.data_dir}/*'" if source.data_dir else ""
    return (
        f"run `hf download {source.dataset} --repo-type dataset{include} --local-dir "
        f"<data_root>/{source.dataset}` on a machine with internet, copy <data_root> here and pass "
        f"--data.init_args.data_root=<data_root>; or:\n{download_instructions(source.dataset, 'dataset')}"
    )


def resolve(source: CorpusSource, data_root: str | None) -> str:
    """Where ``source`` is read from: ``<data_root>/<dataset>``, a local path, or its Hub id (checked reachable now);
    ``DatasetUnavailableError`` naming the data set and how to get it when it is none of these."""
    try:
        import datasets  # noqa: F401
    except ImportError as err:
        raise DatasetUnavailableError(
            f"data set {source.dataset!r} is read with the optional `datasets` package: pip install 'datasets>=2.19' "
            "(litlab's `full` extra)"
        ) from err
    if data_root is not None and (Path(data_root).expanduser() / source.dataset).exists():
        return str(Path(data_root).expanduser() / source.dataset)
    if os.path.exists(os.path.expanduser(source.dataset)):
        return os.path.expanduser(source.dataset)
    where = f"not under data_root {data_root!r} and " if data_root is not None else ""
    if "/" not in source.dataset or source.dataset.startswith((".", "/", "~")):
        raise DatasetUnavailableError(
            f"data set {source.dataset!r} is {where}not a local folder or file, nor a Hugging Face id"
        )
    reason = hub_unreachable_reason(source.dataset, "dataset")
    if reason is not None:
        raise DatasetUnavailableError(
            f"cannot stream data set {source.dataset!r}: it is {where}not on this machine and {reason}. To get "
            f"it, {get_command(source)}"
        )
    return source.dataset


def open_records(source: CorpusSource, path: str, split: str):
    """The records of ``split`` of the source at ``path`` (from ``resolve``), streamed (a ``datasets``
    ``IterableDataset``): a file by its suffix's builder, a folder or Hub id by ``datasets``' own layout rules (its
    README's ``configs``, else the data files it holds)."""
    import datasets

    if os.path.isfile(path):
        suffix = Path(path).suffix
        if suffix not in FILE_BUILDERS:
            raise DatasetUnavailableError(
                f"{path}: unknown data file type {suffix!r}; expected {sorted(FILE_BUILDERS)}"
            )
        return datasets.load_dataset(
            FILE_BUILDERS[suffix], data_files={split: path}, split=split, streaming=True
        )
    kwargs: dict[str, Any] = {"split": split, "streaming": True}
    if source.name is not None:
        kwargs["name"] = source.name
    if source.data_dir is not None:
        kwargs["data_dir"] = source.data_dir
    try:
        return datasets.load_dataset(path, **kwargs)
    except (FileNotFoundError, ValueError) as err:  # a config, split or data_dir the copy does not hold
        raise DatasetUnavailableError(
            f"data set {source.dataset!r} at {path} has no split {split!r}"
            + (f" of config {source.name!r}" if source.name else "")
            + (f" under {source.data_dir!r}" if source.data_dir else "")
            + f": {err}"
        ) from err


def render_text(source: CorpusSource, record: dict) -> str:
    """A ``text`` or ``messages`` record as one document."""
    if source.field not in record:
        raise DatasetUnavailableError(
            f"data set {source.dataset!r}: a record has no column {source.field!r} (columns: {sorted(record)})"
        )
    if source.render == "text":
        return str(record[source.field])
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in record[source.field])


def question_answer(source: CorpusSource, record: dict) -> tuple[str, str]:
    """A ``question_answer`` record as ``("Question: q\\nAnswer:", " a")``."""
    missing = [c for c in (source.field, source.answer_field) if c not in record]
    if missing:
        raise DatasetUnavailableError(
            f"data set {source.dataset!r}: a record has no column {missing} (columns: {sorted(record)})"
        )
    return f"Question: {record[source.field]}\nAnswer:", f" {record[source.answer_field]}"


def qa_window(tokenizer, question: str, answer: str, block_size: int) -> dict[str, torch.Tensor] | None:
    """One ``[block_size]`` window: question then answer tokens then EOS, truncated and right-padded (pad id, or
    EOS); labels the next token on the answer and its EOS, -100 elsewhere (a right pad is never attended to by a
    real token of a causal model, so no attention mask is needed). None when the question leaves no answer token
    in the window (a window without a label would make a NaN loss): such records are left out."""
    q = tokenizer(question, add_special_tokens=False)["input_ids"]
    a = tokenizer(answer, add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids = (q + a + eos)[: block_size + 1]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or [0])[0]
    window = torch.full((block_size + 1,), pad, dtype=torch.long)
    window[: len(ids)] = torch.tensor(ids, dtype=torch.long)
    labels = window[1:].clone()
    labels[
        : max(len(q) - 1, 0)
    ] = -100  # position j predicts token j+1: the first answer token is predicted at len(q)-1
    labels[max(len(ids) - 1, 0) :] = -100
    if bool((labels == -100).all()):
        return None
    return {"input_ids": window[:-1], "labels": labels}


class SourceWindows(IterableDataset):
    """The training windows of one source: its records after the held-out ones, shuffled in a buffer, this rank's
    shard, minus the first ``skip_windows`` windows (those a resumed run already trained on)."""

    def __init__(self, dm: HubCorpusDataModule, skip_windows: int = 0) -> None:
        self.dm, self.skip_windows = dm, skip_windows

    def _windows(self) -> Iterator[dict[str, torch.Tensor]]:
        dm, source = self.dm, self.dm.domain_source
        records = open_records(source, dm.paths["domain"], source.split)
        if source.eval_split is None or source.eval_split == source.split:
            records = records.skip(
                dm.hparams.eval_records if source.render != "question_answer" else dm.hparams.val_windows
            )
        if dm.hparams.shuffle_buffer > 0:
            records = records.shuffle(seed=derive_seed("data.windows"), buffer_size=dm.hparams.shuffle_buffer)
        trainer = dm.trainer
        if trainer is not None and trainer.world_size > 1:
            from datasets.distributed import split_dataset_by_node

            records = split_dataset_by_node(records, rank=trainer.global_rank, world_size=trainer.world_size)
        block, tok = dm.hparams.block_size, dm.tokenizer
        if source.render == "question_answer":
            for record in records:
                qa = qa_window(tok, *question_answer(source, record), block)
                if qa is not None:
                    yield qa
            return
        buffer: list[int] = []
        for record in records:
            buffer += tok(render_text(source, record), add_special_tokens=False)["input_ids"]
            buffer += [tok.eos_token_id] if tok.eos_token_id is not None else []
            while len(buffer) > block:
                window = torch.tensor(buffer[: block + 1], dtype=torch.long)
                buffer = buffer[block:]
                yield {"input_ids": window[:-1], "labels": window[1:]}

    def _resumed_windows(self) -> int:
        """The windows a fit resumed inside its epoch already trained on (read when iteration starts, after
        Lightning restored the loop's progress; the loader itself is built before that)."""
        trainer = self.dm.trainer
        fit_loop = trainer.fit_loop if trainer is not None else None
        if fit_loop is None or not fit_loop.restarting:
            return 0
        return int(fit_loop.epoch_loop.batch_progress.current.processed) * self.dm.hparams.batch_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        skip = self.skip_windows + self._resumed_windows()
        for i, window in enumerate(self._windows()):
            if i >= skip:
                yield window


class HubCorpusDataModule(L.LightningDataModule):
    """Next-token training on ``domain_source`` (named ``domain``; unset, the corpus of ``DOMAIN_SOURCES`` for the
    domain: math, code, instruction, text), with validation loaders ``[domain, general_domain]`` over fixed windows and ``eval_set(which)`` (the ``DomainEvalData`` contract of the analysis
    family) for training-free evaluations and curvature calibration. See the module docstring for where data is
    read from and how records become windows. Every source is located (and a missing one refused) when the module
    is built; the tokenizer loads then too.

    ``streamed``: the training loader has no length and is positioned when iteration starts, after Lightning
    restored a resumed fit's progress; a module whose learning-rate schedule needs the number of steps reads
    ``max_steps`` instead of building the loader early (``Trainer.estimated_stepping_batches`` would start it)."""

    streamed = True

    def __init__(
        self,
        domain: str = "code",
        domain_source: CorpusSource | None = None,
        general_domain: str = "text",
        general_source: CorpusSource | None = None,
        tokenizer: str = "allenai/OLMo-2-0425-1B",
        data_root: str | None = None,
        block_size: int = 4096,
        batch_size: int = 8,
        val_windows: int = 64,
        eval_records: int = 512,
        shuffle_buffer: int = 10_000,
    ) -> None:
        super().__init__()
        if min(block_size, batch_size, val_windows, eval_records) <= 0 or shuffle_buffer < 0:
            raise ValueError(
                f"block_size={block_size}, batch_size={batch_size}, val_windows={val_windows} and "
                f"eval_records={eval_records} must be positive, shuffle_buffer={shuffle_buffer} non-negative"
            )
        self.save_hyperparameters()
        self.domain, self.general_domain = domain, general_domain
        for name, source in ((domain, domain_source), (general_domain, general_source)):
            if source is None and name not in DOMAIN_SOURCES:
                raise ValueError(
                    f"domain {name!r} has no default corpus (those with one: {sorted(DOMAIN_SOURCES)}): give its "
                    "source (domain_source / general_source)"
                )
        self.domain_source = as_config(CorpusSource, domain_source or DOMAIN_SOURCES[domain], "domain_source")
        self.general_source = as_config(
            CorpusSource, general_source or DOMAIN_SOURCES[general_domain], "general_source"
        )
        if self.general_source.render == "question_answer":
            raise ValueError("general_source is the broad distribution: render it as text or messages")
        self.paths = {
            "domain": resolve(self.domain_source, data_root),
            "general": resolve(self.general_source, data_root),
        }
        self.tokenizer = load_tokenizer(tokenizer)  # ModelUnavailableError at once when it cannot be had
        self._eval: dict[str, dict[str, torch.Tensor]] = {}

    def _eval_windows(self, source: CorpusSource, path: str) -> dict[str, torch.Tensor]:
        hp = self.hparams
        records = iter(open_records(source, path, source.eval_split or source.split))
        if source.render == "question_answer":
            held_out = take_records(records, hp.val_windows)
            if len(held_out) < hp.val_windows:
                raise DatasetUnavailableError(
                    f"data set {source.dataset!r} has {len(held_out)} records for evaluation, fewer than "
                    f"val_windows={hp.val_windows}"
                )
            qa = [qa_window(self.tokenizer, *question_answer(source, r), hp.block_size) for r in held_out]
            windows = [w for w in qa if w is not None]
            if not windows:
                raise DatasetUnavailableError(
                    f"no evaluation record of data set {source.dataset!r} leaves an answer token within "
                    f"block_size={hp.block_size}: raise block_size"
                )
            return {k: torch.stack([w[k] for w in windows]) for k in ("input_ids", "labels")}
        eos = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        ids: list[int] = []
        for record in take_records(records, hp.eval_records):
            ids += self.tokenizer(render_text(source, record), add_special_tokens=False)["input_ids"] + eos
        if len(ids) < hp.block_size + 1:
            raise DatasetUnavailableError(
                f"the {hp.eval_records} evaluation records of data set {source.dataset!r} hold {len(ids)} tokens, "
                f"fewer than one window of block_size + 1 = {hp.block_size + 1}: raise eval_records"
            )
        return fixed_windows(torch.tensor(ids, dtype=torch.long), hp.block_size, hp.val_windows)

    def eval_set(self, which: Literal["domain", "general"]) -> dict[str, torch.Tensor]:
        """The fixed evaluation windows of ``"domain"`` or ``"general"`` as one batch (read once, then kept)."""
        if which not in ("domain", "general"):
            raise ValueError(f"which must be 'domain' or 'general', got {which!r}")
        if which not in self._eval:
            source = self.domain_source if which == "domain" else self.general_source
            self._eval[which] = self._eval_windows(source, self.paths[which])
        return self._eval[which]

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        # tokenised in the main process: a worker of an IterableDataset would read the whole stream again
        return DataLoader(SourceWindows(self), batch_size=hp.batch_size)

    def val_dataloader(self) -> list[DataLoader]:
        loaders = []
        for which in ("domain", "general"):
            batch = self.eval_set(which)
            items = [{k: v[i] for k, v in batch.items()} for i in range(batch["input_ids"].shape[0])]
            loaders.append(DataLoader(items, batch_size=self.hparams.batch_size, shuffle=False))
        return loaders


def take_records(records, n: int) -> list[dict]:
    """The first ``n`` records of a stream (fewer when it ends first)."""
    out = []
    for record in records:
        if len(out) >= n:
            break
        out.append(record)
    return out
