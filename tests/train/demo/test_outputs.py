"""The demo's stable output names: relative links, replaced atomically, a user's own folder kept."""

from __future__ import annotations

import os

import pytest

from osprey_data.errors import ConfigError
from osprey_train.demo.outputs import STABLE_NAMES, publish_outputs


def _stage(out, name):
    folder = out / "work" / "stages" / name / "run" / "final"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(name)
    return folder


def test_links_are_relative_and_follow_the_out_folder(tmp_path):
    out = tmp_path / "demo"
    targets = {"drafter": _stage(out, "distill-aaa"), "train_store": _stage(out, "store-bbb"),
               "eval_store": _stage(out, "store-ccc")}
    for split in ("train", "eval"):   # the prompt files are files, linked as files
        prompts = out / "work" / "stages" / f"prompts-{split}" / "prompts.jsonl"
        prompts.parent.mkdir(parents=True)
        prompts.write_text(f'{{"prompt": "{split}"}}\n')
        targets[f"{split}_prompts"] = prompts
    links = publish_outputs(out, targets)
    assert {r: p.relative_to(out).as_posix() for r, p in links.items()} == STABLE_NAMES
    for role, link in links.items():
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve() == targets[role].resolve()
    assert not [p for p in out.rglob(".*tmp*")]
    moved = tmp_path / "moved"
    out.rename(moved)   # a relative link survives moving the whole output folder
    assert (moved / "drafter" / "config.json").read_text() == "distill-aaa"
    assert (moved / "stores" / "eval" / "config.json").read_text() == "store-ccc"
    assert (moved / "prompts" / "eval.jsonl").read_text() == '{"prompt": "eval"}\n'


def test_rerun_replaces_each_link_and_never_a_users_folder(tmp_path):
    out = tmp_path / "demo"
    publish_outputs(out, {"drafter": _stage(out, "distill-aaa")})
    publish_outputs(out, {"drafter": _stage(out, "distill-bbb")})   # other settings: the link moves
    assert (out / "drafter" / "config.json").read_text() == "distill-bbb"
    assert (out / "work" / "stages" / "distill-aaa").is_dir()   # the old stage itself is untouched
    (out / "stores").mkdir()
    (out / "stores" / "eval").mkdir()
    (out / "stores" / "eval" / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match=r"stores/eval exists and is not the demo's link"):
        publish_outputs(out, {"drafter": _stage(out, "distill-ccc"), "eval_store": _stage(out, "store-ccc")})
    assert (out / "stores" / "eval" / "mine.txt").read_text() == "keep"
    # checked before any link is replaced: the drafter link still names the previous run
    assert (out / "drafter" / "config.json").read_text() == "distill-bbb"
