"""The report's setup section describes the stages that ran, not the defaults of those that did not."""

from __future__ import annotations

import json

from osprey_train.study.config import load_study
from osprey_train.study.report import ReportConfig
from osprey_train.study.report import run as report
from osprey_train.study.runner import StudyRunConfig, run
from tests.helpers.tiny_study import write_tiny_study


def _cut(text: str, part: str) -> str:
    assert part in text
    return text.replace(part, "", 1)


def test_a_study_without_stage2_reports_none_instead_of_the_pretrain_defaults(tmp_path, tiny_llama_dir):
    path = write_tiny_study(tmp_path / "spec", tiny_llama_dir)
    text = _cut(path.read_text(), '[corpus]\nfiles = ["data/corpus.jsonl"]\n')
    text = _cut(text, '[[arms]]\nname = "osprey-kd"\narch = "osprey"\nstage2 = "kd"\n')
    text = _cut(text, 'osprey_kd = "osprey-kd"\n').replace('stage2 = "plain"\nseeds = [0, 1]', 'stage2 = "none"')
    text = _cut(text, '[live]\narm = "best"\nprompts = 2\nmax_new_tokens = 6\n')
    path.write_text(text)
    cfg = load_study(path)
    assert cfg.corpus is None and all(a.stage2 == "none" for a in cfg.arms)
    run(StudyRunConfig(study=cfg, out=tmp_path / "out", progress=False))
    readme = (report(ReportConfig(study=cfg, out=tmp_path / "out")).dir / "README.md").read_text()
    setup = readme.split("## Setup", 1)[1].split("\n## ", 1)[0]
    assert "- Stage 2: none (no arm of this study pretrains on generic text)." in setup, setup
    assert " on , lr" not in readme and "tokens) on" not in setup, setup


def test_a_study_of_dflash_against_eagle3_runs_and_reports_without_a_pruned_source(tmp_path, tiny_llama_dir):
    """No arm prunes a source (no [prune] table in the settings): the block drafter's study still runs
    through every stage and the report says what ran."""
    path = write_tiny_study(tmp_path / "spec", tiny_llama_dir)
    text = _cut(path.read_text(), '[corpus]\nfiles = ["data/corpus.jsonl"]\n')
    text = _cut(text, "draft_vocab = 128\n")
    start, end = text.index("[prune]"), text.index("[distill]")
    text = text[:start] + text[end:]
    start, end = text.index("[[arms]]"), text.index("{extra}") if "{extra}" in text else len(text)
    text = text[:start] + '''[[arms]]
name = "eagle3"
arch = "eagle3"
stage2 = "none"
distill = { draft_vocab = 128 }

[[arms]]
name = "dflash"
arch = "dflash"
stage2 = "none"

[[arms]]
name = "dflash-topk"
arch = "dflash"
stage2 = "none"
arch_options = { block_size = 6, objective = "topk" }
'''
    path.write_text(text)
    cfg = load_study(path)
    run(StudyRunConfig(study=cfg, out=tmp_path / "out", progress=False))
    # an arm's arch_options reach its drafter (issue 44); the other DFlash arm keeps the defaults
    options = [json.loads(p.read_text())["arch_options"] for p in (tmp_path / "out").glob("stages/distill-*/run/final/config.json")]
    assert {o.get("objective", "hard") for o in options if o.get("block_size")} == {"hard", "topk"}
    assert {"block_size": 6, "objective": "topk"}.items() <= next(o for o in options if o.get("objective")).items()
    readme = (report(ReportConfig(study=cfg, out=tmp_path / "out")).dir / "README.md").read_text()
    setup = readme.split("## Setup", 1)[1].split("\n## ", 1)[0]
    assert "(no arm prunes a source model)" in setup, setup
    headline = readme.split("## Headline", 1)[1].split("\n## ", 1)[0]
    assert "| `dflash` |" in headline and "| `eagle3` |" in headline, headline
