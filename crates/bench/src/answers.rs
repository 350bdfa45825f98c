//! `ragtime-bench answers`: what users read. Three books the Rust
//! toolchain installs with its documentation — the Rust Reference, the
//! rustdoc book and the Cargo book — each uploaded whole to a fresh
//! ragtime on its embedded defaults, the way a user sends a folder (every
//! file of a known type, print page, table of contents and redirect stubs
//! included, through `POST /v1/documents` as files named by their path, as
//! `ragtime ingest --server` does); then every question of the book's set
//! (`answers/rust-reference.json`, `answers/rustdoc-book.json`,
//! `answers/cargo-book.json`; `BENCH_SETS` picks) is asked, streamed, once
//! per answer mode (`BENCH_MODES`, default all three), one at a time,
//! semantic cache off.
//!
//! An answer is correct when the question's regex matches within its first
//! 400 characters (a user reads the beginning; an answer that pastes every
//! passage has answered nothing). Printed per mode: gold page cited, answer
//! in the top-5 passages (`/v1/search`, hybrid), correct (of all, and of
//! those whose answer was in the top 5), looping answers, time to first
//! text p50/p95, total p95, partial answers, and the grounding check
//! against correctness: of the wrong generated answers the share it marked
//! unsupported, of the right ones the share it wrongly marked, and its
//! time p95.
//!
//! `RAGTIME_DOCS` points at another copy of the toolchain's `html` folder;
//! `BENCH_QUESTIONS` limits the questions; `BENCH_SHOW=1` prints each
//! answer, and beside a wrong one where its text sat in the top 5.

use crate::load::Server;
use crate::stats::pct;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use ragtime_core::PartialReason;
use regex::RegexBuilder;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const FIRST_CHARS: usize = 400;

#[derive(Deserialize)]
struct QuestionSet {
    /// The book's folder under the toolchain's sysroot.
    root: String,
    questions: Vec<Question>,
}

#[derive(Deserialize)]
struct Question {
    id: String,
    question: String,
    answer: String,
    gold: Vec<String>,
}

/// A book's folder as the toolchain installed it (`root` is relative to
/// the sysroot: `share/doc/rust/html/reference`).
fn book_dir(root: &str) -> PathBuf {
    let rel = root.trim_start_matches("share/doc/rust/html/");
    if let Ok(p) = std::env::var("RAGTIME_DOCS") {
        return PathBuf::from(p).join(rel);
    }
    let out = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc --print sysroot");
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Path::new(&sysroot).join(root)
}

/// The folder's files as a user sends it: every file ragtime reads, named
/// by its path from the folder.
fn pages(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)
            .expect("read the book's dir")
            .flatten()
        {
            let p = e.path();
            let rel = p
                .strip_prefix(dir)
                .expect("under dir")
                .to_string_lossy()
                .replace('\\', "/");
            if p.is_dir() {
                stack.push(p);
            } else if ragtime_parse::is_supported(&rel) {
                out.push((rel, std::fs::read(&p).expect("read page")));
            }
        }
    }
    out.sort();
    out
}

/// What one streamed answer came to.
struct Answer {
    text: String,
    citations: Vec<String>,
    reason: Option<PartialReason>,
    first_text: Option<Duration>,
    total: Duration,
    /// The grounding verdict: `Some(grounded)` when checked.
    grounded: Option<bool>,
    /// The grounding check's whole verdict, for `BENCH_SHOW`.
    grounding: Value,
    verify_ms: Option<f64>,
}

async fn ask(http: &reqwest::Client, base: &str, q: &str, mode: &str) -> Answer {
    let t0 = Instant::now();
    let body = json!({"model": "m", "stream": true, "answer": mode,
        "messages": [{"role": "user", "content": q}]});
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("chat");
    assert_eq!(r.status(), 200, "chat");
    let mut a = Answer {
        text: String::new(),
        citations: Vec::new(),
        reason: None,
        first_text: None,
        total: Duration::ZERO,
        grounded: None,
        grounding: Value::Null,
        verify_ms: None,
    };
    let mut events = r.bytes_stream().eventsource();
    while let Some(Ok(ev)) = events.next().await {
        if ev.data == "[DONE]" {
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
            continue;
        };
        let text = v["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap_or_default();
        if a.first_text.is_none() && !text.is_empty() {
            a.first_text = Some(t0.elapsed());
        }
        a.text.push_str(text);
        if v.get("budget").is_some() {
            a.reason = v["partial_reason"]
                .as_str()
                .and_then(PartialReason::from_name);
            a.citations = v["citations"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["document_id"].as_str().map(str::to_owned))
                .collect();
            a.grounded = v["grounding"]["grounded"].as_bool();
            a.grounding = v["grounding"].clone();
            a.verify_ms = v["budget"]["stages"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["stage"] == "verify" && s["outcome"] != "skipped")
                .and_then(|s| s["elapsed_ms"].as_f64());
        }
    }
    a.total = t0.elapsed();
    a
}

/// Whether the answer repeats a line (or sentence) three times or more.
fn loops(text: &str) -> bool {
    let mut seen = std::collections::HashMap::new();
    // Sentences end at ". " — a path's dot ("src/lib.rs") ends none.
    text.split('\n')
        .flat_map(|l| l.split(". "))
        .map(str::trim)
        .filter(|l| l.len() > 12)
        .any(|l| {
            let n = seen.entry(l).or_insert(0);
            *n += 1;
            *n >= 3
        })
}

fn first_chars(text: &str) -> String {
    collapsed(text).chars().take(FIRST_CHARS).collect()
}

fn share(n: usize, of: usize) -> String {
    if of == 0 {
        "–".into()
    } else {
        format!("{:.2}", n as f64 / of as f64)
    }
}

pub async fn answers() {
    let sets = std::env::var("BENCH_SETS")
        .unwrap_or_else(|_| "rust-reference,rustdoc-book,cargo-book".into());
    for name in sets.split(',') {
        run_set(name).await;
    }
}

/// Uploads `pages` in one request, as `ragtime ingest --server` sends a
/// folder; prints what the server skipped.
async fn upload(http: &reqwest::Client, base: &str, pages: &[(String, Vec<u8>)]) {
    let t = Instant::now();
    let mut form = reqwest::multipart::Form::new();
    for (name, bytes) in pages {
        let part = reqwest::multipart::Part::bytes(bytes.clone()).file_name(name.clone());
        form = form.part("file", part);
    }
    let r = http
        .post(format!("{base}/v1/documents"))
        .multipart(form)
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), 200, "upload");
    let body: Value = r.json().await.expect("upload json");
    let skipped: Vec<String> = body["skipped"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            format!(
                "{} ({})",
                s["id"].as_str().unwrap_or("?"),
                s["reason"].as_str().unwrap_or("?")
            )
        })
        .collect();
    println!(
        "uploaded {} documents in {:.1} s; skipped {}: {}",
        body["documents"].as_array().map_or(0, Vec::len),
        t.elapsed().as_secs_f64(),
        skipped.len(),
        skipped.join("; ")
    );
}

async fn run_set(name: &str) {
    let path = format!("{}/answers/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let set: QuestionSet = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}")),
    )
    .expect("parse the question set");
    let dir = book_dir(&set.root);
    let limit = crate::env_usize("BENCH_QUESTIONS", usize::MAX);
    let questions = &set.questions[..set.questions.len().min(limit)];
    let modes: Vec<String> = std::env::var("BENCH_MODES")
        .unwrap_or_else(|_| "extractive,generate,quote_then_generate".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    let show = std::env::var("BENCH_SHOW").is_ok_and(|v| v == "1");
    let pages = pages(&dir);
    assert!(!pages.is_empty(), "no pages under {}", dir.display());
    println!(
        "\n## answers: {name} ({} files from {}), {} questions",
        pages.len(),
        dir.display(),
        questions.len()
    );

    // `BENCH_LEXICAL=chunks|documents`: what BM25 ranks documents by
    // (default `auto`, as the service).
    // `BENCH_DRY`, `BENCH_DRY_LAST_N` and `BENCH_FREQUENCY_PENALTY`: the
    // sampling settings (`chat.dry_multiplier`, `chat.dry_last_n`,
    // `chat.frequency_penalty`) compared for loops.
    let mut sampling = (0.0, 0.0, 0);
    let server = Server::start(|c| {
        use ragtime_gateway::config::Lexical;
        match std::env::var("BENCH_LEXICAL").as_deref() {
            Ok("chunks") => c.chunking.lexical = Lexical::Chunks,
            Ok("documents") => c.chunking.lexical = Lexical::Documents,
            _ => {}
        }
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<f64>().ok());
        if let Some(d) = num("BENCH_DRY") {
            c.chat.dry_multiplier = d;
        }
        if let Some(n) = num("BENCH_DRY_LAST_N") {
            c.chat.dry_last_n = n as u32;
        }
        if let Some(f) = num("BENCH_FREQUENCY_PENALTY") {
            c.chat.frequency_penalty = f;
        }
        sampling = (
            c.chat.frequency_penalty,
            c.chat.dry_multiplier,
            c.chat.dry_last_n,
        );
    })
    .await;
    println!(
        "sampling: frequency_penalty {}, dry_multiplier {} over the latest {} tokens",
        sampling.0, sampling.1, sampling.2
    );
    let http = reqwest::Client::new();
    upload(&http, &server.base, &pages).await;

    // Retrieval: the answer, and a gold page, in the top-5 passages.
    let mut in_top5 = vec![false; questions.len()];
    // For `BENCH_SHOW`: where the answer sits in the top 5 (its rank and
    // the words around it), shown beside a wrong answer.
    let mut found: Vec<Option<String>> = vec![None; questions.len()];
    let mut gold5 = 0usize;
    for (i, q) in questions.iter().enumerate() {
        let re = RegexBuilder::new(&q.answer)
            .case_insensitive(true)
            .build()
            .expect("regex");
        let r: Value = http
            .post(format!("{}/v1/search", server.base))
            .json(&json!({"query": q.question, "top_k": 5}))
            .send()
            .await
            .expect("search")
            .json()
            .await
            .expect("search json");
        let hits = r["results"].as_array().into_iter().flatten();
        found[i] = hits.clone().enumerate().find_map(|(rank, h)| {
            let text = collapsed(h["text"].as_str().unwrap_or_default());
            let m = re.find(&text)?;
            let from = text.floor_char_boundary(m.start().saturating_sub(160));
            let to = text.ceil_char_boundary((m.end() + 80).min(text.len()));
            Some(format!("[{}] …{}…", rank + 1, &text[from..to]))
        });
        in_top5[i] = found[i].is_some();
        gold5 += usize::from(hits.into_iter().any(|h| {
            let id = h["document_id"].as_str().unwrap_or_default();
            q.gold.iter().any(|g| g == id)
        }));
    }
    let top5 = in_top5.iter().filter(|x| **x).count();
    println!(
        "retrieval (hybrid, top 5): a gold page {}, the answer's text {}",
        share(gold5, questions.len()),
        share(top5, questions.len())
    );

    println!(
        "\n| mode | gold page cited | answer in top 5 | correct | correct, of top-5 | looping | partial | first text p50 / p95 ms | total p95 ms | unsupported: of wrong / of right | verify p95 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for mode in &modes {
        let (mut cited, mut correct, mut correct5, mut looping, mut partial) = (0, 0, 0, 0, 0);
        let (mut first, mut total) = (Vec::new(), Vec::new());
        let (mut wrong_flagged, mut wrong_checked, mut right_flagged, mut right_checked) =
            (0, 0, 0, 0);
        let mut verify = Vec::new();
        let mut verify_whole = Vec::new();
        let mut unchecked = 0usize;
        for (i, q) in questions.iter().enumerate() {
            let re = RegexBuilder::new(&q.answer)
                .case_insensitive(true)
                .build()
                .expect("regex");
            let a = ask(&http, &server.base, &q.question, mode).await;
            let ok = re.is_match(&first_chars(&a.text));
            if a.citations.iter().any(|c| q.gold.iter().any(|g| g == c)) {
                cited += 1;
            }
            correct += usize::from(ok);
            correct5 += usize::from(ok && in_top5[i]);
            looping += usize::from(loops(&a.text) || a.reason == Some(PartialReason::Degenerate));
            partial += usize::from(a.reason.is_some());
            first.extend(a.first_text);
            total.push(a.total);
            if let Some(g) = a.grounded {
                if ok {
                    right_checked += 1;
                    right_flagged += usize::from(!g);
                } else {
                    wrong_checked += 1;
                    wrong_flagged += usize::from(!g);
                }
            }
            unchecked += usize::from(a.verify_ms.is_some() && a.grounded.is_none());
            if let Some(ms) = a.verify_ms {
                verify.push(Duration::from_secs_f64(ms / 1000.0));
                // A looping answer is cut while the backend still writes
                // its next token: the check shares the cores with it.
                if a.reason != Some(PartialReason::Degenerate) {
                    verify_whole.push(Duration::from_secs_f64(ms / 1000.0));
                }
            }
            if show {
                println!(
                    "--- {} [{mode}] {} ({}; top5 {}; {:?})\n{}\ngrounding: {}\n",
                    q.id,
                    q.question,
                    if ok { "RIGHT" } else { "wrong" },
                    in_top5[i],
                    a.reason,
                    first_chars(&a.text),
                    a.grounding
                );
                if !ok && let Some(f) = &found[i] {
                    println!("answer /{}/ in {f}\n", q.answer);
                }
            }
        }
        let n = questions.len();
        println!(
            "| {mode} | {} | {} | {} | {} | {looping} | {partial} | {:.0} / {:.0} | {:.0} | {} ({wrong_flagged}/{wrong_checked}) / {} ({right_flagged}/{right_checked}) | {} |",
            share(cited, n),
            share(top5, n),
            share(correct, n),
            share(correct5, top5),
            pct(&mut first, 50.0),
            pct(&mut first, 95.0),
            pct(&mut total, 95.0),
            share(wrong_flagged, wrong_checked),
            share(right_flagged, right_checked),
            if verify.is_empty() {
                "–".into()
            } else {
                format!(
                    "{:.0} ({:.0} not cut for looping; {} unchecked)",
                    pct(&mut verify, 95.0),
                    pct(&mut verify_whole, 95.0),
                    unchecked
                )
            },
        );
    }
    server.stop().await;
}

/// `text` with runs of whitespace as one space.
fn collapsed(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
