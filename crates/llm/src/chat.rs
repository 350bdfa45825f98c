//! Streamed chat completions over the OpenAI protocol, the one protocol
//! every backend speaks (vLLM, TGI, SGLang, llama.cpp's `llama-server`,
//! Ollama). The server-sent events are parsed by `eventsource-stream`; each
//! event's JSON becomes text deltas, a finish reason and token counts.

use crate::client::{LlmClient, short};
use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use ragtime_core::{GenEvent, GenRequest, Generator, StageError, TokenStream, Usage};
use serde::Deserialize;
use serde_json::json;
use std::collections::VecDeque;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum LlmError {
    #[error("llm backend unreachable: {0}")]
    Connect(String),
    #[error("llm backend answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("llm stream broke: {0}")]
    Stream(String),
    #[error("llm backend sent an event that is not a chat chunk: {0}")]
    Protocol(String),
    #[error("llm stream ended before the backend said it was done")]
    Incomplete,
}

impl From<LlmError> for StageError {
    fn from(e: LlmError) -> Self {
        StageError::Backend(e.to_string())
    }
}

/// One `data:` payload of a streamed completion (the fields ragtime reads).
#[derive(Debug, Default, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Counts>,
    /// llama.cpp reports token counts here.
    timings: Option<Timings>,
    /// llama.cpp, asked with `return_progress`: how far it has read the
    /// prompt.
    prompt_progress: Option<Progress>,
    error: Option<ErrorBody>,
}

#[derive(Debug, Deserialize)]
struct Progress {
    total: u32,
    processed: u32,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Delta,
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Delta {
    content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Counts {
    prompt_tokens: u32,
    completion_tokens: u32,
}

#[derive(Debug, Deserialize)]
struct Timings {
    prompt_n: u32,
    predicted_n: u32,
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    message: Option<String>,
}

/// The events in one `data:` payload.
fn parse(data: &str) -> Result<Vec<GenEvent>, LlmError> {
    let c: Chunk = serde_json::from_str(data)
        .map_err(|_| LlmError::Protocol(data.chars().take(200).collect()))?;
    if let Some(e) = c.error {
        return Err(LlmError::Stream(
            e.message
                .unwrap_or_else(|| "the backend reported an error".into()),
        ));
    }
    let mut evs = Vec::new();
    if let Some(p) = c.prompt_progress {
        evs.push(GenEvent::Progress {
            processed: p.processed,
            total: p.total,
        });
    }
    if let Some(choice) = c.choices.into_iter().next() {
        if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
            evs.push(GenEvent::Delta(text));
        }
        if let Some(reason) = choice.finish_reason {
            evs.push(GenEvent::Finish(reason));
        }
    }
    let usage = c
        .usage
        .map(|u| (u.prompt_tokens, u.completion_tokens))
        .or(c.timings.map(|t| (t.prompt_n, t.predicted_n)));
    if let Some((prompt_tokens, completion_tokens)) = usage {
        evs.push(GenEvent::Usage(Usage {
            prompt_tokens,
            completion_tokens,
        }));
    }
    Ok(evs)
}

/// Generation events from a stream of SSE bytes. The stream ends at
/// `[DONE]`; a body that ends before `[DONE]` or a finish reason is an
/// error ([`LlmError::Incomplete`]), as is a broken connection.
pub fn events<S, B, E>(bytes: S) -> impl Stream<Item = Result<GenEvent, LlmError>> + Send
where
    S: Stream<Item = Result<B, E>> + Send + Unpin + 'static,
    B: AsRef<[u8]> + Send,
    E: std::fmt::Display + Send,
{
    struct State<T> {
        sse: T,
        pending: VecDeque<GenEvent>,
        finished: bool,
        ended: bool,
    }
    let state = State {
        sse: bytes.eventsource(),
        pending: VecDeque::new(),
        finished: false,
        ended: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.pending.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.ended {
                return None;
            }
            let failed = |st: State<_>, e| Some((Err(e), State { ended: true, ..st }));
            match st.sse.next().await {
                Some(Ok(ev)) if ev.data.trim() == "[DONE]" => st.ended = true,
                Some(Ok(ev)) if ev.data.trim().is_empty() => {}
                Some(Ok(ev)) => match parse(&ev.data) {
                    Ok(evs) => {
                        st.finished |= evs.iter().any(|e| matches!(e, GenEvent::Finish(_)));
                        st.pending.extend(evs);
                    }
                    Err(e) => return failed(st, e),
                },
                Some(Err(e)) => return failed(st, LlmError::Stream(e.to_string())),
                None if st.finished => st.ended = true,
                None => return failed(st, LlmError::Incomplete),
            }
        }
    })
}

impl LlmClient {
    /// The JSON a chat request sends: OpenAI's fields, and, to a backend
    /// known to be llama.cpp's server, its own — prompt progress, the
    /// slot's prompt cache (a prefix shared with the slot's last prompt is
    /// not read again) and DRY sampling. Never to another server: it may
    /// refuse a field it does not know.
    pub(crate) fn request_body(&self, req: &GenRequest) -> serde_json::Value {
        let mut body = json!({
            "model": req.model,
            "messages": req.messages,
            "max_tokens": req.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(t) = req.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(p) = req.top_p {
            body["top_p"] = json!(p);
        }
        if let Some(p) = req.frequency_penalty {
            body["frequency_penalty"] = json!(p);
        }
        if self.is_llama_cpp() {
            body["return_progress"] = json!(true);
            body["cache_prompt"] = json!(self.prompt_cache());
            if let Some(d) = req.dry_multiplier.filter(|d| *d > 0.0) {
                body["dry_multiplier"] = json!(d);
                if let Some(n) = req.dry_last_n {
                    body["dry_penalty_last_n"] = json!(n);
                }
            }
        }
        body
    }

    /// Starts a streamed chat completion. Returns once the backend has
    /// answered with a success status; events arrive through the stream,
    /// and dropping it closes the connection, which stops the generation.
    pub async fn stream_chat(
        &self,
        req: &GenRequest,
    ) -> Result<impl Stream<Item = Result<GenEvent, LlmError>> + Send + use<>, LlmError> {
        let body = self.request_body(req);
        let mut http = self
            .http()
            .post(format!("{}/chat/completions", self.base_url()))
            .header("accept", "text/event-stream")
            .json(&body);
        if let Some(key) = self.api_key() {
            http = http.bearer_auth(key);
        }
        if let Some(tp) = &req.traceparent {
            http = http.header("traceparent", tp);
        }
        let resp = http
            .send()
            .await
            .map_err(|e| LlmError::Connect(short(&e)))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(LlmError::Status {
                status: status.as_u16(),
                body: text.chars().take(300).collect(),
            });
        }
        Ok(events(Box::pin(resp.bytes_stream())))
    }
}

#[async_trait]
impl Generator for LlmClient {
    fn address(&self) -> &str {
        self.base_url()
    }

    async fn generate(&self, request: GenRequest) -> Result<TokenStream, StageError> {
        let stream = self.stream_chat(&request).await?;
        Ok(stream.map(|r| r.map_err(StageError::from)).boxed())
    }

    async fn ping(&self) -> Result<(), String> {
        // Longer than any prober waits: a slow answer is the prober's to
        // judge; an error here means unreachable or refusing.
        self.check(std::time::Duration::from_secs(10))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(raw: &'static str) -> Vec<Result<GenEvent, LlmError>> {
        // Split the bytes at awkward places, as a network would.
        let parts: Vec<Result<Vec<u8>, std::convert::Infallible>> =
            raw.as_bytes().chunks(7).map(|c| Ok(c.to_vec())).collect();
        events(futures::stream::iter(parts)).collect().await
    }

    #[tokio::test]
    async fn parses_openai_chunks_usage_and_done() {
        let got = collect(concat!(
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"after done\"}}]}\n\n",
        ))
        .await;
        assert_eq!(
            got,
            vec![
                Ok(GenEvent::Delta("Hel".into())),
                Ok(GenEvent::Delta("lo".into())),
                Ok(GenEvent::Finish("stop".into())),
                Ok(GenEvent::Usage(Usage {
                    prompt_tokens: 12,
                    completion_tokens: 2
                })),
            ]
        );
    }

    #[tokio::test]
    async fn llama_cpp_prompt_progress_is_an_event() {
        let got = collect(concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}],",
            "\"prompt_progress\":{\"total\":900,\"cache\":100,\"processed\":612,\"time_ms\":1800}}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
            "data: [DONE]\n\n",
        ))
        .await;
        assert_eq!(
            got,
            vec![
                Ok(GenEvent::Progress {
                    processed: 612,
                    total: 900
                }),
                Ok(GenEvent::Delta("Hi".into())),
            ]
        );
    }

    #[tokio::test]
    async fn llama_cpp_timings_count_as_usage_and_errors_surface() {
        let got = collect("data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}],\"timings\":{\"prompt_n\":30,\"predicted_n\":8}}\n\n").await;
        assert_eq!(
            got,
            vec![
                Ok(GenEvent::Finish("length".into())),
                Ok(GenEvent::Usage(Usage {
                    prompt_tokens: 30,
                    completion_tokens: 8
                }))
            ],
            "a finish reason without [DONE] is a complete stream"
        );
        let got = collect("data: {\"error\":{\"message\":\"model overloaded\"}}\n\n").await;
        assert_eq!(got, vec![Err(LlmError::Stream("model overloaded".into()))]);
        let got = collect("data: not json\n\n").await;
        assert!(matches!(got.as_slice(), [Err(LlmError::Protocol(_))]));
    }

    #[test]
    fn llama_fields_go_only_to_llama_cpp() {
        let req = GenRequest {
            model: "m".into(),
            messages: Vec::new(),
            max_tokens: 8,
            temperature: Some(0.0),
            top_p: None,
            frequency_penalty: Some(0.5),
            dry_multiplier: Some(0.8),
            dry_last_n: Some(128),
            traceparent: None,
        };
        let other = LlmClient::new("http://127.0.0.1:9/v1", None);
        let body = other.request_body(&req);
        assert_eq!(body["frequency_penalty"], 0.5);
        for f in [
            "return_progress",
            "cache_prompt",
            "dry_multiplier",
            "dry_penalty_last_n",
        ] {
            assert!(
                body.get(f).is_none(),
                "{f} sent to an unknown server: {body}"
            );
        }
        let llama = LlmClient::new("http://127.0.0.1:9/v1", None);
        llama.learned_llama_cpp(true);
        let body = llama.request_body(&req);
        assert_eq!(
            (
                &body["return_progress"],
                &body["cache_prompt"],
                &body["dry_multiplier"],
                &body["dry_penalty_last_n"]
            ),
            (&json!(true), &json!(true), &json!(0.8), &json!(128))
        );
        let off = GenRequest {
            dry_multiplier: Some(0.0),
            ..req
        };
        let body = llama.request_body(&off);
        assert!(body.get("dry_multiplier").is_none() && body.get("dry_penalty_last_n").is_none());
        let uncached = LlmClient::new("http://127.0.0.1:9/v1", None).with_prompt_cache(false);
        uncached.learned_llama_cpp(true);
        assert_eq!(uncached.request_body(&off)["cache_prompt"], json!(false));
    }

    #[tokio::test]
    async fn a_stream_that_stops_before_done_is_incomplete() {
        let got = collect("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n").await;
        assert_eq!(
            got,
            vec![Ok(GenEvent::Delta("a".into())), Err(LlmError::Incomplete)]
        );
    }
}
