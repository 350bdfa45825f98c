//! The API's answer shapes stay what clients know: every route is called
//! once and the recursive set of JSON keys of its answer (plus the metric
//! names of `/metrics`) is compared with `fixtures/shapes.json`, recorded
//! from the service before its internals were restructured. Set
//! `RAGTIME_WRITE_SHAPES=1` to record the file anew after a deliberate
//! change to the API.

use crate::fake_llm::{Behaviour, FakeLlm};
use crate::helpers::{ADMIN_KEY as KEY, TestApp};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

/// Every key path of `v`: `a.b`, `a[].c` (arrays are merged over their
/// items), with the JSON type of each leaf (`number`, `string`, …).
fn paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            if m.is_empty() {
                out.insert(format!("{prefix}: object"));
            }
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                paths(x, &p, out);
            }
        }
        Value::Array(items) => {
            if items.is_empty() {
                out.insert(format!("{prefix}: array"));
            }
            for x in items {
                paths(x, &format!("{prefix}[]"), out);
            }
        }
        Value::Null => {
            out.insert(format!("{prefix}: null"));
        }
        Value::Bool(_) => {
            out.insert(format!("{prefix}: bool"));
        }
        Value::Number(_) => {
            out.insert(format!("{prefix}: number"));
        }
        Value::String(_) => {
            out.insert(format!("{prefix}: string"));
        }
    }
}

/// The sorted key paths of `v`.
fn shape(v: &Value) -> Vec<String> {
    let mut out = BTreeSet::new();
    paths(v, "", &mut out);
    out.into_iter().collect()
}

async fn call(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
    admin: bool,
) -> (u16, Value) {
    let mut r = app.http.request(method, app.url(path));
    if admin {
        r = r.bearer_auth(KEY);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The data frames of an SSE answer, as JSON (`[DONE]` left out).
fn sse_frames(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// The names of the samples `/metrics` exposes (labels left out).
fn metric_names(text: &str) -> Vec<String> {
    let set: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_owned))
        .collect();
    set.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_the_shapes_clients_know() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 4,
        gap: Duration::from_millis(5),
    })
    .await;
    let app = TestApp::builder()
        .llm(&fake)
        .admin()
        .config(|c| c.cache.enabled = false)
        .spawn()
        .await;
    use reqwest::Method as M;
    let mut got: Map<String, Value> = Map::new();
    let mut put = |name: &str, status: u16, v: &Value| {
        got.insert(name.to_owned(), json!({"status": status, "keys": shape(v)}));
    };

    let (s, v) = call(&app, M::GET, "/healthz", None, false).await;
    put("GET /healthz", s, &v);
    let (s, v) = call(&app, M::GET, "/readyz", None, false).await;
    // The checks' details differ by backend; their names and `ok` do not.
    let checks: Map<String, Value> = v["checks"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, c)| (k.clone(), json!({"ok": c["ok"]})))
                .collect()
        })
        .unwrap_or_default();
    put(
        "GET /readyz",
        s,
        &json!({"status": v["status"], "checks": checks}),
    );
    let docs = json!({"collection": "shapes", "documents": [
        {"id": "d1", "title": "Mitochondria", "text": "Mitochondria produce ATP for the cell.", "metadata": {"year": 2020}},
        {"id": "d2", "title": "Tea", "text": "Green tea contains caffeine and catechins.", "metadata": {"year": 2019}}
    ]});
    let (s, v) = call(&app, M::POST, "/v1/documents", Some(docs), false).await;
    put("POST /v1/documents", s, &v);
    let (s, v) = call(
        &app,
        M::GET,
        "/v1/documents/d1?collection=shapes",
        None,
        false,
    )
    .await;
    put("GET /v1/documents/{id}", s, &v);
    let (s, v) = call(
        &app,
        M::POST,
        "/v1/search",
        Some(json!({"query": "what makes ATP", "collection": "shapes", "top_k": 2})),
        false,
    )
    .await;
    put("POST /v1/search", s, &v);
    let (s, v) = call(
        &app,
        M::POST,
        "/v1/embeddings",
        Some(json!({"input": ["a b", "c"]})),
        false,
    )
    .await;
    put("POST /v1/embeddings", s, &v);
    let (s, v) = call(
        &app,
        M::POST,
        "/v1/embeddings",
        Some(json!({"input": "a b", "encoding_format": "base64"})),
        false,
    )
    .await;
    put("POST /v1/embeddings base64", s, &v);
    let (s, v) = call(&app, M::GET, "/v1/models", None, false).await;
    put("GET /v1/models", s, &v);
    let chat = json!({"model": "m", "collection": "shapes", "messages": [{"role": "user", "content": "What do mitochondria produce?"}]});
    let (s, v) = call(
        &app,
        M::POST,
        "/v1/chat/completions",
        Some(chat.clone()),
        false,
    )
    .await;
    put("POST /v1/chat/completions", s, &v);
    let mut streamed = chat;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let resp = app
        .http
        .post(app.url("/v1/chat/completions"))
        .json(&streamed)
        .send()
        .await
        .expect("stream");
    let s = resp.status().as_u16();
    let frames = sse_frames(&resp.text().await.expect("sse"));
    assert!(frames.len() >= 4, "{frames:?}");
    put("POST /v1/chat/completions stream first", s, &frames[0]);
    put("POST /v1/chat/completions stream text", s, &frames[1]);
    put(
        "POST /v1/chat/completions stream last",
        s,
        &frames[frames.len() - 2],
    );
    put(
        "POST /v1/chat/completions stream usage",
        s,
        &frames[frames.len() - 1],
    );
    let (s, v) = call(
        &app,
        M::DELETE,
        "/v1/documents/d2?collection=shapes",
        None,
        false,
    )
    .await;
    put("DELETE /v1/documents/{id}", s, &v);
    let (s, v) = call(
        &app,
        M::POST,
        "/v1/search",
        Some(json!({"query": "x", "top_k": 0})),
        false,
    )
    .await;
    put("error 422", s, &v);
    let (s, v) = call(&app, M::GET, "/v1/nothing", None, false).await;
    put("error 404", s, &v);

    // Admin.
    let (s, v) = call(&app, M::GET, "/admin/stats", None, true).await;
    put("GET /admin/stats", s, &v);
    let (s, v) = call(&app, M::GET, "/admin/budgets", None, true).await;
    put("GET /admin/budgets", s, &v);
    let (s, v) = call(
        &app,
        M::PATCH,
        "/admin/budgets",
        Some(json!({"stages": {"rerank": 400}})),
        true,
    )
    .await;
    put("PATCH /admin/budgets", s, &v);
    let mut full = v.clone();
    if let Some(o) = full.as_object_mut() {
        o.remove("version");
    }
    let (s, v) = call(&app, M::PUT, "/admin/budgets", Some(full), true).await;
    put("PUT /admin/budgets", s, &v);
    let (s, v) = call(&app, M::GET, "/admin/budgets/history", None, true).await;
    put("GET /admin/budgets/history", s, &v);
    let (s, v) = call(
        &app,
        M::POST,
        "/admin/budgets/rollback",
        Some(json!({"version": 1})),
        true,
    )
    .await;
    put("POST /admin/budgets/rollback", s, &v);
    let (s, v) = call(
        &app,
        M::GET,
        "/admin/budgets/advice?total_ms=15000",
        None,
        true,
    )
    .await;
    put("GET /admin/budgets/advice", s, &v);
    let (s, v) = call(
        &app,
        M::POST,
        "/admin/keys",
        Some(json!({"tenant": "acme", "name": "k"})),
        true,
    )
    .await;
    put("POST /admin/keys", s, &v);
    let id = v["id"].as_str().unwrap_or_default().to_owned();
    let (s, v) = call(&app, M::GET, "/admin/keys", None, true).await;
    put("GET /admin/keys", s, &v);
    let (s, v) = call(&app, M::DELETE, &format!("/admin/keys/{id}"), None, true).await;
    put("DELETE /admin/keys/{id}", s, &v);
    let (s, v) = call(
        &app,
        M::PUT,
        "/admin/tenants/acme/budgets",
        Some(json!({"stages": {"embed": 100}})),
        true,
    )
    .await;
    put("PUT /admin/tenants/{tenant}/budgets", s, &v);
    let (s, v) = call(&app, M::GET, "/admin/tenants/acme/budgets", None, true).await;
    put("GET /admin/tenants/{tenant}/budgets", s, &v);
    let (s, v) = call(&app, M::DELETE, "/admin/tenants/acme/budgets", None, true).await;
    put("DELETE /admin/tenants/{tenant}/budgets", s, &v);
    let (s, v) = call(
        &app,
        M::POST,
        "/admin/experiments",
        Some(json!({"name": "e", "share": 0.5, "candidate": {"stages": {"rerank": 300}}})),
        true,
    )
    .await;
    put("POST /admin/experiments", s, &v);
    let (s, v) = call(&app, M::GET, "/admin/experiments", None, true).await;
    put("GET /admin/experiments", s, &v);
    let (s, v) = call(&app, M::DELETE, "/admin/experiments", None, true).await;
    put("DELETE /admin/experiments", s, &v);
    let (s, v) = call(&app, M::GET, "/admin/stats", None, false).await;
    put("error 401", s, &v);

    let text = app
        .http
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    got.insert("GET /metrics".into(), json!(metric_names(&text)));

    let file =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api/fixtures/shapes.json");
    let got = Value::Object(got);
    if std::env::var_os("RAGTIME_WRITE_SHAPES").is_some() {
        let text = serde_json::to_string_pretty(&got).expect("json");
        std::fs::write(&file, text + "\n").expect("write shapes");
    }
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(&file)
            .expect("fixtures/shapes.json (RAGTIME_WRITE_SHAPES=1 records it)"),
    )
    .expect("shapes json");
    let (Some(want), Some(got)) = (want.as_object(), got.as_object()) else {
        panic!("shapes are objects");
    };
    let mut diffs = Vec::new();
    for (route, w) in want {
        match got.get(route) {
            Some(g) if g == w => {}
            Some(g) => diffs.push(format!("{route}:\n  want {w}\n  got  {g}")),
            None => diffs.push(format!("{route}: not called")),
        }
    }
    for route in got.keys().filter(|r| !want.contains_key(*r)) {
        diffs.push(format!("{route}: not in the fixture"));
    }
    assert!(
        diffs.is_empty(),
        "API shapes changed:\n{}",
        diffs.join("\n")
    );
    app.shutdown().await.expect("shutdown");
}
