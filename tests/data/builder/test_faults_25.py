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


def test_a_second_builder_of_a_fresh_store_is_refused_before_loading_the_target(tiny_llama_dir, tmp_path,
                                                                                  monkeypatch):
    """Item 19: the first builder of a new store holds its worker lock but has published no
    manifest yet; a second one with the same worker index must not load the target first."""
    from osprey_data.builder import runner as runner_mod
    from osprey_data.store.fs import StoreFS
    from osprey_data.store.worker_lock import WorkerBusyError, WorkerLock

    inputs = _inputs(tmp_path, dict(GOOD, id="other"), reference=None)
    store = tmp_path / "store"
    store.mkdir()
    (store / "shards").mkdir()   # what the first builder's writer has made so far: no manifest yet
    first = WorkerLock(StoreFS(str(store), read_only=False), "w000of001")
    first.acquire()
    loads = []
    monkeypatch.setitem(runner_mod.BACKENDS, "hf", lambda config: loads.append(config) or pytest.fail("loaded"))
    try:
        with pytest.raises(WorkerBusyError, match=r"worker w000of001 is already writing this store .*pid"):
            run(_config(tiny_llama_dir, [inputs], store))
    finally:
        first.release()
    assert loads == []


@pytest.mark.parametrize("regenerate", [True, False])
def test_a_template_error_names_the_file_line_and_sample(tiny_llama_dir, tmp_path, regenerate):
    """Item 19: a chat template that cannot be masked (not prefix-stable) stops the build with the
    input file, line and sample where it showed, under regeneration too."""
    import shutil

    from osprey_data.errors import ModelError

    target = shutil.copytree(tiny_llama_dir, tmp_path / "target")
    (target / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] + ':' + m['content'] + '|' }}{% endfor %}"
        "{% if add_generation_prompt %}GEN{% else %}DONE{% endif %}")
    conv = {"id": "multi", "conversations": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Tell me more"}, {"role": "assistant", "content": "Sure"}]}
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(GOOD | {"conversations": GOOD["conversations"] + [
        {"role": "assistant", "content": "Hi"}]}) + "\n" + json.dumps(conv) + "\n")
    with pytest.raises(ModelError, match=r"chats.jsonl:\d \(sample '(good|multi)'\): .*prefix-stable"):
        run(_config(target, [path], tmp_path / "store", regenerate=regenerate))
