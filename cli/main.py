"""Entry point of the ``osprey`` command.

Subcommands live one concept per file in this folder and are imported lazily, so that
``osprey --help`` does not pay for importing torch and transformers. Each command parses its
options into a typed config and calls one library ``run(config)``.

Exit codes, the same for every command: 0 success; 1 a check found problems (``osprey data
validate``); 2 a usage or input error — a bad option, a missing or malformed file, a damaged
store, an unreadable path — printed as one line ``error: ...`` (OspreyError and OSError);
128 + N stopped by signal N after saving finished work (130 Ctrl-C, 143 SIGTERM).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from osprey_data.errors import Interrupted, OspreyError
from osprey_data.text import printable

__all__ = ["main", "cli", "COMMANDS"]

# group -> command name -> "module:attribute" of a click.Command.
COMMANDS: dict[str, dict[str, str]] = {
    "data": {
        "build": "osprey_cli.build_cmd:build",
        "validate": "osprey_cli.store_cmds:validate",
        "inspect": "osprey_cli.store_cmds:inspect",
        "show": "osprey_cli.show_cmd:show",
        "merge": "osprey_cli.store_cmds:merge",
        "verify": "osprey_cli.store_cmds:verify",
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
        "sweep": "osprey_cli.eval_cmds:sweep",
        "live": "osprey_cli.live_cmd:live",
        "engine": "osprey_cli.engine_cmd:engine",
    },
    "study": {
        "run": "osprey_cli.study_cmd:run",
        "status": "osprey_cli.study_cmd:status",
        "report": "osprey_cli.study_cmd:report",
    },
    "": {
        "export": "osprey_cli.export_cmd:export",
        "demo": "osprey_cli.demo_cmd:demo",
        "fetch-model": "osprey_cli.fetch_cmd:fetch_model",
    },
}

_GROUP_HELP = {
    "data": "Build, validate, verify, inspect, show and merge feature stores; tokenize pretraining corpora.",
    "train": "Stage 1 prune, Stage 2 pretrain, Stage 3 convert, Stage 4 distill.",
    "eval": "Offline acceptance length (chains, trees, tree-shape sweeps), cross-domain matrices, live decoding, engines.",
    "study": "Declarative, resumable comparisons of drafters (every stage, matrices, the paper's claims).",
}


def _load(spec: str) -> click.Command:
    module_name, attr = spec.split(":")
    return getattr(importlib.import_module(module_name), attr)


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when listed help or invoked."""

    def __init__(self, *args: Any, lazy: dict[str, str | click.Command] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # name -> "module:attribute" to import on first use, or a command already built (the
        # subgroups, which import nothing until their own commands are asked for)
        self._lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            entry = self._lazy[cmd_name]
            return entry if isinstance(entry, click.Command) else _load(entry)
        return super().get_command(ctx, cmd_name)


def os_error_line(exc: OSError) -> str:
    """One line naming the path and what went wrong (``[Errno 28] No space left on device``)."""
    paths = [p for p in (exc.filename, exc.filename2) if p is not None]
    what = exc.strerror or exc.__class__.__name__
    where = " -> ".join(printable(str(p)) for p in paths)
    return f"{where}: {what}" if where else f"{what}: {printable(str(exc))}"


class OspreyCLI(LazyGroup):
    """Root group: Osprey's errors and OS errors become one readable line and exit code 2; an
    interrupted command says what it saved and exits with 128 + the signal number."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Interrupted as exc:
            click.echo(f"interrupted: {printable(exc)}", err=True)
            ctx.exit(exc.exit_code)
        except OspreyError as exc:
            click.echo(f"error: {printable(exc)}", err=True)
            ctx.exit(2)
        except OSError as exc:  # a full disk, a permission, a vanished file: name it, no traceback
            click.echo(f"error: {os_error_line(exc)}", err=True)
            ctx.exit(2)


# The subgroups join the root through its lazy table, not add_command: the root's `commands` dict
# then stays empty, so whatever lists the tree goes through list_commands and sees every command.
# mkdocs-click, which rendered docs/cli.md before osprey_cli.reference, read a non-empty `commands`
# dict as the whole list, and the CLI reference once lacked demo, export and fetch-model.
_GROUPS: dict[str, str | click.Command] = {
    name: LazyGroup(name=name, lazy=dict(commands), help=_GROUP_HELP[name])
    for name, commands in COMMANDS.items() if name
}


@click.group(cls=OspreyCLI, lazy={**COMMANDS[""], **_GROUPS})
@click.version_option(package_name="osprey")
def cli() -> None:
    """Osprey: target-agnostic pre-trained drafters for speculative decoding."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="osprey")


if __name__ == "__main__":
    main()
