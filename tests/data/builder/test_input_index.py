"""The builder's inputs: a compact first pass (ids, files, lines) and batches read again later."""

from __future__ import annotations

import json

import pytest

from osprey_data.builder.config import BuildConfig
from osprey_data.builder.input_index import index_inputs, stream_batches
from osprey_data.builder.partition import belongs_to
from osprey_data.conversation import iter_inputs
from osprey_data.errors import InputError


def _config(tmp_path, paths, **kw):
    return BuildConfig(target="unused", inputs=tuple(str(p) for p in paths), out=str(tmp_path / "s"), **kw)


def _write(path, n, start=0, bad=()):
    lines = ["not json" if i in bad else json.dumps({"prompt": f"q {i}", "domain": "math"})
             for i in range(start, start + n)]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("workers", [1, 3])
def test_batches_are_the_slices_of_the_full_list(tmp_path, workers):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, 23, bad={4, 5, 17})
    _write(b, 11, start=100)
    for w in range(workers):
        cfg = _config(tmp_path, [a, b], batch_size=4, limit=30, on_error="skip", worker_index=w,
                      num_workers=workers)
        index = index_inputs(cfg)
        full = [s for s in iter_inputs(cfg.inputs, on_error="skip", error_sink=lambda *e: None)][:30]
        mine = [s for s in full if belongs_to(s.sample_id, w, workers)]
        assert index.ids == [s.sample_id for s in mine]
        assert [index.where(k) for k in range(len(index))] == [(s.file, s.line) for s in mine]
        batches = list(stream_batches(cfg, index))
        assert [[s.sample_id for s in batch] for batch in batches] == \
            [[s.sample_id for s in mine[i:i + 4]] for i in range(0, len(mine), 4)]
        assert batches[0][0].conversation == mine[0].conversation
    # the malformed lines of every worker together: each recorded by the worker owning its file:line
    lines = set()
    for w in range(workers):
        lines |= {line for _, line in index_inputs(_config(tmp_path, [a, b], on_error="skip", worker_index=w,
                                                            num_workers=workers)).errors.lines()}
    assert lines == {5, 6, 18}


def test_inputs_edited_during_the_build_stop_it_naming_the_line(tmp_path):
    a = tmp_path / "a.jsonl"
    _write(a, 6)
    cfg = _config(tmp_path, [a], batch_size=2)
    index = index_inputs(cfg)
    _write(a, 6, start=50)   # other records at the same lines
    with pytest.raises(InputError, match=r"a.jsonl:1: the inputs changed while the build ran"):
        list(stream_batches(cfg, index))
    _write(a, 4)   # records removed at the end
    with pytest.raises(InputError, match=r"a.jsonl:5: the inputs changed while the build ran"):
        list(stream_batches(cfg, index))
