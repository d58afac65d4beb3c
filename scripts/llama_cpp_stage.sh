#!/usr/bin/env bash
# Here (with PyPI): llama.cpp's source for the GPU host, which has no network, as
# .dev/llama/src.tgz (about 5 MB, carried to the host with the tree): the llama.cpp that
# llama-cpp-python's sdist vendors (LLAMA_CPP_PYTHON, default 0.3.36: llama.cpp of 2026-10-01),
# less the backends and tools that llama-bench, llama-batched-bench and llama-server do not build.
# llama-server builds without its web UI: tools/ui keeps only the templates of the generated
# ui.cpp / ui.h (scripts/ui-assets.cmake writes them with no assets, offline, when the build has
# LLAMA_BUILD_UI=OFF and LLAMA_USE_PREBUILT_UI=OFF); tools/mtmd (which the server links) without
# its test media.
#   bash scripts/llama_cpp_stage.sh        then on the host: bash scripts/gpu_check.sh llama|serve-bench
set -euo pipefail
ver=${LLAMA_CPP_PYTHON:-0.3.36}
out=$PWD/.dev/llama
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$tmp"
tar xzf "$tmp"/llama_cpp_python-"$ver".tar.gz -C "$tmp"
mkdir -p "$out"
cd "$tmp"/llama_cpp_python-"$ver"/vendor/llama.cpp
skip=()
for d in vulkan sycl metal opencl cann webgpu hexagon openvino musa zdnn zendnn et virtgpu; do
  skip+=(--exclude="ggml/src/ggml-$d")
done
tar cf "$tmp/src.tar" "${skip[@]}" --exclude=tools/ui --exclude=tools/server/tests --exclude=tools/server/bench \
  --exclude=tools/mtmd/tests --exclude='tools/mtmd/test-*' \
  CMakeLists.txt cmake common ggml include src tools vendor licenses LICENSE scripts/ui-assets.cmake
tar rf "$tmp/src.tar" tools/ui/CMakeLists.txt tools/ui/ui.h.in tools/ui/ui.cpp.in
gzip -c "$tmp/src.tar" > "$out/src.tgz"
echo "$out/src.tgz: llama.cpp from llama-cpp-python $ver ($(du -h "$out/src.tgz" | cut -f1))"
