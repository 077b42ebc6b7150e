"""Target loading and identity: stable hashes, default taps, clear errors."""

from __future__ import annotations

import shutil

import pytest

from osprey_data.errors import InputError
from osprey_data.target_model import chat_template_hash, identify_target, load_hf_target, split_gguf


def test_identity_is_stable_across_copies_and_distinguishes_models(tiny_llama_dir, tiny_qwen3_dir, tmp_path):
    m1, t1 = load_hf_target(str(tiny_llama_dir))
    copy = tmp_path / "copy"
    shutil.copytree(tiny_llama_dir, copy)
    m2, t2 = load_hf_target(str(copy))
    a, b = identify_target(m1, t1, "a"), identify_target(m2, t2, "b")
    assert (a.config_hash, a.tokenizer_hash) == (b.config_hash, b.tokenizer_hash)
    assert (a.model_type, a.num_layers, a.hidden_size, a.vocab_size, a.dtype) == ("llama", 6, 64, len(t1), "float32")
    m3, t3 = load_hf_target(str(tiny_qwen3_dir))
    c = identify_target(m3, t3, "c")
    assert c.config_hash != a.config_hash and c.tokenizer_hash == a.tokenizer_hash
    t2.add_tokens(["<new>"])
    assert identify_target(m2, t2, "b").tokenizer_hash != a.tokenizer_hash
    assert chat_template_hash(t1) == chat_template_hash(t3)


def test_missing_targets_are_input_errors(tmp_path, tiny_llama_dir):
    with pytest.raises(InputError, match="no such folder"):
        load_hf_target(str(tmp_path / "missing"))
    with pytest.raises(InputError, match="GGUF file 'x.gguf' not found"):
        load_hf_target(str(tiny_llama_dir), gguf_file="x.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="cannot load"):
        load_hf_target(str(tmp_path / "empty"))


def test_gguf_path_forms():
    assert split_gguf("/m/model.Q4.gguf", None) == ("/m", "model.Q4.gguf")
    assert split_gguf("/m", "model.gguf") == ("/m", "model.gguf")
    assert split_gguf("/m", None) == ("/m", None)
