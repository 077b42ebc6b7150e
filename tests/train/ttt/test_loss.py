"""Chunked distillation CE vs direct formulas; target LM head loading from safetensors."""

from __future__ import annotations

import json

import pytest
import torch

from osprey_data.errors import ConfigError, InputError
from osprey_train.ttt.loss import TargetRows, VocabMap, chunked_distill_ce
from osprey_train.ttt.target_head import TargetHead, find_head_tensor, load_target_head


N, D, V, K = 13, 8, 30, 5


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(D, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, D, generator=g))
    x = torch.randn(N, D, generator=g, requires_grad=True)
    t_logits = torch.randn(N, V, generator=g) * 2
    lp = torch.log_softmax(t_logits, -1)
    top = lp.topk(K, dim=-1)
    rows = TargetRows(topk_ids_NK=top.indices.int(), topk_logprobs_NK=top.values)
    return head, x, t_logits, lp, rows


def _direct_tail(logq, ids, lp_k):
    p = lp_k.exp()
    q_top = logq.gather(1, ids)
    mask = torch.zeros_like(logq, dtype=torch.bool).scatter(1, ids, True)
    logq_tail = torch.logsumexp(logq.masked_fill(mask, float("-inf")), -1)
    return -(p * q_top).sum(-1) - (1 - p.sum(-1)) * logq_tail


@pytest.mark.parametrize("mode", ["tail", "renorm"])
def test_topk_modes_match_direct_formula_and_gradients(mode):
    head, x, _, _, rows = _setup()
    ce, correct = chunked_distill_ce(x, head, rows, mode=mode, chunk_size=4)
    logq = torch.log_softmax(head(x), -1)
    ids = rows.topk_ids_NK.long()
    if mode == "tail":
        ref = _direct_tail(logq, ids, rows.topk_logprobs_NK).sum()
    else:
        ref = -(torch.softmax(rows.topk_logprobs_NK, -1) * logq.gather(1, ids)).sum()
    torch.testing.assert_close(ce, ref)
    g1 = torch.autograd.grad(ce, [x, head.weight])
    g2 = torch.autograd.grad(ref, [x, head.weight])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)
    assert correct.item() == (head(x).argmax(-1) == ids[:, 0]).sum().item()


def test_tail_with_full_topk_equals_full_ce():
    head, x, t_logits, lp, _ = _setup()
    top = lp.topk(V, dim=-1)
    rows = TargetRows(topk_ids_NK=top.indices, topk_logprobs_NK=top.values)
    ce, _ = chunked_distill_ce(x, head, rows, mode="tail", chunk_size=5)
    full = -(lp.exp() * torch.log_softmax(head(x), -1)).sum()
    torch.testing.assert_close(ce, full, atol=1e-4, rtol=1e-5)


def test_full_mode_through_target_head():
    head, x, t_logits, lp, _ = _setup()
    W = torch.randn(V, 6)
    h = torch.randn(N, 6)
    rows = TargetRows(final_hidden_NDt=h)
    ce, correct = chunked_distill_ce(x, head, rows, mode="full", target_head=TargetHead(W), chunk_size=3)
    p = torch.softmax(h @ W.T, -1)
    torch.testing.assert_close(ce, -(p * torch.log_softmax(head(x), -1)).sum())
    assert correct.item() == (head(x).argmax(-1) == (h @ W.T).argmax(-1)).sum().item()
    with pytest.raises(ConfigError, match="final_hidden"):
        chunked_distill_ce(x, head, TargetRows(), mode="full")
    with pytest.raises(ConfigError, match="unknown target distribution"):
        chunked_distill_ce(x, head, rows, mode="nope")


def test_eagle3_draft_vocab_restriction():
    """Draft vocab = even target ids: odd top-k ids go to the tail (tail) or are dropped (renorm)."""
    head, x, t_logits, lp, _ = _setup()
    Vt = 2 * V
    d2t = torch.arange(V) * 2
    vmap = VocabMap.from_drafter(d2t, Vt)
    g = torch.Generator().manual_seed(3)
    lp_t = torch.log_softmax(torch.randn(N, Vt, generator=g) * 2, -1)
    top = lp_t.topk(K, dim=-1)
    rows = TargetRows(topk_ids_NK=top.indices, topk_logprobs_NK=top.values)
    logq = torch.log_softmax(head(x), -1)
    ce, correct = chunked_distill_ce(x, head, rows, mode="tail", vmap=vmap, chunk_size=4)
    ref = 0.0
    for n in range(N):
        even = top.indices[n] % 2 == 0
        d_ids = top.indices[n][even] // 2
        p = top.values[n][even].exp()
        mask = torch.zeros(V, dtype=torch.bool)
        mask[d_ids] = True
        ref = ref - (p * logq[n, d_ids]).sum() - (1 - p.sum()) * torch.logsumexp(logq[n][~mask], -1)
    torch.testing.assert_close(ce, ref)
    pred_t = head(x).argmax(-1) * 2
    assert correct.item() == (pred_t == top.indices[:, 0]).sum().item()
    ce_r, _ = chunked_distill_ce(x, head, rows, mode="renorm", vmap=vmap)
    assert torch.isfinite(ce_r)


def test_chunking_keeps_logits_out_of_saved_tensors():
    """Nothing of size [N, V] is saved for backward: the chunks are recomputed."""
    head, x, _, _, rows = _setup()
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ce, _ = chunked_distill_ce(x, head, rows, chunk_size=4)
    assert max(sizes) < N * V
    ce.backward()


def _save(tensors, path):
    from safetensors.torch import save_file

    save_file(tensors, str(path))


def test_target_head_single_sharded_and_tied(tmp_path, tiny_qwen3_dir):
    W = torch.randn(V, 6)
    single = tmp_path / "single"
    single.mkdir()
    (single / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    _save({"lm_head.weight": W, "model.embed_tokens.weight": torch.zeros(V, 6)}, single / "model.safetensors")
    torch.testing.assert_close(load_target_head(single).weight_VtDt, W)

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text(json.dumps({"final_logit_softcapping": 3.0}))
    _save({"model.embed_tokens.weight": torch.zeros(V, 6)}, sharded / "a.safetensors")
    _save({"lm_head.weight": W}, sharded / "b.safetensors")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "a.safetensors", "lm_head.weight": "b.safetensors"}}))
    head = load_target_head(sharded)
    torch.testing.assert_close(head.weight_VtDt, W)
    h = torch.randn(2, 6)
    torch.testing.assert_close(head(h), torch.tanh(h @ W.T / 3.0) * 3.0)

    # Real HF tied checkpoint (tiny Qwen3): the head is the input embedding.
    from transformers import AutoModelForCausalLM

    key, _ = find_head_tensor(tiny_qwen3_dir)
    assert key.endswith("embed_tokens.weight")
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir)
    torch.testing.assert_close(load_target_head(tiny_qwen3_dir).weight_VtDt, model.lm_head.weight)

    nothing = tmp_path / "nothing"
    nothing.mkdir()
    with pytest.raises(InputError, match="no config.json"):
        load_target_head(nothing)
    (nothing / "config.json").write_text("{}")
    with pytest.raises(InputError, match="no model.safetensors"):
        load_target_head(nothing)
