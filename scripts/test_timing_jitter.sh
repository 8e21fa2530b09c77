#!/usr/bin/env bash
# Runs the tests (arguments go to pytest; default: the whole suite) with every perf_counter reading perturbed
# (scripts/timing_jitter), to find tests whose assertions depend on measured time. TANDEM_JITTER is the mean
# offset per reading in seconds (default 0.02: far above a tiny model's step). Expect one artefact: a test that
# compares durations measured in two processes (test_generate_stream_and_not's total >= eval duration).
set -euo pipefail
cd "$(dirname "$0")/.."
export TANDEM_JITTER=${TANDEM_JITTER:-0.02}
export PYTHONPATH="$PWD/scripts/timing_jitter:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TANDEM_LIBGGML_BASE=${TANDEM_LIBGGML_BASE:-$PWD/.venv/ggml/libggml-base.so}
exec .venv/bin/python -m pytest -q -p no:cacheprovider "${@:-tests}"
