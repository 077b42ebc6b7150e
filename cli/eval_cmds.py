"""``osprey eval acceptance`` and ``osprey eval matrix``: offline acceptance length of drafters.

Each command parses its options into a typed config and calls one ``run``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from osprey_train.evaluation.options import DraftingOptions

__all__ = ["acceptance", "matrix", "AcceptanceConfig", "run_acceptance"]


@dataclass(kw_only=True)
class AcceptanceConfig(DraftingOptions):
    """Options of ``osprey eval acceptance``."""

    drafter: Path
    """Drafter folder."""
    store: str
    """Eval store (responses generated greedily by the target for an exact figure)."""

    def __post_init__(self) -> None:
        self.drafter = Path(self.drafter)
        self.check_drafting("acceptance")


def run_acceptance(cfg: AcceptanceConfig):
    """Load the drafter and store, check they belong together, and simulate."""
    from osprey_data.store import StoreReader
    from osprey_data.target import check_compatible
    from osprey_train.evaluation.acceptance import evaluate_acceptance
    from osprey_train.models import load_drafter

    drafter = load_drafter(cfg.drafter, device=cfg.device)
    reader = StoreReader(cfg.store)
    check_compatible(drafter.config, reader.header.target, taps=reader.header.taps,
                     where=f"acceptance: drafter {cfg.drafter} on store {cfg.store}")
    return evaluate_acceptance(drafter, reader, steps=cfg.steps, max_samples=cfg.max_samples or None,
                               impl=cfg.attention, progress=cfg.progress)


@click.command("acceptance")
@click.option("--drafter", required=True, type=click.Path(path_type=Path), help="Drafter folder.")
@click.option("--store", required=True, help="Eval store (path or fsspec URL).")
@click.option("--steps", type=int, default=5, show_default=True, help="Draft length S.")
@click.option("--max-samples", type=int, default=0, show_default=True, help="Samples (0 = all).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N].")
@click.option("--attention", type=click.Choice(["sdpa", "eager", "flex"]), default="sdpa", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def acceptance(drafter: Path, store: str, steps: int, max_samples: int, device: str, attention: str,
               as_json: bool) -> None:
    """Offline acceptance length: exact simulation of greedy chain speculative decoding."""
    report = run_acceptance(AcceptanceConfig(drafter=drafter, store=store, steps=steps, max_samples=max_samples,
                                             device=device, attention=attention, progress=not as_json))
    click.echo(report.to_json() if as_json else report.to_text())


@click.command("matrix")
@click.option("--drafter", "drafters", multiple=True, required=True,
              help="NAME=DIR of a drafter (repeat); NAME equal to a store's NAME marks in-domain.")
@click.option("--store", "stores", multiple=True, required=True, help="NAME=STORE of an eval store (repeat).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder for matrix.md/json/png.")
@click.option("--steps", type=int, default=5, show_default=True, help="Draft length S.")
@click.option("--max-samples", type=int, default=0, show_default=True, help="Samples per store (0 = all).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N].")
def matrix(drafters: tuple[str, ...], stores: tuple[str, ...], out: Path, steps: int, max_samples: int,
           device: str) -> None:
    """Cross-domain acceptance matrix of drafters x eval stores (markdown table + heatmap)."""
    from osprey_train.evaluation.matrix import MatrixConfig, parse_labeled, run, to_markdown

    res = run(MatrixConfig(drafters=parse_labeled(drafters, "--drafter"), stores=parse_labeled(stores, "--store"),
                           out=out, steps=steps, max_samples=max_samples, device=device))
    click.echo(to_markdown(res))
    click.echo(f"wrote {res.paths['markdown']}, {res.paths['png']}")
