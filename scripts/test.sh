#!/usr/bin/env bash
# The test suite, as the README gives it. Extra arguments go to pytest (e.g. -m "not realmodel").
set -euo pipefail
cd "$(dirname "$0")/.."
# llama.cpp's quantization library, built by scripts/install.sh: the reference of the quantizer tests
export TANDEM_LIBGGML_BASE=${TANDEM_LIBGGML_BASE:-$PWD/.venv/ggml/libggml-base.so}
# vLLM's CPU build in its own virtualenv, for the vllm engine's tests (tests/vllm; ~2 min to install once).
# TANDEM_SKIP_VLLM=1 skips them; a failed install only skips them too.
if [ -z "${TANDEM_VLLM_PYTHON:-}" ] && [ -z "${TANDEM_SKIP_VLLM:-}" ]; then
  [ -f .venv-vllm/.installed ] || bash scripts/install_vllm.sh .venv-vllm ||
    echo "vLLM not installed: the vllm engine's tests will skip"
  if [ -f .venv-vllm/.installed ]; then export TANDEM_VLLM_PYTHON=$PWD/.venv-vllm/bin/python; fi
fi
exec .venv/bin/python -m pytest -q "$@"
