#!/usr/bin/env bash
# On the GPU host: `impnb bench` of this tree and of another checkout (BASE, e.g. a `git archive`
# of an older commit unpacked under .dev/) on the same models in one call, rounds interleaved
# (head, base, head, base, ...), so the two compare as a ratio. This tree uses the default kernel
# cache, BASE its own (/tmp/impnb-cache-base). Models: names or .gguf paths; `qwen3-8b` and `qwen3-30b-a3b` are written first as
# synthetic Q4_K_M GGUFs under /tmp (scripts/make_synthetic_full.py). Rows go to $OUT/ab-bench.log,
# the table last.
# REPS sets bench's -r (default 3).
#   BASE=.dev/base ROUNDS=2 bash scripts/ab_bench.sh smollm2-135m gemma3-270m qwen3-8b qwen3-30b-a3b
set -uo pipefail
source "$(dirname "$0")/device_setup.sh"
export IMPNB_MODELS_DIR=${IMPNB_MODELS_DIR:-/root/impnb/models}
OUT=${OUT:-/tmp/impnb-out}
BASE=$(cd "${BASE:?BASE=<checkout to compare with>}" && pwd)
ROUNDS=${ROUNDS:-2}
HEAD=$PWD
mkdir -p "$OUT"
log=$OUT/ab-bench.log
: > "$log"

path_of() {  # a model name or path -> what bench takes, writing the synthetic ones first
  case "$1" in
    qwen3-8b|qwen3-30b-a3b)
      local f=/tmp/$1-q4_k_m.gguf
      [ -f "$f" ] || timeout 300 python3 "$HEAD/scripts/make_synthetic_full.py" --model "$1" --quant Q4_K_M \
        --out "$f" >> "$OUT/ab-make.log" 2>&1
      echo "$f" ;;
    *) echo "$1" ;;
  esac
}

bench() {  # tree, model -> "pp512 tg128"
  local cache=${IMPNB_CACHE_DIR:-$HOME/.cache/impnb/kernels}
  [ "$1" = "$BASE" ] && cache=/tmp/impnb-cache-base
  (cd "$1" && IMPNB_CACHE_DIR=$cache PYTHONPATH=/tmp/site:$1 \
    timeout 400 python3 -m impnb bench -m "$2" -p 512 -n 128 -r "${REPS:-3}" --device cuda --json 2>>"$log") |
    python3 -c 'import json,sys; r={x["test"]: x["tok_s"] for x in json.load(sys.stdin)}; print(r.get("pp512", 0), r.get("tg128", 0))'
}

declare -A rows
for m in "$@"; do
  p=$(path_of "$m")
  for r in $(seq "$ROUNDS"); do
    for tree in "$HEAD" "$BASE"; do
      v=$(bench "$tree" "$p")
      echo "$m $(basename "$tree") round $r: pp512 tg128 = $v" | tee -a "$log"
      rows[$m,$(basename "$tree")]+="$v;"
    done
  done
done

echo "| model | head pp512 | base pp512 | ratio | head tg128 | base tg128 | ratio |"
echo "|---|---|---|---|---|---|---|"
for m in "$@"; do
  python3 - "$m" "${rows[$m,$(basename "$HEAD")]}" "${rows[$m,$(basename "$BASE")]}" <<'EOF'
import statistics, sys
m, head, base = sys.argv[1:]
h = [tuple(map(float, x.split())) for x in head.split(";") if x.strip()]
b = [tuple(map(float, x.split())) for x in base.split(";") if x.strip()]
hp, ht = statistics.median(x[0] for x in h), statistics.median(x[1] for x in h)
bp, bt = statistics.median(x[0] for x in b), statistics.median(x[1] for x in b)
print(f"| {m} | {hp:.0f} | {bp:.0f} | {hp / bp if bp else 0:.3f} | {ht:.1f} | {bt:.1f} | {ht / bt if bt else 0:.3f} |")
EOF
done
