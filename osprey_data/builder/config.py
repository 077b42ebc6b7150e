"""``BuildConfig``: every setting of one ``osprey data build`` run, checked up front.

The CLI parses its flags into this dataclass and calls :func:`osprey_data.builder.run`. The
settings that change what ends up in the store (generation parameters, taps, top-k, codec,
length policy, worker partition) are listed in :data:`CONTENT_FIELDS`; they go into the store
header's ``build_config`` and ``build_fingerprint`` so that resuming with a different value is
refused, naming the setting. Operational settings (batch size, device, limit, inputs) can
change between runs of the same store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from osprey_data.errors import ConfigError
from osprey_data.store import HIDDEN_CODECS
from osprey_data.conversation.template_options import check_template_kwargs, parse_template_kwargs, read_chat_template
from osprey_data.cpu_threads import check_threads
from osprey_data.target_model import TapLayers, check_device, parse_taps

__all__ = ["BuildConfig", "BACKEND_NAMES", "CONTENT_FIELDS", "OVERFLOW_POLICIES", "ON_ERROR_POLICIES", "DTYPES"]

# The backends by name; osprey_data.builder.backends.BACKENDS maps them to classes (which import
# torch), so a config is checked without loading any backend.
BACKEND_NAMES = ("hf", "sglang", "vllm")
OVERFLOW_POLICIES = ("truncate", "skip")
ON_ERROR_POLICIES = ("raise", "skip")
DTYPES = ("auto", "float32", "bfloat16", "float16", "bf16-autocast")  # = target_model.PRECISIONS

# Settings that change the bytes of a store: part of the header, refused when they change.
CONTENT_FIELDS = (
    "backend", "regenerate", "max_new_tokens", "temperature", "top_p", "seed", "last_turn_only",
    "layers", "topk", "hidden_codec", "final_hidden", "max_length", "overflow", "dtype",
    "chat_template_kwargs", "num_workers",
)


@dataclass(kw_only=True)
class BuildConfig:
    """Settings of one builder run (library form of ``osprey data build``)."""

    target: str
    """Target model: local HF folder, hub id (online only), or a ``.gguf`` file path."""
    inputs: tuple[str, ...] = field(metadata={"option": "input"})
    """Input file (JSONL, JSON, Parquet) or saved ``datasets`` folder; repeatable."""
    out: str
    """Store location: a directory or an fsspec URL (``memory://``, ``s3://``)."""
    backend: str = field(default="hf", metadata={"choices": BACKEND_NAMES})
    """Engine that runs the target: ``hf`` (transformers), ``sglang`` or ``vllm`` (vLLM's venv, see docs/build.md)."""
    regenerate: bool = True
    """Replace assistant turns by the target's own responses (else teacher-force given ones)."""
    max_new_tokens: int = 512
    """Budget of generated tokens per regenerated assistant turn."""
    temperature: float = 0.0
    """Sampling temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling mass (only used when temperature > 0)."""
    seed: int = 0
    """Base seed; each sample/turn draws from its own generator derived from (seed, id, turn)."""
    last_turn_only: bool = False
    """Regenerate only the last assistant turn; earlier ones stay as given."""
    layers: tuple[int, ...] | None = field(default=None, metadata={
        "option": "taps", "deprecated": ("--layers",), "parse": parse_taps})
    """Tap ids, HF ``hidden_states`` convention, e.g. 2,15,27 (default [2, L//2, L-3])."""
    topk: int = 64
    """Number of top log-probs stored per position."""
    hidden_codec: str = "bf16-blosc"
    """Hidden-state codec of the store: ``bf16-blosc`` (lossless bf16, fast reads), ``bf16``
    (lossless bf16 as byte planes, the layout of older stores) or ``fp8``."""
    final_hidden: bool = False
    """Also store the last hidden state after the final norm (exact full-vocab targets)."""
    max_length: int = 4096
    """Longest stored sequence in tokens (prompt + responses)."""
    overflow: str = field(default="truncate", metadata={"choices": OVERFLOW_POLICIES})
    """What to do with sequences over ``max_length``: ``truncate`` or ``skip`` (both counted)."""
    on_error: str = field(default="raise", metadata={"choices": ON_ERROR_POLICIES})
    """Malformed input: ``raise`` stops, ``skip`` records it in the errors file (NaN/Inf features
    always go to the errors file)."""
    limit: int | None = None
    """Use only the first N samples of the inputs (before the worker partition)."""
    batch_size: int = field(default=8, metadata={"operational": True})
    """Samples per generation/prefill batch."""
    device: str = "auto"
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (under torchrun: ``cuda:LOCAL_RANK``)."""
    threads: int | None = field(default=None, metadata={"operational": True})
    """torch CPU threads (default: torch's, or 1 on a machine whose load exceeds 1.5x its cores)."""
    dtype: str = field(default="auto", metadata={"choices": DTYPES})
    """Target precision (``osprey_data.target_model.precision``): weights dtype, or ``bf16-autocast``
    (float32 weights, bf16 matmuls); ``auto`` is bfloat16 on CUDA and on a CPU with bf16 matrix
    units (AMX/AVX512-BF16; prepacked linears), float32 on other CPUs; ``--backend sglang`` on CPU
    runs bfloat16 only, ``--backend vllm`` float32 or bfloat16. The store header records the resolved name."""
    num_workers: int | None = None
    """Total independent workers writing this store (default: WORLD_SIZE or 1)."""
    worker_index: int | None = None
    """This worker's index in [0, num_workers) (default: RANK or 0)."""
    gguf_file: str | None = None
    """GGUF file inside the ``target`` folder, loaded through transformers."""
    chat_template: str | None = None
    """Jinja chat template file to render with instead of the target's own (the store header's
    ``chat_template_hash`` is then this template's)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"parse": parse_template_kwargs})
    """Extra variables for the chat template, a JSON object (e.g. '{"enable_thinking": false}' for Qwen3)."""
    shard_max_tokens: int = field(default=65536, metadata={"operational": True})
    """Tokens per store shard, the unit of commit (an interrupted build commits a shorter one)."""
    overwrite: bool = False
    """Replace an existing ``out`` (an Osprey store or any other folder) with a new store; without
    it an existing store is resumed and any other non-empty folder is refused."""
    storage_options: dict[str, Any] | None = field(default=None, metadata={"cli": False})
    """fsspec options for remote stores."""
    progress: bool = True
    """Show a tqdm progress bar."""

    def __post_init__(self) -> None:
        if isinstance(self.inputs, (str, os.PathLike)):
            self.inputs = (str(self.inputs),)
        self.inputs = tuple(str(p) for p in self.inputs)
        if not self.inputs:
            raise ConfigError("at least one --input is required")
        if not str(self.target):
            raise ConfigError("--target is required")
        self.target = str(self.target)
        self.out = str(self.out)
        if self.backend not in BACKEND_NAMES:
            raise ConfigError(f"--backend {self.backend!r} is unknown; use one of {sorted(BACKEND_NAMES)}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.layers is not None:
            self.layers = TapLayers.checked(self.layers, where="--taps").layer_ids
        if self.topk < 1:
            raise ConfigError(f"--topk must be >= 1, got {self.topk}")
        if self.hidden_codec not in HIDDEN_CODECS:
            raise ConfigError(f"--hidden-codec {self.hidden_codec!r} is unknown; use one of {sorted(HIDDEN_CODECS)}")
        if self.max_length < 2:
            raise ConfigError(f"--max-length must be >= 2, got {self.max_length}")
        if self.overflow not in OVERFLOW_POLICIES:
            raise ConfigError(f"--overflow must be one of {OVERFLOW_POLICIES}, got {self.overflow!r}")
        if self.on_error not in ON_ERROR_POLICIES:
            raise ConfigError(f"--on-error must be one of {ON_ERROR_POLICIES}, got {self.on_error!r}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        check_device(self.device)
        check_threads(self.threads)
        self.chat_template_kwargs = check_template_kwargs(self.chat_template_kwargs)
        if self.chat_template is not None:
            self.chat_template = str(self.chat_template)
            read_chat_template(self.chat_template)
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.shard_max_tokens < 1:
            raise ConfigError(f"--shard-max-tokens must be >= 1, got {self.shard_max_tokens}")
        self._resolve_workers()
        if self.overwrite and self.num_workers > 1:
            raise ConfigError("--overwrite cannot be combined with --num-workers > 1: each worker would delete "
                              "the others' shards; remove the old store once before starting the workers")

    def _resolve_workers(self) -> None:
        """Fill num_workers/worker_index from torchrun's WORLD_SIZE/RANK when not given."""
        env_world = os.environ.get("WORLD_SIZE")
        env_rank = os.environ.get("RANK")
        if self.num_workers is None:
            self.num_workers = int(env_world) if env_world else 1
        if self.worker_index is None:
            self.worker_index = int(env_rank) if (env_rank and env_world) else 0
        if self.num_workers < 1:
            raise ConfigError(f"--num-workers must be >= 1, got {self.num_workers}")
        if not 0 <= self.worker_index < self.num_workers:
            raise ConfigError(
                f"--worker-index must be in [0, {self.num_workers}), got {self.worker_index}"
            )
        if self.device == "auto" and env_world and os.environ.get("LOCAL_RANK") is not None:
            import torch

            if torch.cuda.is_available():
                self.device = f"cuda:{int(os.environ['LOCAL_RANK'])}"

    def content_settings(self) -> dict[str, Any]:
        """The settings that change the store's contents (JSON-ready)."""
        out: dict[str, Any] = {}
        for name in CONTENT_FIELDS:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    def generation_dict(self) -> dict[str, Any]:
        """Generation parameters recorded in the store header."""
        return {
            "regenerate": self.regenerate,
            "greedy": self.temperature == 0.0,
            "temperature": self.temperature,
            "top_p": self.top_p,
            # the stored top-k log-probs are the full softmax of the raw logits, at temperature 1
            # whatever the sampling temperature (HF features; the SGLang backend prefills with HF)
            "topk_logprobs_temperature": 1.0,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
            "last_turn_only": self.last_turn_only,
            "max_length": self.max_length,
            "overflow": self.overflow,
            "chat_template_kwargs": dict(self.chat_template_kwargs),
        }
