"""How long the rest of a study should take: the ETA of ``study run``, ``study status`` and the demo.

Each stage has a cost in work units (``plan.Node.cost``: samples x new tokens for a build, steps x
slots x K for a distillation, ...). The seconds per unit come, in this order of preference, from:

1. **this run's finished stages of the same kind** (wall seconds / units; resumed stages, whose
   wall covers only part of their work, are left out);
2. for a kind not measured yet, its **a-priori rate scaled by this machine's measured speed**: the
   measured stages of the other compute kinds took ``factor`` times what the a-priori rates
   predicted, so this one probably will too (the model fetch and the prompt split are not compute
   and do not set the factor: a cached model "runs" in no time);
3. with nothing measured yet, the **a-priori rates** alone, said to be rough, with what they were
   measured on and this machine's load (a busy machine takes several times longer).

A stage interrupted and resumed counts only its remaining work (its last checkpoint's step).

Two sets of a-priori rates (:data:`A_PRIORI`), each measured on a real run, because one rate per
kind cannot cover both: a study's rates were measured on the shipped ``smollm2-cpu`` study
(docs/results/smollm2-cpu: SmolLM2-135M target, 4096-token draft vocabulary, builds in batches of
48, 2 CPU cores, one or two torch threads, mean load 1.9; 2 h 57 min in all; the rates they replace,
from a machine at load ~4, predicted 8 h 09 min for it). The demo's on the quick and the full demo (docs/demo.md:
4096-token draft vocabulary, builds in batches of 32, one torch thread per core, load ~1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from osprey_data.cpu_threads import machine_load

__all__ = ["A_PRIORI", "A_PRIORI_RATES", "A_PRIORI_BASIS", "DEMO_RATES", "COMPUTE_KINDS", "Estimate", "StageTiming", "estimate",
           "format_duration", "machine_load", "work_fraction", "study_estimate"]

# Seconds per work unit of each kind: the shipped smollm2-cpu run's wall per kind / its units
# (distill 5,340 s / 16,036 units, store 2,716 s / 113,664, pretrain 1,663 s / 983, eval 724 s /
# 2,610, live 117 s / 96, convert 39 s / 21; corpus, prune, prompts ran in ~0 s there).
A_PRIORI_RATES: dict[str, float] = {"model": 5.0, "prompts": 0.5, "store": 0.024, "prune": 1.0, "corpus": 0.5,
                                    "pretrain": 1.7, "convert": 1.9, "distill": 0.33, "eval": 0.28, "live": 1.2}
A_PRIORI_BASIS = ("rates of the shipped smollm2-cpu study (SmolLM2-135M on 2 CPU cores, 1-2 threads, load ~1.9; "
                  "docs/results/smollm2-cpu)")
# The demo's stage times with the presets of issue 46 (docs/demo.md; full demo: stores 117 s / 9,600
# units, distill 204 s / 614, offline acceptance 9 s / 32, live 323 s / 192; quick demo: stores 68 s /
# 4,080, distill 56 s / 102, offline acceptance 3 s / 6, live 51 s / 24; the model fetch 25 s on an
# empty cache).
DEMO_RATES: dict[str, float] = {**A_PRIORI_RATES, "model": 25.0, "store": 0.014, "distill": 0.4, "eval": 0.35,
                                "live": 1.75, "prune": 0.6, "convert": 4.0}
DEMO_BASIS = "stage times of the quick and full demo (SmolLM2-135M on 2 CPU cores, load ~1; docs/demo.md)"
A_PRIORI: dict[str, tuple[dict[str, float], str]] = {"study": (A_PRIORI_RATES, A_PRIORI_BASIS),
                                                     "demo": (DEMO_RATES, DEMO_BASIS)}
"""Name -> (a-priori seconds per unit of each kind, what they were measured on)."""
COMPUTE_KINDS = frozenset({"store", "prune", "corpus", "pretrain", "convert", "distill", "eval", "live"})
"""Kinds whose measured speed says how fast this machine is (not a download or a file split)."""
_LOAD_THEN = 1.9   # the mean 1-minute load average the a-priori rates were measured at


def format_duration(seconds: float | None) -> str:
    """``3h05m``, ``4m10s``, ``12s`` (``?`` for None)."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


@dataclass(frozen=True)
class StageTiming:
    """A finished stage as the estimate sees it."""

    kind: str
    cost: float
    wall_s: float
    load: float | None = None
    """Mean 1-minute load average while it ran (None: unknown)."""


@dataclass(frozen=True)
class Estimate:
    """Seconds left, and what the figure rests on."""

    seconds: float
    measured: bool
    """True when every kind left has a rate measured in this run (no a-priori rate in the figure)."""
    basis: str
    """A few words: from this run's stages, scaled from them, or a rough a-priori estimate (and why)."""
    source: str = "measured"
    """'measured', 'scaled' (some kinds at a-priori rates x this machine's speed) or 'a-priori'."""

    def label(self) -> str:
        """``3h05m``, or ``~3h05m`` when any part of it is not this run's own measurement."""
        return ("" if self.measured else "~") + format_duration(self.seconds)


def estimate(todo: list[tuple[str, float, float]], finished: list[StageTiming], *,
             load: float | None = None, cores: int = 1, a_priori: str = "study") -> Estimate:
    """Seconds for the stages in ``todo`` (``(kind, cost, fraction already done)``), from the
    ``finished`` stages of this run (see the module docstring for the order of preference), with
    the a-priori rates ``A_PRIORI[a_priori]``."""
    prior, prior_basis = A_PRIORI[a_priori]
    wall: dict[str, float] = {}
    units: dict[str, float] = {}
    for t in finished:
        if t.cost > 0 and t.wall_s >= 0:
            wall[t.kind] = wall.get(t.kind, 0.0) + t.wall_s
            units[t.kind] = units.get(t.kind, 0.0) + t.cost
    rates = {k: wall[k] / units[k] for k in wall}
    compute = [k for k in rates if k in COMPUTE_KINDS and prior.get(k)]
    predicted = sum(units[k] * prior[k] for k in compute)
    factor = sum(wall[k] for k in compute) / predicted if compute and predicted > 0 else None
    seconds = 0.0
    scaled, guessed = set(), set()
    for kind, cost, done in todo:
        if kind in rates:
            rate = rates[kind]
        elif factor is not None:
            rate = prior.get(kind, 1.0) * factor
            scaled.add(kind)
        else:
            rate = prior.get(kind, 1.0)
            guessed.add(kind)
        seconds += cost * rate * max(0.0, 1.0 - done)
    busy = load is not None and load > cores
    now = "" if load is None else f"; load now {load:.1f} on {cores} cores"
    if guessed:
        basis = (f"rough a-priori estimate: no compute stage measured in this run yet, so {prior_basis}{now}"
                 + (": this machine is busy, expect up to several times longer" if busy else "")
                 + "; it is replaced by measured rates as stages finish")
    elif scaled:
        basis = (f"from this run's {', '.join(sorted(rates))} stages; {', '.join(sorted(scaled))} not measured "
                 f"yet: a-priori rates x{factor:.2f}, this machine's speed on the measured stages")
    else:
        basis = "from this run's finished stages"
    then = [t.load for t in finished if t.load is not None and t.kind in COMPUTE_KINDS]
    if not guessed and then and load is not None:
        mean = sum(then) / len(then)
        if load > max(cores, 1.5 * mean):   # busier now than while the rates were measured
            basis += (f" (measured at load ~{mean:.1f}; load now {load:.1f} on {cores} cores: expect it to take "
                      "longer)")
    source = "a-priori" if guessed else "scaled" if scaled else "measured"
    return Estimate(seconds=seconds, measured=source == "measured", basis=basis, source=source)


def work_fraction(folder: Path, node: Any) -> float:
    """How much of ``node``'s work its work folder already holds (0 for a fresh stage): a training
    stage's last checkpoint step over its steps; other kinds start again, so 0."""
    steps = getattr(node.settings, "steps", None)
    if node.kind not in ("pretrain", "distill") or not steps:
        return 0.0
    best = 0
    for p in (Path(folder) / "run" / "checkpoints").glob("step-*"):
        try:
            best = max(best, int(p.name.split("-")[1]))
        except ValueError:
            continue
    return min(1.0, best / steps)


def study_estimate(out: Path, plan: Any, todo: list[Any], read_record: Callable[[Path, Any], dict | None],
                   a_priori: str = "study") -> Estimate:
    """The estimate for the unfinished stages ``todo`` of ``plan`` in study folder ``out``."""
    finished = []
    for node in plan.nodes:
        if node.pending:
            continue
        record = read_record(out, node)
        if record and record.get("wall_s") and not record.get("resumed"):
            loads = [x for x in record.get("load_average") or [] if isinstance(x, (int, float))]
            finished.append(StageTiming(kind=node.kind, cost=node.cost, wall_s=float(record["wall_s"]),
                                        load=sum(loads) / len(loads) if loads else None))
    rows = [(n.kind, n.cost, 0.0 if n.pending else work_fraction(Path(out) / "work" / n.folder, n)) for n in todo]
    load, cores = machine_load()
    return estimate(rows, finished, load=load, cores=cores, a_priori=a_priori)
