//! The store against a real SQLite file and, when `RAGTIME_TEST_DATABASE_URL`
//! names one, a real PostgreSQL server (a fresh database per test).

use ragtime_store::{
    Backend, JobStatus, JobStep, NewChunk, NewDocument, NewJob, Store, StoreError, Upsert,
};

use ragtime_testkit::PgDatabase as PgDb;

async fn check_fresh_store(store: &Store) {
    store.ping().await.expect("ping");
    assert_eq!(
        store.collections().await.expect("collections"),
        vec!["default".to_owned()]
    );
}

fn doc(id: &str, hash: &str, texts: &[&str]) -> NewDocument {
    NewDocument {
        external_id: id.into(),
        title: format!("title of {id}"),
        metadata: r#"{"year":2020,"lang":"en"}"#.into(),
        content_hash: hash.into(),
        chunks: texts
            .iter()
            .enumerate()
            .map(|(i, t)| NewChunk {
                position: i as i32,
                section: format!("Part {i}"),
                text: (*t).into(),
                tokens: 3,
                embedding: vec![i as f32, 0.5, -1.25],
            })
            .collect(),
    }
}

/// Create, read, replace, skip-unchanged and delete, with the corpus
/// version moving on every real write.
async fn exercise_documents(store: &Store) {
    let coll = store.ensure_collection("default").await.expect("default");
    assert_eq!(
        store.ensure_collection("default").await.expect("again"),
        coll
    );
    let other = store.ensure_collection("papers").await.expect("papers");
    assert_ne!(coll, other);
    assert_eq!(store.collection_id("nope").await.expect("lookup"), None);
    // Making `papers` is in the log: the version is 1.
    let v0 = store.corpus_version().await.expect("v0");
    assert_eq!(v0, 1);

    let r = store
        .upsert_document(coll, &doc("d1", "h1", &["alpha", "beta"]))
        .await
        .expect("insert");
    assert_eq!(r.upsert, Upsert::Created);
    assert_eq!(r.chunk_ids.len(), 2);
    assert_eq!(r.version, v0 + 1);
    assert_eq!(
        store.content_hash(coll, "d1").await.expect("hash"),
        Some("h1".into())
    );
    // Same id in another collection is another document.
    let r2 = store
        .upsert_document(other, &doc("d1", "h9", &["gamma"]))
        .await
        .expect("insert other");
    assert_ne!(r2.document_id, r.document_id);

    let same = store
        .upsert_document(coll, &doc("d1", "h1", &["alpha", "beta"]))
        .await
        .expect("same");
    assert_eq!(same.upsert, Upsert::Unchanged);
    assert_eq!(same.chunk_ids, r.chunk_ids);
    assert_eq!(
        store.corpus_version().await.expect("v"),
        v0 + 2,
        "an unchanged upsert writes nothing"
    );

    let rep = store
        .upsert_document(coll, &doc("d1", "h2", &["delta", "epsilon", "zeta"]))
        .await
        .expect("replace");
    assert_eq!(rep.upsert, Upsert::Replaced);
    assert_eq!(rep.document_id, r.document_id);
    assert_eq!(rep.removed_chunk_ids, r.chunk_ids);
    assert_eq!(rep.version, v0 + 3);
    let got = store
        .get_document(coll, "d1")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(got.collection, "default");
    assert_eq!(got.content_hash, "h2");
    let texts: Vec<_> = got.chunks.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(
        texts,
        ["delta", "epsilon", "zeta"],
        "old chunks are gone, new ones in order"
    );

    let all = store.index_chunks().await.expect("index chunks");
    assert_eq!(all.len(), 4);
    let z = all.iter().find(|c| c.text == "zeta").expect("zeta");
    assert_eq!(
        z.embedding,
        vec![2.0, 0.5, -1.25],
        "embeddings round-trip exactly"
    );
    assert_eq!(z.external_id, "d1");
    assert_eq!(z.section, "Part 2", "the section path round-trips");
    assert_eq!(got.chunks[1].section, "Part 1");
    assert_eq!(z.metadata, r#"{"year":2020,"lang":"en"}"#);

    let del = store
        .delete_document(coll, "d1")
        .await
        .expect("delete")
        .expect("existed");
    assert_eq!(del.removed_chunk_ids, rep.chunk_ids);
    assert_eq!(del.version, v0 + 4);
    assert_eq!(store.get_document(coll, "d1").await.expect("get"), None);
    assert_eq!(
        store
            .delete_document(coll, "d1")
            .await
            .expect("delete again"),
        None
    );
    assert_eq!(store.index_chunks().await.expect("chunks").len(), 1);

    // The log, in order, for followers: `papers` made, then d1 created in
    // both collections, replaced, deleted (the unchanged write is not in it).
    let log = store.log_since(0, 100).await.expect("log");
    let ops: Vec<(&str, &str)> = log
        .iter()
        .map(|e| (e.op.as_str(), e.external_id.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("create_collection", ""),
            ("upsert", "d1"),
            ("upsert", "d1"),
            ("upsert", "d1"),
            ("delete", "d1"),
        ]
    );
    assert!(log.windows(2).all(|w| w[0].id < w[1].id));
    assert_eq!(store.log_since(log[3].id, 100).await.expect("log").len(), 1);
    let now = store
        .document_index_chunks(other, "d1")
        .await
        .expect("chunks");
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].text, "gamma");
    assert!(
        store
            .document_index_chunks(coll, "d1")
            .await
            .expect("gone")
            .is_empty()
    );

    // A collection read in batches: the same chunks, in the same order.
    store
        .upsert_document(other, &doc("d2", "h4", &["one", "two", "three", "four"]))
        .await
        .expect("insert");
    let all: Vec<i64> = store
        .index_chunks_in(other)
        .await
        .expect("chunks")
        .iter()
        .map(|c| c.chunk_id)
        .collect();
    assert_eq!(all.len(), 5);
    let mut batches: Vec<Vec<i64>> = Vec::new();
    store
        .index_chunks_in_batches(other, 2, |b| {
            batches.push(b.iter().map(|c| c.chunk_id).collect());
            Ok::<_, StoreError>(())
        })
        .await
        .expect("batches");
    assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    assert_eq!(batches.concat(), all);
    // An error from the caller ends the read and is returned.
    let mut seen = 0;
    let stopped = store
        .index_chunks_in_batches(other, 2, |_| {
            seen += 1;
            Err(StoreError::Url("enough".into()))
        })
        .await;
    assert!(stopped.is_err());
    assert_eq!(seen, 1);
}

async fn exercise_conversations(store: &Store) {
    assert!(
        store
            .recent_turns("c1", 10)
            .await
            .expect("turns")
            .is_empty()
    );
    assert_eq!(
        store.conversation_collection("c1").await.expect("coll"),
        None
    );
    for i in 0..4 {
        store
            .append_turn("c1", "default", &format!("q{i}"), &format!("a{i}"))
            .await
            .expect("append");
    }
    store
        .append_turn("c2", "other", "elsewhere", "there")
        .await
        .expect("append");
    assert_eq!(
        store.conversation_collection("c1").await.expect("coll"),
        Some("default".to_owned())
    );
    // The last three messages, oldest first, of this conversation only.
    let t = store.recent_turns("c1", 3).await.expect("turns");
    let got: Vec<(&str, &str)> = t
        .iter()
        .map(|t| (t.role.as_str(), t.content.as_str()))
        .collect();
    assert_eq!(
        got,
        [("assistant", "a2"), ("user", "q3"), ("assistant", "a3")]
    );
    assert_eq!(store.recent_turns("c1", 100).await.expect("turns").len(), 8);

    // Retention: nothing is older than an hour ago; everything is older
    // than a moment from now.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let none = store
        .expire_conversations(now - 3_600_000)
        .await
        .expect("expire");
    assert_eq!(none, (0, 0));
    assert_eq!(store.recent_turns("c1", 100).await.expect("turns").len(), 8);
    let (messages, conversations) = store
        .expire_conversations(now + 1_000)
        .await
        .expect("expire");
    assert!(
        messages >= 8 && conversations >= 1,
        "{messages} {conversations}"
    );
    assert!(
        store
            .recent_turns("c1", 100)
            .await
            .expect("turns")
            .is_empty()
    );
    assert_eq!(
        store.conversation_collection("c1").await.expect("get"),
        None
    );
}

async fn exercise_budgets(store: &Store) {
    assert_eq!(store.latest_budget_version().await.expect("latest"), None);
    let a = store
        .add_budget_version(r#"{"total_ms":3000}"#, "admin", "changed")
        .await
        .expect("add");
    let b = store
        .add_budget_version(r#"{"total_ms":4000}"#, "admin", "rollback to version 1")
        .await
        .expect("add");
    assert!(b.version > a.version);
    assert!(b.changed_ms > 0);
    assert_eq!(
        store.latest_budget_version().await.expect("latest"),
        Some(b.clone())
    );
    assert_eq!(
        store.budget_version(a.version).await.expect("get"),
        Some(a.clone())
    );
    assert_eq!(store.budget_version(999).await.expect("get"), None);
    assert_eq!(store.budget_history(10).await.expect("history"), vec![b, a]);
}

async fn exercise_keys_and_tenant_budgets(store: &Store) {
    let k = store
        .add_api_key("k1", "acme", "ci", "abc123")
        .await
        .expect("add key");
    assert_eq!(store.api_key("k1").await.expect("get"), Some(k.clone()));
    assert_eq!(store.api_key("nope").await.expect("get"), None);
    assert!(store.revoke_api_key("k1").await.expect("revoke"));
    assert!(!store.revoke_api_key("k1").await.expect("revoke twice"));
    let k = store
        .api_key("k1")
        .await
        .expect("get")
        .expect("still listed");
    assert!(k.revoked_ms.is_some());
    assert_eq!(store.api_keys().await.expect("list").len(), 1);

    store
        .set_tenant_budgets("acme", "{\"a\":1}")
        .await
        .expect("set");
    store
        .set_tenant_budgets("acme", "{\"a\":2}")
        .await
        .expect("replace");
    assert_eq!(
        store.tenant_budgets().await.expect("list"),
        vec![("acme".to_owned(), "{\"a\":2}".to_owned())]
    );
    assert!(store.delete_tenant_budgets("acme").await.expect("delete"));
    assert!(
        !store
            .delete_tenant_budgets("acme")
            .await
            .expect("delete again")
    );
}

/// Collections: counts kept with every write, one owner's collections
/// told from another's (tenant names with `_`, which `LIKE` would take as a
/// wildcard), quotas that roll a write back whole, removal with
/// everything in it, tenants' own quotas.
async fn exercise_collections(store: &Store) {
    use ragtime_store::{Created, Limits, StoreError, TenantQuota, Usage};
    let limits = |owner, c, d, k| Limits {
        owner,
        max_collections: c,
        max_documents: d,
        max_chunks: k,
    };
    let a = match store
        .create_collection("a_b~one", "first", Some(limits("a_b~", 2, 3, 4)))
        .await
        .expect("create")
    {
        Created::New(id) => id,
        Created::Existing(_) => panic!("a_b~one existed"),
    };
    assert_eq!(
        store
            .create_collection("a_b~one", "", None)
            .await
            .expect("again"),
        Created::Existing(a)
    );
    store
        .create_collection("a_b~two", "", Some(limits("a_b~", 2, 3, 4)))
        .await
        .expect("second");
    // `axb~` is another tenant, though `a_b~` as a LIKE pattern matches it.
    store
        .create_collection("axb~x", "", Some(limits("axb~", 1, 3, 4)))
        .await
        .expect("other tenant");
    let third = store
        .create_collection("a_b~three", "", Some(limits("a_b~", 2, 3, 4)))
        .await;
    assert!(
        matches!(
            third,
            Err(StoreError::QuotaExceeded {
                limit: "max_collections",
                value: 2
            })
        ),
        "{third:?}"
    );
    assert_eq!(store.collection("a_b~three").await.expect("get"), None);
    let mine = store.list_collections(Some("a_b~")).await.expect("list");
    let names: Vec<_> = mine.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a_b~one", "a_b~two"]);
    assert_eq!(mine[0].description, "first");
    assert!(mine[0].created_ms > 0);
    // The default tenant's names hold no `~`.
    let plain = store.list_collections(Some("")).await.expect("plain");
    assert!(plain.iter().all(|c| !c.name.contains('~')) && !plain.is_empty());

    let l = limits("a_b~", 2, 3, 4);
    store
        .upsert_documents(
            a,
            &[doc("x", "h", &["1", "2"]), doc("y", "h", &["3"])],
            Some(l),
            None,
        )
        .await
        .expect("within quota");
    assert_eq!(
        store.usage("a_b~").await.expect("usage"),
        Usage {
            collections: 2,
            documents: 2,
            chunks: 3
        }
    );
    let v = store.corpus_version().await.expect("v");
    // Two more chunks would make five: refused, nothing written.
    let over = store
        .upsert_documents(
            a,
            &[doc("z", "h", &["4"]), doc("x", "h2", &["1", "2", "5"])],
            Some(l),
            None,
        )
        .await;
    assert!(
        matches!(
            over,
            Err(StoreError::QuotaExceeded {
                limit: "max_chunks",
                value: 4
            })
        ),
        "{over:?}"
    );
    assert_eq!(store.corpus_version().await.expect("v"), v);
    assert_eq!(store.get_document(a, "z").await.expect("get"), None);
    assert_eq!(store.usage("a_b~").await.expect("usage").chunks, 3);
    // A replacement with fewer chunks fits; a delete counts down.
    store
        .upsert_documents(a, &[doc("x", "h3", &["1"])], Some(l), None)
        .await
        .expect("smaller");
    store.delete_document(a, "y").await.expect("delete");
    let one = store
        .collection("a_b~one")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!((one.documents, one.chunks), (1, 1));

    let dropped = store
        .drop_collection(a)
        .await
        .expect("drop")
        .expect("existed");
    assert_eq!((dropped.documents, dropped.chunks), (1, 1));
    assert!(dropped.version > v);
    assert_eq!(store.collection("a_b~one").await.expect("get"), None);
    assert_eq!(store.get_document(a, "x").await.expect("get"), None);
    assert!(store.index_chunks_in(a).await.expect("chunks").is_empty());
    assert_eq!(store.drop_collection(a).await.expect("again"), None);
    assert_eq!(
        store.usage("a_b~").await.expect("usage"),
        Usage {
            collections: 1,
            documents: 0,
            chunks: 0
        }
    );

    // Every tenant's together: the same as adding up the list.
    let all = store.list_collections(None).await.expect("all");
    let total = store.total_usage().await.expect("total");
    assert_eq!(
        (total.collections, total.documents, total.chunks),
        (
            all.len() as i64,
            all.iter().map(|c| c.documents).sum(),
            all.iter().map(|c| c.chunks).sum()
        )
    );
    assert_eq!(store.tenant_quota("a_b").await.expect("none"), None);
    let q = TenantQuota {
        max_collections: None,
        max_documents: Some(7),
        max_chunks: None,
    };
    assert!(store.set_tenant_quota("a_b", Some(q)).await.expect("set"));
    assert_eq!(store.tenant_quota("a_b").await.expect("get"), Some(q));
    assert!(store.set_tenant_quota("a_b", None).await.expect("remove"));
    assert!(!store.set_tenant_quota("a_b", None).await.expect("again"));
}

#[tokio::test]
async fn sqlite_store_migrates_and_survives_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = Store::sqlite_url(dir.path());
    let store = Store::open(&url).await.expect("open sqlite");
    assert_eq!(store.backend(), Backend::Sqlite);
    assert!(
        store.change_listener().await.expect("listener").is_none(),
        "SQLite has no notifications: its followers poll"
    );
    check_fresh_store(&store).await;
    store.close().await;
    // Reopening applies no migration twice and keeps the data.
    let again = Store::open(&url).await.expect("reopen sqlite");
    check_fresh_store(&again).await;
    assert!(dir.path().join("ragtime.db").is_file());
    exercise_documents(&again).await;
    exercise_conversations(&again).await;
    exercise_budgets(&again).await;
    exercise_keys_and_tenant_budgets(&again).await;
    exercise_collections(&again).await;
    exercise_jobs(&again, &url).await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL (RAGTIME_TEST_DATABASE_URL)"]
async fn needs_postgres_store_migrates_and_survives_reopen() {
    let db = PgDb::create("ragtime_t").await;
    let store = Store::open(&db.url).await.expect("open postgres");
    assert_eq!(store.backend(), Backend::Postgres);
    check_fresh_store(&store).await;
    store.close().await;
    let again = Store::open(&db.url).await.expect("reopen postgres");
    check_fresh_store(&again).await;
    exercise_documents(&again).await;
    exercise_conversations(&again).await;
    exercise_budgets(&again).await;
    exercise_keys_and_tenant_budgets(&again).await;
    exercise_collections(&again).await;
    exercise_jobs(&again, &db.url).await;
    exercise_change_notifications(&again).await;
    again.close().await;
    db.drop_db().await;
}

/// A job's progress moves with the documents it counts, in one
/// transaction; a job nobody beats for reads as interrupted.
async fn exercise_jobs(store: &Store, url: &str) {
    let coll = store.ensure_collection("jobs").await.expect("collection");
    let job = NewJob {
        id: "job1",
        tenant: "t",
        collection: "jobs",
        documents: 3,
        chunks: 4,
    };
    store.create_job(&job).await.expect("create");
    let j = store.job("job1").await.expect("read").expect("there");
    assert_eq!(
        (
            j.status,
            j.documents_total,
            j.chunks_total,
            j.documents_done
        ),
        (JobStatus::Queued, 3, 4, 0)
    );
    store.start_job("job1").await.expect("start");
    let step = |documents, chunks| JobStep {
        id: "job1".into(),
        documents,
        chunks,
    };
    store
        .upsert_documents(
            coll,
            &[doc("j1", "h", &["a", "b"]), doc("j2", "h", &["c"])],
            None,
            Some(&step(2, 3)),
        )
        .await
        .expect("batch");
    let j = store.job("job1").await.expect("read").expect("there");
    assert_eq!(
        (j.status, j.documents_done, j.chunks_done, j.created),
        (JobStatus::Running, 2, 3, 2)
    );
    // A batch refused by a quota moves nothing, the job included.
    let l = ragtime_store::Limits {
        owner: "",
        max_collections: 100,
        max_documents: 1,
        max_chunks: 100,
    };
    let refused = store
        .upsert_documents(coll, &[doc("j3", "h", &["d"])], Some(l), Some(&step(1, 1)))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(
        store
            .job("job1")
            .await
            .expect("read")
            .expect("there")
            .documents_done,
        2
    );
    // A batch of unchanged documents still counts.
    store
        .upsert_documents(coll, &[], None, Some(&step(1, 1)))
        .await
        .expect("unchanged batch");
    let j = store.job("job1").await.expect("read").expect("there");
    assert_eq!(
        (j.documents_done, j.created, j.replaced, j.unchanged),
        (3, 2, 0, 1)
    );
    assert!(!store.job_heartbeat("job1").await.expect("beat"));
    let asked = store.request_job_cancel("job1").await.expect("cancel");
    assert!(asked.expect("there").cancel_requested);
    assert!(
        store.job_heartbeat("job1").await.expect("beat"),
        "cancel seen"
    );
    store
        .finish_job("job1", JobStatus::Cancelled, None)
        .await
        .expect("finish");
    let j = store.job("job1").await.expect("read").expect("there");
    assert_eq!(j.status, JobStatus::Cancelled);
    assert!(j.finished_ms.is_some());
    // A job whose record is gone stops.
    assert!(store.job_heartbeat("nope").await.expect("no such job"));
    // A running job whose process stopped beating is interrupted.
    store
        .create_job(&NewJob { id: "job2", ..job })
        .await
        .expect("create");
    store.start_job("job2").await.expect("start");
    let backdate = "UPDATE jobs SET heartbeat_ms = heartbeat_ms - 60000 WHERE id = 'job2'";
    match store.backend() {
        Backend::Sqlite => {
            let p = sqlx::SqlitePool::connect(url).await.expect("raw");
            sqlx::query(backdate).execute(&p).await.expect("backdate");
        }
        Backend::Postgres => {
            let p = sqlx::PgPool::connect(url).await.expect("raw");
            sqlx::query(backdate).execute(&p).await.expect("backdate");
        }
    }
    let j = store.job("job2").await.expect("read").expect("there");
    assert_eq!(j.status, JobStatus::Interrupted);
    let listed = store.jobs("t", 10).await.expect("list");
    assert_eq!(
        listed.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["job2", "job1"]
    );
    assert!(store.jobs("other", 10).await.expect("list").is_empty());
    assert_eq!(
        store.expire_jobs(j.heartbeat_ms + 1).await.expect("expire"),
        1,
        "only the one beaten before the cut-off"
    );
    assert!(store.job("job2").await.expect("read").is_none());
    assert!(store.delete_job("job1").await.expect("delete"));
    assert!(!store.delete_job("job1").await.expect("again"));
    assert!(store.job("job1").await.expect("read").is_none());
}

/// A committed change-log entry wakes a listener; nothing else does.
async fn exercise_change_notifications(store: &Store) {
    let mut l = store
        .change_listener()
        .await
        .expect("listen")
        .expect("PostgreSQL has notifications");
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(300), l.next()).await;
    assert!(quiet.is_err(), "woken with nothing written");
    store
        .create_collection("notified", "", None)
        .await
        .expect("create");
    tokio::time::timeout(std::time::Duration::from_secs(5), l.next())
        .await
        .expect("a notification within 5 s of the commit")
        .expect("listener");
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

/// Writers on several connection pools (replicas) at a quota's edge: the
/// limit holds exactly; a name created by many at once is made once and
/// found by the rest (never a unique-violation error).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL (RAGTIME_TEST_DATABASE_URL)"]
async fn needs_postgres_quotas_hold_across_concurrent_writers() {
    quotas_hold_across_concurrent_writers(PgDb::create("ragtime_q").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_quotas_hold_across_concurrent_writers() {
    let server = ragtime_testkit::PgServer::start();
    quotas_hold_across_concurrent_writers(PgDb::create_on(&server.admin_url, "ragtime_q").await)
        .await;
}

async fn quotas_hold_across_concurrent_writers(db: PgDb) {
    use ragtime_store::{Created, Limits, StoreError};
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Store::open(&db.url).await.expect("open"));
    }
    let limits = |c, d| Limits {
        owner: "t~",
        max_collections: c,
        max_documents: d,
        max_chunks: 1_000_000,
    };
    // 24 creations of new names, 5 allowed.
    let made = futures_of(24, |i| {
        let s = stores[i % 4].clone();
        async move {
            s.create_collection(&format!("t~c{i}"), "", Some(limits(5, 1000)))
                .await
        }
    })
    .await;
    let new = made
        .iter()
        .filter(|r| matches!(r, Ok(Created::New(_))))
        .count();
    let refused = made
        .iter()
        .filter(|r| {
            matches!(
                r,
                Err(StoreError::QuotaExceeded {
                    limit: "max_collections",
                    ..
                })
            )
        })
        .count();
    assert_eq!((new, refused), (5, 19), "{made:?}");
    // One name, 16 creations at once.
    let same = futures_of(16, |i| {
        let s = stores[i % 4].clone();
        async move { s.create_collection("u~same", "", None).await }
    })
    .await;
    let new = same
        .iter()
        .filter(|r| matches!(r, Ok(Created::New(_))))
        .count();
    let found = same
        .iter()
        .filter(|r| matches!(r, Ok(Created::Existing(_))))
        .count();
    assert_eq!((new, found), (1, 15), "{same:?}");
    // 30 one-document ingests into the owner's collections, 12 documents allowed.
    let colls: Vec<i64> = stores[0]
        .list_collections(Some("t~"))
        .await
        .expect("list")
        .iter()
        .map(|c| c.id)
        .collect();
    let wrote = futures_of(30, |i| {
        let (s, coll) = (stores[i % 4].clone(), colls[i % colls.len()]);
        async move {
            let d = doc(&format!("d{i}"), &format!("h{i}"), &["x"]);
            s.upsert_documents(coll, &[d], Some(limits(5, 12)), None)
                .await
        }
    })
    .await;
    let ok = wrote.iter().filter(|r| r.is_ok()).count();
    let refused = wrote
        .iter()
        .filter(|r| {
            matches!(
                r,
                Err(StoreError::QuotaExceeded {
                    limit: "max_documents",
                    ..
                })
            )
        })
        .count();
    assert_eq!((ok, refused), (12, 18), "{wrote:?}");
    assert_eq!(stores[0].usage("t~").await.expect("usage").documents, 12);
    for s in stores {
        s.close().await;
    }
    db.drop_db().await;
}

/// Change-log entries become visible in the order of their ids: a reader
/// that moves past the highest id it has seen, while writers on several
/// pools upsert and delete at once, misses none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL (RAGTIME_TEST_DATABASE_URL)"]
async fn needs_postgres_the_change_log_shows_no_entry_below_one_already_seen() {
    change_log_in_order(PgDb::create("ragtime_log").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_the_change_log_shows_no_entry_below_one_already_seen() {
    let server = ragtime_testkit::PgServer::start();
    change_log_in_order(PgDb::create_on(&server.admin_url, "ragtime_log").await).await;
}

/// PostgreSQL 18 with pgvector: the store migrates and works there as on
/// the CI server, and the `vector` extension is there to be made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_store_migrates_on_postgres_18_with_pgvector() {
    let server = ragtime_testkit::PgServer::start();
    let db = PgDb::create_on(&server.admin_url, "ragtime_t").await;
    let store = Store::open(&db.url).await.expect("open postgres 18");
    check_fresh_store(&store).await;
    exercise_documents(&store).await;
    exercise_collections(&store).await;
    exercise_change_notifications(&store).await;
    let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
    sqlx::query("CREATE EXTENSION vector")
        .execute(&pool)
        .await
        .expect("pgvector");
    let (pg, vector): (String, String) = sqlx::query_as(
        "SELECT current_setting('server_version'), extversion FROM pg_extension WHERE extname = 'vector'",
    )
    .fetch_one(&pool)
    .await
    .expect("versions");
    assert!(pg.starts_with("18."), "{pg}");
    assert!(vector.as_str() >= "0.8", "{vector}");
    pool.close().await;
    store.close().await;
}

/// See [`needs_postgres_the_change_log_shows_no_entry_below_one_already_seen`].
async fn change_log_in_order(db: PgDb) {
    let reader = Store::open(&db.url).await.expect("open");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let s = Store::open(&db.url).await.expect("open");
        // A collection each: writes into one collection take turns at its
        // row anyway; the log is shared by all.
        let coll = s
            .ensure_collection(&format!("c{w}"))
            .await
            .expect("collection");
        writers.push(tokio::spawn(async move {
            for i in 0..150 {
                let id = format!("w{w}d{}", i % 40);
                if i % 5 == 4 {
                    s.delete_document(coll, &id).await.expect("delete");
                } else {
                    let d = doc(&id, &format!("h{i}"), &["a", "b"]);
                    s.upsert_documents(coll, &[d], None, None)
                        .await
                        .expect("upsert");
                }
            }
            s.close().await;
        }));
    }
    let follow = {
        let (reader, stop) = (reader.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut applied, mut seen) = (0i64, std::collections::BTreeSet::new());
            loop {
                let last_pass = stop.load(std::sync::atomic::Ordering::Acquire);
                for e in reader.log_since(applied, 1000).await.expect("log") {
                    seen.insert(e.id);
                    applied = applied.max(e.id);
                }
                if last_pass {
                    return seen;
                }
            }
        })
    };
    for w in writers {
        w.await.expect("writer");
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let seen = follow.await.expect("reader");
    let all: std::collections::BTreeSet<i64> = reader
        .log_since(0, 100_000)
        .await
        .expect("log")
        .iter()
        .map(|e| e.id)
        .collect();
    let missed: Vec<&i64> = all.difference(&seen).collect();
    assert!(
        missed.is_empty(),
        "passed for ever: {missed:?} of {}",
        all.len()
    );
    reader.close().await;
    db.drop_db().await;
}

/// Runs `n` futures made by `f` at once; their outcomes in order.
async fn futures_of<F, T>(n: usize, f: impl Fn(usize) -> F) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = (0..n).map(|i| tokio::spawn(f(i))).collect();
    let mut out = Vec::with_capacity(n);
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

/// The change log is kept from the lowest live replica's position on; a
/// replica not heard from is forgotten; entries of removed collections'
/// documents go; where the log now starts is recorded.
#[tokio::test]
async fn the_change_log_is_trimmed_below_every_live_replica() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&Store::sqlite_url(dir.path()))
        .await
        .expect("open");
    let keep = store.ensure_collection("keep").await.expect("keep");
    let gone = store.ensure_collection("gone").await.expect("gone");
    let mut versions = Vec::new();
    for i in 0..6 {
        let d = doc(&format!("d{i}"), &format!("h{i}"), &["x"]);
        let r = store.upsert_document(keep, &d).await.expect("upsert");
        versions.push(r.version);
        store.upsert_document(gone, &d).await.expect("upsert");
    }
    assert_eq!(
        store.trim_log(0).await.expect("trim"),
        0,
        "no replica reported yet"
    );
    store.report_position("a", versions[2]).await.expect("a");
    store.report_position("b", versions[4]).await.expect("b");
    store
        .drop_collection(gone)
        .await
        .expect("drop")
        .expect("there");
    let all = store.log_since(0, 1000).await.expect("log");
    store.trim_log(0).await.expect("trim");
    let left = store.log_since(0, 1000).await.expect("log");
    assert_eq!(store.log_trimmed_below().await.expect("below"), versions[2]);
    let kept: Vec<i64> = all
        .iter()
        .filter(|e| e.id >= versions[2])
        .map(|e| e.id)
        .collect();
    let left_ids: Vec<i64> = left.iter().map(|e| e.id).collect();
    assert_eq!(
        left_ids, kept,
        "below the lowest position, everything goes (the removed collection's entries too); from it on, nothing"
    );
    assert_eq!(
        store.corpus_version().await.expect("version"),
        all.last().expect("entries").id,
        "the corpus version stays"
    );
    // "a" goes quiet: once stale, the log no longer waits for it.
    let after_a = ragtime_store::now_ms() + 1;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store.report_position("b", versions[4]).await.expect("b");
    store.trim_log(0).await.expect("trim");
    assert_eq!(
        store.log_trimmed_below().await.expect("below"),
        versions[2],
        "a still counts"
    );
    store.trim_log(after_a).await.expect("trim");
    assert_eq!(store.log_trimmed_below().await.expect("below"), versions[4]);
    // Each collection records the last of its own entries removed: a
    // collection written to no more since then is behind no trim.
    let quiet = store.ensure_collection("quiet").await.expect("quiet");
    let created = store.corpus_version().await.expect("version");
    let last_keep = all
        .iter()
        .filter(|e| e.collection_id == keep && e.id < versions[4])
        .map(|e| e.id)
        .max();
    assert_eq!(
        store.collection_log_trimmed_to(keep).await.expect("q"),
        last_keep.expect("trimmed")
    );
    assert_eq!(store.collection_log_trimmed_to(quiet).await.expect("q"), 0);
    let end = store
        .upsert_document(keep, &doc("d9", "h9", &["x"]))
        .await
        .expect("upsert")
        .version;
    store.report_position("b", end).await.expect("b");
    store.trim_log(0).await.expect("trim");
    assert_eq!(store.log_trimmed_below().await.expect("below"), end);
    assert_eq!(
        store.collection_log_trimmed_to(quiet).await.expect("q"),
        created,
        "its creation's entry went"
    );
    let id = store.identity().await.expect("identity");
    assert_eq!(id.len(), 32, "{id}");
    assert_eq!(store.identity().await.expect("identity"), id, "it stays");
    store.forget_replica("b").await.expect("forget");
    store.trim_log(0).await.expect("trim");
    assert_eq!(
        store.log_trimmed_below().await.expect("below"),
        end,
        "never moves back"
    );
}
