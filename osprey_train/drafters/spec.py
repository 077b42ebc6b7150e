"""What an architecture tells the rest of Osprey: one :class:`DrafterSpec`.

A spec is plain data and torch-free callables (option checks, export refusals, serving texts),
plus the places of its code as ``"module:attribute"`` references imported on first use
(:meth:`DrafterSpec.load`): the ``nn.Module`` class, the convert entry, the training objective,
the offline drafts, the live session, the engine writers and readers. Each architecture keeps that
code in its own folder, ``osprey_train/drafters/<name>/``, whose ``arch.py`` holds the spec
(:mod:`osprey_train.drafters.registry` finds the folders). The hooks that an autoregressive chain
drafter shares (EAGLE-3's Training-Time Test, chain drafts, the chain live session) are the
defaults; a drafter that drafts otherwise (a block drafter) names its own.

Why references and not imports: the table sits at the bottom of the import graph. The CLI reads
it for the ``--arch`` choices (and ``osprey --help`` must not import torch), ``DrafterConfig``
checks its ``arch`` against it, and the model classes need ``DrafterConfig``: importing the
classes from here would be an import circle. The registry contract test
(tests/train/drafters/test_registry.py) loads every reference of every registered architecture,
so a wrong one fails there, by name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from osprey_data.errors import ConfigError, ModelError

__all__ = ["DrafterSpec", "no_check", "hf_only", "no_sglang_fields", "no_arch_options", "load_reference", "CHAIN_OBJECTIVE",
           "CHAIN_DRAFTS", "CHAIN_SESSION"]


CHAIN_OBJECTIVE = "osprey_train.stages.distill:DistillModel.from_config"
"""EAGLE-3's Training-Time Test: K teacher-forced draft steps fed back the drafter's own hidden states."""
CHAIN_DRAFTS = "osprey_train.evaluation.chain_draft:draft_all_positions"
"""Chain drafts at every position of a stored sample."""
CHAIN_SESSION = "osprey_train.evaluation.live_drafter:DrafterSession"
"""The chain drafter's live session."""


def no_check(config: Any) -> None:
    """A check hook that accepts everything."""


def no_arch_options(config: Any) -> None:
    """A check hook for an architecture that has no settings of its own: ``arch_options`` must be empty."""
    if config.arch_options:
        raise ConfigError(f"drafter config: the {config.arch!r} drafter has no arch_options; got "
                          f"{sorted(config.arch_options)}")


def hf_only(config: Any, fmt: str) -> None:
    """The default export hook: Osprey's own ``hf`` format only (no engine class is known to serve the arch)."""
    if fmt != "hf":
        raise ConfigError(f"export --format {fmt}: no {fmt} model class serves the {config.arch!r} drafter; "
                          "use --format hf")


def no_sglang_fields(config: Any) -> dict[str, Any]:
    """No architecture-specific keys in the SGLang config.json."""
    return {}


def load_reference(reference: str, *, what: str) -> Any:
    """The object named by ``"package.module:attribute"``; a ModelError naming ``what`` if it is not there."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not attr:
        raise ModelError(f"{what}: {reference!r} is not a 'module:attribute' reference")
    found: Any = importlib.import_module(module_name)
    for part in attr.split("."):   # "Class.method" names a classmethod
        found = getattr(found, part, None)
        if found is None:
            raise ModelError(f"{what}: module {module_name} has no attribute {attr!r}")
    return found


@dataclass(frozen=True, kw_only=True)
class DrafterSpec:
    """One drafter architecture: what the CLI, configs, convert, export and the study ask about it."""

    name: str
    """The ``arch`` value in config.json and the ``--arch`` / study ``arch`` choice."""
    summary: str
    """One line: what the architecture is (``--arch`` help, docs)."""
    listing_order: int = 100
    """Place in the registry (``--arch`` choices, tables); the lowest is the default ``--arch``."""
    model_class: str
    """``"module:attribute"`` of its :class:`~osprey_train.models.base.Drafter` subclass (``arch`` = ``name``)."""
    convert: str
    """``"module:attribute"`` of its ``osprey train convert`` entry: ``ConvertConfig -> ConvertResult``."""
    needs_backbone: bool
    """Convert starts from a pre-trained backbone (``--backbone``; the study prunes and pre-trains one and
    applies the arm's ``stage2``). False: the drafter is shaped from the target and its depth is
    ``--eagle3-layers`` (the study arm's ``layers``)."""
    accepts_backbone: bool = False
    """Without needing one, convert may also start from a pre-trained backbone (``--backbone``; a study arm
    says ``backbone = true``): dflash takes the backbone's layers, embedding and head in place of random
    layers and the target's embedding and head."""
    reduced_draft_vocab: bool = True
    """``--draft-vocab N`` applies (a study passes its ``[distill] draft_vocab`` to this arch's convert)."""
    default_draft_vocab: int | None = None
    """Draft vocabulary size when ``--draft-vocab`` is not given; None: the full target vocabulary."""
    study_layer_cost: float = 0.5
    """Relative distillation cost of one decoder layer, for the study's work estimates."""
    tiny: Mapping[str, Any] = field(default_factory=dict)
    """DrafterConfig overrides of the ``tiny`` preset that give a tiny drafter of this arch (tests)."""
    arch_option_keys: tuple[str, ...] = ()
    """The ``arch_options`` keys that ``osprey train convert --arch-option KEY=VALUE`` may set (none: the
    option is refused for this arch)."""
    check_config: Callable[[Any], None] = no_check
    """Arch rules of a DrafterConfig (raise ConfigError), run by ``DrafterConfig.__post_init__``."""
    check_convert: Callable[[Any], None] = no_check
    """Arch rules of a ConvertConfig (which of --backbone/--target/--store it needs); raise ConfigError."""
    check_export: Callable[[Any, str], None] = hf_only
    """``(DrafterConfig, format)``: raise ConfigError when ``osprey export --format`` cannot serve it. The
    ``sglang`` writer also needs ``sglang_architecture``, the ``vllm`` one ``vllm_writer``."""
    vllm_writer: str | None = None
    """``"module:attribute"`` of its ``--format vllm`` writer (``osprey_train.export.vllm``)."""
    sglang_architecture: str | None = None
    """``architectures[0]`` of its SGLang export: the model class SGLang runs it with."""
    sglang_fields: Callable[[Any], dict[str, Any]] = no_sglang_fields
    """Arch-specific keys of the SGLang config.json (after ``architectures`` and ``draft_vocab_size``)."""
    sglang_reader: str | None = None
    """``"module:attribute"`` of ``(config.json document, its path) -> DrafterConfig`` reading that export back."""
    serving_label: str = ""
    """README wording of the SGLang model class that serves it."""
    serving_env: Mapping[str, str] = field(default_factory=dict)
    """Environment SGLang needs to find its model class (serving.json ``env``)."""
    serving_install: str = ""
    """README install line before the launch command ('' when SGLang's stock class serves it)."""

    objective: str = CHAIN_OBJECTIVE
    """``"module:attribute"`` of ``(drafter, DistillConfig, target_head) -> nn.Module`` whose
    ``forward(PackedBatch) -> (loss, metrics)`` is ``osprey train distill``'s training objective;
    it holds the drafter as ``.drafter`` (saved, evaluated) and reads ``.checkpoint_steps`` (set
    True for gradient checkpointing). Default: EAGLE-3's Training-Time Test unroll (:mod:`osprey_train.ttt.unroll`)."""
    offline_drafts: str = CHAIN_DRAFTS
    """``"module:attribute"`` of ``(drafter, token_ids_T, hidden_TLDt, steps, *, impl) -> drafts (T-1, S)``:
    row ``p - 1`` holds the ``steps`` drafts of the verify round that starts with ``x_0..x_p``
    committed (offline acceptance, greedy). Default: chain drafting along the drafter's own hidden states."""
    live_session: str = CHAIN_SESSION
    """``"module:attribute"`` of the class binding a drafter to one sequence in ``osprey eval live``
    (``(drafter, *, target_vocab_size, tap_codec)``, the ``DraftSession`` protocol of
    :mod:`osprey_train.evaluation.spec_decode`). Default: the chain session with its own KV cache."""
    tree_drafting: bool = True
    """Tree drafting (``--tree``, EAGLE's top-k tree) applies: it expands chain steps along the
    drafter's own hidden states, which a block drafter has no notion of."""
    sampled_acceptance: bool = True
    """The T > 0 acceptance estimator (:mod:`osprey_train.evaluation.sampled_acceptance`) applies: it
    replays the chain's draft distributions step by step."""
    vllm_method: str | None = "eagle3"
    """``speculative_config["method"]`` vLLM serves the ``--format vllm`` export with."""
    vllm_reader: str | None = None
    """``"module:attribute"`` of ``(config.json document, tensors, its path) -> (DrafterConfig, state) | None``
    reading a ``--format vllm`` export back (None: the document is another layout)."""
    sglang_algorithm: str | None = "EAGLE3"
    """``--speculative-algorithm`` SGLang serves the ``--format sglang`` export with."""
    sglang_writer: str | None = None
    """``"module:attribute"`` of an arch's own ``--format sglang`` writer (``(model, out, *, dtype,
    source_dir, overwrite, serving) -> Path``), for a layout that is not the Llama-layer one of
    :mod:`osprey_train.export.sglang` (dflash: SGLang's own ``DFlashDraftModel``)."""
    sglang_loader: str | None = None
    """``"module:attribute"`` of ``(export folder) -> Drafter`` reading that own layout back (with ``sglang_writer``)."""

    def load(self, hook: str) -> Any:
        """The object behind the reference field ``hook`` ('model_class', 'convert', 'objective',
        'offline_drafts', 'live_session', 'sglang_reader', 'sglang_writer', 'sglang_loader', 'vllm_writer'
        or 'vllm_reader')."""
        reference = getattr(self, hook)
        if reference is None:
            raise ModelError(f"drafter arch {self.name!r} has no {hook}")
        return load_reference(reference, what=f"drafter arch {self.name!r} {hook}")
