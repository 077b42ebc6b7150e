"""``osprey train distill`` (Stage 4): EAGLE-3 Training-Time-Test distillation from a store.

Parses the options into :class:`osprey_train.stages.distill.DistillConfig` and calls its ``run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from osprey_cli.train_options import loop_config, loop_options, optim_config, optim_options
from osprey_train.stages.defaults import DISTILL_OPTIM_DEFAULTS

__all__ = ["distill"]


@click.command("distill")
@click.option("--drafter", required=True, type=click.Path(path_type=Path),
              help="Drafter folder from `osprey train convert` (osprey or eagle3: read from its config).")
@click.option("--store", required=True, help="Training feature store (path or fsspec URL).")
@click.option("--eval-store", default=None, help="Held-out store for periodic offline acceptance.")
@click.option("--ttt-steps", type=int, default=5, show_default=True, help="TTT unroll length K.")
@click.option("--ttt-decay", type=float, default=0.8, show_default=True, help="Loss weight decay^k of step k.")
@click.option("--target-dist", type=click.Choice(["tail", "renorm", "full"]), default="tail", show_default=True,
              help="Target distribution: top-k + tail bucket, top-k renormalized, or full vocab (final_hidden).")
@click.option("--target-model", default=None,
              help="Target HF folder for --target-dist full (default: the store's target path).")
@click.option("--score-out-of-vocab", is_flag=True,
              help="Draft-vocabulary drafters (EAGLE-3, convert --draft-vocab): also score positions whose "
                   "target top-1 is outside the draft vocabulary "
                   "(left out by default: such a token can never be accepted).")
@click.option("--tokens-per-batch", type=int, default=4096, show_default=True,
              help="Budget of one packed micro-batch in slots (a sample of n tokens fills n - 1).")
@click.option("--prefetch", type=int, default=2, show_default=True,
              help="Micro-batches read from the store ahead of training, on a background thread (0 = off).")
@click.option("--attention", type=click.Choice(["auto", "flex", "sdpa", "eager"]), default="auto",
              show_default=True, help="TTT attention implementation (auto: flex on CUDA, else sdpa).")
@click.option("--train-embeddings", is_flag=True, help="Also train the input embedding (frozen by default).")
@click.option("--eval-samples", type=int, default=64, show_default=True, help="Eval samples (0 = all).")
@loop_options
@optim_options(DISTILL_OPTIM_DEFAULTS)
def distill(train_embeddings: bool, **params: Any) -> None:
    """Stage 4: distill a drafter from a feature store with EAGLE-3 Training-Time Test.

    \b
    Example:
      osprey train distill --drafter runs/osprey-init --store stores/train --out runs/osprey --steps 2000
    """
    from osprey_train.stages.distill import DistillConfig, run

    loop, optim = loop_config(params), optim_config(params)
    result = run(DistillConfig(loop=loop, optim=optim, freeze_embeddings=not train_embeddings, **params))
    if result.final_dir is not None:
        last = ", ".join(f"{k}={v:.4g}" for k, v in result.last_train.items()
                         if k == "loss" or k.startswith("acc_k"))
        click.echo(f"distilled {result.step} steps ({last}); drafter in {result.final_dir}")
        if result.last_eval:
            click.echo(f"eval: accept_len={result.last_eval.get('accept_len', float('nan')):.3f}")
