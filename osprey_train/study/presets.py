"""The study presets Osprey ships, found by name from a clone or an installed wheel, and the data
files a study may name as ``shipped:NAME``.

The presets live in the repository's ``studies/`` folder (the one copy that is edited); the wheel
carries them as ``osprey_train/study/presets/`` (``setup.py`` copies them there at build time), so
``osprey study run smollm2-quick`` works where only the wheel is installed. A path to a study file
keeps working as before. A preset may read data Osprey does not ship (the full studies read the
project's shared prompt sets); its ``[study] data`` says where that data comes from, and a missing
file fails at load, before any stage runs, with that note.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from osprey_data.errors import ConfigError

__all__ = ["PRESET_PREFIX", "SHIPPED_PREFIX", "SHIPPED_DATA", "Preset", "presets_dir", "is_installed_preset",
           "list_presets",
           "preset_path", "resolve_study_file", "shipped_data"]

PRESET_PREFIX = "preset:"
"""``preset:NAME`` names a shipped preset even where a file of that name exists."""
SHIPPED_PREFIX = "shipped:"
"""``shipped:NAME`` in a study file names a data file of the installed package (:data:`SHIPPED_DATA`)."""

_PACKAGE = Path(__file__).resolve().parents[1]   # osprey_train/
SHIPPED_DATA: dict[str, Path] = {
    "demo-prompts": _PACKAGE / "demo" / "prompts.jsonl",
}
"""Data files the wheel carries, by the name a study file gives them."""

_IN_WHEEL = Path(__file__).resolve().with_name("presets")   # setup.py copies studies/ here
_IN_CHECKOUT = _PACKAGE.parent / "studies"                   # a clone (editable install)


@dataclass(frozen=True)
class Preset:
    """One shipped study file."""

    name: str
    """The name ``osprey study run NAME`` takes (the file name without ``.toml``)."""
    path: Path
    """Where the file is (in the installed package, or the clone's ``studies/``)."""
    description: str
    """The first sentence of its ``[study] description``."""


def is_installed_preset(path: str | Path) -> bool:
    """Whether ``path`` is a preset inside an installed package (whose relative data paths lead into it)."""
    return _IN_WHEEL in Path(path).resolve().parents


def presets_dir() -> Path:
    """The folder of the shipped presets: the installed package's, else the clone's ``studies/``."""
    return _IN_WHEEL if _IN_WHEEL.is_dir() else _IN_CHECKOUT


def _first_sentence(text: str, width: int = 72) -> str:
    text = " ".join(text.split()).split(". ", 1)[0].rstrip(".")
    return text if len(text) <= width else text[:width - 1].rstrip() + "…"


def list_presets() -> list[Preset]:
    """Every shipped preset, by name (a file that is not valid TOML is listed without a description)."""
    found = []
    for path in sorted(presets_dir().glob("*.toml")):
        try:
            section = tomllib.loads(path.read_text(encoding="utf-8")).get("study", {})
        except (OSError, tomllib.TOMLDecodeError):
            section = {}
        # the one-line summary (size, time, data) when the preset has one: first sentences of two
        # presets of one family read the same
        description = section.get("summary") or _first_sentence(str(section.get("description", "")))
        found.append(Preset(name=path.stem, path=path, description=str(description)))
    return found


def _names() -> str:
    return ", ".join(p.name for p in list_presets()) or "none found"


def preset_path(name: str) -> Path:
    """The file of the shipped preset ``name``.

    Raises:
        ConfigError: no preset has that name (the message lists the shipped ones).
    """
    path = presets_dir() / f"{name}.toml"
    if "/" in name or "\\" in name or not path.is_file():
        raise ConfigError(f"no shipped study preset {name!r}; the presets: {_names()}")
    return path


def resolve_study_file(arg: str | Path) -> tuple[Path, bool]:
    """``(study file, is_preset)`` of a ``study`` argument: an existing file, ``preset:NAME``, or
    a bare NAME (no folder, no ``.toml``) of a shipped preset.

    Raises:
        ConfigError: a bare name that no preset has, or a study file that does not exist.
    """
    text = str(arg)
    if text.startswith(PRESET_PREFIX):
        return preset_path(text[len(PRESET_PREFIX):]), True
    path = Path(text).expanduser()
    if path.exists():
        return path, False
    if path.suffix != ".toml" and "/" not in text and "\\" not in text:
        return preset_path(text), True
    raise ConfigError(f"{path}: no such study file (shipped presets, by name: {_names()})")


def shipped_data(name: str, where: str) -> Path:
    """The package data file ``shipped:NAME`` names.

    Raises:
        ConfigError: an unknown name (naming ``where`` and the known names).
    """
    if name not in SHIPPED_DATA:
        raise ConfigError(f"{where}: {SHIPPED_PREFIX}{name} is not a file Osprey ships; "
                          f"known: {', '.join(SHIPPED_PREFIX + n for n in SHIPPED_DATA)}")
    return SHIPPED_DATA[name]
