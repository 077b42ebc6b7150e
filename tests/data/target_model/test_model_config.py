"""Model sizes read from config files alone (``peek_model_config``): HF folders, nested text configs, GGUF."""

from __future__ import annotations

import json

import pytest

from osprey_data.errors import InputError
from osprey_data.target_model import peek_model_config


def test_an_hf_folder_and_a_nested_text_config(tmp_path, tiny_llama_dir):
    shape = peek_model_config(str(tiny_llama_dir))
    assert (shape.num_layers, shape.hidden_size, shape.vocab_size, shape.max_position_embeddings) == (6, 64, 384, 512)
    assert shape.path == str(tiny_llama_dir / "config.json") and shape.model_type == "llama"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vlm", "vision_config": {"num_hidden_layers": 2},
                                                      "text_config": {"model_type": "qwen3", "num_hidden_layers": 28,
                                                                      "hidden_size": 1024}}))
    shape = peek_model_config(str(tmp_path))
    assert (shape.num_layers, shape.hidden_size, shape.vocab_size, shape.model_type) == (28, 1024, None, "qwen3")


def test_refused_folders_and_unread_hub_ids(tmp_path):
    with pytest.raises(InputError, match="--source .*no config.json"):
        peek_model_config(str(tmp_path), option="--source")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not a readable config.json"):
        peek_model_config(str(tmp_path))
    assert peek_model_config("org/model") is None   # a hub id: the load reads it


def test_a_gguf_header(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(30)
    w.add_embedding_length(576)
    w.add_context_length(8192)
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for args in ((str(path), None), (str(tmp_path), "m.gguf")):
        shape = peek_model_config(*args)
        assert (shape.num_layers, shape.hidden_size, shape.vocab_size, shape.max_position_embeddings) == (30, 576, 3, 8192)
