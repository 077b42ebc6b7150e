"""The generated CLI reference (docs/cli.md) as mkdocs renders it (issue 48): no ``Sentinel.UNSET``
default, every required option marked, the defaults ``--help`` prints, examples as code blocks."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import click
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_cli.reference import MARKER, cli_reference

ROOT = Path(__file__).resolve().parents[2]


def _page() -> str:
    """docs/cli.md through the mkdocs hook, as `mkdocs build` renders it."""
    assert "  - mkdocs_hooks.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nhooks:\n", 1)[1]
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    source = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert MARKER in source
    page = hooks.on_page_markdown(source, page=None, config=None, files=None)
    assert MARKER not in page
    return page


def _commands(command: click.Command, ctx: click.Context, path: tuple[str, ...] = ()):
    """(path, command) of every command below the root, as click lists them."""
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            yield (*path, name), sub
            yield from _commands(sub, ctx, (*path, name))


def _section(page: str, path: tuple[str, ...]) -> str:
    """The part of the page under the heading of command ``path`` (up to the next heading)."""
    depth = 2 + len(path)
    text = page
    for i, name in enumerate(path):   # walk down the headings: "### data", then "#### build"
        marker = f"\n{'#' * (3 + i)} {name}\n"
        assert marker in text, f"no heading for {' '.join(path[:i + 1])}"
        text = text.split(marker, 1)[1]
    return re.split(r"\n#{2,%d} " % depth, text, maxsplit=1)[0]


def test_no_sentinel_and_every_required_option_is_marked():
    page = _page()
    assert "Sentinel" not in page and "UNSET" not in page
    ctx = click.Context(cli)
    checked = 0
    for path, command in _commands(cli, ctx):
        section = _section(page, path)
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            row = next((line for line in section.splitlines() if line.startswith(f"| `{param.opts[0]}")), None)
            assert row is not None, f"osprey {' '.join(path)}: {param.opts[0]} has no row"
            cells = [c.strip() for c in row.split(" | ")]
            assert (cells[-1].rstrip(" |") == "**required**") == param.required, (path, row)
            checked += param.required
    assert checked >= 3   # data build --target/--input/--out at least


def test_the_tables_say_what_help_says():
    page = _page()
    runner = CliRunner()
    for path in (("data", "build"), ("export",), ("eval", "matrix"), ("study", "run")):
        help_text = runner.invoke(cli, [*path, "--help"], terminal_width=400).output
        section = _section(page, path)
        rows = [line for line in section.splitlines() if line.startswith("| `--")]
        assert rows, path
        assert help_text.count("[required]") == sum(r.rstrip().endswith("| **required** |") for r in rows), path
        for default in re.findall(r"\[default: ([^\]]+)\]", help_text):
            assert f"| `{default}` |" in section, (path, default)


def test_the_data_build_example_is_a_code_block_with_its_backslash():
    section = _section(_page(), ("data", "build"))
    block = section.split("Example:\n\n```text\n", 1)[1].split("\n```", 1)[0]
    assert block.startswith("osprey data build --target") and block.splitlines()[0].endswith(" \\")
    assert block.splitlines()[1].startswith("    --out stores/train")


def test_every_command_has_a_section():
    page = cli_reference()
    ctx = click.Context(cli)
    paths = [p for p, _ in _commands(cli, ctx)]
    assert {("demo",), ("export",), ("fetch-model",), ("data", "build"), ("train", "distill")} <= set(paths)
    for path in paths:
        _section(page, path)
