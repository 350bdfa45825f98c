//! The LLM stages under load, on paused time with scripted backends:
//! admission (queue order by priority and deadline, shedding what cannot
//! wait, a queue timeout not mistaken for slow prefill), hedging, failover
//! and circuit breakers, and broken streams.

mod common;

use async_trait::async_trait;
use common::{MS, World, backend, profile};
use ragtime_core::{
    GenRequest, Generator, Outcome, PartialReason, Scope, Stage, StageError, TokenStream,
};
use ragtime_pipeline::RequestBudget;
use ragtime_pipeline::backend::breaker::BreakerState;
use ragtime_pipeline::backend::{Backend, Backends, HedgePolicy};
use ragtime_pipeline::chat::{self, CHAT_PLAN, ChatAnswer, ChatDeps, ChatInput};
use ragtime_testkit::{End, HashEmbedder, MemoryRetriever, Script, ScriptedGenerator, chunk};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

fn corpus(e: &HashEmbedder) -> MemoryRetriever {
    let chunks = (0..8)
        .map(|i| {
            let text = format!("Passage {i} on insulin signalling and sleep in adults.");
            chunk(
                i + 1,
                &format!("d{i}"),
                &format!("Doc {i}"),
                &text,
                json!({}),
            )
        })
        .collect();
    MemoryRetriever::new(e, chunks)
}

fn input(query: &str, priority: u8) -> ChatInput {
    ChatInput {
        priority,
        ..ChatInput::new(query, Scope::new("t", "c", "", 1), 3)
    }
}

/// The request tests' corpus, on `list` with `hedge`.
fn world(list: Vec<Arc<Backend>>, hedge: HedgePolicy) -> Arc<World> {
    let e = HashEmbedder::new(64);
    let r = corpus(&e);
    Arc::new(World::new(e, r, Backends::new(list, hedge)))
}

trait Ask {
    async fn ask(&self, input: ChatInput) -> ChatAnswer;
}

impl Ask for World {
    async fn ask(&self, input: ChatInput) -> ChatAnswer {
        let deps = self.deps();
        let (tx, mut rx) = mpsc::channel(256);
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let budget = RequestBudget::start(&profile(), &CHAT_PLAN, None);
        let a = chat::run(&budget, &deps, &input, &tx).await;
        drop(tx);
        let _ = drain.await;
        a
    }
}

fn stage(a: &ChatAnswer, s: Stage) -> (Outcome, u64, u64) {
    a.report.stage(s).map_or((Outcome::Skipped, 0, 0), |x| {
        (x.outcome, x.elapsed_ms, x.budget_ms)
    })
}

/// 32 requests in flight on a backend of two slots that answers in about
/// 300 ms: the first two get slots at once; of the rest, premium tenants'
/// go first; those whose expected wait leaves no room for a first token
/// are shed at once (an extractive answer, `overload`); no stage outlives
/// its budget.
#[tokio::test(start_paused = true)]
async fn thirty_two_in_flight_queue_by_priority_and_deadline_and_shed_what_cannot_wait() {
    let g = Arc::new(ScriptedGenerator::new(Script::tokens(5, 200 * MS, 20 * MS)));
    let b = backend("one", g.clone(), 2, 1.0);
    // Teach the gate the service time before the burst.
    for _ in 0..5 {
        let p = b.gate.try_admit();
        tokio::time::sleep(300 * MS).await;
        drop(p);
    }
    let w = world(vec![b.clone()], HedgePolicy::default());
    let mut tasks = Vec::new();
    for i in 0..32u8 {
        let w = w.clone();
        let priority = u8::from(i % 2 == 1);
        tasks.push(tokio::spawn(async move {
            let a = w
                .ask(input(
                    &format!("insulin question {i} p{priority}"),
                    priority,
                ))
                .await;
            (i, priority, a)
        }));
    }
    let mut answered = Vec::new();
    let (mut shed, mut missed) = (0, 0);
    for t in tasks {
        let Ok((i, priority, a)) = t.await else {
            panic!("a request task failed");
        };
        for s in &a.report.stages {
            assert!(
                s.elapsed_ms <= s.budget_ms + 2 || s.budget_ms == 0,
                "request {i}: {} took {} ms of a {} ms budget",
                s.stage,
                s.elapsed_ms,
                s.budget_ms
            );
        }
        match a.partial_reason {
            None => answered.push((i, priority)),
            Some(PartialReason::Overload) => {
                shed += 1;
                assert_eq!(stage(&a, Stage::LlmTtft).0, Outcome::Skipped);
                assert!(
                    a.first_text < Some(50 * MS),
                    "a shed answer is immediate: {:?}",
                    a.first_text
                );
                assert!(a.text.starts_with("> "), "a quote first: {}", a.text);
                assert!(a.text.ends_with(
                    "(The model was too busy to answer; this is quoted from the sources.)"
                ));
            }
            // Queued, then too late for a first token when a slot came.
            Some(PartialReason::Stage(Stage::LlmTtft)) => missed += 1,
            Some(other) => panic!(
                "request {i}: unexpected partial reason {other}: {:?}",
                a.report
            ),
        }
    }
    assert!(shed > 0, "some requests could not wait");
    assert!(answered.len() >= 4, "{answered:?}");
    assert!(
        missed * 10 <= 32,
        "at most a tenth admitted then missed: {missed}"
    );
    assert_eq!(answered.len() + shed + missed, 32);
    // The order the backend saw: after the two that found a free slot,
    // every premium request before any other.
    let seen: Vec<u8> = g
        .requests()
        .iter()
        .map(|r| u8::from(r.messages.last().is_some_and(|m| m.content.ends_with("p1"))))
        .collect();
    let after_first_two = &seen[2.min(seen.len())..];
    let first_plain = after_first_two
        .iter()
        .position(|p| *p == 0)
        .unwrap_or(after_first_two.len());
    assert!(
        after_first_two[first_plain..].iter().all(|p| *p == 0),
        "premium requests wait less: {seen:?}"
    );
    assert_eq!(b.gate.state().busy, 0, "every slot was given back");
}

/// A request that queued and timed out never reached the backend: that is
/// not slow prefill, and the backend's learned speed does not move.
#[tokio::test(start_paused = true)]
async fn a_queue_timeout_is_not_booked_as_slow_prefill() {
    let g = Arc::new(ScriptedGenerator::new(Script::tokens(3, 100 * MS, 10 * MS)));
    let b = backend("one", g.clone(), 1, 1.0);
    let w = world(vec![b.clone()], HedgePolicy::default());
    let before = b.stats.estimates();
    // Hold the only slot for longer than the allotment; the gate still
    // believes its prior (a slot frees in about 2 s), so a request with a
    // deadline beyond that queues rather than being shed.
    let held = b.gate.try_admit();
    let mut long = input("insulin", 0);
    long.max_tokens = Some(8);
    let mut p = profile();
    p.llm_ttft_ms = 4_000;
    let deps = ChatDeps {
        embedder: &w.e,
        retriever: &w.r,
        reranker: None,
        backends: &w.backends,
        levels: &w.levels,
        cache: None,
    };
    let (tx, _rx) = mpsc::channel(256);
    let budget = RequestBudget::start(&p, &CHAT_PLAN, None);
    let a = chat::run(&budget, &deps, &long, &tx).await;
    drop(held);
    assert_eq!(a.partial_reason, Some(PartialReason::Stage(Stage::LlmTtft)));
    assert_eq!(stage(&a, Stage::LlmTtft).0, Outcome::Timeout);
    assert!(a.queued >= Some(3_900 * MS), "{:?}", a.queued);
    assert!(g.requests().is_empty(), "it never reached the backend");
    assert_eq!(
        b.stats.estimates(),
        before,
        "the prefill estimate did not move"
    );
    assert_eq!(
        b.breaker.state(),
        BreakerState::Closed,
        "queueing is not a backend failure"
    );
}

/// A first token later than the primary backend's p95 sends the request to
/// a second backend with a free slot; the first first token wins and the
/// other generation is dropped.
#[tokio::test(start_paused = true)]
async fn a_slow_first_token_is_hedged_on_another_backend() {
    let slow = Arc::new(ScriptedGenerator::new(Script::tokens(
        3,
        3_000 * MS,
        10 * MS,
    )));
    let fast = Arc::new(ScriptedGenerator::new(Script::tokens(3, 100 * MS, 10 * MS)));
    // The slow one is preferred (weight) and has shown 150 ms first tokens.
    let a = backend("slow", slow.clone(), 2, 10.0);
    let b = backend("fast", fast.clone(), 2, 1.0);
    for _ in 0..10 {
        a.record_ttft(150 * MS);
    }
    let hedge = HedgePolicy {
        share: 1.0,
        ..HedgePolicy::default()
    };
    let w = world(vec![a.clone(), b.clone()], hedge);
    let ans = w.ask(input("insulin", 0)).await;
    assert!(!ans.partial, "{:?}", ans.report);
    assert!(ans.hedged);
    assert_eq!(ans.backend.as_deref(), Some("fast"));
    // Hedged at the floor (200 ms > the 150 ms p95), first token 100 ms later.
    assert_eq!(stage(&ans, Stage::LlmTtft).1, 300);
    assert_eq!((slow.requests().len(), fast.requests().len()), (1, 1));
    assert_eq!(a.gate.state().busy, 0, "the loser's slot was given back");
    assert_eq!(w.backends.hedge_counts(), (1, 1));

    // At share 0, never (fresh backends: the fast one has now shown its
    // speed, and the router would prefer it).
    let a = backend("slow", slow.clone(), 2, 10.0);
    let b = backend("fast", fast.clone(), 2, 1.0);
    let w = world(
        vec![a.clone(), b.clone()],
        HedgePolicy {
            share: 0.0,
            ..hedge
        },
    );
    let ans = w.ask(input("insulin", 0)).await;
    assert!(!ans.hedged);
    assert_eq!(
        ans.partial_reason,
        Some(PartialReason::Stage(Stage::LlmTtft))
    );
}

/// A backend that fails.
struct Broken;

#[async_trait]
impl Generator for Broken {
    fn address(&self) -> &str {
        "broken"
    }

    async fn generate(&self, _: GenRequest) -> Result<TokenStream, StageError> {
        Err(StageError::Backend("connection refused".into()))
    }
}

/// A backend that fails fast gives way to another within the same request,
/// and after three failures in a row its breaker opens: it gets no more
/// requests until the cool-down.
#[tokio::test(start_paused = true)]
async fn a_failing_backend_gives_way_and_its_breaker_opens() {
    let ok = Arc::new(ScriptedGenerator::new(Script::tokens(3, 100 * MS, 10 * MS)));
    let bad = backend("broken", Arc::new(Broken), 2, 10.0);
    let good = backend("good", ok.clone(), 2, 1.0);
    let w = world(vec![bad.clone(), good.clone()], HedgePolicy::default());
    for i in 0..3 {
        let a = w.ask(input("insulin", 0)).await;
        assert!(!a.partial, "request {i} failed over: {:?}", a.report);
        assert_eq!(a.backend.as_deref(), Some("good"));
    }
    assert_eq!(bad.breaker.state(), BreakerState::Open);
    let a = w.ask(input("insulin", 0)).await;
    assert_eq!(a.backend.as_deref(), Some("good"));
    assert_eq!(ok.requests().len(), 4);

    // Only broken backends: an extractive answer, reason llm_error.
    let b2 = backend("b2", Arc::new(Broken), 1, 1.0);
    let w = world(vec![b2.clone()], HedgePolicy::default());
    let a = w.ask(input("insulin", 0)).await;
    assert_eq!(a.partial_reason, Some(PartialReason::LlmError));
    assert!(
        a.text
            .ends_with("(The model failed to answer; this is quoted from the sources.)")
    );
    // Once its breaker is open the model is not asked, and the answer
    // says so (not that the model failed); the backend's status counts it.
    for _ in 0..2 {
        w.ask(input("insulin", 0)).await;
    }
    assert_eq!(b2.breaker.state(), BreakerState::Open);
    let a = w.ask(input("insulin", 0)).await;
    assert_eq!(a.partial_reason, Some(PartialReason::LlmUnavailable));
    assert!(a.text.contains("The model was not asked"), "{}", a.text);
    assert_eq!(stage(&a, Stage::LlmTtft).0, Outcome::Skipped);
    assert_eq!(w.backends.status()[0].skipped, 1);
}

/// A stream that ends before the backend said it was done is a failure:
/// what was streamed stands, the answer is `llm_error`, and nothing is
/// learned from it.
#[tokio::test(start_paused = true)]
async fn a_broken_stream_is_an_llm_error_and_teaches_nothing() {
    let g = Arc::new(ScriptedGenerator::new(
        Script::tokens(4, 100 * MS, 10 * MS).ending(End::Break),
    ));
    let b = backend("one", g, 2, 1.0);
    let w = world(vec![b.clone()], HedgePolicy::default());
    let a = w.ask(input("insulin", 0)).await;
    assert_eq!(a.text, "tok0 tok1 tok2 tok3 ");
    assert_eq!(a.partial_reason, Some(PartialReason::LlmError));
    assert_eq!(a.finish_reason, "length");
    assert_eq!(stage(&a, Stage::LlmGenerate).0, Outcome::Partial);
    assert_eq!(b.stats.estimates().observations, 0);
}

/// A backend whose health probe is slow (busy) or refused (down).
struct Probed {
    slow: bool,
}

#[async_trait]
impl Generator for Probed {
    fn address(&self) -> &str {
        "probed"
    }

    async fn generate(&self, _: GenRequest) -> Result<TokenStream, StageError> {
        Err(StageError::Backend("unused".into()))
    }

    async fn ping(&self) -> Result<(), String> {
        if self.slow {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        } else {
            Err("connection refused".into())
        }
    }
}

/// The prober opens the breaker of a backend that refuses its probe within
/// one period, and leaves a merely slow (busy) one alone.
#[tokio::test(start_paused = true)]
async fn a_refused_probe_opens_the_breaker_and_a_slow_one_does_not() {
    let busy = backend("busy", Arc::new(Probed { slow: true }), 1, 1.0);
    let down = backend("down", Arc::new(Probed { slow: false }), 1, 1.0);
    let backends = Arc::new(Backends::new(
        vec![busy.clone(), down.clone()],
        HedgePolicy::default(),
    ));
    backends.probe(500 * MS);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(busy.breaker.state(), BreakerState::Closed);
    assert_eq!(down.breaker.state(), BreakerState::Open);
}

/// A small model that repeats itself is stopped where the loop began:
/// `degenerate`, the text before the loop stands, nothing learned.
#[tokio::test(start_paused = true)]
async fn a_looping_answer_is_stopped_where_the_loop_began() {
    let line = "This is a custom build configuration file.\n";
    let mut tokens = vec!["Mitochondria make ATP [1].\n".to_owned()];
    tokens.extend(std::iter::repeat_n(line.to_owned(), 20));
    let g = Arc::new(ScriptedGenerator::new(Script {
        tokens,
        ..Script::tokens(0, 100 * MS, 10 * MS)
    }));
    let b = backend("one", g, 2, 1.0);
    let w = world(vec![b.clone()], HedgePolicy::default());
    let a = w.ask(input("insulin", 0)).await;
    assert_eq!(a.text, format!("Mitochondria make ATP [1].\n{line}"));
    assert_eq!(a.partial_reason, Some(PartialReason::Degenerate));
    assert!(a.partial);
    assert_eq!(a.finish_reason, "stop");
    assert_eq!(b.stats.estimates().observations, 0);
    assert_eq!(b.gate.state().busy, 0, "the slot was given back");
}

/// A backend whose probe is refused before `up` and from `down` on.
struct Starting {
    up: tokio::time::Instant,
    down: tokio::time::Instant,
}

#[async_trait]
impl Generator for Starting {
    fn address(&self) -> &str {
        "starting"
    }

    async fn generate(&self, _: GenRequest) -> Result<TokenStream, StageError> {
        Err(StageError::Backend("unused".into()))
    }

    async fn ping(&self) -> Result<(), String> {
        let now = tokio::time::Instant::now();
        if now < self.up || now >= self.down {
            Err("connection refused".into())
        } else {
            Ok(())
        }
    }
}

/// Records each event's level and message.
#[derive(Clone, Default)]
struct Logged(Arc<std::sync::Mutex<Vec<(tracing::Level, String)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logged {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        e.record(&mut m);
        if let Ok(mut l) = self.0.lock() {
            l.push((*e.metadata().level(), m.0));
        }
    }
}

/// A backend still starting (the local server loading its model) is not a
/// warning: its refused probes say so at INFO until it has been up once;
/// down after that, it is.
#[tokio::test(start_paused = true)]
async fn a_backend_that_is_starting_is_not_a_warning_until_it_was_up() {
    use tracing_subscriber::layer::SubscriberExt;
    let logged = Logged::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logged.clone()));
    let t0 = tokio::time::Instant::now();
    let b = backend(
        "starting",
        Arc::new(Starting {
            up: t0 + Duration::from_secs(2),
            down: t0 + Duration::from_secs(5),
        }),
        1,
        1.0,
    );
    let backends = Arc::new(Backends::new(vec![b.clone()], HedgePolicy::default()));
    backends.probe(500 * MS);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(b.breaker.state(), BreakerState::Closed);
    let seen = logged.0.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(
        seen.iter().all(|(level, _)| *level != tracing::Level::WARN),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|(_, m)| m == "llm backend not answering yet"),
        "{seen:?}"
    );
    assert!(seen.iter().any(|(_, m)| m == "llm backend up"), "{seen:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(b.breaker.state(), BreakerState::Open);
    let seen = logged.0.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(
        seen.iter()
            .any(|(level, m)| *level == tracing::Level::WARN
                && m == "llm backend down: breaker open"),
        "{seen:?}"
    );
}

/// The first request it gets streams a long answer; every later one stalls
/// before its first token (a backend busy with one long generation).
struct OneStreams {
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl Generator for OneStreams {
    fn address(&self) -> &str {
        "one-streams"
    }

    async fn generate(&self, _: GenRequest) -> Result<TokenStream, StageError> {
        use futures::StreamExt;
        let first = self.calls.fetch_add(1, std::sync::atomic::Ordering::AcqRel) == 0;
        let tokens: Vec<_> = if first {
            (0..200).collect()
        } else {
            Vec::new()
        };
        let stalls = (!first).then_some(());
        let s = futures::stream::iter(tokens)
            .then(|i| async move {
                tokio::time::sleep(20 * MS).await;
                Ok(ragtime_core::GenEvent::Delta(format!("w{i} ")))
            })
            .chain(futures::stream::iter(stalls).then(|()| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Err(StageError::Backend("stalled".into()))
            }));
        Ok(s.boxed())
    }
}

/// Late first tokens from a backend that is streaming other answers are a
/// busy backend, not a dead one: its breaker stays closed. The same
/// timeouts with nothing streaming open it.
#[tokio::test(start_paused = true)]
async fn late_first_tokens_open_the_breaker_only_when_nothing_streams() {
    let g = Arc::new(OneStreams {
        calls: std::sync::atomic::AtomicUsize::new(0),
    });
    let b = backend("busy", g, 4, 1.0);
    let w = world(vec![b.clone()], HedgePolicy::default());
    let streaming = {
        let w = w.clone();
        tokio::spawn(async move { w.ask(input("insulin", 0)).await })
    };
    tokio::time::sleep(200 * MS).await;
    let late = futures::future::join_all((0..3).map(|_| w.ask(input("insulin", 0)))).await;
    for a in &late {
        assert_eq!(a.partial_reason, Some(PartialReason::Stage(Stage::LlmTtft)));
    }
    assert_eq!(b.breaker.state(), BreakerState::Closed, "it was streaming");
    let a = streaming.await.expect("join");
    assert!(a.text.starts_with("w0 w1 "), "{}", a.text);

    // Nothing streams now: three late first tokens open it.
    for _ in 0..3 {
        let a = w.ask(input("insulin", 0)).await;
        assert_eq!(a.partial_reason, Some(PartialReason::Stage(Stage::LlmTtft)));
    }
    assert_eq!(b.breaker.state(), BreakerState::Open);
}

/// A backend that streams its prompt progress and reads too slowly for the
/// first token to come within `llm_ttft` is cut over as soon as the rate
/// shows it — not at the deadline — and the report says it was predicted;
/// its slot is free at once and its breaker untouched. One without
/// progress is waited out to the deadline, as before; one whose progress
/// promised a fast prefill and then stalled still ends at the deadline.
#[tokio::test(start_paused = true)]
async fn a_prefill_that_will_miss_its_first_token_deadline_is_cut_over_early() {
    // 2,000 prompt tokens at 500 a second: a first token after 4 s; the
    // budget gives 1 s.
    let slow = Arc::new(ScriptedGenerator::new(
        Script::tokens(3, 100 * MS, 10 * MS).reading(2000, 500.0, 200 * MS),
    ));
    let b = backend("reading", slow, 1, 1.0);
    let w = world(vec![b.clone()], HedgePolicy::default());
    let a = w.ask(input("insulin", 0)).await;
    assert_eq!(a.partial_reason, Some(PartialReason::Stage(Stage::LlmTtft)));
    let (outcome, elapsed, budget) = stage(&a, Stage::LlmTtft);
    assert_eq!(outcome, Outcome::Timeout);
    assert!(
        elapsed <= 250 && budget >= 900,
        "cut at {elapsed} of {budget} ms"
    );
    let detail = a
        .report
        .stage(Stage::LlmTtft)
        .and_then(|s| s.detail.clone())
        .unwrap_or_default();
    assert!(detail.contains("predicted"), "{detail}");
    assert_eq!(b.gate.state().busy, 0, "the request was dropped");
    assert_eq!(b.breaker.state(), BreakerState::Closed);
    // The steps it was read in taught the reading rate: 2 ms a token.
    assert_eq!(b.stats.estimates().ms_per_read_token, Some(2.0));

    // No progress: the same backend speed is only known at the deadline.
    let quiet = Arc::new(ScriptedGenerator::new(Script::tokens(
        3,
        4000 * MS,
        10 * MS,
    )));
    let w = world(
        vec![backend("quiet", quiet, 1, 1.0)],
        HedgePolicy::default(),
    );
    let a = w.ask(input("insulin", 0)).await;
    let (outcome, elapsed, budget) = stage(&a, Stage::LlmTtft);
    assert_eq!(outcome, Outcome::Timeout);
    assert!(
        elapsed + 5 >= budget,
        "waited out: {elapsed} of {budget} ms"
    );

    // Progress that promises a fast prefill, then nothing: the deadline.
    let liar = Arc::new(ScriptedGenerator::new(Script {
        progress: vec![(Duration::ZERO, 0, 2000), (100 * MS, 1000, 2000)],
        ..Script::tokens(3, Duration::from_secs(3600), 10 * MS)
    }));
    let w = world(vec![backend("liar", liar, 1, 1.0)], HedgePolicy::default());
    let a = w.ask(input("insulin", 0)).await;
    let (outcome, elapsed, budget) = stage(&a, Stage::LlmTtft);
    assert_eq!(outcome, Outcome::Timeout);
    assert!(
        elapsed + 5 >= budget && elapsed <= budget + 5,
        "{elapsed} of {budget} ms"
    );
    assert_eq!(a.partial_reason, Some(PartialReason::Stage(Stage::LlmTtft)));
}

/// A server that reads prompts one after another, as llama.cpp's does on a
/// CPU: a request's prompt is read only once the one before it is done, at
/// `tokens_per_s`, with a progress event (its 0 % event first) every
/// 100 ms; then its answer. The first request's prompt is `first_total`
/// tokens and its 0 % event comes `first_delay` after the call (a long
/// prompt being tokenised); any later one's is what its characters make at
/// 3.5 characters a token. A dropped request stops being read.
struct Serial {
    calls: std::sync::atomic::AtomicUsize,
    reader: Arc<tokio::sync::Mutex<()>>,
    tokens_per_s: f64,
    first_total: u32,
    first_delay: Duration,
}

#[async_trait]
impl Generator for Serial {
    fn address(&self) -> &str {
        "serial"
    }

    async fn generate(&self, request: GenRequest) -> Result<TokenStream, StageError> {
        use futures::StreamExt;
        use ragtime_core::GenEvent;
        let i = self.calls.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let chars: usize = request.messages.iter().map(|m| m.content.len()).sum();
        let (total, delay) = if i == 0 {
            (self.first_total, self.first_delay)
        } else {
            ((chars as f64 / 3.5) as u32, Duration::ZERO)
        };
        let step = (self.tokens_per_s / 10.0) as u32;
        let reader = self.reader.clone();
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let send = |ev| tx.send(Ok(ev));
            {
                let _reading = reader.lock().await;
                tokio::time::sleep(delay).await;
                let mut processed = 0;
                if send(GenEvent::Progress { processed, total }).await.is_err() {
                    return;
                }
                while processed < total {
                    tokio::time::sleep(100 * MS).await;
                    processed = (processed + step).min(total);
                    if send(GenEvent::Progress { processed, total }).await.is_err() {
                        return;
                    }
                }
            }
            for t in 0..3 {
                tokio::time::sleep(10 * MS).await;
                if send(GenEvent::Delta(format!("w{t} "))).await.is_err() {
                    return;
                }
            }
            let _ = send(GenEvent::Finish("stop".into())).await;
        });
        Ok(
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
                .boxed(),
        )
    }
}

/// On a server that reads prompts one after another, a request admitted
/// while the prompt ahead of it looked short is cut over as soon as that
/// prompt's progress shows how long it really is — long before its own
/// deadline, without a progress event of its own — while the request
/// ahead is answered. The backend's reading rate, learned from the first
/// request's progress, then sheds at admission what the backlog would
/// make late.
#[tokio::test(start_paused = true)]
async fn a_request_behind_a_long_prompt_is_cut_over_before_its_own_progress() {
    let serial = Arc::new(Serial {
        calls: std::sync::atomic::AtomicUsize::new(0),
        reader: Arc::default(),
        tokens_per_s: 1000.0,
        first_total: 800,
        first_delay: 150 * MS,
    });
    let b = backend("serial", serial, 2, 1.0);
    // Learned before: a token read in 1 ms.
    b.stats.observe_reading(500, 500 * MS);
    let w = world(vec![b.clone()], HedgePolicy::default());
    let first = {
        let w = w.clone();
        tokio::spawn(async move { w.ask(input("insulin", 0)).await })
    };
    tokio::time::sleep(100 * MS).await;
    let t = tokio::time::Instant::now();
    let behind = w.ask(input("insulin", 0)).await;
    let (outcome, elapsed, budget) = stage(&behind, Stage::LlmTtft);
    assert_eq!(
        behind.partial_reason,
        Some(PartialReason::Stage(Stage::LlmTtft)),
        "{:?}",
        behind.report
    );
    assert_eq!(outcome, Outcome::Timeout);
    assert!(
        elapsed <= 250 && budget >= 900,
        "cut at {elapsed} of {budget} ms"
    );
    assert!(t.elapsed() < 400 * MS, "{:?}", t.elapsed());
    let detail = behind
        .report
        .stage(Stage::LlmTtft)
        .and_then(|s| s.detail.clone())
        .unwrap_or_default();
    assert!(
        detail.contains("predicted") && detail.contains("behind"),
        "{detail}"
    );
    // Waiting behind another prompt is not slow reading.
    assert_eq!(b.stats.estimates().ms_per_read_token, Some(1.0));

    let first = first.await.expect("join");
    assert_eq!(first.partial_reason, None, "{:?}", first.report);
    assert!(first.text.starts_with("w0 w1 w2"), "{}", first.text);
    assert_eq!(b.gate.state().busy, 0);
    assert_eq!(b.prefills.backlog(), 0.0, "both readings left the ledger");
    // Its progress taught the rate it read at: 800 tokens in 800 ms.
    let rate = b.stats.estimates().ms_per_read_token.unwrap_or_default();
    assert!((rate - 1.0).abs() < 0.05, "{rate}");
}
