#!/usr/bin/env bash
# The test suite, as the README gives it. Extra arguments go to pytest (e.g. -m "not realmodel").
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -q "$@"
