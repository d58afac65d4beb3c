#!/usr/bin/env bash
# Here (with PyPI): llama.cpp's source for the GPU host, which has no network, as
# .dev/llama/src.tgz (about 3.5 MB, carried to the host with the tree): the llama.cpp that
# llama-cpp-python's sdist vendors (LLAMA_CPP_PYTHON, default 0.3.36: llama.cpp of 2026-10-01),
# less the backends, tools and web UI llama-bench does not build.
#   bash scripts/llama_cpp_stage.sh        then on the host: bash scripts/gpu_check.sh llama
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
tar czf "$out/src.tgz" "${skip[@]}" --exclude=tools/server --exclude=tools/ui --exclude=tools/mtmd \
  CMakeLists.txt cmake common ggml include src tools vendor licenses LICENSE
echo "$out/src.tgz: llama.cpp from llama-cpp-python $ver ($(du -h "$out/src.tgz" | cut -f1))"
