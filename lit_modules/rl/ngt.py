"""NGT — Noise-Guided Transport: imitation from a handful of expert transitions with a random-prior potential.

"Noise-Guided Transport: Imitation Learning from Random Priors" (Blondé et al., ICML 2026; arXiv 2509.26294),
following its released code (github.com/lionelblonde/ngt, ``conf/base.yml``, ``src/agents``) where the paper's
body could not be read. A frozen random prior f† and a trainable predictor f (both spectrally normalised,
orthogonally initialised, so h is ≈ 1-Lipschitz) define h(x) = criterion(f(x), f†(x)); the predictor minimises
E_expert[h] − λ_adv E_agent[h] (the Kantorovich–Rubinstein dual of W1, no gradient penalty), and SAC (Haarnoja
et al., arXiv 1801.01290) learns from the shaped reward r(h), recomputed for every replay batch with the
current predictor.

Baselines from the same objective: ``adv_scale=0`` is RED (random expert distillation, Wang et al., arXiv
1905.06750: the agent batch gives no gradient); ``BehaviorCloning`` fits the policy to the expert transitions
alone. DAC/W-DAC/PWIL/IQ-Learn are not implemented. Reconstructed: the exact "20 transitions" setting (chosen:
1 demo, subsampling 10).
"""

from __future__ import annotations

import copy
from typing import Literal

import torch

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.rl.module import RLModule, adam, drawn_from
from litlab.lit_modules.rl.nets import RunningNorm, TanhGaussianActor, TwinCritic
from litlab.lit_modules.rl.random_prior import RandomPriorPotential, RewardShaper
from litlab.lit_modules.rl.sac import actor_loss_per_sample, critic_loss, polyak_update, temperature_loss

TEMPERATURES = ("softplus", "exp")


def sac_temperature(log_alpha: torch.Tensor, parameterisation: str) -> torch.Tensor:
    """α from its trained parameter θ: softplus(θ) + 1e-10 (the released code) or exp(θ)."""
    if parameterisation == "softplus":
        return torch.nn.functional.softplus(log_alpha) + 1e-10
    if parameterisation == "exp":
        return log_alpha.exp()
    raise ValueError(f"temperature={parameterisation!r} is not one of {', '.join(TEMPERATURES)}")


def sac_temperature_loss(
    log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float, parameterisation: str
) -> torch.Tensor:
    """The temperature's loss: α(θ)·(−log π − H̄) with the gradient through softplus (released code), or the
    log-α form −θ·(log π + H̄) (``sac.temperature_loss``)."""
    if parameterisation == "exp":
        return temperature_loss(log_alpha, logp, target_entropy)
    return (sac_temperature(log_alpha, parameterisation) * (-logp.detach() - target_entropy)).mean()


@config_part
class RewardModel:
    """The potential h and its reward. ``input_mode``: x = [s; a] (``sa``) or state-only [s; s'] (``ss``);
    prior and predictor are LeakyReLU MLPs of widths ``hidden`` with ``out_emb_dim`` outputs, compared by
    ``criterion`` (``huber``, or ``hl_gauss`` with a support of radius ``hlg_radius`` in ``hlg_bins`` bins);
    ``shaping`` maps h to the reward (``symexp``: the code's default; ``exp``: the arXiv v1 formula exp(−h));
    ``lr``: the predictor's Adam learning rate; ``prior_init``: ``orthogonal`` (the paper: orthogonal init under
    spectral norm, the 1-Lipschitz argument) or ``released`` (the released code: its orthogonal init never reaches
    the spectrally normalised weights, so both nets keep PyTorch's default init divided by σ, and the prior keeps
    power-iterating; ``random_prior.released_mlp``)."""

    input_mode: Literal["sa", "ss"] = "sa"
    hidden: tuple[int, ...] = (128, 128, 128)
    out_emb_dim: int = 64
    criterion: Literal["huber", "hl_gauss"] = "huber"
    hlg_radius: float = 3.0
    hlg_bins: int = 21
    shaping: Literal["exp", "symexp", "linear"] = "symexp"
    prior_spectral_norm: bool = True
    predictor_spectral_norm: bool = True
    lr: float = 5e-5
    prior_init: Literal["orthogonal", "released"] = "orthogonal"


@config_part
class SACSettings:
    """The SAC learner: actor and twin critics of widths ``hidden`` (LayerNorm + SiLU, head gain 1e-3, as the
    code), learning rates, initial temperature α₀, discount, Polyak rate, gradient-norm clip of actor and
    critic, and ``obs_norm`` (running mean/std of observations shared by reward nets, actor and critics: the
    code's default; the CPU config scales inputs by fixed ranges instead, data.obs_scale). ``temperature``: α =
    softplus(θ) + 1e-10 with the loss α·(−log π − H̄) (``softplus``: the released code, ``Agent.alpha``; the
    paper's text does not say) or α = exp(θ) with the loss −θ·(log π + H̄) (``exp``: the SAC paper's log-α
    form, this platform's earlier default); θ starts at log ``alpha_init`` either way (so α₀ = 0.182 with
    softplus)."""

    hidden: tuple[int, ...] = (256, 256)
    actor_lr: float = 1e-4
    critic_lr: float = 2e-4
    alpha_lr: float = 3e-4
    alpha_init: float = 0.2
    gamma: float = 0.99
    polyak: float = 0.005
    clip_norm: float = 20.0
    obs_norm: bool = False
    temperature: Literal["softplus", "exp"] = "softplus"


@config_part
class Schedule:
    """The run's env steps (each with one update of every net once learning has started), agent rows per
    batch, expert rows per reward step (at most the expert set's size), and the uniform-random env steps before
    learning starts."""

    env_steps: int = 1_000_000
    batch_size: int = 256
    expert_batch_size: int = 256
    learning_starts: int = 2500


REWARD_MODEL, SAC_SETTINGS, SCHEDULE = RewardModel(), SACSettings(), Schedule()


class NGT(RLModule):
    def __init__(
        self,
        adv_scale: float = 1.0,
        reward_source: Literal["potential", "env"] = "potential",
        reward_model: RewardModel = REWARD_MODEL,
        sac: SACSettings = SAC_SETTINGS,
        schedule: Schedule = SCHEDULE,
        log_every: int = 50,
        steps_per_batch: int = 16,
        obs_dim: int | None = None,
        act_dim: int | None = None,
    ):
        """``adv_scale``: λ_adv, the weight of the agent term of the reward objective (0: RED);
        ``reward_source``: ``potential`` (the imitation reward shaping(h)) or ``env`` (the ceiling: the same SAC
        learner on the environment's true reward, an oracle the imitation methods never see);
        ``log_every``: env steps between training logs; ``steps_per_batch``: env steps (each with its updates)
        per ``training_step`` (``RLModule.training_step``; the numbers do not depend on it)."""
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.reward_model = as_config(RewardModel, reward_model, "NGT.reward_model")
        self.sac = as_config(SACSettings, sac, "NGT.sac")
        self.schedule = as_config(Schedule, schedule, "NGT.schedule")
        if adv_scale < 0:
            raise ValueError(f"adv_scale must be >= 0, got {adv_scale}")
        if reward_source not in ("potential", "env"):
            raise ValueError(f"reward_source={reward_source!r} is not one of potential, env")
        if self.sac.temperature not in TEMPERATURES:
            raise ValueError(
                f"sac.temperature={self.sac.temperature!r} is not one of {', '.join(TEMPERATURES)}"
            )
        if self.schedule.env_steps < 0:
            raise ValueError(f"schedule.env_steps must be >= 0, got {self.schedule.env_steps}")
        self.online_iterations = self.schedule.env_steps  # no offline phase: the demos are only sampled
        if obs_dim is not None and act_dim is not None:
            self.build(obs_dim, act_dim)

    def build(self, obs_dim: int, act_dim: int) -> None:
        rw, sac = self.reward_model, self.sac
        in_dim = obs_dim + (act_dim if rw.input_mode == "sa" else obs_dim)
        with drawn_from("init"):  # the trainable nets; the frozen prior f† from its own stream
            self.reward_net = RandomPriorPotential(
                in_dim,
                list(rw.hidden),
                rw.out_emb_dim,
                rw.criterion,
                rw.hlg_radius,
                rw.hlg_bins,
                prior_spectral_norm=rw.prior_spectral_norm,
                predictor_spectral_norm=rw.predictor_spectral_norm,
                prior_seed=derive_seed("prior"),
                prior_init=rw.prior_init,
            )
            sac_kw = dict(layer_norm=True, activation="silu", head_gain=1e-3)  # the code's SAC nets
            self.actor = TanhGaussianActor(obs_dim, act_dim, list(sac.hidden), **sac_kw)
            self.critic = TwinCritic(obs_dim, act_dim, list(sac.hidden), **sac_kw)
        self.shaper = RewardShaper(rw.shaping)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.nn.Parameter(torch.tensor(float(sac.alpha_init)).log())
        self.obs_rms = RunningNorm(obs_dim) if sac.obs_norm else None
        self.target_entropy = -float(act_dim)
        self.dims = (obs_dim, act_dim)

    def configure_optimizers(self):
        rw, sac = self.reward_model, self.sac
        return [
            adam(self.reward_net.predictor.parameters(), rw.lr),
            adam(self.critic.parameters(), sac.critic_lr),
            adam(self.actor.parameters(), sac.actor_lr),
            adam([self.log_alpha], sac.alpha_lr),
        ]

    def norm(self, obs: torch.Tensor) -> torch.Tensor:
        return self.obs_rms(obs) if self.obs_rms is not None else obs

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self.actor.act(self.norm(obs), deterministic)

    def reward_input(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        second = batch["act"] if self.reward_model.input_mode == "sa" else self.norm(batch["next_obs"])
        return torch.cat([self.norm(batch["obs"]), second], -1)

    def reward_loss(self, expert: dict[str, torch.Tensor], agent: dict[str, torch.Tensor]) -> torch.Tensor:
        """L(ξ) = mean_{B_E} h_ξ − λ_adv · mean_{B_β} h_ξ (λ_adv = 0: RED)."""
        x_expert = self.reward_input(expert)
        if self.hparams.adv_scale == 0:
            return self.reward_net.potential(x_expert).mean()
        h = self.reward_net.potential(torch.cat([x_expert, self.reward_input(agent)]))  # one forward for both
        return h[: len(x_expert)].mean() - self.hparams.adv_scale * h[len(x_expert) :].mean()

    @torch.no_grad()
    def reward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """r = shaping(h(x)) with the current predictor, for every sampled batch (never stored)."""
        return self.shaper(self.reward_net.potential(self.reward_input(batch)).squeeze(-1))

    def critic_reward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The reward SAC's critic learns from: the potential's, or the env's stored one for the ceiling."""
        return batch["rew"] if self.hparams.reward_source == "env" else self.reward(batch)

    def run_iteration(self, idx: int) -> None:
        """One env step, then (after the random warm-up) one predictor, critic, actor and temperature step, as
        the released code's ``orchestrator.train``."""
        hp, dm, sched = self.hparams, self.data, self.schedule
        starts = 0 if self.trainer.fast_dev_run else sched.learning_starts  # a smoke run exercises the update
        random_phase = dm.env_steps < starts
        dm.collect(None if random_phase else (lambda o: self.act(o.to(self.device))))
        if self.obs_rms is not None:
            self.obs_rms.update(dm.last_transition()["obs"].to(self.device))
        if dm.env_steps <= starts:
            dm.finish_iteration(idx)
            return
        opt_reward, opt_critic, opt_actor, opt_alpha = self.optimizers()
        agent = dm.sample_online(sched.batch_size, self.device)
        expert = dm.sample_offline(min(sched.expert_batch_size, dm.offline_size), self.device)
        loss_r = self.reward_loss(expert, agent)
        self.step_optimizers([(opt_reward, loss_r, None)])
        batch = dm.sample_online(
            sched.batch_size, self.device
        )  # fresh batch, rewarded by the updated predictor
        reward = self.critic_reward(batch)
        alpha = sac_temperature(self.log_alpha, self.sac.temperature).detach()
        normed = {**batch, "obs": self.norm(batch["obs"]), "next_obs": self.norm(batch["next_obs"])}
        loss_q = critic_loss(
            self.critic, self.critic_target, self.actor, normed, reward, alpha, self.sac.gamma
        )
        self.step_optimizers([(opt_critic, loss_q, self.sac.clip_norm)])
        polyak_update(self.critic, self.critic_target, self.sac.polyak)
        loss_pi, logp = actor_loss_per_sample(self.actor, self.critic, normed["obs"], alpha)
        # α is detached in the actor loss and log π in the temperature loss: disjoint gradients, one backward
        # (the actor loss's gradient on the critic is cleared before the next critic step)
        loss_alpha = sac_temperature_loss(self.log_alpha, logp, self.target_entropy, self.sac.temperature)
        self.step_optimizers([(opt_actor, loss_pi.mean(), self.sac.clip_norm), (opt_alpha, loss_alpha, None)])
        dm.finish_iteration(idx)
        if (idx + 1) % hp.log_every == 0:
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
                "step": float(idx),  # the logger's x-axis: the iteration, not the training_step
            }
            if dm.episodes:
                logs["train/episode_return"] = dm.last_episode_return
            self.log_dict(logs)


class BehaviorCloning(RLModule):
    """The behaviour-cloning baseline of NGT (arXiv 2509.26294): maximum likelihood of the expert actions,
    ``steps`` gradient steps on the offline data, one per loop iteration and one iteration per ``training_step``
    (automatic optimisation); no env steps."""

    def __init__(
        self,
        hidden: tuple[int, ...] = (256, 256),
        lr: float = 1e-3,
        batch_size: int = 256,
        steps: int = 2000,
        log_every: int = 50,
        obs_dim: int | None = None,
        act_dim: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        self.offline_iterations = int(steps)  # offline only: the loop ends where its offline phase does
        if obs_dim is not None and act_dim is not None:
            self.build(obs_dim, act_dim)

    def build(self, obs_dim: int, act_dim: int) -> None:
        with drawn_from("init"):
            self.actor = TanhGaussianActor(
                obs_dim, act_dim, list(self.hparams.hidden), layer_norm=True, activation="silu"
            )
        self.dims = (obs_dim, act_dim)

    def configure_optimizers(self):
        return adam(self.actor.parameters(), self.hparams.lr)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self.actor.act(obs, deterministic)

    def training_step(self, idx, batch_idx: int) -> torch.Tensor:
        dm = self.data
        batch = dm.sample_offline(min(self.hparams.batch_size, dm.offline_size), self.device)
        loss = -self.actor.log_prob(batch["obs"], batch["act"]).mean()
        dm.finish_iteration(idx)
        if (int(idx) + 1) % self.hparams.log_every == 0:
            self.log_dict({"train/loss_bc": loss, "env_steps": float(dm.env_steps)})
        return loss
