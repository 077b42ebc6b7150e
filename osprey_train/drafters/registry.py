"""The one table of drafter architectures: ``DRAFTERS[name] -> DrafterSpec``.

Everything that depends on the architecture asks this table instead of testing ``arch`` strings:
the CLI's ``--arch`` choices, ``DrafterConfig`` validation, ``build_drafter`` (and through it
every load: distill, evaluation, live decoding), convert, the exporters and the study planner.

Adding an architecture (docs/models.md, "Adding a drafter") is adding one folder,
``osprey_train/drafters/<name>/``, whose ``arch.py`` defines ``SPEC`` (a
:class:`~osprey_train.drafters.spec.DrafterSpec`) and whose other modules hold the code it names
(model class, convert entry, objective, ...). The table is filled from those folders at import
(:func:`discover`): no file outside the folder changes. Why by discovery and not by imports here:
this module sits at the bottom of the import graph (the CLI and ``DrafterConfig`` read it), while an
arch folder's code imports the models, the stages and the exporters; a static import of the folders
would make the ``drafters`` package import itself through them. Only the folders' ``arch.py``
modules are imported, and they are torch-free. Tests may register a throwaway architecture with
:func:`register_drafter` (and remove it with :func:`unregister_drafter`).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

from osprey_data.errors import ConfigError, ModelError
from osprey_train.drafters.spec import DrafterSpec

__all__ = ["DRAFTERS", "register_drafter", "unregister_drafter", "drafter_spec", "arch_names",
           "spec_for_sglang_architecture", "discover"]

_NAME = re.compile(r"[a-z][a-z0-9_]*")   # the schemas' pattern for 'arch'
DRAFTERS: dict[str, DrafterSpec] = {}
"""Registered architectures by name, by ``listing_order`` then name (the first is the default ``--arch``)."""


def register_drafter(spec: DrafterSpec) -> DrafterSpec:
    """Add ``spec`` to the table; a second architecture of the same name is a ConfigError."""
    if not _NAME.fullmatch(spec.name):
        raise ConfigError(f"drafter arch {spec.name!r}: a name is lower-case letters, digits and '_' "
                          "(it is the config.json 'arch' value; schemas/drafter-config.v1.json)")
    if spec.name in DRAFTERS:
        raise ConfigError(f"drafter arch {spec.name!r} is registered twice")
    taken = spec_for_sglang_architecture(spec.sglang_architecture) if spec.sglang_architecture else None
    if taken is not None:
        raise ConfigError(f"drafter arch {spec.name!r}: SGLang architecture {spec.sglang_architecture!r} is "
                          f"already {taken.name!r}'s")
    DRAFTERS[spec.name] = spec
    ordered = sorted(DRAFTERS.values(), key=lambda s: (s.listing_order, s.name))
    DRAFTERS.clear()
    DRAFTERS.update((s.name, s) for s in ordered)
    return spec


def unregister_drafter(name: str) -> None:
    """Remove an architecture registered with :func:`register_drafter` (tests' throwaway ones)."""
    DRAFTERS.pop(name)


def arch_names() -> tuple[str, ...]:
    """The registered architecture names."""
    return tuple(DRAFTERS)


def drafter_spec(name: str, *, where: str = "drafter arch") -> DrafterSpec:
    """The spec of ``name``; an unknown name is a ConfigError that lists the known ones."""
    spec = DRAFTERS.get(name)
    if spec is None:
        raise ConfigError(f"{where} {name!r} is not one of {arch_names()}")
    return spec


def spec_for_sglang_architecture(architecture: str | None) -> DrafterSpec | None:
    """The architecture whose SGLang export names ``architecture`` in config.json, if any."""
    return next((s for s in DRAFTERS.values() if architecture and s.sglang_architecture == architecture), None)


def discover(package: str = __package__, folder: Path = Path(__file__).parent) -> list[DrafterSpec]:
    """Register the ``SPEC`` of every arch folder ``folder/<name>/arch.py``; returns them.

    A folder's name must be its spec's name, so that the folder and the config.json ``arch`` value
    cannot drift apart."""
    found = []
    for info in sorted(pkgutil.iter_modules([str(folder)]), key=lambda i: i.name):
        if not info.ispkg or not (folder / info.name / "arch.py").is_file():
            continue
        module = importlib.import_module(f"{package}.{info.name}.arch")
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, DrafterSpec):
            raise ModelError(f"{module.__file__}: defines no SPEC = DrafterSpec(...)")
        if spec.name != info.name:
            raise ModelError(f"{module.__file__}: SPEC.name is {spec.name!r}; an arch folder is named after its "
                             f"arch (rename the folder or the spec)")
        found.append(register_drafter(spec))
    return found


discover()
