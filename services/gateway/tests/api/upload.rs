//! File upload (`multipart/form-data` on `POST /v1/documents`) and
//! `ragtime ingest FILE…`.

use crate::helpers::{TestApp, error_of, ids};
use reqwest::multipart::{Form, Part};
use serde_json::{Value, json};
use std::io::Write;

/// A one-page PDF with `text` in Helvetica, offsets computed so the xref
/// table is exact.
pub fn tiny_pdf(text: &str) -> Vec<u8> {
    let stream = format!("BT /F1 12 Tf 72 720 Td ({text}) Tj ET");
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_owned(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_owned(),
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>".to_owned(),
        format!("<< /Length {} >>\nstream\n{stream}\nendstream", stream.len()),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>".to_owned(),
    ];
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{o}\nendobj\n", i + 1).as_bytes());
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for o in offsets {
        out.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    out
}

fn file(name: &str, bytes: Vec<u8>) -> Part {
    Part::bytes(bytes).file_name(name.to_owned())
}

/// `POST /v1/documents` with a multipart `form`.
async fn upload(app: &TestApp, form: Form) -> reqwest::Response {
    app.http
        .post(app.url("/v1/documents"))
        .multipart(form)
        .send()
        .await
        .expect("upload")
}

/// The upload is refused with 413 naming `field` and the file `name`.
async fn too_large(app: &TestApp, form: Form, field: &str, name: &str) {
    let (s, code, f, body) = error_of(upload(app, form).await).await;
    assert_eq!(
        (s, code.as_str(), f.as_deref()),
        (413, "payload_too_large", Some(field)),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(name), "{body}");
}

/// A file that expands past what ragtime reads (a gzip bomb), and one whose
/// text is past the per-document limit: 413 naming the file, nothing
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_that_expand_past_the_limits_are_refused_naming_the_file() {
    let app = TestApp::spawn().await;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let line =
        br#"{"_id": "z", "text": "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"}"#;
    let mut written = 0u64;
    while written <= ragtime_parse::MAX_DECOMPRESSED_BYTES {
        let chunk = line.repeat(16 * 1024);
        gz.write_all(&chunk).expect("gzip");
        written += chunk.len() as u64;
    }
    let bomb = gz.finish().expect("gzip");
    assert!(bomb.len() < 8 * 1024 * 1024, "{} bytes sent", bomb.len());
    let form = Form::new()
        .part("file", file("ok.txt", b"fine".to_vec()))
        .part("file", file("bomb.jsonl.gz", bomb));
    too_large(&app, form, "file[1]", "bomb.jsonl.gz").await;
    let long = "word ".repeat(420_000);
    let form = Form::new().part("file", file("long.txt", long.into_bytes()));
    too_large(&app, form, "file[0]", "long.txt").await;
    for id in ["ok.txt", "long.txt"] {
        let r = app.get(&format!("/v1/documents/{id}")).await;
        assert_eq!(r.status(), 404, "{id} was written");
    }
}

/// Many compressed parts, each under the per-file bound, are bounded all
/// together: the part that passes `limits.max_upload_expanded_bytes` is a
/// 413 naming it and the setting, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_s_files_are_bounded_all_together_once_decompressed() {
    let app = TestApp::builder()
        .config(|c| c.limits.max_upload_expanded_bytes = 1024 * 1024)
        .spawn()
        .await;
    let part = |i: usize| {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for j in 0..6000 {
            let line = format!(
                "{{\"_id\": \"d{i}-{j}\", \"text\": \"{}\"}}\n",
                "w".repeat(120)
            );
            gz.write_all(line.as_bytes()).expect("gzip");
        }
        gz.finish().expect("gzip")
    };
    let mut form = Form::new();
    for i in 0..4 {
        form = form.part("file", file(&format!("part{i}.jsonl.gz"), part(i)));
    }
    let (s, code, field, body) = error_of(upload(&app, form).await).await;
    assert_eq!((s, code.as_str()), (413, "payload_too_large"), "{body}");
    assert_eq!(field.as_deref(), Some("file[1]"), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("part1.jsonl.gz") && message.contains("limits.max_upload_expanded_bytes"),
        "{body}"
    );
    let r = app.get("/v1/documents/d0-0").await;
    assert_eq!(r.status(), 404, "written");
    app.shutdown().await.expect("shutdown");
}

async fn search_ids(app: &TestApp, body: Value) -> Vec<String> {
    ids(&app.search(body).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploaded_files_of_every_type_become_searchable_documents() {
    let app = TestApp::builder().real_embeddings().spawn().await;
    let form = Form::new()
        .text("collection", "uploads")
        .text("metadata", r#"{"team": "bio"}"#)
        .part("file", file("notes.txt", b"Ribosomes translate messenger RNA into protein.".to_vec()))
        .part("file", file("guide.md", b"# Photosynthesis\n\nChloroplasts turn light into sugar.".to_vec()))
        .part("file", file("page.html", b"<html><head><title>Volcanoes</title><script>var lava=1</script></head><body><p>Magma rises through the crust &amp; erupts.</p></body></html>".to_vec()))
        .part("file", file("paper.pdf", tiny_pdf("Tardigrades survive the vacuum of space.")));
    let r = upload(&app, form).await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["collection"], "uploads");
    assert_eq!(
        body["documents"].as_array().map(Vec::len),
        Some(4),
        "{body}"
    );

    let q = |text: &str| json!({"query": text, "collection": "uploads", "top_k": 1});
    assert_eq!(
        search_ids(&app, q("how is protein made from mRNA")).await,
        ["notes.txt"]
    );
    assert_eq!(
        search_ids(&app, q("plants make sugar from light")).await,
        ["guide.md"]
    );
    assert_eq!(search_ids(&app, q("magma eruption")).await, ["page.html"]);
    assert_eq!(
        search_ids(&app, q("tardigrades in space")).await,
        ["paper.pdf"]
    );
    assert!(
        search_ids(
            &app,
            json!({"query": "lava", "collection": "uploads", "mode": "lexical"})
        )
        .await
        .is_empty(),
        "script text is not indexed"
    );

    let doc: Value = app
        .http
        .get(app.url("/v1/documents/page.html?collection=uploads"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(doc["title"], "Volcanoes");
    assert_eq!(doc["metadata"]["team"], "bio");
    assert_eq!(doc["metadata"]["source"], "page.html");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_are_refused_and_write_nothing() {
    let app = TestApp::builder()
        .config(|c| c.server.body_limit_bytes = 64 * 1024)
        .spawn()
        .await;
    let cases: Vec<(Form, u16, &str)> = vec![
        (
            Form::new()
                .part("file", file("ok.txt", b"fine".to_vec()))
                .part("file", file("bad.txt", vec![0xff, 0xfe, 0x00])),
            422,
            "file[1]",
        ),
        (
            Form::new().part("file", file("slides.pptx", b"x".to_vec())),
            422,
            "file[0]",
        ),
        (
            Form::new().part("file", file("broken.pdf", b"%PDF-1.4 garbage".to_vec())),
            422,
            "file[0]",
        ),
        (
            Form::new().part("file", file("empty.md", b"   ".to_vec())),
            422,
            "file[0]",
        ),
        (
            Form::new()
                .text("collection", "has space")
                .part("file", file("a.txt", b"x".to_vec())),
            422,
            "collection",
        ),
        (
            Form::new()
                .text("metadata", "[1]")
                .part("file", file("a.txt", b"x".to_vec())),
            422,
            "metadata",
        ),
        (Form::new().text("collection", "c"), 422, "file"),
        (Form::new().text("colour", "red"), 422, "colour"),
    ];
    for (form, status, field) in cases {
        let r = upload(&app, form).await;
        let (s, _, f, body) = error_of(r).await;
        assert_eq!((s, f.as_deref()), (status, Some(field)), "{body}");
    }
    let big = Form::new().part("file", file("big.txt", vec![b'a'; 200 * 1024]));
    let r = upload(&app, big).await;
    let (s, code, _, _) = error_of(r).await;
    assert_eq!((s, code.as_str()), (413, "payload_too_large"));
    let r = app
        .http
        .get(app.url("/v1/documents/ok.txt"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 404, "a refused upload wrote a document");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingest_command_loads_beir_jsonl_that_a_server_then_serves() {
    let data = tempfile::tempdir().expect("data");
    let files = tempfile::tempdir().expect("files");
    let corpus = files.path().join("corpus.jsonl.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for (id, title, text) in [
        (
            "d1",
            "Insulin",
            "Insulin lowers blood glucose by promoting uptake into cells.",
        ),
        (
            "d2",
            "Glaciers",
            "Glaciers retreat as average temperatures rise.",
        ),
        (
            "d3",
            "Sleep",
            "Sleep deprivation impairs memory consolidation.",
        ),
    ] {
        let line = json!({"_id": id, "title": title, "text": text, "metadata": {}});
        writeln!(gz, "{line}").expect("write");
    }
    std::fs::write(&corpus, gz.finish().expect("gzip")).expect("write corpus");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ragtime"))
            .args(args)
            .env("RAGTIME__DATA_DIR", data.path())
            .env_remove("RAGTIME__DATABASE_URL")
            .output()
            .expect("run ragtime ingest")
    };
    let out = run(&[
        "ingest",
        "--collection",
        "beir",
        corpus.to_str().unwrap_or_default(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ingested 3 documents into \"beir\""),
        "{stdout}"
    );
    assert!(stdout.contains("chunks/s"), "{stdout}");

    // A second run re-embeds nothing.
    let out = run(&[
        "ingest",
        "--collection",
        "beir",
        corpus.to_str().unwrap_or_default(),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("(3 unchanged, 0 chunks embedded)"));

    // A bad file fails the command and writes nothing.
    let bad = files.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"_id\": \"x\", \"text\": \"ok\"}\n{not json}\n").expect("write");
    let out = run(&[
        "ingest",
        "--collection",
        "other",
        bad.to_str().unwrap_or_default(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));

    // The command embedded with the real model: so must the server.
    let app = TestApp::builder()
        .real_embeddings()
        .data_dir(data.path())
        .spawn()
        .await;
    let ready = app.wait_ready().await;
    assert_eq!(ready["checks"]["embed"]["chunks_indexed"], 3);
    assert_eq!(
        search_ids(
            &app,
            json!({"query": "blood sugar hormone", "collection": "beir", "top_k": 1})
        )
        .await,
        ["d1"]
    );
    let r = app
        .post_json("/v1/search", json!({"query": "x", "collection": "other"}))
        .await;
    assert_eq!(r.status(), 404, "the failed ingest created nothing");
}

/// `kill -9` in the middle of an ingest: every document is either fully
/// stored (with all its chunks and its log entry) or absent, everything the
/// command reported as done is there, and a server started afterwards
/// indexes exactly what the store holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_ingest_loses_nothing_acknowledged_and_leaves_no_half_document() {
    use std::io::{BufRead, BufReader};
    let data = tempfile::tempdir().expect("data");
    let files = tempfile::tempdir().expect("files");
    let corpus = files.path().join("many.jsonl");
    let mut f = std::fs::File::create(&corpus).expect("create");
    for i in 0..400 {
        let text = format!("Document {i} discusses topic {} in some detail. ", i % 17).repeat(30);
        writeln!(
            f,
            "{}",
            json!({"_id": format!("doc{i}"), "title": format!("Title {i}"), "text": text})
        )
        .expect("write");
    }
    drop(f);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ragtime"))
        .args([
            "ingest",
            "--batch",
            "10",
            corpus.to_str().unwrap_or_default(),
        ])
        .env("RAGTIME__DATA_DIR", data.path())
        .env_remove("RAGTIME__DATABASE_URL")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let mut acknowledged = 0usize;
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("ingest: ") {
            acknowledged = rest
                .split('/')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if acknowledged >= 30 {
                break;
            }
        }
    }
    child.kill().expect("kill -9");
    let _ = child.wait();
    assert!(
        (30..400).contains(&acknowledged),
        "killed at {acknowledged}"
    );

    let url = ragtime_store::Store::sqlite_url(data.path());
    let pool = sqlx::SqlitePool::connect(&url).await.expect("open db");
    let docs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM documents")
        .fetch_one(&pool)
        .await
        .expect("count");
    let empty: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM documents d WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.document_id = d.id)")
        .fetch_one(&pool)
        .await
        .expect("count");
    let logged: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ingest_log")
        .fetch_one(&pool)
        .await
        .expect("count");
    let chunks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM chunks")
        .fetch_one(&pool)
        .await
        .expect("count");
    pool.close().await;
    assert!(
        docs as usize >= acknowledged,
        "{docs} stored but {acknowledged} acknowledged"
    );
    assert_eq!(docs % 10, 0, "a batch is one transaction: all or nothing");
    assert_eq!(empty, 0, "a document without its chunks was left behind");
    assert_eq!(logged, docs, "every stored document has its log entry");

    // The command embedded with the real model: so must the server.
    let app = TestApp::builder()
        .real_embeddings()
        .data_dir(data.path())
        .spawn()
        .await;
    let ready = app.wait_ready().await;
    assert_eq!(
        ready["checks"]["embed"]["chunks_indexed"], chunks,
        "the indexes hold exactly what the store holds"
    );
}

/// Two files with one name in two folders are two documents, through the
/// upload route and through `ragtime ingest DIR` (which walks the folder,
/// reading the file types it knows and skipping hidden entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_named_files_in_two_folders_stay_two_documents() {
    let app = TestApp::builder().spawn().await;
    let form = Form::new()
        .part(
            "file",
            file(
                "guide/build-cache.md",
                b"# Build cache\nThe guide says to run the build twice.".to_vec(),
            ),
        )
        .part(
            "file",
            file(
                "./reference/build-cache.md",
                b"# Build cache\nThe reference lists every cache key.".to_vec(),
            ),
        );
    let r = upload(&app, form).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    for (id, says) in [
        ("guide/build-cache.md", "run the build twice"),
        ("reference/build-cache.md", "every cache key"),
    ] {
        let r = app
            .http
            .get(app.url(&format!("/v1/documents/{}", id.replace('/', "%2F"))))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 200, "{id}");
        let doc: Value = r.json().await.expect("json");
        assert!(doc["chunks"].to_string().contains(says), "{id}: {doc}");
        assert_eq!(doc["metadata"]["source"], id);
    }
    app.shutdown().await.expect("shutdown");

    let data = tempfile::tempdir().expect("data");
    let dir = tempfile::tempdir().expect("files");
    for (path, text) in [
        ("docs/a/README.md", "# A\nAlpha explains the first module."),
        ("docs/b/README.md", "# B\nBeta explains the second module."),
        ("docs/.git/HEAD.md", "# hidden\nnot a document"),
        ("docs/b/logo.png", "not text"),
        (
            "docs/fonts/OPEN-SANS-LICENSE.txt",
            "Apache License, Version 2.0",
        ),
        (
            "docs/toc.html",
            "<html><body><ol><li>A</li><li>B</li></ol></body></html>",
        ),
        ("pictures/logo.png", "not text"),
    ] {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
    }
    // Run from another folder with no data_dir set: the default store is
    // the user's (`$XDG_DATA_HOME/ragtime`), not the working folder's, and
    // the command says which store it wrote to.
    let ingest = |folder: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ragtime"))
            .args(["ingest", "--collection", "site", folder])
            .current_dir(dir.path())
            .env("XDG_DATA_HOME", data.path())
            .env_remove("RAGTIME__DATA_DIR")
            .env_remove("RAGTIME__DATABASE_URL")
            .output()
            .expect("run ragtime ingest")
    };
    let out = ingest("docs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // A licence and a table of contents are passed over, and named.
    assert!(
        stderr.contains("skipped fonts/OPEN-SANS-LICENSE.txt: a licence file"),
        "{stderr}"
    );
    assert!(
        stderr.contains("skipped toc.html: a table of contents"),
        "{stderr}"
    );
    // A folder with nothing ragtime reads names what it found.
    let none = ingest("pictures");
    let said = String::from_utf8_lossy(&none.stderr);
    assert!(!none.status.success());
    assert!(
        said.contains("found .png") && said.contains(".rs") && said.contains(".html"),
        "{said}"
    );
    let store = data.path().join("ragtime");
    assert!(
        stdout.contains(&format!(
            "ingested 2 documents into \"site\" of the SQLite store in {}",
            store.display()
        )),
        "{stdout}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "nothing in the working folder"
    );
    let app = TestApp::builder()
        .real_embeddings()
        .data_dir(&store)
        .spawn()
        .await;
    app.wait_ready().await;
    // Ids are the paths from the folder given, not from where it ran.
    for id in ["a/README.md", "b/README.md"] {
        let r = app
            .http
            .get(app.url(&format!(
                "/v1/documents/{}?collection=site",
                id.replace('/', "%2F")
            )))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 200, "{id}");
    }
    app.shutdown().await.expect("shutdown");
}

/// Pages keep their structure: chunks carry their section path (in search
/// results, stored chunks and the answer's citations), and a line found on
/// most pages of an upload (the site's chrome) is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploaded_pages_keep_their_sections_and_lose_their_chrome() {
    let app = TestApp::builder().spawn().await;
    let page = |title: &str, section: &str, body: &str| {
        format!(
            "<html><head><title>{title} - The Manual</title></head><body><main>\
             <p>Keyboard shortcuts | Press \u{2190} or \u{2192} to navigate</p>\
             <h1>{title}</h1><p>An introduction to {title}.</p>\
             <h2>{section}</h2><p>{body}</p></main></body></html>"
        )
        .into_bytes()
    };
    // A section longer than a chunk: its last chunk lacks the heading line.
    let long = format!(
        "{} Local names stay apart across expansions.",
        "A macro expands where it is called, in the caller's crate. ".repeat(30)
    );
    let mut form = Form::new();
    for (i, (title, section, body)) in [
        (
            "Type layout",
            "Size and alignment",
            "A bool has a size and alignment of 1.",
        ),
        (
            "Closures",
            "Capture modes",
            "Closures capture variables by reference first.",
        ),
        (
            "Traits",
            "Object safety",
            "Object safe traits can be the base of a trait object.",
        ),
        ("Macros", "Hygiene", long.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        form = form.part(
            "file",
            file(&format!("ref/p{i}.html"), page(title, section, body)),
        );
    }
    let r = upload(&app, form).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let found = app
        .search(json!({"query": "bool size alignment", "mode": "lexical", "top_k": 1}))
        .await;
    let hit = &found["results"][0];
    assert_eq!(hit["document_id"], "ref/p0.html", "{found}");
    assert_eq!(hit["title"], "Type layout - The Manual");
    assert_eq!(hit["section"], "Size and alignment", "{hit}");
    let r = app
        .http
        .get(app.url("/v1/documents/ref%2Fp0.html"))
        .send()
        .await
        .expect("get");
    let doc: Value = r.json().await.expect("json");
    let chunks = doc["chunks"].to_string();
    assert!(
        !chunks.contains("Keyboard shortcuts"),
        "chrome dropped: {doc}"
    );
    assert!(chunks.contains("An introduction to Type layout"), "{doc}");
    // The section path is searchable with the chunk: the last chunk of a
    // long section is found by words of its heading.
    let found = app
        .search(json!({"query": "hygiene expansions", "mode": "lexical", "top_k": 1}))
        .await;
    let hit = &found["results"][0];
    assert_eq!(hit["section"], "Hygiene", "{found}");
    let text = hit["text"].as_str().unwrap_or_default();
    assert!(text.ends_with("across expansions."), "{hit}");
    assert!(
        !text.contains("Hygiene"),
        "the heading line is not in it: {hit}"
    );
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_past_the_concurrent_limit_is_refused_and_writes_nothing() {
    let app = TestApp::builder()
        .real_embeddings()
        .config(|c| c.limits.max_concurrent_ingests = 1)
        .spawn()
        .await;
    // A long document: its embedding keeps the one ingest slot for a while.
    let long: String = (0..3000)
        .map(|i| format!("Paragraph {i} discusses glaciers, rivers and erosion at length."))
        .collect::<Vec<_>>()
        .join(" ");
    let first = {
        let app_url = app.url("/v1/documents");
        let http = reqwest::Client::new();
        tokio::spawn(async move {
            http.post(app_url)
                .json(&json!({"documents": [{"id": "long", "text": long}]}))
                .send()
                .await
                .expect("first ingest")
                .status()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // Refused once its body is in (a body that never comes holds no
    // slot: `a_stalled_body_holds_no_ingest_slot`).
    let padding = "Dust and ice. ".repeat(100_000);
    let r = app
        .post_json(
            "/v1/documents",
            json!({"documents": [
                {"id": "short", "text": "Comets have tails."},
                {"id": "padding", "text": padding},
            ]}),
        )
        .await;
    assert!(r.headers().contains_key("retry-after"));
    let (status, code, _, body) = error_of(r).await;
    assert_eq!((status, code.as_str()), (503, "overloaded"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("limits.max_concurrent_ingests")),
        "{body}"
    );
    assert_eq!(first.await.expect("join"), 200);
    // Refused, so not stored; once the slot is free the same write goes in.
    let found = search_ids(&app, json!({"query": "comets tails"})).await;
    assert!(!found.iter().any(|d| d == "short"), "{found:?}");
    let r = app
        .post_json(
            "/v1/documents",
            json!({"documents": [{"id": "short", "text": "Comets have tails."}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let found = search_ids(&app, json!({"query": "comets tails"})).await;
    assert_eq!(
        found.first().map(String::as_str),
        Some("short"),
        "{found:?}"
    );
    app.shutdown().await.expect("shutdown");
}

/// A folder as users have it: a print-all page that repeats every chapter,
/// a page that only redirects, a file the user leaves out by pattern, a
/// source file. The upload says what it skipped and why; no skipped page
/// is searchable, so none fills the top hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_uploaded_whole_skips_its_print_page_stubs_and_excluded_files() {
    let app = TestApp::builder().spawn().await;
    let topics = ["lifetimes", "closures", "traits", "macros"];
    let lines = |t: &str| -> Vec<String> {
        (0..6)
            .map(|j| format!("The chapter on {t} explains point {j} of {t} in detail."))
            .collect()
    };
    let html = |lines: &[String]| {
        let ps: String = lines.iter().map(|l| format!("<p>{l}</p>")).collect();
        format!("<html><body><main>{ps}</main></body></html>").into_bytes()
    };
    let mut form = Form::new()
        .text("exclude", "**/drafts/*")
        .text("collection", "book");
    for t in topics {
        form = form.part("file", file(&format!("book/{t}.html"), html(&lines(t))));
    }
    let all: Vec<String> = topics.iter().flat_map(|t| lines(t)).collect();
    let stub = b"<html><head><meta http-equiv=\"refresh\" content=\"0; URL=macros.html\"></head>\
        <body><p>Redirecting to... <a href=\"macros.html\">macros.html</a>.</p></body></html>";
    form = form
        .part("file", file("book/print.html", html(&all)))
        .part("file", file("book/old-macros.html", stub.to_vec()))
        .part("file", file("book/drafts/wip.html", html(&lines("drafts"))))
        .part(
            "file",
            file(
                "src/retry.rs",
                b"/// Retries a flaky call three times before it gives up.\npub fn retry() {}\n"
                    .to_vec(),
            ),
        );
    let r = upload(&app, form).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let body: Value = r.json().await.expect("json");
    let created: Vec<&str> = body["documents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert_eq!(
        created.len(),
        5,
        "four chapters and the source file: {body}"
    );
    let skipped: Vec<(&str, &str, &str)> = body["skipped"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let f = |k: &str| s[k].as_str().unwrap_or_default();
            (f("file"), f("id"), f("reason"))
        })
        .collect();
    assert_eq!(skipped.len(), 3, "{body}");
    assert!(skipped.contains(&(
        "file[6]",
        "book/drafts/wip.html",
        "excluded by \"**/drafts/*\""
    )));
    assert!(skipped.contains(&(
        "file[5]",
        "book/old-macros.html",
        "only redirects to macros.html"
    )));
    let print = skipped.iter().find(|s| s.1 == "book/print.html");
    assert!(
        print.is_some_and(|s| s.0 == "file[4]" && s.2.starts_with("repeats 4 other pages")),
        "{body}"
    );
    for q in [
        "point of closures in detail",
        "lifetimes explains point",
        "macros",
    ] {
        let found = app
            .search(json!({"query": q, "collection": "book", "mode": "lexical", "top_k": 5}))
            .await;
        let hits = ids(&found);
        assert!(!hits.is_empty(), "{found}");
        assert!(
            hits.iter()
                .all(|id| id.ends_with(".html") && !id.contains("print") && !id.contains("old-")),
            "{q}: {hits:?}"
        );
    }
    let found = app
        .search(json!({"query": "flaky call retries", "collection": "book", "top_k": 1}))
        .await;
    assert_eq!(ids(&found), ["src/retry.rs"]);
    // A bad pattern is refused naming its field, and writes nothing.
    let form = Form::new()
        .text("include", "[")
        .part("file", file("x.html", html(&lines("x"))));
    let (s, code, f, body) = error_of(upload(&app, form).await).await;
    assert_eq!(
        (s, code.as_str(), f.as_deref()),
        (422, "invalid_request", Some("include")),
        "{body}"
    );
    // A lone stub gives nothing to ingest: refused, naming the file.
    let form = Form::new().part("file", file("old.html", stub.to_vec()));
    let (s, _, f, body) = error_of(upload(&app, form).await).await;
    assert_eq!((s, f.as_deref()), (422, Some("file[0]")), "{body}");
    assert!(body.to_string().contains("only redirects"), "{body}");
    app.shutdown().await.expect("shutdown");
}

/// Eight connections send the headers of an upload and then nothing: they
/// hold no ingest slot (an honest one-line ingest goes in at once), and
/// each gets 408 naming the setting once `server.body_timeout_ms` passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_holds_no_ingest_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = TestApp::builder()
        .config(|c| {
            c.limits.max_concurrent_ingests = 2;
            c.server.body_timeout_ms = 1500;
        })
        .spawn()
        .await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let mut tcp = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let head = "POST /v1/documents HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"documents\": [";
        tcp.write_all(head.as_bytes()).await.expect("headers");
        stalled.push(tcp);
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let r = app
        .post_json(
            "/v1/documents",
            json!({"documents": [{"id": "honest", "text": "Comets have tails."}]}),
        )
        .await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert!(started.elapsed() < std::time::Duration::from_millis(1200));
    for mut tcp in stalled {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            tcp.read_to_end(&mut answer),
        )
        .await;
        assert!(read.is_ok(), "no answer to a stalled body");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("server.body_timeout_ms"), "{answer}");
        assert!(answer.contains("\"request_timeout\""), "{answer}");
    }
    app.shutdown().await.expect("shutdown");
}

/// A client that trickles its headers is cut off once
/// `server.header_timeout_ms` passes: its connection is closed, and the
/// server goes on answering others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_that_never_end_close_their_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = TestApp::builder()
        .config(|c| c.server.header_timeout_ms = 500)
        .spawn()
        .await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    tcp.write_all(b"POST /v1/documents HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("part of the headers");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tcp.read_to_end(&mut rest),
    )
    .await;
    assert!(closed.is_ok(), "the connection stayed open");
    assert_eq!(app.get("/healthz").await.status(), 200);
    app.shutdown().await.expect("shutdown");
}
