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

# Headless Chromium (Debian) and playwright-core (npm, pinned) for the admin
# page's browser test. Installed when missing if we can (root with apt-get);
# otherwise that test says it did not run.
PW_VERSION=1.65.1
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test: installing chromium with apt-get for the browser test" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >&2 \
    || echo "test: could not install chromium" >&2
fi
if command -v chromium >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  if [ "$(cat "$CACHE/.stamp-playwright" 2>/dev/null)" != "$PW_VERSION" ]; then
    echo "test: installing playwright-core@$PW_VERSION into $CACHE/node" >&2
    mkdir -p "$CACHE/node"
    npm install --silent --no-audit --no-fund --prefix "$CACHE/node" "playwright-core@$PW_VERSION" >&2 \
      && echo "$PW_VERSION" > "$CACHE/.stamp-playwright"
  fi
  if [ -f "$CACHE/.stamp-playwright" ]; then
    export RAGTIME_TEST_NODE_PATH="$CACHE/node/node_modules"
    export RAGTIME_TEST_CHROMIUM="$(command -v chromium)"
  fi
fi

status=0
cargo test --workspace --locked "$@" || status=$?

if [ -z "${RAGTIME_TEST_DATABASE_URL:-}" ]; then
  echo
  echo "NOTE: RAGTIME_TEST_DATABASE_URL is not set, so the PostgreSQL tests did not run."
  echo "      Point it at a server to run them, e.g."
  echo "      RAGTIME_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test make test"
fi
if [ -z "${RAGTIME_TEST_NODE_PATH:-}" ]; then
  echo
  echo "NOTE: no chromium/npm (install chromium and npm, or run as root with apt-get),"
  echo "      so the admin page's browser test did not run."
fi
if [ -z "${RAGTIME_TEST_RERANK_DIR:-}" ]; then
  echo
  echo "NOTE: no cross-encoder at ../shared/models/ce-minilm-l6 and RAGTIME_TEST_RERANK_DIR is not set,"
  echo "      so the reranking tests did not run."
fi
exit $status
