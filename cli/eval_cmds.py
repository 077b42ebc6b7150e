"""``osprey eval acceptance``, ``osprey eval sweep`` and ``osprey eval matrix``: offline acceptance length.

Each command parses its options into a typed config and calls one ``run``; the options of
``acceptance`` are generated from :class:`osprey_train.evaluation.options.AcceptanceConfig`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from osprey_cli.config_options import ConfigOptions
from osprey_data.cpu_threads import THREADS_HELP
from osprey_train.evaluation.options import KV_MODES, AcceptanceConfig

__all__ = ["acceptance", "matrix", "sweep"]

ACCEPTANCE_OPTIONS = ConfigOptions(AcceptanceConfig)


def _given(name: str) -> bool:
    """Whether the option ``name`` of the running command was given (not left at its default)."""
    source = click.get_current_context().get_parameter_source(name)
    return source is not None and source != click.core.ParameterSource.DEFAULT


def _tree_shapes(values: tuple[str, ...]) -> list:
    """Parse repeated ``--tree S,K,N``, echoing SGLang's adjustments to stderr."""
    from osprey_train.evaluation.tree_shape import parse_tree_shape

    shapes = []
    for text in values:
        shape, note = parse_tree_shape(text)
        if note:
            click.echo(f"note: --tree {text}: {note}", err=True)
        shapes.append(shape)
    return shapes


def _ints(text: str, option: str) -> tuple[int, ...]:
    from osprey_data.errors import ConfigError

    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected comma-separated integers") from None


_TREE_HELP = ("SGLang tree shape STEPS,TOPK,NUM_DRAFT_TOKENS (--speculative-num-steps, --speculative-eagle-topk, "
              "--speculative-num-draft-tokens); repeat for several.")
_TEMPERATURE_HELP = ("Serving temperature: 0 = greedy (exact walk); > 0 = expected acceptance of chain speculative "
                     "sampling, from a store sampled from the target at this temperature (chains only).")
_MISMATCH_HELP = "With --temperature > 0: evaluate a store sampled otherwise instead of refusing it (a proxy figure)."
_KV_HELP = ("Tree drafting: which earlier tree nodes a drafted node attends to: sglang = SGLang's draft KV "
            "layout (as served), ancestors = an exact tree attention.")


@click.command("acceptance")
@ACCEPTANCE_OPTIONS
@click.option("--tree", "trees", multiple=True, help=_TREE_HELP)
@click.option("--draft-kv", type=click.Choice(KV_MODES), default="sglang", show_default=True, help=_KV_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (a list with --tree).")
def acceptance(trees: tuple[str, ...], draft_kv: str, as_json: bool, **params: Any) -> None:
    """Offline acceptance length: exact simulation of greedy chain (or --tree) speculative decoding.

    \b
    Example:
      osprey eval acceptance --drafter runs/osprey/final --store stores/eval --steps 4
      osprey eval acceptance --drafter runs/osprey/final --store stores/eval --tree 5,4,8 --tree 3,1,4
      osprey eval acceptance --drafter runs/osprey/final --store stores/eval-t0.7 --temperature 0.7
      osprey eval acceptance --drafter runs/osprey/final --store stores/eval --profile runs/osprey/final/speculation_profile.json
    """
    import json

    from osprey_data.errors import ConfigError
    from osprey_train.evaluation.acceptance import run

    config = ACCEPTANCE_OPTIONS.config(params, progress=not as_json)
    if not trees:
        report = run(config)
        click.echo(report.to_json() if as_json else report.to_text())
        return
    from osprey_train.evaluation import tree_acceptance

    if _given("steps"):
        raise ConfigError("acceptance: --steps is for chain drafting; with --tree give the steps in STEPS,TOPK,N")
    if config.profile is not None:
        raise ConfigError("acceptance: --profile describes chain drafting (per draft position); run it without --tree")
    reports = tree_acceptance.run(tree_acceptance.TreeAcceptanceConfig(
        drafter=config.drafter, store=config.store, trees=_tree_shapes(trees), draft_kv=draft_kv,
        max_samples=config.max_samples, device=config.device, attention=config.attention,
        temperature=config.temperature, threads=config.threads, progress=not as_json))
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in reports], indent=2, sort_keys=True))
    else:
        click.echo("\n\n".join(r.to_text() for r in reports))


@click.command("sweep")
@click.option("--drafter", required=True, type=click.Path(path_type=Path), help="Drafter folder.")
@click.option("--store", required=True, help="Eval store (path or fsspec URL).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("osprey-sweep"), show_default=True,
              help="Folder for sweep.md, sweep.json, sweep.png.")
@click.option("--cost", default=None,
              help="Cost model: a cost-model JSON file, the preset example-gpu (assumed, not measured), or "
                   "draft_step=F, optionally followed by ,verify_scale=F and ,round_overhead=F. Without it: "
                   "acceptance lengths only.")
@click.option("--tree", "trees", multiple=True, help=_TREE_HELP + " Replaces the grid.")
@click.option("--grid-steps", default="1,2,3,4,5,6", show_default=True, help="Grid: num-steps values.")
@click.option("--grid-topk", default="1,2,4,8", show_default=True, help="Grid: eagle-topk values.")
@click.option("--grid-tokens", default="4,8,16,32,64", show_default=True,
              help="Grid: num-draft-tokens values for topk > 1 (topk 1 serves steps + 1).")
@click.option("--draft-kv", type=click.Choice(["sglang", "ancestors"]), default="sglang", show_default=True,
              help=_KV_HELP)
@click.option("--max-samples", type=int, default=0, show_default=True, help="Samples (0 = all).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--threads", type=int, default=None, help=THREADS_HELP)
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help=_TEMPERATURE_HELP + " Needs --grid-topk 1 or chain --tree S,1,S+1.")
@click.option("--allow-temperature-mismatch", is_flag=True, help=_MISMATCH_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print sweep.json to stdout.")
def sweep(drafter: Path, store: str, out: Path, cost: str | None, trees: tuple[str, ...], grid_steps: str,
          grid_topk: str, grid_tokens: str, draft_kv: str, max_samples: int, device: str, threads: int | None,
          temperature: float, allow_temperature_mismatch: bool, as_json: bool) -> None:
    """Acceptance length of SGLang tree shapes, predicted speedups and the best shape (table + plot).

    \b
    Example:
      osprey eval sweep --drafter runs/osprey/final --store stores/eval --cost example-gpu --out reports/sweep
    """
    import json

    from osprey_train.evaluation.cost_model import parse_cost
    from osprey_train.evaluation.sweep import SweepConfig, run

    res = run(SweepConfig(drafter=drafter, store=store, out=out, cost=None if cost is None else parse_cost(cost),
                          trees=tuple(_tree_shapes(trees)), grid_steps=_ints(grid_steps, "--grid-steps"),
                          grid_topk=_ints(grid_topk, "--grid-topk"), grid_tokens=_ints(grid_tokens, "--grid-tokens"),
                          draft_kv=draft_kv, max_samples=max_samples, device=device, threads=threads,
                          temperature=temperature, allow_temperature_mismatch=allow_temperature_mismatch,
                          progress=not as_json))
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=2))
        return
    click.echo(res.to_markdown())
    click.echo(f"wrote {res.paths['markdown']}, {res.paths['json']}, {res.paths['png']}")


@click.command("matrix")
@click.option("--drafter", "drafters", multiple=True, required=True,
              help="NAME=DIR of a drafter (repeat); NAME equal to a store's NAME marks in-domain.")
@click.option("--store", "stores", multiple=True, required=True, help="NAME=STORE of an eval store (repeat).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder for matrix.md/json/png.")
@click.option("--steps", type=int, default=5, show_default=True, help="Draft length S.")
@click.option("--max-samples", type=int, default=0, show_default=True, help="Samples per store (0 = all).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--threads", type=int, default=None, help=THREADS_HELP)
@click.option("--temperature", type=float, default=0.0, show_default=True, help=_TEMPERATURE_HELP)
@click.option("--allow-temperature-mismatch", is_flag=True, help=_MISMATCH_HELP)
def matrix(drafters: tuple[str, ...], stores: tuple[str, ...], out: Path, steps: int, max_samples: int,
           device: str, threads: int | None, temperature: float, allow_temperature_mismatch: bool) -> None:
    """Cross-domain acceptance matrix of drafters x eval stores (markdown table + heatmap).

    \b
    Example:
      osprey eval matrix --drafter osprey=runs/osprey/final --store chat=stores/chat-eval \\
          --store code=stores/code-eval --out reports/matrix
    """
    from osprey_train.evaluation.matrix import MatrixConfig, parse_labeled, run, to_markdown

    res = run(MatrixConfig(drafters=parse_labeled(drafters, "--drafter"), stores=parse_labeled(stores, "--store"),
                           out=out, steps=steps, max_samples=max_samples, device=device, threads=threads,
                           temperature=temperature,
                           allow_temperature_mismatch=allow_temperature_mismatch))
    click.echo(to_markdown(res))
    click.echo(f"wrote {res.paths['markdown']}, {res.paths['png']}")
