"""Task complexity — "Operationalising the Superficial Alignment Hypothesis via Task Complexity" (Vergara-Browne,
Patil, Titov, Reddy, Pimentel, Mosbach; ICML 2026, arXiv 2602.15829; code github.com/tvergara/sah).
The bit-accounting maths only; the strategies, module and card are ``task_complexity.py``.

Task complexity at target δ is the length of the shortest program reaching performance δ with the model given for
free: ``C(δ | θ) = min { len(p) : perf(run(p, θ)) >= δ }``, ``len(p) = 8·bytes(script) + bits(payload)`` (§3 of the
paper as read from its code). Every executed strategy gives an upper-bound point (bits, perf); the estimate is the
step-function Pareto frontier of those points.

This file holds the bit accounting as pure functions:
    prompt / ICL payload     ceil(Σ_{j>=2} -log2 p_θ(x_j | x_<j))      (first token free; exact arithmetic coder for
                             tests: ``arithmetic_encode`` / ``arithmetic_decode``); each distribution smoothed as
                             the released coder does (``smoothed_logprobs``, ε = float32 eps)
    LoRA payload             16 · #trainable (bf16)
    quantised LoRA [ours]    per tensor: 64 + Σ_t -log2((c_t(q_t) + ½) / (t - 1 + K/2)), adaptive
                             Krichevsky–Trofimov code of the b-bit symbols (K = 2^b; 64 = fp32 min and max)
    Bayesian-Bits width      b = 2^(1 + z4 + z4 z8 + z4 z8 z16 + z4 z8 z16 z32)
    online (prequential)     Σ_batches ceil(Σ_tokens -log2 p_{θ_t}(x)), each batch scored before its own update
    frontier                 sort by bits, keep a point iff its perf beats every shorter one;
                             C(δ) = min bits with perf >= δ; R(δ*) = C_pre(δ*) / C_post(δ*)
Reconstructed: the formal definitions (from the code and abstract; the PDF body was not read) and the quantised-LoRA
strategy (an extension).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import torch
from torch import Tensor

ProbFn = Callable[
    [Sequence[int]], Tensor
]  # prefix -> probabilities over the vocabulary (float64, sums to ~1)


# The released ICL coder's smoothing constant: ``torch.finfo(float32).eps`` of its float32 probabilities.
RELEASED_ICL_EPS = float(torch.finfo(torch.float32).eps)


# ---- code lengths ---------------------------------------------------------------------------------------------
def smoothed_logprobs(token_logprobs: Tensor, vocab: int, eps: float = RELEASED_ICL_EPS) -> Tensor:
    """The released arithmetic coder's smoothing of every next-token distribution over ``vocab`` tokens
    (``normalize_pdf``: p' ∝ (1 − 2Vε) p + ε, whose normaliser is 1 − Vε), applied to the coded tokens'
    natural-log probabilities: log(((1 − 2Vε) p + ε) / (1 − Vε)). Every token keeps a probability >= ε/(1 − Vε)
    (a few bits saved on very unlikely tokens, ~Vε/ln 2 bits lost on each likely one); the uniform distribution
    is unchanged; ``eps = 0`` returns the input."""
    if eps == 0:
        return token_logprobs
    if not 0 < eps < 1 / (2 * vocab):
        raise ValueError(f"smoothing eps must be in [0, 1/(2·vocab)) = [0, {1 / (2 * vocab):.3g}), got {eps}")
    p = token_logprobs.double().exp()
    return torch.log(((1 - 2 * vocab * eps) * p + eps) / (1 - vocab * eps))


def code_length_bits(logprobs: Tensor) -> float:
    """``Σ -log2 p`` of natural-log probabilities."""
    return float(-(logprobs.double() / math.log(2)).sum())


def prompt_payload_bits(token_logprobs: Tensor) -> int:
    """``ceil(Σ_{j>=2} -log2 p(x_j | x_<j))``: the first token is free (as released); ``token_logprobs[j]`` is the
    natural-log probability of token j given its prefix (entry 0 is ignored)."""
    return int(math.ceil(code_length_bits(token_logprobs[1:]) - 1e-9))


def uniform_prompt_bits(n_tokens: int, vocab: int) -> int:
    return int(math.ceil((n_tokens - 1) * math.log2(vocab) - 1e-9))


def lora_payload_bits(params: Sequence[Tensor], bits_per_number: int = 16) -> int:
    return bits_per_number * sum(int(p.numel()) for p in params)


# ---- exact arithmetic coding (tests) ---------------------------------------------------------------------------
def _cdf(probs: Tensor) -> tuple[list[Fraction], Fraction]:
    fr = [Fraction(float(p)) for p in probs.double()]
    cum, acc = [], Fraction(0)
    for f in fr:
        cum.append(acc)
        acc += f
    return cum + [acc], acc


def arithmetic_encode(tokens: Sequence[int], probs: ProbFn) -> tuple[Fraction, Fraction, int]:
    """Exact interval ``[low, low + width)`` of ``tokens[1:]`` (the first token is sent for free) and the code
    length in bits of the shortest binary fraction inside it."""
    low, width = Fraction(0), Fraction(1)
    for j in range(1, len(tokens)):
        cum, total = _cdf(probs(tokens[:j]))
        x = tokens[j]
        low += width * cum[x] / total
        width *= (cum[x + 1] - cum[x]) / total
    bits = 0
    while True:  # shortest k with a multiple of 2^-k inside [low, low + width)
        scale = 2**bits
        v = Fraction(math.ceil(low * scale), scale)
        if v < low + width:
            return low, width, bits
        bits += 1


def arithmetic_code_value(low: Fraction, bits: int) -> Fraction:
    scale = 2**bits
    return Fraction(math.ceil(low * scale), scale)


def arithmetic_decode(value: Fraction, first: int, n: int, probs: ProbFn) -> list[int]:
    """Decode ``n`` tokens (the free first one included) from a value inside the encoder's interval."""
    tokens, low, width = [first], Fraction(0), Fraction(1)
    for _ in range(1, n):
        cum, total = _cdf(probs(tokens))
        target = (value - low) / width * total
        x = max(i for i in range(len(cum) - 1) if cum[i] <= target and cum[i + 1] > cum[i])
        tokens.append(x)
        low += width * cum[x] / total
        width *= (cum[x + 1] - cum[x]) / total
    return tokens


# ---- quantised LoRA payload (KT code) -----------------------------------------------------------------------------
def quantize_uniform(x: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """Per-tensor uniform quantisation to ``K = 2^bits`` levels between min and max: symbols and the
    dequantised tensor (a constant tensor has one level)."""
    K = 2**bits
    lo, hi = x.min(), x.max()
    if float(hi - lo) == 0:
        return torch.zeros_like(x, dtype=torch.long), x.clone()
    step = (hi - lo) / (K - 1)
    q = torch.round((x - lo) / step).clamp(0, K - 1).long()
    return q, lo + q.to(x.dtype) * step


def kt_code_bits(symbols: Sequence[int], K: int, header_bits: int = 64) -> float:
    """Adaptive Krichevsky–Trofimov code length ``header + Σ_t -log2((c_t(q_t) + ½) / (t - 1 + K/2))``."""
    counts: dict[int, int] = {}
    total = float(header_bits)
    for t, q in enumerate(symbols, start=1):
        total -= math.log2((counts.get(q, 0) + 0.5) / (t - 1 + K / 2))
        counts[q] = counts.get(q, 0) + 1
    return total


def lora_q_payload_bits(tensors: Sequence[Tensor], bits: int) -> int:
    return int(
        math.ceil(
            sum(kt_code_bits(quantize_uniform(t, bits)[0].flatten().tolist(), 2**bits) for t in tensors)
        )
    )


def bayesian_bits_width(z4: int, z8: int, z16: int, z32: int) -> int:
    """``2^(1 + z4 + z4 z8 + z4 z8 z16 + z4 z8 z16 z32)`` in {2, 4, 8, 16, 32}."""
    return 2 ** (1 + z4 + z4 * z8 + z4 * z8 * z16 + z4 * z8 * z16 * z32)


# ---- prequential (online) code ------------------------------------------------------------------------------------
def prequential_bits(batch_logprobs: Sequence[Tensor]) -> int:
    """``Σ_batches ceil(Σ -log2 p)`` of each batch scored under the weights before its own update (pass float64
    log-probabilities: the ceiling of a float32 sum can land one bit off)."""
    return sum(int(math.ceil(code_length_bits(lp) - 1e-9)) for lp in batch_logprobs)


# ---- frontier, complexity, reduction --------------------------------------------------------------------------------
def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points ``(bits, perf)`` sorted by bits, kept iff perf beats every shorter (or equal-length earlier) point."""
    out: list[tuple[float, float]] = []
    best = -math.inf
    for bits, perf in sorted(points, key=lambda p: (p[0], -p[1])):
        if perf > best:
            out.append((bits, perf))
            best = perf
    return out


def complexity(points: Sequence[tuple[float, float]], delta: float) -> float:
    """``C(δ) = min { bits : perf >= δ }`` (inf if no point reaches δ)."""
    return min((b for b, p in points if p >= delta), default=math.inf)


def reduction(pre: Sequence[tuple[float, float]], post: Sequence[tuple[float, float]]) -> float:
    """``R = C_pre(δ*) / C_post(δ*)`` at ``δ* = max perf of the pre-trained points``."""
    delta = max(p for _, p in pre)
    c_post = complexity(post, delta)
    return complexity(pre, delta) / c_post if c_post > 0 else math.inf
