"""Attention backends: incremental KV-cache decoding equals the full causal pass; documents stay apart."""

from __future__ import annotations

import pytest
import torch

from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.drafters.osprey.model import OspreyDrafter
from osprey_train.models import CausalAttention, DrafterConfig, KVCacheAttention
from osprey_train.models.attention import masked_attention


def _inputs(config, batch=2, length=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, length), generator=g)
    cond = torch.randn(batch, length, config.hidden_size, generator=g)
    pos = torch.arange(length)[None].expand(batch, length)
    return ids, cond, pos


PRESETS = ["tiny", "tiny-qwen3", "tiny-eagle3"]


def _model(name):
    torch.manual_seed(0)
    config = DrafterConfig.from_name(name)
    cls = Eagle3Drafter if config.arch == "eagle3" else OspreyDrafter
    return cls(config).eval()


@pytest.mark.parametrize("preset", PRESETS)
def test_kv_cache_incremental_equals_full_causal(preset):
    model = _model(preset)
    ids, cond, pos = _inputs(model.config)
    with torch.no_grad():
        full = model.forward_hidden(ids, cond, pos, CausalAttention())
        cache = KVCacheAttention(model.config.num_layers)
        pieces = []
        for start, stop in [(0, 4), (4, 5), (5, 8), (8, 9)]:  # a prefill, then uneven blocks
            sl = slice(start, stop)
            pieces.append(model.forward_hidden(ids[:, sl], cond[:, sl], pos[:, sl], cache))
        assert cache.length == 9
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)


def test_kv_cache_truncate_rolls_back_rejected_drafts():
    model = _model("tiny")
    ids, cond, pos = _inputs(model.config, length=8)
    with torch.no_grad():
        full = model.forward_hidden(ids, cond, pos, CausalAttention())
        cache = KVCacheAttention(model.config.num_layers)
        model.forward_hidden(ids[:, :5], cond[:, :5], pos[:, :5], cache)
        # Draft three wrong tokens, reject them, then feed the real continuation.
        wrong = (ids[:, 5:8] + 1) % model.config.vocab_size
        model.forward_hidden(wrong, cond[:, 5:8], pos[:, 5:8], cache)
        assert cache.length == 8
        cache.truncate(5)
        assert cache.length == 5 and all(cache.layer_length(i) == 5 for i in range(cache.num_layers))
        tail = model.forward_hidden(ids[:, 5:], cond[:, 5:], pos[:, 5:], cache)
    torch.testing.assert_close(tail, full[:, 5:], rtol=1e-5, atol=1e-5)
    cache.reset()
    assert cache.length == 0


def test_kv_cache_grows_past_its_capacity_and_rolls_back_without_copies():
    model = _model("tiny")
    ids, cond, pos = _inputs(model.config, length=12)
    with torch.no_grad():
        full = model.forward_hidden(ids, cond, pos, CausalAttention())
        cache = KVCacheAttention(model.config.num_layers, capacity=1)  # raised to the minimum, then grown
        cache.capacity = 3
        pieces = [model.forward_hidden(ids[:, :2], cond[:, :2], pos[:, :2], cache)]
        for t in range(2, 12):  # one token at a time: the buffers grow by doubling
            pieces.append(model.forward_hidden(ids[:, t:t + 1], cond[:, t:t + 1], pos[:, t:t + 1], cache))
        torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
        pointer = None
        for _ in range(3):  # draft 4 tokens, reject them: the length moves, the buffers stay
            model.forward_hidden(ids[:, 8:12], cond[:, 8:12], pos[:, 8:12] + 4, cache)
            cache.truncate(12)
            pointer = pointer or cache.keys[0].data_ptr()  # (the first round grew the buffers to 24)
            assert cache.keys[0].data_ptr() == pointer and cache.keys[0].shape[2] == 12
        tail = model.forward_hidden(ids[:, 11:12], cond[:, 11:12], pos[:, 11:12] + 1, cache)
        torch.testing.assert_close(tail, model.forward_hidden(
            torch.cat([ids, ids[:, 11:12]], 1), torch.cat([cond, cond[:, 11:12]], 1),
            torch.cat([pos, pos[:, 11:12] + 1], 1), CausalAttention())[:, -1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_doc_ids_prevent_cross_document_attention(preset):
    model = _model(preset)
    ids, cond, _ = _inputs(model.config, batch=1, length=10, seed=1)
    split = 6
    # Packed row: doc 0 at positions 0..5, doc 1 restarting at 0..3.
    pos = torch.cat([torch.arange(split), torch.arange(10 - split)])[None]
    doc = torch.tensor([[0] * split + [1] * (10 - split)])
    with torch.no_grad():
        packed = model.forward_hidden(ids, cond, pos, CausalAttention(doc))
        first = model.forward_hidden(ids[:, :split], cond[:, :split], pos[:, :split], CausalAttention())
        second = model.forward_hidden(ids[:, split:], cond[:, split:], pos[:, split:], CausalAttention())
        leaky = model.forward_hidden(ids, cond, pos, CausalAttention())
    torch.testing.assert_close(packed, torch.cat([first, second], dim=1), rtol=1e-5, atol=1e-5)
    # Without doc ids the second document does see the first (so the test can fail).
    assert not torch.allclose(leaky[:, split:], second, atol=1e-4)


def test_masked_attention_matches_naive_softmax_with_gqa():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=g)
    k = torch.randn(2, 2, 7, 8, generator=g)
    v = torch.randn(2, 2, 7, 8, generator=g)
    allowed = torch.rand(2, 5, 7, generator=g) > 0.4
    allowed[..., 0] = True
    out = masked_attention(q, k, v, allowed)
    k_rep, v_rep = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ k_rep.transpose(-1, -2) / 8 ** 0.5
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    naive = scores.softmax(-1) @ v_rep
    torch.testing.assert_close(out, naive, rtol=1e-5, atol=1e-5)


def test_doc_ids_shape_mismatch_is_a_config_error():
    from osprey_data.errors import ConfigError

    model = _model("tiny")
    ids, cond, pos = _inputs(model.config, batch=1, length=4)
    with pytest.raises(ConfigError, match="doc_ids"):
        model.forward_hidden(ids, cond, pos, CausalAttention(torch.zeros(1, 3, dtype=torch.long)))
