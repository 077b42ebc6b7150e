"""``osprey train prune`` (Stage 1) and ``osprey train convert`` (Stage 3) commands.

Each command parses its options into the stage's typed config and calls the stage's ``run``.
"""

from __future__ import annotations

from pathlib import Path

import click

from osprey_data.errors import ConfigError
from osprey_train.drafters.registry import DRAFTERS, arch_names

__all__ = ["prune", "convert"]


@click.command("prune")
@click.option("--source", required=True, help="Source model: HF folder, .gguf file or hub id.")
@click.option("--layers", required=True, type=int, help="Number of leading decoder blocks to keep.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output HF folder.")
@click.option("--gguf-file", default=None, help="GGUF file name inside --source (a folder).")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
def prune(source: str, layers: int, out: Path, gguf_file: str | None, overwrite: bool) -> None:
    """Stage 1: keep embedding, the first N blocks, final norm and LM head of a small LM.

    \b
    Example:
      osprey train prune --source ~/.cache/osprey/smollm2-135m-instruct --layers 2 --out runs/pruned
    """
    from osprey_train.stages.prune import PruneConfig, run

    result = run(PruneConfig(source=source, layers=layers, out=out, gguf_file=gguf_file, overwrite=overwrite))
    click.echo(f"pruned {result.source_layers} -> {result.kept_layers} layers "
               f"({result.num_parameters / 1e6:.2f}M parameters) into {result.out}")


@click.command("convert")
@click.option("--backbone", type=click.Path(path_type=Path), default=None,
              help="Pre-trained HF backbone folder (Llama/Qwen2/Qwen3); required for --arch osprey.")
@click.option("--target", default=None, help="Target model (folder, .gguf, hub id) or its tokenizer folder.")
@click.option("--store", default=None, help="Feature store of the target (identity, taps, eagle3 vocab).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output drafter folder.")
@click.option("--arch", type=click.Choice(arch_names()), default=arch_names()[0], show_default=True,
              help="; ".join(f"{s.name}: {s.summary}" for s in DRAFTERS.values()) + ".")
@click.option("--taps", default=None, help="Comma-separated tap layers (HF hidden_states ids) without --store.")
@click.option("--draft-vocab", "--draft-vocab-size", "draft_vocab_size", type=int, default=None,
              help="Draft vocabulary: the N target tokens most frequent at --store's loss-masked positions "
                   "(LM head cut to them, d2t map stored). Default: osprey the full target vocabulary, "
                   "eagle3 32000.")
@click.option("--eagle3-layers", type=int, default=1, show_default=True,
              help="--arch eagle3: decoder layers (2 = the parameter-matched control; engines serve 1).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random parts.")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
def convert(backbone: Path | None, target: str | None, store: str | None, out: Path, arch: str,
            taps: str | None, draft_vocab_size: int | None, eagle3_layers: int, seed: int, overwrite: bool) -> None:
    """Stage 3: align vocabulary, add zero-init conditioned QKV columns and W_c (or init EAGLE-3).

    \b
    Example:
      osprey train convert --backbone runs/backbone/final --store stores/train --out runs/osprey-init
      osprey train convert --arch eagle3 --target MODEL --store stores/train --out runs/eagle3-init
      osprey train convert --arch eagle3 --eagle3-layers 2 --target MODEL --store stores/train --out runs/e3-2l
    """
    from osprey_train.stages.convert import ConvertConfig, run

    tap_ids = None
    if taps:
        try:
            tap_ids = tuple(int(t) for t in taps.split(","))
        except ValueError:
            raise ConfigError(f"--taps must be comma-separated integers, got {taps!r}") from None
    result = run(ConvertConfig(backbone=backbone, target=target, store=store, out=out, arch=arch, taps=tap_ids,
                               draft_vocab_size=draft_vocab_size, eagle3_layers=eagle3_layers, seed=seed,
                               overwrite=overwrite))
    summary = ", ".join(f"{k}={v}" for k, v in result.stats.items() if isinstance(v, (int, float)))
    click.echo(f"wrote {arch} drafter to {result.out} ({summary})")
