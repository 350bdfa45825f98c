//! Search, rerank, chat and embeddings requests, end to end through the
//! pipeline, with fake stages on paused time: every figure is exact, and a
//! slow machine cannot change an outcome.

mod common;

use common::{MS, backend, chat_deps, profile};
use ragtime_cache::{CacheOptions, SemanticCache};
use ragtime_core::{CachedAnswer, Filter, Message, Outcome, PartialReason, Scope, Stage};
use ragtime_pipeline::backend::load::Levels;
use ragtime_pipeline::backend::stats::Estimates;
use ragtime_pipeline::backend::{Backend, Backends, HedgePolicy};
use ragtime_pipeline::chat::{self, CHAT_PLAN, ChatAnswer, ChatDeps, ChatEvent, ChatInput};
use ragtime_pipeline::rerank::RerankParams;
use ragtime_pipeline::search::{self, Mode, SearchDeps, SearchRequest};
use ragtime_pipeline::{BudgetProfile, PipelineError, RequestBudget, embeddings};
use ragtime_testkit::{
    End, HashEmbedder, MemoryRetriever, Script, ScriptedGenerator, SlowReranker, chunk,
};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

fn corpus(e: &HashEmbedder) -> MemoryRetriever {
    let topics = [
        "protein folding",
        "autophagy",
        "insulin signalling",
        "sleep and memory",
    ];
    let chunks = (0..24)
        .map(|i| {
            let t = topics[i % 4];
            let text = format!("This paper concerns {t}. It measured outcomes in adults.");
            chunk(
                i as i64 + 1,
                &format!("p{i}"),
                &format!("Paper {i} on {t}"),
                &text,
                json!({"year": 2000 + i}),
            )
        })
        .collect();
    MemoryRetriever::new(e, chunks)
}

fn request(query: &str, top_k: usize, mode: Mode) -> SearchRequest {
    SearchRequest {
        query: query.into(),
        top_k,
        mode,
        filter: Filter::All,
    }
}

/// A search with `e` and `r` (no reranking) under the test profile.
async fn search_with(
    e: &HashEmbedder,
    r: &MemoryRetriever,
    req: &SearchRequest,
) -> ragtime_pipeline::search::SearchOutcome {
    let deps = SearchDeps {
        embedder: e,
        retriever: r,
        reranker: None,
    };
    let budget = RequestBudget::start(&profile(), search::plan(false), None);
    search::run(&budget, &deps, req).await
}

fn outcome(r: &ragtime_core::BudgetReport, s: Stage) -> Option<(Outcome, u64)> {
    r.stage(s).map(|x| (x.outcome, x.elapsed_ms))
}

#[tokio::test(start_paused = true)]
async fn a_hybrid_search_fuses_both_retrievers_within_its_budgets() {
    let e = HashEmbedder::new(64).with_delay(5 * MS);
    let mut r = corpus(&e);
    r.dense.delay = 30 * MS;
    r.lexical.delay = 10 * MS;
    let out = search_with(&e, &r, &request("autophagy", 5, Mode::Hybrid)).await;
    assert_eq!(out.sources, ["dense", "lexical"]);
    assert_eq!(out.hits.len(), 5);
    assert!(
        out.hits[0].chunk.text.contains("autophagy"),
        "{:?}",
        out.hits[0]
    );
    assert_eq!(outcome(&out.report, Stage::Embed), Some((Outcome::Ok, 5)));
    assert_eq!(
        outcome(&out.report, Stage::Retrieve),
        Some((Outcome::Ok, 30))
    );
    assert!(!out.partial());
}

#[tokio::test(start_paused = true)]
async fn an_embedding_overrun_falls_back_to_lexical_only() {
    let e = HashEmbedder::new(64).with_delay(500 * MS);
    let r = corpus(&e);
    let out = search_with(&e, &r, &request("insulin", 3, Mode::Hybrid)).await;
    assert_eq!(
        outcome(&out.report, Stage::Embed),
        Some((Outcome::Fallback, 100))
    );
    assert_eq!(out.sources, ["lexical"]);
    assert!(out.hits.iter().all(|h| h.chunk.text.contains("insulin")));
    assert!(out.partial());
}

#[tokio::test(start_paused = true)]
async fn a_slow_or_failing_retriever_leaves_the_other_standing() {
    let e = HashEmbedder::new(64);
    let mut r = corpus(&e);
    r.lexical.delay = Duration::from_secs(5);
    let out = search_with(&e, &r, &request("sleep", 3, Mode::Hybrid)).await;
    assert_eq!(
        outcome(&out.report, Stage::Retrieve),
        Some((Outcome::Partial, 100))
    );
    assert_eq!(out.sources, ["dense"]);
    let mut r = corpus(&e);
    r.dense.fail = true;
    let out = search_with(&e, &r, &request("sleep", 3, Mode::Hybrid)).await;
    assert_eq!(
        outcome(&out.report, Stage::Retrieve).map(|o| o.0),
        Some(Outcome::Partial)
    );
    assert_eq!(out.sources, ["lexical"]);
}

#[tokio::test(start_paused = true)]
async fn filters_apply_before_retrieval() {
    let e = HashEmbedder::new(64);
    let r = corpus(&e);
    let mut req = request("paper", 24, Mode::Hybrid);
    req.filter = Filter::parse(&json!({"year": {"$gte": 2020}}), "filter").unwrap_or_default();
    let out = search_with(&e, &r, &req).await;
    assert_eq!(out.hits.len(), 4);
    assert!(
        out.hits
            .iter()
            .all(|h| h.chunk.metadata["year"].as_i64() >= Some(2020))
    );
}

/// The anytime reranker scores batches until the budget runs out: 40 ms a
/// batch of 4 in a 100 ms budget is two batches, 8 of 20 candidates; the
/// rest keep their retrieval order after them.
#[tokio::test(start_paused = true)]
async fn rerank_is_anytime_partial_and_skipped_at_zero() {
    let e = HashEmbedder::new(64);
    let r = corpus(&e);
    let ce = SlowReranker::new(40 * MS);
    let params = RerankParams {
        depth: 20,
        batch: 4,
        weight: 1.0,
    };
    let deps = SearchDeps {
        embedder: &e,
        retriever: &r,
        reranker: Some((&ce, params)),
    };
    let plain = search_with(&e, &r, &request("protein folding adults", 10, Mode::Hybrid)).await;
    let budget = RequestBudget::start(&profile(), search::plan(true), None);
    let out = search::run(
        &budget,
        &deps,
        &request("protein folding adults", 10, Mode::Hybrid),
    )
    .await;
    let rerank = out.report.stage(Stage::Rerank).cloned();
    assert_eq!(
        rerank.as_ref().map(|s| (s.outcome, s.elapsed_ms)),
        Some((Outcome::Partial, 100))
    );
    let detail = rerank.and_then(|s| s.detail).unwrap_or_default();
    assert!(detail.ends_with("scored 8 of 20"), "{detail}");
    assert_eq!(ce.calls(), 3, "the third batch was cut at the deadline");
    assert_eq!(out.hits.len(), 10);
    let ids = |h: &[ragtime_core::Passage]| h.iter().map(|p| p.chunk.chunk_id).collect::<Vec<_>>();
    let (got, want) = (ids(&out.hits), ids(&plain.hits));
    let (mut scored, mut first8) = (got[..8].to_vec(), want[..8].to_vec());
    scored.sort_unstable();
    first8.sort_unstable();
    assert_eq!(scored, first8, "only the scored prefix moves");
    assert_eq!(got[8..], want[8..10], "the rest keep their retrieval order");

    let mut p = profile();
    p.rerank_ms = 0;
    let budget = RequestBudget::start(&p, search::plan(true), None);
    let out = search::run(
        &budget,
        &deps,
        &request("protein folding adults", 10, Mode::Hybrid),
    )
    .await;
    assert_eq!(
        outcome(&out.report, Stage::Rerank),
        Some((Outcome::Skipped, 0))
    );
    assert_eq!(
        ids(&out.hits),
        ids(&plain.hits),
        "a skipped rerank keeps the order"
    );
}

fn input(query: &str, history: Vec<Message>) -> ChatInput {
    ChatInput {
        history,
        ..ChatInput::new(query, Scope::new("t", "c", "", 1), 3)
    }
}

/// One backend of `slots` slots on `g`.
fn one_backend(g: Arc<ScriptedGenerator>, slots: usize) -> (Backends, Arc<Backend>) {
    let b = backend(&format!("scripted-{slots}"), g, slots, 1.0);
    (Backends::new(vec![b.clone()], HedgePolicy::default()), b)
}

/// No degradation: the request sizes of these tests stay as asked.
fn no_levels() -> Levels {
    Levels(Vec::new())
}

/// Runs a chat turn and collects the text it sent.
async fn chat_turn(
    deps: &ChatDeps<'_>,
    input: &ChatInput,
    p: &BudgetProfile,
) -> (ChatAnswer, String) {
    let (tx, mut rx) = mpsc::channel(256);
    let budget = RequestBudget::start(p, &CHAT_PLAN, None);
    let answer = chat::run(&budget, deps, input, &tx).await;
    drop(tx);
    let mut text = String::new();
    let mut sources = None;
    while let Some(ev) = rx.recv().await {
        match ev {
            ChatEvent::Sources(c) => {
                assert!(
                    sources.is_none() && text.is_empty(),
                    "sources once, before any text"
                );
                sources = Some(c);
            }
            ChatEvent::Text(t) => text.push_str(&t),
            ChatEvent::Done(_) => {}
        }
    }
    let sources = sources.expect("the sources were sent");
    assert!(
        answer
            .citations
            .iter()
            .all(|c| sources.iter().any(|s| s.chunk_id == c.chunk_id)),
        "the answer cites only what the first chunk announced"
    );
    (answer, text)
}

#[tokio::test(start_paused = true)]
async fn a_chat_streams_the_answer_and_a_paraphrase_is_answered_from_the_cache() {
    let e = HashEmbedder::new(64);
    let r = corpus(&e);
    let g = Arc::new(ScriptedGenerator::new(Script::tokens(5, 300 * MS, 20 * MS)));
    let (backends, backend) = one_backend(g.clone(), 2);
    let levels = no_levels();
    let cache: SemanticCache<CachedAnswer> = SemanticCache::new(CacheOptions::default());
    let deps = chat_deps(&e, &r, &backends, &levels, Some(&cache));
    let (a, text) = chat_turn(&deps, &input("What about autophagy?", vec![]), &profile()).await;
    // The grounding check finds none of "tok0 …" in the sources: the
    // answer says so after it.
    let note = ragtime_pipeline::chat::UNSUPPORTED_NOTE;
    assert_eq!(a.text, format!("tok0 tok1 tok2 tok3 tok4 \n\n({note})"));
    assert_eq!(text, a.text, "every token was sent as it came");
    assert!(!a.partial && !a.cached);
    assert_eq!(a.finish_reason, "stop");
    assert_eq!(a.citations.len(), 3);
    assert_eq!(outcome(&a.report, Stage::LlmTtft), Some((Outcome::Ok, 300)));
    assert_eq!(
        outcome(&a.report, Stage::LlmGenerate),
        Some((Outcome::Ok, 100))
    );
    assert_eq!(a.first_text, Some(300 * MS));
    let sent = g.requests();
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].messages[0].content.contains("[1] Paper"),
        "{:?}",
        sent[0].messages[0]
    );
    assert_eq!(
        backend.stats.estimates().observations,
        1,
        "the backend's speed was learned"
    );

    // The same question again: from the cache, no backend call.
    let (b, text) = chat_turn(&deps, &input("what about autophagy", vec![]), &profile()).await;
    assert!(b.cached);
    assert_eq!(text, a.text);
    assert_eq!(g.requests().len(), 1);
    for s in [
        Stage::Retrieve,
        Stage::Rerank,
        Stage::LlmTtft,
        Stage::LlmGenerate,
    ] {
        assert_eq!(outcome(&b.report, s).map(|o| o.0), Some(Outcome::Skipped));
    }
    // A follow-up in a conversation skips the cache.
    let history = vec![
        Message::new("user", "hi"),
        Message::new("assistant", "hello"),
    ];
    let (c, _) = chat_turn(&deps, &input("What about autophagy?", history), &profile()).await;
    assert!(!c.cached);
    assert_eq!(
        outcome(&c.report, Stage::Cache).map(|o| o.0),
        Some(Outcome::Skipped)
    );
    assert_eq!(g.requests().len(), 2);
}

/// Without sources the model is not asked, and the answer says why there
/// are none: nothing matched in the collection, or the search itself ran
/// out of time (not the sources' fault).
#[tokio::test(start_paused = true)]
async fn without_sources_the_answer_says_whether_the_search_finished() {
    let e = HashEmbedder::new(64);
    let g = Arc::new(ScriptedGenerator::new(Script::tokens(3, 100 * MS, MS)));
    let (backends, _) = one_backend(g.clone(), 2);
    let levels = no_levels();
    let empty = MemoryRetriever::new(&e, Vec::new());
    let deps = chat_deps(&e, &empty, &backends, &levels, None);
    let (a, text) = chat_turn(&deps, &input("insulin signalling", vec![]), &profile()).await;
    assert_eq!(text, "No sources in collection \"c\" matched the question.");
    assert!(!a.partial, "{:?}", a.report);
    let mut slow = corpus(&e);
    slow.dense.delay = Duration::from_secs(5);
    slow.lexical.delay = Duration::from_secs(5);
    let deps = chat_deps(&e, &slow, &backends, &levels, None);
    let (a, text) = chat_turn(&deps, &input("insulin signalling", vec![]), &profile()).await;
    assert!(
        text.starts_with("The search of collection \"c\" did not finish in time"),
        "{text}"
    );
    assert_eq!(
        a.partial_reason,
        Some(PartialReason::Stage(Stage::Retrieve))
    );
    assert!(g.requests().is_empty(), "the model was not asked");
}

#[tokio::test(start_paused = true)]
async fn no_first_token_in_time_gives_the_extractive_answer_at_the_ttft_deadline() {
    let e = HashEmbedder::new(64);
    let r = corpus(&e);
    let g = Arc::new(ScriptedGenerator::new(Script::tokens(
        3,
        Duration::from_secs(60),
        MS,
    )));
    let (backends, backend) = one_backend(g.clone(), 2);
    let levels = no_levels();
    let deps = chat_deps(&e, &r, &backends, &levels, None);
    let (a, text) = chat_turn(&deps, &input("insulin signalling", vec![]), &profile()).await;
    assert!(a.partial);
    assert_eq!(a.partial_reason, Some(PartialReason::Stage(Stage::LlmTtft)));
    assert_eq!(
        outcome(&a.report, Stage::LlmTtft),
        Some((Outcome::Timeout, 1_000))
    );
    assert_eq!(
        outcome(&a.report, Stage::LlmGenerate),
        Some((Outcome::Skipped, 0))
    );
    assert!(
        text.starts_with("> ")
            && text
                .ends_with("(The model did not answer in time; this is quoted from the sources.)"),
        "{text}"
    );
    assert!(
        text.contains("insulin signalling") && text.contains("[1]"),
        "{text}"
    );
    assert_eq!(a.citations.len(), 3);
    assert_eq!(
        a.first_text,
        Some(1_000 * MS),
        "the answer came at the ttft deadline"
    );
    assert!(
        backend.stats.estimates().ms_per_prompt_token > Estimates::PRIOR.ms_per_prompt_token,
        "admitted at once and no first token: the backend is slow, the estimate grows"
    );
}

#[tokio::test(start_paused = true)]
async fn generation_that_outlasts_its_budget_keeps_what_was_streamed() {
    let e = HashEmbedder::new(64);
    let r = corpus(&e);
    let g = Arc::new(ScriptedGenerator::new(
        Script::tokens(3, 100 * MS, 10 * MS).ending(End::Stall),
    ));
    let (backends, backend) = one_backend(g.clone(), 2);
    let levels = no_levels();
    let deps = chat_deps(&e, &r, &backends, &levels, None);
    let (a, text) = chat_turn(&deps, &input("sleep and memory", vec![]), &profile()).await;
    assert_eq!(a.text, "tok0 tok1 tok2 ");
    assert_eq!(text, a.text);
    assert_eq!(a.finish_reason, "length");
    assert_eq!(
        a.partial_reason,
        Some(PartialReason::Stage(Stage::LlmGenerate))
    );
    let g_stage = a.report.stage(Stage::LlmGenerate).cloned();
    assert_eq!(
        g_stage.as_ref().map(|s| (s.outcome, s.elapsed_ms)),
        Some((Outcome::Partial, 2_000))
    );
    assert!(
        g_stage
            .and_then(|s| s.detail)
            .is_some_and(|d| d.contains("3 tokens streamed"))
    );
    assert_eq!(
        backend.stats.estimates().observations,
        0,
        "a cut generation teaches nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn an_embeddings_request_over_its_budget_is_refused_with_the_report() {
    let slow = HashEmbedder::new(8).with_delay(Duration::from_secs(2));
    let p = embeddings::profile(&profile(), Some(500));
    assert_eq!(
        (p.total_ms, p.embed_ms),
        (500, 500),
        "the batch gets the whole budget"
    );
    match embeddings::run(&p, &slow, vec!["a".into(), "b".into()], Instant::now()).await {
        Err(PipelineError::BudgetExceeded { message, report }) => {
            assert!(message.contains("2 texts"), "{message}");
            assert_eq!(
                outcome(&report, Stage::Embed),
                Some((Outcome::Timeout, 500))
            );
        }
        other => panic!("{:?}", other.map(|e| e.vectors.len())),
    }
    let fast = HashEmbedder::new(8).with_delay(10 * MS);
    let done = embeddings::run(&p, &fast, vec!["a b".into()], Instant::now()).await;
    assert_eq!(done.map(|d| d.vectors.len()).ok(), Some(1));
}
