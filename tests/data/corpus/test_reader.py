"""Windows over a memory-mapped corpus: deterministic, disjoint within an epoch, held-out split."""

from __future__ import annotations

import json

import numpy as np
import pytest

from osprey_data.corpus import TokenCorpus, TokenizeCorpusConfig, WindowSampler, run
from osprey_data.errors import InputError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_tokenizer_dir):
    tmp = tmp_path_factory.mktemp("corpus")
    docs = [f"Document {i}: the quick brown fox jumps over the lazy dog {i % 7} times." for i in range(60)]
    (tmp / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    run(TokenizeCorpusConfig(tokenizer=str(tiny_tokenizer_dir), inputs=[tmp / "a.jsonl"], out_dir=tmp / "out",
                             shard_tokens=200, progress=False))
    return TokenCorpus(tmp / "out")


def test_memmap_reads_match_shards(corpus):
    assert all(isinstance(s, np.memmap) for s in corpus._shards)
    whole = np.concatenate([np.fromfile(corpus.path / s["file"], dtype="<u4") for s in corpus.index["shards"]])
    assert np.array_equal(corpus.tokens(0, len(corpus)), whole)
    with pytest.raises(IndexError):
        corpus.tokens(len(corpus) - 2, 5)


def test_windows_are_deterministic_disjoint_and_cover_an_epoch(corpus):
    s = WindowSampler(corpus, 0, len(corpus), 17, seed=3)
    n = s.windows_per_epoch
    starts = [s.window_start(i) for i in range(n)]
    assert sorted(set(np.diff(sorted(starts)))) == [17]              # non-overlapping grid, each once
    assert max(starts) + 17 <= len(corpus)
    again = WindowSampler(corpus, 0, len(corpus), 17, seed=3)
    assert [again.window_start(i) for i in range(n)] == starts        # pure function of (seed, i)
    other = WindowSampler(corpus, 0, len(corpus), 17, seed=4)
    assert [other.window_start(i) for i in range(n)] != starts
    assert [s.window_start(i) for i in range(n, 2 * n)] != starts     # next epoch reshuffles
    b = s.batch(5, 3)
    assert b.shape == (3, 17) and b.dtype == np.int64
    assert np.array_equal(b[1], corpus.tokens(s.window_start(6), 17))


def test_heldout_split_starts_at_a_document(corpus):
    (tr0, tr1), (ho0, ho1) = corpus.split(0.1)
    assert tr0 == 0 and tr1 == ho0 and ho1 == len(corpus)
    assert 0.05 * len(corpus) < ho1 - ho0 <= 0.1 * len(corpus)
    assert corpus.tokens(ho0 - 1, 1)[0] == corpus.eos_id
    with pytest.raises(InputError, match="too small"):
        WindowSampler(corpus, ho0, ho1, ho1 - ho0 + 5, seed=0)
