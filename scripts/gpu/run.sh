#!/usr/bin/env bash
# Time to first token on a GPU: ragtime against the same backend called
# directly (docs/benchmarks.md, "A GPU backend"). Runs on the GPU machine from
# the repository root; scripts/gpu/pack.sh fills .gpu/ here first:
#   .gpu/ragtime.xz  .gpu/libonnxruntime.so.1.31.1.xz  .gpu/all-minilm-l6-v2/
#   .gpu/corpus.jsonl.gz (SciFact, first 1000 documents)  .gpu/queries.jsonl
# Writes its table, logs and every request to $OUT.
set -euo pipefail
OUT=${OUT:-/tmp/gpu-out}
LEVELS=${LEVELS:-1,4,16,48}
SECONDS_PER_LEVEL=${SECONDS_PER_LEVEL:-20}
PY=${PY:-python3}                      # the Python with torch and aiohttp
BACKEND_ARGS=${BACKEND_ARGS:-}         # --cpu-check: try the harness without a GPU
CORPUS=${CORPUS:-.gpu/corpus.jsonl.gz}
mkdir -p "$OUT"
trap 'kill $(jobs -p) 2> /dev/null' EXIT
W=/tmp/rt
rm -rf "$W" && mkdir -p "$W/bin" "$W/onnxruntime" "$W/models"
xz -dc .gpu/ragtime.xz > "$W/bin/ragtime" && chmod +x "$W/bin/ragtime"
xz -dc .gpu/libonnxruntime.so.1.31.1.xz > "$W/onnxruntime/libonnxruntime.so.1.31.1"
cp -r .gpu/all-minilm-l6-v2 "$W/models/"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
nproc

# shellcheck disable=SC2086
"$PY" scripts/gpu/backend.py $BACKEND_ARGS --log "$W/prompts.jsonl" --stats "$OUT/backend-ttft.jsonl" > "$OUT/backend.log" 2>&1 &

export RAGTIME_CACHE=$W RAGTIME__DATA_DIR=$W/data
export RAGTIME__LLM__BASE_URL=http://127.0.0.1:8000/v1 RAGTIME__LLM__MODEL=tinyllama-shape-random
export RAGTIME__LLM__MAX_CONCURRENCY=16 RAGTIME__CACHE__ENABLED=false RAGTIME__EMBED__INTRA_THREADS=4
# The GPU-serving budget profile (docs/budgets.md).
export RAGTIME__BUDGETS__TOTAL_MS=3000 RAGTIME__BUDGETS__CACHE_MS=10 RAGTIME__BUDGETS__EMBED_MS=30 \
  RAGTIME__BUDGETS__RETRIEVE_MS=60 RAGTIME__BUDGETS__RERANK_MS=150 RAGTIME__BUDGETS__LLM_TTFT_MS=700 \
  RAGTIME__BUDGETS__LLM_GENERATE_MS=1950 RAGTIME__BUDGETS__VERIFY_MS=50
"$W/bin/ragtime" serve > "$OUT/ragtime.log" 2>&1 &

wait_for() { # url seconds
  for _ in $(seq 1 "$2"); do curl -sf "$1" > /dev/null && return 0; sleep 1; done
  echo "no answer from $1 in $2 s" >&2; tail -20 "$OUT"/*.log >&2; exit 1
}
wait_for http://127.0.0.1:8000/health 120
wait_for http://127.0.0.1:8080/readyz 120
t0=$(date +%s%N)
"$W/bin/ragtime" ingest --server http://127.0.0.1:8080 --collection scifact "$CORPUS" 2>&1 | tail -3
echo "ingest: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
# Warm both paths (CUDA kernels, connection pools) before anything is timed.
"$PY" scripts/gpu/ttft.py --queries .gpu/queries.jsonl --prompts "$W/prompts.jsonl" \
  --levels 2 --seconds 5 --out /tmp/warm.json > /dev/null
# What runs on the CPUs while ragtime is asked (threads, busiest first).
(sleep 8; top -b -H -n 1 -w 200 | head -30 > "$OUT/top.txt") &
"$PY" scripts/gpu/ttft.py --queries .gpu/queries.jsonl --prompts "$W/prompts.jsonl" \
  --levels "$LEVELS" --seconds "$SECONDS_PER_LEVEL" --novel --out "$OUT/ttft.json" | tee "$OUT/table.md"
"$PY" scripts/gpu/summary.py "$OUT/backend-ttft.jsonl" | tee -a "$OUT/table.md"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
fi
