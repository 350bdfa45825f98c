//! Streaming chat completions over the OpenAI protocol (server-sent events),
//! the one protocol every backend speaks: vLLM, TGI, SGLang, llama.cpp's
//! `llama-server`, Ollama.

use crate::client::{LlmClient, short};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::pin::Pin;
use std::time::{Duration, Instant};
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
}

/// One chat message (`role`: system, user or assistant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.to_owned(),
            content: content.into(),
        }
    }
}

/// What ragtime asks a backend for.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// W3C trace context to propagate to the backend.
    pub traceparent: Option<String>,
}

/// Token counts the backend reported (`usage`, or llama.cpp's `timings`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// One event of a streamed completion.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatEvent {
    /// Generated text.
    Delta(String),
    /// The backend said why it stopped (`stop`, `length`, …).
    Finish(String),
    /// Token counts (sent by most backends in the last chunk).
    Usage(Usage),
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// An open streamed completion. Dropping it closes the connection, which
/// is how a backend learns to stop generating.
pub struct ChatStream {
    body: ByteStream,
    buf: Vec<u8>,
    pending: std::collections::VecDeque<ChatEvent>,
    done: bool,
    started: Instant,
    first_token: Option<Duration>,
    tokens: u32,
}

impl std::fmt::Debug for ChatStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatStream")
            .field("done", &self.done)
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl LlmClient {
    /// Starts a streamed chat completion. Returns once the backend has
    /// answered with a success status; tokens arrive through the stream.
    pub async fn stream_chat(&self, req: &ChatRequest) -> Result<ChatStream, LlmError> {
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
        let started = Instant::now();
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
        Ok(ChatStream {
            body: Box::pin(resp.bytes_stream()),
            buf: Vec::new(),
            pending: Default::default(),
            done: false,
            started,
            first_token: None,
            tokens: 0,
        })
    }
}

impl ChatStream {
    /// The next event; `None` once the backend sent `[DONE]` or closed the
    /// stream.
    pub async fn next_event(&mut self) -> Option<Result<ChatEvent, LlmError>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                if let ChatEvent::Delta(_) = &ev {
                    self.tokens += 1;
                    if self.first_token.is_none() {
                        self.first_token = Some(self.started.elapsed());
                    }
                }
                return Some(Ok(ev));
            }
            if self.done {
                return None;
            }
            if let Some(frame) = take_frame(&mut self.buf) {
                match parse_frame(&frame) {
                    Ok(Frame::Done) => self.done = true,
                    Ok(Frame::Events(evs)) => self.pending.extend(evs),
                    Err(e) => return Some(Err(e)),
                }
                continue;
            }
            match self.body.next().await {
                Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(LlmError::Stream(short(&e))));
                }
                None => {
                    // A last frame without its blank line still counts.
                    self.done = true;
                    if !self.buf.is_empty() {
                        let rest = std::mem::take(&mut self.buf);
                        if let Ok(Frame::Events(evs)) = parse_frame(&rest) {
                            self.pending.extend(evs);
                            self.done = true;
                            continue;
                        }
                    }
                    return None;
                }
            }
        }
    }

    /// Time from the request to the first generated text.
    pub fn time_to_first_token(&self) -> Option<Duration> {
        self.first_token
    }

    /// Text events received so far (one per backend chunk, which is one
    /// token for every backend we know of).
    pub fn chunks(&self) -> u32 {
        self.tokens
    }

    pub fn started(&self) -> Instant {
        self.started
    }
}

enum Frame {
    Done,
    Events(Vec<ChatEvent>),
}

/// Cuts one SSE frame (up to a blank line) off the front of `buf`.
fn take_frame(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let pos = buf
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|p| (p, 2))
        .into_iter()
        .chain(
            buf.windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|p| (p, 4)),
        )
        .min_by_key(|(p, _)| *p)?;
    let frame = buf[..pos.0].to_vec();
    buf.drain(..pos.0 + pos.1);
    Some(frame)
}

/// The events in one SSE frame: its `data:` lines joined.
fn parse_frame(frame: &[u8]) -> Result<Frame, LlmError> {
    let text = String::from_utf8_lossy(frame);
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        // Comments (": keep-alive") and other fields carry nothing for us.
        return Ok(Frame::Events(Vec::new()));
    }
    let data = data.join("\n");
    if data.trim() == "[DONE]" {
        return Ok(Frame::Done);
    }
    let v: Value = serde_json::from_str(&data)
        .map_err(|_| LlmError::Protocol(data.chars().take(200).collect()))?;
    if let Some(err) = v.get("error") {
        return Err(LlmError::Stream(
            err.get("message")
                .and_then(Value::as_str)
                .map_or_else(|| err.to_string(), str::to_owned),
        ));
    }
    let mut evs = Vec::new();
    if let Some(choice) = v["choices"].get(0) {
        if let Some(text) = choice["delta"]["content"].as_str()
            && !text.is_empty()
        {
            evs.push(ChatEvent::Delta(text.to_owned()));
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            evs.push(ChatEvent::Finish(reason.to_owned()));
        }
    }
    let count = |v: &Value| v.as_u64().map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    if let (Some(p), Some(c)) = (
        count(&v["usage"]["prompt_tokens"]),
        count(&v["usage"]["completion_tokens"]),
    ) {
        evs.push(ChatEvent::Usage(Usage {
            prompt_tokens: p,
            completion_tokens: c,
        }));
    } else if let (Some(p), Some(c)) = (
        count(&v["timings"]["prompt_n"]),
        count(&v["timings"]["predicted_n"]),
    ) {
        evs.push(ChatEvent::Usage(Usage {
            prompt_tokens: p,
            completion_tokens: c,
        }));
    }
    Ok(Frame::Events(evs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(raw: &str) -> Vec<ChatEvent> {
        let mut buf = raw.as_bytes().to_vec();
        let mut out = Vec::new();
        while let Some(f) = take_frame(&mut buf) {
            match parse_frame(&f) {
                Ok(Frame::Events(e)) => out.extend(e),
                Ok(Frame::Done) => break,
                Err(e) => panic!("{e}"),
            }
        }
        out
    }

    #[test]
    fn parses_openai_chunks_usage_and_done() {
        let raw = concat!(
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"after done\"}}]}\n\n",
        );
        assert_eq!(
            events(raw),
            vec![
                ChatEvent::Delta("Hel".into()),
                ChatEvent::Delta("lo".into()),
                ChatEvent::Finish("stop".into()),
                ChatEvent::Usage(Usage {
                    prompt_tokens: 12,
                    completion_tokens: 2
                }),
            ]
        );
    }

    #[test]
    fn llama_cpp_timings_count_as_usage_and_errors_surface() {
        let raw = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}],\"timings\":{\"prompt_n\":30,\"predicted_n\":8}}\n\n";
        assert_eq!(
            events(raw),
            vec![
                ChatEvent::Finish("length".into()),
                ChatEvent::Usage(Usage {
                    prompt_tokens: 30,
                    completion_tokens: 8
                })
            ]
        );
        let mut buf = b"data: {\"error\":{\"message\":\"model overloaded\"}}\n\n".to_vec();
        let f = take_frame(&mut buf).unwrap_or_default();
        assert!(matches!(parse_frame(&f), Err(LlmError::Stream(m)) if m == "model overloaded"));
        let mut buf = b"data: not json\n\n".to_vec();
        let f = take_frame(&mut buf).unwrap_or_default();
        assert!(matches!(parse_frame(&f), Err(LlmError::Protocol(_))));
    }

    #[test]
    fn frames_split_across_reads_wait_for_their_end() {
        let mut buf = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n".to_vec();
        assert!(take_frame(&mut buf).is_none());
        buf.extend_from_slice(b"\ndata: [DO");
        assert!(take_frame(&mut buf).is_some());
        assert!(take_frame(&mut buf).is_none());
        assert_eq!(buf, b"data: [DO");
    }
}
