//! A deliberately misbehaving OpenAI-compatible backend for fault
//! injection: it can stall before the first token or in the middle of the
//! stream. It records every request it gets.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub enum Behaviour {
    /// Streams `tokens` tokens, `gap` apart, then finishes.
    Answer { tokens: usize, gap: Duration },
    /// Answers the headers, then sends nothing for a minute.
    StallBeforeFirstToken,
    /// Streams `tokens` tokens, then sends nothing for a minute.
    StallAfter { tokens: usize },
    /// Streams `tokens` tokens, the first after `delay` (a backend whose
    /// prefill looks slow, whatever the prompt's length).
    #[allow(dead_code)]
    SlowFirstToken { delay: Duration, tokens: usize },
    /// Answers 500.
    Fail,
    /// Stalls before the first token when the request mentions `marker`,
    /// else streams `tokens` tokens (a backend that hangs on some prompts;
    /// `tests/phoenix.rs` uses it).
    #[allow(dead_code)]
    StallWhenAsked { marker: &'static str, tokens: usize },
}

#[derive(Debug, Clone)]
pub struct Seen {
    pub body: Value,
    pub traceparent: Option<String>,
}

struct Inner {
    behaviour: Behaviour,
    seen: Mutex<Vec<Seen>>,
    /// Streams whose client hung up before the stream ended.
    hung_up: AtomicUsize,
}

#[derive(Clone)]
pub struct FakeLlm {
    inner: Arc<Inner>,
    pub base_url: String,
}

impl FakeLlm {
    pub async fn start(behaviour: Behaviour) -> FakeLlm {
        let inner = Arc::new(Inner {
            behaviour,
            seen: Mutex::new(Vec::new()),
            hung_up: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/v1/models", get(models))
            .route("/v1/chat/completions", post(completions))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Like real backends: no Nagle, each token leaves when written.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeLlm {
            inner,
            base_url: format!("http://127.0.0.1:{port}/v1"),
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.inner.seen.lock().expect("lock").clone()
    }

    /// Waits up to a second for `n` streams to have been dropped by the
    /// client (ragtime cancelling a generation); returns how many were.
    pub async fn hung_up(&self, n: usize) -> usize {
        for _ in 0..100 {
            if self.inner.hung_up.load(Ordering::Acquire) >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.inner.hung_up.load(Ordering::Acquire)
    }
}

async fn models() -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": "fake", "object": "model"}]}))
        .into_response()
}

fn token_frame(i: usize) -> Bytes {
    let v = json!({"choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}, "finish_reason": null}]});
    Bytes::from(format!("data: {v}\n\n"))
}

/// The characters of a request's messages.
fn body_chars(body: &str) -> usize {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v["messages"].as_array().map(|m| {
                m.iter()
                    .filter_map(|m| m["content"].as_str())
                    .map(str::len)
                    .sum()
            })
        })
        .unwrap_or(0)
}

async fn completions(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let text = body.to_string();
    inner.seen.lock().expect("lock").push(Seen {
        body,
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    });
    // About four characters a token, as the usage a backend reports.
    let prompt_tokens = body_chars(&text) / 4;
    let behaviour = match inner.behaviour {
        Behaviour::StallWhenAsked { marker, tokens } => {
            if text.contains(marker) {
                Behaviour::StallBeforeFirstToken
            } else {
                Behaviour::Answer {
                    tokens,
                    gap: Duration::from_millis(1),
                }
            }
        }
        b => b,
    };
    if let Behaviour::Fail = behaviour {
        return (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "model crashed",
        )
            .into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(16);
    let stalled = inner.clone();
    tokio::spawn(async move {
        // Sends nothing for a minute, noting a client that hangs up.
        let stall = |tx: tokio::sync::mpsc::Sender<_>| async move {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(60)) => {}
                () = tx.closed() => {
                    stalled.hung_up.fetch_add(1, Ordering::AcqRel);
                }
            }
        };
        match behaviour {
            Behaviour::Answer { tokens, gap } => {
                for i in 0..tokens {
                    if tx.send(Ok(token_frame(i))).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(gap).await;
                }
                let end = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
                let usage = json!({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": tokens}});
                let _ = tx.send(Ok(Bytes::from(format!("data: {end}\n\n")))).await;
                let _ = tx.send(Ok(Bytes::from(format!("data: {usage}\n\n")))).await;
                let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
            }
            Behaviour::SlowFirstToken { delay, tokens } => {
                tokio::time::sleep(delay).await;
                for i in 0..tokens {
                    if tx.send(Ok(token_frame(i))).await.is_err() {
                        return;
                    }
                }
                let end = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
                let usage = json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}});
                let _ = tx.send(Ok(Bytes::from(format!("data: {end}\n\n")))).await;
                let _ = tx.send(Ok(Bytes::from(format!("data: {usage}\n\n")))).await;
                let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
            }
            Behaviour::StallBeforeFirstToken => {
                let _ = tx.send(Ok(Bytes::from_static(b": waiting\n\n"))).await;
                stall(tx).await;
            }
            Behaviour::StallAfter { tokens } => {
                for i in 0..tokens {
                    if tx.send(Ok(token_frame(i))).await.is_err() {
                        return;
                    }
                }
                stall(tx).await;
            }
            Behaviour::Fail | Behaviour::StallWhenAsked { .. } => {}
        }
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream"),
    );
    resp
}
