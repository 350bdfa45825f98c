//! The two LLM stages. `llm_ttft` admits the request to a backend (queueing
//! for a slot when that can pay off), calls it and waits for its first
//! text; when the first token is late past the backend's p95, a second
//! backend with a free slot may be asked too, and the first first token
//! wins; a backend that fails fast gives way to another. `llm_generate`
//! streams the rest to the client until the backend stops, fails or the
//! stage's budget runs out.

use crate::backend::gate::{Ask, Permit, Refusal};
use crate::backend::{Backend, Backends};
use crate::budget::{Done, RequestBudget, StageRun};
use crate::chat::Output;
use futures::StreamExt;
use ragtime_core::{GenEvent, GenRequest, Outcome, Stage, StageError, TokenStream, Usage};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

/// A generation whose first text has arrived.
pub(super) struct Started {
    pub stream: TokenStream,
    pub first: String,
    /// From the call to the backend to its first text (queueing excluded).
    pub ttft: Duration,
    pub backend: Arc<Backend>,
    /// The backend's slot, held until the generation ends.
    pub permit: Permit,
    /// The call's client span: it ends with the generation, which records
    /// its token usage and finish reason.
    pub span: tracing::Span,
}

/// What happened on the way to a first token, beyond the stage's outcome.
#[derive(Default)]
pub(super) struct Attempts {
    /// Why admission refused the request, if it did.
    pub refused: Option<Refusal>,
    /// Backends called whose first token never came, and when called.
    pub pending: Vec<(Arc<Backend>, Instant)>,
    /// Time spent queueing for the slot that was used (or waited for).
    pub queued: Duration,
    /// Since when the request waits for a slot, while it does.
    pub waiting_since: Option<Instant>,
    /// Whether a second backend was asked.
    pub hedged: bool,
}

type Log = Mutex<Attempts>;

fn log(l: &Log) -> std::sync::MutexGuard<'_, Attempts> {
    l.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The prompt's length in characters (its tokens are estimated from it).
fn prompt_chars(request: &GenRequest) -> usize {
    request.messages.iter().map(|m| m.content.len()).sum()
}

/// One backend asked for a first token: admitted (unless `permit` is
/// already held), called, and read until its first text. `called` learns
/// when the call went out.
async fn attempt(
    backend: Arc<Backend>,
    mut request: GenRequest,
    permit: Option<Permit>,
    ask: Ask,
    journal: &Log,
    called: Option<oneshot::Sender<Instant>>,
) -> Result<Started, StageError> {
    let permit = match permit {
        Some(p) => p,
        None => {
            log(journal).waiting_since = Some(Instant::now());
            let admitted = backend.gate.admit(ask).await;
            log(journal).waiting_since = None;
            admitted.map_err(|r| {
                let mut l = log(journal);
                l.refused = Some(r);
                if let Refusal::Timeout { waited } | Refusal::GaveUp { waited } = r {
                    l.queued = waited;
                }
                StageError::Backend(format!("overload: {r}"))
            })?
        }
    };
    log(journal).queued = permit.queued;
    // A slot that came after a wait: what is being read now may leave no
    // time for this prompt (the estimate at arrival is stale). Known for
    // a backend that shows its reading rate; give the slot back at once.
    let estimates = backend.stats.estimates();
    if !permit.queued.is_zero() && estimates.ms_per_read_token.is_some() {
        let tokens = estimates.tokens_in(prompt_chars(&request)) as usize;
        let expected = backend.expected_first_token(tokens);
        if Instant::now() + expected > ask.deadline {
            let queued = permit.queued;
            permit.unused();
            return Err(StageError::Late(format!(
                "first token predicted after {} ms, past the budget: a slot came after {} ms, behind {:.0} tokens of prompts being read",
                expected.as_millis(),
                queued.as_millis(),
                backend.prefills.backlog()
            )));
        }
    }
    if !backend.breaker.allow() {
        permit.unused();
        return Err(StageError::Backend(format!(
            "{}: breaker open",
            backend.name()
        )));
    }
    let span = tracing::info_span!(
        "llm.request",
        otel.kind = "client",
        server.address = backend.name(),
        gen_ai.request.model = request.model.as_str(),
        gen_ai.operation.name = "chat",
        gen_ai.request.max_tokens = i64::from(request.max_tokens),
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        openinference.span.kind = "LLM",
        llm.queue_ms = crate::budget::span_ms(permit.queued),
    );
    let call_span = span.clone();
    if let Some(tp) = ragtime_telemetry::traceparent(&span) {
        request.traceparent = Some(tp);
    }
    let at = Instant::now();
    log(journal).pending.push((backend.clone(), at));
    if let Some(tx) = called {
        let _ = tx.send(at);
    }
    let first = first_text(&backend, request, ask.deadline)
        .instrument(span)
        .await;
    let done = |l: &mut Attempts| {
        l.pending
            .retain(|(b, t)| !(Arc::ptr_eq(b, &backend) && *t == at))
    };
    match first {
        Ok((stream, first)) => {
            done(&mut log(journal));
            let ttft = at.elapsed();
            backend.breaker.success();
            backend.record_ttft(ttft);
            Ok(Started {
                stream,
                first,
                ttft,
                backend,
                permit,
                span: call_span,
            })
        }
        // Predicted late: alive and reading, so not the breaker's business.
        Err(e @ StageError::Late(_)) => {
            done(&mut log(journal));
            Err(e)
        }
        Err(e) => {
            done(&mut log(journal));
            backend.breaker.failure();
            Err(StageError::Backend(format!("{}: {e}", backend.name())))
        }
    }
}

/// How often a request that waits for its first token predicts it again
/// between its own progress events (the prompts ahead of it move, or
/// nothing does).
const RECHECK: Duration = Duration::from_millis(100);

/// What a request has seen of its own prompt being read. A server that
/// reads prompts one after another reports on every prompt it has started
/// after every step, whether that step read any of it or not: only the
/// steps that read some of this prompt time its rate (a prompt another
/// one overtook would otherwise look slow, and teach the backend so).
struct Own {
    /// Prompt tokens (estimated until the backend says).
    total: f64,
    /// Tokens read so far (the cached ones included, as reported).
    processed: f64,
    /// Its latest progress event.
    last_event: Option<Instant>,
    /// Its latest progress event that showed tokens read (or its first).
    last_read: Option<Instant>,
    /// Time of the steps that read some of it, and the tokens they read.
    read_ms: f64,
    read_tokens: f64,
}

/// A first token predicted after the deadline.
struct Miss {
    at: Instant,
    /// Tokens of other prompts it waits behind.
    ahead: f64,
    /// The reading rate the prediction used (tokens a second).
    rate: f64,
    /// Its own rate, shown by its own progress (not queueing).
    own: bool,
}

impl Own {
    fn new(total: f64) -> Self {
        Self {
            total,
            processed: 0.0,
            last_event: None,
            last_read: None,
            read_ms: 0.0,
            read_tokens: 0.0,
        }
    }

    fn seen(&mut self, processed: u32, total: u32, now: Instant) {
        let processed = f64::from(processed);
        match self.last_event {
            Some(prev) if processed > self.processed => {
                self.read_ms += (now - prev).as_secs_f64() * 1000.0;
                self.read_tokens += processed - self.processed;
                self.last_read = Some(now);
            }
            Some(_) => {}
            None => self.last_read = Some(now),
        }
        (self.processed, self.total) = (processed, f64::from(total));
        self.last_event = Some(now);
    }

    /// Milliseconds a token as this prompt's own progress has shown.
    fn own_ms_per_token(&self) -> Option<f64> {
        (self.read_tokens > 0.0).then(|| self.read_ms / self.read_tokens)
    }

    /// When its first token should come: the prompts read ahead of it at
    /// the backend's rate, then what is left of its own at the rate it has
    /// shown (or the backend's). `None` with no rate to go by.
    fn predict(&self, ahead: f64, backend_ms: Option<f64>, now: Instant) -> Option<Miss> {
        let own = self.own_ms_per_token();
        let ms = own.or(backend_ms)?;
        let left = (self.total - self.processed).max(0.0);
        let after = |tokens: f64| Duration::from_secs_f64((tokens / 1000.0).min(3600.0));
        let at = match (ahead > 0.0, self.last_read) {
            (true, _) => now + after(backend_ms.unwrap_or(ms) * ahead) + after(ms * left),
            // Being read: from its latest step (or its start) on.
            (false, Some(last)) => last + after(ms * left),
            // Not started, nothing known ahead of it.
            (false, None) => now + after(ms * left),
        };
        Some(Miss {
            at,
            ahead,
            rate: 1000.0 / ms.max(1e-6),
            own: own.is_some() && ahead == 0.0,
        })
    }
}

/// The backend's stream, read up to its first text. While a backend
/// reports its prompt progress (or has shown its reading rate before), the
/// first token is predicted as events come and every [`RECHECK`] between
/// them: the prompts read ahead of this one (see [`Prefills`]), then its
/// own at the rate it shows. Once that passes `deadline` the request is
/// dropped there (freeing its slot) rather than waited out — a `Late`
/// error, a timeout of the stage that says it was predicted; when its own
/// reading was what was slow, the backend learns that prefill is at least
/// that slow. Without progress, only the deadline ends the wait.
///
/// [`Prefills`]: crate::backend::prefill::Prefills
async fn first_text(
    backend: &Backend,
    request: GenRequest,
    deadline: Instant,
) -> Result<(TokenStream, String), StageError> {
    let called = Instant::now();
    let mut own = Own::new(backend.stats.estimates().tokens_in(prompt_chars(&request)));
    let reading = backend.prefills.enter(own.total);
    let mut stream = backend.generator.generate(request).await?;
    let late = |own: &Own, now: Instant| -> Result<(), StageError> {
        let backend_ms = backend.stats.estimates().ms_per_read_token;
        let Some(miss) = own.predict(reading.ahead(), backend_ms, now) else {
            return Ok(());
        };
        if miss.at <= deadline {
            return Ok(());
        }
        let predicted = miss.at - called;
        if miss.own {
            backend.stats.observe_timeout(own.total as u32, predicted);
        }
        // The steps it was read in show the backend's reading rate, cut
        // or not: the next prompts are sized from it.
        backend.stats.observe_reading(
            own.read_tokens as u32,
            Duration::from_secs_f64(own.read_ms / 1000.0),
        );
        Err(StageError::Late(format!(
            "first token predicted after {} ms, past the budget: {:.0} of {:.0} prompt tokens read at {:.0} tokens/s{}",
            predicted.as_millis(),
            own.processed,
            own.total,
            miss.rate,
            if miss.ahead > 0.0 {
                format!(", behind {:.0} tokens of other prompts", miss.ahead)
            } else {
                String::new()
            }
        )))
    };
    // Once true it stays so (a reading rate, once learned, is kept).
    let mut watching = false;
    loop {
        watching = watching
            || own.last_event.is_some()
            || backend.stats.estimates().ms_per_read_token.is_some();
        let ev = tokio::select! {
            ev = stream.next() => ev,
            () = tokio::time::sleep(RECHECK), if watching => {
                late(&own, Instant::now())?;
                continue;
            }
        };
        let Some(ev) = ev else { break };
        match ev? {
            GenEvent::Delta(first) => {
                backend.saw_token();
                backend.stats.observe_reading(
                    own.read_tokens as u32,
                    Duration::from_secs_f64(own.read_ms / 1000.0),
                );
                return Ok((stream, first));
            }
            GenEvent::Progress { processed, total } => {
                let now = Instant::now();
                backend.saw_token();
                reading.progress(processed, total, now);
                own.seen(processed, total, now);
                late(&own, now)?;
            }
            _ => {}
        }
    }
    Err(StageError::Backend("the model returned no text".into()))
}

/// The first success of two; the loser is dropped (which cancels it).
async fn race(
    a: impl Future<Output = Result<Started, StageError>>,
    b: impl Future<Output = Result<Started, StageError>>,
) -> Result<Started, StageError> {
    tokio::pin!(a, b);
    let (mut ea, mut eb): (Option<StageError>, Option<StageError>) = (None, None);
    loop {
        tokio::select! {
            r = &mut a, if ea.is_none() => match r {
                Ok(s) => return Ok(s),
                Err(e) => ea = Some(e),
            },
            r = &mut b, if eb.is_none() => match r {
                Ok(s) => return Ok(s),
                Err(e) => eb = Some(e),
            },
        }
        if let (Some(e), Some(_)) = (&ea, &eb) {
            return Err(e.clone());
        }
    }
}

/// `primary`, hedged on a second backend once its first token is later
/// than the backend's p95.
async fn hedged(
    backends: &Backends,
    primary: Arc<Backend>,
    request: &GenRequest,
    ask: Ask,
    journal: &Log,
) -> Result<Started, StageError> {
    let (tx, rx) = oneshot::channel();
    let after = backends.hedge_after(&primary);
    let first = attempt(
        primary.clone(),
        request.clone(),
        None,
        ask,
        journal,
        Some(tx),
    );
    tokio::pin!(first);
    let Some(after) = after else {
        return first.await;
    };
    let called = tokio::select! {
        r = &mut first => return r,
        at = rx => match at {
            Ok(at) => at,
            Err(_) => return first.await,
        },
    };
    tokio::select! {
        r = &mut first => return r,
        () = tokio::time::sleep_until(called + after) => {}
    }
    let Some((other, permit)) = backends.hedge_target(&primary) else {
        return first.await;
    };
    log(journal).hedged = true;
    tracing::Span::current().record("llm.hedged", true);
    let second = attempt(other, request.clone(), Some(permit), ask, journal, None);
    race(first, second).await
}

/// `llm_ttft`: a first token from `primary` (hedged), or — when it fails
/// fast and time is left — from another backend.
pub(super) async fn first_token(
    budget: &RequestBudget,
    backends: &Backends,
    primary: Arc<Backend>,
    request: GenRequest,
    ask: Ask,
) -> (StageRun<Started>, Attempts) {
    let depth = primary.gate.state().queued;
    let journal: Log = Mutex::new(Attempts::default());
    let j = &journal;
    let run = budget
        .run(Stage::LlmTtft, |ctx| async move {
            let ask = Ask {
                deadline: ctx.deadline(),
                ..ask
            };
            let span = tracing::Span::current();
            span.record("llm.queue_depth", i64::try_from(depth).unwrap_or(i64::MAX));
            let noted = |s: Started| {
                let (queued, hedged) = {
                    let l = log(j);
                    (l.queued, l.hedged)
                };
                span.record("llm.backend", s.backend.name());
                span.record("llm.queue_ms", crate::budget::span_ms(queued));
                span.record("llm.hedged", hedged);
                ctx.note(format!(
                    "{}: queued {} ms behind {depth}, first token after {} ms{}",
                    s.backend.name(),
                    queued.as_millis(),
                    s.ttft.as_millis(),
                    if hedged { " (hedged)" } else { "" }
                ));
                Done::Full(s)
            };
            let failed = match hedged(backends, primary.clone(), &request, ask, j).await {
                Ok(s) => return Ok(noted(s)),
                Err(e) if log(j).refused.is_some() => return Err(e),
                Err(e) => e,
            };
            let tokens = super::approx_tokens(prompt_chars(&request));
            let Some(next) = backends.pick(tokens, &[primary.name()]) else {
                return Err(failed);
            };
            if next.expected_ttft(tokens) >= ctx.remaining() {
                return Err(failed);
            }
            tracing::warn!(failed = %failed, next = next.name(), "llm backend failed: trying another");
            attempt(next, request, None, ask, j, None).await.map(noted)
        })
        .await;
    let mut attempts = std::mem::take(&mut *log(&journal));
    // Still waiting for a slot when the stage ended.
    if let Some(since) = attempts.waiting_since.take() {
        attempts.queued = since.elapsed();
    }
    (run, attempts)
}

/// What `llm_generate` streamed.
#[derive(Debug, Default)]
pub(super) struct Streamed {
    pub text: String,
    /// Text events (one per token for every backend we know of).
    pub tokens: u32,
    pub finish: Option<String>,
    pub usage: Option<Usage>,
    /// Why the backend's stream failed, if it did (not the budget).
    pub error: Option<String>,
    /// The model fell into a loop and was stopped where it began.
    pub looped: bool,
}

/// `llm_generate`: streams the rest of the answer; what was streamed stands
/// whatever happens.
pub(super) async fn rest(
    budget: &RequestBudget,
    started: Started,
    out: &mut Output<'_>,
) -> (StageRun<()>, Streamed, Arc<Backend>) {
    let Started {
        mut stream,
        first,
        backend,
        permit,
        span,
        ..
    } = started;
    let mut s = Streamed {
        text: first.clone(),
        tokens: 1,
        ..Streamed::default()
    };
    let mut guard = super::guard::LoopGuard::default();
    let _ = guard.push(&first);
    let client_gone = !out.send(first).await;
    let st = &mut s;
    let alive = &backend;
    let run = budget
        .run(Stage::LlmGenerate, |ctx| async move {
            ctx.keep((), "1 token streamed");
            if client_gone {
                return Err(StageError::Backend("the client went away".into()));
            }
            while let Some(ev) = stream.next().await {
                let ev = ev.inspect_err(|e| st.error = Some(e.to_string()))?;
                match ev {
                    GenEvent::Delta(t) => {
                        alive.saw_token();
                        if let Some(at) = guard.push(&t) {
                            // Stop (dropping the stream cancels the
                            // backend's request); the loop's repeats
                            // leave the stored answer.
                            st.text.push_str(&t);
                            st.text.truncate(at);
                            st.looped = true;
                            ctx.note(format!(
                                "stopped a looping answer after {} tokens",
                                st.tokens
                            ));
                            return Ok(Done::Full(()));
                        }
                        st.text.push_str(&t);
                        st.tokens += 1;
                        if !out.send(t).await {
                            return Err(StageError::Backend("the client went away".into()));
                        }
                        ctx.keep((), format!("{} tokens streamed", st.tokens));
                    }
                    GenEvent::Finish(r) => st.finish = Some(r),
                    GenEvent::Usage(u) => st.usage = Some(u),
                    GenEvent::Progress { .. } => {}
                }
            }
            Ok(Done::Full(()))
        })
        .await;
    // The slot is free once the backend is done with the request.
    drop(permit);
    // What the call produced, on its client span (GenAI conventions); a
    // stream cut short (budget, loop, failure) finished by "length".
    let output = s.usage.map_or(s.tokens, |u| u.completion_tokens);
    span.record("gen_ai.usage.output_tokens", i64::from(output));
    if let Some(u) = s.usage {
        span.record("gen_ai.usage.input_tokens", i64::from(u.prompt_tokens));
    }
    let finished = match (&run.outcome, &s.finish) {
        (Outcome::Ok, Some(f)) if !s.looped => f.as_str(),
        (Outcome::Ok, None) if !s.looped => "stop",
        _ => "length",
    };
    span.record("gen_ai.response.finish_reasons", finished);
    drop(span);
    if s.error.is_some() {
        backend.breaker.failure();
    }
    (run, s, backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Steps that read none of a prompt (another prompt overtook it) do
    /// not count against its rate; its prediction runs from the last step
    /// that read some of it.
    #[test]
    fn a_prompt_overtaken_by_another_keeps_its_reading_rate() {
        let t = Instant::now();
        let mut own = Own::new(100.0);
        own.seen(0, 1024, t);
        own.seen(256, 1024, t + 300 * MS);
        own.seen(256, 1024, t + 600 * MS);
        own.seen(256, 1024, t + 900 * MS);
        own.seen(512, 1024, t + 1200 * MS);
        let ms = own.own_ms_per_token().unwrap_or_default();
        assert!((ms - 600.0 / 512.0).abs() < 1e-9, "{ms}");
        let miss = own.predict(0.0, Some(5.0), t + 1250 * MS);
        let at = miss.map(|m| (m.at, m.own));
        // 512 tokens left at its own rate, from the step at 1.2 s.
        assert_eq!(at, Some((t + 1200 * MS + 600 * MS, true)));
        // Behind 1,000 tokens of another prompt: those at the backend's
        // rate first, from now.
        let behind = own.predict(1000.0, Some(2.0), t + 1250 * MS);
        assert_eq!(
            behind.map(|m| (m.at, m.own)),
            Some((t + 1250 * MS + 2000 * MS + 600 * MS, false))
        );
    }
}
