"""Every error class litlab raises on purpose, in one place. Each message names the bad value or the missing thing
and, where there is one, the command that fixes it."""

from __future__ import annotations


class ResourceUnavailableError(RuntimeError):
    """A run needs a model, data set or environment that is neither on this machine nor downloadable."""


class ModelUnavailableError(ResourceUnavailableError):
    """A model or tokenizer is neither on this machine nor downloadable from here."""


class DatasetUnavailableError(ResourceUnavailableError):
    """A data set is neither a local file nor downloadable from here."""


class EnvUnavailableError(ResourceUnavailableError):
    """An environment that needs an optional package (MuJoCo) not installed here."""


class ContractError(TypeError):
    """A class does not provide what a harness, callback or strategy needs from it (see the family's contract)."""


class CardError(ValueError):
    """A reproduction card that does not follow the schema; the message names the file and the field."""


class SweepError(ValueError):
    """A sweep file that ``litlab sweep`` cannot run."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read: truncated, corrupt, or holding objects we refuse to unpickle."""


class ConfigError(ValueError):
    """A run's config or command-line arguments that the ``litlab fit`` parser refuses; the message is its own."""


class DataFileError(ValueError):
    """A data file (e.g. a D4RL-layout HDF5) that exists but cannot be read; the message names the file."""


class RunFolderBusy(RuntimeError):
    """Another live process holds the run folder's lock; the message names its pid."""


# What ``litlab`` reports as one line and exit code 2 (the traceback only with --debug or LITLAB_DEBUG=1): the
# user's input is at fault (a config, a file, a missing model or data set, a busy run folder), not litlab.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ResourceUnavailableError,
    ConfigError,
    CardError,
    SweepError,
    CheckpointError,
    DataFileError,
    RunFolderBusy,
)


def unavailable_cause(err: BaseException | None) -> ResourceUnavailableError | None:
    """The ``ResourceUnavailableError`` behind ``err`` (jsonargparse wraps errors raised while it builds a class)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, ResourceUnavailableError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class RunStopped(RuntimeError):
    """A fit that litlab stopped on purpose, with the status ``summary.json`` records and the exit code ``litlab``
    returns (the README's run section lists them). Raised from inside the Trainer, so every callback's
    ``on_exception`` sees it and the run's last good checkpoint stays as it was."""

    exit_code = 1

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status or f"failed: {type(self).__name__}: {message}"


class RunDiverged(RunStopped):
    """The training loss or a logged metric became NaN or infinite; status ``diverged: <metric> at step N``."""

    exit_code = 4


class RunPreempted(RunStopped):
    """SIGTERM or SIGUSR1 (a scheduler's preemption): a checkpoint was written at the current step; status
    ``preempted: <signal> at step N``; exit code 128 + the signal's number (143 for SIGTERM), as a shell reports
    a process the signal ended."""

    def __init__(self, message: str, status: str, signal_number: int):
        super().__init__(message, status)
        self.exit_code = 128 + signal_number


class RunIOError(RunStopped):
    """A checkpoint, log or summary that could not be written (no space, read-only, quota); the message names the
    file and the cause."""

    exit_code = 74  # EX_IOERR (sysexits.h)


class CheckpointWriteError(RunIOError, CheckpointError):
    """A checkpoint that could not be written: torch raises ``RuntimeError`` for a full disk, not ``OSError``."""


class RunFailed(RuntimeError):
    """A card's run ended without a result (failed, diverged, preempted): the card records no number for it."""
