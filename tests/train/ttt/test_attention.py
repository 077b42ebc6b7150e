"""TTT attention: every implementation against the naive materialized-mask reference."""

from __future__ import annotations

import pytest
import torch

from osprey_data.errors import BackendUnavailableError, ConfigError
from osprey_train.ttt.attention import TTTAttention, document_positions, flex_available


# flex has no backward on CPU: its gradients are checked on CUDA only (see test_flex_*).
IMPLS = ["sdpa", "eager"]


def _run(impl, qkv, doc_ids, block_size=8):
    attn = TTTAttention(doc_ids, impl=impl, block_size=block_size)
    outs = []
    for step, (q, k, v) in enumerate(qkv):
        for layer in range(2):  # two layers share one cache object, kept apart by layer index
            outs.append(attn.at_step(step)(layer, q * (layer + 1), k, v))
    return outs


def _make(steps, B=2, H=4, Hk=2, T=21, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = [tuple((torch.randn(B, h, T, d, generator=g)).requires_grad_() for h in (H, Hk, Hk))
           for _ in range(steps + 1)]
    doc_ids = torch.tensor([[0] * 7 + [1] * 9 + [2] * 5, [5] * 21])
    return qkv, doc_ids


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("steps", [0, 1, 3, 8])
def test_forward_and_gradients_match_naive(impl, steps):
    qkv, doc_ids = _make(steps)
    ref = _run("naive", qkv, doc_ids)
    got = _run(impl, qkv, doc_ids)
    w = [torch.randn_like(o) for o in ref]
    leaves = [t for trip in qkv for t in trip]
    g_ref = torch.autograd.grad(sum((o * wi).sum() for o, wi in zip(ref, w)), leaves)
    g_got = torch.autograd.grad(sum((o * wi).sum() for o, wi in zip(got, w)), leaves)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=2e-5)
    for a, b in zip(g_ref, g_got):
        torch.testing.assert_close(b, a, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("steps", [0, 3])
def test_sdpa_under_cpu_autocast_runs_step_zero_in_float32(steps, monkeypatch):
    """Under CPU bf16 autocast the step-0 SDPA gets float32 inputs (its bf16 backward is slow on
    CPU); the result and gradients stay the float32 reference's within bf16 tolerance."""
    import torch.nn.functional as F

    seen = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, *a, **kw: seen.append(q.dtype) or sdpa(q, *a, **kw))
    qkv, doc_ids = _make(steps)
    bf16 = [tuple(t.detach().to(torch.bfloat16).requires_grad_() for t in trip) for trip in qkv]
    ref = _run("naive", qkv, doc_ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _run("sdpa", bf16, doc_ids)
    assert seen and set(seen) == {torch.float32}
    for a, b in zip(ref, got):
        torch.testing.assert_close(b.float(), a, atol=5e-2, rtol=5e-2)
    grads = torch.autograd.grad(sum(o.float().sum() for o in got), [t for trip in bf16 for t in trip], allow_unused=True)
    assert all(g is None or torch.isfinite(g).all() for g in grads)


def _check_flex(device, steps):
    # Compiled flex on CUDA needs a head dimension of at least 16 (inductor's lowering).
    qkv, doc_ids = _make(steps, d=16 if device == "cuda" else 8)
    qkv = [tuple(t.detach().to(device).requires_grad_() for t in trip) for trip in qkv]
    doc_ids = doc_ids.to(device)
    if device == "cpu":
        with torch.no_grad():
            ref, got = _run("naive", qkv, doc_ids), _run("flex", qkv, doc_ids)
        for a, b in zip(ref, got):
            torch.testing.assert_close(b, a, atol=2e-5, rtol=2e-5)
        return
    ref, got = _run("naive", qkv, doc_ids), _run("flex", qkv, doc_ids)
    leaves = [t for trip in qkv for t in trip]
    w = [torch.randn_like(o) for o in ref]
    g_ref = torch.autograd.grad(sum((o * wi).sum() for o, wi in zip(ref, w)), leaves)
    g_got = torch.autograd.grad(sum((o * wi).sum() for o, wi in zip(got, w)), leaves)
    for a, b in zip(list(ref) + list(g_ref), list(got) + list(g_got)):
        torch.testing.assert_close(b, a, atol=2e-3, rtol=2e-3)


@pytest.mark.skipif(not flex_available(), reason="no flex_attention in this torch")
@pytest.mark.parametrize("steps", [0, 3, 8])
def test_flex_forward_matches_naive_cpu(steps):
    _check_flex("cpu", steps)


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [0, 3, 8])
def test_flex_forward_and_gradients_match_naive_cuda(steps):
    _check_flex("cuda", steps)


@pytest.mark.gpu
def test_flex_refuses_a_head_dim_below_16_on_cuda_clearly():
    qkv, doc_ids = _make(0, d=8)
    qkv = [tuple(t.detach().cuda() for t in trip) for trip in qkv]
    with pytest.raises(BackendUnavailableError, match="at least 16"):
        _run("flex", qkv, doc_ids.cuda())


def test_flex_refuses_cpu_backward_clearly():
    from osprey_data.errors import BackendUnavailableError

    if not flex_available():
        pytest.skip("no flex_attention")
    x = torch.randn(1, 2, 4, 8, requires_grad=True)
    with pytest.raises(BackendUnavailableError, match="--attention sdpa"):
        TTTAttention(None, impl="flex").at_step(0)(0, x, x, x)


def test_naive_pattern_is_the_ttt_pattern():
    """With values = one-hot of (step, slot) the output weights reveal which keys are visible."""
    T, steps = 6, 3
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1]])
    q = torch.zeros(1, 1, T, 4)  # zero scores: uniform weights over the visible keys
    attn = TTTAttention(doc_ids, impl="naive")
    for step in range(steps + 1):
        v = torch.zeros(1, 1, T, (steps + 1) * T)
        v[0, 0, torch.arange(T), step * T + torch.arange(T)] = 1.0
        out = attn.at_step(step)(0, q, torch.zeros(1, 1, T, 4), v)[0, 0]
        visible = out > 0
        for t in range(T):
            doc_start = 0 if t < 3 else 3
            expect = {s for s in range(doc_start, t + 1)} | {j * T + t for j in range(1, step + 1)}
            assert set(visible[t].nonzero().flatten().tolist()) == expect


def test_document_positions():
    doc = torch.tensor([[3, 3, 3, 7, 7, 9]])
    assert document_positions(doc).tolist() == [[0, 1, 2, 0, 1, 0]]


def test_step_order_and_bad_impl():
    attn = TTTAttention(None, impl="eager")
    x = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="ran before steps"):
        attn.at_step(2)(0, x, x, x)
    with pytest.raises(ConfigError, match="unknown TTT attention"):
        TTTAttention(None, impl="magic")
