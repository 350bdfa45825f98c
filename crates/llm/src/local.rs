//! Starts llama.cpp's `llama-server`, waits for its `/health`, and restarts it
//! whenever it dies, until shut down.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct LocalServerOptions {
    /// The `llama-server` binary.
    pub binary: PathBuf,
    /// The GGUF model file.
    pub model: PathBuf,
    /// The name the model is served under (`GET /v1/models`).
    pub alias: String,
    /// Context window in tokens.
    pub ctx_size: u32,
    /// CPU threads for generation.
    pub threads: u32,
    /// Concurrent sequences (server slots).
    pub parallel: u32,
    /// Prompt tokens read in one step (`--batch-size`). The server reports
    /// its prompt progress once a step: smaller steps tell sooner how fast
    /// a prompt is being read (its default, 2,048, reports a prompt of
    /// fewer tokens only when it is done).
    pub batch_size: u32,
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
}

struct Shared {
    healthy: AtomicBool,
    restarts: AtomicU32,
    pid: AtomicU32,
}

/// A supervised `llama-server`. Dropping it (or [`LocalServer::shutdown`])
/// stops the process.
pub struct LocalServer {
    port: u16,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

impl LocalServer {
    /// Checks the files, starts the process and its supervisor. Returns at
    /// once; [`LocalServer::wait_healthy`] waits for the model to load.
    pub fn start(opts: LocalServerOptions) -> Result<Self, String> {
        for (what, p) in [
            ("llama-server binary", &opts.binary),
            ("LLM model", &opts.model),
        ] {
            if !p.is_file() {
                return Err(format!(
                    "{what} not found at {} (run `make setup`)",
                    p.display()
                ));
            }
        }
        let port = if opts.port == 0 {
            free_port().map_err(|e| format!("no free port for llama-server: {e}"))?
        } else {
            opts.port
        };
        let shared = Arc::new(Shared {
            healthy: AtomicBool::new(false),
            restarts: AtomicU32::new(0),
            pid: AtomicU32::new(0),
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(supervise(opts, port, shared.clone(), stop_rx));
        Ok(Self {
            port,
            shared,
            stop,
            task: Some(task),
        })
    }

    /// OpenAI-style base URL of the server (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub fn is_healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Acquire)
    }

    /// How many times the server was restarted after dying.
    pub fn restarts(&self) -> u32 {
        self.shared.restarts.load(Ordering::Acquire)
    }

    /// Process id of the running server (0 when none).
    pub fn pid(&self) -> u32 {
        self.shared.pid.load(Ordering::Acquire)
    }

    /// Waits until `/health` answers 200, up to `timeout`.
    pub async fn wait_healthy(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            if self.is_healthy() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.is_healthy()
    }

    /// Stops the supervisor and the server, and waits for both.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn spawn(opts: &LocalServerOptions, port: u16) -> std::io::Result<Child> {
    let mut cmd = Command::new(&opts.binary);
    cmd.arg("--model")
        .arg(&opts.model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--alias", &opts.alias])
        .args(["--ctx-size", &opts.ctx_size.to_string()])
        .args(["--threads", &opts.threads.to_string()])
        .args(["--parallel", &opts.parallel.to_string()])
        .args(["--batch-size", &opts.batch_size.to_string()])
        .arg("--no-webui")
        .args(["--log-verbosity", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd.spawn()
}

async fn health(http: &reqwest::Client, port: u16) -> bool {
    http.get(format!("http://127.0.0.1:{port}/health"))
        .timeout(Duration::from_millis(500))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

async fn supervise(
    opts: LocalServerOptions,
    port: u16,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let http = reqwest::Client::new();
    let mut backoff = Duration::from_millis(200);
    loop {
        let mut child = match spawn(&opts, port) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, binary = %opts.binary.display(), "cannot start llama-server");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        shared.pid.store(child.id().unwrap_or(0), Ordering::Release);
        tracing::info!(port, pid = child.id(), model = %opts.model.display(), "llama-server started");
        let mut probe = tokio::time::interval(Duration::from_millis(100));
        let exit = loop {
            tokio::select! {
                status = child.wait() => break Some(status),
                _ = stop.changed() => break None,
                _ = probe.tick() => {
                    let ok = health(&http, port).await;
                    if ok && !shared.healthy.swap(true, Ordering::AcqRel) {
                        tracing::info!(port, "llama-server is healthy");
                        backoff = Duration::from_millis(200);
                        probe = tokio::time::interval(Duration::from_secs(2));
                    } else if !ok {
                        shared.healthy.store(false, Ordering::Release);
                    }
                }
            }
        };
        shared.healthy.store(false, Ordering::Release);
        shared.pid.store(0, Ordering::Release);
        match exit {
            None => {
                let _ = child.kill().await;
                tracing::info!("llama-server stopped");
                return;
            }
            Some(status) => {
                shared.restarts.fetch_add(1, Ordering::AcqRel);
                tracing::warn!(
                    ?status,
                    retry_in_ms = backoff.as_millis() as u64,
                    "llama-server exited; restarting"
                );
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}
