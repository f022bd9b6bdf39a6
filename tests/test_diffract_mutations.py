"""Mutation tests for the Diffract card's mechanism claims ``vectors_keep_most_gain_*`` (seeds/diffract.yaml:
``cpt_<domain>:diffract/G_vec >= 0.8``, the swap test's share of the domain gain that the base singular values keep
on the tuned singular vectors): plausible wrong implementations of the swap must push G_vec under 0.8 on a small
CPT pair, while the real implementation keeps it above (issue 28: a mechanism claim stays only if it can fail).

The pair: a TinyGPT pre-trained for a few steps on a mix of random and periodic token sequences (θ0), then trained
on the periodic "domain" alone (θd); G_vec is computed by the functions ``analyze_pair`` uses (``spectral_pass`` ->
``spectral.swap_vectors_from`` -> ``swap_test``)."""

from __future__ import annotations

import pytest
import torch

from litlab.lit_modules.analysis import diffract as D
from litlab.lit_modules.analysis import spectral as S
from litlab.lit_modules.core.models import TinyGPT

V, TARGET = 97, 0.8  # vocabulary; the card's target for G_vec


def _batch(kind: str, n: int, g: torch.Generator) -> dict:
    if kind == "noise":
        x = torch.randint(0, V, (n, 33), generator=g)
    else:  # the "domain": periodic sequences start + step * t (mod V)
        start, step = torch.randint(0, V, (n, 1), generator=g), torch.randint(1, 5, (n, 1), generator=g)
        x = (start + step * torch.arange(33)) % V
    return {"input_ids": x[:, :-1], "labels": x[:, 1:]}


def _train(model, kinds, steps: int, lr: float, g: torch.Generator) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for s in range(steps):
        b = _batch(kinds[s % len(kinds)], 32, g)
        loss = torch.nn.functional.cross_entropy(model(b["input_ids"]).flatten(0, 1), b["labels"].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.fixture(scope="module")
def cpt_pair():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = TinyGPT(vocab_size=V, d_model=32, n_layers=2, n_heads=4, block_size=32)
    _train(model, ("noise", "domain"), 40, 3e-3, g)  # θ0
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _train(model, ("domain",), 20, 1e-3, g)  # CPT on the domain
    tuned = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model, base, tuned, _batch("domain", 64, g)


def _g_vec(model, base, tuned, dom) -> float:
    names = D.analysed_names(base)
    _, hybrids = D.spectral_pass(base, tuned, names)
    return D.swap_test(base, tuned, names, D.evaluator(model, dom), hybrids)["G_vec"]


MUTATIONS = {
    # the Diffract toolkit stores singular values ascending: pairing them with descending singular vectors
    "base_values_in_ascending_order": lambda f0, fd: (fd.U * f0.s.flip(0)) @ fd.V.mT,
    # the two hybrids swapped: tuned values on base vectors reported as G_vec
    "hybrids_swapped": lambda f0, fd: (f0.U * fd.s) @ f0.V.mT,
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_g_vec_falls_under_the_target_when_the_swap_is_built_wrong(cpt_pair, mutation, monkeypatch):
    """The mutation test of vectors_keep_most_gain_math, vectors_keep_most_gain_code,
    vectors_keep_most_gain_instruction and smol_vectors_keep_most_gain_math
    (G_vec >= 0.8): the real swap satisfies it, a swap built wrong does not."""
    real = _g_vec(*cpt_pair)
    assert real >= TARGET, real  # the implementation satisfies vectors_keep_most_gain (measured 0.93)
    monkeypatch.setattr(S, "swap_vectors_from", MUTATIONS[mutation])
    broken = _g_vec(*cpt_pair)
    assert broken < TARGET, (mutation, broken)  # measured -0.23 (ascending values), 0.61 (swapped)
