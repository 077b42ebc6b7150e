"""Collect a study folder's finished stages into one plain-JSON results document.

Nothing is recomputed: every figure comes from the ``stage.json`` records and metrics files the
runner wrote. A study that is still running (or was stopped) gives partial results; the document
says which stages are missing. Every finished stage's outputs are checked against the sha256 its
record holds first: a damaged one refuses the whole document (a drafter whose weights changed
after its figures were measured must not be presented with them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from osprey_data.errors import StoreNotFoundError
from osprey_data.store.manifest import parse_manifest
from osprey_train.study.config import StudyConfig
from osprey_train.study.integrity import refuse_damaged
from osprey_train.study.plan import Plan, build_plan
from osprey_train.study.runner import code_version, read_record, stage_dir
from osprey_train.trainer.config import config_json

__all__ = ["collect", "arm_matrix", "mean", "report_roles", "headline", "study_headline"]

# The roles the headline claims compare; each is also the name of an architecture. A study without
# [report.roles] (the quick preset) still gets its claims when it has exactly one arm of each.
_HEADLINE_ROLES = ("osprey", "eagle3")


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def arm_matrix(cells: list[dict], arm: str, domains: list[str], eval_domains: list[str],
               seed: int | None = None) -> list[list[float | None]]:
    """values[i][j]: acceptance length of ``arm`` adapted to domains[i] on eval_domains[j]
    (one seed, or the mean over the seeds present when ``seed`` is None)."""
    rows = []
    for d in domains:
        row = []
        for e in eval_domains:
            vals = [c["acceptance_length"] for c in cells if c["arm"] == arm and c["train_domain"] == d
                    and c["eval_domain"] == e and (seed is None or c["seed"] == seed)]
            row.append(mean(vals))
        rows.append(row)
    return rows


def report_roles(cfg: StudyConfig) -> dict[str, str]:
    """Role -> arm of the report's claims: ``[report.roles]``, and for each headline role it leaves
    out (``osprey``, ``eagle3``) the study's only arm of the architecture of that name, when it has
    exactly one and that arm plays no other role."""
    roles = dict(cfg.report.roles)
    by_arch: dict[str, list[str]] = {}
    for a in cfg.arms:
        by_arch.setdefault(a.arch, []).append(a.name)
    for role in _HEADLINE_ROLES:
        if role in roles:
            continue
        arms = by_arch.get(role, [])
        if len(arms) == 1 and arms[0] not in roles.values():
            roles[role] = arms[0]
    return roles


def _summary(values: list[list[float | None]], domains: list[str], eval_domains: list[str]) -> dict[str, Any]:
    cells = [(d, e, values[i][j]) for i, d in enumerate(domains) for j, e in enumerate(eval_domains)]
    complete = all(v is not None for _, _, v in cells)
    ind = [v for d, e, v in cells if d == e and v is not None]
    ood = [v for d, e, v in cells if d != e and v is not None]
    return {"mean": mean(ind + ood), "in_domain": mean(ind), "out_of_domain": mean(ood), "complete": complete,
            "cells": len(ind) + len(ood)}


def collect(cfg: StudyConfig, out: Path, plan: Plan | None = None) -> dict[str, Any]:
    """The results document of the study ``cfg`` run in ``out``."""
    out = Path(out)
    plan = plan or build_plan(cfg, lookup=lambda key: read_record(out, key))
    records = {n.key: read_record(out, n) for n in plan.nodes if not n.pending}
    done = [n for n in plan.nodes if records.get(n.key)]
    # a finished stage whose files no longer match its record (a flipped bit in a drafter) is refused
    refuse_damaged([(stage_dir(out, n), n.label) for n in done], f"study report of {out}")
    missing = [n.label for n in plan.nodes if not records.get(n.key)]
    domains = [d.name for d in cfg.domains]

    def cell(node, record) -> dict[str, Any]:
        r = record["result"]
        return {"arm": node.arm, "seed": node.seed, "train_domain": node.domain, "eval_domain": node.eval_domain,
                "acceptance_length": r["overall"], "per_position": r["per_position"],
                "num_samples": r["num_samples"], "num_verify_steps": r["num_verify_steps"],
                "num_tokens": r["num_tokens"], "proxy": r["proxy"], "stage": node.key}

    cells = [cell(n, records[n.key]) for n in plan.cells.values() if records.get(n.key)]
    converted = [cell(n, records[n.key]) for n in plan.init_cells.values() if records.get(n.key)]

    curves = []
    for (arm, seed, domain), node in plan.drafters.items():
        if not records.get(node.key):
            continue
        metrics = _metrics(stage_dir(out, node) / "run" / "metrics.jsonl")
        curves.append({"arm": arm, "seed": seed, "domain": domain,
                       "train": [{k: v for k, v in m.items() if k != "kind"} for m in metrics if m["kind"] == "train"],
                       "eval": [{k: v for k, v in m.items() if k != "kind"} for m in metrics if m["kind"] == "eval"]})

    stage2 = {}
    for variant, node in plan.pretrain.items():
        record = records.get(node.key)
        if not record:
            continue
        s = node.settings
        per_step = s.seq_len * s.batch_size
        evals = [m for m in _metrics(stage_dir(out, node) / "run" / "metrics.jsonl") if m["kind"] == "eval"]
        stage2[variant] = {
            "settings": node.settings_json(), "final_ppl": record["result"]["final_ppl"],
            "curve": [{"step": m["step"], "tokens": m["step"] * per_step, "eval_ppl": m["eval_ppl"],
                       **({"eval_kd": m["eval_kd"]} if "eval_kd" in m else {})} for m in evals],
            "teacher_ppl": next((m["teacher_eval_ppl"] for m in evals if "teacher_eval_ppl" in m), None),
            "wall_s": record["wall_s"], "cpu_s": record["cpu_s"]}

    stores = {}
    for (domain, split, data), node in plan.stores.items():
        record = records.get(node.key)
        if record:
            r = record["result"]
            # The record is the last build run's summary: after an interrupted build it counts only
            # what that run added, so the totals come from the store's own manifest.
            manifest_path = stage_dir(out, node) / "store" / "manifest.json"
            if not manifest_path.is_file():
                raise StoreNotFoundError(
                    f"{manifest_path}: missing, although stage '{node.label}' is recorded as finished; the study "
                    f"folder is damaged: delete {stage_dir(out, node)} and rerun `osprey study run` to rebuild it")
            manifest = parse_manifest(manifest_path.read_bytes(), where=str(manifest_path))
            stores[f"{domain}/{split}/{data}"] = {
                "samples": manifest.num_samples, "tokens_written": manifest.num_tokens,
                "generated_tokens": r["generated_tokens"] if not r.get("already_done") else None,
                "resumed": bool(r.get("already_done")), "truncated": r["truncated"], "wall_s": record["wall_s"]}

    matrices = {}
    for arm in cfg.arms:
        arm_domains = cfg.arm_domains(arm)
        seeds = sorted({c["seed"] for c in cells if c["arm"] == arm.name})
        if not seeds:
            continue
        seed_mean = arm_matrix(cells, arm.name, arm_domains, domains)
        per_seed = {}
        for s in seeds:
            values = arm_matrix(cells, arm.name, arm_domains, domains, s)
            per_seed[str(s)] = {"values": values, "summary": _summary(values, arm_domains, domains)}
        matrices[arm.name] = {"domains": arm_domains, "eval_domains": domains, "seeds": seeds, "values": seed_mean,
                              "summary": _summary(seed_mean, arm_domains, domains), "per_seed": per_seed}

    compute: dict[str, Any] = {"wall_s": 0.0, "cpu_s": 0.0, "by_kind": {}}
    threads = set()
    for n in done:
        r = records[n.key]
        k = compute["by_kind"].setdefault(n.kind, {"stages": 0, "wall_s": 0.0, "cpu_s": 0.0})
        k["stages"] += 1
        k["wall_s"] += r["wall_s"]
        k["cpu_s"] += r["cpu_s"]
        compute["wall_s"] += r["wall_s"]
        compute["cpu_s"] += r["cpu_s"]
        threads.add(r.get("threads"))
        load = [x for x in r.get("load_average", []) if x is not None]
        if load:
            compute.setdefault("load_average", []).extend(load)
    if compute.get("load_average"):
        la = compute.pop("load_average")
        compute["load_average_mean"] = sum(la) / len(la)
    compute["threads"] = sorted(t for t in threads if t is not None)
    commits = sorted({json.dumps(records[n.key].get("code_version", {}), sort_keys=True) for n in done})
    # a study folder can outlive its machine's hardware: say which stages ran where
    machines: dict[str, int] = {}
    for n in done:
        desc = json.dumps(records[n.key].get("machine"), sort_keys=True)
        machines[desc] = machines.get(desc, 0) + 1

    live = None
    if plan.live is not None and not plan.live.pending and records.get(plan.live.key):
        live = {"arm": plan.live.arm, "seed": plan.live.seed, "domain": plan.live.domain,
                "settings": plan.live.settings_json(), **records[plan.live.key]["result"]}

    return {
        "format": "osprey-study-results", "format_version": 1,
        "study": {"name": cfg.study.name, "description": cfg.study.description,
                  "file": cfg.path.name if cfg.path else None},
        "code_version": code_version(), "stage_code_versions": [json.loads(c) for c in commits],
        "stage_machines": [{"machine": json.loads(m), "stages": c} for m, c in sorted(machines.items())],
        "progress": {"stages": len(plan.nodes), "done": len(done), "missing": missing},
        "settings": {name: config_json(getattr(cfg, name)) for name in
                     ("stores", "prune", "pretrain", "distill", "eval", "live") if getattr(cfg, name) is not None},
        "target": cfg.target.model, "source": cfg.source.model,
        "corpus": [*(f.name for f in cfg.corpus.files), *(f"{name} (npm)" for name in cfg.corpus.packaged)]
        if cfg.corpus else None,
        "domains": [{"name": d.name, "train_file": d.train.name, "eval_file": d.eval.name if d.eval else None,
                     "train_samples": d.train_samples, "eval_samples": d.eval_samples} for d in cfg.domains],
        "arms": [{**config_json(a), "lr": cfg.arm_distill(a).lr, "steps": cfg.arm_distill(a).steps,
                  "stage2_name": cfg.stage2_name(a)} for a in cfg.arms],
        "roles": report_roles(cfg),
        "cells": cells, "converted_cells": converted, "matrices": matrices, "curves": curves, "stage2": stage2,
        "stores": stores, "live": live, "compute": compute,
    }


def headline(results: dict[str, Any]) -> str:
    """One line of a results document's headline figure: each arm's mean acceptance length over the
    matrix (mean of its seeds), and the Osprey / EAGLE-3 ratio when both roles have one."""
    steps = results["settings"]["eval"]["draft_steps"]
    arms = []
    for name, m in results["matrices"].items():
        s = m["summary"]
        if s["mean"] is None:
            continue
        part = "" if s["complete"] else f", {s['cells']} cells so far"
        seeds = f"{len(m['seeds'])} seed{'s' if len(m['seeds']) > 1 else ''}"
        arms.append(f"{name} {s['mean']:.3f} ({seeds}{part})")
    if not arms:
        return f"acceptance length (S = {steps}): no cell finished yet"
    line = f"acceptance length (S = {steps}, mean over the matrix): " + ", ".join(arms)
    roles = results["roles"]
    o, e = (results["matrices"].get(roles.get(r) or "", {}).get("summary", {}).get("mean") for r in ("osprey", "eagle3"))
    if o is not None and e:
        line += f"; {roles['osprey']} / {roles['eagle3']} x{o / e:.3f}"
    return line


def study_headline(cfg: StudyConfig, out: Path) -> list[str]:
    """The headline line of a study folder (one per target of a ``[[targets]]`` study)."""
    if not cfg.targets:
        return [headline(collect(cfg, out))]
    plan = build_plan(cfg, lookup=lambda key: read_record(out, key))
    return [f"{t.name}: " + headline(collect(cfg.for_target(t.name), out, plan=plan.targets[t.name]))
            for t in cfg.targets]
