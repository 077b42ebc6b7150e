"""The ``make_tiny_store`` test helper other areas build their fixtures on."""

from __future__ import annotations

from osprey_data.store import StoreReader, validate_store
from tests.helpers.tiny_store import make_tiny_store


def test_make_tiny_store(tiny_qwen3_dir, tmp_path):
    path = make_tiny_store(tmp_path / "s", tiny_qwen3_dir, num_samples=10, max_new_tokens=4, topk=4,
                           final_hidden=True, regenerate=False, hidden_codec="fp8")
    assert validate_store(str(path)).problems == []
    r = StoreReader(str(path))
    h = r.header
    assert len(r) == 10 and h.topk == 4 and h.has_final_hidden and h.hidden_codec == "fp8"
    s = r.sample(r.index_of("tiny-009"))
    assert s.finish_reason == "teacher_forced" and s.conversation[-1]["role"] == "assistant"
    assert s.loss_mask.any() and s.final_hidden_TD.shape == (s.num_tokens, h.target.hidden_size)
