#!/usr/bin/env bash
# The checks that need a GPU, as one script for a CUDA machine (CI has none): the `gpu`-marked tests
# and benchmarks/distill_gpu_bench.py. Run from the repository root:
#   bash benchmarks/gpu_check.sh [OUT_DIR]
# On a machine without network access, carry the wheels the image lacks in .whl/ (zarr, numcodecs,
# donfig, google-crc32c, jsonschema + referencing + jsonschema-specifications + rpds-py, datasets,
# dill, multiprocess, gguf); they are installed into /tmp/site. The package is used from the
# checkout, not installed: its import names osprey_cli / osprey_schemas are linked to cli/ and
# schemas/ exactly as setup.py maps them.
set -uo pipefail
out=${1:-${OUT:-/tmp/osprey-gpu-check}}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
mkdir -p /tmp/osprey-links
ln -sfn "$PWD/cli" /tmp/osprey-links/osprey_cli
ln -sfn "$PWD/schemas" /tmp/osprey-links/osprey_schemas
export PYTHONPATH="$PWD:/tmp/osprey-links:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$out/gpu.txt"

rc=0
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
  tests/train/ttt/test_attention.py tests/train/trainer/test_loop.py tests/train/export/test_export.py \
  tests/data/builder/test_backend_hf_cuda.py tests/train/demo/test_demo_cuda.py \
  tests/train/evaluation/test_tree_live.py 2>&1 | tee "$out/gpu-tests.log" || rc=1
timeout ${GPU_BENCH_TIMEOUT:-240} python3 benchmarks/distill_gpu_bench.py --seqs ${GPU_BENCH_SEQS:-4096,8192} \
  --impls ${GPU_BENCH_IMPLS:-sdpa,flex} --repeats 3 --out "$out/distill_gpu.md" 2>&1 | tee "$out/distill-gpu.log" || rc=1
exit $rc
