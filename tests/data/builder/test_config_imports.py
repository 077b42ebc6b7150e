"""Checking a build config loads no backend: ``BuildConfig`` and its backend-name check are torch-free,
and the names it accepts are exactly the backends the runner can start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from osprey_data.builder import BACKEND_NAMES, BuildConfig
from osprey_data.builder.backends import BACKENDS
from osprey_data.errors import ConfigError


def test_a_config_is_checked_without_importing_torch_or_a_backend():
    probe = ("import sys\n"
             "from osprey_data.builder import BuildConfig\n"
             "BuildConfig(target='t', inputs=('a.jsonl',), out='o', backend='sglang')\n"
             "loaded = [m for m in ('torch', 'transformers', 'osprey_data.builder.backends') if m in sys.modules]\n"
             "print(','.join(loaded))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", f"checking a BuildConfig imported {done.stdout.strip()}"


def test_backend_names_are_the_runner_backends():
    assert tuple(BACKENDS) == BACKEND_NAMES
    with pytest.raises(ConfigError, match="--backend 'vllm2' is unknown; use one of"):
        BuildConfig(target="t", inputs=("a.jsonl",), out="o", backend="vllm2")
