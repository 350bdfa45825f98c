use ragtime_gateway::{Application, Config};
use std::time::Duration;
use tokio::sync::oneshot;

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub stop: Option<oneshot::Sender<()>>,
    pub done: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub _data: tempfile::TempDir,
}

pub fn test_config(data: &tempfile::TempDir) -> Config {
    let mut c = Config::default();
    c.server.addr = "127.0.0.1:0".parse().expect("addr");
    c.server.shutdown_grace_s = 2;
    c.data_dir = data.path().to_owned();
    c.llm.threads = 1;
    c.llm.parallel = 1;
    c.llm.ctx_size = 1024;
    c
}

/// Starts the app with `tweak` applied to a test config.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
    let data = tempfile::tempdir().expect("tempdir");
    let mut config = test_config(&data);
    tweak(&mut config);
    let app = Application::build(config).await.expect("build app");
    let base = format!("http://127.0.0.1:{}", app.port());
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(app.run_until(async {
        let _ = rx.await;
    }));
    TestApp {
        base,
        http: reqwest::Client::new(),
        stop: Some(tx),
        done: Some(done),
        _data: data,
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Waits until `/readyz` answers 200 (models warm, store open, LLM up).
    pub async fn wait_ready(&self) -> serde_json::Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = self
                .http
                .get(self.url("/readyz"))
                .send()
                .await
                .expect("readyz");
            let status = r.status();
            let body: serde_json::Value = r.json().await.expect("readyz json");
            if status == 200 {
                return body;
            }
            assert!(std::time::Instant::now() < deadline, "never ready: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn post_json(&self, path: &str, body: serde_json::Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("post")
    }

    /// Stops the server but hands back its data folder, for a restart test.
    pub async fn shutdown_keep_data(mut self) -> tempfile::TempDir {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.done.take() {
            h.await.expect("join").expect("clean shutdown");
        }
        let placeholder = tempfile::tempdir().expect("tempdir");
        std::mem::replace(&mut self._data, placeholder)
    }

    /// Sends the shutdown signal and waits for the server to stop.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.done.take() {
            Some(h) => h.await.expect("join"),
            None => Ok(()),
        }
    }
}

/// The error body's code and field.
pub async fn error_of(r: reqwest::Response) -> (u16, String, Option<String>, serde_json::Value) {
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.expect("error body is json");
    let code = body["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let field = body["error"]["field"].as_str().map(str::to_owned);
    assert!(body["error"]["message"].is_string(), "{body}");
    (status, code, field, body)
}

/// The `document_id`s of a search response, in order.
pub fn ids(body: &serde_json::Value) -> Vec<String> {
    body["results"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| r["document_id"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}
