//! The container set-up, alerts and dashboard parse, bind only to
//! 127.0.0.1, and name only metrics that ragtime exports. (No Docker engine
//! runs where the tests run; this is what can be checked without one.)

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml(path: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(root().join(path)).expect(path);
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Metric names ragtime exports (every family prints its HELP line).
/// The sample names `/metrics` exposes once every metric has a sample
/// (histogram suffixes removed, as in [`referenced`]).
fn exported() -> BTreeSet<String> {
    use ragtime_core::{Outcome, Stage};
    use std::time::Duration;
    let m = std::sync::Arc::new(ragtime_telemetry::metrics::Metrics::default());
    m.stage(
        Stage::Rerank,
        Outcome::Partial,
        Duration::from_millis(5),
        true,
        None,
    );
    m.partial_answer("llm_ttft");
    m.request("/v1/search", 200);
    m.cache_lookup(true);
    m.ttft(Duration::from_millis(5), None);
    m.time_per_output_token(Duration::from_millis(5));
    m.set_budget(Some(Stage::Rerank), 500);
    let _busy = (m.in_flight(), m.llm_in_flight());
    m.render()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .flat_map(referenced)
        .collect()
}

/// `ragtime_*` names in a PromQL text, histogram suffixes removed.
fn referenced(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("ragtime_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        out.push(base.to_owned());
        rest = &tail[end..];
    }
    out
}

#[test]
fn compose_brings_ragtime_jaeger_and_the_profiles_on_loopback_only() {
    let c = yaml("docker-compose.yml");
    let services = c["services"].as_mapping().expect("services");
    for name in [
        "ragtime",
        "jaeger",
        "postgres",
        "vllm",
        "prometheus",
        "phoenix",
    ] {
        assert!(services.contains_key(name), "service {name}");
    }
    for (name, svc) in services {
        for p in svc["ports"].as_sequence().into_iter().flatten() {
            let p = p.as_str().unwrap_or_default();
            assert!(
                p.starts_with("127.0.0.1:"),
                "{name:?} publishes {p} beyond loopback"
            );
        }
    }
    let jaeger: Vec<&str> = c["services"]["jaeger"]["ports"]
        .as_sequence()
        .map(|s| s.iter().filter_map(|p| p.as_str()).collect())
        .unwrap_or_default();
    for port in ["4317:4317", "4318:4318", "16686:16686"] {
        assert!(jaeger.iter().any(|p| p.ends_with(port)), "jaeger {port}");
    }
    let env = &c["services"]["ragtime"]["environment"];
    assert_eq!(
        env["OTEL_EXPORTER_OTLP_ENDPOINT"].as_str(),
        Some("${OTEL_EXPORTER_OTLP_ENDPOINT:-http://jaeger:4317}"),
        "Jaeger unless the user points it elsewhere"
    );
    assert_eq!(
        c["services"]["phoenix"]["profiles"][0].as_str(),
        Some("phoenix")
    );
    // Exemplars need Prometheus's exemplar storage.
    assert!(
        c["services"]["prometheus"]["command"]
            .as_sequence()
            .is_some_and(|c| c
                .iter()
                .any(|a| a.as_str() == Some("--enable-feature=exemplar-storage")))
    );
    assert_eq!(
        c["services"]["postgres"]["profiles"][0].as_str(),
        Some("postgres")
    );
    assert_eq!(c["services"]["vllm"]["profiles"][0].as_str(), Some("gpu"));
    // Two gateways on PostgreSQL behind nginx, which names both.
    for name in ["ragtime-a", "ragtime-b", "proxy"] {
        assert_eq!(
            c["services"][name]["profiles"][0].as_str(),
            Some("replicas"),
            "{name}"
        );
    }
    assert!(
        c["services"]["postgres"]["profiles"]
            .as_sequence()
            .is_some_and(|p| p.iter().any(|x| x.as_str() == Some("replicas")))
    );
    for name in ["ragtime-a", "ragtime-b"] {
        assert!(
            c["services"][name]["environment"]["RAGTIME__DATABASE_URL"]
                .as_str()
                .is_some_and(|u| u.starts_with("postgres://") && u.contains("@postgres:5432/")),
            "{name} uses the shared PostgreSQL"
        );
    }
    let conf =
        std::fs::read_to_string(root().join("deploy/replicas-nginx.conf")).expect("nginx conf");
    assert!(conf.contains("server ragtime-a:8080") && conf.contains("server ragtime-b:8080"));
    assert!(
        conf.contains("proxy_buffering off"),
        "streamed answers pass at once"
    );
    assert!(
        c["services"]["vllm"]["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("vllm/vllm-openai"))
    );
}

#[test]
fn alerts_and_dashboard_name_only_exported_metrics() {
    let names = exported();
    let mut exprs = Vec::new();
    let alerts = yaml("deploy/alerts.yml");
    let mut alert_names = Vec::new();
    for g in alerts["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            alert_names.push(r["alert"].as_str().expect("alert name").to_owned());
            exprs.push(r["expr"].as_str().expect("expr").to_owned());
        }
    }
    for want in ["TTFT", "Overruns", "PartialAnswer"] {
        assert!(
            alert_names.iter().any(|a| a.contains(want)),
            "{want} alert: {alert_names:?}"
        );
    }
    let prom = yaml("deploy/prometheus.yml");
    assert_eq!(
        prom["scrape_configs"][0]["metrics_path"].as_str(),
        Some("/metrics")
    );

    let text =
        std::fs::read_to_string(root().join("deploy/grafana-dashboard.json")).expect("dashboard");
    let dash: Value = serde_json::from_str(&text).expect("dashboard json");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 5);
    let mut exemplars = Vec::new();
    for p in panels {
        for t in p["targets"].as_array().expect("targets") {
            exprs.push(t["expr"].as_str().expect("expr").to_owned());
            if t["exemplar"] == true {
                exemplars.push(t["expr"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    // The latency panels show exemplars (the histograms that carry them).
    for h in ["ragtime_stage_duration_seconds", "ragtime_llm_ttft_seconds"] {
        assert!(
            exemplars.iter().any(|e| e.contains(h)),
            "no exemplars shown for {h}"
        );
    }
    let mut seen = 0;
    for e in &exprs {
        for n in referenced(e) {
            assert!(
                names.contains(&n),
                "{n} (in {e}) is not exported; exported: {names:?}"
            );
            seen += 1;
        }
    }
    assert!(
        seen >= exprs.len(),
        "every expression names a ragtime metric"
    );
}
