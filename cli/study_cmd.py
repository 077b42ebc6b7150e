"""``osprey study run | status | report``: a declarative, resumable comparison of drafters.

STUDY is a study file, or the name of a preset Osprey ships (``smollm2-quick``, ``preset:NAME``):
the presets come with the wheel, so they run where only the wheel is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

__all__ = ["run", "status", "report"]

_STUDY_ARG = click.argument("study_file", metavar="STUDY")
_OUT = click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
                    help="Study folder (default: study-runs/NAME in the current directory).")


def _load(study_file: str, out: Path | None):
    from osprey_train.study.config import load_study
    from osprey_train.study.presets import resolve_study_file

    path, preset = resolve_study_file(study_file)
    cfg = load_study(path, preset=preset)
    return cfg, out or Path("study-runs") / cfg.study.name


def _presets_epilog() -> str:
    """The shipped presets, for ``study run --help`` (read from the installed files, so it never drifts)."""
    from osprey_train.study.presets import list_presets

    lines = [f"  {p.name:<20} {p.description}" for p in list_presets()]
    return "\b\nShipped presets (STUDY may be one of these names, or preset:NAME):\n" + "\n".join(lines)


@click.command("run", epilog=_presets_epilog())
@_STUDY_ARG
@_OUT
@click.option("--cache", default=None, help="Model cache for a PyPI target (default: $OSPREY_CACHE or ~/.cache/osprey).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Stage lines and progress bars.")
def run(study_file: str, out: Path | None, cache: str | None, progress: bool) -> None:
    """Run every stage of STUDY not finished yet (rerun the same command to continue).

    STUDY is a study file or a shipped preset's name (listed below). A file a preset reads that
    Osprey does not ship fails at once, naming the file and where to get it.

    \b
    Example:
      osprey study run smollm2-quick --out study-runs/smollm2-quick
      osprey study run studies/smollm2-cpu.toml --out study-runs/smollm2-cpu
    """
    from osprey_train.study.runner import StudyRunConfig
    from osprey_train.study.runner import run as run_study

    from osprey_data.progress import progress_bars
    from osprey_train.study.results import study_headline

    cfg, out = _load(study_file, out)
    with progress_bars(progress):   # --no-progress: transformers' loading and saving bars too
        result = run_study(StudyRunConfig(study=cfg, out=out, cache=cache, progress=progress))
    for line in study_headline(cfg, out):   # the figure the study is for, as the demo ends with its own
        click.echo(line)
    click.echo(f"{len(result.ran)} stages run, {result.reused} reused; next: osprey study report {study_file} "
               f"--out {out}")


@click.command("status")
@_STUDY_ARG
@_OUT
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--verify", is_flag=True,
              help="Hash every finished stage's outputs against the sha256 its stage.json recorded; exit 1 "
                   "when one is damaged.")
def status(study_file: str, out: Path | None, as_json: bool, verify: bool) -> None:
    """How far the study is: stages finished per kind, the one in progress, time to go.

    \b
    Example:
      osprey study status studies/smollm2-cpu.toml --out study-runs/smollm2-cpu
    """
    from osprey_train.study.status import status as study_status

    cfg, out = _load(study_file, out)
    st = study_status(cfg, out, verify=verify)
    click.echo(json.dumps(st.to_dict(), indent=2) if as_json else st.to_text())
    if st.corrupt:
        raise SystemExit(1)


@click.command("report")
@_STUDY_ARG
@_OUT
@click.option("--dir", "report_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Report folder (default: the study's [report] dir, else OUT/report).")
def report(study_file: str, out: Path | None, report_dir: Path | None) -> None:
    """Write results.json, matrix.md, heatmaps, curves and README.md from the study folder.

    \b
    Example:
      osprey study report studies/smollm2-cpu.toml --out study-runs/smollm2-cpu
    """
    from osprey_train.study.report import ReportConfig
    from osprey_train.study.report import run as run_report

    cfg, out = _load(study_file, out)
    result = run_report(ReportConfig(study=cfg, out=out, report_dir=report_dir))
    p = result.results["progress"]
    click.echo(f"report of {p['done']}/{p['stages']} stages in {result.dir} ({len(result.files)} files)")
