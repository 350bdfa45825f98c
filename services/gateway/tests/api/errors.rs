use crate::helpers::{TestApp, error_of};
use serde_json::json;

/// Bad input gets a 4xx with a JSON body naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_json_error_naming_the_field() {
    let app = TestApp::spawn().await;
    let cases = [
        (json!({"input": []}), 422, "invalid_request", Some("input")),
        (
            json!({"input": ["ok", "  "]}),
            422,
            "invalid_request",
            Some("input[1]"),
        ),
        (json!({"input": 5}), 422, "invalid_request", Some("input")),
        (
            json!({"input": [1, 2]}),
            422,
            "invalid_request",
            Some("input"),
        ),
        (
            json!({"inputs": "x"}),
            422,
            "invalid_request",
            Some("inputs"),
        ),
        (json!({}), 422, "invalid_request", Some("input")),
        (
            json!({"input": "x", "model": "gpt-4"}),
            422,
            "invalid_request",
            Some("model"),
        ),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            422,
            "invalid_request",
            Some("encoding_format"),
        ),
        (
            json!({"input": "x", "budget_ms": 0}),
            422,
            "invalid_request",
            Some("budget_ms"),
        ),
        (
            json!({"input": "x", "budget_ms": -3}),
            422,
            "invalid_request",
            Some("budget_ms"),
        ),
    ];
    for (body, status, code, field) in cases {
        let r = app.post_json("/v1/embeddings", body.clone()).await;
        let (s, c, f, full) = error_of(r).await;
        assert_eq!(
            (s, c.as_str(), f.as_deref()),
            (status, code, field),
            "{body} -> {full}"
        );
        let msg = full["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.chars().next().is_some_and(|ch| !ch.is_uppercase()),
            "messages are lowercase: {msg}"
        );
    }

    let r = app
        .http
        .post(app.url("/v1/embeddings"))
        .header("content-type", "application/json")
        .body("{\"input\": \"x\"")
        .send()
        .await
        .expect("post");
    let (s, c, _, _) = error_of(r).await;
    assert_eq!((s, c.as_str()), (400, "invalid_json"));

    let r = app
        .http
        .post(app.url("/v1/embeddings"))
        .body("input=x")
        .send()
        .await
        .expect("post");
    let (s, c, _, _) = error_of(r).await;
    assert_eq!((s, c.as_str()), (415, "unsupported_media_type"));

    let r = app
        .http
        .get(app.url("/v1/nothing-here"))
        .send()
        .await
        .expect("get");
    let (s, c, _, _) = error_of(r).await;
    assert_eq!((s, c.as_str()), (404, "not_found"));

    let r = app
        .http
        .delete(app.url("/healthz"))
        .send()
        .await
        .expect("delete");
    let (s, c, _, _) = error_of(r).await;
    assert_eq!((s, c.as_str()), (405, "method_not_allowed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_refused() {
    let app = TestApp::builder()
        .config(|c| c.server.body_limit_bytes = 4096)
        .not_ready()
        .spawn()
        .await;
    let big = "x".repeat(10_000);
    let r = app.post_json("/v1/embeddings", json!({"input": big})).await;
    let (s, c, _, _) = error_of(r).await;
    assert_eq!((s, c.as_str()), (413, "payload_too_large"));
}

/// The framework's own rejections (query strings, path segments) answer
/// with the one JSON error shape, naming the parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_and_path_rejections_are_json_naming_the_parameter() {
    let app = TestApp::spawn().await;
    for (path, field) in [
        ("/v1/documents/mito?foo=1", "foo"),
        ("/v1/documents/mito?collection=a&collection=a", "collection"),
        ("/v1/documents/%FF", "id"),
        ("/v1/documents/a%FFb?collection=default", "id"),
    ] {
        for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
            let r = app
                .http
                .request(method.clone(), app.url(path))
                .send()
                .await
                .expect("request");
            let ct = r
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            assert!(ct.starts_with("application/json"), "{method} {path}: {ct}");
            let (s, code, f, body) = error_of(r).await;
            assert!((400..500).contains(&s), "{method} {path}: {s} {body}");
            assert_eq!(code, "invalid_request", "{method} {path}: {body}");
            assert_eq!(f.as_deref(), Some(field), "{method} {path}: {body}");
        }
    }
}
