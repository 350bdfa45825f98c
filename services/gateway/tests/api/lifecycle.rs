use crate::helpers::TestApp;
use std::time::Duration;

/// Shutdown drains, stops the supervised llama-server and returns cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_stops_the_server_and_the_local_llm() {
    let app = TestApp::builder()
        .local_llm()
        .admin()
        .not_ready()
        .spawn()
        .await;
    app.wait_ready().await;
    // Where the backend is: the admin's to read.
    let ready: serde_json::Value = app
        .admin(reqwest::Method::GET, "/readyz", None)
        .await
        .json()
        .await
        .expect("readyz");
    let llm = ready["checks"]["llm"]["base_url"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let base = app.base.clone();
    let t0 = std::time::Instant::now();
    app.shutdown().await.expect("clean shutdown");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let http = reqwest::Client::new();
    assert!(
        http.get(format!("{base}/healthz")).send().await.is_err(),
        "still serving"
    );
    let models = http
        .get(format!("{llm}/models"))
        .timeout(Duration::from_secs(1))
        .send()
        .await;
    assert!(models.is_err(), "llama-server outlived the gateway");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_lives_in_the_data_dir() {
    let app = TestApp::spawn().await;
    assert!(app.data_dir().join("ragtime.db").is_file());
}
