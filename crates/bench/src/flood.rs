//! `ragtime-bench flood`: hostile and heavy uploads against a `ragtime
//! serve` process, and its memory meanwhile. A gzip bomb (a `.jsonl.gz`
//! of a few MiB that expands to `BENCH_BOMB_GIB`, 4 GiB), a 40 MiB PDF, and
//! a flood of `BENCH_FLOOD` (200) concurrent 2 MiB JSON ingests: each
//! answer's status and error, and the process's resident memory before and
//! its peak (`VmHWM`) after each.

use crate::env_usize;
use crate::load::FakeBackend;
use crate::scaling::proc_status;
use crate::tracing_cost::run_ragtime;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

/// `(VmRSS, VmHWM)` of a process, in MiB.
fn memory(pid: u32) -> (f64, f64) {
    let mib = |name| proc_status(pid, name) as f64 / 1024.0;
    (mib("VmRSS:"), mib("VmHWM:"))
}

async fn answer(r: reqwest::Result<reqwest::Response>) -> String {
    match r {
        Err(e) => format!("transport error: {e}"),
        Ok(r) => {
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            match body["error"]["message"].as_str() {
                Some(m) => format!(
                    "{status} {}: {m}",
                    body["error"]["code"].as_str().unwrap_or("")
                ),
                None => status.to_string(),
            }
        }
    }
}

pub async fn flood() {
    let bomb_gib = env_usize("BENCH_BOMB_GIB", 4);
    let n = env_usize("BENCH_FLOOD", 200);
    let http = reqwest::Client::new();
    let llm = FakeBackend::start(0, Duration::ZERO).await;
    let data = tempfile::tempdir().expect("tempdir");
    let (p, _) = run_ragtime("flood", data.path(), &llm.base_url, &[], &http).await;
    let pid = p.child.id();
    let upload = |name: &str, bytes: Vec<u8>| {
        let form = reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(bytes).file_name(name.to_owned()),
        );
        http.post(format!("{}/v1/documents", p.base))
            .multipart(form)
            .send()
    };
    println!("\n## Hostile and heavy uploads\n");
    println!("| what | answers | RSS before | peak RSS after |\n|---|---|---:|---:|");

    // A gzip bomb: a small file expanding to gigabytes of one JSON line.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(b"{\"_id\": \"bomb\", \"text\": \"")
        .expect("gzip");
    let zeros = vec![b'a'; 1 << 20];
    for _ in 0..bomb_gib * 1024 {
        gz.write_all(&zeros).expect("gzip");
    }
    let bomb = gz.finish().expect("gzip");
    let (before, _) = memory(pid);
    let said = answer(upload("bomb.jsonl.gz", bomb.clone()).await).await;
    let (_, peak) = memory(pid);
    println!(
        "| gzip bomb: {:.1} MiB expanding to {bomb_gib} GiB | {said} | {before:.0} MiB | {peak:.0} MiB |",
        bomb.len() as f64 / 1048576.0
    );

    // A PDF over the body limit.
    let mut pdf = b"%PDF-1.4\n".to_vec();
    pdf.resize(40 << 20, b' ');
    let (before, _) = memory(pid);
    let said = answer(upload("big.pdf", pdf).await).await;
    let (_, peak) = memory(pid);
    println!("| 40 MiB PDF | {said} | {before:.0} MiB | {peak:.0} MiB |");

    // A flood of 2 MiB ingests, all at once.
    let text = "Sediment settles where the river meets the sea and the tide turns. ".repeat(30);
    let body = |k: usize| {
        json!({"collection": "flood", "documents": (0..1000)
            .map(|i| json!({"id": format!("f{k}-{i}"), "text": text}))
            .collect::<Vec<_>>()})
    };
    let bodies: Vec<Value> = (0..n).map(body).collect();
    let (before, _) = memory(pid);
    let t = Instant::now();
    let answers = futures::future::join_all(bodies.iter().map(|b| async {
        answer(
            http.post(format!("{}/v1/documents", p.base))
                .json(b)
                .send()
                .await,
        )
        .await
    }))
    .await;
    let (_, peak) = memory(pid);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for a in answers {
        *counts.entry(a).or_default() += 1;
    }
    let said: Vec<String> = counts.iter().map(|(a, c)| format!("{c} × {a}")).collect();
    println!(
        "| {n} concurrent ingests of 1,000 documents (2 MiB) each ({:.0} s) | {} | {before:.0} MiB | {peak:.0} MiB |",
        t.elapsed().as_secs_f64(),
        said.join("; ")
    );
}
