"""``osprey study run``: run every stage of a study that is not done yet, resumably.

Layout of a study folder ``OUT``::

    OUT/study.toml            the study file of the latest run (``status`` and ``report`` read it)
    OUT/stages/KIND-KEY/      finished stages: the output + ``stage.json`` (settings, inputs, timings,
                              threads, code version, summary, sha256 of the output files); renamed
                              into place when complete
    OUT/work/KIND-KEY/        a stage being run or interrupted; resumable kinds continue from it
    OUT/run.log               one line per stage started / finished
    OUT/locks/                each live runner's lock and the lock of every stage being run: several
                              runners share a folder, each running stages no other one holds
                              (:mod:`osprey_train.study.runner_locks`)
    OUT/.lock                 held for the instant a runner joins (one study file per folder)

A stage is complete exactly when ``stages/KIND-KEY/`` exists: the runner fills ``work/KIND-KEY/``,
writes ``stage.json`` into it last and moves it into place with one rename
(:func:`osprey_data.atomic.replace_dir`). Killing the process at any moment therefore leaves finished
stages untouched and at most one stage in ``work/``; running the same command again skips what is
finished and continues the interrupted stage from its own checkpoints (trainer checkpoints, committed
store shards, tokenized corpus shards), which resume exactly. A finished stage's files are checked
against the checksums in its ``stage.json`` before another stage uses them
(:mod:`osprey_train.study.integrity`): a damaged one is refused, naming the file and the folder to delete.

SIGINT / SIGTERM: the stage in progress stops the way its own command does (a training stage
checkpoints the step it finished, a store build commits its finished samples; a stage with no
resume of its own is dropped and rerun), and :class:`~osprey_data.errors.Interrupted` names the
stage, what was kept and the command that continues the study (exit 130 / 143).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from osprey_data import jsonio
from osprey_data.atomic import replace_dir, write_json
from osprey_data.errors import ConfigError, InputError, Interrupted
from osprey_data.schema_check import validate
from osprey_data.interrupt import GracefulStop, StopRequested, signal_name
from osprey_data.cpu_threads import busy_machine_threads, machine_load
from osprey_data.target_model.precision import cpu_description
from osprey_train.study.config import StudyConfig
from osprey_train.study.eta import A_PRIORI_RATES, format_duration, study_estimate
from osprey_train.study.integrity import (CHECKSUM_KEY, STAGE_SCHEMA, output_checksums, read_stage_record,
                                          verify_stage)
from osprey_train.study.plan import Node, Plan, build_plan
from osprey_data.target_model.model_config import peek_model_config
from osprey_train.stages.prune import check_kept_layers
from osprey_train.study.stages import EXECUTORS, Inputs, StageContext
from osprey_train.study.runner_locks import StageClaim, claim_stage, join_study, live_runners

__all__ = ["StudyRunConfig", "StudyRunResult", "run", "stage_dir", "read_record", "code_version", "DEFAULT_RATES",
           "format_duration", "STAGE_RECORD"]

STAGE_RECORD = "stage.json"

# Seconds per work unit of each stage kind before the study has measured its own (osprey_train/study/eta.py).
DEFAULT_RATES = A_PRIORI_RATES


@dataclass(kw_only=True)
class StudyRunConfig:
    """Options of ``osprey study run``."""

    study: StudyConfig
    """The study."""
    out: Path
    """Study folder (created if missing)."""
    cache: str | None = None
    """Model cache of the PyPI target (default $OSPREY_CACHE or ~/.cache/osprey)."""
    progress: bool = True
    """Stage lines and the stages' own progress bars."""
    prefix: str = "study"
    """Word the stage lines start with (``[study 3/40 ...]``; the demo says ``demo``)."""
    max_stages: int | None = None
    """Stop after running this many stages (tests; None = all)."""
    eta_rates: str = "study"
    """A-priori rates of the ETA before this run has measured its own: 'study' or 'demo'
    (:data:`osprey_train.study.eta.A_PRIORI`)."""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"study: --out {self.out} exists and is not a folder")


@dataclass
class StudyRunResult:
    """What one invocation did."""

    out: Path
    plan: Plan
    ran: list[str] = field(default_factory=list)
    """Keys of the stages run (finished) by this invocation."""
    reused: int = 0
    """Stages found finished."""
    wall_s: float = 0.0


def stage_dir(out: Path, node: Node) -> Path:
    """Where ``node``'s finished output lives."""
    return Path(out) / "stages" / node.folder


def read_record(out: Path, key_or_node: str | Node) -> dict[str, Any] | None:
    """The ``stage.json`` of a finished stage, or None."""
    if isinstance(key_or_node, Node):
        folder = stage_dir(out, key_or_node)
    else:
        matches = sorted((Path(out) / "stages").glob(f"*-{key_or_node}"))
        if not matches:
            return None
        folder = matches[0]
    try:
        return jsonio.loads((folder / STAGE_RECORD).read_bytes())
    except (OSError, ValueError):   # JSONDecodeError, too deep, not UTF-8
        return None


def code_version() -> dict[str, Any]:
    """The git commit of the code that runs (and whether the tree had changes), or the package version."""
    from importlib.metadata import PackageNotFoundError, version

    root = Path(__file__).resolve().parents[2]
    doc: dict[str, Any] = {}
    try:
        doc["package"] = version("osprey")
    except PackageNotFoundError:
        doc["package"] = None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode == 0:
            doc["commit"] = commit.stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            doc["dirty"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return doc


def machine() -> dict[str, Any]:
    """What a stage ran on: the CPU (``cpu_description``) and the GPU, if one was visible."""
    import torch

    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {**cpu_description(), "gpu": cuda}


def _cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _log(out: Path, line: str) -> None:
    with open(out / "run.log", "a", encoding="utf-8") as fh:
        fh.write(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} [pid {os.getpid()}] {line}\n")


@contextmanager
def _threads(setting: int | str, note: Callable[[str], None]) -> Iterator[int]:
    import torch

    before = torch.get_num_threads()
    chosen = setting if isinstance(setting, int) else busy_machine_threads(note)
    if chosen is not None:
        torch.set_num_threads(chosen)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def _run_stage(cfg: StudyRunConfig, ctx: StageContext, node: Node) -> dict[str, Any]:
    out = cfg.out
    inputs = Inputs()
    for role, dep in node.deps.items():
        folder = stage_dir(out, dep)
        if not (folder / STAGE_RECORD).is_file():   # the plan orders inputs first: an internal invariant
            raise AssertionError(f"{node.label}: input {role} ({dep.label}) is not finished")
        verify_stage(folder, dep.label)   # a damaged finished output is refused, never used
        inputs[role] = (dep, folder)
    work = out / "work" / node.folder
    interrupted = work.exists()
    if interrupted and not node.resumable:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc)
    wall0, cpu0 = time.perf_counter(), _cpu_seconds()
    load0 = machine_load()[0]
    with _threads(cfg.study.study.threads, ctx.log) as threads:
        result = EXECUTORS[node.kind](ctx, node, inputs, work)
    record = {
        "format": "osprey-study-stage", "format_version": 1, **node.describe(), "result": result,
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - wall0, "cpu_s": _cpu_seconds() - cpu0, "threads": threads,
        "load_average": [load0, machine_load()[0]],
        "resumed": interrupted and node.resumable, "code_version": code_version(), "machine": machine(),
        CHECKSUM_KEY: output_checksums(work, node.kind),
    }
    record = json.loads(json.dumps(record, default=str))   # as it will read back
    validate(record, STAGE_SCHEMA, where=str(work / STAGE_RECORD))   # a wrong record is a bug: never written
    write_json(work / STAGE_RECORD, record)
    (out / "stages").mkdir(exist_ok=True)
    replace_dir(work, stage_dir(out, node))
    return record


def _finished(out: Path, node: Node) -> bool:
    """Whether ``node`` is finished; a ``stage.json`` that does not parse is an error, not done."""
    if not (stage_dir(out, node) / STAGE_RECORD).is_file():
        return False
    read_stage_record(stage_dir(out, node))
    return True


# How often a runner whose remaining stages all wait on another runner looks again.
WAIT_POLL_S = 2.0


def _next_stage(cfg: StudyRunConfig, out: Path, plan: Plan,
                todo: list[Node]) -> tuple[tuple[Node, StageClaim] | None, Plan]:
    """The first stage of ``todo`` that is ready (inputs finished), claimed for this runner; stages
    another runner finished meanwhile are dropped from ``todo``. Returns the (maybe re-built) plan."""
    for node in list(todo):
        if node.pending:   # a 'best' live run: defined once the cells it chooses from exist
            plan = build_plan(cfg.study, lookup=lambda key: read_record(out, key))
            resolved = plan.live_of(node) or node
            if resolved.pending:
                continue
            todo[todo.index(node)] = node = resolved
        if _finished(out, node):
            todo.remove(node)
            continue
        if not all((stage_dir(out, dep) / STAGE_RECORD).is_file() for dep in node.deps.values()):
            continue
        claim = claim_stage(out, node.folder)
        if claim is None:
            continue
        if _finished(out, node):   # finished by another runner between the two looks
            claim.release()
            todo.remove(node)
            continue
        return (node, claim), plan
    return None, plan


def _wait(cfg: StudyRunConfig, left: int, total: int) -> None:
    try:
        time.sleep(WAIT_POLL_S)
    except KeyboardInterrupt:
        study_file = cfg.study.path if cfg.study.path is not None else "STUDY.toml"
        raise Interrupted(f"study {cfg.study.study.name} interrupted by SIGINT while waiting for another runner "
                          f"({total - left} of {total} stages finished and kept; this runner held none). Continue "
                          f"with `osprey study run {study_file} --out {cfg.out}`.", signum=signal.SIGINT) from None


def _run_stage_stoppable(cfg: StudyRunConfig, ctx: StageContext, node: Node, *, done: int,
                         total: int) -> dict[str, Any]:
    """:func:`_run_stage`, turning a signal into one :class:`Interrupted` naming the stage."""
    try:
        with GracefulStop():
            return _run_stage(cfg, ctx, node)
    except (Interrupted, StopRequested) as exc:
        work = cfg.out / "work" / node.folder
        if isinstance(exc, Interrupted):  # the stage's own command saved its finished work
            kept = f"what it finished is kept in {work} and resumed from there"
        elif node.resumable:
            kept = f"what it committed is kept in {work} and resumed from there"
        else:
            kept = "it has no partial result and is rerun"
        _log(cfg.out, f"interrupted {node.folder} by {signal_name(exc.signum)}")
        study_file = cfg.study.path if cfg.study.path is not None else "STUDY.toml"
        raise Interrupted(f"study {cfg.study.study.name} interrupted by {signal_name(exc.signum)} in stage "
                          f"{node.label} ({done} of {total} stages finished and kept; {kept}). Continue with "
                          f"`osprey study run {study_file} --out {cfg.out}`.", signum=exc.signum) from None


# What a folder a study runner made holds (at least one of them from its first second on)
_STUDY_MARKERS = ("study.toml", "stages", "work", "run.log", ".lock")


def check_study_folder(out: Path) -> None:
    """ConfigError when ``out`` is a non-empty folder that no study runner made: a mistyped
    ``--out`` (the current folder, a home folder) must not fill up with stages and have its
    ``study.toml`` replaced. Any study's folder is accepted (a study file may change between runs)."""
    out = Path(out)
    if not out.is_dir() or any((out / m).exists() for m in _STUDY_MARKERS):
        return
    entries = sorted(p.name for p in out.iterdir())
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ConfigError(f"study: --out {out} is a non-empty folder that is not a study folder (it holds {shown}); "
                          "choose a new or empty folder, or the folder of an earlier `osprey study run`")


def check_before_weights(plan: Any, model_node: Node, model: dict[str, Any]) -> None:
    """Check the settings that a model's config decides, as soon as that model is on disk and before
    any stage loads its weights (a store, the first user of the source, loads the target for minutes):
    ``[prune] layers`` against the source's layer count."""
    try:
        shape = peek_model_config(model["path"], model.get("gguf_file"), option=model_node.label)
    except InputError:
        return   # not a readable local model: the stage that loads it says what is wrong
    if shape is None or shape.num_layers is None:
        return
    for node in plan.nodes:
        if node.kind == "prune" and node.deps.get("source") is model_node:
            check_kept_layers(node.settings.layers, shape.num_layers, where=f"the source ({shape.path})")


def run(cfg: StudyRunConfig) -> StudyRunResult:
    """Run (or continue) the study in ``cfg.out``.

    Several runners may work in one folder at once (start the same command again): each takes the
    first stage in order of work whose inputs are finished and that no other runner holds
    (:mod:`osprey_train.study.runner_locks`), and waits when every remaining stage waits on another
    runner's. Alone, a runner runs the stages in plan order, as before."""
    out = cfg.out
    check_study_folder(out)
    t0 = time.perf_counter()
    say: Callable[[str], None] = (lambda m: print(m, flush=True)) if cfg.progress else (lambda m: None)
    study_text = cfg.study.path.read_text(encoding="utf-8") if cfg.study.path is not None else None
    with join_study(out, study_text) as me:
        ctx = StageContext(cfg=cfg.study, cache=cfg.cache, progress=cfg.progress, log=lambda m: say(f"    {m}"))
        plan = build_plan(cfg.study, lookup=lambda key: read_record(out, key))
        result = StudyRunResult(out=out, plan=plan)
        todo = [n for n in plan.nodes if not _finished(out, n)]
        result.reused = len(plan.nodes) - len(todo)
        total = len(plan.nodes)
        others = live_runners(out, exclude=me)
        if cfg.progress:
            say(f"[{cfg.prefix}] {cfg.study.study.name}: {total} stages, {result.reused} already done, "
                f"{len(todo)} to run; folder {out}" + (f"; sharing it with {', '.join(others)}" if others else ""))
        _log(out, f"run: {len(todo)} of {total} stages to run"
             + (f" (beside {len(others)} other runner(s))" if others else ""))
        basis_said = None
        waiting_said = False
        while todo:
            picked, plan = _next_stage(cfg, out, plan, todo)
            if picked is None:
                if not todo:
                    break
                busy = live_runners(out, exclude=me)
                if not busy:   # the plan orders inputs first, so alone a runner always finds one
                    raise AssertionError(f"{todo[0].label}: no stage is ready and no other runner is working")
                if cfg.progress and not waiting_said:
                    say(f"    waiting: the {len(todo)} stages left need stages another runner is running ({busy[0]})")
                waiting_said = True
                _wait(cfg, len(todo), total)
                continue
            waiting_said = False
            node, claim = picked
            try:
                index = total - len(todo) + 1
                eta = study_estimate(out, plan, list(todo), read_record, a_priori=cfg.eta_rates)
                if cfg.progress:
                    if eta.source != basis_said:   # say what the ETA rests on when that changes
                        basis_said = eta.source
                        say(f"    ETA: {eta.basis}")
                    say(f"[{cfg.prefix} {index}/{total} +{format_duration(time.perf_counter() - t0)} "
                        f"ETA {eta.label()}] {node.label}")
                _log(out, f"start {node.folder} {node.label}")
                record = _run_stage_stoppable(cfg, ctx, node, done=index - 1, total=total)
                _log(out, f"done {node.folder} in {record['wall_s']:.0f} s")
                if node.kind == "model":
                    check_before_weights(plan, node, record["result"])
            finally:
                claim.release()
            todo.remove(node)
            result.ran.append(node.key)
            if cfg.max_stages is not None and len(result.ran) >= cfg.max_stages:
                break
    result.plan = plan
    result.wall_s = time.perf_counter() - t0
    if cfg.progress:
        say(f"[{cfg.prefix}] {len(result.ran)} stages run, {result.reused} reused, in "
            f"{format_duration(result.wall_s)}")
    return result
