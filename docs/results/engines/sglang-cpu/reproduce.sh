#!/usr/bin/env bash
# The SGLang CPU run behind docs/results/engines/sglang-cpu/report.md (2 CPU cores, about 10 minutes).
#
# SmolLM2-135M-Instruct and an Osprey drafter made in a minute, as tests/train/engines/test_vllm_engine.py
# makes it: the whole target (30 blocks) converted, its condition columns filled with seeded noise
# (scale 0.003), so that it drafts the target's own tokens and its drafts depend on the taps; then
# ``osprey eval engine --engine sglang --device cpu`` (bf16, SGLang's only CPU dtype) on the first
# demo prompt of each domain, S = 3, 32 new tokens, one thread.
#
# Usage (from the repository root, after ``.ci/sglang_venv.sh``):
#     docs/results/engines/sglang-cpu/reproduce.sh WORK_DIR [SGLANG_VENV]
set -euo pipefail
work="${1:?usage: reproduce.sh WORK_DIR [SGLANG_VENV]}"
venv="${2:-.venv-sglang}"
python - "$work" "$venv" <<'EOF'
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from osprey_data.target_model.fetch import fetch_smollm2
from osprey_train.engines.engine_eval import EngineEvalConfig, run
from osprey_train.models import load_drafter, save_drafter
from osprey_train.stages.configs import ConvertConfig
from osprey_train.stages.convert import run as convert
from osprey_train.stages.prune import PruneConfig
from osprey_train.stages.prune import run as prune

NOISE = 0.003


def main(work: Path, venv: str) -> int:
    torch.set_num_threads(1)
    work.mkdir(parents=True, exist_ok=True)
    target = fetch_smollm2()
    first: dict[str, str] = {}
    demo = Path("osprey_train/demo/prompts.jsonl")  # run from the repository root
    for line in demo.read_text(encoding="utf-8").splitlines():
        if line.strip():
            first.setdefault(json.loads(line)["domain"], line)
    (work / "eval.jsonl").write_text("".join(v + "\n" for v in first.values()), encoding="utf-8")
    if not (work / "osprey" / "config.json").is_file():
        torch.manual_seed(0)
        full = prune(PruneConfig(source=str(target), layers=30, out=work / "full")).out
        init = convert(ConvertConfig(arch="osprey", backbone=full, target=str(target), out=work / "osprey-init")).out
        drafter = load_drafter(init)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for block in drafter.extra_column_blocks():
                block.copy_(torch.randn(block.shape, generator=generator) * NOISE)
        save_drafter(drafter, work / "osprey")
    report = run(EngineEvalConfig(engine="sglang", device="cpu", drafter=work / "osprey", target=str(target),
                                  inputs=(str(work / "eval.jsonl"),), out=work / "run", steps=3, max_new_tokens=32,
                                  venv=venv))
    print(report.to_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ".venv-sglang"))
EOF
