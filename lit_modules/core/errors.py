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


def unavailable_cause(err: BaseException | None) -> ResourceUnavailableError | None:
    """The ``ResourceUnavailableError`` behind ``err`` (jsonargparse wraps errors raised while it builds a class)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, ResourceUnavailableError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None
