"""``osprey demo``: the whole recipe on SmolLM2-135M-Instruct (fetched from PyPI), with a report."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["demo"]


@click.command("demo")
@click.option("--quick", is_flag=True, help="Quick preset: <= 3 minutes on 2 CPU cores (default: full, <= 15).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("osprey-demo"), show_default=True,
              help="Output folder (report.md, report.png, demo.json, work/).")
@click.option("--target", default=None, help="Target model folder/.gguf/hub id (default: SmolLM2 from PyPI).")
@click.option("--gguf-file", default=None, help="GGUF file name inside --target (a folder).")
@click.option("--source", default=None, help="LM to prune into the drafter backbone (default: the target).")
@click.option("--prompts", default=None, help="Prompt file (default: the prompts shipped with Osprey).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--cache", default=None, help="Model cache (default: $OSPREY_CACHE or ~/.cache/osprey).")
@click.option("--train-prompts", type=int, default=None, help="Training prompts (preset default).")
@click.option("--eval-prompts", type=int, default=None, help="Held-out prompts (preset default).")
@click.option("--max-new-tokens", type=int, default=None, help="Response length cap (preset default).")
@click.option("--prune-layers", type=int, default=None, help="Blocks kept from the source (preset default).")
@click.option("--distill-steps", type=int, default=None, help="Distillation steps (preset default).")
@click.option("--draft-steps", type=int, default=None, help="Draft steps S per verify step (preset default).")
@click.option("--live-steps", default="auto", show_default=True,
              help="Draft length of the live run: 'auto' (chosen per round, 0 = a plain step) or a fixed S.")
@click.option("--draft-vocab", type=int, default=None,
              help="Draft vocabulary: the N most frequent target tokens of the training store (preset default).")
@click.option("--lr", type=float, default=None, help="Distillation learning rate (default 3e-3).")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random part.")
def demo(quick: bool, out: Path, target: str | None, gguf_file: str | None, source: str | None,
         prompts: str | None, device: str, cache: str | None, train_prompts: int | None,
         eval_prompts: int | None, max_new_tokens: int | None, prune_layers: int | None,
         distill_steps: int | None, draft_steps: int | None, draft_vocab: int | None, live_steps: str,
         lr: float | None,
         threads: int | None, seed: int) -> None:
    """Fetch a small target, build stores, prune/convert/distill a drafter, evaluate offline and live.

    The model is cached in --cache, $OSPREY_CACHE or ~/.cache/osprey.

    \b
    Example:
      osprey demo --quick --out osprey-demo
    """
    from osprey_train.demo.pipeline import DemoConfig, lossless_failure, run
    from osprey_train.demo.report import headline

    result = run(DemoConfig(out=out, quick=quick, target=target, gguf_file=gguf_file, source=source,
                            prompts=prompts, device=device, cache=cache, train_prompts=train_prompts,
                            eval_prompts=eval_prompts, max_new_tokens=max_new_tokens, prune_layers=prune_layers,
                            distill_steps=distill_steps, draft_steps=draft_steps, draft_vocab=draft_vocab,
                            live_steps=live_steps,
                            threads=threads, seed=seed,
                            **({} if lr is None else {"lr": lr})))
    s = result.summary
    click.echo(headline(s, result.report_md))
    failure = lossless_failure(s)
    if failure is not None:
        click.echo(f"error: {failure}", err=True)
        raise SystemExit(1)
