//! One integration-test binary for the gateway: every test starts a real
//! `Application` on port 0 with its own data folder (see [`helpers`]: by
//! default with deterministic hash embeddings and a fake LLM backend; the
//! tests that need them ask for the real ONNX model or the supervised
//! llama-server).

mod admin;
mod admin_page;
mod chat;
mod cli;
mod collections;
mod deploy;
mod embeddings;
mod errors;
mod fake_llm;
mod health;
mod helpers;
mod jobs;
mod k8s;
mod lifecycle;
mod load;
mod observability;
mod openai_e2e;
mod replicas;
mod rerank;
mod search;
mod shapes;
mod snapshots;
mod tenants;
mod upload;
