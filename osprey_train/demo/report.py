"""The demo's report: a short markdown page and one PNG comparing offline vs live figures.

Inputs are the plain-JSON summary the pipeline assembles (also written as ``demo.json``), so the
report can be regenerated from a finished run without re-running anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from osprey_data.atomic import atomic_file, write_text

__all__ = ["write_report", "render_markdown", "plot"]


def _fmt(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def render_markdown(summary: dict[str, Any], png_name: str = "report.png") -> str:
    """The report page (markdown) for one demo summary."""
    sizes = summary["sizes"]
    off = summary["offline"]
    live = summary["live"]
    domains = sorted(set(off["distilled"]["per_domain"]) | set(live["per_domain"]))
    t = summary["timings_s"]
    lines = [
        "# Osprey demo report",
        "",
        f"Target: **{summary['target']}**; drafter source: {summary['source']}, pruned to "
        f"{sizes['prune_layers']} block(s); device {summary['device']} ({summary['cpu_threads']} threads).",
        f"Preset: {'quick' if summary['quick'] else 'full'}; {sizes['train_prompts']} train / "
        f"{sizes['eval_prompts']} held-out prompts, responses up to {sizes['max_new_tokens']} tokens; "
        f"{summary['distill']['steps']} distillation steps (TTT K={sizes['ttt_steps']}); "
        f"S={sizes['draft_steps']} draft steps per verify step.",
        "",
        "## Acceptance length (tokens per verify step, greedy, held-out prompts)",
        "",
        "| domain | offline, converted (init) | offline, distilled | live, distilled |",
        "|---|---:|---:|---:|",
    ]
    for d in domains:
        lines.append(f"| {d} | {_fmt(off['converted']['per_domain'].get(d))} | "
                     f"{_fmt(off['distilled']['per_domain'].get(d))} | "
                     f"{_fmt(live['per_domain'].get(d, {}).get('acceptance_length'))} |")
    lines.append(f"| **all** | {_fmt(off['converted']['overall'])} | **{_fmt(off['distilled']['overall'])}** | "
                 f"**{_fmt(live['acceptance_length'])}** |")
    diff = live["acceptance_length"] - off["distilled"]["overall"]
    lines += [
        "",
        f"Offline vs live (same drafter, same prompts): difference {diff:+.4f}. The store holds exactly the "
        f"ids the target generated, so greedy offline acceptance equals live acceptance; a gap means the "
        f"live run stopped differently (e.g. another max_new_tokens) or the store is not greedy.",
        "",
        "## Speed (same run, same prompts)",
        "",
        "| decoding | tokens | seconds | tokens/s |",
        "|---|---:|---:|---:|",
        f"| target alone | {live['plain_tokens']} | {_fmt(live['plain_seconds'], 2)} | "
        f"{_fmt(live['plain_tokens_per_s'], 1)} |",
        f"| speculative (Osprey drafter) | {live['spec_tokens']} | {_fmt(live['spec_seconds'], 2)} | "
        f"{_fmt(live['spec_tokens_per_s'], 1)} |",
        "",
        f"Speedup x{_fmt(live['speedup'], 2)}. Greedy speculative outputs identical to plain decoding: "
        f"{live['greedy_identical']}/{live['num_prompts']}.",
        "",
        f"![offline vs live]({png_name})",
        "",
        "## Wall time",
        "",
        "| stage | seconds |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v:.1f} |" for k, v in t.items()]
    la, lb = summary.get("load_average_before"), summary.get("load_average_after")
    if la is not None:
        lines += ["", f"1-minute load average: {la:.2f} before, {_fmt(lb, 2)} after (a shared machine runs slower)."]
    lines += ["", "Small prompt set and a short distillation: the figures show the pipeline works end to "
              "end, not the paper's quality."]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: Path) -> Path:
    """Two panels: acceptance length per domain (offline init / offline / live), tokens/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    off, live = summary["offline"], summary["live"]
    domains = sorted(set(off["distilled"]["per_domain"]) | set(live["per_domain"])) + ["all"]

    def values(source: dict, key: str) -> list[float]:
        return [source["overall"] if d == "all" else source["per_domain"].get(d, 0.0) for d in domains] \
            if key == "offline" else \
            [live["acceptance_length"] if d == "all" else live["per_domain"].get(d, {}).get("acceptance_length", 0.0)
             for d in domains]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.27
    xs = range(len(domains))
    ax1.bar([x - width for x in xs], values(off["converted"], "offline"), width, label="offline, converted")
    ax1.bar(list(xs), values(off["distilled"], "offline"), width, label="offline, distilled")
    ax1.bar([x + width for x in xs], values(live, "live"), width, label="live, distilled")
    ax1.set_xticks(list(xs), domains)
    ax1.set_ylabel("acceptance length (tokens / verify step)")
    ax1.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax1.legend(fontsize=8)
    ax1.set_title(f"S={summary['sizes']['draft_steps']}, greedy, held-out prompts")
    speeds = [live["plain_tokens_per_s"] or 0.0, live["spec_tokens_per_s"]]
    ax2.bar(["target alone", "speculative"], speeds, color=["grey", "tab:green"])
    ax2.set_ylabel("tokens / s")
    ax2.set_title(f"x{live['speedup']:.2f}" if live.get("speedup") else "speed")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def write_report(summary: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.md`` into ``out``; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    png = plot(summary, out / "report.png")
    md = write_text(out / "report.md", render_markdown(summary, png.name))
    return md, png
