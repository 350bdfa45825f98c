//! Request deadlines, stage allotments, outcomes and the budget report;
//! the profiles they come from ([`profile`]), the budgets changed at
//! runtime and their history ([`runtime`]), experiments between two
//! profiles ([`experiment`]) and budgets advised from what stages took
//! ([`advice`]).

pub mod advice;
pub mod experiment;
pub mod profile;
pub mod runtime;

use crate::budget::profile::BudgetProfile;
use ragtime_core::{BudgetReport, Cancel, Outcome, PromptReport, Stage, StageError, StageReport};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{Instrument, Span, field};

/// What the next stage gets when this one ends without a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The request needs this stage: its budget is reserved by every earlier
    /// stage, and without a result the request degrades (e.g. to an
    /// extractive answer) instead of failing.
    Required,
    /// The next stage gets the previous stage's output unchanged.
    Optional,
    /// An alternative path answers instead ([`RequestBudget::run_with_fallback`]).
    Fallback,
}

/// One stage of a request's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagePlan {
    pub stage: Stage,
    pub policy: Policy,
}

impl StagePlan {
    pub const fn new(stage: Stage, policy: Policy) -> Self {
        Self { stage, policy }
    }
}

/// What a stage's work returns when it finishes in time.
#[derive(Debug, Clone, PartialEq)]
pub enum Done<T> {
    /// All of the work.
    Full(T),
    /// Some of the work, by the stage's own choice (e.g. an anytime reranker
    /// that scored 12 of 30 candidates before its deadline), with a note.
    Partial(T, String),
}

/// Handed to a stage's work: its deadline, a cancel flag for CPU work, and a
/// place to keep progress so that an overrun still yields a partial result.
pub struct StageCtx<T> {
    stage: Stage,
    deadline: Instant,
    cancel: Cancel,
    kept: Arc<Mutex<Option<(T, String)>>>,
    note: Arc<Mutex<Option<String>>>,
}

impl<T> StageCtx<T> {
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// When this stage's budget runs out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left in this stage's budget.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Set when the stage's deadline passes or its future is dropped; pass it
    /// to blocking work ([`crate::run_blocking`]).
    pub fn cancel(&self) -> Cancel {
        self.cancel.clone()
    }

    /// Records progress. If the budget runs out (or the work fails) before
    /// the stage returns, the last kept value stands with outcome `partial`.
    /// A note for the report when the stage ends `ok` (what it did, where).
    pub fn note(&self, note: impl Into<String>) {
        *lock(&self.note) = Some(note.into());
    }

    pub fn keep(&self, value: T, note: impl Into<String>) {
        *lock(&self.kept) = Some((value, note.into()));
    }
}

/// How a stage ended, and its value if it kept one.
#[derive(Debug)]
pub struct StageRun<T> {
    pub stage: Stage,
    pub outcome: Outcome,
    pub value: Option<T>,
    pub budget: Duration,
    pub elapsed: Duration,
}

impl<T> StageRun<T> {
    fn new(
        stage: Stage,
        outcome: Outcome,
        value: Option<T>,
        budget: Duration,
        elapsed: Duration,
    ) -> Self {
        Self {
            stage,
            outcome,
            value,
            budget,
            elapsed,
        }
    }
}

/// The budget of one request: its deadline, its plan and the report so far.
#[derive(Debug)]
pub struct RequestBudget {
    profile: BudgetProfile,
    plan: Vec<StagePlan>,
    start: Instant,
    deadline: Instant,
    records: Mutex<Vec<StageReport>>,
    index_load_ms: Mutex<Option<u64>>,
    prompt: Mutex<Option<PromptReport>>,
    requested_ms: Option<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds for a span attribute: a signed integer, which OTLP
/// exports as an int (`tracing-opentelemetry` turns a `u64` into its text).
pub(crate) fn span_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A span named after the stage, with the four budget attributes and, for
/// LLM-specific trace stores (Phoenix), the OpenInference span kind.
fn stage_span(stage: Stage, budget: Duration) -> Span {
    macro_rules! span {
        ($name:literal, $kind:literal) => {
            tracing::info_span!(
                $name,
                openinference.span.kind = $kind,
                budget.ms = span_ms(budget),
                budget.elapsed_ms = field::Empty,
                budget.remaining_ms = field::Empty,
                budget.outcome = field::Empty,
            )
        };
    }
    match stage {
        Stage::Cache => span!("cache", "CHAIN"),
        Stage::Embed => span!("embed", "EMBEDDING"),
        Stage::Retrieve => span!("retrieve", "RETRIEVER"),
        Stage::Rerank => span!("rerank", "RERANKER"),
        Stage::LlmTtft => tracing::info_span!(
            "llm_ttft",
            openinference.span.kind = "CHAIN",
            budget.ms = span_ms(budget),
            budget.elapsed_ms = field::Empty,
            budget.remaining_ms = field::Empty,
            budget.outcome = field::Empty,
            llm.backend = field::Empty,
            llm.queue_ms = field::Empty,
            llm.queue_depth = field::Empty,
            llm.hedged = field::Empty,
        ),
        Stage::LlmGenerate => span!("llm_generate", "CHAIN"),
        Stage::Quote => span!("quote", "CHAIN"),
        Stage::Verify => span!("verify", "EVALUATOR"),
    }
}

enum Attempt<T> {
    Value(T, Option<String>, Outcome),
    Nothing(Outcome, String),
}

impl RequestBudget {
    /// Starts the clock for a request. `requested_ms` (the request's own
    /// `budget_ms`) can tighten the configured total, never loosen it.
    pub fn start(profile: &BudgetProfile, plan: &[StagePlan], requested_ms: Option<u64>) -> Self {
        Self::start_at(profile, plan, requested_ms, Instant::now())
    }

    /// As [`RequestBudget::start`], for a request that arrived at `start`
    /// (its clock runs from then: authentication and lookups count).
    pub fn start_at(
        profile: &BudgetProfile,
        plan: &[StagePlan],
        requested_ms: Option<u64>,
        start: Instant,
    ) -> Self {
        let profile = profile.tightened(requested_ms);
        Self {
            deadline: start + profile.total(),
            profile,
            plan: plan.to_vec(),
            start,
            records: Mutex::new(Vec::with_capacity(plan.len())),
            index_load_ms: Mutex::new(None),
            prompt: Mutex::new(None),
            requested_ms,
        }
    }

    /// The profile this request runs under (after tightening).
    pub fn profile(&self) -> &BudgetProfile {
        &self.profile
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    pub fn policy(&self, stage: Stage) -> Policy {
        self.plan
            .iter()
            .find(|p| p.stage == stage)
            .map_or(Policy::Optional, |p| p.policy)
    }

    /// Time that `Required` stages after `stage` in the plan hold back.
    pub fn reserved_after(&self, stage: Stage) -> Duration {
        let Some(pos) = self.plan.iter().position(|p| p.stage == stage) else {
            return Duration::ZERO;
        };
        self.plan[pos + 1..]
            .iter()
            .filter(|p| p.policy == Policy::Required)
            .map(|p| self.profile.stage(p.stage))
            .sum()
    }

    /// The budget `stage` gets if it starts now:
    /// `min(stage budget, time left − what later required stages reserve)`.
    pub fn allot(&self, stage: Stage) -> Duration {
        let free = self.remaining().saturating_sub(self.reserved_after(stage));
        self.profile.stage(stage).min(free)
    }

    /// Why `stage`, starting now, would get no time: its budget is 0, or
    /// the request has none left for it; `None` when it would get some.
    pub fn unfunded(&self, stage: Stage) -> Option<&'static str> {
        if !self.allot(stage).is_zero() {
            None
        } else if self.profile.stage_ms(stage) == 0 {
            Some("budget is 0")
        } else {
            Some("no time left for this stage")
        }
    }

    /// Records that `stage` did not run.
    pub fn skip(&self, stage: Stage, reason: impl Into<String>) {
        let span = stage_span(stage, Duration::ZERO);
        self.finish(
            &span,
            stage,
            Duration::ZERO,
            Duration::ZERO,
            Outcome::Skipped,
            Some(reason.into()),
        );
    }

    /// Runs one stage under its allotment.
    ///
    /// The work gets a [`StageCtx`] with its deadline. It ends `ok` when it
    /// returns [`Done::Full`] in time, `partial` when it returns
    /// [`Done::Partial`] or overruns/fails after [`StageCtx::keep`]ing
    /// progress, `timeout` when it overruns with nothing kept, `error` when
    /// it fails with nothing kept, and `skipped` when there was no time to
    /// give it. The work's future is dropped at the deadline and its cancel
    /// flag set, so nothing it started outlives the stage by more than the
    /// time to notice the flag.
    pub async fn run<T, F, Fut>(&self, stage: Stage, work: F) -> StageRun<T>
    where
        F: FnOnce(StageCtx<T>) -> Fut,
        Fut: Future<Output = Result<Done<T>, StageError>>,
    {
        let budget = self.allot(stage);
        if let Some(why) = self.unfunded(stage) {
            self.skip(stage, why);
            return StageRun::new(stage, Outcome::Skipped, None, budget, Duration::ZERO);
        }
        let span = stage_span(stage, budget);
        let started = Instant::now();
        let attempt = attempt(stage, budget, work, &span).await;
        let elapsed = started.elapsed();
        let (outcome, value, detail) = match attempt {
            Attempt::Value(v, detail, outcome) => (outcome, Some(v), detail),
            Attempt::Nothing(outcome, detail) => (outcome, None, Some(detail)),
        };
        self.finish(&span, stage, budget, elapsed, outcome, detail);
        StageRun::new(stage, outcome, value, budget, elapsed)
    }

    /// Runs `primary` like [`run`](Self::run); if it ends with nothing
    /// (timeout or error), `fallback` answers within the time the request
    /// can still spare, and the stage's outcome is `fallback`.
    pub async fn run_with_fallback<T, F, Fut, G, GFut>(
        &self,
        stage: Stage,
        primary: F,
        fallback: G,
    ) -> StageRun<T>
    where
        F: FnOnce(StageCtx<T>) -> Fut,
        Fut: Future<Output = Result<Done<T>, StageError>>,
        G: FnOnce(StageCtx<T>) -> GFut,
        GFut: Future<Output = Result<Done<T>, StageError>>,
    {
        let budget = self.allot(stage);
        let span = stage_span(stage, budget);
        let started = Instant::now();
        let first = if budget.is_zero() {
            Attempt::Nothing(Outcome::Skipped, "no time left for this stage".into())
        } else {
            attempt(stage, budget, primary, &span).await
        };
        let (outcome, value, detail) = match first {
            Attempt::Value(v, detail, outcome) => (outcome, Some(v), detail),
            Attempt::Nothing(why, detail) => {
                let spare = self.remaining().saturating_sub(self.reserved_after(stage));
                let note = format!("primary {why}: {detail}");
                match attempt(stage, spare, fallback, &span).await {
                    Attempt::Value(v, _, _) => (Outcome::Fallback, Some(v), Some(note)),
                    Attempt::Nothing(outcome, d) => (
                        outcome,
                        None,
                        Some(format!("{note}; fallback {outcome}: {d}")),
                    ),
                }
            }
        };
        let elapsed = started.elapsed();
        self.finish(&span, stage, budget, elapsed, outcome, detail);
        StageRun::new(stage, outcome, value, budget, elapsed)
    }

    /// Runs a stage whose work keeps its own time and always answers (the
    /// extractive reader): it is handed its allotment — zero when none is
    /// left, and it then does only what needs no waiting — and is never
    /// dropped, so its time is its stage's whatever it costs. It ends `ok`
    /// when the work did all it meant to, `partial` (with the work's note)
    /// when time cut it short.
    pub async fn run_anytime<T, F, Fut>(&self, stage: Stage, work: F) -> T
    where
        F: FnOnce(Duration) -> Fut,
        Fut: Future<Output = Done<T>>,
    {
        let budget = self.allot(stage);
        let span = stage_span(stage, budget);
        let started = Instant::now();
        let done = work(budget).instrument(span.clone()).await;
        let elapsed = started.elapsed();
        let (value, outcome, detail) = match done {
            Done::Full(v) => (v, Outcome::Ok, None),
            Done::Partial(v, note) => (v, Outcome::Partial, Some(note)),
        };
        self.finish(&span, stage, budget, elapsed, outcome, detail);
        value
    }

    /// Notes what the model was sent (the report's `prompt`, and an event
    /// on the current span).
    pub fn note_prompt(&self, prompt: PromptReport) {
        tracing::info!(
            passages.sent = i64::try_from(prompt.passages_sent).unwrap_or(i64::MAX),
            passages.dropped = i64::try_from(prompt.passages_dropped).unwrap_or(i64::MAX),
            over_allotment = prompt.over_allotment,
            "prompt sized"
        );
        *lock(&self.prompt) = Some(prompt);
    }

    fn finish(
        &self,
        span: &Span,
        stage: Stage,
        budget: Duration,
        elapsed: Duration,
        outcome: Outcome,
        detail: Option<String>,
    ) {
        let remaining = self.remaining();
        span.record("budget.elapsed_ms", span_ms(elapsed));
        span.record("budget.remaining_ms", span_ms(remaining));
        span.record("budget.outcome", outcome.name());
        let overran =
            matches!(outcome, Outcome::Timeout) || (elapsed > budget && !budget.is_zero());
        if overran {
            let overrun = elapsed.saturating_sub(budget);
            tracing::warn!(
                parent: span,
                stage = stage.name(),
                budget_ms = span_ms(budget),
                elapsed_ms = span_ms(elapsed),
                overrun_ms = span_ms(overrun),
                "budget.overrun"
            );
        }
        lock(&self.records).push(StageReport {
            stage,
            budget_ms: ms(budget),
            elapsed_ms: ms(elapsed),
            outcome,
            overran,
            detail,
        });
    }

    /// The budget story so far.
    pub fn report(&self) -> BudgetReport {
        let stages = lock(&self.records).clone();
        let elapsed_ms = ms(self.elapsed());
        let in_stages: u64 = stages.iter().map(|s| s.elapsed_ms).sum();
        BudgetReport {
            total_ms: self.profile.total_ms,
            requested_ms: self.requested_ms,
            elapsed_ms,
            overhead_ms: elapsed_ms.saturating_sub(in_stages),
            stages,
            index_load_ms: *lock(&self.index_load_ms),
            prompt: *lock(&self.prompt),
        }
    }

    /// Marks the request as the one that loaded its collection's indexes
    /// (in `took`, before its stages ran).
    pub fn index_loaded(&self, took: Duration) {
        *lock(&self.index_load_ms) = Some(ms(took));
        tracing::info!(
            index_load_ms = span_ms(took),
            "collection indexes loaded from the store"
        );
    }
}

async fn attempt<T, F, Fut>(stage: Stage, budget: Duration, work: F, span: &Span) -> Attempt<T>
where
    F: FnOnce(StageCtx<T>) -> Fut,
    Fut: Future<Output = Result<Done<T>, StageError>>,
{
    let deadline = Instant::now() + budget;
    let kept = Arc::new(Mutex::new(None));
    let note = Arc::new(Mutex::new(None));
    let cancel = Cancel::with_deadline(deadline.into_std());
    let ctx = StageCtx {
        stage,
        deadline,
        cancel: cancel.clone(),
        kept: kept.clone(),
        note: note.clone(),
    };
    // The deadline is checked first: work that finishes only after it (the
    // task was polled late) has overrun, whatever it returned.
    let work = work(ctx).instrument(span.clone());
    let res = tokio::select! {
        biased;
        () = tokio::time::sleep_until(deadline) => Err(()),
        r = work => Ok(r),
    };
    // The timer fires only when the time driver gets to it: on a busy
    // runtime, work that finished after the deadline can be seen first.
    // A full result that came late is treated as the deadline passing
    // (an anytime stage's partial result, made at its deadline, stands).
    let res = match res {
        Ok(Ok(Done::Full(_))) if Instant::now() > deadline => Err(()),
        r => r,
    };
    // Whatever the work left running (blocking tasks) stops at its next check.
    cancel.cancel();
    let kept = lock(&kept).take();
    match (res, kept) {
        (Ok(Ok(Done::Full(v))), _) => Attempt::Value(v, lock(&note).take(), Outcome::Ok),
        (Ok(Ok(Done::Partial(v, note))), _) => Attempt::Value(v, Some(note), Outcome::Partial),
        (Ok(Err(StageError::Cancelled)) | Err(_), Some((v, note))) => Attempt::Value(
            v,
            Some(format!("budget ran out; kept {note}")),
            Outcome::Partial,
        ),
        (Ok(Err(e)), Some((v, note))) => {
            Attempt::Value(v, Some(format!("{e}; kept {note}")), Outcome::Partial)
        }
        (Ok(Err(StageError::Cancelled)) | Err(_), None) => Attempt::Nothing(
            Outcome::Timeout,
            format!("overran its {} ms budget", ms(budget)),
        ),
        (Ok(Err(StageError::Late(why))), None) => Attempt::Nothing(Outcome::Timeout, why),
        (Ok(Err(e)), None) => Attempt::Nothing(Outcome::Error, e.to_string()),
    }
}
