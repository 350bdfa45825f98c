//! `Application::build` opens the store, starts the LLM backend, starts
//! loading the models and binds the listener; `run_until_stopped` serves.

use crate::config::{Config, LogFormatSetting};
use crate::error::{ApiError, ErrorCode};
use crate::routes;
use crate::state::AppState;
use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use ragtime_embed::{EmbedService, EmbedderOptions, OnnxEmbedder, ServiceOptions};
use ragtime_llm::{LlmClient, LocalServer, LocalServerOptions};
use ragtime_pipeline::rag::{ChunkParams, Rag};
use ragtime_store::Store;
use std::future::Future;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub struct Application {
    listener: TcpListener,
    state: Arc<AppState>,
    router: Router,
}

/// Sets up logging, and span export when an OTLP endpoint is configured
/// (once per process). Keep the guard; its `shutdown` flushes the spans.
pub fn init_telemetry(config: &Config) -> ragtime_telemetry::Telemetry {
    let format = match config.telemetry.log_format {
        LogFormatSetting::Json => ragtime_telemetry::LogFormat::Json,
        LogFormatSetting::Pretty => ragtime_telemetry::LogFormat::Pretty,
        LogFormatSetting::Auto if std::io::stderr().is_terminal() => {
            ragtime_telemetry::LogFormat::Pretty
        }
        LogFormatSetting::Auto => ragtime_telemetry::LogFormat::Json,
    };
    let otlp = config
        .telemetry
        .otlp_endpoint
        .as_ref()
        .map(|endpoint| ragtime_telemetry::Otlp {
            endpoint: endpoint.clone(),
            protocol: ragtime_telemetry::OtlpProtocol::parse(&config.telemetry.otlp_protocol)
                .unwrap_or(ragtime_telemetry::OtlpProtocol::Grpc),
        });
    ragtime_telemetry::init(format, otlp.as_ref())
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        config.validate()?;
        let store = open_store(&config).await?;

        let api_key = config.llm.api_key.as_ref().map(|s| s.0.clone());
        let (llm, local) = match &config.llm.base_url {
            Some(url) => (LlmClient::new(url, api_key), None),
            None => {
                let server = LocalServer::start(LocalServerOptions {
                    binary: config.llm.server_bin.clone(),
                    model: config.llm.model_path.clone(),
                    alias: config.llm.model.clone(),
                    ctx_size: config.llm.ctx_size,
                    threads: config.llm.threads,
                    parallel: config.llm.parallel,
                    port: 0,
                })
                .map_err(anyhow::Error::msg)
                .context("cannot start the local LLM (set RAGTIME__LLM__BASE_URL to use another backend)")?;
                (LlmClient::new(&server.base_url(), api_key), Some(server))
            }
        };

        // Fail fast on missing model files; load and warm up in the background
        // so the process answers /healthz at once and /readyz when warm.
        let embed_opts = embedder_options(&config);
        for f in [
            embed_opts.model_dir.join("model.onnx"),
            embed_opts.model_dir.join("tokenizer.json"),
            embed_opts.ort_lib.clone(),
        ] {
            anyhow::ensure!(f.is_file(), "{} not found (run `make setup`)", f.display());
        }

        let listener = TcpListener::bind(config.server.addr)
            .await
            .with_context(|| format!("cannot listen on {}", config.server.addr))?;
        let body_limit = config.server.body_limit_bytes;
        let state = Arc::new(AppState::new(config, store, llm, local));
        // Budgets changed at runtime survive restarts and reach every replica.
        state.sync_budgets().await.map_err(anyhow::Error::msg)?;
        state
            .sync_tenant_budgets()
            .await
            .map_err(anyhow::Error::msg)?;
        let follower = Arc::downgrade(&state);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(state) = follower.upgrade() else {
                    return;
                };
                if let Err(e) = state.sync_budgets().await {
                    tracing::warn!(error = %e, "could not read the budget versions");
                }
                if let Err(e) = state.sync_tenant_budgets().await {
                    tracing::warn!(error = %e, "could not read the tenants' budgets");
                }
            }
        });

        let loader = state.clone();
        tokio::spawn(async move {
            let res = load_engine(&loader, embed_opts).await;
            if let Err(e) = &res {
                tracing::error!(error = %e, "the retrieval engine failed to start");
            }
            loader.set_rag(res);
        });

        let router = routes::router(state.clone())
            .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
            .method_not_allowed_fallback(|| async {
                ApiError::new(
                    ErrorCode::MethodNotAllowed,
                    "method not allowed on this route",
                )
            })
            .layer(DefaultBodyLimit::max(body_limit))
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                crate::observe::observe,
            ))
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(TraceLayer::new_for_http().make_span_with(crate::observe::request_span))
            .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid));
        Ok(Application {
            listener,
            state,
            router,
        })
    }

    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until SIGINT or SIGTERM, then drains and stops the LLM.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        self.run_until(shutdown_signal()).await
    }

    /// Serves until `signal` completes; in-flight requests get the
    /// configured grace period to finish.
    pub async fn run_until(
        self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let addr = self.listener.local_addr()?;
        tracing::info!(%addr, "ragtime listening");
        let grace = Duration::from_secs(self.state.config.server.shutdown_grace_s);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        // No Nagle: streamed tokens leave as soon as they are written.
        let listener = axum::serve::ListenerExt::tap_io(self.listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let serve = axum::serve(listener, self.router).with_graceful_shutdown(async move {
            signal.await;
            let _ = tx.send(());
        });
        let drained = async move {
            let _ = rx.await;
            tracing::info!(
                grace_s = grace.as_secs(),
                "shutting down: draining requests"
            );
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            res = serve => res?,
            () = drained => tracing::warn!("grace period over; dropping remaining requests"),
        }
        if let Some(server) = self.state.take_local_llm() {
            server.shutdown().await;
        }
        self.state.store.close().await;
        tracing::info!("ragtime stopped");
        Ok(())
    }
}

/// Creates the data folder and opens (and migrates) the store.
async fn open_store(config: &Config) -> anyhow::Result<Store> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data_dir {}", config.data_dir.display()))?;
    let db_url = config.database_url();
    Store::open(&db_url).await.with_context(|| {
        format!(
            "cannot open the store at {}",
            ragtime_store::redact(&db_url)
        )
    })
}

fn embedder_options(config: &Config) -> EmbedderOptions {
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

/// The embedding service and chunking settings from the config.
fn new_rag(config: &Config, store: Store, model: OnnxEmbedder) -> Rag {
    let e = &config.embed;
    let service = EmbedService::new(
        model,
        ServiceOptions {
            workers: e.workers,
            max_batch: e.batch_size,
            max_wait: Duration::from_micros(e.batch_wait_us),
            cache_entries: e.cache_entries,
            cache_ttl: Duration::from_secs(e.cache_ttl_s),
        },
    );
    Rag::new(
        store,
        Arc::new(service),
        ChunkParams {
            max_tokens: config.chunking.max_tokens,
            overlap: config.chunking.overlap_tokens,
        },
    )
}

/// `ragtime ingest`: reads every file first (so a bad file writes nothing),
/// then ingests in batches, printing progress and throughput.
pub async fn ingest_files(
    config: &Config,
    collection: &str,
    files: &[std::path::PathBuf],
    batch: usize,
) -> anyhow::Result<()> {
    config.validate()?;
    crate::routes::documents::check_collection(collection, "collection")
        .map_err(|e| anyhow::anyhow!("--collection: {}", e.message))?;
    let mut docs = Vec::new();
    for f in files {
        let bytes = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
        docs.extend(
            crate::files::docs_from_file(&f.display().to_string(), bytes)
                .map_err(anyhow::Error::msg)?,
        );
    }
    let store = open_store(config).await?;
    let opts = embedder_options(config);
    let model = tokio::task::spawn_blocking(move || OnnxEmbedder::load(&opts)).await??;
    let rag = new_rag(config, store, model);
    let t0 = std::time::Instant::now();
    let (mut n_docs, mut n_chunks, mut unchanged) = (0usize, 0usize, 0usize);
    let total = docs.len();
    let mut it = docs.into_iter().peekable();
    let batches = std::iter::from_fn(|| {
        it.peek()
            .is_some()
            .then(|| it.by_ref().take(batch).collect::<Vec<_>>())
    });
    rag.ingest_batches(collection, batches, |done| {
        for r in done {
            n_docs += 1;
            if r.status == ragtime_store::Upsert::Unchanged {
                unchanged += 1;
            } else {
                n_chunks += r.chunks;
            }
        }
        eprintln!("ingest: {n_docs}/{total} documents");
    })
    .await?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "ingested {n_docs} documents into {collection:?} ({unchanged} unchanged, {n_chunks} chunks embedded) in {secs:.1} s: {:.0} chunks/s",
        n_chunks as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// Loads and warms the embedding model, then rebuilds the indexes from the
/// store. Until this is done `/readyz` says so.
async fn load_engine(state: &AppState, opts: EmbedderOptions) -> Result<Rag, String> {
    let t0 = std::time::Instant::now();
    let model = tokio::task::spawn_blocking(move || OnnxEmbedder::load(&opts))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    tracing::info!(
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "embedding model loaded and warmed"
    );
    if let Some(dir) = &state.config.rerank.model_dir {
        let r = &state.config.rerank;
        let opts = ragtime_rerank::RerankOptions {
            model_dir: dir.clone(),
            model_file: r.model_file.clone(),
            ort_lib: state.config.embed.ort_lib.clone(),
            intra_threads: state.config.embed.intra_threads,
            max_tokens: r.max_tokens,
        };
        let ce = tokio::task::spawn_blocking(move || ragtime_rerank::CrossEncoder::load(&opts))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("reranker: {e}"))?;
        let _ = state.reranker.set(Arc::new(ce));
        tracing::info!(dir = %dir.display(), "cross-encoder loaded and warmed");
    }
    let rag = new_rag(&state.config, state.store.clone(), model);
    let t1 = std::time::Instant::now();
    let n = rag
        .rebuild()
        .await
        .map_err(|e| format!("rebuilding the indexes: {e}"))?;
    tracing::info!(
        chunks = n,
        elapsed_ms = t1.elapsed().as_millis() as u64,
        "indexes rebuilt from the store"
    );
    Ok(rag)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
