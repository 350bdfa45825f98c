//! `ragtime-bench follow`: how far a replica trails another while the
//! other ingests. Two `ragtime serve` processes share one fresh PostgreSQL
//! database (`BENCH_DATABASE_URL`, default the local test server). The
//! SciFact corpus is ingested on A in batches of `BENCH_BATCH` documents
//! (64), each batch tagged in its metadata; for each batch, B is searched
//! (lexically, filtered to the batch) from the moment A acknowledged it
//! until B finds it — the follower's lag as a user sees it. Meanwhile
//! `BENCH_CLIENTS` (2) clients search B with SciFact queries without pause,
//! whose latency is reported too.

use crate::data::load_scifact;
use crate::env_usize;
use crate::load::FakeBackend;
use crate::stats::pct;
use crate::tracing_cost::run_ragtime;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub async fn follow() {
    let admin_url = std::env::var("BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let batch = env_usize("BENCH_BATCH", 64);
    let clients = env_usize("BENCH_CLIENTS", 2);
    let limit = env_usize("BENCH_DOCS", usize::MAX);
    let name = format!("ragtime_follow_{}", std::process::id());
    let admin = sqlx::PgPool::connect(&admin_url).await.expect("PostgreSQL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("create database");
    let base = admin_url
        .rsplit_once('/')
        .map_or(admin_url.as_str(), |(b, _)| b);
    let url = format!("{base}/{name}");

    let data = load_scifact();
    let http = reqwest::Client::new();
    let llm = FakeBackend::start(0, Duration::ZERO).await;
    let dirs = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let env = [("RAGTIME__DATABASE_URL", url.clone())];
    let (a, _) = run_ragtime("a", dirs.0.path(), &llm.base_url, &env, &http).await;
    let (b, _) = run_ragtime("b", dirs.1.path(), &llm.base_url, &env, &http).await;

    // Searches on B without pause, all the while.
    let stop = Arc::new(AtomicBool::new(false));
    let mut searchers = Vec::new();
    for c in 0..clients {
        let (http, base, stop) = (http.clone(), b.base.clone(), stop.clone());
        let queries: Vec<String> = data
            .queries
            .iter()
            .skip(c)
            .step_by(clients)
            .map(|q| q.1.clone())
            .collect();
        searchers.push(tokio::spawn(async move {
            let mut took = Vec::new();
            for q in queries.iter().cycle() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let t = Instant::now();
                let r = http
                    .post(format!("{base}/v1/search"))
                    .json(&json!({"collection": "scifact", "query": q, "top_k": 10}))
                    .send()
                    .await;
                // The collection does not exist before A's first batch.
                if r.is_ok_and(|r| r.status() == 200) {
                    took.push(t.elapsed());
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            took
        }));
    }

    let mut lags = Vec::new();
    let t0 = Instant::now();
    let mut chunks = 0u64;
    let docs: Vec<_> = data.corpus.iter().take(limit).collect();
    for (i, group) in docs.chunks(batch).enumerate() {
        let documents: Vec<Value> = group
            .iter()
            .map(|(id, title, text)| json!({"id": id, "title": title, "text": text, "metadata": {"batch": i}}))
            .collect();
        let r = http
            .post(format!("{}/v1/documents", a.base))
            .json(&json!({"collection": "scifact", "documents": documents}))
            .send()
            .await
            .expect("ingest on A");
        assert_eq!(r.status(), 200, "ingest batch {i}");
        let acked = Instant::now();
        let body: Value = r.json().await.expect("json");
        chunks += body["documents"].as_array().map_or(0, |d| {
            d.iter().map(|x| x["chunks"].as_u64().unwrap_or(0)).sum()
        });
        let probe = json!({
            "collection": "scifact",
            "query": group[0].1,
            "mode": "lexical",
            "top_k": 1,
            "filter": {"batch": i},
        });
        loop {
            let r = http
                .post(format!("{}/v1/search", b.base))
                .json(&probe)
                .send()
                .await
                .expect("search B");
            if r.status() == 200 {
                let found: Value = r.json().await.expect("json");
                if found["results"].as_array().is_some_and(|r| !r.is_empty()) {
                    break;
                }
            }
            assert!(
                acked.elapsed() < Duration::from_secs(60),
                "B never saw batch {i}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        lags.push(acked.elapsed());
    }
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut took = Vec::new();
    for s in searchers {
        took.extend(s.await.expect("searcher"));
    }
    println!("\n## Follower lag on PostgreSQL (A ingests SciFact, B is searched)\n");
    println!(
        "{} documents, {chunks} chunks in {secs:.0} s on A ({:.0} chunks/s, batches of {batch})\n",
        docs.len(),
        chunks as f64 / secs
    );
    println!("| | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|");
    let (n_lags, n_took) = (lags.len(), took.len());
    println!(
        "| B finds a batch after A acknowledged it ({n_lags} batches) | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
        pct(&mut lags, 50.0),
        pct(&mut lags, 90.0),
        pct(&mut lags, 99.0),
        pct(&mut lags, 100.0)
    );
    println!(
        "| B's hybrid searches meanwhile ({n_took} by {clients} clients) | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
        pct(&mut took, 50.0),
        pct(&mut took, 90.0),
        pct(&mut took, 99.0),
        pct(&mut took, 100.0)
    );
    drop((a, b));
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&admin)
        .await;
}
