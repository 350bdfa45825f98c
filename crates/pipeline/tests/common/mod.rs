//! What the pipeline's request tests share: the budget profile, scripted
//! backends and the chat stages wired together.

#![allow(dead_code)] // each test file uses its own part

use ragtime_core::{Generator, ResponseCache};
use ragtime_pipeline::BudgetProfile;
use ragtime_pipeline::backend::breaker::Breaker;
use ragtime_pipeline::backend::load::Levels;
use ragtime_pipeline::backend::{Backend, BackendSpec, Backends};
use ragtime_pipeline::chat::ChatDeps;
use ragtime_testkit::{HashEmbedder, MemoryRetriever};
use std::sync::Arc;
use std::time::Duration;

pub const MS: Duration = Duration::from_millis(1);

/// 10 s in all; 1 s to the first token, 2 s to generate.
pub fn profile() -> BudgetProfile {
    BudgetProfile {
        total_ms: 10_000,
        cache_ms: 20,
        embed_ms: 100,
        retrieve_ms: 100,
        rerank_ms: 100,
        llm_ttft_ms: 1_000,
        llm_generate_ms: 2_000,
        quote_ms: 40,
        verify_ms: 50,
    }
}

/// A backend named `name` of `slots` slots on `g` (breaker: 3 failures,
/// 5 s cool-down).
pub fn backend(name: &str, g: Arc<dyn Generator>, slots: usize, weight: f64) -> Arc<Backend> {
    let spec = BackendSpec {
        name: name.into(),
        model: "m".into(),
        slots,
        max_queue: 64,
        max_queue_wait: None,
        weight,
        context_tokens: 4096,
    };
    Backend::new(spec, g, Breaker::new(3, Duration::from_secs(5)))
}

/// The chat stages without a reranker.
pub fn chat_deps<'a>(
    embedder: &'a HashEmbedder,
    retriever: &'a MemoryRetriever,
    backends: &'a Backends,
    levels: &'a Levels,
    cache: Option<&'a dyn ResponseCache>,
) -> ChatDeps<'a> {
    ChatDeps {
        embedder,
        retriever,
        reranker: None,
        backends,
        levels,
        cache,
    }
}

/// The chat stages over `r`'s chunks and some backends, with no load
/// levels (request sizes stay as asked).
pub struct World {
    pub e: HashEmbedder,
    pub r: MemoryRetriever,
    pub backends: Backends,
    pub levels: Levels,
}

impl World {
    pub fn new(e: HashEmbedder, r: MemoryRetriever, backends: Backends) -> Self {
        Self {
            e,
            r,
            backends,
            levels: Levels(Vec::new()),
        }
    }

    pub fn deps(&self) -> ChatDeps<'_> {
        chat_deps(&self.e, &self.r, &self.backends, &self.levels, None)
    }
}
