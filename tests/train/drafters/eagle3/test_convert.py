"""EAGLE-3 baseline init: target embedding (frozen), draft vocabulary from loss-masked store counts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from osprey_data.errors import ConfigError
from osprey_train.stages.draft_vocab import loss_masked_token_counts, select_draft_vocab
from osprey_train.drafters.eagle3.model import Eagle3Drafter
from osprey_train.models import load_drafter
from osprey_train.stages.convert import ConvertConfig, run
from tests.train.models.tiny_targets import make_fake_store


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_llama_dir):
    return make_fake_store(tmp_path_factory.mktemp("e3") / "store", tiny_llama_dir, taps=(2, 3, 4))


def test_counts_follow_loss_mask(store):
    from osprey_data.store import StoreReader

    counts = loss_masked_token_counts(str(store), 384)
    reader = StoreReader(str(store))
    naive = np.zeros(384, dtype=np.int64)
    for sample in reader.iter_samples():
        for t, m in zip(sample.token_ids, sample.loss_mask):
            naive[t] += int(m)
    assert np.array_equal(counts, naive) and counts[7] == 16


def test_select_draft_vocab_ties_and_padding():
    counts = np.array([0, 5, 5, 1, 0, 9])
    assert select_draft_vocab(counts, 3).tolist() == [1, 2, 5]
    assert select_draft_vocab(counts, 5).tolist() == [0, 1, 2, 3, 5]  # unused ids fill by lowest id
    with pytest.raises(ConfigError, match="exceeds"):
        select_draft_vocab(counts, 7)


def test_eagle3_init_end_to_end(store, tiny_llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    result = run(ConvertConfig(arch="eagle3", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "e3",
                               draft_vocab_size=64))
    model = load_drafter(result.out)
    assert isinstance(model, Eagle3Drafter)
    cfg = model.config
    assert cfg.draft_vocab_size == 64 and cfg.vocab_size == 384 and cfg.tap_layers.layer_ids == (2, 3, 4)
    target = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    assert torch.equal(model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert not model.embed_tokens.weight.requires_grad
    d2t = model.draft_to_target
    counts = loss_masked_token_counts(str(store), 384)
    assert 7 in d2t.tolist() and bool((d2t[1:] > d2t[:-1]).all())
    # every token seen at a loss-masked position makes it when it fits
    assert set(np.nonzero(counts)[0].tolist()) <= set(d2t.tolist()) or (counts > 0).sum() > 64
    t2d = model.target_to_draft_mask()
    assert int(t2d.sum()) == 64 and bool(t2d[d2t].all())
    stats = json.loads((result.out / "draft_vocab.json").read_text())
    assert stats["draft_vocab_size"] == 64 and 0 < stats["coverage"] <= 1
    with pytest.raises(ConfigError, match="exceeds"):
        run(ConvertConfig(arch="eagle3", target=str(tiny_llama_dir), store=str(store), out=tmp_path / "x",
                          draft_vocab_size=1000))
    assert not (tmp_path / "x").exists()
    # the parameter-matched control: same init for the shared parts, one plain layer more
    two = load_drafter(run(ConvertConfig(arch="eagle3", target=str(tiny_llama_dir), store=str(store),
                                         out=tmp_path / "e3-2l", draft_vocab_size=64, eagle3_layers=2)).out)
    assert two.config.num_layers == 2 and len(two.layers) == 1
    assert torch.equal(two.draft_to_target, d2t) and torch.equal(two.embed_tokens.weight, model.embed_tokens.weight)
    with pytest.raises(ConfigError, match="--eagle3-layers applies to --arch eagle3 only"):
        ConvertConfig(backbone=tmp_path, store=str(store), out=tmp_path / "y", eagle3_layers=2)


def test_eagle3_init_refuses_a_target_the_store_was_not_built_with(store, tiny_qwen3_dir, tmp_path):
    from osprey_data.errors import ManifestMismatchError

    # same tokenizer, different model: caught by the config hash
    with pytest.raises(ManifestMismatchError, match="config hash"):
        run(ConvertConfig(arch="eagle3", target=str(tiny_qwen3_dir), store=str(store), out=tmp_path / "q",
                          draft_vocab_size=16))
