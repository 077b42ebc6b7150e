"""The one error hierarchy of Osprey (data, training, evaluation, export, CLI).

Every error a user can cause derives from :class:`OspreyError`; the CLI turns these into a
one-line message and a non-zero exit instead of a stack trace. Messages say what was found,
where (file, line, shard, sample) and what to do.

Add new classes to the family they belong to; keep ``ValueError`` as a base for anything
caused by bad input or configuration so library users can catch it generically.
"""

from __future__ import annotations

__all__ = [
    "OspreyError",
    "ConfigError",
    "InputError",
    "SchemaError",
    "StoreError",
    "StoreNotFoundError",
    "StoreCorruptError",
    "ManifestMismatchError",
    "FormatVersionError",
    "StoreReadOnlyError",
    "ModelError",
    "CheckpointError",
    "BackendUnavailableError",
]


class OspreyError(Exception):
    """Base class of every error Osprey raises on purpose."""


# --- configuration and input -------------------------------------------------------------


class ConfigError(OspreyError, ValueError):
    """A config field or CLI option has a bad value or conflicts with another one."""


class InputError(OspreyError, ValueError):
    """An input file (prompts, corpus, model folder) is malformed; the message names file/line."""


class SchemaError(OspreyError, ValueError):
    """A JSON document does not match its schema in ``schemas/``."""


# --- feature stores ----------------------------------------------------------------------


class StoreError(OspreyError):
    """Base class of feature-store problems."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """No store (or no ``manifest.json``) at the given location."""


class StoreCorruptError(StoreError, ValueError):
    """A shard, chunk or table is truncated, fails its checksum or disagrees with the manifest."""


class ManifestMismatchError(StoreError, ValueError):
    """A shard, worker or build config does not belong to this store (other target or config)."""


class FormatVersionError(StoreError, ValueError):
    """The store was written by a newer (or unknown) format version."""


class StoreReadOnlyError(StoreError, PermissionError):
    """A write was attempted through a reader."""


# --- models, checkpoints, backends -------------------------------------------------------


class ModelError(OspreyError, ValueError):
    """A model folder or config cannot be used as asked (unsupported architecture, shapes)."""


class CheckpointError(OspreyError, ValueError):
    """A training checkpoint is missing, incomplete or does not match the run being resumed."""


class BackendUnavailableError(OspreyError, RuntimeError):
    """An optional backend (SGLang, CUDA, flash-attn) was requested but is not installed."""


# --- training (appended by the PRETRAIN helper) --------------------------------------------


class TrainingDivergedError(OspreyError, RuntimeError):
    """The training loss or gradient norm became NaN/inf; lower the LR or check the data."""


__all__ += ["TrainingDivergedError"]


# --- appended by the STORE helper --------------------------------------------------------


class SampleNotFoundError(StoreError, KeyError):
    """A sample id asked of a store reader is not in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


__all__ += ["SampleNotFoundError"]


# --- demo (model fetch) ------------------------------------------------------------------


class FetchError(OspreyError, RuntimeError):
    """A model could not be fetched (package registry unreachable, pip missing, bad archive)."""


__all__ += ["FetchError"]


# --- interruption --------------------------------------------------------------------------


class Interrupted(OspreyError):
    """Long work stopped on SIGINT/SIGTERM after saving what was finished (the message says what).

    The CLI exits with ``128 + signum`` (130 for Ctrl-C, 143 for SIGTERM), as a shell does for a
    process a signal ended.
    """

    def __init__(self, message: str, *, signum: int) -> None:
        super().__init__(message)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


__all__ += ["Interrupted"]


# --- studies -----------------------------------------------------------------------------


class StudyBusyError(OspreyError, RuntimeError):
    """Another ``osprey study run`` holds the study folder (one runner per folder at a time)."""


__all__ += ["StudyBusyError"]


class StageCorruptError(OspreyError, ValueError):
    """A finished study stage's output differs from the checksums its ``stage.json`` recorded."""


__all__ += ["StageCorruptError"]
