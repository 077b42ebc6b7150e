"""``osprey data verify --recompute``: recompute a store's features and check it was built right.

A store can pass ``osprey data validate`` (schema, checksums, finite values) and still be wrong:
built with the taps one layer off, with a padding side or attention mask that let a batch's
short sequences see padding, with another target. Only running the target again tells. This
loads the target named in the store header (or ``--target``), checks it is that target (config and
tokenizer hashes), and for a few samples (``N`` drawn with a seeded generator, or named ones)
recomputes the features with a teacher-forced prefill of the stored token ids — one sequence at
a time, so no padding or batching can be involved — through the HF backend's own feature
extraction (:meth:`~osprey_data.builder.backends.HFBackend.features`, taps by
:class:`~osprey_data.target_model.TapCapture`: one tap convention in the builder and here).
:mod:`osprey_data.builder.verify_compare` compares them against bars derived from the codec and
the dtypes. The store is only read (local or fsspec URL).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from osprey_data.builder.backends import HFBackend
from osprey_data.builder.config import BuildConfig
from osprey_data.builder.verify_compare import Bars, SampleCheck, bars_for, check_sample
from osprey_data.errors import ConfigError, InputError, StoreCorruptError
from osprey_data.store import StoreReader
from osprey_data.target_model import check_target_exists
from osprey_data.text import printable

__all__ = ["VerifyConfig", "VerifyReport", "run", "pick_samples"]

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(kw_only=True)
class VerifyConfig:
    """Options of ``osprey data verify`` (library form)."""

    store: str
    """Store path or fsspec URL (read only)."""
    recompute: int = 8
    """How many samples to recompute, drawn at random with ``seed`` (all of them if fewer)."""
    samples: tuple[str, ...] = ()
    """Sample ids to recompute instead of a random draw."""
    seed: int = 0
    """Seed of the random draw (the same seed picks the same samples)."""
    target: str | None = None
    """Target model folder; default the store header's ``target.name_or_path``."""
    gguf_file: str | None = None
    """GGUF file inside the ``target`` folder (stores built from GGUF targets)."""
    device: str = "auto"
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto``."""
    dtype: str | None = None
    """Recompute dtype; default the dtype the store was built in (its header's build config)."""
    storage_options: dict = field(default_factory=dict)
    """fsspec storage options for remote stores."""

    def __post_init__(self) -> None:
        if not self.store:
            raise ConfigError("STORE must be a path or URL")
        self.store = str(self.store)
        if isinstance(self.samples, str):
            self.samples = (self.samples,)
        self.samples = tuple(str(s) for s in self.samples)
        if not self.samples and self.recompute < 1:
            raise ConfigError(f"--recompute must be >= 1, got {self.recompute}")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise ConfigError(f"--dtype must be one of {_DTYPES}, got {self.dtype!r}")


@dataclass
class VerifyReport:
    """Outcome of :func:`run`; ``ok`` is False when any recomputed sample misses a bar."""

    store: str
    target: str
    codec: str
    build_dtype: str
    recompute_dtype: str
    taps: tuple[int, ...]
    bars: Bars
    num_samples: int
    """Samples in the store."""
    checks: list[SampleCheck] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[SampleCheck]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "ok": self.ok, "target": self.target, "codec": self.codec,
                "build_dtype": self.build_dtype, "recompute_dtype": self.recompute_dtype,
                "taps": list(self.taps), "bars": self.bars.to_dict(), "num_samples": self.num_samples,
                "failed": [c.sample_id for c in self.failed], "samples": [c.to_dict() for c in self.checks],
                "wall_s": self.wall_s}

    def format(self) -> str:
        head = (f"{self.store}: recomputed {len(self.checks)} of {self.num_samples} samples with {self.target} "
                f"({self.recompute_dtype}; built in {self.build_dtype}, codec {self.codec}, taps "
                f"{list(self.taps)}) in {self.wall_s:.1f} s")
        cols = (f"{'index':>6} {'sample':<20} {'tokens':>6} {'hid max':>9} {'hid mean':>9} {'rel err':>9} "
                f"{'bar':>8} {'top1':>6} {'top-k':>6} {'lp mean':>8} {'lp max':>8}  verdict")
        lines = [head, cols]
        for c in self.checks:
            sid = c.sample_id if len(c.sample_id) <= 20 else c.sample_id[:19] + "…"
            lines.append(f"{c.index:>6} {sid:<20} {c.num_tokens:>6} {c.hidden_max_abs:>9.3g} "
                         f"{c.hidden_mean_abs:>9.3g} {c.hidden_rel:>9.3g} {c.hidden_bar:>8.3g} "
                         f"{c.top1_agree:>6.3f} {c.topk_overlap:>6.3f} {c.logprob_mean_err:>8.3g} {c.logprob_max_err:>8.3g}  "
                         f"{'ok' if c.ok else 'FAIL'}")
        for c in self.failed:
            lines.append(f"  FAIL {c.sample_id} (index {c.index}): {'; '.join(c.failures)}")
        bars = (f"bars: hidden rel err <= codec bound + {self.bars.hidden_dtype_rel:.3g} (ordinary channels), "
                f"mean log-prob err <= {self.bars.logprob_mean:.3g}, top-1/top-k exact outside near-ties "
                f"(gap < {self.bars.tie_gap:.3g})")
        lines.append(bars)
        if self.ok:
            lines.append(f"PASS: {len(self.checks)} samples match the recomputation")
        else:
            names = ", ".join(c.sample_id for c in self.failed[:10]) + (" ..." if len(self.failed) > 10 else "")
            lines.append(f"FAIL: {len(self.failed)} of {len(self.checks)} samples differ from the recomputation: "
                         f"{names}")
        return "\n".join(printable(line) for line in lines)


def pick_samples(reader: StoreReader, config: VerifyConfig) -> list[int]:
    """Global indices to recompute: the named ids in order, else a seeded draw of ``recompute``."""
    if config.samples:
        return [reader.index_of(sid) for sid in config.samples]
    n = reader.num_samples
    rng = np.random.default_rng(config.seed)
    return sorted(int(i) for i in rng.choice(n, size=min(config.recompute, n), replace=False))


def _load_target(config: VerifyConfig, reader: StoreReader, dtype: str) -> HFBackend:
    header = reader.header
    target = config.target or header.target.name_or_path
    try:
        check_target_exists(target, config.gguf_file)
    except InputError as exc:
        hint = "" if config.target else " (the store header's target); pass --target with the model folder"
        raise ConfigError(f"{config.store}: cannot load target {target!r}{hint}: {exc}") from None
    # The builder's backend, for its feature extraction only (inputs/out are never touched).
    backend = HFBackend(BuildConfig(target=target, inputs=(config.store,), out=config.store, device=config.device,
                                    dtype=dtype, gguf_file=config.gguf_file, progress=False))
    want, got = header.target, backend.identity
    diffs = [name for name in ("config_hash", "tokenizer_hash", "vocab_size", "hidden_size", "num_layers")
             if getattr(want, name) != getattr(got, name)]
    if diffs:
        backend.close()
        raise ConfigError(f"{config.store}: target {target!r} is not the model this store was built from "
                          f"({', '.join(diffs)} differ from the header's {want.name_or_path!r}); pass --target "
                          f"with the store's target")
    return backend


def run(config: VerifyConfig) -> VerifyReport:
    """Recompute the chosen samples of ``config.store`` and compare; never writes to the store.

    Raises:
        StoreNotFoundError: no store at ``config.store``.
        SampleNotFoundError: a ``samples`` id is not in the store.
        ConfigError: the target cannot be loaded or is not the store's target.
    """
    t0 = time.perf_counter()
    reader = StoreReader(config.store, storage_options=config.storage_options or None, check_values=False)
    header = reader.header
    if reader.num_samples == 0:
        raise ConfigError(f"{config.store}: the store has no samples to recompute")
    indices = pick_samples(reader, config)
    build_dtype = str(header.build_config.get("dtype", "float32"))
    dtype = config.dtype or (build_dtype if build_dtype in _DTYPES else "float32")
    bars = bars_for(header.hidden_codec, build_dtype, dtype)
    taps = tuple(header.taps.layer_ids)
    backend = _load_target(config, reader, dtype)
    report = VerifyReport(store=config.store, target=backend.identity.name_or_path, codec=header.hidden_codec,
                          build_dtype=build_dtype, recompute_dtype=dtype, taps=taps, bars=bars,
                          num_samples=reader.num_samples)
    try:
        for i in indices:
            report.checks.append(_check_one(reader, backend, i, taps=taps, topk=header.topk, bars=bars,
                                            has_final_hidden=header.has_final_hidden))
    finally:
        backend.close()
    report.wall_s = time.perf_counter() - t0
    return report


def _check_one(reader: StoreReader, backend: HFBackend, i: int, *, taps: tuple[int, ...], topk: int, bars: Bars,
               has_final_hidden: bool) -> SampleCheck:
    try:
        stored = reader.sample(i)
    except StoreCorruptError as exc:
        return SampleCheck(index=i, sample_id=f"#{i}", num_tokens=0, failures=[f"unreadable: {exc}"])
    check = SampleCheck(index=i, sample_id=stored.sample_id, num_tokens=stored.num_tokens)
    ids = np.asarray(stored.token_ids, dtype=np.int32)
    # one sequence alone: no padding, no batch neighbours; the reference a batched build must match
    ref = backend.features([ids], taps=taps, topk=topk, final_hidden=has_final_hidden)[0]
    bad = [name for name, x in (("hidden", stored.hidden_TLD), ("top-k log-probs", stored.topk_logprobs_TK),
                                ("final hidden", stored.final_hidden_TD))
           if x is not None and not np.isfinite(np.asarray(x)).all()]
    if bad:
        check.failures.append(f"stored {', '.join(bad)} hold NaN/Inf")
        return check
    return check_sample(check, stored=stored, ref=ref, taps=taps, bars=bars, has_final_hidden=has_final_hidden)
