//! Load on the chat path, against ragtime served in this process on
//! loopback, by HTTP as clients send it (streamed chat, OpenAI protocol):
//!
//! - `ragtime-bench load`: the embedded defaults (local llama-server with
//!   its slots, `BENCH_DOCS` SciFact documents, semantic cache off). It
//!   first measures capacity — full answers per second with as many
//!   closed-loop clients as the backend has slots (the knee: more clients
//!   only queue) — then runs open-loop Poisson arrivals at each factor of
//!   it (`BENCH_FACTORS`, default 0.5,1,2,4; `BENCH_SECONDS` each) and
//!   prints, per level, goodput, partial answers by reason, 503s, latency
//!   percentiles and how far answers ran past their budgets.
//! - `ragtime-bench hedge`: two fault-injecting backends, one stalling its
//!   first token by 3 s on every tenth request, with hedging off and on.
//! - `ragtime-bench prefix`: time to first token on a workload of
//!   overlapping questions (each SciFact claim asked three ways, so the
//!   sources mostly repeat and only the question differs), with the
//!   backend's prompt prefix cache (`llm.prompt_cache`) on and off.
//! - `ragtime-bench kill`: two local llama-servers; one is killed mid-run
//!   (SIGKILL; its supervisor brings it back): what users saw, and when
//!   its breaker opened and closed.
//!
//! Open loop, not closed: arrivals do not wait for answers, so a slow
//! server meets the same load as a fast one (a closed loop throttles
//! itself and hides queueing).

use crate::data::SciFact;
use crate::env_usize;
use crate::stats::{Rng, pct};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use ragtime_core::{PartialReason, Stage};
use ragtime_gateway::config::Secret;
use ragtime_gateway::{Application, Config};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const ADMIN: &str = "admin-key-for-the-load-bench";

/// ragtime serving on loopback.
pub struct Server {
    pub base: String,
    http: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _data: tempfile::TempDir,
}

impl Server {
    pub async fn start(tweak: impl FnOnce(&mut Config)) -> Server {
        let data = tempfile::tempdir().expect("tempdir");
        let mut c = Config::default();
        c.server.addr = "127.0.0.1:0".parse().expect("addr");
        c.data_dir = data.path().to_owned();
        c.admin_key = Some(Secret::from(ADMIN));
        c.cache.enabled = false;
        // The load figures are the model's: ask it (the answers bench
        // names its mode per request).
        c.chat.answer = Some(ragtime_pipeline::chat::AnswerMode::Generate);
        tweak(&mut c);
        let app = Application::build(c).await.expect("start ragtime");
        let base = format!("http://127.0.0.1:{}", app.port());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let done = tokio::spawn(app.run_until(async {
            let _ = rx.await;
        }));
        let s = Server {
            base,
            http: reqwest::Client::new(),
            stop: Some(tx),
            done: Some(done),
            _data: data,
        };
        let t = Instant::now();
        while s.get("/readyz").await.0 != 200 {
            assert!(
                t.elapsed() < Duration::from_secs(300),
                "ragtime never became ready"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        s
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(ADMIN)
            .send()
            .await;
        match r {
            Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
            Err(_) => (0, Value::Null),
        }
    }

    /// Ingests the first `n` SciFact documents (100 a request).
    pub async fn ingest(&self, data: &SciFact, n: usize) {
        for batch in data.corpus[..n.min(data.corpus.len())].chunks(100) {
            let docs: Vec<Value> = batch
                .iter()
                .map(|(id, title, text)| json!({"id": id, "title": title, "text": text}))
                .collect();
            let r = self
                .http
                .post(format!("{}/v1/documents", self.base))
                .json(&json!({"documents": docs}))
                .send()
                .await
                .expect("ingest");
            assert_eq!(r.status(), 200, "ingest");
        }
    }

    /// The first backend's learned speed: (ms before the first token, ms
    /// per prompt token, ms per token read as its progress shows).
    async fn prefill(&self) -> (f64, f64, f64) {
        let (_, s) = self.get("/admin/stats").await;
        let b = &s["llm"]["backends"][0];
        (
            b["ttft_base_ms"].as_f64().unwrap_or(0.0),
            b["ms_per_prompt_token"].as_f64().unwrap_or(0.0),
            b["ms_per_read_token"].as_f64().unwrap_or(f64::NAN),
        )
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(d) = self.done.take() {
            let _ = d.await;
        }
    }
}

/// What one streamed chat came to.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) reason: Option<PartialReason>,
    first_chunk: Option<Duration>,
    ttft: Option<Duration>,
    pub(crate) total: Duration,
    /// The answer's time minus its budget (ms); negative when early.
    over_budget_ms: f64,
    /// The `llm_ttft` stage's note, when the answer was not the model's.
    ttft_detail: Option<String>,
    /// Every stage that did not end `ok`, with its note.
    not_ok: Vec<String>,
}

/// One streamed chat request, read to its end.
pub(crate) async fn ask(http: &reqwest::Client, base: &str, q: &str) -> Answer {
    ask_for(http, base, q, 96).await
}

/// One streamed chat request of at most `max_tokens`, read to its end.
async fn ask_for(http: &reqwest::Client, base: &str, q: &str, max_tokens: u32) -> Answer {
    let t0 = Instant::now();
    let body = json!({"model": "m", "stream": true, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": q}]});
    let mut a = Answer {
        status: 0,
        reason: None,
        first_chunk: None,
        ttft: None,
        total: Duration::ZERO,
        over_budget_ms: 0.0,
        ttft_detail: None,
        not_ok: Vec::new(),
    };
    let r = match http
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(_) => return a,
    };
    a.status = r.status().as_u16();
    if a.status != 200 {
        a.total = t0.elapsed();
        return a;
    }
    let mut events = r.bytes_stream().eventsource();
    let mut budget_ms = 0.0;
    while let Some(Ok(ev)) = events.next().await {
        if ev.data == "[DONE]" {
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
            continue;
        };
        if a.first_chunk.is_none() {
            a.first_chunk = Some(t0.elapsed());
        }
        let text = v["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap_or_default();
        if a.ttft.is_none() && !text.is_empty() {
            a.ttft = Some(t0.elapsed());
        }
        if v.get("budget").is_some() {
            a.reason = v["partial_reason"]
                .as_str()
                .and_then(PartialReason::from_name);
            budget_ms = v["budget"]["total_ms"].as_f64().unwrap_or(0.0);
            let stages = v["budget"]["stages"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            let not_ok = stages.iter().filter(|s| s["outcome"] != "ok");
            a.ttft_detail = not_ok
                .clone()
                .find(|s| s["stage"] == Stage::LlmTtft.name())
                .and_then(|s| s["detail"].as_str())
                .map(str::to_owned);
            a.not_ok = not_ok
                .map(|s| {
                    let name = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
                    format!("{}: {}", name("stage"), name("detail"))
                })
                .collect();
        }
    }
    a.total = t0.elapsed();
    a.over_budget_ms = a.total.as_secs_f64() * 1000.0 - budget_ms;
    a
}

/// SciFact train questions whose relevant documents are among the first
/// `docs` ingested.
fn questions(data: &SciFact, docs: usize) -> Vec<String> {
    let ingested: HashSet<&str> = data
        .corpus
        .iter()
        .take(docs)
        .map(|(id, _, _)| id.as_str())
        .collect();
    data.queries
        .iter()
        .filter(|(qid, _)| {
            data.qrels
                .get(qid)
                .is_some_and(|r| r.iter().any(|d| ingested.contains(d.as_str())))
        })
        .map(|(_, q)| q.clone())
        .collect()
}

/// `clients` asking back to back for `dur`.
async fn closed_loop(base: &str, qs: &[String], clients: usize, dur: Duration) -> Vec<Answer> {
    let qs = qs.to_vec();
    let until = Instant::now() + dur;
    asking(base, clients, 96, move |i| {
        (Instant::now() < until).then(|| qs[i % qs.len()].clone())
    })
    .await
}

/// `clients` tasks asking one after another, each the question `next`
/// gives for the next number (shared, counting from 0) until it gives
/// none; every answer.
async fn asking(
    base: &str,
    clients: usize,
    max_tokens: u32,
    next: impl Fn(usize) -> Option<String> + Send + Sync + 'static,
) -> Vec<Answer> {
    let count = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(next);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (count, next, base) = (count.clone(), next.clone(), base.to_owned());
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut out = Vec::new();
                while let Some(q) = next(count.fetch_add(1, Ordering::Relaxed)) {
                    out.push(ask_for(&http, &base, &q, max_tokens).await);
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    all
}

/// Poisson arrivals at `rate` a second for `dur`, each its own task.
async fn open_loop(
    base: &str,
    qs: &[String],
    rate: f64,
    dur: Duration,
    rng: &mut Rng,
) -> Vec<Answer> {
    let http = reqwest::Client::new();
    let start = Instant::now();
    let mut at = 0.0;
    let mut tasks = Vec::new();
    let mut i = 0usize;
    loop {
        at += rng.exponential(rate);
        if at >= dur.as_secs_f64() {
            break;
        }
        tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()).await;
        let (http, base, q) = (http.clone(), base.to_owned(), qs[i % qs.len()].clone());
        i += 1;
        tasks.push(tokio::spawn(async move { ask(&http, &base, &q).await }));
    }
    let mut all = Vec::new();
    for t in tasks {
        if let Ok(a) = t.await {
            all.push(a);
        }
    }
    all
}

/// Full answers (a 200, nothing degraded) a second.
fn goodput(a: &[Answer], secs: f64) -> f64 {
    a.iter()
        .filter(|x| x.status == 200 && x.reason.is_none())
        .count() as f64
        / secs.max(1e-9)
}

fn ms(v: Vec<Duration>, p: f64) -> String {
    let mut v = v;
    if v.is_empty() {
        return "–".into();
    }
    format!("{:.0}", pct(&mut v, p))
}

/// "p50 / p95 / p99" of `v` in milliseconds, as the tables print them.
fn p50_95_99(v: Vec<Duration>) -> String {
    [50.0, 95.0, 99.0].map(|p| ms(v.clone(), p)).join(" / ")
}

fn row(name: &str, rate: f64, a: &[Answer], secs: f64) {
    let ok: Vec<&Answer> = a.iter().filter(|x| x.status == 200).collect();
    let mut reasons: BTreeMap<&'static str, usize> = BTreeMap::new();
    for x in &ok {
        if let Some(r) = &x.reason {
            *reasons.entry(r.name()).or_default() += 1;
        }
    }
    let s503 = a.iter().filter(|x| x.status == 503).count();
    let other = a
        .iter()
        .filter(|x| x.status != 200 && x.status != 503)
        .count();
    let total: Vec<Duration> = ok.iter().map(|x| x.total).collect();
    let ttft: Vec<Duration> = ok.iter().filter_map(|x| x.ttft).collect();
    let first: Vec<Duration> = ok.iter().filter_map(|x| x.first_chunk).collect();
    let mut over: Vec<f64> = ok.iter().map(|x| x.over_budget_ms).collect();
    over.sort_by(f64::total_cmp);
    let over99 = over.get(((over.len().max(1) - 1) as f64 * 0.99).round() as usize);
    let not_llm = |r: &PartialReason| {
        matches!(
            r,
            PartialReason::Overload | PartialReason::Stage(Stage::LlmTtft)
        )
    };
    let unwritten: Vec<Duration> = ok
        .iter()
        .filter(|x| x.reason.as_ref().is_some_and(not_llm))
        .map(|x| x.total)
        .collect();
    let shed: Vec<Duration> = ok
        .iter()
        .filter(|x| x.reason == Some(PartialReason::Overload))
        .map(|x| x.total)
        .collect();
    let missed = reasons.get(Stage::LlmTtft.name()).copied().unwrap_or(0);
    println!(
        "| {name} | {rate:.2} | {} | {:.2} | {} | {s503} | {other} | {} | {} | {} / {} | {} | {} | {} | {:.1} % |",
        a.len(),
        goodput(a, secs),
        if reasons.is_empty() {
            "–".to_owned()
        } else {
            reasons
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        p50_95_99(total),
        p50_95_99(ttft),
        ms(first.clone(), 50.0),
        ms(first, 95.0),
        over99.map_or("–".into(), |o| format!("{o:.0}")),
        ms(unwritten, 95.0),
        ms(shed, 95.0),
        100.0 * missed as f64 / a.len().max(1) as f64,
    );
}

/// How the answers the model did not write came to be, each way's count
/// and p95 total time: refused at admission, queued until no slot could
/// come in time (or the longest wait passed), cut early on a predicted
/// late first token (the backend's prompt progress, or the prompts being
/// read when a slot came after a wait), or waited out to the deadline.
/// With `BENCH_SHOW`, each one's note, and each `llm_error` answer's
/// stages that did not end ok.
fn unwritten_by_way(name: &str, a: &[Answer]) -> String {
    let mut ways: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    for x in a.iter().filter(|x| x.status == 200) {
        let Some(r) = &x.reason else { continue };
        if *r == PartialReason::LlmError && std::env::var_os("BENCH_SHOW").is_some() {
            eprintln!("{name}: llm_error: {}", x.not_ok.join("; "));
        }
        if !matches!(
            r,
            PartialReason::Overload | PartialReason::Stage(Stage::LlmTtft)
        ) {
            continue;
        }
        let d = x.ttft_detail.as_deref().unwrap_or_default();
        let way = if d.contains("shed:") || d.contains("queue is full") {
            "1 refused at once"
        } else if d.contains("no slot came free") || d.contains("none came free") {
            "2 queued out"
        } else if d.contains("predicted") {
            "3 cut on progress"
        } else {
            "4 waited out"
        };
        ways.entry(way).or_default().push(x.total);
        if std::env::var_os("BENCH_SHOW").is_some() {
            eprintln!("{name}: {} ms: {d}", x.total.as_millis());
        }
    }
    let parts: Vec<String> = ways
        .into_iter()
        .map(|(w, v)| format!("{} {} (p95 {} ms)", &w[2..], v.len(), ms(v, 95.0)))
        .collect();
    format!(
        "- {name}: not written by the LLM: {}",
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    )
}

fn header() {
    println!(
        "| load | arrivals/s | requests | goodput (full answers/s) | partial by reason | 503 | other errors | total p50 / p95 / p99 ms | first token p50 / p95 / p99 ms | first chunk p50 / p95 ms | p99 of total − budget ms | not written by the LLM, p95 ms | shed, p95 ms | admitted, then no first token |"
    );
    println!("|---|---:|---:|---:|---|---:|---:|---|---|---|---:|---:|---:|---:|");
}

/// `ragtime-bench load`.
pub async fn load(data: &SciFact) {
    let secs = env_usize("BENCH_SECONDS", 60) as u64;
    let docs = env_usize("BENCH_DOCS", 500);
    let factors: Vec<f64> = std::env::var("BENCH_FACTORS")
        .unwrap_or_else(|_| "0.5,1,2,4".into())
        .split(',')
        .filter_map(|f| f.trim().parse().ok())
        .collect();
    // `BENCH_BATCH`: the local server's `llm.batch_size` (its progress
    // reports come once a step).
    let batch = std::env::var("BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok());
    // `BENCH_MAX_QUEUE_WAIT_MS`: `llm.max_queue_wait_ms` (how long a
    // request waits for a slot before it is answered without the model).
    let max_wait = std::env::var("BENCH_MAX_QUEUE_WAIT_MS")
        .ok()
        .and_then(|v| v.parse().ok());
    let server = Server::start(|c| {
        if let Some(b) = batch {
            c.llm.batch_size = b;
        }
        if let Some(w) = max_wait {
            c.llm.max_queue_wait_ms = w;
        }
    })
    .await;
    server.ingest(data, docs).await;
    let qs = questions(data, docs);
    let (_, stats) = server.get("/admin/stats").await;
    let slots = stats["llm"]["backends"][0]["slots"].as_u64().unwrap_or(2) as usize;
    // Warm the backend (and its learned speed), then measure capacity.
    let _ = closed_loop(&server.base, &qs, slots, Duration::from_secs(10)).await;
    let dur = Duration::from_secs(secs);
    let cap_cpu = Cpu::now();
    let cap_answers = closed_loop(&server.base, &qs[50..], slots, dur).await;
    // The estimate as learned at capacity, against which overload must not
    // move it (queueing is not prefill).
    let before = server.prefill().await;
    let capacity = goodput(&cap_answers, dur.as_secs_f64());
    println!(
        "\n## load: streamed chat against the embedded defaults ({docs} SciFact documents, {slots} llama-server slots, semantic cache off, max_tokens 96, {secs} s a level, a slot waited for at most {} ms)",
        max_wait.unwrap_or(Config::default().llm.max_queue_wait_ms)
    );
    println!("capacity ({slots} closed-loop clients): {capacity:.3} full answers/s");
    header();
    row(
        "capacity (closed loop)",
        0.0,
        &cap_answers,
        dur.as_secs_f64(),
    );
    let mut ways = vec![unwritten_by_way("capacity", &cap_answers)];
    let mut cpu = vec![("capacity".to_owned(), cap_cpu.since())];
    let mut rng = Rng(7);
    for f in factors {
        let rate = f * capacity.max(0.05);
        let used = Cpu::now();
        let a = open_loop(&server.base, &qs, rate, dur, &mut rng).await;
        cpu.push((format!("{f}×"), used.since()));
        row(&format!("{f}×"), rate, &a, dur.as_secs_f64());
        ways.push(unwritten_by_way(&format!("{f}×"), &a));
    }
    println!();
    for w in ways {
        println!("{w}");
    }
    // Where the two cores went: ragtime's own work (embedding, retrieval,
    // reranking, the extractive answers of the requests not admitted)
    // takes cycles from the model.
    for (name, (own, llama, wall)) in cpu {
        println!(
            "- {name}: CPU in ragtime {:.2} cores, in llama-server {:.2} cores (over {:.0} s)",
            own / wall,
            llama / wall,
            wall
        );
    }
    let after = server.prefill().await;
    println!(
        "learned prefill at capacity / after the overload levels: {:.0} ms + {:.2} ms a prompt token / {:.0} ms + {:.2} ms a prompt token; reading (from progress) {:.2} / {:.2} ms a token",
        before.0, before.1, after.0, after.1, before.2, after.2
    );
    server.stop().await;
}

/// CPU seconds used so far by this process (ragtime runs in it) and by
/// the llama-server it started, and when they were read.
struct Cpu {
    own: f64,
    llama: f64,
    at: Instant,
}

impl Cpu {
    fn now() -> Cpu {
        let llama = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                std::fs::read_to_string(e.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "llama-server")
            })
            .map(|e| cpu_seconds(&e.path().join("stat")))
            .sum();
        Cpu {
            own: cpu_seconds(std::path::Path::new("/proc/self/stat")),
            llama,
            at: Instant::now(),
        }
    }

    /// (ragtime's CPU seconds, llama-server's, wall seconds) since `self`.
    fn since(&self) -> (f64, f64, f64) {
        let n = Cpu::now();
        (
            n.own - self.own,
            n.llama - self.llama,
            n.at.duration_since(self.at).as_secs_f64(),
        )
    }
}

/// utime + stime of a `/proc/…/stat` file, in seconds (100 ticks a
/// second, Linux's `USER_HZ`).
fn cpu_seconds(stat: &std::path::Path) -> f64 {
    let s = std::fs::read_to_string(stat).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

/// `ragtime-bench prefix`: each of `BENCH_QUESTIONS` SciFact claims asked
/// three ways, one after another, by `BENCH_CLIENTS` closed-loop clients
/// (default 2, the local server's slots), short answers (16 tokens: the
/// first token is what is timed); a fresh ragtime and llama-server with
/// the prompt cache on, then off, then on again, the same questions.
pub async fn prefix(data: &SciFact) {
    let docs = env_usize("BENCH_DOCS", 500);
    let n = env_usize("BENCH_QUESTIONS", 30);
    let clients = env_usize("BENCH_CLIENTS", 2);
    let qs = questions(data, docs);
    // Warm the backend's learned speed on other questions.
    let warm = qs.get(n..).unwrap_or_default();
    let asked: Vec<String> = qs[..n.min(qs.len())]
        .iter()
        .flat_map(|c| {
            let c = c.trim_end_matches('.');
            [
                format!("{c}."),
                format!("Is it true that {}?", lower_first(c)),
                format!("What do the sources say about whether {}?", lower_first(c)),
            ]
        })
        .collect();
    println!(
        "\n## prompt prefix reuse: {} questions ({n} claims asked three ways), {clients} closed-loop clients, 16-token answers, {docs} SciFact documents",
        asked.len()
    );
    println!(
        "| prompt cache | answered with a first token | first token p50 / p95 / p99 ms | total p50 ms | partial |"
    );
    println!("|---|---:|---|---:|---:|");
    for on in [true, false, true] {
        let server = Server::start(|c| c.llm.prompt_cache = on).await;
        server.ingest(data, docs).await;
        let http = reqwest::Client::new();
        for q in warm.iter().take(8) {
            let _ = ask_for(&http, &server.base, q, 16).await;
        }
        let list = asked.clone();
        let all = asking(&server.base, clients, 16, move |i| list.get(i).cloned()).await;
        let ttft: Vec<Duration> = all.iter().filter_map(|a| a.ttft).collect();
        let total: Vec<Duration> = all.iter().map(|a| a.total).collect();
        let partial = all.iter().filter(|a| a.reason.is_some()).count();
        println!(
            "| {} | {} of {} | {} | {} | {partial} |",
            if on { "on" } else { "off" },
            ttft.len(),
            all.len(),
            p50_95_99(ttft),
            ms(total, 50.0),
        );
        server.stop().await;
    }
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

/// Serves `app` on a free loopback port, in the background; its base URL.
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://127.0.0.1:{port}")
}

/// A fault-injecting OpenAI-compatible backend: every `stall_every`th
/// request waits `stall` before its first token.
pub struct FakeBackend {
    pub base_url: String,
    pub requests: Arc<AtomicUsize>,
}

impl FakeBackend {
    pub async fn start(stall_every: usize, stall: Duration) -> FakeBackend {
        use axum::routing::{get, post};
        let requests = Arc::new(AtomicUsize::new(0));
        let n = requests.clone();
        let app = axum::Router::new()
            .route(
                "/v1/models",
                get(|| async { axum::Json(json!({"object": "list", "data": [{"id": "fake"}]})) }),
            )
            .route(
                "/v1/chat/completions",
                post(move || {
                    let i = n.fetch_add(1, Ordering::Relaxed) + 1;
                    let wait = if stall_every > 0 && i.is_multiple_of(stall_every) {
                        stall
                    } else {
                        Duration::from_millis(150)
                    };
                    async move { fake_stream(wait) }
                }),
            );
        FakeBackend {
            base_url: format!("{}/v1", serve(app).await),
            requests,
        }
    }
}

/// An SSE answer: the first token after `ttft`, 20 more 10 ms apart.
fn fake_stream(ttft: Duration) -> axum::response::Response {
    use axum::response::IntoResponse;
    let frames = futures::stream::unfold(0usize, move |i| async move {
        let frame = match i {
            0 => {
                tokio::time::sleep(ttft).await;
                json!({"choices": [{"index": 0, "delta": {"content": "tok "}}]}).to_string()
            }
            1..=20 => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                json!({"choices": [{"index": 0, "delta": {"content": "tok "}}]}).to_string()
            }
            21 => {
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).to_string()
            }
            22 => "[DONE]".to_owned(),
            _ => return None,
        };
        Some((
            Ok::<_, std::convert::Infallible>(format!("data: {frame}\n\n")),
            i + 1,
        ))
    });
    let mut r = axum::body::Body::from_stream(frames).into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream"),
    );
    r
}

/// `ragtime-bench hedge`.
pub async fn hedge(data: &SciFact) {
    let secs = env_usize("BENCH_SECONDS", 60) as u64;
    let rate = env_usize("BENCH_RATE", 6) as f64;
    let docs = env_usize("BENCH_DOCS", 200);
    let qs = questions(data, docs);
    println!(
        "\n## hedging: two backends (8 slots each; first token after 150 ms, 20 more tokens 10 ms apart), one stalling its first token by 3 s on every 10th request; {rate} requests/s for {secs} s"
    );
    println!(
        "| hedging | requests | first token p50 / p95 / p99 ms | total p99 ms | backend requests | extra | partial |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|");
    for on in [false, true] {
        let a = FakeBackend::start(10, Duration::from_secs(3)).await;
        let b = FakeBackend::start(0, Duration::ZERO).await;
        let (ua, ub) = (a.base_url.clone(), b.base_url.clone());
        let server = Server::start(move |c| {
            c.llm.backends = vec![backend_config(&ua, 8), backend_config(&ub, 8)];
            c.llm.hedge.enabled = on;
            c.budgets.rerank_ms = 0;
        })
        .await;
        server.ingest(data, docs).await;
        let (ra0, rb0) = (
            a.requests.load(Ordering::Relaxed),
            b.requests.load(Ordering::Relaxed),
        );
        let answers = open_loop(
            &server.base,
            &qs,
            rate,
            Duration::from_secs(secs),
            &mut Rng(11),
        )
        .await;
        let backend =
            a.requests.load(Ordering::Relaxed) - ra0 + b.requests.load(Ordering::Relaxed) - rb0;
        let ttft: Vec<Duration> = answers.iter().filter_map(|x| x.ttft).collect();
        let total: Vec<Duration> = answers.iter().map(|x| x.total).collect();
        let partial = answers.iter().filter(|x| x.reason.is_some()).count();
        println!(
            "| {} | {} | {} | {} | {backend} | {:.1} % | {partial} |",
            if on { "on" } else { "off" },
            answers.len(),
            p50_95_99(ttft),
            ms(total, 99.0),
            100.0 * (backend as f64 - answers.len() as f64) / answers.len().max(1) as f64,
        );
        server.stop().await;
    }
}

fn backend_config(url: &str, slots: usize) -> ragtime_gateway::config::BackendConfig {
    ragtime_gateway::config::BackendConfig {
        base_url: url.to_owned(),
        model: None,
        max_concurrency: slots,
        weight: 1.0,
        ctx_size: None,
    }
}

/// `ragtime-bench kill`.
pub async fn kill(data: &SciFact) {
    use ragtime_llm::{LocalServer, LocalServerOptions};
    let secs = env_usize("BENCH_SECONDS", 40) as u64;
    let docs = env_usize("BENCH_DOCS", 300);
    let rate: f64 = std::env::var("BENCH_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0.4);
    let c = crate::cache();
    let llama = |_: usize| {
        LocalServer::start(LocalServerOptions {
            binary: c.join("bin/llama-server"),
            model: c.join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            alias: "smollm2-135m-instruct".into(),
            ctx_size: 2048,
            threads: 1,
            parallel: 1,
            batch_size: 256,
            port: 0,
        })
        .expect("llama-server")
    };
    let (a, b) = (llama(0), llama(1));
    assert!(
        a.wait_healthy(Duration::from_secs(120)).await
            && b.wait_healthy(Duration::from_secs(120)).await
    );
    let (ua, ub) = (a.base_url(), b.base_url());
    let server = Server::start(move |c| {
        c.llm.backends = vec![backend_config(&ua, 1), backend_config(&ub, 1)];
        c.llm.ctx_size = 2048;
        c.llm.probe_ms = 250;
    })
    .await;
    server.ingest(data, docs).await;
    let qs = questions(data, docs);
    let base = server.base.clone();
    let load = tokio::spawn(async move {
        open_loop(&base, &qs, rate, Duration::from_secs(secs), &mut Rng(5)).await
    });
    tokio::time::sleep(Duration::from_secs(secs / 4)).await;
    let pid = a.pid();
    let killed_at = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
    let state = |s: &Value| {
        s["llm"]["backends"][0]["breaker"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    let (mut opened, mut closed) = (None, None);
    while killed_at.elapsed() < Duration::from_secs(secs) && closed.is_none() {
        let (_, s) = server.get("/admin/stats").await;
        match (state(&s).as_str(), opened) {
            ("open", None) => opened = Some(killed_at.elapsed()),
            ("closed", Some(_)) => closed = Some(killed_at.elapsed()),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answers = load.await.unwrap_or_default();
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    let mut reasons: BTreeMap<&'static str, usize> = BTreeMap::new();
    for x in &answers {
        *by_status.entry(x.status).or_default() += 1;
        if let Some(r) = &x.reason {
            *reasons.entry(r.name()).or_default() += 1;
        }
    }
    println!(
        "\n## a backend killed mid-run: two llama-servers (1 slot each), {rate} requests/s for {secs} s, SIGKILL of one after {} s (its supervisor restarts it)",
        secs / 4
    );
    println!("responses by status: {by_status:?}; partial answers by reason: {reasons:?}");
    println!(
        "breaker of the killed backend: open {} after the kill, closed again {} after it",
        opened.map_or("never".into(), |d| format!("{} ms", d.as_millis())),
        closed.map_or("not within the run".into(), |d| format!(
            "{} ms",
            d.as_millis()
        )),
    );
    server.stop().await;
    a.shutdown().await;
    b.shutdown().await;
}
