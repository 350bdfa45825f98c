//! `ragtime-bench cache`: hit and false-hit rates of the semantic cache on
//! the labelled Quora question pairs (`../shared/data/paraphrase/pairs.tsv`,
//! or `RAGTIME_PARAPHRASE`). For each pair, the first question is the
//! cached one and the second is asked: a duplicate that hits is a hit, a
//! non-duplicate that hits is a false hit.
//!
//! Prints plain cosine thresholds next to the verified cache (cosine floor,
//! vetoes, logistic score). The score's weights are fitted on one half of
//! the pairs and measured on the other (two folds, averaged), then fitted
//! on all pairs for the defaults in `ragtime-cache`.

use ragtime_cache::{Features, Verifier, analyse, features};
use ragtime_core::Cancel;
use ragtime_embed::{EmbedService, ServiceOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

struct Pair {
    f: Features,
    dup: bool,
}

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

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

#[allow(clippy::needless_range_loop)]
/// Logistic regression by Newton's method (a few iterations suffice for
/// five parameters), with a little L2 for stability.
fn fit(pairs: &[&Pair]) -> Verifier {
    const N: usize = 5;
    let x = |p: &Pair| {
        let v = p.f.vector();
        [1.0, v[0] as f64, v[1] as f64, v[2] as f64, v[3] as f64]
    };
    let mut w = [0.0f64; N];
    for _ in 0..25 {
        let mut g = [0.0f64; N];
        let mut h = [[0.0f64; N]; N];
        for p in pairs {
            let xi = x(p);
            let z: f64 = (0..N).map(|j| w[j] * xi[j]).sum();
            let pr = sigmoid(z);
            let y = if p.dup { 1.0 } else { 0.0 };
            for j in 0..N {
                g[j] += (pr - y) * xi[j];
                for k in 0..N {
                    h[j][k] += pr * (1.0 - pr) * xi[j] * xi[k];
                }
            }
        }
        for j in 0..N {
            g[j] += 1e-3 * w[j];
            h[j][j] += 1e-3;
        }
        let step = solve(h, g);
        for j in 0..N {
            w[j] -= step[j];
        }
    }
    Verifier {
        bias: w[0] as f32,
        weights: [w[1] as f32, w[2] as f32, w[3] as f32, w[4] as f32],
    }
}

/// Gaussian elimination with partial pivoting.
#[allow(clippy::needless_range_loop)]
fn solve<const N: usize>(mut a: [[f64; N]; N], mut b: [f64; N]) -> [f64; N] {
    for c in 0..N {
        let p = (c..N)
            .max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))
            .unwrap_or(c);
        a.swap(c, p);
        b.swap(c, p);
        if a[c][c].abs() < 1e-12 {
            continue;
        }
        for r in c + 1..N {
            let f = a[r][c] / a[c][c];
            for k in c..N {
                a[r][k] -= f * a[c][k];
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = [0.0; N];
    for r in (0..N).rev() {
        let s: f64 = (r + 1..N).map(|k| a[r][k] * x[k]).sum();
        x[r] = if a[r][r].abs() < 1e-12 {
            0.0
        } else {
            (b[r] - s) / a[r][r]
        };
    }
    x
}

/// (duplicates hit %, non-duplicates hit %).
fn rates<'a>(pairs: impl Iterator<Item = &'a Pair>, hit: impl Fn(&Pair) -> bool) -> (f64, f64) {
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
    let pairs: Vec<Pair> = rows
        .iter()
        .enumerate()
        .map(|(i, (a, b, dup))| {
            let cos: f32 = vecs[2 * i]
                .iter()
                .zip(&vecs[2 * i + 1])
                .map(|(x, y)| x * y)
                .sum();
            Pair {
                f: features(&analyse(a), &analyse(b), cos),
                dup: *dup,
            }
        })
        .collect();

    println!("\n### plain cosine threshold (no verification)");
    println!("| cosine ≥ | duplicates hit | false hits |");
    println!("|---:|---:|---:|");
    for th in [0.80f32, 0.85, 0.88, 0.90, 0.92, 0.94, 0.96] {
        let (h, f) = rates(pairs.iter(), |p| p.f.cosine >= th);
        println!("| {th:.2} | {h:.1} % | {f:.1} % |");
    }

    let floor = env_f32("BENCH_CACHE_FLOOR", 0.80);
    let vetoed = rates(pairs.iter(), |p| p.f.cosine >= floor && p.f.veto.is_some());
    println!(
        "\nvetoes (negation / number / swapped) above cosine {floor:.2}: {:.1} % of duplicates, {:.1} % of non-duplicates",
        vetoed.0, vetoed.1
    );

    // Two folds: fit on one half, measure on the other.
    let candidates = |fold: usize, train: bool| {
        pairs
            .iter()
            .enumerate()
            .filter(move |(i, _)| (i % 2 == fold) == train)
            .map(|(_, p)| p)
    };
    let thresholds = [0.3f32, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];
    let mut sums = vec![(0.0, 0.0); thresholds.len()];
    for fold in 0..2 {
        let train: Vec<&Pair> = candidates(fold, true)
            .filter(|p| p.f.cosine >= floor && p.f.veto.is_none())
            .collect();
        let v = fit(&train);
        for (k, th) in thresholds.iter().enumerate() {
            let (h, f) = rates(candidates(fold, false), |p| {
                p.f.cosine >= floor && v.score(&p.f) >= *th
            });
            sums[k].0 += h / 2.0;
            sums[k].1 += f / 2.0;
        }
    }
    println!(
        "\n### verified cache: cosine ≥ {floor:.2}, vetoes, then score ≥ threshold (two-fold cross-validated)"
    );
    println!("| score ≥ | duplicates hit | false hits |");
    println!("|---:|---:|---:|");
    for (th, (h, f)) in thresholds.iter().zip(&sums) {
        println!("| {th:.1} | {h:.1} % | {f:.1} % |");
    }
    let all: Vec<&Pair> = pairs
        .iter()
        .filter(|p| p.f.cosine >= floor && p.f.veto.is_none())
        .collect();
    let v = fit(&all);
    println!(
        "\nweights fitted on all pairs ({:?}): {:?}, bias {:.3}",
        Features::NAMES,
        v.weights,
        v.bias
    );
    let d = Verifier::default();
    println!("\n### the shipped defaults (Verifier::default(), min_score 0.5) on all pairs");
    {
        let th = 0.5f32;
        let (h, f) = rates(pairs.iter(), |p| p.f.cosine >= floor && d.score(&p.f) >= th);
        println!("score ≥ {th:.1}: duplicates hit {h:.1} %, false hits {f:.1} %");
    }
}

fn env_f32(name: &str, default: f32) -> f32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn service(model: ragtime_embed::OnnxEmbedder) -> Arc<EmbedService> {
    Arc::new(EmbedService::new(model, ServiceOptions::default()))
}
