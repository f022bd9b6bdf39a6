"""SPR-RAFT's paper-scale regression data ("SPR-RAFT: Parameter-Efficient Regression-Aware Fine-Tuning for Biomedical
LLM Regression", ICML 2026; abstract only): published CSV files read as text for a Hugging Face causal LM.

The paper's molecular property benchmarks are MoleculeNet's regression sets (Wu et al., "MoleculeNet: a benchmark
for molecular machine learning", arXiv 1703.00564: its physical-chemistry sets), in the files DeepChem distributes
(``MOLECULENET_URL`` + the file name), each read from ``data_dir``:

    esol           delaney-processed.csv  text "smiles", target "measured log solubility in mols per litre" (1128)
    freesolv       SAMPL.csv              text "smiles", target "expt" (hydration free energy, kcal/mol; 642)
    lipophilicity  Lipophilicity.csv      text "smiles", target "exp" (octanol/water logD; 4200)

Any other CSV with a text column and a numeric target (``task="csv"`` with ``file``, ``text_column``,
``target_column``, ``instruction``): the paper's clinical-trial duration (TrialBench, arXiv 2407.00631) once
exported to one CSV, a lab panel serialised to text for biological age. The TrialBench release's own layout is
not read here (reconstructed: the exact benchmark releases of the paper were not reachable).

A record (reconstructed layout, spec §3.1) is the prompt ``instruction + "\\n" + evidence + "\\nAnswer:"`` in the
model's tokens, left-padded to the longest prompt (``mask`` 0 on the padding), then ``[REG]`` (a special token
added to the tokenizer), the target serialised character by character and ``<eos>``:

    <pad>… "Predict …\\nSMILES: CCO\\nAnswer:" [REG] "+" "0" "0" "." "7" "7" <eos>

The answer always has a sign, ``width`` integer digits (zero-padded; by default the fewest that hold every record's
target) and ``precision`` decimals, so every answer has the same number of tokens (``width`` here counts all of
them before ``<eos>``). Splits: a fixed permutation (``split_seed``, pinned 0; None draws it from the run seed's
``"data.split"`` stream) into train / val / test by ``val_fraction`` and ``test_fraction``; target statistics
and the RAFT grid (``grid_size`` training quantiles, rounded to ``precision``, deduplicated) come from train.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from litlab.datamodules.digits_pairs import epoch_shuffled_loader
from litlab.datamodules.text_regression import serialize
from litlab.lit_modules.core.errors import DataFileError, DatasetUnavailableError
from litlab.lit_modules.core.seeding import derive_seed

MOLECULENET_URL = "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/"
REG_TOKEN = "[REG]"


@dataclasses.dataclass(frozen=True)
class RegressionCSV:
    """Where a data set's records are: ``file`` in the data folder, its ``text_column`` and ``target_column``, the
    task's ``instruction`` and the evidence's ``label`` in the prompt; ``url`` says where to get the file."""

    file: str
    text_column: str
    target_column: str
    instruction: str
    label: str
    url: str = ""


REGRESSION_CSVS: dict[str, RegressionCSV] = {
    "esol": RegressionCSV(
        "delaney-processed.csv",
        "smiles",
        "measured log solubility in mols per litre",
        "Predict the measured aqueous solubility of the molecule, as log10 of mol/L.",
        "SMILES",
        MOLECULENET_URL + "delaney-processed.csv",
    ),
    "freesolv": RegressionCSV(
        "SAMPL.csv",
        "smiles",
        "expt",
        "Predict the experimental hydration free energy of the molecule in water, in kcal/mol.",
        "SMILES",
        MOLECULENET_URL + "SAMPL.csv",
    ),
    "lipophilicity": RegressionCSV(
        "Lipophilicity.csv",
        "smiles",
        "exp",
        "Predict the octanol/water distribution coefficient (logD at pH 7.4) of the molecule.",
        "SMILES",
        MOLECULENET_URL + "Lipophilicity.csv",
    ),
}


def serialize_signed(y: float, precision: int, width: int) -> str:
    """'+' or '-', then ``serialize(|y|, precision, width)``: one length for every value that fits ``width``."""
    q = round(float(y), precision)
    return ("-" if q < 0 else "+") + serialize(abs(q), precision, width)


def integer_digits(values: np.ndarray, precision: int) -> int:
    """The fewest integer digits that hold every value rounded to ``precision`` (at least 1)."""
    largest = float(np.abs(np.round(values, precision)).max())
    return max(1, len(str(int(largest))))


def read_regression_csv(path: Path, spec: RegressionCSV) -> tuple[list[str], np.ndarray]:
    """(texts, targets) of a CSV file; ``DataFileError`` naming the file and the missing column or the bad row."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        for column in (spec.text_column, spec.target_column):
            if column not in columns:
                raise DataFileError(f"{path} has no column {column!r}; its columns are {columns}")
        texts, targets = [], []
        for line, row in enumerate(reader, start=2):
            try:
                y = float(row[spec.target_column])
            except (TypeError, ValueError) as err:
                raise DataFileError(
                    f"{path} line {line}: target {spec.target_column!r} = {row[spec.target_column]!r} is not a number"
                ) from err
            if not math.isfinite(y) or not row[spec.text_column]:
                raise DataFileError(f"{path} line {line}: empty text or non-finite target {y}")
            texts.append(row[spec.text_column])
            targets.append(y)
    if len(texts) < 3:
        raise DataFileError(f"{path} holds {len(texts)} records; train, val and test need at least 3")
    return texts, np.asarray(targets, dtype=np.float64)


class CSVTextRegressionDataModule(L.LightningDataModule):
    """Batches ``{"ids": [b, reg_index + width + 2], "mask": [b, same], "y", "z"}`` of one CSV data set (module
    docstring) for the tokenizer ``tokenizer`` (a Hugging Face id or folder, loaded in ``setup``: the model's).

    Constructing it reads the file, so a missing one stops the run at once naming the folder, the file, its columns
    and where to download it. Same interface as ``text_regression.TextRegressionDataModule`` (``token_ids``,
    ``reg_index``, ``width``, ``raft_grid``, ``encode_answers``, ``numeric_split``, ``target_mean``/``target_std``,
    ``eval_splits``); ``numeric_split`` gives no features (a SMILES string has none), only targets.
    ``max_prompt_tokens`` caps a prompt: a longer evidence text is cut at its end (the instruction and
    ``Answer:`` stay), with a warning counting the records cut.
    """

    def __init__(
        self,
        data_dir: str,
        tokenizer: str,
        task: str = "esol",
        file: str | None = None,
        text_column: str | None = None,
        target_column: str | None = None,
        instruction: str | None = None,
        precision: int = 2,
        width: int | None = None,
        batch_size: int = 16,
        grid_size: int = 64,
        max_prompt_tokens: int = 256,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        eval_splits: tuple[str, ...] = ("val", "test"),
        split_seed: int | None = 0,
    ):
        super().__init__()
        if precision < 0 or batch_size <= 0 or grid_size < 2 or max_prompt_tokens < 8:
            raise ValueError(
                f"need precision >= 0, batch_size > 0, grid_size >= 2, max_prompt_tokens >= 8; got {precision}, "
                f"{batch_size}, {grid_size}, {max_prompt_tokens}"
            )
        if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(
                f"val_fraction {val_fraction} and test_fraction {test_fraction} must leave training data"
            )
        if set(eval_splits) - {"val", "test"} or not eval_splits:
            raise ValueError(f"eval_splits must be among ('val', 'test'), got {eval_splits}")
        self.save_hyperparameters()
        self.spec = self._spec(task, file, text_column, target_column, instruction)
        folder = Path(data_dir).expanduser()
        path = folder / self.spec.file
        if not path.is_file():
            where = f"download {self.spec.url} into it" if self.spec.url else "put the CSV file there"
            raise DatasetUnavailableError(
                f"data set {task!r} needs {path}: data_dir {str(folder)!r} has no {self.spec.file} (a CSV file with "
                f"the columns {self.spec.text_column!r} and {self.spec.target_column!r}); {where}, or pass "
                "--data.init_args.data_dir=<the folder that holds it>"
            )
        texts, y = read_regression_csv(path, self.spec)
        self.eval_splits = tuple(eval_splits)
        n = len(texts)
        perm = np.random.RandomState(derive_seed("data.split", fixed=split_seed)).permutation(n)
        n_val, n_test = max(1, round(val_fraction * n)), max(1, round(test_fraction * n))
        parts = {"train": perm[n_val + n_test :], "val": perm[:n_val], "test": perm[n_val : n_val + n_test]}
        self.splits = {k: ([texts[i] for i in idx], y[idx]) for k, idx in parts.items()}
        ytr = self.splits["train"][1]
        self.target_mean, self.target_std = float(ytr.mean()), float(ytr.std())
        if self.target_std == 0:
            raise DataFileError(f"{path}: every training target is {self.target_mean}; nothing to regress")
        self.digits = width if width is not None else integer_digits(y, precision)
        self.width = len(serialize_signed(0.0, precision, self.digits))  # answer tokens before <eos>
        q = np.round(np.quantile(ytr, np.linspace(0, 1, grid_size)), precision)
        self.raft_grid = torch.tensor(sorted(set(q.tolist())), dtype=torch.float32)
        self.tok = None
        self.tensors: dict[str, TensorDataset] = {}

    @staticmethod
    def _spec(task, file, text_column, target_column, instruction) -> RegressionCSV:
        given = {
            "file": file,
            "text_column": text_column,
            "target_column": target_column,
            "instruction": instruction,
        }
        if task == "csv":
            missing = [k for k, v in given.items() if v is None]
            if missing:
                raise ValueError(
                    f"task 'csv' needs {missing} (the CSV file's name, its columns, the instruction)"
                )
            return RegressionCSV(file, text_column, target_column, instruction, "Input")  # type: ignore[arg-type]
        if task not in REGRESSION_CSVS:
            raise ValueError(
                f"unknown task {task!r}: one of {sorted(REGRESSION_CSVS)} or 'csv' (any CSV file)"
            )
        overrides = {k: v for k, v in given.items() if v is not None}
        return dataclasses.replace(REGRESSION_CSVS[task], **overrides)

    def setup(self, stage: str | None = None) -> None:
        if self.tok is not None:
            return
        from litlab.lit_modules.core.hf import load_tokenizer

        hp = self.hparams
        tok = load_tokenizer(hp.tokenizer)
        tok.add_tokens([REG_TOKEN], special_tokens=True)  # [REG]: the model's own trained embedding e_REG
        eos = tok.eos_token_id
        if eos is None:
            raise ValueError(f"tokenizer {hp.tokenizer!r} has no eos token, which ends every answer")
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        self.answer_ids = {}
        for ch in "0123456789+-.":
            ids = tok.encode(ch, add_special_tokens=False)
            if len(ids) != 1:
                raise ValueError(
                    f"tokenizer {hp.tokenizer!r} does not give {ch!r} one token of its own ({ids})"
                )
            self.answer_ids[ch] = ids[0]
        self.tok = tok
        self.token_ids = {
            "reg": tok.convert_tokens_to_ids(REG_TOKEN),
            "pad": pad,
            "eos": eos,
            "digits": [self.answer_ids[str(d)] for d in range(10)],
        }
        prompts = {k: [self._prompt_ids(t) for t in texts] for k, (texts, _) in self.splits.items()}
        cut = sum(len(p) == hp.max_prompt_tokens for v in prompts.values() for p in v)
        if cut:
            warnings.warn(f"{cut} prompts reach max_prompt_tokens={hp.max_prompt_tokens}: cut", stacklevel=2)
        self.reg_index = max(len(p) for v in prompts.values() for p in v)
        for k, (_, y) in self.splits.items():
            rows, mask = [], []
            for p in prompts[k]:
                rows.append([pad] * (self.reg_index - len(p)) + p)
                mask.append([0] * (self.reg_index - len(p)) + [1] * (len(p) + self.width + 2))
            pre = torch.tensor(rows)
            ids = torch.cat(
                [pre, torch.full((len(pre), 1), self.token_ids["reg"]), self.encode_answers(y)], 1
            )
            yt = torch.tensor(y, dtype=torch.float32)
            z = (yt - self.target_mean) / self.target_std
            self.tensors[k] = TensorDataset(ids, torch.tensor(mask), yt, z)

    def _prompt_ids(self, text: str) -> list[int]:
        """The instruction, the evidence (cut at its end to fit ``max_prompt_tokens``) and ``Answer:``."""
        assert self.tok is not None
        head = self.tok.encode(
            f"{self.spec.instruction}\n{self.spec.label}: {text}", add_special_tokens=False
        )
        tail = self.tok.encode("\nAnswer:", add_special_tokens=False)
        return head[: self.hparams.max_prompt_tokens - len(tail)] + tail

    def encode_answers(self, values) -> torch.Tensor:
        """``[K, width + 1]``: each value's characters (sign, digits, point) as tokens, then ``<eos>``."""
        self.setup()
        rows = []
        for v in values:
            s = serialize_signed(float(v), self.hparams.precision, self.digits)
            if len(s) != self.width:
                raise ValueError(
                    f"target {v} does not fit {self.digits} integer digits: raise data.init_args.width"
                )
            rows.append([self.answer_ids[c] for c in s] + [self.token_ids["eos"]])
        return torch.tensor(rows)

    def numeric_split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        texts, y = self.splits[name]
        return np.zeros((len(texts), 0)), y

    def train_dataloader(self) -> DataLoader:
        return epoch_shuffled_loader(self.tensors["train"], self.hparams.batch_size, _collate)

    def val_dataloader(self) -> list[DataLoader]:
        return [
            DataLoader(self.tensors[k], batch_size=self.hparams.batch_size, collate_fn=_collate)
            for k in self.eval_splits
        ]


def _collate(items) -> dict[str, torch.Tensor]:
    ids, mask, y, z = zip(*items)
    return {"ids": torch.stack(ids), "mask": torch.stack(mask), "y": torch.stack(y), "z": torch.stack(z)}
