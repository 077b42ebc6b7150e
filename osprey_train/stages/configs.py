"""The typed configs of Stages 2-4 (``pretrain``, ``convert``, ``distill``): values only, free of torch.

Each stage module (``stages/pretrain.py``, ``convert.py``, ``distill.py``) runs its config; the
classes live here, apart from the torch code, because the command line generates its options
from them (``osprey_cli.config_options``: flag, type, default and help come from each field and
its docstring) and a study reads its ``[pretrain]`` / ``[distill]`` tables into them, both
without importing torch. ``__post_init__`` checks values only; paths are checked when the
stage runs, so a study can check a table before the folders it names exist. Stage 1's
:class:`~osprey_train.stages.prune.PruneConfig` lives with its (torch-free) stage.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osprey_data.cpu_threads import check_threads
from osprey_data.errors import ConfigError
from osprey_data.target_model import TapLayers, parse_taps
from osprey_train.drafters.registry import arch_names, drafter_spec
from osprey_train.stages.defaults import distill_optim, pretrain_optim
from osprey_train.trainer.config import LoopConfig, OptimConfig, config_json

__all__ = ["PretrainConfig", "ConvertConfig", "DistillConfig", "TARGET_DISTS", "ATTENTION_IMPLS"]

TARGET_DISTS = ("tail", "renorm", "full")
"""Distillation target distributions (see ``osprey_train.ttt.loss``)."""
ATTENTION_IMPLS = ("auto", "flex", "sdpa", "eager")
"""TTT attention implementations (``osprey_train.ttt.attention``)."""


@dataclass(kw_only=True)
class PretrainConfig:
    """Options of ``osprey train pretrain``."""

    model: Path
    """HF causal-LM folder to train (Stage 1 output), with its tokenizer."""
    corpus: Path
    """Tokenized corpus folder (``osprey data tokenize-corpus``) made with the model's tokenizer."""
    loop: LoopConfig
    """The trainer's loop: run folder (``out_dir``: checkpoints/, metrics, final/ = the trained HF
    model), steps, gradient accumulation, logging, eval and save periods, seed, devices. Held-out
    perplexity is always also measured at step 0 (``PretrainResult.initial_ppl``)."""
    optim: OptimConfig = field(default_factory=pretrain_optim)
    """AdamW and schedule (the paper's pretraining recipe, see ``stages/defaults.py``)."""
    seq_len: int = 1024
    """Tokens per training window (inputs; targets are shifted by one)."""
    batch_size: int = 8
    """Windows per micro-batch per process."""
    heldout_fraction: float = 0.01
    """Fraction of the corpus (its end) held out for perplexity; never trained on."""
    eval_windows: int = 64
    """Held-out windows (of seq_len + 1 tokens) per evaluation."""
    eval_batch_size: int = 8
    """Windows per forward pass during evaluation."""
    teacher: str | None = None
    """Knowledge distillation: the unpruned source model (folder, .gguf file or hub id) whose logits
    are soft targets; it must share the corpus's tokenizer. None = plain next-token prediction."""
    kd_temperature: float = 1.0
    """Softmax temperature tau of both distributions in the KD term."""
    kd_weight: float = 1.0
    """Weight of the KD term; ``1 - kd_weight`` goes to the hard next-token cross-entropy."""
    threads: int | None = field(default=None, metadata={"operational": True})
    """torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores)."""

    def __post_init__(self) -> None:
        self.model, self.corpus = Path(self.model), Path(self.corpus)
        if self.teacher is not None:
            self.teacher = str(self.teacher)
        if not (math.isfinite(self.kd_temperature) and self.kd_temperature > 0):
            raise ConfigError(f"pretrain: kd_temperature must be > 0, got {self.kd_temperature}")
        if not 0.0 <= self.kd_weight <= 1.0:
            raise ConfigError(f"pretrain: kd_weight must be in [0, 1], got {self.kd_weight}")
        if self.teacher is None and (self.kd_temperature != 1.0 or self.kd_weight != 1.0):
            raise ConfigError("pretrain: --kd-temperature / --kd-weight need --teacher")
        for name in ("seq_len", "batch_size", "eval_windows", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"pretrain: {name} must be an integer >= 1, got {value!r}")
        if not 0.0 < self.heldout_fraction < 0.5:
            raise ConfigError(f"pretrain: heldout_fraction must be in (0, 0.5), got {self.heldout_fraction}")
        check_threads(self.threads, "pretrain")

    def trainer_loop(self) -> LoopConfig:
        """``loop`` as the trainer runs it: evaluated at step 0, the stage config recorded."""
        return dataclasses.replace(self.loop, eval_at_start=True,
                                   extra={"stage": "pretrain", "config": config_json(self)})


@dataclass(kw_only=True)
class ConvertConfig:
    """Options of ``osprey train convert``."""

    out: Path
    """Output drafter folder."""
    arch: str = field(default="osprey", metadata={"choices": arch_names()})
    """A registered architecture (osprey_train/drafters/registry.py): osprey converts a pre-trained
    backbone (needs --backbone); eagle3 makes a fresh EAGLE-3 baseline head (needs --target and --store);
    dflash makes a block drafter (needs --target and --store; from scratch, or from --backbone)."""
    backbone: Path | None = None
    """Pre-trained (pruned) HF backbone folder (Llama / Qwen2 / Qwen3); required for --arch osprey,
    optional for --arch dflash (Llama / Qwen3: its layers, embedding and head in place of random ones)."""
    target: str | None = None
    """Target model (folder, .gguf, hub id) or just its tokenizer folder when --store is given."""
    store: str | None = None
    """Feature store built for the target: identity and tap layers come from its manifest."""
    taps: tuple[int, ...] | None = field(default=None, metadata={"parse": parse_taps})
    """Comma-separated tap layers (HF hidden_states ids, e.g. 2,15,27) when there is no --store;
    default [2, L//2, L-3]."""
    draft_vocab_size: int | None = field(default=None, metadata={"option": "draft_vocab",
                                                                  "aliases": ("--draft-vocab-size",)})
    """``--draft-vocab N``: the draft vocabulary, the N target tokens most frequent at the store's
    loss-masked positions (needs ``--store``). None: the arch's ``default_draft_vocab`` (osprey: the
    full target vocabulary, eagle3: 32000 tokens)."""
    seed: int = 0
    """Seed of the random parts (W_c; eagle3 body)."""
    eagle3_layers: int = 1
    """eagle3: decoder layers (1 = the EAGLE-3 baseline; 2 = the paper's parameter-matched control); dflash:
    its draft layers."""
    arch_option: tuple[str, ...] = field(default=(), metadata={"key_if_set": True})
    """``KEY=VALUE`` (repeatable; VALUE in JSON, e.g. ``block_size=16``): a setting of the architecture kept in
    its config.json ``arch_options`` (dflash: block_size, mask_token_id, anchor_fraction)."""
    overwrite: bool = False
    """Replace ``out`` if it exists."""
    threads: int | None = field(default=None, metadata={"operational": True})
    """torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores)."""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        check_threads(self.threads, "convert")
        if self.arch not in arch_names():
            raise ConfigError(f"convert: --arch must be one of {list(arch_names())}, got {self.arch!r}")
        drafter_spec(self.arch).check_convert(self)   # which of --backbone / --target / --store it needs
        self.arch_option = tuple(self.arch_option)
        self.arch_options   # noqa: B018 -- parsed now: a malformed or unknown --arch-option fails before any work
        if self.backbone is not None:
            self.backbone = Path(self.backbone)
        if self.taps is not None:
            if self.store is not None:
                raise ConfigError("convert: --taps conflicts with --store (the store fixes the tap layers)")
            self.taps = TapLayers.checked(self.taps, where="convert --taps").layer_ids
        if self.draft_vocab_size is not None:
            if self.draft_vocab_size < 1:
                raise ConfigError(f"convert: --draft-vocab must be positive, got {self.draft_vocab_size}")
            if self.store is None:
                raise ConfigError("convert: --draft-vocab needs --store (the draft vocabulary is the store's most "
                                  "frequent loss-masked tokens)")
        if self.out.exists() and not self.overwrite:
            raise ConfigError(f"convert: output folder {self.out} exists; pass --overwrite or choose another --out")

    @property
    def arch_options(self) -> dict[str, Any]:
        """``--arch-option`` as a dict of JSON values; a ConfigError names a malformed or unknown one."""
        keys = drafter_spec(self.arch).arch_option_keys
        out: dict[str, Any] = {}
        for item in self.arch_option:
            key, sep, raw = str(item).partition("=")
            if not sep or not key:
                raise ConfigError(f"convert: --arch-option {item!r} is not KEY=VALUE")
            if key not in keys:
                known = f"it takes {list(keys)}" if keys else "it takes none"
                raise ConfigError(f"convert: --arch-option {key!r} is not an option of the {self.arch!r} arch; {known}")
            try:
                out[key] = json.loads(raw)
            except json.JSONDecodeError:
                raise ConfigError(f"convert: --arch-option {item!r}: the value is not JSON (a number, true/false, "
                                  "or a quoted string)") from None
        return out


@dataclass(kw_only=True)
class DistillConfig:
    """Options of ``osprey train distill``."""

    drafter: Path
    """Drafter folder (config.json + model.safetensors) from ``osprey train convert``."""
    store: str
    """Training feature store (path or fsspec URL)."""
    loop: LoopConfig
    """The trainer's loop: run folder (``out_dir``: checkpoints/, metrics, final/ = the distilled
    drafter), steps, gradient accumulation, logging, eval and save periods, seed, devices."""
    optim: OptimConfig = field(default_factory=distill_optim)
    """AdamW and schedule; defaults as pretraining except no weight decay (see ``stages/defaults.py``)."""
    eval_store: str | None = None
    """Held-out store for periodic offline acceptance (greedy chain decoding simulation)."""
    ttt_steps: int = 5
    """TTT unroll length K (1 = plain next-token distillation)."""
    ttt_decay: float = 0.8
    """Weight decay^k of step k's CE in the loss."""
    target_dist: str = field(default="tail", metadata={"choices": TARGET_DISTS})
    """Target distribution: tail (top-k + tail bucket), renorm (top-k only) or full (final_hidden)."""
    target_model: str | None = None
    """Target HF folder for --target-dist full (default: the store's target name_or_path)."""
    teacher_topk: int = field(default=0, metadata={"key_if_set": True})
    """Learn from only the N most likely tokens of the store's stored top-k (0: all of them); with
    ``--target-dist tail`` the rest of the mass goes to the tail bucket. What a smaller ``--topk``
    at build time would have cost, without rebuilding the store (issue 33)."""
    score_out_of_vocab: bool = False
    """Drafters with a draft vocabulary (EAGLE-3, Osprey converted with ``--draft-vocab``): also
    score positions whose target top-1 is outside it (never acceptable; left out by default, as
    SpecForge does). No effect on full-vocabulary drafters."""
    tokens_per_batch: int = 4096
    """Budget of one packed micro-batch in slots (one row of whole samples, no padding; a sample of n tokens
    fills n - 1 slots, see osprey_train.ttt.layout)."""
    prefetch: int = field(default=2, metadata={"operational": True})
    """Micro-batches read and packed ahead of training on a background thread (0 = off): the
    step never waits on the store. Batches are identical either way; memory: this many batches."""
    attention: str = field(default="auto", metadata={"choices": ATTENTION_IMPLS})
    """TTT attention: auto (flex on CUDA, else sdpa), flex, sdpa or eager."""
    freeze_embeddings: bool = field(default=True, metadata={
        "flag": "--train-embeddings", "negate": True, "help": "Also train the input embedding (frozen by default)."})
    """Keep the input embedding frozen (EAGLE-3 practice; saves its AdamW state)."""
    loss_chunk: int = 1024
    """Rows per LM-head/loss chunk (bounds the [rows, vocab] logits held at once)."""
    eval_samples: int = 64
    """Eval-store samples used per evaluation (0 = all)."""
    eval_draft_steps: int = 5
    """Draft length S of the acceptance evaluation."""
    threads: int | None = field(default=None, metadata={"operational": True})
    """torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores)."""

    def __post_init__(self) -> None:
        self.drafter = Path(self.drafter)
        checks = [
            (isinstance(self.ttt_steps, int) and 1 <= self.ttt_steps <= 64, f"--ttt-steps must be in [1, 64], got {self.ttt_steps!r}"),
            (0.0 < self.ttt_decay <= 1.0, f"--ttt-decay must be in (0, 1], got {self.ttt_decay!r}"),
            (self.target_dist in TARGET_DISTS, f"--target-dist must be one of {TARGET_DISTS}, got {self.target_dist!r}"),
            (isinstance(self.teacher_topk, int) and self.teacher_topk >= 0,
             f"--teacher-topk must be >= 0 (0: the whole stored top-k), got {self.teacher_topk!r}"),
            (not (self.teacher_topk and self.target_dist == "full"),
             "--teacher-topk applies to the stored top-k (--target-dist tail or renorm), not to full"),
            (self.tokens_per_batch >= 2, f"--tokens-per-batch must be >= 2, got {self.tokens_per_batch}"),
            (isinstance(self.prefetch, int) and self.prefetch >= 0, f"--prefetch must be >= 0, got {self.prefetch!r}"),
            (self.attention in ATTENTION_IMPLS, f"--attention must be one of {ATTENTION_IMPLS}, got {self.attention!r}"),
            (self.loss_chunk >= 1, f"loss_chunk must be >= 1, got {self.loss_chunk}"),
            (self.eval_samples >= 0 and self.eval_draft_steps >= 1, "eval_samples >= 0 and eval_draft_steps >= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"distill: {msg}")
        check_threads(self.threads, "distill")
