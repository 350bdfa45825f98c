//! LLM backends. ragtime speaks one protocol to every backend: OpenAI-compatible
//! chat completions (vLLM, TGI, SGLang, llama.cpp's `llama-server`, Ollama).
//! When no backend URL is configured, [`LocalServer`] starts and supervises
//! llama.cpp's `llama-server` with the model fetched by `make setup`.

mod client;
mod local;

pub use client::LlmClient;
pub use local::{LocalServer, LocalServerOptions};
