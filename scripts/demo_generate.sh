#!/usr/bin/env bash
# Start `tandem serve`, stream one generation from MODEL with speculation statistics, stop the server.
# Usage: scripts/demo_generate.sh MODEL [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: demo_generate.sh MODEL [PROMPT]}
prompt=${2:-"Write a Python function that checks whether a string is a palindrome, with a docstring and three doctests."}
export TANDEM_HOST=${TANDEM_HOST:-127.0.0.1:11434}
log=$(mktemp)
.venv/bin/tandem serve >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://$TANDEM_HOST/" >/dev/null && break
  kill -0 $server 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.5
done
echo "== tandem run --verbose $model (streaming; statistics at the end)"
.venv/bin/tandem run --verbose "$model" "$prompt"
echo
echo "== the same through curl: the final NDJSON line carries Ollama's fields plus the speculation statistics"
curl -s "http://$TANDEM_HOST/api/generate" -d "{\"model\": \"$model\", \"prompt\": \"def fibonacci(n):\", \"raw\": true, \"options\": {\"num_predict\": 48}}" | tail -n 1
echo
