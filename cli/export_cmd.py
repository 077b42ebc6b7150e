"""``osprey export``: write a drafter in the layout a serving engine (or Osprey itself) loads."""

from __future__ import annotations

from pathlib import Path

import click

from osprey_data.cpu_threads import THREADS_HELP

__all__ = ["export"]


@click.command("export")
@click.option("--drafter", required=True, type=click.Path(path_type=Path), help="Drafter folder to export.")
@click.option("--format", "fmt", required=True, type=click.Choice(["sglang", "vllm", "hf"]),
              help="sglang: LlamaForCausalLMEagle3 / Osprey external class; vllm: speculators eagle3; "
                   "hf: Osprey's documented checkpoint.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output folder.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="bfloat16",
              show_default=True, help="Floating weights' dtype: bfloat16 is what the engines serve (half the "
                                      "bytes); float32 for exact parity with Osprey's fp32 figures. d2t stays int64.")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--sweep", type=click.Path(path_type=Path), default=None,
              help="sweep.json of `osprey eval sweep --cost ...`: its best shape becomes the recommended "
                   "--speculative-* flags (serving.json, README.md); default: the untuned chain 5,1,6.")
@click.option("--threads", type=int, default=None, help=THREADS_HELP)
def export(drafter: Path, fmt: str, out: Path, dtype: str, overwrite: bool, sweep: Path | None,
           threads: int | None) -> None:
    """Export a drafter for serving (SGLang, vLLM) or as an Osprey checkpoint.

    \b
    Example:
      osprey export --drafter runs/osprey/final --format sglang --out exports/osprey
      osprey export --drafter runs/osprey/final --format sglang --out exports/osprey --sweep reports/sweep/sweep.json
    """
    from osprey_train.export import ExportConfig, run

    result = run(ExportConfig(drafter=drafter, format=fmt, out=out, dtype=dtype, overwrite=overwrite, sweep=sweep,
                              threads=threads))
    click.echo(f"exported {result.arch} drafter as {result.format} ({result.dtype} weights) to {result.out}")
    if result.serving is not None:
        shape = result.serving.shape
        click.echo(f"serving flags ({result.serving.label}): "
                   f"{' '.join(shape.sglang_flags())}; see {result.out / 'serving.json'}")
