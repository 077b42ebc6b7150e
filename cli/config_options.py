"""Click options generated from a typed config class: a command declares no option by hand.

:class:`ConfigOptions` reads the config's fields (:func:`osprey_data.config_fields.config_fields`:
name, type, default, docstring, ``metadata``) and adds one click option per field: the flag is
the option name with dashes (``ttt_steps`` -> ``--ttt-steps``), the type comes from the
annotation, the default from the field (or from the outer field's default for a nested config),
the help from the docstring's first paragraph. After parsing, :meth:`ConfigOptions.config` turns
the parsed values back into the config. Adding a documented field to a config adds the option.

Annotation -> click: ``int``/``float``/``str`` as they are, ``Path`` a click path, ``bool`` a
flag (``--x`` when it defaults to False, ``--x/--no-x`` when True), ``tuple[T, ...]`` a
repeatable option, ``X | None`` an optional ``X``; ``metadata['choices']`` makes a Choice and
``metadata['parse']`` a parsed string (tap lists). See the module docstring of
``osprey_data.config_fields`` for every metadata key.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osprey_data.config_fields import ConfigField, config_fields, from_values
from osprey_data.errors import ConfigError
from osprey_data.progress import progress_bars

__all__ = ["ConfigOptions"]

F = TypeVar("F", bound=Callable[..., Any])
_DEPRECATED = "__deprecated"


class _Parsed(click.ParamType):
    """A string turned into a value by the field's own parser (``metadata['parse']``)."""

    def __init__(self, parse: Callable[[str], Any], name: str) -> None:
        self.parse, self.name = parse, name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


def _option_kwargs(c: ConfigField) -> tuple[list[str], dict[str, Any]]:
    """(declarations, click keyword arguments) of one field."""
    meta = c.metadata
    tp = c.base_type
    kwargs: dict[str, Any] = {"help": c.help, "hidden": bool(meta.get("hidden", False))}
    decls = [c.flag, *meta.get("aliases", ())]
    if tp is bool:
        if "flag" in meta:
            decls = [meta["flag"]]
        elif c.default is True:
            decls = [f"{c.flag}/--no-{c.flag[2:]}"]
        default = (not c.default) if meta.get("negate") else c.default
        if "/" in decls[0]:
            kwargs.update(default=default, show_default=True)
        else:
            kwargs.update(is_flag=True, default=default)
        return decls, kwargs
    if "parse" in meta:
        kwargs["type"] = _Parsed(meta["parse"], c.name.upper())
    elif "choices" in meta:
        kwargs["type"] = click.Choice(list(meta["choices"]))
    elif tp is Path:
        kwargs["type"] = click.Path(path_type=Path)
    elif typing.get_origin(tp) is tuple and typing.get_args(tp)[1:] == (Ellipsis,):
        kwargs.update(multiple=True, type=typing.get_args(tp)[0])
    elif tp in (int, float, str):
        kwargs["type"] = tp
    else:
        raise TypeError(f"option {c.name}: no command-line form for {tp!r}; set metadata cli=False or parse=...")
    if c.required:
        kwargs["required"] = True
    else:
        kwargs["default"] = c.default
        kwargs["show_default"] = c.default is not None and not kwargs.get("multiple")
    return decls, kwargs


class ConfigOptions:
    """The command-line options of config class ``cls`` (a click decorator) and the way back.

    ``exclude`` leaves options out (the command sets them itself, through ``config(..., **fixed)``);
    fields with ``metadata['cli'] = False`` are left out always.
    """

    def __init__(self, cls: type, *, exclude: tuple[str, ...] = ()) -> None:
        self.cls = cls
        self.fields = [c for c in config_fields(cls, exclude=exclude) if c.metadata.get("cli", True)]

    def __call__(self, fn: F) -> F:
        for c in reversed(self.fields):   # click lists options in decoration order
            decls, kwargs = _option_kwargs(c)
            fn = click.option(*decls, c.name, **kwargs)(fn)
            if c.metadata.get("deprecated"):
                old = {k: v for k, v in kwargs.items() if k not in ("required", "default", "show_default")}
                fn = click.option(*c.metadata["deprecated"], c.name + _DEPRECATED,
                                  **{**old, "hidden": True, "default": None})(fn)
        return fn

    def config(self, params: dict[str, Any], **fixed: Any) -> Any:
        """The config from a command's parsed ``params`` (its options are removed from it) and
        ``fixed`` option values the command computed itself."""
        ctx = click.get_current_context(silent=True)
        values: dict[str, Any] = {}
        for c in self.fields:
            value = params.pop(c.name)
            old = params.pop(c.name + _DEPRECATED, None)
            if old not in (None, ()):
                given = ctx is not None and ctx.get_parameter_source(c.name) != click.core.ParameterSource.DEFAULT
                if given:
                    raise click.UsageError(f"{c.flag} and its old name {'/'.join(c.metadata['deprecated'])} "
                                           "are the same option; give it once")
                value = old
            if c.metadata.get("negate"):
                value = not value
            values[c.name] = value
        if {**values, **fixed}.get("progress") is False and ctx is not None:
            # --no-progress: the libraries' own bars (transformers' Loading weights, Writing model
            # shards) stay off until the command's context closes, as Osprey's bars do
            ctx.with_resource(progress_bars(False))
        return from_values(self.cls, {**values, **fixed})
