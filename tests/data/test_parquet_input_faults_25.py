"""Fault-round item 19 of issue #25: a Parquet input with a damaged page (corrupt snappy data)
failed inside pyarrow with "Corrupt snappy compressed data." naming no file; prompt files and
corpus files now fail with one InputError naming the file."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from osprey_data.conversation.inputs import read_records
from osprey_data.corpus.sources import iter_documents
from osprey_data.errors import InputError


def _damaged_parquet(path):
    text = [f"some text number {i} " * 10 for i in range(200)]
    table = pa.table({"id": [f"r{i}" for i in range(200)], "text": text,
                      "conversations": [[{"role": "user", "content": t}] for t in text]})
    pq.write_table(table, path, compression="snappy")
    raw = bytearray(path.read_bytes())
    for offset in range(200, 1200, 7):   # inside the first data pages; the footer stays readable
        raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))
    pq.ParquetFile(path)   # opens: only reading the pages fails
    return path


def test_a_damaged_parquet_prompt_file_names_the_file(tmp_path):
    path = _damaged_parquet(tmp_path / "prompts.parquet")
    with pytest.raises(InputError, match=rf"{path}: damaged Parquet data after row 0 \(OSError: .*"):
        read_records(path)


def test_a_damaged_parquet_corpus_file_names_the_file(tmp_path):
    path = _damaged_parquet(tmp_path / "corpus.parquet")
    with pytest.raises(InputError, match=rf"{path}: damaged Parquet data after row 0"):
        list(iter_documents(path, "parquet", "text", "file"))
