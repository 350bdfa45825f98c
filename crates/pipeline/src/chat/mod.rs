//! The chat request, start to end, under one budget:
//!
//! `embed` → `cache` → `retrieve` → `rerank` → `llm_ttft` → `llm_generate`
//! → `verify`,
//!
//! in named steps: the load [`Shape`] (how much the request may do while
//! the backends are busy), [`lookup`] (query vector, then the semantic
//! cache; a hit answers at once), [`passages`] (retrieval, then reranking
//! when a cross-encoder is configured and the load allows), [`reply`] (a
//! backend picked, the [`PromptPlan`] — passages trimmed to what that
//! backend can prefill within `llm_ttft`, `max_tokens` to what fits in
//! `llm_generate` — the sources sent, admission, then the model's answer
//! streamed as it comes; or, shed or without a first token in time, the
//! extractive answer), [`verify`] (the grounding check of a generated
//! answer) and [`finish`]. The [`AnswerMode`] decides whether the model
//! is asked at all, and whether the extractive quote goes first. The caller gets
//! [`ChatEvent::Sources`] before the LLM starts, then [`ChatEvent::Text`]
//! as text is produced.

mod ask;
mod extractive;
mod generate;
mod guard;
mod prompt;
mod text;
mod verify;

pub use extractive::{Asked, Quote, Why, extract, extractive_answer};
pub use prompt::{DEFAULT_MAX_TOKENS, Prompt, PromptPlan, build_prompt};
pub use verify::{SUPPORT_COSINE, SourceVectors, check as check_grounding, embed_sources};

use crate::backend::Backends;
use crate::backend::gate::{Ask, Refusal};
use crate::backend::load::{Levels, Shape};
use crate::backend::stats::Observation;
use crate::budget::{Done, Policy, RequestBudget, StagePlan};
use crate::rerank::{RerankParams, rerank};
use crate::search::{Mode, SearchRequest, embed_query, retrieve};
use ragtime_core::{
    BudgetReport, CachedAnswer, Cancel, Citation, Embedder, Filter, GenRequest, Grounding, Message,
    Outcome, PartialReason, Passage, PromptReport, Reranker, ResponseCache, Retriever, Scope,
    Stage, Usage,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub const CHAT_PLAN: [StagePlan; 8] = [
    StagePlan::new(Stage::Embed, Policy::Fallback),
    StagePlan::new(Stage::Cache, Policy::Optional),
    StagePlan::new(Stage::Retrieve, Policy::Required),
    StagePlan::new(Stage::Rerank, Policy::Optional),
    StagePlan::new(Stage::LlmTtft, Policy::Required),
    StagePlan::new(Stage::LlmGenerate, Policy::Required),
    StagePlan::new(Stage::Verify, Policy::Optional),
    // The extractive reader runs where an answer needs it (instead of the
    // model, before it, or after an unsupported answer), in what is left.
    StagePlan::new(Stage::Quote, Policy::Optional),
];

/// Passages an extractive answer quotes.
const EXTRACTIVE_PASSAGES: usize = 5;

/// How a chat request answers (`chat.answer`, or the request's `answer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerMode {
    /// The model's answer (the extractive one when it cannot give one).
    #[default]
    Generate,
    /// The best sentences of the sources, quoted; the model is not asked.
    Extractive,
    /// The extractive quote at once, then the model's answer.
    QuoteThenGenerate,
}

impl AnswerMode {
    pub fn name(self) -> &'static str {
        match self {
            AnswerMode::Generate => "generate",
            AnswerMode::Extractive => "extractive",
            AnswerMode::QuoteThenGenerate => "quote_then_generate",
        }
    }
}

/// What an answer the grounding check does not support becomes
/// (`chat.on_ungrounded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUngrounded {
    /// It stands; the last chunk's `grounding` says what is unsupported.
    #[default]
    Annotate,
    /// A whole answer is replaced by the extractive one; a streamed one
    /// (already sent) gets the extractive quote appended. Either way
    /// `partial_reason` is `ungrounded`.
    Extractive,
}

/// The stages a chat request runs with.
pub struct ChatDeps<'a> {
    pub embedder: &'a dyn Embedder,
    pub retriever: &'a dyn Retriever,
    pub reranker: Option<(&'a dyn Reranker, RerankParams)>,
    pub backends: &'a Backends,
    pub levels: &'a Levels,
    /// The semantic response cache, unless it is turned off.
    pub cache: Option<&'a dyn ResponseCache>,
}

#[derive(Debug, Clone)]
pub struct ChatInput {
    /// The user's last turn: the retrieval query.
    pub query: String,
    /// Earlier turns, oldest first.
    pub history: Vec<Message>,
    pub top_k: usize,
    pub filter: Filter,
    /// Where cached answers may come from (the corpus version included).
    pub scope: Scope,
    /// The client's own `max_tokens`, if any.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// DRY sampling, where the backend has it ([`GenRequest`]).
    pub dry_multiplier: Option<f64>,
    pub dry_last_n: Option<u32>,
    pub traceparent: Option<String>,
    /// The tenant's priority in the backends' queues (higher waits less).
    pub priority: u8,
    pub answer: AnswerMode,
    pub on_ungrounded: OnUngrounded,
    /// Whether the caller reads the answer as it is produced (an
    /// ungrounded streamed answer cannot be taken back).
    pub stream: bool,
}

impl ChatInput {
    /// What the request is searched by: the question, then its
    /// [`context`](Self::context), so a follow-up ("Can I give it more
    /// than one?") is searched about what "it" was. The question's own
    /// words come first.
    pub fn search_text(&self) -> String {
        format!("{}{}", self.query, self.context())
    }

    /// What the conversation established before the question, each on a
    /// line of its own (a line break first): the sections the last answer
    /// cited (its `— Section [n]` lines) and the previous question; empty
    /// without earlier turns.
    pub fn context(&self) -> String {
        let mut text = String::new();
        let before = self.history.iter().rev();
        if let Some(answer) = before.clone().find(|m| m.role == "assistant") {
            for line in answer.content.lines() {
                if let Some(source) = line.strip_prefix("\u{2014} ") {
                    let section = source.rsplit_once(" [").map_or(source, |(s, _)| s);
                    text.push('\n');
                    text.push_str(section);
                }
            }
        }
        if let Some(asked) = before.clone().find(|m| m.role == "user") {
            text.push('\n');
            text.push_str(&asked.content);
        }
        text
    }

    /// A question with no history, filter or sampling settings of its own.
    pub fn new(query: impl Into<String>, scope: Scope, top_k: usize) -> Self {
        Self {
            query: query.into(),
            history: Vec::new(),
            top_k,
            filter: Filter::All,
            scope,
            max_tokens: None,
            temperature: None,
            top_p: None,
            frequency_penalty: None,
            dry_multiplier: None,
            dry_last_n: None,
            traceparent: None,
            priority: 0,
            answer: AnswerMode::Generate,
            on_ungrounded: OnUngrounded::Annotate,
            stream: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ChatAnswer {
    pub text: String,
    pub citations: Vec<Citation>,
    /// `stop`, or `length` when generation was cut.
    pub finish_reason: String,
    pub partial: bool,
    /// What degraded the answer: the stage (`llm_ttft`, `llm_generate`, …),
    /// `overload` (shed before the LLM) or `llm_error` (the backend failed).
    pub partial_reason: Option<PartialReason>,
    pub cached: bool,
    pub usage: Usage,
    pub report: BudgetReport,
    /// Time from the request's start to the sources sent.
    pub first_chunk: Option<Duration>,
    /// Time from the request's start to the first text sent.
    pub first_text: Option<Duration>,
    /// The load level the request ran at (0: none).
    pub load_level: usize,
    /// The backend that answered, and how long the request queued for it.
    pub backend: Option<String>,
    pub queued: Option<Duration>,
    pub hedged: bool,
    /// The grounding check's verdict, when a generated answer was checked.
    pub grounding: Option<Grounding>,
    pub answer_mode: AnswerMode,
}

/// What a chat request sends while it runs.
#[derive(Debug)]
pub enum ChatEvent {
    /// The passages the answer will rest on, before the LLM starts (sent
    /// once, before any text).
    Sources(Vec<Citation>),
    /// A piece of the answer, in order.
    Text(String),
    /// The answer is complete; the last event.
    Done(Box<ChatAnswer>),
}

/// Sends to the caller and notes when the first sources and text left.
pub(crate) struct Output<'a> {
    tx: &'a mpsc::Sender<ChatEvent>,
    budget: &'a RequestBudget,
    sources: Option<Duration>,
    first: Option<Duration>,
}

impl Output<'_> {
    /// `false` once the caller has gone away.
    async fn send(&mut self, text: String) -> bool {
        if self.first.is_none() && !text.is_empty() {
            self.first = Some(self.budget.elapsed());
        }
        self.tx.send(ChatEvent::Text(text)).await.is_ok()
    }

    /// The sources, once, before any text.
    async fn sources(&mut self, citations: Vec<Citation>) {
        if self.sources.is_none() {
            self.sources = Some(self.budget.elapsed());
            let _ = self.tx.send(ChatEvent::Sources(citations)).await;
        }
    }
}

fn citation(hit: &Passage) -> Citation {
    Citation {
        document_id: hit.chunk.external_id.clone(),
        chunk_id: hit.chunk.chunk_id,
        title: hit.chunk.title.clone(),
        section: hit.chunk.section.clone(),
        snippet: prompt::snippet(&hit.chunk.text, 240),
    }
}

/// Runs a chat request; sources then text go out on `tx` as they are
/// produced, the return value says the rest.
pub async fn run(
    budget: &RequestBudget,
    deps: &ChatDeps<'_>,
    input: &ChatInput,
    tx: &mpsc::Sender<ChatEvent>,
) -> ChatAnswer {
    let mut out = Output {
        tx,
        budget,
        sources: None,
        first: None,
    };
    let shape = deps.levels.shape(deps.backends.load());
    let level = i64::try_from(shape.level).unwrap_or(i64::MAX);
    tracing::Span::current().record("ragtime.load_level", level);
    let vector = match lookup(budget, deps, input).await {
        Lookup::Hit(cached) => return answered_from_cache(budget, cached, &mut out).await,
        Lookup::Miss(vector) => vector,
    };
    let hits = passages(budget, deps, input, vector.clone(), &shape).await;
    let qv = vector.as_deref().map(Vec::as_slice);
    let turn = Turn {
        budget,
        deps,
        input,
        qv,
    };
    let (r, ahead) = match input.answer {
        // Nothing to ground an answer on: the model is not asked to make
        // one up, and the answer says where nothing was found.
        _ if hits.is_empty() => {
            for s in [Stage::LlmTtft, Stage::LlmGenerate, Stage::Verify] {
                budget.skip(s, "no sources");
            }
            let r = extractive(&turn, &[], &mut out, Why::Chosen).await;
            (r, verify::SourceVectors::new())
        }
        AnswerMode::Extractive => {
            for s in [Stage::LlmTtft, Stage::LlmGenerate, Stage::Verify] {
                budget.skip(s, "the answer mode is extractive");
            }
            let top = ranked_top(&hits);
            let r = extractive(&turn, &top, &mut out, Why::Chosen).await;
            (r, verify::SourceVectors::new())
        }
        _ => {
            // The sources' sentences are embedded for the grounding check
            // while the model answers; dropped if the reply comes first.
            let stop = Cancel::new();
            let mut ahead =
                std::pin::pin!(verify::embed_sources(&hits, deps.embedder, stop.clone()));
            let mut replied = std::pin::pin!(reply(&turn, &hits, &shape, &mut out));
            let mut sources = None;
            let r = loop {
                tokio::select! {
                    r = &mut replied => break r,
                    v = &mut ahead, if sources.is_none() => sources = Some(v),
                }
            };
            stop.cancel();
            (r, sources.unwrap_or_default())
        }
    };
    let r = verify(&turn, r, &ahead, &mut out).await;
    let answer = finish(budget, r, &out, &shape, input.answer);
    // Only full generated answers are worth reusing.
    if let (Some(cache), Some(v)) = (deps.cache, &vector)
        && input.history.is_empty()
        && input.answer == AnswerMode::Generate
        && !answer.partial
        && answer.finish_reason == "stop"
        && !answer.text.trim().is_empty()
    {
        let kept = CachedAnswer {
            text: answer.text.clone(),
            citations: answer.citations.clone(),
        };
        cache.insert(input.scope.clone(), &input.query, v.to_vec(), kept);
    }
    answer
}

enum Lookup {
    Hit(CachedAnswer),
    Miss(Option<Arc<Vec<f32>>>),
}

/// `embed`, then `cache`: a verified paraphrase of the same scope answers
/// at once. Follow-ups in a conversation skip the cache.
async fn lookup(budget: &RequestBudget, deps: &ChatDeps<'_>, input: &ChatInput) -> Lookup {
    let vector = embed_query(budget, deps.embedder, &input.search_text(), Mode::Hybrid).await;
    let usable = match (deps.cache, &vector) {
        (None, _) => Err("the semantic cache is off"),
        (Some(_), None) => Err("no query vector"),
        (Some(_), Some(_)) if !input.history.is_empty() => Err("conversation has earlier turns"),
        (Some(_), Some(_)) if input.answer != AnswerMode::Generate => {
            Err("the answer mode is not generate")
        }
        (Some(cache), Some(v)) => Ok((cache, v)),
    };
    let (cache, v) = match usable {
        Ok(c) => c,
        Err(why) => {
            budget.skip(Stage::Cache, why);
            return Lookup::Miss(vector);
        }
    };
    let hit = budget
        .run(Stage::Cache, |ctx| async move {
            let found = cache
                .lookup(&input.scope, &input.query, v, ctx.cancel())
                .await;
            Ok(Done::Full(found))
        })
        .await
        .value
        .flatten();
    match hit {
        Some(answer) => Lookup::Hit(answer),
        None => Lookup::Miss(vector),
    }
}

async fn answered_from_cache(
    budget: &RequestBudget,
    cached: CachedAnswer,
    out: &mut Output<'_>,
) -> ChatAnswer {
    for s in [
        Stage::Retrieve,
        Stage::Rerank,
        Stage::LlmTtft,
        Stage::LlmGenerate,
        Stage::Verify,
    ] {
        budget.skip(s, "answered from the semantic cache");
    }
    out.sources(cached.citations.clone()).await;
    out.send(cached.text.clone()).await;
    ChatAnswer {
        text: cached.text,
        citations: cached.citations,
        finish_reason: "stop".into(),
        partial: false,
        partial_reason: None,
        cached: true,
        usage: Usage::default(),
        report: budget.report(),
        first_chunk: out.sources,
        first_text: out.first,
        load_level: 0,
        backend: None,
        queued: None,
        hedged: false,
        grounding: None,
        answer_mode: AnswerMode::Generate,
    }
}

/// `retrieve`, then `rerank`: the best passages (as many as the request
/// and the load allow).
async fn passages(
    budget: &RequestBudget,
    deps: &ChatDeps<'_>,
    input: &ChatInput,
    vector: Option<Arc<Vec<f32>>>,
    shape: &Shape,
) -> Vec<Passage> {
    let top_k = shape.top_k.map_or(input.top_k, |k| input.top_k.min(k));
    let reranker = deps.reranker.filter(|_| shape.rerank);
    let depth = reranker.map_or(0, |(_, p)| p.depth);
    let req = SearchRequest {
        query: input.search_text(),
        top_k: top_k.max(depth),
        mode: Mode::Hybrid,
        filter: input.filter.clone(),
    };
    let mut hits = retrieve(budget, deps.retriever, &req, vector, req.top_k)
        .await
        .hits;
    match (reranker, deps.reranker) {
        (Some((model, params)), _) => {
            hits = rerank(budget, model, &req.query, hits, params).await.0;
        }
        (None, Some(_)) => {
            let why = shape.describe().unwrap_or_default();
            budget.skip(Stage::Rerank, why);
        }
        (None, None) => budget.skip(Stage::Rerank, "no reranker configured"),
    }
    hits.truncate(top_k);
    hits
}

/// The text of an answer and what it rests on.
struct Reply {
    /// All of it, as sent.
    text: String,
    /// The passages it cites, in citation order.
    passages: Vec<Passage>,
    /// The model's part of `text`, when the model wrote one.
    generated: Option<String>,
    finish_reason: String,
    usage: Usage,
    /// What degraded it beyond the stages' outcomes.
    reason: Option<PartialReason>,
    backend: Option<String>,
    queued: Option<Duration>,
    hedged: bool,
    grounding: Option<Grounding>,
}

/// The best passages an extractive answer quotes, numbered as cited.
fn ranked_top(hits: &[Passage]) -> Vec<(usize, &Passage)> {
    hits.iter()
        .take(EXTRACTIVE_PASSAGES)
        .enumerate()
        .map(|(i, h)| (i + 1, h))
        .collect()
}

/// What every step of a chat turn after retrieval works with: its
/// budget, its stages, the request and the query's vector.
#[derive(Clone, Copy)]
struct Turn<'a> {
    budget: &'a RequestBudget,
    deps: &'a ChatDeps<'a>,
    input: &'a ChatInput,
    qv: Option<&'a [f32]>,
}

/// `quote`: the extractive quote, with the embedding model's help for as
/// long as the stage's allotment lasts.
async fn quote(t: &Turn<'_>, ranked: &[(usize, &Passage)], why: Why) -> String {
    let Turn {
        budget,
        deps,
        input,
        qv,
    } = *t;
    if ranked.is_empty() {
        // Name where it looked: a question sent to the wrong (or an
        // empty) collection reads differently from one nothing answers;
        // and a search cut short is not the sources' fault.
        let c = &input.scope.collection;
        let searched = budget
            .report()
            .stage(Stage::Retrieve)
            .is_none_or(|r| !r.outcome.is_degraded());
        let body = if searched {
            format!("No sources in collection {c:?} matched the question.")
        } else {
            format!("The search of collection {c:?} did not finish in time: no sources to quote.")
        };
        budget.skip(Stage::Quote, "no sources to quote");
        return extractive::with_note(body, why);
    }
    // Shed requests get the cheapest quote: no cross-encoder.
    let cross = deps.reranker.map(|(r, _)| r).filter(|_| why != Why::Busy);
    let context = input.context();
    let asked = Asked {
        question: &input.query,
        context: &context,
    };
    budget
        .run_anytime(Stage::Quote, |time| async move {
            extract(asked, qv, ranked, deps.embedder, cross, time, why)
                .await
                .done()
        })
        .await
}

/// The extractive answer: no prefill needed, so it draws on the best
/// passages whether or not they fitted a prompt.
async fn extractive(
    t: &Turn<'_>,
    ranked: &[(usize, &Passage)],
    out: &mut Output<'_>,
    why: Why,
) -> Reply {
    let budget = t.budget;
    if why != Why::Chosen {
        budget.skip(Stage::LlmGenerate, "no first token");
    }
    let passages: Vec<Passage> = ranked.iter().map(|(_, p)| (*p).clone()).collect();
    out.sources(passages.iter().map(citation).collect()).await;
    let text = quote(t, ranked, why).await;
    out.send(text.clone()).await;
    extractive_reply(text, passages, why)
}

/// Without the model's answer: the extractive one, or — when the quote
/// went first — the quote with a note of what happened to the rest.
#[allow(clippy::too_many_arguments)]
async fn without_model(
    t: &Turn<'_>,
    ranked: &[(usize, &Passage)],
    sent: Option<(String, Vec<Passage>)>,
    out: &mut Output<'_>,
    why: Why,
) -> Reply {
    let budget = t.budget;
    let Some((quoted, passages)) = sent else {
        return extractive(t, ranked, out, why).await;
    };
    budget.skip(Stage::LlmGenerate, "no first token");
    let note = why.note().map(|n| format!("({n})")).unwrap_or_default();
    out.send(note.clone()).await;
    extractive_reply(format!("{quoted}{note}"), passages, why)
}

/// An answer from the sources' words; `why` it is one says what degraded
/// it (a timeout is the `llm_ttft` stage's outcome, not a reason here).
fn extractive_reply(text: String, passages: Vec<Passage>, why: Why) -> Reply {
    Reply {
        text,
        passages,
        generated: None,
        finish_reason: "stop".into(),
        usage: Usage::default(),
        reason: match why {
            Why::Busy => Some(PartialReason::Overload),
            Why::Failed => Some(PartialReason::LlmError),
            Why::Skipped => Some(PartialReason::LlmUnavailable),
            Why::NoTime | Why::NoRoom => Some(PartialReason::Stage(Stage::LlmTtft)),
            _ => None,
        },
        backend: None,
        queued: None,
        hedged: false,
        grounding: None,
    }
}

/// `llm_ttft`, then `llm_generate`: a backend picked and the prompt sized
/// for it, the sources sent, admission (shed at once when waiting cannot
/// pay off), then the model's answer streamed; without a first token in
/// time, the extractive answer.
async fn reply(t: &Turn<'_>, hits: &[Passage], shape: &Shape, out: &mut Output<'_>) -> Reply {
    let Turn {
        budget,
        deps,
        input,
        ..
    } = *t;
    // Asked with no time to answer, the model could only miss: it is not
    // asked, and the answer says why.
    if let Some(why) = budget.unfunded(Stage::LlmTtft) {
        let detail = format!("the model was not asked: {why}");
        return unasked(t, hits, out, detail, Why::NoTime).await;
    }
    let ttft = budget.allot(Stage::LlmTtft);
    deps.backends.count_request();
    let Some(backend) = deps.backends.pick(most_prompt_tokens(input, hits), &[]) else {
        deps.backends.note_skipped();
        let detail = "no llm backend is available: every breaker is open".to_owned();
        return unasked(t, hits, out, detail, Why::Skipped).await;
    };
    let Sized { prompt, est } = prompt_for(budget, input, hits, shape, &backend, ttft);
    budget.note_prompt(PromptReport {
        passages_sent: prompt.passages.len(),
        passages_dropped: hits.len().saturating_sub(prompt.passages.len()),
        over_allotment: prompt.over_allotment,
    });
    if prompt.passages.is_empty() {
        // Never a model answer without its sources.
        let detail = format!(
            "the model was not asked: {}'s context window has no room for a passage",
            backend.name()
        );
        return unasked(t, hits, out, detail, Why::NoRoom).await;
    }
    out.sources(prompt.passages.iter().map(citation).collect())
        .await;
    let announced = announced(hits, &prompt);
    let ranked: Vec<(usize, &Passage)> = match &announced {
        Some(numbered) => numbered.iter().map(|(n, p)| (*n, p)).collect(),
        None => ranked_top(hits),
    };
    // The quote first, when asked for: it needs no model.
    let sent = match input.answer {
        AnswerMode::QuoteThenGenerate => Some(quote_first(t, &ranked, out).await),
        _ => None,
    };
    let prompt_tokens = est.tokens_in(prompt.chars) as usize;
    let ask = Ask {
        deadline: tokio::time::Instant::now() + ttft,
        priority: input.priority,
        expected_ttft: backend.expected_first_token(prompt_tokens),
    };
    if let Err(r) = backend.gate.preview(ask) {
        budget.skip(
            Stage::LlmTtft,
            format!("overload at {}: {r}", backend.name()),
        );
        return without_model(t, &ranked, sent, out, Why::Busy).await;
    }
    let request = GenRequest {
        model: backend.spec.model.clone(),
        messages: prompt.messages.clone(),
        max_tokens: prompt.max_tokens,
        temperature: input.temperature,
        top_p: input.top_p,
        frequency_penalty: input.frequency_penalty,
        dry_multiplier: input.dry_multiplier,
        dry_last_n: input.dry_last_n,
        traceparent: input.traceparent.clone(),
    };
    let (first, attempts) =
        generate::first_token(budget, deps.backends, backend, request, ask).await;
    match first.value {
        Some(started) => {
            let mut r = streamed(budget, started, attempts, &prompt, out).await;
            if let Some((q, _)) = sent {
                r.text = format!("{q}{}", r.text);
            }
            r
        }
        None => {
            let missed = Missed {
                outcome: first.outcome,
                attempts,
                prompt_tokens,
            };
            let why = missed_why(&missed);
            let queued = missed.attempts.queued;
            tell_backends(missed);
            let mut r = without_model(t, &ranked, sent, out, why).await;
            r.queued = Some(queued);
            r
        }
    }
}

/// The model not asked (`detail` says why, on `llm_ttft`): the extractive
/// answer from the best passages.
async fn unasked(
    t: &Turn<'_>,
    hits: &[Passage],
    out: &mut Output<'_>,
    detail: String,
    why: Why,
) -> Reply {
    t.budget.skip(Stage::LlmTtft, detail);
    extractive(t, &ranked_top(hits), out, why).await
}

/// The tokens a prompt holds at most: every passage, the history and the
/// question. The prompt is sized for the backend chosen, so routing goes
/// by this.
fn most_prompt_tokens(input: &ChatInput, hits: &[Passage]) -> usize {
    let chars = hits.iter().map(|h| h.chunk.text.len()).sum::<usize>()
        + input.history.iter().map(|m| m.content.len()).sum::<usize>()
        + input.query.len();
    approx_tokens(chars)
}

/// A prompt sized for a backend, with the speed it was sized for.
struct Sized {
    prompt: prompt::Prompt,
    est: crate::backend::stats::Estimates,
}

/// The prompt for `backend`: what it can read within the `ttft`
/// allotment at the speed it will have while shared, and an answer as long
/// as the client and the load level allow that fits in the generation
/// budget left after it.
fn prompt_for(
    budget: &RequestBudget,
    input: &ChatInput,
    hits: &[Passage],
    shape: &Shape,
    backend: &crate::backend::Backend,
    ttft: Duration,
) -> Sized {
    let generate = budget
        .remaining()
        .saturating_sub(ttft)
        .min(budget.profile().stage(Stage::LlmGenerate));
    let asked = match (input.max_tokens, shape.max_tokens) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let est = backend.stats.estimates();
    let contention = backend.contention();
    let plan = PromptPlan::new(
        &est,
        ttft.div_f64(contention),
        generate,
        backend.spec.context_tokens,
        asked,
    );
    Sized {
        prompt: plan.build(hits, &input.history, &input.query),
        est,
    }
}

/// The hits the prompt holds, numbered as the prompt (and so the sources)
/// number them: an extractive answer from here on cites only what was
/// announced. `None` when the prompt holds none of them.
fn announced(hits: &[Passage], prompt: &prompt::Prompt) -> Option<Vec<(usize, Passage)>> {
    let number = |h: &Passage| {
        prompt
            .passages
            .iter()
            .position(|p| p.chunk.chunk_id == h.chunk.chunk_id)
            .map(|i| i + 1)
    };
    let numbered: Vec<(usize, Passage)> = hits
        .iter()
        .filter_map(|h| number(h).map(|n| (n, h.clone())))
        .collect();
    (!numbered.is_empty()).then_some(numbered)
}

/// The quote sent ahead of the model's answer (`quote_then_generate`): the
/// text sent and the passages it cites.
async fn quote_first(
    t: &Turn<'_>,
    ranked: &[(usize, &Passage)],
    out: &mut Output<'_>,
) -> (String, Vec<Passage>) {
    let q = quote(t, ranked, Why::Chosen).await;
    let q = format!("{q}\n\n");
    out.send(q.clone()).await;
    (q, ranked.iter().map(|(_, p)| (*p).clone()).collect())
}

/// Why `llm_ttft` ended without a first token.
struct Missed {
    outcome: Outcome,
    attempts: generate::Attempts,
    prompt_tokens: usize,
}

/// No first token: the backends that had the request are told (breaker,
/// and — a timeout on their side, queueing excluded — slow prefill). A
/// timeout counts against the breaker only when the backend sent no token
/// at all, for any request, while this one waited: a backend that streams
/// is busy, not down, and opening its breaker would turn every request
/// away (extractive) until the cool-down instead of shedding by its wait.
fn tell_backends(m: Missed) {
    for (b, called) in &m.attempts.pending {
        if m.outcome != Outcome::Timeout || !b.token_since(*called) {
            b.breaker.failure();
        }
        if m.outcome == Outcome::Timeout {
            b.stats
                .observe_timeout(m.prompt_tokens as u32, called.elapsed());
        }
    }
}

/// Shed: `overload`; queued past the point where a first token could
/// come: `llm_ttft`, like a late backend; failed: `llm_error`.
fn missed_why(m: &Missed) -> Why {
    match (m.attempts.refused, m.outcome) {
        (Some(Refusal::Shed { .. } | Refusal::Full { .. } | Refusal::GaveUp { .. }), _) => {
            Why::Busy
        }
        (Some(Refusal::Timeout { .. }), _) => Why::Late,
        (_, Outcome::Error) => Why::Failed,
        _ => Why::Late,
    }
}

/// `llm_generate`: the rest of the answer, and what the backend taught.
async fn streamed(
    budget: &RequestBudget,
    started: generate::Started,
    attempts: generate::Attempts,
    prompt: &Prompt,
    out: &mut Output<'_>,
) -> Reply {
    let ttft_after = started.ttft;
    let generate_started = Instant::now();
    let (run, s, backend) = generate::rest(budget, started, out).await;
    if run.outcome == Outcome::Ok && !s.looped {
        backend.stats.observe(Observation {
            prompt_chars: prompt.chars,
            prompt_tokens: s.usage.map_or(0, |u| u.prompt_tokens),
            ttft: ttft_after,
            later_tokens: s.tokens.saturating_sub(1),
            generate: generate_started.elapsed(),
        });
    }
    let finish_reason = match run.outcome {
        Outcome::Ok => s.finish.unwrap_or_else(|| "stop".into()),
        _ => "length".into(),
    };
    // The backend's counts when it sent them; a stream cut short (budget,
    // loop, client) or a backend that never reports them: the tokens
    // streamed, and the prompt's characters over the characters per token
    // this backend has shown.
    let usage = s.usage.unwrap_or_else(|| Usage {
        prompt_tokens: backend.stats.estimates().tokens_in(prompt.chars).round() as u32,
        completion_tokens: s.tokens,
    });
    Reply {
        generated: Some(s.text.clone()),
        text: s.text,
        passages: prompt.passages.clone(),
        finish_reason,
        usage,
        reason: match (&s.error, s.looped) {
            (Some(_), _) => Some(PartialReason::LlmError),
            (None, true) => Some(PartialReason::Degenerate),
            (None, false) => None,
        },
        backend: Some(backend.name().to_owned()),
        queued: Some(attempts.queued),
        hedged: attempts.hedged,
        grounding: None,
    }
}

/// What an annotated answer that its sources do not support says after it.
pub const UNSUPPORTED_NOTE: &str = "The sources do not support most of what the model wrote here; check the cited passages before relying on it.";

/// `verify`: the grounding check of the model's answer, within its own
/// budget; then what `on_ungrounded` says to do with an unsupported one:
/// annotated, a whole answer says so after its text; extractive, the quote
/// replaces it (or follows it, streamed).
async fn verify(
    t: &Turn<'_>,
    mut r: Reply,
    ahead: &verify::SourceVectors,
    out: &mut Output<'_>,
) -> Reply {
    let Turn {
        budget,
        deps,
        input,
        ..
    } = *t;
    let Some(generated) = r.generated.clone().filter(|g| !g.trim().is_empty()) else {
        if input.answer != AnswerMode::Extractive {
            budget.skip(Stage::Verify, "no generated answer");
        }
        return r;
    };
    let passages = &r.passages;
    let run = budget
        .run(Stage::Verify, |ctx| async move {
            match verify::check(&generated, passages, ahead, deps.embedder, ctx.cancel()).await {
                Some(g) => Ok(Done::Full(g)),
                None => Err(ragtime_core::StageError::Cancelled),
            }
        })
        .await;
    r.grounding = run.value;
    let ungrounded = r.grounding.as_ref().is_some_and(|g| !g.grounded());
    if !ungrounded {
        return r;
    }
    if input.on_ungrounded == OnUngrounded::Annotate {
        if r.reason.is_some() || r.finish_reason != "stop" {
            // Cut short (a loop, a broken stream, out of time or tokens):
            // its partial reason says more than the check does.
            return r;
        }
        // Said in the answer, where the reader looks, not only in a field.
        let tail = format!("\n\n({UNSUPPORTED_NOTE})");
        out.send(tail.clone()).await;
        r.text.push_str(&tail);
        return r;
    }
    let ranked: Vec<(usize, &Passage)> = r
        .passages
        .iter()
        .enumerate()
        .map(|(i, p)| (i + 1, p))
        .collect();
    let quoted = quote(t, &ranked, Why::Ungrounded).await;
    if input.stream {
        let tail = format!("\n\n{quoted}");
        out.send(tail.clone()).await;
        r.text.push_str(&tail);
    } else {
        r.text = quoted;
    }
    r.reason = r.reason.or(Some(PartialReason::Ungrounded));
    r
}

/// The answer with its partial flag: what the reply says degraded it, else
/// the LLM stages (they decide what the user got), else any other stage
/// that did not do all its work.
fn finish(
    budget: &RequestBudget,
    r: Reply,
    out: &Output<'_>,
    shape: &Shape,
    mode: AnswerMode,
) -> ChatAnswer {
    let report = budget.report();
    let degraded = |s: Stage| report.stage(s).is_some_and(|r| r.outcome.is_degraded());
    // A model's answer the grounding check did not get to (overran, or no
    // time was left for it) is unchecked: that is a degradation too, unless
    // the check is turned off.
    let unchecked = r.generated.as_deref().is_some_and(|g| !g.trim().is_empty())
        && r.grounding.is_none()
        && budget.profile().stage_ms(Stage::Verify) > 0;
    let stage = [Stage::LlmTtft, Stage::LlmGenerate]
        .into_iter()
        .find(|s| degraded(*s))
        .or_else(|| {
            report
                .stages
                .iter()
                .find(|r| r.outcome.is_degraded())
                .map(|r| r.stage)
        })
        .or_else(|| unchecked.then_some(Stage::Verify));
    let reason = r.reason.or_else(|| stage.map(PartialReason::Stage));
    // What was given, not what was asked for: without the model's words
    // the answer is extractive.
    let mode = match (mode, &r.generated) {
        (AnswerMode::Generate | AnswerMode::QuoteThenGenerate, None) => AnswerMode::Extractive,
        (m, _) => m,
    };
    ChatAnswer {
        text: r.text,
        citations: r.passages.iter().map(citation).collect(),
        finish_reason: r.finish_reason,
        partial: reason.is_some(),
        partial_reason: reason,
        cached: false,
        usage: r.usage,
        report,
        first_chunk: out.sources,
        first_text: out.first,
        load_level: shape.level,
        backend: r.backend,
        queued: r.queued,
        hedged: r.hedged,
        grounding: r.grounding,
        answer_mode: mode,
    }
}

/// Tokens in `chars` of text at the prior's characters per token, for
/// routing before a backend (and its learned ratio) is chosen.
pub(crate) fn approx_tokens(chars: usize) -> usize {
    (chars as f64 / crate::backend::stats::Estimates::PRIOR.chars_per_token).ceil() as usize
}

#[cfg(test)]
pub(crate) mod tests {
    use ragtime_core::Passage;
    use std::sync::Arc;

    pub(crate) fn hit(id: i64, title: &str, text: &str) -> Passage {
        let c =
            ragtime_testkit::chunk(id, &format!("doc-{id}"), title, text, serde_json::json!({}));
        Passage {
            chunk: Arc::new(c),
            score: 1.0,
        }
    }
}
