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

/// The `rank`th word (0 the most common) of a made-up vocabulary, spelled
/// from syllables.
fn word(mut rank: usize) -> String {
    const SYLLABLES: [&str; 16] = [
        "ka", "lo", "mi", "nu", "pe", "ra", "so", "ti", "va", "ze", "bri", "dun", "fel", "gor",
        "hax", "jin",
    ];
    let mut w = String::new();
    loop {
        w.push_str(SYLLABLES[rank % 16]);
        rank /= 16;
        if rank == 0 {
            return w;
        }
    }
}

/// About `bytes` bytes of text, its words drawn from a 50,000-word
/// vocabulary by Zipf's law (a word's frequency falls as 1/rank, as in
/// prose): postings as long and as varied as a real corpus's.
fn prose(bytes: usize, rng: &mut Rng) -> String {
    let mut s = String::with_capacity(bytes + 16);
    while s.len() < bytes {
        let rank = (50_000f64.powf(rng.unit() as f64) - 1.0) as usize;
        s.push_str(&word(rank));
        s.push(' ');
    }
    s
}

/// Where the startup bench's vectors come from: uniform random unit
/// vectors (the worst case for a graph: no neighbourhoods to find), or
/// real embeddings — each a random one of `base` (SciFact's chunk
/// vectors, read from a store the `scifact` bench ingested) with
/// N(0, 0.02²) noise on every component, as the `vectors` bench makes
/// its copies: points cluster as a real corpus's do.
enum Vectors {
    Random,
    Near(Vec<Vec<f32>>),
}

impl Vectors {
    /// `BENCH_STARTUP_VECTORS=dir`: the SQLite store in `dir` (a `scifact`
    /// bench's `BENCH_STORE`) gives the base vectors.
    async fn from_env() -> Self {
        let Some(dir) = std::env::var_os("BENCH_STARTUP_VECTORS") else {
            return Self::Random;
        };
        let store = Store::open(&Store::sqlite_url(Path::new(&dir)))
            .await
            .expect("BENCH_STARTUP_VECTORS: a store");
        let base: Vec<Vec<f32>> = store
            .index_chunks()
            .await
            .expect("its chunks")
            .into_iter()
            .map(|c| c.embedding)
            .filter(|v| v.len() == DIM)
            .collect();
        store.close().await;
        assert!(
            !base.is_empty(),
            "BENCH_STARTUP_VECTORS: no {DIM}-d vectors there"
        );
        Self::Near(base)
    }

    fn label(&self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Near(_) => "scifact",
        }
    }

    fn next(&self, rng: &mut Rng) -> Vec<f32> {
        match self {
            Self::Random => unit_vector(rng),
            Self::Near(base) => {
                let i = ((rng.unit() as f64 * base.len() as f64) as usize).min(base.len() - 1);
                let mut v: Vec<f32> = base[i].iter().map(|x| x + 0.02 * rng.gauss()).collect();
                let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                v.iter_mut().for_each(|x| *x /= n);
                v
            }
        }
    }
}

/// A document of `chunks` chunks; each chunk's text a sentence, and
/// `prose` bytes of made-up prose after it.
fn document(id: String, chunks: usize, prose_bytes: usize, rng: &mut Rng) -> NewDocument {
    document_with(id, chunks, prose_bytes, &Vectors::Random, rng)
}

fn document_with(
    id: String,
    chunks: usize,
    prose_bytes: usize,
    vectors: &Vectors,
    rng: &mut Rng,
) -> NewDocument {
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
                    "Chunk {i} of {id}: cells divide, proteins fold and membranes carry charge. {}",
                    prose(prose_bytes, rng)
                ),
                tokens: 16,
                embedding: vectors.next(rng),
            })
            .collect(),
    }
}

/// A number field of a process's `/proc/{pid}/status` (`VmRSS:` in kB,
/// `Threads:`), 0 if absent.
pub(crate) fn proc_status(pid: u32, name: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
}

/// `(threads, RSS in MiB)` of a process.
fn status(pid: u32) -> (u64, f64) {
    let rss = proc_status(pid, "VmRSS:") as f64 / 1024.0;
    (proc_status(pid, "Threads:"), rss)
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
            let doc = document(format!("d{i}"), 1, 0, &mut rng);
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
            .map(|i| document(format!("b{i}"), 10, 0, &mut rng))
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
/// document; vectors as `vectors` makes them), kept under `BENCH_STORE`
/// when set.
async fn big_store(
    chunks: usize,
    prose_bytes: usize,
    vectors: &Vectors,
    rng: &mut Rng,
) -> (std::path::PathBuf, Option<tempfile::TempDir>) {
    let folder = match vectors {
        Vectors::Random => format!("startup-{chunks}-{prose_bytes}"),
        Vectors::Near(_) => format!("startup-{chunks}-{prose_bytes}-scifact"),
    };
    let (dir, temp) = match std::env::var("BENCH_STORE") {
        Ok(base) => (Path::new(&base).join(folder), None),
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
            .map(|i| document_with(format!("b{i}"), 10, prose_bytes, vectors, rng))
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

/// Search latency (`mode`) through the HTTP API at `clients` concurrent
/// clients: 200 queries of three words drawn as the chunks' prose is (so
/// common words come up as in real questions), each asked once first
/// (the page cache and the query-vector cache warm), then every client
/// asks all 200, starting at its own offset. `(p50, p99)` in ms, the
/// number of timed searches and how many of them were partial (a stage
/// ran out of its budget).
async fn search_latency(
    http: &reqwest::Client,
    base: &str,
    collection: &str,
    mode: &str,
    clients: usize,
    rng: &mut Rng,
) -> (f64, f64, usize, usize) {
    let queries: Vec<String> = (0..200).map(|_| prose(12, rng).trim().to_owned()).collect();
    let (client, url, name, mode) = (
        http.clone(),
        format!("{base}/v1/search"),
        collection.to_owned(),
        mode.to_owned(),
    );
    let ask = move |q: String| {
        let (http, url, collection, mode) =
            (client.clone(), url.clone(), name.clone(), mode.clone());
        async move {
            let t = Instant::now();
            let r = http
                .post(url)
                .json(&json!({"collection": collection, "query": q, "top_k": 10, "mode": mode}))
                .send()
                .await
                .expect("search");
            assert_eq!(r.status(), 200, "search");
            let body: serde_json::Value = r.json().await.expect("json");
            (t.elapsed(), body["partial"].as_bool() == Some(true))
        }
    };
    for q in &queries {
        ask(q.clone()).await;
    }
    let mut tasks = Vec::new();
    for c in 0..clients {
        let queries = queries.clone();
        let ask = ask.clone();
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::with_capacity(queries.len());
            for k in 0..queries.len() {
                let q = queries[(k + c * 50) % queries.len()].clone();
                times.push(ask(q).await);
            }
            times
        }));
    }
    let mut all = Vec::new();
    let mut partial = 0;
    for t in tasks {
        for (took, cut) in t.await.expect("client") {
            all.push(took);
            partial += usize::from(cut);
        }
    }
    (
        crate::stats::pct(&mut all, 50.0),
        crate::stats::pct(&mut all, 99.0),
        all.len(),
        partial,
    )
}

/// The collection's complete snapshot record under `data/indexes`, if any.
fn snapshot_record(data: &Path) -> Option<std::path::PathBuf> {
    let root = data.join("indexes");
    for coll in std::fs::read_dir(root).ok()?.flatten() {
        for snap in std::fs::read_dir(coll.path()).ok()?.flatten() {
            let record = snap.path().join("snapshot.json");
            if record.is_file() {
                return Some(record);
            }
        }
    }
    None
}

/// Bytes of the files under `dir`.
pub(crate) fn disk_bytes(dir: &Path) -> u64 {
    // A file linked twice (a snapshot's BM25 files and a workspace's) is
    // on disk once.
    fn walk(dir: &Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&e.path(), seen),
                    _ => e
                        .metadata()
                        .ok()
                        .filter(|m| seen.insert((m.dev(), m.ino())))
                        .map_or(0, |m| m.len()),
                })
                .sum()
        })
    }
    walk(dir, &mut std::collections::HashSet::new())
}

/// Builds the collection's indexes in this process and saves them as
/// `ragtime serve` would (the same `CollectionIndex` and
/// `snapshots::save`), with `ef_construction` for the graph.
async fn prebuild_snapshot(data: &Path, ef_construction: usize) {
    let t = Instant::now();
    let store = Store::open(&Store::sqlite_url(data)).await.expect("store");
    let list = store.list_collections(None).await.expect("collections");
    let coll = list.first().expect("one collection");
    let items = ragtime_pipeline::corpus::index_items(
        store.index_chunks_in(coll.id).await.expect("chunks"),
    );
    let read = t.elapsed();
    let params = ragtime_retrieve::DenseParams {
        ef_construction,
        ..ragtime_retrieve::DenseParams::default()
    };
    let idx = ragtime_retrieve::CollectionIndex::new(DIM, params).expect("index");
    let total = items.len();
    let mut items = items.into_iter();
    loop {
        let batch: Vec<_> = items.by_ref().take(50_000).collect();
        if batch.is_empty() {
            break;
        }
        tokio::task::block_in_place(|| idx.add(batch)).expect("add");
        eprintln!(
            "prebuild: {} of {total} chunks indexed, {:.0} s",
            idx.len(),
            t.elapsed().as_secs_f64()
        );
    }
    let built = t.elapsed();
    let position = store.corpus_version().await.expect("version");
    let at = store
        .log_entry(position)
        .await
        .expect("log")
        .map_or(0, |e| e.at_ms);
    let meta = ragtime_pipeline::snapshots::SnapshotMeta {
        format: ragtime_pipeline::snapshots::FORMAT,
        collection_id: coll.id,
        collection: coll.name.clone(),
        log_position: position,
        log_at_ms: at,
        dim: DIM,
        chunks: 0,
        documents: 0,
        saved_at_ms: ragtime_store::now_ms(),
        files: Default::default(),
        crc32: Default::default(),
        store: store.identity().await.expect("identity"),
    };
    let root = data.join("indexes");
    tokio::task::block_in_place(|| ragtime_pipeline::snapshots::save(&root, &idx, meta))
        .expect("save");
    store.close().await;
    eprintln!(
        "prebuilt snapshot (ef_construction {ef_construction}): read {:.0} s, indexed {:.0} s, saved {:.0} s",
        read.as_secs_f64(),
        (built - read).as_secs_f64(),
        (t.elapsed() - built).as_secs_f64()
    );
}

/// `ragtime-bench startup`: one collection of 100k and of 1M chunks
/// (`BENCH_STARTUP_CHUNKS`, comma-separated), each started by `ragtime
/// serve` (loaded at start, the largest collection being preloaded) from
/// the store — the process then saves its snapshot — and again from that
/// snapshot: time to ready, RSS and threads once ready, a search's
/// latency then, the snapshot's save time and size. `BENCH_STARTUP_FROM=
/// snapshot` skips the start from the store: the snapshot is then built
/// in this process (`BENCH_SNAPSHOT_EF`, the graph's ef_construction,
/// default the server's) unless one is there. A chunk's text is a sentence
/// and `BENCH_STARTUP_PROSE` bytes (default 1,000: a real chunk's length)
/// of made-up prose; its vector random, or near a real one
/// (`BENCH_STARTUP_VECTORS`, see [`Vectors`]). Opened from the snapshot,
/// the collection is then searched by 4 concurrent clients (or each count
/// in `BENCH_STARTUP_CLIENTS`) in hybrid mode (or each of
/// `BENCH_STARTUP_MODES`), both comma-separated.
pub async fn startup() {
    let sizes: Vec<usize> = std::env::var("BENCH_STARTUP_CHUNKS")
        .unwrap_or_else(|_| "100000,1000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let from_store = std::env::var("BENCH_STARTUP_FROM").map_or(true, |f| f.contains("store"));
    let prose_bytes = env_usize("BENCH_STARTUP_PROSE", 1000);
    let ef = env_usize(
        "BENCH_SNAPSHOT_EF",
        ragtime_retrieve::DenseParams::default().ef_construction,
    );
    let http = reqwest::Client::new();
    let llm = FakeBackend::start(0, Duration::ZERO).await;
    let mut rng = Rng(0xb16);
    let empty = tempfile::tempdir().expect("tempdir");
    let (p, _) = start("empty", empty.path(), &llm.base_url, 1000, &http).await;
    let (_, base_rss) = status(p.child.id());
    let base_anon = proc_status(p.child.id(), "RssAnon:") as f64 / 1024.0;
    drop(p);
    let vectors = Vectors::from_env().await;
    let modes: Vec<String> = std::env::var("BENCH_STARTUP_MODES")
        .unwrap_or_else(|_| "hybrid".into())
        .split(',')
        .map(|m| m.trim().to_owned())
        .collect();
    // Concurrent clients each mode is timed at (4 by default: twice the
    // cores of the machine the goals were set on).
    let client_counts: Vec<usize> = std::env::var("BENCH_STARTUP_CLIENTS")
        .unwrap_or_else(|_| "4".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for chunks in sizes {
        let (dir, _keep) = big_store(chunks, prose_bytes, &vectors, &mut rng).await;
        let mut starts = Vec::new();
        if from_store {
            let _ = std::fs::remove_dir_all(dir.join("indexes"));
            starts.push("store");
        } else if snapshot_record(&dir).is_none() {
            prebuild_snapshot(&dir, ef).await;
        }
        starts.push("snapshot");
        for from in starts {
            let (p, took) = start("big", &dir, &llm.base_url, 1000, &http).await;
            let (threads, rss) = status(p.child.id());
            let anon = proc_status(p.child.id(), "RssAnon:") as f64 / 1024.0;
            let t = Instant::now();
            let first = search(&http, &p.base, "big").await;
            let searched = t.elapsed();
            assert!(
                first["results"].as_array().is_some_and(|r| !r.is_empty()),
                "{first}"
            );
            rows.push(format!(
                "| {chunks} | {from} | {:.1} s | {rss:.0} MiB | {:.0} MiB | {:.0} MiB | {threads} | {:.1} ms |",
                took.as_secs_f64(),
                (rss - base_rss) * 100_000.0 / chunks as f64,
                (anon - base_anon) * 100_000.0 / chunks as f64,
                searched.as_secs_f64() * 1000.0
            ));
            if from == "snapshot" {
                for mode in &modes {
                    for &clients in &client_counts {
                        let (p50, p99, n, partial) =
                            search_latency(&http, &p.base, "big", mode, clients, &mut rng).await;
                        notes.push(format!(
                            "{chunks} chunks, opened from the snapshot: {mode} search (top 10) at {clients} concurrent clients, warm: p50 {p50:.1} ms, p99 {p99:.1} ms ({n} searches, {partial} partial)"
                        ));
                    }
                }
            }
            if from == "store" {
                // The process saves its snapshot once loaded (it looks
                // every 10 s): wait for it.
                let t = Instant::now();
                while snapshot_record(&dir).is_none() {
                    assert!(t.elapsed() < Duration::from_secs(7200), "no snapshot saved");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                let (_, peak) = status(p.child.id());
                notes.push(format!(
                    "{chunks} chunks: the snapshot was complete {:.1} s after ready (RSS then {peak:.0} MiB)",
                    t.elapsed().as_secs_f64()
                ));
            }
            drop(p);
        }
        notes.push(format!(
            "{chunks} chunks: the snapshot takes {:.0} MiB on disk",
            disk_bytes(&dir.join("indexes")) as f64 / (1 << 20) as f64
        ));
    }
    println!("\n## Start-up with one large collection\n");
    println!(
        "| chunks | loaded from | ready in | RSS | RSS per 100k chunks (over the empty process) | RssAnon per 100k chunks (over the empty process) | threads | first search |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!("{r}");
    }
    println!(
        "\n(the empty process: {base_rss:.0} MiB, RssAnon {base_anon:.0} MiB; chunks of ~{} bytes; {} vectors)",
        prose_bytes + 90,
        vectors.label()
    );
    for n in notes {
        println!("- {n}");
    }
}

/// `ragtime-bench metadata`: what documents' metadata cost a collection's
/// heap. `BENCH_DOCS` documents (default 100,000) of one short chunk each,
/// whose metadata are what a company's documents carry: a source of 20, a
/// language of 3, a team of 12, two tags of 30 (900 pairs), a year of 25,
/// and a URL and an update time (a second apart) of their own. Each of
/// three is built in a process of its own (this program again), which
/// says how many more bytes its heap holds once built (counted by the
/// allocator: exact, where the process's `RssAnon` moved by tens of MiB
/// from one run to the next with the indexes' freed buffers): a collection of those
/// chunks with empty metadata, the same chunks with their metadata, and
/// the metadata alone as one JSON tree per document with a hash of each
/// (how a collection held them before it kept them by field).
pub fn metadata() {
    let n = env_usize("BENCH_DOCS", 100_000);
    if let Ok(part) = std::env::var("BENCH_METADATA_PART") {
        let grew = metadata_part(&part, n);
        println!("grew {grew}");
        return;
    }
    let run = |part: &str| -> f64 {
        let out = std::process::Command::new(std::env::current_exe().expect("exe"))
            .arg("metadata")
            .env("BENCH_METADATA_PART", part)
            .output()
            .expect("run a part");
        assert!(
            out.status.success(),
            "{part}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix("grew "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{part}: {text}"))
    };
    let (plain, field, trees) = (run("plain"), run("field"), run("trees"));
    let per_doc = |mib: f64| mib * (1 << 20) as f64 / n as f64;
    println!("\n## Documents' metadata ({n} documents)\n");
    println!("| heap held | MiB | per document |\n|---|---:|---:|");
    for (what, mib) in [
        ("a collection, empty metadata", plain),
        ("the same chunks with their metadata, kept by field", field),
        ("so their metadata, kept by field", field - plain),
        ("the metadata as one JSON tree per document", trees),
    ] {
        println!("| {what} | {mib:.1} | {:.0} B |", per_doc(mib));
    }
}

/// One part of [`metadata`]: how much more heap (MiB) this process holds.
fn metadata_part(part: &str, n: usize) -> f64 {
    use ragtime_core::Chunk;
    use ragtime_retrieve::{CollectionIndex, DenseParams};
    use std::sync::Arc;
    let dim = 8;
    let meta = |i: usize| {
        let lang = ["en", "de", "fr"][i % 3];
        json!({
            "source": format!("source-{}", i % 20),
            "lang": lang,
            "team": format!("team-{}", i % 12),
            "tags": [format!("tag-{}", i % 30), format!("tag-{}", (i / 30) % 30)],
            "year": 2000 + i % 25,
            "url": format!("https://intranet.example.com/docs/{i:08}/index.html"),
            // A second apart from one document to the next, from 2026-01-01.
            "updated": format!(
                "2026-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                1 + i / (28 * 86400),
                1 + (i / 86400) % 28,
                (i / 3600) % 24,
                (i / 60) % 60,
                i % 60
            ),
        })
    };
    let held = || crate::heap::held() as f64 / (1 << 20) as f64;
    let mut rng = Rng(0x3e7a);
    let before = held();
    if part == "trees" {
        let mut by_hash = std::collections::HashMap::new();
        let trees: Vec<(Arc<serde_json::Value>, u32)> = (0..n)
            .map(|i| {
                use std::hash::{Hash, Hasher};
                let v = meta(i);
                let mut h = std::collections::hash_map::DefaultHasher::new();
                v.to_string().hash(&mut h);
                by_hash.insert(h.finish(), i as u32);
                (Arc::new(v), 1)
            })
            .collect();
        let grew = held() - before;
        assert_eq!(trees.len(), n);
        return grew;
    }
    let with = part == "field";
    let idx = CollectionIndex::new(dim, DenseParams::default()).expect("index");
    for start in (0..n).step_by(1000) {
        let batch = (start..(start + 1000).min(n))
            .map(|i| {
                let chunk = Chunk {
                    chunk_id: i as i64 + 1,
                    document_id: i as i64 + 1,
                    external_id: format!("d{i}"),
                    position: 0,
                    title: String::new(),
                    section: String::new(),
                    metadata: Arc::new(if with { meta(i) } else { json!({}) }),
                    text: prose(8, &mut rng),
                };
                let v: Vec<f32> = (0..dim).map(|_| rng.gauss()).collect();
                (chunk, v)
            })
            .collect();
        idx.add(batch).expect("add");
    }
    let grew = held() - before;
    assert_eq!(idx.len(), n);
    grew
}
