//! `ragtime-bench chat`: the whole chat pipeline on the embedded CPU
//! defaults — the local llama-server with SmolLM2-135M, the CPU budget
//! profile — over a slice of SciFact. Prints end-to-end time to first token
//! (from the request's start: embedding, cache, retrieval, prefill) and
//! total time for fresh questions, then the latency of the same questions
//! answered from the semantic cache.

use crate::Rag;
use crate::data::SciFact;
use crate::stats::pct;
use crate::{cache, env_usize};
use ragtime_cache::CacheOptions;
use ragtime_cache::SemanticCache;
use ragtime_core::{CachedAnswer, Scope};
use ragtime_llm::{LlmClient, LocalServer, LocalServerOptions};
use ragtime_pipeline::adapters::IndexRetriever;
use ragtime_pipeline::backend::breaker::Breaker;
use ragtime_pipeline::backend::load::Levels;
use ragtime_pipeline::backend::{Backend, BackendSpec, Backends, HedgePolicy};
use ragtime_pipeline::chat::{self, CHAT_PLAN, ChatDeps, ChatInput};
use ragtime_pipeline::{BudgetProfile, RequestBudget};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub async fn chat_bench(rag: &Rag, data: &SciFact) {
    let docs = env_usize("BENCH_CHAT_DOCS", 500);
    let questions = env_usize("BENCH_CHAT_QUESTIONS", 40);
    let n = docs.min(data.corpus.len());
    let part = crate::as_docs(&data.corpus[..n]);
    rag.corpus.ingest("chat", part).await.expect("ingest");
    let index = rag.corpus.collection("chat").await.expect("collection");
    let in_corpus: std::collections::HashSet<&str> = data
        .corpus
        .iter()
        .take(docs)
        .map(|(id, _, _)| id.as_str())
        .collect();
    // Questions whose answer is among the ingested documents.
    let asked: Vec<&str> = data
        .queries
        .iter()
        .filter(|(qid, _)| {
            data.qrels
                .get(qid)
                .is_some_and(|r| r.iter().any(|d| in_corpus.contains(d.as_str())))
        })
        .map(|(_, q)| q.as_str())
        .take(questions)
        .collect();

    let threads = env_usize("BENCH_LLM_THREADS", 2) as u32;
    let server = LocalServer::start(LocalServerOptions {
        binary: cache().join("bin/llama-server"),
        model: cache().join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        alias: "smollm2-135m-instruct".into(),
        ctx_size: 4096,
        threads,
        parallel: 1,
        batch_size: 256,
        port: 0,
    })
    .expect("llama-server (run make setup)");
    assert!(
        server.wait_healthy(Duration::from_secs(120)).await,
        "llama-server never became healthy"
    );
    let llm = LlmClient::new(&server.base_url(), None);
    let spec = BackendSpec {
        name: server.base_url(),
        model: "smollm2-135m-instruct".into(),
        slots: 1,
        max_queue: 8,
        max_queue_wait: None,
        weight: 1.0,
        context_tokens: 4096,
    };
    let backend = Backend::new(spec, Arc::new(llm), Breaker::new(3, Duration::from_secs(5)));
    let backends = Backends::new(vec![backend.clone()], HedgePolicy::default());
    let levels = Levels(Vec::new());
    let answers: SemanticCache<CachedAnswer> = SemanticCache::new(CacheOptions::default());
    let retriever = IndexRetriever(index, ragtime_retrieve::LexicalUnit::Documents);
    let deps = ChatDeps {
        embedder: rag.svc.as_ref(),
        retriever: &retriever,
        reranker: None,
        backends: &backends,
        levels: &levels,
        cache: Some(&answers),
    };
    let profile = BudgetProfile::cpu();
    let ask = |q: &str| {
        let scope = Scope {
            tenant: String::new(),
            collection: "chat".into(),
            filter: String::new(),
            version: u64::try_from(rag.corpus.version()).unwrap_or(0),
        };
        ChatInput {
            max_tokens: Some(64),
            temperature: Some(0.0),
            ..ChatInput::new(q, scope, 5)
        }
    };

    let (mut ttft, mut total, mut partial) = (Vec::new(), Vec::new(), 0usize);
    for q in &asked {
        let (tx, mut rx) = tokio::sync::mpsc::channel(256);
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let budget = RequestBudget::start(&profile, &CHAT_PLAN, None);
        let t = Instant::now();
        let a = chat::run(&budget, &deps, &ask(q), &tx).await;
        total.push(t.elapsed());
        drop(tx);
        let _ = drain.await;
        if let Some(f) = a.first_text {
            ttft.push(f);
        }
        partial += usize::from(a.partial);
    }
    let est = backend.stats.estimates();
    println!(
        "\n## chat end to end (local llama-server, SmolLM2-135M Q4_1, {threads} threads; {} SciFact questions over {docs} documents, top 5 passages, max_tokens 64, CPU budgets)",
        asked.len()
    );
    println!(
        "time to first token: p50 {:.0} ms  p95 {:.0} ms;  whole answer: p50 {:.0} ms  p95 {:.0} ms;  partial answers: {partial}",
        pct(&mut ttft, 50.0),
        pct(&mut ttft, 95.0),
        pct(&mut total, 50.0),
        pct(&mut total, 95.0)
    );
    println!(
        "learned from the backend: TTFT ≈ {:.0} ms + {:.2} ms/prompt token, {:.1} ms/output token, {:.2} chars/token ({} completions)",
        est.ttft_base_ms,
        est.ms_per_prompt_token,
        est.ms_per_output_token,
        est.chars_per_token,
        est.observations
    );

    let mut hits = Vec::new();
    let mut cached = 0usize;
    for q in &asked {
        let (tx, mut rx) = tokio::sync::mpsc::channel(256);
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let budget = RequestBudget::start(&profile, &CHAT_PLAN, None);
        let t = Instant::now();
        let a = chat::run(&budget, &deps, &ask(q), &tx).await;
        let e = t.elapsed();
        drop(tx);
        let _ = drain.await;
        if a.cached {
            cached += 1;
            hits.push(e);
        }
    }
    println!(
        "semantic cache hits (same questions again, query vector cached): {cached}/{} answered from the cache, latency p50 {:.2} ms  p99 {:.2} ms",
        asked.len(),
        pct(&mut hits, 50.0),
        pct(&mut hits, 99.0)
    );
    server.shutdown().await;
}
