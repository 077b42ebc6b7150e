"""The request/result plumbing shared by the engine drivers (:mod:`vllm_driver`, :mod:`sglang_driver`).

A driver runs inside an engine's own venv, so this module imports only the standard library (the
engine and torch are imported when :func:`serve` runs, after the driver's own imports): it reads
the request JSON, sets the thread budget, runs each configuration with the driver's ``one_run``
and writes the result so that a result file is complete or absent.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from typing import Any

__all__ = ["serve"]


def serve(argv: list[str], *, engine: str, version_key: str,
          one_run: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> int:
    """``argv`` = [REQUEST.json, RESULT.json]: every run of the request through ``one_run(run, request)``."""
    request_path, result_path = argv
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    module = importlib.import_module(engine)
    import torch

    torch.set_num_threads(int(request.get("threads", 1)))
    result: dict[str, Any] = {version_key: module.__version__, "torch_version": torch.__version__, "runs": []}
    for run in request["runs"]:
        print(f"[osprey {engine} driver] run {run['name']}", flush=True)
        result["runs"].append(one_run(run, request))
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)
    return 0
