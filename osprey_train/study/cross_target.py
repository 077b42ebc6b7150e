"""The claims of a study of several ``[[targets]]``: each target's figures side by side, pooled
over targets, and the transfer claim.

The per-target claims (:func:`osprey_train.study.claims.check_claims`) say whether the recipe held
on one target. Two questions need every target at once:

* **pooled**: the headline figures (Osprey vs EAGLE-3 mean AL, ID and OOD gains, cells won, the
  Stage-2 effect) with every target weighted equally. The pooled noise figure of a mean of n
  per-target differences is ``sqrt(sum noise_t^2) / n`` (independent seeds per target).
* **transfer**: the paper's target-agnostic thesis. The same pretrained backbone, converted for a
  target it was *not* pruned from (another family and tokenizer), must still beat EAGLE-3 there by
  more than twice the seed noise (paper: Llama-3.3-70B +21.2 %, MiniMax-M2.5 +22.7 % mean AL over a
  controlled EAGLE-3, from a Qwen3-4B backbone). A target counts as "not the source" when its model
  reference differs from ``[source] model``.

A pooled figure is stated only when every target has it; otherwise the verdict is ``not measured``
and says how many targets are missing, so that partial results never read as a pooled result.
"""

from __future__ import annotations

import math
from typing import Any

from osprey_train.study.claims import fmt

__all__ = ["PAPER_TRANSFER", "cross_target_claims", "per_target_rows", "source_is_target"]

# Mean AL gain over a controlled EAGLE-3 on targets the backbone was not pruned from (Osprey paper).
PAPER_TRANSFER = {"Llama-3.3-70B": 0.212, "MiniMax-M2.5": 0.227}


def source_is_target(results: dict[str, Any]) -> bool:
    """Whether this target's drafter backbone was pruned from the target itself (self-speculation)."""
    return results["source"] in ("target", results["target"])


def _claim(results: dict, claim_id: str) -> dict[str, Any] | None:
    return next((c for c in results.get("claims", []) if c["id"] == claim_id), None)


def _values(results: dict, claim_id: str) -> dict[str, Any]:
    c = _claim(results, claim_id)
    return c["values"] if c else {}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f} %"


def per_target_rows(per_target: dict[str, dict]) -> list[list[str]]:
    """One row per target: Osprey and EAGLE-3 mean AL, ratio, noise, ID / OOD gain, cells won,
    Stage-2 effect, best in-domain AL, live speedup."""
    rows = []
    for name, res in per_target.items():
        m, g, c = _values(res, "mean_ratio"), _values(res, "ood_gain"), _values(res, "cells_ahead")
        s2, best, live = _values(res, "stage2_plain"), _values(res, "best_in_domain"), _values(res, "live_speedup")
        rows.append([
            name, "yes" if source_is_target(res) else "no", fmt(m.get("osprey")), fmt(m.get("eagle3")),
            "n/a" if m.get("ratio") is None else f"x{m['ratio']:.3f}", fmt(m.get("noise")),
            _pct(g.get("id_gain")), _pct(g.get("ood_gain")),
            "n/a" if c.get("cells") is None else f"{c['ahead']} / {c['cells']}",
            fmt(s2.get("difference"), sign=True),
            "n/a" if not best.get("best") else f"{best['best']['acceptance_length']:.3f}",
            "n/a" if live.get("speedup") is None else f"x{live['speedup']:.2f}"])
    return rows


def _pooled_mean(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def _pooled_noise(noises: list[float | None]) -> float | None:
    known = [n for n in noises if n is not None]
    return math.sqrt(sum(n * n for n in known)) / len(noises) if known else None


def _missing(per_target: dict[str, dict], claim_id: str, key: str) -> list[str]:
    return [name for name, res in per_target.items() if _values(res, claim_id).get(key) is None]


def cross_target_claims(per_target: dict[str, dict]) -> list[dict[str, Any]]:
    """Pooled claims and the transfer claim, each with the paper's figure, ours, noise and verdict
    (the verdict words of :mod:`osprey_train.study.claims`)."""
    n = len(per_target)
    out: list[dict[str, Any]] = []

    def not_measured(missing: list[str]) -> str:
        return f"not measured ({len(missing)} of {n} targets missing: {', '.join(missing)})"

    # pooled Osprey vs EAGLE-3
    missing = _missing(per_target, "mean_ratio", "difference")
    mo = _pooled_mean([_values(r, "mean_ratio").get("osprey") for r in per_target.values()])
    me = _pooled_mean([_values(r, "mean_ratio").get("eagle3") for r in per_target.values()])
    noise = _pooled_noise([_values(r, "mean_ratio").get("noise") for r in per_target.values()])
    ratio = mo / me if mo is not None and me else None
    delta = None if missing or mo is None or me is None else mo - me
    if delta is None:
        verdict = not_measured(missing)
    elif ratio is not None and ratio >= 1.16 and (noise is None or delta > 2 * noise):
        verdict = "held" if noise is not None else "held (no noise figure)"
    else:
        verdict = "within noise" if delta > 0 and ratio >= 1.16 else "not held"
    out.append({"id": "pooled_mean_ratio",
                "claim": "Pooled over targets, Osprey's mean AL is >= 1.16x EAGLE-3's, by more than twice the noise",
                "paper": "x1.161 (Qwen3-8B); +21.2 % / +22.7 % on Llama-3.3-70B / MiniMax-M2.5",
                "ours": "n/a" if delta is None else f"{fmt(mo)} vs {fmt(me)} (x{ratio:.3f}, {fmt(delta, sign=True)})",
                "noise": "" if delta is None else fmt(noise), "verdict": verdict,
                "values": {"osprey": mo, "eagle3": me, "ratio": ratio, "difference": delta,
                           "noise": None if delta is None else noise}})

    # pooled ID / OOD gains: the mean of each target's relative gain
    gid = _pooled_mean([_values(r, "ood_gain").get("id_gain") for r in per_target.values()])
    good = _pooled_mean([_values(r, "ood_gain").get("ood_gain") for r in per_target.values()])
    missing = _missing(per_target, "ood_gain", "ood_gain")
    out.append({"id": "pooled_ood_gain", "claim": "Pooled over targets, the Osprey gain is larger out of domain",
                "paper": "ID +12.4 %, OOD +17.3 %",
                "ours": "n/a" if gid is None or good is None else f"ID {100 * gid:+.1f} %, OOD {100 * good:+.1f} %",
                "noise": "", "verdict": not_measured(missing) if gid is None or good is None else
                ("held" if good > gid and good > 0 else "not held"), "values": {"id_gain": gid, "ood_gain": good}})

    # cells won, summed
    ahead = [_values(r, "cells_ahead").get("ahead") for r in per_target.values()]
    cells = [_values(r, "cells_ahead").get("cells") for r in per_target.values()]
    missing = _missing(per_target, "cells_ahead", "cells")
    won, total = (None, None) if missing else (sum(ahead), sum(cells))
    out.append({"id": "pooled_cells_ahead", "claim": "Osprey is ahead in most cells of every target together",
                "paper": "25 / 25 (one target)", "ours": "n/a" if total is None else f"{won} / {total}", "noise": "",
                "verdict": not_measured(missing) if total is None else ("held" if won * 2 > total else "not held"),
                "values": {"ahead": won, "cells": total}})

    # pooled Stage-2 effect
    d = _pooled_mean([_values(r, "stage2_plain").get("difference") for r in per_target.values()])
    dn = _pooled_noise([_values(r, "stage2_plain").get("noise") for r in per_target.values()])
    missing = _missing(per_target, "stage2_plain", "difference")
    out.append({"id": "pooled_stage2", "claim": "Pooled over targets, Stage 2 (plain pretraining) helps",
                "paper": "+0.185 (+5.1 %, Table 5, one target)", "ours": fmt(d, sign=True),
                "noise": "" if d is None else fmt(dn),
                "verdict": not_measured(missing) if d is None else
                ("not held" if d <= 0 else ("held" if dn is None or d > dn else "within noise")),
                "values": {"difference": d, "noise": dn}})

    # transfer: every target the backbone was not pruned from
    others = {name: r for name, r in per_target.items() if not source_is_target(r)}
    paper = ", ".join(f"{k} {100 * v:+.1f} %" for k, v in PAPER_TRANSFER.items()) + " over EAGLE-3"
    if not others:
        out.append({"id": "transfer", "claim": "The same backbone helps on a target it was not pruned from",
                    "paper": paper, "ours": "n/a", "noise": "",
                    "verdict": "not measured (every target is the source model)", "values": {}})
        return out
    parts, verdicts, values = [], [], {}
    for name, r in others.items():
        m, s2 = _values(r, "mean_ratio"), _values(r, "stage2_plain")
        delta, noise = m.get("difference"), m.get("noise")
        values[name] = {"gain": None if m.get("ratio") is None else m["ratio"] - 1, "difference": delta,
                        "noise": noise, "stage2": s2.get("difference")}
        if delta is None:
            verdicts.append("not measured")
            parts.append(f"{name}: n/a")
            continue
        parts.append(f"{name}: {100 * (m['ratio'] - 1):+.1f} % ({fmt(delta, sign=True)}, noise {fmt(noise)}); "
                     f"Stage 2 {fmt(s2.get('difference'), sign=True)}")
        if delta <= 0:
            verdicts.append("not held")
        elif noise is None:
            verdicts.append("held (no noise figure)")
        else:
            verdicts.append("held" if delta > 2 * noise else "within noise")
    order = ["not held", "not measured", "within noise", "held (no noise figure)", "held"]
    out.append({"id": "transfer",
                "claim": "The same backbone helps on a target it was not pruned from: Osprey beats EAGLE-3 there "
                         "by more than twice the seed noise",
                "paper": paper, "ours": "; ".join(parts), "noise": "",
                "verdict": min(verdicts, key=order.index), "values": values})
    return out
