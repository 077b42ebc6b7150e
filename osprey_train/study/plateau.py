"""Did the distillations train long enough? The held-out acceptance curves, measured late.

Each distillation of a study evaluates acceptance length on a subset of its in-domain held-out
store every few steps (``results["curves"][i]["eval"]``). A run that stopped too early still gains
in its last stretch; a run that flattened does not. Per arm this module reports:

* the held-out AL at the first evaluation and at the last one, mean over the arm's runs;
* the **late gain**: last AL minus the AL at the evaluation nearest two thirds of the run's steps,
  and its share of the run's whole gain (first -> last evaluation), beside the share a straight
  line through the same evaluation steps would put there (about 0.4 when the first evaluation
  comes at a sixth of the run). A curve that has flattened puts little or none of its gain there.

Verdict per arm, from the late share over the arm's runs together (the held-out subset is small,
tens of samples, so one run's curve is noisy): ``flat`` under :data:`FLAT_SHARE` or with no late
gain, ``flattening`` under half the straight line's share, ``still rising`` otherwise.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FLAT_SHARE", "LATE_FROM", "plateau_rows"]

LATE_FROM = 2 / 3     # the late stretch starts at this fraction of a run's steps
FLAT_SHARE = 0.10     # under this share of its gain in the late stretch, a curve counts as flat


def _run_points(curve: dict[str, Any]) -> tuple[float, float, float, float] | None:
    """(first AL, AL near LATE_FROM of the steps, last AL, a straight line's late share) of one run,
    or None with fewer than two evaluations."""
    # one point per step (the last logged wins), so a resumed run's repeated evaluation counts once
    by_step = {e["step"]: e["accept_len"] for e in curve.get("eval", []) if e.get("accept_len") is not None}
    points = sorted(by_step.items())
    if len(points) < 2:
        return None
    last_step = points[-1][0]
    late = min(points[:-1], key=lambda p: abs(p[0] - LATE_FROM * last_step))
    linear = (last_step - late[0]) / (last_step - points[0][0])
    return points[0][1], late[1], points[-1][1], linear


def plateau_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm with curves: runs, first / late-start / last held-out AL (means), late gain,
    late share of the gain, a straight line's share, and the verdict. Arms in ``results["arms"]`` order."""
    by_arm: dict[str, list[tuple[float, float, float, float]]] = {}
    for curve in results.get("curves", []):
        pts = _run_points(curve)
        if pts is not None:
            by_arm.setdefault(curve["arm"], []).append(pts)
    order = [a["name"] for a in results.get("arms", [])]
    rows = []
    for arm in sorted(by_arm, key=lambda a: order.index(a) if a in order else len(order)):
        runs = by_arm[arm]
        first, late, last, linear = (sum(p[i] for p in runs) / len(runs) for i in range(4))
        gain, late_gain = last - first, last - late
        share = late_gain / gain if gain > 0 else None
        if late_gain <= 0 or (share is not None and share < FLAT_SHARE):
            verdict = "flat"
        elif share is not None and share < linear / 2:
            verdict = "flattening"
        else:
            verdict = "still rising"
        rows.append({"arm": arm, "runs": len(runs), "first": first, "late_start": late, "last": last,
                     "late_gain": late_gain, "late_share": share, "linear_share": linear, "verdict": verdict})
    return rows
