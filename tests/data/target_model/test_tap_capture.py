"""TapCapture: the hooked taps are exactly HF's ``output_hidden_states``, and the hooks go away."""

from __future__ import annotations

import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_data.target_model import TapCapture, decoder_layers


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize("taps", [(2, 3, 4), (0, 6), (5, 1)])  # 0 = embeddings, 6 = post-norm last state
def test_hooked_taps_equal_output_hidden_states(tiny_llama, taps):
    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])
    with torch.no_grad():
        reference = tiny_llama(input_ids=ids, output_hidden_states=True).hidden_states
        with TapCapture(tiny_llama, taps) as capture:
            tiny_llama(input_ids=ids)
    got = capture.stacked(dim=2)
    assert got.shape == (1, 7, len(taps), 64)
    for j, i in enumerate(taps):
        assert torch.equal(got[:, :, j], reference[i]), i
    layers = decoder_layers(tiny_llama)
    assert not any(layer._forward_pre_hooks for layer in layers) and not tiny_llama.base_model._forward_hooks


def test_bad_taps_and_missing_captures(tiny_llama):
    with pytest.raises(ConfigError, match=r"must be in \[0, 6\]"):
        TapCapture(tiny_llama, (2, 7))
    capture = TapCapture(tiny_llama, (2,))
    with capture:
        pass  # no forward ran
    with pytest.raises(Exception, match="not captured"):
        capture.stacked(dim=1)
