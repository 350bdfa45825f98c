//! The API contract, checked from outside: `/openapi.json` validates
//! against the OpenAPI 3.1 meta-schema, and schemathesis (pinned, from PyPI)
//! runs its examples, coverage, fuzzing and stateful phases against a live
//! server with that document — every check but `positive_data_acceptance`
//! (the document does not state every semantic rule, such as a collection
//! name's characters, so a value it allows may still be refused with a
//! 422 naming the field) — and must find no failure: no 5xx, no response off
//! its schema or content type, no invalid input accepted, no resource
//! alive after its delete.

#[path = "api/fake_llm.rs"]
#[allow(dead_code)]
mod fake_llm;
#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use helpers::{ADMIN_KEY, TestApp};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

const MAX_EXAMPLES: &str = "150";

fn python(path: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("python3");
    cmd.env("PYTHONPATH", path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("SCHEMATHESIS_HOOKS", "")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs schemathesis's `phases` over the operations `select` picks
/// (`--include-…` arguments); returns (succeeded, its output).
async fn schemathesis(
    py: &str,
    app: &TestApp,
    phases: &str,
    select: &[String],
    header: Option<&str>,
    reports: &Path,
) -> (bool, String) {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/schemathesis.toml");
    let mut cmd = python(py);
    cmd.args(["-m", "schemathesis.cli", "--config-file", config, "run"])
        .arg(app.url("/openapi.json"))
        .args(select)
        .args([
            "--phases",
            phases,
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            MAX_EXAMPLES,
            "--seed",
            "20261124",
            // One worker: two threads building Hypothesis strategies at
            // once can trip CPython 3.11's AST recursion counter, shared
            // between threads ("AST constructor recursion depth mismatch",
            // python/cpython#106905), a runtime error that is not ours.
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--max-failures",
            "20",
            "--suppress-health-check",
            "all",
            "--report",
            "junit,har",
            "--report-dir",
        ])
        .arg(reports)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(h) = header {
        cmd.args(["-H", h]);
    }
    let out = cmd.output().await.expect("run schemathesis");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Requests per documented operation ("GET /v1/documents/{id}") in the
/// HAR reports schemathesis wrote under `dir`.
fn cases_per_operation(doc: &serde_json::Value, dir: &Path) -> BTreeMap<String, usize> {
    let mut templates: Vec<(String, Vec<String>)> = Vec::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for method in item.as_object().into_iter().flatten().map(|(m, _)| m) {
            let parts = path.split('/').map(str::to_owned).collect();
            templates.push((format!("{} {path}", method.to_uppercase()), parts));
        }
    }
    let mut counts: BTreeMap<String, usize> =
        templates.iter().map(|(op, _)| (op.clone(), 0)).collect();
    let mut hars = Vec::new();
    for run in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(run.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            // schemathesis names them har-<time>.json
            if f.file_name().to_string_lossy().starts_with("har-") {
                hars.push(f.path());
            }
        }
    }
    for har in hars {
        let text = std::fs::read_to_string(&har).expect("read har");
        let har: serde_json::Value = serde_json::from_str(&text).expect("har json");
        for e in har["log"]["entries"].as_array().into_iter().flatten() {
            let method = e["request"]["method"].as_str().unwrap_or_default();
            let url = e["request"]["url"].as_str().unwrap_or_default();
            let path = url
                .splitn(4, '/')
                .nth(3)
                .map(|p| format!("/{}", p.split('?').next().unwrap_or_default()))
                .unwrap_or_default();
            let segs: Vec<&str> = path.split('/').collect();
            let same_method = |op: &String| op.starts_with(&format!("{method} "));
            let exact = templates.iter().find(|(op, parts)| {
                same_method(op)
                    && parts.len() == segs.len()
                    && parts
                        .iter()
                        .zip(&segs)
                        .all(|(t, s)| t.starts_with('{') || t == s)
            });
            // A path value with a `/` of its own (sent unescaped) has more
            // segments: the template with the longest literal prefix.
            let hit = exact.or_else(|| {
                templates
                    .iter()
                    .filter(|(op, _)| same_method(op))
                    .filter_map(|(op, _)| {
                        let template = op.split_once(' ').map_or("", |(_, p)| p);
                        let prefix = template.split('{').next().unwrap_or_default();
                        (template.contains('{') && path.starts_with(prefix))
                            .then_some((prefix.len(), op))
                    })
                    .max_by_key(|(n, _)| *n)
                    .and_then(|(_, op)| templates.iter().find(|(o, _)| o == op))
            });
            if let Some((op, _)) = hit {
                *counts.entry(op.clone()).or_default() += 1;
            }
        }
    }
    counts
}

/// Whether an operation takes any input (parameters or a body).
fn takes_input(doc: &serde_json::Value, op: &str) -> bool {
    let (method, path) = op.split_once(' ').unwrap_or_default();
    let o = &doc["paths"][path][method.to_lowercase()];
    o["parameters"].as_array().is_some_and(|p| !p.is_empty()) || o["requestBody"].is_object()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs schemathesis (RAGTIME_TEST_SCHEMATHESIS_PYTHONPATH; make test installs it)"]
async fn needs_schemathesis_the_api_keeps_its_openapi_contract() {
    let py = std::env::var("RAGTIME_TEST_SCHEMATHESIS_PYTHONPATH")
        .expect("RAGTIME_TEST_SCHEMATHESIS_PYTHONPATH: make test installs schemathesis");
    let app = TestApp::builder().admin().spawn().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // RAGTIME_TEST_SCHEMATHESIS_REPORTS keeps the JUnit and HAR reports.
    let dir = std::env::var_os("RAGTIME_TEST_SCHEMATHESIS_REPORTS")
        .map_or_else(|| tmp.path().to_owned(), std::path::PathBuf::from);
    for i in 0..4 {
        let _ = std::fs::remove_dir_all(dir.join(format!("run{i}")));
    }
    let doc = app.get("/openapi.json").await;
    assert_eq!(doc.status(), 200);
    let doc: serde_json::Value = doc.json().await.expect("json");
    assert_eq!(doc["openapi"], "3.1.0");
    std::fs::create_dir_all(&dir).expect("report dir");
    let file = dir.join("openapi.json");
    std::fs::write(&file, doc.to_string()).expect("write");
    // The meta-schema schemathesis ships (OpenAPI 3.1, 2022-10-07).
    let check = python(&py)
        .arg("-c")
        .arg(
            "import json, sys\n\
             from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR as v\n\
             doc = json.load(open(sys.argv[1]))\n\
             errors = [e.message for e in v.iter_errors(doc)]\n\
             print('\\n'.join(errors) or 'valid')\n\
             sys.exit(1 if errors else 0)",
        )
        .arg(&file)
        .output()
        .await
        .expect("validate");
    let said = String::from_utf8_lossy(&check.stdout).into_owned()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "not valid OpenAPI 3.1: {said}");
    let ops: usize = doc["paths"]
        .as_object()
        .map(|p| {
            p.values()
                .map(|i| i.as_object().map_or(0, |o| o.len()))
                .sum()
        })
        .unwrap_or(0);
    assert!(ops >= 40, "{ops} operations documented");

    // Users' routes without a key (the default tenant), then the admin's
    // with the admin key (which /v1 refuses).
    let admin = format!("Authorization: Bearer {ADMIN_KEY}");
    let header_for = |path: &str| path.starts_with("/admin").then_some(admin.as_str());
    let all_phases = "examples,coverage,fuzzing,stateful";
    let runs = [
        ("^/(v1/|healthz|readyz|metrics|openapi|docs)", "/v1"),
        ("^/admin", "/admin"),
    ];
    let mut failed = Vec::new();
    for (i, (paths, like)) in runs.iter().enumerate() {
        let reports = dir.join(format!("run{i}"));
        let select = ["--include-path-regex".to_owned(), (*paths).to_owned()];
        let (ok, out) =
            schemathesis(&py, &app, all_phases, &select, header_for(like), &reports).await;
        eprintln!("schemathesis {paths}:\n{out}");
        if !ok {
            failed.push((*paths).to_owned());
        }
    }
    // The coverage phase's cases are not repeated by fuzzing, so an
    // operation whose small inputs coverage already tried can end up with
    // few; fuzz those once more on their own.
    let counts = cases_per_operation(&doc, &dir);
    for (i, (_, like)) in runs.iter().enumerate() {
        let short: Vec<String> = counts
            .iter()
            .filter(|(op, n)| {
                **n < 100 && takes_input(&doc, op) && op.contains(&format!(" {like}"))
            })
            .flat_map(|(op, _)| {
                let (method, path) = op.split_once(' ').unwrap_or_default();
                let id = doc["paths"][path][method.to_lowercase()]["operationId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                ["--include-operation-id".to_owned(), id]
            })
            .collect();
        if short.is_empty() {
            continue;
        }
        let reports = dir.join(format!("run{}", runs.len() + i));
        let (ok, out) =
            schemathesis(&py, &app, "fuzzing", &short, header_for(like), &reports).await;
        eprintln!("schemathesis, fuzzing again {short:?}:\n{out}");
        if !ok {
            failed.push(format!("{short:?}"));
        }
    }
    let counts = cases_per_operation(&doc, &dir);
    let total: usize = counts.values().sum();
    eprintln!("schemathesis requests per operation ({total} in all):");
    for (op, n) in &counts {
        eprintln!("  {n:>5}  {op}");
    }
    assert!(
        failed.is_empty(),
        "schemathesis found failures in {failed:?}"
    );
    // Every operation was exercised; those that take input, at least 100
    // times (one without input is the same request each time).
    for (op, n) in &counts {
        let want = if takes_input(&doc, op) { 100 } else { 1 };
        assert!(*n >= want, "{op}: {n} requests, want {want}");
    }
}
