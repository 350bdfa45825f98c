//! The chat request, start to end, under one budget:
//!
//! `embed` → `cache` → `retrieve` → `rerank` → `llm_ttft` → `llm_generate`.
//!
//! - The query vector first looks for a verified paraphrase in the semantic
//!   cache of the same scope; a hit answers at once (`cached: true`).
//! - Otherwise the passages are retrieved (and reranked when a
//!   cross-encoder is configured), and the prompt is built static-first:
//!   system prompt, passages in a stable order, earlier turns, the user's
//!   turn last, so the backend's prefix cache can reuse it. The passages
//!   are trimmed to the prompt tokens the backend can prefill within the
//!   `llm_ttft` allotment, learned from its observed prefill rate.
//! - If no token arrives within `llm_ttft`, the answer is extractive: the
//!   best sentence of each top passage, with citations. If generation runs
//!   out of `llm_generate`, what was streamed stands and ends with
//!   `finish_reason: "length"`. Either way the request ends `partial`.
//!
//! Generated text is sent through a channel as it arrives, so the HTTP
//! layer streams it; the final [`ChatAnswer`] carries everything else.

use crate::engine::{Done, Policy, RequestBudget, StagePlan};
use crate::rerank::{RerankParams, rerank};
use crate::search::{Mode, SearchHit, SearchRequest, embed_query, retrieve};
use ragtime_cache::{Scope, SemanticCache};
use ragtime_core::{BudgetReport, Filter, Outcome, Stage, StageError};
use ragtime_embed::EmbedService;
use ragtime_llm::{
    BackendStats, ChatEvent, ChatRequest, ChatStream, LlmClient, Message, Observation, Usage,
};
use ragtime_rerank::CrossEncoder;
use ragtime_retrieve::CollectionIndex;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::Instrument;

pub const CHAT_PLAN: [StagePlan; 6] = [
    StagePlan::new(Stage::Embed, Policy::Fallback),
    StagePlan::new(Stage::Cache, Policy::Optional),
    StagePlan::new(Stage::Retrieve, Policy::Required),
    StagePlan::new(Stage::Rerank, Policy::Optional),
    StagePlan::new(Stage::LlmTtft, Policy::Required),
    StagePlan::new(Stage::LlmGenerate, Policy::Required),
];

/// A passage the answer rests on.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Citation {
    pub document_id: String,
    pub chunk_id: i64,
    pub title: String,
    pub snippet: String,
}

/// What the semantic cache keeps of a full answer.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedAnswer {
    pub text: String,
    pub citations: Vec<Citation>,
}

pub type AnswerCache = SemanticCache<CachedAnswer>;

/// The stages a chat request runs with.
pub struct ChatDeps<'a> {
    pub embedder: &'a Arc<EmbedService>,
    pub index: &'a Arc<CollectionIndex>,
    pub reranker: Option<(&'a Arc<CrossEncoder>, RerankParams)>,
    pub llm: &'a LlmClient,
    pub stats: &'a BackendStats,
    /// The semantic response cache, unless it is turned off.
    pub cache: Option<&'a AnswerCache>,
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
    /// Model name sent to the backend.
    pub model: String,
    /// The client's own `max_tokens`, if any.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub traceparent: Option<String>,
    /// The backend's context window in tokens.
    pub context_tokens: usize,
}

#[derive(Debug, Clone)]
pub struct ChatAnswer {
    pub text: String,
    pub citations: Vec<Citation>,
    /// `stop`, or `length` when generation was cut.
    pub finish_reason: String,
    pub partial: bool,
    /// The stage that degraded the answer (`llm_ttft`, `llm_generate`, …).
    pub partial_reason: Option<String>,
    pub cached: bool,
    pub usage: Usage,
    pub report: BudgetReport,
    /// Time from the request's start to the first text sent.
    pub first_text: Option<Duration>,
}

const SYSTEM: &str = "You are a helpful assistant. Answer the user's question using only the numbered sources below, and cite them in square brackets like [1]. If the sources do not contain the answer, say that you do not know.";

/// Passages an extractive answer quotes.
const EXTRACTIVE_PASSAGES: usize = 3;
/// Default `max_tokens` when the client sets none.
const DEFAULT_MAX_TOKENS: u32 = 512;
/// Share of the `llm_ttft` allotment the prompt may fill (the rest is
/// headroom for queueing and estimation error).
const TTFT_SHARE: f64 = 0.7;

fn snippet(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max).collect();
    match cut.rfind(' ') {
        Some(i) if i > max / 2 => format!("{}…", &cut[..i]),
        _ => format!("{cut}…"),
    }
}

fn citation(hit: &SearchHit) -> Citation {
    Citation {
        document_id: hit.chunk.external_id.clone(),
        chunk_id: hit.chunk.chunk_id,
        title: hit.chunk.title.clone(),
        snippet: snippet(&hit.chunk.text, 240),
    }
}

fn source_block(i: usize, hit: &SearchHit) -> String {
    if hit.chunk.title.is_empty() {
        format!("[{}] {}", i + 1, hit.chunk.text)
    } else {
        format!("[{}] {}\n{}", i + 1, hit.chunk.title, hit.chunk.text)
    }
}

/// The prompt: system prompt and sources first (in chunk-id order, so the
/// same passages give the same prefix), then earlier turns, then the
/// question. Passages are taken best-first until `max_chars` is used up.
pub fn build_prompt(
    hits: &[SearchHit],
    history: &[Message],
    query: &str,
    max_chars: usize,
) -> (Vec<Message>, Vec<SearchHit>) {
    let fixed = SYSTEM.len()
        + 16
        + query.len()
        + history.iter().map(|m| m.content.len() + 8).sum::<usize>();
    let mut room = max_chars.saturating_sub(fixed);
    let mut chosen: Vec<SearchHit> = Vec::new();
    for h in hits {
        let need = h.chunk.text.len() + h.chunk.title.len() + 8;
        if need <= room {
            room -= need;
            chosen.push(h.clone());
        } else if chosen.is_empty() && room > 200 {
            // The best passage alone is too long: send the part that fits.
            let mut cut = h.clone();
            let mut text = Arc::unwrap_or_clone(cut.chunk.clone());
            let keep = room.saturating_sub(text.title.len() + 8);
            text.text = snippet(&text.text, keep);
            cut.chunk = Arc::new(text);
            chosen.push(cut);
            break;
        } else {
            break;
        }
    }
    chosen.sort_by_key(|h| h.chunk.chunk_id);
    let sources: Vec<String> = chosen
        .iter()
        .enumerate()
        .map(|(i, h)| source_block(i, h))
        .collect();
    let system = if sources.is_empty() {
        format!("{SYSTEM}\n\nSources: none were found.")
    } else {
        format!("{SYSTEM}\n\nSources:\n\n{}", sources.join("\n\n"))
    };
    let mut messages = vec![Message::new("system", system)];
    messages.extend(history.iter().cloned());
    messages.push(Message::new("user", query));
    (messages, chosen)
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() > 2)
        .map(str::to_lowercase)
        .collect()
}

/// The sentence of `text` sharing the most words with the query.
fn best_sentence(text: &str, query: &[String]) -> String {
    let mut best = ("", 0usize);
    for s in text.split_inclusive(['.', '!', '?', '\n']) {
        let s = s.trim();
        if s.is_empty() {
            continue;
        }
        let n = words(s).iter().filter(|w| query.contains(w)).count();
        if n > best.1 || best.0.is_empty() {
            best = (s, n);
        }
    }
    snippet(best.0, 300)
}

/// The answer when the model gave none in time: the best sentence of each
/// of the top passages, each with its citation number.
pub fn extractive_answer(query: &str, passages: &[SearchHit]) -> String {
    if passages.is_empty() {
        return "No answer could be generated in time, and no sources matched the question."
            .to_owned();
    }
    let q = words(query);
    let lines: Vec<String> = passages
        .iter()
        .enumerate()
        .map(|(i, h)| format!("- {} [{}]", best_sentence(&h.chunk.text, &q), i + 1))
        .collect();
    format!(
        "The model could not answer in time; here is what the sources say:\n\n{}",
        lines.join("\n")
    )
}

/// Shared between the generate stage and the request: what was streamed.
#[derive(Default)]
struct Streamed {
    text: String,
    finish: Option<String>,
    usage: Option<Usage>,
}

fn lock(m: &Mutex<Streamed>) -> std::sync::MutexGuard<'_, Streamed> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs a chat request. Text is sent on `tx` as it is produced (one message
/// for a cached or extractive answer); the return value says the rest.
pub async fn chat(
    budget: &RequestBudget,
    deps: &ChatDeps<'_>,
    input: &ChatInput,
    tx: &mpsc::Sender<String>,
) -> ChatAnswer {
    let started = Instant::now();
    let mut first_text = None;
    let mut send = |text: String| {
        if first_text.is_none() && !text.is_empty() {
            first_text = Some(started.elapsed());
        }
        let tx = tx.clone();
        async move { tx.send(text).await.is_ok() }
    };

    // 1. Query vector, then the semantic cache.
    let vector = embed_query(budget, deps.embedder, &input.query, Mode::Hybrid).await;
    let cacheable = input.history.is_empty();
    let hit = match (&vector, deps.cache.filter(|_| cacheable)) {
        _ if deps.cache.is_none() => {
            budget.skip(Stage::Cache, "the semantic cache is off");
            None
        }
        (None, _) => {
            budget.skip(Stage::Cache, "no query vector");
            None
        }
        (Some(_), None) => {
            budget.skip(Stage::Cache, "conversation has earlier turns");
            None
        }
        (Some(v), Some(cache)) => {
            let (scope, q, v) = (&input.scope, &input.query, v.clone());
            budget
                .run(Stage::Cache, |_ctx| async move {
                    Ok(Done::Full(cache.lookup(scope, q, &v)))
                })
                .await
                .value
                .flatten()
        }
    };
    if let Some(hit) = hit {
        for s in [
            Stage::Retrieve,
            Stage::Rerank,
            Stage::LlmTtft,
            Stage::LlmGenerate,
        ] {
            budget.skip(s, "answered from the semantic cache");
        }
        send(hit.value.text.clone()).await;
        return ChatAnswer {
            text: hit.value.text,
            citations: hit.value.citations,
            finish_reason: "stop".into(),
            partial: false,
            partial_reason: None,
            cached: true,
            usage: Usage::default(),
            report: budget.report(),
            first_text,
        };
    }

    // 2. Passages.
    let depth = deps.reranker.map_or(0, |(_, p)| p.depth);
    let req = SearchRequest {
        query: input.query.clone(),
        top_k: input.top_k.max(depth),
        mode: Mode::Hybrid,
        filter: input.filter.clone(),
    };
    let found = retrieve(budget, deps.index, &req, vector.clone()).await;
    let mut hits = found.hits;
    match deps.reranker {
        Some((model, params)) if !hits.is_empty() => {
            hits = rerank(budget, model, &input.query, hits, params).await.0;
        }
        Some(_) => budget.skip(Stage::Rerank, "no passages"),
        None => budget.skip(Stage::Rerank, "no reranker configured"),
    }
    hits.truncate(input.top_k);

    // 3. The prompt, sized to what the backend can prefill in time.
    let est = deps.stats.estimates();
    let ttft_allot = budget.allot(Stage::LlmTtft);
    let output_cap = {
        let gen_allot = budget
            .remaining()
            .saturating_sub(ttft_allot)
            .min(budget.profile().stage(Stage::LlmGenerate));
        let fit = est.output_tokens_within(gen_allot);
        let asked = input.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS) as usize;
        asked.min(fit).max(1)
    };
    let prompt_tokens = est
        .prompt_tokens_within(ttft_allot.mul_f64(TTFT_SHARE))
        .min(input.context_tokens.saturating_sub(output_cap + 64));
    let max_chars = (prompt_tokens as f64 * est.chars_per_token) as usize;
    let (messages, passages) = build_prompt(&hits, &input.history, &input.query, max_chars);
    let prompt_chars: usize = messages.iter().map(|m| m.content.len()).sum();
    let citations: Vec<Citation> = passages.iter().map(citation).collect();
    let max_tokens = u32::try_from(
        output_cap.min(
            input
                .context_tokens
                .saturating_sub((prompt_chars as f64 / est.chars_per_token) as usize + 16)
                .max(1),
        ),
    )
    .unwrap_or(DEFAULT_MAX_TOKENS);
    let request = ChatRequest {
        model: input.model.clone(),
        messages,
        max_tokens,
        temperature: input.temperature,
        top_p: input.top_p,
        traceparent: input.traceparent.clone(),
    };

    // 4. Time to first token.
    let llm = deps.llm;
    let ttft = budget
        .run(Stage::LlmTtft, |_ctx| async move {
            // The call to the backend is a client span; the backend gets its
            // trace context (or the caller's, when spans are not recorded).
            let call = tracing::info_span!(
                "llm.request",
                otel.kind = "client",
                server.address = llm.base_url(),
                gen_ai.request.model = request.model.as_str(),
                gen_ai.request.max_tokens = request.max_tokens,
            );
            let mut request = request;
            if let Some(tp) = ragtime_telemetry::traceparent(&call) {
                request.traceparent = Some(tp);
            }
            async move {
                let mut stream = llm
                    .stream_chat(&request)
                    .await
                    .map_err(|e| StageError::Backend(e.to_string()))?;
                loop {
                    match stream.next_event().await {
                        Some(Ok(ChatEvent::Delta(t))) => return Ok(Done::Full((stream, t))),
                        Some(Ok(ChatEvent::Usage(_) | ChatEvent::Finish(_))) => {}
                        Some(Err(e)) => return Err(StageError::Backend(e.to_string())),
                        None => {
                            return Err(StageError::Backend("the model returned no text".into()));
                        }
                    }
                }
            }
            .instrument(call)
            .await
        })
        .await;
    let Some((stream, first)) = ttft.value else {
        if ttft.outcome == Outcome::Timeout {
            // Maybe the prompt was too long for this backend right now.
            deps.stats.observe_timeout(
                (prompt_chars as f64 / est.chars_per_token) as u32,
                ttft.elapsed,
            );
        }
        budget.skip(Stage::LlmGenerate, "no first token");
        // The extractive answer needs no prefill: it draws on the best
        // passages whether or not they fitted into the prompt.
        let top: Vec<SearchHit> = hits.iter().take(EXTRACTIVE_PASSAGES).cloned().collect();
        let text = extractive_answer(&input.query, &top);
        send(text.clone()).await;
        return finish(
            budget,
            text,
            top.iter().map(citation).collect(),
            "stop",
            Usage::default(),
            first_text,
        );
    };

    // 5. Generation, streamed as it comes.
    let streamed = Arc::new(Mutex::new(Streamed {
        text: first.clone(),
        ..Streamed::default()
    }));
    let client_gone = !send(first).await;
    let generate_started = Instant::now();
    let shared = streamed.clone();
    let generated = budget
        .run(Stage::LlmGenerate, |ctx| async move {
            let mut stream: ChatStream = stream;
            ctx.keep((1, Duration::ZERO), "1 token streamed");
            if client_gone {
                return Err(StageError::Backend("the client went away".into()));
            }
            let mut n = 1u32;
            while let Some(ev) = stream.next_event().await {
                match ev.map_err(|e| StageError::Backend(e.to_string()))? {
                    ChatEvent::Delta(t) => {
                        lock(&shared).text.push_str(&t);
                        if tx.send(t).await.is_err() {
                            return Err(StageError::Backend("the client went away".into()));
                        }
                        n += 1;
                        ctx.keep((n, Duration::ZERO), format!("{n} tokens streamed"));
                    }
                    ChatEvent::Finish(r) => lock(&shared).finish = Some(r),
                    ChatEvent::Usage(u) => lock(&shared).usage = Some(u),
                }
            }
            let ttft = stream.time_to_first_token().unwrap_or_default();
            Ok(Done::Full((stream.chunks(), ttft)))
        })
        .await;
    let s = std::mem::take(&mut *lock(&streamed));
    if let Some((chunks, ttft)) = generated.value.filter(|_| generated.outcome == Outcome::Ok) {
        deps.stats.observe(Observation {
            prompt_chars,
            prompt_tokens: s.usage.map_or(0, |u| u.prompt_tokens),
            ttft,
            later_tokens: chunks.saturating_sub(1),
            generate: generate_started.elapsed(),
        });
    }
    let finish_reason = match generated.outcome {
        Outcome::Ok => s.finish.unwrap_or_else(|| "stop".into()),
        _ => "length".into(),
    };
    let answer = finish(
        budget,
        s.text,
        citations,
        &finish_reason,
        s.usage.unwrap_or_default(),
        first_text,
    );
    // Only full answers are worth reusing.
    if let (Some(cache), Some(v), true) = (deps.cache, &vector, cacheable)
        && !answer.partial
        && answer.finish_reason == "stop"
        && !answer.text.trim().is_empty()
    {
        cache.insert(
            input.scope.clone(),
            &input.query,
            v.to_vec(),
            CachedAnswer {
                text: answer.text.clone(),
                citations: answer.citations.clone(),
            },
        );
    }
    answer
}

/// The answer with its partial flag: the LLM stages first (they decide
/// what the user got), then any other stage that did not do all its work.
fn finish(
    budget: &RequestBudget,
    text: String,
    citations: Vec<Citation>,
    finish_reason: &str,
    usage: Usage,
    first_text: Option<Duration>,
) -> ChatAnswer {
    let report = budget.report();
    let degraded = |s: Stage| report.stage(s).is_some_and(|r| r.outcome.is_degraded());
    let reason = [Stage::LlmTtft, Stage::LlmGenerate]
        .into_iter()
        .find(|s| degraded(*s))
        .or_else(|| report.first_degraded().map(|r| r.stage));
    ChatAnswer {
        text,
        citations,
        finish_reason: finish_reason.to_owned(),
        partial: reason.is_some(),
        partial_reason: reason.map(|s| s.name().to_owned()),
        cached: false,
        usage,
        report,
        first_text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ragtime_retrieve::ChunkEntry;

    fn hit(id: i64, title: &str, text: &str) -> SearchHit {
        SearchHit {
            chunk: Arc::new(ChunkEntry {
                chunk_id: id,
                document_id: id,
                external_id: format!("doc-{id}"),
                position: 0,
                title: title.into(),
                metadata: Arc::new(serde_json::json!({})),
                text: text.into(),
            }),
            score: 1.0,
        }
    }

    #[test]
    fn prompt_is_static_first_and_stable_in_order() {
        let hits = vec![hit(9, "Nine", "ninth text"), hit(3, "Three", "third text")];
        let history = vec![
            Message::new("user", "hi"),
            Message::new("assistant", "hello"),
        ];
        let (msgs, chosen) = build_prompt(&hits, &history, "what is third?", 10_000);
        assert_eq!(msgs.len(), 4);
        assert_eq!(msgs[0].role, "system");
        assert_eq!(msgs[3], Message::new("user", "what is third?"));
        assert_eq!(&msgs[1..3], &history[..]);
        // Sources in chunk-id order whatever the rank order.
        let sys = &msgs[0].content;
        assert!(sys.find("[1] Three").unwrap_or(usize::MAX) < sys.find("[2] Nine").unwrap_or(0));
        assert_eq!(
            chosen.iter().map(|h| h.chunk.chunk_id).collect::<Vec<_>>(),
            [3, 9]
        );
        let (again, _) = build_prompt(
            &[hits[1].clone(), hits[0].clone()],
            &history,
            "other?",
            10_000,
        );
        assert_eq!(again[0], msgs[0], "same passages, same prefix");
    }

    #[test]
    fn passages_are_trimmed_best_first_to_the_room_left() {
        let long = "word ".repeat(200);
        let hits = vec![hit(1, "A", &long), hit(2, "B", &long), hit(3, "C", &long)];
        let room = SYSTEM.len() + 100 + 2 * 1010;
        let (_, chosen) = build_prompt(&hits, &[], "q", room);
        assert_eq!(chosen.len(), 2);
        assert_eq!(chosen[0].chunk.chunk_id, 1);
        // No room at all: no sources, and the prompt says so.
        let (msgs, chosen) = build_prompt(&hits, &[], "q", 10);
        assert!(chosen.is_empty());
        assert!(msgs[0].content.contains("none were found"));
        // Room for part of the best passage only: it is cut, not dropped.
        let (_, chosen) = build_prompt(&hits, &[], "q", SYSTEM.len() + 600);
        assert_eq!(chosen.len(), 1);
        assert!(chosen[0].chunk.text.len() < long.len());
    }

    #[test]
    fn extractive_answer_cites_the_best_sentence_of_each_passage() {
        let hits = vec![
            hit(
                1,
                "Tea",
                "Tea is a drink. Green tea contains caffeine and catechins.",
            ),
            hit(
                2,
                "Coffee",
                "Coffee contains more caffeine than tea. It is roasted.",
            ),
        ];
        let a = extractive_answer("how much caffeine does green tea contain", &hits);
        assert!(
            a.contains("- Green tea contains caffeine and catechins. [1]"),
            "{a}"
        );
        assert!(
            a.contains("- Coffee contains more caffeine than tea. [2]"),
            "{a}"
        );
        assert!(extractive_answer("q", &[]).contains("no sources matched"));
    }
}
