"""``osprey study report``: the committed results of a study, produced from its folder.

Writes into the report folder (``[report] dir`` or ``OUT/report``):

* ``results.json`` every cell, arm and seed with the settings, the code version, the claims;
* ``matrix.md`` the adapted-domain x evaluation-domain matrix of every arm (seed mean and per
  seed), the summary table and the Osprey / EAGLE-3 ratio matrix;
* ``heatmap-ARM.png`` per arm and ``ratio.png``;
* ``curves.png`` training loss and held-out acceptance vs step; ``stage2.png`` held-out perplexity
  vs tokens of both Stage-2 variants;
* ``README.md`` each paper claim with the paper's figure, ours, the noise figure and whether it held,
  then the setup, compute and how to reproduce; the ``[report] notes`` file is appended.

Everything is a function of the study folder: rerunning the report gives the same files.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osprey_train.study.stage2_axis import plot_axis, render_axis, stage2_axis
from osprey_data.atomic import atomic_file, write_json, write_text
from osprey_data.errors import ConfigError
from osprey_data.text import printable
from osprey_train.drafters.registry import drafter_spec
from osprey_train.evaluation.matrix import MatrixResult, plot_heatmap
from osprey_train.study.claims import check_claims, claim_applies
from osprey_train.study.config import StudyConfig
from osprey_train.study.cross_target import cross_target_claims, per_target_rows
from osprey_train.study.plateau import FLAT_SHARE, LATE_FROM, plateau_rows
from osprey_train.study.results import collect
from osprey_train.study.plan import Plan, build_plan
from osprey_train.study.presets import preset_path
from osprey_train.study.runner import format_duration, read_record

__all__ = ["ReportConfig", "ReportResult", "run", "render_readme", "render_matrix_md"]

_TRAIN_DATA_NOTE = {"regenerated": "", "regenerated-fp8": ", fp8 train store", "teacher-forced": ", teacher-forced data"}


@dataclass(kw_only=True)
class ReportConfig:
    """Options of ``osprey study report``."""

    study: StudyConfig
    """The study."""
    out: Path
    """Study folder (what ``osprey study run`` wrote)."""
    report_dir: Path | None = None
    """Where to write (default: ``[report] dir``, else ``OUT/report``)."""


@dataclass
class ReportResult:
    dir: Path
    files: list[Path]
    results: dict[str, Any]


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _cell(text: object) -> str:
    """A table cell: control characters escaped (no forged line, no terminal escape) and ``|``
    escaped, so a name (an arm, a domain, a store's domain) cannot add columns."""
    return printable(text).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    spec = align or "|".join(["---"] + ["---:"] * (len(header) - 1))
    return ["| " + " | ".join(map(_cell, header)) + " |", "|" + spec + "|",
            *("| " + " | ".join(map(_cell, r)) + " |" for r in rows)]


def _matrix_table(values: list[list[float | None]], domains: list[str], eval_domains: list[str]) -> list[str]:
    rows = []
    for i, d in enumerate(domains):
        cells = []
        for j, e in enumerate(eval_domains):
            v = _f(values[i][j])
            cells.append(f"**{v}**" if d == e and values[i][j] is not None else v)
        vals = [values[i][j] for j in range(len(eval_domains)) if values[i][j] is not None]
        ood = [values[i][j] for j, e in enumerate(eval_domains) if e != d and values[i][j] is not None]
        rows.append([d, *cells, _f(sum(vals) / len(vals) if vals else None), _f(sum(ood) / len(ood) if ood else None)])
    return _table(["adapted \\ eval", *eval_domains, "mean", "OOD mean"], rows)


def _ratio(results: dict) -> tuple[list[list[float | None]], list[str], list[str]] | None:
    roles = results["roles"]
    o, e = results["matrices"].get(roles.get("osprey")), results["matrices"].get(roles.get("eagle3"))
    if not o or not e or o["domains"] != e["domains"]:
        return None
    values = [[None if a is None or b is None or b == 0 else a / b for a, b in zip(ra, rb)]
              for ra, rb in zip(o["values"], e["values"])]
    return values, o["domains"], o["eval_domains"]


def render_matrix_md(results: dict) -> str:
    """matrix.md: summary, every arm's matrix (seed mean and per seed), the Osprey / EAGLE-3 ratios."""
    steps = results["settings"]["eval"]["draft_steps"]
    lines = [f"# Acceptance matrices: {results['study']['name']}", "",
             f"Acceptance length (tokens per verify round, SGLang accounting), greedy chain drafting, S = {steps}; "
             "rows: the domain the drafter was adapted to; columns: the held-out evaluation domain; "
             "bold: in-domain. Generated by `osprey study report`.", "", "## Summary (mean over seeds)", ""]
    rows = []
    for name, m in results["matrices"].items():
        s = m["summary"]
        per = [p["summary"]["mean"] for p in m["per_seed"].values()]
        spread = max(per) - min(per) if len(per) > 1 and None not in per else None
        rows.append([name, _f(s["mean"]), _f(s["in_domain"]), _f(s["out_of_domain"]), _seeds(m["seeds"]),
                     _f(spread), "yes" if s["complete"] else "partial"])
    lines += _table(["arm", "mean", "in-domain", "out-of-domain", "seeds", "seed spread", "every cell"], rows)
    ratio = _ratio(results)
    if ratio is not None:
        values, domains, eval_domains = ratio
        lines += ["", f"## Osprey / EAGLE-3 per cell ({results['roles']['osprey']} / {results['roles']['eagle3']}, "
                      "seed means)", "", *_matrix_table(values, domains, eval_domains), "", "![ratio](ratio.png)"]
    for name, m in results["matrices"].items():
        over = (f"Mean over seeds {', '.join(str(s) for s in m['seeds'])}:" if len(m["seeds"]) > 1
                else f"Seed {m['seeds'][0]} (one seed):")
        lines += ["", f"## {name}", "", over, "",
                  *_matrix_table(m["values"], m["domains"], m["eval_domains"]), "",
                  f"![{name}](heatmap-{name}.png)"]
        if len(m["per_seed"]) > 1:
            for seed, p in m["per_seed"].items():
                lines += ["", f"Seed {seed}:", "", *_matrix_table(p["values"], m["domains"], m["eval_domains"])]
    return "\n".join(lines) + "\n"


def _seeds(seeds: list[int]) -> str:
    """The seeds cell: how many, then which (``1 (seed 0)``, ``2 (seeds 0, 1)``)."""
    return f"{len(seeds)} (seed{'s' if len(seeds) > 1 else ''} {', '.join(str(s) for s in seeds)})"


def _heatmaps(results: dict, folder: Path) -> list[Path]:
    files = []
    steps = results["settings"]["eval"]["draft_steps"]
    for name, m in results["matrices"].items():
        res = MatrixResult(drafters=m["domains"], stores=m["eval_domains"], values=m["values"],
                           proxy=[False] * len(m["eval_domains"]), steps=steps)
        files.append(plot_heatmap(res, folder / f"heatmap-{name}.png", title=f"{name}: acceptance length (S={steps})",
                                  xlabel="evaluation domain", ylabel="adapted to"))
    ratio = _ratio(results)
    if ratio is not None:
        values, domains, eval_domains = ratio
        res = MatrixResult(drafters=domains, stores=eval_domains, values=values, proxy=[False] * len(eval_domains),
                           steps=steps)
        files.append(plot_heatmap(res, folder / "ratio.png", title="Osprey / EAGLE-3 acceptance length", cmap="RdBu",
                                  center=1.0, xlabel="evaluation domain", ylabel="adapted to"))
    return files


def _plot_curves(results: dict, path: Path) -> Path | None:
    curves = results["curves"]
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = [d["name"] for d in results["domains"] if any(c["domain"] == d["name"] for c in curves)]
    arms = [a["name"] for a in results["arms"]]
    held_out = _has_held_out(results)   # eval_every = 0: no held-out points, no empty panel
    rows = 2 if held_out else 1
    fig, axes = plt.subplots(rows, len(domains), figsize=(4.2 * len(domains), 3.2 * rows + 0.2 * (not held_out)),
                             squeeze=False)
    colors = {a: f"C{i % 10}" for i, a in enumerate(arms)}
    for j, d in enumerate(domains):
        for c in curves:
            if c["domain"] != d:
                continue
            style = "-" if c["seed"] == min(x["seed"] for x in curves if x["arm"] == c["arm"]) else ":"
            label = f"{c['arm']} s{c['seed']}"
            axes[0, j].plot([r["step"] for r in c["train"]], [r["loss"] for r in c["train"]], style,
                            color=colors[c["arm"]], label=label, lw=1.2)
            ev = [r for r in c["eval"] if "accept_len" in r]
            if not held_out:
                continue
            axes[1, j].plot([r["step"] for r in ev], [r["accept_len"] for r in ev], style + "o",
                            color=colors[c["arm"]], label=label, lw=1.2, ms=3)
        axes[0, j].set_title(f"adapted to {d}")
        axes[0, j].set_ylabel("training loss (sum of TTT steps)")
        axes[-1, j].set_xlabel("step")
        if held_out:
            axes[1, j].set_ylabel(f"held-out {d} acceptance length")
    axes[-1, -1].legend(fontsize=7, loc="lower right" if held_out else "upper right", ncol=2)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def _has_held_out(results: dict) -> bool:
    """Whether any distillation run measured held-out acceptance while it trained."""
    return any("accept_len" in r for c in results["curves"] for r in c["eval"])


def _plot_stage2(results: dict, path: Path) -> Path | None:
    s2 = results["stage2"]
    if not s2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = {"plain": "next-token prediction", "kd": "distillation from the unpruned source"}
    for variant, doc in s2.items():
        curve = doc["curve"]
        ax.plot([r["tokens"] for r in curve], [r["eval_ppl"] for r in curve], "o-", ms=3,
                label=names.get(variant, variant))
        if doc.get("teacher_ppl"):
            ax.axhline(doc["teacher_ppl"], color="grey", ls="--", lw=0.8, label="unpruned source")
    ax.set_yscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out perplexity (generic corpus)")
    ax.set_title("Stage 2 of the pruned backbone")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def _machine(m: dict | None) -> str:
    if not m:
        return "an unrecorded machine (written before stages recorded one)"
    isa = "AMX" if m.get("amx") else ("AVX-512 BF16, no AMX" if m.get("avx512_bf16") else "no bf16 instructions")
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    return f"{m.get('cpu') or 'an unnamed CPU'} ({m.get('cores')} cores, {isa}{gpu})"


def _version(doc: dict) -> str:
    """The code a report or stage ran: ``commit `abc123def456` `` (``+changes`` for a dirty tree) in a
    git checkout, else the installed package's version (a wheel has no commit)."""
    if doc.get("commit"):
        return f"commit `{doc['commit'][:12]}{'+changes' if doc.get('dirty') else ''}`"
    if doc.get("package"):
        return f"osprey {doc['package']} (installed package)"
    return "an unknown version"


def _per_position(results: dict) -> list[str]:
    rows = []
    steps = results["settings"]["eval"]["draft_steps"]
    for name in results["matrices"]:
        for kind, test in (("in-domain", lambda c: c["train_domain"] == c["eval_domain"]),
                           ("out-of-domain", lambda c: c["train_domain"] != c["eval_domain"])):
            cells = [c for c in results["cells"] if c["arm"] == name and test(c)]
            if not cells:
                continue
            rates = [sum(c["per_position"][s] for c in cells) / len(cells) for s in range(steps)]
            rows.append([name, kind, *[_f(r) for r in rates]])
    if not rows:
        return []
    return _table(["arm", "cells", *[f"draft {s + 1}" for s in range(steps)]], rows)


def render_readme(results: dict, claims: list[dict], notes: str | None, study_file: str | None) -> str:
    """README.md of the report."""
    p = results["progress"]
    name = results["study"]["name"]
    lines = [f"# Does the recipe hold? Study `{name}`", "",
             "Generated by `osprey study report` from the study folder; every figure below is in "
             "`results.json`. Regenerate with the commands under *Reproduce*.", ""]
    if results["study"]["description"]:
        lines += [results["study"]["description"], ""]
    if p["done"] < p["stages"]:
        lines += [f"**Partial results: {p['done']} of {p['stages']} stages finished.** Missing: "
                  + "; ".join(p["missing"][:12]) + (" ..." if len(p["missing"]) > 12 else "") + ".", ""]
    else:
        lines += [f"All {p['stages']} stages finished.", ""]
    versions = sorted({_version(v) for v in results["stage_code_versions"]})
    lines += [f"Code: report by {_version(results['code_version'])}; stages ran with "
              f"{', '.join(versions) or 'none yet'}.", ""]
    if results.get("stage_machines"):
        lines += ["Machines: " + "; ".join(f"{m['stages']} stages on {_machine(m['machine'])}"
                                           for m in results["stage_machines"]) + ".", ""]

    lines += ["## Headline", ""]
    rows = []
    base_distill = results.get("settings", {}).get("distill") or {}   # an arm's distill table: only what differs
    for arm in results["arms"]:
        m = results["matrices"].get(arm["name"])
        if not m:
            continue
        s = m["summary"]
        per = [x["summary"]["mean"] for x in m["per_seed"].values()]
        spread = max(per) - min(per) if len(per) > 1 and None not in per else None
        backbone = drafter_spec(arm["arch"]).needs_backbone or bool(arm.get("backbone"))
        what = (f"{arm['arch']}" + (f" {arm['layers']}L" if not backbone else "")
                + (f", Stage 2 {arm.get('stage2_name', arm['stage2'])}" if backbone else "")
                + f", lr {arm['lr']:.0e}" + _TRAIN_DATA_NOTE[arm["train_data"]]
                + "".join(f", {k} = {json.dumps(v)}" for k, v in sorted((arm.get("arch_options") or {}).items()))
                + "".join(f", {k} = {json.dumps(v)}" for k, v in sorted((arm.get("distill") or {}).items())
                          if v != base_distill.get(k)))
        rows.append([f"`{arm['name']}`", what, _f(s["mean"]), _f(s["in_domain"]), _f(s["out_of_domain"]),
                     str(len(m["seeds"])), _f(spread)])
    lines += _table(["arm", "recipe", "mean AL", "in-domain", "out-of-domain", "seeds", "seed spread"], rows,
                    "---|---|---:|---:|---:|---:|---:")
    lines += ["", "AL: acceptance length over the adapted-domain x evaluation-domain matrix (mean over seeds), "
                  f"greedy chain drafting with S = {results['settings']['eval']['draft_steps']}, rounds counted "
                  "as SGLang counts them (accepted drafts + 1). Full matrices: [matrix.md](matrix.md).", ""]

    lines += ["## The paper's claims at this scale", ""]
    shown = [c for c in claims if claim_applies(c["id"], results["roles"])]
    lines += _table(["claim", "paper", "ours", "noise", "verdict"],
                    [[c["claim"], c["paper"], c["ours"], c["noise"] or "", f"**{c['verdict']}**"] for c in shown],
                    "---|---|---|---:|---")
    if left_out := [c["claim"] for c in claims if c not in shown]:
        lines += ["", "Left out, as this study has no arm for them: " + "; ".join(left_out) + "."]
    if any(len(m["seeds"]) > 1 for m in results["matrices"].values()):
        lines += ["", "Noise: the seed spread of a matrix mean (two seeds); for a difference of two-seed means "
                      "sqrt((s1/2)^2 + (s2/2)^2), for a single-seed arm against a seed of another the larger spread. "
                      "Two seeds give a rough figure, not a confidence interval.", ""]
    else:
        lines += ["", "Noise unknown: every arm ran one seed, so nothing here tells a difference from seed noise; "
                      "give the arms `seeds = [0, 1]` for a noise figure.", ""]

    heatmaps = [f"![{name}](heatmap-{name}.png)" for name in results["matrices"]]
    if _ratio(results) is not None:
        heatmaps.append("![Osprey / EAGLE-3](ratio.png)")
    if heatmaps:
        lines += ["## Matrices", "", " ".join(heatmaps), "",
                  "Per arm and seed, with the Osprey / EAGLE-3 ratio per cell: [matrix.md](matrix.md).", ""]
    pos = _per_position(results)
    if pos:
        lines += ["## Acceptance per draft position", "",
                  "P(draft s accepted | drafts before it accepted), mean over cells:", "", *pos, ""]
    if results["curves"]:
        if _has_held_out(results):
            what = ("Top: training loss (sum over TTT steps of decay^k CE_k); bottom: acceptance length on a subset "
                    f"of the in-domain held-out store ({results['settings']['distill']['eval_samples']} samples) "
                    "during training; solid: first seed, dotted: second.")
        else:
            what = ("Training loss (sum over TTT steps of decay^k CE_k); solid: first seed, dotted: second. No "
                    "held-out curve: the study's `[distill] eval_every = 0` measures acceptance only after training.")
        lines += ["## Learning curves", "", "![curves](curves.png)", "", what, ""]
        if plateau := plateau_rows(results):
            lines += ["Did the runs train long enough? Held-out AL (mean over the arm's runs) at the first "
                      f"evaluation, at the one nearest {LATE_FROM:.0%} of the steps, and at the last:", ""]
            lines += _table(["arm", "runs", "first", f"at {LATE_FROM:.0%}", "last", "late gain",
                             "late share of the gain", "straight line's share", "verdict"],
                            [[f"`{r['arm']}`", str(r["runs"]), _f(r["first"]), _f(r["late_start"]), _f(r["last"]),
                              f"{r['late_gain']:+.3f}", "–" if r["late_share"] is None else f"{r['late_share']:.0%}",
                              f"{r['linear_share']:.0%}", r["verdict"]] for r in plateau],
                            "---|---:|---:|---:|---:|---:|---:|---:|---")
            lines += ["", f"Flat: under {FLAT_SHARE:.0%} of the gain in the last third, or no late gain; flattening: "
                          "under half of what a straight line through the same evaluations would put there.", ""]
    if results["stage2"]:
        lines += ["## Stage 2: held-out perplexity vs tokens", "", "![stage 2](stage2.png)", ""]
        rows = []
        for variant, doc in results["stage2"].items():
            for r in doc["curve"]:
                rows.append([variant, str(r["step"]), f"{r['tokens']:,}", _f(r["eval_ppl"], 1)])
        lines += _table(["variant", "step", "tokens", "held-out perplexity"], rows)
        teacher = next((d.get("teacher_ppl") for d in results["stage2"].values() if d.get("teacher_ppl")), None)
        if teacher:
            lines += ["", f"The unpruned source itself: {teacher:.1f}."]
        lines += [""]
    if results.get("stage2_axis"):
        lines += render_axis(results["stage2_axis"])
    live = results.get("live")
    if live:
        lines += ["## Live speculative decoding", "",
                  f"`osprey eval live` of `{live['arm']}` seed {live['seed']} (adapted to {live['domain']}) against "
                  f"the target on {live['num_prompts']} held-out {live['domain']} prompts, {live['settings']['max_new_tokens']} "
                  f"new tokens at most, S = {live['settings']['steps']}, greedy:", "",
                  *_table(["", "value"], [["acceptance length (live)", _f(live["acceptance_length"])],
                                          ["target alone, tokens/s", _f(live.get("plain_tokens_per_s"), 1)],
                                          ["speculative, tokens/s", _f(live.get("spec_tokens_per_s"), 1)],
                                          ["speedup", f"x{_f(live.get('speedup'), 2)}"],
                                          ["greedy outputs identical", f"{live.get('greedy_identical')}/{live['num_prompts']}"]],
                          "---|---:"), ""]
    lines += _setup(results)
    c = results["compute"]
    lines += ["## Compute", "", f"{format_duration(c['wall_s'])} wall, {c['cpu_s'] / 3600:.2f} CPU-hours "
              f"(torch threads per stage: {', '.join(map(str, c['threads'])) or 'n/a'}; mean 1-minute load average "
              f"{_f(c.get('load_average_mean'), 1)}):", ""]
    lines += _table(["stage kind", "stages", "wall", "CPU"],
                    [[k, str(v["stages"]), format_duration(v["wall_s"]), format_duration(v["cpu_s"])]
                     for k, v in sorted(c["by_kind"].items(), key=lambda kv: -kv[1]["wall_s"])])
    study_arg = shlex.quote(study_file) if study_file else "STUDY.toml"
    lines += ["", "## Reproduce", "", "```bash",
              f"osprey study run {study_arg} --out STUDY_FOLDER   # resumable: rerun after any interruption",
              f"osprey study status {study_arg} --out STUDY_FOLDER",
              f"osprey study report {study_arg} --out STUDY_FOLDER", "```", ""]
    if notes:
        lines += [notes.rstrip(), ""]
    return "\n".join(lines)


def _generated(store: dict) -> str:
    if store.get("resumed"):
        return "built across an interruption, so the generated count covers only the last run and is omitted"
    return f"{store.get('generated_tokens', '?')} generated by the target"


def _setup(results: dict) -> list[str]:
    s = results["settings"]
    st, ds, pt = s["stores"], s["distill"], s["pretrain"]
    source = results['source'] if results['source'] != 'target' else results['target']
    # a study without an Osprey arm prunes nothing: its settings have no [prune] table
    pruned = f"; Osprey source: `{source}`, pruned to {s['prune']['layers']} blocks" if "prune" in s else \
        " (no arm prunes a source model)"
    lines = ["## Setup", "", f"- Target: `{results['target']}`{pruned}."]
    for d in results["domains"]:
        train = results["stores"].get(f"{d['name']}/train/regenerated", {})
        ev = results["stores"].get(f"{d['name']}/eval/regenerated", {})
        lines.append(f"- Domain `{d['name']}`: {train.get('samples', d['train_samples'])} training prompts "
                     f"({train.get('tokens_written', '?')} stored tokens, {_generated(train)}) from "
                     f"`{d['train_file']}`; {ev.get('samples', d['eval_samples'])} "
                     f"held-out prompts ({ev.get('tokens_written', '?')} tokens) from `{d['eval_file'] or d['train_file']}`.")
    lines += [f"- Stores: greedy responses of the target, at most {st['max_new_tokens']} new tokens, sequences cut "
              f"at {st['max_length']}, top-{st['topk']} log-probs, "
              f"{'only the final turn regenerated' if st['last_turn_only'] else 'every assistant turn regenerated'}.",
              f"- Distillation: {ds['steps']} steps x {ds['tokens_per_batch'] * ds['grad_accum']} slots, TTT K = "
              f"{ds['ttt_steps']} (decay {ds['ttt_decay']}), lr {ds['lr']:g} x the arm's scale, warmup "
              f"{ds['warmup_ratio']:g}, cosine; draft vocabulary "
              f"{ds['draft_vocab'] or 'the architecture default (full for Osprey and DFlash, 32000 for EAGLE-3)'}.",
              _stage2_line(results, pt), ""]
    return lines


def _stage2_line(results: dict, pt: dict) -> str:
    """Stage 2 as it ran: the [pretrain] defaults of a study whose arms skip it describe nothing."""
    if results.get("stage2"):
        return (f"- Stage 2: {pt['steps']} steps x {pt['batch_size']} x {pt['seq_len']} tokens "
                f"({pt['steps'] * pt['batch_size'] * pt['seq_len']:,} tokens) on {', '.join(results['corpus'] or [])}, "
                f"lr {pt['lr']:g}.")
    if any(a.get("stage2", "none") != "none" for a in results.get("arms", [])):
        return "- Stage 2: not finished yet."
    return "- Stage 2: none (no arm of this study pretrains on generic text)."


def run(cfg: ReportConfig) -> ReportResult:
    """Collect the study folder's results and write the report files.

    A study of several ``[[targets]]`` gets one full report per target in ``<dir>/<target>/`` and,
    in ``<dir>``, a README with the claims side by side and a results.json holding every target's.
    """
    study = cfg.study
    folder = Path(cfg.report_dir or study.report.dir or Path(cfg.out) / "report")
    if not study.targets:
        return _write_report(study, cfg.out, folder, plan=None)
    plan = build_plan(study, lookup=lambda key: read_record(cfg.out, key))
    # the [report] notes speak of the whole study: the summary carries them, not each target's report
    per_target = {t.name: _write_report(study.for_target(t.name), cfg.out, folder / t.name, plan=plan.targets[t.name],
                                        with_notes=False) for t in study.targets}
    missing = [n.label for n in plan.nodes if n.pending or read_record(cfg.out, n) is None]
    results = {"format": "osprey-study-results", "format_version": 1,
               "progress": {"stages": len(plan.nodes), "done": len(plan.nodes) - len(missing), "missing": missing},
               "targets": {name: r.results for name, r in per_target.items()},
               "cross_target_claims": cross_target_claims({name: r.results for name, r in per_target.items()})}
    files = [write_json(folder / "results.json", results, default=str),
             write_text(folder / "README.md", render_targets_readme(study, per_target, results))]
    return ReportResult(dir=folder, files=files + [f for r in per_target.values() for f in r.files], results=results)


def render_targets_readme(study: StudyConfig, per_target: dict[str, ReportResult], results: dict) -> str:
    """The summary of a study of several targets: the headline figures per target, the pooled and
    transfer claims, each per-target claim's verdict side by side, and the links."""
    p = results["progress"]
    lines = [f"# Study {study.study.name}: {len(per_target)} targets, one source backbone", "",
             study.study.description.strip(), ""]
    if p["done"] < p["stages"]:
        lines += [f"**Partial results: {p['done']} of {p['stages']} stages finished.** Figures of unfinished "
                  "arms read n/a and the pooled claims are not measured until every target has them.", ""]
    else:
        lines += [f"All {p['stages']} stages finished.", ""]
    lines += [f"Source (pruned, Stage 2 once, converted for every target): `{study.source.model}`.", "",
              "| target | model | stages done | report |", "|---|---|---|---|"]
    for t in study.targets:
        res = per_target[t.name].results
        lines.append(f"| {_cell(t.name)} | `{_cell(t.model)}` | {res['progress']['done']}/{res['progress']['stages']} "
                     f"| [{t.name}/README.md]({t.name}/README.md) |")
    lines += ["", "## Headline, per target", ""]
    lines += _table(["target", "pruned from it", "Osprey mean AL", "EAGLE-3 mean AL", "ratio", "noise", "ID gain",
                     "OOD gain", "cells won", "Stage 2 effect", "best in-domain AL", "live speedup"],
                    [[_cell(x) for x in row] for row in per_target_rows({n: r.results for n, r in per_target.items()})],
                    "---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:")
    lines += ["", "Mean AL over the adapted x evaluated matrix, mean of the seeds; noise: the seed-noise figure of "
                  "the Osprey - EAGLE-3 difference; Stage 2 effect: Osprey minus Osprey without Stage 2 at one seed; "
                  "live speedup: `osprey eval live` of the target's best in-domain drafter.", "",
              "## Pooled over targets, and the transfer claim", ""]
    lines += _table(["claim", "paper", "ours", "noise", "verdict"],
                    [[_cell(c["claim"]), _cell(c["paper"]), _cell(c["ours"]), _cell(c["noise"]),
                      f"**{_cell(c['verdict'])}**"] for c in results["cross_target_claims"]],
                    "---|---|---|---:|---")
    claims: dict[str, dict[str, dict]] = {}
    for name, r in per_target.items():
        for c in r.results["claims"]:
            claims.setdefault(c["id"], {})[name] = c
    lines += ["", "## The paper's claims, per target", "",
              "| claim | paper | " + " | ".join(_cell(n) for n in per_target) + " |",
              "|---|---|" + "---|" * len(per_target)]
    for cid, by_target in claims.items():
        if not claim_applies(cid, study.report.roles):
            continue   # an arm it needs is not in this study
        first = next(iter(by_target.values()))
        row = [_cell(first["claim"]), _cell(first["paper"])]
        row += [_cell(f"{c['ours']} ({c['verdict']})") if (c := by_target.get(n)) else "-" for n in per_target]
        lines.append("| " + " | ".join(row) + " |")
    if study.report.notes:
        lines += ["", study.report.notes.read_text(encoding="utf-8").rstrip()]
    return "\n".join(lines) + "\n"


def study_argument(study: StudyConfig) -> str | None:
    """The STUDY argument that runs this study again: a shipped preset's name (it works from a clone
    and from a wheel alike), else the study file's path (relative to the current directory when
    it lies below it)."""
    if study.path is None:
        return None
    path = Path(study.path).absolute()
    if path.suffix == ".toml":
        try:
            if preset_path(path.stem).resolve() == path.resolve():
                return path.stem
        except ConfigError:
            pass
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _write_report(study: StudyConfig, out: Path, folder: Path, *, plan: Plan | None,
                  with_notes: bool = True) -> ReportResult:
    folder.mkdir(parents=True, exist_ok=True)
    results = collect(study, out, plan=plan)
    claims = check_claims(results)
    results["claims"] = claims
    results["plateau"] = plateau_rows(results)
    results["stage2_axis"] = stage2_axis(results)
    files = [write_json(folder / "results.json", results, default=str),
             write_text(folder / "matrix.md", render_matrix_md(results))]
    files += _heatmaps(results, folder)
    for plot, name in ((_plot_curves, "curves.png"), (_plot_stage2, "stage2.png")):
        path = plot(results, folder / name)
        if path is not None:
            files.append(path)
    if results["stage2_axis"] is not None:
        files.append(plot_axis(results["stage2_axis"], folder / "stage2-axis.png"))
    notes = study.report.notes.read_text(encoding="utf-8") if study.report.notes and with_notes else None
    files.append(write_text(folder / "README.md", render_readme(results, claims, notes, study_argument(study))))
    return ReportResult(dir=folder, files=files, results=results)
