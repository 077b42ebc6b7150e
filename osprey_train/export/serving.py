"""Recommended SGLang serving flags for an export: ``serving.json`` and a ``README.md`` next to the weights.

The recommendation is SGLang's ``--speculative-*`` flags (the arch's ``sglang_algorithm``: EAGLE3 for the chain drafters; num-steps,
eagle-topk, num-draft-tokens, the draft model path). It comes from the best shape of a sweep
(``osprey eval sweep --cost ...``, :mod:`osprey_train.evaluation.sweep`) when the user passes
``--sweep FILE``; otherwise it is the chain the Osprey paper evaluates (steps 5, topk 1,
num_draft_tokens 6), with a note saying it was not tuned.

``serving.json`` (schema ``schemas/serving.v1.json``)::

    {"format": "osprey-serving", "version": 1, "engine": "sglang", "arch": "osprey",
     "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/abs/export",
     "speculative_num_steps": 5, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 6,
     "tuned": false, "sweep": null, "predicted": null, "note": "...",
     "env": {"SGLANG_EXTERNAL_MODEL_PACKAGE": "osprey_train.drafters.osprey.sglang"}, "target": "/models/target",
     "launch": "python -m sglang.launch_server --model-path ... --speculative-algorithm EAGLE3 ...",
     "dtype": "bfloat16"}
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osprey_data.errors import ConfigError
from osprey_data.schema_check import validate
from osprey_data.text import printable
from osprey_train.drafters.registry import drafter_spec
from osprey_train.evaluation.sweep import load_sweep
from osprey_train.evaluation.tree_shape import TreeShape

__all__ = ["DEFAULT_SHAPE", "ServingRecommendation", "recommend", "serving_doc", "serving_readme", "SERVING_FORMAT"]

SERVING_FORMAT = "osprey-serving"
SCHEMA = "serving.v1.json"
DEFAULT_SHAPE = TreeShape.chain(5)
"""The Osprey paper's setting: a chain of 5 drafts (steps 5, topk 1, num_draft_tokens 6)."""


@dataclass(frozen=True)
class ServingRecommendation:
    """Which tree shape to serve and why."""

    shape: TreeShape
    tuned: bool
    """True when it is a sweep's best predicted shape."""
    note: str
    sweep: str | None = None
    """The sweep file it came from."""
    predicted: dict[str, Any] | None = None
    """The sweep's figures for it: acceptance_length, speedup, cost device."""

    @property
    def label(self) -> str:
        """How the flags were chosen, in a few words: never "tuned" for a shape predicted slower
        than plain decoding (then every shape of the sweep was)."""
        if not self.tuned:
            return "not tuned"
        speedup = (self.predicted or {}).get("speedup")
        if speedup is not None and speedup < 1:
            return (f"least slow shape of the sweep, predicted x{speedup:.3f}: every shape is predicted slower "
                    f"than plain decoding with these costs")
        return "tuned" if speedup is None else f"tuned, predicted x{speedup:.3f}"


def recommend(sweep: str | Path | None) -> ServingRecommendation:
    """The best shape of ``sweep`` (a ``sweep.json``), or the untuned chain default without one."""
    if sweep is None:
        return ServingRecommendation(
            shape=DEFAULT_SHAPE, tuned=False,
            note=("not tuned: the chain of the Osprey paper (steps 5, topk 1, num_draft_tokens 6). To tune it, run "
                  "`osprey eval sweep --drafter DRAFTER --store EVAL_STORE --cost COSTS` and export again with "
                  "--sweep osprey-sweep/sweep.json."))
    doc = load_sweep(sweep)
    best = doc["best"]
    if best is None:
        raise ConfigError(f"export --sweep {sweep}: the sweep has no best shape (it ran without a cost model); "
                          "run `osprey eval sweep ... --cost FILE|example-gpu|draft_step=...` first")
    try:
        shape = TreeShape(steps=best["steps"], topk=best["topk"], num_draft_tokens=best["num_draft_tokens"])
    except ConfigError as exc:   # a hand-edited or damaged file: name it
        raise ConfigError(f"export --sweep {sweep}: its best shape is not servable ({exc}); sweep again") from None
    cost = doc["cost_model"] or {}
    note = printable(f"tuned offline by `osprey eval sweep` ({doc['num_samples']} samples of {doc['store']}, draft KV "
                     f"layout {doc['draft_kv']}): best predicted speedup x{best['speedup']:.3f} with costs of "
                     f"{cost.get('device', '?')}")  # the sweep file's strings go into a README
    if best["speedup"] < 1:
        note += ("; every shape of the sweep is predicted SLOWER than plain decoding (speedup < 1), so with these "
                 "costs serving this drafter does not pay: distill it further or measure the costs on your GPU")
    if cost.get("assumed"):
        note += " (assumed costs, not measured: check the speedup on your GPU)"
    if doc["proxy"]:
        note += printable(f"; proxy acceptance figures: {doc['proxy_reason']}")
    return ServingRecommendation(shape=shape, tuned=True, note=note, sweep=str(sweep),
                                 predicted={"acceptance_length": best["acceptance_length"],
                                            "speedup": best["speedup"], "cost_device": cost.get("device")})


def serving_doc(rec: ServingRecommendation, *, export_dir: Path, arch: str, target: str | None,
                dtype: str, block_size: int | None = None) -> dict[str, Any]:
    """The ``serving.json`` document of an SGLang export at ``export_dir`` whose weights are ``dtype``.

    ``block_size``: a block drafter (SGLang's DFLASH), which verifies its whole trained block each
    round: ``--speculative-num-draft-tokens block_size``, one step, top-k 1 (SGLang forces both)."""
    draft_path = str(Path(export_dir).resolve())
    spec = drafter_spec(arch)
    env = dict(spec.serving_env)   # how SGLang finds the arch's model class
    if block_size is None:
        steps, topk, tokens, flags, note = (rec.shape.steps, rec.shape.topk, rec.shape.num_draft_tokens,
                                            rec.shape.sglang_flags(), rec.note)
    else:
        steps, topk, tokens = 1, 1, block_size
        flags = ["--speculative-num-draft-tokens", str(block_size)]
        note = (f"the trained block: the last committed token and {block_size - 1} drafts, verified together each "
                "round (SGLang's DFLASH runs on CUDA only)")
    args = ["python", "-m", "sglang.launch_server", "--model-path", target or "TARGET",
            "--speculative-algorithm", spec.sglang_algorithm, "--speculative-draft-model-path", draft_path, *flags]
    launch = " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in args])
    doc = {"format": SERVING_FORMAT, "version": 1, "engine": "sglang", "arch": arch,
           "speculative_algorithm": spec.sglang_algorithm, "speculative_draft_model_path": draft_path,
           "speculative_num_steps": steps, "speculative_eagle_topk": topk,
           "speculative_num_draft_tokens": tokens, "tuned": rec.tuned, "sweep": rec.sweep,
           "predicted": rec.predicted, "note": note, "env": env, "target": target, "launch": launch,
           "dtype": dtype}
    validate(doc, SCHEMA, where=str(Path(export_dir) / "serving.json"))
    return doc


def _label(doc: dict[str, Any]) -> str:
    predicted = doc.get("predicted")
    return ServingRecommendation(shape=DEFAULT_SHAPE, tuned=doc["tuned"], note="", predicted=predicted).label


def serving_readme(doc: dict[str, Any]) -> str:
    """The README snippet written next to the weights."""
    spec = drafter_spec(doc["arch"])
    install = f"{spec.serving_install}\n" if spec.serving_install else ""
    # the target name comes from the drafter's config.json: no control character may reach the
    # README (a forged line, a terminal escape) and no backtick may end its code span
    target = printable(doc["target"] or "TARGET").replace("`", "'")
    lines = [
        "# Serving this drafter with SGLang", "",
        f"Architecture: {spec.serving_label}; "
        f"target: `{target}`; weights: {doc.get('dtype', 'float32')}.", "",
        "```bash", f"{install}{printable(doc['launch'])}", "```", "",
        (f"Block: `--speculative-num-draft-tokens {doc['speculative_num_draft_tokens']}`."
         if doc["speculative_algorithm"] == "DFLASH" else
         f"Tree: `--speculative-num-steps {doc['speculative_num_steps']} --speculative-eagle-topk "
         f"{doc['speculative_eagle_topk']} --speculative-num-draft-tokens {doc['speculative_num_draft_tokens']}`"
         f" ({_label(doc)})."), "",
        f"{doc['note']}", "",
        "The same flags are in `serving.json`. Move this folder and `--speculative-draft-model-path` moves with it.",
    ]
    return "\n".join(lines) + "\n"
