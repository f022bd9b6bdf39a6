"""NGT — Noise-Guided Transport: imitation from a handful of expert transitions with a random-prior potential
(ngt.md). A frozen random prior f† and a trainable predictor f (both spectrally normalised, orthogonally
initialised, so h is ≈ 1-Lipschitz) define h(x) = criterion(f(x), f†(x)); the predictor minimises
E_expert[h] − λ_adv E_agent[h] (§3.4, the Kantorovich–Rubinstein dual of W1, no gradient penalty), and SAC learns
from the shaped reward r(h), recomputed for every replay batch with the current predictor (§3.5–3.6).

Baselines from the same objective: ``adv_scale=0`` is RED (random expert distillation: the agent batch gives no
gradient); ``BehaviorCloning`` fits the policy to the expert transitions alone. DAC/W-DAC/PWIL/IQ-Learn are
not implemented. Reconstructed [R]: the exact "20 transitions" setting (1 demo, subsampling 10, ngt.md §3.7).
"""

from __future__ import annotations

import copy
from typing import Literal

import lightning as L
import torch
from litlab.lit_modules.rl.nets import RunningNorm, TanhGaussianActor, TwinCritic
from litlab.lit_modules.rl.random_prior import RandomPriorPotential, RewardShaper
from litlab.lit_modules.rl.sac import actor_loss_per_sample, critic_loss, polyak_update, temperature_loss


class NGT(L.LightningModule):
    def __init__(
        self,
        input_mode: Literal["sa", "ss"] = "sa",
        reward_hidden: list[int] = [128, 128, 128],  # noqa: B006
        out_emb_dim: int = 64,
        criterion: Literal["huber", "hl_gauss"] = "huber",
        hlg_radius: float = 3.0,
        hlg_bins: int = 21,
        reward_shaping: Literal["exp", "symexp", "linear"] = "symexp",
        adv_scale: float = 1.0,
        prior_spectral_norm: bool = True,
        predictor_spectral_norm: bool = True,
        reward_lr: float = 5e-5,
        actor_lr: float = 1e-4,
        critic_lr: float = 2e-4,
        alpha_lr: float = 3e-4,
        alpha_init: float = 0.2,
        gamma: float = 0.99,
        polyak: float = 0.005,
        batch_size: int = 256,
        expert_batch_size: int = 256,
        learning_starts: int = 2500,
        clip_norm: float = 20.0,
        hidden: list[int] = [256, 256],
        obs_norm: bool = False,
        log_every: int = 50,  # noqa: B006
        obs_dim: int | None = None,
        act_dim: int | None = None,
    ):
        """``obs_norm``: running mean/std of observations shared by reward nets, actor and critics (the code's
        default; the CPU config scales inputs by fixed ranges instead, data.obs_scale)."""
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        if adv_scale < 0:
            raise ValueError(f"adv_scale must be >= 0, got {adv_scale}")
        if obs_dim is not None and act_dim is not None:
            self.build(obs_dim, act_dim)

    def build(self, obs_dim: int, act_dim: int) -> None:
        hp = self.hparams
        in_dim = obs_dim + (act_dim if hp.input_mode == "sa" else obs_dim)
        self.reward_net = RandomPriorPotential(
            in_dim,
            hp.reward_hidden,
            hp.out_emb_dim,
            hp.criterion,
            hp.hlg_radius,
            hp.hlg_bins,
            prior_spectral_norm=hp.prior_spectral_norm,
            predictor_spectral_norm=hp.predictor_spectral_norm,
        )
        self.shaper = RewardShaper(hp.reward_shaping)
        sac_kw = dict(layer_norm=True, activation="silu", head_gain=1e-3)  # ngt.md §3.2
        self.actor = TanhGaussianActor(obs_dim, act_dim, hp.hidden, **sac_kw)
        self.critic = TwinCritic(obs_dim, act_dim, hp.hidden, **sac_kw)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.nn.Parameter(torch.tensor(float(hp.alpha_init)).log())
        self.obs_rms = RunningNorm(obs_dim) if hp.obs_norm else None
        self.target_entropy = -float(act_dim)

    def setup(self, stage: str) -> None:
        if not hasattr(self, "actor"):
            dm = self.trainer.datamodule
            self.build(dm.obs_dim, dm.act_dim)

    def configure_optimizers(self):
        hp = self.hparams
        return [
            torch.optim.Adam(self.reward_net.predictor.parameters(), lr=hp.reward_lr),
            torch.optim.Adam(self.critic.parameters(), lr=hp.critic_lr),
            torch.optim.Adam(self.actor.parameters(), lr=hp.actor_lr),
            torch.optim.Adam([self.log_alpha], lr=hp.alpha_lr),
        ]

    def norm(self, obs: torch.Tensor) -> torch.Tensor:
        return self.obs_rms(obs) if self.obs_rms is not None else obs

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self.actor.act(self.norm(obs), deterministic)

    def reward_input(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        second = batch["act"] if self.hparams.input_mode == "sa" else self.norm(batch["next_obs"])
        return torch.cat([self.norm(batch["obs"]), second], -1)

    def reward_loss(self, expert: dict[str, torch.Tensor], agent: dict[str, torch.Tensor]) -> torch.Tensor:
        """§3.4: L(ξ) = mean_{B_E} h_ξ − λ_adv · mean_{B_β} h_ξ (λ_adv = 0: RED)."""
        x_expert = self.reward_input(expert)
        if self.hparams.adv_scale == 0:
            return self.reward_net.potential(x_expert).mean()
        h = self.reward_net.potential(torch.cat([x_expert, self.reward_input(agent)]))  # one forward for both
        return h[: len(x_expert)].mean() - self.hparams.adv_scale * h[len(x_expert) :].mean()

    @torch.no_grad()
    def reward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """§3.5: r = shaping(h(x)) with the current predictor, for every sampled batch (never stored)."""
        return self.shaper(self.reward_net.potential(self.reward_input(batch)).squeeze(-1))

    def _step(self, opt, loss: torch.Tensor, clip: bool = False) -> None:
        opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if clip:
            self.clip_gradients(opt, gradient_clip_val=self.hparams.clip_norm, gradient_clip_algorithm="norm")
        opt.step()

    def training_step(self, idx, batch_idx: int) -> None:
        hp, dm = self.hparams, self.trainer.datamodule
        starts = (
            0 if self.trainer.fast_dev_run else hp.learning_starts
        )  # a smoke run still exercises the update
        random_phase = dm.env_steps < starts
        dm.collect(None if random_phase else (lambda o: self.act(o.to(self.device))))
        if self.obs_rms is not None:
            self.obs_rms.update(
                dm.online.data["obs"][(dm.online.ptr - 1) % dm.online.capacity].to(self.device)
            )
        if dm.env_steps <= starts:
            dm.finish_iteration(idx)
            return
        opt_reward, opt_critic, opt_actor, opt_alpha = self.optimizers()
        agent = dm.sample_online(hp.batch_size, self.device)
        expert = dm.sample_offline(min(hp.expert_batch_size, dm.offline_size), self.device)
        loss_r = self.reward_loss(expert, agent)
        self._step(opt_reward, loss_r)
        batch = dm.sample_online(hp.batch_size, self.device)  # fresh batch, rewarded by the updated predictor
        reward = self.reward(batch)
        alpha = self.log_alpha.exp().detach()
        normed = {**batch, "obs": self.norm(batch["obs"]), "next_obs": self.norm(batch["next_obs"])}
        loss_q = critic_loss(self.critic, self.critic_target, self.actor, normed, reward, alpha, hp.gamma)
        self._step(opt_critic, loss_q, clip=True)
        polyak_update(self.critic, self.critic_target, hp.polyak)
        loss_pi, logp = actor_loss_per_sample(self.actor, self.critic, normed["obs"], alpha)
        self._step(opt_actor, loss_pi.mean(), clip=True)
        self._step(opt_alpha, temperature_loss(self.log_alpha, logp, self.target_entropy))
        dm.finish_iteration(idx)
        if (batch_idx + 1) % hp.log_every == 0:
            with torch.no_grad():
                h_expert = self.reward_net.potential(self.reward_input(expert)).mean()
                h_agent = self.reward_net.potential(self.reward_input(agent)).mean()
            logs = {
                "train/loss_reward": loss_r,
                "train/loss_critic": loss_q,
                "train/loss_actor": loss_pi.mean(),
                "train/alpha": alpha,
                "train/reward_mean": reward.mean(),
                "ngt/h_expert": h_expert,
                "ngt/h_agent": h_agent,
                "ngt/h_gap": h_agent - h_expert,
                "env_steps": float(dm.env_steps),
            }
            if dm.collector.episodes:
                logs["train/episode_return"] = dm.collector.last_episode_return
            self.log_dict(logs)


class BehaviorCloning(L.LightningModule):
    """BC baseline (ngt.md §6 (d)): maximum likelihood of the expert actions, one step per loop iteration; no env
    steps (the data module's ``n_offline_steps`` sets the budget)."""

    def __init__(
        self,
        hidden: list[int] = [256, 256],
        lr: float = 1e-3,
        batch_size: int = 256,  # noqa: B006
        log_every: int = 50,
        obs_dim: int | None = None,
        act_dim: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if obs_dim is not None and act_dim is not None:
            self.actor = TanhGaussianActor(obs_dim, act_dim, hidden, layer_norm=True, activation="silu")

    def setup(self, stage: str) -> None:
        if not hasattr(self, "actor"):
            dm = self.trainer.datamodule
            self.actor = TanhGaussianActor(
                dm.obs_dim, dm.act_dim, self.hparams.hidden, layer_norm=True, activation="silu"
            )

    def configure_optimizers(self):
        return torch.optim.Adam(self.actor.parameters(), lr=self.hparams.lr)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self.actor.act(obs, deterministic)

    def training_step(self, idx, batch_idx: int) -> torch.Tensor:
        dm = self.trainer.datamodule
        batch = dm.sample_offline(min(self.hparams.batch_size, dm.offline_size), self.device)
        loss = -self.actor.log_prob(batch["obs"], batch["act"]).mean()
        dm.finish_iteration(idx)
        if (batch_idx + 1) % self.hparams.log_every == 0:
            self.log_dict({"train/loss_bc": loss, "env_steps": float(dm.env_steps)})
        return loss


def report(res: dict, out_dir) -> dict:
    """repro report hook: normalised return against env steps for every run."""
    from litlab.lit_modules.rl.report import plot_learning_curves

    return plot_learning_curves(
        res, out_dir, "ngt", metric="eval/norm_return", extra_numbers=("eval/score_auc",)
    )
