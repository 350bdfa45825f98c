//! The budget engine under paused tokio time: every outcome, the deadline
//! arithmetic, span attributes, and cancellation of blocking work.

use ragtime_pipeline::{
    BudgetProfile, Done, Outcome, Policy, RequestBudget, Stage, StageError, StagePlan, run_blocking,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{Instant, sleep};

fn profile(total: u64, stages: &[(Stage, u64)]) -> BudgetProfile {
    let mut p = BudgetProfile {
        total_ms: total,
        cache_ms: 0,
        embed_ms: 0,
        retrieve_ms: 0,
        rerank_ms: 0,
        llm_ttft_ms: 0,
        llm_generate_ms: 0,
        quote_ms: 0,
        verify_ms: 0,
    };
    for (s, ms) in stages {
        p.set_stage_ms(*s, *ms);
    }
    p
}

fn chat_plan() -> Vec<StagePlan> {
    vec![
        StagePlan::new(Stage::Cache, Policy::Optional),
        StagePlan::new(Stage::Embed, Policy::Fallback),
        StagePlan::new(Stage::Retrieve, Policy::Required),
        StagePlan::new(Stage::Rerank, Policy::Optional),
        StagePlan::new(Stage::LlmTtft, Policy::Required),
        StagePlan::new(Stage::LlmGenerate, Policy::Required),
    ]
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

#[tokio::test(start_paused = true)]
async fn ok_when_the_work_finishes_in_time() {
    let b = RequestBudget::start(&profile(1000, &[(Stage::Embed, 50)]), &chat_plan(), None);
    let run = b
        .run(Stage::Embed, |_ctx| async {
            sleep(Duration::from_millis(20)).await;
            Ok(Done::Full(7))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Ok);
    assert_eq!(run.value, Some(7));
    assert_eq!(ms(run.elapsed), 20);
    assert_eq!(ms(run.budget), 50);
    let r = b.report();
    assert_eq!(r.stages.len(), 1);
    assert_eq!(r.stages[0].budget_ms, 50);
    assert_eq!(r.stages[0].elapsed_ms, 20);
    assert_eq!(r.stages[0].outcome, Outcome::Ok);
}

#[tokio::test(start_paused = true)]
async fn timeout_when_the_work_overruns_and_kept_nothing() {
    let b = RequestBudget::start(&profile(1000, &[(Stage::Rerank, 40)]), &chat_plan(), None);
    let run = b
        .run(Stage::Rerank, |_ctx| async {
            sleep(Duration::from_secs(3600)).await;
            Ok(Done::Full(()))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Timeout);
    assert!(run.value.is_none());
    assert_eq!(
        ms(run.elapsed),
        40,
        "the stage is cut exactly at its budget"
    );
    let detail = b.report().stages[0].detail.clone().unwrap_or_default();
    assert!(detail.contains("40 ms"), "{detail}");
}

#[tokio::test(start_paused = true)]
async fn work_ready_only_at_the_deadline_has_overrun() {
    // The result and the deadline are ready at the same instant (a task
    // polled late looks like this): the budget wins.
    let b = RequestBudget::start(
        &profile(1000, &[(Stage::Embed, 5), (Stage::Retrieve, 5)]),
        &chat_plan(),
        None,
    );
    let run = b
        .run(Stage::Embed, |_ctx| async {
            sleep(Duration::from_millis(5)).await;
            Ok(Done::Full(()))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Timeout);
    let run = b
        .run(Stage::Retrieve, |_ctx| async {
            sleep(Duration::from_millis(4)).await;
            Ok(Done::Full(()))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Ok, "a millisecond early is in time");
}

#[tokio::test(start_paused = true)]
async fn partial_when_the_work_says_so_or_kept_progress_before_overrunning() {
    let b = RequestBudget::start(&profile(1000, &[(Stage::Rerank, 40)]), &chat_plan(), None);
    let run = b
        .run(Stage::Rerank, |_ctx| async {
            Ok(Done::Partial(vec![1, 2], "scored 2 of 10".into()))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Partial);
    assert_eq!(run.value, Some(vec![1, 2]));

    // Anytime work: keeps a result after each batch, then overruns.
    let run = b
        .run(Stage::Rerank, |ctx| async move {
            let mut scored = Vec::new();
            for i in 0..10 {
                sleep(Duration::from_millis(15)).await;
                scored.push(i);
                ctx.keep(scored.clone(), format!("{} of 10 scored", scored.len()));
            }
            Ok(Done::Full(scored))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Partial);
    assert_eq!(
        run.value,
        Some(vec![0, 1]),
        "batches finished at 15 and 30 ms stand"
    );
    assert_eq!(ms(run.elapsed), 40);
    let detail = b.report().stages[1].detail.clone().unwrap_or_default();
    assert!(detail.contains("2 of 10 scored"), "{detail}");

    // Progress kept before an error also stands.
    let run = b
        .run(Stage::Rerank, |ctx| async move {
            ctx.keep(1, "first batch");
            Err::<Done<i32>, _>(StageError::Backend("model crashed".into()))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Partial);
    assert_eq!(run.value, Some(1));
}

#[tokio::test(start_paused = true)]
async fn error_when_the_work_fails_and_kept_nothing() {
    let b = RequestBudget::start(&profile(1000, &[(Stage::Retrieve, 40)]), &chat_plan(), None);
    let run: ragtime_pipeline::StageRun<()> = b
        .run(Stage::Retrieve, |_ctx| async {
            Err(StageError::Backend("index unavailable".into()))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Error);
    assert_eq!(
        b.report().stages[0].detail.as_deref(),
        Some("index unavailable")
    );
}

#[tokio::test(start_paused = true)]
async fn skipped_when_the_budget_is_zero_or_no_time_is_left() {
    let b = RequestBudget::start(
        &profile(1000, &[(Stage::Rerank, 0), (Stage::LlmTtft, 500)]),
        &chat_plan(),
        None,
    );
    let called = Arc::new(AtomicUsize::new(0));
    let c = called.clone();
    let run = b
        .run(Stage::Rerank, move |_ctx| async move {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(Done::Full(()))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Skipped);
    assert_eq!(
        called.load(Ordering::SeqCst),
        0,
        "a skipped stage never runs"
    );
    assert_eq!(b.report().stages[0].detail.as_deref(), Some("budget is 0"));

    // 600 ms pass; llm_ttft (required, 500 ms) holds back what is left.
    sleep(Duration::from_millis(600)).await;
    let b2 = RequestBudget::start(
        &profile(1000, &[(Stage::Embed, 300), (Stage::LlmTtft, 900)]),
        &chat_plan(),
        None,
    );
    sleep(Duration::from_millis(100)).await;
    let run = b2
        .run(Stage::Embed, |_ctx| async { Ok(Done::Full(())) })
        .await;
    assert_eq!(run.outcome, Outcome::Skipped);
    assert_eq!(
        b2.report().stages[0].detail.as_deref(),
        Some("no time left for this stage")
    );
}

#[tokio::test(start_paused = true)]
async fn fallback_when_the_primary_path_fails_and_the_alternative_answers() {
    let b = RequestBudget::start(
        &profile(1000, &[(Stage::Embed, 30), (Stage::Retrieve, 100)]),
        &chat_plan(),
        None,
    );
    let run = b
        .run_with_fallback(
            Stage::Embed,
            |_ctx| async {
                sleep(Duration::from_secs(10)).await;
                Ok(Done::Full("dense"))
            },
            |_ctx| async { Ok(Done::Full("lexical")) },
        )
        .await;
    assert_eq!(run.outcome, Outcome::Fallback);
    assert_eq!(run.value, Some("lexical"));
    assert_eq!(ms(run.elapsed), 30);
    let detail = b.report().stages[0].detail.clone().unwrap_or_default();
    assert!(detail.contains("primary timeout"), "{detail}");

    // A primary that answers in time is just ok.
    let run = b
        .run_with_fallback(
            Stage::Embed,
            |_ctx| async { Ok(Done::Full("dense")) },
            |_ctx| async { Ok(Done::Full("lexical")) },
        )
        .await;
    assert_eq!((run.outcome, run.value), (Outcome::Ok, Some("dense")));

    // If the fallback fails too, the stage reports the fallback's failure.
    let run: ragtime_pipeline::StageRun<()> = b
        .run_with_fallback(
            Stage::Embed,
            |_ctx| async { Err(StageError::Backend("onnx".into())) },
            |_ctx| async { Err(StageError::Backend("tantivy".into())) },
        )
        .await;
    assert_eq!(run.outcome, Outcome::Error);
}

#[tokio::test(start_paused = true)]
async fn allotment_is_min_of_stage_budget_and_time_left_minus_later_required_stages() {
    let p = profile(
        1000,
        &[
            (Stage::Embed, 500),
            (Stage::Retrieve, 200),
            (Stage::Rerank, 300),
            (Stage::LlmTtft, 300),
            (Stage::LlmGenerate, 200),
        ],
    );
    let b = RequestBudget::start(&p, &chat_plan(), None);
    // Later required: retrieve 200 + llm_ttft 300 + llm_generate 200 = 700.
    assert_eq!(ms(b.reserved_after(Stage::Embed)), 700);
    assert_eq!(ms(b.allot(Stage::Embed)), 300);
    // Rerank is optional; after it, 500 ms are reserved.
    assert_eq!(ms(b.reserved_after(Stage::Rerank)), 500);
    assert_eq!(ms(b.allot(Stage::Rerank)), 300);
    sleep(Duration::from_millis(350)).await;
    assert_eq!(ms(b.remaining()), 650);
    assert_eq!(ms(b.allot(Stage::Rerank)), 150);
    // The last stage gets whatever is left, capped by its own budget.
    assert_eq!(ms(b.allot(Stage::LlmGenerate)), 200);
    sleep(Duration::from_millis(500)).await;
    assert_eq!(ms(b.allot(Stage::LlmGenerate)), 150);
    sleep(Duration::from_millis(500)).await;
    assert_eq!(b.remaining(), Duration::ZERO);
    assert_eq!(b.allot(Stage::LlmGenerate), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn per_request_budget_tightens_never_loosens() {
    let p = profile(2000, &[(Stage::Embed, 200), (Stage::LlmGenerate, 1000)]);
    let loose = RequestBudget::start(&p, &chat_plan(), Some(60_000));
    assert_eq!(ms(loose.remaining()), 2000);
    assert_eq!(loose.report().total_ms, 2000);
    assert_eq!(loose.report().requested_ms, Some(60_000), "the cut is said");
    let tight = RequestBudget::start(&p, &chat_plan(), Some(500));
    assert_eq!(ms(tight.remaining()), 500);
    // Searching keeps its budget; the rest share the other 300 ms.
    assert_eq!(tight.profile().embed_ms, 200);
    assert_eq!(tight.profile().llm_generate_ms, 1000 * 300 / 1800);
    assert_eq!(tight.report().requested_ms, Some(500));
}

/// Every stage of a chat plan stalls forever. The request still ends within
/// its deadline: no stage outlives the time it was given.
#[tokio::test(start_paused = true)]
async fn a_request_never_outlives_its_deadline() {
    for requested in [None, Some(900), Some(37), Some(1)] {
        let p = BudgetProfile::gpu();
        let b = RequestBudget::start(&p, &chat_plan(), requested);
        let start = Instant::now();
        let total = Duration::from_millis(b.profile().total_ms);
        for plan in chat_plan() {
            let run = b
                .run(plan.stage, |_ctx| async {
                    sleep(Duration::from_secs(86_400)).await;
                    Ok(Done::Full(()))
                })
                .await;
            assert!(matches!(run.outcome, Outcome::Timeout | Outcome::Skipped));
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed <= total + Duration::from_millis(1),
            "requested {requested:?}: ran {elapsed:?} past a {total:?} budget"
        );
        let report = b.report();
        assert_eq!(report.stages.len(), 6);
        let sum: u64 = report.stages.iter().map(|s| s.elapsed_ms).sum();
        assert!(sum <= report.total_ms + 1, "{report:?}");
    }
}

/// A stage that overruns stops its blocking work: the CPU loop sees the
/// cancel flag and quits instead of burning a core for the rest of its run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_work_stops_when_its_stage_times_out() {
    let p = profile(5000, &[(Stage::Embed, 50)]);
    let b = RequestBudget::start(&p, &chat_plan(), None);
    let iterations = Arc::new(AtomicUsize::new(0));
    let it = iterations.clone();
    let t0 = std::time::Instant::now();
    let run = b
        .run(Stage::Embed, move |ctx| {
            let cancel = ctx.cancel();
            async move {
                run_blocking(cancel, move |cancel| {
                    // ~10 s of "work" in 1 ms units unless cancelled.
                    for _ in 0..10_000 {
                        if cancel.is_cancelled() {
                            return Err(StageError::Cancelled);
                        }
                        std::thread::sleep(Duration::from_millis(1));
                        it.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(Done::Full(()))
                })
                .await
            }
        })
        .await;
    assert_eq!(run.outcome, Outcome::Timeout);
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t0.elapsed()
    );
    std::thread::sleep(Duration::from_millis(100));
    let after_stop = iterations.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        iterations.load(Ordering::SeqCst),
        after_stop,
        "the blocking loop kept running"
    );
    assert!(after_stop < 1000, "{after_stop} iterations ran");
}

// --- span attributes -------------------------------------------------------

/// A span or event name with its fields.
type Record = (String, HashMap<String, String>);

#[derive(Default, Clone)]
struct Captured {
    spans: Arc<Mutex<Vec<Record>>>,
    events: Arc<Mutex<Vec<Record>>>,
}

struct Visitor<'a>(&'a mut HashMap<String, String>);
impl tracing::field::Visit for Visitor<'_> {
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.insert(
            f.name().to_owned(),
            format!("{v:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.0.insert(f.name().to_owned(), v.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Captured
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = HashMap::new();
        attrs.record(&mut Visitor(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }
    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<HashMap<String, String>>()
        {
            values.record(&mut Visitor(fields));
        }
    }
    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Visitor(&mut fields));
        let parent = ctx
            .event_span(event)
            .map(|s| s.name().to_owned())
            .unwrap_or_default();
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((parent, fields));
    }
    fn on_close(&self, id: tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<HashMap<String, String>>()
                .cloned()
                .unwrap_or_default();
            self.spans
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((span.name().to_owned(), fields));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn every_stage_is_a_span_with_the_four_budget_attributes_and_overruns_are_events() {
    use tracing_subscriber::layer::SubscriberExt;
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let p = profile(
        1000,
        &[
            (Stage::Embed, 30),
            (Stage::Rerank, 0),
            (Stage::LlmTtft, 100),
        ],
    );
    let b = RequestBudget::start(&p, &chat_plan(), None);
    b.run(Stage::Embed, |_| async {
        sleep(Duration::from_millis(10)).await;
        Ok(Done::Full(()))
    })
    .await;
    b.run(Stage::Rerank, |_| async { Ok(Done::Full(())) }).await;
    b.run(Stage::LlmTtft, |_| async {
        sleep(Duration::from_secs(5)).await;
        Ok(Done::Full(()))
    })
    .await;

    let spans = captured
        .spans
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let names: Vec<&str> = spans.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["embed", "rerank", "llm_ttft"]);
    let expect = [
        ("embed", "30", "10", "ok"),
        ("rerank", "0", "0", "skipped"),
        ("llm_ttft", "100", "100", "timeout"),
    ];
    for ((name, fields), (n, budget, elapsed, outcome)) in spans.iter().zip(expect) {
        assert_eq!(name, n);
        assert_eq!(
            fields.get("budget.ms").map(String::as_str),
            Some(budget),
            "{name}: {fields:?}"
        );
        assert_eq!(
            fields.get("budget.elapsed_ms").map(String::as_str),
            Some(elapsed),
            "{name}"
        );
        assert_eq!(
            fields.get("budget.outcome").map(String::as_str),
            Some(outcome),
            "{name}"
        );
        assert!(
            fields.contains_key("budget.remaining_ms"),
            "{name}: {fields:?}"
        );
    }
    assert_eq!(
        spans[2].1.get("budget.remaining_ms").map(String::as_str),
        Some("890")
    );

    let events = captured
        .events
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let overruns: Vec<_> = events
        .iter()
        .filter(|(_, f)| f.get("message").map(String::as_str) == Some("budget.overrun"))
        .collect();
    assert_eq!(overruns.len(), 1, "{events:?}");
    assert_eq!(
        overruns[0].0, "llm_ttft",
        "the overrun event belongs to the stage's span"
    );
    assert_eq!(
        overruns[0].1.get("stage").map(String::as_str),
        Some("llm_ttft")
    );
}

/// On a busy runtime the deadline's timer may not have fired when work
/// that finished late is polled: a full result that came after the
/// deadline is still an overrun (here the work blocks its thread past the
/// deadline within one poll, so the timer cannot fire first).
#[tokio::test]
async fn a_full_result_seen_after_the_deadline_is_a_timeout() {
    let b = RequestBudget::start(&profile(1000, &[(Stage::Embed, 2)]), &chat_plan(), None);
    let run = b
        .run(Stage::Embed, |_ctx| async {
            std::thread::sleep(Duration::from_millis(20));
            Ok(Done::Full(7))
        })
        .await;
    assert_eq!(run.outcome, Outcome::Timeout, "{:?}", b.report());
    assert!(run.value.is_none());
    assert!(b.report().stages[0].overran);
}
