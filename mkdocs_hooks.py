"""mkdocs hooks (mkdocs.yml ``hooks:``): docs/cli.md gets the CLI reference rendered from the click
commands at build time (:func:`osprey_cli.reference.cli_reference`, the same text ``--help`` prints)."""

from __future__ import annotations

from typing import Any


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    """Put the generated reference where a page holds the marker (docs/cli.md)."""
    from osprey_cli.reference import MARKER, cli_reference

    return markdown.replace(MARKER, cli_reference()) if MARKER in markdown else markdown
