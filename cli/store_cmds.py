"""``osprey data validate | inspect | merge``: feature-store maintenance commands.

Each command parses its options into a typed config and calls one ``run`` function; store
problems become a readable report (validate) or one-line error (others) and a non-zero exit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import click

from osprey_data.errors import ConfigError

__all__ = ["validate", "inspect", "merge", "ValidateConfig", "InspectConfig", "MergeConfig",
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
