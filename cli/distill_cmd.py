"""``osprey train distill`` (Stage 4): EAGLE-3 Training-Time-Test distillation from a store.

Parses the options into :class:`osprey_train.stages.distill.DistillConfig` and calls its ``run``.
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["distill"]


@click.command("distill")
@click.option("--drafter", required=True, type=click.Path(path_type=Path),
              help="Drafter folder from `osprey train convert` (osprey or eagle3: read from its config).")
@click.option("--store", required=True, help="Training feature store (path or fsspec URL).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Run folder.")
@click.option("--eval-store", default=None, help="Held-out store for periodic offline acceptance.")
@click.option("--ttt-steps", type=int, default=5, show_default=True, help="TTT unroll length K.")
@click.option("--ttt-decay", type=float, default=0.8, show_default=True, help="Loss weight decay^k of step k.")
@click.option("--target-dist", type=click.Choice(["tail", "renorm", "full"]), default="tail", show_default=True,
              help="Target distribution: top-k + tail bucket, top-k renormalized, or full vocab (final_hidden).")
@click.option("--target-model", default=None,
              help="Target HF folder for --target-dist full (default: the store's target path).")
@click.option("--steps", type=int, default=1000, show_default=True, help="Optimizer steps.")
@click.option("--lr", type=float, default=1e-4, show_default=True, help="Peak learning rate.")
@click.option("--warmup-ratio", type=float, default=0.01, show_default=True, help="Linear warmup fraction.")
@click.option("--tokens-per-batch", type=int, default=4096, show_default=True,
              help="Token budget of one packed micro-batch.")
@click.option("--grad-accum", type=int, default=1, show_default=True, help="Micro-batches per step.")
@click.option("--attention", type=click.Choice(["auto", "flex", "sdpa", "eager"]), default="auto",
              show_default=True, help="TTT attention implementation (auto: flex on CUDA, else sdpa).")
@click.option("--gradient-checkpointing", is_flag=True, help="Recompute each TTT step in backward.")
@click.option("--train-embeddings", is_flag=True, help="Also train the input embedding (frozen by default).")
@click.option("--eval-every", type=int, default=0, show_default=True, help="Eval every N steps (0 = end).")
@click.option("--eval-samples", type=int, default=64, show_default=True, help="Eval samples (0 = all).")
@click.option("--save-every", type=int, default=0, show_default=True, help="Checkpoint every N steps (0 = end).")
@click.option("--log-every", type=int, default=10, show_default=True, help="Metrics record every N steps.")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in --out.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--distributed", type=click.Choice(["auto", "none", "ddp", "fsdp"]), default="auto",
              show_default=True, help="Data parallelism under torchrun.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def distill(drafter: Path, store: str, out: Path, eval_store: str | None, ttt_steps: int, ttt_decay: float,
            target_dist: str, target_model: str | None, steps: int, lr: float, warmup_ratio: float,
            tokens_per_batch: int, grad_accum: int, attention: str, gradient_checkpointing: bool,
            train_embeddings: bool, eval_every: int, eval_samples: int, save_every: int, log_every: int,
            resume: bool, seed: int, device: str, distributed: str, no_progress: bool) -> None:
    """Stage 4: distill a drafter from a feature store with EAGLE-3 Training-Time Test."""
    from osprey_train.stages.distill import DistillConfig, run

    result = run(DistillConfig(
        drafter=drafter, store=store, out=out, eval_store=eval_store, ttt_steps=ttt_steps, ttt_decay=ttt_decay,
        target_dist=target_dist, target_model=target_model, steps=steps, lr=lr, warmup_ratio=warmup_ratio,
        tokens_per_batch=tokens_per_batch, grad_accum=grad_accum, attention=attention,
        gradient_checkpointing=gradient_checkpointing, freeze_embeddings=not train_embeddings,
        eval_every=eval_every, eval_samples=eval_samples, save_every=save_every, log_every=log_every,
        resume=resume, seed=seed, device=device, distributed=distributed, progress=not no_progress))
    if result.final_dir is not None:
        last = ", ".join(f"{k}={v:.4g}" for k, v in result.last_train.items()
                         if k == "loss" or k.startswith("acc_k"))
        click.echo(f"distilled {result.step} steps ({last}); drafter in {result.final_dir}")
        if result.last_eval:
            click.echo(f"eval: accept_len={result.last_eval.get('accept_len', float('nan')):.3f}")
