//! The real llama-server built by `make setup`, with SmolLM2-135M.

use ragtime_llm::{LlmClient, LocalServer, LocalServerOptions};
use std::path::PathBuf;
use std::time::Duration;

fn cache() -> PathBuf {
    std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        })
}

fn opts() -> LocalServerOptions {
    LocalServerOptions {
        binary: cache().join("bin/llama-server"),
        model: cache().join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        alias: "smollm2-test".into(),
        ctx_size: 2048,
        threads: 1,
        parallel: 1,
        batch_size: 256,
        port: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_starts_the_server_and_restarts_it_when_it_dies() {
    let server = LocalServer::start(opts()).expect("start");
    assert!(
        server.wait_healthy(Duration::from_secs(60)).await,
        "llama-server never became healthy"
    );
    let client = LlmClient::new(&server.base_url(), None);
    let models = client.check(Duration::from_secs(2)).await.expect("models");
    assert!(models.iter().any(|m| m == "smollm2-test"), "{models:?}");

    // Kill it behind the supervisor's back: it comes back on its own.
    let pid = server.pid();
    assert!(pid > 0);
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
    assert!(killed.is_ok_and(|s| s.success()));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while server.restarts() == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.restarts(), 1);
    assert!(
        server.wait_healthy(Duration::from_secs(60)).await,
        "not healthy after restart"
    );
    assert_ne!(server.pid(), pid);
    client
        .check(Duration::from_secs(2))
        .await
        .expect("models after restart");

    let port_url = server.base_url();
    server.shutdown().await;
    assert!(
        LlmClient::new(&port_url, None)
            .check(Duration::from_millis(500))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn missing_files_are_named() {
    let mut o = opts();
    o.model = PathBuf::from("/nonexistent/model.gguf");
    let e = LocalServer::start(o).err().unwrap_or_default();
    assert!(
        e.contains("/nonexistent/model.gguf") && e.contains("make setup"),
        "{e}"
    );
}

#[tokio::test]
async fn an_unreachable_backend_fails_the_check_quickly() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(1);
    let t0 = std::time::Instant::now();
    let e = LlmClient::new(&format!("http://127.0.0.1:{port}/v1"), None)
        .check(Duration::from_millis(500))
        .await
        .err()
        .unwrap_or_default();
    assert!(e.contains("unreachable") || e.contains("refused"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2));
}
