"""Fault-round item 16 of issue #25: a study named ``..`` (or any name with a path separator or a
control character) is refused when the file is loaded, and ``study run --out`` on an unrelated
non-empty folder is refused before anything is written there."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli
from osprey_data.errors import ConfigError
from osprey_train.study.config import load_study
from osprey_train.study.runner import StudyRunConfig, run
from tests.helpers.tiny_study import write_tiny_study


@pytest.mark.parametrize("name", ["..", ".", "a/b", "..\\\\up", "x\\u001b[31mred", "line\\nNOTE: forged", "\\u202egnp"])
@pytest.mark.parametrize("where", ["study", "arm", "domain"])
def test_names_that_are_not_plain_labels_are_refused(tmp_path, name, where):
    spec = write_tiny_study(tmp_path / "spec", tmp_path / "model")
    text = spec.read_text()
    old = {"study": 'name = "tiny"', "arm": 'name = "eagle3"', "domain": 'name = "math"'}[where]
    assert old in text
    spec.write_text(text.replace(old, f'name = "{name}"', 1))
    with pytest.raises(ConfigError, match=r"name must be a plain label"):
        load_study(spec)


def test_a_study_named_dotdot_never_writes_into_the_current_folder(tmp_path, monkeypatch):
    spec = write_tiny_study(tmp_path / "spec", tmp_path / "model", name="..")
    monkeypatch.chdir(tmp_path / "spec")
    before = sorted(p.name for p in (tmp_path / "spec").iterdir())
    res = CliRunner().invoke(cli, ["study", "run", str(spec), "--no-progress"])
    assert res.exit_code == 2 and "name must be a plain label" in res.output, res.output
    assert sorted(p.name for p in (tmp_path / "spec").iterdir()) == before
    assert spec.read_text().count('name = ".."') == 1   # the user's study file is untouched


def test_out_on_an_unrelated_non_empty_folder_is_refused(tmp_path):
    spec = write_tiny_study(tmp_path / "spec", tmp_path / "model")
    cfg = load_study(spec)
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    (home / "study.toml.bak").write_text("mine")
    with pytest.raises(ConfigError, match=rf"--out {home} is a non-empty folder that is not a study folder "
                                          r"\(it holds notes.txt, study.toml.bak\)"):
        run(StudyRunConfig(study=cfg, out=home, progress=False))
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "study.toml.bak"]   # nothing written
    res = CliRunner().invoke(cli, ["study", "run", str(spec), "--out", str(home), "--no-progress"])
    assert res.exit_code == 2 and "not a study folder" in res.output


def test_empty_and_earlier_study_folders_are_accepted(tmp_path):
    spec = write_tiny_study(tmp_path / "spec", tmp_path / "model")
    cfg = load_study(spec)
    (tmp_path / "empty").mkdir()
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "run.log").write_text("")   # what a runner stopped at once leaves behind
    for out in (tmp_path / "empty", tmp_path / "earlier"):
        # one stage only: the model stage (it names a path) runs first and is quick
        res = run(StudyRunConfig(study=cfg, out=out, progress=False, max_stages=1))
        assert len(res.ran) == 1 and (out / "study.toml").is_file()


def test_report_table_cells_cannot_add_columns_or_lines():
    """Item 17: names in the report's markdown tables (arms, domains, a store's domains) are escaped."""
    from osprey_train.study.report import _table

    lines = _table(["arm", "mean"], [["a|b\n| forged | row |\x1b[31m", "1.0"]])
    assert len(lines) == 3 and "\x1b" not in lines[2]
    assert lines[2].count("|") - lines[2].count("\\|") == 3   # two cells: three unescaped bars
