"""Corpus tokenization: formats, EOS separation, index identity, resume, bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from osprey_data.corpus import TokenCorpus, TokenizeCorpusConfig, run, tokenizer_identity
from osprey_data.corpus import tokenize as tokenize_mod
from osprey_data.errors import ConfigError, InputError, SchemaError

DOCS = ["The quick brown fox jumps over the lazy dog.", "What is two plus two? Two plus two is four.",
        "", "Hello! How are you today?", "The capital of France is Paris."]


def _jsonl(path, docs=DOCS, field="text"):
    path.write_text("".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs)))
    return path


def _cfg(tok_dir, inputs, out, **kw):
    return TokenizeCorpusConfig(tokenizer=str(tok_dir), inputs=inputs, out_dir=out, progress=False, **kw)


def test_formats_and_eos_separation(tmp_path, tiny_tokenizer_dir, tiny_tokenizer):
    src = tmp_path / "src"
    src.mkdir()
    jsonl = _jsonl(src / "a.jsonl")
    (src / "b.txt").write_text("Para one line.\n\nPara two.\n")
    pq.write_table(pa.table({"body": ["Stocks rose sharply.", "def add(a, b):"]}), src / "c.parquet")
    import datasets

    datasets.Dataset.from_dict({"text": ["One two three."]}).save_to_disk(str(src / "ds"))

    index = run(_cfg(tiny_tokenizer_dir, [jsonl, src / "b.txt"], tmp_path / "o1", txt_docs="paragraph"))
    index_pq = run(_cfg(tiny_tokenizer_dir, [src / "c.parquet"], tmp_path / "o2", text_field="body"))
    index_ds = run(_cfg(tiny_tokenizer_dir, [src / "ds"], tmp_path / "o3"))

    eos = tiny_tokenizer.eos_token_id
    expected_docs = [d for d in DOCS if d] + ["Para one line.", "Para two."]
    expected = []
    for d in expected_docs:
        expected += tiny_tokenizer(d, add_special_tokens=False)["input_ids"] + [eos]
    corpus = TokenCorpus(tmp_path / "o1", verify=True)
    assert corpus.tokens(0, len(corpus)).tolist() == expected
    assert index["num_documents"] == 6 and index["skipped_empty"] == 1
    assert [e["documents"] for e in index["inputs"]] == [4, 2]
    assert index["tokenizer"] == tokenizer_identity(tiny_tokenizer, str(tiny_tokenizer_dir))
    assert index["tokenizer"]["eos_token_id"] == eos and index["tokenizer"]["vocab_size"] == len(tiny_tokenizer)
    assert index_pq["num_documents"] == 2 and index_ds["num_documents"] == 1
    assert [e["format"] for e in index["inputs"] + index_pq["inputs"] + index_ds["inputs"]] == \
        ["jsonl", "txt", "parquet", "datasets"]
    assert not (tmp_path / "o1" / "progress.json").exists()


def test_shards_split_on_documents_and_reread(tmp_path, tiny_tokenizer_dir):
    docs = [f"Document number {i} says hello to the quick brown fox." for i in range(40)]
    index = run(_cfg(tiny_tokenizer_dir, [_jsonl(tmp_path / "a.jsonl", docs)], tmp_path / "out", shard_tokens=50,
                     batch_docs=7))
    assert len(index["shards"]) > 3
    assert all(s["tokens"] >= 50 for s in index["shards"][:-1])
    corpus = TokenCorpus(tmp_path / "out")
    # Every shard ends with EOS (whole documents) and reads across shard borders are seamless.
    ends = np.cumsum([s["tokens"] for s in index["shards"]])
    assert all(corpus.tokens(int(e) - 1, 1)[0] == corpus.eos_id for e in ends)
    stream = corpus.tokens(0, len(corpus))
    assert np.array_equal(corpus.tokens(int(ends[0]) - 5, 10), stream[int(ends[0]) - 5:int(ends[0]) + 5])
    assert index["num_tokens"] == len(stream) == sum(e["tokens"] for e in index["inputs"])
    # Same command again: finished, returns the same index without rewriting.
    assert run(_cfg(tiny_tokenizer_dir, [tmp_path / "a.jsonl"], tmp_path / "out", shard_tokens=50,
                    batch_docs=7))["shards"] == index["shards"]


def test_resume_after_crash_skips_done_shards(tmp_path, tiny_tokenizer_dir, monkeypatch):
    docs = [f"Document {i}: the quick brown fox jumps over the lazy dog." for i in range(30)]
    src = _jsonl(tmp_path / "a.jsonl", docs)
    straight = run(_cfg(tiny_tokenizer_dir, [src], tmp_path / "straight", shard_tokens=40, batch_docs=4))

    real_close = tokenize_mod._ShardWriter.close
    calls = {"n": 0}

    def crashing_close(self, next_input, next_doc):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real_close(self, next_input, next_doc)

    monkeypatch.setattr(tokenize_mod._ShardWriter, "close", crashing_close)
    with pytest.raises(KeyboardInterrupt):
        run(_cfg(tiny_tokenizer_dir, [src], tmp_path / "crashed", shard_tokens=40, batch_docs=4))
    out = tmp_path / "crashed"
    assert not (out / "index.json").exists()            # partial output never looks complete
    with pytest.raises(InputError, match="unfinished"):
        TokenCorpus(out)
    done_before = sorted(p.name for p in out.glob("shard-*.bin"))
    assert len(done_before) == 2
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.bin")}
    monkeypatch.setattr(tokenize_mod._ShardWriter, "close", real_close)
    resumed = run(_cfg(tiny_tokenizer_dir, [src], out, shard_tokens=40, batch_docs=4))
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.bin") if p.name in mtimes} == mtimes
    assert resumed["shards"] == straight["shards"] and resumed["inputs"][0]["documents"] == 30
    assert resumed["num_tokens"] == straight["num_tokens"]
    # A different run in the same unfinished folder is refused.
    (out / "index.json").unlink()
    (out / "progress.json").write_text(json.dumps({"identity": {"other": 1}}))
    with pytest.raises(ConfigError, match="unfinished"):
        run(_cfg(tiny_tokenizer_dir, [src], out, shard_tokens=40, batch_docs=4))


def test_missing_text_field_names_file_and_line(tmp_path, tiny_tokenizer_dir):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "fine"}\n{"body": "no text here"}\n')
    with pytest.raises(InputError, match=r"bad\.jsonl:2: no 'text' field.*--text-field"):
        run(_cfg(tiny_tokenizer_dir, [src], tmp_path / "out"))
    assert not (tmp_path / "out" / "index.json").exists()


@pytest.mark.parametrize("content,pattern", [
    ('{"text": "ok"}\n{not json\n', r"bad\.jsonl:2: not valid JSON"),
    ('{"text": 5}\n', r"bad\.jsonl:1: field 'text' is int"),
    ('["text"]\n', r"bad\.jsonl:1: no 'text' field"),
])
def test_bad_jsonl_records(tmp_path, tiny_tokenizer_dir, content, pattern):
    src = tmp_path / "bad.jsonl"
    src.write_text(content)
    with pytest.raises(InputError, match=pattern):
        run(_cfg(tiny_tokenizer_dir, [src], tmp_path / "out"))


def test_bad_inputs(tmp_path, tiny_tokenizer_dir):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "c.parquet")
    with pytest.raises(InputError, match=r"c\.parquet: no 'text' column \(columns: \['body'\]\)"):
        run(_cfg(tiny_tokenizer_dir, [tmp_path / "c.parquet"], tmp_path / "o"))
    with pytest.raises(InputError, match="no such file"):
        run(_cfg(tiny_tokenizer_dir, [tmp_path / "missing.jsonl"], tmp_path / "o"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(InputError, match="unknown corpus format"):
        run(_cfg(tiny_tokenizer_dir, [tmp_path / "x.csv"], tmp_path / "o"))
    with pytest.raises(InputError, match="cannot load a tokenizer"):
        run(_cfg(tmp_path / "nope", [tmp_path / "c.parquet"], tmp_path / "o"))
    with pytest.raises(ConfigError):
        TokenizeCorpusConfig(tokenizer="t", inputs=[], out_dir=tmp_path)


def test_damaged_corpus_is_detected(tmp_path, tiny_tokenizer_dir):
    run(_cfg(tiny_tokenizer_dir, [_jsonl(tmp_path / "a.jsonl")], tmp_path / "out"))
    shard = tmp_path / "out" / "shard-00000.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))
    TokenCorpus(tmp_path / "out")                       # size fine, no checksum by default
    with pytest.raises(InputError, match="sha256"):
        TokenCorpus(tmp_path / "out", verify=True)
    shard.write_bytes(bytes(data[:-4]))
    with pytest.raises(InputError, match="wrong size"):
        TokenCorpus(tmp_path / "out")
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    index["dtype"] = "uint16"
    (tmp_path / "out" / "index.json").write_text(json.dumps(index))
    with pytest.raises(SchemaError, match="dtype"):
        TokenCorpus(tmp_path / "out")
