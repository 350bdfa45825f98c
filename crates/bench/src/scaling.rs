//! `ragtime-bench scaling`: what collections cost a `ragtime serve`
//! process. A data folder with 10,000 collections of one document each (and
//! their vectors: random unit vectors, written straight to the store) is
//! started twice — loading the default 1,000 largest collections at start,
//! and loading every one — and timed to ready; then, on the first process,
//! threads and RSS before and after 1,000 new empty collections, and after
//! 1,000 one-document collections load at their first search. A second data
//! folder holds one collection of 10,000 chunks, loaded at its first search:
//! load time and RSS per 10k chunks.

use crate::env_usize;
use crate::load::FakeBackend;
use crate::stats::Rng;
use crate::tracing_cost::{Proc, run_ragtime};
use ragtime_store::{NewChunk, NewDocument, Store};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

const DIM: usize = 384;

fn unit_vector(rng: &mut Rng) -> Vec<f32> {
    let v: Vec<f32> = (0..DIM).map(|_| rng.gauss()).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
    v.into_iter().map(|x| x / n).collect()
}

fn document(id: String, chunks: usize, rng: &mut Rng) -> NewDocument {
    NewDocument {
        external_id: id.clone(),
        title: id.clone(),
        metadata: "{}".into(),
        content_hash: format!("bench-{id}"),
        chunks: (0..chunks)
            .map(|i| NewChunk {
                position: i as i32,
                section: String::new(),
                text: format!(
                    "Chunk {i} of {id}: cells divide, proteins fold and membranes carry charge."
                ),
                tokens: 16,
                embedding: unit_vector(rng),
            })
            .collect(),
    }
}

/// `(threads, RSS in MiB)` of a process.
fn status(pid: u32) -> (u64, f64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:") as f64 / 1024.0)
}

async fn start(
    name: &'static str,
    data: &Path,
    llm: &str,
    preload: usize,
    http: &reqwest::Client,
) -> (Proc, Duration) {
    let env = [("RAGTIME__LIMITS__PRELOAD_COLLECTIONS", preload.to_string())];
    run_ragtime(name, data, llm, &env, http).await
}

async fn search(http: &reqwest::Client, base: &str, collection: &str) -> serde_json::Value {
    let r = http
        .post(format!("{base}/v1/search"))
        .json(&json!({"collection": collection, "query": "proteins fold", "top_k": 5}))
        .send()
        .await
        .expect("search");
    assert_eq!(r.status(), 200, "search {collection}");
    r.json().await.expect("json")
}

pub async fn scaling() {
    let n = env_usize("BENCH_COLLECTIONS", 10_000);
    let big = env_usize("BENCH_BIG_CHUNKS", 10_000);
    let http = reqwest::Client::new();
    let llm = FakeBackend::start(0, Duration::ZERO).await;
    let mut rng = Rng(0x5eed);

    let many = tempfile::tempdir().expect("tempdir");
    let t = Instant::now();
    {
        let store = Store::open(&Store::sqlite_url(many.path()))
            .await
            .expect("store");
        for i in 0..n {
            let id = store
                .ensure_collection(&format!("c{i:05}"))
                .await
                .expect("collection");
            let doc = document(format!("d{i}"), 1, &mut rng);
            store.upsert_document(id, &doc).await.expect("document");
        }
        store.close().await;
    }
    println!(
        "\n## Collections ({n} of one document each; written in {:.0} s)\n",
        t.elapsed().as_secs_f64()
    );
    println!("| start | ready in | threads | RSS |\n|---|---|---|---|");
    let (all, took) = start("all", many.path(), &llm.base_url, usize::MAX / 2, &http).await;
    let (th, rss) = status(all.child.id());
    println!(
        "| every collection loaded | {:.1} s | {th} | {rss:.0} MiB |",
        took.as_secs_f64()
    );
    drop(all);
    let (p, took) = start("default", many.path(), &llm.base_url, 1000, &http).await;
    let pid = p.child.id();
    let (th0, rss0) = status(pid);
    println!(
        "| 1,000 largest loaded (default) | {:.1} s | {th0} | {rss0:.0} MiB |",
        took.as_secs_f64()
    );

    let k = 1000;
    for i in 0..k {
        let r = http
            .post(format!("{}/v1/collections", p.base))
            .json(&json!({"name": format!("empty{i}")}))
            .send()
            .await
            .expect("create");
        assert_eq!(r.status(), 201);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (th1, rss1) = status(pid);
    println!("\n| what | threads | RSS |\n|---|---|---|");
    println!(
        "| {k} new empty collections | {:+} | {:+.1} MiB ({:.1} KiB each) |",
        th1 as i64 - th0 as i64,
        rss1 - rss0,
        (rss1 - rss0) * 1024.0 / k as f64
    );
    // Collections past the preloaded 1,000 load at their first search.
    let t = Instant::now();
    for i in (n - k)..n {
        search(&http, &p.base, &format!("c{i:05}")).await;
    }
    let per = t.elapsed() / k as u32;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (th2, rss2) = status(pid);
    println!(
        "| {k} one-document collections loaded at their first search ({:.1} ms each, search included) | {:+} | {:+.1} MiB ({:.1} KiB each) |",
        per.as_secs_f64() * 1000.0,
        th2 as i64 - th1 as i64,
        rss2 - rss1,
        (rss2 - rss1) * 1024.0 / k as f64
    );
    drop(p);

    let one = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(&Store::sqlite_url(one.path()))
            .await
            .expect("store");
        let id = store.ensure_collection("big").await.expect("collection");
        let docs: Vec<NewDocument> = (0..big / 10)
            .map(|i| document(format!("b{i}"), 10, &mut rng))
            .collect();
        for batch in docs.chunks(100) {
            store
                .upsert_documents(id, batch, None, None)
                .await
                .expect("documents");
        }
        store.close().await;
    }
    let (p, _) = start("big", one.path(), &llm.base_url, 0, &http).await;
    let (th0, rss0) = status(p.child.id());
    let t = Instant::now();
    let first = search(&http, &p.base, "big").await;
    let load = t.elapsed();
    let (th1, rss1) = status(p.child.id());
    println!(
        "| one collection of {big} chunks, loaded at its first search ({:.2} s; budget report index_load_ms {}) | {:+} | {:+.0} MiB |",
        load.as_secs_f64(),
        first["budget"]["index_load_ms"],
        th1 as i64 - th0 as i64,
        rss1 - rss0
    );
}

/// A data folder holding one collection `big` of `chunks` chunks (ten per
/// document; random unit vectors), kept under `BENCH_STORE` when set.
async fn big_store(
    chunks: usize,
    rng: &mut Rng,
) -> (std::path::PathBuf, Option<tempfile::TempDir>) {
    let (dir, temp) = match std::env::var("BENCH_STORE") {
        Ok(base) => (Path::new(&base).join(format!("startup-{chunks}")), None),
        Err(_) => {
            let t = tempfile::tempdir().expect("tempdir");
            (t.path().to_owned(), Some(t))
        }
    };
    if dir.join("complete").is_file() {
        return (dir, temp);
    }
    std::fs::create_dir_all(&dir).expect("store folder");
    let t = Instant::now();
    let store = Store::open(&Store::sqlite_url(&dir)).await.expect("store");
    let id = store.ensure_collection("big").await.expect("collection");
    for start in (0..chunks / 10).step_by(500) {
        let docs: Vec<NewDocument> = (start..(start + 500).min(chunks / 10))
            .map(|i| document(format!("b{i}"), 10, rng))
            .collect();
        store
            .upsert_documents(id, &docs, None, None)
            .await
            .expect("documents");
    }
    store.close().await;
    std::fs::write(dir.join("complete"), b"").expect("mark");
    eprintln!(
        "wrote {chunks} chunks in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    (dir, temp)
}

/// `ragtime-bench startup`: one collection of 100k and of 1M chunks
/// (`BENCH_STARTUP_CHUNKS`, comma-separated), each started by `ragtime
/// serve` (loaded at start, the largest collection being preloaded): time
/// to ready, RSS and threads once ready, and a search's latency then.
pub async fn startup() {
    let sizes: Vec<usize> = std::env::var("BENCH_STARTUP_CHUNKS")
        .unwrap_or_else(|_| "100000,1000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let http = reqwest::Client::new();
    let llm = FakeBackend::start(0, Duration::ZERO).await;
    let mut rng = Rng(0xb16);
    println!("\n## Start-up with one large collection\n");
    println!(
        "| chunks | ready in | RSS | RSS per 100k chunks (over the empty process) | threads | first search |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let empty = tempfile::tempdir().expect("tempdir");
    let (p, _) = start("empty", empty.path(), &llm.base_url, 1000, &http).await;
    let (_, base_rss) = status(p.child.id());
    drop(p);
    for chunks in sizes {
        let (dir, _keep) = big_store(chunks, &mut rng).await;
        let (p, took) = start("big", &dir, &llm.base_url, 1000, &http).await;
        let (threads, rss) = status(p.child.id());
        let t = Instant::now();
        let first = search(&http, &p.base, "big").await;
        let searched = t.elapsed();
        assert!(
            first["results"].as_array().is_some_and(|r| !r.is_empty()),
            "{first}"
        );
        println!(
            "| {chunks} | {:.1} s | {rss:.0} MiB | {:.0} MiB | {threads} | {:.1} ms |",
            took.as_secs_f64(),
            (rss - base_rss) * 100_000.0 / chunks as f64,
            searched.as_secs_f64() * 1000.0
        );
        drop(p);
    }
    println!("\n(the empty process: {base_rss:.0} MiB)");
}
