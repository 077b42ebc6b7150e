"""Top-k teacher fidelity (issue 33) against brute force on small distributions."""

from __future__ import annotations

import math

import torch

from osprey_train.evaluation.teacher_fidelity import TopkFidelity, topk_fidelity


def test_mass_kl_and_tail_entropy_equal_their_definitions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 40, generator=g) * 3
    figures = topk_fidelity(logits, (1, 4, 40))
    p = torch.softmax(logits.double(), -1)
    for n in range(5):
        order = p[n].argsort(descending=True)
        for k in (1, 4):
            top, tail = order[:k], order[k:]
            mass = float(p[n, top].sum())
            q = p[n, top] / mass                       # the renormalised top-k
            kl = float((q * (q / p[n, top]).log()).sum())
            r = p[n, tail] / p[n, tail].sum()
            h_tail = float(-(r * r.log()).sum())
            assert math.isclose(float(figures[k]["mass"][n]), mass, rel_tol=1e-5)
            assert math.isclose(float(figures[k]["kl_renorm"][n]), kl, rel_tol=1e-4, abs_tol=1e-6)
            assert math.isclose(float(figures[k]["tail_entropy"][n]), h_tail, rel_tol=1e-3, abs_tol=1e-4)
        # the whole vocabulary: nothing lost
        assert math.isclose(float(figures[40]["mass"][n]), 1.0, rel_tol=1e-6)
        assert float(figures[40]["kl_renorm"][n]) < 1e-6 and float(figures[40]["tail_entropy"][n]) == 0.0


def test_the_running_table_averages_the_selected_positions_per_group():
    logits = torch.tensor([[10.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    fid = TopkFidelity(ks=(1,))
    figures = topk_fidelity(logits, (1,))
    fid.add(["all", "chat"], figures, torch.tensor([True, True]))
    fid.add(["all"], figures, torch.tensor([True, False]))
    peaked = float(torch.softmax(logits[0], -1)[0])
    assert fid.counts == {"all": 3, "chat": 2}
    assert math.isclose(fid.table("chat")[1]["mass"], (peaked + 1 / 3) / 2, rel_tol=1e-6)
    assert fid.table("chat")[1]["low_mass_share"] == 0.5 and fid.table("nobody") == {}
