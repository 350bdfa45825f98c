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

# The official OpenAI Python client for the end-to-end chat test, pinned,
# from PyPI, into the cache (once per version of the requirements file).
CACHE="${RAGTIME_CACHE:-$HOME/.cache/ragtime}"
req=services/gateway/tests/e2e/requirements.txt
stamp="$CACHE/.stamp-py-openai"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "test: installing the openai Python client (pinned) into $CACHE/py" >&2
  rm -rf "$CACHE/py"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --target "$CACHE/py" -r "$req" >&2 \
    || { echo "test: pip could not install $req" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
export RAGTIME_TEST_PYTHONPATH="$CACHE/py"

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
