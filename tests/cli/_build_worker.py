"""Subprocess entry of the shared-store tests: one builder worker, ``run(BuildConfig(**json))``.

Usage: ``python -m tests.cli._build_worker '<BuildConfig kwargs as JSON>'`` (credentials and
endpoint come from the environment, as in production). Prints the build summary.
"""

from __future__ import annotations

import json
import sys

import torch

from osprey_data.builder import BuildConfig

from osprey_data.builder.runner import run

if __name__ == "__main__":
    torch.set_num_threads(1)  # two workers share the test machine's cores
    print(run(BuildConfig(**json.loads(sys.argv[1]))).format(), flush=True)
