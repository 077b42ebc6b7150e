"""``osprey export``: write a drafter in the layout a serving engine (or Osprey itself) loads."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["export"]


@click.command("export")
@click.option("--drafter", required=True, type=click.Path(path_type=Path), help="Drafter folder to export.")
@click.option("--format", "fmt", required=True, type=click.Choice(["sglang", "vllm", "hf"]),
              help="sglang: LlamaForCausalLMEagle3 / Osprey external class; vllm: speculators eagle3; "
                   "hf: Osprey's documented checkpoint.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output folder.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Weights dtype of the export.")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
def export(drafter: Path, fmt: str, out: Path, dtype: str, overwrite: bool) -> None:
    """Export a drafter for serving (SGLang, vLLM) or as an Osprey checkpoint.

    \b
    Example:
      osprey export --drafter runs/osprey/final --format sglang --out exports/osprey
    """
    from osprey_train.export import ExportConfig, run

    result = run(ExportConfig(drafter=drafter, format=fmt, out=out, dtype=dtype, overwrite=overwrite))
    click.echo(f"exported {result.arch} drafter as {result.format} to {result.out}")
