"""The Stage-2 axis of a report (issue 34): points per size, the trend, its verdict and the
extrapolation, from a results document shaped as ``collect`` writes it."""

from __future__ import annotations

import math

import pytest

from osprey_train.study.stage2_axis import PAPER_RATIO, fit_trend, plot_axis, render_axis, stage2_axis


def _matrix(seed_means: list[float]) -> dict:
    def summary(v):
        return {"mean": v, "in_domain": v + 0.05, "out_of_domain": v - 0.02, "complete": True, "cells": 9}
    mean = sum(seed_means) / len(seed_means)
    return {"summary": summary(mean), "per_seed": {str(i): {"summary": summary(v)} for i, v in enumerate(seed_means)}}


def _results(sizes: dict[int, list[float]], *, eagle=(1.30, 1.32)) -> dict:
    arms = [{"name": "eagle3", "arch": "eagle3", "stage2": "none", "stage2_name": "none"}]
    matrices = {"eagle3": _matrix(list(eagle))}
    stage2 = {}
    for steps, seeds in sizes.items():
        name = "plain" if steps == 400 else f"plain {steps}"
        arm = f"osprey-{steps}"
        arms.append({"name": arm, "arch": "osprey", "stage2": "plain", "stage2_name": name, "arch_options": None,
                     "distill": None, "lr_scale": 1.0, "train_data": "regenerated"})
        matrices[arm] = _matrix(seeds)
        stage2[name] = {"settings": {"steps": steps, "seq_len": 512, "batch_size": 4}, "final_ppl": 4000 / steps}
    # an ablation at the largest size is not a point of the axis
    arms.append({"name": "wc", "arch": "osprey", "stage2": "plain", "stage2_name": name,
                 "arch_options": {"w_c_init": "identity"}, "distill": None, "lr_scale": 1.0})
    matrices["wc"] = _matrix([2.0])
    return {"arms": arms, "matrices": matrices, "stage2": stage2, "roles": {"eagle3": "eagle3", "osprey": "osprey-400"}}


def test_a_growing_ratio_is_called_growing_and_extrapolated_to_the_papers_level(tmp_path):
    # ratio rises 0.02 per doubling of Stage-2 tokens, with a little seed noise
    sizes = {100 * 2 ** i: [1.31 * (1.0 + 0.02 * i) - 0.004, 1.31 * (1.0 + 0.02 * i) + 0.004] for i in range(5)}
    axis = stage2_axis(_results(sizes))
    assert [p["arm"] for p in axis["points"]] == [f"osprey-{100 * 2 ** i}" for i in range(5)]   # no ablation
    assert axis["points"][0]["tokens"] == 100 * 512 * 4 and axis["points"][0]["heldout_ppl"] == 40.0
    assert axis["points"][2]["ratio"] == pytest.approx(1.04 * 1.31 / 1.31, abs=1e-9)
    assert axis["points"][0]["noise"] == pytest.approx(math.sqrt(0.004 ** 2 + 0.01 ** 2) / 1.31)
    t = axis["trend"]
    assert t["verdict"] == "grows" and t["slope_per_decade"] == pytest.approx(0.02 / math.log10(2), rel=1e-6)
    # the line reaches x1.16 after 8 doublings of the smallest size
    assert t["reaches_paper_at_tokens"] == pytest.approx(100 * 512 * 4 * 2 ** 8, rel=1e-6)
    text = "\n".join(render_axis(axis))
    assert "**grows**" in text and "Extrapolated, not measured" in text and f"x{PAPER_RATIO:.2f}" in text
    assert plot_axis(axis, tmp_path / "axis.png").stat().st_size > 0


def test_a_flat_ratio_is_flat_and_not_extrapolated():
    sizes = {100: [1.40, 1.41], 200: [1.42, 1.39], 400: [1.405, 1.405], 800: [1.41, 1.40]}
    axis = stage2_axis(_results(sizes))
    assert axis["trend"]["verdict"] == "flat" and axis["trend"]["reaches_paper_at_tokens"] is None
    assert "Extrapolated" not in "\n".join(render_axis(axis))


def test_fewer_than_two_sizes_is_no_axis_and_two_sizes_no_trend():
    assert stage2_axis(_results({400: [1.4, 1.41]})) is None
    axis = stage2_axis(_results({400: [1.4, 1.41], 1600: [1.45, 1.46]}))
    assert axis["trend"] is None and "No trend yet" in "\n".join(render_axis(axis))
    assert fit_trend([1e5, 1e5, 1e5], [1.0, 1.1, 1.2]) is None
