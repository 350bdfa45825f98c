#!/usr/bin/env bash
# Opt-in: downloads the cross-encoder cross-encoder/ms-marco-MiniLM-L6-v2
# (Apache-2.0) from the Hugging Face hub, ONNX export and tokenizer, for real
# reranking. Never run by `make setup`, `make run` or the tests: no model hub
# is reachable from the machines ragtime is developed and tested on, and no
# registry package carries this model.
#
#   make fetch-reranker                 # into $RAGTIME_CACHE/models/ms-marco-minilm-l6-v2
#   RAGTIME__RERANK__MODEL_DIR=~/.cache/ragtime/models/ms-marco-minilm-l6-v2 make run
#
#   HF_ENDPOINT  hub mirror (default https://huggingface.co)
#   REVISION     branch, tag or commit to fetch (default main); pin a commit
#                for reproducible deployments
set -euo pipefail

CACHE="${RAGTIME_CACHE:-$HOME/.cache/ragtime}"
DEST="$CACHE/models/ms-marco-minilm-l6-v2"
HUB="${HF_ENDPOINT:-https://huggingface.co}"
REPO="cross-encoder/ms-marco-MiniLM-L6-v2"
REV="${REVISION:-main}"

command -v curl >/dev/null 2>&1 || { echo "fetch-reranker: curl is missing" >&2; exit 1; }
mkdir -p "$DEST"
for f in onnx/model.onnx tokenizer.json config.json; do
  out="$DEST/$(basename "$f")"
  echo "fetch-reranker: $HUB/$REPO/resolve/$REV/$f" >&2
  curl --fail --location --retry 3 --silent --show-error -o "$out.part" "$HUB/$REPO/resolve/$REV/$f" \
    || { rm -f "$out.part"; echo "fetch-reranker: could not download $f (is $HUB reachable?)" >&2; exit 1; }
  mv "$out.part" "$out"
done
echo "fetch-reranker: done; sha256 of what was fetched (record them to pin this revision):" >&2
(cd "$DEST" && sha256sum model.onnx tokenizer.json config.json) >&2
echo "fetch-reranker: start with RAGTIME__RERANK__MODEL_DIR=$DEST" >&2
