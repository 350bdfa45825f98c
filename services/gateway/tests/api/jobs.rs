//! Ingest jobs: `"async": true` (or a large ingest) answers 202 with a job;
//! `GET /v1/jobs/{id}` follows its progress to its end; `DELETE` stops it
//! at its next batch, keeping what it committed whole; a job belongs to
//! its tenant; a replica holds a bounded number of them.

use crate::helpers::{TestApp, error_of};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn docs(n: usize, words: &str) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"id": format!("d{i}"), "text": format!("Document {i} token{i} {words}.")}))
        .collect()
}

async fn job(app: &TestApp, id: &str) -> Value {
    let r = app.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(r.status(), 200);
    r.json().await.expect("job json")
}

/// Polls the job until `until` holds of it (at most `within`).
async fn wait_job(
    app: &TestApp,
    id: &str,
    within: Duration,
    mut until: impl FnMut(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let j = job(app, id).await;
        if until(&j) {
            return j;
        }
        assert!(Instant::now() < deadline, "job never got there: {j}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `POST /v1/documents`, which must answer a job (202); the job.
async fn submit(app: &TestApp, body: Value) -> Value {
    let r = app.post_json("/v1/documents", body).await;
    assert_eq!(r.status(), 202);
    r.json().await.expect("job json")
}

fn id_of(job: &Value) -> String {
    job["id"].as_str().expect("job id").to_owned()
}

fn ended(j: &Value) -> bool {
    !matches!(j["status"].as_str(), Some("queued" | "running"))
}

/// A job of a few long documents moves in steps of at most 128 chunks,
/// not in one jump at the end: a folder of long pages shows its progress
/// and a time to go while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_of_few_long_documents_moves_in_steps() {
    let app = TestApp::builder()
        .slow_embeddings(Duration::from_millis(150))
        .spawn()
        .await;
    let long = |i: usize| {
        let text: Vec<String> = (0..3000).map(|j| format!("word{j} of page {i}.")).collect();
        json!({"id": format!("page{i}"), "text": text.join(" ")})
    };
    let created = submit(
        &app,
        json!({"collection": "long", "async": true, "documents": (0..4).map(long).collect::<Vec<_>>()}),
    )
    .await;
    let id = id_of(&created);
    let total = created["chunks"]["total"].as_i64().unwrap_or(0);
    assert!(total > 4 * 128 / 2, "long pages: {created}");
    let mut eta = false;
    let done = wait_job(&app, &id, Duration::from_secs(120), |j| {
        let done = j["chunks"]["done"].as_i64().unwrap_or(0);
        if j["status"] == "running" && done > 0 && done < total {
            eta |= j["eta_seconds"].as_f64().is_some();
        }
        ended(j)
    })
    .await;
    assert_eq!(done["status"], "done", "{done}");
    // Seen part way, with a time to go, at least once (4 steps of ~1 s).
    assert!(eta, "no progress seen between 0 and {total} chunks");
    assert_eq!(done["chunks"]["done"], total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_ingest_is_a_job_whose_progress_reaches_done() {
    let app = TestApp::builder()
        .slow_embeddings(Duration::from_millis(150))
        .spawn()
        .await;
    let r = app
        .post_json(
            "/v1/documents",
            json!({"collection": "bulk", "async": true, "documents": docs(200, "about glaciers")}),
        )
        .await;
    assert_eq!(r.status(), 202);
    let location = r.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    let created: Value = r.json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    assert_eq!(location, format!("/v1/jobs/{id}"));
    assert_eq!(created["collection"], "bulk");
    assert_eq!(created["documents"], json!({"done": 0, "total": 200}));
    assert!(
        created["chunks"]["total"].as_i64() >= Some(200),
        "{created}"
    );

    // Part way: progress moves in whole batches and has an estimate.
    let mid = wait_job(&app, &id, Duration::from_secs(30), |j| {
        j["documents"]["done"].as_i64().unwrap_or(0) > 0
    })
    .await;
    if mid["status"] == "running" {
        let n = mid["documents"]["done"].as_i64().unwrap_or(0);
        assert!(n % 32 == 0 || n == 200, "whole batches: {mid}");
        assert!(mid["eta_seconds"].as_f64().is_some(), "{mid}");
    }
    let done = wait_job(&app, &id, Duration::from_secs(60), ended).await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["documents"], json!({"done": 200, "total": 200}));
    assert_eq!(done["chunks"]["done"], done["chunks"]["total"]);
    assert_eq!(
        (done["created"].as_i64(), done["unchanged"].as_i64()),
        (Some(200), Some(0))
    );
    assert!(done["eta_seconds"].is_null() && done["finished_ms"].as_i64().is_some());
    let found = app
        .search(json!({"collection": "bulk", "query": "token199", "mode": "lexical"}))
        .await;
    assert_eq!(found["results"][0]["document_id"], "d199", "{found}");

    // The same upload again: every document unchanged.
    let again = submit(
        &app,
        json!({"collection": "bulk", "async": true, "documents": docs(200, "about glaciers")}),
    )
    .await;
    let again = wait_job(&app, &id_of(&again), Duration::from_secs(30), ended).await;
    assert_eq!(
        (again["status"].as_str(), again["unchanged"].as_i64()),
        (Some("done"), Some(200))
    );

    let listed: Value = app
        .get("/v1/jobs?limit=5")
        .await
        .json()
        .await
        .expect("json");
    let ids: Vec<&str> = listed["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["id"].as_str())
        .collect();
    assert_eq!(ids, [again["id"].as_str().unwrap_or_default(), id.as_str()]);
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_ingests_become_jobs_without_asking() {
    let app = TestApp::builder()
        .config(|c| c.limits.job_above_bytes = 4096)
        .spawn()
        .await;
    // Small: answered at once.
    let r = app
        .post_json("/v1/documents", json!({"documents": docs(3, "small")}))
        .await;
    assert_eq!(r.status(), 200);
    // Over the text threshold.
    let big = "word ".repeat(1000);
    let r = app
        .post_json(
            "/v1/documents",
            json!({"documents": [{"id": "big", "text": big}]}),
        )
        .await;
    assert_eq!(r.status(), 202);
    // Over 1,000 documents.
    let j = submit(&app, json!({"documents": docs(1001, "many")})).await;
    let j = wait_job(&app, &id_of(&j), Duration::from_secs(60), ended).await;
    assert_eq!(
        (j["status"].as_str(), j["documents"]["done"].as_i64()),
        (Some("done"), Some(1001))
    );
    let d = app.get("/v1/documents/d1000").await;
    assert_eq!(d.status(), 200);
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_stops_at_its_next_batch_and_keeps_whole_documents() {
    let app = TestApp::builder()
        .slow_embeddings(Duration::from_millis(100))
        .spawn()
        .await;
    let id = id_of(
        &submit(
            &app,
            json!({"collection": "c", "async": true, "documents": docs(2000, "to cancel")}),
        )
        .await,
    );
    wait_job(&app, &id, Duration::from_secs(30), |j| {
        j["documents"]["done"].as_i64().unwrap_or(0) >= 64
    })
    .await;
    let r = app
        .http
        .delete(app.url(&format!("/v1/jobs/{id}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 200);
    let j: Value = r.json().await.expect("json");
    assert_eq!(j["status"], "cancelled", "{j}");
    assert_eq!(j["cancel_requested"], true);
    let done = j["documents"]["done"].as_i64().expect("done");
    assert!((64..2000).contains(&done), "{j}");
    // Removed with the cancel; nothing moves after it, and what it
    // counted is stored, and only that.
    let (status, _, _, _) = error_of(app.get(&format!("/v1/jobs/{id}")).await).await;
    assert_eq!(status, 404);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let coll: Value = app
        .get("/v1/collections/c")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(coll["documents"].as_i64(), Some(done), "{coll}");
    let last = app
        .get(&format!("/v1/documents/d{}?collection=c", done - 1))
        .await;
    assert_eq!(last.status(), 200);
    let next = app
        .get(&format!("/v1/documents/d{done}?collection=c"))
        .await;
    assert_eq!(next.status(), 404);
    let r = app
        .http
        .delete(app.url(&format!("/v1/jobs/{id}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 404);
    // Deleting an ended job removes it and answers it as it ended.
    let r = app
        .post_json(
            "/v1/documents",
            json!({"collection": "c", "async": true, "documents": docs(3, "small")}),
        )
        .await;
    let small = r.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    wait_job(&app, &small, Duration::from_secs(30), ended).await;
    let gone: Value = app
        .http
        .delete(app.url(&format!("/v1/jobs/{small}")))
        .send()
        .await
        .expect("delete")
        .json()
        .await
        .expect("json");
    assert_eq!(
        (gone["status"].as_str(), gone["documents"]["done"].as_i64()),
        (Some("done"), Some(3))
    );
    assert_eq!(app.get(&format!("/v1/jobs/{small}")).await.status(), 404);
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_bounded_and_belong_to_their_tenant() {
    let app = TestApp::builder()
        .slow_embeddings(Duration::from_millis(100))
        .admin()
        .config(|c| {
            c.limits.max_jobs = 1;
            c.limits.max_concurrent_ingests = 1;
        })
        .spawn()
        .await;
    let id = id_of(&submit(&app, json!({"async": true, "documents": docs(400, "slow")})).await);
    // A second job past limits.max_jobs: refused, nothing recorded.
    let r = app
        .post_json(
            "/v1/documents",
            json!({"async": true, "documents": [{"id": "x", "text": "refused"}]}),
        )
        .await;
    assert!(r.headers().contains_key("retry-after"));
    let (status, code, _, body) = error_of(r).await;
    assert_eq!((status, code.as_str()), (503, "overloaded"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("limits.max_jobs")),
        "{body}"
    );
    // Another tenant cannot see or cancel it.
    let key: Value = app
        .admin(
            reqwest::Method::POST,
            "/admin/keys",
            Some(json!({"tenant": "other", "name": "k"})),
        )
        .await
        .json()
        .await
        .expect("json");
    let key = key["key"].as_str().expect("key");
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let r = app
            .http
            .request(method, app.url(&format!("/v1/jobs/{id}")))
            .bearer_auth(key)
            .send()
            .await
            .expect("request");
        let (status, code, _, _) = error_of(r).await;
        assert_eq!((status, code.as_str()), (404, "not_found"));
    }
    let theirs: Value = app
        .http
        .get(app.url("/v1/jobs"))
        .bearer_auth(key)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(theirs["jobs"], json!([]));
    assert_eq!(job(&app, &id).await["cancel_requested"], false);
    // Bad input names its field.
    let (status, _, field, _) = error_of(app.get("/v1/jobs?limit=0").await).await;
    assert_eq!((status, field.as_deref()), (422, Some("limit")));
    let (status, code, _, _) = error_of(app.get("/v1/jobs/job_nope").await).await;
    assert_eq!((status, code.as_str()), (404, "not_found"));
    let form = reqwest::multipart::Form::new().text("async", "maybe").part(
        "file",
        reqwest::multipart::Part::bytes(b"text".to_vec()).file_name("a.txt"),
    );
    let r = app
        .http
        .post(app.url("/v1/documents"))
        .multipart(form)
        .send()
        .await
        .expect("post");
    let (status, _, field, _) = error_of(r).await;
    assert_eq!((status, field.as_deref()), (422, Some("async")));
    app.shutdown().await.expect("shutdown");
}

/// `ragtime serve` as its own process (so it can be killed), on `data`.
struct Server {
    child: std::process::Child,
    base: String,
}

impl Server {
    /// Started with `env` (configuration) over the defaults.
    async fn start_with(data: &std::path::Path, llm: &str, env: &[(&str, &str)]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_ragtime"))
            .arg("serve")
            .env("RAGTIME__SERVER__ADDR", format!("127.0.0.1:{port}"))
            .env("RAGTIME__DATA_DIR", data)
            .env("RAGTIME__LLM__BASE_URL", llm)
            .env("RUST_LOG", "warn")
            .env_remove("RAGTIME__DATABASE_URL")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start ragtime serve");
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        let http = reqwest::Client::new();
        loop {
            if let Ok(r) = http.get(format!("{}/readyz", server.base)).send().await
                && r.status() == 200
            {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "ragtime serve never became ready"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = reqwest::get(format!("{}{path}", self.base))
            .await
            .expect("get");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("post");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn wait_job(&self, id: &str, within: Duration, until: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let (status, j) = self.get(&format!("/v1/jobs/{id}")).await;
            assert_eq!(status, 200, "{j}");
            if until(&j) {
                return j;
            }
            assert!(Instant::now() < deadline, "job never got there: {j}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_killed_mid_way_keeps_every_counted_document_whole_and_searchable() {
    killed_mid_way(&[]).await;
}

/// The same with the collection's indexes saved every second while the
/// job writes: the kill lands among BM25 commits on disk and snapshot
/// saves, and the next start opens the newest snapshot and replays the
/// change log after it — exactly what the store acknowledged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_amid_index_commits_and_saves_the_next_start_serves_exactly_the_store() {
    killed_mid_way(&[
        ("RAGTIME__SNAPSHOTS__MIN_CHUNKS", "1"),
        ("RAGTIME__SNAPSHOTS__EVERY_S", "1"),
        ("RAGTIME__ADMIN_KEY", ADMIN_KEY),
    ])
    .await;
}

const ADMIN_KEY: &str = "kill-test-admin-key-0123";

/// A lexical search for document `i`'s marker word.
async fn marker_search(server: &Server, i: i64) -> Value {
    let (status, found) = server
        .post(
            "/v1/search",
            &json!({"collection": "crash", "query": format!("marker{i}x"), "mode": "lexical"}),
        )
        .await;
    assert_eq!(status, 200, "{found}");
    found
}

async fn killed_mid_way(env: &[(&str, &str)]) {
    let fake = crate::fake_llm::FakeLlm::start(crate::fake_llm::Behaviour::Answer {
        tokens: 3,
        gap: Duration::from_millis(1),
    })
    .await;
    let data = tempfile::tempdir().expect("tempdir");
    let n = 600usize;
    // Each about 200 tokens: two chunks.
    let filler = "Sediment settles slowly where the river meets the sea. ".repeat(18);
    let upload = json!({
        "collection": "crash",
        "async": true,
        "documents": (0..n)
            .map(|i| json!({"id": format!("d{i}"), "text": format!("Record {i} marker{i}x. {filler}")}))
            .collect::<Vec<_>>(),
    });
    let mut server = Server::start_with(data.path(), &fake.base_url, env).await;
    let (status, created) = server.post("/v1/documents", &upload).await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let total_chunks = created["chunks"]["total"].as_i64().expect("chunks");
    assert_eq!(
        total_chunks % n as i64,
        0,
        "every document alike: {created}"
    );
    let per_document = total_chunks / n as i64;
    assert!(per_document >= 2, "{created}");
    server
        .wait_job(&id, Duration::from_secs(120), |j| {
            j["documents"]["done"].as_i64().unwrap_or(0) >= 64
        })
        .await;
    let saving = env.iter().any(|(k, _)| k.contains("SNAPSHOTS"));
    if saving {
        let t = Instant::now();
        while crate::snapshots::records(data.path()).is_empty() {
            assert!(t.elapsed() < Duration::from_secs(30), "no snapshot saved");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    server.child.kill().expect("SIGKILL");
    let _ = server.child.wait();
    drop(server);
    let workspaces = || -> Vec<String> {
        std::fs::read_dir(data.path().join("indexes"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("work-"))
            .collect()
    };
    let dead = workspaces();
    assert_eq!(dead.len(), 1, "the killed run's BM25 indexes: {dead:?}");

    let server = Server::start_with(data.path(), &fake.base_url, env).await;
    let live = workspaces();
    assert!(
        live.len() == 1 && live != dead,
        "the dead run's workspace is removed, never read: {dead:?} then {live:?}"
    );
    if saving {
        let stats: Value = reqwest::Client::new()
            .get(format!("{}/admin/stats", server.base))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .expect("stats")
            .json()
            .await
            .expect("json");
        assert_eq!(
            stats["collections"]["loaded_from_snapshots"], 1,
            "opened from the snapshot saved before the kill: {stats}"
        );
    }
    // Nobody beats for it any more: it reads as interrupted, and says how
    // far it got.
    let j = server
        .wait_job(&id, Duration::from_secs(30), |j| {
            j["status"] == "interrupted"
        })
        .await;
    let done = j["documents"]["done"].as_i64().expect("done");
    assert!((64..n as i64).contains(&done), "{j}");
    assert_eq!(
        j["chunks"]["done"].as_i64(),
        Some(done * per_document),
        "{j}"
    );
    // Exactly what it counted is stored, every document whole.
    let (_, coll) = server.get("/v1/collections/crash").await;
    assert_eq!(
        (coll["documents"].as_i64(), coll["chunks"].as_i64()),
        (Some(done), Some(done * per_document)),
        "{coll}"
    );
    for i in [0, done / 2, done - 1] {
        let (status, d) = server
            .get(&format!("/v1/documents/d{i}?collection=crash"))
            .await;
        assert_eq!(status, 200, "d{i}");
        assert_eq!(
            d["chunks"].as_array().map(Vec::len),
            Some(per_document as usize),
            "d{i}"
        );
        let found = marker_search(&server, i).await;
        assert_eq!(
            found["results"][0]["document_id"],
            format!("d{i}"),
            "{found}"
        );
    }
    let (status, _) = server
        .get(&format!("/v1/documents/d{done}?collection=crash"))
        .await;
    assert_eq!(status, 404);
    // And nothing past it is found (no index holds what the store lost).
    for i in [done, done + 1, n as i64 - 1] {
        let found = marker_search(&server, i).await;
        assert!(
            found["results"]
                .as_array()
                .is_some_and(|r| r.iter().all(|h| h["document_id"] != format!("d{i}"))),
            "d{i} was never stored: {found}"
        );
    }
    // The same upload again finishes the rest and re-embeds nothing done.
    let (status, again) = server.post("/v1/documents", &upload).await;
    assert_eq!(status, 202, "{again}");
    let again = server
        .wait_job(
            again["id"].as_str().expect("id"),
            Duration::from_secs(300),
            ended,
        )
        .await;
    assert_eq!(again["status"], "done", "{again}");
    assert_eq!(
        (again["unchanged"].as_i64(), again["created"].as_i64()),
        (Some(done), Some(n as i64 - done)),
        "{again}"
    );
}

/// Runs the `ragtime` binary with `args` in `cwd` (a folder of the
/// test's, not the checkout), without the caller's server or key.
async fn ragtime(args: Vec<String>, cwd: std::path::PathBuf) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ragtime"))
            .args(args)
            .current_dir(cwd)
            .env_remove("RAGTIME_SERVER")
            .env_remove("RAGTIME_API_KEY")
            .output()
            .expect("run ragtime")
    })
    .await
    .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ragtime_ingest_with_a_server_sends_jobs_and_follows_them_to_the_end() {
    let app = TestApp::builder()
        .slow_embeddings(Duration::from_millis(20))
        .spawn()
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let notes = dir.path().join("notes");
    std::fs::create_dir_all(&notes).expect("mkdir");
    for i in 0..40 {
        std::fs::write(
            notes.join(format!("n{i:02}.md")),
            format!("# Note {i}\n\nThe kiln{i} fires clay at high heat."),
        )
        .expect("write");
    }
    let server = app.url("");
    let args = |server: &str| -> Vec<String> {
        ["ingest", "--server", server, "--collection", "pottery"]
            .iter()
            .map(|a| (*a).to_owned())
            .chain([notes.display().to_string()])
            .collect()
    };
    let out = ragtime(args(&server), dir.path().to_owned()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("40 documents into \"pottery\"")
            && stdout
                .contains("(40 created, 0 replaced, 0 unchanged; 40 chunks embedded, 0 unchanged)"),
        "{stdout}"
    );
    let found = app
        .search(json!({"collection": "pottery", "query": "kiln17", "mode": "lexical"}))
        .await;
    let first = found["results"][0]["document_id"]
        .as_str()
        .unwrap_or_default();
    assert!(first.ends_with("n17.md"), "{found}");
    // Sent again, from another folder, the server named without a scheme
    // (`127.0.0.1:8080` means http): nothing re-embedded, nothing written
    // where it ran.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let bare = server.trim_start_matches("http://");
    let out = ragtime(args(bare), elsewhere.path().to_owned()).await;
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("(0 created, 0 replaced, 40 unchanged; 0 chunks embedded, 40 unchanged)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_dir(elsewhere.path()).map_or(1, |d| d.count());
    assert_eq!(written, 0);
    // Patterns leave files out before they are sent; the server says
    // which it skipped (a page that only redirects) and the command prints it.
    std::fs::write(
        notes.join("old.html"),
        "<head><meta http-equiv=refresh content=\"0; url=n00.md\"></head><p>Moved.</p>",
    )
    .expect("write");
    let mut filtered = args(&server);
    filtered.splice(1..1, ["--exclude".to_owned(), "n1?.md".to_owned()]);
    let out = ragtime(filtered, dir.path().to_owned()).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("10 files left out by --include/--exclude"),
        "{stderr}"
    );
    assert!(
        stderr.contains("old.html: only redirects to n00.md"),
        "{stderr}"
    );
    assert!(
        stdout.contains("(0 created, 0 replaced, 30 unchanged"),
        "{stdout}"
    );
    // A server that is not there: a clear failure.
    let file = notes.join("n00.md").display().to_string();
    let gone = vec![
        "ingest".into(),
        "--server".into(),
        "http://127.0.0.1:9".into(),
        file,
    ];
    let out = ragtime(gone, dir.path().to_owned()).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach http://127.0.0.1:9"),
        "{stderr}"
    );
    app.shutdown().await.expect("shutdown");
}

/// A collection removed under its jobs — one running, one queued behind
/// it — ends both as failed naming the collection; neither makes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_removed_under_its_jobs_is_not_made_again() {
    let app = TestApp::builder()
        .slow_embeddings(Duration::from_millis(100))
        .config(|c| c.limits.max_concurrent_ingests = 1)
        .spawn()
        .await;
    let running = id_of(
        &submit(
            &app,
            json!({"collection": "busy", "async": true, "documents": docs(400, "first")}),
        )
        .await,
    );
    let queued = id_of(
        &submit(
            &app,
            json!({"collection": "waiting", "async": true, "documents": docs(40, "second")}),
        )
        .await,
    );
    wait_job(&app, &running, Duration::from_secs(30), |j| {
        j["documents"]["done"].as_i64().unwrap_or(0) >= 32
    })
    .await;
    assert_eq!(job(&app, &queued).await["status"], "queued");
    for name in ["waiting", "busy"] {
        let r = app
            .http
            .delete(app.url(&format!("/v1/collections/{name}")))
            .send()
            .await
            .expect("delete");
        assert_eq!(r.status(), 200, "{name}");
    }
    for (id, name) in [(&running, "busy"), (&queued, "waiting")] {
        let j = wait_job(&app, id, Duration::from_secs(30), ended).await;
        assert_eq!(j["status"], "failed", "{j}");
        let error = j["error"].as_str().unwrap_or_default();
        assert!(error.contains(name), "names the collection: {j}");
    }
    for name in ["busy", "waiting"] {
        let (status, _, _, _) = error_of(app.get(&format!("/v1/collections/{name}")).await).await;
        assert_eq!(status, 404, "{name} was made again");
    }
    app.shutdown().await.expect("shutdown");
}

/// Held jobs are bounded per tenant and by the text they keep in memory:
/// past either, 503 naming the setting, and the other tenant still gets
/// its job within the byte bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_jobs_are_bounded_per_tenant_and_in_bytes() {
    let app = TestApp::builder()
        .slow_embeddings(Duration::from_millis(100))
        .admin()
        .config(|c| {
            c.limits.max_concurrent_ingests = 1;
            c.limits.max_jobs_per_tenant = 1;
            c.limits.max_queued_job_bytes = 64 * 1024;
        })
        .spawn()
        .await;
    // About 10 KB held.
    submit(&app, json!({"async": true, "documents": docs(400, "slow")})).await;
    let refused = |r: reqwest::Response, setting: &'static str| async move {
        let (status, code, _, body) = error_of(r).await;
        assert_eq!((status, code.as_str()), (503, "overloaded"), "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(setting), "{body}");
    };
    let second = app
        .post_json(
            "/v1/documents",
            json!({"collection": "refused", "async": true, "documents": docs(3, "more")}),
        )
        .await;
    refused(second, "limits.max_jobs_per_tenant").await;
    let (status, _, _, _) = error_of(app.get("/v1/collections/refused").await).await;
    assert_eq!(status, 404, "a refused job makes no collection");
    let key: Value = app
        .admin(
            reqwest::Method::POST,
            "/admin/keys",
            Some(json!({"tenant": "other", "name": "k"})),
        )
        .await
        .json()
        .await
        .expect("json");
    let key = key["key"].as_str().expect("key");
    let big = "x".repeat(60 * 1024);
    let r = app
        .http
        .post(app.url("/v1/documents"))
        .bearer_auth(key)
        .json(&json!({"async": true, "documents": [{"id": "big", "text": big}]}))
        .send()
        .await
        .expect("post");
    refused(r, "limits.max_queued_job_bytes").await;
    let r = app
        .http
        .post(app.url("/v1/documents"))
        .bearer_auth(key)
        .json(&json!({"async": true, "documents": docs(3, "small")}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 202, "within both bounds");
    app.shutdown().await.expect("shutdown");
}

/// A server that wants a key, asked without one: the command fails naming
/// its own flag and variable, not an HTTP header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ragtime_ingest_without_a_key_names_the_flag() {
    let app = TestApp::builder()
        .config(|c| c.auth.require_api_key = true)
        .spawn()
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("note.md");
    std::fs::write(&file, "# A note\n\nSomething to send.").expect("write");
    let args = vec![
        "ingest".into(),
        "--server".into(),
        app.url(""),
        file.display().to_string(),
    ];
    let out = ragtime(args, dir.path().to_owned()).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--api-key") && stderr.contains("RAGTIME_API_KEY"),
        "{stderr}"
    );
    app.shutdown().await.expect("shutdown");
}
