"""``osprey train prune`` (Stage 1) and ``osprey train convert`` (Stage 3) commands.

The options of each are generated from the stage's typed config (``PruneConfig``,
``ConvertConfig``); the command parses them into it and calls the stage's ``run``.
"""

from __future__ import annotations

from typing import Any

import click

from osprey_cli.config_options import ConfigOptions
from osprey_train.stages.configs import ConvertConfig
from osprey_train.stages.prune import PruneConfig

__all__ = ["prune", "convert"]

PRUNE_OPTIONS = ConfigOptions(PruneConfig)
CONVERT_OPTIONS = ConfigOptions(ConvertConfig)


@click.command("prune")
@PRUNE_OPTIONS
def prune(**params: Any) -> None:
    """Stage 1: keep embedding, the first N blocks, final norm and LM head of a small LM.

    \b
    Example:
      osprey train prune --source ~/.cache/osprey/smollm2-135m-instruct --layers 2 --out runs/pruned
    """
    from osprey_train.stages.prune import run

    result = run(PRUNE_OPTIONS.config(params))
    click.echo(f"pruned {result.source_layers} -> {result.kept_layers} layers "
               f"({result.num_parameters / 1e6:.2f}M parameters) into {result.out}")


@click.command("convert")
@CONVERT_OPTIONS
def convert(**params: Any) -> None:
    """Stage 3: align vocabulary, add zero-init conditioned QKV columns and W_c (or init EAGLE-3).

    \b
    Example:
      osprey train convert --backbone runs/backbone/final --store stores/train --out runs/osprey-init
      osprey train convert --arch eagle3 --target MODEL --store stores/train --out runs/eagle3-init
      osprey train convert --arch eagle3 --eagle3-layers 2 --target MODEL --store stores/train --out runs/e3-2l
    """
    from osprey_train.stages.convert import run

    config = CONVERT_OPTIONS.config(params)
    result = run(config)
    summary = ", ".join(f"{k}={v}" for k, v in result.stats.items() if isinstance(v, (int, float)))
    click.echo(f"wrote {config.arch} drafter to {result.out} ({summary})")
