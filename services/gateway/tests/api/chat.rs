//! `POST /v1/chat/completions` against a fault-injecting backend: partial
//! answers when the first token is late or generation stalls, the semantic
//! cache, conversations, the prompt the backend sees, bad input.

use crate::fake_llm::{Behaviour, FakeLlm};
use crate::helpers::{TestApp, error_of};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const TOTAL_MS: u64 = 3000;

/// The app on `fake`, with three documents; `real`: embed with the model
/// (the semantic cache's paraphrases need it).
async fn app_with(fake: &FakeLlm, real: bool) -> TestApp {
    app_tuned(fake, real, |_| {}).await
}

/// As [`app_with`], with `tweak` applied to the configuration last.
async fn app_tuned(
    fake: &FakeLlm,
    real: bool,
    tweak: impl FnOnce(&mut ragtime_gateway::Config) + Send + 'static,
) -> TestApp {
    let b = TestApp::builder().llm(fake).config(|c| {
        c.budgets.total_ms = TOTAL_MS;
        c.budgets.cache_ms = 20;
        c.budgets.embed_ms = 300;
        c.budgets.retrieve_ms = 300;
        c.budgets.rerank_ms = 0;
        c.budgets.llm_ttft_ms = 600;
        c.budgets.llm_generate_ms = 1200;
        // The grounding check embeds the answer: 50 ms (the default) is
        // not enough on two busy cores, and these tests read its verdict.
        c.budgets.verify_ms = 300;
    });
    let b = b.config(tweak);
    let app = if real { b.real_embeddings() } else { b }.spawn().await;
    app.ingest(json!({"documents": [
        {"id": "mito", "title": "Mitochondria", "text": "Mitochondria produce ATP for the cell through oxidative phosphorylation. They have their own DNA."},
        {"id": "vaccine", "title": "Vaccines", "text": "Vaccines train the immune system to recognise a pathogen without causing disease."},
        {"id": "market", "title": "Markets", "text": "Stock markets rallied on Monday after the central bank cut interest rates."},
    ]}))
    .await;
    app
}

fn ask(q: &str) -> Value {
    json!({"model": "ragtime", "messages": [{"role": "user", "content": q}]})
}

async fn chat(app: &TestApp, body: Value) -> (Value, Duration) {
    let t = Instant::now();
    let b = app.chat(body).await;
    (b, t.elapsed())
}

/// Streams a chat; returns every chunk, whether `[DONE]` came, and the
/// time until the stream ended.
async fn chat_stream(app: &TestApp, body: Value) -> (Vec<Value>, bool, Duration) {
    let s = app.chat_stream(body).await;
    (s.chunks, s.done, s.elapsed)
}

fn content(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect()
}

fn outcome<'a>(b: &'a Value, stage: &str) -> &'a str {
    b["budget"]["stages"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["stage"] == stage))
        .and_then(|s| s["outcome"].as_str())
        .unwrap_or("absent")
}

fn cited(b: &Value) -> Vec<String> {
    b["citations"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| c["document_id"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_first_token_gives_an_extractive_answer_within_the_budget() {
    let fake = FakeLlm::start(Behaviour::StallBeforeFirstToken).await;
    let app = app_with(&fake, false).await;

    let (b, elapsed) = chat(&app, ask("What do mitochondria produce for the cell?")).await;
    assert!(
        elapsed <= Duration::from_millis(TOTAL_MS + 50),
        "{elapsed:?}"
    );
    assert_eq!(b["partial"], true, "{b}");
    assert_eq!(b["partial_reason"], "llm_ttft");
    assert_eq!(b["cached"], false);
    assert_eq!(outcome(&b, "llm_ttft"), "timeout");
    assert_eq!(outcome(&b, "llm_generate"), "skipped");
    assert_eq!(b["choices"][0]["finish_reason"], "stop");
    let text = b["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("Mitochondria produce ATP") && text.contains("[1]"),
        "{text}"
    );
    assert_eq!(cited(&b).first().map(String::as_str), Some("mito"), "{b}");
    assert!(
        b["citations"][0]["snippet"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );

    // Streamed, with a tighter per-request budget: the stages shrink with it
    // and the stream still ends cleanly within it.
    let mut body = ask("What do mitochondria produce for the cell?");
    body["budget_ms"] = json!(1500);
    let (chunks, done, elapsed) = chat_stream(&app, body).await;
    assert!(done);
    assert!(elapsed <= Duration::from_millis(1500 + 50), "{elapsed:?}");
    let last = chunks.last().expect("chunks");
    assert_eq!(last["partial_reason"], "llm_ttft");
    assert_eq!(last["budget"]["total_ms"], 1500);
    assert!(content(&chunks).contains("Mitochondria produce ATP"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    // Both requests reached the backend, and ragtime hung up on both at
    // their deadlines (which is how a backend learns to stop); neither
    // answer was cached.
    assert_eq!(fake.seen().len(), 2);
    assert_eq!(fake.hung_up(2).await, 2);
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_mid_stream_keeps_what_was_streamed_and_ends_with_length() {
    let fake = FakeLlm::start(Behaviour::StallAfter { tokens: 3 }).await;
    let app = app_with(&fake, false).await;

    let (chunks, done, elapsed) =
        chat_stream(&app, ask("What do mitochondria produce for the cell?")).await;
    assert!(done);
    assert!(
        elapsed <= Duration::from_millis(TOTAL_MS + 50),
        "{elapsed:?}"
    );
    assert_eq!(content(&chunks), "tok0 tok1 tok2 ");
    let last = chunks.last().expect("chunks");
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["partial"], true);
    assert_eq!(last["partial_reason"], "llm_generate");
    assert_eq!(outcome(last, "llm_ttft"), "ok");
    assert_eq!(outcome(last, "llm_generate"), "partial");
    assert_eq!(cited(last).first().map(String::as_str), Some("mito"));

    // Not streamed: the same story in one body, and a partial answer is
    // never cached.
    let (b, elapsed) = chat(&app, ask("What do mitochondria produce for the cell?")).await;
    assert!(
        elapsed <= Duration::from_millis(TOTAL_MS + 50),
        "{elapsed:?}"
    );
    assert_eq!(b["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
    assert_eq!(b["choices"][0]["finish_reason"], "length");
    assert_eq!(b["cached"], false);
    // Cut before the backend's counts came: the tokens streamed, and the
    // prompt estimated from its length (never the zeros of no answer).
    assert_eq!(b["usage"]["completion_tokens"], 3, "{b}");
    let prompt = b["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(prompt > 10, "{b}");
    assert_eq!(b["usage"]["total_tokens"], prompt + 3);
    assert_eq!(fake.seen().len(), 2);
    assert_eq!(
        fake.hung_up(2).await,
        2,
        "generation cancelled at the deadline"
    );
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_backend_still_gets_the_user_a_cited_answer() {
    let fake = FakeLlm::start(Behaviour::Fail).await;
    let app = app_with(&fake, false).await;
    let (b, elapsed) = chat(&app, ask("How do vaccines work?")).await;
    assert!(elapsed < Duration::from_millis(TOTAL_MS), "{elapsed:?}");
    assert_eq!(b["partial"], true, "{b}");
    assert_eq!(
        b["partial_reason"], "llm_error",
        "the backend erred, not the clock"
    );
    assert_eq!(outcome(&b, "llm_ttft"), "error");
    let detail = b["budget"]["stages"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["stage"] == "llm_ttft"))
        .and_then(|s| s["detail"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("500"), "{detail}");
    assert_eq!(cited(&b).first().map(String::as_str), Some("vaccine"));
    let text = b["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("Vaccines train the immune system"), "{text}");
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_answers_are_cached_for_paraphrases_until_the_corpus_changes() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 5,
        gap: Duration::from_millis(5),
    })
    .await;
    let app = app_with(&fake, true).await;
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let r = app
        .http
        .post(app.url("/v1/chat/completions"))
        .header("traceparent", tp)
        .json(&ask("What do mitochondria produce for the cell?"))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.contains("llm_ttft;desc=\"ok\"")),
    );
    let b: Value = r.json().await.expect("json");
    assert_eq!(b["object"], "chat.completion");
    // None of "tok0 …" is in the sources: the answer says so after it.
    assert_eq!(
        b["choices"][0]["message"]["content"],
        format!(
            "tok0 tok1 tok2 tok3 tok4 \n\n({})",
            ragtime_pipeline::chat::UNSUPPORTED_NOTE
        )
    );
    assert_eq!(b["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        (b["partial"].clone(), b["cached"].clone()),
        (json!(false), json!(false)),
        "{b}"
    );
    assert!(b["partial_reason"].is_null());
    assert_eq!(b["usage"]["completion_tokens"], 5);
    let stages: Vec<&str> = b["budget"]["stages"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["stage"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        stages,
        [
            "embed",
            "cache",
            "retrieve",
            "rerank",
            "llm_ttft",
            "llm_generate",
            "verify"
        ]
    );

    // What the backend got: static content first, the question last.
    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    let req = &seen[0].body;
    assert_eq!(seen[0].traceparent.as_deref(), Some(tp));
    assert_eq!(req["stream"], true);
    let msgs = req["messages"].as_array().expect("messages");
    assert_eq!(msgs[0]["role"], "system");
    assert!(
        msgs[0]["content"]
            .as_str()
            .is_some_and(|s| s.contains("Mitochondria produce ATP"))
    );
    assert_eq!(msgs.last().map(|m| m["role"].clone()), Some(json!("user")));
    assert_eq!(
        msgs.last().map(|m| m["content"].clone()),
        Some(json!("What do mitochondria produce for the cell?"))
    );
    assert!(
        req["max_tokens"]
            .as_u64()
            .is_some_and(|n| (1..=512).contains(&n)),
        "{req}"
    );

    let first = b["choices"][0]["message"]["content"].clone();
    // A paraphrase is answered from the cache, without the backend.
    let (b, _) = chat(
        &app,
        ask("What does the mitochondria produce for the cell?"),
    )
    .await;
    assert_eq!(b["cached"], true, "{b}");
    assert_eq!(b["partial"], false);
    assert_eq!(
        b["choices"][0]["message"]["content"], first,
        "the same answer, its note included"
    );
    assert_eq!(cited(&b).first().map(String::as_str), Some("mito"));
    assert_eq!(outcome(&b, "cache"), "ok");
    assert_eq!(outcome(&b, "llm_ttft"), "skipped");
    assert_eq!(fake.seen().len(), 1);
    // Streamed cache hits carry the same flag.
    let (chunks, done, _) =
        chat_stream(&app, ask("What do mitochondria produce for the cell?")).await;
    assert!(done);
    assert_eq!(
        chunks.last().map(|c| c["cached"].clone()),
        Some(json!(true))
    );
    assert_eq!(fake.seen().len(), 1);

    // A negation is a different question, however close its embedding.
    let (b, _) = chat(&app, ask("What do mitochondria not produce for the cell?")).await;
    assert_eq!(b["cached"], false);
    assert_eq!(fake.seen().len(), 2);
    // Another filter is another scope.
    let mut body = ask("What do mitochondria produce for the cell?");
    body["filter"] = json!({"lang": "en"});
    let (b, _) = chat(&app, body).await;
    assert_eq!(b["cached"], false);
    // (Nothing passes that filter: no sources, and the model is not asked
    // to answer from nothing.)
    assert_eq!(fake.seen().len(), 2);

    // Ingesting changes the corpus version: the old answer is not reused.
    let r = app
        .post_json(
            "/v1/documents",
            json!({"documents": [{"id": "chloro", "title": "Chloroplasts", "text": "Chloroplasts capture light energy."}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let (b, _) = chat(&app, ask("What do mitochondria produce for the cell?")).await;
    assert_eq!(b["cached"], false);
    assert_eq!(fake.seen().len(), 3);
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_are_stored_and_their_last_turns_reach_the_prompt() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 2,
        gap: Duration::from_millis(1),
    })
    .await;
    let app = app_with(&fake, false).await;
    let mut first = ask("What do mitochondria produce?");
    first["conversation_id"] = json!("conv-1");
    let (b, _) = chat(&app, first).await;
    assert_eq!(b["conversation_id"], "conv-1");
    let mut second = ask("And do they have DNA?");
    second["conversation_id"] = json!("conv-1");
    let (b, _) = chat(&app, second).await;
    assert_eq!(
        outcome(&b, "cache"),
        "skipped",
        "follow-ups depend on context"
    );
    let seen = fake.seen();
    let msgs = seen[1].body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let turns: Vec<(String, String)> = msgs
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(turns.len(), 4, "{turns:?}");
    assert_eq!(turns[0].0, "system");
    assert_eq!(
        turns[1],
        ("user".into(), "What do mitochondria produce?".into())
    );
    assert_eq!(turns[2], ("assistant".into(), "tok0 tok1 ".into()));
    assert_eq!(turns[3], ("user".into(), "And do they have DNA?".into()));

    // Without an id, one is made up and returned.
    let (b, _) = chat(&app, ask("hello?")).await;
    assert!(b["conversation_id"].as_str().is_some_and(|s| s.len() >= 32));
    // A conversation stays in its collection.
    let r = app
        .post_json(
            "/v1/documents",
            json!({"collection": "other", "documents": [{"id": "x", "text": "other text"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let mut wrong = ask("more?");
    wrong["conversation_id"] = json!("conv-1");
    wrong["collection"] = json!("other");
    let (status, code, field, _) =
        error_of(app.post_json("/v1/chat/completions", wrong).await).await;
    assert_eq!(
        (status, code.as_str(), field.as_deref()),
        (422, "invalid_request", Some("conversation_id"))
    );
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chat_requests_name_the_field_and_reach_no_backend() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 1,
        gap: Duration::ZERO,
    })
    .await;
    let app = app_with(&fake, false).await;
    let user = |c: Value| json!({"role": "user", "content": c});
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"messages": [user(json!("hi"))]}), 422, "model"),
        (json!({"model": "m"}), 422, "messages"),
        (json!({"model": "m", "messages": []}), 422, "messages"),
        (
            json!({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}),
            422,
            "messages[0].role",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi")), {"role": "assistant", "content": "yo"}]}),
            422,
            "messages[1].role",
        ),
        (
            json!({"model": "m", "messages": [user(json!("   "))]}),
            422,
            "messages[0].content",
        ),
        (
            json!({"model": "m", "messages": [user(json!(42))]}),
            422,
            "messages[0].content",
        ),
        (
            json!({"model": "m", "messages": [user(json!([{"type": "image_url", "image_url": {"url": "x"}}]))]}),
            422,
            "messages[0].content[0].type",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "n": 2}),
            422,
            "n",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "temperature": 3.5}),
            422,
            "temperature",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "answer": "summarise"}),
            422,
            "answer",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "frequency_penalty": 2.5}),
            422,
            "frequency_penalty",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "max_tokens": 0}),
            422,
            "max_tokens",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "top_k": 0}),
            422,
            "top_k",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "budget_ms": 0}),
            422,
            "budget_ms",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "stream": "yes"}),
            422,
            "stream",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "conversation_id": "no spaces"}),
            422,
            "conversation_id",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "filter": {"year": {"$gt": "x", "$bogus": 1}}}),
            422,
            "filter.year.$bogus",
        ),
        (
            json!({"model": "m", "messages": [user(json!("hi"))], "collection": "nope"}),
            404,
            "collection",
        ),
    ];
    for (body, want_status, want_field) in cases {
        let r = app.post_json("/v1/chat/completions", body.clone()).await;
        let (status, _, field, err) = error_of(r).await;
        assert_eq!(status, want_status, "{body} → {err}");
        assert_eq!(field.as_deref(), Some(want_field), "{body} → {err}");
    }
    // Malformed JSON is a 400.
    let r = app
        .http
        .post(app.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 400);
    assert!(
        fake.seen().is_empty(),
        "a refused request reached the backend"
    );

    // The model list answers for OpenAI clients.
    let r = app
        .http
        .get(app.url("/v1/models"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.expect("json");
    assert_eq!(b["object"], "list");
    assert!(b["data"][0]["id"].is_string());
    app.shutdown().await.expect("shutdown");
}

/// A long text on `topic`: `n` sentences, enough for several chunks.
fn long_text(topic: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("Sentence {i} of the notes on {topic} says something about {topic} and its history number {i}."))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_holds_the_passages_search_returns_grouped_by_document() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 3,
        gap: Duration::from_millis(1),
    })
    .await;
    let app = TestApp::builder().llm(&fake).spawn().await;
    app.ingest(json!({"documents": [
        {"id": "glaciers", "title": "Glaciers", "text": long_text("glaciers", 40)},
        {"id": "volcanoes", "title": "Volcanoes", "text": long_text("volcanoes and glaciers", 40)},
        {"id": "rivers", "title": "Rivers", "text": long_text("rivers", 40)},
    ]}))
    .await;
    let q = "What do the notes say about glaciers?";
    let found = app.search(json!({"query": q, "top_k": 4})).await;
    let results = found["results"].as_array().cloned().unwrap_or_default();
    assert!(results.len() >= 2, "{found}");
    // Passages come document by document, at most three of each.
    let docs: Vec<&str> = results
        .iter()
        .filter_map(|r| r["document_id"].as_str())
        .collect();
    let mut order: Vec<&str> = docs.clone();
    order.dedup();
    let mut distinct = order.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        order.len(),
        distinct.len(),
        "a document's passages are together: {docs:?}"
    );
    for d in &distinct {
        assert!(docs.iter().filter(|x| *x == d).count() <= 3, "{docs:?}");
    }

    let mut body = ask(q);
    body["top_k"] = json!(4);
    let b = app.chat(body).await;
    assert_eq!(b["partial"], false, "{b}");
    let seen = fake.seen();
    let system = seen[0].body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // The prompt's sources are the search's passages, in its order (as
    // many as the prompt has room for).
    let mut at = 0;
    let mut sources = 0;
    for (i, r) in results.iter().enumerate() {
        let text = r["text"].as_str().unwrap_or_default();
        let marker = format!("\n[{}] ", i + 1);
        let Some(p) = system[at..].find(&marker) else {
            break;
        };
        sources += 1;
        at += p;
        let block = &system[at..];
        assert!(
            block.contains(&text[..text.len().min(60)]),
            "source {} is not search result {}:\n{system}",
            i + 1,
            i + 1
        );
    }
    assert!(sources >= 2, "{sources} sources in the prompt:\n{system}");
    assert!(
        !system.contains(&format!("\n[{}] ", results.len() + 1)),
        "the prompt holds a passage search did not return:\n{system}"
    );
    app.shutdown().await.expect("shutdown");
}

/// A request's own small budget goes to searching first (an extractive
/// answer needs nothing else), so it still answers from its sources; a
/// budget over the server's total is cut to it, and the report says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_budget_still_searches_and_a_cut_budget_is_said() {
    let fake = FakeLlm::start(Behaviour::StallBeforeFirstToken).await;
    let app = app_with(&fake, false).await;
    let budget_of = |b: &Value, stage: &str| -> u64 {
        b["budget"]["stages"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["stage"] == stage))
            .and_then(|s| s["budget_ms"].as_u64())
            .unwrap_or(0)
    };

    let mut q = ask("What do mitochondria produce for the cell?");
    q["budget_ms"] = json!(200);
    let (b, _) = chat(&app, q).await;
    assert_eq!(b["budget"]["total_ms"], 200, "{b}");
    assert_eq!(b["budget"]["requested_ms"], 200);
    // embed and retrieve (300 ms each configured) share the 200 ms (less
    // what went by before each started); proportional shrinking gave 33.
    assert!((95..=100).contains(&budget_of(&b, "embed")), "{b}");
    assert!((90..=100).contains(&budget_of(&b, "retrieve")), "{b}");
    assert_eq!(outcome(&b, "retrieve"), "ok", "{b}");
    assert_eq!(cited(&b).first().map(String::as_str), Some("mito"), "{b}");
    // No time was left for the model: it was not asked, and the answer
    // says so (partial at llm_ttft, given as extractive).
    assert!(fake.seen().is_empty(), "the model was asked");
    assert_eq!(b["partial"], true, "{b}");
    assert_eq!(b["partial_reason"], "llm_ttft", "{b}");
    assert_eq!(b["answer"], "extractive", "{b}");
    let text = b["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("not asked"), "{text}");

    let mut q = ask("What do mitochondria produce for the cell?");
    q["budget_ms"] = json!(60_000);
    let (b, _) = chat(&app, q).await;
    assert_eq!(b["budget"]["total_ms"], TOTAL_MS, "{b}");
    assert_eq!(b["budget"]["requested_ms"], 60_000);
    let (b, _) = chat(&app, ask("What do mitochondria produce for the cell?")).await;
    assert!(b["budget"].get("requested_ms").is_none(), "{b}");
    app.shutdown().await.expect("shutdown");
}

/// A question to a collection with nothing in it says which collection
/// was searched; one to a collection that does not exist is a 404 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_missing_collection_is_named() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 3,
        gap: Duration::from_millis(1),
    })
    .await;
    let app = app_with(&fake, false).await;
    let r = app
        .post_json("/v1/collections", json!({"name": "empty"}))
        .await;
    assert_eq!(r.status(), 201);
    let mut q = ask("What do mitochondria produce for the cell?");
    q["collection"] = json!("empty");
    let (b, _) = chat(&app, q.clone()).await;
    let text = b["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("No sources in collection \"empty\" matched"),
        "{text}"
    );
    assert!(fake.seen().is_empty(), "no model call without sources");
    q["collection"] = json!("nope");
    let (s, code, _, body) = error_of(app.post_json("/v1/chat/completions", q).await).await;
    assert_eq!((s, code.as_str()), (404, "not_found"), "{body}");
    assert!(body.to_string().contains("nope"), "{body}");
    app.shutdown().await.expect("shutdown");
}

/// A backend whose first token always takes 450 ms of the 600 ms
/// allotment: its learned prefill rate soon leaves room for no passage.
/// No answer comes from the model without its sources, and the report
/// says how many were sent; a grounding check that could not finish
/// makes the answer partial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_prefill_never_sends_the_model_a_prompt_without_sources() {
    let fake = FakeLlm::start(Behaviour::SlowFirstToken {
        delay: Duration::from_millis(450),
        tokens: 3,
    })
    .await;
    // Each turn asks the model (no cached answer).
    let app = app_tuned(&fake, false, |c| c.cache.enabled = false).await;
    let mut over = 0;
    for _ in 0..6 {
        let mut q = ask("What do mitochondria produce for the cell?");
        q["answer"] = json!("generate");
        let (b, _) = chat(&app, q).await;
        let sent = b["budget"]["prompt"]["passages_sent"].as_u64();
        assert!(sent.is_some_and(|n| n >= 1), "{b}");
        if b["answer"] == "generate" {
            assert!(!cited(&b).is_empty(), "a model answer with no sources: {b}");
        }
        over += usize::from(b["budget"]["prompt"]["over_allotment"] == true);
    }
    assert!(over > 0, "the allotment never came to hold no passage");
    for seen in fake.seen() {
        let system = seen.body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default();
        assert!(
            system.contains("[1] "),
            "a prompt without sources: {system}"
        );
    }
    app.shutdown().await.expect("shutdown");
}

/// The grounding check with 1 ms cannot finish: the answer is partial at
/// `verify`, not a silent `grounding: null`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grounding_check_that_overran_is_said() {
    let fake = FakeLlm::start(Behaviour::Answer {
        tokens: 6,
        gap: Duration::from_millis(1),
    })
    .await;
    let app = TestApp::builder()
        .llm(&fake)
        .slow_embeddings(Duration::from_millis(20))
        .config(|c| {
            c.budgets.verify_ms = 5;
            c.cache.enabled = false;
        })
        .spawn()
        .await;
    app.ingest(json!({"documents": [
        {"id": "mito", "title": "Mitochondria", "text": "Mitochondria produce ATP for the cell through oxidative phosphorylation."},
    ]}))
    .await;
    let mut q = ask("What do mitochondria produce?");
    q["answer"] = json!("generate");
    let (b, _) = chat(&app, q).await;
    assert_eq!(b["answer"], "generate", "{b}");
    assert!(b["grounding"].is_null(), "{b}");
    assert_ne!(outcome(&b, "verify"), "ok", "{b}");
    assert_eq!(b["partial"], true, "{b}");
    assert_eq!(b["partial_reason"], "verify", "{b}");
    app.shutdown().await.expect("shutdown");
}
