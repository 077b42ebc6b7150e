"""Issue #45 items 7-8: a symlinked OUT/locks (or lock file) is refused, never followed; a target or
domain name that would collide with the report's own files is refused when the study file is read."""

from __future__ import annotations

import pytest

from osprey_data.errors import ConfigError
from osprey_train.study.runner_locks import claim_stage, join_study, live_runners


def test_a_symlinked_locks_folder_is_refused_and_nothing_is_created_where_it_points(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "locks").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=rf"{out / 'locks'}: must be a plain folder of the study, not a symlink"):
        with join_study(out, "x"):
            pass
    with pytest.raises(ConfigError, match="not a symlink"):
        claim_stage(out, "distill-abc")
    assert list(elsewhere.iterdir()) == [] and live_runners(out) == []


def test_a_symlinked_lock_file_is_refused(tmp_path):
    out, target = tmp_path / "out", tmp_path / "victim"
    (out / "locks").mkdir(parents=True)
    target.write_text("keep")
    (out / "locks" / "distill-abc").symlink_to(target)
    with pytest.raises(ConfigError, match=r"distill-abc: a study lock must be a plain file, not a symlink"):
        claim_stage(out, "distill-abc")
    (out / ".lock").symlink_to(target)
    with pytest.raises(ConfigError, match=r"\.lock: a study lock must be a plain file"):
        with join_study(out, "x"):
            pass
    assert target.read_text() == "keep"


def test_plain_locks_still_work(tmp_path):
    out = tmp_path / "out"
    with join_study(out, "x") as name:
        assert name.startswith("runner-") and len(live_runners(out)) == 1
        claim = claim_stage(out, "distill-abc")
        assert claim is not None and claim_stage(out, "distill-abc") is None
        claim.release()
    assert live_runners(out) == []


@pytest.mark.parametrize("name", ["README.md", "readme.md", "results.json"])
def test_a_target_named_as_a_file_of_the_report_summary_is_refused_when_the_study_is_read(tmp_path, tiny_llama_dir,
                                                                                           name):
    # issue 45: the whole study ran (25/25 stages), then every `study report` failed on
    # ".../report/README.md: Is a directory"
    from osprey_train.study.config import load_study
    from tests.train.study.test_targets import _two_target_study

    path = _two_target_study(tmp_path / "s", tiny_llama_dir, tiny_llama_dir)
    path.write_text(path.read_text().replace('name = "qwen"', f'name = "{name}"'))
    with pytest.raises(ConfigError, match=rf"\[\[targets\]\] name '{name}' is the name of a file of the study "
                                          r"report's summary \(README.md, results.json\).*rename the target"):
        load_study(path)
