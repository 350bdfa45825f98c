# ragtime — the three names tools outside the project rely on:
#   make setup   fetch ONNX Runtime, models and build llama-server, then build
#                ragtime and prepare the embedding graphs once (idempotent)
#   make run     start the service on its embedded defaults (127.0.0.1:8080)
#   make test    run every test
#
# Everything fetched or built lands in $(RAGTIME_CACHE) (default ~/.cache/ragtime),
# including cargo's target dir, so a fresh clone reuses earlier builds.

RAGTIME_CACHE ?= $(HOME)/.cache/ragtime
CARGO_TARGET_DIR ?= $(RAGTIME_CACHE)/target
export RAGTIME_CACHE CARGO_TARGET_DIR

# A clean work tree's commit: the binary built from it is kept as
# $(RAGTIME_CACHE)/bin/<commit>/ragtime, so another clone of the same commit
# (at any path) runs it without building, and no clone replaces the binary
# another runs. A tree with changes builds and runs cargo's own.
COMMIT := $(shell [ -z "$$(git status --porcelain 2>/dev/null)" ] && git rev-parse HEAD 2>/dev/null)
BIN := $(if $(COMMIT),$(RAGTIME_CACHE)/bin/$(COMMIT)/ragtime,$(CARGO_TARGET_DIR)/release/ragtime)

.PHONY: setup fetch run test build bench fmt lint fetch-reranker

# Only what comes from package registries (the tests prepare the graphs
# themselves, in the same cache folder, when they are missing).
fetch:
	@bash scripts/setup.sh

setup: fetch build
	@$(BIN) prepare-model

run: setup
	$(BIN) serve

test: fetch
	@bash scripts/test.sh

build:
	@if [ -n "$(COMMIT)" ] && [ -x "$(BIN)" ]; then \
	  echo "build: ragtime of $(COMMIT) is built: $(BIN)"; \
	else \
	  cargo build --release --locked -p ragtime-gateway --bin ragtime && \
	  if [ -n "$(COMMIT)" ]; then \
	    mkdir -p "$(dir $(BIN))" && cp "$(CARGO_TARGET_DIR)/release/ragtime" "$(BIN).tmp.$$$$" && \
	    mv "$(BIN).tmp.$$$$" "$(BIN)"; \
	  fi; \
	fi

# Retrieval quality on BEIR SciFact and latency figures (needs ../shared/data/scifact
# or RAGTIME_SCIFACT). Prints figures; asserts nothing.
bench: setup
	cargo run --release --locked -p ragtime-bench -- all

# Opt-in, needs the Hugging Face hub: ms-marco-MiniLM-L6-v2 for real reranking.
fetch-reranker:
	@bash scripts/fetch-reranker.sh

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
