//! LLM backends. ragtime speaks one protocol to every backend: OpenAI-compatible
//! chat completions (vLLM, TGI, SGLang, llama.cpp's `llama-server`, Ollama),
//! streamed as server-sent events over a pooled connection.
//! When no backend URL is configured, [`LocalServer`] starts and supervises
//! llama.cpp's `llama-server` with the model fetched by `make setup`.

mod chat;
mod client;
mod local;
mod stats;

pub use chat::{ChatEvent, ChatRequest, ChatStream, LlmError, Message, Usage};
pub use client::LlmClient;
pub use local::{LocalServer, LocalServerOptions};
pub use stats::{BackendStats, Estimates, Observation};
