"""The documentation site cannot drift from the repository (issue 35), checked without mkdocs.

CI also runs ``mkdocs build --strict`` (.ci/run); these checks catch the same drift in the plain
test run: a page missing from the menu or a menu entry without its page, a README that grew back
past one screen, a README figure without its report, and an architecture page that no longer names
the packages whose import rules ``tests/test_import_graph.py`` enforces.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_LIMIT = 10_240


def nav_pages(mkdocs_yml: str) -> list[str]:
    """The ``*.md`` files the ``nav`` of mkdocs.yml names (read as text: PyYAML is not a test dependency)."""
    nav = mkdocs_yml.split("\nnav:\n", 1)[1]
    return re.findall(r"^\s+- (?:[^:\n]+: )?([\w./-]+\.md)\s*$", nav, flags=re.M)


def results_rows(readme: str) -> list[str]:
    """The body rows of the README's "Measured results" table."""
    section = readme.split("## Measured results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return rows[2:]  # header and separator


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    pages = nav_pages((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert len(pages) >= 10
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml nav names pages that do not exist: {missing}"
    # docs/results/** are reached through links (mkdocs.yml not_in_nav); every other page is in the menu
    top = sorted(p.name for p in DOCS.glob("*.md"))
    assert not set(top) - set(pages), f"docs pages missing from the mkdocs.yml nav: {sorted(set(top) - set(pages))}"


def test_nav_reader_sees_a_missing_page():
    assert nav_pages("x: 1\nnav:\n  - Home: index.md\n  - Ref:\n      - CLI: cli.md\n") == ["index.md", "cli.md"]


def test_readme_fits_one_screen():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes (at most {README_LIMIT}): move detail to docs/"


def test_every_readme_figure_links_its_report():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = results_rows(readme)
    assert len(rows) >= 3
    for row in rows:
        links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", row)
        assert links, f"a README result without its report link: {row}"
        for link in links:
            assert (ROOT / link).is_file(), f"the README links {link}, which does not exist"


def test_results_rows_reader_sees_a_row_without_link():
    text = "## Measured results\n\n| a | b |\n|---|---|\n| x | 1.0 |\n\n## Next\n"
    assert results_rows(text) == ["| x | 1.0 |"]
    assert not re.findall(r"\]\(([^)#]+)\)", results_rows(text)[0])


def test_architecture_names_every_package_of_the_import_graph():
    graph = (ROOT / "tests" / "test_import_graph.py").read_text(encoding="utf-8")
    packages = re.search(r"PACKAGES = (\{.*?\})", graph, flags=re.S).group(1)
    pairs = re.findall(r'"(\w+)": "(\w+)"', packages)
    assert len(pairs) >= 4
    arch = (DOCS / "architecture.md").read_text(encoding="utf-8")
    for name, folder in pairs:
        assert name in arch and f"{folder}/" in arch, f"docs/architecture.md does not name {name} ({folder}/)"
    subsystems = sorted(p.name for p in (ROOT / "osprey_train").iterdir() if (p / "__init__.py").is_file())
    subsystems += sorted(p.name for p in (ROOT / "osprey_data").iterdir() if (p / "__init__.py").is_file())
    missing = [s for s in subsystems if f"{s}/" not in arch]
    assert not missing, f"docs/architecture.md does not describe these subsystem folders: {missing}"


def _tree(command, ctx, listed_by_mkdocs_click: bool) -> set[str]:
    """Every command path below ``command``, as click lists it or as mkdocs-click 0.9 does: that
    reads a group's ``commands`` dict whenever it is non-empty, and list_commands only otherwise."""
    import click

    if not isinstance(command, click.Group):
        return set()
    if listed_by_mkdocs_click and command.commands:
        subs = dict(command.commands)
    else:
        subs = {name: command.get_command(ctx, name) for name in command.list_commands(ctx)}
    paths = set()
    for name, sub in subs.items():
        paths.add(name)
        paths |= {f"{name} {p}" for p in _tree(sub, ctx, listed_by_mkdocs_click)}
    return paths


def test_generated_cli_reference_sees_every_command():
    # The lazy root group once kept its subgroups in `commands` and its own commands in the lazy
    # table, so docs/cli.md silently lacked demo, export and fetch-model while the build passed.
    # The page comes from osprey_cli.reference now, which lists through list_commands; a listing by
    # `commands` (as mkdocs-click did) still sees every command.
    import click

    from osprey_cli.main import cli
    from osprey_cli.reference import cli_reference

    ctx = click.Context(cli)
    full = _tree(cli, ctx, listed_by_mkdocs_click=False)
    assert {"demo", "export", "data build", "train distill"} <= full
    assert _tree(cli, ctx, listed_by_mkdocs_click=True) == full
    page = cli_reference()
    assert all(f"# {path.split()[-1]}\n" in page for path in full)


# The hand-written option tables kept beside the generated CLI reference (docs/cli.md): they add
# what --help cannot (measurements, formats, the why of a default). page -> (section heading or
# "" for the page's top, the command its table rows document).
FLAG_TABLES = {
    "build.md": [("## Options", ("data", "build"))],
    "pretrain.md": [("## `osprey data tokenize-corpus`", ("data", "tokenize-corpus")),
                    ("## `osprey train pretrain`", ("train", "pretrain"))],
    "live.md": [("", ("eval", "live"))],
    "demo.md": [("## Options", ("demo",))],
}


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n") if heading else 0
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def _table_flags(section: str) -> set[str]:
    """The flags named in the first cell of each table row that documents one."""
    flags = set()
    for line in section.splitlines():
        if line.startswith("| `--"):
            flags |= set(re.findall(r"--[a-z0-9][a-z0-9-]*", line.split("|")[1]))
    return flags


def test_hand_written_option_tables_name_only_real_flags():
    # A renamed or removed flag would otherwise live on in these pages while --help and the
    # generated reference moved on: every flag a table names must be one the command accepts.
    import click

    from osprey_cli.main import cli

    ctx = click.Context(cli)
    for page, tables in FLAG_TABLES.items():
        text = (DOCS / page).read_text(encoding="utf-8")
        for heading, path in tables:
            command = cli
            for name in path:
                command = command.get_command(ctx, name)
            accepted = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
            named = _table_flags(_section(text, heading))
            assert named, f"docs/{page} {heading or 'top'}: no option table found"
            unknown = sorted(named - accepted)
            assert not unknown, f"docs/{page} {heading or 'top'} names flags `osprey {' '.join(path)}` lacks: {unknown}"


def test_table_flags_reader():
    text = "## Options\n\n| flag | x |\n|---|---|\n| `--a` / `--b-c` | d `--not-this` |\n\n## Next\n| `--z` | |\n"
    assert _table_flags(_section(text, "## Options")) == {"--a", "--b-c"}


def _subsystem(module: str) -> str:
    """The architecture table's name for a module: its package folder, or ``osprey_data/*.py``."""
    parts = module.split(".")
    if parts[0] in ("osprey_cli", "osprey_schemas"):
        return parts[0]
    folder = {"osprey_data": "osprey_data", "osprey_train": "osprey_train"}[parts[0]]
    if len(parts) >= 2 and (ROOT / folder / parts[1] / "__init__.py").is_file():
        return parts[1]
    return f"{folder}/*.py"


def _subsystem_arrows() -> dict[str, set[str]]:
    """subsystem -> the other subsystems its modules import (any import: top, function, TYPE_CHECKING)."""
    import ast

    roots = {"osprey_data": "osprey_data", "osprey_train": "osprey_train", "osprey_cli": "cli",
             "osprey_schemas": "schemas"}
    arrows: dict[str, set[str]] = {}
    for name, folder in roots.items():
        for path in (ROOT / folder).rglob("*.py"):
            module = ".".join([name, *path.relative_to(ROOT / folder).with_suffix("").parts])
            source = _subsystem(module)
            targets = arrows.setdefault(source, set())
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                else:
                    continue
                targets |= {_subsystem(n) for n in names if n.split(".")[0] in roots} - {source}
    return arrows


def test_architecture_arrows_are_the_imports():
    arch = (DOCS / "architecture.md").read_text(encoding="utf-8")
    table = arch.split("## Subsystems and the arrows between them", 1)[1].split("\n## ", 1)[0]
    documented = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        name = re.match(r"`([^`]+)`", cells[0]).group(1)
        name = name if name.endswith("*.py") or "/" not in name else name.rstrip("/").rsplit("/", 1)[1]
        documented[name] = set(re.findall(r"`([^`]+)`", cells[2]))
    # the schemas package imports nothing of ours, and osprey_train/__init__.py is only a docstring
    actual = {k: v for k, v in _subsystem_arrows().items() if k not in ("osprey_schemas", "osprey_train/*.py") or v}
    assert set(documented) == set(actual), f"architecture.md subsystems {sorted(documented)} vs {sorted(actual)}"
    drift = {k: (sorted(documented[k] - actual[k]), sorted(actual[k] - documented[k]))
             for k in actual if documented[k] != actual[k]}
    assert not drift, f"docs/architecture.md arrows (documented only, imported only): {drift}"


def test_schemas_page_includes_every_schema():
    # docs/schemas.md includes each file at build time (pymdownx.snippets fails on a missing one);
    # this catches the other drift, a schema added to schemas/ but not to the page.
    page = (DOCS / "schemas.md").read_text(encoding="utf-8")
    included = set(re.findall(r'--8<-- "schemas/([^"]+\.json)"', page))
    on_disk = {p.name for p in (ROOT / "schemas").glob("*.json")}
    assert on_disk == included, f"docs/schemas.md lacks {sorted(on_disk - included)}, names missing {sorted(included - on_disk)}"


def code_lines(markdown: str) -> list[str]:
    """The lines inside fenced code blocks."""
    inside, lines = False, []
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    return lines


def test_architecture_diagrams_fit_the_page():
    """Issue 48: the file tree was cut at the right of a 1,400 px window; 100 columns fit."""
    wide = [line for line in code_lines((DOCS / "architecture.md").read_text(encoding="utf-8")) if len(line) > 100]
    assert not wide, f"architecture.md code lines over 100 columns: {wide[:3]}"
    assert code_lines("a\n```\nx\n```\nb\n  ```text\ny\n  ```\n") == ["x", "y"]


def test_home_page_links_read_as_titles():
    """Issue 48: the home page's links show page titles, not file names."""
    texts = re.findall(r"\[([^\]]+)\]\([^)]+\)", (DOCS / "index.md").read_text(encoding="utf-8"))
    assert texts and not [t for t in texts if re.search(r"\.md\b|/", t)], texts
