//! Answer modes and the grounding check, through the pipeline with fake
//! stages on paused time.

mod common;

use common::{MS, World, backend, profile};
use ragtime_core::{Outcome, PartialReason, Scope, Stage};
use ragtime_pipeline::RequestBudget;
use ragtime_pipeline::backend::{Backends, HedgePolicy};
use ragtime_pipeline::chat::{
    self, AnswerMode, CHAT_PLAN, ChatAnswer, ChatDeps, ChatEvent, ChatInput, OnUngrounded,
};
use ragtime_testkit::{End, HashEmbedder, MemoryRetriever, Script, ScriptedGenerator, chunk};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::mpsc;

const DOCS: [(&str, &str); 3] = [
    (
        "Creating a project",
        "The new command creates a project folder. It also initializes a git repository by default. Pass --vcs none to skip the repository.",
    ),
    (
        "Build cache",
        "Builds are cached in the target folder. Set CARGO_TARGET_DIR to share one cache between projects.",
    ),
    (
        "Publishing",
        "The publish command uploads a package to the registry. A token is read from the credentials file.",
    ),
];

fn corpus(e: &HashEmbedder) -> MemoryRetriever {
    let chunks = DOCS
        .iter()
        .enumerate()
        .map(|(i, (title, text))| chunk(i as i64 + 1, &format!("d{i}"), title, text, json!({})))
        .collect();
    MemoryRetriever::new(e, chunks)
}

/// A backend that answers `text`, word by word.
fn says(text: &str) -> Arc<ScriptedGenerator> {
    Arc::new(ScriptedGenerator::new(Script {
        progress: Vec::new(),
        ttft: 200 * MS,
        tokens: text.split_inclusive(' ').map(str::to_owned).collect(),
        gap: 10 * MS,
        end: End::Done("stop"),
    }))
}

fn ask(query: &str, mode: AnswerMode, on: OnUngrounded, stream: bool) -> ChatInput {
    ChatInput {
        answer: mode,
        on_ungrounded: on,
        stream,
        ..ChatInput::new(query, Scope::new("t", "c", "", 1), 3)
    }
}

/// A turn: the answer, and each text event as it was sent.
async fn turn(deps: &ChatDeps<'_>, input: &ChatInput) -> (ChatAnswer, Vec<String>) {
    let (tx, mut rx) = mpsc::channel(256);
    let budget = RequestBudget::start(&profile(), &CHAT_PLAN, None);
    let answer = chat::run(&budget, deps, input, &tx).await;
    drop(tx);
    let mut texts = Vec::new();
    while let Some(ev) = rx.recv().await {
        if let ChatEvent::Text(t) = ev {
            texts.push(t);
        }
    }
    (answer, texts)
}

fn outcome(a: &ChatAnswer, s: Stage) -> Option<Outcome> {
    a.report.stage(s).map(|r| r.outcome)
}

fn world(g: Arc<ScriptedGenerator>) -> World {
    let e = HashEmbedder::new(256);
    let r = corpus(&e);
    let b = backend("scripted", g, 2, 1.0);
    World::new(e, r, Backends::new(vec![b], HedgePolicy::default()))
}

/// A generated answer, `on` deciding what an unsupported one becomes.
async fn generated(w: &World, on: OnUngrounded, stream: bool) -> (ChatAnswer, Vec<String>) {
    turn(&w.deps(), &ask(QUESTION, AnswerMode::Generate, on, stream)).await
}

const QUESTION: &str = "how do I create a new project without a git repository";

#[tokio::test(start_paused = true)]
async fn the_extractive_mode_quotes_the_sources_without_asking_the_model() {
    let g = says("never asked ");
    let w = world(g.clone());
    let (a, texts) = turn(
        &w.deps(),
        &ask(
            QUESTION,
            AnswerMode::Extractive,
            OnUngrounded::Annotate,
            true,
        ),
    )
    .await;
    assert!(g.requests().is_empty(), "the model was not called");
    assert!(!a.partial, "chosen, not degraded: {:?}", a.partial_reason);
    assert!(a.text.starts_with("> "), "{}", a.text);
    assert!(a.text.contains("--vcs none"), "{}", a.text);
    assert!(!a.text.contains("in time"), "{}", a.text);
    assert_eq!(texts.concat(), a.text);
    for s in [Stage::LlmTtft, Stage::LlmGenerate, Stage::Verify] {
        assert_eq!(outcome(&a, s), Some(Outcome::Skipped), "{s}");
    }
    assert!(a.grounding.is_none());
    assert_eq!(a.answer_mode, AnswerMode::Extractive);
}

#[tokio::test(start_paused = true)]
async fn quote_then_generate_sends_the_quote_before_the_model_starts() {
    let g = says("Pass --vcs none to the new command [1]. ");
    let w = world(g.clone());
    let (a, texts) = turn(
        &w.deps(),
        &ask(
            QUESTION,
            AnswerMode::QuoteThenGenerate,
            OnUngrounded::Annotate,
            true,
        ),
    )
    .await;
    assert_eq!(g.requests().len(), 1);
    assert!(
        texts[0].starts_with("> ") && texts[0].contains("--vcs none"),
        "{texts:?}"
    );
    assert!(a.text.starts_with(&texts[0]));
    // Only the model's part is checked; what it found is said after it.
    let g = a.grounding.clone().expect("checked");
    assert_eq!(g.sentences, 1);
    let note = format!("\n\n({})", chat::UNSUPPORTED_NOTE);
    let model_part = match g.grounded() {
        true => a.text.as_str(),
        false => a.text.strip_suffix(&note).expect("the note ends it"),
    };
    assert!(
        model_part.ends_with("Pass --vcs none to the new command [1]. "),
        "{}",
        a.text
    );
    assert!(!a.partial);
}

#[tokio::test(start_paused = true)]
async fn an_answer_naming_a_flag_no_source_has_is_unsupported_and_replaced_when_asked() {
    let made_up = "Run the new command with --no-git-repo to skip the git repository [1]. ";
    // Annotate: the answer stands, says after it that its sources do not
    // support it, and the verdict says why.
    let w = world(says(made_up));
    let (a, _) = generated(&w, OnUngrounded::Annotate, false).await;
    assert_eq!(a.text, format!("{made_up}\n\n({})", chat::UNSUPPORTED_NOTE));
    let (streamed, texts) = generated(&w, OnUngrounded::Annotate, true).await;
    assert_eq!(texts.concat(), streamed.text, "the note is streamed too");
    assert!(
        streamed
            .text
            .ends_with(&format!("({})", chat::UNSUPPORTED_NOTE))
    );
    let g = a.grounding.clone().expect("checked");
    assert_eq!((g.sentences, g.supported), (1, 0));
    assert!(g.unsupported[0].contains("--no-git-repo"), "{g:?}");
    assert!(!a.partial);
    assert_eq!(outcome(&a, Stage::Verify), Some(Outcome::Ok));

    // Extractive, not streamed: replaced by the quote.
    let (b, _) = generated(&w, OnUngrounded::Extractive, false).await;
    assert!(b.partial);
    assert_eq!(b.partial_reason, Some(PartialReason::Ungrounded));
    assert!(!b.text.contains("--no-git-repo"), "{}", b.text);
    assert!(b.text.contains("--vcs none"), "{}", b.text);

    // Extractive, streamed: what was sent stands, the quote follows.
    let (c, texts) = generated(&w, OnUngrounded::Extractive, true).await;
    assert_eq!(c.partial_reason, Some(PartialReason::Ungrounded));
    assert!(c.text.starts_with(made_up), "{}", c.text);
    assert!(c.text.contains("What the sources say:") && c.text.contains("--vcs none"));
    assert_eq!(texts.concat(), c.text);
}

#[tokio::test(start_paused = true)]
async fn an_answer_that_says_what_its_source_says_is_supported() {
    let w = world(says(
        "It initializes a git repository by default. Pass --vcs none to skip the repository [1]. ",
    ));
    let (a, _) = generated(&w, OnUngrounded::Extractive, false).await;
    let g = a.grounding.clone().expect("checked");
    assert_eq!((g.sentences, g.supported), (2, 2), "{g:?}");
    assert!(!a.partial, "{:?}", a.partial_reason);
    assert!(a.text.starts_with("It initializes"));
    assert!(
        !a.text.contains(chat::UNSUPPORTED_NOTE),
        "a supported answer has no note"
    );
}

/// A follow-up is searched with what the conversation established: "Can I
/// share it?" alone reads like the publishing passage (a package shared on
/// the registry); after a question about the build cache, whose answer
/// cited the "Build cache" section, it is answered from that section.
#[tokio::test(start_paused = true)]
async fn a_follow_up_is_answered_from_the_conversation_s_section() {
    let w = world(says("never asked "));
    let follow_up = "Can I share it between several projects?";
    let alone = ask(
        follow_up,
        AnswerMode::Extractive,
        OnUngrounded::Annotate,
        false,
    );
    let mut input = alone.clone();
    input.history = vec![
        ragtime_core::Message::new("user", "where are builds cached?"),
        ragtime_core::Message::new(
            "assistant",
            "> Builds are cached in the target folder.\n\u{2014} Build cache [1]",
        ),
    ];
    assert_eq!(
        input.search_text(),
        "Can I share it between several projects?\nBuild cache\nwhere are builds cached?"
    );
    let (a, _) = turn(&w.deps(), &input).await;
    assert!(a.text.contains("CARGO_TARGET_DIR"), "{}", a.text);
    assert_eq!(
        a.citations.first().map(|c| c.title.as_str()),
        Some("Build cache")
    );
    // Without the conversation the same words find another passage first.
    let (b, _) = turn(&w.deps(), &alone).await;
    assert!(!b.text.starts_with("> Set CARGO_TARGET_DIR"), "{}", b.text);
}

/// A follow-up's own words outweigh the previous turn's: after the
/// variance of `&'a mut T` was asked and quoted, "And what about *mut T?"
/// quotes the `*mut T` row of the same table, not the row quoted before
/// (both rows share the words the two questions do: `mut`, `T`).
#[tokio::test(start_paused = true)]
async fn a_follow_up_quotes_what_it_asks_about_not_what_the_last_turn_did() {
    let e = HashEmbedder::new(256);
    let table = "The variance of the common types:\n\
        Type | 'a | T\n\
        &'a T | covariant | covariant\n\
        &'a mut T | covariant | invariant\n\
        Box<T> | | covariant\n\
        *const T | | covariant\n\
        *mut T | | invariant";
    let other = "A mutable reference &'a mut T is invariant over T because a function could write a shorter-lived value through it.";
    let r = MemoryRetriever::new(
        &e,
        vec![
            chunk(
                1,
                "variance",
                "Subtyping and Variance \u{203a} Variance",
                table,
                json!({}),
            ),
            chunk(
                2,
                "why",
                "Subtyping and Variance \u{203a} Why",
                other,
                json!({}),
            ),
        ],
    );
    let b = backend("scripted", says("never asked "), 2, 1.0);
    let w = World::new(e, r, Backends::new(vec![b], HedgePolicy::default()));
    let mut input = ask(
        "And what about *mut T?",
        AnswerMode::Extractive,
        OnUngrounded::Annotate,
        false,
    );
    input.history = vec![
        ragtime_core::Message::new("user", "What is the variance of &'a mut T?"),
        ragtime_core::Message::new(
            "assistant",
            "> Type | 'a | T\n> &'a mut T | covariant | invariant\n\u{2014} Subtyping and Variance \u{203a} Variance [1]",
        ),
    ];
    let (a, _) = turn(&w.deps(), &input).await;
    let first_row = a
        .text
        .lines()
        .find(|l| l.contains(" | ") && !l.contains("Type"))
        .unwrap_or_default();
    assert!(first_row.contains("*mut T | | invariant"), "{}", a.text);
    assert!(!a.text.contains("&'a mut T | covariant"), "{}", a.text);
}

#[tokio::test(start_paused = true)]
async fn a_grounding_check_that_did_not_finish_makes_the_answer_partial() {
    let mut w = world(says("Pass --vcs none to skip the repository [1]. "));
    // Within the query's 100 ms, past the check's 50.
    w.e = HashEmbedder::new(256).with_delay(60 * MS);
    let (a, _) = generated(&w, OnUngrounded::Extractive, false).await;
    assert_eq!(outcome(&a, Stage::Embed), Some(Outcome::Ok));
    assert_eq!(outcome(&a, Stage::Verify), Some(Outcome::Timeout));
    assert!(a.grounding.is_none());
    assert!(a.partial, "an unchecked answer is not a whole one");
    assert_eq!(a.partial_reason, Some(PartialReason::Stage(Stage::Verify)));
    // Turned off, the check is a choice, not a cut.
    let g = says("Pass --vcs none to skip the repository [1]. ");
    let w = world(g);
    let mut p = profile();
    p.verify_ms = 0;
    let (tx, _rx) = mpsc::channel(256);
    let budget = RequestBudget::start(&p, &CHAT_PLAN, None);
    let q = ask(
        QUESTION,
        AnswerMode::Generate,
        OnUngrounded::Annotate,
        false,
    );
    let b = chat::run(&budget, &w.deps(), &q, &tx).await;
    assert_eq!(outcome(&b, Stage::Verify), Some(Outcome::Skipped));
    assert!(!b.partial, "{:?}", b.partial_reason);
}

/// A backend whose first token always takes 900 ms: a few prompts in, its
/// learned prefill rate leaves the 1 s allotment no room for a passage.
/// The model is still never asked without one: the best passage goes,
/// and the report says what was sent, dropped, and past the allotment.
#[tokio::test(start_paused = true)]
async fn a_model_is_never_asked_without_a_passage_however_slow_its_prefill_looks() {
    let g = Arc::new(ScriptedGenerator::new(Script {
        progress: Vec::new(),
        ttft: 900 * MS,
        tokens: vec!["Pass ".into(), "--vcs none [1]. ".into()],
        gap: 10 * MS,
        end: End::Done("stop"),
    }));
    let w = world(g.clone());
    let mut over = 0;
    for _ in 0..6 {
        let (a, _) = generated(&w, OnUngrounded::Annotate, false).await;
        let p = a.report.prompt.expect("the prompt is reported");
        assert!(p.passages_sent >= 1, "{p:?}");
        assert_eq!(p.passages_sent, a.citations.len());
        assert_eq!(p.passages_sent + p.passages_dropped, 3, "{p:?}");
        over += usize::from(p.over_allotment);
    }
    assert!(over > 0, "the allotment came to hold no passage");
    for r in g.requests() {
        let system = &r.messages[0].content;
        assert!(
            system.contains("[1] "),
            "a prompt without sources: {system}"
        );
        assert!(!system.contains("none were found"), "{system}");
    }
}

/// `budget_ms` too small for the model: it is not asked, and the answer
/// says so — partial at `llm_ttft`, given as extractive.
#[tokio::test(start_paused = true)]
async fn a_budget_with_no_time_for_the_model_gives_a_partial_extractive_answer() {
    let g = says("never asked ");
    let w = world(g.clone());
    let (tx, _rx) = mpsc::channel(256);
    let budget = RequestBudget::start(&profile(), &CHAT_PLAN, Some(50));
    let q = ask(
        QUESTION,
        AnswerMode::Generate,
        OnUngrounded::Annotate,
        false,
    );
    let a = chat::run(&budget, &w.deps(), &q, &tx).await;
    assert!(g.requests().is_empty(), "the model was not asked");
    assert!(a.partial);
    assert_eq!(a.partial_reason, Some(PartialReason::Stage(Stage::LlmTtft)));
    assert_eq!(a.answer_mode, AnswerMode::Extractive);
    assert!(a.text.contains("not asked"), "{}", a.text);
    assert!(!a.text.contains("did not answer in time"), "{}", a.text);
    assert!(a.text.contains("--vcs none"), "{}", a.text);
}

/// The extractive reader's own work (embedding candidate sentences) is a
/// stage of its own: the stages and the overhead add up to the total.
#[tokio::test(start_paused = true)]
async fn every_millisecond_of_an_extractive_answer_is_in_a_stage() {
    let quoted = |delay| async move {
        let mut w = world(says("never asked "));
        w.e = HashEmbedder::new(256).with_delay(delay);
        let q = ask(
            QUESTION,
            AnswerMode::Extractive,
            OnUngrounded::Annotate,
            false,
        );
        turn(&w.deps(), &q).await.0
    };
    let a = quoted(15 * MS).await;
    let r = &a.report;
    let quote = r.stage(Stage::Quote).expect("a quote stage");
    assert!(quote.elapsed_ms >= 15, "{quote:?}");
    assert_eq!(quote.budget_ms, 40);
    let in_stages: u64 = r.stages.iter().map(|s| s.elapsed_ms).sum();
    assert_eq!(in_stages + r.overhead_ms, r.elapsed_ms, "{r:?}");
    assert!(r.overhead_ms <= 1, "time outside the stages: {r:?}");
    // The reader cut short by its allotment says so.
    let b = quoted(30 * MS).await;
    let quote = b.report.stage(Stage::Quote).expect("a quote stage");
    assert_eq!(quote.outcome, Outcome::Partial, "{quote:?}");
    assert!(b.partial);
    assert_eq!(b.partial_reason, Some(PartialReason::Stage(Stage::Quote)));
}
