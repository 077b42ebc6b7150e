"""Issue #45 item 9: a user's own file at a name the demo publishes (OUT/drafter, OUT/stores/train)
is refused before the first stage, not after all of them."""

from __future__ import annotations

import os

import pytest

from osprey_data.errors import ConfigError
from osprey_train.demo.outputs import STABLE_NAMES, publish_outputs
from osprey_train.study.published import check_publishable


@pytest.mark.parametrize("rel,kind", [("drafter", "dir"), ("stores/train", "file"), ("stores", "file"),
                                      ("prompts/eval.jsonl", "file")])
def test_a_users_file_at_a_published_name_is_refused_up_front(tmp_path, rel, kind):
    out = tmp_path / "out"
    path = out / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir() if kind == "dir" else path.write_text("mine")
    with pytest.raises(ConfigError, match=rf"demo: {path} (exists and is not the demo's link|is not a plain folder)"):
        check_publishable(out, STABLE_NAMES)
    assert path.exists()   # untouched


def test_a_symlinked_parent_folder_is_refused(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "stores").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"stores is not a plain folder"):
        check_publishable(out, STABLE_NAMES)


def test_a_fresh_folder_and_the_demos_own_links_pass(tmp_path):
    out = tmp_path / "out"
    check_publishable(out, STABLE_NAMES)     # nothing there yet
    targets = {}
    for role, rel in STABLE_NAMES.items():
        target = out / "work" / role
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x") if rel.endswith(".jsonl") else target.mkdir()
        targets[role] = target
    publish_outputs(out, targets)
    check_publishable(out, STABLE_NAMES)     # a rerun: its own links are replaced, not refused
    assert os.path.islink(out / "drafter")
