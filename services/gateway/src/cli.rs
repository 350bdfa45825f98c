//! `ragtime ingest`: files from the command line into the store.

use crate::config::Config;
use anyhow::Context;
use std::path::{Path, PathBuf};

/// Reads every file first (so a bad file writes nothing), then ingests in
/// batches, printing progress and throughput.
pub async fn ingest_files(
    config: &Config,
    collection: &str,
    files: &[PathBuf],
    batch: usize,
) -> anyhow::Result<()> {
    config.validate()?;
    anyhow::ensure!(
        ragtime_core::valid_collection(collection),
        "--collection: must be 1 to 64 characters of letters, digits, '_', '-' or '.'"
    );
    let mut docs = Vec::new();
    let mut listed = Vec::new();
    for f in files {
        if f.is_dir() {
            walk(f, &mut listed).with_context(|| format!("cannot list {}", f.display()))?;
        } else {
            listed.push(f.clone());
        }
    }
    let mut parsed = Vec::new();
    for f in &listed {
        let bytes = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
        parsed.push(
            ragtime_parse::parse_file(&f.display().to_string(), bytes)
                .map_err(anyhow::Error::msg)?,
        );
    }
    // Read together, so lines repeated on most pages (chrome) are dropped.
    docs.extend(ragtime_parse::into_documents(parsed));
    let store = crate::app::open_store(config).await?;
    let corpus = crate::loader::corpus(config, store, None)
        .await
        .map_err(anyhow::Error::msg)?;
    let t0 = std::time::Instant::now();
    let (mut n_docs, mut n_chunks, mut unchanged) = (0usize, 0usize, 0usize);
    let total = docs.len();
    let mut it = docs.into_iter().peekable();
    let batches = std::iter::from_fn(|| {
        it.peek()
            .is_some()
            .then(|| it.by_ref().take(batch).collect::<Vec<_>>())
    });
    corpus
        .ingest_batches(collection, batches, |done| {
            for r in done {
                n_docs += 1;
                if r.status == ragtime_store::Upsert::Unchanged {
                    unchanged += 1;
                } else {
                    n_chunks += r.chunks;
                }
            }
            eprintln!("ingest: {n_docs}/{total} documents");
        })
        .await?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "ingested {n_docs} documents into {collection:?} ({unchanged} unchanged, {n_chunks} chunks embedded) in {secs:.1} s: {:.0} chunks/s",
        n_chunks as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// The files under `dir` that ragtime reads (by extension), in name order,
/// folders walked depth-first; hidden entries (`.git`, `.DS_Store`) skipped.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        if p.is_dir() {
            walk(&p, out)?;
        } else if ragtime_parse::is_supported(name) {
            out.push(p);
        }
    }
    Ok(())
}
