//! `Application::build` opens the store, starts the LLM backend, starts
//! loading the models and binds the listener; `run_until_stopped` serves.

use crate::config::{Config, LogFormatSetting};
use crate::error::{ApiError, ErrorCode};
use crate::loader::{self, Overrides};
use crate::routes;
use crate::state::AppState;
use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use ragtime_llm::{LlmClient, LocalServer, LocalServerOptions};
use ragtime_pipeline::backend::breaker::Breaker;
use ragtime_pipeline::backend::{Backend, BackendSpec, Backends, HedgePolicy};
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
            sampling: ragtime_telemetry::Sampling {
                ratio: config.telemetry.sample_ratio,
                buffer_spans: config.telemetry.sample_buffer_spans,
                buffer_bytes: config.telemetry.sample_buffer_mib << 20,
            },
        });
    ragtime_telemetry::init(format, otlp.as_ref())
}

/// A backend's client and how it is set up.
type Spec = (LlmClient, BackendSpec);

/// The configured backends, or the local llama-server started for them.
fn llm_backends(config: &Config) -> anyhow::Result<(Vec<Spec>, Option<LocalServer>)> {
    let l = &config.llm;
    let api_key = l.api_key.as_ref().map(|s| s.expose().to_owned());
    let spec = |url: &str, model: &str, slots: usize, weight: f64, ctx: u32| {
        let client = LlmClient::new(url, api_key.clone()).with_prompt_cache(l.prompt_cache);
        let spec = BackendSpec {
            name: client.base_url().to_owned(),
            model: model.to_owned(),
            slots,
            max_queue: l.max_queue,
            max_queue_wait: (l.max_queue_wait_ms > 0)
                .then(|| Duration::from_millis(l.max_queue_wait_ms)),
            weight,
            context_tokens: ctx as usize,
        };
        (client, spec)
    };
    if !l.backends.is_empty() {
        let list = l.backends.iter().map(|b| {
            let model = b.model.as_deref().unwrap_or(&l.model);
            spec(
                &b.base_url,
                model,
                b.max_concurrency,
                b.weight,
                b.ctx_size.unwrap_or(l.ctx_size),
            )
        });
        return Ok((list.collect(), None));
    }
    if let Some(url) = &l.base_url {
        return Ok((
            vec![spec(url, &l.model, l.max_concurrency, 1.0, l.ctx_size)],
            None,
        ));
    }
    let server = LocalServer::start(LocalServerOptions {
        binary: l.server_bin.clone(),
        model: l.model_path.clone(),
        alias: l.model.clone(),
        ctx_size: l.ctx_size,
        threads: l.threads,
        parallel: l.parallel,
        batch_size: l.batch_size,
        port: 0,
    })
    .map_err(anyhow::Error::msg)
    .context("cannot start the local LLM (set RAGTIME__LLM__BASE_URL to use another backend)")?;
    // llama-server splits its context window over its slots.
    let per_slot = l.ctx_size / l.parallel.max(1);
    let one = spec(
        &server.base_url(),
        &l.model,
        l.parallel as usize,
        1.0,
        per_slot,
    );
    Ok((vec![one], Some(server)))
}

/// The backends with their gates and breakers, probed for health.
fn backends(config: &Config, specs: &[Spec]) -> Arc<Backends> {
    let l = &config.llm;
    let list = specs
        .iter()
        .map(|(client, spec)| {
            let breaker = Breaker::new(
                l.breaker.failures,
                Duration::from_millis(l.breaker.cooldown_ms),
            );
            Backend::new(spec.clone(), Arc::new(client.clone()), breaker)
        })
        .collect();
    let hedge = HedgePolicy {
        enabled: l.hedge.enabled,
        share: l.hedge.share,
        floor: Duration::from_millis(l.hedge.floor_ms),
        cap: Duration::from_millis(l.hedge.cap_ms),
    };
    let backends = Arc::new(Backends::new(list, hedge));
    if l.probe_ms > 0 {
        backends.probe(Duration::from_millis(l.probe_ms));
    }
    backends
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        Self::build_with(config, Overrides::default()).await
    }

    /// As [`Application::build`], with some stages provided by the caller.
    pub async fn build_with(config: Config, overrides: Overrides) -> anyhow::Result<Application> {
        config.validate()?;
        let store = open_store(&config).await?;
        let (specs, local) = llm_backends(&config)?;
        let backends = backends(&config, &specs);
        // Fail fast on missing model files; load and warm up in the
        // background so the process answers /healthz at once and /readyz
        // when warm.
        loader::check_files(&config, &overrides)?;
        let listener = TcpListener::bind(config.server.addr)
            .await
            .with_context(|| format!("cannot listen on {}", config.server.addr))?;
        let body_limit = config.server.body_limit_bytes;
        let llm = specs.into_iter().next().map(|(c, _)| c);
        let llm = llm.ok_or_else(|| anyhow::anyhow!("no llm backend is configured"))?;
        let state = Arc::new(AppState::new(config, store, llm, backends, local));
        // Budgets changed at runtime survive restarts and reach every replica.
        state.budgets.sync().await.map_err(anyhow::Error::msg)?;
        state
            .budgets
            .sync_tenants()
            .await
            .map_err(anyhow::Error::msg)?;
        state.budgets.follow(Duration::from_secs(1));
        tokio::spawn(expire_conversations(
            state.store.clone(),
            state.config.chat.retention_days,
        ));
        let loading = state.clone();
        tokio::spawn(async move {
            let res = loader::load(&loading, overrides).await;
            if let Err(e) = &res {
                tracing::error!(error = %e, "the retrieval engine failed to start");
            }
            loading.set_pipeline(res);
            if let Some(p) = loading.loaded().cloned() {
                tokio::spawn(follow_store(p.clone()));
                tokio::spawn(save_snapshots(p.clone()));
                tokio::spawn(trim_log(p.clone()));
                let retrieval = &loading.config.retrieval;
                if retrieval.engine == crate::config::Engine::Postgres
                    && retrieval.bm25_rebuild_after > 0.0
                {
                    tokio::spawn(keep_bm25_fresh(p.clone(), retrieval.bm25_rebuild_after));
                }
                unload_idle(p, loading.config.limits.idle_unload_s).await;
            }
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
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(crate::observe::request_span)
                    // A 5xx is logged at WARN here: the expected ones
                    // (budget_exceeded, overloaded, not_ready) are no
                    // fault of ours, and internal errors log themselves
                    // at ERROR where they happen.
                    .on_failure(
                        tower_http::trace::DefaultOnFailure::new().level(tracing::Level::WARN),
                    ),
            )
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
        let headers = Duration::from_millis(self.state.config.server.header_timeout_ms);
        let serve = serve(self.listener, self.router, headers, async move {
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
        if let Some(p) = self.state.loaded()
            && let Err(e) = p.corpus().leave().await
        {
            tracing::warn!(error = %e, "could not record on the change log that this replica stops");
        }
        // Closing waits for every connection to come back, and the
        // change-log listener (`follow_store`) holds one for the process's
        // life: bounded, so that a stop never hangs on it.
        if tokio::time::timeout(STORE_CLOSE_WAIT, self.state.store.close())
            .await
            .is_err()
        {
            tracing::warn!(
                "the store's connections were still held after {STORE_CLOSE_WAIT:?}; stopping without them"
            );
        }
        tracing::info!("ragtime stopped");
        Ok(())
    }
}

/// Creates the data folder and opens (and migrates) the store.
pub async fn open_store(config: &Config) -> anyhow::Result<Store> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data_dir {}", config.data_dir.display()))?;
    let db_url = config.database_url();
    let options = ragtime_store::Options {
        search_connections: config.database.search_connections,
    };
    let store = Store::open_with(&db_url, options).await.with_context(|| {
        format!(
            "cannot open the store at {}",
            ragtime_store::redact(&db_url)
        )
    })?;
    let max_lag = Duration::from_millis(config.database.max_read_lag_ms);
    store
        .with_standbys(&config.database.read_urls(), max_lag)
        .context("database.read_urls")
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

/// How long a stop waits for the store's connections to close.
const STORE_CLOSE_WAIT: Duration = Duration::from_secs(2);

/// How often the indexes look for changes other processes made.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// Applies what other replicas and `ragtime ingest` write to the store to
/// this process's indexes; runs for the process's life. On PostgreSQL a
/// notification wakes it as a change commits; it polls as well (SQLite has
/// no notifications, and one can be lost while a connection is down).
async fn follow_store(pipeline: Arc<ragtime_pipeline::Pipeline>) {
    let mut every = tokio::time::interval(FOLLOW_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut listener = match pipeline.corpus().store.change_listener().await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "LISTEN on the store failed; following by polling only");
            None
        }
    };
    loop {
        match listener.as_mut() {
            Some(l) => tokio::select! {
                _ = every.tick() => {}
                r = l.next() => {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "the store's change notifications broke off; polling until they are back");
                        // Not in a loop on a dead connection: the next
                        // try comes after a polling interval.
                        every.tick().await;
                    }
                }
            },
            None => {
                every.tick().await;
            }
        }
        match pipeline.corpus().follow().await {
            Ok(_) => {
                let lag = pipeline.corpus().lag();
                pipeline.metrics().set_index_lag(lag.entries, lag.seconds);
                probe_standbys(&pipeline).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "following the store's changes failed; trying again");
            }
        }
        count_filtered_searches(&pipeline);
    }
}

/// Measures the standbys' lag (`database.read_urls`) for the choice of
/// where searches read, and puts it on `/metrics`.
async fn probe_standbys(pipeline: &ragtime_pipeline::Pipeline) {
    let store = &pipeline.corpus().store;
    if let Err(e) = store.probe_standbys().await {
        tracing::warn!(error = %e, "probing the standbys failed; searches read the primary");
    }
    for (i, s) in store.standbys().iter().enumerate() {
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        pipeline
            .metrics()
            .set_standby(i, s.usable, s.lag_ms as f64 / 1000.0);
    }
}

/// Puts the database engine's filtered searches, by how each was
/// answered, on `/metrics`.
fn count_filtered_searches(pipeline: &ragtime_pipeline::Pipeline) {
    use ragtime_telemetry::metrics::FilteredPath;
    let store = &pipeline.corpus().store;
    if store.searches_in_database() {
        let p = store.filtered_paths();
        pipeline.metrics().set_filtered_searches([
            (FilteredPath::Exact, p.exact),
            (FilteredPath::Counted, p.counted),
            (FilteredPath::Sampled, p.sampled),
            (FilteredPath::Walked, p.walked),
        ]);
    }
}

/// Saves the snapshots of loaded collections that have none or changed
/// (`[snapshots]`), looking every second (a look reads two numbers per
/// loaded collection); runs for the process's life.
async fn save_snapshots(pipeline: Arc<ragtime_pipeline::Pipeline>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(e) = pipeline.corpus().save_snapshots().await {
            tracing::warn!(error = %e, "saving indexes failed; trying again later");
        }
    }
}

/// How often a replica reports its change-log position and trims the log.
const TRIM_EVERY: Duration = Duration::from_secs(60);
/// A replica not heard from for this long no longer holds the log back
/// (if it comes back, it reloads from the store what it missed).
const REPLICA_STALE: Duration = Duration::from_secs(3600);

/// Reports this replica's change-log position and trims the log below
/// every live replica's, every minute; runs for the process's life.
async fn trim_log(pipeline: Arc<ragtime_pipeline::Pipeline>) {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match pipeline.corpus().keep_log_trimmed(REPLICA_STALE).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(entries = n, "change log trimmed"),
            Err(e) => {
                tracing::warn!(error = %e, "trimming the change log failed; trying again later")
            }
        }
    }
}

/// How often the `postgres` engine looks whether its BM25 index is due
/// a build.
const BM25_LOOK_EVERY: Duration = Duration::from_secs(60);
/// Fewer documents written than this never make a build due.
const BM25_REBUILD_AT_LEAST: i64 = 1000;

/// Builds the `postgres` engine's BM25 index again once `fraction` of the
/// documents were written since its last build (`retrieval.bm25_rebuild_after`,
/// [`ragtime_store::Store::keep_bm25_fresh`]), looking every minute, and
/// twice as long after each failure in a row (at most an hour: a build
/// that keeps failing is not started again every minute); runs for the
/// process's life.
async fn keep_bm25_fresh(pipeline: Arc<ragtime_pipeline::Pipeline>, fraction: f64) {
    let (mut wait, mut failures) = (Duration::ZERO, 0u32);
    loop {
        tokio::time::sleep(wait).await;
        let started = std::time::Instant::now();
        match pipeline
            .corpus()
            .store
            .keep_bm25_fresh(fraction, BM25_REBUILD_AT_LEAST)
            .await
        {
            Ok(look) => {
                failures = 0;
                if let Some(look) = look.filter(|l| l.rebuilt) {
                    tracing::info!(
                        documents = look.documents,
                        written_since = look.written_since,
                        seconds = started.elapsed().as_secs_f64(),
                        "BM25 index built again"
                    );
                }
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(error = %e, failures, "building the BM25 index again failed; trying again later");
            }
        }
        wait = BM25_LOOK_EVERY
            .saturating_mul(1 << failures.min(6))
            .min(Duration::from_secs(3600));
    }
}

/// Drops the indexes of collections idle for `idle_s` (0: never), looking
/// every quarter of that (at most once a minute); runs for the process's life.
async fn unload_idle(pipeline: Arc<ragtime_pipeline::Pipeline>, idle_s: u64) {
    if idle_s == 0 {
        return;
    }
    let idle = Duration::from_secs(idle_s);
    let every = (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        tokio::time::sleep(every).await;
        let n = pipeline.corpus().unload_idle(idle).await;
        if n > 0 {
            tracing::info!(collections = n, idle_s, "idle collections' indexes dropped");
        }
    }
}

/// How long a job's record is kept after it last moved.
const JOB_RETENTION_MS: i64 = 7 * 86_400_000;

/// Removes conversations' messages older than `days` (0: keeps them) and
/// jobs that ended over a week ago, at start and every hour after; runs
/// for the process's life.
async fn expire_conversations(store: ragtime_store::Store, days: u32) {
    let keep_ms = i64::from(days) * 86_400_000;
    let mut every = tokio::time::interval(Duration::from_secs(3600));
    loop {
        every.tick().await;
        let now = ragtime_store::now_ms();
        match store.expire_jobs(now - JOB_RETENTION_MS).await {
            Ok(0) => {}
            Ok(jobs) => tracing::info!(jobs, "ended jobs' records removed"),
            Err(e) => tracing::warn!(error = %e, "removing ended jobs failed"),
        }
        if days == 0 {
            continue;
        }
        match store.expire_conversations(now - keep_ms).await {
            Ok((0, 0)) => {}
            Ok((messages, conversations)) => tracing::info!(
                messages,
                conversations,
                days,
                "expired conversation messages removed"
            ),
            Err(e) => tracing::warn!(error = %e, "removing expired conversation messages failed"),
        }
    }
}

/// Serves `router` on `listener` until `signal`, then waits for the open
/// connections to finish (the caller bounds how long). hyper's own
/// connection loop rather than `axum::serve`, which installs no timer, so
/// hyper's `header_read_timeout` never held: a client trickling its
/// headers kept its connection for ever. No Nagle: streamed tokens leave
/// as soon as they are written.
async fn serve(
    listener: TcpListener,
    router: axum::Router,
    header_timeout: Duration,
    signal: impl Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut signal = std::pin::pin!(signal);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors, say: wait, then go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let _ = tcp.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(tcp), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
