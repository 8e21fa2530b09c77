#!/usr/bin/env bash
# The test suite, as the README gives it. Extra arguments go to pytest (e.g. -m "not realmodel").
set -euo pipefail
cd "$(dirname "$0")/.."
# llama.cpp's quantization library, built by scripts/install.sh: the reference of the quantizer tests
export TANDEM_LIBGGML_BASE=${TANDEM_LIBGGML_BASE:-$PWD/.venv/ggml/libggml-base.so}
exec .venv/bin/python -m pytest -q "$@"
