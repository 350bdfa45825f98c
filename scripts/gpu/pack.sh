#!/usr/bin/env bash
# Fills .gpu/ (ignored by git) with what scripts/gpu/run.sh needs on the GPU
# machine, which fetches nothing: the release binary and ONNX Runtime, xz'd,
# the embedding model, 1000 SciFact documents and the SciFact questions.
set -euo pipefail
CACHE=${RAGTIME_CACHE:-$HOME/.cache/ragtime}
TARGET=${CARGO_TARGET_DIR:-$CACHE/target}
SCIFACT=${RAGTIME_SCIFACT:-../shared/data/scifact}
rm -rf .gpu && mkdir -p .gpu
strip -o .gpu/ragtime "$TARGET/release/ragtime"
xz -T2 -6 .gpu/ragtime
xz -T2 -6 -c "$CACHE/onnxruntime/libonnxruntime.so.1.31.1" > .gpu/libonnxruntime.so.1.31.1.xz
mkdir -p .gpu/all-minilm-l6-v2
cp "$CACHE"/models/all-minilm-l6-v2/{config.json,model.onnx,tokenizer.json} .gpu/all-minilm-l6-v2/
# (head stops reading early: zcat's SIGPIPE is expected)
(zcat "$SCIFACT/corpus.jsonl.gz" || true) | head -1000 | gzip > .gpu/corpus.jsonl.gz
cp "$SCIFACT/queries-train.jsonl" .gpu/queries.jsonl
du -sh .gpu
