"""Package layout, the one part of the build that pyproject.toml cannot say.

The repository keeps the folders ``cli/`` and ``schemas/``, but they install as ``osprey_cli``
and ``osprey_schemas``: every top-level import name this wheel installs starts with ``osprey``,
so another distribution shipping a generic ``cli`` or ``schemas`` package can never overwrite
ours. Metadata, dependencies, package data and the console script live in pyproject.toml.
"""

from setuptools import find_packages, setup

# import name -> repository folder
RENAMED_PACKAGES = {"osprey_cli": "cli", "osprey_schemas": "schemas"}

setup(
    packages=find_packages(include=["osprey_data", "osprey_data.*", "osprey_train", "osprey_train.*"])
    + sorted(RENAMED_PACKAGES),
    package_dir=RENAMED_PACKAGES,
)
