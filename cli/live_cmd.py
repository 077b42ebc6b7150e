"""``osprey eval live``: real speculative decoding with a target and a drafter, vs the target alone.

The options are generated from :class:`osprey_train.evaluation.options.LiveConfig`; ``--tree``
(parsed with SGLang's adjustments echoed) and ``--json`` are the command's own.
"""

from __future__ import annotations

import json
from typing import Any

import click

from osprey_cli.config_options import ConfigOptions
from osprey_data.text import printable, printable_text
from osprey_train.evaluation.options import LiveConfig

__all__ = ["live"]

OPTIONS = ConfigOptions(LiveConfig)


@click.command("live")
@OPTIONS
@click.option("--tree", default=None,
              help="Tree drafting (greedy) with SGLang's shape STEPS,TOPK,NUM_DRAFT_TOKENS instead of a chain.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def live(tree: str | None, as_json: bool, **params: Any) -> None:
    """Speculative decoding of prompts: acceptance length per domain, tokens/s vs the target alone.

    \b
    Example:
      osprey eval live --drafter runs/osprey/final --target MODEL --input prompts.jsonl --steps 4
      osprey eval live --drafter runs/osprey/final --target MODEL --input prompts.jsonl --tree 5,4,8
      osprey eval live --drafter runs/osprey/final --target MODEL --input prompts.jsonl --show-text
    """
    from osprey_data.errors import ConfigError
    from osprey_train.evaluation.live import run
    from osprey_train.evaluation.tree_shape import parse_tree_shape

    shape = None
    if tree is not None:
        source = click.get_current_context().get_parameter_source("steps")
        if source is not None and source != click.core.ParameterSource.DEFAULT:
            raise ConfigError("live: --steps is for chain drafting; with --tree give the steps in STEPS,TOPK,N")
        shape, note = parse_tree_shape(tree)
        if note:
            click.echo(f"note: --tree {tree}: {note}", err=True)
    config = OPTIONS.config(params, tree=shape, progress=not as_json)
    report = run(config)
    texts = [{"id": s["id"], "domain": s["domain"], "text": s["text"]} for s in report.samples]
    if as_json:
        doc = report.to_dict()
        doc.pop("samples")
        if config.show_text:
            doc["texts"] = texts
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(report.to_markdown(), nl=False)
        if config.show_text:
            click.echo("\n## Generated text\n")
            for t in texts:
                click.echo(f"### {printable(t['id'])} ({printable(t['domain'])})\n\n{printable_text(t['text'])}\n")
    if report.lossless is False:
        # greedy verification must never change the output: a split is a bug, never a figure
        split = [s["id"] for s in report.samples if s.get("identical") is False]
        click.echo(f"error: greedy speculative output differs from plain decoding on {len(split)} of "
                   f"{report.num_prompts} prompts ({', '.join(map(printable, split[:5]))}"
                   f"{', ...' if len(split) > 5 else ''}; first divergence at token {min(report.divergences)}); "
                   f"verify rows: {report.exactness.get('summary', 'unknown')}. Keep --out FILE and report it",
                   err=True)
        raise SystemExit(1)
