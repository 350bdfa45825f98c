//! `ragtime-bench tracing`: what tracing costs on the retrieval path.
//!
//! Three `ragtime serve` processes (the release binary beside this one) on
//! copies of one data folder (`BENCH_DOCS` SciFact documents): spans off,
//! `telemetry.sample_ratio = 0.1`, and 1.0, both exporting over OTLP
//! (HTTP/protobuf) to a collector in this process that takes and discards
//! every batch. `BENCH_CLIENTS` closed-loop clients (default 4) send
//! `POST /v1/search` (hybrid, SciFact train queries) to one server at a
//! time, turn by turn in 2 s slices (each round starting with the next
//! server), so drift in the machine falls on all three alike;
//! `BENCH_SECONDS` (default 60) per server in all. Prints latency
//! percentiles, throughput and the spans each server exported.
//! (Processes, not one: the tracing subscriber is process-wide.)

use crate::data::SciFact;
use crate::env_usize;
use crate::load::{FakeBackend, serve};
use crate::stats::pct;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub(crate) struct Proc {
    pub name: &'static str,
    pub child: Child,
    pub base: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

pub(crate) fn ragtime_bin() -> PathBuf {
    let me = std::env::current_exe().expect("current exe");
    let bin = me.with_file_name("ragtime");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build --release -p ragtime-gateway --bin ragtime",
        bin.display()
    );
    bin
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).expect("copy");
        }
    }
}

/// `ragtime serve` on `data` with the fake backend at `llm`, logs at WARN
/// and no span export unless `env` (set last) says otherwise; waits until it
/// is ready and says how long that took. With `BENCH_SERVER_LOG=file` its
/// log (at `RUST_LOG`, as set for the bench, or info) is appended there.
pub(crate) async fn run_ragtime(
    name: &'static str,
    data: &Path,
    llm: &str,
    env: &[(&str, String)],
    http: &reqwest::Client,
) -> (Proc, Duration) {
    let port = free_port();
    let t = Instant::now();
    let mut cmd = Command::new(ragtime_bin());
    cmd.arg("serve")
        .env("RAGTIME__SERVER__ADDR", format!("127.0.0.1:{port}"))
        .env("RAGTIME__DATA_DIR", data)
        .env("RAGTIME__LLM__BASE_URL", llm)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::null());
    match std::env::var_os("BENCH_SERVER_LOG") {
        Some(file) => {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
                .expect("BENCH_SERVER_LOG");
            let level = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
            cmd.env("RUST_LOG", level).stderr(log);
        }
        None => {
            cmd.env("RUST_LOG", "warn").stderr(Stdio::null());
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let child = cmd.spawn().expect("start ragtime");
    let mut p = Proc {
        name,
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    loop {
        if let Ok(r) = http.get(format!("{}/readyz", p.base)).send().await
            && r.status() == 200
        {
            return (p, t.elapsed());
        }
        // A server that exits (no models prepared, a port taken) will never
        // answer: say so now instead of waiting out the deadline below.
        if let Ok(Some(status)) = p.child.try_wait() {
            panic!(
                "{name} exited before it became ready ({status}); \
                 set BENCH_SERVER_LOG=<file> to keep its log (and run `make setup` first)"
            );
        }
        // Four hours: a first build of several million chunks from the
        // store takes most of an hour on two cores.
        assert!(
            t.elapsed() < Duration::from_secs(4 * 3600),
            "{name} never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start(
    name: &'static str,
    data: &Path,
    llm: &str,
    otlp: Option<(&str, f64)>,
    http: &reqwest::Client,
) -> Proc {
    let mut env = vec![
        ("RAGTIME__CACHE__ENABLED", "false".to_owned()),
        ("RAGTIME__TELEMETRY__LOG_FORMAT", "json".to_owned()),
    ];
    if let Some((endpoint, ratio)) = otlp {
        env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_owned()));
        env.push(("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_owned()));
        env.push(("RAGTIME__TELEMETRY__SAMPLE_RATIO", ratio.to_string()));
    }
    run_ragtime(name, data, llm, &env, http).await.0
}

/// A collector that accepts every OTLP/HTTP batch and keeps nothing (an
/// empty `ExportTraceServiceResponse` is an empty body).
async fn sink() -> (String, Arc<AtomicUsize>) {
    let batches = Arc::new(AtomicUsize::new(0));
    let n = batches.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            n.fetch_add(usize::from(!body.is_empty()), Ordering::Relaxed);
            async {
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    (serve(app).await, batches)
}

async fn counter(http: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = match http.get(format!("{base}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

pub async fn tracing_cost(data: &SciFact) {
    let docs = env_usize("BENCH_DOCS", 2000);
    let secs = env_usize("BENCH_SECONDS", 60) as u64;
    let clients = env_usize("BENCH_CLIENTS", 4);
    let http = reqwest::Client::new();
    let llm = FakeBackend::start(0, Duration::ZERO).await;
    let (collector, batches) = sink().await;

    // One data folder, ingested once, copied for each server.
    let root = tempfile::tempdir().expect("tempdir");
    let first = root.path().join("a");
    {
        let p = start("ingest", &first, &llm.base_url, None, &http).await;
        for batch in data.corpus[..docs.min(data.corpus.len())].chunks(100) {
            let body: Vec<_> = batch
                .iter()
                .map(|(id, title, text)| json!({"id": id, "title": title, "text": text}))
                .collect();
            let r = http
                .post(format!("{}/v1/documents", p.base))
                .json(&json!({"documents": body}))
                .send()
                .await
                .expect("ingest");
            assert_eq!(r.status(), 200, "ingest");
        }
    }
    copy_dir(&first, &root.path().join("b"));
    copy_dir(&first, &root.path().join("c"));
    let servers = [
        start("spans off", &first, &llm.base_url, None, &http).await,
        start(
            "ratio 0.1",
            &root.path().join("b"),
            &llm.base_url,
            Some((&collector, 0.1)),
            &http,
        )
        .await,
        start(
            "ratio 1.0",
            &root.path().join("c"),
            &llm.base_url,
            Some((&collector, 1.0)),
            &http,
        )
        .await,
    ];
    let queries: Arc<Vec<String>> = Arc::new(data.queries.iter().map(|q| q.1.clone()).collect());

    // Warm each server, then take turns.
    let mut lat: Vec<Vec<Duration>> = vec![Vec::new(); servers.len()];
    let mut errors = vec![0usize; servers.len()];
    let slice = Duration::from_secs(2);
    let rounds = (secs / 2).max(1);
    let next = Arc::new(AtomicUsize::new(0));
    for round in 0..=rounds {
        // Each round starts with the next server: none always follows the
        // same one.
        for k in 0..servers.len() {
            let i = (k + round as usize) % servers.len();
            let s = &servers[i];
            let stop = Arc::new(AtomicBool::new(false));
            let mut tasks = Vec::new();
            for _ in 0..clients {
                let (http, base, qs, stop, next) = (
                    http.clone(),
                    s.base.clone(),
                    queries.clone(),
                    stop.clone(),
                    next.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    let mut out = Vec::new();
                    let mut failed = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let q = &qs[next.fetch_add(1, Ordering::Relaxed) % qs.len()];
                        let t = Instant::now();
                        let r = http
                            .post(format!("{base}/v1/search"))
                            .json(&json!({"query": q, "top_k": 10}))
                            .send()
                            .await;
                        match r {
                            Ok(r) if r.status() == 200 => {
                                let _ = r.bytes().await;
                                out.push(t.elapsed());
                            }
                            _ => failed += 1,
                        }
                    }
                    (out, failed)
                }));
            }
            tokio::time::sleep(slice).await;
            stop.store(true, Ordering::Relaxed);
            for t in tasks {
                let (out, failed) = t.await.expect("client");
                // Round 0 warms up.
                if round > 0 {
                    lat[i].extend(out);
                    errors[i] += failed;
                }
            }
        }
    }
    println!(
        "\n## tracing cost on the retrieval path ({docs} SciFact documents, POST /v1/search hybrid top 10, {clients} closed-loop clients, {secs} s a setting in 2 s turns, OTLP/HTTP to a discarding collector)"
    );
    println!(
        "| setting | requests | req/s | p50 ms | p95 ms | p99 ms | p99 vs off | spans exported | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let ms = |v: &[Duration], p: f64| pct(&mut v.to_vec(), p);
    let off_p99 = ms(&lat[0], 99.0);
    for (i, s) in servers.iter().enumerate() {
        let p99 = ms(&lat[i], 99.0);
        let exported = counter(&http, &s.base, "ragtime_trace_spans_exported_total").await;
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:+.1} % | {exported:.0} | {} |",
            s.name,
            lat[i].len(),
            lat[i].len() as f64 / (rounds as f64 * slice.as_secs_f64()),
            ms(&lat[i], 50.0),
            ms(&lat[i], 95.0),
            p99,
            (p99 / off_p99 - 1.0) * 100.0,
            errors[i],
        );
    }
    println!(
        "collector received {} batches",
        batches.load(Ordering::Relaxed)
    );
}
