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
