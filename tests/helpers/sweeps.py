"""A small sweep.json (two shapes, optionally with the example GPU costs) for export tests."""

from __future__ import annotations

import json

from osprey_train.evaluation.cost_model import parse_cost
from osprey_train.evaluation.sweep import SweepResult, SweepRow
from osprey_train.evaluation.tree_shape import TreeShape


def write_sweep(path, *, cost=True, scale=1.0):
    cost_model = parse_cost("example-gpu") if cost else None
    rows = [SweepRow(shape=TreeShape.chain(3), acceptance_length=2.0 * scale, per_domain={"x": 2.0}, verify_rounds=10,
                     tokens=20),
            SweepRow(shape=TreeShape(steps=4, topk=2, num_draft_tokens=8), acceptance_length=2.6 * scale,
                     per_domain={"x": 2.6}, verify_rounds=10, tokens=26)]
    if cost_model:
        for r in rows:
            r.round_cost = cost_model.round_cost(r.shape)
            r.speedup = cost_model.speedup(r.acceptance_length, r.shape)
    res = SweepResult(rows=rows, drafter="d", store="s", draft_kv="sglang", num_samples=3, proxy_reason=None,
                      cost=cost_model, assumptions=[])
    path.write_text(json.dumps(res.to_dict()))
    return path, res
