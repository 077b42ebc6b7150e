"""``osprey eval sweep``: acceptance length of a grid of SGLang tree shapes, predicted speedups, the best shape.

Every shape ``(steps, topk, num_draft_tokens)`` of the grid (or the shapes given with ``--tree``)
is evaluated offline on one store with :func:`~osprey_train.evaluation.tree_acceptance.evaluate_tree_acceptance`
(one tree growth per ``topk`` serves every shape with that ``topk``). With a cost model
(:mod:`cost_model`) each shape gets a round cost and a predicted speedup over plain decoding, and
the shape with the highest predicted speedup is the recommendation that
``osprey export --format sglang --sweep FILE`` turns into serving flags.

``run(SweepConfig)`` writes into ``out``: ``sweep.md`` (table, best shape, assumptions),
``sweep.json`` (schema ``schemas/tree-sweep.v1.json``) and ``sweep.png`` (acceptance length and
predicted speedup vs num_draft_tokens, one line per topk; at each point the best ``steps``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osprey_data.atomic import atomic_file, write_json, write_text
from osprey_data.errors import ConfigError, Interrupted
from osprey_data.interrupt import GracefulStop, StopRequested, signal_name
from osprey_data.schema_check import load_json, validate
from osprey_data.text import printable
from osprey_train.evaluation.acceptance import load_drafter_and_store, sampled_reports
from osprey_train.evaluation.cost_model import CostModel
from osprey_data.cpu_threads import note_to_stderr, torch_threads
from osprey_train.evaluation.options import DraftingOptions
from osprey_train.evaluation.tree_acceptance import TREE_SAMPLING_REASON, evaluate_tree_acceptance
from osprey_train.evaluation.tree_draft import KV_MODES
from osprey_train.evaluation.tree_shape import TreeShape, max_draft_nodes

__all__ = ["SweepConfig", "SweepResult", "SweepRow", "grid_shapes", "load_sweep", "run", "SWEEP_FORMAT",
           "DEFAULT_STEPS", "DEFAULT_TOPK", "DEFAULT_TOKENS"]

SWEEP_FORMAT = "osprey-tree-sweep"
SCHEMA = "tree-sweep.v1.json"
DEFAULT_STEPS = (1, 2, 3, 4, 5, 6)
DEFAULT_TOPK = (1, 2, 4, 8)
DEFAULT_TOKENS = (4, 8, 16, 32, 64)


def grid_shapes(steps: tuple[int, ...], topk: tuple[int, ...], tokens: tuple[int, ...]) -> list[TreeShape]:
    """Every valid shape of the grid: topk 1 gives the chain of each ``steps`` (SGLang's rule),
    topk > 1 every ``num_draft_tokens`` the tree has candidates for."""
    shapes: list[TreeShape] = []
    for k in sorted(set(topk)):
        for s in sorted(set(steps)):
            if k == 1:
                shapes.append(TreeShape.chain(s))
                continue
            shapes += [TreeShape(steps=s, topk=k, num_draft_tokens=n) for n in sorted(set(tokens))
                       if 2 <= n <= max_draft_nodes(s, k) + 1]
    return shapes


@dataclass(kw_only=True)
class SweepConfig(DraftingOptions):
    """Options of ``osprey eval sweep``."""

    drafter: Path
    """Drafter folder."""
    store: str
    """Eval store (responses generated greedily by the target for exact figures)."""
    out: Path = Path("osprey-sweep")
    """Folder for sweep.md / sweep.json / sweep.png."""
    trees: tuple[TreeShape, ...] = ()
    """Explicit shapes; empty = the grid below."""
    grid_steps: tuple[int, ...] = DEFAULT_STEPS
    """Grid: ``--speculative-num-steps`` values."""
    grid_topk: tuple[int, ...] = DEFAULT_TOPK
    """Grid: ``--speculative-eagle-topk`` values."""
    grid_tokens: tuple[int, ...] = DEFAULT_TOKENS
    """Grid: ``--speculative-num-draft-tokens`` values for topk > 1 (topk 1 uses steps + 1)."""
    cost: CostModel | None = None
    """Cost model for predicted speedups (None: acceptance lengths only, no best shape)."""
    draft_kv: str = "sglang"
    """Which earlier tree nodes a drafted node attends to: 'sglang' (as served) or 'ancestors'."""

    def __post_init__(self) -> None:
        self.drafter, self.out = Path(self.drafter), Path(self.out)
        self.check_drafting("sweep")
        if self.draft_kv not in KV_MODES:
            raise ConfigError(f"sweep: --draft-kv must be one of {KV_MODES}, got {self.draft_kv!r}")
        for name in ("grid_steps", "grid_topk", "grid_tokens"):
            values = tuple(int(v) for v in getattr(self, name))
            if not values or min(values) < 1:
                raise ConfigError(f"sweep: --{name.replace('_', '-')} needs positive integers, got {values}")
            setattr(self, name, values)
        self.trees = tuple(self.trees)
        if self.temperature > 0:
            trees = [s.label for s in self.shapes() if not s.is_chain]
            if trees:
                raise ConfigError(f"sweep: --temperature {self.temperature:g} with tree shapes ({', '.join(trees[:4])}"
                                  f"{', ...' if len(trees) > 4 else ''}): {TREE_SAMPLING_REASON}; sweep chains only "
                                  "(--grid-topk 1, or --tree S,1,S+1)")
        if self.cost is not None:  # price every shape now: a missing verify size fails before any work
            for shape in self.shapes():
                self.cost.round_cost(shape)

    def shapes(self) -> list[TreeShape]:
        """The shapes to evaluate, in table order."""
        if self.trees:
            return list(dict.fromkeys(self.trees))
        shapes = grid_shapes(self.grid_steps, self.grid_topk, self.grid_tokens)
        if not shapes:
            raise ConfigError("sweep: the grid holds no valid tree shape")
        return shapes


@dataclass
class SweepRow:
    """One shape's figures."""

    shape: TreeShape
    acceptance_length: float
    per_domain: dict[str, float]
    verify_rounds: int
    tokens: int
    round_cost: float | None = None
    speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**self.shape.to_dict(), "acceptance_length": self.acceptance_length, "per_domain": self.per_domain,
                "verify_rounds": self.verify_rounds, "tokens": self.tokens, "round_cost": self.round_cost,
                "speedup": self.speedup}


@dataclass
class SweepResult:
    """The sweep's rows, best shape and provenance (``to_dict`` is ``sweep.json``)."""

    rows: list[SweepRow]
    drafter: str
    store: str
    draft_kv: str
    num_samples: int
    proxy_reason: str | None
    cost: CostModel | None
    assumptions: list[str]
    paths: dict[str, str] = field(default_factory=dict)
    temperature: float = 0.0
    """Serving temperature: 0 = greedy; > 0 = expected acceptance of chain speculative sampling."""

    @property
    def best(self) -> SweepRow | None:
        """Highest predicted speedup (earliest in table order on ties); None without a cost model."""
        priced = [r for r in self.rows if r.speedup is not None]
        return max(priced, key=lambda r: r.speedup) if priced else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"format": SWEEP_FORMAT, "version": 1, "drafter": self.drafter, "store": self.store,
                "draft_kv": self.draft_kv, "num_samples": self.num_samples, "proxy": self.proxy_reason is not None,
                "proxy_reason": self.proxy_reason, "cost_model": None if self.cost is None else self.cost.to_dict(),
                "assumptions": self.assumptions, "rows": [r.to_dict() for r in self.rows],
                "best": None if best is None else best.to_dict(),
                **({"temperature": self.temperature} if self.temperature > 0 else {})}

    def to_markdown(self) -> str:
        best = self.best
        priced = self.cost is not None
        head = ["steps", "topk", "num_draft_tokens", "acceptance length"] + (
            ["round cost", "predicted speedup"] if priced else [])
        lines = [f"# Tree sweep: {self.drafter} on {self.store}", "",
                 f"{self.num_samples} samples; draft KV layout: {self.draft_kv}; acceptance length = tokens per "
                 "verify round (SGLang's accept length)"
                 + (f", expected under chain speculative sampling at temperature {self.temperature:g}."
                    if self.temperature > 0 else "."), "",
                 "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for r in self.rows:
            cells = [str(r.shape.steps), str(r.shape.topk), str(r.shape.num_draft_tokens), f"{r.acceptance_length:.3f}"]
            if priced:
                cells += [f"{r.round_cost:.3f}", f"x{r.speedup:.3f}"]
            if r is best:
                cells = [f"**{c}**" for c in cells]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        if best is not None and best.speedup < 1:
            lines.append(f"Every shape is predicted SLOWER than plain decoding with these costs ({self.cost.device}): "
                         f"the least slow, `{' '.join(best.shape.sglang_flags())}` (acceptance length "
                         f"{best.acceptance_length:.3f}), is predicted at x{best.speedup:.3f}. Serving this drafter "
                         f"does not pay here: distill it further, or measure the costs of your GPU.")
        elif best is not None:
            lines.append(f"Best predicted shape: `{' '.join(best.shape.sglang_flags())}` "
                         f"(acceptance length {best.acceptance_length:.3f}, predicted speedup x{best.speedup:.3f}, "
                         f"costs: {self.cost.device}).")
        else:
            lines.append("No cost model given (--cost): acceptance lengths only, no best shape.")
        if self.proxy_reason:   # blank lines as lines of their own: printable() would show a "\n"
            lines += ["", f"NOTE: proxy figures: {self.proxy_reason}."]
        for note in self.assumptions:
            lines += ["", f"Assumption: {note}."]
        return "\n".join(printable(line) for line in lines) + "\n"  # paths and the cost file's device text


def plot_sweep(res: SweepResult, path: Path) -> Path:
    """Acceptance length (and predicted speedup) vs num_draft_tokens, one line per topk, best steps per point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    priced = res.cost is not None
    fig, axes = plt.subplots(1, 2 if priced else 1, figsize=(11 if priced else 6, 4.2), squeeze=False)
    panels = [("acceptance_length", "acceptance length (tokens / round)")]
    if priced:
        panels.append(("speedup", "predicted speedup over plain decoding"))
    for ax, (key, label) in zip(axes[0], panels):
        for k in sorted({r.shape.topk for r in res.rows}):
            points: dict[int, SweepRow] = {}
            for r in (r for r in res.rows if r.shape.topk == k):
                n = r.shape.num_draft_tokens
                rank = (r.speedup if priced else r.acceptance_length)
                if n not in points or rank > (points[n].speedup if priced else points[n].acceptance_length):
                    points[n] = r
            xs = sorted(points)
            ax.plot(xs, [getattr(points[n], key) for n in xs], marker="o", label=f"topk {k}")
            for n in xs:
                ax.annotate(f"s{points[n].shape.steps}", (n, getattr(points[n], key)), fontsize=7,
                            textcoords="offset points", xytext=(3, 3))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("num_draft_tokens (best steps at each point: s<steps>)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    title = f"tree sweep ({res.num_samples} samples, draft KV {res.draft_kv})"
    if priced:
        title += f"; costs: {res.cost.device}"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path


def load_sweep(path: str | Path) -> dict[str, Any]:
    """Read and validate a ``sweep.json`` (errors name the file)."""
    return load_json(path, SCHEMA, what="sweep")


def run(cfg: SweepConfig) -> SweepResult:
    """Evaluate every shape, price it, write sweep.md / sweep.json / sweep.png into ``cfg.out``."""
    shapes = cfg.shapes()
    drafter, reader = load_drafter_and_store(cfg.drafter, cfg.store, device=cfg.device, command="sweep")
    try:
        with GracefulStop(), torch_threads(cfg.threads, note_to_stderr if cfg.progress else None):
            if cfg.temperature > 0:  # chains only (checked in the config): one drafting pass serves every length
                reports = sampled_reports(drafter, reader, [s.steps for s in shapes], temperature=cfg.temperature,
                                          max_samples=cfg.max_samples or None, impl=cfg.attention,
                                          progress=cfg.progress,
                                          allow_temperature_mismatch=cfg.allow_temperature_mismatch)
            else:
                reports = evaluate_tree_acceptance(drafter, reader, shapes, kv=cfg.draft_kv,
                                                   max_samples=cfg.max_samples or None, progress=cfg.progress)
    except StopRequested as exc:
        # one pass over the store scores every shape at once: until it ends no shape is finished
        raise Interrupted(f"eval sweep interrupted by {signal_name(exc.signum)} before its pass over the store "
                          f"ended; no shape was finished, so nothing was written to {cfg.out}. Rerun the same "
                          f"command (--max-samples N makes the pass shorter).", signum=exc.signum) from None
    rows = []
    for shape, rep in zip(shapes, reports):
        row = SweepRow(shape=shape, acceptance_length=rep.overall, per_domain=rep.per_domain,
                       verify_rounds=rep.num_verify_steps, tokens=rep.num_tokens)
        if cfg.cost is not None:
            row.round_cost = cfg.cost.round_cost(shape)
            row.speedup = cfg.cost.speedup(rep.overall, shape)
        rows.append(row)
    res = SweepResult(rows=rows, drafter=str(cfg.drafter), store=cfg.store, draft_kv=cfg.draft_kv,
                      num_samples=reports[0].num_samples, proxy_reason=reports[0].proxy_reason, cost=cfg.cost,
                      assumptions=[] if cfg.cost is None else cfg.cost.assumptions(shapes),
                      temperature=cfg.temperature)
    cfg.out.mkdir(parents=True, exist_ok=True)
    md, js, png = cfg.out / "sweep.md", cfg.out / "sweep.json", cfg.out / "sweep.png"
    doc = res.to_dict()
    validate(doc, SCHEMA, where=str(js))
    plot_sweep(res, png)
    write_text(md, res.to_markdown())
    write_json(js, doc)  # last: a sweep.json next to its table and plot means the sweep completed
    res.paths = {"markdown": str(md), "json": str(js), "png": str(png)}
    return res
