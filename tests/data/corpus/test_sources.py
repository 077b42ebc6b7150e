"""Document readers: .txt splitting modes and format detection."""

from __future__ import annotations

import pytest

from osprey_data.corpus.sources import detect_format, iter_documents
from osprey_data.errors import InputError

TEXT = "first line\nsecond line\n\n\nthird para\n"


@pytest.mark.parametrize("mode,expected", [
    ("file", [(1, TEXT)]),
    ("paragraph", [(1, "first line\nsecond line"), (5, "third para")]),
    ("line", [(1, "first line"), (2, "second line"), (3, ""), (4, ""), (5, "third para")]),
])
def test_txt_modes(tmp_path, mode, expected):
    (tmp_path / "a.txt").write_text(TEXT)
    assert list(iter_documents(tmp_path / "a.txt", "txt", "text", mode)) == expected


def test_detect_format(tmp_path):
    for name, fmt in (("a.jsonl", "jsonl"), ("a.ndjson", "jsonl"), ("a.txt", "txt"), ("a.parquet", "parquet")):
        (tmp_path / name).write_text("")
        assert detect_format(tmp_path / name) == fmt
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="not a `datasets`"):
        detect_format(tmp_path / "plain")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InputError, match="not UTF-8"):
        list(iter_documents(tmp_path / "bad.txt", "txt", "text", "file"))
