"""``osprey study status``: how far a study folder is, and how long the rest should take.

Read-only: it never takes the runner's lock, so it can watch a running study. Per stage kind it
counts finished stages, names the stage in ``work/`` (running or interrupted) with its last
checkpoint, and estimates the remaining time (:mod:`osprey_train.study.eta`: this run's measured
seconds per work unit, a-priori rates scaled by them, or rough a-priori rates before any stage).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osprey_train.study.config import StudyConfig
from osprey_train.study.plan import build_plan
from osprey_train.study.eta import format_duration, study_estimate
from osprey_train.study.integrity import damaged_outputs
from osprey_train.study.runner import STAGE_RECORD, read_record, stage_dir
from osprey_train.study.runner_locks import live_runners

__all__ = ["StudyStatus", "status"]


@dataclass
class StudyStatus:
    """Where a study stands."""

    name: str
    out: Path
    total: int
    done: int
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    in_work: list[dict[str, Any]] = field(default_factory=list)
    """Stages with a work folder (running now, or interrupted): label and progress."""
    next: list[str] = field(default_factory=list)
    """The next stages to run."""
    remaining_s: float = 0.0
    """Estimated seconds for the unfinished stages."""
    estimate_note: str | None = None
    """What the estimate rests on: this run's finished stages, a-priori rates scaled by them, or a
    rough a-priori estimate (with the machine's load) before any stage is measured."""
    estimate_measured: bool = False
    """True when every kind left has a rate measured in this run."""
    spent_s: float = 0.0
    """Wall seconds of the finished stages."""
    lock: str | None = None
    """The runner holding the folder, if any ('pid N since ...')."""
    damaged: list[str] = field(default_factory=list)
    """Finished-looking stage folders whose ``stage.json`` does not parse (``study run`` refuses
    them until the folder is deleted): not counted as finished."""
    corrupt: list[dict[str, str]] = field(default_factory=list)
    """With ``verify``: finished stages whose outputs differ from the sha256 their record holds
    (``{"stage", "folder", "problem"}``); not counted as finished."""
    verified: bool = False
    """Whether every finished stage's outputs were hashed against its record."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "out": str(self.out), "total": self.total, "done": self.done,
                "by_kind": self.by_kind, "in_work": self.in_work, "next": self.next,
                "remaining_s": self.remaining_s, "estimate_note": self.estimate_note,
                "estimate_measured": self.estimate_measured, "spent_s": self.spent_s,
                "lock": self.lock, "damaged": self.damaged, "verified": self.verified, "corrupt": self.corrupt}

    def to_text(self) -> str:
        lines = [f"study {self.name} in {self.out}: {self.done}/{self.total} stages finished; "
                 f"{format_duration(self.spent_s)} spent, about {'' if self.estimate_measured else '~'}"
                 f"{format_duration(self.remaining_s)} to go"
                 + (f" ({self.estimate_note})" if self.estimate_note else "")]
        lines.append(f"runners: {self.lock}" if self.lock and ";" in self.lock else f"runner: {self.lock or 'none running'}")
        for kind, c in self.by_kind.items():
            lines.append(f"  {kind:<9} {c['done']:>4}/{c['total']:<4}")
        for w in self.in_work:
            lines.append(f"  in progress: {w['label']}" + (f" ({w['progress']})" if w.get("progress") else ""))
        for folder in self.damaged:
            lines.append(f"  damaged: {folder} (stage.json unreadable; delete it to run that stage again)")
        for bad in self.corrupt:
            lines.append(f"  damaged output: {bad['problem']}")
        if self.verified:
            lines.append(f"  verified: {'every finished stage matches its sha256' if not self.corrupt else f'{len(self.corrupt)} finished stage(s) damaged'}")
        if self.next:
            lines.append("  next: " + "; ".join(self.next))
        return "\n".join(lines)


def _work_progress(folder: Path, kind: str) -> str | None:
    """A short description of what an interrupted / running stage already has."""
    if kind in ("pretrain", "distill"):
        ckpts = sorted((folder / "run" / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
        metrics = folder / "run" / "metrics.jsonl"
        last = None
        if metrics.is_file():
            lines = [json.loads(x) for x in metrics.read_text(encoding="utf-8").splitlines() if x.strip()]
            last = max((r["step"] for r in lines), default=None)
        parts = []
        if last is not None:
            parts.append(f"logged step {last}")
        if ckpts:
            parts.append(f"checkpoint {ckpts[-1].name}")
        return ", ".join(parts) or None
    if kind == "store":
        manifest = folder / "store" / "manifest.json"
        if manifest.is_file():
            doc = json.loads(manifest.read_text(encoding="utf-8"))
            return f"{doc.get('num_samples', 0)} samples committed"
    return None


def status(cfg: StudyConfig, out: Path, *, verify: bool = False) -> StudyStatus:
    """The status of study ``cfg`` in folder ``out``; ``verify`` hashes every finished stage's outputs
    against its record (a damaged one is listed in ``corrupt``, not counted as finished)."""
    out = Path(out)
    plan = build_plan(cfg, lookup=lambda key: read_record(out, key))
    st = StudyStatus(name=cfg.study.name, out=out, total=len(plan.nodes), done=0, verified=verify)
    todo = []
    for node in plan.nodes:
        counts = st.by_kind.setdefault(node.kind, {"done": 0, "total": 0})
        counts["total"] += 1
        record = None if node.pending else read_record(out, node)
        bad = damaged_outputs([(stage_dir(out, node), node.label)]) if record is not None and verify else []
        if bad:
            st.corrupt += bad
            record = None
        if record is not None:
            counts["done"] += 1
            st.done += 1
            st.spent_s += record.get("wall_s", 0.0)
            continue
        todo.append(node)
        if not node.pending and not bad and (stage_dir(out, node) / STAGE_RECORD).is_file():
            st.damaged.append(str(stage_dir(out, node)))
        work = out / "work" / node.folder
        if not node.pending and work.is_dir() and not (stage_dir(out, node) / STAGE_RECORD).is_file():
            st.in_work.append({"label": node.label, "folder": node.folder,
                               "progress": _work_progress(work, node.kind)})
    st.next = [n.label for n in todo[:3]]
    eta = study_estimate(out, plan, todo, read_record)
    st.remaining_s, st.estimate_note, st.estimate_measured = eta.seconds, eta.basis, eta.measured
    runners = live_runners(out)
    st.lock = "; ".join(runners) if runners else None
    return st
