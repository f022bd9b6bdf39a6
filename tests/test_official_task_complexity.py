"""Task complexity against the authors' code: golden numbers from github.com/tvergara/sah at commit
b5a5bd60496094a93597807fbe8b417b345c9994, run once on CPU on seeded inputs stored in
``tests/fixtures/official/task_complexity/golden.pt``:

* ICL payload: ``sah/algorithms/utils/arithmetic_coding.py`` ``encode_single`` (imported unchanged; every
  next-token distribution smoothed by ``normalize_pdf``, ε = float32 eps; first token free), bits
  ``ceil(-log2 width)`` as ``sah/algorithms/strategies/icl.py`` counts them, on four float32 distributions over
  128 tokens (40 tokens each, three of them the least likely token).
* Frontier: ``notebooks/046-task-complexity-curves.py`` (the script sizes added per strategy,
  ``compute_pareto_frontier``'s corner points, C(δ) = the fewest bits among points with performance >= δ) on 50 random
  point sets of 30 points (distinct totals, continuous performance: no ties).

``smoothing_eps=0`` (ours before issue 30) and payload-only frontiers (``count_script_bits=False``, the module's
default; the card counts the scripts since issue 34, with ``plan.charge_first_token=False``: the released coder's free
first token) differ, as the last two tests show.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import torch

from litlab.lit_modules.analysis import complexity_coding as TC
from litlab.lit_modules.analysis import task_complexity as T

FIXTURE = Path(__file__).parent / "fixtures" / "official" / "task_complexity"
GOLDEN = torch.load(FIXTURE / "golden.pt")
TOL = json.loads((FIXTURE / "SOURCE.json").read_text())["tolerance"]
OURS = {"baseline": "baseline", "icl": "icl", "online_coding": "online", "lora": "lora", "blora": "lora_q"}


def _icl_bits(eps: float) -> list[int]:
    """Our ICL payload of each stored sequence: row j of ``probs`` is the distribution of token j + 1."""
    out = []
    for probs, tokens in zip(GOLDEN["probs"], GOLDEN["tokens"]):
        lp = torch.zeros(len(tokens), dtype=torch.float64)
        lp[1:] = torch.log(probs.double()[torch.arange(len(tokens) - 1), tokens[1:]])
        out.append(TC.prompt_payload_bits(TC.smoothed_logprobs(lp, int(GOLDEN["vocab"]), eps)))
    return out


def _rows(i: int) -> list[dict]:
    names = GOLDEN["strategy_names"]
    return [
        {"strategy": OURS[names[int(k)]], "knob": "", "bits_payload": int(b), "perf": float(p)}
        for k, b, p in zip(GOLDEN["strategy"][i], GOLDEN["payload"][i], GOLDEN["perf"][i])
    ]


def test_icl_payload_bits_equal_the_released_coder():
    assert _icl_bits(TC.RELEASED_ICL_EPS) == GOLDEN["icl_bits"].tolist()
    assert T.StrategyPlan().icl_smoothing_eps == TC.RELEASED_ICL_EPS == torch.finfo(torch.float32).eps


def test_script_sizes_frontier_and_complexity_equal_the_released_notebook():
    names = GOLDEN["strategy_names"]
    assert {OURS[n]: int(b) for n, b in zip(names, GOLDEN["script_bits"])} == T.RELEASED_SCRIPT_BITS
    for i in range(len(GOLDEN["payload"])):
        rows = T.with_released_script_bits(_rows(i))
        points = [(float(r["bits_total"]), r["perf"]) for r in rows]
        for d, want in zip(GOLDEN["deltas"].tolist(), GOLDEN["C"][i].tolist()):
            got = TC.complexity(points, d)
            assert got == want or (math.isinf(got) and math.isinf(want))
        n = int(GOLDEN["frontier_len"][i])
        frontier = torch.tensor(TC.pareto_frontier(points), dtype=torch.float64)
        assert frontier.shape[0] == n
        assert (frontier - GOLDEN["frontier"][i, :n]).abs().max() <= TOL


def test_without_smoothing_the_sharp_sequences_cost_other_bits():
    """eps = 0: the unlikely tokens are not floored at ε, so the sharper sequences take more bits."""
    unsmoothed, released = _icl_bits(0.0), GOLDEN["icl_bits"].tolist()
    assert unsmoothed != released and all(u >= r for u, r in zip(unsmoothed, released))


def test_payload_only_is_the_default_and_counting_scripts_moves_complexity():
    assert inspect.signature(T.TaskComplexity).parameters["count_script_bits"].default is False
    rows = _rows(0)
    payload = T.summarize(rows, (0.5,))
    counted = T.summarize(T.with_released_script_bits(rows), (0.5,), bits="bits_total")
    assert counted["log2_C_050"] > payload["log2_C_050"]


class _GoldenModel(torch.nn.Module):
    """Next-token logits = the stored distributions (row j: token j + 1) of one golden sequence."""

    block_size = 64

    def __init__(self, probs: torch.Tensor):
        super().__init__()
        self.log_probs = probs.double().log()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_probs[: x.shape[1]][None]


class _GoldenTokens:
    """A tokenizer whose every text is one golden token sequence."""

    def __init__(self, tokens: torch.Tensor, vocab: int):
        self.tokens, self.vocab_size = tokens.long(), vocab

    def encode(self, text: str) -> torch.Tensor:
        return self.tokens

    def decode(self, ids) -> str:
        return ""


def test_the_module_icl_coder_without_the_first_token_charge_equals_the_released_coder():
    """Issue 34: through the module's own ICL path (``prompt_bits``: the model's log-softmax, the released smoothing)
    our bits equal the released ``encode_single`` once our first-token charge is off, and exceed it by exactly
    ``ceil(log2 V)`` with it on."""
    vocab = int(GOLDEN["vocab"])
    for probs, tokens, want in zip(GOLDEN["probs"], GOLDEN["tokens"], GOLDEN["icl_bits"].tolist()):
        model, tokenizer = _GoldenModel(probs), _GoldenTokens(tokens, vocab)
        assert T.prompt_bits(model, "x", tokenizer, charge_first_token=False) == want
        assert T.prompt_bits(model, "x", tokenizer) == want + T.first_token_bits(tokenizer) == want + 7
