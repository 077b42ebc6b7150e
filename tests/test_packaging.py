"""What the wheel installs: only ``osprey``-prefixed import names, the schemas and the console script.

A generic top-level name (``cli``, ``schemas``) can be overwritten, or deleted on uninstall, by
any other distribution that ships the same name; these tests build the real wheel from the
project's files and read its metadata.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What setuptools needs to build the wheel; copied so the build never writes into the checkout.
_SOURCES = ("pyproject.toml", "setup.py", "README.md", "osprey_data", "osprey_train", "cli", "schemas")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    for name in _SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, src / name)
    out = src / "dist"
    # The PEP 517 hook pip would call, without pip's isolated environment (no network needed).
    done = subprocess.run([sys.executable, "-c", "import setuptools.build_meta as b, sys; print(b.build_wheel(sys.argv[1]))",
                           str(out)], cwd=src, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    name = done.stdout.strip().splitlines()[-1]
    return zipfile.ZipFile(out / name)


def _dist_info(wheel: zipfile.ZipFile, file: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{file}")]
    return wheel.read(path).decode("utf-8")


def test_every_top_level_name_starts_with_osprey(wheel):
    top_level = _dist_info(wheel, "top_level.txt").split()
    assert sorted(top_level) == ["osprey_cli", "osprey_data", "osprey_schemas", "osprey_train"]
    roots = {n.split("/", 1)[0] for n in wheel.namelist()}
    assert all(r.startswith("osprey") for r in roots), roots


def test_wheel_ships_schemas_and_the_console_script(wheel):
    names = set(wheel.namelist())
    schema_files = sorted(p.name for p in (ROOT / "schemas").glob("*.json"))
    assert schema_files and all(f"osprey_schemas/{n}" in names for n in schema_files)
    assert "osprey_cli/main.py" in names and "cli/main.py" not in names
    entry_points = configparser.ConfigParser()
    entry_points.read_string(_dist_info(wheel, "entry_points.txt"))
    assert dict(entry_points["console_scripts"]) == {"osprey": "osprey_cli.main:main"}


def test_installed_names_map_to_the_repository_folders():
    """The editable install used by CI maps the prefixed names onto ``cli/`` and ``schemas/``."""
    import osprey_cli.main
    import osprey_schemas

    assert Path(osprey_cli.main.__file__).resolve() == ROOT / "cli" / "main.py"
    assert Path(osprey_schemas.__file__).resolve() == ROOT / "schemas" / "__init__.py"
    assert "store-manifest.v1.json" in osprey_schemas.SCHEMA_NAMES


def test_console_script_runs():
    script = Path(sys.executable).with_name("osprey")
    assert script.is_file(), f"no console script next to {sys.executable}; install with pip install -e ."
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "train" in done.stdout and "data" in done.stdout


def test_no_source_folder_is_named_build():
    """Tools treat ``build/`` as build output (pytest, black and code maps skip it)."""
    found = [p for top in ("osprey_data", "osprey_train", "cli", "schemas", "tests")
             for p in (ROOT / top).rglob("build") if p.is_dir()]
    assert not found, found
