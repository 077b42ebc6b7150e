"""Options of ``osprey demo``: one typed config, with a quick and a full preset.

Every size knob defaults to ``None`` = "take it from the preset" (``--quick`` or full), so the
command line only overrides what a user names. Target, source and prompts are options too: the
same command runs a bigger target on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from osprey_data.errors import ConfigError

__all__ = ["DemoConfig", "PRESETS", "DEFAULT_LR"]

# Measured on 2 shared CPU cores with SmolLM2-135M-Instruct; docs/demo.md ("What each choice bought")
# has the runs behind each value. In short: the quick preset's old 16 prompts x 24 tokens gave the
# drafter ~400 tokens to learn from (P(first draft accepted) ~0.06, live x0.99); 80 prompts x 48
# tokens, a 4096-token draft vocabulary (a draft step 0.12 -> 0.054 of a target step, a distillation
# step ~2.5x cheaper), lr 3e-3 and K = 1 (live rounds draft one token: K > 1 buys later positions
# that `--live-steps auto` does not use at this acceptance) lift it to ~0.13-0.16.
PRESETS: dict[str, dict[str, int]] = {
    "quick": dict(train_prompts=80, eval_prompts=5, max_new_tokens=48, prune_layers=2, distill_steps=200,
                  tokens_per_batch=256, ttt_steps=1, draft_steps=3, draft_vocab=4096),
    "full": dict(train_prompts=80, eval_prompts=20, max_new_tokens=96, prune_layers=2, distill_steps=300,
                 tokens_per_batch=512, ttt_steps=2, draft_steps=4, draft_vocab=4096),
}
DEFAULT_LR = 3e-3
"""Distillation learning rate of both presets (5e-4 before: 100 steps want a larger one; 1e-2 was worse)."""


@dataclass(kw_only=True)
class DemoConfig:
    """Options of one demo run (see docs/demo.md)."""

    out: Path = Path("osprey-demo")
    """Output folder: report.md, report.png, demo.json, and work/ with every stage's output."""
    quick: bool = False
    """Use the quick preset (<= 3 min on 2 CPU cores) instead of the full one (<= 15 min)."""
    target: str | None = None
    """Target model (HF folder, .gguf file or hub id); None = SmolLM2-135M-Instruct from PyPI."""
    gguf_file: str | None = None
    """GGUF file name inside ``target`` when it is a folder holding a GGUF."""
    source: str | None = None
    """Source LM to prune into the drafter backbone; None = the target itself."""
    prompts: str | None = None
    """Prompt file (builder input formats); None = the ~100 prompts shipped in the package."""
    device: str = "auto"
    """'cpu', 'cuda', 'cuda:N' or 'auto'."""
    cache: str | None = None
    """Model cache folder; None = $OSPREY_CACHE or ~/.cache/osprey."""
    train_prompts: int | None = None
    """Prompts for the training store (round-robin over domains)."""
    eval_prompts: int | None = None
    """Held-out prompts for offline and live evaluation (round-robin over domains)."""
    max_new_tokens: int | None = None
    """Response length cap for the stores and live decoding."""
    prune_layers: int | None = None
    """Decoder blocks kept from the source (Stage 1)."""
    distill_steps: int | None = None
    """Optimizer steps of TTT distillation (Stage 4)."""
    tokens_per_batch: int | None = None
    """Packed tokens per distillation batch."""
    ttt_steps: int | None = None
    """TTT unroll length K."""
    draft_steps: int | None = None
    """Draft steps S per verify step, offline and live."""
    draft_vocab: int | None = None
    """Draft vocabulary: the N target tokens most frequent in the training store (``osprey train
    convert --draft-vocab``); it makes a draft step and a distillation step cheaper. Capped at the
    target's vocabulary when that is smaller (a tiny test model)."""
    live_steps: int | str = "auto"
    """Draft length of the live run: 'auto' (chosen per round from measured costs and the running
    acceptance, S = 0 a plain step, as ``osprey eval live`` by default) or a fixed S (the offline S:
    then live and offline acceptance length are the same figure)."""
    lr: float = DEFAULT_LR
    """Distillation learning rate (short runs want a larger one than the library default)."""
    threads: int | None = None
    """torch CPU threads (None = torch's default; 1 is faster on a heavily shared machine)."""
    seed: int = 0
    """Seed of every random part."""
    progress: bool = True
    """Progress bars and stage messages."""
    sizes: dict[str, int] = field(init=False, default_factory=dict)
    """Resolved sizes: the preset with the explicit options applied."""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        preset = PRESETS["quick" if self.quick else "full"]
        for name, default in preset.items():
            value = getattr(self, name)
            if value is None:
                value = default
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"demo: {name.replace('_', '-')} must be a positive integer, got {value!r}")
            self.sizes[name] = value
        if isinstance(self.live_steps, str) and self.live_steps.strip().isdigit():
            self.live_steps = int(self.live_steps)
        if self.live_steps != "auto" and not (isinstance(self.live_steps, int) and self.live_steps >= 1):
            raise ConfigError(f"demo: --live-steps must be 'auto' or a positive integer, got {self.live_steps!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"demo: --threads must be >= 1, got {self.threads}")
        if self.lr <= 0:
            raise ConfigError(f"demo: --lr must be > 0, got {self.lr}")
        if self.prompts is not None and not Path(self.prompts).exists():
            raise ConfigError(f"demo: prompt file {self.prompts!r} does not exist")
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"demo: --out {self.out} exists and is not a folder")
