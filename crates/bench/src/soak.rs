//! `ragtime-bench soak`: `SOAK_MINUTES` (60) of mixed traffic against one
//! `ragtime serve` (the release binary beside this one; the LLM a fake
//! GPU server: first token after 150 ms, 20 more 10 ms apart), and what
//! the process and its data hold meanwhile.
//!
//! `SOAK_ENGINE=sqlite` (the default: SQLite, memory engine) or
//! `postgres` (a PostgreSQL 18 with pgvector of its own from
//! `RAGTIME_TEST_PGVECTOR_BIN`, `retrieval.engine = "postgres"`).
//!
//! The traffic, all at once:
//! - chat, Poisson arrivals at `SOAK_LOAD` (1.5) × the full answers a
//!   second that 8 closed-loop clients got in the first minute;
//! - 2 clients searching with metadata filters (`$in`, `$gte`, `$ne`),
//!   200 ms apart;
//! - 1 client adding, replacing and deleting documents of the `soak`
//!   `default` collection (`SOAK_DOCS`, 1,000 SciFact abstracts,
//!   ingested first; the chat asks it);
//! - each minute a collection made, searched and dropped;
//! - each minute hostile clients: 8 that send an ingest's headers and
//!   stall (408 expected), a filter of 200,000 `$in` values (422), and
//!   every other minute a gzip bomb expanding to 1 GiB (413).
//!
//! Each minute prints RSS, the data folder's bytes (the database's too on
//! PostgreSQL), each route's answers and p50/p99, 503s and other 5xx.
//! At the end: RSS growth a minute after `SOAK_WARMUP` (5) minutes, disk
//! at most against the warm-up's end, p99 of the last 10 minutes against
//! the first 10 after warm-up, and a check of every acknowledged write
//! (each document's last acknowledged revision is what the service holds).
//! On PostgreSQL the server is restarted (`pg_ctl -m immediate`) at
//! `SOAK_PG_RESTART_AT` minutes (half-way): how long until searches and
//! ingests succeed again.

use crate::env_usize;
use crate::load::{FakeBackend, ask};
use crate::scaling::{disk_bytes, proc_status};
use crate::stats::{Rng, pct};
use crate::tracing_cost::run_ragtime;
use ragtime_testkit::scifact::load_scifact;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// One answer: its route, status (0: no answer), time and when it ended.
struct Rec {
    route: &'static str,
    status: u16,
    took: Duration,
    at: Instant,
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Rec>>>);

impl Log {
    fn push(&self, route: &'static str, status: u16, took: Duration) {
        let rec = Rec {
            route,
            status,
            took,
            at: Instant::now(),
        };
        self.0.lock().expect("log").push(rec);
    }
    fn drain(&self) -> Vec<Rec> {
        std::mem::take(&mut *self.0.lock().expect("log"))
    }
}

/// What the writer had acknowledged for each document id (its revision,
/// or `None` once a delete was acknowledged), and the state a later write
/// whose answer was neither a success nor a refusal may have left.
type Ledger = Arc<Mutex<HashMap<usize, (Option<u64>, Option<Option<u64>>)>>>;

const ROUTES: [&str; 4] = ["chat", "search", "ingest", "collection"];

async fn status_of(r: reqwest::Result<reqwest::Response>) -> u16 {
    match r {
        Ok(r) => {
            let s = r.status().as_u16();
            let _ = r.bytes().await;
            s
        }
        Err(_) => 0,
    }
}

fn doc(i: usize, rev: u64, corpus: &[(String, String, String)]) -> Value {
    let (_, title, text) = &corpus[(i + rev as usize * 7919) % corpus.len()];
    json!({"id": format!("d{i}"), "title": title, "text": text,
        "metadata": {"topic": (i % 8) as i64, "year": 2000 + (i % 20) as i64, "rev": rev}})
}

pub async fn soak() {
    let minutes = env_usize("SOAK_MINUTES", 60);
    let warmup = env_usize("SOAK_WARMUP", 5).min(minutes.saturating_sub(1));
    let docs = env_usize("SOAK_DOCS", 1000);
    let load = std::env::var("SOAK_LOAD")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(1.5);
    let engine = std::env::var("SOAK_ENGINE").unwrap_or_else(|_| "sqlite".into());
    let restart_at = env_usize("SOAK_PG_RESTART_AT", minutes / 2);
    let calibrate_s = env_usize("SOAK_CALIBRATE_S", 60) as u64;

    let data = load_scifact();
    let corpus = Arc::new(data.corpus.clone());
    let questions: Arc<Vec<String>> = Arc::new(data.queries.iter().map(|q| q.1.clone()).collect());
    let http = reqwest::Client::new();
    let llm = FakeBackend::start(0, Duration::ZERO).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = (engine == "postgres").then(ragtime_testkit::PgServer::start);
    let mut env = Vec::new();
    if let Some(pg) = &pg {
        env.push(("RAGTIME__DATABASE_URL", pg.url("postgres")));
        env.push(("RAGTIME__RETRIEVAL__ENGINE", "postgres".to_owned()));
    }
    let (p, ready) = run_ragtime("soak", dir.path(), &llm.base_url, &env, &http).await;
    let base = p.base.clone();
    let pid = p.child.id();
    println!(
        "\n## soak: {engine}, {minutes} min, {docs} documents, ready in {:.1} s\n",
        ready.as_secs_f64()
    );

    // The collection's documents, acknowledged before the clock starts.
    let ledger: Ledger = Arc::default();
    for chunk in (0..docs).collect::<Vec<_>>().chunks(100) {
        let body = json!({"collection": "default",
            "documents": chunk.iter().map(|&i| doc(i, 0, &corpus)).collect::<Vec<_>>()});
        let r = http
            .post(format!("{base}/v1/documents"))
            .json(&body)
            .send()
            .await;
        assert_eq!(status_of(r).await, 200, "the first ingest failed");
        ledger
            .lock()
            .expect("ledger")
            .extend(chunk.iter().map(|&i| (i, (Some(0), None))));
    }

    // Chat capacity: answers a second of 8 closed-loop clients. A partial
    // answer is an answer (the service degraded on purpose); the share and
    // reasons are printed so a calibration on degraded answers shows.
    let t = Instant::now();
    let reasons: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let calibrate: Vec<_> = (0..8)
        .map(|c| {
            let (http, base, qs, reasons) = (
                http.clone(),
                base.clone(),
                questions.clone(),
                reasons.clone(),
            );
            tokio::spawn(async move {
                let mut i = c;
                while t.elapsed() < Duration::from_secs(calibrate_s) {
                    let a = ask(&http, &base, &qs[(i * 37) % qs.len()]).await;
                    let key = match (a.status, a.reason) {
                        (200, None) => "full".to_owned(),
                        (200, Some(r)) => format!("partial {r:?}"),
                        (s, _) => format!("status {s}"),
                    };
                    *reasons.lock().expect("reasons").entry(key).or_default() += 1;
                    i += 8;
                }
            })
        })
        .collect();
    for c in calibrate {
        let _ = c.await;
    }
    let reasons = std::mem::take(&mut *reasons.lock().expect("reasons"));
    let answered: usize = reasons
        .iter()
        .filter(|(k, _)| !k.starts_with("status"))
        .map(|(_, n)| n)
        .sum();
    let capacity = answered as f64 / t.elapsed().as_secs_f64();
    let rate = (capacity * load).max(0.5);
    println!(
        "chat capacity {capacity:.2} answers/s (8 clients, {calibrate_s} s; {reasons:?}); offered {rate:.2}/s\n"
    );

    let log = Log::default();
    let stop = Arc::new(AtomicBool::new(false));
    let hostile: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let mut tasks = Vec::new();

    // Chat: open loop, at most 512 waiting in this process.
    {
        let (http, base, qs, log, stop) = (
            http.clone(),
            base.clone(),
            questions.clone(),
            log.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x5eed_50a6);
            let open = Arc::new(AtomicUsize::new(0));
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs_f64(rng.exponential(rate))).await;
                if open.load(Ordering::Relaxed) >= 512 {
                    log.push("chat", 0, Duration::ZERO);
                    continue;
                }
                i += 1;
                let (http, base, q, log, open) = (
                    http.clone(),
                    base.clone(),
                    qs[(i * 101) % qs.len()].clone(),
                    log.clone(),
                    open.clone(),
                );
                open.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let a = ask(&http, &base, &q).await;
                    // A degraded answer is a 200 that says so: counted as
                    // answered, its time kept.
                    log.push("chat", a.status, a.total);
                    open.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }));
    }

    // Filtered searches.
    for c in 0..2u64 {
        let (http, base, qs, log, stop) = (
            http.clone(),
            base.clone(),
            questions.clone(),
            log.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0xf117e5 + c);
            let mut i = c as usize;
            while !stop.load(Ordering::Relaxed) {
                i += 2;
                let filter = match i % 3 {
                    0 => json!({"topic": {"$in": [1, 3, 5]}}),
                    1 => json!({"year": {"$gte": 2010}}),
                    _ => json!({"topic": {"$ne": (rng.unit() * 8.0) as i64}}),
                };
                let body = json!({"collection": "default", "query": qs[(i * 13) % qs.len()],
                    "top_k": 10, "filter": filter});
                let t = Instant::now();
                let s = status_of(
                    http.post(format!("{base}/v1/search"))
                        .json(&body)
                        .send()
                        .await,
                )
                .await;
                log.push("search", s, t.elapsed());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }

    // The writer: add, replace, delete; each acknowledged state kept.
    {
        let (http, base, corpus, log, stop, ledger) = (
            http.clone(),
            base.clone(),
            corpus.clone(),
            log.clone(),
            stop.clone(),
            ledger.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x1e56e7);
            let mut rev = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let i = ((rng.unit() * docs as f32) as usize).min(docs - 1);
                let now = ledger.lock().expect("ledger").get(&i).and_then(|e| e.0);
                rev += 1;
                let t = Instant::now();
                let (s, then) = if now.is_some() && rng.unit() < 0.3 {
                    let url = format!("{base}/v1/documents/d{i}?collection=default");
                    (status_of(http.delete(url).send().await).await, None)
                } else {
                    let body =
                        json!({"collection": "default", "documents": [doc(i, rev, &corpus)]});
                    let url = format!("{base}/v1/documents");
                    (
                        status_of(http.post(url).json(&body).send().await).await,
                        Some(rev),
                    )
                };
                log.push("ingest", s, t.elapsed());
                {
                    let mut ledger = ledger.lock().expect("ledger");
                    let entry = ledger.entry(i).or_default();
                    match s {
                        200 => *entry = (then, None),
                        // Refused: nothing was written.
                        400..=499 | 503 => {}
                        _ => entry.1 = Some(then),
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }));
    }

    // Each minute: a collection made, searched and dropped.
    {
        let (http, base, corpus, log, stop) = (
            http.clone(),
            base.clone(),
            corpus.clone(),
            log.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let name = format!("tmp{k}");
                let body = json!({"collection": name,
                    "documents": (0..20).map(|i| doc(k * 20 + i, 0, &corpus)).collect::<Vec<_>>()});
                let t = Instant::now();
                let mut s = status_of(
                    http.post(format!("{base}/v1/documents"))
                        .json(&body)
                        .send()
                        .await,
                )
                .await;
                if s == 200 {
                    let q = json!({"collection": name, "query": "cells", "top_k": 5});
                    s = status_of(http.post(format!("{base}/v1/search")).json(&q).send().await)
                        .await;
                }
                let d = status_of(
                    http.delete(format!("{base}/v1/collections/{name}"))
                        .send()
                        .await,
                )
                .await;
                log.push("collection", if s == 200 { d } else { s }, t.elapsed());
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }));
    }

    // Hostile clients, each minute.
    {
        let (http, base, stop, hostile) =
            (http.clone(), base.clone(), stop.clone(), hostile.clone());
        let addr = base.trim_start_matches("http://").to_owned();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(b"{\"_id\": \"bomb\", \"text\": \"")
            .expect("gzip");
        let zeros = vec![b'a'; 1 << 20];
        for _ in 0..1024 {
            gz.write_all(&zeros).expect("gzip");
        }
        let bomb = gz.finish().expect("gzip");
        tasks.push(tokio::spawn(async move {
            let mut minute = 0usize;
            let note = |what: String| {
                *hostile.lock().expect("hostile").entry(what).or_default() += 1;
            };
            while !stop.load(Ordering::Relaxed) {
                minute += 1;
                let stalls: Vec<_> = (0..8)
                    .map(|_| {
                        let addr = addr.clone();
                        tokio::spawn(async move { stalled_ingest(&addr).await })
                    })
                    .collect();
                let values: Vec<i64> = (0..200_000).collect();
                let q = json!({"collection": "default", "query": "cells", "filter": {"topic": {"$in": values}}});
                let s = status_of(http.post(format!("{base}/v1/search")).json(&q).send().await).await;
                note(format!("huge $in filter: {s}"));
                if minute % 2 == 1 {
                    let form = reqwest::multipart::Form::new().part(
                        "file",
                        reqwest::multipart::Part::bytes(bomb.clone()).file_name("bomb.jsonl.gz"),
                    );
                    let s = status_of(http.post(format!("{base}/v1/documents")).multipart(form).send().await).await;
                    note(format!("gzip bomb (1 GiB): {s}"));
                }
                for s in stalls {
                    note(format!("stalled ingest body: {}", s.await.unwrap_or_else(|e| e.to_string())));
                }
                tokio::time::sleep(Duration::from_secs(20)).await;
            }
        }));
    }

    // The clock: one row a minute; PostgreSQL restarted once.
    println!(
        "| min | RSS MiB | data MiB | chat n · p50 · p99 ms | search n · p50 · p99 | ingest n · p50 · p99 | collections n | 503 | other 5xx | no answer |"
    );
    println!("|---:|---:|---:|---|---|---|---:|---:|---:|---:|");
    let pg_bytes = |pg: &Option<ragtime_testkit::PgServer>| {
        let pg = pg.as_ref().map(|pg| pg.url("postgres"));
        async move {
            let Some(url) = pg else { return 0 };
            let Ok(pool) = sqlx::PgPool::connect(&url).await else {
                return 0;
            };
            let n: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
                .fetch_one(&pool)
                .await
                .unwrap_or(0);
            pool.close().await;
            n as u64
        }
    };
    let mut rss = Vec::new();
    let mut disk = Vec::new();
    let mut p99s: Vec<BTreeMap<&'static str, f64>> = Vec::new();
    let mut errors = 0usize;
    let mut statuses: BTreeMap<(&'static str, u16), usize> = BTreeMap::new();
    let mut restart: Option<(Instant, Option<Duration>, Option<Duration>)> = None;
    let started = Instant::now();
    for minute in 1..=minutes {
        let end = started + Duration::from_secs(60 * minute as u64);
        if let (Some(pg), true) = (&pg, minute == restart_at + 1) {
            pg.stop();
            pg.start_again();
            restart = Some((Instant::now(), None, None));
        }
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Some((at, search, ingest)) = &mut restart
                && (search.is_none() || ingest.is_none())
            {
                for r in log.0.lock().expect("log").iter() {
                    if r.status != 200 || r.at < *at {
                        continue;
                    }
                    match r.route {
                        "search" if search.is_none() => *search = Some(at.elapsed()),
                        "ingest" if ingest.is_none() => *ingest = Some(at.elapsed()),
                        _ => {}
                    }
                }
            }
        }
        let recs = log.drain();
        for r in &recs {
            *statuses.entry((r.route, r.status)).or_default() += 1;
        }
        let mem = proc_status(pid, "VmRSS:") as f64 / 1024.0;
        let bytes = (disk_bytes(dir.path()) + pg_bytes(&pg).await) as f64 / 1048576.0;
        rss.push(mem);
        disk.push(bytes);
        let mut row = BTreeMap::new();
        let mut cells = Vec::new();
        for route in ROUTES {
            let of: Vec<&Rec> = recs.iter().filter(|r| r.route == route).collect();
            let mut ok: Vec<Duration> = of
                .iter()
                .filter(|r| r.status == 200)
                .map(|r| r.took)
                .collect();
            let n = of.len();
            let (p50, p99) = (pct(&mut ok, 50.0), pct(&mut ok, 99.0));
            row.insert(route, p99);
            cells.push(if route == "collection" {
                n.to_string()
            } else {
                format!("{n} · {p50:.0} · {p99:.0}")
            });
        }
        p99s.push(row);
        let busy = recs.iter().filter(|r| r.status == 503).count();
        let other = recs
            .iter()
            .filter(|r| r.status >= 500 && r.status != 503)
            .count();
        let none = recs.iter().filter(|r| r.status == 0).count();
        errors += other;
        println!(
            "| {minute} | {mem:.0} | {bytes:.1} | {} | {busy} | {other} | {none} |",
            cells.join(" | ")
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    // Let the chat answers still streaming end.
    tokio::time::sleep(Duration::from_secs(5)).await;

    // RSS growth: the least-squares slope after warm-up.
    let after: Vec<(f64, f64)> = rss
        .iter()
        .enumerate()
        .skip(warmup)
        .map(|(i, &m)| (i as f64, m))
        .collect();
    let n = after.len() as f64;
    let (mx, my) = (
        after.iter().map(|a| a.0).sum::<f64>() / n,
        after.iter().map(|a| a.1).sum::<f64>() / n,
    );
    let slope = after.iter().map(|a| (a.0 - mx) * (a.1 - my)).sum::<f64>()
        / after
            .iter()
            .map(|a| (a.0 - mx).powi(2))
            .sum::<f64>()
            .max(1e-9);
    let base_disk = disk[warmup.saturating_sub(1)];
    let most_disk = disk.iter().skip(warmup).cloned().fold(0.0, f64::max);
    println!(
        "\n- RSS after warm-up: {:.0} → {:.0} MiB, {slope:+.2} MiB a minute (least squares)",
        rss[warmup],
        rss[rss.len() - 1]
    );
    println!(
        "- disk: {base_disk:.1} MiB at the warm-up's end, at most {most_disk:.1} MiB after ({:.2}×)",
        most_disk / base_disk.max(1e-9)
    );
    let window = 10.min((minutes - warmup) / 2).max(1);
    for route in ["chat", "search", "ingest"] {
        let of = |rows: &[BTreeMap<&str, f64>]| rows.iter().map(|r| r[route]).fold(0.0, f64::max);
        let first = of(&p99s[warmup..warmup + window]);
        let last = of(&p99s[p99s.len() - window..]);
        println!(
            "- {route} p99 (worst minute): first {window} min after warm-up {first:.0} ms, last {window} min {last:.0} ms ({:+.0} %)",
            (last / first.max(1e-9) - 1.0) * 100.0
        );
    }
    println!("- 5xx other than 503: {errors}");
    let answers: Vec<String> = statuses
        .iter()
        .map(|((route, status), n)| format!("{route} {status}: {n}"))
        .collect();
    println!("- answers: {}", answers.join(", "));
    let hostile = hostile.lock().expect("hostile").clone();
    for (what, n) in hostile {
        println!("- hostile: {n} × {what}");
    }
    if let Some((_, search, ingest)) = restart {
        let s =
            |d: Option<Duration>| d.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64()));
        println!(
            "- PostgreSQL restarted at minute {restart_at}: searches answered again after {}, ingests after {}",
            s(search),
            s(ingest)
        );
    }

    // Every acknowledged write is what the service holds.
    let ledger = ledger.lock().expect("ledger").clone();
    let (mut held, mut lost) = (0usize, Vec::new());
    for (i, (want, maybe)) in &ledger {
        let r = http
            .get(format!("{base}/v1/documents/d{i}?collection=default"))
            .send()
            .await;
        let got = match r {
            Ok(r) if r.status() == 200 => r
                .json::<Value>()
                .await
                .ok()
                .and_then(|v| v["metadata"]["rev"].as_u64()),
            _ => None,
        };
        if got == *want || maybe.is_some_and(|m| m == got) {
            held += 1;
        } else {
            lost.push(format!("d{i}: acknowledged {want:?}, holds {got:?}"));
        }
    }
    println!(
        "- acknowledged writes: {held} of {} documents hold their last acknowledged state; {} do not {:?}",
        ledger.len(),
        lost.len(),
        lost.iter().take(5).collect::<Vec<_>>()
    );
    drop(p);
}

/// The headers of an ingest, ten bytes of its body, then nothing: the
/// status the service answers with, or how the connection ended.
async fn stalled_ingest(addr: &str) -> String {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return "no connection".into();
    };
    let head = format!(
        "POST /v1/documents HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{\"collect"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return "refused".into();
    }
    let mut buf = vec![0u8; 4096];
    use tokio::io::AsyncReadExt;
    match tokio::time::timeout(Duration::from_secs(120), s.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => String::from_utf8_lossy(&buf[..n])
            .split_whitespace()
            .nth(1)
            .unwrap_or("?")
            .to_owned(),
        Ok(_) => "closed".into(),
        Err(_) => "no answer in 120 s".into(),
    }
}
