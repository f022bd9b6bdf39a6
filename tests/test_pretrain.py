"""core.pretrain.train_and_cache: the one train-and-cache rule (own seed, fixed thread count, atomic cache)."""

from __future__ import annotations

import threading
import time

import torch
from torch import nn

from litlab.lit_modules.core.pretrain import train_and_cache


def test_trains_once_on_its_own_seed_and_threads_then_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))
    calls = []

    def train(model: nn.Linear) -> None:
        calls.append(torch.get_num_threads())
        with torch.no_grad():
            model.weight.add_(torch.randn_like(model.weight))

    before = torch.get_num_threads()
    torch.manual_seed(123)
    outside = torch.rand(1)
    torch.manual_seed(123)
    first = train_and_cache(
        "toy", {"width": 4}, seed=7, build=lambda: nn.Linear(4, 4), train=train, threads=2
    )
    assert torch.rand(1) == outside  # the caller's RNG is left as it was
    assert calls == [2] and torch.get_num_threads() == before
    second = train_and_cache(
        "toy", {"width": 4}, seed=7, build=lambda: nn.Linear(4, 4), train=train, threads=2
    )
    assert calls == [2]  # loaded, not retrained
    assert torch.equal(first.weight, second.weight)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [
        next(tmp_path.glob("toy-*.safetensors")).name
    ]  # no tmp left
    other = train_and_cache(
        "toy", {"width": 5}, seed=7, build=lambda: nn.Linear(4, 4), train=train, threads=1
    )
    assert (
        calls == [2, 1] and len(list(tmp_path.glob("toy-*.safetensors"))) == 2
    )  # another recipe, another file
    assert torch.equal(other.weight, first.weight)  # same seed, same draws


def test_two_builders_of_one_artefact_train_it_once(tmp_path, monkeypatch):
    """Two workers that need the same base model at once (``repro --jobs 2``): one trains, the other waits for the
    lock and loads what the first wrote. Threads stand in for processes: ``flock`` locks conflict between two
    open files of one process as between two processes."""
    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))
    calls, models = [], []

    def train(model: nn.Linear) -> None:
        calls.append(threading.get_ident())
        time.sleep(0.5)  # long enough that the second caller arrives while the first is training
        with torch.no_grad():
            model.weight.add_(torch.randn_like(model.weight))

    def build_once() -> None:
        models.append(
            train_and_cache(
                "toy", {"width": 3}, seed=1, build=lambda: nn.Linear(3, 3), train=train, threads=1
            )
        )

    workers = [threading.Thread(target=build_once) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert len(calls) == 1 and len(models) == 2
    assert torch.equal(models[0].weight, models[1].weight)
