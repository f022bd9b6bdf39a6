"""SALE: low-bit estimated fine-grained block-sparse attention for long-context prefill.

Paper: "SALE: Low-bit Estimation for Efficient Sparse Attention in Long-context LLM Prefilling", Ji, Zhang, Fu,
Cui, arXiv 2505.24179, ICML 2026; official code github.com/BirdChristopher/SALE. Kernels: the block selection in
``litlab.kernels.block_select``, the sparse computation in ``litlab.kernels.block_sparse_attention``.

Algorithm, per layer and prefill call:
    K' = K - mean_t K;  Qi, Ki = 4-bit per-token codes of Q - mean_t Q and K'            # smoothing
    s_hat = s_q s_k <Qi, Ki> + q_bar . K'                                                 # low-bit estimate
    per query block: reserved = sink block + last n_loc causal blocks (whole segments)
                     m_i, l_i over reserved exact logits;  T_i = m_i + ln(tau l_i)
                     middle block selected iff max_(i,j in block) scale*s_hat - T_i > 0  # RAS > tau
    O = flash attention over reserved + selected blocks
Thresholds tau[l, h]: uniform, or calibrated offline by halving until the L1 output error < theta*N.
Baselines (``sale_baselines``), same reserved blocks and SALE's density, ONE top fraction of every query block's
middle blocks: ``sale_pooled`` ranks them by mean-pooled q_block . k_block (our stand-in for SpargeAttn-style coarse
selection), ``sale_random`` at random (the floor; its draws come from the run's ``"select"`` stream).
Reconstructed: the paper's text could not be read; chosen (from the official kernels): the threshold formula, the
reserved-region arithmetic, the calibration loop, and the name "Relative Attention Score" for exp(z - m)/l.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Literal

import torch

from litlab.kernels.block_select import quant_qk_block_select, smooth_quantize
from litlab.kernels.block_sparse_attention import block_sparse_attention, dense_causal_attention
from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.results import CardResult, ReportExtras
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.longctx.contract import CalibrationData, LongContextData
from litlab.lit_modules.longctx.harness import EVAL, TINY_LM, EvalSettings, FrozenLM, LongContextEval
from litlab.lit_modules.longctx.kv_cache import CACHE_KWARG, KVMethod, head_dim, method_cache
from litlab.lit_modules.longctx.report import density_report
from litlab.lit_modules.longctx.sale_baselines import pooled_block_mask, pooled_keep_counts, random_block_mask

Attn = Literal["sale", "sale_pooled", "sale_random", "sdpa"]


# ---- synthetic "sink + needles" attention inputs ----------------------------------------------------------------
def sink_needle_inputs(
    H: int = 4,
    N: int = 1024,
    d: int = 64,
    n_needles: int = 60,
    seed: int = 1,
    min_query: int = 300,
    min_gap: int = 200,
):
    """q, k, v [H, N, d]: queries 3u + noise ⟂ u, a sink key 25u, needles k_j = 12 n_i/|n_i| for random i > j.

    Our synthetic check (not the paper's): single-key needles that a pooled block score dilutes."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.nn.functional.normalize(torch.randn(H, 1, d, generator=gen), dim=-1)
    noise = 0.9 * torch.randn(H, N, d, generator=gen)
    noise = noise - (noise * u).sum(-1, keepdim=True) * u
    q = 3 * u + noise
    k = 0.5 * torch.randn(H, N, d, generator=gen)
    k[:, 0] = 25 * u[:, 0]
    v = torch.randn(H, N, d, generator=gen)
    for h in range(H):
        for _ in range(n_needles):
            i = int(torch.randint(min_query, N, (), generator=gen))
            j = int(torch.randint(40, max(41, i - min_gap), (), generator=gen))
            k[h, j] = 12 * noise[h, i] / noise[h, i].norm() + 0.2 * torch.randn(d, generator=gen)
    return q, k, v


# ---- selection + computation, and the pooled baseline ------------------------------------------------------
@config_part
class SALEConfig:
    """Block geometry of SALE (defaults: the official scripts'): query blocks of ``block_q`` rows, key blocks of
    ``block_k``; the last ``local_window`` tokens are always kept, the middle region is cut into whole segments of
    ``segment`` tokens; ``bits``-bit estimation; ``impl``: ``triton`` kernels, ``reference`` PyTorch, ``flex``
    (the computation pass on the compiled ``flex_attention``, selection as ``auto``), or ``auto`` (Triton on CUDA;
    on the CPU from 1024 tokens the int8-product selection and the flex computation pass, the reference below).
    ``quant_mode``: 3 = every official script's (per-warp scales, q̄·k' rounded, fp16 comparison; PyTorch reference
    selection), 2 = per token (our Triton/int8 kernels). The official int8 computation pass is not reproduced."""

    block_q: int = 64
    block_k: int = 32
    local_window: int = 128
    segment: int = 128
    bits: int = 4
    impl: Literal["auto", "triton", "reference", "flex"] = "auto"
    quant_mode: Literal[2, 3] = 3

    def __post_init__(self):
        if self.local_window % self.block_k or self.segment % self.block_k:
            raise ValueError(
                f"local_window={self.local_window} and segment={self.segment} must be multiples of "
                f"block_k={self.block_k}"
            )

    @property
    def local_blocks(self) -> int:
        return self.local_window // self.block_k

    @property
    def seg_blocks(self) -> int:
        return self.segment // self.block_k

    def blocks(self) -> dict:
        return dict(
            block_q=self.block_q,
            block_k=self.block_k,
            local_blocks=self.local_blocks,
            seg_blocks=self.seg_blocks,
        )


@config_part
class Calibration:
    """Per-head threshold calibration (off when ``theta`` is None): starting from ``tau_init``, halve tau[l, h]
    until the L1 output error is below theta * d/128 * N on every calibration prompt (the d/128 scaling is our
    choice for small heads); below ``tau_floor`` the head is dense. Defaults are the official code's. The result
    is saved to ``thresholds_path`` if given; with ``theta`` None, thresholds are loaded from it instead.
    ``dense_fallback``: prompts of <= ``min_seq_len`` tokens stay dense, as the official calibration's at 1024."""

    theta: float | None = None
    tau_init: float = 0.008
    tau_floor: float = 1e-4
    thresholds_path: str | None = None
    dense_fallback: bool = True


def sale_block_mask(q, k, tau, cfg: SALEConfig, sm_scale=None):
    """(mask uint8 [B,H,nQ,nK], k' = k - mean k): smoothing + quantisation, then block selection (kernel or
    reference)."""
    quant = smooth_quantize(q, k, cfg.bits, cfg.quant_mode, cfg.block_k)
    impl = "auto" if cfg.impl == "flex" else cfg.impl  # flex names the computation pass; selection as auto
    mask = quant_qk_block_select(
        q, *quant, tau, sm_scale=sm_scale, impl=impl, quant_mode=cfg.quant_mode, **cfg.blocks()
    )
    return mask, quant[0]


def block_density(mask: torch.Tensor, N: int, block_q: int, block_k: int) -> float:
    """(reserved + selected causal blocks) / (all causal blocks)."""
    n_qb = mask.shape[2]
    causal = (
        sum(math.ceil(min((b + 1) * block_q, N) / block_k) for b in range(n_qb))
        * mask.shape[0]
        * mask.shape[1]
    )
    return float(mask.sum()) / causal


def sale_attention_core(q, k, v, tau, cfg: SALEConfig, sm_scale=None, baseline: str = "sale"):
    """One layer's SALE (or pooled-baseline) prefill attention; returns (o [B,H,N,d], mask)."""
    mask, k_s = sale_block_mask(q, k, tau, cfg, sm_scale)
    if baseline == "sale_pooled":
        mask = pooled_block_mask(q, k, pooled_keep_counts(mask, q.shape[2], cfg), cfg)
    o = block_sparse_attention(
        q, k_s, v, mask, cfg.block_q, cfg.block_k, causal=True, sm_scale=sm_scale, impl=cfg.impl
    )
    return o, mask


BLOCKS, NO_CALIBRATION = SALEConfig(), Calibration()  # defaults


# ---- the KV-method interface ------------------------------------------------------------------------------
class SALEMethod(KVMethod):
    """Prefill through SALE (or the pooled baseline) via a registered attention function; decode stays dense.
    Prefill calls of at most ``min_seq_len`` tokens and layers below ``start_layer`` stay dense too."""

    def __init__(
        self,
        attn: Attn = "sale",
        cfg: SALEConfig = BLOCKS,
        tau: float = 0.1,
        thresholds: torch.Tensor | None = None,
        min_seq_len: int = 1024,
        start_layer: int = 0,
        measure_error: bool = True,
    ):
        self.name = self.attn_implementation = attn
        self.attention_fn = None if attn == "sdpa" else _sale_attention
        self.cfg, self.tau, self.thresholds = cfg, tau, thresholds
        self.min_seq_len, self.start_layer, self.measure_error = min_seq_len, start_layer, measure_error
        self.stats: list[dict] = []
        self._select_gen: torch.Generator | None = None

    def random_stream(self) -> torch.Generator:
        """The random floor's draws: the run's ``"select"`` stream, one generator for the whole run."""
        if self._select_gen is None:
            self._select_gen = torch.Generator().manual_seed(derive_seed("select"))
        return self._select_gen

    def prepare(self, model) -> None:
        super().prepare(model)
        self.stats = []  # per request

    def layer_tau(self, layer_idx: int, n_heads: int) -> torch.Tensor:
        if self.thresholds is not None:
            return self.thresholds[layer_idx]
        return torch.full((n_heads,), float(self.tau))

    def metrics(self, cache) -> dict[str, float]:
        out = {}
        if self.stats:
            out["density"] = sum(s["density"] for s in self.stats) / len(self.stats)
            errs = [s["out_rel_err"] for s in self.stats if "out_rel_err" in s]
            if errs:
                out["attn_out_rel_err"] = sum(errs) / len(errs)
            out["selection_overhead"] = sum(s["select_s"] for s in self.stats) / max(
                sum(s["attn_s"] for s in self.stats), 1e-9
            )
        return out


def _sale_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    method: SALEMethod = method_cache(kwargs).method
    M, N = query.shape[2], key.shape[2]
    key, value = key.to(query.dtype), value.to(query.dtype)
    if M == 1 or M != N or N <= method.min_seq_len or module.layer_idx < method.start_layer:
        return dense_causal_attention(query, key, value, scaling).transpose(1, 2).contiguous(), None
    cfg = method.cfg
    tau = method.layer_tau(module.layer_idx, query.shape[1]).to(query.device)
    t0 = time.perf_counter()
    mask, k_s = sale_block_mask(query, key, tau, cfg, scaling)
    if method.attn_implementation == "sale_pooled":
        mask = pooled_block_mask(query, key, pooled_keep_counts(mask, N, cfg), cfg).to(query.device)
    elif method.attn_implementation == "sale_random":
        n_keep = pooled_keep_counts(mask, N, cfg)
        mask = random_block_mask(mask, N, n_keep, cfg, method.random_stream()).to(query.device)
    t1 = time.perf_counter()
    out = block_sparse_attention(
        query, k_s, value, mask, cfg.block_q, cfg.block_k, causal=True, sm_scale=scaling, impl=cfg.impl
    )
    stat = {
        "layer": module.layer_idx,
        "density": block_density(mask, N, cfg.block_q, cfg.block_k),
        "select_s": t1 - t0,
        "attn_s": time.perf_counter() - t1,
    }
    if method.measure_error:
        ref = dense_causal_attention(query, key, value, scaling)
        stat["out_rel_err"] = float((out.float() - ref.float()).norm() / ref.float().norm())
    method.stats.append(stat)
    return out.transpose(1, 2).contiguous(), None


# ---- per-head threshold calibration --------------------------------------------------------------------------
def _capture_attention(module, q, k, v, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    method_cache(kwargs).method.captured.append((q, k, v, scaling))
    return dense_causal_attention(q, k, v, scaling).transpose(1, 2).contiguous(), None


class QKVCapture(KVMethod):
    """Dense attention that records every layer's post-RoPE (q, k, v, scaling) of one prefill."""

    name = attn_implementation = "sale_capture"
    attention_fn = staticmethod(_capture_attention)

    def __init__(self):
        self.captured: list[tuple] = []


@torch.no_grad()
def capture_qkv(model, input_ids: torch.Tensor) -> list[tuple]:
    """Post-RoPE (q, k, v, scaling) of every layer from one DENSE forward."""
    method = QKVCapture()
    method.prepare(model)
    cache = method.make_cache(model, input_ids.shape[1])
    model(input_ids=input_ids, cache=cache, use_cache=True, **{CACHE_KWARG: cache})
    return method.captured


@torch.no_grad()
def calibrate_thresholds(
    model,
    prompts: list[torch.Tensor],
    cfg: SALEConfig,
    theta: float,
    tau_init: float = 0.008,
    tau_floor: float = 1e-4,
    min_seq_len: int = 0,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Halve tau[l, h] until sum|O - O_dense| < theta * N on every prompt (0 = dense head below the floor).
    Heads are independent: all heads of a layer are tested at once. Prompts of <= ``min_seq_len`` tokens run
    dense (never halve). Returns (tau [N_L, H], tau after each prompt)."""
    tau = None
    history = []
    for ids in prompts:
        layers = capture_qkv(model, ids[None] if ids.dim() == 1 else ids)
        if tau is None:
            tau = torch.full((len(layers), layers[0][0].shape[1]), tau_init)
        for li, (q, k, v, scaling) in enumerate(layers if layers[0][0].shape[2] > min_seq_len else []):
            ref = dense_causal_attention(q, k, v, scaling)
            N = q.shape[2]
            while True:
                o, _ = sale_attention_core(q, k, v, tau[li], cfg, scaling)
                err = (o.float() - ref.float()).abs().sum((0, 2, 3))  # L1 over rows and dims, per head
                bad = (err >= theta * N) & (tau[li] > 0)
                if not bad.any():
                    break
                tau[li] = torch.where(bad, tau[li] / 2, tau[li])
                tau[li] = torch.where(tau[li] <= tau_floor, torch.zeros_like(tau[li]), tau[li])
        history.append(tau.clone())
    return tau, history


class SALEPrefillModule(LongContextEval):
    """A frozen causal LM whose prefill runs through SALE, its pooled baseline, or dense SDPA.

    The whole prompt (context + question) is prefilled; the answer is greedy-decoded with dense attention.
    ``calibration.theta`` set: thresholds are calibrated on the DataModule's ``calib_prompts()`` at fit start
    (the DataModule must then provide ``contract.CalibrationData``). ``measure_error``: also run dense attention
    in every SALE layer to log the output error (costs a dense pass).

    Argument groups: ``lm`` (the frozen model), ``attn`` and ``tau``, ``blocks`` (geometry), where SALE runs
    (``min_seq_len``, ``start_layer``), ``calibration``, ``evaluation``.
    """

    def __init__(
        self,
        lm: FrozenLM = TINY_LM,
        attn: Attn = "sale",
        tau: float = 0.1,
        blocks: SALEConfig = BLOCKS,
        min_seq_len: int = 1024,
        start_layer: int = 0,
        calibration: Calibration = NO_CALIBRATION,
        measure_error: bool = True,
        evaluation: EvalSettings = EVAL,
    ):
        super().__init__(lm, evaluation, query_after_compression=False)
        self.save_hyperparameters()
        blocks, calibration = (
            as_config(SALEConfig, blocks, "blocks"),
            as_config(Calibration, calibration, "calibration"),
        )
        self.cfg, self.calibration = blocks, calibration
        self.calibrates = calibration.theta is not None and attn != "sdpa"
        self.data_contract = CalibrationData if self.calibrates else LongContextData
        path = calibration.thresholds_path
        thresholds = torch.load(path) if path and calibration.theta is None else None
        self.method = SALEMethod(attn, blocks, tau, thresholds, min_seq_len, start_layer, measure_error)
        self.calib_metrics: dict[str, float] = {}

    def extra_metrics(self) -> dict[str, float]:
        return self.calib_metrics

    def on_fit_start(self) -> None:
        if not self.calibrates:
            return
        cal = self.calibration
        d = head_dim(self.lm.config)
        prompts = [
            torch.cat([p["context_ids"], p["query_ids"]]).to(self.device)
            for p in self.trainer.datamodule.calib_prompts()
        ]
        fallback = self.method.min_seq_len if cal.dense_fallback else 0
        tau, _ = calibrate_thresholds(
            self.lm, prompts, self.cfg, cal.theta * d / 128, cal.tau_init, cal.tau_floor, fallback
        )
        self.method.thresholds = tau
        self.calib_metrics = {
            "calib_mean_tau": float(tau.mean()),
            "calib_dense_heads_frac": float((tau == 0).float().mean()),
        }
        if cal.thresholds_path:
            torch.save(tau, cal.thresholds_path)


def report(result: CardResult, out_dir: Path) -> ReportExtras:
    """Card hook: density / output error / accuracy of every run, and the accuracy-vs-density figure (CPU timing:
    ``litlab bench sale_prefill``)."""
    return density_report(result, out_dir)
