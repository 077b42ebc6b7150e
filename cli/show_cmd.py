"""``osprey data show``: print one stored sample's text with its loss mask marked.

The options are generated from :class:`osprey_data.store.show.ShowConfig`; the command parses
them into that config and calls :func:`osprey_data.store.show.run`.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from osprey_cli.config_options import ConfigOptions
from osprey_data.store.show import ShowConfig

__all__ = ["show"]

OPTIONS = ConfigOptions(ShowConfig)


@click.command("show")
@OPTIONS
def show(**params: Any) -> None:
    """Print one stored sample's text, the loss mask marked: [[trained on]], the rest context only.

    The sample is decoded with the store's target tokenizer (or --tokenizer) in runs of equal
    loss mask; with colour (on a terminal) the trained text is bold and the rest dimmed.

    \b
    Example:
      osprey data show --store stores/train --sample 0
      osprey data show --store stores/train --sample tiny-003 --json
    """
    from osprey_data.store.show import run

    config = OPTIONS.config(params)
    shown = run(config)
    if config.as_json:
        click.echo(shown.to_json())
        return
    color = config.color == "always" or (config.color == "auto" and sys.stdout.isatty())
    click.echo(shown.to_text(color=color), nl=False, color=color)
