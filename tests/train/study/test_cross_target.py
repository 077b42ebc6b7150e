"""Pooled and transfer claims of a study of several targets (osprey_train/study/cross_target.py)."""

from __future__ import annotations

import math

import pytest

from osprey_train.study.cross_target import cross_target_claims, per_target_rows, source_is_target


def _target(model: str, *, osprey: float | None, eagle3: float | None, noise: float | None = 0.02,
            id_gain: float | None = 0.05, ood_gain: float | None = 0.10, ahead: int | None = 8,
            stage2: float | None = 0.04, s2_noise: float | None = 0.01) -> dict:
    ratio = osprey / eagle3 if osprey is not None and eagle3 else None
    diff = None if osprey is None or eagle3 is None else osprey - eagle3
    claims = {"source": "pypi:small", "target": model, "claims": [
        {"id": "mean_ratio", "values": {"osprey": osprey, "eagle3": eagle3, "ratio": ratio, "difference": diff,
                                        "noise": noise}},
        {"id": "ood_gain", "values": {"id_gain": id_gain, "ood_gain": ood_gain}},
        {"id": "cells_ahead", "values": {"ahead": ahead, "cells": None if ahead is None else 9}},
        {"id": "stage2_plain", "values": {"difference": stage2, "noise": s2_noise}},
        {"id": "best_in_domain", "values": {"best": {"acceptance_length": 2.1}}},
        {"id": "live_speedup", "values": {"speedup": 1.3}}, {"id": "low_lr", "values": {}}]}
    for c in claims["claims"]:      # the words the per-claim table of the summary shows
        c.update(claim=c["id"], paper="p", ours="o", verdict="v")
    return claims


def _by_id(claims: list[dict]) -> dict[str, dict]:
    return {c["id"]: c for c in claims}


def test_pooled_figures_weight_targets_equally_and_add_their_noise_in_quadrature():
    claims = _by_id(cross_target_claims({
        "self": _target("pypi:small", osprey=2.4, eagle3=2.0, noise=0.03),
        "other": _target("pypi:big", osprey=1.8, eagle3=1.5, noise=0.04, ahead=6)}))
    pooled = claims["pooled_mean_ratio"]["values"]
    assert pooled["osprey"] == pytest.approx(2.1) and pooled["eagle3"] == pytest.approx(1.75)
    assert pooled["ratio"] == pytest.approx(1.2)
    assert pooled["noise"] == pytest.approx(math.sqrt(0.03 ** 2 + 0.04 ** 2) / 2)
    assert claims["pooled_mean_ratio"]["verdict"] == "held"
    assert claims["pooled_cells_ahead"]["values"] == {"ahead": 14, "cells": 18}
    assert claims["pooled_ood_gain"]["verdict"] == "held"
    assert claims["pooled_stage2"]["values"]["difference"] == pytest.approx(0.04)


def test_a_pooled_claim_is_not_measured_until_every_target_has_it():
    claims = _by_id(cross_target_claims({
        "self": _target("pypi:small", osprey=2.4, eagle3=2.0),
        "other": _target("pypi:big", osprey=None, eagle3=1.5, ahead=None, stage2=None, ood_gain=None)}))
    for cid in ("pooled_mean_ratio", "pooled_cells_ahead", "pooled_stage2", "pooled_ood_gain"):
        assert claims[cid]["verdict"].startswith("not measured (1 of 2 targets missing: other)"), claims[cid]
    assert claims["transfer"]["verdict"] == "not measured"


@pytest.mark.parametrize("osprey, noise, verdict", [(1.8, 0.04, "held"), (1.55, 0.04, "within noise"),
                                                    (1.45, 0.04, "not held"), (1.8, None, "held (no noise figure)")])
def test_transfer_judges_only_the_targets_the_backbone_was_not_pruned_from(osprey, noise, verdict):
    claims = _by_id(cross_target_claims({
        "self": _target("pypi:small", osprey=1.0, eagle3=3.0),      # a loss here must not decide transfer
        "other": _target("pypi:big", osprey=osprey, eagle3=1.5, noise=noise)}))
    t = claims["transfer"]
    assert t["verdict"] == verdict and set(t["values"]) == {"other"}
    assert t["ours"].startswith("other: ")


def test_transfer_is_not_measured_when_every_target_is_the_source():
    claims = _by_id(cross_target_claims({"self": _target("pypi:small", osprey=2.4, eagle3=2.0)}))
    assert claims["transfer"]["verdict"] == "not measured (every target is the source model)"


def test_rows_and_the_self_speculation_flag():
    a, b = _target("pypi:small", osprey=2.4, eagle3=2.0), _target("pypi:big", osprey=None, eagle3=None)
    assert source_is_target(a) and not source_is_target(b)
    assert source_is_target({"source": "target", "target": "anything"})
    rows = per_target_rows({"self": a, "other": b})
    assert rows[0][:5] == ["self", "yes", "2.400", "2.000", "x1.200"] and rows[0][-2:] == ["2.100", "x1.30"]
    assert rows[1][:5] == ["other", "no", "n/a", "n/a", "n/a"]


def test_the_summary_readme_says_partial_and_shows_every_target(tmp_path):
    from types import SimpleNamespace

    from osprey_train.study.report import ReportResult, render_targets_readme

    notes = tmp_path / "notes.md"
    notes.write_text("## Notes\n\nWhy the transfer claim is within noise.\n", encoding="utf-8")
    per = {"self": _target("pypi:small", osprey=2.4, eagle3=2.0), "other": _target("pypi:big", osprey=None, eagle3=1.5)}
    for r in per.values():
        r["progress"] = {"done": 3, "stages": 9}
    study = SimpleNamespace(study=SimpleNamespace(name="x", description="two targets"),
                            source=SimpleNamespace(model="pypi:small"),
                            report=SimpleNamespace(roles={"osprey": "o", "eagle3": "e", "osprey_no_stage2": "n"},
                                                   notes=notes),
                            targets=[SimpleNamespace(name=n, model=r["target"]) for n, r in per.items()])
    results = {"progress": {"done": 6, "stages": 18}, "cross_target_claims": cross_target_claims(per)}
    text = render_targets_readme(study, {n: ReportResult(dir=None, files=[], results=r) for n, r in per.items()},
                                 results)
    assert "**Partial results: 6 of 18 stages finished.**" in text
    assert "| self | yes | 2.400 | 2.000 | x1.200 |" in text and "| other | no | n/a |" in text
    assert "**not measured (1 of 2 targets missing: other)**" in text
    # a claim whose arms the study does not have is left out; one it has stays, measured or not
    assert "| stage2_plain |" in text and "| low_lr |" not in text
    assert text.rstrip().endswith("## Notes\n\nWhy the transfer claim is within noise.")   # the study's notes
