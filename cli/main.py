"""Entry point of the ``osprey`` command.

Subcommands live one concept per file in this folder and are imported lazily, so that
``osprey --help`` does not pay for importing torch and transformers. Each command parses its
options into a typed config and calls one library ``run(config)``; errors derived from
:class:`osprey_data.errors.OspreyError` become a one-line message and exit code 2.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from osprey_data.errors import OspreyError

__all__ = ["main", "cli", "COMMANDS"]

# group -> command name -> "module:attribute" of a click.Command.
COMMANDS: dict[str, dict[str, str]] = {
    "data": {
        "build": "osprey_cli.build_cmd:build",
        "validate": "osprey_cli.store_cmds:validate",
        "inspect": "osprey_cli.store_cmds:inspect",
        "merge": "osprey_cli.store_cmds:merge",
        "tokenize-corpus": "osprey_cli.corpus_cmd:tokenize_corpus",
    },
    "train": {
        "prune": "osprey_cli.model_cmds:prune",
        "convert": "osprey_cli.model_cmds:convert",
        "pretrain": "osprey_cli.pretrain_cmd:pretrain",
        "distill": "osprey_cli.distill_cmd:distill",
    },
    "eval": {
        "acceptance": "osprey_cli.eval_cmds:acceptance",
        "matrix": "osprey_cli.eval_cmds:matrix",
        "live": "osprey_cli.live_cmd:live",
    },
    "": {
        "export": "osprey_cli.export_cmd:export",
        "demo": "osprey_cli.demo_cmd:demo",
    },
}

_GROUP_HELP = {
    "data": "Build, validate, inspect and merge feature stores; tokenize pretraining corpora.",
    "train": "Stage 1 prune, Stage 2 pretrain, Stage 3 convert, Stage 4 distill.",
    "eval": "Offline acceptance length, cross-domain matrices, live speculative decoding.",
}


def _load(spec: str) -> click.Command:
    module_name, attr = spec.split(":")
    return getattr(importlib.import_module(module_name), attr)


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when listed help or invoked."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            return _load(self._lazy[cmd_name])
        return super().get_command(ctx, cmd_name)


class OspreyCLI(LazyGroup):
    """Root group: turns Osprey's own errors into one readable line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OspreyError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)


@click.group(cls=OspreyCLI, lazy=COMMANDS[""])
@click.version_option(package_name="osprey")
def cli() -> None:
    """Osprey: target-agnostic pre-trained drafters for speculative decoding."""


for _group_name, _commands in COMMANDS.items():
    if _group_name:
        cli.add_command(LazyGroup(name=_group_name, lazy=_commands, help=_GROUP_HELP[_group_name]))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="osprey")


if __name__ == "__main__":
    main()
