"""The late-gain measure of the held-out curves: flat, flattening and still-rising runs."""

import pytest

from osprey_train.study.plateau import plateau_rows


def _curve(arm: str, values: list[float], every: int = 40) -> dict:
    return {"arm": arm, "seed": 0, "domain": "chat",
            "eval": [{"step": every * (i + 1), "accept_len": v} for i, v in enumerate(values)]}


def test_verdicts_follow_the_late_share_of_the_gain():
    results = {"arms": [{"name": "rising"}, {"name": "bending"}, {"name": "flat"}, {"name": "falls"}],
               "curves": [_curve("flat", [1.0, 1.5, 1.8, 1.95, 1.98, 2.0]),        # 0.05 of 1.0 after step 160
                          _curve("rising", [1.0, 1.2, 1.4, 1.6, 1.8, 2.0]),        # a straight line
                          _curve("bending", [1.0, 1.4, 1.7, 1.85, 1.92, 2.0]),     # 0.15 of 1.0
                          _curve("falls", [1.0, 1.5, 1.7, 1.9, 1.85, 1.8])]}       # ends below step 160
    rows = {r["arm"]: r for r in plateau_rows(results)}
    assert [r["arm"] for r in plateau_rows(results)] == ["rising", "bending", "flat", "falls"]
    assert rows["rising"]["linear_share"] == pytest.approx(0.4)    # steps 160 -> 240 of 40 -> 240
    assert rows["rising"]["late_share"] == pytest.approx(0.4) and rows["rising"]["verdict"] == "still rising"
    assert rows["bending"]["late_share"] == pytest.approx(0.15) and rows["bending"]["verdict"] == "flattening"
    assert rows["flat"]["late_gain"] == pytest.approx(0.05) and rows["flat"]["verdict"] == "flat"
    assert rows["falls"]["late_gain"] < 0 and rows["falls"]["verdict"] == "flat"
    assert rows["flat"]["first"] == pytest.approx(1.0) and rows["flat"]["last"] == pytest.approx(2.0)


def test_runs_of_an_arm_are_averaged_and_short_curves_skipped():
    results = {"arms": [{"name": "a"}],
               "curves": [_curve("a", [1.0, 1.2, 1.4, 1.6, 1.8, 2.0]), _curve("a", [1.0, 1.5, 1.8, 1.95, 1.98, 2.0]),
                          _curve("a", [1.7]), _curve("b", []),
                          {"arm": "c", "eval": [{"step": 40, "accept_len": 1.2}, {"step": 40, "accept_len": 1.3}]}]}
    (row,) = plateau_rows(results)
    assert row["runs"] == 2 and row["late_start"] == pytest.approx((1.6 + 1.95) / 2)
    assert row["late_share"] == pytest.approx(((2.0 - 1.6) + (2.0 - 1.95)) / 2 / 1.0)
    assert plateau_rows({"arms": [], "curves": []}) == []
