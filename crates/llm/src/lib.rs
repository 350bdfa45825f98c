//! LLM backends. ragtime speaks one protocol to every backend: OpenAI-compatible
//! chat completions (vLLM, TGI, SGLang, llama.cpp's `llama-server`, Ollama),
//! streamed as server-sent events over a pooled connection; [`LlmClient`] is
//! the pipeline's [`ragtime_core::Generator`].
//! When no backend URL is configured, [`LocalServer`] starts and supervises
//! llama.cpp's `llama-server` with the model fetched by `make setup`.

mod chat;
mod client;
mod local;

pub use chat::{LlmError, events};
pub use client::LlmClient;
pub use local::{LocalServer, LocalServerOptions};
