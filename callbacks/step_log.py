"""A checkpoint written inside a training step's ``on_train_batch_end`` carries that step's logged row with it.

ModelCheckpoint's mid-epoch saves (``every_n_train_steps``) and ``PreemptionCheckpoint`` write the state after step
N in ``on_train_batch_end``, but Lightning (2.6, ``_TrainingEpochLoop.advance``) hands step N's metrics to the
loggers only after that hook. A run killed in between resumed at step N + 1 and never logged step N: its
``train/loss`` row was lost for good (issue 31). ``log_step_before_checkpoint`` logs the row before the file is
written, and Lightning's own call for that batch then logs only what the LightningModule's ``on_train_batch_end``
added after the checkpoint (LoRDO's communication counters, lock-in's probes), so no metric is logged twice.
``tests/test_run_faults.py`` kills a run right after such a checkpoint and checks the row is on disk.
"""

from __future__ import annotations

import lightning as L


def _inside_train_batch_end(trainer: L.Trainer) -> bool:
    """Between ``increment_processed`` and ``increment_completed`` of the epoch loop: a batch trained, not logged."""
    if not trainer.training or trainer.sanity_checking:
        return False
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    return progress.processed == progress.completed + 1


def log_step_before_checkpoint(trainer: L.Trainer) -> None:
    """Log the current step's row now if a checkpoint is being written inside ``on_train_batch_end``."""
    connector = trainer._logger_connector
    if (
        not trainer.loggers
        or not _inside_train_batch_end(trainer)
        or "update_train_step_metrics" in vars(connector)
    ):
        return  # no logger, not inside a step, or this step's row is already out (a second checkpoint callback)
    # Lightning's own rule (LoggerConnector.update_train_step_metrics): every log_every_n_steps, never mid-accumulation
    accumulating = trainer.fit_loop._should_accumulate() and trainer.lightning_module.automatic_optimization
    logs_now = not accumulating and (connector.should_update_logs or bool(trainer.fast_dev_run))
    logged = set(connector.metrics["log"]) if logs_now else set()
    if logs_now:
        connector.log_metrics(connector.metrics["log"])

    def log_the_rest() -> (
        None
    ):  # Lightning's call for this batch, after the LightningModule's on_train_batch_end
        del connector.update_train_step_metrics  # Lightning's own method again from the next batch on
        if not logs_now:
            connector.update_train_step_metrics()
            return
        late = {k: v for k, v in connector.metrics["log"].items() if k not in logged}
        if late:
            connector.log_metrics(late)

    connector.update_train_step_metrics = log_the_rest  # type: ignore[method-assign]
