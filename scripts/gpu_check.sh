#!/usr/bin/env bash
# Everything a GPU run checks, in one device call: GPU tests, end-to-end generation with and
# without CUDA graphs, kernel benchmarks. Logs go under $OUT; a short table is printed last.
#   bash scripts/gpu_check.sh [tests|e2e|smoke|bench|moe|llama|ncu|trace|attn|decode|dp4a|blocks|startup|batch|
#                              serve|serve-soak|llama-server|serve-bench|all]
#   (all: not moe, llama, ncu, trace, attn, decode, dp4a, blocks, startup, batch, serve*, llama-server)
# decode tests and benches decode attention (vs torch SDPA); moe writes the full-size synthetic
# Qwen3-30B-A3B Q4_K_M (18.6 GB, ~70 s) to /tmp and benches it, and times one layer's routed
# experts at decode piece by piece (bench_moe_decode.py) and a megakernel's floor on its bytes
# (bench_decode_floor.py); llama builds llama.cpp's llama-bench and times it beside impnb's bench
# on the same GGUF (see its block); ncu profiles each kernel of one decode
# step of that model (NCU_MODEL for another) and tabulates them (ncu_table.py, ~4 min); trace
# records a batch's decode step in its graph (trace_batch.py: TRACE_MODELS, BATCHES); dp4a
# benches the dp4a GEMV and a synthetic Qwen3-8B Q4_K_M with and without it (see its block for
# DP4A_MB, DP4A_VARIANTS, DP4A_TYPES, BASE); blocks times how fast few blocks read from HBM
# (bench_block_bandwidth.py).
set -uo pipefail
what=${1:-all}
source "$(dirname "$0")/device_setup.sh"
export IMPNB_MODELS_DIR=${IMPNB_MODELS_DIR:-/root/impnb/models}
OUT=${OUT:-/tmp/impnb-out}
mkdir -p "$OUT"
declare -A status

build_llama() {  # targets...: llama.cpp built in /tmp/llama from .dev/llama/src.tgz (scripts/llama_cpp_stage.sh),
  # offline: no web UI (an empty asset table is generated), no OpenSSL, no curl
  local src=$PWD/.dev/llama/src.tgz
  (mkdir -p /tmp/llama && cd /tmp/llama && tar xzf "$src" &&
    { printf '%s\n' 'find_package(Threads REQUIRED)' 'llama_add_compile_flags()'
      for d in llama-bench batched-bench ui mtmd server; do [ ! -d tools/$d ] || echo "add_subdirectory($d)"; done
    } > tools/CMakeLists.txt &&
    cmake -S . -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
      -DCMAKE_BUILD_TYPE=Release && timeout 540 cmake --build build --target "$@" -j "$(nproc)")
}

if [[ $what == all || $what == tests ]]; then
  # the whole GPU suite outgrew one device call (~10 min): GPU_TESTS picks files, e.g.
  # GPU_TESTS="tests/gpu/test_engine.py tests/gpu/test_graphs.py"
  timeout 540 python3 -m pytest -q -m gpu ${GPU_TESTS:-tests/gpu} -p no:cacheprovider -W ignore -s \
    --junitxml="$OUT/gpu-tests.xml" > "$OUT/gpu-tests.log" 2>&1
  status[gpu-tests]="rc=$? $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$OUT/gpu-tests.log" | tail -n 1)"
fi

if [[ $what == all || $what == e2e ]]; then
  : > "$OUT/e2e.log"
  gen() {  # name, args...
    local name=$1; shift
    timeout 120 python3 -m impnb generate --device cuda --temperature 0 "$@" >"$OUT/e2e-$name.txt" 2>>"$OUT/e2e.log"
    status[e2e-$name]="rc=$? $(tail -n 1 "$OUT/e2e.log" | sed 's/.*prefill/prefill/') | $(tr '\n' ' ' < "$OUT/e2e-$name.txt" | cut -c1-40)"
  }
  for m in smollm2-135m gemma3-270m; do
    gen "$m-graphs" "The Eiffel Tower is located in the city of" -m "$m" -n 128
    gen "$m-eager" "The Eiffel Tower is located in the city of" -m "$m" -n 128 --no-graphs
  done
fi

if [[ $what == all || $what == smoke ]]; then
  timeout 400 python3 scripts/smoke.py multi-model --device cuda --json "$OUT/smoke.json" > "$OUT/smoke.txt" 2> "$OUT/smoke.log"
  status[smoke]="rc=$? $(tail -n 1 "$OUT/smoke.txt")"
fi

if [[ $what == blocks ]]; then
  timeout 120 python3 scripts/bench_block_bandwidth.py > "$OUT/bench-blocks.log" 2>&1
  status[bench-blocks]="rc=$? see bench-blocks.log"
fi

if [[ $what == moe ]]; then
  moe=/tmp/qwen3-30b-a3b-q4_k_m.gguf
  [ -f $moe ] || timeout 200 python3 scripts/make_synthetic_full.py --model qwen3-30b-a3b --quant Q4_K_M --out $moe > "$OUT/moe-make.log" 2>&1
  timeout 300 python3 -m impnb bench -m $moe -p 512 -n 128 -r 3 --device cuda > "$OUT/bench-moe.log" 2>&1
  status[bench-moe]="rc=$? $(grep -E 'tg128' "$OUT/bench-moe.log" | tail -n 1 | awk -F'|' '{print $8 $9 $10}')"
  timeout 200 python3 scripts/bench_moe_decode.py --json "$OUT/bench-moe-decode.json" > "$OUT/bench-moe-decode.log" 2>&1
  status[bench-moe-decode]="rc=$? see bench-moe-decode.log"
  timeout 200 python3 scripts/bench_decode_floor.py $moe > "$OUT/bench-floor.log" 2>&1
  status[bench-floor]="rc=$? $(grep -E '^prefetched, 4' "$OUT/bench-floor.log" | awk '{print $(NF-2), $NF}')"
fi

if [[ $what == llama ]]; then
  # llama.cpp's llama-bench built here from .dev/llama/src.tgz (scripts/llama_cpp_stage.sh; ~4.5 min
  # on 16 cores) against impnb's bench on the same GGUFs (LLAMA_GGUF, default the synthetic
  # Qwen3-30B-A3B Q4_K_M), in one call
  moe=/tmp/qwen3-30b-a3b-q4_k_m.gguf
  if [[ -z ${LLAMA_GGUF:-} && ! -f $moe ]]; then
    timeout 200 python3 scripts/make_synthetic_full.py --model qwen3-30b-a3b --quant Q4_K_M --out $moe > "$OUT/moe-make.log" 2>&1
  fi
  build_llama llama-bench > "$OUT/llama-build.log" 2>&1
  status[llama-build]="rc=$?"
  for m in ${LLAMA_GGUF:-$moe}; do
    name=$(basename "$m" .gguf)
    timeout 200 /tmp/llama/build/bin/llama-bench -m "$m" -p 512 -n 128 -r 3 -ngl 99 -fa 0,1 >> "$OUT/bench-llama.log" 2>&1
    status[llama-$name]="rc=$? $(grep -E 'tg128' "$OUT/bench-llama.log" | tail -n 2 | awk -F'|' '{printf "fa%s%s ", $7, $9}')"
    timeout 200 python3 -m impnb bench -m "$m" -p 512 -n 128 -r 3 --device cuda >> "$OUT/bench-llama.log" 2>&1
    status[impnb-$name]="rc=$? $(grep -E 'tg128' "$OUT/bench-llama.log" | tail -n 1 | awk -F'|' '{print $9}')"
  done
fi

if [[ $what == ncu ]]; then
  model=${NCU_MODEL:-/tmp/qwen3-30b-a3b-q4_k_m.gguf}
  [ -f "$model" ] || timeout 200 python3 scripts/make_synthetic_full.py --model qwen3-30b-a3b --quant Q4_K_M \
    --out "$model" > "$OUT/moe-make.log" 2>&1
  timeout 450 "$(command -v ncu || echo /usr/local/cuda/bin/ncu)" --profile-from-start off --csv --section SpeedOfLight \
    --section WarpStateStats --section LaunchStats --section Occupancy --metrics dram__bytes_read.sum \
    python3 scripts/profile_step.py "$model" --ncu > "$OUT/ncu.csv" 2> "$OUT/ncu.log"
  status[ncu]="rc=$? see ncu-table.txt"
  python3 scripts/ncu_table.py "$OUT/ncu.csv" --json "$OUT/ncu-table.json" > "$OUT/ncu-table.txt" 2>&1
  status[ncu-table]="rc=$? $(tail -n 1 "$OUT/ncu-table.txt")"
fi

if [[ $what == trace ]]; then  # a batch's decode step kernel by kernel in its graph (CUPTI; cupti-python in .dev/whl)
  for m in ${TRACE_MODELS:-qwen3-30b-a3b}; do
    f=/tmp/$m-q4_k_m.gguf
    [ -f "$f" ] || timeout 200 python3 scripts/make_synthetic_full.py --model "$m" --quant Q4_K_M --out "$f" \
      --workers 12 > "$OUT/make-$m.log" 2>&1
    timeout 400 python3 scripts/trace_batch.py "$f" --batch "${BATCHES:-8}" --json "$OUT/trace-$m.json" \
      > "$OUT/trace-$m.log" 2>&1
    status[trace-$m]="rc=$? $(grep -m1 -E '^B=' "$OUT/trace-$m.log")"
  done
fi

if [[ $what == decode ]]; then
  timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_attention.py tests/gpu/test_launch.py -k decode \
    -p no:cacheprovider -W ignore > "$OUT/decode-tests.log" 2>&1
  status[decode-tests]="rc=$? $(tail -n 1 "$OUT/decode-tests.log")"
  timeout 200 python3 scripts/bench_decode_attention.py --models smollm2,gemma3,qwen3-30b-a3b \
    --ctx 131,256,512,1024,4096,16384,32768 --torch --short --short-clusters 1,2,8 --json "$OUT/bench-decode-attention.json" \
    > "$OUT/bench-decode-attention.log" 2>&1
  status[bench-decode-attention]="rc=$? see bench-decode-attention.log"
fi

if [[ $what == dp4a ]]; then
  # the dp4a decode GEMV end to end: synthetic Qwen3-8B Q4_K_M (dense, norms fused into the
  # GEMVs), tg128 at each IMPNB_DP4A_MIN_MB of DP4A_MB (default: off, then the rule's 8); the
  # GEMV alone on 4096x14336 and 14336x4096 in choose_capped's variant or DP4A_VARIANTS (e.g.
  # s64u1r8,s128u2r4); with BASE=<another checkout's root>, its GEMV and tg128 in the same call
  q8b=/tmp/qwen3-8b-q4_k_m.gguf
  types=${DP4A_TYPES:-Q8_0,Q4_K,Q4_1}
  gemv_args=(--tokens 1 --types "$types" --dp4a ${DP4A_VARIANTS:-})
  # compile every kernel first, a process a type and shape (the cubin cache), so the timed runs load them
  for shape in 4096x14336 14336x4096; do
    for t in ${types//,/ }; do
      timeout 200 python3 scripts/bench_gemv.py --shape $shape --tokens 1 --types $t --dp4a ${DP4A_VARIANTS:-} \
        --reps 2 --copies 2 > /dev/null 2>&1 &
    done
  done
  wait
  for shape in 4096x14336 14336x4096; do
    timeout 200 python3 scripts/bench_gemv.py --shape $shape "${gemv_args[@]}" --json "$OUT/bench-gemv-dp4a-$shape.json" \
      >> "$OUT/bench-gemv-dp4a.log" 2>&1
    status[bench-gemv-dp4a-$shape]="rc=$? see bench-gemv-dp4a.log"
    if [ -n "${BASE:-}" ]; then
      (cd "$BASE" && PYTHONPATH=/tmp/site:$BASE timeout 200 python3 scripts/bench_gemv.py --shape $shape --tokens 1 \
        --types "$types" --dp4a) >> "$OUT/bench-gemv-dp4a-base.log" 2>&1
      status[bench-gemv-dp4a-base-$shape]="rc=$? see bench-gemv-dp4a-base.log"
    fi
  done
  [ -f $q8b ] || timeout 200 python3 scripts/make_synthetic_full.py --model qwen3-8b --quant Q4_K_M --out $q8b > "$OUT/q8b-make.log" 2>&1
  for mb in ${DP4A_MB:-1e9 8}; do
    for tree in "$PWD" ${BASE:-}; do
      (cd "$tree" && PYTHONPATH=/tmp/site:$tree IMPNB_DP4A_MIN_MB=$mb timeout 200 python3 -m impnb bench -m $q8b -p 512 \
        -n 128 -r 2 --device cuda) >> "$OUT/bench-dp4a.log" 2>&1
      status[bench-q8b-dp4a-$mb${BASE:+-$(basename "$tree")}]="rc=$? $(grep -E 'tg128' "$OUT/bench-dp4a.log" |
        tail -n 1 | awk -F'|' '{print $8 $9 $10}')"
    done
  done
fi

if [[ $what == attn ]]; then
  timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_attention_fa2.py tests/gpu/test_attention_real.py -p no:cacheprovider -W ignore -n 8 \
    > "$OUT/attn-tests.log" 2>&1
  status[attn-tests]="rc=$? $(tail -n 1 "$OUT/attn-tests.log")"
  timeout 300 python3 scripts/bench_attention.py --tilings m32,wg --json "$OUT/bench-attention.json" \
    > "$OUT/bench-attention.log" 2>&1
  status[bench-attention]="rc=$? see bench-attention.log"
fi

if [[ $what == startup ]]; then
  # process start to the first token and to the last of `generate -n 32`, warm and cold (a fresh
  # IMPNB_CACHE_DIR), and `info`, on both real models (scripts/bench_startup.py); beside llama.cpp's
  # start to one token where LLAMA_BENCH names a llama-bench (the llama mode builds
  # /tmp/llama/build/bin/llama-bench); with BASE=<another checkout's root> its impnb too, same call
  lb=${LLAMA_BENCH:-/tmp/llama/build/bin/llama-bench}
  [ -x "$lb" ] || lb=
  timeout 220 python3 scripts/bench_startup.py --json "$OUT/startup.json" ${lb:+--llama-bench "$lb"} \
    > "$OUT/startup.log" 2>&1
  status[startup]="rc=$? $(grep -E '^\| (gemma|smol)' "$OUT/startup.log" | awk -F'|' '{printf "%s:%s/%s/%s ", $2, $4, $5, $6}')"
  if [ -n "${BASE:-}" ]; then
    timeout 370 python3 scripts/bench_startup.py --root "$BASE" --json "$OUT/startup-base.json" \
      > "$OUT/startup-base.log" 2>&1
    status[startup-base]="rc=$? $(grep -E '^\| (gemma|smol)' "$OUT/startup-base.log" | awk -F'|' '{printf "%s:%s/%s/%s ", $2, $4, $5, $6}')"
  fi
fi

if [[ $what == batch ]]; then
  # impnb bench --batch (llama-batched-bench's table) on BATCH_MODELS: `qwen3-8b` / `qwen3-30b-a3b`
  # (the synthetic Q4_K_M, written first to /tmp) or .gguf paths (the real models); then
  # llama-batched-bench on the same GGUFs with the same lengths, and scripts/batch_compare.py writes
  # both S_TG columns and their ratio to batch-compare.log. Where llama-batched-bench is not built
  # (the llama-server mode's build, or LLAMA_BATCHED) and .dev/llama/src.tgz is here, it is built
  # in the background while impnb's rows run (~5.5 min on 16 cores: the whole table fits one call)
  lbb=${LLAMA_BATCHED:-/tmp/llama/build/bin/llama-batched-bench}
  builder=
  if [ ! -x "$lbb" ] && [ -f .dev/llama/src.tgz ]; then
    build_llama llama-batched-bench > "$OUT/llama-build.log" 2>&1 &
    builder=$!
  fi
  files=()
  for m in ${BATCH_MODELS:-qwen3-8b qwen3-30b-a3b}; do
    case "$m" in
      *.gguf) f=$m; m=$(basename "$m" .gguf) ;;
      *) f=/tmp/$m-q4_k_m.gguf
         [ -f "$f" ] || timeout 200 python3 scripts/make_synthetic_full.py --model "$m" --quant Q4_K_M --out "$f" \
           --workers 8 > "$OUT/make-$m.log" 2>&1 ;;
    esac
    files+=("$m=$f")
    timeout 250 python3 -m impnb bench --batch "${BATCHES:-1,8,16,32,64,128}" -m "$f" -p 128 -n 128 -r 1 --device cuda \
      > "$OUT/batch-$m.log" 2>&1
    status[batch-$m]="rc=$? S_TG by B $(grep -E '^\| +128 ' "$OUT/batch-$m.log" | awk -F'|' '{printf "%s ", $9}')"
  done
  [ -z "$builder" ] || { wait "$builder"; status[llama-build]="rc=$?"; }
  if [ -x "$lbb" ]; then
    for mf in "${files[@]}"; do
      m=${mf%%=*} f=${mf#*=}
      timeout 250 "$lbb" -m "$f" -npp 128 -ntg 128 -npl "${BATCHES:-1,8,16,32,64,128}" -fa on -ngl 99 -c 33000 \
        > "$OUT/batch-llama-$m.log" 2>&1
      status[batch-llama-$m]="rc=$?"
      python3 scripts/batch_compare.py --impnb "$OUT/batch-$m.log" --llama "$OUT/batch-llama-$m.log" --label "$m" \
        --json "$OUT/batch-compare-$m.json" >> "$OUT/batch-compare.log" 2>&1
    done
  fi
  [ -f "$OUT/batch-compare.log" ] && cat "$OUT/batch-compare.log"
fi

if [[ $what == serve* ]]; then  # the serve extra's wheels (fastapi, uvicorn, openai), carried in .dev/whl-serve
  [ -f /tmp/site/fastapi/__init__.py ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .dev/whl-serve/*.whl
fi

if [[ $what == serve ]]; then
  # the HTTP suite on the GPU engine (SmolLM2), the serving engine's GPU tests and logprobs on the GPU (~5 min)
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/gpu/test_serve_logprobs.py tests/gpu/test_serve_cuda.py \
    tests/gpu/test_sample.py -W ignore > "$OUT/serve-engine-tests.log" 2>&1
  status[serve-engine-tests]="rc=$? $(tail -n 1 "$OUT/serve-engine-tests.log")"
  IMPNB_SERVE_TEST_DEVICES=cuda timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_server_http.py \
    -W ignore > "$OUT/serve-tests.log" 2>&1
  status[serve-tests]="rc=$? $(tail -n 1 "$OUT/serve-tests.log")"
fi

if [[ $what == serve-soak ]]; then
  # 1000 requests at concurrency 64 on SmolLM2 on the GPU engine, random lengths, 5% disconnects, 5%
  # malformed; then every KV block free, the server answers, RSS and GPU memory at their warmed-up level (~3 min)
  timeout 540 python3 scripts/soak_serve.py -m ${SOAK_MODEL:-smollm2-135m} --device cuda > "$OUT/soak.log" 2>&1
  status[soak]="rc=$? $(grep -E '^soak: [0-9]' "$OUT/soak.log" | tail -n 1) | $(tail -n 1 "$OUT/soak.log")"
fi

if [[ $what == llama-server ]]; then
  # llama.cpp's llama-server (and llama-bench, llama-batched-bench) built in /tmp/llama (~6 min on 16 cores);
  # a machine keeps it for serve-bench while it stays warm
  build_llama llama-server llama-bench llama-batched-bench > "$OUT/llama-build.log" 2>&1
  status[llama-build]="rc=$? $(ls /tmp/llama/build/bin 2>/dev/null | tr '\n' ' ')"
fi

if [[ $what == serve-bench ]]; then
  # impnb's server on the GPU engine against llama-server (-np 128, continuous batching, -fa on) on the
  # same GGUFs (SERVE_MODELS: SmolLM2 and the synthetic Qwen3-8B Q4_K_M), bench-serve at concurrency
  # 1/8/32/64/128, 128-token prompts, 128-token outputs; one table (scripts/serve_compare.py). llama-server
  # from the llama-server mode (or LLAMA_SERVER); without it impnb's rows alone. ~7 min with both models
  q8b=/tmp/qwen3-8b-q4_k_m.gguf
  models=${SERVE_MODELS:-smollm2-135m,$q8b}
  if [[ $models == *$q8b* && ! -f $q8b ]]; then
    timeout 200 python3 scripts/make_synthetic_full.py --model qwen3-8b --quant Q4_K_M --out $q8b > "$OUT/q8b-make.log" 2>&1
  fi
  server=${LLAMA_SERVER:-/tmp/llama/build/bin/llama-server}
  [ -x "$server" ] || server=
  timeout 570 python3 scripts/serve_compare.py -m "$models" ${server:+--llama-server "$server"} --logs "$OUT" \
    --json "$OUT/serve-bench.json" > "$OUT/serve-bench.log" 2> "$OUT/serve-bench.err"
  status[serve-bench]="rc=$? ${server:-no llama-server} (table: serve-bench.log)"
fi

if [[ $what == all || $what == bench ]]; then
  for m in smollm2-135m gemma3-270m; do
    for g in "" --no-graphs; do
      timeout 150 python3 -m impnb bench -m "$m" -p 512 -n 128 -d 0,700 -r 3 --device cuda $g >> "$OUT/bench.log" 2>&1
      status[bench-$m${g:+-eager}]="rc=$? $(grep -E 'tg128 ' "$OUT/bench.log" | tail -n 2 | awk -F'|' '{printf "%s%s ", $8, $9}')"
    done
  done
  timeout 150 python3 scripts/bench_gemv.py --json "$OUT/bench-gemv.json" > "$OUT/bench-gemv.log" 2>&1
  status[bench-gemv]="rc=$? see bench-gemv.log"
fi

[ -f "$OUT/serve-bench.log" ] && [[ $what == serve-bench ]] && cat "$OUT/serve-bench.log"
echo "== impnb GPU check $(date -u +%F) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
for k in "${!status[@]}"; do printf '%-22s %s\n' "$k" "${status[$k]}"; done | sort
