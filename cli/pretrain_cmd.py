"""``osprey train pretrain``: Stage 2 next-token pretraining of a pruned backbone (torchrun-ready).

The options are generated from :class:`osprey_train.stages.configs.PretrainConfig` (its own
fields, then its ``loop`` and ``optim``); the command parses them into that config and calls ``run``.
"""

from __future__ import annotations

from typing import Any

import click

from osprey_cli.config_options import ConfigOptions
from osprey_train.stages.configs import PretrainConfig

__all__ = ["pretrain"]

OPTIONS = ConfigOptions(PretrainConfig)


@click.command("pretrain")
@OPTIONS
def pretrain(**params: Any) -> None:
    """Stage 2: pretrain a pruned backbone on generic text (launch with torchrun for DDP/FSDP).

    Held-out perplexity is measured at step 0, every --eval-every steps and at the end. With
    --teacher SOURCE the loss is distillation from the unpruned source's logits.

    \b
    Example:
      osprey train pretrain --model runs/pruned --corpus corpora/generic --out runs/backbone --steps 2000
      osprey train pretrain --model runs/pruned --corpus corpora/generic --out runs/backbone-kd --teacher SOURCE
    """
    from osprey_train.stages.pretrain import run

    result = run(OPTIONS.config(params))
    if result.final_dir is None:      # ranks > 0 under torchrun stay quiet
        return
    initial = f"{result.initial_ppl:.2f}" if result.initial_ppl is not None else "n/a (resumed)"
    final = f"{result.final_ppl:.2f}" if result.final_ppl is not None else "n/a"
    click.echo(f"held-out perplexity {initial} -> {final}; {result.tokens_per_s:.0f} tokens/s; "
               f"model: {result.final_dir}; curves: {result.plot_path}")
