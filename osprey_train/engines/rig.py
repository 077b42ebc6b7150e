"""Finding an engine's virtual environment and running a script inside it.

vLLM's venv is made by ``engines/setup_vllm.sh`` (vLLM from PyPI, this package installed into it
without dependencies), SGLang's by ``.ci/sglang_venv.sh`` on CPU machines (the SGLang CPU rig of
``../shared/wheels``; PyPI ``sglang`` plus this package without dependencies on CUDA machines).
It is looked for in ``--venv``, then ``$OSPREY_VLLM_VENV`` / ``$OSPREY_SGLANG_VENV``, then
``.venv-vllm`` / ``.venv-sglang`` in the current folder (the repository root, where the scripts
put them). A missing venv, or one without the engine or without this package, is a one-line error
saying how to make it; an engine run that fails is one line: its last exception line and where the whole log is.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from osprey_data.atomic import write_json
from osprey_data.errors import BackendUnavailableError

__all__ = ["ENGINES", "EngineRig", "find_rig", "run_driver"]

ENGINES = {"vllm": {"env": "OSPREY_VLLM_VENV", "default": ".venv-vllm", "setup": "engines/setup_vllm.sh",
                    "module": "vllm", "probe_env": {}},
           # SGLang's CPU build reads SGLANG_USE_CPU_ENGINE when imported
           "sglang": {"env": "OSPREY_SGLANG_VENV", "default": ".venv-sglang",
                      "setup": ".ci/sglang_venv.sh (CPU) or `pip install sglang` + `pip install --no-deps -e .` (CUDA)",
                      "module": "sglang", "probe_env": {"SGLANG_USE_CPU_ENGINE": "1"}}}
_LOG_TAIL = 200   # log lines searched for the exception
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


@dataclass(frozen=True)
class EngineRig:
    """An engine's venv: its interpreter and where it was found."""

    engine: str
    venv: Path
    python: Path


def find_rig(engine: str, venv: str | os.PathLike | None = None, *, env: dict[str, str] | None = None) -> EngineRig:
    """The engine's venv (checked to import the engine and this package, with ``env`` set: the run's
    settings; default the engine's import settings), or BackendUnavailableError."""
    if engine not in ENGINES:
        raise BackendUnavailableError(f"engine {engine!r}: known engines are {sorted(ENGINES)}")
    spec = ENGINES[engine]
    where = venv or os.environ.get(spec["env"]) or spec["default"]
    path = Path(where).expanduser().absolute()  # the driver runs with its own working folder
    python = path / "bin" / "python"
    how = (f"create it with `{spec['setup']}` from the repository root, or pass --venv / set "
           f"{spec['env']} to an existing one")
    if not python.is_file():
        raise BackendUnavailableError(f"{engine} engine venv {path} not found (no {python}); {how}")
    probe = subprocess.run([str(python), "-c", f"import {spec['module']}, osprey_train.engines"],
                           capture_output=True, text=True, env=_clean_env(spec["probe_env"] if env is None else env))
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        raise BackendUnavailableError(f"{engine} engine venv {path} cannot import {spec['module']} and "
                                      f"osprey_train ({last}); {how}")
    return EngineRig(engine=engine, venv=path, python=python)


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without what would leak our venv into the engine's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra or {})
    return env


def _cause(log_path: Path) -> str:
    """The engine log's last exception line (errors are printed as one line; the log keeps the rest)."""
    lines = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-_LOG_TAIL:]
    for line in reversed(lines):
        text = line.split("]: ")[-1].strip()   # vLLM prefixes worker lines with "[rank0]: "
        if _EXCEPTION.match(text):
            return text
    return (lines[-1].strip() if lines else "the log is empty") or "?"


def run_driver(rig: EngineRig, module: str, request: dict, workdir: Path, *, env: dict[str, str] | None = None,
               timeout_s: float | None = None, log=None) -> dict:
    """Run ``python -m module REQUEST.json RESULT.json`` in the engine's venv; return the result.

    The engine's output goes to ``workdir/engine.log``; a failure raises with its last exception line.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    req, res, log_path = workdir / "engine-request.json", workdir / "engine-result.json", workdir / "engine.log"
    res.unlink(missing_ok=True)
    write_json(req, request)
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as out:
        try:
            proc = subprocess.run([str(rig.python), "-m", module, str(req), str(res)], stdout=out,
                                  stderr=subprocess.STDOUT, env=_clean_env(env), timeout=timeout_s,
                                  cwd=str(workdir))
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = time.perf_counter() - t0
    if code != 0 or not res.is_file():
        why = "timed out" if code is None else f"exited with {code}"
        raise BackendUnavailableError(f"{rig.engine} run {why} after {seconds:.0f} s: {_cause(log_path)} "
                                      f"(the whole log: {log_path})")
    if log is not None:
        log(f"{rig.engine} engine run took {seconds:.0f} s (log {log_path})")
    result = json.loads(res.read_text(encoding="utf-8"))
    result["wall_s"] = seconds
    return result
