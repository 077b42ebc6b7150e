"""Prompt selection: a seeded subset that keeps its earlier choice when it grows; the demo's split."""

from __future__ import annotations

from osprey_train.study.prompts import sample_prompts, split_prompts


def test_sample_is_seeded_in_file_order_and_grows_by_adding():
    records = [{"id": f"p{i}", "domain": "math"} for i in range(50)]
    ten = sample_prompts(records, 10, seed=0)
    twenty = sample_prompts(records, 20, seed=0)
    assert len(ten) == 10 and len(twenty) == 20
    assert {r["id"] for r in ten} <= {r["id"] for r in twenty}                  # growing keeps the choice
    assert [r["id"] for r in ten] == sorted((r["id"] for r in ten), key=lambda x: int(x[1:]))  # file order
    assert sample_prompts(records, 10, seed=1) != ten                            # the seed matters
    assert sample_prompts(records, 10, seed=0) == ten                            # ... and only the seed
    assert sample_prompts(records, 80, seed=0) == records                        # all when fewer


def test_split_holds_out_the_last_prompts_of_each_domain(tmp_path):
    import json

    path = tmp_path / "p.jsonl"
    rows = [{"id": f"{d}{i}", "domain": d} for d in ("a", "b") for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, held = split_prompts(path, 4, 4)
    assert [r["id"] for r in held] == ["a4", "b4", "a3", "b3"]
    assert [r["id"] for r in train] == ["a0", "b0", "a1", "b1"]
    _, held_again = split_prompts(path, 6, 4)              # the held-out set does not depend on train_n
    assert held_again == held
