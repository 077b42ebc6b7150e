"""What the wheel installs, and that it works installed the way users install it.

A generic top-level name (``cli``, ``schemas``) can be overwritten, or deleted on uninstall, by
any other distribution that ships the same name; these tests build the real wheel from the
project's files and read its metadata. Then the wheel is installed, **not editable**, into a
fresh virtual environment, and every module of the source tree is imported from there, every
command's ``--help`` runs from its console script, and so does the tiny study preset: a module
the wheel leaves out (a folder without ``__init__.py`` once dropped ``osprey_train/study/``) fails
here, where the editable install of CI and the README could not notice.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from osprey_cli.main import COMMANDS

from tests.helpers.tiny_study import write_tiny_study
from tests.helpers.venvs import venv_over_ours

ROOT = Path(__file__).resolve().parents[1]
# What setuptools needs to build the wheel; copied so the build never writes into the checkout.
_SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "osprey_data", "osprey_train", "cli", "schemas",
            "studies")


# import name -> repository folder, as setup.py maps them
_ROOTS = {"osprey_data": "osprey_data", "osprey_train": "osprey_train", "osprey_cli": "cli",
          "osprey_schemas": "schemas"}


def _source_modules() -> set[str]:
    """Every module of the source tree by import name (a folder of .py files is a package)."""
    found = set()
    for name, folder in _ROOTS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found.add(".".join(parts))
    return found


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory) -> Path:
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
    return out / name


@pytest.fixture(scope="module")
def wheel(wheel_path) -> zipfile.ZipFile:
    return zipfile.ZipFile(wheel_path)


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


def test_wheel_ships_the_study_presets_and_their_notes(wheel):
    names = set(wheel.namelist())
    shipped = sorted([*(ROOT / "studies").glob("*.toml"), *(ROOT / "studies").glob("*.md")])
    assert any(p.name == "smollm2-quick.toml" for p in shipped)
    missing = [p.name for p in shipped if f"osprey_train/study/presets/{p.name}" not in names]
    assert not missing, missing


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


def test_wheel_ships_every_module_of_the_source_tree(wheel):
    shipped = set()
    for name in wheel.namelist():
        if name.endswith(".py") and not name.split("/", 1)[0].endswith(".dist-info"):
            parts = name[:-3].split("/")
            if parts[-1] == "__init__":
                parts.pop()
            shipped.add(".".join(parts))
    missing = sorted(_source_modules() - shipped)
    assert not missing, f"the wheel leaves out {len(missing)} modules: {missing[:10]}"


@pytest.fixture(scope="module")
def installed(wheel_path, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed non-editable; returns its bin/ folder.

    The dependencies (torch, transformers, ...) are not reinstalled: a ``.pth`` file puts this
    environment's site-packages folders after the venv's own. A path named in a ``.pth`` file is
    not itself scanned for ``.pth`` files, so the editable install of the checkout (a finder
    hooked in by its own ``.pth``) stays out, and the test below checks that ``osprey_*`` is
    imported from the venv.
    """
    py = venv_over_ours(tmp_path_factory.mktemp("wheel-venv") / "venv", with_pip=True)
    bindir = py.parent
    done = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return bindir


def _clean_env() -> dict[str, str]:
    # Nothing of the checkout on the path: only the installed wheel may provide osprey_*.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


# Modules that only an engine's own venv can import (they subclass the engine's classes): the
# wheel must ship them, but they are located here, not imported.
ENGINE_ONLY = {"osprey_train.drafters.osprey.vllm_model", "osprey_data.builder.backends.vllm_rig.osprey_sync_connector"}


def test_every_module_imports_from_the_installed_wheel(installed, tmp_path):
    probe = """
import importlib, importlib.util, json, sys
names, engine_only = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
failed, outside = {}, []
for name in names:
    try:
        if name in engine_only:
            found = importlib.util.find_spec(name)
            if found is None:
                raise ModuleNotFoundError(name)
            path = found.origin
        else:
            path = importlib.import_module(name).__file__
    except Exception as exc:
        failed[name] = repr(exc)[:300]
        continue
    if not path.startswith(sys.prefix):
        outside.append((name, path))
print(json.dumps({"failed": failed, "outside": outside}))
"""
    names = sorted(_source_modules())
    assert ENGINE_ONLY <= set(names)
    done = subprocess.run([str(installed / "python"), "-c", probe, json.dumps(names), json.dumps(sorted(ENGINE_ONLY))],
                          cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=_clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["failed"], result["failed"]
    assert not result["outside"], f"imported from outside the installed wheel: {result['outside'][:5]}"


def test_every_command_help_runs_from_the_installed_script(installed, tmp_path):
    script = installed / "osprey"
    commands = [[]] + [[group, name] if group else [name] for group, names in COMMANDS.items()
                       for name in names] + [[group] for group in COMMANDS if group]
    failed = []
    for argv in commands:
        done = subprocess.run([str(script), *argv, "--help"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env=_clean_env())
        if done.returncode != 0 or "Usage:" not in done.stdout:
            failed.append((argv, done.returncode, done.stderr[-500:]))
    assert len(commands) > 15
    assert not failed, failed


def test_the_tiny_study_runs_from_the_installed_wheel(installed, tmp_path, tiny_llama_dir):
    study = write_tiny_study(tmp_path / "spec", tiny_llama_dir)
    out = tmp_path / "out"
    env = {**_clean_env(), "OSPREY_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([str(installed / "osprey"), "study", "run", str(study), "--out", str(out), "--no-progress"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    done = subprocess.run([str(installed / "osprey"), "study", "status", str(study), "--out", str(out), "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    state = json.loads(done.stdout)
    assert state["done"] == state["total"] > 0, state


def test_presets_resolve_by_name_from_the_installed_wheel(installed, tmp_path):
    """``osprey study ... NAME`` finds a shipped preset in the install, not in a checkout: the one
    that needs only shipped data loads (its prompts are package data), one that reads the project's
    shared data fails at once with one line naming the missing file and where it comes from."""
    env = _clean_env()
    done = subprocess.run([str(installed / "osprey"), "study", "status", "smollm2-quick", "--out", str(tmp_path / "q"),
                           "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    state = json.loads(done.stdout)
    assert state["done"] == 0 < state["total"], state
    done = subprocess.run([str(installed / "osprey"), "study", "run", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert "smollm2-quick" in done.stdout and "smollm2-cpu" in done.stdout, done.stdout
    done = subprocess.run([str(installed / "osprey"), "study", "status", "preset:smollm2-cpu", "--out",
                           str(tmp_path / "c")], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "chat.train.jsonl does not exist" in lines[0] and "cp " in lines[0], lines[0]
    assert "prompts of this study are not shipped with Osprey" in lines[0], lines[0]
