"""``osprey data build``: run a target over conversations and write a feature store.

Parses the flags into :class:`osprey_data.builder.BuildConfig` and calls
:func:`osprey_data.builder.run`; heavy imports happen only when the command runs.
"""

from __future__ import annotations

import click

__all__ = ["build", "parse_layers"]


def parse_layers(value: str | None) -> tuple[int, ...] | None:
    """``"2,15,27"`` -> (2, 15, 27); None/"" -> None (the default taps)."""
    if value is None or not value.strip():
        return None
    try:
        return tuple(int(v) for v in value.replace(" ", "").split(",") if v)
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 2,15,27, got {value!r}",
                                 param_hint="--layers") from None


@click.command("build")
@click.option("--target", required=True, help="Target model: local HF folder, hub id (online), or .gguf file.")
@click.option("--input", "inputs", required=True, multiple=True,
              help="Input file (JSONL/JSON/Parquet) or saved datasets folder; repeatable.")
@click.option("--out", required=True, help="Store directory or fsspec URL.")
@click.option("--backend", type=click.Choice(["hf", "sglang"]), default="hf", show_default=True,
              help="Engine running the target.")
@click.option("--regenerate/--no-regenerate", default=True, show_default=True,
              help="Replace assistant turns with the target's own responses, or teacher-force given ones.")
@click.option("--max-new-tokens", type=int, default=512, show_default=True, help="Generated tokens per turn.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling mass.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed (per sample and turn).")
@click.option("--last-turn-only", is_flag=True, help="Regenerate only the last assistant turn.")
@click.option("--layers", default=None, help="Tap ids, HF hidden_states convention, e.g. 2,15,27 "
              "(default [2, L//2, L-3]).")
@click.option("--topk", type=int, default=64, show_default=True, help="Top-k log-probs stored per position.")
@click.option("--hidden-codec", default="bf16-blosc", show_default=True,
              help="Hidden-state codec: bf16-blosc (lossless bf16), bf16 (lossless bf16, older byte-plane "
                   "layout) or fp8.")
@click.option("--final-hidden", is_flag=True, help="Also store the post-norm last hidden state.")
@click.option("--max-length", type=int, default=4096, show_default=True, help="Longest stored sequence (tokens).")
@click.option("--overflow", type=click.Choice(["truncate", "skip"]), default="truncate", show_default=True,
              help="Policy for sequences over --max-length (counted in the summary).")
@click.option("--on-error", type=click.Choice(["raise", "skip"]), default="raise", show_default=True,
              help="Malformed input: stop, or record it in the store's errors file and go on.")
@click.option("--limit", type=int, default=None, help="Use only the first N samples.")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Samples per batch.")
@click.option("--shard-max-tokens", type=int, default=65536, show_default=True,
              help="Tokens per store shard, the unit of commit (an interrupted build commits a shorter one).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="Target precision: auto is float32 on CPU and bfloat16 on CUDA for --backend "
              "hf; bfloat16 for --backend sglang on CPU (its only precision there).")
@click.option("--num-workers", type=int, default=None, help="Independent workers (default WORLD_SIZE or 1).")
@click.option("--worker-index", type=int, default=None, help="This worker's index (default RANK or 0).")
@click.option("--gguf-file", default=None, help="GGUF file inside the --target folder.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing --out (a store or any other folder) with a new store.")
def build(target, inputs, out, backend, regenerate, max_new_tokens, temperature, top_p, seed,
          last_turn_only, layers, topk, hidden_codec, final_hidden, max_length, overflow, on_error,
          limit, batch_size, shard_max_tokens, device, dtype, num_workers, worker_index, gguf_file, overwrite) -> None:
    """Run TARGET over conversations; write responses, tapped hidden states and top-k log-probs.

    Rerun the same command to resume. Ctrl-C (or SIGTERM) stops after committing every finished
    sample; exit codes: 0 done, 2 bad option or input, 130/143 interrupted (rerun to resume).

    \b
    Example:
      osprey data build --target HuggingFaceTB/SmolLM2-135M-Instruct --input chat.jsonl \\
          --out stores/train --max-new-tokens 256 --device cpu
    """
    from osprey_data.builder import BuildConfig
    from osprey_data.builder.runner import run

    config = BuildConfig(
        target=target, inputs=tuple(inputs), out=out, backend=backend, regenerate=regenerate,
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
        last_turn_only=last_turn_only, layers=parse_layers(layers), topk=topk,
        hidden_codec=hidden_codec, final_hidden=final_hidden, max_length=max_length,
        overflow=overflow, on_error=on_error, limit=limit, batch_size=batch_size,
        shard_max_tokens=shard_max_tokens, device=device, dtype=dtype, num_workers=num_workers, worker_index=worker_index,
        gguf_file=gguf_file, overwrite=overwrite,
    )
    summary = run(config)
    click.echo(summary.format())
    if config.num_workers > 1:
        click.echo(f"worker {config.worker_index} done; when all {config.num_workers} workers finish, "
                   f"run `osprey data merge {out}` to publish their shards")
