import pytest
import torch

from litlab.datamodules.bundled import load_bundled
from litlab.datamodules.text import LocalTextDataModule
from litlab.lit_modules.core.corpus import _CORPUS_CACHE, CharTokenizer, local_text_corpus
from litlab.lit_modules.core.seeding import derive_seed, reset_ledger, seed_ledger


def test_corpus_is_large_and_deterministic():
    text = local_text_corpus(200_000)
    assert len(text) >= 200_000
    _CORPUS_CACHE.clear()  # rebuild, not just hit the cache
    assert local_text_corpus(200_000) == text


def test_corpus_too_small_error_names_the_numbers():
    with pytest.raises(RuntimeError, match=r"min_chars=100000000"):
        local_text_corpus(min_chars=100_000_000)


def test_tokenizer_round_trip_and_unknowns():
    tokenizer = CharTokenizer()
    assert tokenizer.vocab_size == 97
    text = "Hello, world!\n  ~{x: [1, 2]}\\"
    ids = tokenizer.encode(text)
    assert ids.dtype == torch.long and ids.shape == (len(text),)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids.tolist()) == text
    assert tokenizer.encode("é\tß").tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="97"):
        tokenizer.decode([97])


def first_batch(dm):
    return next(iter(dm.train_dataloader()))


def test_batches_are_shifted_windows():
    dm = LocalTextDataModule(block_size=32, batch_size=4)
    dm.setup("fit")
    assert dm.vocab_size == 97
    batch = first_batch(dm)
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 32)
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    val = list(dm.val_dataloader())
    assert sum(len(b["input_ids"]) for b in val) == 256
    assert torch.equal(val[0]["input_ids"][:, 1:], val[0]["labels"][:, :-1])


def test_halves_are_disjoint_and_cover_the_corpus():
    first, second = (LocalTextDataModule(split=s) for s in ("first_half", "second_half"))
    full = LocalTextDataModule(split="all")
    for dm in (first, second, full):
        dm.setup("fit")
    n_first = len(first.train_ids) + len(first.val_ids)
    n_second = len(second.train_ids) + len(second.val_ids)
    assert n_first + n_second == len(full.train_ids) + len(full.val_ids)
    corpus_ids = torch.cat([full.train_ids, full.val_ids])
    assert torch.equal(torch.cat([first.train_ids, first.val_ids]), corpus_ids[:n_first])
    assert torch.equal(torch.cat([second.train_ids, second.val_ids]), corpus_ids[n_first:])


def first_batch_at(run_seed: int, monkeypatch) -> torch.Tensor:
    monkeypatch.setenv("PL_GLOBAL_SEED", str(run_seed))  # what seed_everything exports
    return first_batch(LocalTextDataModule(block_size=16, batch_size=8))["input_ids"]


def test_train_batches_follow_the_run_seed_and_epoch(monkeypatch):
    """The windows come from the run's "data" stream: the same run seed draws them again, another draws others."""
    assert torch.equal(first_batch_at(0, monkeypatch), first_batch_at(0, monkeypatch))
    assert not torch.equal(first_batch_at(0, monkeypatch), first_batch_at(1, monkeypatch))
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    reset_ledger(0)
    a = LocalTextDataModule(block_size=16, batch_size=8)
    loader = a.train_dataloader()
    assert seed_ledger()["components"] == {"data": derive_seed("data")}  # the run's ledger names the stream
    epoch0 = next(iter(loader))["input_ids"]
    loader.sampler.set_epoch(1)
    assert not torch.equal(next(iter(loader))["input_ids"], epoch0)
    assert len(loader) == 3200 // 8


def test_bad_arguments_have_clear_errors():
    with pytest.raises(ValueError, match=r"block_size=100000 is too large for the validation split"):
        LocalTextDataModule(block_size=100_000).setup("fit")
    with pytest.raises(ValueError, match=r"val_fraction=1.5"):
        LocalTextDataModule(val_fraction=1.5)
    with pytest.raises(ValueError, match=r"split='middle'"):
        LocalTextDataModule(split="middle")
    with pytest.raises(ValueError, match=r"batch_size=0"):
        LocalTextDataModule(batch_size=0)


def test_load_bundled_digits_and_unknown_name():
    X, y = load_bundled("digits")
    assert X.shape == (1797, 64) and y.shape == (1797,)
    with pytest.raises(ValueError, match=r"'mnist'.*digits.*fetch_"):
        load_bundled("mnist")


def test_corpus_does_not_depend_on_importing_diffusers():
    # transformers and diffusers both bind logging.Logger.warning_advice, whose docstring is corpus text
    import transformers  # noqa: F401

    from litlab.lit_modules.diffusion.ddpm import diffusers_classes

    _CORPUS_CACHE.clear()
    before = local_text_corpus(200_000)
    diffusers_classes("DDPMScheduler", "UNet2DConditionModel")
    _CORPUS_CACHE.clear()
    assert local_text_corpus(200_000) == before


def test_corpus_does_not_depend_on_what_this_process_bound_on_logging_logger(monkeypatch):
    # A worker that imported diffusers directly (litlab.model_shapes does, for the full-scale plan) after the corpus
    # was cached rebuilt a different corpus: the cards' training text depended on import order.
    import logging

    _CORPUS_CACHE.clear()
    recorded = local_text_corpus(200_000)

    def warning_advice(self, *args, **kwargs):
        """Another library's docstring, which must not enter the corpus."""

    monkeypatch.setattr(logging.Logger, "warning_advice", warning_advice)
    monkeypatch.delattr(logging.Logger, "info_once")
    _CORPUS_CACHE.clear()
    assert local_text_corpus(200_000) == recorded
    assert vars(logging.Logger)["warning_advice"] is warning_advice and "info_once" not in vars(
        logging.Logger
    )
