//! `POST /v1/chat/completions` (OpenAI-compatible, streamed or not) and
//! `GET /v1/models`.
//!
//! Extra request fields: `collection`, `filter`, `top_k`, `budget_ms`,
//! `conversation_id`. Extra response fields (for streams, in the last
//! chunk before `[DONE]`): `citations`, `partial`, `partial_reason`,
//! `cached`, `budget`, `conversation_id`.

use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::routes::documents::check_collection;
use crate::routes::{engine, rag_error, with_timing};
use crate::state::AppState;
use crate::tenant::Tenant;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use ragtime_cache::Scope;
use ragtime_core::{Filter, Outcome, Stage};
use ragtime_llm::Message;
use ragtime_pipeline::RequestBudget;
use ragtime_pipeline::chat::{CHAT_PLAN, ChatAnswer, ChatDeps, ChatInput, chat};
use ragtime_pipeline::rerank::RerankParams;
use serde::Deserialize;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::Instrument;

const MAX_TOP_K: usize = 50;
const MAX_CONTENT: usize = 32 * 1024;
const MAX_MESSAGES: usize = 200;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ContentIn {
    Text(String),
    Parts(Vec<PartIn>),
}

#[derive(Debug, Deserialize)]
struct PartIn {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    #[serde(default)]
    content: Option<ContentIn>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The request. Other OpenAI fields (`user`, `seed`, …) are accepted and
/// ignored.
#[derive(Debug, Deserialize)]
pub struct ChatIn {
    model: String,
    messages: Vec<MessageIn>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    collection: Option<String>,
    #[serde(default)]
    filter: Option<Value>,
    #[serde(default)]
    top_k: Option<usize>,
    #[serde(default)]
    budget_ms: Option<u64>,
    #[serde(default)]
    conversation_id: Option<String>,
}

fn text_of(m: &MessageIn, i: usize) -> Result<String, ApiError> {
    let field = format!("messages[{i}].content");
    match &m.content {
        None => Ok(String::new()),
        Some(ContentIn::Text(t)) => Ok(t.clone()),
        Some(ContentIn::Parts(parts)) => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                if p.kind != "text" {
                    return Err(ApiError::invalid(
                        format!("{field}[{j}].type"),
                        format!("only text parts are supported, not {:?}", p.kind),
                    ));
                }
                out.push(p.text.clone().unwrap_or_default());
            }
            Ok(out.join("\n"))
        }
    }
}

fn valid_conversation_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// Everything checked before any work starts (a refused request does
/// nothing).
struct Checked {
    query: String,
    earlier: Vec<Message>,
    collection: String,
    filter: Filter,
    filter_key: String,
    top_k: usize,
}

fn check(req: &ChatIn, default_top_k: usize) -> Result<Checked, ApiError> {
    if req.model.trim().is_empty() {
        return Err(ApiError::invalid("model", "must not be empty"));
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "must hold at least one message",
        ));
    }
    if req.messages.len() > MAX_MESSAGES {
        return Err(ApiError::invalid(
            "messages",
            format!("at most {MAX_MESSAGES} messages"),
        ));
    }
    let mut texts = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        if !matches!(
            m.role.as_str(),
            "system" | "developer" | "user" | "assistant" | "tool"
        ) {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!("unknown role {:?}", m.role),
            ));
        }
        let t = text_of(m, i)?;
        if t.len() > MAX_CONTENT {
            return Err(ApiError::invalid(
                format!("messages[{i}].content"),
                format!("longer than {MAX_CONTENT} bytes"),
            ));
        }
        texts.push(t);
    }
    let last = req.messages.len() - 1;
    if req.messages[last].role != "user" {
        return Err(ApiError::invalid(
            format!("messages[{last}].role"),
            "the last message must be the user's",
        ));
    }
    let query = texts[last].trim().to_owned();
    if query.is_empty() {
        return Err(ApiError::invalid(
            format!("messages[{last}].content"),
            "must not be empty",
        ));
    }
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("n", "only n = 1 is supported"));
    }
    if req.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        return Err(ApiError::invalid("temperature", "must be between 0 and 2"));
    }
    if req.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(ApiError::invalid(
            "top_p",
            "must be greater than 0 and at most 1",
        ));
    }
    for (name, v) in [
        ("max_tokens", req.max_tokens),
        ("max_completion_tokens", req.max_completion_tokens),
    ] {
        if v.is_some_and(|v| v == 0 || v > 32_768) {
            return Err(ApiError::invalid(name, "must be between 1 and 32768"));
        }
    }
    let top_k = req.top_k.unwrap_or(default_top_k);
    if top_k == 0 || top_k > MAX_TOP_K {
        return Err(ApiError::invalid(
            "top_k",
            format!("must be between 1 and {MAX_TOP_K}"),
        ));
    }
    if req.budget_ms == Some(0) {
        return Err(ApiError::invalid("budget_ms", "must be at least 1"));
    }
    if let Some(id) = &req.conversation_id
        && !valid_conversation_id(id)
    {
        return Err(ApiError::invalid(
            "conversation_id",
            "must be 1–128 characters of letters, digits, '-', '_', '.' or ':'",
        ));
    }
    let collection = req
        .collection
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    check_collection(&collection, "collection")?;
    let (filter, filter_key) = match &req.filter {
        None => (Filter::All, String::new()),
        Some(v) => (
            Filter::parse(v, "filter").map_err(|e| ApiError::invalid(e.path, e.message))?,
            v.to_string(),
        ),
    };
    // Earlier turns sent by the client (system messages are ragtime's own).
    let earlier = req.messages[..last]
        .iter()
        .zip(&texts)
        .filter(|(m, t)| matches!(m.role.as_str(), "user" | "assistant") && !t.trim().is_empty())
        .map(|(m, t)| Message::new(&m.role, t.clone()))
        .collect();
    Ok(Checked {
        query,
        earlier,
        collection,
        filter,
        filter_key,
        top_k,
    })
}

fn traceparent(headers: &HeaderMap) -> Option<String> {
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    tenant: Tenant,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ChatIn>,
) -> Result<Response, ApiError> {
    let c = check(&req, state.config.chat.top_k)?;
    let rag = engine(&state)?;
    let stored_collection = tenant.collection(&c.collection);
    let index = rag
        .collection(&stored_collection)
        .await
        .map_err(|e| rag_error(e, &c.collection))?;
    let slot = if req.stream {
        Some(state.limits.open_stream(tenant.name())?)
    } else {
        None
    };
    let keep = state.config.chat.history_messages;
    let (conversation_id, history) = match &req.conversation_id {
        Some(id) => {
            let stored = state
                .store
                .conversation_collection(&tenant.conversation(id))
                .await
                .map_err(ApiError::internal)?;
            match stored {
                Some(coll) if coll != stored_collection => {
                    return Err(ApiError::invalid(
                        "conversation_id",
                        "this conversation belongs to another collection",
                    ));
                }
                Some(_) => {
                    let turns = state
                        .store
                        .recent_turns(&tenant.conversation(id), keep)
                        .await
                        .map_err(ApiError::internal)?;
                    let h = turns
                        .into_iter()
                        .map(|t| Message::new(&t.role, t.content))
                        .collect();
                    (id.clone(), h)
                }
                None => (id.clone(), tail(c.earlier, keep)),
            }
        }
        None => (uuid::Uuid::new_v4().to_string(), tail(c.earlier, keep)),
    };
    let model = state.config.llm.model.clone();
    let input = ChatInput {
        query: c.query,
        history,
        top_k: c.top_k,
        filter: c.filter,
        scope: Scope {
            tenant: tenant.name().to_owned(),
            collection: c.collection.clone(),
            filter: c.filter_key,
            version: u64::try_from(rag.version()).unwrap_or(0),
        },
        model: model.clone(),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        temperature: req.temperature,
        top_p: req.top_p,
        traceparent: traceparent(&headers),
        context_tokens: state.config.llm.ctx_size as usize,
    };
    let (profile, arm) = state.profile_for(tenant.name());
    let budget = RequestBudget::start(&profile, &CHAT_PLAN, req.budget_ms);
    let meta = Meta {
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model,
        conversation_id,
    };

    let (tx, rx) = mpsc::channel::<String>(64);
    let root = tracing::Span::current();
    let task = {
        let state = state.clone();
        let (conversation, collection) = (
            tenant.conversation(&meta.conversation_id),
            stored_collection.clone(),
        );
        let llm_in_flight = state.metrics.llm_in_flight();
        let work = async move {
            let reranker = state.reranker.get().cloned();
            let r = &state.config.rerank;
            let deps = ChatDeps {
                embedder: &rag.embedder,
                index: &index,
                reranker: reranker.as_ref().map(|m| {
                    (
                        m,
                        RerankParams {
                            depth: r.depth,
                            batch: r.batch,
                            weight: r.weight,
                        },
                    )
                }),
                llm: &state.llm,
                stats: &state.llm_stats,
                cache: state.answers.as_ref(),
            };
            let answer = chat(&budget, &deps, &input, &tx).await;
            drop(tx);
            drop(llm_in_flight);
            record(&state, &answer);
            if let Some((e, a)) = &arm {
                e.record(*a, &answer.report, answer.partial);
            }
            if !answer.text.trim().is_empty()
                && let Err(e) = state
                    .store
                    .append_turn(&conversation, &collection, &input.query, &answer.text)
                    .await
            {
                tracing::error!(error = %e, "could not store the conversation turn");
            }
            answer
        };
        tokio::spawn(work.instrument(root.clone()))
    };
    if req.stream {
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        Ok(stream_response(meta, rx, task, include_usage, root, slot))
    } else {
        let mut rx = rx;
        while rx.recv().await.is_some() {}
        let answer = task.await.map_err(ApiError::internal)?;
        let body = full_body(&meta, &answer);
        Ok(with_timing(&answer.report, body))
    }
}

/// The answer's story into the metrics and onto the root span.
fn record(state: &AppState, a: &ChatAnswer) {
    let m = &state.metrics;
    crate::observe::record_report(m, &a.report);
    crate::observe::record_partial(a.partial, a.partial_reason.as_deref());
    if let Some(r) = &a.partial_reason {
        m.partial_answer(r);
    }
    let stage = |s: Stage| a.report.stage(s);
    if stage(Stage::Cache).is_some_and(|s| s.outcome == Outcome::Ok) {
        m.cache_lookup(a.cached);
    }
    if let Some(t) = stage(Stage::LlmTtft).filter(|s| s.outcome == Outcome::Ok) {
        m.ttft(std::time::Duration::from_millis(t.elapsed_ms));
    }
    if let Some(g) = stage(Stage::LlmGenerate).filter(|s| s.outcome == Outcome::Ok)
        && a.usage.completion_tokens > 1
    {
        m.time_per_output_token(
            std::time::Duration::from_millis(g.elapsed_ms) / (a.usage.completion_tokens - 1),
        );
    }
}

fn tail(mut v: Vec<Message>, keep: usize) -> Vec<Message> {
    let cut = v.len().saturating_sub(keep);
    v.drain(..cut);
    v
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    conversation_id: String,
}

fn usage_json(a: &ChatAnswer) -> Value {
    json!({
        "prompt_tokens": a.usage.prompt_tokens,
        "completion_tokens": a.usage.completion_tokens,
        "total_tokens": a.usage.prompt_tokens + a.usage.completion_tokens,
    })
}

/// The fields ragtime adds to OpenAI's shape.
fn extras(meta: &Meta, a: &ChatAnswer, body: &mut Value) {
    body["citations"] = json!(a.citations);
    body["partial"] = json!(a.partial);
    body["partial_reason"] = json!(a.partial_reason);
    body["cached"] = json!(a.cached);
    body["budget"] = serde_json::to_value(&a.report).unwrap_or(Value::Null);
    body["conversation_id"] = json!(meta.conversation_id);
}

fn full_body(meta: &Meta, a: &ChatAnswer) -> Value {
    let mut body = json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": a.text},
            "finish_reason": a.finish_reason,
        }],
        "usage": usage_json(a),
    });
    extras(meta, a, &mut body);
    body
}

fn chunk(meta: &Meta, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    })
}

fn frame(v: &Value) -> Result<Bytes, Infallible> {
    Ok(Bytes::from(format!("data: {v}\n\n")))
}

/// Server-sent events: a role chunk, one chunk per piece of text, a last
/// chunk with the finish reason and ragtime's fields, `[DONE]`. When the
/// client goes away the channel closes and generation stops.
fn stream_response(
    meta: Meta,
    mut rx: mpsc::Receiver<String>,
    task: tokio::task::JoinHandle<ChatAnswer>,
    include_usage: bool,
    root: tracing::Span,
    slot: Option<crate::tenant::StreamSlot>,
) -> Response {
    let (out, body_rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let forward = async move {
        // The tenant's stream slot is held until the stream ends.
        let _slot = slot;
        let first = chunk(&meta, json!({"role": "assistant", "content": ""}), None);
        if out.send(frame(&first)).await.is_err() {
            return;
        }
        while let Some(text) = rx.recv().await {
            let c = chunk(&meta, json!({ "content": text }), None);
            if out.send(frame(&c)).await.is_err() {
                return;
            }
        }
        let Ok(answer) = task.await else {
            return;
        };
        let mut last = chunk(&meta, json!({}), Some(&answer.finish_reason));
        extras(&meta, &answer, &mut last);
        let _ = out.send(frame(&last)).await;
        if include_usage {
            let mut u = chunk(&meta, json!({}), None);
            u["choices"] = json!([]);
            u["usage"] = usage_json(&answer);
            let _ = out.send(frame(&u)).await;
        }
        let _ = out.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    };
    tokio::spawn(forward.instrument(root));
    let stream =
        futures::stream::unfold(
            body_rx,
            |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
        );
    let mut resp = Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// `GET /v1/models`: the one model ragtime answers with.
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.llm.model,
            "object": "model",
            "created": 0,
            "owned_by": "ragtime",
        }],
    }))
    .into_response()
}
