"""The paper's claims, checked against a study's results.

Each check compares arms named by role (``[report.roles]``) over the acceptance matrix and returns
what the paper reports, what the study measured, the noise figure of the difference and a verdict:

* ``held``: the difference has the claimed direction and size and exceeds its noise figure;
* ``not held``: it does not;
* ``within noise``: the direction is right but the difference is smaller than the noise figure;
* ``not measured``: an arm it needs is missing (or has no finished cells yet).

**Noise.** Two seeds of an arm give the spread ``|m_0 - m_1|`` of its matrix mean. For a
difference of two seed means the noise figure is ``sqrt((s_a/2)^2 + (s_b/2)^2)`` (the standard
error of a two-seed mean is half the spread); for a single-seed arm compared with a seed of
another, it is that arm's spread (the difference of two single runs). These are rough figures
from two seeds, stated as such in the report.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_claims", "claim_applies", "fmt", "noise_text", "PAPER", "CLAIM_ROLES"]

# The [report.roles] a claim needs beyond osprey and eagle3: without them it cannot be measured.
CLAIM_ROLES = {"stage2_plain": ("osprey_no_stage2",), "stage2_kd": ("osprey_kd", "osprey_no_stage2"),
               "kd_vs_plain": ("osprey_kd",), "kd_ppl": ("osprey_kd",),
               "low_lr": ("osprey_low_lr", "eagle3_low_lr"), "two_layer": ("eagle3_2l",)}


def claim_applies(claim_id: str, roles: dict) -> bool:
    """Whether a study whose ``[report.roles]`` are ``roles`` has every arm the claim compares."""
    return all(role in roles for role in CLAIM_ROLES.get(claim_id, ()))


PAPER = {
    "ratio": 3.686 / 3.176, "osprey_mean": 3.686, "eagle3_mean": 3.176, "id_gain": 0.124, "ood_gain": 0.173,
    "stage2_delta": 0.185, "stage2_rel": 0.051, "low_lr_osprey": 0.11, "low_lr_eagle3": 1.07,
    "two_layer_gap": 0.405, "two_layer_over_one": 0.094,
}


def _matrix_mean(results: dict, arm: str | None, seed: int | None = None, key: str = "mean") -> float | None:
    if arm is None or arm not in results["matrices"]:
        return None
    m = results["matrices"][arm]
    if seed is None:
        return m["summary"][key]
    per = m["per_seed"].get(str(seed))
    return per["summary"][key] if per else None


def _spread(results: dict, arm: str | None) -> float | None:
    if arm is None or arm not in results["matrices"]:
        return None
    per = results["matrices"][arm]["per_seed"]
    values = [p["summary"]["mean"] for p in per.values() if p["summary"]["mean"] is not None]
    return max(values) - min(values) if len(values) >= 2 else None


def _verdict(delta: float | None, noise: float | None, ok: bool) -> str:
    if delta is None:
        return "not measured"
    if not ok:
        return "not held"
    if noise is None:
        return "held (no noise figure)"
    return "held" if abs(delta) > noise else "within noise"


def fmt(x: float | None, digits: int = 3, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def noise_text(results: dict, noise: float | None, *arms: str | None) -> str:
    """The noise cell of a claim: the figure, or why there is none (``unknown (1 seed)`` when every
    arm it compares ran one seed, ``n/a`` when an arm is missing)."""
    if noise is not None:
        return fmt(noise)
    present = [results["matrices"][a] for a in arms if a is not None and a in results["matrices"]]
    if present and len(present) == len([a for a in arms if a is not None]) \
            and all(len(m["seeds"]) < 2 for m in present):
        return "unknown (1 seed)"
    return "n/a"


def _pair_noise(results: dict, a: str | None, b: str | None) -> float | None:
    sa, sb = _spread(results, a), _spread(results, b)
    if sa is None and sb is None:
        return None
    return math.sqrt((sa or 0.0) ** 2 / 4 + (sb or 0.0) ** 2 / 4)


def _single_vs(results: dict, multi: str | None, single: str | None) -> tuple[float | None, float | None, int | None]:
    """(difference multi - single at the single arm's seed, noise, seed): a one-seed arm vs a seed of another."""
    if single is None or single not in results["matrices"] or multi not in results["matrices"]:
        return None, None, None
    seed = results["matrices"][single]["seeds"][0]
    a, b = _matrix_mean(results, multi, seed), _matrix_mean(results, single, seed)
    if a is None or b is None:
        return None, None, seed
    spreads = [s for s in (_spread(results, multi), _spread(results, single)) if s is not None]
    return a - b, (max(spreads) if spreads else None), seed


def check_claims(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every claim with the paper's figure, ours, the noise figure and a verdict."""
    roles = results.get("roles", {})
    o, e = roles.get("osprey"), roles.get("eagle3")
    out: list[dict[str, Any]] = []

    mo, me = _matrix_mean(results, o), _matrix_mean(results, e)
    noise = _pair_noise(results, o, e)
    ratio = mo / me if mo is not None and me else None
    cells_ahead = total = None
    if o in results["matrices"] and e in results["matrices"]:
        vo, ve = results["matrices"][o]["values"], results["matrices"][e]["values"]
        pairs = [(x, y) for ro, re in zip(vo, ve) for x, y in zip(ro, re) if x is not None and y is not None]
        cells_ahead, total = sum(x > y for x, y in pairs), len(pairs)
    delta = None if mo is None or me is None else mo - me
    ok = ratio is not None and ratio >= 1.16 and (noise is None or delta > 2 * noise)
    out.append({
        "id": "mean_ratio", "claim": "Osprey's mean acceptance length over the matrix is >= 1.16x EAGLE-3's, "
                                     "by more than twice the seed noise",
        "paper": f"{PAPER['osprey_mean']} vs {PAPER['eagle3_mean']} (x{PAPER['ratio']:.3f})",
        "ours": f"{fmt(mo)} vs {fmt(me)} (x{fmt(ratio)}, difference {fmt(delta, sign=True)})",
        "noise": noise_text(results, noise, o, e), "verdict": "not measured" if delta is None else
        ("held" if ok else ("not held" if ratio is None or ratio < 1.16 or delta <= 0 else "within noise")),
        "values": {"osprey": mo, "eagle3": me, "ratio": ratio, "difference": delta, "noise": noise}})
    out.append({
        "id": "cells_ahead", "claim": "Osprey is ahead in most cells (paper: all 25)",
        "paper": "25 / 25", "ours": "n/a" if total is None else f"{cells_ahead} / {total}", "noise": "",
        "verdict": "not measured" if total is None else ("held" if cells_ahead * 2 > total else "not held"),
        "values": {"ahead": cells_ahead, "cells": total}})

    gains = {}
    for key in ("in_domain", "out_of_domain"):
        a, b = _matrix_mean(results, o, key=key), _matrix_mean(results, e, key=key)
        gains[key] = a / b - 1 if a is not None and b else None
    gid, good = gains["in_domain"], gains["out_of_domain"]
    out.append({
        "id": "ood_gain", "claim": "The Osprey gain is larger out of domain than in domain",
        "paper": f"ID +{100 * PAPER['id_gain']:.1f} %, OOD +{100 * PAPER['ood_gain']:.1f} %",
        "ours": "n/a" if gid is None or good is None else f"ID {100 * gid:+.1f} %, OOD {100 * good:+.1f} %",
        "noise": "", "verdict": "not measured" if gid is None or good is None else
        ("held" if good > gid and good > 0 else "not held"), "values": {"id_gain": gid, "ood_gain": good}})

    d_plain, n_plain, seed = _single_vs(results, o, roles.get("osprey_no_stage2"))
    base = _matrix_mean(results, roles.get("osprey_no_stage2"))
    out.append({
        "id": "stage2_plain", "claim": "Stage 2 (plain next-token pretraining) helps",
        "paper": f"+{PAPER['stage2_delta']} (+{100 * PAPER['stage2_rel']:.1f} %, Table 5)",
        "ours": "n/a" if d_plain is None else f"{fmt(d_plain, sign=True)} ({100 * d_plain / base:+.1f} %, seed {seed})",
        "noise": noise_text(results, n_plain, o, roles.get("osprey_no_stage2")), "verdict": _verdict(d_plain, n_plain, d_plain is not None and d_plain > 0),
        "values": {"difference": d_plain, "noise": n_plain}})
    kd, nos2 = roles.get("osprey_kd"), roles.get("osprey_no_stage2")
    d_kd = n_kd = None
    if kd in results["matrices"] and nos2 in results["matrices"]:
        seed = results["matrices"][kd]["seeds"][0]
        a, b = _matrix_mean(results, kd, seed), _matrix_mean(results, nos2, seed)
        if a is not None and b is not None:
            d_kd = a - b
            n_kd = _spread(results, o)
    out.append({
        "id": "stage2_kd", "claim": "Stage 2 by distillation from the unpruned source helps (beyond the paper)",
        "paper": "not in the paper (Minitron / Sheared-LLaMA: distillation recovers pruned models faster)",
        "ours": "n/a" if d_kd is None else f"{fmt(d_kd, sign=True)} vs no Stage 2", "noise": noise_text(results, n_kd, o),
        "verdict": _verdict(d_kd, n_kd, d_kd is not None and d_kd > 0), "values": {"difference": d_kd, "noise": n_kd}})
    d_kp = n_kp = None
    if kd in results["matrices"] and o in results["matrices"]:
        seed = results["matrices"][kd]["seeds"][0]
        a, b = _matrix_mean(results, kd, seed), _matrix_mean(results, o, seed)
        if a is not None and b is not None:
            d_kp, n_kp = a - b, _spread(results, o)
    out.append({
        "id": "kd_vs_plain", "claim": "Distillation-based Stage 2 buys more acceptance than plain pretraining "
                                      "on the same corpus and steps (beyond the paper)",
        "paper": "not in the paper", "ours": "n/a" if d_kp is None else f"{fmt(d_kp, sign=True)}",
        "noise": noise_text(results, n_kp, o), "verdict": _verdict(d_kp, n_kp, d_kp is not None and d_kp > 0),
        "values": {"difference": d_kp, "noise": n_kp}})

    ol, el = roles.get("osprey_low_lr"), roles.get("eagle3_low_lr")
    do, n_o, _ = _single_vs(results, o, ol)
    de, n_e, _ = _single_vs(results, e, el)
    ok = do is not None and de is not None and de > 0 and de > 2 * max(do, 0.0)
    out.append({
        "id": "low_lr", "claim": "A 10x lower learning rate hurts EAGLE-3 much more than Osprey",
        "paper": f"Osprey -{PAPER['low_lr_osprey']}, EAGLE-3 -{PAPER['low_lr_eagle3']} (Table 4)",
        "ours": "n/a" if do is None or de is None else f"Osprey {fmt(-do, sign=True)}, EAGLE-3 {fmt(-de, sign=True)}",
        "noise": noise_text(results, max([x for x in (n_o, n_e) if x is not None], default=None), o, e, ol, el),
        "verdict": "not measured" if do is None or de is None else _verdict(de - do, max(
            [x for x in (n_o, n_e) if x is not None], default=None), ok),
        "values": {"osprey_loss": do, "eagle3_loss": de}})

    e2 = roles.get("eagle3_2l")
    d2, n2, _ = _single_vs(results, o, e2)
    d21, n21, _ = _single_vs(results, e, e2)
    out.append({
        "id": "two_layer", "claim": "Osprey beats the parameter-matched 2-layer EAGLE-3 (the gain is not just depth)",
        "paper": f"Osprey +{PAPER['two_layer_gap']} over EAGLE-3 2L; 2L +{PAPER['two_layer_over_one']} over 1L (Table 6)",
        "ours": "n/a" if d2 is None else f"Osprey {fmt(d2, sign=True)} over 2L; 2L {fmt(-d21 if d21 is not None else None, sign=True)} over 1L",
        "noise": noise_text(results, n2, o, e2), "verdict": _verdict(d2, n2, d2 is not None and d2 > 0),
        "values": {"osprey_over_2l": d2, "two_layer_over_one": None if d21 is None else -d21}})

    diag = [c for c in results["cells"] if c["train_domain"] == c["eval_domain"]]
    best = max(diag, key=lambda c: c["acceptance_length"]) if diag else None
    live = results.get("live")
    out.append({
        "id": "best_in_domain", "claim": "The best in-domain acceptance length is >= 2.0 (a drafter worth serving)",
        "paper": "math -> math 5.253 (Qwen3-8B target)",
        "ours": "n/a" if best is None else f"{best['acceptance_length']:.3f} ({best['arm']} seed {best['seed']}, "
                                          f"{best['train_domain']})",
        "noise": "", "verdict": "not measured" if best is None else
        ("held" if best["acceptance_length"] >= 2.0 else "not held"),
        "values": {"best": best}})
    out.append({
        "id": "live_speedup", "claim": "`osprey eval live` on the best drafter reports the real speedup on this machine",
        "paper": "1.18x tokens/s (Table 1, H100)",
        "ours": "n/a" if not live else f"x{fmt(live.get('speedup'), 2)} ({fmt(live.get('plain_tokens_per_s'), 1)} -> "
                                       f"{fmt(live.get('spec_tokens_per_s'), 1)} tok/s), live AL "
                                       f"{fmt(live.get('acceptance_length'))}",
        "noise": "", "verdict": "not measured" if not live else "reported",
        "values": {"speedup": live.get("speedup") if live else None}})

    s2 = results.get("stage2", {})
    ppl = {}
    for variant in ("plain", "kd"):
        curve = s2.get(variant, {}).get("curve", [])
        if curve:
            ppl[variant] = curve[-1]["eval_ppl"]
    out.append({
        "id": "kd_ppl", "claim": "Distillation from the source reaches a lower held-out perplexity than plain "
                                 "pretraining after the same tokens (beyond the paper)",
        "paper": "not in the paper", "ours": "n/a" if len(ppl) < 2 else
        f"plain {ppl['plain']:.1f}, distillation {ppl['kd']:.1f} (pruned start {s2['plain']['curve'][0]['eval_ppl']:.3g})",
        "noise": "", "verdict": "not measured" if len(ppl) < 2 else ("held" if ppl["kd"] < ppl["plain"] else "not held"),
        "values": ppl})
    return out

