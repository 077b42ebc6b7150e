"""Cost model of one speculative-decoding round, for predicting speedups from acceptance lengths.

All costs are relative to one plain decode step of the target (``plain_step``, normally 1.0), so a
model measured on one device can be written once and used for any sweep. On disk (JSON, schema
``schemas/cost-model.v1.json``; ``benchmarks/live_bench.py --cost-out FILE`` writes it from
measurements, users may write one by hand for a GPU)::

    {"format": "osprey-cost-model", "version": 1, "device": "H100 80GB, bf16",
     "drafter": "runs/distill/final", "target": "Llama-3.1-8B-Instruct",
     "plain_step": 1.0,
     "draft_step": 0.08,                      # one drafter step, width 1
     "draft_step_by_width": {"4": 0.09},      # optional: one tree depth of topk branches
     "verify": {"1": 1.0, "4": 1.02, "8": 1.05, "16": 1.1, "64": 1.45},   # or "verify_scale"
     "round_overhead": 0.05, "plain_step_seconds": 0.0071}

Predicted speedup of a tree shape ``(steps, topk, num_draft_tokens)`` with acceptance length AL
(tokens per round, SGLang's ``spec_accept_length``)::

    speedup = AL * plain_step / (draft(1) + (steps - 1) * draft(topk) + verify(num_draft_tokens) + round_overhead)

* ``draft(1)`` is the draft extend over the accepted tokens that opens every round; it also
  yields depth 1 of the tree. The ``steps - 1`` further depths each run the drafter once on the
  ``topk`` frontier nodes, batched, costing ``draft(topk)``: ``draft_step_by_width[topk]``
  (interpolated linearly between measured widths), or, when the file has no width map,
  ``draft_step`` itself, i.e. the assumption that a small batch costs what one row costs (true of
  a memory-bound GPU step, not of a CPU). For a chain this is ``steps * draft_step``.
* ``verify(n)`` is one target forward over ``n`` new tokens (the root and ``n - 1`` drafts) with
  the tree mask: the measured table, linearly interpolated between measured sizes; a size outside
  the measured range is refused (measure it). With ``verify_scale`` instead of a table,
  ``verify(n) = plain_step * (1 + verify_scale * (n - 1))``.
* Not modelled: the prefill (the same with and without a drafter), batching several requests,
  sampling, and the drafter's KV growth over a long sequence.

``--cost`` takes a file, the preset ``example-gpu`` (assumed GPU-like numbers, never a
measurement: it says so in every report), or inline ``draft_step=0.1,verify_scale=0.01,round_overhead=0.05``.

Legend: n tokens verified per round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osprey_data.atomic import write_json
from osprey_data.errors import ConfigError
from osprey_data.schema_check import load_json, validate
from osprey_train.evaluation.tree_shape import TreeShape

__all__ = ["CostModel", "COST_FORMAT", "COST_PRESETS", "parse_cost"]

COST_FORMAT = "osprey-cost-model"
SCHEMA = "cost-model.v1.json"


def _interpolate(table: dict[int, float], x: int, what: str, where: str) -> float:
    if x in table:
        return table[x]
    keys = sorted(table)
    if not keys or x < keys[0] or x > keys[-1]:
        raise ConfigError(f"cost model {where}: no {what} cost for {x} (measured: {keys}); extrapolation is "
                          f"refused, measure it or give a table that covers {x}")
    hi = next(k for k in keys if k > x)
    lo = max(k for k in keys if k < x)
    return table[lo] + (table[hi] - table[lo]) * (x - lo) / (hi - lo)


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Per-round costs relative to one plain target decode step (see the module docstring)."""

    device: str
    """Where the costs hold (free text: GPU, dtype, engine)."""
    draft_step: float
    """One drafter step at width 1, relative to ``plain_step``."""
    verify: dict[int, float] = field(default_factory=dict)
    """n -> one target forward over n new tokens (tree-masked), relative to ``plain_step``."""
    verify_scale: float | None = None
    """Instead of ``verify``: ``verify(n) = plain_step * (1 + verify_scale * (n - 1))``."""
    draft_step_by_width: dict[int, float] = field(default_factory=dict)
    """Optional topk -> one drafter step over topk branches; absent = ``draft_step`` for any width."""
    round_overhead: float = 0.0
    """Fixed cost per round (scheduling, tree building), relative to ``plain_step``; 0 if unknown."""
    plain_step: float = 1.0
    """The unit: one plain decode step of the target (1.0)."""
    plain_step_seconds: float | None = None
    """Seconds of one plain decode step where measured (information only)."""
    drafter: str = ""
    """Drafter the costs were measured with."""
    target: str = ""
    """Target the costs were measured with."""
    assumed: bool = False
    """True for presets and inline values: not a measurement (reports say so)."""
    source: str = ""
    """Where it came from (file, preset or inline text), quoted in errors and reports."""

    def __post_init__(self) -> None:
        where = self.source or self.device
        # NaN passes every comparison below (and JSON Schema's minimum): check finiteness first
        numbers = {"plain_step": self.plain_step, "draft_step": self.draft_step, "round_overhead": self.round_overhead,
                   "verify_scale": self.verify_scale, "plain_step_seconds": self.plain_step_seconds,
                   **{f"verify[{n}]": c for n, c in self.verify.items()},
                   **{f"draft_step_by_width[{n}]": c for n, c in self.draft_step_by_width.items()}}
        for name, value in numbers.items():
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"cost model {where}: {name} = {value} is not a finite number")
        if self.plain_step <= 0:
            raise ConfigError(f"cost model {where}: plain_step must be > 0, got {self.plain_step}")
        for name in ("draft_step", "round_overhead"):
            if getattr(self, name) < 0:
                raise ConfigError(f"cost model {where}: {name} must be >= 0, got {getattr(self, name)}")
        if not self.verify and self.verify_scale is None:
            raise ConfigError(f"cost model {where}: give a 'verify' table or a 'verify_scale'")
        if self.verify and self.verify_scale is not None:
            raise ConfigError(f"cost model {where}: give either a 'verify' table or a 'verify_scale', not both")
        if self.verify_scale is not None and self.verify_scale < 0:
            raise ConfigError(f"cost model {where}: verify_scale must be >= 0, got {self.verify_scale}")
        for what, table in (("verify", self.verify), ("draft_step_by_width", self.draft_step_by_width)):
            for n, cost in table.items():
                if n < 1 or cost <= 0:
                    raise ConfigError(f"cost model {where}: {what}[{n}] = {cost}; sizes must be >= 1 and "
                                      "costs > 0")

    # --- costs ------------------------------------------------------------------------------

    def verify_cost(self, n: int) -> float:
        """One target forward over ``n`` new tokens."""
        if self.verify_scale is not None:
            return self.plain_step * (1.0 + self.verify_scale * (n - 1))
        return _interpolate(self.verify, n, "verify", self.source or self.device)

    def draft_cost(self, width: int) -> float:
        """One drafter step over ``width`` branches."""
        if width == 1 or not self.draft_step_by_width:
            return self.draft_step
        return _interpolate({1: self.draft_step, **self.draft_step_by_width}, width, "draft_step_by_width",
                            self.source or self.device)

    def round_cost(self, shape: TreeShape) -> float:
        """Cost of one verify round of ``shape`` (drafting, verification, overhead)."""
        return (self.draft_cost(1) + (shape.steps - 1) * self.draft_cost(shape.topk)
                + self.verify_cost(shape.num_draft_tokens) + self.round_overhead)

    def speedup(self, acceptance_length: float, shape: TreeShape) -> float:
        """Predicted tokens/s of speculative decoding over plain decoding."""
        return acceptance_length * self.plain_step / self.round_cost(shape)

    def assumptions(self, shapes: list[TreeShape]) -> list[str]:
        """What the prediction assumes beyond the numbers given (printed with every report)."""
        notes = []
        if self.assumed:
            notes.append(f"costs from {self.source or 'a preset'} are given by hand or a preset, not measured")
        widths = sorted({s.topk for s in shapes if s.topk > 1 and s.steps > 1})
        if widths and not self.draft_step_by_width:
            notes.append(f"no draft_step_by_width: a drafter step over topk {widths} branches is assumed to cost "
                         "what one branch costs (a memory-bound GPU step)")
        return notes

    # --- (de)serialization ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"format": COST_FORMAT, "version": 1, "device": self.device, "drafter": self.drafter,
                               "target": self.target, "plain_step": self.plain_step, "draft_step": self.draft_step,
                               "round_overhead": self.round_overhead}
        if self.verify:
            doc["verify"] = {str(n): c for n, c in sorted(self.verify.items())}
        if self.verify_scale is not None:
            doc["verify_scale"] = self.verify_scale
        if self.draft_step_by_width:
            doc["draft_step_by_width"] = {str(n): c for n, c in sorted(self.draft_step_by_width.items())}
        if self.plain_step_seconds is not None:
            doc["plain_step_seconds"] = self.plain_step_seconds
        if self.assumed:
            doc["assumed"] = True
        return doc

    @classmethod
    def from_dict(cls, doc: Any, *, where: str) -> "CostModel":
        """Parse a cost-model document; :class:`~osprey_data.errors.SchemaError` / ``ConfigError`` name ``where``."""
        validate(doc, SCHEMA, where=where)

        def table(key: str) -> dict[int, float]:
            return {int(n): float(c) for n, c in (doc.get(key) or {}).items()}

        return cls(device=doc["device"], draft_step=float(doc["draft_step"]), verify=table("verify"),
                   verify_scale=None if doc.get("verify_scale") is None else float(doc["verify_scale"]),
                   draft_step_by_width=table("draft_step_by_width"),
                   round_overhead=float(doc.get("round_overhead", 0.0)), plain_step=float(doc.get("plain_step", 1.0)),
                   plain_step_seconds=doc.get("plain_step_seconds"), drafter=doc.get("drafter", ""),
                   target=doc.get("target", ""), assumed=bool(doc.get("assumed", False)), source=where)

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        """Read a cost-model file; errors name it (``InputError``, ``SchemaError``, ``ConfigError``)."""
        return cls.from_dict(load_json(path, SCHEMA, what="cost model"), where=str(path))

    def save(self, path: str | Path) -> Path:
        """Write atomically (validated against the schema first)."""
        doc = self.to_dict()
        validate(doc, SCHEMA, where=str(path))
        write_json(Path(path), doc)
        return Path(path)


COST_PRESETS: dict[str, dict[str, Any]] = {
    # Assumed GPU-like figures for a ~8B target with a one-layer drafter at batch size 1: a drafter
    # step ~1/10 of a target step, verification nearly flat in n (memory-bound), a fixed round cost.
    # Never a measurement; every report that uses it says so.
    "example-gpu": dict(device="example GPU (assumed costs, not measured)", draft_step=0.1, verify_scale=0.01,
                        round_overhead=0.1),
}

_INLINE_KEYS = ("draft_step", "verify_scale", "round_overhead")


def parse_cost(text: str, *, option: str = "--cost") -> CostModel:
    """``--cost``: a cost-model JSON file, a preset name, or ``key=value,...`` (keys :data:`_INLINE_KEYS`)."""
    text = str(text).strip()
    if text in COST_PRESETS:
        return CostModel(**COST_PRESETS[text], assumed=True, source=f"preset {text!r}")
    if "=" not in text:
        if not Path(text).is_file():
            raise ConfigError(f"{option} {text!r}: not a file, a preset ({sorted(COST_PRESETS)}) or "
                              f"key=value pairs ({', '.join(_INLINE_KEYS)})")
        return CostModel.load(text)
    values: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in _INLINE_KEYS:
            raise ConfigError(f"{option}: unknown key {key!r}; use {', '.join(_INLINE_KEYS)}")
        try:
            values[key] = float(value)
        except ValueError:
            raise ConfigError(f"{option}: {key}={value!r} is not a number") from None
    if "draft_step" not in values:
        raise ConfigError(f"{option}: inline costs need draft_step=... (relative to one target decode step)")
    values.setdefault("verify_scale", 0.0)
    return CostModel(device="given on the command line", assumed=True, source=f"{option} {text}", **values)
