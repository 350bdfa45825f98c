//! `ragtime ingest`: files from the command line into the store, or to a
//! running server as jobs whose progress it shows.

use crate::config::Config;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Reads every file first (so a bad file writes nothing), then ingests in
/// batches, printing progress and throughput.
pub async fn ingest_files(
    config: &Config,
    collection: &str,
    files: &[PathBuf],
    filter: &ragtime_parse::FileFilter,
    id_prefix: &str,
    batch: usize,
) -> anyhow::Result<()> {
    config.validate()?;
    anyhow::ensure!(
        ragtime_core::valid_collection(collection),
        "--collection: must be 1 to 64 characters of letters, digits, '_', '-' or '.'"
    );
    let listed = list(files, filter, id_prefix)?;
    let mut parsed = Vec::new();
    for f in &listed {
        let bytes =
            std::fs::read(&f.path).with_context(|| format!("cannot read {}", f.path.display()))?;
        parsed.push(ragtime_parse::parse_file(&f.id, bytes).map_err(anyhow::Error::msg)?);
    }
    // Read together, so lines repeated on most pages (chrome) are dropped,
    // and a page that repeats the others is found.
    let read = ragtime_parse::into_documents(parsed);
    for s in &read.skipped {
        eprintln!("skipped {}: {}", listed[s.file].id, s.reason);
    }
    let docs = read.docs;
    let store = crate::app::open_store(config).await?;
    // A one-off process neither reads nor writes the server's snapshots
    // (it shares their folder; a server beside it may be saving).
    let mut config = config.clone();
    config.snapshots.enabled = false;
    let config = &config;
    let corpus = crate::loader::corpus(config, store, None)
        .await
        .map_err(anyhow::Error::msg)?;
    let t0 = std::time::Instant::now();
    let (mut n_docs, mut n_chunks, mut unchanged) = (0usize, 0usize, 0usize);
    let total = docs.len();
    // The time to go from the bar's own rate (a job's comes from the server).
    let bar = bar(total as u64, "documents · about {eta} to go");
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
            bar.set_position(n_docs as u64);
            if bar.is_hidden() {
                // Not a terminal: a line per batch for logs.
                eprintln!("ingest: {n_docs}/{total} documents");
            }
        })
        .await?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    // Which store: a server started with another data_dir (or another
    // database) does not see these documents.
    let store = match &config.database_url {
        Some(_) => "the PostgreSQL database of database_url".to_owned(),
        None => format!("the SQLite store in {}", config.data_dir.display()),
    };
    println!(
        "ingested {n_docs} documents into {collection:?} of {store} ({unchanged} unchanged, {n_chunks} chunks embedded) in {secs:.1} s: {:.0} chunks/s",
        n_chunks as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// A file to send and its document id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub path: PathBuf,
    /// `prefix` and the file's path from the folder given (`races.html`,
    /// `sub/page.html`); a file named itself: its path as given, or its
    /// name when that path is absolute.
    pub id: String,
}

/// The files named, folders walked, less those `filter` refuses (a
/// folder's files matched by their path from it, a named file by its
/// path as given). Licence files and tables of contents are named on
/// stderr as they are passed over; how many the patterns left out is
/// said there too. None found: an error naming the types seen and those
/// read.
pub fn list(
    files: &[PathBuf],
    filter: &ragtime_parse::FileFilter,
    prefix: &str,
) -> anyhow::Result<Vec<Listed>> {
    let mut listed = Vec::new();
    let mut left_out = 0usize;
    let mut seen_types = std::collections::BTreeSet::new();
    let mut keep = |rel: String, path: PathBuf, listed: &mut Vec<Listed>| {
        if let Some(why) = filter.passes_over(&rel) {
            eprintln!("skipped {rel}: {why}");
        } else if filter.refuses(&rel).is_some() {
            left_out += 1;
        } else {
            listed.push(Listed {
                path,
                id: format!("{prefix}{rel}"),
            });
        }
    };
    for f in files {
        if f.is_dir() {
            let mut found = Vec::new();
            walk(f, &mut found, &mut seen_types)
                .with_context(|| format!("cannot list {}", f.display()))?;
            for p in found {
                let rel = p
                    .strip_prefix(f)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .replace('\\', "/");
                keep(rel, p, &mut listed);
            }
        } else {
            let rel = if f.is_absolute() {
                f.file_name().map_or_else(
                    || f.to_string_lossy().into_owned(),
                    |n| n.to_string_lossy().into_owned(),
                )
            } else {
                f.to_string_lossy().replace('\\', "/")
            };
            keep(rel, f.clone(), &mut listed);
        }
    }
    if left_out > 0 {
        eprintln!("{left_out} files left out by --include/--exclude");
    }
    if listed.is_empty() {
        let seen = if seen_types.is_empty() {
            "no files".to_owned()
        } else {
            seen_types.into_iter().collect::<Vec<_>>().join(", ")
        };
        anyhow::bail!(
            "no file of a known type to send: found {seen}; ragtime reads {}",
            ragtime_parse::supported()
        );
    }
    Ok(listed)
}

/// A progress bar on stderr (drawn only on a terminal); `unit` follows the
/// count and may hold indicatif's keys (`{eta}`).
fn bar(len: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let template = format!("{{elapsed_precise}} {{wide_bar}} {{pos}}/{{len}} {unit} {{msg}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// Files sent in one request at most (the server's default body limit is
/// 32 MiB; multipart framing adds a little).
const REQUEST_BYTES: u64 = 24 * 1024 * 1024;

/// The server's base URL from `--server`: `http://` when it names no
/// scheme (`127.0.0.1:8080`), no trailing `/`.
fn server_url(server: &str) -> anyhow::Result<String> {
    let s = server.trim();
    let s = if s.contains("://") {
        s.to_owned()
    } else {
        format!("http://{s}")
    };
    match reqwest::Url::parse(&s) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
            Ok(s.trim_end_matches('/').to_owned())
        }
        _ => {
            anyhow::bail!("--server {server:?} is not an http(s) URL (e.g. http://127.0.0.1:8080)")
        }
    }
}

/// Why the server refused an upload, in the CLI's words: a missing or
/// wrong key names `--api-key`.
fn refusal(status: reqwest::StatusCode, body: &Value, keyed: bool) -> String {
    let message = body["error"]["message"].as_str().unwrap_or("no message");
    match (status, keyed) {
        (reqwest::StatusCode::UNAUTHORIZED, false) => {
            "the server needs an API key: pass --api-key KEY (or set RAGTIME_API_KEY)".to_owned()
        }
        (reqwest::StatusCode::UNAUTHORIZED, true) => {
            format!("the server did not accept the key given with --api-key: {message}")
        }
        _ => format!("the server refused the upload ({status}): {message}"),
    }
}

/// Sends `files` to the server at `server` as ingest jobs (one per request
/// of at most [`REQUEST_BYTES`]), then follows the jobs to their end with
/// a progress bar over their chunks. Ctrl-C cancels them (what they
/// committed stays).
pub async fn ingest_remote(
    server: &str,
    api_key: Option<&str>,
    collection: &str,
    files: &[PathBuf],
    filter: &ragtime_parse::FileFilter,
    id_prefix: &str,
) -> anyhow::Result<()> {
    let server = server_url(server)?;
    let server = server.as_str();
    let listed = list(files, filter, id_prefix)?;
    let http = reqwest::Client::new();
    let auth = |r: reqwest::RequestBuilder| match api_key {
        Some(k) => r.bearer_auth(k),
        None => r,
    };
    // Files grouped into requests under the size limit.
    let mut groups: Vec<Vec<Listed>> = vec![Vec::new()];
    let mut size = 0u64;
    for f in listed {
        let len = std::fs::metadata(&f.path)
            .with_context(|| format!("cannot read {}", f.path.display()))?
            .len();
        if size + len > REQUEST_BYTES && groups.last().is_some_and(|g| !g.is_empty()) {
            groups.push(Vec::new());
            size = 0;
        }
        size += len;
        if let Some(g) = groups.last_mut() {
            g.push(f);
        }
    }
    let mut jobs = Vec::new();
    for group in groups {
        let mut form = reqwest::multipart::Form::new()
            .text("collection", collection.to_owned())
            .text("async", "true");
        for f in &group {
            let bytes = std::fs::read(&f.path)
                .with_context(|| format!("cannot read {}", f.path.display()))?;
            let part = reqwest::multipart::Part::bytes(bytes).file_name(f.id.clone());
            form = form.part("file", part);
        }
        let resp = auth(http.post(format!("{server}/v1/documents")))
            .multipart(form)
            .send()
            .await
            .with_context(|| format!("cannot reach {server}"))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        anyhow::ensure!(
            status == reqwest::StatusCode::ACCEPTED,
            "{}",
            refusal(status, &body, api_key.is_some())
        );
        let id = body["id"]
            .as_str()
            .context("the server's answer has no job id")?;
        for s in body["skipped"].as_array().into_iter().flatten() {
            let (file, reason) = (s["id"].as_str(), s["reason"].as_str());
            eprintln!("skipped {}: {}", file.unwrap_or("?"), reason.unwrap_or("?"));
        }
        jobs.push(id.to_owned());
    }
    let bar = bar(0, "chunks");
    let t0 = std::time::Instant::now();
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    let states = loop {
        let mut states = Vec::with_capacity(jobs.len());
        for id in &jobs {
            let r = auth(http.get(format!("{server}/v1/jobs/{id}")))
                .send()
                .await
                .with_context(|| format!("cannot reach {server}"))?;
            anyhow::ensure!(r.status().is_success(), "job {id}: {}", r.status());
            states.push(r.json::<Value>().await?);
        }
        let sum = |f: &str, g: &str| {
            states
                .iter()
                .map(|j| j[f][g].as_u64().unwrap_or(0))
                .sum::<u64>()
        };
        bar.set_length(sum("chunks", "total"));
        bar.set_position(sum("chunks", "done"));
        let eta = states
            .iter()
            .filter_map(|j| j["eta_seconds"].as_f64())
            .fold(0.0, f64::max);
        bar.set_message(format!(
            "· {}/{} documents{}",
            sum("documents", "done"),
            sum("documents", "total"),
            if eta > 0.0 {
                format!(" · about {eta:.0} s to go")
            } else {
                String::new()
            }
        ));
        let active = |j: &Value| matches!(j["status"].as_str(), Some("queued" | "running"));
        if !states.iter().any(active) {
            break states;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = &mut stop => {
                bar.println("cancelling (what is committed stays)…");
                // Cancelling removes a job: its answer is its last state.
                let mut last = Vec::with_capacity(jobs.len());
                for (id, before) in jobs.iter().zip(states) {
                    let r = auth(http.delete(format!("{server}/v1/jobs/{id}"))).send().await;
                    let after = match r {
                        Ok(r) if r.status().is_success() => r.json::<Value>().await.ok(),
                        _ => None,
                    };
                    last.push(after.unwrap_or(before));
                }
                break last;
            }
        }
    };
    bar.finish_and_clear();
    let count = |f: &str| {
        states
            .iter()
            .map(|j| j[f].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let chunks: u64 = states
        .iter()
        .map(|j| j["chunks"]["done"].as_u64().unwrap_or(0))
        .sum();
    let written = count("chunks_written");
    let kept = chunks.saturating_sub(written);
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{} documents into {collection:?} on {server} ({} created, {} replaced, {} unchanged; {written} chunks embedded, {kept} unchanged) in {secs:.1} s",
        states
            .iter()
            .map(|j| j["documents"]["done"].as_u64().unwrap_or(0))
            .sum::<u64>(),
        count("created"),
        count("replaced"),
        count("unchanged"),
    );
    let failed: Vec<String> = states
        .iter()
        .filter(|j| j["status"] != "done")
        .map(|j| {
            format!(
                "job {} {}{}",
                j["id"].as_str().unwrap_or("?"),
                j["status"].as_str().unwrap_or("?"),
                j["error"]
                    .as_str()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    anyhow::ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(())
}

/// The files under `dir` that ragtime reads (by extension), in name order,
/// folders walked depth-first; hidden entries (`.git`, `.DS_Store`)
/// skipped. `types`: the extensions of the files it does not read.
fn walk(
    dir: &Path,
    out: &mut Vec<PathBuf>,
    types: &mut std::collections::BTreeSet<String>,
) -> std::io::Result<()> {
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
            walk(&p, out, types)?;
        } else if ragtime_parse::is_supported(name) {
            out.push(p);
        } else {
            types.insert(match name.rsplit_once('.') {
                Some((_, ext)) => format!(".{}", ext.to_ascii_lowercase()),
                None => "files without an extension".to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_a_scheme_is_http_and_a_bad_one_names_the_flag() {
        let ok = |s: &str| server_url(s).expect("a URL");
        assert_eq!(ok("127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(ok("http://localhost:8080/"), "http://localhost:8080");
        assert_eq!(ok("https://rag.example"), "https://rag.example");
        for bad in ["ftp://host", "", "http://"] {
            let e = server_url(bad).expect_err(bad).to_string();
            assert!(e.contains("--server"), "{e}");
        }
    }

    #[test]
    fn a_missing_key_is_named_as_the_flag() {
        let body = serde_json::json!({"error": {"message": "an api key is required"}});
        let none = refusal(reqwest::StatusCode::UNAUTHORIZED, &body, false);
        assert!(
            none.contains("--api-key") && none.contains("RAGTIME_API_KEY"),
            "{none}"
        );
        let wrong = refusal(reqwest::StatusCode::UNAUTHORIZED, &body, true);
        assert!(wrong.contains("--api-key"), "{wrong}");
        let full = refusal(reqwest::StatusCode::SERVICE_UNAVAILABLE, &body, false);
        assert!(
            full.contains("503") && full.contains("an api key is required"),
            "{full}"
        );
    }
}
