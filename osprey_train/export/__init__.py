"""Export drafters for serving: ``hf`` (Osprey's own format), ``sglang`` and ``vllm`` layouts.

``EXPORTERS`` maps a format name to (writer, reader); ``run(ExportConfig)`` is what
``osprey export`` calls. ``sglang_model`` (the SGLang external model class for the Osprey drafter)
is imported only by SGLang itself, never from here, so this package imports without SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from osprey_data.cpu_threads import check_threads, note_to_stderr, torch_threads
from osprey_data.errors import ConfigError
from osprey_train.drafters.registry import drafter_spec
from osprey_train.evaluation.speculation_profile import check_profile
from osprey_train.export.common import DTYPES, check_representable
from osprey_train.export.hf import read_hf, write_hf
from osprey_train.export.serving import ServingRecommendation, recommend
from osprey_train.export.sglang import read_sglang, write_sglang
from osprey_train.export.vllm import read_vllm, write_vllm
from osprey_train.models.io import load_drafter, read_drafter_config

__all__ = ["ExportConfig", "ExportResult", "run", "EXPORTERS", "load_export"]


# format -> (writer, reader)
EXPORTERS: dict[str, tuple[Callable, Callable]] = {
    "hf": (write_hf, read_hf), "sglang": (write_sglang, read_sglang), "vllm": (write_vllm, read_vllm),
}


@dataclass(kw_only=True)
class ExportConfig:
    """Options of ``osprey export``."""

    drafter: Path
    """Drafter folder (``osprey-drafter`` config.json + model.safetensors)."""
    format: str
    """'hf', 'sglang' or 'vllm'."""
    out: Path
    """Output folder."""
    dtype: str = "bfloat16"
    """Floating weights' dtype of the export: bfloat16 (the default: what the engines serve, half the
    bytes of float32), float32 (lossless: exact parity with Osprey's fp32 figures) or float16. Integer
    and bool tensors (``d2t`` int64, ``t2d``) keep their own dtypes."""
    overwrite: bool = False
    """Replace ``out`` if it exists."""
    sweep: Path | None = None
    """``--format sglang``: a ``sweep.json`` whose best shape becomes the recommended serving flags."""
    threads: int | None = None
    """torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores)."""

    def __post_init__(self) -> None:
        self.drafter, self.out = Path(self.drafter), Path(self.out)
        if self.sweep is not None and self.format != "sglang":
            raise ConfigError("export: --sweep recommends SGLang serving flags; it needs --format sglang")
        if self.format not in EXPORTERS:
            raise ConfigError(f"export: --format must be one of {sorted(EXPORTERS)}, got {self.format!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"export: --dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.out.resolve() == self.drafter.resolve():
            raise ConfigError("export: --out must differ from --drafter")
        check_threads(self.threads, "export")


@dataclass(kw_only=True)
class ExportResult:
    """What export wrote."""

    out: Path
    """The exported folder."""
    arch: str
    """The drafter's architecture (a name in osprey_train/drafters/registry.py)."""
    format: str
    """The format written."""
    dtype: str
    """The floating weights' dtype written (``config.dtype``)."""
    serving: ServingRecommendation | None = None
    """``sglang``: the serving flags recommended in ``serving.json``."""


def run(config: ExportConfig) -> ExportResult:
    """Load the drafter and write it in ``config.format`` (``sglang``: with ``serving.json`` and ``README.md``)."""
    extra = {}
    if config.format == "sglang":  # read the sweep before the model: a bad file fails first
        extra["serving"] = recommend(config.sweep)
    # the drafter's config.json decides the checks: they fail before its weights load
    drafter_config = read_drafter_config(config.drafter)
    check_profile(config.drafter)   # a stale speculation_profile.json is refused, not copied
    drafter_spec(drafter_config.arch).check_export(drafter_config, config.format)   # the writer checks it again
    serving = extra.get("serving")
    if serving is not None and serving.shape.topk > drafter_config.draft_vocab_size:
        raise ConfigError(f"export --sweep {config.sweep}: its best shape has topk {serving.shape.topk}, more "
                          f"than the {drafter_config.draft_vocab_size} draft tokens of --drafter "
                          f"{Path(config.drafter) / 'config.json'}; the sweep is of another drafter or edited: "
                          "sweep this drafter again")
    with torch_threads(config.threads, note_to_stderr):
        model = load_drafter(config.drafter)
        # before any file is written: a finite weight that --dtype cannot hold is refused, not made inf
        check_representable(model.state_dict(), DTYPES[config.dtype],
                            f"export --dtype {config.dtype} of {Path(config.drafter) / 'model.safetensors'}")
        writer, _ = EXPORTERS[config.format]
        writer(model, config.out, dtype=DTYPES[config.dtype], source_dir=config.drafter, overwrite=config.overwrite,
               **extra)
    return ExportResult(out=config.out, arch=model.config.arch, format=config.format, dtype=config.dtype,
                        serving=extra.get("serving"))


def load_export(path: str | Path, format: str):
    """Read an export back into a Drafter (round-trip checks)."""
    if format not in EXPORTERS:
        raise ConfigError(f"unknown export format {format!r}; known: {sorted(EXPORTERS)}")
    return EXPORTERS[format][1](Path(path))
