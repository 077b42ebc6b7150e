"""``osprey data validate | inspect | merge | verify``: feature-store maintenance commands.

Each command parses its options into a typed config and calls one ``run`` function; store
problems become a readable report (validate) or one-line error (others) and a non-zero exit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import click

from osprey_data.errors import ConfigError

__all__ = ["validate", "inspect", "merge", "verify", "ValidateConfig", "InspectConfig", "MergeConfig",
           "run_validate", "run_inspect", "run_merge"]


def _storage_options(pairs: tuple[str, ...]) -> dict:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise ConfigError(f"--storage-option expects KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


@dataclass(kw_only=True)
class _StoreOptions:
    store: str
    """Store path or fsspec URL."""
    as_json: bool = False
    """Print machine-readable JSON instead of a human report."""
    storage_options: dict = field(default_factory=dict)
    """fsspec storage options (e.g. S3 credentials profile)."""

    def __post_init__(self) -> None:
        if not self.store:
            raise ConfigError("STORE must be a path or URL")


@dataclass(kw_only=True)
class ValidateConfig(_StoreOptions):
    check_values: bool = True
    """Decode every chunk and check values (NaN/Inf, id ranges); off = structure and checksums only."""


@dataclass(kw_only=True)
class InspectConfig(_StoreOptions):
    """Options of ``osprey data inspect``."""


@dataclass(kw_only=True)
class MergeConfig:
    store: str
    """Store path or fsspec URL whose worker shards should become visible."""
    storage_options: dict = field(default_factory=dict)
    """fsspec storage options."""

    def __post_init__(self) -> None:
        if not self.store:
            raise ConfigError("STORE must be a path or URL")


def run_validate(config: ValidateConfig) -> bool:
    from osprey_data.store import validate_store

    report = validate_store(config.store, config.storage_options, check_values=config.check_values,
                            progress=not config.as_json)
    click.echo(json.dumps(report.to_dict(), indent=1) if config.as_json else report.format())
    return report.ok


def run_inspect(config: InspectConfig) -> dict:
    from osprey_data.store import inspect_store
    from osprey_data.store.inspect import format_inspection

    info = inspect_store(config.store, config.storage_options)
    click.echo(json.dumps(info, indent=1) if config.as_json else format_inspection(info))
    return info


def run_merge(config: MergeConfig) -> None:
    from osprey_data.store import merge_store

    m = merge_store(config.store, config.storage_options)
    workers = sorted({s.worker for s in m.shards})
    click.echo(f"{config.store}: {len(m.shards)} shards from {len(workers)} worker(s), "
               f"{m.num_samples} samples, {m.num_tokens} tokens now visible")


_so = click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
                   help="fsspec storage option (repeatable; VALUE parsed as JSON when possible).")


@click.command("validate")
@click.argument("store")
@click.option("--no-values", is_flag=True, help="Skip decoding values (structure + checksums only).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_so
def validate(store: str, no_values: bool, as_json: bool, storage_option: tuple[str, ...]) -> None:
    """Check a store: schema, shards, counts, shapes, dtypes, NaN/Inf, token ids, checksums.

    Every file listed in every commit record is checked. Exit codes: 0 valid, 1 problems found
    (listed), 2 no store at STORE or a bad option.

    \b
    Example:
      osprey data validate stores/train
    """
    ok = run_validate(ValidateConfig(store=store, check_values=not no_values, as_json=as_json,
                                     storage_options=_storage_options(storage_option)))
    if not ok:
        raise SystemExit(1)


@click.command("inspect")
@click.argument("store")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@_so
def inspect(store: str, as_json: bool, storage_option: tuple[str, ...]) -> None:
    """Summarise a store: samples, tokens, domains, bytes/token per array, target, taps.

    \b
    Example:
      osprey data inspect stores/train --json
    """
    run_inspect(InspectConfig(store=store, as_json=as_json, storage_options=_storage_options(storage_option)))


@click.command("merge")
@click.argument("store")
@_so
def merge(store: str, storage_option: tuple[str, ...]) -> None:
    """Publish the shards of all workers that wrote into STORE (idempotent, lock-free).

    \b
    Example:
      osprey data merge stores/train
    """
    run_merge(MergeConfig(store=store, storage_options=_storage_options(storage_option)))


@click.command("verify")
@click.argument("store")
@click.option("--recompute", "recompute", type=int, default=8, show_default=True, metavar="N",
              help="Recompute N samples drawn at random (seeded); all of them if the store has fewer.")
@click.option("--samples", "samples", multiple=True, metavar="ID[,ID...]",
              help="Recompute these sample ids instead (repeatable or comma-separated).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random draw.")
@click.option("--target", default=None, help="Target model folder (default: the store header's target).")
@click.option("--gguf-file", default=None, help="GGUF file inside the --target folder.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Recompute dtype (default: the dtype the store was built in).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_so
def verify(store: str, recompute: int, samples: tuple[str, ...], seed: int, target: str | None,
           gguf_file: str | None, device: str, dtype: str | None, as_json: bool,
           storage_option: tuple[str, ...]) -> None:
    """Recompute samples of STORE with its target and compare the stored features.

    A teacher-forced prefill of each chosen sample's stored token ids, one sequence at a time,
    gives the reference taps, top-k log-probs and final hidden state; a store built with the
    wrong taps, padding, batch handling or target differs from it beyond the codec's error.
    Prints one row per sample and a verdict. Exit codes: 0 pass, 1 some samples differ (named),
    2 no store, a bad option or a target that is not the store's.

    \b
    Example:
      osprey data verify stores/train --recompute 16
      osprey data verify s3://bucket/stores/train --samples a1b2,c3d4 --target models/smollm2
    """
    from osprey_data.builder.verify import VerifyConfig, run

    ids = tuple(s for group in samples for s in group.split(",") if s)
    report = run(VerifyConfig(store=store, recompute=recompute, samples=ids, seed=seed, target=target,
                              gguf_file=gguf_file, device=device, dtype=dtype,
                              storage_options=_storage_options(storage_option)))
    click.echo(json.dumps(report.to_dict(), indent=1) if as_json else report.format())
    if not report.ok:
        raise SystemExit(1)
