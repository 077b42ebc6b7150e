"""HFTargetSession: the rollback cache and hooked taps give exactly what a stock DynamicCache with
``output_hidden_states`` gives, and rolling back copies nothing."""

from __future__ import annotations

import pytest
import torch

from osprey_train.evaluation.target_session import HFTargetSession

TAPS = (2, 3, 6)


def _reference(model, ids):
    """One full forward without a cache: logits and taps of every position."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0].float(), torch.stack([out.hidden_states[i][0] for i in TAPS], dim=1)


def _gemma3(sliding_window: int = 4):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              sliding_window=sliding_window, max_position_embeddings=256)
    return Gemma3ForCausalLM(config).eval()


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request, tiny_llama_dir):
    if request.param == "gemma3":  # sliding-window layers must roll back too
        return _gemma3()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def test_forwards_and_rollbacks_equal_a_full_recompute(model):
    """Prefill, verify blocks with rejected drafts, rollbacks and growth past the preallocated capacity."""
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 384, (90,), generator=g).tolist()
    session = HFTargetSession(model, TAPS)
    session.reset(capacity=8)  # far too small: the buffers must grow on the way
    committed = 10
    logits, taps = session.forward(seq[:committed], want_taps=True, logits_for=1)
    ref_logits, ref_taps = _reference(model, seq[:committed])
    torch.testing.assert_close(logits, ref_logits[-1:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(taps, ref_taps, rtol=1e-4, atol=1e-4)
    while committed < 80:
        wrong = torch.randint(0, 384, (3,), generator=g).tolist()
        block = [seq[committed], *wrong]  # like a verify of S=3 drafts that are all rejected
        logits, taps = session.forward(block, want_taps=True)
        ref_logits, ref_taps = _reference(model, seq[:committed] + block)
        torch.testing.assert_close(logits, ref_logits[-4:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(taps, ref_taps[-4:], rtol=1e-4, atol=1e-4)
        session.crop(committed)  # reject the drafts, keep the cache up to the last committed token
        accepted = 1 + committed % 5
        logits, _ = session.forward(seq[committed: committed + accepted], want_taps=False, logits_for=1)
        committed += accepted
        torch.testing.assert_close(logits, _reference(model, seq[:committed])[0][-1:], rtol=1e-4, atol=1e-4)
    assert session.length == committed


def test_rollback_copies_nothing(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    session = HFTargetSession(model)
    session.reset(capacity=64)
    session.forward(list(range(10)), want_taps=False, logits_for=1)
    layer = session.cache.layers[0]
    pointer = layer.keys.data_ptr()
    for _ in range(5):
        session.forward([1, 2, 3, 4], want_taps=False)
        session.crop(10)
        assert layer.keys.data_ptr() == pointer and layer.get_seq_length() == 10
    with pytest.raises(ValueError, match="cannot crop"):
        session.crop(11)
