"""A study's stage tables (``[prune]``, ``[pretrain]``, ``[distill]``) are the stage configs' own fields.

:func:`stage_table` makes the class of one table from the stage configs it feeds: one field per
option of those configs (:func:`osprey_data.config_fields.config_fields`: the same names as the
command line's flags, e.g. ``steps`` for ``LoopConfig.max_steps``), with the config's type,
default and docstring. Nothing is declared twice: a field added to ``DistillConfig`` is a key
of ``[distill]`` at once, with the stage's default. The options the study sets itself are not
keys: ``wired`` ones (folders, devices, resume: where and how a stage runs) are left out of the
class; ``derived`` ones (a distillation's seed comes from ``[[arms]] seeds``) are fields the
study fills in per stage but a table may not set.

A table instance is the typed settings of one stage of the plan: :meth:`StageTable.key` is what
enters its stage key (every field but the ``operational`` ones, see ``config_fields``), and
:meth:`StageTable.build` makes the stage's config from it plus the wired values. Bad values are
found when the study is loaded: :meth:`StageTable.check` builds each config with placeholder
folders (a config's ``__post_init__`` checks values; folders are checked when a stage runs).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from osprey_data.config_fields import config_fields, from_values
from osprey_data.errors import ConfigError
from osprey_train.trainer.config import config_json

__all__ = ["Source", "StageTable", "stage_table"]


@dataclass(frozen=True)
class Source:
    """A stage config that a table feeds, and which of its options the table holds."""

    cls: type
    """The stage config class (``DistillConfig``)."""
    wired: tuple[str, ...] = ()
    """Options the study sets for every stage (folders, device, resume...): not in the table."""
    only: tuple[str, ...] | None = None
    """Take just these options (None: all but ``wired``)."""
    placeholders: Mapping[str, Any] = field(default_factory=dict)
    """Values of wired options that let ``cls`` be built to check a table (never run)."""


class StageTable:
    """Base of the classes :func:`stage_table` makes."""

    SOURCES: ClassVar[tuple[Source, ...]] = ()
    DERIVED: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def table_keys(cls) -> list[str]:
        """The keys a study file may set in this table."""
        return [f.name for f in dataclasses.fields(cls) if f.name not in cls.DERIVED]  # type: ignore[arg-type]

    def _values(self, source: Source) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if f.metadata["source"] is source.cls}

    def build(self, cls: type, **wired: Any) -> Any:
        """The ``cls`` config of this table's values plus the ``wired`` option values."""
        source = next(s for s in self.SOURCES if s.cls is cls)
        return from_values(cls, {**self._values(source), **wired})

    def check(self, where: str) -> None:
        """Raise :class:`ConfigError` (prefixed with ``where``) when a config refuses the values."""
        for source in self.SOURCES:
            try:
                self.build(source.cls, **source.placeholders)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None

    def key(self) -> dict[str, Any]:
        """The values that define the stage's output (operational ones left out), JSON-ready. An
        option added after studies were run (``key_if_set`` in its config's metadata) enters the key
        only when it is set, so that the stages those studies finished keep their keys."""
        return {f.name: config_json(getattr(self, f.name)) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if not f.metadata.get("operational")
                and not (f.metadata.get("key_if_set") and getattr(self, f.name) == f.metadata.get("default"))}


def stage_table(name: str, doc: str, *sources: Source, derived: tuple[str, ...] = ()) -> type:
    """The dataclass of one stage table: the options of ``sources`` (see the module docstring)."""
    fields: list[tuple[str, Any, Any]] = []
    for source in sources:
        for c in config_fields(source.cls, exclude=source.wired, only=source.only):
            meta = {"doc": c.doc, "source": source.cls, "operational": c.metadata.get("operational", False),
                    "key_if_set": c.metadata.get("key_if_set", False), "default": c.default}
            if c.required:   # a key the table must set (``[prune] layers``)
                fields.append((c.name, c.type, field(metadata=meta)))
            else:
                fields.append((c.name, c.type, field(default_factory=lambda v=c.default: copy.copy(v),
                                                     metadata=meta)))
    names = [f[0] for f in fields]
    assert len(set(names)) == len(names), f"{name}: options repeat across sources: {names}"
    assert set(derived) <= set(names), f"{name}: derived options {set(derived) - set(names)} are not fields"
    cls = dataclasses.make_dataclass(name, fields, bases=(StageTable,), kw_only=True, frozen=True,
                                     namespace={"SOURCES": tuple(sources), "DERIVED": tuple(derived), "__doc__": doc})
    return cls
