#!/usr/bin/env bash
# The SGLang engine environment for the `sglang_cpu` tests: a venv of its own (SGLang pins
# transformers 5.12.1, ours takes newer), built from the CPU rig in ../shared/wheels (see its
# README: SGLang's CPU kernels are not on PyPI). Our package goes in with --no-deps next to the
# runtime needs it has that SGLang's list lacks (zarr, pyarrow, ...), so the versions SGLang pins win.
# Usage: .ci/sglang_venv.sh [VENV_DIR]   (default .venv-sglang; WHEELS=dir overrides the rig folder)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-sglang}"
wheels="${WHEELS:-../shared/wheels}"
[ -d "$wheels" ] || wheels=/work/shared/wheels
if [ ! -f "$wheels/sglang-cpu-requirements.txt" ]; then
  echo "sglang_venv.sh: no SGLang CPU rig in $wheels (set WHEELS=folder holding its README)" >&2
  exit 2
fi
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q torch==2.13.0
# The rig's list pins tokenizers==0.23.2, which its transformers==5.12.1 refuses (it needs
# tokenizers >=0.22,<=0.23.0, and checks that when imported): transformers picks tokenizers.
reqs="$venv/sglang-cpu-requirements.txt"
grep -v '^tokenizers==' "$wheels/sglang-cpu-requirements.txt" > "$reqs"
"$py" -m pip install -q -r "$reqs" triton==3.8.0
# Imported at engine start but missing from the rig's list (sglang-cpu's metadata names them);
# transformers and torch held where they are.
printf 'transformers==5.12.1\ntorch==2.13.0\n' > "$venv/pins.txt"
"$py" -m pip install -q -c "$venv/pins.txt" xgrammar==0.2.1 compressed-tensors tabulate
"$py" -m pip install -q --no-deps torchvision==0.28.0
tv_dir="$("$py" -c 'import os, torchvision; print(os.path.dirname(torchvision.__file__))' 2>/dev/null \
  || "$py" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torchvision").origin))')"
# Idempotent: a second run finds the patch applied and leaves it.
patch -N -s "$tv_dir/_meta_registrations.py" "$wheels/torchvision-cpu-meta.patch" || true
"$py" -m pip install -q --no-deps "$wheels"/sglang_kernel_cpu-0.4.5-*.whl "$wheels"/sglang_cpu-0.5.16.dev0+jul20-*.whl
# Our package without its dependency pins (transformers stays at SGLang's), then what it needs
# beyond SGLang's list; the test extra for pytest.
"$py" -m pip install -q --no-deps -e .
# Re-stating SGLang's transformers pin keeps the resolver from moving them.
"$py" -m pip install -q transformers==5.12.1 "pyarrow>=15" "zarr>=3.0" \
  "numcodecs>=0.15" "datasets>=3.0" "click>=8.1" "safetensors>=0.4" "fsspec>=2024.6" \
  "google-crc32c>=1.5" "jsonschema>=4.20" "tqdm>=4.66" "matplotlib>=3.8" "gguf>=0.10" \
  "accelerate>=0.34" "sentencepiece>=0.2" "pytest>=8"
SGLANG_USE_CPU_ENGINE=1 "$py" -c "import sglang, sgl_kernel, osprey_data; print('sglang', sglang.__version__)"
