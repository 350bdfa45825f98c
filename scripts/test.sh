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

status=0
cargo test --workspace --locked "$@" || status=$?

if [ -z "${RAGTIME_TEST_DATABASE_URL:-}" ]; then
  echo
  echo "NOTE: RAGTIME_TEST_DATABASE_URL is not set, so the PostgreSQL tests did not run."
  echo "      Point it at a server to run them, e.g."
  echo "      RAGTIME_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test make test"
fi
exit $status
