//! How long loading the embedder takes: preparing its graphs in memory at
//! every start, against loading the graphs prepared beside the model.
//!
//! ```text
//! cargo run --release -p ragtime-embed --example load_time [RUNS]
//! ```
//!
//! Works on a copy of the setup model (`$RAGTIME_CACHE` or
//! `~/.cache/ragtime`) in a temporary folder.

use ragtime_embed::prepare::{Outcome, load_or_prepare, prepare_in_memory};
use ragtime_embed::{EmbedderOptions, OnnxEmbedder};
use std::path::PathBuf;
use std::time::Instant;

fn cache() -> PathBuf {
    std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        })
}

/// Milliseconds since `t`.
fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// "median (min)" of timings: the minimum is the least disturbed by
/// other work on the machine.
fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!("{:7.1} ({:7.1})", v[v.len() / 2], v[0])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir()?;
    let setup = cache().join("models/all-minilm-l6-v2");
    for f in ["model.onnx", "tokenizer.json"] {
        std::fs::copy(setup.join(f), dir.path().join(f))?;
    }
    let model = dir.path().join("model.onnx");
    let opts = EmbedderOptions {
        model_dir: dir.path().to_owned(),
        ort_lib: cache().join("onnxruntime/libonnxruntime.so.1.31.1"),
        intra_threads: 1,
        max_tokens: 256,
        batch_size: 8,
        max_batch_tokens: 1024,
        passage_int8: true,
    };
    // Loads ONNX Runtime once, outside the timings.
    drop(OnnxEmbedder::from_prepared(
        &opts,
        &prepare_in_memory(&model)?,
    )?);

    let (mut rewrite, mut every_start) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let p = prepare_in_memory(&model)?;
        rewrite.push(ms(t));
        drop(OnnxEmbedder::from_prepared(&opts, &p)?);
        every_start.push(ms(t));
    }

    let t = Instant::now();
    drop(OnnxEmbedder::load(&opts)?);
    let first = ms(t);

    let (mut check, mut prepared) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let p = load_or_prepare(&model)?;
        check.push(ms(t));
        assert_eq!(p.outcome, Outcome::Reused);
        let t = Instant::now();
        drop(OnnxEmbedder::load(&opts)?);
        prepared.push(ms(t));
    }
    println!("median (min) of {runs} runs, ms:");
    println!(
        "  rewrite in memory (read, hash, decode, rewrite, encode ×2): {}",
        stats(rewrite)
    );
    println!(
        "  load, rewriting in memory at every start:                   {}",
        stats(every_start)
    );
    println!("  first load, preparing and writing the files:                {first:7.1}");
    println!(
        "  find the prepared files (read, hash, manifest):             {}",
        stats(check)
    );
    println!(
        "  load from the prepared files (OnnxEmbedder::load):          {}",
        stats(prepared)
    );
    Ok(())
}
