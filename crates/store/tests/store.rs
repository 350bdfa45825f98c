//! The store against a real SQLite file and, when `RAGTIME_TEST_DATABASE_URL`
//! names one, a real PostgreSQL server (a fresh database per test).

use ragtime_store::{Backend, Store};

/// A fresh PostgreSQL database on the test server, dropped at the end.
struct PgDb {
    admin_url: String,
    name: String,
    url: String,
}

impl PgDb {
    async fn create() -> Option<PgDb> {
        let admin_url = std::env::var("RAGTIME_TEST_DATABASE_URL").ok()?;
        let name = format!("ragtime_t_{}", uuid::Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(&admin_url)
            .await
            .expect("connect to RAGTIME_TEST_DATABASE_URL");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .expect("create database");
        admin.close().await;
        let base = admin_url
            .rsplit_once('/')
            .map_or(admin_url.as_str(), |(b, _)| b);
        let url = format!("{base}/{name}");
        Some(PgDb {
            admin_url,
            name,
            url,
        })
    }

    async fn drop_db(self) {
        if let Ok(admin) = sqlx::PgPool::connect(&self.admin_url).await {
            let _ = sqlx::query(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&admin)
            .await;
        }
    }
}

async fn check_fresh_store(store: &Store) {
    store.ping().await.expect("ping");
    assert_eq!(
        store.collections().await.expect("collections"),
        vec!["default".to_owned()]
    );
}

#[tokio::test]
async fn sqlite_store_migrates_and_survives_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = Store::sqlite_url(dir.path());
    let store = Store::open(&url).await.expect("open sqlite");
    assert_eq!(store.backend(), Backend::Sqlite);
    check_fresh_store(&store).await;
    store.close().await;
    // Reopening applies no migration twice and keeps the data.
    let again = Store::open(&url).await.expect("reopen sqlite");
    check_fresh_store(&again).await;
    assert!(dir.path().join("ragtime.db").is_file());
}

#[tokio::test]
async fn postgres_store_migrates_and_survives_reopen() {
    let Some(db) = PgDb::create().await else {
        eprintln!("RAGTIME_TEST_DATABASE_URL is not set: PostgreSQL test did not run");
        return;
    };
    let store = Store::open(&db.url).await.expect("open postgres");
    assert_eq!(store.backend(), Backend::Postgres);
    check_fresh_store(&store).await;
    store.close().await;
    let again = Store::open(&db.url).await.expect("reopen postgres");
    check_fresh_store(&again).await;
    again.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn bad_urls_are_clear_errors() {
    let e = Store::open("mysql://x@y/z")
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("unsupported scheme"), "{e}");
    let e = Store::open("postgres://u:hunter2@127.0.0.1:1/db")
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(!e.contains("hunter2"), "password leaked: {e}");
}
