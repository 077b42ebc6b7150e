"""Metrics of a run: ``metrics.jsonl`` (one JSON record per line) and ``metrics.png`` curves.

Records have ``kind`` ("train" or "eval"), ``step`` and numbers. On resume, records of steps
after the checkpoint are dropped (they belong to the abandoned continuation), so the curves
of a resumed run look exactly like those of a straight run. The plot (matplotlib, Agg) shows
the loss (train and any ``eval_loss``) and, on the right, the perplexity: ``exp`` of the train
metric the task names as its per-token cross-entropy (``perplexity_of``; none for a loss that is
not one, such as distillation's sum over TTT steps, where exp would mean nothing) and
``eval_ppl``/``*ppl*`` eval metrics; without any perplexity the right panel shows the per-step
accuracies (``acc_*``) instead. Every point is marked, so a run of one or two records is not a
blank plot. Written to a temporary name and renamed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from osprey_data.atomic import atomic_file, write_text

__all__ = ["MetricsLog", "read_metrics", "plot_metrics", "metrics_figure"]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` (a torn last line from a crash is ignored)."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class MetricsLog:
    """Appends records to ``out_dir/metrics.jsonl`` on the main rank (no-op elsewhere)."""

    def __init__(self, out_dir: Path, *, enabled: bool, resume_step: int | None = None,
                 perplexity_of: str | None = None) -> None:
        self.perplexity_of = perplexity_of
        self.path = Path(out_dir) / "metrics.jsonl"
        self.plot_path = Path(out_dir) / "metrics.png"
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            if self.path.exists():
                self.path.unlink()
        else:
            kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= resume_step]
            self._rewrite(kept)

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        write_text(self.path, "".join(json.dumps(r) + "\n" for r in records))

    def log(self, record: dict[str, Any]) -> None:
        """Append one record (flushed immediately so a crash keeps everything logged so far)."""
        if not self.enabled:
            return
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def plot(self) -> Path | None:
        """Redraw ``metrics.png`` from the log; returns its path."""
        if not self.enabled:
            return None
        return plot_metrics(read_metrics(self.path), self.plot_path, perplexity_of=self.perplexity_of)


def _series(records: list[dict[str, Any]], kind: str, key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        if r.get("kind") == kind and isinstance(r.get(key), (int, float)) and math.isfinite(r[key]):
            xs.append(int(r["step"]))
            ys.append(float(r[key]))
    return xs, ys


def plot_metrics(records: list[dict[str, Any]], out_path: Path, title: str | None = None, *,
                 perplexity_of: str | None = None) -> Path:
    """Draw loss and perplexity (or accuracy) curves of ``records`` into ``out_path`` (PNG);
    ``perplexity_of`` names the train metric that is a per-token cross-entropy in nats, if any."""
    import matplotlib.pyplot as plt

    fig = metrics_figure(records, title, perplexity_of=perplexity_of)
    out_path = Path(out_path)
    with atomic_file(out_path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
    return out_path


def metrics_figure(records: list[dict[str, Any]], title: str | None = None, *,
                   perplexity_of: str | None = None) -> Any:
    """The matplotlib figure of :func:`plot_metrics` (loss axes first, then perplexity/accuracy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_ppl) = plt.subplots(1, 2, figsize=(11, 4))
    xs, ys = _series(records, "train", "loss")
    if xs:
        ax_loss.plot(xs, ys, marker=".", label="train loss")
    if perplexity_of is not None:
        px, py = _series(records, "train", perplexity_of)
        if px:
            ax_ppl.plot(px, [math.exp(min(y, 50.0)) for y in py], marker=".", label=f"train ppl (exp {perplexity_of})")
    eval_keys = sorted({k for r in records if r.get("kind") == "eval" for k in r if k not in ("kind", "step")})
    for key in eval_keys:
        ex, ey = _series(records, "eval", key)
        if not ex:
            continue
        target = ax_ppl if "ppl" in key or "perplexity" in key else ax_loss if "loss" in key else None
        if target is not None:
            target.plot(ex, ey, marker="o", label=key)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (nats/token)")
    ax_ppl.set_xlabel("step")
    if ax_ppl.get_lines():
        ax_ppl.set_ylabel("perplexity")
        ax_ppl.set_yscale("log")
    else:   # the loss is no cross-entropy (distillation): per-step accuracies say more
        acc_keys = sorted({k for r in records if r.get("kind") == "train" for k in r if k.startswith("acc")})
        for key in acc_keys:
            sx, sy = _series(records, "train", key)
            if sx:
                ax_ppl.plot(sx, sy, marker=".", label=f"train {key}")
        ax_ppl.set_ylabel("accuracy" if acc_keys else "(no perplexity: the loss is not a cross-entropy)")
    for ax in (ax_loss, ax_ppl):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
