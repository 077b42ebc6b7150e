"""Fault-round findings of issue #25 against ``osprey data build`` (item 11): one bad record in a
ShareGPT dump must not stop a ``--on-error skip`` build, nor every rerun of it.
"""

from __future__ import annotations

import json

import pytest

from osprey_data.builder.runner import run
from osprey_data.errors import InputError
from osprey_data.store import StoreReader
from tests.data.builder.test_runner import config as _config
from tests.data.builder.test_runner import journal_errors

GOOD = {"id": "good", "conversations": [{"role": "user", "content": "Hello there"}]}
BAD = {
    "assistant-first": {"id": "bad", "conversations": [
        {"role": "assistant", "content": "Hi, how can I help?"}, {"role": "user", "content": "Tell me a joke"}]},
    "lone-surrogate": {"id": "bad", "conversations": [{"role": "user", "content": "broken \ud800 text"}]},
}


def _inputs(tmp_path, bad: dict, *, reference: str | None):
    path = tmp_path / "sharegpt.jsonl"
    records = [GOOD, bad, dict(GOOD, id="good2")]
    if reference is not None:
        records = [dict(r, reference=reference) for r in records]
    # json.dumps escapes the lone surrogate as \\ud800, which json.loads turns back into one
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# teacher-forced (--no-regenerate), an assistant-first conversation needs no prompt: it is data
@pytest.mark.parametrize("case, regenerate", [("assistant-first", True), ("lone-surrogate", True),
                                              ("lone-surrogate", False)])
def test_bad_record_is_skipped_and_named_in_the_journal(tiny_llama_dir, tmp_path, case, regenerate):
    inputs = _inputs(tmp_path, BAD[case], reference=None if regenerate else "A reference answer.")
    for attempt in range(2):  # the rerun meets the same record: still skipped, not a crash
        summary = run(_config(tiny_llama_dir, [inputs], tmp_path / "store", on_error="skip",
                              regenerate=regenerate))
        assert summary.samples_written == (2 if attempt == 0 else 0)
        assert summary.skipped.get("input_error", 0) + summary.already_skipped == 1, summary
    assert sorted(StoreReader(str(tmp_path / "store")).table(["sample_id"]).column(0).to_pylist()) == ["good", "good2"]
    (err,) = journal_errors(tmp_path / "store")
    assert err["sample_id"] == "bad" and err["line"] == 2 and err["file"].endswith("sharegpt.jsonl")
    with pytest.raises(InputError, match=r"sharegpt.jsonl:2\b"):
        run(_config(tiny_llama_dir, [inputs], tmp_path / "raise", regenerate=regenerate))
