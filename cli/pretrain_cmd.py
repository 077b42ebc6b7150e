"""``osprey train pretrain``: Stage 2 next-token pretraining of a pruned backbone (torchrun-ready)."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["pretrain"]


@click.command("pretrain")
@click.option("--model", required=True, type=click.Path(path_type=Path), help="HF backbone folder (Stage 1 output).")
@click.option("--corpus", required=True, type=click.Path(path_type=Path), help="Tokenized corpus folder.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Run folder.")
@click.option("--steps", type=int, default=1000, show_default=True, help="Optimizer steps.")
@click.option("--seq-len", type=int, default=1024, show_default=True, help="Tokens per training window.")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Windows per micro-batch per process.")
@click.option("--grad-accum", type=int, default=1, show_default=True, help="Micro-batches per step.")
@click.option("--lr", type=float, default=1e-4, show_default=True, help="Peak learning rate.")
@click.option("--warmup-ratio", type=float, default=0.01, show_default=True, help="Linear warmup fraction.")
@click.option("--min-lr-ratio", type=float, default=0.0, show_default=True, help="Final LR / peak LR.")
@click.option("--weight-decay", type=float, default=0.1, show_default=True, help="AdamW weight decay.")
@click.option("--grad-clip", type=float, default=1.0, show_default=True, help="Grad-norm clip (0 = off).")
@click.option("--heldout-fraction", type=float, default=0.01, show_default=True,
              help="End fraction of the corpus held out for perplexity.")
@click.option("--eval-every", type=int, default=0, show_default=True, help="Held-out eval period (0 = start/end).")
@click.option("--eval-windows", type=int, default=64, show_default=True, help="Held-out windows per eval.")
@click.option("--save-every", type=int, default=0, show_default=True, help="Checkpoint period (0 = end only).")
@click.option("--log-every", type=int, default=10, show_default=True, help="Metrics period.")
@click.option("--resume", is_flag=True, help="Continue from the newest complete checkpoint in --out.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of data order and RNGs.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--distributed", type=click.Choice(["auto", "none", "ddp", "fsdp"]), default="auto",
              show_default=True, help="auto = DDP when launched by torchrun with >1 process.")
@click.option("--gradient-checkpointing", is_flag=True, help="Recompute activations to save memory.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def pretrain(model: Path, corpus: Path, out: Path, steps: int, seq_len: int, batch_size: int, grad_accum: int,
             lr: float, warmup_ratio: float, min_lr_ratio: float, weight_decay: float, grad_clip: float,
             heldout_fraction: float, eval_every: int, eval_windows: int, save_every: int, log_every: int,
             resume: bool, seed: int, device: str, distributed: str, gradient_checkpointing: bool,
             no_progress: bool) -> None:
    """Stage 2: pretrain a pruned backbone on generic text (launch with torchrun for DDP/FSDP)."""
    from osprey_train.stages.pretrain import PretrainConfig, run

    result = run(PretrainConfig(
        model=model, corpus=corpus, out=out, steps=steps, seq_len=seq_len, batch_size=batch_size,
        grad_accum=grad_accum, lr=lr, warmup_ratio=warmup_ratio, min_lr_ratio=min_lr_ratio,
        weight_decay=weight_decay, grad_clip=grad_clip, heldout_fraction=heldout_fraction, eval_every=eval_every,
        eval_windows=eval_windows, save_every=save_every, log_every=log_every, resume=resume, seed=seed,
        device=device, distributed=distributed, gradient_checkpointing=gradient_checkpointing,
        progress=not no_progress))
    if result.final_dir is None:      # ranks > 0 under torchrun stay quiet
        return
    initial = f"{result.initial_ppl:.2f}" if result.initial_ppl is not None else "n/a (resumed)"
    final = f"{result.final_ppl:.2f}" if result.final_ppl is not None else "n/a"
    click.echo(f"held-out perplexity {initial} -> {final}; {result.tokens_per_s:.0f} tokens/s; "
               f"model: {result.final_dir}; curves: {result.plot_path}")
