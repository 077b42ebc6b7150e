"""Cross-domain acceptance matrix: drafters x eval stores -> markdown table + heatmap PNG.

Each drafter and each store carries a *label* (``NAME=PATH`` on the command line, e.g.
``math=runs/math/final`` and ``math=stores/math-eval``). A cell is *in-domain* when the drafter's
label equals the store's label, *out-of-domain* otherwise (a drafter trained on a mix, e.g.
label ``mix``, has no in-domain store and only an out-of-domain mean). Per drafter the table
reports the in-domain mean and out-of-domain mean of its acceptance lengths, as in the paper's
cross-domain tables. Proxy cells (sampled responses) are marked with ``*``.

``run(MatrixConfig)`` writes ``matrix.md``, ``matrix.json`` and ``matrix.png`` into ``out``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from osprey_data import jsonio
from osprey_data.atomic import atomic_file, write_json, write_text
from osprey_data.cpu_threads import note_to_stderr, torch_threads
from osprey_data.errors import ConfigError, Interrupted
from osprey_data.interrupt import GracefulStop, StopRequested, signal_name
from osprey_data.store import StoreReader
from osprey_data.target_model import resolve_device
from osprey_train.evaluation.acceptance import evaluate_acceptance
from osprey_train.evaluation.early_checks import check_drafter_on_store
from osprey_train.evaluation.options import DraftingOptions
from osprey_train.models import load_drafter

__all__ = ["MatrixConfig", "MatrixResult", "parse_labeled", "run", "to_markdown", "plot_heatmap", "heatmap_figure",
           "summarize"]


def parse_labeled(items: list[str] | tuple[str, ...], what: str) -> list[tuple[str, str]]:
    """``NAME=PATH`` (or bare ``PATH``, labeled by its folder name) -> [(name, path)]."""
    out: list[tuple[str, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            path = item
            name = Path(item.rstrip("/")).name or item
        if not name or not path:
            raise ConfigError(f"matrix: bad {what} {item!r}; use NAME=PATH")
        out.append((name, path))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"matrix: duplicate {what} labels in {names}; give each a unique NAME=")
    return out


@dataclass(kw_only=True)
class MatrixConfig(DraftingOptions):
    """Options of ``osprey eval matrix``."""

    drafters: list[tuple[str, str]]
    """(label, drafter folder) pairs."""
    stores: list[tuple[str, str]]
    """(label, eval store) pairs; label == drafter label marks the in-domain cell."""
    out: Path
    """Output folder for matrix.md / matrix.json / matrix.png."""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if not self.drafters or not self.stores:
            raise ConfigError("matrix: give at least one --drafter and one --store")
        self.check_drafting("matrix")


@dataclass
class MatrixResult:
    drafters: list[str]
    stores: list[str]
    values: list[list[float]]
    """values[i][j]: acceptance length of drafter i on store j."""
    proxy: list[bool]
    """proxy[j]: store j's figures are proxies."""
    steps: int
    summary: dict[str, dict[str, float | None]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    temperature: float = 0.0
    """Serving temperature (0 = greedy; > 0 = expected AL of speculative sampling)."""


def summarize(drafters: list[str], stores: list[str], values: list[list[float]]) -> dict[str, dict]:
    """Per drafter: in-domain mean (cells with equal labels) and out-of-domain mean."""
    out = {}
    for i, d in enumerate(drafters):
        ind = [values[i][j] for j, s in enumerate(stores) if s == d]
        ood = [values[i][j] for j, s in enumerate(stores) if s != d]
        out[d] = {"in_domain": sum(ind) / len(ind) if ind else None,
                  "out_of_domain": sum(ood) / len(ood) if ood else None}
    return out


def to_markdown(res: MatrixResult) -> str:
    fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    head = ["drafter \\ store"] + [s + ("*" if p else "") for s, p in zip(res.stores, res.proxy)]
    head += ["in-domain", "out-of-domain mean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, d in enumerate(res.drafters):
        cells = []
        for j, s in enumerate(res.stores):
            v = f"{res.values[i][j]:.2f}"
            cells.append(f"**{v}**" if s == d else v)
        sm = res.summary[d]
        lines.append("| " + " | ".join([d, *cells, fmt(sm["in_domain"]), fmt(sm["out_of_domain"])]) + " |")
    how = "greedy chain" if res.temperature == 0 else f"expected, chain speculative sampling at T={res.temperature:g}"
    note = f"\nAcceptance length (tokens per verify step, {how}, S={res.steps}); bold = in-domain."
    if any(res.proxy):
        note += (" * = proxy (store responses not generated greedily by the target)." if res.temperature == 0 else
                 f" * = proxy (store responses not sampled from the target at T={res.temperature:g}).")
    return "\n".join(lines) + "\n" + note + "\n"


def plot_heatmap(res: MatrixResult, path: Path, *, title: str | None = None, cmap: str = "viridis",
                 center: float | None = None, xlabel: str = "eval store", ylabel: str = "drafter") -> Path:
    """Heatmap PNG of ``res.values`` (missing cells, None or NaN, are left blank and marked "–").

    ``center``: a diverging colour scale symmetric around this value (e.g. 1.0 for ratios).
    """
    import matplotlib.pyplot as plt

    fig = heatmap_figure(res, title=title, cmap=cmap, center=center, xlabel=xlabel, ylabel=ylabel)
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path


def heatmap_figure(res: MatrixResult, *, title: str | None = None, cmap: str = "viridis",
                   center: float | None = None, xlabel: str = "eval store", ylabel: str = "drafter") -> Any:
    """The matplotlib figure of :func:`plot_heatmap`. The title is wrapped to the figure's width
    (a one-column matrix is narrower than its title), with room made above the plot for each line."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vals = np.asarray([[np.nan if v is None else v for v in row] for row in res.values], dtype=float)
    width = max(3.2, 1.4 + 1.1 * len(res.stores))
    text = title or f"acceptance length (S={res.steps})"
    # about 11 characters per inch at the title's 12 pt; the colour bar's part of the width stays free
    title_lines = textwrap.wrap(text, width=max(12, int(width * 9))) or [text]
    fig, ax = plt.subplots(figsize=(width, 1.0 + 0.6 * len(res.drafters) + 0.25 * len(title_lines)))
    limits = {}
    if center is not None and np.isfinite(vals).any():
        half = float(np.nanmax(np.abs(vals - center))) or 1e-3
        limits = {"vmin": center - half, "vmax": center + half}
    im = ax.imshow(vals, cmap=cmap, aspect="auto", **limits)
    ax.set_xticks(range(len(res.stores)), [s + ("*" if p else "") for s, p in zip(res.stores, res.proxy)],
                  rotation=30, ha="right")
    ax.set_yticks(range(len(res.drafters)), res.drafters)
    for i in range(vals.shape[0]):
        for j in range(vals.shape[1]):
            bold = res.drafters[i] == res.stores[j]
            text = "–" if not np.isfinite(vals[i, j]) else f"{vals[i, j]:.2f}"
            ax.text(j, i, text, ha="center", va="center", color="w" if center is None else "k",
                    fontweight="bold" if bold else "normal")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(title_lines))
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


PARTIAL = "matrix.partial.json"


def _folder_fingerprint(path: str) -> list[list[Any]]:
    """Name, size and mtime of each file of a local drafter folder: a retrained drafter is noticed."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(folder.iterdir()) if f.is_file()]


def _identity(cfg: MatrixConfig, readers: list[tuple[str, StoreReader]]) -> dict[str, Any]:
    """What the finished cells of an interrupted run depend on (a rerun reuses them only if equal)."""
    return {"drafters": [[n, p, _folder_fingerprint(p)] for n, p in cfg.drafters],
            "stores": [[n, url, r.header.build_fingerprint, len(r)] for (n, url), (_, r) in zip(cfg.stores, readers)],
            "steps": cfg.steps, "max_samples": cfg.max_samples, "attention": cfg.attention,
            "temperature": cfg.temperature, "allow_temperature_mismatch": cfg.allow_temperature_mismatch}


def _load_partial(path: Path, identity: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The cells an interrupted run of the same matrix finished ({} when none or another matrix)."""
    if not path.is_file():
        return {}
    try:
        doc = jsonio.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("identity") != json.loads(json.dumps(identity)):
        return {}
    cells = doc.get("cells")
    return cells if isinstance(cells, dict) else {}


def run(cfg: MatrixConfig) -> MatrixResult:
    """Evaluate every drafter on every store and write the table, JSON and heatmap.

    Each finished cell is saved at once to ``OUT/matrix.partial.json``; on SIGINT/SIGTERM the cell
    in progress is dropped and :class:`~osprey_data.errors.Interrupted` says how many were kept.
    Rerunning the same command continues from them (the file is removed once the matrix is written).

    Raises:
        Interrupted: SIGINT/SIGTERM arrived; every finished cell was saved first.
    """
    readers = [(name, StoreReader(url)) for name, url in cfg.stores]
    partial_path = cfg.out / PARTIAL
    identity = _identity(cfg, readers)
    cells = _load_partial(partial_path, identity)
    total = len(cfg.drafters) * len(readers)
    reused = len(cells)
    # every pair still to compute, from the drafters' config.json: a misfit fails before any weights load
    for i, (dname, dpath) in enumerate(cfg.drafters):
        for j, (sname, reader) in enumerate(readers):
            if f"{i},{j}" not in cells:
                check_drafter_on_store(dpath, reader, where=f"matrix: drafter {dname!r} on store {sname!r}")
    with GracefulStop() as stop, torch_threads(cfg.threads, note_to_stderr if cfg.progress else None):
        try:
            for i, (_, dpath) in enumerate(cfg.drafters):
                if all(f"{i},{j}" in cells for j in range(len(readers))):
                    continue
                drafter = load_drafter(dpath, device=resolve_device(cfg.device))
                for j, (_, reader) in enumerate(readers):
                    if f"{i},{j}" in cells:
                        continue
                    rep = evaluate_acceptance(drafter, reader, steps=cfg.steps, max_samples=cfg.max_samples or None,
                                              impl=cfg.attention, progress=cfg.progress,
                                              temperature=cfg.temperature,
                                              allow_temperature_mismatch=cfg.allow_temperature_mismatch)
                    with stop.deferred():   # a finished cell is saved whole before a signal is acted on
                        cells[f"{i},{j}"] = {"overall": rep.overall, "proxy": bool(rep.proxy)}
                        cfg.out.mkdir(parents=True, exist_ok=True)
                        write_json(partial_path, {"identity": identity, "cells": cells})
        except StopRequested as exc:
            kept = (f"{len(cells)} of {total} cells finished ({reused} from an earlier run), kept in {partial_path}"
                    if cells else f"none of its {total} cells had finished")
            raise Interrupted(f"eval matrix interrupted by {signal_name(exc.signum)}: {kept}; the cell in progress "
                              f"was dropped. Rerun the same command to continue.", signum=exc.signum) from None
    values = [[cells[f"{i},{j}"]["overall"] for j in range(len(readers))] for i in range(len(cfg.drafters))]
    proxy = [any(cells[f"{i},{j}"]["proxy"] for i in range(len(cfg.drafters))) for j in range(len(readers))]
    res = MatrixResult(drafters=[d for d, _ in cfg.drafters], stores=[s for s, _ in cfg.stores],
                       values=values, proxy=proxy, steps=cfg.steps, temperature=cfg.temperature)
    res.summary = summarize(res.drafters, res.stores, values)
    cfg.out.mkdir(parents=True, exist_ok=True)
    md, js, png = cfg.out / "matrix.md", cfg.out / "matrix.json", cfg.out / "matrix.png"
    write_text(md, to_markdown(res))
    plot_heatmap(res, png)
    res.paths = {"markdown": str(md), "json": str(js), "png": str(png)}
    doc = {"drafters": res.drafters, "stores": res.stores, "values": values, "proxy": proxy, "steps": cfg.steps,
           "summary": res.summary}
    if cfg.temperature > 0:
        doc["temperature"] = cfg.temperature
    write_json(js, doc)
    partial_path.unlink(missing_ok=True)   # matrix.json is written: the cells live there now
    return res
