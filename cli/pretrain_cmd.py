"""``osprey train pretrain``: Stage 2 next-token pretraining of a pruned backbone (torchrun-ready)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from osprey_cli.train_options import loop_config, loop_options, optim_config, optim_options
from osprey_train.stages.defaults import PRETRAIN_OPTIM_DEFAULTS

__all__ = ["pretrain"]


@click.command("pretrain")
@click.option("--model", required=True, type=click.Path(path_type=Path), help="HF backbone folder (Stage 1 output).")
@click.option("--corpus", required=True, type=click.Path(path_type=Path), help="Tokenized corpus folder.")
@click.option("--seq-len", type=int, default=1024, show_default=True, help="Tokens per training window.")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Windows per micro-batch per process.")
@click.option("--heldout-fraction", type=float, default=0.01, show_default=True,
              help="End fraction of the corpus held out for perplexity.")
@click.option("--eval-windows", type=int, default=64, show_default=True, help="Held-out windows per eval.")
@click.option("--teacher", default=None,
              help="Knowledge distillation: the unpruned source (folder/.gguf/hub id); its logits are the soft targets.")
@click.option("--kd-temperature", type=float, default=1.0, show_default=True, help="Temperature of the KD term.")
@click.option("--kd-weight", type=float, default=1.0, show_default=True,
              help="Weight of the KD term (the rest goes to next-token cross-entropy).")
@loop_options
@optim_options(PRETRAIN_OPTIM_DEFAULTS)
def pretrain(**params: Any) -> None:
    """Stage 2: pretrain a pruned backbone on generic text (launch with torchrun for DDP/FSDP).

    Held-out perplexity is measured at step 0, every --eval-every steps and at the end. With
    --teacher SOURCE the loss is distillation from the unpruned source's logits.

    \b
    Example:
      osprey train pretrain --model runs/pruned --corpus corpora/generic --out runs/backbone --steps 2000
      osprey train pretrain --model runs/pruned --corpus corpora/generic --out runs/backbone-kd --teacher SOURCE
    """
    from osprey_train.stages.pretrain import PretrainConfig, run

    loop, optim = loop_config(params), optim_config(params)
    result = run(PretrainConfig(loop=loop, optim=optim, **params))
    if result.final_dir is None:      # ranks > 0 under torchrun stay quiet
        return
    initial = f"{result.initial_ppl:.2f}" if result.initial_ppl is not None else "n/a (resumed)"
    final = f"{result.final_ppl:.2f}" if result.final_ppl is not None else "n/a"
    click.echo(f"held-out perplexity {initial} -> {final}; {result.tokens_per_s:.0f} tokens/s; "
               f"model: {result.final_dir}; curves: {result.plot_path}")
