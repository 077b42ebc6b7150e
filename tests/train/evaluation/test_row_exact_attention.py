"""Row-exact attention: a verify block's rows get the bits of plain one-row steps, in bfloat16, and
the attention is SDPA's up to rounding; masks that are not chains go to SDPA unchanged."""

from __future__ import annotations

import types

import pytest
import torch

from osprey_train.evaluation.row_exact_attention import (ROW_EXACT, prefix_lengths, row_exact_attention,
                                                         use_row_exact_attention)
from osprey_train.evaluation.spec_decode import plain_generate, speculative_generate
from osprey_train.evaluation.target_session import HFTargetSession
from tests.train.evaluation._live_stubs import LogitsFnDrafter


def _tiny_bf16_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def test_prefix_lengths_of_chain_masks_and_refusals():
    assert prefix_lengths(None, 3, 10, causal=True) == [8, 9, 10]
    assert prefix_lengths(None, 1, 10, causal=True) == [10]
    assert prefix_lengths(None, 2, 5, causal=False) == [5, 5]
    chain = torch.ones(1, 1, 3, 10, dtype=torch.bool).tril(7)
    assert prefix_lengths(chain, 3, 10, causal=True) == [8, 9, 10]
    additive = torch.zeros(1, 1, 3, 10).masked_fill(~chain, float("-inf"))
    assert prefix_lengths(additive, 3, 10, causal=True) == [8, 9, 10]
    finfo_min = torch.zeros(1, 1, 3, 10, dtype=torch.bfloat16).masked_fill(~chain, torch.finfo(torch.bfloat16).min)
    assert prefix_lengths(finfo_min, 3, 10, causal=True) == [8, 9, 10]
    tree = chain.clone()
    tree[0, 0, 2, 8] = False  # the third node does not see the second: siblings, not a chain
    assert prefix_lengths(tree, 3, 10, causal=True) is None
    assert prefix_lengths(torch.zeros(1, 1, 3, 10).masked_fill(~chain, -1.0), 3, 10, causal=True) is None  # biases
    padded = chain.repeat(2, 1, 1, 1)
    padded[1, 0, :, 0] = False  # left padding in the second batch row: rows differ between sequences
    assert prefix_lengths(padded, 3, 10, causal=True) is None


@pytest.mark.parametrize("groups", [1, 3])
def test_rows_equal_sdpa_up_to_rounding_and_one_row_calls_exactly(groups):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(1)
    module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=True, training=False)
    q = torch.randn(1, 2 * groups, 4, 16, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 2, 37, 16, generator=g).to(torch.bfloat16)
    v = torch.randn(1, 2, 37, 16, generator=g).to(torch.bfloat16)
    mask = torch.ones(1, 1, 4, 37, dtype=torch.bool).tril(33)
    out, _ = row_exact_attention(module, q, k, v, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert out.shape == ref.shape == (1, 4, 2 * groups, 16)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    for t in range(4):  # row t of the block is the plain step at its position, bit for bit
        alone, _ = row_exact_attention(module, q[:, :, t: t + 1], k[:, :, : 34 + t], v[:, :, : 34 + t], None,
                                       scaling=0.25)
        assert torch.equal(alone[:, 0], out[:, t])


def test_verify_rows_are_bit_equal_to_plain_steps_in_bfloat16():
    model = _tiny_bf16_llama()
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 512, (70,), generator=g).tolist()
    plain = HFTargetSession(model)
    assert plain.row_exact and model.config._attn_implementation == ROW_EXACT
    plain.reset(128)
    plain.forward(seq[:30], want_taps=False, logits_for=1)
    step_logits = [plain.forward([tok], want_taps=False, logits_for=1)[0][-1] for tok in seq[30:70]]
    verify = HFTargetSession(model)
    verify.reset(16)  # another capacity (cache strides) than the plain session's
    verify.forward(seq[:30], want_taps=False, logits_for=1)
    pos = 30
    while pos < 70:
        block = seq[pos: pos + 5]
        logits = verify.forward(block, want_taps=False)[0]
        for j, row in enumerate(logits):
            assert torch.equal(row, step_logits[pos - 30 + j]), f"position {pos + j}"
        pos += len(block)


def test_greedy_speculative_decoding_equals_plain_decoding_in_bfloat16():
    """A drafter that proposes the next tokens of a perturbed continuation: many rounds accept some
    drafts and reject the rest, and the output must be plain bf16 decoding's, token for token."""
    model = _tiny_bf16_llama()
    prompt = list(range(5, 25))
    reference = plain_generate(HFTargetSession(model), prompt, max_new_tokens=40).output_ids

    def fn(context: list[int]) -> torch.Tensor:
        k = len(context) - len(prompt)
        token = reference[k] if k < len(reference) else 0
        logits = torch.zeros(512)
        logits[(token + 1) % 512 if k % 3 == 1 else token] = 5.0  # every third draft is wrong
        return logits

    out = speculative_generate(HFTargetSession(model, (1,)), LogitsFnDrafter(fn), prompt, num_steps=4, max_new_tokens=40)
    assert out.output_ids == reference
    assert 0 < sum(out.accepted) < sum(out.drafted)


def test_only_sdpa_models_are_switched():
    assert use_row_exact_attention(torch.nn.Linear(2, 2)) is False
    model = _tiny_bf16_llama()
    model.set_attn_implementation("eager")
    assert use_row_exact_attention(model) is False and model.config._attn_implementation == "eager"
    assert HFTargetSession(model).row_exact is False
    model.set_attn_implementation("sdpa")
    assert HFTargetSession(model, row_exact=False).row_exact is False
    assert model.config._attn_implementation == "sdpa"
