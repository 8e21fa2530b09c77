#!/usr/bin/env bash
# Builds llama-server (the llamacpp engine's binary) from the llama.cpp tree that llama-cpp-python 0.3.36's sdist
# vendors (a pinned source from PyPI), with llama.cpp's model converter beside it (convert_hf_to_gguf.py and its
# gguf-py, which the tests use to write tiny models of architectures the native engine does not run).
#
#   bash scripts/install_llama_server.sh            # native CPU build, linked as .venv/bin/llama-server
#   TANDEM_LLAMA_CMAKE_FLAGS="-DGGML_CUDA=ON" bash scripts/install_llama_server.sh      # NVIDIA GPUs (CUDA toolkit)
#   TANDEM_LLAMA_CMAKE_FLAGS="-DGGML_VULKAN=ON" bash scripts/install_llama_server.sh    # Vulkan (libvulkan-dev, glslc)
#
# The build is cached under ~/.cache/tandem (TANDEM_LLAMA_CACHE) by source version, CPU features and flags, so a
# second install (CI's next run on this machine) links the cached binary in seconds; a fresh build takes 3-8 min on
# 2 cores. Static libraries: the binary runs from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
FLAGS=${TANDEM_LLAMA_CMAKE_FLAGS:-}
PY=.venv/bin/python
features=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m)
key=$(printf '%s|%s|%s' "$VERSION" "$features" "$FLAGS" | sha256sum | cut -c1-16)
cache=${TANDEM_LLAMA_CACHE:-$HOME/.cache/tandem}/llama-server-$VERSION-$key
if [ ! -x "$cache/bin/llama-server" ]; then
  command -v cmake >/dev/null 2>&1 || .venv/bin/pip install -qq cmake
  CMAKE=$(command -v cmake || echo .venv/bin/cmake)
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  .venv/bin/pip download -qq --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$src"
  tar xzf "$src/llama_cpp_python-$VERSION.tar.gz" -C "$src"
  tree="$src/llama_cpp_python-$VERSION/vendor/llama.cpp"
  # shellcheck disable=SC2086 # FLAGS is a list of cmake options
  "$CMAKE" -S "$tree" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $FLAGS >/dev/null
  "$CMAKE" --build "$src/build" --target llama-server -j "$(nproc)" >/dev/null 2>&1
  partial="$cache.partial.$$"
  mkdir -p "$partial/bin"
  cp "$src/build/bin/llama-server" "$partial/bin/"
  cp -r "$tree/convert_hf_to_gguf.py" "$tree/conversion" "$tree/gguf-py" "$partial/"
  rm -rf "$cache" && mv "$partial" "$cache"  # whole or not at all: an interrupted build leaves no half cache
fi
ln -sfn "$cache/bin/llama-server" .venv/bin/llama-server
ln -sfn "$cache" .venv/llama.cpp
echo "llama-server: $("$cache/bin/llama-server" --version 2>&1 | grep -m1 -i version || echo built) ($cache)"
