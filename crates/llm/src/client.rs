use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A pooled HTTP client for one OpenAI-compatible backend.
#[derive(Debug, Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    base_url: String,
    api_key: Option<String>,
    /// Whether the backend is llama.cpp's server (it streams prompt
    /// progress with `return_progress`, keeps a slot's prompt cache and
    /// samples with DRY), found out once (see [`LlmClient::check`]);
    /// unknown until then, and never assumed: other servers may refuse
    /// a field they do not know.
    llama_cpp: Arc<OnceLock<bool>>,
    /// Whether a llama.cpp backend is asked to reuse a slot's prompt
    /// prefix (`cache_prompt`).
    prompt_cache: bool,
}

impl LlmClient {
    /// `base_url` is the OpenAI-style base, ending in `/v1`
    /// (e.g. `http://127.0.0.1:8000/v1`).
    pub fn new(base_url: &str, api_key: Option<String>) -> Self {
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_default();
        Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            llama_cpp: Arc::new(OnceLock::new()),
            prompt_cache: true,
        }
    }

    /// Whether to ask a llama.cpp backend to reuse the prompt prefix its
    /// slot already read (on by default).
    pub fn with_prompt_cache(mut self, on: bool) -> Self {
        self.prompt_cache = on;
        self
    }

    pub(crate) fn prompt_cache(&self) -> bool {
        self.prompt_cache
    }

    /// Whether the backend is known to be llama.cpp's server: requests
    /// ask for prompt progress and carry its sampling fields.
    pub fn is_llama_cpp(&self) -> bool {
        self.llama_cpp.get().copied().unwrap_or(false)
    }

    /// What [`LlmClient::check`] would learn (for tests).
    #[cfg(test)]
    pub(crate) fn learned_llama_cpp(&self, llama: bool) {
        let _ = self.llama_cpp.set(llama);
    }

    /// Finds out once whether the backend is llama.cpp's server (which
    /// streams prompt progress when asked): its `GET /props` (beside
    /// `/v1`) answers with `default_generation_settings`. Any other
    /// answer means no.
    async fn learn_llama_cpp(&self) {
        if self.llama_cpp.get().is_some() {
            return;
        }
        let Some(root) = self.base_url.strip_suffix("/v1") else {
            let _ = self.llama_cpp.set(false);
            return;
        };
        let mut req = self
            .http
            .get(format!("{root}/props"))
            .timeout(Duration::from_secs(2));
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let props = match req.send().await {
            Ok(r) if r.status().is_success() => r.json::<serde_json::Value>().await.ok(),
            Ok(_) => None,
            // Unreachable: ask again at the next check.
            Err(_) => return,
        };
        let llama = props.is_some_and(|p| p.get("default_generation_settings").is_some());
        let _ = self.llama_cpp.set(llama);
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub(crate) fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }

    /// Is the backend up and serving? Asks `GET /models`, which every
    /// OpenAI-compatible server answers, and returns the model ids. The
    /// first check that reaches it also finds out whether it streams
    /// prompt progress.
    pub async fn check(&self, timeout: Duration) -> Result<Vec<String>, String> {
        let models = self.models(timeout).await;
        if models.is_ok() {
            self.learn_llama_cpp().await;
        }
        models
    }

    async fn models(&self, timeout: Duration) -> Result<Vec<String>, String> {
        let mut req = self
            .http
            .get(format!("{}/models", self.base_url))
            .timeout(timeout);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("{}: {}", self.base_url, short(&e)))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(format!("{}/models answered {status}", self.base_url));
        }
        let body: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| format!("{}/models: {}", self.base_url, short(&e)))?;
        Ok(body["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }
}

pub(crate) fn short(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection refused or unreachable".into()
    } else {
        e.to_string()
    }
}
