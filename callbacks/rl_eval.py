"""``RLEvalCallback``: deterministic evaluation episodes on a separate env every ``every_n_iterations`` loop
iterations (and at the offline→online switch and the end), logged against ``env_steps``; plus periodic
``last.ckpt`` saves, since an RL run is one long epoch and ModelCheckpoint would only save at its end. Both
cadences are registered with the datamodule (``RLData.align_to``), so a module that runs several iterations
per ``training_step`` still ends one exactly there.

It reads the datamodule through the RL family's ``RLData`` contract (checked once in ``setup``) and the module
through ``ActingModule`` (``act(obs, deterministic)`` and where its offline phase ends). Evaluation episode i
starts from the reset seed ``derive_seed("eval") + i``: the same episodes for every evaluation of a run and for
every run of one run seed (a card's runs of one seed are compared on the same starts), other starts for another
run seed."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import numpy as np
import torch

from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.rl.contract import (
    ActingModule,
    RLData,
    check_acting_module,
    check_rl_data,
    evaluate,
)
from litlab.lit_modules.rl.scores import normalized_score


def logged_step(dm: RLData) -> int:
    """The logger step of what is logged after the iteration just finished: its index, ``iteration − 1`` (the
    RL modules log their training metrics at the same step, through a ``step`` entry; with one iteration per
    ``training_step`` it is also the step Lightning itself would use)."""
    return max(dm.iteration - 1, 0)


class RLEvalCallback(L.Callback):
    def __init__(
        self,
        every_n_iterations: int = 1000,
        n_episodes: int = 5,
        ref_table: str = "d4rl",
        checkpoint_every_n_iterations: int | None = 1000,
    ):
        """Logs ``eval/return``, ``eval/score`` (100 · (R − R_random)/(R_expert − R_random), ``ref_table`` for
        MuJoCo tasks: ``d4rl`` or ``ngt``), ``eval/norm_return`` (score / 100), ``eval/score_offline_end`` (at
        the switch to the online phase) and ``eval/score_auc`` (mean score over the online evaluations)."""
        if every_n_iterations < 1 or n_episodes < 1:
            raise ValueError(
                f"every_n_iterations and n_episodes must be >= 1, got {every_n_iterations}, {n_episodes}"
            )
        self.every, self.n_episodes, self.ref_table = every_n_iterations, n_episodes, ref_table
        self.eval_seed: int | None = None  # the run's ``eval`` stream, drawn in ``setup``
        self.ckpt_every = checkpoint_every_n_iterations
        self.history: list[dict[str, float]] = []
        self._online_scores: list[float] = []

    def state_dict(self) -> dict:
        return {"online_scores": list(self._online_scores)}

    def load_state_dict(self, state: dict) -> None:
        self._online_scores = [float(x) for x in state.get("online_scores", [])]

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dm = check_rl_data(trainer.datamodule, needs_offline=False, user="RLEvalCallback")
        check_acting_module(pl_module, user="RLEvalCallback")
        self.eval_seed = derive_seed("eval")
        # a module running several iterations per training_step ends them at these cadences, so the
        # evaluations and checkpoints fall on the iterations they fall on with one iteration per step
        dm.align_to(self.every)
        dm.align_to(self.ckpt_every)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        dm: RLData = trainer.datamodule
        module: ActingModule = pl_module
        it = dm.iteration
        phase_end = module.offline_iterations > 0 and it == module.offline_iterations
        if it % self.every == 0 or it == dm.total_iterations or phase_end:
            self.run_eval(trainer, pl_module, phase_end)
        if (
            self.ckpt_every
            and it % self.ckpt_every == 0
            and it < dm.total_iterations
            and trainer.checkpoint_callback
        ):
            ckpt = trainer.checkpoint_callback
            if ckpt.dirpath:
                path = str(Path(ckpt.dirpath) / f"{ckpt.CHECKPOINT_NAME_LAST}{ckpt.FILE_EXTENSION}")
                ckpt.last_model_path = (
                    path  # ModelCheckpoint then overwrites it at the end instead of writing last-v1
                )
                trainer.save_checkpoint(path)

    def run_eval(
        self, trainer: L.Trainer, pl_module: L.LightningModule, phase_end: bool = False
    ) -> dict[str, float]:
        dm: RLData = trainer.datamodule
        if self.eval_seed is None:  # called before the fit's setup (a direct call)
            self.eval_seed = derive_seed("eval")
        returns = evaluate(
            lambda o: pl_module.act(o.to(pl_module.device), deterministic=True),
            dm.env_id,
            self.n_episodes,
            self.eval_seed,
            dm.obs_scale,
            dm.env_kwargs,
        )
        ret = float(np.mean(returns))
        try:
            score = normalized_score(dm.env_id, ret, self.ref_table)
        except KeyError:
            score = math.nan
        metrics = {
            "eval/return": ret,
            "eval/return_std": float(np.std(returns)),
            "eval/score": score,
            "eval/norm_return": score / 100,
            "env_steps": float(dm.env_steps),
            "iteration": float(dm.iteration),
        }
        if phase_end:
            metrics["eval/score_offline_end"] = score
        if dm.env_steps > 0 and dm.iteration > pl_module.offline_iterations:
            self._online_scores.append(score)
            metrics["eval/score_auc"] = float(np.mean(self._online_scores))
        self.history.append(metrics)
        # straight to the loggers: an evaluation must not be dropped by log_every_n_steps
        step = logged_step(dm)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        for k, v in metrics.items():
            trainer.callback_metrics[k] = torch.tensor(v)
        return metrics
