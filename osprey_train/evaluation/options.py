"""The configs of the evaluations (``osprey eval acceptance``, ``matrix``, ``live``), free of torch.

The command line generates its options from these classes (``osprey_cli.config_options``) and
builds and checks them without importing torch; the evaluation modules run them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from osprey_data.builder.config import DTYPES as PRECISIONS   # = target_model.PRECISIONS, free of torch
from osprey_data.conversation.template_options import check_template_kwargs, parse_template_kwargs, read_chat_template
from osprey_data.cpu_threads import check_threads
from osprey_data.errors import ConfigError
from osprey_data.target_model import check_device
from osprey_train.evaluation.cost_model import parse_cost
from osprey_train.evaluation.draft_length import AUTO, parse_steps, steps_option
from osprey_train.evaluation.tree_shape import TreeShape

__all__ = ["DraftingOptions", "AcceptanceConfig", "LiveConfig", "KV_MODES", "ATTENTION_IMPLS", "TAP_CODECS"]

KV_MODES = ("sglang", "ancestors")
"""Tree drafting: which earlier tree nodes a drafted node attends to (sglang = SGLang's draft KV layout,
as served; ancestors = an exact tree attention)."""
ATTENTION_IMPLS = ("sdpa", "eager", "flex")
"""Attention implementations that draft every position of a stored sample at once."""
TAP_CODECS = ("bf16", "fp8")
"""Store hidden codecs live taps can be rounded through."""


@dataclass(kw_only=True)
class DraftingOptions:
    """How drafts are proposed during an offline evaluation (shared by acceptance and matrix)."""

    steps: int = 5
    """Draft length S."""
    max_samples: int = 0
    """Samples to evaluate per store (0 = all)."""
    device: str = "auto"
    """Device of the drafter: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``."""
    threads: int | None = None
    """torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores)."""
    attention: str = field(default="sdpa", metadata={"choices": ATTENTION_IMPLS})
    """TTT attention implementation used to draft all positions at once (sdpa, eager, flex)."""
    progress: bool = field(default=True, metadata={"cli": False})
    """Show progress bars."""
    temperature: float = 0.0
    """Serving temperature: 0 = greedy (exact walk); > 0 = expected acceptance of chain speculative
    sampling, from a store sampled from the target at this temperature (chain drafting only)."""
    allow_temperature_mismatch: bool = False
    """At temperature > 0, evaluate a store sampled otherwise (greedy, another temperature or top-p)
    instead of refusing it; the figures are then labelled proxies."""

    def check_drafting(self, command: str) -> None:
        """Raise :class:`ConfigError` (prefixed with ``command``) on a bad drafting option."""
        if self.steps < 1:
            raise ConfigError(f"{command}: --steps must be >= 1, got {self.steps}")
        if self.max_samples < 0:
            raise ConfigError(f"{command}: --max-samples must be >= 0, got {self.max_samples}")
        check_device(self.device, command)
        check_threads(self.threads, command)
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"{command}: --temperature must be a number >= 0, got {self.temperature}")
        if self.attention not in ATTENTION_IMPLS:
            raise ConfigError(f"{command}: --attention must be sdpa, eager or flex, got {self.attention!r}")


@dataclass(kw_only=True)
class AcceptanceConfig(DraftingOptions):
    """Options of ``osprey eval acceptance``."""

    drafter: Path
    """Drafter folder."""
    store: str
    """Eval store (responses generated greedily by the target for an exact figure; sampled from it
    at the serving temperature for ``temperature > 0``)."""
    profile: Path | None = None
    """Also write this speculation_profile.json (Model-Optimizer's fields, read by serving tools): greedy
    acceptance per draft position, and at the store's sampling temperature when it has one; the draft
    length, the target's identity and the store's digest. ``osprey export`` copies it into the export."""

    def __post_init__(self) -> None:
        self.drafter = Path(self.drafter)
        if self.profile is not None:
            self.profile = Path(self.profile)
            if not self.profile.parent.is_dir():   # refused before the simulation, not after it
                raise ConfigError(f"acceptance --profile {self.profile}: folder {self.profile.parent} does not "
                                  "exist; create it or name a file in an existing folder")
        self.check_drafting("acceptance")


@dataclass(kw_only=True)
class LiveConfig:
    """Options of one live speculative-decoding run."""

    drafter: str
    """Drafter folder (``save_drafter`` output: Osprey or EAGLE-3)."""
    target: str
    """Target: local HF folder, hub id (online only) or a ``.gguf`` file path."""
    inputs: tuple[str, ...] = field(metadata={"option": "input"})
    """Prompt files (JSONL/JSON/Parquet/datasets folder, builder input formats)."""
    gguf_file: str | None = None
    """GGUF file name inside ``target`` when the target is a folder holding a GGUF."""
    steps: int | str = field(default="auto", metadata={"parse": steps_option})
    """Draft steps S per verify step (chain drafting): a number, or 'auto' to choose S in 0..--max-steps
    every round from the step costs and the running acceptance per position (0 = a plain step), so
    that drafting happens only where it is expected to pay."""
    max_steps: int = 5
    """With --steps auto: the most drafts a round may have (the drafter's maximum)."""
    cost: str | None = None
    """With --steps auto: the step costs, a cost-model file (benchmarks/live_bench.py --cost-out), a preset
    or key=value pairs (as eval sweep --cost); default: measured on this target and drafter at the start."""
    tree: TreeShape | None = field(default=None, metadata={"cli": False})
    """Tree drafting with this SGLang shape instead of a chain (greedy only; ``steps`` is not used)."""
    draft_kv: str = field(default="sglang", metadata={"choices": KV_MODES})
    """Tree drafting: which earlier tree nodes a drafted node attends to ('sglang' or 'ancestors')."""
    temperature: float = 0.0
    """0 = greedy (lossless, exact); > 0 = sampling with rejection-sampling verification."""
    max_new_tokens: int = 64
    """Generated tokens per prompt at most (EOS stops earlier)."""
    limit: int | None = None
    """At most this many prompts, round-robin across domains (None = all)."""
    device: str = "auto"
    """'cpu', 'cuda', 'cuda:N' or 'auto'."""
    seed: int = 0
    """Seed of the sampling generator (temperature > 0)."""
    baseline: bool = field(default=True, metadata={
        "flag": "--no-baseline", "negate": True, "help": "Skip plain decoding (no tokens/s ratio, no lossless check)."})
    """Also decode every prompt with the target alone (tokens/s baseline, lossless check)."""
    tap_codec: str | None = field(default=None, metadata={"choices": TAP_CODECS})
    """Round live taps through a store hidden codec ('bf16'/'fp8') as training saw them; None = fp32."""
    allow_target_mismatch: bool = False
    """Run even if the drafter was built for a target with another config/tokenizer hash."""
    out: str | None = None
    """Optional JSON file to write the full report to (each prompt's generated text included)."""
    show_text: bool = False
    """Print each prompt's generated text (speculative decoding's output) after the report."""
    threads: int | None = None
    """torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores)."""
    precision: str = field(default="auto", metadata={"choices": PRECISIONS})
    """Target precision: 'float32', 'bfloat16' (prepacked bf16 linears on CPU), 'bf16-autocast' (float32
    weights, bf16 matmuls) or 'auto' (bfloat16 on CUDA or a CPU with AMX/AVX512-BF16, else float32)."""
    draft_precision: str | None = field(default=None, metadata={"choices": PRECISIONS})
    """The drafter's precision (same names); None = the target's."""
    chat_template: str | None = None
    """Jinja chat template file to render the prompts with instead of the target's own (as the
    store was built with ``osprey data build --chat-template``)."""
    chat_template_kwargs: dict = field(default_factory=dict, metadata={"parse": parse_template_kwargs})
    """Extra variables for the chat template, a JSON object (e.g. '{"enable_thinking": false}' for Qwen3)."""
    progress: bool = field(default=True, metadata={"cli": False})
    """Show a tqdm progress bar."""

    @property
    def auto_steps(self) -> bool:
        """Chain drafting with the draft length chosen every round (``--steps auto``)."""
        return self.tree is None and self.steps == AUTO

    @property
    def most_steps(self) -> int:
        """The most drafts a chain round can have: ``--max-steps`` with ``--steps auto``, else ``--steps``."""
        return self.max_steps if self.steps == AUTO else int(self.steps)

    def __post_init__(self) -> None:
        if isinstance(self.inputs, str):
            self.inputs = (self.inputs,)
        self.inputs = tuple(str(p) for p in self.inputs)
        if not self.inputs:
            raise ConfigError("live: give at least one --input prompt file")
        try:
            self.steps = parse_steps(self.steps)
        except ConfigError as exc:
            raise ConfigError(f"live: {exc}") from None
        if self.max_steps < 1:
            raise ConfigError(f"live: --max-steps must be >= 1, got {self.max_steps}")
        if self.cost is not None:
            if self.steps != AUTO:
                raise ConfigError("live: --cost is for --steps auto (a fixed --steps N drafts N every round)")
            parse_cost(self.cost)   # a bad file or value fails before any model loads
        if self.temperature < 0:
            raise ConfigError(f"live: --temperature must be >= 0, got {self.temperature}")
        if self.tree is not None and self.temperature > 0:
            raise ConfigError("live: --tree drafting verifies greedily; use --temperature 0 (sampling needs chain "
                              "drafting)")
        if self.draft_kv not in KV_MODES:
            raise ConfigError(f"live: --draft-kv must be one of {KV_MODES}, got {self.draft_kv!r}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"live: --max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"live: --limit must be >= 1, got {self.limit}")
        check_device(self.device, "live")
        check_threads(self.threads, "live")
        self.chat_template_kwargs = check_template_kwargs(self.chat_template_kwargs)
        if self.chat_template is not None:
            read_chat_template(self.chat_template)
        for name in ("precision", "draft_precision"):
            value = getattr(self, name)
            if value is not None and value not in PRECISIONS:
                raise ConfigError(f"live: --{name.replace('_', '-')} must be one of {PRECISIONS}, got {value!r}")
        if self.tap_codec is not None and self.tap_codec not in TAP_CODECS:
            raise ConfigError(f"live: --tap-codec must be 'bf16' or 'fp8', got {self.tap_codec!r}")
        if not Path(self.drafter).is_dir():
            raise ConfigError(f"live: drafter folder {self.drafter!r} does not exist")
        for path in self.inputs:
            if not Path(path).exists():
                raise ConfigError(f"live: --input {path!r} does not exist")
