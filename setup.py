"""Package layout, the one part of the build that pyproject.toml cannot say.

The repository keeps the folders ``cli/`` and ``schemas/``, but they install as ``osprey_cli``
and ``osprey_schemas``: every top-level import name this wheel installs starts with ``osprey``,
so another distribution shipping a generic ``cli`` or ``schemas`` package can never overwrite
ours. Metadata, dependencies, package data and the console script live in pyproject.toml.

Below the four roots nothing is listed by hand: every folder is discovered as a package
(``find_namespace_packages``), so a folder that lacks its ``__init__.py`` still ships (ruff's
INP rule flags the missing file; tests/test_packaging.py installs the built wheel into a fresh
environment and imports every module of the source tree from it).

The shipped study presets (``studies/*.toml`` and their notes) are edited in ``studies/`` and
copied into the wheel as ``osprey_train/study/presets/``, where ``osprey_train.study.presets``
finds them by name in an install; a build without them fails rather than ship a wheel whose
presets are missing.
"""

import shutil
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

# import name -> repository folder
ROOTS = {"osprey_data": "osprey_data", "osprey_train": "osprey_train", "osprey_cli": "cli",
         "osprey_schemas": "schemas"}


def _packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_namespace_packages(where=folder, exclude=["*__pycache__*"])
                  if "__pycache__" not in sub]
    return sorted(found)


PRESETS = Path(__file__).resolve().parent / "studies"


class BuildWithPresets(build_py):
    """build_py plus the study presets, copied into ``osprey_train/study/presets/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):   # an editable install reads the checkout's studies/
            return
        files = sorted([*PRESETS.glob("*.toml"), *PRESETS.glob("*.md")])
        if not any(f.suffix == ".toml" for f in files):
            raise RuntimeError(f"no study presets in {PRESETS}: the wheel would ship none")
        target = Path(self.build_lib) / "osprey_train" / "study" / "presets"
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy2(f, target / f.name)


setup(
    cmdclass={"build_py": BuildWithPresets},
    packages=_packages(),
    package_dir={name: folder for name, folder in ROOTS.items() if name != folder},
)
