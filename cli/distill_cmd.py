"""``osprey train distill`` (Stage 4): EAGLE-3 Training-Time-Test distillation from a store.

The options are generated from :class:`osprey_train.stages.configs.DistillConfig` (its own fields,
then its ``loop`` and ``optim``); the command parses them into that config and calls ``run``.
"""

from __future__ import annotations

from typing import Any

import click

from osprey_cli.config_options import ConfigOptions
from osprey_train.stages.configs import DistillConfig

__all__ = ["distill"]

OPTIONS = ConfigOptions(DistillConfig)


@click.command("distill")
@OPTIONS
def distill(**params: Any) -> None:
    """Stage 4: distill a drafter from a feature store with EAGLE-3 Training-Time Test.

    \b
    Example:
      osprey train distill --drafter runs/osprey-init --store stores/train --out runs/osprey --steps 2000
    """
    from osprey_train.stages.distill import run

    result = run(OPTIONS.config(params))
    if result.final_dir is not None:
        last = ", ".join(f"{k}={v:.4g}" for k, v in result.last_train.items()
                         if k == "loss" or k.startswith("acc_k"))
        click.echo(f"distilled {result.step} steps ({last}); drafter in {result.final_dir}")
        if result.last_eval:
            click.echo(f"eval: accept_len={result.last_eval.get('accept_len', float('nan')):.3f}")
