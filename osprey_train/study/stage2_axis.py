"""The Stage-2 axis of a study (issue 34): does Osprey's lead over EAGLE-3 grow with Stage 2?

A study has an axis when its Osprey arms differ only in their own ``pretrain`` table (the Stage-2
size; ``stage2_name`` "plain 3.28M"). For one target's results this module gives, per size: the
Stage-2 tokens, the backbone's held-out perplexity, Osprey's mean AL with its seed spread,
in-domain and out-of-domain, and the ratio to the study's EAGLE-3 with its noise; then a
least-squares line ``ratio = a + b * log10(tokens)`` with the standard error of the slope, the
verdict (the ratio **grows** with Stage 2 when ``b > 2 SE``, **falls** when ``b < -2 SE``, else it is
**flat**), and, only when it grows, the Stage-2 size at which the line would reach the paper's
x1.16, with the range the slope's +-1 SE gives: an extrapolation, never a result.

Arms with other differences (an ``arch_options``, a ``distill`` table, a learning-rate scale, other
training data) are ablations, not points of the axis.

Legend: n points of the axis.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from osprey_data.atomic import atomic_file
from osprey_train.drafters.registry import drafter_spec
from osprey_train.study.config import tokens_label

__all__ = ["PAPER_RATIO", "axis_points", "fit_trend", "stage2_axis", "render_axis", "plot_axis"]

PAPER_RATIO = 1.16
"""Osprey's mean AL over EAGLE-3 in the paper (Table: 3.686 vs 3.176), the level the trend is read against."""


def _is_axis_arm(arm: dict[str, Any]) -> bool:
    # the arch whose drafter always converts the backbone (osprey): dflash's optional backbone is no point
    return (drafter_spec(arm["arch"]).needs_backbone and arm.get("stage2") == "plain" and not arm.get("arch_options")
            and arm.get("distill") is None and arm.get("lr_scale", 1.0) == 1.0
            and arm.get("train_data", "regenerated") == "regenerated")


def _spread(matrix: dict[str, Any], key: str) -> float | None:
    values = [s["summary"][key] for s in matrix["per_seed"].values() if s["summary"].get(key) is not None]
    return max(values) - min(values) if len(values) >= 2 else None


def _tokens(stage2: dict[str, Any]) -> int:
    s = stage2["settings"]
    return int(s["steps"]) * int(s["seq_len"]) * int(s["batch_size"])


def axis_points(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One point per Stage-2 size with a finished Osprey matrix and its Stage 2 recorded, by tokens."""
    eagle = results["matrices"].get(results.get("roles", {}).get("eagle3", "eagle3"))
    points = []
    for arm in results["arms"]:
        m = results["matrices"].get(arm["name"])
        s2 = results["stage2"].get(arm.get("stage2_name", arm.get("stage2")))
        if not _is_axis_arm(arm) or m is None or s2 is None or m["summary"]["mean"] is None:
            continue
        point = {"arm": arm["name"], "stage2": arm.get("stage2_name"), "tokens": _tokens(s2),
                 "heldout_ppl": s2["final_ppl"], "osprey": m["summary"]["mean"],
                 "osprey_in_domain": m["summary"]["in_domain"], "osprey_out_of_domain": m["summary"]["out_of_domain"],
                 "osprey_spread": _spread(m, "mean"), "seeds": len(m["per_seed"]), "ratio": None, "noise": None}
        if eagle is not None and eagle["summary"]["mean"]:
            e = eagle["summary"]["mean"]
            point["eagle3"] = e
            point["ratio"] = point["osprey"] / e
            spreads = [s for s in (point["osprey_spread"], _spread(eagle, "mean")) if s is not None]
            if spreads:   # the report's rule for a difference of two-seed means, as a ratio
                point["noise"] = math.sqrt(sum((s / 2) ** 2 for s in spreads)) / e
            for part in ("in_domain", "out_of_domain"):
                o, ee = point[f"osprey_{part}"], eagle["summary"].get(part)
                point[f"gain_{part}"] = None if o is None or not ee else o / ee - 1
        points.append(point)
    return sorted(points, key=lambda p: p["tokens"])


def fit_trend(tokens: list[float], ratios: list[float]) -> dict[str, Any] | None:
    """``ratio = a + b * log10(tokens)`` by least squares (None under 3 points or one size)."""
    n = len(tokens)
    if n < 3 or len(set(tokens)) < 2:
        return None
    x = [math.log10(t) for t in tokens]
    mx, my = sum(x) / n, sum(ratios) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, ratios)) / sxx
    a = my - b * mx
    rss = sum((yi - (a + b * xi)) ** 2 for xi, yi in zip(x, ratios))
    se = math.sqrt(rss / (n - 2) / sxx) if n > 2 else float("nan")
    verdict = "grows" if b > 2 * se else "falls" if b < -2 * se else "flat"
    out: dict[str, Any] = {"intercept": a, "slope_per_decade": b, "slope_se": se, "points": n, "verdict": verdict,
                           "reaches_paper_at_tokens": None, "reaches_paper_range": None}
    if verdict == "grows":
        def at(slope: float) -> float | None:
            return 10 ** ((PAPER_RATIO - a) / slope) if slope > 0 else None
        # the intercept is kept: the range is the slope's, a rough figure of how far the point moves
        low, high = at(b + se), at(b - se)
        out["reaches_paper_at_tokens"] = at(b)
        out["reaches_paper_range"] = [low, high]   # high None: the slope's lower bound is not positive
    return out


def stage2_axis(results: dict[str, Any]) -> dict[str, Any] | None:
    """The axis of one target's results (None when the study has fewer than 2 sizes with figures)."""
    points = axis_points(results)
    if len({p["tokens"] for p in points}) < 2:
        return None
    with_ratio = [p for p in points if p["ratio"] is not None]
    trend = fit_trend([p["tokens"] for p in with_ratio], [p["ratio"] for p in with_ratio])
    return {"points": points, "trend": trend, "paper_ratio": PAPER_RATIO}


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _size(tokens: float | None) -> str:
    return "–" if tokens is None else tokens_label(tokens)


def render_axis(axis: dict[str, Any]) -> list[str]:
    """The report section: the table per size, the trend and its reading."""
    def pct(g: float | None) -> str:
        return "–" if g is None else f"{100 * g:+.1f} %"

    rows = []
    for p in axis["points"]:
        ratio = "–" if p["ratio"] is None else f"x{p['ratio']:.3f}"
        rows.append(f"| `{p['arm']}` | {_size(p['tokens'])} | {_fmt(p['heldout_ppl'], 1)} | {_fmt(p['osprey'])} "
                    f"| {_fmt(p.get('eagle3'))} | {ratio} | {_fmt(p['noise'])} | {pct(p.get('gain_in_domain'))} "
                    f"| {pct(p.get('gain_out_of_domain'))} | {p['seeds']} |")
    lines = ["## Stage-2 axis: Osprey / EAGLE-3 against Stage-2 tokens", "", "![stage-2 axis](stage2-axis.png)", "",
             "| arm | Stage-2 tokens | held-out ppl | Osprey AL | EAGLE-3 AL | ratio | noise | ID gain | OOD gain "
             "| seeds |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows, ""]
    t = axis["trend"]
    if t is None:
        lines += ["No trend yet: it needs at least 3 sizes with a ratio.", ""]
        return lines
    lines += [f"Least-squares line over {t['points']} sizes: ratio = {t['intercept']:.3f} "
              f"{t['slope_per_decade']:+.4f} x log10(tokens) (slope standard error {t['slope_se']:.4f} per decade "
              f"of tokens): the ratio **{t['verdict']}** with Stage 2 (grows or falls: the slope beyond twice its "
              "standard error).", ""]
    if t["reaches_paper_at_tokens"] is not None:
        low, high = t["reaches_paper_range"]
        lines += [f"Extrapolated, not measured: if the line held, it would reach the paper's x{axis['paper_ratio']:.2f} "
                  f"at about {_size(t['reaches_paper_at_tokens'])} Stage-2 tokens (slope +-1 SE: {_size(low)} .. "
                  f"{'never' if high is None else _size(high)}).", ""]
    return lines


def plot_axis(axis: dict[str, Any], path: Path) -> Path:
    """Ratio against Stage-2 tokens (log scale) with noise bars and the line; Osprey AL against held-out ppl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in axis["points"] if p["ratio"] is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    if pts:
        left.errorbar([p["tokens"] for p in pts], [p["ratio"] for p in pts],
                      yerr=[p["noise"] or 0.0 for p in pts], fmt="o", capsize=3, label="measured (seed noise)")
    t = axis["trend"]
    if t is not None and pts:
        xs = [min(p["tokens"] for p in pts), max(p["tokens"] for p in pts)]
        left.plot(xs, [t["intercept"] + t["slope_per_decade"] * math.log10(x) for x in xs], "-",
                  label=f"trend: {t['verdict']}")
    left.axhline(1.0, color="grey", lw=0.8)
    left.axhline(axis["paper_ratio"], color="grey", ls="--", lw=0.8, label=f"paper x{axis['paper_ratio']:.2f}")
    left.set_xscale("log")
    left.set_xlabel("Stage-2 tokens")
    left.set_ylabel("Osprey / EAGLE-3 mean AL")
    left.legend(fontsize=8)
    right.plot([p["heldout_ppl"] for p in axis["points"]], [p["osprey"] for p in axis["points"]], "o-")
    right.set_xscale("log")
    right.invert_xaxis()
    right.set_xlabel("backbone held-out perplexity (lower: more Stage 2)")
    right.set_ylabel("Osprey mean AL")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path
