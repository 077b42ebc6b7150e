"""The CLI reference page (docs/cli.md) rendered from the click commands themselves.

Every figure on the page is what ``--help`` prints, taken from the same click calls: an option's
default and its required mark come from :meth:`click.Option.get_help_extra` (``[default: 8]``,
``[required]`` in ``--help``), its names from :meth:`click.Option.get_help_record`. A help
paragraph that click keeps verbatim (one opened by a ``\\b`` line: the examples) becomes a code
block, as it prints in a terminal. A new option or command appears without a hand edit.

mkdocs-click rendered this page before; with click >= 8.3 its tables read ``Sentinel.UNSET`` for
every option without a declared default and never marked a required option (issue 48).

``mkdocs_hooks.py`` (next to mkdocs.yml) puts :func:`cli_reference` where docs/cli.md holds
:data:`MARKER`; ``python -m osprey_cli.reference`` prints it.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Iterator

import click

__all__ = ["MARKER", "cli_reference", "option_rows"]

MARKER = "<!-- osprey-cli-reference -->"
"""Where docs/cli.md takes the generated reference."""


def _cell(text: str) -> str:
    """A table cell: one line, ``|`` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _description(text: str) -> Iterator[str]:
    """A command's help as Markdown: prose paragraphs as they are, ``\\b`` paragraphs (kept verbatim
    by click) as code blocks. Text after ``\\f`` is not help (click drops it too)."""
    text = inspect.cleandoc(text.split("\f", 1)[0])
    for para in text.split("\n\n"):
        lines = para.splitlines()
        if lines and lines[0].strip() == "\b":
            body = textwrap.dedent("\n".join(lines[1:]))
            head, *rest = body.splitlines() or [""]
            if head.endswith(":") and not head.startswith(" ") and rest:   # "Example:" then the lines
                yield head
                yield ""
                body = textwrap.dedent("\n".join(rest))
            yield "```text"
            yield from body.splitlines()
            yield "```"
        else:
            yield from lines
        yield ""


def option_rows(command: click.Command, ctx: click.Context) -> list[tuple[str, str, str]]:
    """(names, help, default cell) of each option ``command --help`` lists, as ``--help`` shows them:
    the default cell is ``**required**``, the ``[default: ...]`` text, or empty (no default shown)."""
    rows = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option) or param.hidden:
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        extra = param.get_help_extra(ctx)
        default = "**required**" if extra.get("required") else (f"`{extra['default']}`" if "default" in extra else "")
        notes = [f"range: {extra['range']}"] if extra.get("range") else []
        if extra.get("envvars"):
            notes.append("env var: " + ", ".join(extra["envvars"]))
        help_text = " ".join([inspect.cleandoc(param.help or ""), *(f"({n})" for n in notes)]).strip()
        rows.append((record[0], help_text, default))
    return rows


def _usage(command: click.Command, ctx: click.Context) -> str:
    formatter = ctx.make_formatter()
    formatter.write_usage(ctx.command_path, " ".join(command.collect_usage_pieces(ctx)), prefix="")
    return formatter.getvalue().strip()


def _subcommands(command: click.Command, ctx: click.Context) -> list[click.Command]:
    if not isinstance(command, click.Group):
        return []
    subs = [command.get_command(ctx, name) for name in command.list_commands(ctx)]
    return [s for s in subs if s is not None and not s.hidden]


def _command(command: click.Command, name: str, parent: click.Context | None, depth: int) -> Iterator[str]:
    ctx = click.Context(command, info_name=name, parent=parent)
    yield f"{'#' * depth} {name}"
    yield ""
    if command.help:
        yield from _description(command.help)
    yield "**Usage:**"
    yield ""
    yield "```text"
    yield _usage(command, ctx)
    yield "```"
    yield ""
    rows = option_rows(command, ctx)
    if command.epilog:
        yield from _description(command.epilog)
    if rows:
        yield "**Options:**"
        yield ""
        yield "| Option | Description | Default |"
        yield "| ------ | ----------- | ------- |"
        for names, help_text, default in rows:
            yield f"| `{_cell(names)}` | {_cell(help_text)} | {default} |"
        yield ""
    subs = _subcommands(command, ctx)
    if subs:
        yield "**Subcommands:**"
        yield ""
        for sub in subs:
            first = (sub.short_help or inspect.cleandoc(sub.help or "").split("\n\n")[0] or "").replace("\n", " ")
            yield f"- *{sub.name}*: {first}"
        yield ""
        for sub in subs:
            yield from _command(sub, sub.name or "", ctx, depth + 1)


def cli_reference(prog_name: str = "osprey", depth: int = 2) -> str:
    """The Markdown of every command of ``osprey``, its options and subcommands (headings from ``depth``)."""
    from osprey_cli.main import cli

    return "\n".join(_command(cli, prog_name, None, depth)).rstrip() + "\n"


if __name__ == "__main__":
    print(cli_reference(), end="")
