"""The options of a typed config, read from the config class itself: the one source of every option.

A stage config is a ``@dataclass(kw_only=True)`` whose every field has a docstring (the string
literal right under it). :func:`config_fields` reads those fields into :class:`ConfigField`
rows: the option's name, where it lives in the config, its type, its default and its help (the
docstring's first paragraph). The command line (``osprey_cli.config_options``) turns the rows into
click options and a study (``osprey_train.study.config``) reads its stage tables with them, so a
field, its default and its help are written once, in the config class.

A field that holds another config dataclass (``DistillConfig.loop: LoopConfig``) is expanded:
its fields become options of the outer config, named by their own field names, with the outer
field's default (``optim = field(default_factory=distill_optim)`` gives distill its own weight
decay) as their defaults. Names must be unique across the expansion.

Per-field settings go in ``dataclasses.field(metadata={...})``, all optional:

``option``      the option's name when it differs from the field name (``max_steps`` -> ``steps``:
                flag ``--steps``, study key ``steps``);
``aliases``     more flag spellings shown in ``--help`` (``("--draft-vocab-size",)``);
``deprecated``  old flag spellings that still work but are hidden (``("--layers",)``);
``choices``     the allowed values (a click Choice on the command line);
``flag``        the click declaration of a boolean (``"--train-embeddings"``) with ``negate``
                True when the flag turns the field off;
``help``        the command-line help when the docstring does not read as one (a negated flag);
``parse``       a ``str -> value`` function for the command line (tap lists);
``hidden``      keep the option out of ``--help``;
``cli``         False: not a command-line option (set in code or by a study);
``operational`` True: the value does not change the output (a checkpoint period, a prefetch
                depth); a study leaves it out of the stage key;
``doc``         the docstring of a field of a class made in code (``dataclasses.make_dataclass``).

This module imports neither torch nor click, so reading a config costs nothing at ``--help``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigField", "config_fields", "field_docs", "from_values", "values_of", "flag_name"]

MISSING = dataclasses.MISSING


def flag_name(option: str) -> str:
    """``ttt_steps`` -> ``--ttt-steps``."""
    return "--" + option.replace("_", "-")


@dataclass(frozen=True)
class ConfigField:
    """One option of a config: a field of the class or of a config nested in it."""

    name: str
    """Option name (``steps``): the study key; ``--`` + dashes make the flag."""
    path: tuple[str, ...]
    """Attribute path inside the config (``("loop", "max_steps")``)."""
    type: Any
    """The resolved annotation (``int``, ``str | None``, ``tuple[int, ...]``, ...)."""
    default: Any
    """The default value (``dataclasses.MISSING`` when the option is required)."""
    doc: str
    """The field's whole docstring, whitespace collapsed."""
    metadata: Mapping[str, Any]
    """The field's ``metadata`` (keys listed in the module docstring)."""

    @property
    def required(self) -> bool:
        return self.default is MISSING

    @property
    def help(self) -> str:
        """Command-line help: ``metadata['help']`` or the docstring's first paragraph, without RST quotes."""
        text = self.metadata.get("help") or self.doc.split("\n\n")[0]
        return " ".join(text.replace("``", "").split())

    @property
    def flag(self) -> str:
        return flag_name(self.name)

    @property
    def optional(self) -> bool:
        """Whether None is an allowed value (``X | None``)."""
        return type(None) in typing.get_args(self.type)

    @property
    def base_type(self) -> Any:
        """The annotation without its ``| None``."""
        args = [a for a in typing.get_args(self.type) if a is not type(None)]
        if typing.get_origin(self.type) in (typing.Union, types.UnionType) and len(args) == 1:
            return args[0]
        return self.type


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> docstring of a (data)class and its bases, read from the class source with ``ast``."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):   # built in code (make_dataclass): no source, no docstrings
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


@functools.cache
def _fields(cls: type) -> tuple[ConfigField, ...]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    own: list[ConfigField] = []
    nested: list[ConfigField] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            base = _default(f)
            for sub in _fields(tp):
                default = sub.default if base is MISSING else _get(base, sub.path)
                nested.append(dataclasses.replace(sub, path=(f.name, *sub.path), default=default))
            continue
        doc = docs.get(f.name) or f.metadata.get("doc")
        if doc is None:
            raise TypeError(f"{cls.__name__}.{f.name} has no docstring: every config field documents itself")
        own.append(ConfigField(name=f.metadata.get("option", f.name), path=(f.name,), type=tp,
                               default=_default(f), doc=doc, metadata=dict(f.metadata)))
    out = tuple(own + nested)
    names = [c.name for c in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise TypeError(f"{cls.__name__}: option names {repeated} appear twice (set metadata['option'])")
    return out


def config_fields(cls: type, *, exclude: tuple[str, ...] = (), only: tuple[str, ...] | None = None
                  ) -> list[ConfigField]:
    """The options of config class ``cls`` (own fields first, then nested configs' fields), by option name."""
    rows = [c for c in _fields(cls) if c.name not in exclude and (only is None or c.name in only)]
    if only is not None:
        missing = set(only) - {c.name for c in rows}
        if missing:
            raise TypeError(f"{cls.__name__} has no options {sorted(missing)}")
        rows.sort(key=lambda c: only.index(c.name))
    return rows


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        obj = getattr(obj, name)
    return obj


def from_values(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of ``cls`` from option name -> value (missing options take their defaults).

    Nested configs are built from their options on top of the outer field's default (so a stage's
    own defaults for a nested config hold), or from scratch when that field has none.
    """
    by_name = {c.name: c for c in _fields(cls)}
    unknown = set(values) - set(by_name)
    if unknown:
        raise TypeError(f"{cls.__name__} has no options {sorted(unknown)}")
    return _build(cls, {by_name[n].path: v for n, v in values.items()})


def _build(cls: type, by_path: dict[tuple[str, ...], Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            sub = {p[1:]: v for p, v in by_path.items() if p[0] == f.name}
            base = _default(f)
            if base is MISSING:
                kwargs[f.name] = _build(hints[f.name], sub)
            elif sub:
                flat = {p: _get(base, p) for p in (c.path for c in _fields(hints[f.name]))}
                kwargs[f.name] = _build(hints[f.name], {**flat, **sub})
        elif (f.name,) in by_path:
            kwargs[f.name] = by_path[f.name,]
    return cls(**kwargs)


def values_of(config: Any, fields: list[ConfigField] | None = None) -> dict[str, Any]:
    """Option name -> value of a config instance (the inverse of :func:`from_values`)."""
    rows = fields if fields is not None else config_fields(type(config))
    return {c.name: _get(config, c.path) for c in rows}
