//! One typed test app (zero2prod's `TestApp`): [`TestApp::builder`] starts a
//! real `Application` on port 0 with its own data folder; its methods call
//! the API the way clients do.
//!
//! By default the app embeds with [`HashEmbedder`] (deterministic vectors
//! from hashed words: texts that share words are close) and answers from a
//! [`FakeLlm`]; tests that need the model's semantics ask for
//! [`Builder::real_embeddings`], tests of the real LLM for
//! [`Builder::local_llm`].

use crate::fake_llm::{Behaviour, FakeLlm};
use ragtime_gateway::{Application, Config, Overrides};
use ragtime_testkit::HashEmbedder;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The admin key of [`Builder::admin`].
pub const ADMIN_KEY: &str = "admin-key-for-the-api-tests";

type Tweak = Box<dyn FnOnce(&mut Config) + Send>;

enum Llm {
    /// A fake backend started for the app, answering with a few tokens.
    Default,
    Url(String),
    /// The supervised local llama-server with SmolLM2.
    Local,
}

pub struct Builder {
    tweaks: Vec<Tweak>,
    real_embeddings: bool,
    embed_delay: Duration,
    llm: Llm,
    data: Option<PathBuf>,
    ready: bool,
}

impl Builder {
    /// Embed with the real ONNX model (for tests of retrieval quality or
    /// the semantic cache's paraphrases).
    pub fn real_embeddings(mut self) -> Self {
        self.real_embeddings = true;
        self
    }

    /// Hash embeddings, each call taking `delay` (slow bulk embedding).
    pub fn slow_embeddings(mut self, delay: Duration) -> Self {
        self.embed_delay = delay;
        self
    }

    /// Answer from `fake`.
    pub fn llm(mut self, fake: &FakeLlm) -> Self {
        self.llm = Llm::Url(fake.base_url.clone());
        self
    }

    /// Answer from the backend at `url` (ending in `/v1`).
    pub fn llm_url(mut self, url: impl Into<String>) -> Self {
        self.llm = Llm::Url(url.into());
        self
    }

    /// Start and supervise the local llama-server.
    pub fn local_llm(mut self) -> Self {
        self.llm = Llm::Local;
        self
    }

    /// Budgets no busy machine overruns, for tests of what an answer holds
    /// rather than of its timing: a stage cut under the defaults makes the
    /// answer partial, and a partial answer is not cached.
    pub fn unhurried(self) -> Self {
        self.config(|c| {
            let b = &mut c.budgets;
            b.total_ms = 60_000;
            b.cache_ms = 1_000;
            b.embed_ms = 5_000;
            b.retrieve_ms = 5_000;
            b.rerank_ms = 5_000;
            b.llm_ttft_ms = 10_000;
            b.llm_generate_ms = 20_000;
            b.quote_ms = 5_000;
            b.verify_ms = 5_000;
        })
    }

    /// Turn the admin API on with [`ADMIN_KEY`].
    pub fn admin(self) -> Self {
        self.config(|c| c.admin_key = Some(ragtime_gateway::config::Secret::from(ADMIN_KEY)))
    }

    /// Change the configuration (applied in order, after the test defaults).
    pub fn config(mut self, f: impl FnOnce(&mut Config) + Send + 'static) -> Self {
        self.tweaks.push(Box::new(f));
        self
    }

    /// Search inside the PostgreSQL database at `url`
    /// (`retrieval.engine = "postgres"`).
    pub fn searching_in(self, url: &str) -> Self {
        let url = url.to_owned();
        self.config(move |c| {
            c.database_url = Some(ragtime_gateway::config::Secret::from(url));
            c.retrieval.engine = ragtime_gateway::config::Engine::Postgres;
        })
    }

    /// Use this data folder (a restart test's earlier one).
    pub fn data_dir(mut self, dir: &Path) -> Self {
        self.data = Some(dir.to_owned());
        self
    }

    /// Return as soon as the app listens, before `/readyz` says ready.
    pub fn not_ready(mut self) -> Self {
        self.ready = false;
        self
    }

    pub async fn spawn(self) -> TestApp {
        let data = tempfile::tempdir().expect("tempdir");
        let mut c = Config::default();
        c.server.addr = "127.0.0.1:0".parse().expect("addr");
        c.server.shutdown_grace_s = 2;
        c.data_dir = self.data.clone().unwrap_or_else(|| data.path().to_owned());
        c.llm.threads = 1;
        c.llm.parallel = 1;
        c.llm.ctx_size = 1024;
        let fake = match self.llm {
            Llm::Default => {
                let f = FakeLlm::start(Behaviour::Answer {
                    tokens: 3,
                    gap: Duration::from_millis(1),
                })
                .await;
                c.llm.base_url = Some(f.base_url.clone());
                Some(f)
            }
            Llm::Url(url) => {
                c.llm.base_url = Some(url);
                None
            }
            Llm::Local => None,
        };
        for t in self.tweaks {
            t(&mut c);
        }
        let mut overrides = Overrides::default();
        if !self.real_embeddings {
            overrides.embedder = Some(Arc::new(
                HashEmbedder::new(384).with_delay(self.embed_delay),
            ));
        }
        let app = Application::build_with(c, overrides)
            .await
            .expect("build app");
        let base = format!("http://127.0.0.1:{}", app.port());
        let (tx, rx) = oneshot::channel::<()>();
        let done = tokio::spawn(app.run_until(async {
            let _ = rx.await;
        }));
        let app = TestApp {
            base,
            http: reqwest::Client::new(),
            stop: Some(tx),
            done: Some(done),
            data,
            data_dir: self.data,
            _fake: fake,
        };
        if self.ready {
            app.wait_ready().await;
        }
        app
    }
}

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    data: tempfile::TempDir,
    data_dir: Option<PathBuf>,
    _fake: Option<FakeLlm>,
}

/// A streamed chat: its chunks, whether `[DONE]` came, and how long it took.
pub struct Streamed {
    pub chunks: Vec<Value>,
    pub done: bool,
    pub elapsed: Duration,
}

impl TestApp {
    pub fn builder() -> Builder {
        Builder {
            tweaks: Vec::new(),
            real_embeddings: false,
            embed_delay: Duration::ZERO,
            llm: Llm::Default,
            data: None,
            ready: true,
        }
    }

    /// A ready app with the defaults.
    pub async fn spawn() -> TestApp {
        Self::builder().spawn().await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The data folder (SQLite database and files).
    pub fn data_dir(&self) -> &Path {
        self.data_dir.as_deref().unwrap_or(self.data.path())
    }

    /// Waits until `/readyz` answers 200 (models warm, store open, LLM up).
    pub async fn wait_ready(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.get("/readyz").await;
            let status = r.status();
            let body: Value = r.json().await.expect("readyz json");
            if status == 200 {
                return body;
            }
            assert!(Instant::now() < deadline, "never ready: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.expect("get")
    }

    pub async fn post_json(&self, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("post")
    }

    /// `POST /v1/documents`, which must succeed.
    pub async fn ingest(&self, body: Value) -> Value {
        ok(self.post_json("/v1/documents", body).await).await
    }

    /// `POST /v1/search`, which must succeed.
    pub async fn search(&self, body: Value) -> Value {
        ok(self.post_json("/v1/search", body).await).await
    }

    /// `POST /v1/chat/completions` (not streamed), which must succeed.
    pub async fn chat(&self, body: Value) -> Value {
        ok(self.post_json("/v1/chat/completions", body).await).await
    }

    /// `POST /v1/chat/completions` streamed, read to its end.
    pub async fn chat_stream(&self, mut body: Value) -> Streamed {
        body["stream"] = Value::Bool(true);
        let t = Instant::now();
        let mut r = self.post_json("/v1/chat/completions", body).await;
        assert_eq!(r.status(), 200);
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok());
        assert_eq!(ct, Some("text/event-stream"));
        let mut buf = String::new();
        while let Some(bytes) = r.chunk().await.expect("chunk") {
            buf.push_str(&String::from_utf8_lossy(&bytes));
        }
        let elapsed = t.elapsed();
        let mut chunks = Vec::new();
        let mut done = false;
        // Keep-alive comments (": …") carry nothing.
        for frame in buf
            .split("\n\n")
            .filter(|f| !f.trim().is_empty() && !f.starts_with(':'))
        {
            let data = frame.strip_prefix("data: ").expect("data frame");
            if data == "[DONE]" {
                done = true;
            } else {
                assert!(!done, "a chunk after [DONE]");
                chunks.push(serde_json::from_str(data).expect("chunk json"));
            }
        }
        Streamed {
            chunks,
            done,
            elapsed,
        }
    }

    /// An `/admin` request with [`ADMIN_KEY`].
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        let mut r = self
            .http
            .request(method, self.url(path))
            .bearer_auth(ADMIN_KEY);
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send().await.expect("admin request")
    }

    /// Stops the server but hands back its data folder, for a restart test.
    pub async fn shutdown_keep_data(mut self) -> tempfile::TempDir {
        self.stop_now().await.expect("clean shutdown");
        let placeholder = tempfile::tempdir().expect("tempdir");
        std::mem::replace(&mut self.data, placeholder)
    }

    /// Sends the shutdown signal and waits for the server to stop.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.stop_now().await
    }

    async fn stop_now(&mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.done.take() {
            Some(h) => h.await.expect("join"),
            None => Ok(()),
        }
    }
}

/// The body of a response that must be a 200.
async fn ok(r: reqwest::Response) -> Value {
    let status = r.status();
    let body: Value = r.json().await.expect("json body");
    assert_eq!(status, 200, "{body}");
    body
}

/// The error body's code and field.
pub async fn error_of(r: reqwest::Response) -> (u16, String, Option<String>, Value) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.expect("error body is json");
    let code = body["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let field = body["error"]["field"].as_str().map(str::to_owned);
    assert!(body["error"]["message"].is_string(), "{body}");
    (status, code, field, body)
}

/// The `document_id`s of a search response, in order.
pub fn ids(body: &Value) -> Vec<String> {
    body["results"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| r["document_id"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A stage's line of a budget report (`Null` when absent).
pub fn stage<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["budget"]["stages"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["stage"] == name))
        .unwrap_or(&Value::Null)
}

#[allow(unused_imports)] // not every test binary that includes this file uses it
pub use ragtime_testkit::PgDatabase;
