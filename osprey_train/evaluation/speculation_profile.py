"""``speculation_profile.json``: how good a drafter is, per draft position, in a file serving tools read.

The layout is Model-Optimizer's (``schema_version`` "1.0", which its exporter places beside each
draft checkpoint and its ``specdec_bench`` measures; NVIDIA Dynamo's mocker and vLLM's synthetic
acceptance sampler consume it). Its fields, as that format defines them:

- ``conditional_accept_rates[i]``: P(draft ``i + 1`` accepted | the drafts before it accepted);
- ``marginal_accept_rates[i]``: P(the first ``i + 1`` drafts all accepted), a survival function of
  the per-round acceptance length, so ``mean_accept_length = 1 + sum(marginal_accept_rates)``
  (checked under ``validation``);
- ``mean_accept_length``: tokens per verify round (the bonus token counted), the per-round mean;
  ``acceptance_length_histogram``: rounds by tokens yielded;
- ``num_speculative_tokens``, ``block_size`` and ``max_supported_k`` (a block drafter cannot draft
  past its block), ``verification_method`` (``longest_prefix``), ``accept_length_model``
  (``chain_analytic``: a chain's K-draft round is a prefix of its K+1 one, so the vector
  extrapolates to shorter K; ``measured_per_k`` for a block drafter, which re-plans the block);
- ``method``, ``draft_checkpoint``, ``target_model``, ``per_category``, ``measurement_conditions``.

Ours adds ``osprey``: the store's content digest and URL, the target's identity (config and
tokenizer hashes), the per-domain figures, our truncation-aware per-position rates (a sample's
last round may compare fewer drafts than K; they are judged only where compared) and, when the
store was sampled at a temperature, the expected acceptance of speculative sampling at it.
Offline figures are simulated on the store's own responses (``osprey eval acceptance``), which
for greedy decoding are exactly what an engine serving the same target accepts (docs/evaluation.md).

Schema: ``schemas/speculation-profile.v1.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from osprey_data.atomic import write_json
from osprey_data.digest import file_sha256
from osprey_data.errors import ConfigError
from osprey_data.schema_check import load_json, validate
from osprey_train.drafters.registry import drafter_spec

if TYPE_CHECKING:   # acceptance writes profiles: a runtime import back would be a cycle
    from osprey_train.evaluation.acceptance import AcceptanceReport

__all__ = ["PROFILE_FILE", "SCHEMA", "build_profile", "write_profile", "check_profile"]

PROFILE_FILE = "speculation_profile.json"
SCHEMA = "speculation-profile.v1.json"
SCHEMA_VERSION = "1.0"
WEIGHTS = "model.safetensors"
CONSISTENCY_TOLERANCE = 1e-6
"""Both sides of ``mean = 1 + sum(marginals)`` come from the same histogram: they agree to rounding."""


def _survival(histogram: dict[str, int], steps: int) -> list[float]:
    """P(a round yields at least ``i + 2`` tokens) for ``i = 0 .. steps - 1``."""
    rounds = sum(histogram.values())
    if rounds == 0:
        return [0.0] * steps
    return [sum(n for length, n in histogram.items() if int(length) >= i + 2) / rounds for i in range(steps)]


def _conditionals(marginal: list[float]) -> list[float]:
    out, before = [], 1.0
    for m in marginal:
        out.append(m / before if before > 0 else 0.0)
        before = m
    return out


def _rounded(values: list[float]) -> list[float]:
    return [round(float(v), 6) for v in values]


def build_profile(greedy: AcceptanceReport, *, drafter: Any, drafter_path: str | Path, reader: Any,
                  sampled: AcceptanceReport | None = None, conditions: dict[str, Any] | None = None) -> dict:
    """The profile document of one drafter on one store (``greedy``: its chain acceptance report)."""
    assert greedy.length_histogram is not None and greedy.sampled is None and greedy.tree is None, \
        "a greedy chain report is needed"
    cfg = drafter.config
    spec = drafter_spec(cfg.arch)
    steps = greedy.steps
    marginal = _survival(greedy.length_histogram, steps)
    mean = greedy.overall
    block = cfg.arch_options.get("block_size") if not spec.tree_drafting else None
    manifest = reader.manifest
    target = manifest.header.target   # the model whose responses and features were measured against
    implied = 1.0 + sum(marginal)
    violations = [i for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-12]
    doc = {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "method": spec.vllm_method or cfg.arch,
        "draft_checkpoint": {"path": str(drafter_path), "arch": cfg.arch, "num_layers": cfg.num_layers},
        "target_model": {"name_or_path": target.name_or_path, "model_type": target.model_type},
        "num_speculative_tokens": steps,
        "block_size": block,
        "max_supported_k": (int(block) - 1) if block is not None else steps,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": _rounded(_conditionals(marginal)),
        "marginal_accept_rates": _rounded(marginal),
        "mean_accept_length": round(mean, 6),
        "mean_accept_length_per_request": None,
        "accept_length_model": "chain_analytic" if spec.tree_drafting else "measured_per_k",
        "accept_length_by_k": {str(steps): round(mean, 6)},
        "acceptance_length_histogram": dict(greedy.length_histogram),
        "per_category": {d: {"mean_accept_length": round(v, 6), "samples": greedy.per_domain_samples.get(d, 0)}
                         for d, v in greedy.per_domain.items()},
        "measurement_conditions": {"engine": "osprey offline simulation (osprey eval acceptance)",
                                   "temperature": 0.0, "num_samples": greedy.num_samples,
                                   "verify_rounds": greedy.num_verify_steps, **(conditions or {})},
        "validation": {
            "mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                 "reported_mean_accept_length": round(mean, 6),
                                 "abs_delta": round(abs(implied - mean), 6), "tolerance": CONSISTENCY_TOLERANCE,
                                 "passed": abs(implied - mean) <= CONSISTENCY_TOLERANCE},
            "marginal_monotonicity": {"passed": not violations, "violations": violations},
        },
        "osprey": {
            "drafter_weights_sha256": file_sha256(Path(drafter_path) / WEIGHTS),
            "store": {"url": greedy.store, "digest": manifest.digest(), "num_samples": manifest.num_samples,
                      "num_tokens": manifest.num_tokens, "generation": dict(manifest.header.generation)},
            "target": target.to_dict(),
            "per_position_judged": _rounded(greedy.per_position),
            "greedy_consistency": greedy.greedy_consistency,
            "proxy": greedy.proxy_reason,
            "sampled": None if sampled is None else {
                "temperature": sampled.sampled["temperature"],
                "mean_accept_length": round(sampled.overall, 6),
                "conditional_accept_rates": _rounded(sampled.per_position),
                "per_category": {d: round(v, 6) for d, v in sampled.per_domain.items()},
                "proxy": sampled.proxy_reason,
            },
        },
    }
    validate(doc, SCHEMA, where=PROFILE_FILE)
    return doc


def write_profile(path: str | Path, doc: dict) -> Path:
    """Write ``doc`` to ``path`` atomically (a half-written profile never appears)."""
    path = Path(path)
    write_json(path, doc)
    return path


def check_profile(drafter_dir: str | Path) -> Path | None:
    """The drafter folder's profile when it describes these weights (None when it has none).

    A profile measured on other weights (the folder was trained further, or the file copied from
    another drafter) is refused rather than exported: serving tools would plan with wrong rates."""
    path = Path(drafter_dir) / PROFILE_FILE
    if not path.is_file():
        return None
    doc = load_json(path, SCHEMA, what="speculation profile")
    measured_on = doc["osprey"].get("drafter_weights_sha256")
    if measured_on != file_sha256(Path(drafter_dir) / WEIGHTS):
        raise ConfigError(f"{path}: measured on other weights than {Path(drafter_dir) / WEIGHTS} (sha256 "
                          f"{str(measured_on)[:12]}...); measure it again (osprey eval acceptance --drafter "
                          f"{drafter_dir} --store STORE --profile {path}) or delete it")
    return path
