//! Loading the stages in the background: the embedding model (warmed),
//! the cross-encoder when configured, the indexes (from their snapshots or
//! the store), and the [`Pipeline`] built from them. Until it is done `/readyz` says so.

use crate::config::Config;
use crate::state::AppState;
use ragtime_cache::{CacheOptions, SemanticCache};
use ragtime_core::{CachedAnswer, Embedder, Reranker, ResponseCache};
use ragtime_embed::{Chunker, EmbedService, EmbedderOptions, OnnxEmbedder, ServiceOptions};
use ragtime_pipeline::adapters::CrossEncoderReranker;
use ragtime_pipeline::corpus::{ChunkParams, Corpus, Quotas};
use ragtime_pipeline::rerank::RerankParams;
use ragtime_pipeline::{Pipeline, Settings};
use ragtime_rerank::{CrossEncoder, RerankOptions};
use ragtime_store::Store;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stages a caller (a test) provides instead of the configured ones.
#[derive(Default)]
pub struct Overrides {
    /// An embedder in place of the ONNX model (chunking still uses the
    /// model's tokenizer).
    pub embedder: Option<Arc<dyn Embedder>>,
}

pub fn embedder_options(config: &Config) -> EmbedderOptions {
    let e = &config.embed;
    EmbedderOptions {
        model_dir: e.model_dir.clone(),
        ort_lib: e.ort_lib.clone(),
        intra_threads: e.intra_threads,
        max_tokens: e.max_tokens,
        batch_size: e.batch_size,
        max_batch_tokens: e.max_batch_tokens,
        passage_int8: e.passage_int8,
    }
}

/// The files the stages need, checked before anything starts.
pub fn check_files(config: &Config, overrides: &Overrides) -> anyhow::Result<()> {
    let dir = &config.embed.model_dir;
    let mut need = vec![dir.join("tokenizer.json")];
    if overrides.embedder.is_none() {
        need.extend([dir.join("model.onnx"), config.embed.ort_lib.clone()]);
    }
    for f in need {
        anyhow::ensure!(f.is_file(), "{} not found (run `make setup`)", f.display());
    }
    Ok(())
}

fn chunk_params(config: &Config) -> ChunkParams {
    ChunkParams {
        max_tokens: config.chunking.max_tokens,
        overlap: config.chunking.overlap_tokens,
    }
}

/// The ONNX embedder behind its batching service, and its chunker.
pub async fn onnx_embedder(config: &Config) -> Result<(Arc<EmbedService>, Chunker), String> {
    let opts = embedder_options(config);
    let t0 = Instant::now();
    let model = tokio::task::spawn_blocking(move || OnnxEmbedder::load(&opts))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    tracing::info!(
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "embedding model loaded and warmed"
    );
    let p = chunk_params(config);
    let chunker = model.chunker(p.max_tokens, p.overlap);
    let e = &config.embed;
    let service = EmbedService::new(
        model,
        ServiceOptions {
            workers: e.workers,
            max_batch: e.batch_size,
            max_wait: Duration::from_micros(e.batch_wait_us),
            cache_entries: e.cache_entries,
            cache_ttl: Duration::from_secs(e.cache_ttl_s),
            max_bulk_texts: e.max_queued_texts,
        },
    );
    Ok((Arc::new(service), chunker))
}

/// A corpus on `store` with the configured embedder (or `embedder`).
pub async fn corpus(
    config: &Config,
    store: Store,
    embedder: Option<Arc<dyn Embedder>>,
) -> Result<Corpus, String> {
    let p = chunk_params(config);
    let (embedder, chunker): (Arc<dyn Embedder>, Chunker) = match embedder {
        Some(e) => {
            let tok = config.embed.model_dir.join("tokenizer.json");
            let chunker =
                Chunker::from_file(&tok, p.max_tokens, p.overlap).map_err(|e| e.to_string())?;
            (e, chunker)
        }
        None => {
            let (service, chunker) = onnx_embedder(config).await?;
            (service, chunker)
        }
    };
    let l = &config.limits;
    let quotas = Quotas {
        max_collections: l.max_collections,
        max_documents: l.max_documents,
        max_chunks: l.max_chunks,
    };
    let unit = match config.chunking.lexical {
        crate::config::Lexical::Documents => ragtime_pipeline::LexicalUnit::Documents,
        crate::config::Lexical::Chunks => ragtime_pipeline::LexicalUnit::Chunks,
        crate::config::Lexical::Auto => ragtime_pipeline::LexicalUnit::Auto,
    };
    let corpus = Corpus::new(store, embedder, chunker, p)
        .with_quotas(quotas)
        .with_preload(l.preload_collections)
        .with_lexical_unit(unit);
    if config.retrieval.engine == crate::config::Engine::Postgres {
        // No index in this process: nothing to preload or save.
        return corpus
            .with_database_engine(config.retrieval.ef_search)
            .await
            .map_err(|e| format!("retrieval.engine = \"postgres\": {e}"));
    }
    let s = &config.snapshots;
    Ok(if s.enabled {
        corpus.with_snapshots(ragtime_pipeline::snapshots::SnapshotConfig {
            dir: config.data_dir.join("indexes"),
            min_chunks: s.min_chunks,
            every: std::time::Duration::from_secs(s.every_s),
        })
    } else {
        corpus
    })
}

async fn reranker(config: &Config) -> Result<Option<Arc<dyn Reranker>>, String> {
    let Some(dir) = &config.rerank.model_dir else {
        return Ok(None);
    };
    let r = &config.rerank;
    let model_file = match r.model_file.as_str() {
        "" if dir.join("model-int8.onnx").is_file() => "model-int8.onnx".to_owned(),
        "" => "model.onnx".to_owned(),
        f => f.to_owned(),
    };
    let opts = RerankOptions {
        model_dir: dir.clone(),
        model_file,
        ort_lib: config.embed.ort_lib.clone(),
        intra_threads: config.embed.intra_threads,
        max_tokens: r.max_tokens,
    };
    let opts_file = opts.model_file.clone();
    let ce = tokio::task::spawn_blocking(move || CrossEncoder::load(&opts))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("reranker: {e}"))?;
    tracing::info!(dir = %dir.display(), file = %opts_file, "cross-encoder loaded and warmed");
    Ok(Some(Arc::new(CrossEncoderReranker(Arc::new(ce)))))
}

fn answer_cache(config: &Config) -> Option<Arc<dyn ResponseCache>> {
    let c = &config.cache;
    c.enabled.then(|| {
        let cache: SemanticCache<CachedAnswer> = SemanticCache::new(CacheOptions {
            max_entries: c.max_entries,
            ttl: Duration::from_secs(c.ttl_s),
            min_cosine: c.min_cosine,
        });
        Arc::new(cache) as Arc<dyn ResponseCache>
    })
}

/// Loads every stage and the indexes (from their snapshots or the store),
/// and builds the pipeline.
pub async fn load(state: &AppState, overrides: Overrides) -> Result<Pipeline, String> {
    let config = &state.config;
    let corpus = corpus(config, state.store.clone(), overrides.embedder).await?;
    let reranker = reranker(config).await?;
    let t1 = Instant::now();
    let n = corpus
        .rebuild()
        .await
        .map_err(|e| format!("loading the indexes: {e}"))?;
    tracing::info!(
        chunks = n,
        from_snapshots = corpus.snapshot_loads(),
        elapsed_ms = t1.elapsed().as_millis() as u64,
        "indexes loaded"
    );
    let r = &config.rerank;
    let settings = Settings {
        model: config.llm.model.clone(),
        top_k: config.chat.top_k,
        history_messages: config.chat.history_messages,
        rerank: RerankParams {
            depth: r.depth,
            batch: r.batch,
            weight: r.weight,
        },
        answer: config.answers(),
        capture_content: config.telemetry.capture_content,
        max_concurrent_ingests: config.limits.max_concurrent_ingests,
        max_jobs: config.limits.max_jobs,
        max_jobs_per_tenant: config.limits.max_jobs_per_tenant,
        max_queued_job_bytes: config.limits.max_queued_job_bytes,
    };
    Ok(Pipeline::new(
        corpus,
        reranker,
        state.backends.clone(),
        config.load.levels.clone(),
        answer_cache(config),
        state.budgets.clone(),
        state.metrics.clone(),
        settings,
    ))
}
