#!/usr/bin/env bash
# Everything a GPU run checks, in one device call: GPU tests, end-to-end generation, kernel
# benchmarks. Logs and JSON go under $OUT; a short table is printed last.
#   bash scripts/gpu_check.sh [tests|e2e|bench|all]   (default all)
set -uo pipefail
what=${1:-all}
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export IMPNB_MODELS_DIR=${IMPNB_MODELS_DIR:-/root/impnb/models}
OUT=${OUT:-/tmp/impnb-out}
mkdir -p "$OUT"
declare -A status

if [[ $what == all || $what == tests ]]; then
  python3 -m pytest -q -m gpu -rs tests/gpu tests/test_kernel_build.py --junitxml="$OUT/gpu-tests.xml" \
    2>&1 | tee "$OUT/gpu-tests.log"
  status[gpu-tests]=$(tail -n 1 "$OUT/gpu-tests.log")
fi

if [[ $what == all || $what == e2e ]]; then
  : > "$OUT/e2e.log"
  run() {  # name, args...
    local name=$1; shift
    python3 -m impnb generate --device cuda --temperature 0 "$@" >"$OUT/e2e-$name.txt" 2>>"$OUT/e2e.log"
    status[e2e-$name]="rc=$? $(tr '\n' ' ' < "$OUT/e2e-$name.txt" | cut -c1-60)"
  }
  run gemma3 "The Eiffel Tower is located in the city of" -m gemma3-270m -n 16
  run smollm2 "What is the capital of France?" -m smollm2-135m --chat -n 24
fi

if [[ $what == all || $what == bench ]]; then
  [ -f scripts/bench_gemv.py ] && python3 scripts/bench_gemv.py --json "$OUT/bench-gemv.json" \
    2>&1 | tee "$OUT/bench-gemv.log"
fi

echo
echo "== impnb GPU check $(date -u +%F) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
for k in "${!status[@]}"; do printf '%-14s %s\n' "$k" "${status[$k]}"; done | sort
