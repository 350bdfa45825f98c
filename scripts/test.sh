#!/usr/bin/env bash
# Runs every test in the workspace. PostgreSQL tests run against
# RAGTIME_TEST_DATABASE_URL when it is set (CI sets it); otherwise they say
# they did not run, and this script says so again at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "test: cargo is missing: install Rust (https://rustup.rs) and run again" >&2
  exit 1
fi

# The trained cross-encoder for the rerank tests is not on any registry; it
# sits in ../shared beside the clone (as in CI). Without it those tests say
# they did not run.
ce="$(cd .. && pwd)/shared/models/ce-minilm-l6"
if [ -z "${RAGTIME_TEST_RERANK_DIR:-}" ] && [ -f "$ce/tokenizer.json" ]; then
  export RAGTIME_TEST_RERANK_DIR="$ce"
fi

status=0
cargo test --workspace --locked "$@" || status=$?

if [ -z "${RAGTIME_TEST_DATABASE_URL:-}" ]; then
  echo
  echo "NOTE: RAGTIME_TEST_DATABASE_URL is not set, so the PostgreSQL tests did not run."
  echo "      Point it at a server to run them, e.g."
  echo "      RAGTIME_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test make test"
fi
if [ -z "${RAGTIME_TEST_RERANK_DIR:-}" ]; then
  echo
  echo "NOTE: no cross-encoder at ../shared/models/ce-minilm-l6 and RAGTIME_TEST_RERANK_DIR is not set,"
  echo "      so the reranking tests did not run."
fi
exit $status
