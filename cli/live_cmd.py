"""``osprey eval live``: real speculative decoding with a target and a drafter, vs the target alone."""

from __future__ import annotations

import json

import click

__all__ = ["live"]


@click.command("live")
@click.option("--drafter", required=True, help="Drafter folder (Osprey or EAGLE-3).")
@click.option("--target", required=True, help="Target: HF folder, .gguf file or hub id (online only).")
@click.option("--input", "inputs", required=True, multiple=True, help="Prompt file(s); repeat for several.")
@click.option("--gguf-file", default=None, help="GGUF file name inside --target (a folder).")
@click.option("--steps", type=int, default=None, help="Draft steps per verify step (chain drafting) [default: 5].")
@click.option("--tree", default=None,
              help="Tree drafting (greedy) with SGLang's shape STEPS,TOPK,NUM_DRAFT_TOKENS instead of a chain.")
@click.option("--draft-kv", type=click.Choice(["sglang", "ancestors"]), default="sglang", show_default=True,
              help="Tree drafting: which earlier tree nodes a drafted node attends to (sglang = as served).")
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="0 = greedy (lossless); > 0 = rejection sampling (keeps the target distribution).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True, help="Tokens per prompt at most.")
@click.option("--limit", type=int, default=None, help="At most this many prompts (round-robin over domains).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@click.option("--tap-codec", type=click.Choice(["bf16", "fp8"]), default=None,
              help="Round live taps through a store codec, as the drafter saw them in training.")
@click.option("--no-baseline", is_flag=True, help="Skip plain decoding (no tokens/s ratio, no lossless check).")
@click.option("--allow-target-mismatch", is_flag=True, help="Run even if the drafter's target hashes differ.")
@click.option("--threads", type=int, default=None,
              help="torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores).")
@click.option("--precision", type=click.Choice(["auto", "float32", "bfloat16", "float16", "bf16-autocast"]),
              default="auto", show_default=True,
              help="Target precision: auto = bfloat16 (prepacked) on CUDA or an AMX/AVX512-BF16 CPU, else float32.")
@click.option("--draft-precision", type=click.Choice(["auto", "float32", "bfloat16", "float16", "bf16-autocast"]),
              default=None, help="Drafter precision [default: the target's].")
@click.option("--out", default=None, help="Also write the full report as JSON to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def live(drafter: str, target: str, inputs: tuple[str, ...], gguf_file: str | None, steps: int | None,
         tree: str | None, draft_kv: str, temperature: float, max_new_tokens: int, limit: int | None, device: str,
         seed: int, tap_codec: str | None, no_baseline: bool, allow_target_mismatch: bool, threads: int | None,
         precision: str, draft_precision: str | None, out: str | None, as_json: bool) -> None:
    """Speculative decoding of prompts: acceptance length per domain, tokens/s vs the target alone.

    \b
    Example:
      osprey eval live --drafter runs/osprey/final --target MODEL --input prompts.jsonl --steps 4
      osprey eval live --drafter runs/osprey/final --target MODEL --input prompts.jsonl --tree 5,4,8
    """
    from osprey_data.errors import ConfigError
    from osprey_train.evaluation.live import LiveConfig, run
    from osprey_train.evaluation.tree_shape import parse_tree_shape

    shape = None
    if tree is not None:
        if steps is not None:
            raise ConfigError("live: --steps is for chain drafting; with --tree give the steps in STEPS,TOPK,N")
        shape, note = parse_tree_shape(tree)
        if note:
            click.echo(f"note: --tree {tree}: {note}", err=True)
    report = run(LiveConfig(drafter=drafter, target=target, inputs=inputs, gguf_file=gguf_file,
                            steps=5 if steps is None else steps, tree=shape, draft_kv=draft_kv,
                            temperature=temperature, max_new_tokens=max_new_tokens, limit=limit, device=device,
                            seed=seed, tap_codec=tap_codec, baseline=not no_baseline,
                            allow_target_mismatch=allow_target_mismatch, threads=threads, precision=precision,
                            draft_precision=draft_precision, out=out,
                            progress=not as_json))
    if as_json:
        doc = report.to_dict()
        doc.pop("samples")
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(report.to_markdown(), nl=False)
