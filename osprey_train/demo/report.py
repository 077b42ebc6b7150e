"""The demo's report: a short markdown page and one PNG comparing offline vs live figures.

Inputs are the plain-JSON summary the pipeline assembles (also written as ``demo.json``), so the
report can be regenerated from a finished run without re-running anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from osprey_data.atomic import atomic_file, write_text
from osprey_train.evaluation.live_report import draft_length_line, lossless_line, speedup_text

__all__ = ["write_report", "render_markdown", "plot", "figure", "limits_sentence", "acceptance_axis",
           "domain_counts", "reading_note", "headline"]


def _fmt(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def domain_counts(summary: dict[str, Any]) -> dict[str, int | None]:
    """Held-out prompts per domain (n): the live run decodes the eval store's prompts, one each."""
    live = summary["live"]["per_domain"]
    domains = set(summary["offline"]["distilled"]["per_domain"]) | set(live)
    return {d: live.get(d, {}).get("prompts") for d in sorted(domains)}


def reading_note(summary: dict[str, Any]) -> str:
    """How to read the acceptance figures: n per domain, and what 1.0 and S + 1 mean."""
    counts = [n for n in domain_counts(summary).values() if n is not None]
    steps = summary["sizes"]["draft_steps"]
    few = (f" A domain's figure comes from {min(counts)} to {max(counts)} prompt(s)"
           f"{' (n = 1: a single prompt, an anecdote rather than a measurement)' if min(counts) == 1 else ''}."
           if counts else "")
    return (f"n = held-out prompts per domain.{few} Acceptance length 1.0 means no drafted token was accepted "
            f"(each verify step kept only the target's own token); {steps + 1} (S + 1) means every draft was.")


def headline(summary: dict[str, Any], report_md: Any) -> str:
    """The demo's last line: both acceptance lengths, the speedup (saying so when it is a slowdown),
    the lossless count and where the report is."""
    live = summary["live"]
    auto = " (draft length auto)" if live.get("draft_length") else ""
    return (f"acceptance length: offline {summary['offline']['distilled']['overall']:.3f}, "
            f"live {live['acceptance_length']:.3f}{auto}; {speedup_text(live.get('speedup'))}, "
            f"{lossless_line(live.get('greedy_identical'), live['num_prompts'])}; report: {report_md}")


def _offline_vs_live(summary: dict[str, Any]) -> str:
    live, off = summary["live"], summary["offline"]
    if live.get("draft_length"):
        return (f"Offline vs live: live decoding chose its draft length every round (`--steps auto`: the S, 0 = "
                f"a plain step, that the measured costs and the acceptance so far say pays most), so its "
                f"tokens per verify round ({_fmt(live['acceptance_length'])}) is not offline's fixed "
                f"S={summary['sizes']['draft_steps']} acceptance length ({_fmt(off['distilled']['overall'])}); "
                f"`osprey demo --live-steps {summary['sizes']['draft_steps']}` decodes with that fixed S, "
                f"and then the two agree.")
    diff = live["acceptance_length"] - off["distilled"]["overall"]
    return (f"Offline vs live (same drafter, same prompts): difference {diff:+.4f}. The eval store and live "
            f"decoding both ran the target in {live.get('precision', {}).get('target', '?')}: the store's "
            f"responses are the target's greedy output, so greedy offline acceptance equals live acceptance; a "
            f"gap means the live run stopped differently (e.g. another max_new_tokens), or the builder's batched "
            f"forward and live single-stream decoding broke a near-tie of two logits differently.")


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
        f"S={sizes['draft_steps']} draft steps per verify step"
        + (" offline; live, the draft length is chosen every round (auto)." if live.get("draft_length") else "."),
        "",
        "## Acceptance length (tokens per verify step, greedy, held-out prompts)",
        "",
        "| domain | n | offline, converted (init) | offline, distilled | live, distilled |",
        "|---|---:|---:|---:|---:|",
    ]
    counts = domain_counts(summary)
    for d in domains:
        n = "?" if counts.get(d) is None else counts[d]
        lines.append(f"| {d} | {n} | {_fmt(off['converted']['per_domain'].get(d))} | "
                     f"{_fmt(off['distilled']['per_domain'].get(d))} | "
                     f"{_fmt(live['per_domain'].get(d, {}).get('acceptance_length'))} |")
    lines.append(f"| **all** | {live.get('num_prompts', '?')} | {_fmt(off['converted']['overall'])} | "
                 f"**{_fmt(off['distilled']['overall'])}** | **{_fmt(live['acceptance_length'])}** |")
    auto = draft_length_line(live.get("draft_length"), live.get("speedup"))
    lines += [
        "",
        reading_note(summary),
        "",
        _offline_vs_live(summary),
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
        f"{speedup_text(live.get('speedup')).capitalize()}. Greedy speculative outputs identical to plain decoding: "
        f"{lossless_line(live.get('greedy_identical'), live['num_prompts'])}. Verify rows: "
        f"{live.get('exactness', {}).get('summary', 'not recorded')}.",
        *([] if auto is None else ["", auto + "."]),
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
    if summary.get("busy_warning"):
        lines += ["", f"**{summary['busy_warning']}**"]
    lines += ["", limits_sentence(summary)]
    return "\n".join(lines) + "\n"


def limits_sentence(summary: dict[str, Any]) -> str:
    """One sentence on what limits the figures of this run (data, steps, model sizes)."""
    sizes, off, live = summary["sizes"], summary["offline"], summary["live"]
    gain = off["distilled"]["overall"] - off["converted"]["overall"]
    data = (f"{sizes['train_prompts']} training prompts with responses of at most {sizes['max_new_tokens']} "
            f"tokens and {summary['distill']['steps']} distillation steps")
    if gain <= 0.01:
        accept = (f"distillation did not raise acceptance ({gain:+.3f}) because {data} are far too little for "
                  f"the drafter to learn the target (the paper distills on hundreds of thousands of conversations)")
    else:
        accept = f"acceptance rose by {gain:+.3f} from only {data}; more data and steps raise it further"
    speedup = live.get("speedup")
    if speedup is not None and speedup < 1:
        speed = (f"and speculative decoding ran at x{speedup:.2f} of the target alone because, next to a target "
                 f"this small on {summary['device']}, a draft step costs a large part of a target step (the "
                 f"output head and the per-call overhead are paid by both), so the "
                 f"speedup needs a target much larger than its drafter")
    else:
        speed = f"and the speed figure (x{_fmt(speedup, 2)}) comes from a few short responses on a shared machine"
    return f"What limits these figures: {accept}, {speed}."


def acceptance_axis(values: list[float]) -> tuple[float, float]:
    """y-limits that show the differences between acceptance lengths (not a 0-based axis on which
    1.05 and 1.18 look the same), with room above for the value labels."""
    lo, hi = min(values), max(values)
    span = max(hi - lo, 0.05)
    return max(0.0, lo - 0.6 * span), hi + 0.5 * span


def figure(summary: dict[str, Any]) -> Any:
    """The report's matplotlib figure: acceptance length per domain (offline init / offline /
    live) on an axis that shows their differences, and both decoding speeds, labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    off, live = summary["offline"], summary["live"]
    domains = sorted(set(off["distilled"]["per_domain"]) | set(live["per_domain"])) + ["all"]

    def offline_values(source: dict) -> list[float]:
        return [source["overall"] if d == "all" else source["per_domain"].get(d, 0.0) for d in domains]

    live_values = [live["acceptance_length"] if d == "all" else live["per_domain"].get(d, {}).get("acceptance_length", 0.0)
                   for d in domains]
    series = [("offline, converted (init)", offline_values(off["converted"]), "tab:grey"),
              ("offline, distilled", offline_values(off["distilled"]), "tab:blue"),
              ("live, distilled", live_values, "tab:orange")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.27
    xs = range(len(domains))
    for k, (label, values, color) in enumerate(series):
        bars = ax1.bar([x + (k - 1) * width for x in xs], values, width, label=label, color=color)
        ax1.bar_label(bars, fmt="%.3f", fontsize=6, padding=1)
    counts = {**domain_counts(summary), "all": live.get("num_prompts")}
    ax1.set_xticks(list(xs), [d if counts.get(d) is None else f"{d}\nn={counts[d]}" for d in domains])
    lo, hi = acceptance_axis([v for _, values, _ in series for v in values])
    ax1.set_ylim(lo, hi)
    ax1.set_ylabel(f"acceptance length (tokens / verify step)\naxis from {lo:.2f}")
    ax1.set_title(f"S={summary['sizes']['draft_steps']}, greedy, held-out prompts (n per domain); "
                  f"1.0 = no draft accepted", fontsize=10)
    # below the axes, so it never covers a bar
    ax1.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    names = ["target alone", "speculative\n(Osprey drafter)"]
    speeds = [live["plain_tokens_per_s"] or 0.0, live["spec_tokens_per_s"]]
    bars = ax2.bar(names, speeds, color=["tab:grey", "tab:green"])
    ax2.bar_label(bars, labels=[f"{v:.1f} tok/s" for v in speeds], fontsize=8, padding=2)
    ax2.set_ylim(0, max(speeds + [1e-9]) * 1.25)
    ax2.set_ylabel("tokens / s")
    speedup = live.get("speedup")
    ax2.set_title(f"decoding speed ({speedup_text(speedup)})" if speedup else "decoding speed", fontsize=9)
    fig.tight_layout()
    return fig


def plot(summary: dict[str, Any], path: Path) -> Path:
    """Write :func:`figure` as a PNG to ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(summary)
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
