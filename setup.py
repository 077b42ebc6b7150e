"""Package layout, the one part of the build that pyproject.toml cannot say.

The repository keeps the folders ``cli/`` and ``schemas/``, but they install as ``osprey_cli``
and ``osprey_schemas``: every top-level import name this wheel installs starts with ``osprey``,
so another distribution shipping a generic ``cli`` or ``schemas`` package can never overwrite
ours. Metadata, dependencies, package data and the console script live in pyproject.toml.

Below the four roots nothing is listed by hand: every folder is discovered as a package
(``find_namespace_packages``), so a folder that lacks its ``__init__.py`` still ships (ruff's
INP rule flags the missing file; tests/test_packaging.py installs the built wheel into a fresh
environment and imports every module of the source tree from it).
"""

from setuptools import find_namespace_packages, setup

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


setup(
    packages=_packages(),
    package_dir={name: folder for name, folder in ROOTS.items() if name != folder},
)
