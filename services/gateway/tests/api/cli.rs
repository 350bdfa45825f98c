//! The `ragtime` binary: configuration layering and start-up errors.

use std::process::Command;

fn ragtime(dir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ragtime"));
    c.current_dir(dir);
    // Only this test's RAGTIME__ variables count.
    for (k, _) in std::env::vars() {
        if k.starts_with("RAGTIME__") || k.starts_with("OTEL_") {
            c.env_remove(k);
        }
    }
    c
}

fn effective(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.arg("config").output().expect("run ragtime config");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("config json")
}

#[test]
fn config_layers_defaults_then_file_then_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The store is the user's, not the working folder's.
    let home = dir.path().join("home");
    let c = effective(
        ragtime(dir.path())
            .env("HOME", &home)
            .env_remove("XDG_DATA_HOME"),
    );
    assert_eq!(c["server"]["addr"], "127.0.0.1:8080");
    assert_eq!(
        c["data_dir"].as_str(),
        home.join(".local/share/ragtime").to_str()
    );
    let c = effective(ragtime(dir.path()).env("XDG_DATA_HOME", "/xdg"));
    assert_eq!(c["data_dir"], "/xdg/ragtime");
    assert_eq!(c["budgets"]["total_ms"], 15_000);
    assert_eq!(c["llm"]["base_url"], serde_json::Value::Null);

    std::fs::write(
        dir.path().join("ragtime.toml"),
        "data_dir = \"/srv/rag\"\n[budgets]\ntotal_ms = 16000\nllm_ttft_ms = 1000\n[llm]\nmodel = \"from-file\"\n",
    )
    .expect("write toml");
    let c = effective(&mut ragtime(dir.path()));
    assert_eq!(c["data_dir"], "/srv/rag");
    assert_eq!(c["budgets"]["total_ms"], 16000);
    assert_eq!(c["budgets"]["llm_ttft_ms"], 1000);
    assert_eq!(
        c["budgets"]["embed_ms"], 150,
        "unset keys keep their defaults"
    );
    assert_eq!(c["llm"]["model"], "from-file");

    let c = effective(
        ragtime(dir.path())
            .env("RAGTIME__BUDGETS__TOTAL_MS", "12000")
            .env("RAGTIME__BUDGETS__LLM_TTFT_MS", "700")
            .env("RAGTIME__SERVER__ADDR", "0.0.0.0:9999")
            .env("RAGTIME__DATA_DIR", "/var/lib/ragtime")
            .env("RAGTIME__DATABASE_URL", "postgres://app:pw@db:5432/rag")
            .env("RAGTIME__LLM__BASE_URL", "http://gpu:8000/v1")
            .env("RAGTIME__LLM__MODEL", "Qwen/Qwen2.5-7B-Instruct")
            .env("RAGTIME__RERANK__MODEL_DIR", "/models/ce")
            .env("RAGTIME__ADMIN_KEY", "a-very-long-admin-key")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://jaeger:4317"),
    );
    assert_eq!(
        c["budgets"]["total_ms"], 12000,
        "environment beats the file"
    );
    assert_eq!(c["budgets"]["llm_ttft_ms"], 700);
    assert_eq!(c["server"]["addr"], "0.0.0.0:9999");
    assert_eq!(c["data_dir"], "/var/lib/ragtime");
    assert_eq!(
        c["database_url"], "postgres://app:***@db:5432/rag",
        "passwords are hidden"
    );
    assert_eq!(c["llm"]["base_url"], "http://gpu:8000/v1");
    assert_eq!(c["llm"]["model"], "Qwen/Qwen2.5-7B-Instruct");
    assert_eq!(c["rerank"]["model_dir"], "/models/ce");
    assert_eq!(c["admin_key"], "***");
    assert_eq!(c["telemetry"]["otlp_endpoint"], "http://jaeger:4317");
}

#[test]
fn invalid_configuration_fails_at_start_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, &str, &str); 15] = [
        ("RAGTIME__BUDGETS__TOTAL_MS", "0", "budgets.total_ms"),
        // The store is SQLite (no database_url): nothing to search in.
        ("RAGTIME__RETRIEVAL__ENGINE", "postgres", "retrieval.engine"),
        (
            "RAGTIME__RETRIEVAL__EF_SEARCH",
            "5000",
            "retrieval.ef_search",
        ),
        (
            "RAGTIME__RETRIEVAL__BM25_REBUILD_AFTER",
            "1.5",
            "retrieval.bm25_rebuild_after",
        ),
        // Standbys serve the postgres engine's searches only.
        (
            "RAGTIME__DATABASE__READ_URLS",
            "[\"postgres://standby/db\"]",
            "database.read_urls",
        ),
        (
            "RAGTIME__DATABASE__SEARCH_CONNECTIONS",
            "0",
            "database.search_connections",
        ),
        ("RAGTIME__CHAT__DRY_MULTIPLIER", "9", "chat.dry_multiplier"),
        ("RAGTIME__CHAT__DRY_LAST_N", "0", "chat.dry_last_n"),
        ("RAGTIME__LLM__BATCH_SIZE", "8", "llm.batch_size"),
        (
            "RAGTIME__LLM__MAX_QUEUE_WAIT_MS",
            "99999999",
            "llm.max_queue_wait_ms",
        ),
        ("RAGTIME__BUDGETS__RERANK_MS", "999999", "budgets.rerank_ms"),
        ("RAGTIME__BUDGETS__EMBED_MS", "abc", "embed_ms"),
        ("RAGTIME__LLM__BASE_URL", "gpu:8000", "llm.base_url"),
        ("RAGTIME__BUDGETS__LLM_TTFT", "700", "llm_ttft"),
        (
            "RAGTIME__EMBED__MAX_BATCH_TOKENS",
            "8",
            "embed.max_batch_tokens",
        ),
    ];
    for (key, value, named) in cases {
        let out = ragtime(dir.path())
            .env(key, value)
            .arg("serve")
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{key}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(named), "{key}={value}: {err}");
        assert!(err.starts_with("ragtime: error: config"), "{err}");
    }
}
