//! `POST /v1/chat/completions` (OpenAI-compatible, streamed or not) and
//! `GET /v1/models`.
//!
//! Extra request fields: `collection`, `filter`, `top_k`, `budget_ms`,
//! `conversation_id`, `answer`. Extra response fields (for streams, in the
//! last chunk before `[DONE]`): `citations`, `partial`, `partial_reason`,
//! `cached`, `answer`, `grounding`, `budget`, `conversation_id`. A stream's first chunk carries
//! `sources`, the passages the answer will rest on, before the LLM starts.

mod request;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::observe::Arrived;
use crate::routes::Timed;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt, stream};
use ragtime_core::{BudgetReport, Citation};
use ragtime_pipeline::AbortOnDrop;
use ragtime_pipeline::chat::{ChatAnswer, ChatEvent};
use request::ChatIn;
use serde::Serialize;
use std::convert::Infallible;
use std::sync::Arc;
use utoipa::ToSchema;

/// What every chunk and completion carries.
struct Meta {
    id: String,
    created: u64,
    model: String,
    conversation_id: String,
}

#[derive(Serialize, ToSchema)]
pub struct UsageOut {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
}

impl From<&ChatAnswer> for UsageOut {
    fn from(a: &ChatAnswer) -> Self {
        let u = a.usage;
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

/// The grounding check's verdict.
#[derive(Serialize, ToSchema)]
pub struct GroundingOut<'a> {
    /// Share of the answer's checkable sentences its sources support.
    supported: f64,
    grounded: bool,
    sentences: usize,
    #[schema(value_type = Vec<String>)]
    unsupported: &'a [String],
}

/// The fields ragtime adds to OpenAI's shape.
#[derive(Serialize, ToSchema)]
pub struct Extras<'a> {
    #[schema(value_type = Vec<Citation>)]
    citations: &'a [Citation],
    partial: bool,
    partial_reason: Option<&'a str>,
    cached: bool,
    /// How the answer was made: `generate`, `extractive` or
    /// `quote_then_generate`.
    answer: &'static str,
    /// `null` when no generated answer was checked.
    grounding: Option<GroundingOut<'a>>,
    #[schema(value_type = BudgetReport)]
    budget: &'a BudgetReport,
    conversation_id: &'a str,
}

impl<'a> Extras<'a> {
    fn new(meta: &'a Meta, a: &'a ChatAnswer) -> Self {
        Self {
            citations: &a.citations,
            partial: a.partial,
            partial_reason: a.partial_reason.map(ragtime_core::PartialReason::name),
            cached: a.cached,
            answer: a.answer_mode.name(),
            grounding: a.grounding.as_ref().map(|g| GroundingOut {
                supported: (g.share() * 1000.0).round() / 1000.0,
                grounded: g.grounded(),
                sentences: g.sentences,
                unsupported: &g.unsupported,
            }),
            budget: &a.report,
            conversation_id: &meta.conversation_id,
        }
    }
}

#[derive(Serialize, ToSchema)]
#[schema(as = ChatCompletion)]
pub struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    #[schema(value_type = Vec<CompletionChoice>)]
    choices: [CompletionChoice<'a>; 1],
    usage: UsageOut,
    #[serde(flatten)]
    extras: Extras<'a>,
}

#[derive(Serialize, ToSchema)]
pub struct CompletionChoice<'a> {
    index: u32,
    message: AssistantMessage<'a>,
    finish_reason: &'a str,
}

#[derive(Serialize, ToSchema)]
pub struct AssistantMessage<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageOut>,
    /// The first chunk's: what the answer will rest on.
    #[serde(skip_serializing_if = "Option::is_none")]
    sources: Option<&'a [Citation]>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    extras: Option<Extras<'a>>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    finish_reason: Option<&'a str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

impl Meta {
    fn chunk<'a>(&'a self, delta: Delta<'a>, finish_reason: Option<&'a str>) -> Chunk<'a> {
        Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                finish_reason,
            }],
            usage: None,
            sources: None,
            extras: None,
        }
    }

    /// The first chunk: the assistant's role, with the sources once known.
    fn role(&self, sources: Option<&[Citation]>) -> Result<Event, Infallible> {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(""),
        };
        let mut c = self.chunk(delta, None);
        c.sources = sources;
        self.event(&c)
    }

    fn event(&self, chunk: &Chunk<'_>) -> Result<Event, Infallible> {
        Ok(Event::default().data(serde_json::to_string(chunk).unwrap_or_default()))
    }

    /// The events for one pipeline event: the first chunk with the
    /// sources, a text chunk, or the last chunk (finish reason and
    /// ragtime's fields), the usage chunk when asked for, and `[DONE]`.
    /// `opened`: whether the first chunk went out.
    fn events(
        &self,
        ev: ChatEvent,
        include_usage: bool,
        opened: &mut bool,
    ) -> Vec<Result<Event, Infallible>> {
        let mut out = Vec::new();
        if let ChatEvent::Sources(c) = &ev {
            *opened = true;
            return vec![self.role(Some(c))];
        }
        if !std::mem::replace(opened, true) {
            out.push(self.role(None));
        }
        match ev {
            ChatEvent::Sources(_) => {}
            ChatEvent::Text(text) => {
                let delta = Delta {
                    content: Some(&text),
                    ..Delta::default()
                };
                out.push(self.event(&self.chunk(delta, None)));
            }
            ChatEvent::Done(a) => {
                let mut last = self.chunk(Delta::default(), Some(&a.finish_reason));
                last.extras = Some(Extras::new(self, &a));
                out.push(self.event(&last));
                if include_usage {
                    let mut u = self.chunk(Delta::default(), None);
                    u.choices.clear();
                    u.usage = Some(UsageOut::from(&*a));
                    out.push(self.event(&u));
                }
                out.push(Ok(Event::default().data("[DONE]")));
            }
        }
        out
    }
}

/// A stream's state: the pipeline's events, what the chunks share, the
/// tenant's stream slot, and the task (aborted if the client goes first).
struct Streaming {
    rx: tokio::sync::mpsc::Receiver<ChatEvent>,
    meta: Meta,
    _slot: Option<crate::auth::StreamSlot>,
    task: AbortOnDrop,
    opened: bool,
}

/// Chat with a collection (OpenAI-compatible): the answer with citations,
/// streamed as server-sent events when `stream` is true.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "chat", request_body = request::ChatIn,
    responses((status = 200, description = "The answer (JSON), or its chunks as server-sent events when `stream` is true",
        content((Completion = "application/json"), (String = "text/event-stream")))))]
pub async fn completions(
    State(state): State<Arc<AppState>>,
    Arrived(at): Arrived,
    Caller(tenant): Caller,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ChatIn>,
) -> Result<Response, ApiError> {
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let query = req.check(traceparent)?;
    let pipeline = state.pipeline()?;
    // A tenant's stream slot is held until its stream ends.
    let slot = req
        .stream
        .then(|| state.limits.open_stream(tenant.name()))
        .transpose()?;
    let started = pipeline.chat(&tenant, query, at).await?;
    let meta = Meta {
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: started.model,
        conversation_id: started.conversation_id,
    };
    let (mut events, mut task) = (started.events, started.task);
    if !req.stream {
        while let Some(ev) = events.recv().await {
            if let ChatEvent::Done(a) = ev {
                task.disarm();
                return Ok(completion(&meta, &a));
            }
        }
        return Err(ApiError::internal("the chat task ended without an answer"));
    }
    let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
    let state = Streaming {
        rx: events,
        meta,
        _slot: slot,
        task,
        opened: false,
    };
    let stream = stream::unfold(state, move |mut st| async move {
        let ev = st.rx.recv().await?;
        if matches!(ev, ChatEvent::Done(_)) {
            st.task.disarm();
        }
        let evs = st.meta.events(ev, include_usage, &mut st.opened);
        Some((stream::iter(evs), st))
    });
    Ok(sse(stream.flatten()))
}

fn completion(meta: &Meta, a: &ChatAnswer) -> Response {
    let body = Completion {
        id: &meta.id,
        object: "chat.completion",
        created: meta.created,
        model: &meta.model,
        choices: [CompletionChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: &a.text,
            },
            finish_reason: &a.finish_reason,
        }],
        usage: UsageOut::from(a),
        extras: Extras::new(meta, a),
    };
    Timed(&a.report, body).into_response()
}

/// Server-sent events with keep-alive comments; proxies are asked not to
/// buffer them. When the client goes away the stream is dropped, which
/// stops the generation.
fn sse(events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    let mut resp = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

#[derive(Serialize, ToSchema)]
pub struct ModelList<'a> {
    object: &'static str,
    #[schema(value_type = Vec<ModelOut>)]
    data: [ModelOut<'a>; 1],
}

#[derive(Serialize, ToSchema)]
pub struct ModelOut<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
}

/// The one model ragtime answers with.
#[utoipa::path(get, path = "/v1/models", tag = "chat",
    responses((status = 200, description = "The model list", body = ModelList)))]
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    Json(ModelList {
        object: "list",
        data: [ModelOut {
            id: &state.config.llm.model,
            object: "model",
            created: 0,
            owned_by: "ragtime",
        }],
    })
    .into_response()
}
