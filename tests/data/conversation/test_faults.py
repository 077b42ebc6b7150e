"""Crafted input files: deeply nested JSON is a clear error naming file and line, or a counted
skip under ``on_error="skip"`` — never a RecursionError (issue #12, item 14)."""

from __future__ import annotations

import json

import pytest

from osprey_data.conversation import iter_inputs
from osprey_data.errors import InputError
from osprey_data.jsonio import MAX_JSON_DEPTH, loads

DEEP = "[" * 100_000 + "]" * 100_000


def test_deep_jsonl_line_is_named_or_skipped(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n" + DEEP + "\n"
                    + json.dumps({"id": "b", "prompt": "x", "meta": {"k": [[[[[[1]]]]]]}}) + "\n")
    with pytest.raises(InputError, match=r"in.jsonl:2: not valid JSON \(nested deeper than 100 levels"):
        list(iter_inputs([str(path)]))
    errors = []
    samples = list(iter_inputs([str(path)], on_error="skip", error_sink=lambda *e: errors.append(e)))
    assert [s.sample_id for s in samples] == ["a", "b"]
    assert len(errors) == 1 and errors[0][2] == 2 and "nested deeper" in errors[0][3]


def test_deep_json_file_and_just_too_deep(tmp_path):
    path = tmp_path / "in.json"
    path.write_text(DEEP)
    with pytest.raises(InputError, match=r"in.json: not valid JSON \(nested deeper"):
        list(iter_inputs([str(path)]))
    # deep enough for json.loads, too deep for what walks the document afterwards
    nested = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(json.JSONDecodeError, match="nested deeper"):
        loads(nested)
    assert loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
