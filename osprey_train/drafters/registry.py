"""The one table of drafter architectures: ``DRAFTERS[name] -> DrafterSpec``.

Everything that depends on the architecture asks this table instead of testing ``arch`` strings:
the CLI's ``--arch`` choices, ``DrafterConfig`` validation, ``build_drafter`` (and through it
every load: distill, evaluation, live decoding), convert, the exporters and the study planner.

Adding an architecture (docs/models.md, "Adding a drafter"): a spec module ``drafters/<name>.py``
(a :class:`~osprey_train.drafters.spec.DrafterSpec`), the code it names (model class, convert
entry, ...), and its registration below. Tests may register a throwaway architecture with :func:`register_drafter`
(and remove it with :func:`unregister_drafter`).
"""

from __future__ import annotations

import re

from osprey_data.errors import ConfigError
from osprey_train.drafters.eagle3 import SPEC as EAGLE3
from osprey_train.drafters.osprey import SPEC as OSPREY
from osprey_train.drafters.spec import DrafterSpec

__all__ = ["DRAFTERS", "register_drafter", "unregister_drafter", "drafter_spec", "arch_names",
           "spec_for_sglang_architecture"]

_NAME = re.compile(r"[a-z][a-z0-9_]*")   # the schemas' pattern for 'arch'
DRAFTERS: dict[str, DrafterSpec] = {}
"""Registered architectures by name, in registration order (the first is the default ``--arch``)."""


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


# The registration: one line per architecture.
register_drafter(OSPREY)
register_drafter(EAGLE3)
