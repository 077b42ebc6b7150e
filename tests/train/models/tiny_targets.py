"""Test helpers (not tests): a second tiny tokenizer/target and a small fake feature store.

The Stage-3 tests need a target whose tokenizer differs from the backbone's (trained locally on
other text, other size) and a store written through the real ``StoreWriter`` (random features,
real token ids and loss masks), without running the builder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer

TARGET_CORPUS = [
    "the cat sat on the mat and the dog ran to the park",
    "Two plus two is four, three plus three is six.",
    "Markets fell while bond yields rose in the morning session.",
    "def mul(a, b):\n    return a * b\n",
    "Where is the station? The station is near the old bridge.",
    "Hello there, how is the weather today? It is sunny and warm.",
]


def make_target(root: Path, *, hidden_size: int = 48, num_layers: int = 6) -> Path:
    """A random Llama target (d=48) with its own 320-token byte-level BPE tokenizer."""
    tok = make_tiny_tokenizer(root / "tok", vocab_size=320, corpus=TARGET_CORPUS)
    return make_tiny_llama(root / "target", tok, num_layers=num_layers, hidden_size=hidden_size, seed=3)


def make_fake_store(out: Path, target_dir: Path, *, taps=(1, 3, 4), num_samples: int = 4, length: int = 12,
                    seed: int = 0) -> Path:
    """Write a store for the target at ``target_dir`` with random features (real StoreWriter)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from osprey_data.store import SampleRecord, StoreHeader, StoreWriter
    from osprey_data.target_model import TapLayers, chat_template_hash, identify_target

    model = AutoModelForCausalLM.from_pretrained(target_dir)
    tok = AutoTokenizer.from_pretrained(target_dir)
    identity = identify_target(model, tok, str(target_dir))
    header = StoreHeader(target=identity, taps=TapLayers(layer_ids=tuple(taps)), topk=4, hidden_codec="bf16",
                         has_final_hidden=False, chat_template_hash=chat_template_hash(tok),
                         generation={"greedy": True}, build_fingerprint="test", build_config={},
                         builder_version="test")
    rng = np.random.default_rng(seed)
    with StoreWriter(str(out), header) as writer:
        for i in range(num_samples):
            ids = rng.integers(0, identity.vocab_size, size=length).astype(np.int32)
            ids[-4:] = 7  # token 7 dominates the loss-masked counts
            mask = np.zeros(length, dtype=bool)
            mask[length // 2:] = True
            writer.add(SampleRecord(
                sample_id=f"s{i}", domain="chat", source="test", conversation=[{"role": "user", "content": "hi"}],
                token_ids=ids, loss_mask=mask, prompt_length=length // 2, finish_reason="stop",
                hidden_TLD=rng.standard_normal((length, len(taps), identity.hidden_size)).astype(np.float32),
                topk_ids_TK=np.tile(np.arange(4, dtype=np.int32), (length, 1)),
                topk_logprobs_TK=np.tile(np.log(np.array([0.4, 0.3, 0.2, 0.1], dtype=np.float32)), (length, 1)),
            ))
    return out
