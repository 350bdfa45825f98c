use crate::helpers::{ADMIN_KEY, TestApp, error_of};
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

fn content_type(r: &reqwest::Response) -> String {
    r.headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
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
            let ct = content_type(&r);
            assert!(ct.starts_with("application/json"), "{method} {path}: {ct}");
            let (s, code, f, body) = error_of(r).await;
            assert!((400..500).contains(&s), "{method} {path}: {s} {body}");
            assert_eq!(code, "invalid_request", "{method} {path}: {body}");
            assert_eq!(f.as_deref(), Some(field), "{method} {path}: {body}");
        }
    }
}

/// Every route, provoked four ways — an unknown query parameter, a path
/// segment that is not UTF-8, malformed JSON, a wrong content type —
/// answers with the one JSON error shape whenever it refuses, never a 5xx
/// and never the framework's plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_bad_input_with_a_json_error() {
    use reqwest::Method;
    let app = TestApp::builder().admin().spawn().await;
    // (method, path, takes a JSON body, takes query parameters)
    let routes: &[(Method, &str, bool, bool)] = &[
        (Method::POST, "/v1/embeddings", true, false),
        (Method::POST, "/v1/documents", true, false),
        (Method::GET, "/v1/documents", false, true),
        (Method::GET, "/v1/documents/{}", false, true),
        (Method::DELETE, "/v1/documents/{}", false, true),
        (Method::GET, "/v1/jobs", false, true),
        (Method::GET, "/v1/jobs/{}", false, false),
        (Method::DELETE, "/v1/jobs/{}", false, false),
        (Method::GET, "/v1/collections", false, false),
        (Method::POST, "/v1/collections", true, false),
        (Method::GET, "/v1/collections/{}", false, false),
        (Method::DELETE, "/v1/collections/{}", false, false),
        (Method::POST, "/v1/search", true, false),
        (Method::POST, "/v1/chat/completions", true, false),
        (Method::GET, "/v1/models", false, false),
        (Method::GET, "/admin/stats", false, false),
        (Method::GET, "/admin/collections", false, false),
        (Method::GET, "/admin/budgets", false, false),
        (Method::PUT, "/admin/budgets", true, false),
        (Method::PATCH, "/admin/budgets", true, false),
        (Method::GET, "/admin/budgets/history", false, false),
        (Method::POST, "/admin/budgets/rollback", true, false),
        (Method::GET, "/admin/budgets/advice", false, true),
        (Method::GET, "/admin/keys", false, false),
        (Method::POST, "/admin/keys", true, false),
        (Method::DELETE, "/admin/keys/{}", false, false),
        (Method::GET, "/admin/tenants/{}/budgets", false, false),
        (Method::PUT, "/admin/tenants/{}/budgets", true, false),
        (Method::DELETE, "/admin/tenants/{}/budgets", false, false),
        (Method::GET, "/admin/tenants/{}/priority", false, false),
        (Method::PUT, "/admin/tenants/{}/priority", true, false),
        (Method::DELETE, "/admin/tenants/{}/priority", false, false),
        (Method::GET, "/admin/tenants/{}/quotas", false, false),
        (Method::PUT, "/admin/tenants/{}/quotas", true, false),
        (Method::DELETE, "/admin/tenants/{}/quotas", false, false),
        (Method::GET, "/admin/experiments", false, false),
        (Method::POST, "/admin/experiments", true, false),
        (Method::DELETE, "/admin/experiments", false, false),
    ];
    // The OpenAPI document describes exactly these operations (and the
    // probes, metrics and pages outside /v1 and /admin/…).
    let doc: serde_json::Value = app.get("/openapi.json").await.json().await.expect("doc");
    let mut documented: Vec<String> = Vec::new();
    for (p, item) in doc["paths"].as_object().into_iter().flatten() {
        for m in item.as_object().into_iter().flatten().map(|(m, _)| m) {
            if p.starts_with("/v1/") || p.starts_with("/admin/") {
                let template = p.split('{').next().unwrap_or_default();
                let shaped = if p.contains('{') {
                    format!("{template}{{}}{}", p.rsplit('}').next().unwrap_or_default())
                } else {
                    p.clone()
                };
                documented.push(format!("{} {shaped}", m.to_uppercase()));
            }
        }
    }
    let mut walked: Vec<String> = routes
        .iter()
        .map(|(m, p, _, _)| format!("{m} {p}"))
        .collect();
    documented.sort();
    walked.sort();
    assert_eq!(documented, walked, "the document and the routes differ");
    let mut checked = 0;
    for (method, path, body, query) in routes {
        let has_param = path.contains("{}");
        let ok_path = path.replace("{}", "acme");
        // (what, url, (content type, body) to send, must it be refused)
        type Case<'a> = (&'a str, String, Option<(&'a str, &'a str)>, bool);
        let mut cases: Vec<Case> = vec![(
            "unknown query parameter",
            format!("{ok_path}?bogus=1"),
            None,
            *query,
        )];
        if has_param {
            cases.push((
                "non-UTF-8 path segment",
                path.replace("{}", "a%FFb"),
                None,
                true,
            ));
        }
        if *body {
            cases.push((
                "malformed JSON",
                ok_path.clone(),
                Some(("application/json", "{\"a\": ")),
                true,
            ));
            cases.push((
                "wrong content type",
                ok_path.clone(),
                Some(("text/plain", "{}")),
                true,
            ));
        }
        for (what, url, send, must_refuse) in cases {
            let mut r = app
                .http
                .request(method.clone(), app.url(&url))
                .bearer_auth(ADMIN_KEY);
            if path.starts_with("/v1") {
                r = app.http.request(method.clone(), app.url(&url));
            }
            if let Some((ct, b)) = send {
                r = r.header("content-type", ct).body(b.to_owned());
            }
            let r = r.send().await.expect("request");
            let s = r.status().as_u16();
            let ct = content_type(&r);
            let text = r.text().await.unwrap_or_default();
            let at = format!("{method} {url} ({what}): {s} {ct} {text}");
            assert!(s < 500, "{at}");
            if must_refuse {
                assert!((400..500).contains(&s), "refused: {at}");
            }
            if s >= 400 {
                assert!(ct.starts_with("application/json"), "{at}");
                let v: serde_json::Value = serde_json::from_str(&text).expect(&at);
                assert!(
                    v["error"]["code"].is_string() && v["error"]["message"].is_string(),
                    "{at}"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 80, "every route, every way it can be provoked");
}
