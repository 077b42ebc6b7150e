"""Skipped records in a worker journal: runs of lines per file and code, a bounded message sample.

10^6 skipped records used to be 10^6 journal entries (332 MB re-read by every merge); these tests
pin the compact form, its round trip, the reading of older journals and the damage checks."""

from __future__ import annotations

import json

import pytest

from osprey_data.errors import StoreCorruptError
from osprey_data.store import StoreReader, StoreWriter
from osprey_data.store.merge import merge_store
from osprey_data.store.skip_log import MESSAGES_PER_CODE, SkipLog
from tests.data.store.helpers import make_header, make_record


def test_runs_join_and_duplicates_are_refused():
    log = SkipLog()
    for line in (1, 2, 3, 5, 9, 8):
        assert log.add(sample_id=None, file="a.jsonl", line=line, reason="input_error: bad")
    assert log.add(sample_id=None, file="a.jsonl", line=4, reason="too_long: 9 tokens")   # another code: a run of its own
    assert not log.add(sample_id="x", file="a.jsonl", line=2, reason="input_error: again")   # a resumed run's repeat
    assert log.add(sample_id=None, file="b.jsonl", line=2, reason="input_error: bad")
    doc = log.to_doc()
    runs = {(s["file"], s["code"]): s["runs"] for s in doc["skipped"]}
    assert runs == {("a.jsonl", "input_error"): [[1, 3], [5, 5], [8, 9]], ("a.jsonl", "too_long"): [[4, 4]],
                    ("b.jsonl", "input_error"): [[2, 2]]}
    assert doc["num_errors"] == len(log) == 8
    assert log.holds("a.jsonl", 4) and log.holds("a.jsonl", 9) and not log.holds("a.jsonl", 6)
    assert not log.holds("c.jsonl", 1) and not log.holds(None, None)
    gap = SkipLog()
    for line in (1, 3, 2):   # filling the gap joins both neighbours into one run
        gap.add(sample_id=None, file="f", line=line, reason="input_error")
    assert gap.to_doc()["skipped"][0]["runs"] == [[1, 3]]
    assert sorted(gap.lines()) == [("f", 1), ("f", 2), ("f", 3)]


def test_messages_are_bounded_per_code_and_the_doc_round_trips():
    log = SkipLog()
    for line in range(1, 1001):
        log.add(sample_id=f"s{line}", file="big.jsonl", line=2 * line, reason=f"input_error: record {line}")
    log.add(sample_id="t", file="big.jsonl", line=1, reason="too_long: 99 tokens")
    log.add(sample_id="u", file=None, line=None, reason="non_finite: NaN")   # no line: kept whole
    doc = log.to_doc()
    codes = [e["reason"].split(":")[0] for e in doc["errors"]]
    assert codes.count("input_error") == MESSAGES_PER_CODE and codes.count("too_long") == 1
    assert {"sample_id": "u", "file": None, "line": None, "reason": "non_finite: NaN"} in doc["errors"]
    assert doc["num_errors"] == 1002
    back = SkipLog.from_doc(json.loads(json.dumps(doc)), where="j")
    assert back.to_doc() == doc and back.holds("big.jsonl", 2000) and not back.holds("big.jsonl", 3)
    assert not back.add(sample_id="u", file=None, line=None, reason="non_finite: NaN")


def test_an_older_journal_lists_every_entry_and_is_read_into_runs():
    legacy = {"errors": [{"sample_id": None, "file": "a", "line": n, "reason": "input_error: x"} for n in (4, 5, 6)]}
    log = SkipLog.from_doc(legacy, where="old")
    assert log.to_doc()["skipped"] == [{"file": "a", "code": "input_error", "runs": [[4, 6]]}] and len(log) == 3


@pytest.mark.parametrize("damage", [
    lambda d: d["skipped"][0].update(runs=[[5, 3]]),            # reversed run
    lambda d: d["skipped"][0].update(runs=[[1, 3], [3, 4]]),    # overlapping runs
    lambda d: d["skipped"][0].update(runs=[["1", 2]]),          # not integers
    lambda d: d.update(num_errors=99),                          # count disagrees with the runs
])
def test_damaged_runs_are_refused_naming_the_journal(damage):
    log = SkipLog()
    for line in (1, 2, 3):
        log.add(sample_id=None, file="a", line=line, reason="input_error")
    doc = log.to_doc()
    damage(doc)
    with pytest.raises(StoreCorruptError, match="workers/w000of001.json"):
        SkipLog.from_doc(doc, where="store/workers/w000of001.json")


def test_twenty_thousand_skipped_records_make_a_small_journal_and_merge_counts_them(tmp_path):
    url = str(tmp_path / "s")
    writer = StoreWriter(url, make_header(), shard_max_tokens=60)
    for line in range(1, 20_001):
        writer.record_error(sample_id=f"id{line}", file="/data/bad.jsonl", line=line,
                            reason=f"input_error: /data/bad.jsonl:{line}: not valid JSON")
    writer.add(make_record(0))
    writer.close()
    journal = tmp_path / "s" / "workers" / "w000of001.json"
    assert journal.stat().st_size < 20_000   # was ~150 bytes per skipped record: ~3 MB
    doc = json.loads(journal.read_text())
    assert doc["num_errors"] == 20_000 and doc["skipped"][0]["runs"] == [[1, 20_000]]
    assert merge_store(url).num_errors == 20_000 == StoreReader(url).manifest.num_errors
    # a resumed writer reads the runs back: the same lines are not recorded twice
    again = StoreWriter(url, make_header(), shard_max_tokens=60)
    assert again.is_skipped("/data/bad.jsonl", 10_000) and not again.is_skipped("/data/bad.jsonl", 20_001)
    assert not again.record_error(sample_id=None, file="/data/bad.jsonl", line=7, reason="input_error")
    assert again.num_errors() == 20_000
    again.close()


def test_merge_still_reads_an_older_journal(tmp_path):
    url = str(tmp_path / "s")
    writer = StoreWriter(url, make_header(), shard_max_tokens=60)
    writer.add(make_record(0))
    writer.close()
    path = tmp_path / "s" / "workers" / "w000of001.json"
    doc = json.loads(path.read_text())
    for key in ("skipped", "num_errors"):
        doc.pop(key)
    doc["errors"] = [{"sample_id": None, "file": "a", "line": n, "reason": "input_error: x"} for n in range(1, 8)]
    path.write_text(json.dumps(doc, indent=1))
    assert merge_store(url).num_errors == 7
    again = StoreWriter(url, make_header(), shard_max_tokens=60)   # resumes it into runs
    assert again.is_skipped("a", 7) and again.num_errors() == 7
    again.close()
    assert json.loads(path.read_text())["skipped"] == [{"file": "a", "code": "input_error", "runs": [[1, 7]]}]
