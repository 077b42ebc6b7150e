"""``osprey eval acceptance`` and ``osprey eval matrix``: offline acceptance length of drafters.

Each command parses its options into a typed config and calls one ``run``.
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["acceptance", "matrix"]


@click.command("acceptance")
@click.option("--drafter", required=True, type=click.Path(path_type=Path), help="Drafter folder.")
@click.option("--store", required=True, help="Eval store (path or fsspec URL).")
@click.option("--steps", type=int, default=5, show_default=True, help="Draft length S.")
@click.option("--max-samples", type=int, default=0, show_default=True, help="Samples (0 = all).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--attention", type=click.Choice(["sdpa", "eager", "flex"]), default="sdpa", show_default=True,
              help="Attention used to draft every position at once (same drafts; speed differs).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def acceptance(drafter: Path, store: str, steps: int, max_samples: int, device: str, attention: str,
               as_json: bool) -> None:
    """Offline acceptance length: exact simulation of greedy chain speculative decoding.

    \b
    Example:
      osprey eval acceptance --drafter runs/osprey/final --store stores/eval --steps 4
    """
    from osprey_train.evaluation.acceptance import AcceptanceConfig, run

    report = run(AcceptanceConfig(drafter=drafter, store=store, steps=steps, max_samples=max_samples,
                                  device=device, attention=attention, progress=not as_json))
    click.echo(report.to_json() if as_json else report.to_text())


@click.command("matrix")
@click.option("--drafter", "drafters", multiple=True, required=True,
              help="NAME=DIR of a drafter (repeat); NAME equal to a store's NAME marks in-domain.")
@click.option("--store", "stores", multiple=True, required=True, help="NAME=STORE of an eval store (repeat).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder for matrix.md/json/png.")
@click.option("--steps", type=int, default=5, show_default=True, help="Draft length S.")
@click.option("--max-samples", type=int, default=0, show_default=True, help="Samples per store (0 = all).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
def matrix(drafters: tuple[str, ...], stores: tuple[str, ...], out: Path, steps: int, max_samples: int,
           device: str) -> None:
    """Cross-domain acceptance matrix of drafters x eval stores (markdown table + heatmap).

    \b
    Example:
      osprey eval matrix --drafter osprey=runs/osprey/final --store chat=stores/chat-eval \\
          --store code=stores/code-eval --out reports/matrix
    """
    from osprey_train.evaluation.matrix import MatrixConfig, parse_labeled, run, to_markdown

    res = run(MatrixConfig(drafters=parse_labeled(drafters, "--drafter"), stores=parse_labeled(stores, "--store"),
                           out=out, steps=steps, max_samples=max_samples, device=device))
    click.echo(to_markdown(res))
    click.echo(f"wrote {res.paths['markdown']}, {res.paths['png']}")
