#!/usr/bin/env bash
# The drafters and engine runs behind docs/results/engines/README.md (2 CPU cores, about an hour):
# one math store of SmolLM2-135M-Instruct's own responses, an EAGLE-3 and an Osprey drafter
# distilled on it, then `osprey eval engine` in vLLM (fp32 for parity, bf16 for speed) on held-out
# math prompts. Usage: docs/results/engines/reproduce.sh WORK_DIR   (needs engines/setup_vllm.sh first)
set -euo pipefail
work="${1:?usage: reproduce.sh WORK_DIR}"
data="${DATA:-../shared/data/prompts}"
target="$(python -c 'from osprey_data.target_model.fetch import fetch_smollm2; print(fetch_smollm2())')"
mkdir -p "$work"
head -n 10 "$data/math.eval.jsonl" > "$work/eval.jsonl"
osprey data build --target "$target" --input "$data/math.train.jsonl" --limit 64 --max-new-tokens 96 \
    --last-turn-only --dtype float32 --device cpu --out "$work/store"
osprey train convert --arch eagle3 --target "$target" --store "$work/store" --draft-vocab 8192 \
    --out "$work/eagle3-init" --overwrite
osprey train distill --drafter "$work/eagle3-init" --store "$work/store" --out "$work/eagle3" \
    --steps 100 --tokens-per-batch 1024 --ttt-steps 3 --lr 3e-3 --device cpu --resume-if-any
osprey train prune --source "$target" --layers 2 --out "$work/pruned" --overwrite
osprey train convert --backbone "$work/pruned" --store "$work/store" --out "$work/osprey-init" --overwrite
osprey train distill --drafter "$work/osprey-init" --store "$work/store" --out "$work/osprey" \
    --steps 100 --tokens-per-batch 1024 --ttt-steps 3 --lr 3e-3 --device cpu --resume-if-any
for arch in eagle3 osprey; do
  for dtype in float32 bfloat16; do
    osprey eval engine --engine vllm --drafter "$work/$arch/final" --target "$target" --input "$work/eval.jsonl" \
        --steps 3 --max-new-tokens 64 --dtype "$dtype" --out "$work/engine-$arch-$dtype" || true   # exit 1 = disagreement, reported
  done
done
