//! `ragtime-bench cache`: hit and false-hit rates of the semantic cache on
//! the labelled Quora question pairs (`../shared/data/paraphrase/pairs.tsv`,
//! or `RAGTIME_PARAPHRASE`). For each pair, the first question is the
//! cached one and the second is asked: a duplicate that hits is a hit, a
//! non-duplicate that hits is a false hit. Prints plain cosine thresholds
//! next to the cache's own rule (cosine threshold plus the vetoes of
//! `ragtime_cache::verify`).
//!
//! `BENCH_CACHE_DUMP=FILE` also writes q1, q2, label and cosine (and with
//! `BENCH_CACHE_CE=1` the shared cross-encoder's logit) per pair, for
//! trying other verification features offline.

use ragtime_cache::{CacheOptions, analyse, veto};
use ragtime_core::Cancel;
use ragtime_embed::{EmbedService, ServiceOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

fn path() -> PathBuf {
    if let Some(p) = std::env::var_os("RAGTIME_PARAPHRASE") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/paraphrase/pairs.tsv")
}

fn load() -> Vec<(String, String, bool)> {
    let p = path();
    let text = std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (set RAGTIME_PARAPHRASE)", p.display()));
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let mut it = l.split('\t');
            let (a, b, d) = (it.next()?, it.next()?, it.next()?);
            Some((a.to_owned(), b.to_owned(), d.trim() == "1"))
        })
        .collect()
}

struct Pair {
    cosine: f32,
    vetoed: bool,
    dup: bool,
}

/// (duplicates hit %, non-duplicates hit %).
fn rates(pairs: &[Pair], hit: impl Fn(&Pair) -> bool) -> (f64, f64) {
    let (mut d, mut dh, mut n, mut nh) = (0usize, 0usize, 0usize, 0usize);
    for p in pairs {
        if p.dup {
            d += 1;
            dh += usize::from(hit(p));
        } else {
            n += 1;
            nh += usize::from(hit(p));
        }
    }
    (
        100.0 * dh as f64 / d.max(1) as f64,
        100.0 * nh as f64 / n.max(1) as f64,
    )
}

pub async fn semantic_cache(svc: Arc<EmbedService>) {
    let rows = load();
    let texts: Vec<String> = rows
        .iter()
        .flat_map(|(a, b, _)| [a.clone(), b.clone()])
        .collect();
    let t = Instant::now();
    let vecs = svc.embed(texts, Cancel::new()).await.expect("embed");
    println!(
        "\n## semantic cache: Quora question pairs ({} pairs, {} duplicates), embedded in {:.1} s",
        rows.len(),
        rows.iter().filter(|r| r.2).count(),
        t.elapsed().as_secs_f64()
    );
    let cosine = |i: usize| -> f32 {
        vecs[2 * i]
            .iter()
            .zip(&vecs[2 * i + 1])
            .map(|(x, y)| x * y)
            .sum()
    };
    if let Some(path) = std::env::var_os("BENCH_CACHE_DUMP") {
        let ce = std::env::var_os("BENCH_CACHE_CE")
            .map(|_| crate::rerank_bench::load("model-int8.onnx"));
        let lines: Vec<String> = rows
            .iter()
            .enumerate()
            .map(|(i, (a, b, dup))| {
                let logit = ce.as_ref().map_or(0.0, |ce| {
                    let x = ce
                        .score(a, std::slice::from_ref(b), &Cancel::new())
                        .expect("ce")[0];
                    let y = ce
                        .score(b, std::slice::from_ref(a), &Cancel::new())
                        .expect("ce")[0];
                    (x + y) / 2.0
                });
                format!("{a}\t{b}\t{}\t{}\t{logit}", u8::from(*dup), cosine(i))
            })
            .collect();
        std::fs::write(path, lines.join("\n")).expect("dump");
    }
    let pairs: Vec<Pair> = rows
        .iter()
        .enumerate()
        .map(|(i, (a, b, dup))| Pair {
            cosine: cosine(i),
            vetoed: veto(&analyse(a), &analyse(b)).is_some(),
            dup: *dup,
        })
        .collect();

    let default = CacheOptions::default().min_cosine;
    println!(
        "| cosine ≥ | plain: duplicates hit | plain: false hits | with vetoes: duplicates hit | with vetoes: false hits |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for th in [0.85f32, 0.88, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97] {
        let (h, f) = rates(&pairs, |p| p.cosine >= th);
        let (hv, fv) = rates(&pairs, |p| p.cosine >= th && !p.vetoed);
        let mark = if (th - default).abs() < 1e-6 {
            " (default)"
        } else {
            ""
        };
        println!("| {th:.2}{mark} | {h:.1} % | {f:.2} % | {hv:.1} % | {fv:.2} % |");
    }
}

pub fn service(model: ragtime_embed::OnnxEmbedder) -> Arc<EmbedService> {
    Arc::new(EmbedService::new(model, ServiceOptions::default()))
}
