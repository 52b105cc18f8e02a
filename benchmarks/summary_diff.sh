#!/usr/bin/env bash
# Write the JSON summary of `ep-trace analyze` on each reference input into DIR (default
# /tmp/summaries/<label>), so that two checkouts can be diffed: run it with each checkout's venv
# active, then `diff -r /tmp/summaries/main /tmp/summaries/branch`.
# Usage: benchmarks/summary_diff.sh LABEL [INPUT ...]
# MODE=cache: through a fresh ingest cache (a first analysis: streamed into the cache, events read
# back lazily), then again from the warm cache (LABEL-hit); default: --no-cache (in memory).
set -euo pipefail
label=${1:?label}; shift
root=$(cd "$(dirname "$0")/.." && pwd)
inputs=("$@")
if [ ${#inputs[@]} -eq 0 ]; then
  inputs=("$root"/sample_traces/* "$root/../shared/external/kineto/param_dlrm_8rank")
  [ -d "$root/benchmarks/data/dlrm1024" ] && inputs+=("$root/benchmarks/data/dlrm1024")
fi
out=/tmp/summaries/$label
mkdir -p "$out"
for d in "${inputs[@]}"; do
  name=$(basename "$d")
  if [ "${MODE:-}" = cache ]; then
    cache=$(mktemp -d)
    mkdir -p "$out-hit"
    EP_TRACE_CACHE_DIR=$cache nice -n 10 ep-trace analyze "$d" -o "$out/$name.html" --json "$out/$name.json" -q
    EP_TRACE_CACHE_DIR=$cache nice -n 10 ep-trace analyze "$d" -o "$out-hit/$name.html" --json "$out-hit/$name.json" -q
    rm -rf "$cache"
  else
    nice -n 10 ep-trace analyze "$d" -o "$out/$name.html" --json "$out/$name.json" -q --no-cache
  fi
  echo "$name done"
done
