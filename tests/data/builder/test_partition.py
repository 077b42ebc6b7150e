"""Worker partition by sample id: deterministic, complete, balanced; dialogue planning rules."""

from __future__ import annotations

from collections import Counter

import pytest

from osprey_data.builder.dialogue import combine_finish_reasons, plan_dialogue
from osprey_data.builder.partition import belongs_to, worker_of
from osprey_data.conversation.inputs import InputSample
from osprey_data.errors import InputError


def test_partition_is_a_stable_balanced_cover():
    ids = [f"sample-{i}" for i in range(3000)]
    counts = Counter(worker_of(i, 3) for i in ids)
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 900
    # sha256-based: the same on every machine and Python process (no salted hash())
    assert worker_of("sample-0", 3) == int.from_bytes(
        __import__("hashlib").sha256(b"sample-0").digest()[:8], "little") % 3
    assert all(sum(belongs_to(i, w, 4) for w in range(4)) == 1 for i in ids[:200])
    assert worker_of("anything", 1) == 0
    with pytest.raises(ValueError):
        worker_of("x", 0)


def _sample(conv, reference=None):
    return InputSample(sample_id="s", domain="d", source="x", conversation=conv, reference=reference,
                       file="f.jsonl", line=3)


CONV = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]


def test_plan_dialogue_rules():
    d = plan_dialogue(_sample(CONV), regenerate=True, last_turn_only=False)
    assert d.pending == [1, 3] and d.messages[1]["content"] is None and d.messages[3]["content"] is None
    d = plan_dialogue(_sample(CONV), regenerate=True, last_turn_only=True)
    assert d.pending == [3] and d.messages[1]["content"] == "b"
    d = plan_dialogue(_sample(CONV[:2]), regenerate=True, last_turn_only=True)
    assert d.pending == [1] and len(d.messages) == 2  # a final assistant turn is itself regenerated
    d = plan_dialogue(_sample(CONV, reference="r"), regenerate=False, last_turn_only=False)
    assert d.pending == [] and d.messages[-1] == {"role": "assistant", "content": "r"}
    assert combine_finish_reasons(d) == "teacher_forced"
    with pytest.raises(InputError, match=r"ends with a user turn and has no 'reference'"):
        plan_dialogue(_sample(CONV), regenerate=False, last_turn_only=False)
    assert CONV[1]["content"] == "b"  # the input is never mutated
    d.finish_reasons = ["stop", "length"]
    assert combine_finish_reasons(d) == "length"
    d.truncated = True
    assert combine_finish_reasons(d) == "truncated"
