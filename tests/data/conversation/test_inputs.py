"""Input readers: every accepted shape, stable ids, malformed lines named by file and line."""

from __future__ import annotations

import json

import pytest

from osprey_data.conversation.inputs import iter_inputs, read_records, stable_id
from osprey_data.errors import InputError
from tests.data.conftest import write_jsonl

CONV = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_all_record_shapes_normalize(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [
        {"id": "x", "domain": "chat", "source": "s", "conversations": CONV, "reference": "r"},
        {"messages": CONV},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"prompt": "hi", "system": "be nice"},
        {"text": "pre-formatted"},
        {"id": 7, "messages": [{"role": "user", "content": "q"}]},
    ])
    got = list(iter_inputs([str(path)]))
    assert [s.sample_id for s in got][0] == "x" and got[0].reference == "r"
    assert (got[0].domain, got[0].source) == ("chat", "s")
    assert got[1].conversation == CONV and got[2].conversation == CONV  # ShareGPT mapped
    assert got[1].domain == "default" and got[1].source == "a"  # defaults: domain, file stem
    assert got[3].conversation == [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]
    assert got[4].is_text and got[4].text == "pre-formatted" and got[4].conversation == []
    assert got[5].sample_id == "7"
    assert [s.line for s in got] == [1, 2, 3, 4, 5, 6]
    # ids derived from content: the ShareGPT form repeats the same content, so it gets "~2"
    assert got[1].sample_id == stable_id({"conversation": CONV, "text": None, "reference": None})
    assert got[2].sample_id == got[1].sample_id + "~2"


def test_derived_ids_are_stable_and_content_dependent(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"messages": CONV}, {"prompt": "other"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"messages": CONV}])
    ids_a = [s.sample_id for s in iter_inputs([str(a)])]
    ids_b = [s.sample_id for s in iter_inputs([str(b)])]
    assert ids_a[0] == ids_b[0] and ids_a[0] != ids_a[1] and len(ids_a[0]) == 16


def test_json_parquet_and_datasets_folder(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = [{"id": f"r{i}", "prompt": f"question {i}"} for i in range(3)]
    (tmp_path / "a.json").write_text(json.dumps(recs))
    (tmp_path / "w.json").write_text(json.dumps({"data": recs}))
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "a.parquet")
    datasets.Dataset.from_list(recs).save_to_disk(str(tmp_path / "ds"))
    for name in ("a.json", "w.json", "a.parquet", "ds"):
        got = list(iter_inputs([str(tmp_path / name)]))
        assert [s.sample_id for s in got] == ["r0", "r1", "r2"], name
        assert got[2].conversation == [{"role": "user", "content": "question 2"}]
        assert read_records(tmp_path / name) == recs, name        # raw, unnormalized, in order


def test_read_records_errors_name_file_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": 1}\n\n[1, 2]\n')
    with pytest.raises(InputError, match=r"a.jsonl:3: expected a JSON object"):
        read_records(tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text('{"id": 1}\n{oops\n')
    with pytest.raises(InputError, match=r"b.jsonl:2: not valid JSON"):
        read_records(tmp_path / "b.jsonl")
    (tmp_path / "c.jsonl").write_text("\n")
    with pytest.raises(InputError, match=r"c.jsonl: no records"):
        read_records(tmp_path / "c.jsonl")


@pytest.mark.parametrize("bad, needle", [
    ("{not json", "not valid JSON"),
    (json.dumps({"foo": 1}), "none of 'conversations'"),
    (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}), "unknown role"),
    (json.dumps({"messages": [{"role": "user", "content": 3}]}), "content must be a string"),
    (json.dumps({"messages": [{"role": "assistant", "content": "x"}]}), "no user turn"),
    (json.dumps({"id": "p0", "prompt": "dup"}), "duplicate sample id"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad, needle):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "p0", "prompt": "ok"}) + "\n\n" + bad + "\n")
    with pytest.raises(InputError) as err:
        list(iter_inputs([str(path)]))
    assert f"{path}:3" in str(err.value) and needle in str(err.value)


def test_skip_hands_every_bad_record_to_the_sink(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([json.dumps({"prompt": "a"}), "{oops", json.dumps({"id": "z", "x": 1}),
                               json.dumps({"prompt": "b"})]) + "\n")
    seen = []
    got = list(iter_inputs([str(path)], on_error="skip", error_sink=lambda *a: seen.append(a)))
    assert len(got) == 2
    assert [(f, line) for _, f, line, _ in seen] == [(str(path), 2), (str(path), 3)]
    assert seen[1][0] == "z" and "none of" in seen[1][3]
    with pytest.raises(ValueError):
        list(iter_inputs([str(path)], on_error="skip"))  # skipping needs somewhere to record


def test_missing_and_unsupported_inputs(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        list(iter_inputs([str(tmp_path / "nope.jsonl")]))
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(InputError, match="unsupported input type"):
        list(iter_inputs([str(tmp_path / "a.csv")]))
