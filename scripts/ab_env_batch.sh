#!/usr/bin/env bash
# On the GPU host: the batched decode (`impnb bench --batch`, S_TG tok/s) of this tree under
# environment settings in one call, rounds interleaved, so they compare as ratios. A setting is
# one word of VAR=value pairs joined by '+' ('-' for the environment as it is); each setting has
# its own kernel cache (a switch read at build time changes kernels). Models: .gguf paths, or
# `qwen3-8b` / `qwen3-30b-a3b`, written first as synthetic Q4_K_M GGUFs under /tmp. Rows go to
# $OUT/ab-env.log.
#   BATCH=8,16 ROUNDS=2 bash scripts/ab_env_batch.sh qwen3-30b-a3b -- - IMPNB_GEMM_PAIR_MMQ_ROWS=8,16
#   bash scripts/ab_env_batch.sh qwen3-8b -- - IMPNB_WRS_PLAIN_TOKENS=16,32,64+IMPNB_PDL=1
set -uo pipefail
source "$(dirname "$0")/device_setup.sh"
OUT=${OUT:-/tmp/impnb-out}
mkdir -p "$OUT"
log=$OUT/ab-env.log
models=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do models+=("$1"); shift; done
shift || true
settings=("$@")
[ ${#models[@]} -gt 0 ] && [ ${#settings[@]} -gt 0 ] || { sed -n 2,9p "$0"; exit 2; }

path_of() {  # a model name or path -> the GGUF bench takes, writing the synthetic ones first
  case "$1" in
    qwen3-8b|qwen3-30b-a3b)
      local f=/tmp/$1-q4_k_m.gguf
      [ -f "$f" ] || timeout 300 python3 scripts/make_synthetic_full.py --model "$1" --quant Q4_K_M --out "$f" \
        --workers 8 >> "$OUT/ab-make.log" 2>&1
      echo "$f" ;;
    *) echo "$1" ;;
  esac
}

for m in "${models[@]}"; do
  p=$(path_of "$m")
  for r in $(seq "${ROUNDS:-2}"); do
    for i in "${!settings[@]}"; do
      s=${settings[$i]}
      env_words=()
      [ "$s" = "-" ] || IFS='+' read -r -a env_words <<< "$s"
      env "${env_words[@]}" IMPNB_CACHE_DIR=/tmp/impnb-cache-ab$i timeout 500 python3 -m impnb bench -m "$p" \
        --batch "${BATCH:-8,16,32}" -p 128 -n 128 -r 1 --device cuda 2>&1 | grep -E "^\| +[0-9]" |
        sed "s|^|$m round $r [$s] |" | tee -a "$log"
    done
  done
done
